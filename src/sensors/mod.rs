//! sensors

pub mod calib;
pub mod cloud_files;
pub mod image;

