//! sensors::calib

pub mod camera;
pub mod file;
pub mod rig;
pub mod tf;

