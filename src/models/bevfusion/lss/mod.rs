//! BEVFusion's `LSSTransform` (lift-splat-shoot view transform): camera features + calibration →
//! a camera BEV feature map.
//!
//! - `config`: the YAML section, the BEV grid, the frustum, the test-time image augmentation;
//! - `geometry`: the per-calibration point → BEV cell table (CPU) and its cache;
//! - `transform`: weights, depthnet + depth softmax (lift), the pool, the downsample convs (CPU);
//! - `pool_plan`: the CUDA pool's work items per calibration (long cells cut into chunks);
//! - `cuda` (feature `cuda`): the same on the GPU, geometry built by a kernel + radix sort, a fused
//!   lift + pool kernel that never forms the N·D·H·W·C frustum features (`kernels/models/bevfusion/bev_pool.cu`).

pub mod config;
#[cfg(feature = "cuda-core")]
pub mod cuda;
pub mod geometry;
pub mod pool_plan;
pub mod transform;

pub use config::{BevGrid, Frustum, ImageAug, LssConfig};
pub use geometry::{GeometryCache, Interval, LssGeometry, LssParams};
pub use transform::{pool, weight_specs, CameraMask, Lifted, LssTransform, PREFIX};
