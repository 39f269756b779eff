//! Voxelization: points -> voxels with batch-first int32 coordinates `[b, x, y, z]`.
//!
//! The CPU reference here and the CUDA path (`voxelize_cuda.rs`) do the same arithmetic in the
//! same order, so their coordinates agree exactly and their features to FP16 rounding:
//!
//! 1. voxel-space position `c = p`, clamped onto `pc_range` (`Clip`) or the point dropped
//!    (`Drop`), in the configured precision (SphereFormer: float64 for SemanticKITTI);
//! 2. origin `o`: the sample's minimum of `c` (`ScanMin`, SphereFormer's inference), the range's
//!    lower corner, or zero (negative coordinates then allowed);
//! 3. coordinate `q = floor((c - o) / voxel_size)`;
//! 4. voxels ordered by the packed key of `(b, x, y, z)`, i.e. lexicographically: the output order
//!    is deterministic and independent of the input order of voxels;
//! 5. per voxel, in input point order: mean of the raw features (x, y, z, intensity, summed in
//!    f32) and mean of the voxel-space positions `c` (metres);
//! 6. voxels past `max_voxels` in key order are dropped and counted; their points map to -1.
//!
//! A point with NaN or Inf in any value the network reads (x, y, z or intensity: the voxel
//! features) gets no voxel and takes no part in anything above (not even the scan minimum): it is
//! counted in [`VoxelStats::non_finite`] and the other points come out as if it were not there.

use crate::{Error, Points};
use rayon::prelude::*;
use serde::Deserialize;

/// What happens to points outside `pc_range`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutOfRange {
    /// Clamp the coordinates used for voxels onto the range box (SphereFormer's SemanticKITTI
    /// preprocessing: `np.clip(xyz, pc_range[0], pc_range[1])`); features keep the raw values.
    Clip,
    /// Drop the point; it gets no voxel and is counted.
    Drop,
}

/// Where voxel coordinate 0 lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VoxelOrigin {
    /// The per-sample minimum of the (clipped) coordinates, as SphereFormer's inference does:
    /// coordinates are non-negative and relative to each scan.
    ScanMin,
    /// The lower corner of `pc_range` (fixed grid; needs `pc_range`).
    RangeMin,
    /// The sensor frame origin: `floor(p / voxel_size)`, negative coordinates allowed.
    Zero,
}

/// Arithmetic precision of the voxel key `floor((p - origin) / voxel_size)`. SphereFormer computes
/// it in float64 for SemanticKITTI (its clip bounds are float64) and float32 for nuScenes; at a
/// voxel boundary the two can differ, so reproducing a model's preprocessing exactly needs this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyPrecision {
    F32,
    F64,
}

/// Feature channels of every voxel: x, y, z, intensity (SphereFormer's `input_c: 4`).
pub const FEATURE_CHANNELS: usize = 4;

/// Largest |coordinate| accepted; beyond it the point is counted `out_of_grid`.
pub const GRID_LIMIT: f64 = 1_073_741_824.0;

/// How points become voxels. Built from a model YAML (`ModelConfig::voxel_params`) or by hand.
#[derive(Debug, Clone, PartialEq)]
pub struct VoxelParams {
    pub voxel_size: [f64; 3],
    /// `[[xmin, ymin, zmin], [xmax, ymax, zmax]]`, metres.
    pub range: Option<[[f64; 3]; 2]>,
    pub out_of_range: OutOfRange,
    pub origin: VoxelOrigin,
    pub precision: KeyPrecision,
    pub max_voxels: usize,
}

impl VoxelParams {
    pub fn validate(&self) -> Result<(), Error> {
        for (a, v) in self.voxel_size.iter().enumerate() {
            if !(v.is_finite() && *v > 0.0) {
                return Err(Error::InvalidInput(format!("voxel_size[{a}] must be positive, got {v}")));
            }
        }
        if let Some(r) = &self.range {
            for a in 0..3 {
                if !(r[0][a].is_finite() && r[1][a].is_finite() && r[0][a] < r[1][a]) {
                    return Err(Error::InvalidInput(format!("pc_range axis {a}: need finite min < max, got {:?}", r)));
                }
            }
        } else if self.origin == VoxelOrigin::RangeMin {
            return Err(Error::InvalidInput("voxel origin `range_min` needs a pc_range".into()));
        }
        if self.max_voxels == 0 || self.max_voxels >= i32::MAX as usize {
            return Err(Error::InvalidInput(format!("max_voxels must be in 1..2^31-1, got {}", self.max_voxels)));
        }
        Ok(())
    }
}

/// What happened to the points and voxels of one call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VoxelStats {
    pub points_in: usize,
    /// Points with NaN or Inf in x, y, z or intensity.
    pub non_finite: usize,
    /// Points outside `pc_range` with `out_of_range: drop`.
    pub out_of_range: usize,
    /// Points whose coordinate would exceed ±2^30 voxels.
    pub out_of_grid: usize,
    /// Voxels formed before the cap.
    pub voxels_total: usize,
    /// Voxels returned (`min(voxels_total, max_voxels)`).
    pub voxels_kept: usize,
    /// Points that fell in voxels dropped by the cap.
    pub points_capped: usize,
}

impl VoxelStats {
    pub fn voxels_dropped(&self) -> usize {
        self.voxels_total - self.voxels_kept
    }
    /// Points that got a voxel.
    pub fn points_voxelized(&self) -> usize {
        self.points_in - self.non_finite - self.out_of_range - self.out_of_grid - self.points_capped
    }
}

/// Voxels on the host, `m` of them, in key order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Voxels {
    /// `[b, x, y, z]` per voxel.
    pub coords: Vec<[i32; 4]>,
    /// `m * FEATURE_CHANNELS` mean features, row-major.
    pub feats: Vec<f32>,
    /// Mean voxel-space position of each voxel's points (metres; clipped when clipping).
    pub xyz: Vec<[f32; 3]>,
    pub counts: Vec<u32>,
    /// For every input point (samples concatenated in order), its voxel or -1.
    pub point_to_voxel: Vec<i32>,
    pub stats: VoxelStats,
}

impl Voxels {
    pub fn len(&self) -> usize {
        self.coords.len()
    }
    pub fn is_empty(&self) -> bool {
        self.coords.is_empty()
    }
}

/// Float type the key arithmetic runs in.
pub(crate) trait KeyFloat: Copy + PartialOrd + Send + Sync + std::ops::Sub<Output = Self> + std::ops::Div<Output = Self> {
    fn of_f32(v: f32) -> Self;
    fn of_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn to_f32(self) -> f32;
    fn floor(self) -> Self;
    fn max(self, o: Self) -> Self;
    fn min(self, o: Self) -> Self;
}

macro_rules! key_float {
    ($t:ty) => {
        impl KeyFloat for $t {
            fn of_f32(v: f32) -> Self { v as $t }
            fn of_f64(v: f64) -> Self { v as $t }
            fn to_f64(self) -> f64 { self as f64 }
            fn to_f32(self) -> f32 { self as f32 }
            fn floor(self) -> Self { <$t>::floor(self) }
            fn max(self, o: Self) -> Self { <$t>::max(self, o) }
            fn min(self, o: Self) -> Self { <$t>::min(self, o) }
        }
    };
}
key_float!(f32);
key_float!(f64);

/// Voxel-space coordinate on `axis` (see module doc, step 1); `None` when dropped.
#[inline]
pub(crate) fn voxel_space<R: KeyFloat>(p: &VoxelParams, axis: usize, v: f32) -> Option<R> {
    let c = R::of_f32(v);
    match &p.range {
        None => Some(c),
        Some(r) => {
            let (lo, hi) = (R::of_f64(r[0][axis]), R::of_f64(r[1][axis]));
            match p.out_of_range {
                OutOfRange::Clip => Some(c.max(lo).min(hi)),
                OutOfRange::Drop => (c >= lo && c < hi).then_some(c),
            }
        }
    }
}

#[derive(Clone, Copy)]
enum PointFate {
    Coord([i32; 3]),
    NonFinite,
    OutOfRange,
    OutOfGrid,
}

/// Start offset of each sample in the concatenated point list, plus the total.
pub fn sample_offsets(batch: &[&Points]) -> Vec<usize> {
    let mut off = Vec::with_capacity(batch.len() + 1);
    let mut acc = 0;
    off.push(0);
    for p in batch {
        acc += p.len();
        off.push(acc);
    }
    off
}

/// Checks what both backends need before touching the points.
pub(crate) fn check_batch(batch: &[&Points], params: &VoxelParams) -> Result<usize, Error> {
    params.validate()?;
    if batch.len() > 1 << 16 {
        return Err(Error::InvalidInput(format!("batch of {} samples; at most 65536", batch.len())));
    }
    for (b, p) in batch.iter().enumerate() {
        let n = p.len();
        if p.y.len() != n || p.z.len() != n || p.intensity.len() != n {
            return Err(Error::InvalidInput(format!("sample {b}: x, y, z, intensity have different lengths")));
        }
    }
    let total: usize = batch.iter().map(|p| p.len()).sum();
    if total >= i32::MAX as usize {
        return Err(Error::InvalidInput(format!("{total} points in one call; at most 2^31-1")));
    }
    Ok(total)
}

/// The mixed radices of the packed key, or an error when the cloud spans too many voxels.
/// `bounds` = min xyz, max xyz of the valid coordinates. Returns (dx, dy, dz, invalid_key).
pub(crate) fn key_radices(bounds: [i32; 6], samples: usize) -> Result<(u64, u64, u64, u64), Error> {
    let d = |a: usize| (bounds[3 + a] as i64 - bounds[a] as i64 + 1) as u64;
    let (dx, dy, dz) = (d(0), d(1), d(2));
    let total = (samples as u64)
        .checked_mul(dx)
        .and_then(|v| v.checked_mul(dy))
        .and_then(|v| v.checked_mul(dz))
        .filter(|&v| v < u64::MAX);
    match total {
        Some(t) => Ok((dx, dy, dz, t)),
        None => Err(Error::InvalidInput(format!(
            "the cloud spans {dx} x {dy} x {dz} voxels in {samples} samples, too many for a 64-bit key: \
             use a pc_range with out_of_range: drop, or a larger voxel_size"
        ))),
    }
}

/// CPU reference voxelization of a batch of samples.
pub fn voxelize_cpu(batch: &[&Points], params: &VoxelParams) -> Result<Voxels, Error> {
    check_batch(batch, params)?;
    match params.precision {
        KeyPrecision::F32 => voxelize_impl::<f32>(batch, params),
        KeyPrecision::F64 => voxelize_impl::<f64>(batch, params),
    }
}

/// Whether every value of point `i` the network reads (x, y, z, intensity) is finite.
fn features_finite(p: &Points, i: usize) -> bool {
    p.x[i].is_finite() && p.y[i].is_finite() && p.z[i].is_finite() && p.intensity[i].is_finite()
}

/// Voxel-space position of point `i` (clipped to the range when the params clip), or `None` when
/// it is NaN/Inf or dropped as out of range.
pub(crate) fn voxel_position<R: KeyFloat>(pts: &Points, i: usize, params: &VoxelParams) -> Option<[R; 3]> {
    if !features_finite(pts, i) {
        return None;
    }
    let raw = [pts.x[i], pts.y[i], pts.z[i]];
    let mut c = [R::of_f32(0.0); 3];
    for a in 0..3 {
        c[a] = voxel_space::<R>(params, a, raw[a])?;
    }
    Some(c)
}

fn scan_min<R: KeyFloat>(pts: &Points, params: &VoxelParams) -> [Option<R>; 3] {
    let mut mins: [Option<R>; 3] = [None; 3];
    for i in 0..pts.len() {
        let Some(c) = voxel_position::<R>(pts, i, params) else { continue };
        for a in 0..3 {
            mins[a] = Some(match mins[a] {
                Some(m) if m <= c[a] => m,
                _ => c[a],
            });
        }
    }
    mins
}

/// The voxel-space origin of one sample (`params.origin`).
pub(crate) fn sample_origin<R: KeyFloat>(pts: &Points, params: &VoxelParams) -> Result<[R; 3], Error> {
    Ok(match params.origin {
        VoxelOrigin::ScanMin => {
            let m = scan_min::<R>(pts, params);
            // A sample with no valid point has no origin; its points are all invalid anyway.
            [0, 1, 2].map(|a| m[a].unwrap_or(R::of_f32(0.0)))
        }
        VoxelOrigin::RangeMin => {
            let r = params.range.as_ref().ok_or_else(|| Error::InvalidInput("range_min origin needs pc_range".into()))?;
            [0, 1, 2].map(|a| R::of_f64(r[0][a]))
        }
        VoxelOrigin::Zero => [R::of_f32(0.0); 3],
    })
}

fn point_fate<R: KeyFloat>(pts: &Points, i: usize, params: &VoxelParams, origin: &[R; 3]) -> PointFate {
    if !features_finite(pts, i) {
        return PointFate::NonFinite;
    }
    let Some(c) = voxel_position::<R>(pts, i, params) else {
        return PointFate::OutOfRange;
    };
    let mut q = [0i32; 3];
    for a in 0..3 {
        let f = ((c[a] - origin[a]) / R::of_f64(params.voxel_size[a])).floor();
        let fd = f.to_f64();
        if !(-GRID_LIMIT..=GRID_LIMIT).contains(&fd) {
            return PointFate::OutOfGrid;
        }
        q[a] = fd as i32;
    }
    PointFate::Coord(q)
}

fn voxelize_impl<R: KeyFloat>(batch: &[&Points], params: &VoxelParams) -> Result<Voxels, Error> {
    let offsets = sample_offsets(batch);
    let n = *offsets.last().unwrap_or(&0);
    let mut stats = VoxelStats { points_in: n, ..Default::default() };

    // Steps 1-3: per-point coordinates.
    let mut fates: Vec<PointFate> = Vec::with_capacity(n);
    for pts in batch {
        let origin: [R; 3] = sample_origin::<R>(pts, params)?;
        let part: Vec<PointFate> = (0..pts.len()).into_par_iter().map(|i| point_fate::<R>(pts, i, params, &origin)).collect();
        fates.extend(part);
    }
    let mut bounds = [i32::MAX, i32::MAX, i32::MAX, i32::MIN, i32::MIN, i32::MIN];
    let mut n_valid = 0usize;
    for f in &fates {
        match f {
            PointFate::Coord(q) => {
                n_valid += 1;
                for a in 0..3 {
                    bounds[a] = bounds[a].min(q[a]);
                    bounds[3 + a] = bounds[3 + a].max(q[a]);
                }
            }
            PointFate::NonFinite => stats.non_finite += 1,
            PointFate::OutOfRange => stats.out_of_range += 1,
            PointFate::OutOfGrid => stats.out_of_grid += 1,
        }
    }
    let mut point_to_voxel = vec![-1i32; n];
    if n_valid == 0 {
        return Ok(Voxels { point_to_voxel, stats, ..Default::default() });
    }

    // Step 4: packed keys, stable sort (equal keys keep input order).
    let (dx, dy, dz, invalid_key) = key_radices(bounds, batch.len())?;
    let mut keys = vec![invalid_key; n];
    for b in 0..batch.len() {
        let (s, e) = (offsets[b], offsets[b + 1]);
        keys[s..e].par_iter_mut().zip(&fates[s..e]).for_each(|(k, f)| {
            if let PointFate::Coord(q) = f {
                let r = |a: usize| (q[a] as i64 - bounds[a] as i64) as u64;
                *k = ((b as u64 * dx + r(0)) * dy + r(1)) * dz + r(2);
            }
        });
    }
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.par_sort_by_key(|&i| keys[i as usize]);
    let order = &order[..n_valid];

    // Step 5-6: walk the runs of equal keys.
    let mut starts: Vec<usize> = Vec::new();
    for (j, &i) in order.iter().enumerate() {
        if j == 0 || keys[i as usize] != keys[order[j - 1] as usize] {
            starts.push(j);
        }
    }
    stats.voxels_total = starts.len();
    let m = starts.len().min(params.max_voxels);
    stats.voxels_kept = m;
    starts.push(n_valid);
    stats.points_capped = n_valid - starts[m];

    let sample_of = |i: usize| offsets.partition_point(|&o| o <= i) - 1;
    let per_voxel: Vec<([i32; 4], [f32; FEATURE_CHANNELS], [f32; 3], u32)> = (0..m)
        .into_par_iter()
        .map(|v| {
            let members = &order[starts[v]..starts[v + 1]];
            let mut sf = [0f32; FEATURE_CHANNELS];
            let mut sx = [0f32; 3];
            let b = sample_of(members[0] as usize);
            for &gi in members {
                let gi = gi as usize;
                let pts = batch[b];
                let li = gi - offsets[b];
                let raw = [pts.x[li], pts.y[li], pts.z[li], pts.intensity[li]];
                for c in 0..FEATURE_CHANNELS {
                    sf[c] += raw[c];
                }
                for a in 0..3 {
                    // Valid points are inside the range or clipped, so this is Some.
                    let c: R = voxel_space::<R>(params, a, raw[a]).unwrap_or(R::of_f32(raw[a]));
                    sx[a] += c.to_f32();
                }
            }
            let cnt = members.len() as f32;
            let PointFate::Coord(q) = fates[members[0] as usize] else { unreachable!("sorted valid points only") };
            (
                [b as i32, q[0], q[1], q[2]],
                sf.map(|s| s / cnt),
                sx.map(|s| s / cnt),
                members.len() as u32,
            )
        })
        .collect();

    for v in 0..m {
        for &gi in &order[starts[v]..starts[v + 1]] {
            point_to_voxel[gi as usize] = v as i32;
        }
    }
    let mut out = Voxels {
        coords: Vec::with_capacity(m),
        feats: Vec::with_capacity(m * FEATURE_CHANNELS),
        xyz: Vec::with_capacity(m),
        counts: Vec::with_capacity(m),
        point_to_voxel,
        stats,
    };
    for (c, f, x, k) in per_voxel {
        out.coords.push(c);
        out.feats.extend_from_slice(&f);
        out.xyz.push(x);
        out.counts.push(k);
    }
    Ok(out)
}
