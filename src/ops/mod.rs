//! ops

pub mod attention;
pub mod dense;
pub mod image_preprocess;
pub mod label_grid;
pub mod rowwise;
pub mod sparse_conv;
pub mod voxelize;

