//! The ops the models are built from, one folder per op family, each with its CPU reference
//! (f32, the definition the CUDA version is tested against) beside its CUDA wrapper; the kernels
//! are in `kernels/ops/`.

pub mod attention;
pub mod dense;
pub mod image_preprocess;
pub mod label_grid;
pub mod rowwise;
pub mod sparse_conv;
pub mod voxelize;

