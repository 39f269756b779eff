//! Camera images as the sensors send them: raw encodings (`encodings`), JPEG and PNG decoding
//! (`compressed`), the JPEG checks done before any decoder sees the bytes (`jpeg_markers`,
//! `jpeg_scan`), and nvJPEG (`nvjpeg`).

pub mod compressed;
pub mod encodings;
pub mod jpeg_markers;
pub mod jpeg_scan;
#[cfg(feature = "cuda-core")]
pub mod nvjpeg;

