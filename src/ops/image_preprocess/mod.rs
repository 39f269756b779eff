//! ops::image_preprocess

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

