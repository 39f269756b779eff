//! BEVFusion's LSS view transform (`sptr::models::bevfusion::lss`: geometry, lift, bev_pool,
//! downsample) on the CPU, on CUDA and against the PyTorch reference, in one target.
//!
//! - `cpu`: the pool against a naive outer product + scatter, masking, weights, bad inputs.
//! - `gpu`: the CUDA geometry tables, pool and transform against the CPU (skipped without a GPU
//!   unless SPTR_REQUIRE_GPU=1).
//! - `parity`: against `tests/parity/lss_ref.py` (`SPTR_LSS_PARITY_DIR`; skipped when unset),
//!   run by `scripts/gpu_parity.sh OUT lss` with the name filter `parity::`.
//!
//! `lss_common` (tests/common/lss.rs) is the set-up the three share.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/lss.rs"]
mod lss_common;

mod cpu;
mod gpu;
mod parity;
