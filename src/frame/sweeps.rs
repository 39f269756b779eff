//! LiDAR sweep aggregation for the fusion model's LiDAR input (upstream
//! `LoadPointsFromMultiSweeps`): the last `lidar.sweeps` clouds, each moved into the current
//! cloud's frame by the ego motion between them, with the time lag (current stamp − sweep stamp,
//! seconds) as the 5th feature (0 for the current cloud).
//!
//! Ego motion: each cloud comes with its pose `odom ← lidar` at its stamp (from TF, `odom` →
//! `base_link` → the cloud's frame, or an odometry source), and sweep `k`'s points go to the
//! current frame by `inv(pose_now) · pose_k`. When the current cloud or any older one has no
//! pose, only the current cloud is used (as with `sweeps: 1`): sweeps that cannot be moved would
//! smear every static object. Upstream's nuScenes models take 10 sweeps; one sweep is less
//! accurate (sparser LiDAR BEV features).

use std::collections::VecDeque;

use crate::sensors::calib::camera::{mat4_inverse_affine, Mat4};
use crate::sensors::calib::tf::mat4_mul;
use crate::{Error, Points};

/// The fusion model's LiDAR input: `x, y, z, intensity, time lag` per point.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepPoints {
    pub x: Vec<f32>,
    pub y: Vec<f32>,
    pub z: Vec<f32>,
    pub intensity: Vec<f32>,
    /// Seconds since the sweep's stamp at the current cloud's stamp (0 for the current cloud).
    pub time_lag: Vec<f32>,
    /// How many clouds were aggregated.
    pub sweeps: usize,
}

impl SweepPoints {
    pub fn len(&self) -> usize {
        self.x.len()
    }

    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }
}

struct Sweep {
    stamp_ns: i64,
    points: Points,
    pose: Option<Mat4>,
}

/// The last `max` clouds.
pub struct SweepBuffer {
    max: usize,
    sweeps: VecDeque<Sweep>,
}

impl SweepBuffer {
    /// `max` = `lidar.sweeps` (≥ 1; checked by the parameters, clamped here).
    pub fn new(max: usize) -> Self {
        SweepBuffer { max: max.max(1), sweeps: VecDeque::new() }
    }

    /// Adds the newest cloud with its pose `odom ← cloud frame` (None: unknown). A cloud stamped
    /// before the newest one kept (a bag replayed out of order, a clock jump back) empties the
    /// buffer first: its time lags would be negative.
    pub fn push(&mut self, stamp_ns: i64, points: Points, pose: Option<Mat4>) {
        if self.sweeps.back().is_some_and(|s| s.stamp_ns > stamp_ns) {
            self.sweeps.clear();
        }
        self.sweeps.push_back(Sweep { stamp_ns, points, pose });
        while self.sweeps.len() > self.max {
            self.sweeps.pop_front();
        }
    }

    /// Clouds kept.
    pub fn len(&self) -> usize {
        self.sweeps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sweeps.is_empty()
    }

    /// The aggregated points of the kept clouds in the newest cloud's frame (see the module
    /// doc), newest first. Errors only on a pose that cannot be inverted.
    pub fn aggregate(&self) -> Result<SweepPoints, Error> {
        let mut out = SweepPoints::default();
        let Some(now) = self.sweeps.back() else { return Ok(out) };
        let all_posed = self.sweeps.iter().all(|s| s.pose.is_some());
        let inv_now = match (&now.pose, all_posed) {
            (Some(p), true) => Some(mat4_inverse_affine(p, "ego pose of the current cloud")?),
            _ => None,
        };
        let total: usize = self.sweeps.iter().map(|s| s.points.len()).sum();
        for v in [&mut out.x, &mut out.y, &mut out.z, &mut out.intensity, &mut out.time_lag] {
            v.reserve_exact(total);
        }
        for s in self.sweeps.iter().rev() {
            let is_now = std::ptr::eq(s, now);
            if !is_now && inv_now.is_none() {
                break;
            }
            let m = match (&inv_now, &s.pose) {
                (Some(inv), Some(p)) if !is_now => Some(mat4_mul(inv, p)),
                _ => None,
            };
            let lag = ((now.stamp_ns - s.stamp_ns) as f64 * 1e-9) as f32;
            let p = &s.points;
            let n = p.len();
            if p.has_intensity {
                out.intensity.extend_from_slice(&p.intensity[..n]);
            } else {
                out.intensity.resize(out.intensity.len() + n, 0.0);
            }
            out.time_lag.resize(out.time_lag.len() + n, lag);
            let Some(m) = &m else {
                // The current cloud (or no ego motion): as it is, copied in bulk.
                out.x.extend_from_slice(&p.x[..n]);
                out.y.extend_from_slice(&p.y[..n]);
                out.z.extend_from_slice(&p.z[..n]);
                out.sweeps += 1;
                continue;
            };
            for i in 0..n {
                let (x, y, z) = (p.x[i] as f64, p.y[i] as f64, p.z[i] as f64);
                out.x.push((m[0][0] * x + m[0][1] * y + m[0][2] * z + m[0][3]) as f32);
                out.y.push((m[1][0] * x + m[1][1] * y + m[1][2] * z + m[1][3]) as f32);
                out.z.push((m[2][0] * x + m[2][1] * y + m[2][2] * z + m[2][3]) as f32);
            }
            out.sweeps += 1;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sensors::calib::tf::{transform_matrix, IDENTITY};

    fn cloud(xs: &[f32]) -> Points {
        Points {
            x: xs.to_vec(),
            y: vec![0.0; xs.len()],
            z: vec![0.5; xs.len()],
            intensity: vec![7.0; xs.len()],
            has_intensity: true,
            ring: None,
            time: None,
        }
    }

    fn at(x: f64) -> Mat4 {
        transform_matrix(&[x, 0.0, 0.0], &[0.0, 0.0, 0.0, 1.0]).unwrap()
    }

    #[test]
    fn sweeps_are_moved_by_ego_motion_with_their_time_lag() {
        let mut b = SweepBuffer::new(3);
        // a static object at odom x = 10: seen at lidar x = 10, 9, 8, 7 as the car drives +1 m per 0.1 s
        for k in 0..4 {
            b.push(k * 100_000_000, cloud(&[10.0 - k as f32]), Some(at(k as f64)));
        }
        assert_eq!(b.len(), 3);
        let a = b.aggregate().unwrap();
        assert_eq!(a.sweeps, 3);
        // all three land on the object's position in the current frame (x = 7)
        assert_eq!(a.x, vec![7.0, 7.0, 7.0]);
        for (got, want) in a.time_lag.iter().zip([0.0f32, 0.1, 0.2]) {
            assert!((got - want).abs() < 1e-7, "{:?}", a.time_lag);
        }
        assert_eq!(a.intensity, vec![7.0; 3]);
        assert_eq!(a.z, vec![0.5; 3]);
    }

    #[test]
    fn without_poses_only_the_current_cloud_and_a_rewind_restarts() {
        let mut b = SweepBuffer::new(10);
        b.push(0, cloud(&[1.0]), Some(IDENTITY));
        b.push(100, cloud(&[2.0, 3.0]), None);
        let a = b.aggregate().unwrap();
        assert_eq!((a.sweeps, a.x.clone(), a.time_lag.clone()), (1, vec![2.0, 3.0], vec![0.0, 0.0]));
        // a stamp going back empties the buffer
        b.push(50, cloud(&[4.0]), Some(IDENTITY));
        assert_eq!(b.len(), 1);
        assert_eq!(SweepBuffer::new(0).aggregate().unwrap(), SweepPoints::default());
        // sweeps: 1 keeps one cloud
        let mut one = SweepBuffer::new(1);
        one.push(0, cloud(&[1.0]), Some(IDENTITY));
        one.push(1, cloud(&[2.0]), Some(IDENTITY));
        assert_eq!(one.aggregate().unwrap().x, vec![2.0]);
        // a pose that cannot be inverted is an error
        let mut bad = SweepBuffer::new(2);
        let mut singular = IDENTITY;
        singular[0][0] = 0.0;
        bad.push(0, cloud(&[1.0]), Some(IDENTITY));
        bad.push(1, cloud(&[1.0]), Some(singular));
        assert!(bad.aggregate().is_err());
    }
}
