//! BEVFusion's LiDAR branch on the CPU: hard voxelization against a naive implementation and
//! hand-made cases (limits, range edges, order, bad input), anisotropic strided kernel maps against
//! brute force, the config and weight names, and the encoder end to end on the nuScenes sweep
//! against an independent site-by-site reference (conv → BN → ReLU unfolded, dense flattening
//! written out), deterministic.

use crate::common;
use crate::common::{rel_err, Rng};
use sptr::models::bevfusion::lidar_encoder::{random_tensors, random_weights, weight_specs, LidarEncoder, LidarEncoderConfig, Padding, BN_EPS, PREFIX};
use sptr::nn::{ModelError, Weights};
use sptr::ops::voxelize::hard::{hard_voxelize_cpu, point_rows, HardVoxelParams, POINT_COLUMNS};
use sptr::ops::sparse_conv::kernel_map::{conv_output_shape, kernel_offsets, strided, ConvGeometry};
use sptr::ops::sparse_conv::tensor::SparseTensor;
use std::collections::{BTreeSet, HashMap};

fn model_yaml() -> std::path::PathBuf {
    common::root().join("config/models/bevfusion_seg_fusion.yaml")
}

fn full_config() -> LidarEncoderConfig {
    LidarEncoderConfig::load(&model_yaml()).expect("fusion model YAML")
}

fn nus_params() -> HardVoxelParams {
    full_config().voxelize
}

fn sweep_rows() -> Vec<[f32; POINT_COLUMNS]> {
    // the key frame: upstream sets column 4 (time lag) to 0
    point_rows(&common::nuscenes_sweep(), 0.0)
}

// ---------- hard voxelization ----------

/// Upstream's algorithm written the slow way: every point's cell, the distinct cells in order of
/// first appearance (linear search), then per kept voxel all its points in order, the first
/// `max` of them averaged.
fn naive_voxelize(points: &[[f32; 5]], p: &HardVoxelParams) -> (Vec<[i32; 4]>, Vec<f32>, Vec<u32>, usize) {
    let vs = p.voxel_size.map(|v| v as f32);
    let lo = [0, 1, 2].map(|a| p.point_cloud_range[a] as f32);
    let hi = [0, 1, 2].map(|a| p.point_cloud_range[a + 3] as f32);
    let grid = [0, 1, 2].map(|a| ((hi[a] - lo[a]) / vs[a]).round() as i32);
    let cell = |q: &[f32; 5]| -> Option<[i32; 3]> {
        if q.iter().any(|v| !(v.abs() <= 65504.0)) {
            return None; // NaN, Inf, or beyond FP16's range
        }
        if p.range_filter && !(0..3).all(|a| q[a] > lo[a] && q[a] < hi[a]) {
            return None;
        }
        let c = [0, 1, 2].map(|a| ((q[a] - lo[a]) / vs[a]).floor() as i32);
        (0..3).all(|a| c[a] >= 0 && c[a] < grid[a]).then_some(c)
    };
    let cells: Vec<Option<[i32; 3]>> = points.iter().map(cell).collect();
    let mut order: Vec<[i32; 3]> = Vec::new();
    for c in cells.iter().flatten() {
        if !order.contains(c) {
            order.push(*c);
        }
    }
    let total = order.len();
    order.truncate(p.max_voxels);
    let mut coords = vec![];
    let mut feats = vec![];
    let mut counts = vec![];
    for c in &order {
        let mine: Vec<&[f32; 5]> = points.iter().zip(&cells).filter(|(_, k)| k.as_ref() == Some(c)).map(|(q, _)| q).take(p.max_num_points).collect();
        let mut sum = [0f32; 5];
        for q in &mine {
            for k in 0..5 {
                sum[k] += q[k];
            }
        }
        coords.push([0, c[0], c[1], c[2]]);
        feats.extend(sum.iter().map(|s| s / mine.len() as f32));
        counts.push(mine.len() as u32);
    }
    (coords, feats, counts, total)
}

#[test]
fn hard_voxelize_matches_naive_on_random_clouds() {
    let mut rng = Rng(20);
    for case in 0..4 {
        // a small box around the range edges, few cells, so voxels fill up and the cap bites
        let mut p = nus_params();
        p.range_filter = case % 2 == 0;
        p.max_num_points = [10, 3, 1, 5][case];
        p.max_voxels = [120000, 40, 7, 200][case];
        let n = 1500;
        let pts: Vec<[f32; 5]> = (0..n)
            .map(|i| {
                let mut q = [rng.uniform(50.9, 51.5), rng.uniform(-51.5, -50.9), rng.uniform(-5.3, -4.1), rng.uniform(0.0, 255.0), rng.uniform(0.0, 0.5)];
                if i % 97 == 0 {
                    q[rng.below(5)] = f32::NAN;
                }
                q
            })
            .collect();
        let v = hard_voxelize_cpu(&pts, &p).unwrap();
        let (coords, feats, counts, total) = naive_voxelize(&pts, &p);
        assert_eq!(v.coords, coords, "case {case}: coordinates and order");
        assert_eq!(v.counts, counts, "case {case}");
        assert_eq!(v.feats, feats, "case {case}: means bit for bit");
        let s = v.stats;
        assert_eq!(s.voxels_total, total);
        assert_eq!(s.voxels_kept, coords.len());
        assert_eq!(s.non_finite, (0..n).filter(|i| i % 97 == 0).count());
        assert_eq!(s.points_used() as u32, counts.iter().sum::<u32>(), "case {case}: every point accounted for");
        assert!(s.out_of_range > 0 && (case == 0 || s.points_capped + s.points_over_max > 0), "case {case}: {s:?}");
    }
}

#[test]
fn hard_voxelize_on_the_sweep_matches_naive() {
    let pts = sweep_rows();
    let mut p = nus_params();
    p.max_voxels = 3000; // the cap bites: the naive first-appearance order decides which stay
    // the naive search is quadratic in voxels: a 6000-point slice keeps it quick
    let pts = &pts[..6000];
    let v = hard_voxelize_cpu(pts, &p).unwrap();
    let (coords, feats, counts, total) = naive_voxelize(pts, &p);
    assert!(total > 3000, "{total} voxels");
    assert_eq!(v.coords, coords);
    assert_eq!(v.counts, counts);
    assert_eq!(v.feats, feats);
    assert_eq!(v.stats.voxels_dropped(), total - 3000);
}

#[test]
fn hard_voxelize_hand_made_cases() {
    let mut p = nus_params();
    assert!(p.range_filter, "on by default from the YAML");
    p.range_filter = false;
    p.max_num_points = 2;
    p.max_voxels = 2;
    let pt = |x: f32, y: f32, z: f32, i: f32| [x, y, z, i, 0.0];
    let pts = vec![
        pt(0.05, 0.05, 0.1, 1.0),     // A = (512, 512, 25)
        pt(-51.2, -51.2, -5.0, 2.0),  // B = (0, 0, 0): the lower corner is inside
        pt(0.01, 0.02, 0.03, 3.0),    // A again
        pt(0.09, 0.09, 0.19, 4.0),    // A, third point: over max_num_points
        pt(51.2, 0.0, 0.0, 5.0),      // x = max: outside (upper bound exclusive)
        pt(-51.25, 0.0, 0.0, 6.0),    // half a voxel below min: floor gives -1, outside
        pt(10.0, 10.0, 0.0, 7.0),     // C: a third voxel, dropped by max_voxels = 2
        pt(10.0, 10.0, 0.0, 8.0),     // C again: dropped with it
        pt(-51.2, -51.2, -5.0, 10.0), // B again
    ];
    let v = hard_voxelize_cpu(&pts, &p).unwrap();
    assert_eq!(v.coords, vec![[0, 512, 512, 25], [0, 0, 0, 0]], "order of first appearance, [b, x, y, z]");
    assert_eq!(v.counts, vec![2, 2]);
    assert_eq!(&v.feats[0..5], &[(0.05 + 0.01) / 2.0, (0.05 + 0.02) / 2.0, (0.1 + 0.03) / 2.0, 2.0, 0.0]);
    assert_eq!(&v.feats[5..10], &[-51.2, -51.2, -5.0, 6.0, 0.0]);
    let s = v.stats;
    assert_eq!((s.points_in, s.out_of_range, s.points_over_max, s.points_capped), (9, 2, 1, 2));
    assert_eq!((s.voxels_total, s.voxels_kept, s.voxels_dropped(), s.points_used()), (3, 2, 1, 4));

    // with upstream's PointsRangeFilter (strict) the lower-corner points go; C moves up
    p.range_filter = true;
    let v = hard_voxelize_cpu(&pts, &p).unwrap();
    assert_eq!(v.coords, vec![[0, 512, 512, 25], [0, 100 + 512, 100 + 512, 25]]);
    assert_eq!(v.counts, vec![2, 2]);
    let s = v.stats;
    assert_eq!((s.out_of_range, s.points_over_max, s.points_capped, s.voxels_total), (4, 1, 0, 2));
    let mut edge = nus_params();
    edge.max_voxels = 10;
    let v = hard_voxelize_cpu(&[[-51.19, -51.19, -4.99, 0.0, 0.0], [51.199, 51.199, 2.999, 0.0, 0.0]], &edge).unwrap();
    assert_eq!(v.coords, vec![[0, 0, 0, 0], [0, 1023, 1023, 39]], "just inside both faces");
}

#[test]
fn hard_voxelize_fp16_rounding_option() {
    // 50.1001 is in cell 1013 in float32; in FP16 (spacing 1/32 there) it is 50.09375, cell 1012
    let mut p = nus_params();
    let pts = vec![[50.1001, 0.0, 0.0, 1.0, 0.3]];
    let v32 = hard_voxelize_cpu(&pts, &p).unwrap();
    p.round_points_to_fp16 = true;
    let v16 = hard_voxelize_cpu(&pts, &p).unwrap();
    assert_eq!(v32.coords[0][1], 1013);
    assert_eq!(v16.coords[0][1], 1012);
    assert_eq!(v16.feats[0], 50.09375);
    assert_eq!(v16.feats[4], half::f16::from_f32(0.3).to_f32());
    // a value beyond FP16's range (Inf in FP16): dropped as non-finite, with or without rounding;
    // 65504 itself is kept
    for fp16 in [false, true] {
        p.round_points_to_fp16 = fp16;
        let v = hard_voxelize_cpu(&[[0.0, 0.0, 0.0, 1.0e6, 0.0], [0.0, 0.0, 0.0, 0.0, -65505.0], [0.0, 0.0, 0.0, 65504.0, 0.0]], &p).unwrap();
        assert_eq!((v.len(), v.stats.non_finite), (1, 2));
        assert_eq!(v.feats[3], 65504.0);
    }
}

#[test]
fn hard_voxelize_bad_input() {
    let p = nus_params();
    let v = hard_voxelize_cpu(&[], &p).unwrap();
    assert!(v.is_empty());
    assert_eq!(v.stats.points_in, 0);
    let nan = vec![[f32::NAN, 0.0, 0.0, 0.0, 0.0], [0.0, f32::INFINITY, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, f32::NAN, 0.0], [1.0, 1.0, 0.0, 1.0, f32::NEG_INFINITY]];
    let v = hard_voxelize_cpu(&nan, &p).unwrap();
    assert_eq!((v.len(), v.stats.non_finite), (0, 4));
    let far = vec![[100.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 3.5, 0.0, 0.0], [f32::MAX, 0.0, 0.0, 0.0, 0.0]];
    let v = hard_voxelize_cpu(&far, &p).unwrap();
    assert_eq!((v.len(), v.stats.out_of_range, v.stats.non_finite), (0, 2, 1), "f32::MAX is beyond FP16's range");
}

// ---------- anisotropic kernel maps ----------

/// Every (offset, input, output) triple of a strided conv by brute force over the output grid.
fn brute_strided(t: &SparseTensor, g: &ConvGeometry) -> (BTreeSet<[i32; 4]>, BTreeSet<(usize, [i32; 4], [i32; 4])>) {
    let out_shape = conv_output_shape(t.spatial_shape(), g);
    let sites: HashMap<[i32; 4], usize> = t.coords().iter().enumerate().map(|(i, c)| (*c, i)).collect();
    let mut outs = BTreeSet::new();
    let mut triples = BTreeSet::new();
    for b in 0..2 {
        for qx in 0..out_shape[0] {
            for qy in 0..out_shape[1] {
                for qz in 0..out_shape[2] {
                    for (k, r) in kernel_offsets(g.kernel).iter().enumerate() {
                        let q = [qx, qy, qz];
                        let i = [0, 1, 2].map(|a| q[a] * g.stride[a] - g.padding[a] + r[a] * g.dilation[a]);
                        let c = [b, i[0], i[1], i[2]];
                        if sites.contains_key(&c) {
                            outs.insert([b, qx, qy, qz]);
                            triples.insert((k, c, [b, qx, qy, qz]));
                        }
                    }
                }
            }
        }
    }
    (outs, triples)
}

#[test]
fn anisotropic_strided_maps_match_brute_force() {
    let mut rng = Rng(7);
    let shape = [11, 9, 11];
    let mut coords = BTreeSet::new();
    while coords.len() < 180 {
        coords.insert([rng.below(2) as i32, rng.below(11) as i32, rng.below(9) as i32, rng.below(11) as i32]);
    }
    let coords: Vec<[i32; 4]> = coords.into_iter().collect();
    let t = SparseTensor::new(coords.clone(), vec![0.0; coords.len()], 1, shape).unwrap();
    let geoms = [
        // stage 3's down conv: padding [1, 1, 0]
        ConvGeometry { kernel: [3; 3], stride: [2; 3], padding: [1, 1, 0], dilation: [1; 3] },
        // conv_out: kernel (1, 1, 3), stride (1, 1, 2), padding 0
        ConvGeometry { kernel: [1, 1, 3], stride: [1, 1, 2], padding: [0; 3], dilation: [1; 3] },
        ConvGeometry { kernel: [3; 3], stride: [2; 3], padding: [1; 3], dilation: [1; 3] },
    ];
    for g in geoms {
        let m = strided(&t, g).unwrap();
        let (outs, triples) = brute_strided(&t, &g);
        assert_eq!(m.out_spatial_shape, conv_output_shape(shape, &g));
        assert_eq!(m.out_coords.iter().copied().collect::<BTreeSet<_>>(), outs, "{g:?}: output sites");
        let got: BTreeSet<(usize, [i32; 4], [i32; 4])> = m
            .pairs
            .iter()
            .enumerate()
            .flat_map(|(k, l)| l.iter().map(move |&(i, o)| (k, i, o)))
            .map(|(k, i, o)| (k, coords[i as usize], m.out_coords[o as usize]))
            .collect();
        assert_eq!(got, triples, "{g:?}: pairs");
    }
    // the nuScenes shapes: 1024² × 41 → 512² × 21 → 256² × 11 → 128² × 5 → 128² × 2
    assert_eq!(full_config().shapes().unwrap(), vec![[1024, 1024, 41], [512, 512, 21], [256, 256, 11], [128, 128, 5], [128, 128, 5], [128, 128, 2]]);
}

// ---------- config and weights ----------

#[test]
fn config_and_weight_names() {
    let cfg = full_config();
    assert_eq!(cfg.voxelize.max_voxels, 120000, "the test-time value");
    assert_eq!(cfg.voxelize.max_num_points, 10);
    assert_eq!(cfg.backbone.encoder_paddings[2][2], Padding::Axes([1, 1, 0]));
    assert_eq!(cfg.bev_shape().unwrap(), [128, 128, 256]);
    let specs = weight_specs(&cfg).unwrap();
    let shape = |n: &str| specs.iter().find(|s| s.name == format!("{PREFIX}{n}")).map(|s| s.shape.clone());
    assert_eq!(shape("conv_input.0.weight"), Some(vec![3, 3, 3, 5, 16]), "spconv 1.x layout [k, k, k, Cin, Cout]");
    assert_eq!(shape("conv_input.1.running_var"), Some(vec![16]));
    assert_eq!(shape("encoder_layers.encoder_layer1.0.conv1.weight"), Some(vec![3, 3, 3, 16, 16]));
    assert_eq!(shape("encoder_layers.encoder_layer1.1.bn2.bias"), Some(vec![16]));
    assert_eq!(shape("encoder_layers.encoder_layer1.2.0.weight"), Some(vec![3, 3, 3, 16, 32]));
    assert_eq!(shape("encoder_layers.encoder_layer3.2.1.weight"), Some(vec![128]));
    assert_eq!(shape("encoder_layers.encoder_layer4.1.conv2.weight"), Some(vec![3, 3, 3, 128, 128]));
    assert_eq!(shape("encoder_layers.encoder_layer4.2.0.weight"), None, "the last stage has no down conv");
    assert_eq!(shape("conv_out.0.weight"), Some(vec![1, 1, 3, 128, 128]));
    // 1 + 3 stages × (2 blocks × 2 convs + 1 down) + 2 blocks × 2 + 1 = 21 convs, each with a BN
    assert_eq!(specs.len(), 21 * 5);

    // the checked loader: other modules' tensors are ignored, ours missing / extra / mis-shaped listed
    let mut t = random_tensors(&cfg, 1).unwrap();
    t.push(("decoder.backbone.blocks.0.0.weight".into(), vec![1], vec![0.0]));
    assert!(LidarEncoder::load(&cfg, &Weights::from_tensors("t", t.clone()).unwrap()).is_ok());
    t.retain(|(n, _, _)| !n.ends_with("conv_out.1.running_mean"));
    t.push((format!("{PREFIX}conv_out.2.weight"), vec![1], vec![0.0]));
    for (n, s, v) in t.iter_mut() {
        if n.ends_with("encoder_layer2.0.conv1.weight") {
            // spconv 2.x's [Cout, k, k, k, Cin] of a 32 → 32 conv has the same shape; a 16 → 32
            // one does not
            *s = vec![32, 3, 3, 3, 32 + 1];
            *v = vec![0.0; s.iter().product()];
        }
    }
    let err = LidarEncoder::load(&cfg, &Weights::from_tensors("t", t).unwrap()).unwrap_err();
    let ModelError::Mismatch { missing, unexpected, misshaped, .. } = &err else { panic!("{err}") };
    assert_eq!(missing, &vec![format!("{PREFIX}conv_out.1.running_mean")]);
    assert_eq!(unexpected, &vec![format!("{PREFIX}conv_out.2.weight")]);
    assert_eq!(misshaped.len(), 1);
    assert!(err.to_string().contains("encoder_layer2.0.conv1.weight"), "{err}");

    // config errors name the key
    let text = std::fs::read_to_string(model_yaml()).unwrap();
    let bad = text.replace("block_type: basicblock", "block_type: conv_module");
    let e = LidarEncoderConfig::parse(&bad, "x.yaml").unwrap_err().to_string();
    assert!(e.contains("block_type"), "{e}");
    let bad = text.replace("sparse_shape: [1024, 1024, 41]", "sparse_shape: [1024, 1000, 41]");
    let e = LidarEncoderConfig::parse(&bad, "x.yaml").unwrap_err().to_string();
    assert!(e.contains("sparse_shape"), "{e}");
    let cam = std::fs::read_to_string(common::root().join("config/models/bevfusion_seg_camera.yaml")).unwrap();
    let e = LidarEncoderConfig::parse(&cam, "camera.yaml").unwrap_err().to_string();
    assert!(e.contains("model.encoders.lidar"), "{e}");
}

// ---------- the encoder end to end ----------

/// A reduced configuration: 0.4 m × 0.4 m × 0.2 m voxels (256² × 40 grid), narrower channels,
/// same structure (256² × 41 → 128² × 21 → 64² × 11 → 32² × 5 → 32² × 2).
fn reduced_config() -> LidarEncoderConfig {
    let mut cfg = full_config();
    cfg.voxelize.voxel_size = [0.4, 0.4, 0.2];
    cfg.backbone.sparse_shape = [256, 256, 41];
    cfg.backbone.base_channels = 4;
    cfg.backbone.output_channels = 8;
    cfg.backbone.encoder_channels = vec![vec![4, 4, 8], vec![8, 8, 12], vec![12, 12, 16], vec![16, 16]];
    cfg.validate().unwrap();
    cfg
}

/// The encoder written site by site from the raw weights: hash lookups for neighbours, conv → BN
/// (running stats, eps 1e-3) → ReLU unfolded, then the dense flattening `c · Z + z`.
struct Naive<'a> {
    w: &'a Weights,
}

type Sites = Vec<([i32; 3], Vec<f32>)>;

impl Naive<'_> {
    fn t(&self, n: &str) -> &[f32] {
        &self.w.get(&format!("{PREFIX}{n}")).unwrap_or_else(|| panic!("{n}")).data
    }

    /// conv (weight `[k0, k1, k2, Cin, Cout]`) at `outs` from `x`, then BN and optional residual, ReLU.
    #[allow(clippy::too_many_arguments)]
    fn layer(&self, x: &Sites, outs: &[[i32; 3]], conv: &str, bn: &str, k: [i32; 3], s: [i32; 3], p: [i32; 3], res: Option<&Sites>) -> Sites {
        let cin = x[0].1.len();
        let w = self.t(&format!("{conv}.weight"));
        let cout = w.len() / (cin * (k[0] * k[1] * k[2]) as usize);
        let index: HashMap<[i32; 3], usize> = x.iter().enumerate().map(|(i, (c, _))| (*c, i)).collect();
        let (g, b, m, v) = (self.t(&format!("{bn}.weight")), self.t(&format!("{bn}.bias")), self.t(&format!("{bn}.running_mean")), self.t(&format!("{bn}.running_var")));
        outs.iter()
            .enumerate()
            .map(|(o, q)| {
                let mut acc = vec![0f64; cout];
                for (kk, r) in kernel_offsets(k).iter().enumerate() {
                    let i = [0, 1, 2].map(|a| q[a] * s[a] - p[a] + r[a]);
                    if let Some(&row) = index.get(&i) {
                        for ci in 0..cin {
                            for co in 0..cout {
                                acc[co] += x[row].1[ci] as f64 * w[(kk * cin + ci) * cout + co] as f64;
                            }
                        }
                    }
                }
                let f = (0..cout)
                    .map(|co| {
                        let y = (acc[co] - m[co] as f64) / ((v[co] + BN_EPS) as f64).sqrt() * g[co] as f64 + b[co] as f64;
                        let y = y + res.map_or(0.0, |r| r[o].1[co] as f64);
                        y.max(0.0) as f32
                    })
                    .collect();
                (*q, f)
            })
            .collect()
    }

    /// Output sites of a strided conv: every q in the output shape some input reaches.
    fn down_sites(x: &Sites, shape: [i32; 3], k: [i32; 3], s: [i32; 3], p: [i32; 3]) -> (Vec<[i32; 3]>, [i32; 3]) {
        let out = [0, 1, 2].map(|a| (shape[a] + 2 * p[a] - k[a]) / s[a] + 1);
        let mut set = BTreeSet::new();
        for (c, _) in x {
            for r in kernel_offsets(k) {
                let num = [0, 1, 2].map(|a| c[a] + p[a] - r[a]);
                if (0..3).all(|a| num[a] >= 0 && num[a] % s[a] == 0 && num[a] / s[a] < out[a]) {
                    set.insert([0, 1, 2].map(|a| num[a] / s[a]));
                }
            }
        }
        (set.into_iter().collect(), out)
    }

    fn run(&self, cfg: &LidarEncoderConfig, coords: &[[i32; 4]], feats: &[f32]) -> (Vec<f32>, [usize; 3]) {
        let b = &cfg.backbone;
        let mut x: Sites = coords.iter().zip(feats.chunks(5)).map(|(c, f)| ([c[1], c[2], c[3]], f.to_vec())).collect();
        let sites = |x: &Sites| x.iter().map(|(c, _)| *c).collect::<Vec<_>>();
        x = self.layer(&x, &sites(&x), "conv_input.0", "conv_input.1", [3; 3], [1; 3], [1; 3], None);
        let mut shape = b.sparse_shape;
        for (i, chans) in b.encoder_channels.iter().enumerate() {
            for j in 0..chans.len() {
                let l = format!("encoder_layers.encoder_layer{}.{j}", i + 1);
                if j + 1 == chans.len() && i + 1 != b.encoder_channels.len() {
                    let pad = b.encoder_paddings[i][j].axes();
                    let (outs, out) = Self::down_sites(&x, shape, [3; 3], [2; 3], pad);
                    x = self.layer(&x, &outs, &format!("{l}.0"), &format!("{l}.1"), [3; 3], [2; 3], pad, None);
                    shape = out;
                } else {
                    let h = self.layer(&x, &sites(&x), &format!("{l}.conv1"), &format!("{l}.bn1"), [3; 3], [1; 3], [1; 3], None);
                    x = self.layer(&h, &sites(&x), &format!("{l}.conv2"), &format!("{l}.bn2"), [3; 3], [1; 3], [1; 3], Some(&x));
                }
            }
        }
        let (outs, out) = Self::down_sites(&x, shape, [1, 1, 3], [1, 1, 2], [0; 3]);
        x = self.layer(&x, &outs, "conv_out.0", "conv_out.1", [1, 1, 3], [1, 1, 2], [0; 3], None);
        let c = b.output_channels;
        let (nx, ny, nz) = (out[0] as usize, out[1] as usize, out[2] as usize);
        // dense (C, X, Y, Z) → permute (C, Z, X, Y) → view (C·Z, X, Y); stored NHWC [X, Y, C·Z]
        let mut bev = vec![0f32; nx * ny * c * nz];
        for (q, f) in &x {
            for (ch, v) in f.iter().enumerate() {
                let plane = ch * nz + q[2] as usize;
                bev[(q[0] as usize * ny + q[1] as usize) * c * nz + plane] = *v;
            }
        }
        (bev, [nx, ny, c * nz])
    }
}

#[test]
fn encoder_matches_the_site_by_site_reference_on_the_sweep() {
    let cfg = reduced_config();
    let w = random_weights(&cfg, 2026).unwrap();
    let enc = LidarEncoder::load(&cfg, &w).unwrap();
    let pts = sweep_rows();
    let (bev, stats) = enc.forward(&pts).unwrap();
    assert_eq!((bev.n, bev.h, bev.w, bev.c), (1, 32, 32, 16), "256 / 8 = 32 cells, 8 channels x 2 z planes");
    assert_eq!(stats.points_in, pts.len());
    assert!(stats.voxels_kept > 5000 && stats.out_of_range > 0, "{stats:?}");
    assert!(bev.data.iter().all(|v| v.is_finite()));
    let nonzero = bev.data.iter().filter(|v| **v != 0.0).count();
    assert!(nonzero > bev.data.len() / 20, "{nonzero} of {} values non-zero", bev.data.len());

    let v = enc.voxelize(&pts).unwrap();
    let (want, shape) = Naive { w: &w }.run(&cfg, &v.coords, &v.feats);
    assert_eq!(shape, [32, 32, 16]);
    let err = rel_err(&bev.data, &want);
    assert!(err < 1e-5, "rel err {err} against the site-by-site reference");

    // deterministic: bit-identical on a second run
    let (again, stats2) = enc.forward(&pts).unwrap();
    assert_eq!(again.data, bev.data);
    assert_eq!(stats2, stats);

    // per-stage outputs: the sites shrink level by level and conv_out has 2 z planes
    let (_, stages) = enc.forward_voxels(&v, true).unwrap();
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["conv_input", "encoder_layer1", "encoder_layer2", "encoder_layer3", "encoder_layer4", "conv_out"]);
    assert_eq!(stages[0].tensor.len(), v.len());
    assert!(stages[2].tensor.len() < stages[1].tensor.len());
    assert_eq!(stages[5].tensor.spatial_shape(), [32, 32, 2]);
}

#[test]
fn encoder_bad_clouds_are_errors() {
    let cfg = reduced_config();
    let enc = LidarEncoder::load(&cfg, &random_weights(&cfg, 3).unwrap()).unwrap();
    for (what, pts) in [
        ("empty", vec![]),
        ("all NaN", vec![[f32::NAN, 0.0, 0.0, 0.0, 0.0]; 4]),
        ("all out of range", vec![[60.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, -9.0, 1.0, 0.0]]),
    ] {
        let e = enc.forward(&pts).unwrap_err().to_string();
        assert!(e.contains("no voxel"), "{what}: {e}");
    }
    // NaN points among good ones are dropped and counted; the rest gives the same map as without them
    let mut pts = sweep_rows()[..3000].to_vec();
    let (clean, _) = enc.forward(&pts).unwrap();
    pts.insert(10, [f32::NAN; 5]);
    pts.push([1.0, f32::INFINITY, 0.0, 0.0, 0.0]);
    let (dirty, stats) = enc.forward(&pts).unwrap();
    assert_eq!(stats.non_finite, 2);
    assert_eq!(dirty.data, clean.data);
}
