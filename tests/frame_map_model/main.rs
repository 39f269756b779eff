//! The BEVFusion seg model as the camera branch's map model (`sptr::frame::map_model`, what the
//! node and replay run), in one target.
//!
//! - `deferred_jpeg`: JPEGs the branch leaves undecoded for the model, on the CPU backend (the
//!   host decode path, a bad JPEG masked and reported).
//! - `gpu`: the map model on CUDA against the CPU, on frames made by the branch (nvJPEG decode,
//!   masked and hostile cameras).
//! - `overlap_gpu`: the node's two models beside each other on one GPU (SphereFormer on one
//!   thread, the map model on another) give the serial outputs.
//!
//! The GPU modules skip without a GPU unless SPTR_REQUIRE_GPU=1. `seg` (tests/common/bevseg.rs)
//! holds the nuScenes frame's inputs.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/bevseg.rs"]
mod seg;

mod deferred_jpeg;
mod gpu;
mod overlap_gpu;
