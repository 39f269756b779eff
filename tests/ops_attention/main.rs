//! Window attention (`sptr::ops::attention`): partitions, relative position encodings and the
//! attention itself on the CPU, on CUDA and against PyPI sptr, in one target.
//!
//! - `cpu`: the CPU window attention against naive dense masked attention.
//! - `gpu`: the CUDA partitions, RPE positions and attention against the CPU reference (skipped
//!   without a GPU unless SPTR_REQUIRE_GPU=1).
//! - `parity`: parity and speed against PyPI sptr 1.1.1 from `tests/parity/sptr_parity.py`'s
//!   reference (`SPTR_ATTN_PARITY_DIR`; skipped when unset). `scripts/gpu_parity.sh` runs it
//!   with the name filter `parity::`.

#[path = "../common/mod.rs"]
mod common;

mod cpu;
mod gpu;
mod parity;
