//! The ROS 2 side of sptr (cargo feature `ros`, built on r2r).
//!
//! Here: `sensor_msgs/PointCloud2` messages ⇄ the codec's types in [`crate::msgs::cloud`]. Decoding
//! borrows the message's data bytes (only the small field table is converted); encoding moves
//! the encoder's buffer into the message.
//!
//! The node itself is [`node`] (binary `perception_node`): [`params`] validates its parameters,
//! [`mailbox`] hands frames from the subscription to the processing thread, [`cameras`] is the
//! camera branch's subscriptions, outputs and diagnostics, [`stop_guard`] bounds the stop's time. [`bench_peer`] is the node benchmark's
//! publisher (binary `node_bench_peer`).

pub mod bench_peer;
pub mod cameras;
pub mod mailbox;
pub mod node;
pub mod params;
pub mod stop_guard;

use r2r::sensor_msgs::msg::{PointCloud2, PointField as MsgField};
use r2r::std_msgs::msg::Header;

use crate::msgs::cloud;
use crate::msgs::cloud::{CloudBuf, CloudError, CloudView, DecodeReport, PointField};
use crate::msgs::points::Points;

/// The message's field table as the codec's [`PointField`]s.
pub fn fields(msg: &PointCloud2) -> Vec<PointField> {
    let mut out = Vec::with_capacity(msg.fields.len());
    fields_into(msg, &mut out);
    out
}

/// [`fields`] into a reused vector (cleared first), for a subscriber that decodes every message.
pub fn fields_into(msg: &PointCloud2, out: &mut Vec<PointField>) {
    out.clear();
    out.extend(msg.fields.iter().map(|f| PointField {
        name: f.name.clone(),
        offset: f.offset,
        datatype: f.datatype,
        count: f.count,
    }));
}

/// A [`CloudView`] of `msg` that borrows its data bytes; `fields` is `fields(msg)`.
///
/// ```ignore
/// let fields = sptr::ros::fields(&msg);
/// let (points, report) = sptr::msgs::cloud::decode(&sptr::ros::cloud_view(&msg, &fields))?;
/// ```
pub fn cloud_view<'a>(msg: &'a PointCloud2, fields: &'a [PointField]) -> CloudView<'a> {
    CloudView {
        height: msg.height,
        width: msg.width,
        fields,
        is_bigendian: msg.is_bigendian,
        point_step: msg.point_step,
        row_step: msg.row_step,
        data: &msg.data,
        is_dense: msg.is_dense,
    }
}

/// Decodes a message's points (see [`crate::msgs::cloud::decode`] for what layouts are accepted).
pub fn decode(msg: &PointCloud2) -> Result<(Points, DecodeReport), CloudError> {
    let fields = fields(msg);
    cloud::decode(&cloud_view(msg, &fields))
}

/// A message from an encoded body (e.g. [`crate::msgs::cloud::encode_labeled`]) and a header; the data
/// buffer is moved, not copied.
pub fn to_msg(buf: CloudBuf, header: Header) -> PointCloud2 {
    PointCloud2 {
        header,
        height: buf.height,
        width: buf.width,
        fields: buf
            .fields
            .into_iter()
            .map(|f| MsgField {
                name: f.name,
                offset: f.offset,
                datatype: f.datatype,
                count: f.count,
            })
            .collect(),
        is_bigendian: buf.is_bigendian,
        point_step: buf.point_step,
        row_step: buf.row_step,
        data: buf.data,
        is_dense: buf.is_dense,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::cloud::{encode_points_with, Layout};

    #[test]
    fn message_round_trip_keeps_every_field_and_value() {
        let n = 37;
        let pts = Points {
            x: (0..n).map(|i| i as f32 * 0.5 - 3.0).collect(),
            y: (0..n).map(|i| 10.0 - i as f32).collect(),
            z: (0..n).map(|i| (i % 7) as f32 * 0.25).collect(),
            intensity: (0..n).map(|i| (i * 3) as f32).collect(),
            has_intensity: true,
            ring: Some((0..n).map(|i| (i % 16) as u16).collect()),
            time: Some((0..n).map(|i| i as f32 * 1e-4).collect()),
        };
        for big in [false, true] {
            let buf = encode_points_with(&pts, Layout::XyzIrt, big).unwrap();
            let header = Header {
                frame_id: "lidar".into(),
                ..Default::default()
            };
            let msg = to_msg(buf.clone(), header);
            assert_eq!(msg.header.frame_id, "lidar");
            assert_eq!(fields(&msg), buf.fields);
            assert_eq!(msg.data, buf.data);
            let (back, report) = decode(&msg).unwrap();
            assert_eq!(report.kept, n);
            assert_eq!(back, pts, "big_endian = {big}");
        }
    }
}
