//! Window attention (CPU reference) against naive dense masked attention: every query against
//! every key of the whole input, with the pairs of different windows masked out. The reference
//! knows nothing of partitions or varlen layouts, so it checks the grouping as well as the math.

use crate::common::{rel_err, Rng};
use sptr::ops::attention::partition::window_cells;
use sptr::ops::attention::rpe::cart2sphere;
use sptr::ops::attention::swin::swin_partition;
use sptr::ops::attention::{window_attention, window_partition, ContextualRpe, HeadSlice, PositionTerm, RelativeBias2d, RpeGeometry, RpeTables};

fn rand_vec(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| rng.sym() * scale).collect()
}

/// Dense masked attention: `same(i, j)` says whether j is visible to i; `extra(i, j, h)` returns
/// (logit addend, value addend `[d]`).
fn dense_reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    d: usize,
    same: &dyn Fn(usize, usize) -> bool,
    extra: &dyn Fn(usize, usize, usize, &[f32], &[f32]) -> (f64, Vec<f64>),
) -> Vec<f32> {
    let n = q.len() / (heads * d);
    let mut out = vec![0f32; q.len()];
    for i in 0..n {
        for h in 0..heads {
            let qi = &q[(i * heads + h) * d..][..d];
            let mut logits = vec![f64::NEG_INFINITY; n];
            let mut vadd = vec![vec![0f64; d]; n];
            for j in 0..n {
                if !same(i, j) {
                    continue;
                }
                let kj = &k[(j * heads + h) * d..][..d];
                let (lb, va) = extra(i, j, h, qi, kj);
                logits[j] = (0..d).map(|c| qi[c] as f64 * kj[c] as f64).sum::<f64>() + lb;
                vadd[j] = va;
            }
            let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = logits.iter().map(|&l| (l - max).exp()).collect();
            let z: f64 = w.iter().sum();
            for c in 0..d {
                let mut acc = 0f64;
                for j in 0..n {
                    if w[j] > 0.0 {
                        acc += w[j] / z * (v[(j * heads + h) * d + c] as f64 + vadd[j][c]);
                    }
                }
                out[(i * heads + h) * d + c] = acc as f32;
            }
        }
    }
    out
}

/// Random voxel positions on a 5 cm grid in a few metres, two batches.
fn random_voxels(rng: &mut Rng, n: usize, extent: f32) -> (Vec<[f32; 3]>, Vec<i32>) {
    let pos = (0..n)
        .map(|_| {
            [
                (rng.uniform(0.0, extent) / 0.05).floor() * 0.05 + 0.025,
                (rng.uniform(-extent, 0.0) / 0.05).floor() * 0.05 + 0.025,
                rng.uniform(-1.0, 1.0),
            ]
        })
        .collect();
    let batch = (0..n).map(|i| (i * 2 / n) as i32).collect();
    (pos, batch)
}

#[test]
fn plain_attention_matches_dense_masked() {
    let mut rng = Rng(11);
    let (n, heads, d) = (300, 2, 16);
    let (pos, batch) = random_voxels(&mut rng, n, 1.0);
    let window = [0.3f32, 0.3, 0.5];
    let part = window_partition(&pos, &batch, window, false).unwrap();
    assert!(part.windows() > 10 && part.n_max() > 3, "a mix of window sizes");
    let cells = window_cells(&pos, &batch, window, false).unwrap();
    let (q, k, v) = (rand_vec(&mut rng, n * heads * d, 1.0), rand_vec(&mut rng, n * heads * d, 1.0), rand_vec(&mut rng, n * heads * d, 1.0));
    let ours = window_attention(&q, &k, &v, HeadSlice::all(heads, d), &part, PositionTerm::None).unwrap();
    let want = dense_reference(&q, &k, &v, heads, d, &|i, j| cells[i] == cells[j], &|_, _, _, _, _| (0.0, vec![0.0; d]));
    // both accumulate in f64 and round once to f32
    assert!(rel_err(&ours, &want) < 1e-6, "rel err {}", rel_err(&ours, &want));
}

/// SphereFormer's contextual RPE, written out per pair as upstream's formula reads, on cubic and
/// on spherical windows (radial exponential split, clamping).
#[test]
fn contextual_rpe_matches_dense_masked() {
    let mut rng = Rng(12);
    let (n, heads, d) = (260, 1, 16);
    for spherical in [false, true] {
        let (mut xyz, batch) = random_voxels(&mut rng, n, 2.0);
        // off the 5 cm grid, so no position sits on a quant bin edge (where upstream's fmod-based
        // floor division and the plain floor below may differ by one bin)
        for p in xyz.iter_mut() {
            p[0] += rng.uniform(-0.01, 0.01);
            p[1] += rng.uniform(-0.01, 0.01);
        }
        let (pos, window, quant, l, split) = if spherical {
            let pos: Vec<[f32; 3]> = xyz.iter().map(|&p| cart2sphere(p)).collect();
            (pos, [20.0f32, 20.0, 80.0], [20.0 / 24.0, 20.0 / 24.0, 80.0 / 24.0], 24, Some(0.0125f32))
        } else {
            (xyz.clone(), [0.6f32, 0.6, 0.6], [0.025f32; 3], 24, None)
        };
        let geom = RpeGeometry::new(&pos, window, quant, false, l, split).unwrap();
        let rows = geom.table_rows();
        let tq = rand_vec(&mut rng, rows * 3 * heads * d, 0.5);
        let tk = rand_vec(&mut rng, rows * 3 * heads * d, 0.5);
        let tv = rand_vec(&mut rng, rows * 3 * heads * d, 0.5);
        let part = window_partition(&pos, &batch, window, false).unwrap();
        let cells = window_cells(&pos, &batch, window, false).unwrap();
        let (q, k, v) = (rand_vec(&mut rng, n * heads * d, 1.0), rand_vec(&mut rng, n * heads * d, 1.0), rand_vec(&mut rng, n * heads * d, 1.0));
        let rpe = ContextualRpe { geometry: geom, positions: &pos, tables: RpeTables { q: &tq, k: &tk, v: &tv } };
        let ours = window_attention(&q, &k, &v, HeadSlice::all(heads, d), &part, PositionTerm::Contextual(rpe)).unwrap();

        // upstream's formula, pair by pair, independent of the library's pair_index
        let min = sptr::ops::attention::rpe::min_position(&pos).unwrap();
        let quantize = |p: [f32; 3]| -> [i32; 3] {
            let mut o = [0; 3];
            for a in 0..3 {
                let m = (p[a] - min[a]) % window[a];
                o[a] = (m / quant[a]).floor() as i32;
            }
            o
        };
        let extra = |i: usize, j: usize, h: usize, qi: &[f32], kj: &[f32]| {
            let (a, b) = (quantize(pos[i]), quantize(pos[j]));
            let mut idx = [0i32; 3];
            for x in 0..3 {
                idx[x] = a[x] - b[x] + l - 1;
            }
            if let Some(av) = split {
                let dr = pos[i][2] - pos[j][2];
                // the bin edges 0, a, 2a, 4a, 6a, 10a, 14a, 22a, ... (each length used twice)
                let ad = dr.abs() as f64 / av as f64;
                let mut edges = vec![0.0f64];
                let mut step = 1.0;
                while *edges.last().unwrap() <= ad {
                    for _ in 0..2 {
                        let e = edges.last().unwrap() + step;
                        edges.push(e);
                    }
                    step *= 2.0;
                }
                let bin = edges.iter().rposition(|&e| e <= ad).unwrap() as i32;
                idx[2] = if dr >= 0.0 { bin } else { -bin - 1 } + 24;
                for x in idx.iter_mut() {
                    *x = (*x).clamp(0, 2 * l - 1);
                }
            }
            let mut lb = 0f64;
            let mut va = vec![0f64; d];
            for (ax, &r) in idx.iter().enumerate() {
                let t = ((r as usize * 3 + ax) * heads + h) * d;
                for c in 0..d {
                    lb += qi[c] as f64 * tq[t + c] as f64 + kj[c] as f64 * tk[t + c] as f64;
                    va[c] += tv[t + c] as f64;
                }
            }
            (lb, va)
        };
        let want = dense_reference(&q, &k, &v, heads, d, &|i, j| cells[i] == cells[j], &extra);
        let err = rel_err(&ours, &want);
        // away from bin edges the two index computations agree; the random positions here are
        // not on edges, so only f64 summation order differs
        assert!(err < 1e-6, "spherical = {spherical}: rel err {err}");
    }
}

#[test]
fn edge_cases_one_voxel_windows_one_big_window_and_empty() {
    let mut rng = Rng(13);
    let (heads, d) = (2, 16);
    // one voxel per window: softmax over one key is 1, so out = v
    let pos: Vec<[f32; 3]> = (0..50).map(|i| [i as f32, 0.0, 0.0]).collect();
    let batch = vec![0; 50];
    let part = window_partition(&pos, &batch, [0.5; 3], false).unwrap();
    assert_eq!(part.windows(), 50);
    let (q, k, v) = (rand_vec(&mut rng, 50 * heads * d, 1.0), rand_vec(&mut rng, 50 * heads * d, 1.0), rand_vec(&mut rng, 50 * heads * d, 1.0));
    let out = window_attention(&q, &k, &v, HeadSlice::all(heads, d), &part, PositionTerm::None).unwrap();
    assert!(rel_err(&out, &v) < 1e-7);

    // one window holding everything (1,200 voxels) equals unmasked dense attention
    let n = 1200;
    let pos: Vec<[f32; 3]> = (0..n).map(|_| [rng.uniform(0.0, 1.0), rng.uniform(0.0, 1.0), 0.0]).collect();
    let batch = vec![0; n];
    let part = window_partition(&pos, &batch, [10.0; 3], false).unwrap();
    assert_eq!((part.windows(), part.n_max()), (1, n));
    let (q, k, v) = (rand_vec(&mut rng, n * d, 1.0), rand_vec(&mut rng, n * d, 1.0), rand_vec(&mut rng, n * d, 1.0));
    let out = window_attention(&q, &k, &v, HeadSlice::all(1, d), &part, PositionTerm::None).unwrap();
    let want = dense_reference(&q, &k, &v, 1, d, &|_, _| true, &|_, _, _, _, _| (0.0, vec![0.0; d]));
    assert!(rel_err(&out, &want) < 1e-6);

    // the same voxels in two batches never see each other
    let pos2: Vec<[f32; 3]> = pos.iter().chain(pos.iter()).cloned().collect();
    let batch2: Vec<i32> = (0..2 * n).map(|i| (i / n) as i32).collect();
    let part2 = window_partition(&pos2, &batch2, [10.0; 3], false).unwrap();
    assert_eq!(part2.windows(), 2);

    // empty input
    let empty = window_partition(&[], &[], [1.0; 3], false).unwrap();
    let out = window_attention(&[], &[], &[], HeadSlice::all(2, 16), &empty, PositionTerm::None).unwrap();
    assert!(out.is_empty());
}

#[test]
fn bad_inputs_are_errors() {
    let pos = vec![[0.0f32; 3]; 4];
    let part = window_partition(&pos, &[0; 4], [1.0; 3], false).unwrap();
    let x = vec![0f32; 4 * 16];
    // wrong lengths, bad head slices
    assert!(window_attention(&x[..60], &x, &x, HeadSlice::all(1, 16), &part, PositionTerm::None).is_err());
    let bad = HeadSlice { heads: 1, head_dim: 16, first: 1, count: 1 };
    assert!(window_attention(&x, &x, &x, bad, &part, PositionTerm::None).is_err());
    // a partition of other voxels
    let other = window_partition(&pos[..3], &[0; 3], [1.0; 3], false).unwrap();
    assert!(window_attention(&x, &x, &x, HeadSlice::all(1, 16), &other, PositionTerm::None).is_err());
    // mis-sized RPE tables
    let g = RpeGeometry::new(&pos, [1.0; 3], [0.5; 3], false, 2, None).unwrap();
    let t = vec![0f32; 10];
    let rpe = ContextualRpe { geometry: g, positions: &pos, tables: RpeTables { q: &t, k: &t, v: &t } };
    let err = window_attention(&x, &x, &x, HeadSlice::all(1, 16), &part, PositionTerm::Contextual(rpe)).unwrap_err();
    assert!(err.to_string().contains("table"), "{err}");
}

/// Swin's shifted-window attention written literally (cyclic roll, window partition, -100 mask
/// between regions, relative position bias, roll back) against the varlen partition.
#[test]
fn swin_shifted_windows_match_the_literal_mask() {
    let mut rng = Rng(14);
    let (hh, ww, m, s, heads, d) = (14i32, 21i32, 7i32, 3i32, 2usize, 32usize);
    let n = (hh * ww) as usize;
    let (q, k, v) = (rand_vec(&mut rng, n * heads * d, 1.0), rand_vec(&mut rng, n * heads * d, 1.0), rand_vec(&mut rng, n * heads * d, 1.0));
    let tl = ((2 * m - 1) * (2 * m - 1)) as usize;
    let table = rand_vec(&mut rng, heads * tl, 2.0);
    let (part, rc) = swin_partition(1, hh, ww, m, s).unwrap();
    let bias = RelativeBias2d { window: [m, m], table: &table, rc: &rc };
    let ours = window_attention(&q, &k, &v, HeadSlice::all(heads, d), &part, PositionTerm::Bias2d(bias)).unwrap();

    // literal Swin: token t at (r, c) sits at rolled (r - s, c - s) mod size
    let rolled = |t: usize| {
        let (r, c) = ((t as i32) / ww, (t as i32) % ww);
        ((r - s).rem_euclid(hh), (c - s).rem_euclid(ww))
    };
    let region = |x: i32, len: i32| if x < len - m { 0 } else if x < len - s { 1 } else { 2 };
    let mut want = vec![0f32; n * heads * d];
    for t in 0..n {
        let (ri, ci) = rolled(t);
        for h in 0..heads {
            let mut logits = Vec::new();
            for u in 0..n {
                let (rj, cj) = rolled(u);
                if ri / m != rj / m || ci / m != cj / m {
                    continue; // another window
                }
                let mut l = (0..d).map(|c| q[(t * heads + h) * d + c] as f64 * k[(u * heads + h) * d + c] as f64).sum::<f64>();
                let col = ((ri % m - rj % m + m - 1) * (2 * m - 1) + (ci % m - cj % m + m - 1)) as usize;
                l += table[h * tl + col] as f64;
                if region(ri, hh) != region(rj, hh) || region(ci, ww) != region(cj, ww) {
                    l += -100.0;
                }
                logits.push((u, l));
            }
            let max = logits.iter().map(|x| x.1).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = logits.iter().map(|x| (x.1 - max).exp()).sum();
            for c in 0..d {
                let acc: f64 = logits.iter().map(|&(u, l)| (l - max).exp() / z * v[(u * heads + h) * d + c] as f64).sum();
                want[(t * heads + h) * d + c] = acc as f32;
            }
        }
    }
    // exp(-100) leaks ~1e-43 of a masked key's value into Swin's result: far below f32 resolution
    let err = rel_err(&ours, &want);
    assert!(err < 1e-6, "rel err {err}");
}
