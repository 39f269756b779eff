//! BEVFusion's fuser, BEV decoders and map head (`sptr::models::bevfusion::bev_stack`) on the
//! CPU, on CUDA and against the PyTorch reference, in one target.
//!
//! - `cpu`: against a naive composition of the upstream modules, names, loading, bad inputs.
//! - `gpu`: the CUDA ops and both models' full configurations against the CPU, on cuDNN and on
//!   im2col + cuBLAS (skipped without a GPU unless SPTR_REQUIRE_GPU=1).
//! - `parity`: against `tests/parity/bev_decoder_ref.py` (`SPTR_BEV_DECODER_PARITY_DIR`, written
//!   by `scripts/gpu_parity.sh OUT bevdecoder`; skipped when unset), run there with the name
//!   filter `parity::`.

#[path = "../common/mod.rs"]
mod common;

mod cpu;
mod gpu;
mod parity;
