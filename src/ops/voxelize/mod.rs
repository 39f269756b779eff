//! ops::voxelize

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod hard;
#[cfg(feature = "cuda")]
pub mod hard_cuda;

