//! sensors::image

pub mod compressed;
pub mod encodings;
pub mod jpeg_markers;
pub mod jpeg_scan;
#[cfg(feature = "cuda")]
pub mod nvjpeg;

