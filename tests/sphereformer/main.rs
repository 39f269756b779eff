//! SphereFormer (`sptr::models::sphereformer`): weights, preprocessing, the network and its
//! precision modes, on the CPU, on CUDA and against the upstream network, in one target.
//!
//! - `cpu`: weight names and shapes, safetensors, the upstream preprocessing, the network end to
//!   end on the committed samples (small configurations).
//! - `gpu`: the CUDA network against the CPU reference on the full configurations.
//! - `preprocess_gpu`: the GPU preprocessing and label mapping against the CPU's.
//! - `precision_gpu`: the `bf16`, `fp32` and `auto` precisions (kernels and the network).
//! - `parity`: against upstream's network in PyTorch (`SPTR_MODEL_PARITY_DIR`, written by
//!   `scripts/gpu_parity.sh OUT model`; skipped when unset), run there with the name filter
//!   `parity::`.
//!
//! The GPU modules skip without a GPU unless SPTR_REQUIRE_GPU=1.

#[path = "../common/mod.rs"]
mod common;
#[cfg(feature = "cuda-core")]
#[path = "../common/overflow_weights.rs"]
mod overflow_weights;

mod cpu;
mod gpu;
mod parity;
mod precision_gpu;
mod preprocess_gpu;
