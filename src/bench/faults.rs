//! Faults injected into `sptr bench pipeline --cameras --faults-every-s S`: a soak that proves
//! the node's frame neither falls over nor answers wrongly on bad input, and that it stays as
//! fast and as small as without faults.
//!
//! Every `S` seconds of frames a fault starts, the kinds in turn ([`Fault::ALL`]):
//!
//! | fault | what the frame's inputs get | what must be counted |
//! | --- | --- | --- |
//! | `silent_camera` | the last camera sends nothing for 3 s, then comes back | that camera `stale` (after `max_camera_lidar_delay`) until its next image |
//! | `stamp_collision` | the first camera's JPEG cut in half, stamped like its previous image | `decode_error` for that camera |
//! | `corrupt_jpeg` | the first camera's JPEG cut at 60 % with an end-of-image marker appended | `decode_error` for that camera |
//! | `calibration_change` | the second camera's CameraInfo with fx, fy 1 % larger for one frame, then back | two calibration changes |
//! | `big_clouds` | three clouds of 3,000,000 points in a row | three answered frames of 3,000,000 points |
//!
//! A frame with no fault (and out of a silent camera's window) is a good frame: all of its
//! cameras must be used and its map made. The bench's JSON `faults` says what was injected,
//! what the branch counted, and how many good frames were answered, with the latency of good
//! frames beside that of every frame.

/// One kind of injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    SilentCamera,
    StampCollision,
    CorruptJpeg,
    CalibrationChange,
    BigClouds,
}

impl Fault {
    pub const ALL: [Fault; 5] = [Fault::SilentCamera, Fault::StampCollision, Fault::CorruptJpeg, Fault::CalibrationChange, Fault::BigClouds];

    pub fn name(self) -> &'static str {
        match self {
            Fault::SilentCamera => "silent_camera",
            Fault::StampCollision => "stamp_collision",
            Fault::CorruptJpeg => "corrupt_jpeg",
            Fault::CalibrationChange => "calibration_change",
            Fault::BigClouds => "big_clouds",
        }
    }
}

/// How long a silent camera stays silent.
pub const SILENT_S: f64 = 3.0;
/// Clouds in a burst of big clouds, and their points.
pub const BIG_CLOUDS: usize = 3;
pub const BIG_CLOUD_POINTS: usize = 3_000_000;

/// What one frame's inputs get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrameFaults {
    /// The last camera sends nothing this frame.
    pub silent_camera: bool,
    /// The frame right after a silence: the camera's first image is back, its status may still
    /// be anything but a fault of ours (it is neither checked nor a good frame).
    pub silence_ends: bool,
    pub stamp_collision: bool,
    pub corrupt_jpeg: bool,
    /// The second camera's CameraInfo is the changed one (this frame only).
    pub calibration_change: bool,
    /// The frame right after a calibration change: the CameraInfo is back, a second change.
    pub calibration_back: bool,
    pub big_cloud: bool,
}

impl FrameFaults {
    /// A frame whose inputs are all good: every camera must be used, the map made.
    pub fn is_good(&self) -> bool {
        *self == FrameFaults::default()
    }
}

/// Which fault starts at which frame: one every `every` frames, the kinds in turn, from frame
/// `every` on (the first frames are good, for a baseline).
#[derive(Debug, Clone, Copy)]
pub struct FaultSchedule {
    every: usize,
    silent_frames: usize,
}

impl FaultSchedule {
    /// A fault every `every_s` seconds of frames at `rate_hz`. Errors when a fault would not end
    /// before the next begins (a silence of 3 s needs `every_s` > 3.5).
    pub fn new(every_s: f64, rate_hz: f64) -> Result<Self, String> {
        if !(every_s.is_finite() && every_s > SILENT_S + 0.5) {
            return Err(format!("--faults-every-s {every_s}: must be more than {} s (a silent camera stays silent {SILENT_S} s)", SILENT_S + 0.5));
        }
        let every = (every_s * rate_hz).round() as usize;
        let silent_frames = (SILENT_S * rate_hz).round().max(1.0) as usize;
        if every < silent_frames + BIG_CLOUDS + 2 {
            return Err(format!("--faults-every-s {every_s} at {rate_hz} Hz: {every} frames between faults, too few"));
        }
        Ok(FaultSchedule { every, silent_frames })
    }

    /// The fault that starts at timed frame `i`, if one does.
    pub fn starting_at(&self, i: usize) -> Option<Fault> {
        (i >= self.every && i % self.every == 0).then(|| Fault::ALL[(i / self.every - 1) % Fault::ALL.len()])
    }

    /// What timed frame `i`'s inputs get.
    pub fn at(&self, i: usize) -> FrameFaults {
        let mut f = FrameFaults::default();
        if i < self.every {
            return f;
        }
        let start = i - i % self.every;
        let since = i - start;
        match self.starting_at(start) {
            Some(Fault::SilentCamera) if since < self.silent_frames => f.silent_camera = true,
            Some(Fault::SilentCamera) if since == self.silent_frames => f.silence_ends = true,
            Some(Fault::StampCollision) if since == 0 => f.stamp_collision = true,
            Some(Fault::CorruptJpeg) if since == 0 => f.corrupt_jpeg = true,
            Some(Fault::CalibrationChange) if since == 0 => f.calibration_change = true,
            Some(Fault::CalibrationChange) if since == 1 => f.calibration_back = true,
            Some(Fault::BigClouds) if since < BIG_CLOUDS => f.big_cloud = true,
            _ => {}
        }
        f
    }
}

/// A JPEG cut at 60 % with an end-of-image marker appended: whole markers, too little scan data.
pub fn patched_jpeg(jpeg: &[u8]) -> Vec<u8> {
    let mut d = jpeg[..jpeg.len() * 6 / 10].to_vec();
    d.extend_from_slice(&[0xFF, 0xD9]);
    d
}

/// The cloud repeated, each copy moved 0.01 m along z, to `n` points.
pub fn big_cloud(p: &crate::Points, n: usize) -> crate::Points {
    let m = p.len().max(1);
    let mut out = crate::Points { has_intensity: p.has_intensity, ..Default::default() };
    for i in 0..n {
        let (j, copy) = (i % m, (i / m) as f32);
        out.x.push(p.x[j]);
        out.y.push(p.y[j]);
        out.z.push(p.z[j] + 0.01 * copy);
        out.intensity.push(p.intensity[j]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_fault_in_turn_then_good_frames() {
        let s = FaultSchedule::new(5.0, 20.0).unwrap();
        assert!((0..100).all(|i| s.at(i).is_good()), "the first 5 s are good");
        let starts: Vec<(usize, Fault)> = (0..700).filter_map(|i| s.starting_at(i).map(|f| (i, f))).collect();
        assert_eq!(starts.len(), 6);
        assert_eq!(starts[0], (100, Fault::SilentCamera));
        assert_eq!(starts[4], (500, Fault::BigClouds));
        assert_eq!(starts[5], (600, Fault::SilentCamera), "then again from the first");
        assert!((100..160).all(|i| s.at(i).silent_camera) && s.at(160).silence_ends && s.at(161).is_good());
        assert!(s.at(200).stamp_collision && s.at(201).is_good());
        assert!(s.at(300).corrupt_jpeg && s.at(301).is_good());
        assert!(s.at(400).calibration_change && s.at(401).calibration_back && s.at(402).is_good());
        assert!((500..503).all(|i| s.at(i).big_cloud) && s.at(503).is_good());
        let bad: usize = (0..700).filter(|&i| !s.at(i).is_good()).count();
        assert_eq!(bad, 61 + 1 + 1 + 2 + 3 + 61);
        assert!(FaultSchedule::new(3.0, 20.0).is_err());
        assert!(FaultSchedule::new(f64::NAN, 20.0).is_err());
    }

    #[test]
    fn patched_jpegs_and_big_clouds() {
        let j: Vec<u8> = (0..100u8).collect();
        let p = patched_jpeg(&j);
        assert_eq!(p.len(), 62);
        assert_eq!(&p[60..], &[0xFF, 0xD9]);
        let pts = crate::Points { x: vec![1.0, 2.0], y: vec![3.0, 4.0], z: vec![5.0, 6.0], intensity: vec![7.0, 8.0], has_intensity: true, ring: None, time: None };
        let b = big_cloud(&pts, 5);
        assert_eq!(b.x, vec![1.0, 2.0, 1.0, 2.0, 1.0]);
        assert_eq!(b.z, vec![5.0, 6.0, 5.01, 6.01, 5.02]);
    }
}
