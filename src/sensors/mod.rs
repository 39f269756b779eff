//! Sensor inputs decoded: camera images (`image`), camera calibration (`calib`: intrinsics,
//! extrinsics, TF, the rig, calibration files), and LiDAR cloud files (`cloud_files`).

pub mod calib;
pub mod cloud_files;
pub mod image;

