//! Voxelization: points to voxels with batch-first int32 coordinates `[b, x, y, z]` (`cpu`, the
//! reference; `cuda`), and BEVFusion's hard voxelization with its per-voxel point cap (`hard`,
//! `hard_cuda`).

pub mod cpu;
#[cfg(feature = "cuda-core")]
pub mod cuda;
pub mod hard;
#[cfg(feature = "cuda-core")]
pub mod hard_cuda;

