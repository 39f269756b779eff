//! CPU voxelization (`sptr::ops::voxelize::cpu::voxelize_cpu`): checked against an independent naive
//! implementation written here (a BTreeMap of coordinate -> member points), plus hand-built cases
//! for every rule of the module doc: clipping/dropping, origins, key order, means, the cap and its
//! accounting, batches, invalid points and parameters, and the real nuScenes/SemanticKITTI scans.
//!
//! Random clouds come from a splitmix64 generator with fixed seeds, so every run is the same.

use crate::common;
use sptr::ops::voxelize::cpu::{KeyPrecision, OutOfRange, VoxelOrigin};
use sptr::models::sphereformer::config::ModelConfig;
use sptr::ops::voxelize::cpu::{voxelize_cpu, VoxelParams, VoxelStats, Voxels, FEATURE_CHANNELS, GRID_LIMIT};
use sptr::{Error, Points};
use std::collections::BTreeMap;
use std::path::PathBuf;

// ---------------------------------------------------------------------------------------------
// Deterministic random numbers

use crate::common::Rng as SplitMix64;

// ---------------------------------------------------------------------------------------------
// Building clouds and parameters

fn cloud(rows: &[[f32; 4]]) -> Points {
    Points {
        x: rows.iter().map(|r| r[0]).collect(),
        y: rows.iter().map(|r| r[1]).collect(),
        z: rows.iter().map(|r| r[2]).collect(),
        intensity: rows.iter().map(|r| r[3]).collect(),
        has_intensity: true,
        ring: None,
        time: None,
    }
}

fn rows_of(p: &Points) -> Vec<[f32; 4]> {
    (0..p.len()).map(|i| [p.x[i], p.y[i], p.z[i], p.intensity[i]]).collect()
}

fn params(
    voxel_size: [f64; 3],
    range: Option<[[f64; 3]; 2]>,
    out_of_range: OutOfRange,
    origin: VoxelOrigin,
    precision: KeyPrecision,
    max_voxels: usize,
) -> VoxelParams {
    VoxelParams { voxel_size, range, out_of_range, origin, precision, max_voxels }
}

/// Origin zero, no range, float64 keys, no cap: `floor(p / voxel_size)`.
fn zero_params(vs: f64) -> VoxelParams {
    params([vs; 3], None, OutOfRange::Clip, VoxelOrigin::Zero, KeyPrecision::F64, 1_000_000)
}

/// A random cloud inside `lo..hi` whose points share voxels often: uniform points, jittered
/// neighbours of earlier points, exact duplicates, and points on voxel boundaries.
fn random_cloud(rng: &mut SplitMix64, n: usize, lo: [f32; 3], hi: [f32; 3], vs: f32) -> Points {
    let mut rows: Vec<[f32; 4]> = Vec::with_capacity(n);
    for _ in 0..n {
        let kind = rng.below(10);
        let inten = rng.uniform(0.0, 255.0).floor();
        let row = if rows.is_empty() || kind < 5 {
            [rng.uniform(lo[0], hi[0]), rng.uniform(lo[1], hi[1]), rng.uniform(lo[2], hi[2]), inten]
        } else if kind < 8 {
            let b = rows[rng.below(rows.len())];
            [
                b[0] + rng.uniform(-0.5 * vs, 0.5 * vs),
                b[1] + rng.uniform(-0.5 * vs, 0.5 * vs),
                b[2] + rng.uniform(-0.5 * vs, 0.5 * vs),
                inten,
            ]
        } else if kind < 9 {
            rows[rng.below(rows.len())]
        } else {
            // On a boundary of a zero-origin grid (floor edge cases).
            let k = |a: usize, r: &mut SplitMix64| (r.uniform(lo[a], hi[a]) / vs).round() * vs;
            [k(0, rng), k(1, rng), k(2, rng), inten]
        };
        rows.push(row);
    }
    cloud(&rows)
}

fn data_dir() -> PathBuf {
    common::root().join("tests/data")
}

fn model_params(name: &str) -> VoxelParams {
    let path = common::root().join("config/models").join(name);
    ModelConfig::load(&path).unwrap_or_else(|e| panic!("{e}")).voxel_params()
}

fn nuscenes_scans() -> Vec<Points> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(data_dir().join("nuscenes"))
        .expect("tests/data/nuscenes")
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".pcd.bin"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no tests/data/nuscenes/*.pcd.bin");
    files.iter().map(|f| Points::read_bin(f, 5).unwrap_or_else(|e| panic!("{e}"))).collect()
}

fn kitti_scan() -> Points {
    Points::read_bin(&data_dir().join("semantickitti/000000.bin"), 4).unwrap_or_else(|e| panic!("{e}"))
}

fn feat(v: &Voxels, i: usize) -> [f32; FEATURE_CHANNELS] {
    v.feats[i * FEATURE_CHANNELS..(i + 1) * FEATURE_CHANNELS].try_into().unwrap()
}

// ---------------------------------------------------------------------------------------------
// The naive reference: written from the module doc, shares no code with the crate

struct Naive {
    coords: Vec<[i32; 4]>,
    feats: Vec<f32>,
    xyz: Vec<[f32; 3]>,
    counts: Vec<u32>,
    point_to_voxel: Vec<i32>,
    stats: VoxelStats,
}

/// Voxel-space position of one axis, in the key precision (an f32 result is held exactly in f64).
fn naive_space(p: &VoxelParams, axis: usize, v: f32) -> Option<f64> {
    match p.precision {
        KeyPrecision::F32 => match p.range {
            None => Some(v as f64),
            Some(r) => {
                let (lo, hi) = (r[0][axis] as f32, r[1][axis] as f32);
                match p.out_of_range {
                    OutOfRange::Clip => Some(v.clamp(lo, hi) as f64),
                    OutOfRange::Drop => (lo <= v && v < hi).then_some(v as f64),
                }
            }
        },
        KeyPrecision::F64 => {
            let v = v as f64;
            match p.range {
                None => Some(v),
                Some(r) => {
                    let (lo, hi) = (r[0][axis], r[1][axis]);
                    match p.out_of_range {
                        OutOfRange::Clip => Some(v.clamp(lo, hi)),
                        OutOfRange::Drop => (lo <= v && v < hi).then_some(v),
                    }
                }
            }
        }
    }
}

fn naive_floor(p: &VoxelParams, axis: usize, c: f64, o: f64) -> f64 {
    match p.precision {
        KeyPrecision::F32 => ((c as f32 - o as f32) / p.voxel_size[axis] as f32).floor() as f64,
        KeyPrecision::F64 => ((c - o) / p.voxel_size[axis]).floor(),
    }
}

fn naive(batch: &[&Points], p: &VoxelParams) -> Naive {
    #[derive(Clone, Copy)]
    enum Fate {
        Ok([f64; 3]),
        NonFinite,
        Range,
    }
    let n: usize = batch.iter().map(|s| s.len()).sum();
    let mut stats = VoxelStats { points_in: n, ..Default::default() };
    let mut members: BTreeMap<[i32; 4], Vec<(usize, usize)>> = BTreeMap::new(); // (sample, local)
    let mut global = 0usize;
    let mut global_of = Vec::new();
    for (b, s) in batch.iter().enumerate() {
        let fates: Vec<Fate> = (0..s.len())
            .map(|i| {
                let raw = [s.x[i], s.y[i], s.z[i]];
                if raw.iter().any(|v| !v.is_finite()) {
                    return Fate::NonFinite;
                }
                let c: Vec<Option<f64>> = (0..3).map(|a| naive_space(p, a, raw[a])).collect();
                if c.iter().any(|v| v.is_none()) {
                    return Fate::Range;
                }
                Fate::Ok([c[0].unwrap(), c[1].unwrap(), c[2].unwrap()])
            })
            .collect();
        let origin: [f64; 3] = match p.origin {
            VoxelOrigin::Zero => [0.0; 3],
            VoxelOrigin::RangeMin => {
                let r = p.range.unwrap();
                match p.precision {
                    KeyPrecision::F32 => [0, 1, 2].map(|a| r[0][a] as f32 as f64),
                    KeyPrecision::F64 => r[0],
                }
            }
            VoxelOrigin::ScanMin => {
                let mut m = [f64::INFINITY; 3];
                for f in &fates {
                    if let Fate::Ok(c) = f {
                        for a in 0..3 {
                            m[a] = m[a].min(c[a]);
                        }
                    }
                }
                m
            }
        };
        for (i, f) in fates.iter().enumerate() {
            global_of.push((b, i));
            match f {
                Fate::NonFinite => stats.non_finite += 1,
                Fate::Range => stats.out_of_range += 1,
                Fate::Ok(c) => {
                    let q: Vec<f64> = (0..3).map(|a| naive_floor(p, a, c[a], origin[a])).collect();
                    if q.iter().any(|v| v.abs() > GRID_LIMIT) {
                        stats.out_of_grid += 1;
                    } else {
                        members.entry([b as i32, q[0] as i32, q[1] as i32, q[2] as i32]).or_default().push((b, i));
                    }
                }
            }
            global += 1;
        }
    }
    assert_eq!(global, n);
    let mut offsets = vec![0usize];
    for s in batch {
        offsets.push(offsets.last().unwrap() + s.len());
    }
    stats.voxels_total = members.len();
    stats.voxels_kept = members.len().min(p.max_voxels);
    let mut out = Naive {
        coords: vec![],
        feats: vec![],
        xyz: vec![],
        counts: vec![],
        point_to_voxel: vec![-1; n],
        stats,
    };
    for (v, (key, pts)) in members.iter().enumerate() {
        if v >= p.max_voxels {
            out.stats.points_capped += pts.len();
            continue;
        }
        let mut sf = [0f32; 4];
        let mut sx = [0f32; 3];
        for &(b, i) in pts {
            let s = batch[b];
            let raw = [s.x[i], s.y[i], s.z[i], s.intensity[i]];
            for ch in 0..4 {
                sf[ch] += raw[ch];
            }
            for a in 0..3 {
                sx[a] += naive_space(p, a, raw[a]).unwrap() as f32;
            }
            out.point_to_voxel[offsets[b] + i] = v as i32;
        }
        let k = pts.len() as f32;
        out.coords.push(*key);
        out.feats.extend(sf.iter().map(|s| s / k));
        out.xyz.push(sx.map(|s| s / k));
        out.counts.push(pts.len() as u32);
    }
    out
}

/// Runs both and asserts they agree exactly (same f32 summation order, so no tolerance).
fn check_against_naive(batch: &[&Points], p: &VoxelParams) -> Voxels {
    let got = voxelize_cpu(batch, p).unwrap_or_else(|e| panic!("voxelize_cpu: {e}"));
    let want = naive(batch, p);
    assert_eq!(got.stats, want.stats, "stats");
    assert_eq!(got.coords.len(), want.coords.len(), "voxel count");
    assert_eq!(got.coords, want.coords, "coords/order");
    assert_eq!(got.counts, want.counts, "counts");
    assert_eq!(got.point_to_voxel, want.point_to_voxel, "point_to_voxel");
    assert_eq!(got.feats.len(), got.coords.len() * FEATURE_CHANNELS);
    for (i, (g, w)) in got.feats.iter().zip(&want.feats).enumerate() {
        assert!(g == w, "feature {i} (voxel {}, ch {}): {g} vs naive {w}", i / FEATURE_CHANNELS, i % FEATURE_CHANNELS);
    }
    for (i, (g, w)) in got.xyz.iter().zip(&want.xyz).enumerate() {
        assert!(g == w, "xyz of voxel {i}: {g:?} vs naive {w:?}");
    }
    check_invariants(&got, p);
    got
}

/// What holds for any output: strictly increasing keys, counts match point_to_voxel, stats add up.
fn check_invariants(v: &Voxels, p: &VoxelParams) {
    let m = v.len();
    assert_eq!(v.counts.len(), m);
    assert_eq!(v.xyz.len(), m);
    assert_eq!(v.feats.len(), m * FEATURE_CHANNELS);
    assert!(v.coords.windows(2).all(|w| w[0] < w[1]), "coords not strictly increasing [b,x,y,z]");
    let mut hist = vec![0u32; m];
    for &t in &v.point_to_voxel {
        assert!(t >= -1 && (t as i64) < m as i64, "point_to_voxel {t} out of 0..{m}");
        if t >= 0 {
            hist[t as usize] += 1;
        }
    }
    assert_eq!(hist, v.counts, "counts vs point_to_voxel");
    let s = v.stats;
    assert_eq!(s.points_in, v.point_to_voxel.len());
    assert_eq!(s.voxels_kept, m);
    assert_eq!(s.voxels_kept, s.voxels_total.min(p.max_voxels));
    assert_eq!(s.voxels_dropped(), s.voxels_total - s.voxels_kept);
    assert_eq!(s.points_voxelized(), v.point_to_voxel.iter().filter(|&&t| t >= 0).count());
    assert!(v.counts.iter().all(|&c| c > 0));
}

fn assert_close(a: f32, b: f32, what: &str) {
    let tol = 1e-6 * a.abs().max(b.abs()).max(1.0);
    assert!((a - b).abs() <= tol, "{what}: {a} vs {b}");
}

// ---------------------------------------------------------------------------------------------
// Against the naive implementation

/// The parameter variants the random comparisons sweep: every origin, both precisions, both
/// out-of-range modes, isotropic and anisotropic voxels.
fn sweep_params() -> Vec<VoxelParams> {
    let r = Some([[-10.0, -8.0, -2.0], [9.5, 8.0, 1.5]]);
    use KeyPrecision::*;
    use OutOfRange::*;
    use VoxelOrigin::*;
    vec![
        params([0.1; 3], None, Clip, ScanMin, F32, 1_000_000),
        params([0.1; 3], None, Clip, ScanMin, F64, 1_000_000),
        params([0.05, 0.05, 0.05], r, Clip, ScanMin, F64, 1_000_000),
        params([0.05, 0.05, 0.05], r, Clip, ScanMin, F32, 1_000_000),
        params([0.3, 0.25, 0.2], r, Drop, Zero, F32, 1_000_000),
        params([0.3, 0.25, 0.2], r, Drop, Zero, F64, 1_000_000),
        params([0.2, 0.2, 0.15], r, Drop, RangeMin, F64, 1_000_000),
        params([0.2, 0.2, 0.15], r, Clip, RangeMin, F32, 1_000_000),
        params([0.1, 0.2, 0.3], r, Drop, ScanMin, F32, 1_000_000),
        params([0.5; 3], None, Clip, Zero, F64, 1_000_000),
        params([0.5; 3], None, Clip, Zero, F32, 1_000_000),
    ]
}

#[test]
fn matches_naive_on_random_single_clouds() {
    let mut rng = SplitMix64(0x5EED_0001);
    for (k, p) in sweep_params().iter().enumerate() {
        for round in 0..4 {
            let n = 200 + rng.below(3000);
            let vs = p.voxel_size[0] as f32;
            let c = random_cloud(&mut rng, n, [-12.0, -10.0, -3.0], [12.0, 10.0, 2.0], vs);
            let v = check_against_naive(&[&c], p);
            assert!(v.len() > 10, "params {k} round {round}: only {} voxels", v.len());
            assert!(v.counts.iter().any(|&c| c > 1), "params {k}: no voxel with several points");
        }
    }
}

#[test]
fn matches_naive_on_random_batches_with_invalid_points() {
    let mut rng = SplitMix64(0x5EED_0002);
    for p in sweep_params() {
        let vs = p.voxel_size[0] as f32;
        let mut samples: Vec<Points> = (0..4)
            .map(|b| {
                let n = if b == 2 { 0 } else { 100 + rng.below(1500) };
                random_cloud(&mut rng, n, [-11.0, -9.0, -2.5], [11.0, 9.0, 2.0], vs)
            })
            .collect();
        // Sprinkle NaN / Inf into samples 0 and 3.
        for &b in &[0usize, 3] {
            for j in 0..5 {
                let i = rng.below(samples[b].len());
                match j % 3 {
                    0 => samples[b].x[i] = f32::NAN,
                    1 => samples[b].y[i] = f32::INFINITY,
                    _ => samples[b].z[i] = f32::NEG_INFINITY,
                }
            }
        }
        let batch: Vec<&Points> = samples.iter().collect();
        let v = check_against_naive(&batch, &p);
        assert!(v.stats.non_finite >= 1);
        assert!(v.coords.iter().all(|c| c[0] != 2), "empty sample 2 got voxels");
        for b in [0, 1, 3] {
            assert!(v.coords.iter().any(|c| c[0] == b), "sample {b} has no voxels");
        }
    }
}

#[test]
fn matches_naive_under_cap() {
    let mut rng = SplitMix64(0x5EED_0003);
    for p in sweep_params() {
        let vs = p.voxel_size[0] as f32;
        let a = random_cloud(&mut rng, 1500, [-11.0, -9.0, -2.5], [11.0, 9.0, 2.0], vs);
        let b = random_cloud(&mut rng, 1500, [-11.0, -9.0, -2.5], [11.0, 9.0, 2.0], vs);
        let full = voxelize_cpu(&[&a, &b], &p).unwrap();
        for cap in [1, 7, full.len() / 2, full.len() - 1, full.len(), full.len() + 1] {
            let mut pc = p.clone();
            pc.max_voxels = cap;
            let v = check_against_naive(&[&a, &b], &pc);
            assert_eq!(v.coords[..], full.coords[..cap.min(full.len())], "cap {cap}: not the first voxels in key order");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Geometry

#[test]
fn every_point_lies_in_its_voxel_origin_zero() {
    let mut rng = SplitMix64(0x5EED_0010);
    for &vs in &[0.05f64, 0.1, 0.3, 1.0] {
        for prec in [KeyPrecision::F64, KeyPrecision::F32] {
            let mut p = zero_params(vs);
            p.precision = prec;
            let c = random_cloud(&mut rng, 4000, [-30.0, -30.0, -5.0], [30.0, 30.0, 5.0], vs as f32);
            let v = voxelize_cpu(&[&c], &p).unwrap();
            check_invariants(&v, &p);
            assert_eq!(v.stats.points_voxelized(), c.len());
            for i in 0..c.len() {
                let t = v.point_to_voxel[i];
                assert!(t >= 0);
                let q = v.coords[t as usize];
                assert_eq!(q[0], 0);
                let raw = [c.x[i], c.y[i], c.z[i]];
                for a in 0..3 {
                    let pv = raw[a] as f64;
                    // Float division may round a point on a boundary into either neighbour.
                    let eps = 1e-6 * pv.abs().max(1.0);
                    let lo = q[1 + a] as f64 * vs;
                    let hi = (q[1 + a] as f64 + 1.0) * vs;
                    assert!(lo - eps <= pv && pv < hi + eps, "vs {vs} {prec:?}: point {i} axis {a}: {pv} not in [{lo}, {hi}) of coord {}", q[1 + a]);
                }
            }
        }
    }
}

#[test]
fn negative_coordinates_in_all_octants_with_origin_zero() {
    let p = zero_params(0.5);
    let mut rows = vec![];
    for sx in [-1.0f32, 1.0] {
        for sy in [-1.0f32, 1.0] {
            for sz in [-1.0f32, 1.0] {
                rows.push([0.25 * sx, 0.25 * sy, 0.25 * sz, 1.0]);
                rows.push([1.3 * sx, 0.7 * sy, 2.1 * sz, 3.0]);
            }
        }
    }
    let c = cloud(&rows);
    let v = check_against_naive(&[&c], &p);
    assert_eq!(v.len(), 16);
    let expect = |x: f32| (x as f64 / 0.5).floor() as i32;
    for (i, r) in rows.iter().enumerate() {
        let q = v.coords[v.point_to_voxel[i] as usize];
        assert_eq!(q, [0, expect(r[0]), expect(r[1]), expect(r[2])], "row {i} {r:?}");
    }
    // The small cube: coordinates -1 and 0 on every axis.
    for (i, r) in rows.iter().enumerate().step_by(2) {
        let q = v.coords[v.point_to_voxel[i] as usize];
        for a in 0..3 {
            assert_eq!(q[1 + a], if r[a] < 0.0 { -1 } else { 0 });
        }
    }
    assert!(v.coords.contains(&[0, -3, -2, -5]));
    assert!(v.coords.contains(&[0, 2, 1, 4]));
    // Key order with negatives: lexicographic over signed coordinates.
    assert_eq!(v.coords[0], [0, -3, -2, -5]);
    assert_eq!(*v.coords.last().unwrap(), [0, 2, 1, 4]);
}

#[test]
fn range_min_origin_counts_from_the_lower_corner() {
    let r = [[-10.0, -20.0, -5.0], [10.0, 20.0, 5.0]];
    for prec in [KeyPrecision::F32, KeyPrecision::F64] {
        let p = params([0.5, 1.0, 0.25], Some(r), OutOfRange::Drop, VoxelOrigin::RangeMin, prec, 1000);
        let c = cloud(&[
            [-10.0, -20.0, -5.0, 1.0],  // the corner itself
            [9.75, 19.5, 4.875, 2.0],   // the last voxel
            [0.0, 0.0, 0.0, 3.0],       // the middle
            [-9.6, -19.1, -4.9, 4.0],   // first voxel again
        ]);
        let v = check_against_naive(&[&c], &p);
        assert_eq!(v.coords, vec![[0, 0, 0, 0], [0, 20, 20, 20], [0, 39, 39, 39]], "{prec:?}");
        assert_eq!(v.point_to_voxel, vec![0, 2, 1, 0]);
        assert_eq!(v.counts, vec![2, 1, 1]);
    }
}

#[test]
fn scan_min_coordinates_start_at_zero() {
    let mut rng = SplitMix64(0x5EED_0011);
    let p = params([0.1; 3], None, OutOfRange::Clip, VoxelOrigin::ScanMin, KeyPrecision::F32, 1 << 20);
    let c = random_cloud(&mut rng, 3000, [-40.0, -40.0, -4.0], [40.0, 40.0, 3.0], 0.1);
    let v = check_against_naive(&[&c], &p);
    for a in 1..4 {
        assert_eq!(v.coords.iter().map(|q| q[a]).min(), Some(0), "axis {}", a - 1);
    }
}

// ---------------------------------------------------------------------------------------------
// Means, clipping, dropping

#[test]
fn mean_features_and_counts_of_hand_built_voxels() {
    let p = zero_params(1.0);
    let c = cloud(&[
        [0.25, 0.5, 0.5, 10.0],
        [5.5, 5.5, 5.5, 7.0],
        [0.75, 0.25, 0.125, 20.0],
        [0.5, 0.75, 0.875, 60.0],
    ]);
    let v = check_against_naive(&[&c], &p);
    assert_eq!(v.coords, vec![[0, 0, 0, 0], [0, 5, 5, 5]]);
    assert_eq!(v.counts, vec![3, 1]);
    assert_eq!(v.point_to_voxel, vec![0, 1, 0, 0]);
    assert_eq!(feat(&v, 0), [0.5, 0.5, 0.5, 30.0]);
    assert_eq!(feat(&v, 1), [5.5, 5.5, 5.5, 7.0]);
    assert_eq!(v.xyz, vec![[0.5, 0.5, 0.5], [5.5, 5.5, 5.5]]);
}

#[test]
fn clip_keeps_raw_features_and_clips_xyz() {
    let r = [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]];
    for prec in [KeyPrecision::F32, KeyPrecision::F64] {
        let p = params([0.5; 3], Some(r), OutOfRange::Clip, VoxelOrigin::Zero, prec, 1000);
        let c = cloud(&[
            [5.0, 0.1, -7.0, 3.0],  // clipped to (1, 0.1, -1)
            [1.0, 0.2, -1.0, 5.0],  // already on the clip point's voxel
            [0.3, 0.3, 0.3, 1.0],   // inside
        ]);
        let v = check_against_naive(&[&c], &p);
        assert_eq!(v.stats.out_of_range, 0, "clip drops nothing");
        assert_eq!(v.stats.points_voxelized(), 3);
        // (1, 0.1/0.2, -1) -> (2, 0, -2): clipping onto the max face lands one past the last cell.
        assert_eq!(v.coords, vec![[0, 0, 0, 0], [0, 2, 0, -2]]);
        assert_eq!(v.point_to_voxel, vec![1, 1, 0]);
        let f = feat(&v, 1);
        assert_eq!(f[0], 3.0, "raw x mean (5 + 1) / 2");
        assert_eq!(f[2], -4.0, "raw z mean (-7 - 1) / 2");
        assert_eq!(f[3], 4.0);
        assert_close(f[1], 0.15, "raw y mean");
        assert_eq!(v.xyz[1][0], 1.0, "clipped x mean");
        assert_eq!(v.xyz[1][2], -1.0, "clipped z mean");
        assert_close(v.xyz[1][1], 0.15, "y mean");
        assert_eq!(feat(&v, 0), [0.3, 0.3, 0.3, 1.0]);
        assert_eq!(v.xyz[0], [0.3, 0.3, 0.3]);
    }
}

#[test]
fn clip_with_scan_min_uses_clipped_minimum() {
    let r = [[-2.0, -2.0, -2.0], [2.0, 2.0, 2.0]];
    let p = params([0.5; 3], Some(r), OutOfRange::Clip, VoxelOrigin::ScanMin, KeyPrecision::F64, 1000);
    // The far point clips to -2 on x: the origin is -2, not -100.
    let c = cloud(&[[-100.0, 0.0, 0.0, 1.0], [-1.9, 0.0, 0.0, 2.0], [0.1, 0.0, 0.0, 3.0]]);
    let v = check_against_naive(&[&c], &p);
    assert_eq!(v.coords, vec![[0, 0, 0, 0], [0, 4, 0, 0]]);
    assert_eq!(v.counts, vec![2, 1]);
    assert_close(feat(&v, 0)[0], -50.95, "raw x mean");
    assert_close(v.xyz[0][0], -1.95, "clipped mean");
}

#[test]
fn drop_mode_counts_out_of_range() {
    let r = [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]];
    for prec in [KeyPrecision::F32, KeyPrecision::F64] {
        let p = params([0.5; 3], Some(r), OutOfRange::Drop, VoxelOrigin::Zero, prec, 1000);
        let c = cloud(&[
            [0.1, 0.1, 0.1, 1.0],
            [1.5, 0.0, 0.0, 1.0],   // x past max
            [0.0, -1.0, 0.0, 1.0],  // on min: kept
            [0.0, 0.0, 1.0, 1.0],   // on max: dropped (half-open)
            [0.0, 0.0, -3.0, 1.0],  // z below min
            [f32::NAN, 0.0, 0.0, 1.0],
        ]);
        let v = check_against_naive(&[&c], &p);
        assert_eq!(v.stats.out_of_range, 3, "{prec:?}");
        assert_eq!(v.stats.non_finite, 1);
        assert_eq!(v.stats.points_voxelized(), 2);
        assert_eq!(v.point_to_voxel, vec![1, -1, 0, -1, -1, -1]);
        assert_eq!(v.coords, vec![[0, 0, -2, 0], [0, 0, 0, 0]]);
    }
}

// ---------------------------------------------------------------------------------------------
// The cap

#[test]
fn cap_keeps_first_voxels_in_key_order_and_accounts_points() {
    let p0 = zero_params(1.0);
    // 10 voxels at (k, -k, k%3) with k+1 points each, input shuffled.
    let mut rows = vec![];
    for k in 0..10i32 {
        for j in 0..=k {
            rows.push([k as f32 + 0.5, -k as f32 + 0.5, (k % 3) as f32 + 0.1 * j as f32, (k * 100 + j) as f32]);
        }
    }
    SplitMix64(0x5EED_0020).shuffle(&mut rows);
    let c = cloud(&rows);
    let full = check_against_naive(&[&c], &p0);
    assert_eq!(full.len(), 10);
    let want_order: Vec<[i32; 4]> = (0..10).map(|k| [0, k, -k, k % 3]).collect();
    assert_eq!(full.coords, want_order);

    let mut p = p0.clone();
    p.max_voxels = 4;
    let v = check_against_naive(&[&c], &p);
    assert_eq!(v.stats.voxels_total, 10);
    assert_eq!(v.stats.voxels_kept, 4);
    assert_eq!(v.stats.voxels_dropped(), 6);
    assert_eq!(v.len(), 4);
    assert_eq!(v.coords[..], full.coords[..4]);
    assert_eq!(v.counts, vec![1, 2, 3, 4]);
    assert_eq!(v.stats.points_capped, (5..=10).sum::<usize>());
    assert_eq!(v.feats[..], full.feats[..4 * FEATURE_CHANNELS]);
    for (i, r) in rows.iter().enumerate() {
        let k = (r[0] - 0.5) as usize;
        if k >= 4 {
            assert_eq!(v.point_to_voxel[i], -1, "point {i} in dropped voxel {k}");
        } else {
            assert_eq!(v.point_to_voxel[i], k as i32);
            assert_eq!(full.point_to_voxel[i], k as i32);
        }
    }
    assert_eq!(v.stats.points_voxelized(), 10);
    assert_eq!(v.stats.points_voxelized(), v.point_to_voxel.iter().filter(|&&t| t >= 0).count());
    assert_eq!(v.stats.points_in, rows.len());
}

#[test]
fn cap_order_spans_the_batch() {
    // The cap counts voxels over the whole batch in key order: sample 0's voxels come first.
    let p = VoxelParams { max_voxels: 3, ..zero_params(1.0) };
    let a = cloud(&[[0.5, 0.5, 0.5, 1.0], [1.5, 0.5, 0.5, 1.0]]);
    let b = cloud(&[[-3.5, 0.5, 0.5, 1.0], [2.5, 0.5, 0.5, 1.0], [9.5, 0.5, 0.5, 1.0]]);
    let v = check_against_naive(&[&a, &b], &p);
    assert_eq!(v.coords, vec![[0, 0, 0, 0], [0, 1, 0, 0], [1, -4, 0, 0]]);
    assert_eq!(v.point_to_voxel, vec![0, 1, 2, -1, -1]);
    assert_eq!(v.stats.points_capped, 2);
    assert_eq!(v.stats.voxels_total, 5);
}

// ---------------------------------------------------------------------------------------------
// Batches

#[test]
fn identical_samples_differ_only_in_batch_index() {
    let mut rng = SplitMix64(0x5EED_0030);
    for prec in [KeyPrecision::F32, KeyPrecision::F64] {
        let p = params([0.1; 3], None, OutOfRange::Clip, VoxelOrigin::ScanMin, prec, 1 << 20);
        let a = random_cloud(&mut rng, 2000, [-20.0, -20.0, -3.0], [20.0, 20.0, 2.0], 0.1);
        let one = check_against_naive(&[&a], &p);
        let two = check_against_naive(&[&a, &a], &p);
        let m = one.len();
        assert_eq!(two.len(), 2 * m);
        for i in 0..m {
            assert_eq!(two.coords[i], one.coords[i]);
            let q = one.coords[i];
            assert_eq!(two.coords[m + i], [1, q[1], q[2], q[3]]);
            assert_eq!(feat(&two, i), feat(&one, i));
            assert_eq!(feat(&two, m + i), feat(&one, i));
            assert_eq!(two.counts[m + i], one.counts[i]);
            assert_eq!(two.xyz[m + i], one.xyz[i]);
        }
        let n = a.len();
        for i in 0..n {
            assert_eq!(two.point_to_voxel[i], one.point_to_voxel[i]);
            assert_eq!(two.point_to_voxel[n + i], one.point_to_voxel[i] + m as i32);
        }
    }
}

#[test]
fn scan_min_origin_is_per_sample() {
    // Points on a 1/64 m lattice and integer shifts: the shifted copy is exact in f32, so its
    // coordinates relative to its own minimum are identical.
    let mut rng = SplitMix64(0x5EED_0031);
    let rows: Vec<[f32; 4]> = (0..1500)
        .map(|_| {
            let g = |r: &mut SplitMix64, lo: f32, hi: f32| (r.uniform(lo, hi) * 64.0).round() / 64.0;
            [g(&mut rng, -20.0, 20.0), g(&mut rng, -20.0, 20.0), g(&mut rng, -3.0, 2.0), rng.uniform(0.0, 100.0)]
        })
        .collect();
    let shifted: Vec<[f32; 4]> = rows.iter().map(|r| [r[0] + 100.0, r[1] - 50.0, r[2] + 7.0, r[3]]).collect();
    let (a, b) = (cloud(&rows), cloud(&shifted));
    for prec in [KeyPrecision::F32, KeyPrecision::F64] {
        let p = params([0.25; 3], None, OutOfRange::Clip, VoxelOrigin::ScanMin, prec, 1 << 20);
        let v = check_against_naive(&[&a, &b], &p);
        let m = v.len() / 2;
        assert_eq!(v.len(), 2 * m);
        assert!(v.coords[..m].iter().all(|q| q[0] == 0));
        for i in 0..m {
            let q = v.coords[i];
            assert_eq!(v.coords[m + i], [1, q[1], q[2], q[3]], "{prec:?} voxel {i}");
            assert_eq!(v.counts[m + i], v.counts[i]);
        }
        let n = a.len();
        for i in 0..n {
            assert_eq!(v.point_to_voxel[n + i], v.point_to_voxel[i] + m as i32);
        }
    }
}

#[test]
fn empty_samples_inside_a_batch() {
    let mut rng = SplitMix64(0x5EED_0032);
    let p = params([0.2; 3], None, OutOfRange::Clip, VoxelOrigin::ScanMin, KeyPrecision::F32, 1 << 20);
    let a = random_cloud(&mut rng, 800, [-10.0, -10.0, -2.0], [10.0, 10.0, 2.0], 0.2);
    let c = random_cloud(&mut rng, 600, [-5.0, -5.0, -2.0], [5.0, 5.0, 2.0], 0.2);
    let empty = Points::default();
    let alone_a = voxelize_cpu(&[&a], &p).unwrap();
    let alone_c = voxelize_cpu(&[&c], &p).unwrap();
    let v = check_against_naive(&[&empty, &a, &empty, &c, &empty], &p);
    assert_eq!(v.len(), alone_a.len() + alone_c.len());
    assert_eq!(v.stats.points_in, a.len() + c.len());
    let (ma, mc) = (alone_a.len(), alone_c.len());
    for i in 0..ma {
        let q = alone_a.coords[i];
        assert_eq!(v.coords[i], [1, q[1], q[2], q[3]]);
        assert_eq!(feat(&v, i), feat(&alone_a, i));
    }
    for i in 0..mc {
        let q = alone_c.coords[i];
        assert_eq!(v.coords[ma + i], [3, q[1], q[2], q[3]]);
        assert_eq!(feat(&v, ma + i), feat(&alone_c, i));
    }
    for i in 0..a.len() {
        assert_eq!(v.point_to_voxel[i], alone_a.point_to_voxel[i]);
    }
    for i in 0..c.len() {
        assert_eq!(v.point_to_voxel[a.len() + i], alone_c.point_to_voxel[i] + ma as i32);
    }
}

// ---------------------------------------------------------------------------------------------
// Invalid points and empty input

#[test]
fn non_finite_points_are_counted_and_unmapped() {
    let p = zero_params(1.0);
    let c = cloud(&[
        [0.5, 0.5, 0.5, 1.0],
        [f32::NAN, 0.5, 0.5, 1.0],
        [0.5, f32::INFINITY, 0.5, 1.0],
        [0.5, 0.5, f32::NEG_INFINITY, 1.0],
        [0.6, 0.6, 0.6, 3.0],
    ]);
    let v = check_against_naive(&[&c], &p);
    assert_eq!(v.stats.non_finite, 3);
    assert_eq!(v.point_to_voxel, vec![0, -1, -1, -1, 0]);
    assert_eq!(v.counts, vec![2]);
    assert_eq!(feat(&v, 0), [0.55, 0.55, 0.55, 2.0]);
}

#[test]
fn non_finite_points_do_not_move_scan_min() {
    let p = params([1.0; 3], None, OutOfRange::Clip, VoxelOrigin::ScanMin, KeyPrecision::F64, 100);
    let c = cloud(&[[f32::NEG_INFINITY, -1e30, 0.0, 0.0], [2.5, 3.5, 4.5, 1.0], [4.0, 3.5, 4.5, 1.0]]);
    let v = check_against_naive(&[&c], &p);
    assert_eq!(v.coords, vec![[0, 0, 0, 0], [0, 1, 0, 0]]);
    assert_eq!(v.point_to_voxel, vec![-1, 0, 1]);
}

#[test]
fn all_invalid_cloud_gives_empty_output() {
    let r = [[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]];
    let p = params([0.1; 3], Some(r), OutOfRange::Drop, VoxelOrigin::ScanMin, KeyPrecision::F32, 100);
    let c = cloud(&[[f32::NAN, 0.0, 0.0, 1.0], [5.0, 0.0, 0.0, 1.0], [0.0, f32::INFINITY, 0.0, 1.0]]);
    let v = voxelize_cpu(&[&c], &p).expect("no error for an all-invalid cloud");
    assert!(v.is_empty());
    assert!(v.feats.is_empty() && v.xyz.is_empty() && v.counts.is_empty());
    assert_eq!(v.point_to_voxel, vec![-1, -1, -1]);
    assert_eq!(
        v.stats,
        VoxelStats { points_in: 3, non_finite: 2, out_of_range: 1, ..Default::default() }
    );
    assert_eq!(v.stats.points_voxelized(), 0);
}

#[test]
fn empty_batch_and_zero_points_give_empty_output() {
    let p = zero_params(0.1);
    let none = voxelize_cpu(&[], &p).expect("empty batch");
    assert!(none.is_empty() && none.point_to_voxel.is_empty());
    assert_eq!(none.stats, VoxelStats::default());
    let e = Points::default();
    for batch in [vec![&e], vec![&e, &e, &e]] {
        let v = voxelize_cpu(&batch, &p).expect("zero points");
        assert!(v.is_empty() && v.point_to_voxel.is_empty());
        assert_eq!(v.stats, VoxelStats::default());
    }
    let scan = params([0.1; 3], None, OutOfRange::Clip, VoxelOrigin::ScanMin, KeyPrecision::F32, 10);
    assert!(voxelize_cpu(&[&e], &scan).unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Invalid parameters and oversized grids

fn expect_invalid(batch: &[&Points], p: &VoxelParams, needle: &str) {
    assert!(p.validate().is_err(), "validate accepted {p:?}");
    match voxelize_cpu(batch, p) {
        Err(Error::InvalidInput(msg)) => assert!(msg.contains(needle), "message {msg:?} lacks {needle:?}"),
        Err(e) => panic!("wrong error kind for {p:?}: {e}"),
        Ok(_) => panic!("accepted {p:?}"),
    }
}

#[test]
fn invalid_params_are_errors() {
    let c = cloud(&[[0.5, 0.5, 0.5, 1.0]]);
    let good = params([0.1; 3], Some([[-1.0; 3], [1.0; 3]]), OutOfRange::Clip, VoxelOrigin::RangeMin, KeyPrecision::F64, 10);
    assert!(good.validate().is_ok());
    assert!(voxelize_cpu(&[&c], &good).is_ok());

    for (i, bad) in [0.0, -0.1, f64::NAN, f64::INFINITY].into_iter().enumerate() {
        let mut p = good.clone();
        p.voxel_size[i % 3] = bad;
        expect_invalid(&[&c], &p, "voxel_size");
    }
    expect_invalid(&[&c], &VoxelParams { max_voxels: 0, ..good.clone() }, "max_voxels");
    expect_invalid(&[&c], &VoxelParams { max_voxels: i32::MAX as usize + 5, ..good.clone() }, "max_voxels");
    expect_invalid(&[&c], &VoxelParams { range: None, ..good.clone() }, "range_min");
    for axis in 0..3 {
        let mut r = [[-1.0; 3], [1.0; 3]];
        r[0][axis] = 1.0; // min == max
        expect_invalid(&[&c], &VoxelParams { range: Some(r), ..good.clone() }, "pc_range");
        r[0][axis] = 2.0; // min > max
        expect_invalid(&[&c], &VoxelParams { range: Some(r), ..good.clone() }, "pc_range");
        r[0][axis] = f64::NAN;
        expect_invalid(&[&c], &VoxelParams { range: Some(r), ..good.clone() }, "pc_range");
    }
    // Invalid params are rejected even when there are no points to voxelize.
    expect_invalid(&[], &VoxelParams { max_voxels: 0, ..good.clone() }, "max_voxels");
}

#[test]
fn mismatched_column_lengths_are_an_error() {
    let mut c = cloud(&[[0.5, 0.5, 0.5, 1.0], [1.5, 0.5, 0.5, 1.0]]);
    c.intensity.pop();
    match voxelize_cpu(&[&c], &zero_params(1.0)) {
        Err(Error::InvalidInput(msg)) => assert!(msg.contains("sample 0"), "{msg}"),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn batch_of_more_than_65536_samples_is_an_error() {
    let e = Points::default();
    let p = zero_params(1.0);
    let ok: Vec<&Points> = vec![&e; 1 << 16];
    assert!(voxelize_cpu(&ok, &p).unwrap().is_empty());
    let too_many: Vec<&Points> = vec![&e; (1 << 16) + 1];
    match voxelize_cpu(&too_many, &p) {
        Err(Error::InvalidInput(msg)) => assert!(msg.contains("65536"), "{msg}"),
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn too_many_voxels_for_a_64_bit_key_is_an_error() {
    // ±1e6 m at 1 mm: |coordinate| = 1e9 < 2^30, so every point is on the grid, but the cloud
    // spans (2e9+1)^3 voxels, which no 64-bit key holds.
    let c = cloud(&[[-1e6, -1e6, -1e6, 1.0], [1e6, 1e6, 1e6, 1.0], [0.0, 0.0, 0.0, 1.0]]);
    for prec in [KeyPrecision::F32, KeyPrecision::F64] {
        let p = VoxelParams { precision: prec, ..zero_params(1e-3) };
        match voxelize_cpu(&[&c], &p) {
            Err(Error::InvalidInput(msg)) => assert!(msg.contains("64-bit key"), "{msg}"),
            other => panic!("{prec:?}: expected the 64-bit key error, got {other:?}"),
        }
    }
}

#[test]
fn a_wide_span_on_one_axis_still_fits_the_key() {
    // 2e9+1 voxels along x alone fits 64 bits: two voxels, no error.
    let c = cloud(&[[-1e6, 0.0, 0.0, 1.0], [1e6, 0.0, 0.0, 2.0]]);
    let v = check_against_naive(&[&c], &zero_params(1e-3));
    assert_eq!(v.coords, vec![[0, -1_000_000_000, 0, 0], [0, 1_000_000_000, 0, 0]]);
}

#[test]
fn coordinates_past_the_grid_limit_are_out_of_grid() {
    // 1e7 m at 1 mm is 1e10 voxels > 2^30: counted out_of_grid, mapped to -1, no error.
    let c = cloud(&[[1e7, 0.0, 0.0, 1.0], [0.0, -1e7, 0.0, 1.0], [0.5003, 0.5003, 0.5003, 1.0], [3e38, 0.0, 0.0, 1.0]]);
    for prec in [KeyPrecision::F32, KeyPrecision::F64] {
        let p = VoxelParams { precision: prec, ..zero_params(1e-3) };
        let v = check_against_naive(&[&c], &p);
        assert_eq!(v.stats.out_of_grid, 3, "{prec:?}");
        assert_eq!(v.point_to_voxel, vec![-1, -1, 0, -1]);
        assert_eq!(v.coords, vec![[0, 500, 500, 500]]);
    }
    // With scan_min the far side of a ±1e6 m cloud is 2e9 voxels from the origin: out of grid.
    let c = cloud(&[[-1e6, 0.0, 0.0, 1.0], [1e6, 0.0, 0.0, 1.0]]);
    let p = params([1e-3; 3], None, OutOfRange::Clip, VoxelOrigin::ScanMin, KeyPrecision::F64, 10);
    let v = check_against_naive(&[&c], &p);
    assert_eq!(v.stats.out_of_grid, 1);
    assert_eq!(v.point_to_voxel, vec![0, -1]);
}

// ---------------------------------------------------------------------------------------------
// Real scans

#[test]
fn nuscenes_scan_with_nuscenes_params() {
    let p = model_params("sphereformer_nuscenes.yaml");
    assert_eq!(p.precision, KeyPrecision::F32);
    assert_eq!(p.origin, VoxelOrigin::ScanMin);
    for scan in nuscenes_scans() {
        assert!(scan.len() > 10_000);
        let v = check_against_naive(&[&scan], &p);
        assert_eq!(v.stats.points_voxelized(), scan.len(), "every nuScenes point voxelized");
        assert_eq!(v.stats.voxels_total, v.len());
        assert!(v.point_to_voxel.iter().all(|&t| t >= 0));
        assert!(v.coords.iter().all(|q| q[0] == 0 && q[1] >= 0 && q[2] >= 0 && q[3] >= 0));
        for a in 1..4 {
            assert_eq!(v.coords.iter().map(|q| q[a]).min(), Some(0));
        }
        assert!(v.len() > 1000 && v.len() < scan.len());
    }
}

#[test]
fn nuscenes_scan_with_semantickitti_params() {
    let p = model_params("sphereformer_semantickitti.yaml");
    assert_eq!(p.precision, KeyPrecision::F64);
    assert_eq!(p.out_of_range, OutOfRange::Clip);
    let r = p.range.expect("semantickitti has a pc_range");
    for scan in nuscenes_scans() {
        let v = check_against_naive(&[&scan], &p);
        // Clip drops nothing: points past 51.2 m are clamped onto the box.
        assert_eq!(v.stats.points_voxelized(), scan.len());
        assert!(v.coords.iter().all(|q| q[1] >= 0 && q[2] >= 0 && q[3] >= 0));
        let max_cells = [0, 1, 2].map(|a| ((r[1][a] - r[0][a]) / p.voxel_size[a]).round() as i32);
        for q in &v.coords {
            for a in 0..3 {
                assert!(q[1 + a] <= max_cells[a], "coordinate {q:?} past the clip box");
            }
        }
        for x in &v.xyz {
            for a in 0..3 {
                // The f32 mean of values on a face may round one ulp past it.
                let slack = 1e-6 * r[0][a].abs().max(r[1][a].abs());
                assert!(r[0][a] - slack <= x[a] as f64 && x[a] as f64 <= r[1][a] + slack, "clipped mean {x:?} outside pc_range");
            }
        }
        assert!(scan.x.iter().any(|&x| x as f64 > r[1][0]), "scan should reach past the range");
    }
}

#[test]
fn semantickitti_scan_with_semantickitti_params() {
    let p = model_params("sphereformer_semantickitti.yaml");
    let scan = kitti_scan();
    assert_eq!(scan.len(), 50);
    let v = check_against_naive(&[&scan], &p);
    assert_eq!(v.stats.points_in, 50);
    assert_eq!(v.stats.points_voxelized(), 50);
    assert!(v.coords.iter().all(|q| q[0] == 0 && q[1] >= 0 && q[2] >= 0 && q[3] >= 0));
    assert_eq!(v.counts.iter().sum::<u32>(), 50);
}

#[test]
fn real_scans_batched_together() {
    let kitti = model_params("sphereformer_semantickitti.yaml");
    let scans = nuscenes_scans();
    let k = kitti_scan();
    let mut batch: Vec<&Points> = scans.iter().collect();
    batch.push(&k);
    let v = check_against_naive(&batch, &kitti);
    assert_eq!(v.stats.points_voxelized(), v.stats.points_in);
    assert_eq!(v.coords.last().unwrap()[0] as usize, scans.len());
}

// ---------------------------------------------------------------------------------------------
// Determinism

#[test]
fn two_runs_give_identical_output() {
    let mut rng = SplitMix64(0x5EED_0040);
    for p in sweep_params() {
        let a = random_cloud(&mut rng, 5000, [-11.0, -9.0, -2.5], [11.0, 9.0, 2.0], p.voxel_size[0] as f32);
        let b = random_cloud(&mut rng, 3000, [-11.0, -9.0, -2.5], [11.0, 9.0, 2.0], p.voxel_size[0] as f32);
        let first = voxelize_cpu(&[&a, &b], &p).unwrap();
        for _ in 0..3 {
            assert_eq!(voxelize_cpu(&[&a, &b], &p).unwrap(), first);
        }
    }
    let p = model_params("sphereformer_nuscenes.yaml");
    let scan = &nuscenes_scans()[0];
    let first = voxelize_cpu(&[scan], &p).unwrap();
    assert_eq!(voxelize_cpu(&[scan], &p).unwrap(), first);
}

/// Permutes the input points; output coordinates and order are the same, point_to_voxel follows
/// the permutation, counts equal, means within 1e-6 relative (summation order differs).
fn check_permutation_invariance(c: &Points, p: &VoxelParams, seed: u64) {
    let rows = rows_of(c);
    let mut perm: Vec<usize> = (0..rows.len()).collect();
    SplitMix64(seed).shuffle(&mut perm);
    let shuffled = cloud(&perm.iter().map(|&i| rows[i]).collect::<Vec<_>>());
    let a = voxelize_cpu(&[c], p).unwrap();
    let b = voxelize_cpu(&[&shuffled], p).unwrap();
    assert_eq!(a.coords, b.coords);
    assert_eq!(a.counts, b.counts);
    assert_eq!(a.stats, b.stats);
    for (j, &i) in perm.iter().enumerate() {
        assert_eq!(b.point_to_voxel[j], a.point_to_voxel[i]);
    }
    for k in 0..a.feats.len() {
        assert_close(a.feats[k], b.feats[k], &format!("feature {k}"));
    }
    for k in 0..a.len() {
        for ax in 0..3 {
            assert_close(a.xyz[k][ax], b.xyz[k][ax], &format!("xyz {k}.{ax}"));
        }
    }
}

#[test]
fn permuting_points_keeps_coordinates_and_order() {
    let mut rng = SplitMix64(0x5EED_0041);
    for (k, p) in sweep_params().iter().enumerate() {
        let c = random_cloud(&mut rng, 4000, [-11.0, -9.0, -2.5], [11.0, 9.0, 2.0], p.voxel_size[0] as f32);
        check_permutation_invariance(&c, p, 1000 + k as u64);
    }
}

#[test]
fn permuting_real_scans_keeps_coordinates_and_order() {
    for scan in nuscenes_scans() {
        check_permutation_invariance(&scan, &model_params("sphereformer_nuscenes.yaml"), 7);
        check_permutation_invariance(&scan, &model_params("sphereformer_semantickitti.yaml"), 8);
    }
}
