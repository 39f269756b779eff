//! BEVFusion's test-time camera preprocessing (Pillow's resize and crop, torchvision's
//! normalisation): the CPU reference (`cpu`) and the GPU version fed by nvJPEG or host decodes
//! (`cuda`).

pub mod cpu;
#[cfg(feature = "cuda-core")]
pub mod cuda;

