//! Sparse convolution (`sptr::ops::sparse_conv`): kernel maps and convolutions on the CPU, on
//! CUDA and against spconv, in one target.
//!
//! - `cpu`: the CPU conv against a naive dense 3-D convolution, and the kernel-map invariants.
//! - `gpu`: the CUDA kernel maps and convs against the CPU reference (skipped without a GPU
//!   unless SPTR_REQUIRE_GPU=1).
//! - `parity`: parity and speed against spconv 2.3.x from `tests/parity/spconv_parity.py`'s
//!   reference (`SPTR_PARITY_DIR`; skipped when unset). `scripts/gpu_parity.sh` runs it with the
//!   name filter `parity::`.

#[path = "../common/mod.rs"]
mod common;

mod cpu;
mod gpu;
mod parity;
