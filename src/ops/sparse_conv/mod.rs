//! Sparse convolution: the CPU sparse tensor (`tensor`), kernel maps (spconv's indice pairs:
//! `kernel_map`, `kernel_map_cuda`), and `SubMConv3d` / `SparseConv3d` / inverse convolution
//! (`cpu`, the reference; `cuda`, FP16 storage with FP32 accumulation).

pub mod cpu;
#[cfg(feature = "cuda-core")]
pub mod cuda;
pub mod kernel_map;
#[cfg(feature = "cuda-core")]
pub mod kernel_map_cuda;
pub mod tensor;

