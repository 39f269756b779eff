//! cli

pub mod bevseg;
pub mod camera_features;
pub mod segment_files;
pub mod segment_progress;

