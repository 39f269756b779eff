//! Voxelization (`sptr::ops::voxelize`): the CPU reference and its CUDA path in one target.
//!
//! - `cpu`: `voxelize_cpu` against a naive implementation and hand-built cases of every rule of
//!   the module doc, and the committed nuScenes / SemanticKITTI scans.
//! - `gpu`: `voxelize_cuda` against the CPU, and the device scan and radix sort it is built on
//!   (skipped without a GPU unless SPTR_REQUIRE_GPU=1).

#[path = "../common/mod.rs"]
mod common;

mod cpu;
mod gpu;
