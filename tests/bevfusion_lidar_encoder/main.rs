//! BEVFusion's LiDAR branch (`sptr::models::bevfusion::lidar_encoder`: hard voxelization and the
//! SparseEncoder) on the CPU, on CUDA and against the PyTorch + spconv reference, in one target.
//!
//! - `cpu`: hard voxelization against a naive implementation, anisotropic strided maps, config
//!   and weight names, the encoder against a site-by-site reference.
//! - `gpu`: the CUDA voxelization and encoder against the CPU (skipped without a GPU unless
//!   SPTR_REQUIRE_GPU=1).
//! - `parity`: against `tests/parity/lidar_encoder_ref.py` (`SPTR_LIDAR_PARITY_DIR`, written by
//!   `scripts/gpu_parity.sh OUT lidarenc`; skipped when unset), run there with the name filter
//!   `parity::`.

#[path = "../common/mod.rs"]
mod common;

mod cpu;
mod gpu;
mod parity;
