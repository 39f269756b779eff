//! BEV label grids (`sptr::ops::label_grid`): the CPU vote and its CUDA path in one target.
//!
//! - `cpu`: cell layout, the confidence-weighted vote, occupancy, bad input.
//! - `gpu`: the CUDA grid equal to the CPU's (skipped without a GPU unless SPTR_REQUIRE_GPU=1).

#[path = "../common/mod.rs"]
mod common;

mod cpu;
mod gpu;
