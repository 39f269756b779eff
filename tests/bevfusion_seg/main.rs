//! BEVFusion BEV map segmentation end to end (`sptr::models::bevfusion::seg`), both models, on
//! the CPU and on CUDA, in one target. Its parity with upstream is `sptr bevseg --dump-stages`
//! beside `tests/parity/bevfusion_seg_ref.py` (`scripts/gpu_parity.sh OUT bevseg`).
//!
//! - `cpu`: reduced configurations, deterministic, every bad input.
//! - `gpu`: the full configurations on CUDA against the CPU (skipped without a GPU unless
//!   SPTR_REQUIRE_GPU=1).
//!
//! `seg` (tests/common/bevseg.rs) holds the nuScenes frame's inputs both use.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/bevseg.rs"]
mod seg;

mod cpu;
mod gpu;
