//! sensors

pub mod calib;
pub mod image;

