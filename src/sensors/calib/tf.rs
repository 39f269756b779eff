//! A small TF buffer: the transforms of `/tf_static` and the latest of each `/tf` edge, chained
//! between any two frames of one tree.
//!
//! Each edge is a `geometry_msgs/TransformStamped`: the pose of `child_frame_id` in
//! `header.frame_id`. A child has one parent (as in tf2); a later message for the same child
//! replaces the edge (a static edge replaced on `/tf_static` is how a calibration changes at run
//! time). A child published on both `/tf_static` and `/tf` takes the latest message of either.
//! Dynamic edges are used at their latest value, without interpolation in time: camera
//! extrinsics are static, and ego motion between sweeps (see [`crate::frame::sweeps`]) is sampled once
//! per cloud.
//!
//! [`TfBuffer::lookup`]`(target, source)` is the transform that maps a point in `source` to
//! `target` (tf2's `lookupTransform(target, source)`), through their common ancestor.

use std::collections::HashMap;

use crate::msgs::cdr::{TfMessage, TransformStamped};
use crate::sensors::calib::camera::{mat4_inverse_affine, Mat4};
use crate::Error;

/// The deepest chain followed from a frame to its root (a longer one is a cycle).
const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, PartialEq)]
struct Edge {
    parent: String,
    /// child → parent.
    transform: Mat4,
    stamp_ns: i64,
    is_static: bool,
}

/// Transforms by child frame.
#[derive(Debug, Clone, Default)]
pub struct TfBuffer {
    edges: HashMap<String, Edge>,
    /// Incremented whenever an edge is added or its value changes.
    version: u64,
}

/// `[x, y, z, w]` + translation as a homogeneous 4×4 (the quaternion normalised first). Errors
/// on a non-finite value or a quaternion of (near) zero length.
pub fn transform_matrix(translation: &[f64; 3], rotation: &[f64; 4]) -> Result<Mat4, Error> {
    if translation.iter().chain(rotation).any(|v| !v.is_finite()) {
        return Err(Error::InvalidInput(format!("transform is not finite: translation {translation:?}, rotation {rotation:?}")));
    }
    let n = rotation.iter().map(|v| v * v).sum::<f64>().sqrt();
    if n < 1e-6 {
        return Err(Error::InvalidInput(format!("rotation quaternion {rotation:?} has zero length")));
    }
    let [x, y, z, w] = rotation.map(|v| v / n);
    Ok([
        [1.0 - 2.0 * (y * y + z * z), 2.0 * (x * y - z * w), 2.0 * (x * z + y * w), translation[0]],
        [2.0 * (x * y + z * w), 1.0 - 2.0 * (x * x + z * z), 2.0 * (y * z - x * w), translation[1]],
        [2.0 * (x * z - y * w), 2.0 * (y * z + x * w), 1.0 - 2.0 * (x * x + y * y), translation[2]],
        [0.0, 0.0, 0.0, 1.0],
    ])
}

/// `a · b` of homogeneous transforms.
pub fn mat4_mul(a: &Mat4, b: &Mat4) -> Mat4 {
    let mut m = [[0.0; 4]; 4];
    for (i, row) in m.iter_mut().enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            *v = (0..4).map(|k| a[i][k] * b[k][j]).sum();
        }
    }
    m
}

/// The identity transform.
pub const IDENTITY: Mat4 = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]];

/// A frame id without a leading `/` (ROS 1 style names are accepted as tf2 does).
fn frame(name: &str) -> &str {
    name.strip_prefix('/').unwrap_or(name)
}

impl TfBuffer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds every transform of a `/tf` (`is_static` false) or `/tf_static` message. A bad
    /// transform (empty frame ids, a frame its own parent, not finite, zero quaternion) is
    /// skipped and named in the returned errors; the others are kept.
    pub fn add_message(&mut self, msg: &TfMessage, is_static: bool) -> Vec<String> {
        let mut errors = Vec::new();
        for t in &msg.transforms {
            if let Err(e) = self.add(t, is_static) {
                errors.push(e.to_string());
            }
        }
        errors
    }

    /// Adds one transform (see [`TfBuffer::add_message`]).
    pub fn add(&mut self, t: &TransformStamped, is_static: bool) -> Result<(), Error> {
        let (parent, child) = (frame(&t.header.frame_id), frame(&t.child_frame_id));
        if parent.is_empty() || child.is_empty() {
            return Err(Error::InvalidInput(format!("transform `{parent}` -> `{child}`: empty frame id")));
        }
        if parent == child {
            return Err(Error::InvalidInput(format!("transform of `{child}` to itself")));
        }
        let transform = transform_matrix(&t.translation, &t.rotation)
            .map_err(|e| Error::InvalidInput(format!("transform `{parent}` -> `{child}`: {e}")))?;
        let edge = Edge { parent: parent.to_string(), transform, stamp_ns: t.header.stamp.as_nanos(), is_static };
        let changed = self.edges.get(child).is_none_or(|old| old.parent != edge.parent || old.transform != edge.transform);
        self.edges.insert(child.to_string(), edge);
        if changed {
            self.version += 1;
        }
        Ok(())
    }

    /// Changes whenever an edge is added or changes value (not when one is re-sent unchanged).
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Frames with a parent.
    pub fn len(&self) -> usize {
        self.edges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.edges.is_empty()
    }

    /// The stamp of `child`'s edge and whether it is static.
    pub fn edge_stamp(&self, child: &str) -> Option<(i64, bool)> {
        self.edges.get(frame(child)).map(|e| (e.stamp_ns, e.is_static))
    }

    /// The chain from `f` up to its root: `(frame, f → frame)` for `f` and each ancestor.
    fn to_root(&self, f: &str) -> Result<Vec<(String, Mat4)>, Error> {
        let mut chain = vec![(f.to_string(), IDENTITY)];
        let mut acc = IDENTITY;
        let mut cur = f;
        while let Some(e) = self.edges.get(cur) {
            if chain.len() > MAX_DEPTH {
                return Err(Error::InvalidInput(format!("TF: frame `{f}` has more than {MAX_DEPTH} ancestors (a cycle?)")));
            }
            // f → parent = (cur → parent) · (f → cur)
            acc = mat4_mul(&e.transform, &acc);
            chain.push((e.parent.clone(), acc));
            cur = &e.parent;
        }
        Ok(chain)
    }

    /// The transform mapping points in `source` to `target`. Errors name the frames and what
    /// is missing (no common ancestor: the trees are not connected).
    pub fn lookup(&self, target: &str, source: &str) -> Result<Mat4, Error> {
        let (target, source) = (frame(target), frame(source));
        if target.is_empty() || source.is_empty() {
            return Err(Error::InvalidInput(format!("TF lookup `{source}` -> `{target}`: empty frame id")));
        }
        if target == source {
            return Ok(IDENTITY);
        }
        let up_s = self.to_root(source)?; // (ancestor, source → ancestor)
        let up_t = self.to_root(target)?; // (ancestor, target → ancestor)
        for (a, s_to_a) in &up_s {
            if let Some((_, t_to_a)) = up_t.iter().find(|(b, _)| b == a) {
                let a_to_t = mat4_inverse_affine(t_to_a, &format!("TF `{target}` -> `{a}`"))?;
                return Ok(mat4_mul(&a_to_t, s_to_a));
            }
        }
        let root = |c: &[(String, Mat4)]| c.last().map(|(n, _)| n.clone()).unwrap_or_default();
        Err(Error::InvalidInput(format!(
            "TF: no transform between `{source}` (root `{}`) and `{target}` (root `{}`): they are not connected (check /tf_static)",
            root(&up_s),
            root(&up_t)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::cdr::{CdrMessage, Header, Time};

    fn tf(parent: &str, child: &str, t: [f64; 3], q: [f64; 4]) -> TransformStamped {
        TransformStamped { header: Header { stamp: Time { sec: 1, nanosec: 2 }, frame_id: parent.into() }, child_frame_id: child.into(), translation: t, rotation: q }
    }

    fn apply(m: &Mat4, p: [f64; 3]) -> [f64; 3] {
        [0, 1, 2].map(|r| m[r][0] * p[0] + m[r][1] * p[1] + m[r][2] * p[2] + m[r][3])
    }

    fn close(a: [f64; 3], b: [f64; 3]) -> bool {
        a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-12)
    }

    /// 90° about z: (x, y, z, w) = (0, 0, sin 45°, cos 45°).
    const RZ90: [f64; 4] = [0.0, 0.0, std::f64::consts::FRAC_1_SQRT_2, std::f64::consts::FRAC_1_SQRT_2];
    const I: [f64; 4] = [0.0, 0.0, 0.0, 1.0];

    #[test]
    fn quaternion_to_matrix() {
        let m = transform_matrix(&[1.0, 2.0, 3.0], &RZ90).unwrap();
        // x axis of the child is the parent's y
        assert!(close(apply(&m, [1.0, 0.0, 0.0]), [1.0, 3.0, 3.0]));
        // un-normalised quaternions are normalised
        let m2 = transform_matrix(&[1.0, 2.0, 3.0], &RZ90.map(|v| v * 3.0)).unwrap();
        assert!(close(apply(&m2, [1.0, 0.0, 0.0]), [1.0, 3.0, 3.0]));
        assert!(transform_matrix(&[0.0; 3], &[0.0; 4]).is_err());
        assert!(transform_matrix(&[f64::NAN, 0.0, 0.0], &I).is_err());
    }

    /// base_link ← lidar_top (translation), base_link ← cam_front (rotation + translation),
    /// odom ← base_link (dynamic): the camera → LiDAR lookup chains through base_link.
    #[test]
    fn chains_through_the_common_ancestor_from_cdr_bytes() {
        let statics = TfMessage {
            transforms: vec![tf("base_link", "lidar_top", [1.0, 0.0, 2.0], I), tf("/base_link", "cam_front", [2.0, 0.5, 1.5], RZ90)],
        };
        let dynamic = TfMessage { transforms: vec![tf("odom", "base_link", [10.0, 20.0, 0.0], RZ90)] };
        // through CDR bytes, both byte orders (what the node's raw subscription and a bag give)
        let mut buf = TfBuffer::new();
        for (m, st, le) in [(&statics, true, true), (&dynamic, false, false)] {
            let bytes = m.to_cdr(le).unwrap();
            let back = TfMessage::from_cdr(&bytes).unwrap();
            assert_eq!(&back, m);
            assert!(buf.add_message(&back, st).is_empty());
        }
        assert_eq!(buf.len(), 3);
        let c2l = buf.lookup("lidar_top", "cam_front").unwrap();
        // camera origin: (2, 0.5, 1.5) in base_link = (1, 0.5, -0.5) in lidar_top
        assert!(close(apply(&c2l, [0.0; 3]), [1.0, 0.5, -0.5]));
        // camera x axis → base_link y
        assert!(close(apply(&c2l, [1.0, 0.0, 0.0]), [1.0, 1.5, -0.5]));
        // the inverse lookup undoes it
        let l2c = buf.lookup("cam_front", "lidar_top").unwrap();
        assert!(close(apply(&mat4_mul(&l2c, &c2l), [3.0, -4.0, 5.0]), [3.0, -4.0, 5.0]));
        // odom ← lidar_top: through the dynamic edge
        let o = buf.lookup("odom", "lidar_top").unwrap();
        assert!(close(apply(&o, [0.0; 3]), [10.0, 21.0, 2.0]));
        assert_eq!(buf.lookup("cam_front", "cam_front").unwrap(), IDENTITY);
        assert_eq!(buf.edge_stamp("base_link"), Some((1_000_000_002, false)));
    }

    #[test]
    fn changes_bump_the_version_and_bad_transforms_are_named() {
        let mut buf = TfBuffer::new();
        let m = TfMessage { transforms: vec![tf("base_link", "cam", [0.0; 3], I)] };
        buf.add_message(&m, true);
        let v = buf.version();
        buf.add_message(&m, true);
        assert_eq!(buf.version(), v, "an unchanged re-send is not a change");
        let moved = TfMessage { transforms: vec![tf("base_link", "cam", [0.0, 0.0, 0.01], I)] };
        buf.add_message(&moved, true);
        assert_eq!(buf.version(), v + 1);
        let bad = TfMessage {
            transforms: vec![
                tf("", "x", [0.0; 3], I),
                tf("y", "y", [0.0; 3], I),
                tf("a", "b", [0.0; 3], [0.0; 4]),
                tf("a", "c", [f64::INFINITY, 0.0, 0.0], I),
                tf("base_link", "lidar", [0.0; 3], I),
            ],
        };
        let errs = buf.add_message(&bad, false);
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(errs[0].contains("empty frame id") && errs[1].contains("itself") && errs[2].contains("zero length"), "{errs:?}");
        assert!(errs[3].contains("`a` -> `c`") && errs[3].contains("not finite"), "{errs:?}");
        assert!(buf.lookup("lidar", "cam").is_ok(), "the good one of the batch is kept");
        // unconnected trees
        buf.add(&tf("map", "other", [0.0; 3], I), true).unwrap();
        let e = buf.lookup("lidar", "other").unwrap_err().to_string();
        assert!(e.contains("not connected") && e.contains("root `map`") && e.contains("root `base_link`"), "{e}");
        assert!(buf.lookup("lidar", "").is_err());
        // a cycle is an error, not a hang
        buf.add(&tf("cam", "base_link", [0.0; 3], I), true).unwrap();
        let e = buf.lookup("lidar", "nowhere").unwrap_err().to_string();
        assert!(e.contains("cycle"), "{e}");
    }

    #[test]
    fn truncated_and_corrupt_tf_bytes_are_errors() {
        let m = TfMessage { transforms: vec![tf("base_link", "cam", [1.0, 2.0, 3.0], RZ90)] };
        let bytes = m.to_cdr(true).unwrap();
        for cut in [4, 8, 20, bytes.len() - 8] {
            assert!(TfMessage::from_cdr(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut huge = bytes.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(TfMessage::from_cdr(&huge), Err(crate::msgs::cdr::CdrError::SequenceTooLong { .. })));
        assert_eq!(TfMessage::from_cdr(&TfMessage::default().to_cdr(true).unwrap()).unwrap(), TfMessage::default());
    }
}
