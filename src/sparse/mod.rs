//! Sparse tensors: voxelization now; hash tables, kernel maps and sparse convolution next.

pub mod conv_cpu;
pub mod hard_voxelize;
pub mod kernel_map;
pub mod tensor;
pub mod voxelize;
#[cfg(feature = "cuda")]
pub mod voxelize_cuda;
#[cfg(feature = "cuda")]
pub mod hard_voxelize_cuda;
#[cfg(feature = "cuda")]
pub mod kernel_map_cuda;
#[cfg(feature = "cuda")]
pub mod conv_cuda;
#[cfg(feature = "cuda")]
pub mod bench;
