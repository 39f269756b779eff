//! Sparse window attention: window partitions (cubic, spherical, shifted, 2-D Swin), SphereFormer's
//! contextual relative position encoding, and the varlen attention op (CPU reference here, the
//! fused FP16 CUDA kernel in `cuda`).
//!
//! One op serves every window kind: voxels (or image tokens) are grouped window after window
//! (`Partition`), and each query attends to the keys of its own window. Nothing per pair is ever
//! stored: RPE table rows are computed from positions inside the op.

pub mod cpu;
#[cfg(feature = "cuda-core")]
pub mod cuda;
pub mod partition;
pub mod rpe;
pub mod sphere;
pub mod swin;

pub use cpu::{window_attention, window_attention_into, ContextualRpe, HeadSlice, PositionTerm, RelativeBias2d, RpeTables};
pub use partition::{window_partition, Partition};
pub use rpe::{cart2sphere, RpeGeometry};
pub use sphere::{sphere_attention_cpu, SphereLevel, SphereTables, SphereWindows};
