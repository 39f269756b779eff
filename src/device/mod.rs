//! Backends. Every op has a CPU reference (f32, rayon) and, with feature `cuda`, a CUDA
//! implementation (FP16 storage, FP32 accumulation) whose kernels come from `kernels/`.
//!
//! `kernels` (the embedded sources) is always compiled so tools can list them; `nvrtc` (compile
//! and on-disk cache), `cuda` (context, stream, loaded modules) and `range` (the FP16 range
//! guard's device buffers; `range_guard` is its host side: which layers left the FP16 range) need
//! feature `cuda`. `storage`: FP16, BF16 or FP32 activations and the `precision` setting.
//! `clock`: stage times on the host and on the GPU. `memory`: host and device memory in use.

#[cfg(feature = "cuda")]
pub mod cuda;
pub mod clock;
pub mod kernels;
pub mod memory;
#[cfg(feature = "cuda")]
pub mod nvrtc;
pub mod percentile;
#[cfg(feature = "cuda")]
pub mod primitives;
#[cfg(feature = "cuda")]
pub mod range;
pub mod range_guard;
pub mod storage;

/// Which backend a caller asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    Cuda,
}

impl std::str::FromStr for Backend {
    type Err = crate::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Backend::Cpu),
            "cuda" | "gpu" => Ok(Backend::Cuda),
            other => Err(crate::Error::InvalidInput(format!("unknown device `{other}`: use `cpu` or `cuda`"))),
        }
    }
}

/// Whether this build has the CUDA backend compiled in.
pub const CUDA_COMPILED: bool = cfg!(feature = "cuda");

/// Which backend runs the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    Cuda,
    Cpu,
}
