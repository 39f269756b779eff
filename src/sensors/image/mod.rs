//! Camera images as the sensors send them: raw encodings (`encodings`), JPEG and PNG decoding
//! (`compressed`), the JPEG checks a GPU decode rests on (`jpeg_markers`: the headers before it,
//! the scans before its result is used; `jpeg_scan`), and nvJPEG (`nvjpeg`).

pub mod compressed;
pub mod encodings;
pub mod jpeg_markers;
pub mod jpeg_scan;
#[cfg(feature = "cuda-core")]
pub mod nvjpeg;

