//! The two model families: SphereFormer's LiDAR segmentation (`sphereformer`) and BEVFusion's
//! BEV map segmentation (`bevfusion`), each with its CPU reference and its CUDA upload.

pub mod bevfusion;
pub mod sphereformer;

