//! The camera branch: images in, BEVFusion's camera features out.

pub mod encoder;
#[cfg(feature = "cuda")]
pub mod encoder_bench;
#[cfg(feature = "cuda")]
pub mod encoder_cuda;
pub mod features;
pub mod fpn;
#[cfg(feature = "cuda")]
pub mod fpn_cuda;
pub mod npy;
pub mod swin;
#[cfg(feature = "cuda")]
pub mod swin_cuda;
