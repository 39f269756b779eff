//! The benchmark harnesses behind `sptr bench`: each prints machine-readable JSON; the one
//! percentile type (`percentiles`) and the host probe (`host_probe`) that tells a slow frame of ours
//! from a slow host.

#[cfg(feature = "cuda-core")]
pub mod attention;
#[cfg(feature = "cuda-core")]
pub mod bev_decoder;
#[cfg(feature = "cuda-core")]
pub mod bevpool;
#[cfg(feature = "cuda-core")]
pub mod bevseg;
#[cfg(feature = "cuda-core")]
pub mod camera_encoder;
pub mod camera_input;
pub mod faults;
pub mod host_probe;
pub mod json;
pub mod lidar;
#[cfg(feature = "cuda-core")]
pub mod lidar_encoder;
pub mod model;
pub mod percentiles;
pub mod pipeline;
#[cfg(feature = "cuda-core")]
pub mod spconv;

