//! Per-row layers on `[N, C]` features shared by the networks: Linear, LayerNorm, BatchNorm, GELU
//! (`cpu`, the reference; `cuda`), and `nn.Linear` as one cuBLASLt GEMM with its bias in the
//! epilogue (`lt`).

pub mod cpu;
#[cfg(feature = "cuda-core")]
pub mod cuda;
#[cfg(feature = "cuda-core")]
pub mod lt;

