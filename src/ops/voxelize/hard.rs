//! Hard voxelization as BEVFusion's LiDAR branch does it (mit-han-lab/bevfusion at db75150:
//! `mmdet3d/ops/voxel/voxelize.py` `Voxelization` with `deterministic=True`, its
//! `hard_voxelize` CPU/CUDA kernels, then `BEVFusion.voxelize` with `voxelize_reduce`). Facts:
//!
//! - Cell of a point, per axis, in float32: `c = floor((p - range_min) / voxel_size)`; the point
//!   is dropped unless `0 <= c < grid`, `grid = round((range_max - range_min) / voxel_size)`
//!   (float32; 1024 × 1024 × 40 for the nuScenes configs). Ranges and sizes are the config's
//!   doubles cast to float32, as pybind11 passes them.
//! - Coordinates are stored `(x, y, z)` (this fork writes `coor[j] = c`, not mmdet3d's reversed
//!   `(z, y, x)`), then `F.pad(c, (1, 0), value=k)` puts the batch index first: `[b, x, y, z]`,
//!   the order `SparseEncoder` hands spconv with `sparse_shape [1024, 1024, 41]` (x, y, z).
//! - Voxels are numbered in the order of their first point (point order); a voxel whose first
//!   point arrives when `max_voxels` voxels exist is dropped with all its points. A voxel keeps its
//!   first `max_num_points` points in point order; later ones are dropped.
//! - Features: every column of the kept points (x, y, z, intensity, time lag), summed over the
//!   voxel's slots and divided by the count, in float32 (`feats.sum(dim=1) / sizes`).
//!
//! - With `range_filter` (on in the model YAML path): upstream's test pipeline runs
//!   `PointsRangeFilter` (`min < p < max` per axis, float32, strict) on the points before the model.
//!
//! Deviations, all about inputs upstream does not define: a point with NaN or Inf in any column
//! is dropped and counted (upstream's float→int cast of NaN is undefined behaviour), and so is one
//! with a value beyond ±65504 (FP16's range: upstream's FP16 evaluation would make it Inf). The sum here
//! runs in point order; PyTorch's reduction order over the 10 slots is its own (a last-bit
//! difference at most).
//!
//! Upstream's mixed-precision evaluation (`tools/test.py` with `fp16` in the config) casts the
//! points to FP16 in `BEVFusion.forward` (`@auto_fp16(apply_to=("img", "points"))`) before
//! `voxelize` casts them back: [`HardVoxelParams::round_points_to_fp16`] reproduces that.

use crate::Error;
use half::f16;
use std::collections::HashMap;

/// Columns of an input point: x, y, z, intensity, time lag of its sweep (upstream's layout).
pub const POINT_COLUMNS: usize = 5;

/// How points become voxels (`model.encoders.lidar.voxelize` of the model YAML).
#[derive(Debug, Clone, PartialEq)]
pub struct HardVoxelParams {
    /// `[x, y, z]` metres.
    pub voxel_size: [f64; 3],
    /// `[xmin, ymin, zmin, xmax, ymax, zmax]` metres.
    pub point_cloud_range: [f64; 6],
    /// Points kept per voxel (`max_num_points`).
    pub max_num_points: usize,
    /// Voxels kept (`max_voxels[1]`, the test-time value).
    pub max_voxels: usize,
    /// Round every column to FP16 and back first, as upstream's FP16 evaluation does.
    pub round_points_to_fp16: bool,
    /// Keep only points strictly inside the range first (`min < p < max` per axis, float32), as
    /// upstream's test pipeline does with `PointsRangeFilter` before the model: it drops points
    /// on the lower faces, which the voxelizer alone would keep.
    pub range_filter: bool,
}

/// The float32 constants the kernels use: voxel size, range minimum, grid extent per axis.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HardVoxelGrid {
    pub voxel: [f32; 3],
    pub min: [f32; 3],
    pub max: [f32; 3],
    pub grid: [i32; 3],
}

impl HardVoxelParams {
    /// Checks the parameters and derives the float32 grid (errors say which value is wrong).
    pub fn grid(&self) -> Result<HardVoxelGrid, Error> {
        let mut g = HardVoxelGrid { voxel: [0.0; 3], min: [0.0; 3], max: [0.0; 3], grid: [0; 3] };
        for a in 0..3 {
            let (v, lo, hi) = (self.voxel_size[a] as f32, self.point_cloud_range[a] as f32, self.point_cloud_range[a + 3] as f32);
            if !(v.is_finite() && v > 0.0) {
                return Err(Error::InvalidInput(format!("hard voxelization: voxel_size[{a}] = {} must be positive", self.voxel_size[a])));
            }
            if !(lo.is_finite() && hi.is_finite() && lo < hi) {
                return Err(Error::InvalidInput(format!(
                    "hard voxelization: point_cloud_range axis {a} needs finite min < max, got {} .. {}",
                    self.point_cloud_range[a],
                    self.point_cloud_range[a + 3]
                )));
            }
            let n = ((hi - lo) / v).round();
            if !(1.0..=65536.0).contains(&n) {
                return Err(Error::InvalidInput(format!("hard voxelization: axis {a} has {n} cells, need 1 ..= 65536")));
            }
            g.voxel[a] = v;
            g.min[a] = lo;
            g.max[a] = hi;
            g.grid[a] = n as i32;
        }
        if self.max_num_points == 0 || self.max_num_points > 1024 {
            return Err(Error::InvalidInput(format!("hard voxelization: max_num_points {} must be in 1 ..= 1024", self.max_num_points)));
        }
        if self.max_voxels == 0 || self.max_voxels >= i32::MAX as usize {
            return Err(Error::InvalidInput(format!("hard voxelization: max_voxels {} must be in 1 .. 2^31-1", self.max_voxels)));
        }
        Ok(g)
    }
}

impl HardVoxelGrid {
    /// Total cells (fits u64: each axis is at most 65536).
    pub fn cells(&self) -> u64 {
        self.grid.iter().map(|&g| g as u64).product()
    }

    /// The cell of `(x, y, z)`, upstream's float32 arithmetic, or None when outside the grid.
    /// Callers have checked that the values are finite.
    pub fn cell(&self, p: [f32; 3]) -> Option<[i32; 3]> {
        let mut c = [0i32; 3];
        for a in 0..3 {
            let f = ((p[a] - self.min[a]) / self.voxel[a]).floor();
            // compare as floats: no int conversion of far-away values
            if !(f >= 0.0 && f < self.grid[a] as f32) {
                return None;
            }
            c[a] = f as i32;
        }
        Some(c)
    }

    /// `PointsRangeFilter`: strictly inside the range on every axis (float32 comparisons).
    pub fn strictly_inside(&self, p: [f32; 3]) -> bool {
        (0..3).all(|a| p[a] > self.min[a] && p[a] < self.max[a])
    }

    /// Row-major key `(x * Gy + y) * Gz + z`.
    pub fn key(&self, c: [i32; 3]) -> u64 {
        (c[0] as u64 * self.grid[1] as u64 + c[1] as u64) * self.grid[2] as u64 + c[2] as u64
    }
}

/// What happened to the points and voxels of one call (never silent: the node reports these).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HardVoxelStats {
    pub points_in: usize,
    /// Points with NaN or Inf in any column, or a value beyond FP16's range ([`MAX_ABS_VALUE`]).
    pub non_finite: usize,
    /// Finite points outside `point_cloud_range` (cell outside the grid, or on a face with
    /// `range_filter`).
    pub out_of_range: usize,
    /// Points beyond `max_num_points` in a kept voxel.
    pub points_over_max: usize,
    /// Distinct voxels the points fall in, before the cap.
    pub voxels_total: usize,
    /// Voxels returned: `min(voxels_total, max_voxels)`.
    pub voxels_kept: usize,
    /// Points in the voxels dropped by the cap.
    pub points_capped: usize,
}

impl HardVoxelStats {
    pub fn voxels_dropped(&self) -> usize {
        self.voxels_total - self.voxels_kept
    }
    /// Points whose values entered a voxel's mean.
    pub fn points_used(&self) -> usize {
        self.points_in - self.non_finite - self.out_of_range - self.points_over_max - self.points_capped
    }
}

/// Voxels of one cloud (batch index 0), in upstream's order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HardVoxels {
    /// `[b, x, y, z]` per voxel.
    pub coords: Vec<[i32; 4]>,
    /// Mean of the kept points' columns, `len * POINT_COLUMNS`, row-major.
    pub feats: Vec<f32>,
    /// Points averaged per voxel (1 ..= max_num_points).
    pub counts: Vec<u32>,
    pub stats: HardVoxelStats,
}

impl HardVoxels {
    pub fn len(&self) -> usize {
        self.coords.len()
    }
    pub fn is_empty(&self) -> bool {
        self.coords.is_empty()
    }
}

/// Rows `(x, y, z, intensity, time_lag)` of one sweep (upstream sets the key frame's lag to 0 and
/// each earlier sweep's to its timestamp difference in seconds).
pub fn point_rows(points: &crate::Points, time_lag: f32) -> Vec<[f32; POINT_COLUMNS]> {
    (0..points.len()).map(|i| [points.x[i], points.y[i], points.z[i], points.intensity[i], time_lag]).collect()
}

/// A stand-in for a multi-sweep nuScenes cloud built from one sweep, for tests and benchmarks:
/// copy k (0 ≤ k < `sweeps`) of `rows` rotated by 0.6·k degrees about z and shifted by −0.4·k m
/// along x (as if the ego moved), with time lag 0.05·k s (upstream's lag column). Ten copies of
/// the 34,688-point test sweep give 346,880 points and more than 120,000 voxels.
pub fn synthetic_sweeps(rows: &[[f32; POINT_COLUMNS]], sweeps: usize) -> Vec<[f32; POINT_COLUMNS]> {
    let mut out = Vec::with_capacity(rows.len() * sweeps);
    for k in 0..sweeps {
        let (s, c) = ((0.6 * k as f64).to_radians().sin() as f32, (0.6 * k as f64).to_radians().cos() as f32);
        let (dx, lag) = (-0.4 * k as f32, 0.05 * k as f32);
        out.extend(rows.iter().map(|p| [c * p[0] - s * p[1] + dx, s * p[0] + c * p[1], p[2], p[3], lag]));
    }
    out
}

/// Largest magnitude a point column may have: FP16's largest finite value. Beyond it the CUDA
/// path's FP16 features (and upstream's FP16 evaluation, which casts the points to FP16) would
/// hold Inf, so such a point is dropped on every path and counted with the non-finite ones.
pub const MAX_ABS_VALUE: f32 = 65504.0;

/// The point as the voxelizer reads it: FP16-rounded when asked, None when a column is NaN, Inf
/// or beyond [`MAX_ABS_VALUE`].
pub(crate) fn read_point(p: &[f32; POINT_COLUMNS], fp16: bool) -> Option<[f32; POINT_COLUMNS]> {
    if !p.iter().all(|v| v.is_finite() && v.abs() <= MAX_ABS_VALUE) {
        return None;
    }
    Some(if fp16 { p.map(|v| f16::from_f32(v).to_f32()) } else { *p })
}

/// Hard voxelization of one cloud on the CPU (the reference the CUDA path matches exactly).
pub fn hard_voxelize_cpu(points: &[[f32; POINT_COLUMNS]], params: &HardVoxelParams) -> Result<HardVoxels, Error> {
    let grid = params.grid()?;
    let mut stats = HardVoxelStats { points_in: points.len(), ..Default::default() };
    // voxel slot by cell key; None = a voxel dropped by the cap (its later points are dropped too)
    let mut slot: HashMap<u64, Option<u32>> = HashMap::new();
    let mut out = HardVoxels::default();
    let mut sums: Vec<[f32; POINT_COLUMNS]> = Vec::new();
    for p in points {
        let Some(q) = read_point(p, params.round_points_to_fp16) else {
            stats.non_finite += 1;
            continue;
        };
        let inside = !params.range_filter || grid.strictly_inside([q[0], q[1], q[2]]);
        let Some(c) = grid.cell([q[0], q[1], q[2]]).filter(|_| inside) else {
            stats.out_of_range += 1;
            continue;
        };
        let key = grid.key(c);
        let v = match slot.get(&key) {
            Some(v) => *v,
            None => {
                stats.voxels_total += 1;
                let v = (out.coords.len() < params.max_voxels).then_some(out.coords.len() as u32);
                if v.is_some() {
                    out.coords.push([0, c[0], c[1], c[2]]);
                    out.counts.push(0);
                    sums.push([0.0; POINT_COLUMNS]);
                }
                slot.insert(key, v);
                v
            }
        };
        let Some(v) = v else {
            stats.points_capped += 1;
            continue;
        };
        let v = v as usize;
        if out.counts[v] as usize >= params.max_num_points {
            stats.points_over_max += 1;
            continue;
        }
        out.counts[v] += 1;
        for (s, x) in sums[v].iter_mut().zip(q) {
            *s += x;
        }
    }
    out.feats = Vec::with_capacity(sums.len() * POINT_COLUMNS);
    for (s, &n) in sums.iter().zip(&out.counts) {
        out.feats.extend(s.iter().map(|&v| v / n as f32));
    }
    stats.voxels_kept = out.coords.len();
    out.stats = stats;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> HardVoxelParams {
        HardVoxelParams {
            voxel_size: [0.1, 0.1, 0.2],
            point_cloud_range: [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0],
            max_num_points: 10,
            max_voxels: 120000,
            round_points_to_fp16: false,
            range_filter: false,
        }
    }

    #[test]
    fn nuscenes_grid() {
        let g = params().grid().unwrap();
        assert_eq!(g.grid, [1024, 1024, 40]);
        assert_eq!(g.cells(), 1024 * 1024 * 40);
        assert_eq!(g.cell([-51.2, -51.2, -5.0]), Some([0, 0, 0]));
        assert_eq!(g.cell([51.2, 0.0, 0.0]), None, "upper bound is exclusive");
        assert_eq!(g.cell([0.0, 0.0, 0.0]), Some([512, 512, 25]));
        assert!(!g.strictly_inside([-51.2, 0.0, 0.0]), "PointsRangeFilter is strict");
        assert!(g.strictly_inside([-51.19, 51.19, 2.99]));
    }

    #[test]
    fn bad_params() {
        let mut p = params();
        p.voxel_size[1] = 0.0;
        assert!(p.grid().is_err());
        let mut p = params();
        p.point_cloud_range[5] = -6.0;
        assert!(p.grid().is_err());
        let mut p = params();
        p.max_num_points = 0;
        assert!(p.grid().is_err());
        let mut p = params();
        p.max_voxels = 0;
        assert!(p.grid().is_err());
    }
}
