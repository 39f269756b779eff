//! Sparse tensors: voxelization now; hash tables, kernel maps and sparse convolution next.

pub mod voxelize;
#[cfg(feature = "cuda")]
pub mod voxelize_cuda;
