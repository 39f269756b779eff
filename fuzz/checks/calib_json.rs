//! A nuScenes-style `calib.json` (`sptr bevseg --calib`), for the six nuScenes cameras.
use sptr::sensors::calib::camera::Calibration;

const CAMERAS: [&str; 6] = ["CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"];

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(calib) = Calibration::from_nuscenes_json(text, "fuzz.json", &CAMERAS, 1600, 900) {
        assert_eq!(calib.len(), CAMERAS.len());
    }
}
