//! BEVFusion's camera encoder: its configuration (`config`), the Swin-T backbone (`swin`,
//! `swin_cuda`), the GeneralizedLSSFPN neck (`fpn`, `fpn_cuda`), and the two together
//! (`encoder`, `encoder_cuda`).

pub mod config;
pub mod encoder;
#[cfg(feature = "cuda-core")]
pub mod encoder_cuda;
pub mod fpn;
#[cfg(feature = "cuda-core")]
pub mod fpn_cuda;
pub mod swin;
#[cfg(feature = "cuda-core")]
pub mod swin_cuda;

