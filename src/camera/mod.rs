//! The camera branch: images in, BEVFusion's camera features out.
//!
//! Images in: `image` decodes `sensor_msgs/Image` encodings to RGB8, `compressed` JPEG / PNG
//! `CompressedImage`s, `preprocess` BEVFusion's test-time resize + crop + normalize on the CPU
//! (Pillow's bicubic resize, bit for bit), `preprocess_cuda` the same in one CUDA kernel (FP16
//! NHWC out; JPEGs decoded by nvJPEG on the device when it loads: `nvjpeg`, `jpeg_markers`),
//! `jpeg_scan` walks a JPEG's scan data to refuse a truncated one before either decoder sees it,
//! `bench` times decode + upload + preprocessing. Features out: `swin` (Swin-T),
//! `fpn` (GeneralizedLSSFPN), `encoder` (both), each with a `_cuda` twin.

pub mod bench;
pub mod compressed;
pub mod encoder;
#[cfg(feature = "cuda")]
pub mod encoder_bench;
#[cfg(feature = "cuda")]
pub mod encoder_cuda;
pub mod features;
pub mod fpn;
#[cfg(feature = "cuda")]
pub mod fpn_cuda;
pub mod image;
pub mod jpeg_markers;
pub mod jpeg_scan;
pub mod npy;
#[cfg(feature = "cuda")]
pub mod nvjpeg;
pub mod preprocess;
#[cfg(feature = "cuda")]
pub mod preprocess_cuda;
pub mod swin;
#[cfg(feature = "cuda")]
pub mod swin_cuda;
