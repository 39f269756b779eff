//! Backends. Every op has a CPU reference (f32, rayon) and, with feature `cuda`, a CUDA
//! implementation (FP16 storage, FP32 accumulation) whose kernels come from `kernels/`.
//!
//! `kernels` (the embedded sources) is always compiled so tools can list them; `nvrtc` (compile
//! and on-disk cache), `cuda` (context, stream, loaded modules; `driver_error` its errors) and
//! `range` (the FP16 range guard's device buffers; `range_guard` is its host side: which layers
//! left the FP16 range) need feature `cuda`. `storage`: FP16, BF16 or FP32 activations and the
//! `precision` setting. `clock`: stage times on the host and on the GPU. `memory`: host and
//! device memory in use.
//! `staging` (feature `cuda`): the reused host buffers uploads are written into.
//! `cluster_launch` (feature `cuda`): launches whose blocks form thread-block clusters. `libraries`:
//! the CUDA libraries opened at run time, found as they will be opened and checked against the
//! CUDA major the build binds (`cuda`: 13, `cuda12`: 12.6).
//! `choice`: the device a user names (`auto`, `cpu`, `cuda`) and [`resolve`], the one place it
//! becomes the [`Device`] the work runs on.

pub mod choice;
#[cfg(feature = "cuda-core")]
pub mod cluster_launch;
#[cfg(feature = "cuda-core")]
pub mod cuda;
#[cfg(feature = "cuda-core")]
pub mod driver_error;
pub mod clock;
pub mod kernels;
#[cfg(feature = "cuda-core")]
pub mod libraries;
pub mod memory;
#[cfg(feature = "cuda-core")]
pub mod nvrtc;
pub mod percentile;
#[cfg(feature = "cuda-core")]
pub mod primitives;
#[cfg(feature = "cuda-core")]
pub mod range;
pub mod range_guard;
#[cfg(feature = "cuda-core")]
pub mod staging;
pub mod storage;

/// Whether this build has the CUDA backend compiled in.
pub const CUDA_COMPILED: bool = cfg!(feature = "cuda-core");

pub use choice::{cuda_unavailable, resolve, CudaUnavailable, Device, DeviceChoice, ResolvedDevice, UnknownDevice};
