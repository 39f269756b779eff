//! A `sensor_msgs/CameraInfo` CDR body and the intrinsics taken from its K and P.
use sptr::msgs::cdr::{decode_message, Message};
use sptr::sensors::calib::camera::{intrinsics_from_k, intrinsics_from_projection};

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let Ok(Message::CameraInfo(msg)) = decode_message("sensor_msgs/msg/CameraInfo", data) else {
        return;
    };
    for k in [intrinsics_from_k(&msg.k), intrinsics_from_projection(&msg.p)].into_iter().flatten() {
        // Accepted intrinsics are finite (the geometry divides by them).
        assert!(k.iter().flatten().all(|v| v.is_finite()), "{k:?}");
    }
}
