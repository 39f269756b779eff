//! Camera calibration: per camera the intrinsics and the camera-to-LiDAR extrinsic (`camera`),
//! the calibration file (`file`), the TF buffer (`tf`) and the rig as it stands at each frame
//! (`rig`: CameraInfo, TF and the file combined, changes detected).

pub mod camera;
pub mod file;
pub mod rig;
pub mod tf;

