//! sptr: LiDAR/camera perception on sparse tensors, CPU reference and CUDA FP16 backends.
//!
//! Module map (see README.md and the design notes): `cloud` decodes/encodes PointCloud2 buffers,
//! `points` holds decoded clouds, `config` parses the YAML configs, `device` owns the backends and
//! the NVRTC kernel pipeline, `sparse` builds sparse tensors (voxelization first).

pub mod attention;
pub mod bag;
pub mod bev;
pub mod budget;
pub mod camera;
pub mod cloud;
pub mod config;
pub mod dense;
pub mod device;
pub mod error;
pub mod eval;
pub mod host_probe;
pub mod memory;
pub mod model;
pub mod outputs;
pub mod perception;
pub mod pipeline;
pub mod pipeline_bench;
pub mod pipeline_faults;
pub mod points;
pub mod replay;
pub mod sparse;

pub use error::{Error, Result};
pub use points::Points;
#[cfg(feature = "ros")]
pub mod ros;
