//! ops::sparse_conv

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod kernel_map;
#[cfg(feature = "cuda")]
pub mod kernel_map_cuda;
pub mod tensor;

