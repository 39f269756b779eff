//! models::bevfusion

pub mod bev_stack;
#[cfg(feature = "cuda")]
pub mod bev_stack_cuda;
pub mod camera;
pub mod config;
pub mod decoder;
#[cfg(feature = "cuda")]
pub mod decoder_cuda;
pub mod fuser;
pub mod head;
#[cfg(feature = "cuda")]
pub mod head_cuda;
pub mod lidar_encoder;
pub(crate) mod load;
pub mod lss;
pub mod map;
pub mod seg;
#[cfg(feature = "cuda")]
pub mod seg_cuda;

