//! CPU sparse convolution against a naive dense 3-D convolution (f64), plus kernel-map invariants.
#![allow(clippy::too_many_arguments, clippy::needless_range_loop)]
//!
//! The dense references are written from the definitions (PyTorch conv3d cross-correlation,
//! spconv's output-coordinate rule, transposed conv for the inverse), not from the sparse code.

use sptr::ops::sparse_conv::cpu::{conv, conv_with, fold_batch_norm, spconv_layout, spconv_weight_layout, to_rsck, ConvOptions, PreActivation, WeightLayout};
use sptr::ops::sparse_conv::kernel_map::{conv_output_shape, inverse, kernel_offsets, minkowski_down, strided, submanifold, ConvGeometry, KernelMap, MapKind};
use sptr::ops::sparse_conv::tensor::SparseTensor;
use std::collections::{HashMap, HashSet};

use crate::common::Rng as SplitMix64;

const SHAPE: [i32; 3] = [8, 7, 6];
const BATCHES: i32 = 2;
const CIN: usize = 3;
const COUT: usize = 5;

/// Random sites (~`occupancy`) in `[origin, origin + shape)` for `BATCHES` batches, shuffled so
/// the input order is not the coordinate order.
fn random_tensor(seed: u64, origin: [i32; 3], shape: [i32; 3], occupancy: f64) -> SparseTensor {
    let mut rng = SplitMix64(seed);
    let mut coords = Vec::new();
    for b in 0..BATCHES {
        for x in 0..shape[0] {
            for y in 0..shape[1] {
                for z in 0..shape[2] {
                    if rng.unit() < occupancy {
                        coords.push([b, x + origin[0], y + origin[1], z + origin[2]]);
                    }
                }
            }
        }
    }
    for i in (1..coords.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        coords.swap(i, j);
    }
    let feats = (0..coords.len() * CIN).map(|_| rng.sym()).collect();
    SparseTensor::with_geometry(coords, feats, CIN, [1, 1, 1], origin, shape).unwrap()
}

fn random_vec(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| rng.sym()).collect()
}

/// KRSC weight `[Cout, Kx, Ky, Kz, Cin]` element.
fn w_at(w: &[f32], kernel: [i32; 3], co: usize, r: [i32; 3], ci: usize, cin: usize) -> f64 {
    let k = ((r[0] * kernel[1] + r[1]) * kernel[2] + r[2]) as usize;
    let kv = (kernel[0] * kernel[1] * kernel[2]) as usize;
    w[(co * kv + k) * cin + ci] as f64
}

/// Sparse tensor as a lookup (batch, absolute coordinate) -> features.
fn dense(t: &SparseTensor) -> HashMap<[i32; 4], Vec<f64>> {
    t.coords()
        .iter()
        .enumerate()
        .map(|(i, c)| (*c, t.row(i).iter().map(|&v| v as f64).collect()))
        .collect()
}

/// Asserts `got` equals `want` within f32 rounding: per element |d| <= 1e-5 * (sum of |terms|)
/// and a global relative norm error <= 1e-5.
fn assert_close(got: &[f32], want: &[(f64, f64)], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (i, (&g, &(v, mag))) in got.iter().zip(want).enumerate() {
        let d = (g as f64 - v).abs();
        assert!(g.is_finite(), "{what}: non-finite at {i}");
        assert!(
            d <= 1e-5 * mag + 1e-7,
            "{what}: element {i}: got {g}, want {v} (|terms| {mag})"
        );
        num += d * d;
        den += v * v;
    }
    if den > 0.0 {
        assert!(
            (num / den).sqrt() <= 1e-5,
            "{what}: relative error {}",
            (num / den).sqrt()
        );
    }
}

type Term = (f64, f64);

/// Dense reference of a forward conv: out[q] = bias + sum_r W[r] x[q*s - p + r*d] (coordinates
/// relative to the origins), evaluated at the given output sites.
fn dense_forward(
    input: &SparseTensor,
    in_origin: [i32; 3],
    out_coords: &[[i32; 4]],
    out_origin: [i32; 3],
    g: ConvGeometry,
    w: &[f32],
    bias: Option<&[f32]>,
    cin: usize,
    cout: usize,
) -> Vec<Term> {
    let x = dense(input);
    let o_in = in_origin;
    let mut res = Vec::with_capacity(out_coords.len() * cout);
    for q in out_coords {
        for co in 0..cout {
            let mut s = bias.map_or(0.0, |b| b[co] as f64);
            let mut mag = s.abs();
            for rx in 0..g.kernel[0] {
                for ry in 0..g.kernel[1] {
                    for rz in 0..g.kernel[2] {
                        let r = [rx, ry, rz];
                        let mut c = [q[0], 0, 0, 0];
                        for a in 0..3 {
                            let qr = q[a + 1] - out_origin[a];
                            c[a + 1] =
                                qr * g.stride[a] - g.padding[a] + r[a] * g.dilation[a] + o_in[a];
                        }
                        if let Some(f) = x.get(&c) {
                            for ci in 0..cin {
                                let t = w_at(w, g.kernel, co, r, ci, cin) * f[ci];
                                s += t;
                                mag += t.abs();
                            }
                        }
                    }
                }
            }
            res.push((s, mag));
        }
    }
    res
}

/// spconv's output-site rule evaluated densely: every q in the output grid with some active input
/// at q*s - p + r*d.
fn dense_output_sites(input: &SparseTensor, g: ConvGeometry) -> HashSet<[i32; 4]> {
    let active: HashSet<[i32; 4]> = input.coords().iter().copied().collect();
    let out_shape = conv_output_shape(input.spatial_shape(), &g);
    let o = input.origin();
    let oo = [o[0] / g.stride[0], o[1] / g.stride[1], o[2] / g.stride[2]];
    let mut set = HashSet::new();
    for b in 0..BATCHES {
        for qx in 0..out_shape[0] {
            for qy in 0..out_shape[1] {
                for qz in 0..out_shape[2] {
                    let q = [qx, qy, qz];
                    'r: for r in kernel_offsets(g.kernel) {
                        let mut c = [b, 0, 0, 0];
                        for a in 0..3 {
                            c[a + 1] =
                                q[a] * g.stride[a] - g.padding[a] + r[a] * g.dilation[a] + o[a];
                        }
                        if active.contains(&c) {
                            set.insert([b, qx + oo[0], qy + oo[1], qz + oo[2]]);
                            break 'r;
                        }
                    }
                }
            }
        }
    }
    set
}

fn subm_geometry(k: i32) -> ConvGeometry {
    ConvGeometry {
        kernel: [k; 3],
        stride: [1; 3],
        padding: [k / 2; 3],
        dilation: [1; 3],
    }
}

fn check_subm_symmetric(m: &KernelMap) {
    let kv = m.kernel_volume();
    for o in 0..kv {
        let a: HashSet<(u32, u32)> = m.pairs[o].iter().copied().collect();
        let b: HashSet<(u32, u32)> = m.pairs[kv - 1 - o].iter().map(|&(i, j)| (j, i)).collect();
        assert_eq!(a, b, "offset {o} vs {}", kv - 1 - o);
        assert_eq!(a.len(), m.pairs[o].len(), "duplicate pairs at offset {o}");
    }
    assert_eq!(
        m.pairs[kv / 2],
        (0..m.in_count() as u32).map(|i| (i, i)).collect::<Vec<_>>()
    );
}

fn run_subm(k: i32, origin: [i32; 3], seed: u64) {
    let t = random_tensor(seed, origin, SHAPE, 0.3);
    assert!(t.len() > 50);
    let m = submanifold(&t, [k; 3], [1; 3]).unwrap();
    assert_eq!(m.kind, MapKind::Submanifold);
    assert_eq!(m.out_coords, t.coords());
    check_subm_symmetric(&m);
    let kv = (k * k * k) as usize;
    let w = random_vec(seed ^ 1, COUT * kv * CIN);
    let b = random_vec(seed ^ 2, COUT);
    let got = conv(&t, &m, &w, WeightLayout::Krsc, Some(&b), CIN, COUT).unwrap();
    let want = dense_forward(
        &t,
        origin,
        t.coords(),
        origin,
        subm_geometry(k),
        &w,
        Some(&b),
        CIN,
        COUT,
    );
    assert_close(&got, &want, &format!("subm k{k} origin {origin:?}"));
    // Deterministic: same bits twice.
    let again = conv(&t, &m, &w, WeightLayout::Krsc, Some(&b), CIN, COUT).unwrap();
    assert_eq!(got, again);
    // Repacked once to Rsck (what a model does at load), the same bits.
    let packed = to_rsck(&w, WeightLayout::Krsc, kv, CIN, COUT).unwrap();
    let from_packed = conv(&t, &m, &packed, WeightLayout::Rsck, Some(&b), CIN, COUT).unwrap();
    assert_eq!(got, from_packed, "subm k{k}: Rsck weight repacked at load");
    assert_eq!(spconv_layout(kv, true), spconv_weight_layout(&m));
}

#[test]
fn subm_k1_matches_dense() {
    run_subm(1, [0; 3], 11);
}

#[test]
fn subm_k3_matches_dense() {
    run_subm(3, [0; 3], 12);
}

#[test]
fn subm_k5_matches_dense() {
    run_subm(5, [0; 3], 13);
}

#[test]
fn subm_negative_coordinates_match_dense() {
    run_subm(3, [-4, -3, -6], 14);
    run_subm(5, [-9, 2, -1], 15);
}

#[test]
fn subm_dilated_matches_dense() {
    let t = random_tensor(16, [0; 3], SHAPE, 0.3);
    let m = submanifold(&t, [3; 3], [2, 1, 2]).unwrap();
    check_subm_symmetric(&m);
    let w = random_vec(17, COUT * 27 * CIN);
    let got = conv(&t, &m, &w, WeightLayout::Krsc, None, CIN, COUT).unwrap();
    let g = ConvGeometry {
        kernel: [3; 3],
        stride: [1; 3],
        padding: [2, 1, 2],
        dilation: [2, 1, 2],
    };
    let want = dense_forward(&t, [0; 3], t.coords(), [0; 3], g, &w, None, CIN, COUT);
    assert_close(&got, &want, "subm k3 dilation (2,1,2)");
}

fn run_strided(k: i32, s: i32, p: i32, origin: [i32; 3], seed: u64) -> (SparseTensor, KernelMap) {
    let t = random_tensor(seed, origin, SHAPE, 0.3);
    let g = ConvGeometry {
        kernel: [k; 3],
        stride: [s; 3],
        padding: [p; 3],
        dilation: [1; 3],
    };
    let m = strided(&t, g).unwrap();
    assert_eq!(m.kind, MapKind::Strided);
    assert_eq!(m.out_spatial_shape, conv_output_shape(SHAPE, &g));
    // Output sites = the rule evaluated densely; sorted by [b, x, y, z]; unique.
    let want_sites = dense_output_sites(&t, g);
    let got_sites: HashSet<[i32; 4]> = m.out_coords.iter().copied().collect();
    assert_eq!(got_sites, want_sites, "k{k} s{s} p{p}: output sites");
    assert!(
        m.out_coords.windows(2).all(|w| w[0] < w[1]),
        "outputs sorted and unique"
    );
    // Every pair obeys in = out*s - p + r (relative to the origins).
    let offs = kernel_offsets(g.kernel);
    for (o, list) in m.pairs.iter().enumerate() {
        for &(i, j) in list {
            let ci = t.coords()[i as usize];
            let cj = m.out_coords[j as usize];
            assert_eq!(ci[0], cj[0]);
            for a in 0..3 {
                assert_eq!(
                    ci[a + 1] - origin[a],
                    (cj[a + 1] - m.out_origin[a]) * s - p + offs[o][a]
                );
            }
        }
    }
    let kv = (k * k * k) as usize;
    let w = random_vec(seed ^ 1, COUT * kv * CIN);
    let b = random_vec(seed ^ 2, COUT);
    let got = conv(&t, &m, &w, WeightLayout::Krsc, Some(&b), CIN, COUT).unwrap();
    let want = dense_forward(
        &t,
        origin,
        &m.out_coords,
        m.out_origin,
        g,
        &w,
        Some(&b),
        CIN,
        COUT,
    );
    assert_close(
        &got,
        &want,
        &format!("strided k{k} s{s} p{p} origin {origin:?}"),
    );
    (t, m)
}

#[test]
fn strided_k2_s2_matches_dense() {
    let (t, m) = run_strided(2, 2, 0, [0; 3], 21);
    // k = s, p = 0: out = floor(c / 2), except the last row of an odd extent (y: 7), dropped by
    // spconv's output shape floor((7 - 2) / 2) + 1 = 3.
    assert_eq!(m.out_spatial_shape, [4, 3, 3]);
    let mut expect: Vec<[i32; 4]> = t
        .coords()
        .iter()
        .filter(|c| c[2] < 6)
        .map(|c| {
            [
                c[0],
                c[1].div_euclid(2),
                c[2].div_euclid(2),
                c[3].div_euclid(2),
            ]
        })
        .collect();
    expect.sort_unstable();
    expect.dedup();
    assert_eq!(m.out_coords, expect);
    assert_eq!(m.out_stride, [2, 2, 2]);
}

#[test]
fn strided_k3_s2_p1_matches_dense() {
    run_strided(3, 2, 1, [0; 3], 22);
}

#[test]
fn strided_negative_coordinates_match_dense() {
    let (t, m) = run_strided(2, 2, 0, [-4, -2, -6], 23);
    assert_eq!(m.out_origin, [-2, -1, -3]);
    for c in &m.out_coords {
        // floor(c / 2) of some input
        assert!(t
            .coords()
            .iter()
            .any(|i| i[0] == c[0] && (1..4).all(|a| i[a].div_euclid(2) == c[a])));
    }
    run_strided(3, 2, 1, [-8, -6, -2], 24);
}

#[test]
fn strided_rejects_unaligned_origin() {
    let t = random_tensor(25, [-3, 0, 0], SHAPE, 0.3);
    let g = ConvGeometry {
        kernel: [2; 3],
        stride: [2; 3],
        padding: [0; 3],
        dilation: [1; 3],
    };
    assert!(strided(&t, g).is_err());
}

/// Dense transposed conv: fine site c gets sum over r, coarse q with c = q*s - p + r*d of
/// W_inv[r] y[q].
fn dense_inverse(
    coarse: &SparseTensor,
    m_inv: &KernelMap,
    g: ConvGeometry,
    w: &[f32],
    bias: Option<&[f32]>,
    cin: usize,
    cout: usize,
) -> Vec<Term> {
    let y = dense(coarse);
    let oi = m_inv.out_origin; // fine origin
    let oc = coarse.origin();
    let mut res = Vec::new();
    for c in &m_inv.out_coords {
        for co in 0..cout {
            let mut s = bias.map_or(0.0, |b| b[co] as f64);
            let mut mag = s.abs();
            for r in kernel_offsets(g.kernel) {
                let mut q = [c[0], 0, 0, 0];
                let mut ok = true;
                for a in 0..3 {
                    let num = c[a + 1] - oi[a] + g.padding[a] - r[a] * g.dilation[a];
                    if num.rem_euclid(g.stride[a]) != 0 {
                        ok = false;
                    }
                    q[a + 1] = num.div_euclid(g.stride[a]) + oc[a];
                }
                if !ok {
                    continue;
                }
                if let Some(f) = y.get(&q) {
                    for ci in 0..cin {
                        let t = w_at(w, g.kernel, co, r, ci, cin) * f[ci];
                        s += t;
                        mag += t.abs();
                    }
                }
            }
            res.push((s, mag));
        }
    }
    res
}

fn run_inverse(k: i32, p: i32, origin: [i32; 3], seed: u64) {
    let (t, m) = run_strided(k, 2, p, origin, seed);
    let mid = 4; // channels of the coarse tensor
    let w_down = random_vec(seed ^ 3, mid * (k * k * k) as usize * CIN);
    let coarse_feats = conv(&t, &m, &w_down, WeightLayout::Krsc, None, CIN, mid).unwrap();
    let coarse = m.output_tensor(coarse_feats, mid).unwrap();
    let mi = inverse(&m).unwrap();
    assert_eq!(mi.kind, MapKind::Inverse);
    assert_eq!(
        mi.out_coords,
        t.coords(),
        "inverse restores the input coordinates in order"
    );
    assert_eq!(mi.in_coords, m.out_coords);
    assert_eq!(mi.out_spatial_shape, t.spatial_shape());
    for (a, b) in mi.pairs.iter().zip(&m.pairs) {
        assert_eq!(a.iter().map(|&(i, o)| (o, i)).collect::<Vec<_>>(), *b);
    }
    // Inverse conv weight: [Cout_inv, K..., Cin_inv] with Cin_inv = coarse channels.
    let cout = COUT;
    let w = random_vec(seed ^ 4, cout * (k * k * k) as usize * mid);
    let bias = random_vec(seed ^ 5, cout);
    let got = conv(&coarse, &mi, &w, WeightLayout::Krsc, Some(&bias), mid, cout).unwrap();
    let want = dense_inverse(&coarse, &mi, m.geometry, &w, Some(&bias), mid, cout);
    assert_close(&got, &want, &format!("inverse k{k} p{p} origin {origin:?}"));
}

#[test]
fn inverse_k2_s2_matches_dense() {
    run_inverse(2, 0, [0; 3], 31);
}

#[test]
fn inverse_k3_s2_p1_matches_dense() {
    run_inverse(3, 1, [0; 3], 32);
}

#[test]
fn inverse_negative_coordinates_match_dense() {
    run_inverse(2, 0, [-6, -4, -2], 33);
    run_inverse(3, 1, [-2, -8, 4], 34);
}

#[test]
fn inverse_of_subm_is_an_error() {
    let t = random_tensor(35, [0; 3], SHAPE, 0.3);
    let m = submanifold(&t, [3; 3], [1; 3]).unwrap();
    assert!(inverse(&m).is_err());
}

#[test]
fn minkowski_down_matches_dense() {
    for (origin, seed) in [([0, 0, 0], 41u64), ([-5, -3, 1], 42)] {
        let t = random_tensor(seed, origin, SHAPE, 0.3);
        let m = minkowski_down(&t, [2; 3]).unwrap();
        assert_eq!(m.kind, MapKind::MinkowskiDown);
        // Every input feeds exactly one output, floor(c / 2), nothing dropped.
        assert_eq!(m.pair_count(), t.len());
        let mut expect: Vec<[i32; 4]> = t
            .coords()
            .iter()
            .map(|c| {
                [
                    c[0],
                    c[1].div_euclid(2),
                    c[2].div_euclid(2),
                    c[3].div_euclid(2),
                ]
            })
            .collect();
        expect.sort_unstable();
        expect.dedup();
        assert_eq!(m.out_coords, expect);
        // Dense: out[q] = sum_{r in [0,2)^3} W[r] x[2q + r] (absolute coordinates).
        let w = random_vec(seed ^ 1, COUT * 8 * CIN);
        let got = conv(&t, &m, &w, WeightLayout::Krsc, None, CIN, COUT).unwrap();
        let g = ConvGeometry {
            kernel: [2; 3],
            stride: [2; 3],
            padding: [0; 3],
            dilation: [1; 3],
        };
        let want = dense_forward(&t, [0; 3], &m.out_coords, [0; 3], g, &w, None, CIN, COUT);
        assert_close(&got, &want, &format!("minkowski down origin {origin:?}"));
        let mi = inverse(&m).unwrap();
        assert_eq!(mi.out_coords, t.coords());
    }
}

#[test]
fn fused_pre_activation_and_residual() {
    let t = random_tensor(51, [0; 3], SHAPE, 0.3);
    let m = submanifold(&t, [3; 3], [1; 3]).unwrap();
    let gamma = random_vec(52, CIN);
    let beta = random_vec(53, CIN);
    let mean = random_vec(54, CIN);
    let var: Vec<f32> = random_vec(55, CIN).iter().map(|v| v.abs() + 0.5).collect();
    let (scale, shift) = fold_batch_norm(&gamma, &beta, &mean, &var, 1e-3).unwrap();
    let w = random_vec(56, COUT * 27 * CIN);
    let bias = random_vec(57, COUT);
    let residual = random_vec(58, t.len() * COUT);
    let opts = ConvOptions {
        bias: Some(&bias),
        pre: Some(PreActivation {
            scale: &scale,
            shift: &shift,
            relu: true,
        }),
        residual: Some(&residual),
    };
    let got = conv_with(&t, &m, &w, WeightLayout::Krsc, CIN, COUT, &opts).unwrap();
    // Reference: BN + ReLU materialized, plain conv, then the residual added.
    let act: Vec<f32> = t
        .feats()
        .chunks(CIN)
        .flat_map(|row| {
            (0..CIN)
                .map(|c| {
                    let y = (row[c] - mean[c]) / (var[c] + 1e-3).sqrt() * gamma[c] + beta[c];
                    y.max(0.0)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let ta = t.with_feats(act, CIN).unwrap();
    let mut want = dense_forward(
        &ta,
        [0; 3],
        t.coords(),
        [0; 3],
        subm_geometry(3),
        &w,
        Some(&bias),
        CIN,
        COUT,
    );
    for (v, &r) in want.iter_mut().zip(&residual) {
        v.0 += r as f64;
        v.1 += (r as f64).abs();
    }
    // BN folding rounds differently from the materialized BN: allow a little more.
    let mut max_rel = 0.0f64;
    for (g, (v, mag)) in got.iter().zip(&want) {
        max_rel = max_rel.max((*g as f64 - v).abs() / (mag + 1e-6));
    }
    assert!(max_rel < 1e-5, "fused: max relative error {max_rel}");
}

#[test]
fn weight_layouts_agree() {
    let t = random_tensor(61, [0; 3], SHAPE, 0.3);
    let m = submanifold(&t, [3; 3], [1; 3]).unwrap();
    let kv = 27;
    let krsc = random_vec(62, COUT * kv * CIN);
    let mut rskc = vec![0.0; krsc.len()];
    let mut rsck = vec![0.0; krsc.len()];
    for co in 0..COUT {
        for k in 0..kv {
            for ci in 0..CIN {
                let v = krsc[(co * kv + k) * CIN + ci];
                rskc[(k * COUT + co) * CIN + ci] = v;
                rsck[(k * CIN + ci) * COUT + co] = v;
            }
        }
    }
    let a = conv(&t, &m, &krsc, WeightLayout::Krsc, None, CIN, COUT).unwrap();
    let b = conv(&t, &m, &rskc, WeightLayout::Rskc, None, CIN, COUT).unwrap();
    let c = conv(&t, &m, &rsck, WeightLayout::Rsck, None, CIN, COUT).unwrap();
    assert_eq!(a, b);
    assert_eq!(a, c);
}

#[test]
fn empty_input() {
    let t = SparseTensor::new(vec![], vec![], CIN, SHAPE).unwrap();
    let m = submanifold(&t, [3; 3], [1; 3]).unwrap();
    assert_eq!(m.pair_count(), 0);
    let w = random_vec(71, COUT * 27 * CIN);
    assert!(conv(&t, &m, &w, WeightLayout::Krsc, None, CIN, COUT)
        .unwrap()
        .is_empty());
    let g = ConvGeometry {
        kernel: [2; 3],
        stride: [2; 3],
        padding: [0; 3],
        dilation: [1; 3],
    };
    let ms = strided(&t, g).unwrap();
    assert_eq!(ms.out_count(), 0);
    let w2 = random_vec(72, COUT * 8 * CIN);
    assert!(conv(&t, &ms, &w2, WeightLayout::Krsc, None, CIN, COUT)
        .unwrap()
        .is_empty());
    let mi = inverse(&ms).unwrap();
    assert_eq!(mi.out_count(), 0);
}

#[test]
fn bad_arguments_are_errors() {
    let t = random_tensor(81, [0; 3], SHAPE, 0.3);
    let m = submanifold(&t, [3; 3], [1; 3]).unwrap();
    let w = random_vec(82, COUT * 27 * CIN);
    // weight length
    assert!(conv(&t, &m, &w[1..], WeightLayout::Krsc, None, CIN, COUT).is_err());
    // channel mismatch
    assert!(conv(&t, &m, &w, WeightLayout::Krsc, None, CIN + 1, COUT).is_err());
    // bias length
    assert!(conv(&t, &m, &w, WeightLayout::Krsc, Some(&[0.0; 2]), CIN, COUT).is_err());
    // map built on another tensor
    let other = random_tensor(83, [0; 3], SHAPE, 0.3);
    assert!(conv(&other, &m, &w, WeightLayout::Krsc, None, CIN, COUT).is_err());
    // even subm kernel
    assert!(submanifold(&t, [2; 3], [1; 3]).is_err());
    // output shape would be empty
    let tiny = SparseTensor::new(vec![[0, 0, 0, 0]], vec![0.0; CIN], CIN, [1, 1, 1]).unwrap();
    let g = ConvGeometry {
        kernel: [3; 3],
        stride: [2; 3],
        padding: [0; 3],
        dilation: [1; 3],
    };
    assert!(strided(&tiny, g).is_err());
    // duplicate coordinates
    assert!(SparseTensor::new(
        vec![[0, 1, 1, 1], [0, 1, 1, 1]],
        vec![0.0; 2 * CIN],
        CIN,
        SHAPE
    )
    .is_err());
}

#[test]
fn spconv_conv1x1_reads_weight_as_cin_cout() {
    // spconv 2.3.8 computes x @ weight.view(Cin, Cout) for a k=1 SubMConv3d (upstream issue
    // traveller59/spconv#450).
    let t = random_tensor(91, [0; 3], SHAPE, 0.3);
    let m = submanifold(&t, [1; 3], [1; 3]).unwrap();
    assert_eq!(spconv_weight_layout(&m), WeightLayout::Rsck);
    let w = random_vec(92, COUT * CIN); // stored as [Cout, 1, 1, 1, Cin]
    let got = conv(&t, &m, &w, spconv_weight_layout(&m), None, CIN, COUT).unwrap();
    for (j, row) in got.chunks(COUT).enumerate() {
        for co in 0..COUT {
            let want: f64 = (0..CIN)
                .map(|ci| t.row(j)[ci] as f64 * w[ci * COUT + co] as f64)
                .sum();
            assert!((row[co] as f64 - want).abs() < 1e-5, "row {j} co {co}");
        }
    }
    // Every other layer reads KRSC.
    assert_eq!(
        spconv_weight_layout(&submanifold(&t, [3; 3], [1; 3]).unwrap()),
        WeightLayout::Krsc
    );
    let g = ConvGeometry {
        kernel: [1; 3],
        stride: [2; 3],
        padding: [0; 3],
        dilation: [1; 3],
    };
    assert_eq!(
        spconv_weight_layout(&strided(&t, g).unwrap()),
        WeightLayout::Krsc
    );
    let g = ConvGeometry {
        kernel: [2; 3],
        stride: [2; 3],
        padding: [0; 3],
        dilation: [1; 3],
    };
    assert_eq!(
        spconv_weight_layout(&strided(&t, g).unwrap()),
        WeightLayout::Krsc
    );
}

#[test]
fn anisotropic_kernels_match_dense() {
    // Unequal kernel extents per axis pin down the flat offset order (x slowest, z fastest).
    let t = random_tensor(101, [0; 3], SHAPE, 0.3);
    let kernel = [3, 1, 5];
    let m = submanifold(&t, kernel, [1; 3]).unwrap();
    check_subm_symmetric(&m);
    let w = random_vec(102, COUT * 15 * CIN);
    let got = conv(&t, &m, &w, WeightLayout::Krsc, None, CIN, COUT).unwrap();
    let g = ConvGeometry {
        kernel,
        stride: [1; 3],
        padding: [1, 0, 2],
        dilation: [1; 3],
    };
    let want = dense_forward(&t, [0; 3], t.coords(), [0; 3], g, &w, None, CIN, COUT);
    assert_close(&got, &want, "subm k(3,1,5)");

    let g = ConvGeometry {
        kernel: [3, 2, 1],
        stride: [2, 2, 1],
        padding: [1, 0, 0],
        dilation: [1; 3],
    };
    let m = strided(&t, g).unwrap();
    let got_sites: HashSet<[i32; 4]> = m.out_coords.iter().copied().collect();
    assert_eq!(got_sites, dense_output_sites(&t, g));
    let w = random_vec(103, COUT * 6 * CIN);
    let got = conv(&t, &m, &w, WeightLayout::Krsc, None, CIN, COUT).unwrap();
    let want = dense_forward(
        &t,
        [0; 3],
        &m.out_coords,
        m.out_origin,
        g,
        &w,
        None,
        CIN,
        COUT,
    );
    assert_close(&got, &want, "strided k(3,2,1) s(2,2,1)");
}
