//! models::bevfusion::camera

pub mod config;
pub mod encoder;
#[cfg(feature = "cuda")]
pub mod encoder_cuda;
pub mod fpn;
#[cfg(feature = "cuda")]
pub mod fpn_cuda;
pub mod swin;
#[cfg(feature = "cuda")]
pub mod swin_cuda;

