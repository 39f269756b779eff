//! Camera ⇄ LiDAR synchronisation: each LiDAR cloud makes a frame with the latest image of each
//! camera (autoware_bevfusion's rule); frames never wait for cameras.
//!
//! A camera is masked out of a frame (its features contribute nothing, see
//! [`crate::models::bevfusion::lss::CameraMask`]) when it has no image yet (`missing`), or when its latest
//! image's stamp differs from the cloud's by more than `max_camera_lidar_delay` in either
//! direction (`stale`: older; `ahead`: newer, e.g. a clock jump or a bag played out of order).
//! Each outcome is counted per camera. The age reported per camera is the cloud's stamp minus
//! the image's (positive: the image is older).
//!
//! Generic over what is kept per camera (the node keeps the message, replay its bytes), so the
//! rule is one piece of code, unit-tested here without ROS.

use crate::models::bevfusion::lss::CameraMask;

/// What a frame got from one camera.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CameraUse {
    /// Its latest image is used; `age_ns` = cloud stamp − image stamp.
    Used { age_ns: i64 },
    /// Masked: its latest image is older than the cloud by more than the limit.
    Stale { age_ns: i64 },
    /// Masked: its latest image is newer than the cloud by more than the limit.
    Ahead { age_ns: i64 },
    /// Masked: no image yet.
    Missing,
}

impl CameraUse {
    pub fn is_used(&self) -> bool {
        matches!(self, CameraUse::Used { .. })
    }

    /// The age of the image considered (None when there is none).
    pub fn age_ns(&self) -> Option<i64> {
        match *self {
            CameraUse::Used { age_ns } | CameraUse::Stale { age_ns } | CameraUse::Ahead { age_ns } => Some(age_ns),
            CameraUse::Missing => None,
        }
    }

    /// `used`, `stale`, `ahead` or `missing`.
    pub fn name(&self) -> &'static str {
        match self {
            CameraUse::Used { .. } => "used",
            CameraUse::Stale { .. } => "stale",
            CameraUse::Ahead { .. } => "ahead",
            CameraUse::Missing => "missing",
        }
    }
}

/// Per camera, how its frames went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CameraCounts {
    pub used: u64,
    pub stale: u64,
    pub ahead: u64,
    pub missing: u64,
    /// Images that replaced one no frame had used (the camera is faster than the LiDAR).
    pub replaced_unused: u64,
}

impl CameraCounts {
    /// Frames this camera was masked out of, for any reason.
    pub fn masked(&self) -> u64 {
        self.stale + self.ahead + self.missing
    }
}

struct Slot<T> {
    stamp_ns: i64,
    item: T,
    used: bool,
}

/// The latest image of each camera and the per-camera counts.
pub struct CameraSync<T> {
    names: Vec<String>,
    max_delay_ns: i64,
    latest: Vec<Option<Slot<T>>>,
    counts: Vec<CameraCounts>,
}

/// One frame's cameras: per camera what happened and, when used, a reference to its item.
#[derive(Debug)]
pub struct SyncedFrame<'a, T> {
    pub cameras: Vec<(CameraUse, Option<&'a T>)>,
}

impl<T> SyncedFrame<'_, T> {
    /// Bit `n` set for every camera used.
    pub fn mask(&self) -> CameraMask {
        let mut m = 0u32;
        for (i, (u, _)) in self.cameras.iter().enumerate().take(32) {
            if u.is_used() {
                m |= 1 << i;
            }
        }
        CameraMask(m)
    }

    /// Cameras used.
    pub fn used(&self) -> usize {
        self.cameras.iter().filter(|(u, _)| u.is_used()).count()
    }
}

impl<T> CameraSync<T> {
    /// `names` in the network's camera order; `max_delay_s` is `max_camera_lidar_delay`
    /// (finite, ≥ 0; checked by the parameters).
    pub fn new(names: &[String], max_delay_s: f64) -> Self {
        CameraSync {
            names: names.to_vec(),
            max_delay_ns: (max_delay_s * 1e9).round() as i64,
            latest: names.iter().map(|_| None).collect(),
            counts: vec![CameraCounts::default(); names.len()],
        }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The index of camera `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Camera `camera`'s new image (stamped `stamp_ns`) replaces its previous one. Returns false
    /// for a camera index out of range.
    pub fn put(&mut self, camera: usize, stamp_ns: i64, item: T) -> bool {
        let Some(slot) = self.latest.get_mut(camera) else { return false };
        if slot.as_ref().is_some_and(|s| !s.used) {
            self.counts[camera].replaced_unused += 1;
        }
        *slot = Some(Slot { stamp_ns, item, used: false });
        true
    }

    /// Forgets camera `camera`'s image (it could not be decoded): the camera is `missing` until
    /// its next image.
    pub fn clear(&mut self, camera: usize) {
        if let Some(s) = self.latest.get_mut(camera) {
            *s = None;
        }
    }

    /// The frame of a cloud stamped `cloud_ns`: each camera's latest image, or why it is masked;
    /// counted. Images stay for later frames (a camera slower than the LiDAR serves two).
    pub fn frame(&mut self, cloud_ns: i64) -> SyncedFrame<'_, T> {
        let max = self.max_delay_ns;
        let mut cameras = Vec::with_capacity(self.latest.len());
        for (slot, counts) in self.latest.iter_mut().zip(self.counts.iter_mut()) {
            let u = match slot {
                None => CameraUse::Missing,
                Some(s) => {
                    let age_ns = cloud_ns.saturating_sub(s.stamp_ns);
                    if age_ns > max {
                        CameraUse::Stale { age_ns }
                    } else if age_ns < -max {
                        CameraUse::Ahead { age_ns }
                    } else {
                        s.used = true;
                        CameraUse::Used { age_ns }
                    }
                }
            };
            match u {
                CameraUse::Used { .. } => counts.used += 1,
                CameraUse::Stale { .. } => counts.stale += 1,
                CameraUse::Ahead { .. } => counts.ahead += 1,
                CameraUse::Missing => counts.missing += 1,
            }
            let item = if u.is_used() { slot.as_ref().map(|s| &s.item) } else { None };
            cameras.push((u, item));
        }
        SyncedFrame { cameras }
    }

    /// Per camera counts, in camera order.
    pub fn counts(&self) -> &[CameraCounts] {
        &self.counts
    }

    /// Camera `camera`'s latest image stamp.
    pub fn latest_stamp(&self, camera: usize) -> Option<i64> {
        self.latest.get(camera)?.as_ref().map(|s| s.stamp_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("CAM_{i}")).collect()
    }

    #[test]
    fn latest_image_within_the_delay_is_used_else_masked_and_counted() {
        let mut s = CameraSync::new(&names(4), 0.12);
        let t = 1_000 * MS;
        s.put(0, t - 30 * MS, "a0");
        s.put(0, t - 10 * MS, "a1"); // replaces a0 before any frame used it
        s.put(1, t - 121 * MS, "b");
        s.put(2, t + 121 * MS, "c");
        // camera 3: nothing
        let f = s.frame(t);
        assert_eq!(f.cameras[0], (CameraUse::Used { age_ns: 10 * MS }, Some(&"a1")));
        assert_eq!(f.cameras[1], (CameraUse::Stale { age_ns: 121 * MS }, None));
        assert_eq!(f.cameras[2], (CameraUse::Ahead { age_ns: -121 * MS }, None));
        assert_eq!(f.cameras[3], (CameraUse::Missing, None));
        assert_eq!(f.mask(), CameraMask(0b0001));
        assert_eq!(f.used(), 1);
        // exactly at the limit is used (either side)
        s.put(1, t - 120 * MS, "b2");
        s.put(2, t + 120 * MS, "c2");
        let f = s.frame(t);
        assert_eq!(f.mask(), CameraMask(0b0111));
        assert_eq!(f.cameras[2].0.age_ns(), Some(-120 * MS));
        let c = s.counts();
        assert_eq!(c[0], CameraCounts { used: 2, replaced_unused: 1, ..Default::default() });
        // b and c were masked, then replaced: never used
        assert_eq!(c[1], CameraCounts { used: 1, stale: 1, replaced_unused: 1, ..Default::default() });
        assert_eq!(c[2], CameraCounts { used: 1, ahead: 1, replaced_unused: 1, ..Default::default() });
        assert_eq!(c[3], CameraCounts { missing: 2, ..Default::default() });
        assert_eq!(c[3].masked(), 2);
        assert_eq!(s.latest_stamp(0), Some(t - 10 * MS));
    }

    #[test]
    fn a_camera_that_stops_goes_stale_without_waiting() {
        let mut s = CameraSync::new(&names(1), 0.12);
        s.put(0, 0, 7u32);
        // 10 Hz clouds: the one image serves the frames within 120 ms, then is masked
        let uses: Vec<&str> = (0..4).map(|k| s.frame(k * 100 * MS).cameras[0].0.name()).collect();
        assert_eq!(uses, ["used", "used", "stale", "stale"]);
        // a used image that is replaced is not "replaced unused"
        s.put(0, 400 * MS, 8);
        assert_eq!(s.counts()[0].replaced_unused, 0);
        s.clear(0);
        assert_eq!(s.frame(400 * MS).cameras[0].0, CameraUse::Missing);
        assert!(!s.put(5, 0, 1), "no camera 5");
        assert_eq!(s.index("CAM_0"), Some(0));
        assert_eq!(s.index("x"), None);
    }

    #[test]
    fn zero_delay_and_extreme_stamps() {
        let mut s = CameraSync::new(&names(2), 0.0);
        s.put(0, 5, ());
        s.put(1, i64::MIN, ());
        let f = s.frame(5);
        assert!(f.cameras[0].0.is_used());
        // i64::MAX - i64::MIN saturates instead of overflowing
        let f = s.frame(i64::MAX);
        assert_eq!(f.cameras[1].0, CameraUse::Stale { age_ns: i64::MAX });
    }
}
