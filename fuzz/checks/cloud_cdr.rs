//! A `sensor_msgs/PointCloud2` CDR body, as replay reads it from a bag, decoded the way the node
//! decodes every cloud. Checks: the decoded point count never exceeds what the header allows,
//! and decode → encode → decode gives the same points.
use sptr::msgs::cdr::{decode_message, Message};
use sptr::msgs::cloud::{decode, encode_points, Layout};

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let Ok(Message::PointCloud2(msg)) = decode_message("sensor_msgs/msg/PointCloud2", data) else {
        return;
    };
    let view = msg.cloud.view();
    let Ok((points, report)) = decode(&view) else {
        return;
    };
    let allowed = view.width as usize * view.height as usize;
    assert!(report.total <= allowed && report.kept <= report.total, "{report:?} with header {allowed}");
    assert_eq!(points.x.len(), report.kept);
    if report.kept > 0 {
        // Every point needs point_step bytes of data.
        assert!(report.kept <= view.data.len() / view.point_step as usize);
    }
    // Decoded points are finite, so an f32 layout carries them exactly.
    let layout = if points.has_intensity { Layout::XyzI32 } else { Layout::Xyz32 };
    let Ok(buf) = encode_points(&points, layout) else {
        return;
    };
    let (again, _) = decode(&buf.view()).expect("a cloud we encoded must decode");
    assert_eq!(again.x, points.x);
    assert_eq!(again.y, points.y);
    assert_eq!(again.z, points.z);
    if points.has_intensity {
        assert_eq!(again.intensity, points.intensity);
    }
}
