//! The FP16 range guard: activations that leave FP16's range are flagged under their layer and
//! reported, never passed on as plausible output. One target for its CPU and GPU sides.
//!
//! - `cpu`: the reporting paths on the CPU (the segmenter's report, the frame processor's
//!   `on_overflow`, `sptr segment` and `sptr replay` exit statuses).
//! - `gpu`: every SphereFormer kernel that stores FP16 activations, and the network's forward,
//!   flag out-of-range values by layer.
//! - `camera_encoder_gpu`: the same on the camera encoder's CUDA path (Swin-T, the FPN neck) and
//!   the LSS view transform.
//!
//! The GPU modules skip without a GPU unless SPTR_REQUIRE_GPU=1.

#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "cuda-core")]
#[path = "../common/lss.rs"]
mod lss_common;
#[cfg(feature = "cuda-core")]
#[path = "../common/overflow_weights.rs"]
mod overflow_weights;

mod camera_encoder_gpu;
mod cpu;
mod gpu;
