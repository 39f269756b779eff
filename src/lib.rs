//! sptr: LiDAR/camera perception on sparse tensors, CPU reference and CUDA FP16 backends.
//!
//! Module map (see README.md and the design notes): `cloud` decodes/encodes PointCloud2 buffers,
//! `points` holds decoded clouds, `config` parses the YAML configs, `device` owns the backends and
//! the NVRTC kernel pipeline, `sparse` builds sparse tensors (voxelization first).

pub mod bag;
pub mod bench;
pub mod cli;
pub mod device;
pub mod error;
pub mod eval;
pub mod frame;
pub mod models;
pub mod msgs;
pub mod nn;
pub mod ops;
pub mod replay;
#[cfg(feature = "ros")]
pub mod ros;
pub mod sensors;

pub use error::{Error, Result};
pub use crate::msgs::points::Points;
