//! BEVFusion's camera encoder (`sptr::models::bevfusion::camera`: Swin-T + GeneralizedLSSFPN) on
//! the CPU, on CUDA and against the PyTorch reference of the upstream modules, in one target.
//!
//! - `cpu`: configuration and weight names, each op against a naive implementation, the reduced
//!   encoder end to end, bad inputs.
//! - `gpu`: the CUDA encoder against the CPU reference, reduced and full configurations (skipped
//!   without a GPU unless SPTR_REQUIRE_GPU=1).
//! - `parity`: against `tests/parity/bevfusion_camera_ref.py` (`SPTR_CAMERA_PARITY_DIR`, written
//!   by `scripts/gpu_parity.sh OUT camera`; skipped when unset), run there with the name filter
//!   `parity::`.

#[path = "../common/mod.rs"]
mod common;

mod cpu;
mod gpu;
mod parity;
