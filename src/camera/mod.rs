//! The camera branch: images in, BEVFusion's camera features out.

pub mod encoder;
pub mod fpn;
pub mod swin;
