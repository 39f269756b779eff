//! CUDA window attention against the CPU reference: partitions equal exactly, quantized RPE
//! positions equal exactly, attention within ‖out − ref‖/‖ref‖ ≤ 2e-3 with no NaN — on random
//! voxels and on the real nuScenes sweep (SphereFormer level 1 and 3 windows, both kinds), with
//! and without RPE, head dims 16/32/64, and a shifted 2-D Swin case with its relative position
//! bias. Skips without a GPU unless SPTR_REQUIRE_GPU=1.
//!
//! Tolerance: q/k/v are FP16 on both sides (the CPU reads the same rounded values); the kernel
//! accumulates in FP32 and writes FP16, so the output carries one FP16 rounding (2^-11 ≈ 4.9e-4
//! relative) plus FP32 summation error over ≤ a few hundred keys: 2e-3 leaves margin.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{gpu, nuscenes_sweep, rel_err, Rng};
use half::f16;
use sptr::ops::attention::cuda::{cart2sphere_cuda, exponential_split_cuda, rpe_quantize_cuda, sphere_attention_cuda, window_attention_cuda, window_attention_cuda_split, window_partition_cuda, window_attention_packed_qkv_cuda, TILED_MIN_WINDOW, Bias2dKernel, CudaBias2d, CudaContextual, CudaSphereTables, CudaSphereWindows, CudaTerm, QkvView};
use sptr::ops::attention::rpe::{cart2sphere, exponential_split};
use sptr::ops::attention::swin::swin_partition;
use sptr::ops::attention::{sphere_attention_cpu, window_attention, window_partition, ContextualRpe, HeadSlice, PositionTerm, RelativeBias2d, RpeGeometry, RpeTables, SphereLevel, SphereTables, SphereWindows};
use sptr::models::sphereformer::config::ModelConfig;
use sptr::device::cuda::CudaDevice;
use sptr::ops::voxelize::cpu::voxelize_cpu;

fn f16_round(v: Vec<f32>) -> Vec<f32> {
    v.into_iter().map(|x| f16::from_f32(x).to_f32()).collect()
}

fn rand_vec(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    f16_round((0..n).map(|_| rng.sym() * scale).collect())
}

fn up16(dev: &CudaDevice, v: &[f32]) -> cudarc::driver::CudaSlice<f16> {
    dev.stream.clone_htod(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>()).unwrap()
}

fn down16(dev: &CudaDevice, v: &cudarc::driver::CudaSlice<f16>) -> Vec<f32> {
    dev.stream.clone_dtoh(v).unwrap().into_iter().map(|x| x.to_f32()).collect()
}

fn flat(p: &[[f32; 3]]) -> Vec<f32> {
    p.iter().flatten().copied().collect()
}

/// SphereFormer's voxel positions of the nuScenes sweep (nuScenes preprocessing, voxel 0.1 m).
fn nuscenes_voxels() -> (Vec<[f32; 3]>, Vec<i32>, ModelConfig) {
    let cfg = ModelConfig::load(&common::root().join("config/models/sphereformer_nuscenes.yaml")).unwrap();
    let pts = nuscenes_sweep();
    let v = voxelize_cpu(&[&pts], &cfg.voxel_params()).unwrap();
    let batch = v.coords.iter().map(|c| c[0]).collect();
    (v.xyz, batch, cfg)
}

fn check(case: &str, got: &[f32], want: &[f32]) {
    assert!(got.iter().all(|x| x.is_finite()), "{case}: non-finite output");
    let err = rel_err(got, want);
    eprintln!("{case}: rel err {err:.2e}");
    assert!(err <= 2e-3, "{case}: rel err {err} > 2e-3");
}

#[test]
fn partitions_and_rpe_positions_equal_the_cpu() {
    let Some(dev) = gpu("partitions_and_rpe_positions_equal_the_cpu") else { return };
    let (xyz, batch, cfg) = nuscenes_voxels();
    // a second sample: the same voxels shifted, so windows must split by batch
    let n1 = xyz.len();
    let xyz2: Vec<[f32; 3]> = xyz.iter().cloned().chain(xyz.iter().map(|p| [p[0] + 0.37, p[1], p[2]])).collect();
    let batch2: Vec<i32> = batch.iter().cloned().chain(std::iter::repeat(1).take(n1)).collect();
    let n = xyz2.len();
    let s = &dev.stream;
    let xyz_d = s.clone_htod(&flat(&xyz2)).unwrap();
    let batch_d = s.clone_htod(&batch2).unwrap();

    // spherical coordinates: both sides run the same float32 ops in the same order; only atan2
    // may differ (libm vs CUDA, each within 2 ulp: 2 x 2.4e-7 rad near pi, i.e. 3e-5 degrees after
    // the + pi and the degree conversion) and sqrt is exact on both
    let sph_d = cart2sphere_cuda(&dev, &xyz_d, n).unwrap();
    let sph_gpu: Vec<f32> = s.clone_dtoh(&sph_d).unwrap();
    let (mut worst_deg, mut worst_r, mut differ) = (0f32, 0f32, 0usize);
    for (i, p) in xyz2.iter().enumerate() {
        let c = cart2sphere(*p);
        let g = &sph_gpu[i * 3..i * 3 + 3];
        differ += (c[0] != g[0] || c[1] != g[1] || c[2] != g[2]) as usize;
        worst_deg = worst_deg.max((c[0] - g[0]).abs()).max((c[1] - g[1]).abs());
        worst_r = worst_r.max((c[2] - g[2]).abs() / c[2].max(1e-6));
    }
    eprintln!("cart2sphere: {differ} of {n} voxels differ in some bit; worst angle {worst_deg:.2e} deg, worst radius rel {worst_r:.2e}");
    assert!(worst_deg <= 1e-4 && worst_r <= 1e-6, "cart2sphere differs: {worst_deg} deg, {worst_r} rel");
    let sph: Vec<[f32; 3]> = sph_gpu.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();

    for level in [1usize, 3] {
        let lvl = SphereLevel::from_model(&cfg.yaml, level).unwrap();
        for shift in [false, true] {
            for (kind, pos, pos_d, window) in [("cubic", &xyz2, &xyz_d, lvl.cubic_window), ("sphere", &sph, &sph_d, lvl.sphere_window)] {
                let cpu = window_partition(pos, &batch2, window, shift).unwrap();
                let gpu_part = window_partition_cuda(&dev, pos_d, &batch_d, n, window, shift).unwrap();
                let got = gpu_part.to_host(&dev).unwrap();
                assert_eq!(got, cpu, "level {level} {kind} shift {shift}: partition differs");
                assert_eq!(gpu_part.n_max, cpu.n_max(), "level {level} {kind} shift {shift}: largest window");
                eprintln!("level {level} {kind} shift {shift}: {} windows, n_max {}, pairs {} (equal)", cpu.windows(), cpu.n_max(), cpu.pair_count());
                let (quant, l, split) = if kind == "cubic" {
                    (lvl.cubic_quant, lvl.cubic_grid_length, None)
                } else {
                    (lvl.sphere_quant, lvl.sphere_grid_length, Some(lvl.a))
                };
                let g = RpeGeometry::new(pos, window, quant, shift, l, split).unwrap();
                assert_eq!(g.min, gpu_part.min, "grid start = RPE minimum");
                let q_d = rpe_quantize_cuda(&dev, pos_d, n, &g).unwrap();
                let q_gpu: Vec<u32> = s.clone_dtoh(&q_d).unwrap();
                for (i, p) in pos.iter().enumerate() {
                    let c = g.quantize(*p);
                    let packed = (c[0].clamp(0, 1023) as u32) | (c[1].clamp(0, 1023) as u32) << 10 | (c[2].clamp(0, 1023) as u32) << 20;
                    assert_eq!(q_gpu[i], packed, "level {level} {kind}: voxel {i} quantized {c:?}");
                }
            }
        }
    }
    // empty input and bad windows
    let empty = window_partition_cuda(&dev, &xyz_d, &batch_d, 0, [1.0; 3], false).unwrap();
    assert_eq!(empty.windows, 0);
    assert!(window_partition_cuda(&dev, &xyz_d, &batch_d, n, [0.0, 1.0, 1.0], false).is_err());
    let nan = s.clone_htod(&[f32::NAN, 0.0, 0.0]).unwrap();
    let b0 = s.clone_htod(&[0i32]).unwrap();
    assert!(window_partition_cuda(&dev, &nan, &b0, 1, [1.0; 3], false).is_err());
}

#[test]
fn attention_matches_cpu_on_random_voxels() {
    let Some(dev) = gpu("attention_matches_cpu_on_random_voxels") else { return };
    let mut rng = Rng(21);
    let n = 5000;
    // clustered positions: windows from 1 voxel to several hundred
    let xyz: Vec<[f32; 3]> = (0..n)
        .map(|i| {
            let spread = if i % 5 == 0 { 4.0 } else { 0.6 };
            [rng.uniform(-spread, spread), rng.uniform(-spread, spread), rng.uniform(-0.5, 0.5)]
        })
        .collect();
    let batch: Vec<i32> = (0..n).map(|i| (i % 3 == 0) as i32).collect();
    let s = &dev.stream;
    let xyz_d = s.clone_htod(&flat(&xyz)).unwrap();
    let batch_d = s.clone_htod(&batch).unwrap();
    for d in [16usize, 32, 64] {
        let heads = 2;
        let row = heads * d;
        let (q, k, v) = (rand_vec(&mut rng, n * row, 0.5), rand_vec(&mut rng, n * row, 1.0), rand_vec(&mut rng, n * row, 1.0));
        let (qd, kd, vd) = (up16(&dev, &q), up16(&dev, &k), up16(&dev, &v));
        let qkv = QkvView { q: &qd, k: &kd, v: &vd, ld: row };
        let window = [0.9f32, 0.9, 1.0];
        let part = window_partition(&xyz, &batch, window, false).unwrap();
        let part_d = window_partition_cuda(&dev, &xyz_d, &batch_d, n, window, false).unwrap();
        assert!(part.n_max() >= 200, "a large window is exercised (n_max {})", part.n_max());
        let all = HeadSlice::all(heads, d);
        // plain
        let want = window_attention(&q, &k, &v, all, &part, PositionTerm::None).unwrap();
        let mut out = s.alloc_zeros::<f16>(n * row).unwrap();
        window_attention_cuda(&dev, qkv, all, &part_d, CudaTerm::None, &mut out, row).unwrap();
        check(&format!("random plain d{d}"), &down16(&dev, &out), &want);
        // contextual RPE, cubic and spherical-style (radial split)
        for split in [None, Some(0.0125f32)] {
            let quant = [window[0] / 24.0, window[1] / 24.0, window[2] / 24.0];
            let g = RpeGeometry::new(&xyz, window, quant, false, 24, split).unwrap();
            let rows = g.table_rows();
            let t: Vec<Vec<f32>> = (0..3).map(|_| rand_vec(&mut rng, rows * 3 * heads * d, 0.2)).collect();
            let rpe = ContextualRpe { geometry: g, positions: &xyz, tables: RpeTables { q: &t[0], k: &t[1], v: &t[2] } };
            let want = window_attention(&q, &k, &v, all, &part, PositionTerm::Contextual(rpe)).unwrap();
            let quant_d = rpe_quantize_cuda(&dev, &xyz_d, n, &g).unwrap();
            let td: Vec<_> = t.iter().map(|x| s.clone_htod(x).unwrap()).collect();
            let term = CudaTerm::Contextual(CudaContextual { geometry: g, quant: &quant_d, positions: &xyz_d, tables: [&td[0], &td[1], &td[2]] });
            // per-query kernel only, tiled kernel for every window (1 voxel up), and the default
            // split between them; the tiled kernel serves head_dim 16 and 32. Its keys walked by
            // one block, or cut into 2, 5 or 8 slices merged afterwards (8: small windows leave
            // some slices empty), or as many as it picks itself.
            let cases = [
                ("per-query", usize::MAX, None),
                ("tiled", 1, None),
                ("tiled, keys whole", 1, Some(1)),
                ("tiled, 2 key splits", 1, Some(2)),
                ("tiled, 5 key splits", 1, Some(5)),
                ("tiled, 8 key splits", 1, Some(8)),
                ("mixed", TILED_MIN_WINDOW, None),
                ("mixed, 3 key splits", TILED_MIN_WINDOW, Some(3)),
            ];
            for (kernels, tiled_min, key_splits) in cases {
                let mut out = s.alloc_zeros::<f16>(n * row).unwrap();
                window_attention_cuda_split(&dev, qkv, all, &part_d, term, &mut out, row, tiled_min, key_splits).unwrap();
                check(&format!("random contextual d{d} split {split:?} {kernels}"), &down16(&dev, &out), &want);
            }
        }
    }
    // mis-sized tables and unsupported head dims are errors, not crashes
    let bad = s.alloc_zeros::<f32>(7).unwrap();
    let qd = up16(&dev, &vec![0.0; n * 32]);
    let part_d = window_partition_cuda(&dev, &xyz_d, &batch_d, n, [1.0; 3], false).unwrap();
    let g = RpeGeometry::new(&xyz, [1.0; 3], [0.5; 3], false, 2, None).unwrap();
    let quant_d = rpe_quantize_cuda(&dev, &xyz_d, n, &g).unwrap();
    let term = CudaTerm::Contextual(CudaContextual { geometry: g, quant: &quant_d, positions: &xyz_d, tables: [&bad, &bad, &bad] });
    let mut out = s.alloc_zeros::<f16>(n * 32).unwrap();
    let qkv = QkvView { q: &qd, k: &qd, v: &qd, ld: 32 };
    assert!(window_attention_cuda(&dev, qkv, HeadSlice::all(2, 16), &part_d, term, &mut out, 32).is_err());
    assert!(window_attention_cuda(&dev, qkv, HeadSlice::all(4, 8), &part_d, CudaTerm::None, &mut out, 32).is_err());
}

/// The split-axis tiled kernel keeps its radial histogram in fixed point, scaled by the keys a
/// block walks (2^19 for this 6,000-voxel window walked whole, 2^22 for real windows). One window
/// holding every voxel, walked by one block and by 8 slices, with peaked logits (a few keys take
/// most of the weight, thousands get tiny P, the values fixed point rounds worst) still equals the
/// CPU within the FP16 tolerance.
#[test]
fn tiled_radial_histogram_in_one_large_window() {
    let Some(dev) = gpu("tiled_radial_histogram_in_one_large_window") else { return };
    let mut rng = Rng(33);
    let n = 6000;
    // radii spread over 0..20 m, so the radial split's bins all fill
    let xyz: Vec<[f32; 3]> = (0..n).map(|_| [rng.uniform(0.5, 20.0), rng.uniform(-0.4, 0.4), rng.uniform(-0.4, 0.4)]).collect();
    let batch = vec![0i32; n];
    let s = &dev.stream;
    let xyz_d = s.clone_htod(&flat(&xyz)).unwrap();
    let batch_d = s.clone_htod(&batch).unwrap();
    let window = [21.0f32, 1.0, 1.0];
    let part = window_partition(&xyz, &batch, window, false).unwrap();
    let part_d = window_partition_cuda(&dev, &xyz_d, &batch_d, n, window, false).unwrap();
    assert_eq!((part.windows(), part.n_max()), (1, n), "one window holds every voxel");
    for d in [16usize, 32] {
        let heads = 2;
        let row = heads * d;
        let (q, k, v) = (rand_vec(&mut rng, n * row, 2.0), rand_vec(&mut rng, n * row, 1.0), rand_vec(&mut rng, n * row, 1.0));
        let (qd, kd, vd) = (up16(&dev, &q), up16(&dev, &k), up16(&dev, &v));
        let qkv = QkvView { q: &qd, k: &kd, v: &vd, ld: row };
        let all = HeadSlice::all(heads, d);
        let quant = [window[0] / 24.0, window[1] / 24.0, window[2] / 24.0];
        let g = RpeGeometry::new(&xyz, window, quant, false, 24, Some(0.0125)).unwrap();
        let rows = g.table_rows();
        let t: Vec<Vec<f32>> = (0..3).map(|_| rand_vec(&mut rng, rows * 3 * heads * d, 0.5)).collect();
        let rpe = ContextualRpe { geometry: g, positions: &xyz, tables: RpeTables { q: &t[0], k: &t[1], v: &t[2] } };
        let want = window_attention(&q, &k, &v, all, &part, PositionTerm::Contextual(rpe)).unwrap();
        let quant_d = rpe_quantize_cuda(&dev, &xyz_d, n, &g).unwrap();
        let td: Vec<_> = t.iter().map(|x| s.clone_htod(x).unwrap()).collect();
        let term = CudaTerm::Contextual(CudaContextual { geometry: g, quant: &quant_d, positions: &xyz_d, tables: [&td[0], &td[1], &td[2]] });
        for key_splits in [1usize, 8] {
            let mut out = s.alloc_zeros::<f16>(n * row).unwrap();
            window_attention_cuda_split(&dev, qkv, all, &part_d, term, &mut out, row, TILED_MIN_WINDOW, Some(key_splits)).unwrap();
            check(&format!("one {n}-voxel window d{d}, {key_splits} key slices"), &down16(&dev, &out), &want);
        }
    }
}

/// The SphereFormer attention core on the real sweep, both window kinds with RPE, C = 32 and 64.
#[test]
fn sphere_attention_matches_cpu_on_nuscenes() {
    let Some(dev) = gpu("sphere_attention_matches_cpu_on_nuscenes") else { return };
    let (xyz, batch, cfg) = nuscenes_voxels();
    let n = xyz.len();
    let s = &dev.stream;
    let xyz_d = s.clone_htod(&flat(&xyz)).unwrap();
    let batch_d = s.clone_htod(&batch).unwrap();
    let mut rng = Rng(31);
    for level in [1usize, 2] {
        let lvl = SphereLevel::from_model(&cfg.yaml, level).unwrap();
        let wd = CudaSphereWindows::build(&dev, &xyz_d, &batch_d, n, &lvl).unwrap();
        // the CPU reference on the GPU's spherical coordinates, so both partition identical inputs
        let sph_flat = s.clone_dtoh(&wd.sphere_pos).unwrap();
        // the level's one-pass kernel (spherical coordinates with both partitions' bounds) writes
        // the stand-alone cart2sphere's bits
        let alone = s.clone_dtoh(&cart2sphere_cuda(&dev, &xyz_d, n).unwrap()).unwrap();
        assert!(sph_flat.iter().zip(&alone).all(|(a, b)| a.to_bits() == b.to_bits()) && sph_flat.len() == alone.len(), "level {level}: spherical coordinates");
        let sph: Vec<[f32; 3]> = sph_flat.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
        let w = SphereWindows::from_sphere_positions(&xyz, sph, &batch, &lvl).unwrap();
        assert_eq!(wd.cubic.to_host(&dev).unwrap(), w.cubic);
        assert_eq!(wd.sphere.to_host(&dev).unwrap(), w.sphere);
        for channels in [32usize, 64] {
            let (heads, d) = (channels / 16, 16);
            let (hc, hs) = (heads / 2, heads - heads / 2);
            let (q, k, v) = (rand_vec(&mut rng, n * channels, 0.25), rand_vec(&mut rng, n * channels, 1.0), rand_vec(&mut rng, n * channels, 1.0));
            let (rc, rs) = (w.cubic_rpe.table_rows(), w.sphere_rpe.table_rows());
            let tc: Vec<Vec<f32>> = (0..3).map(|_| rand_vec(&mut rng, rc * 3 * hc * d, 0.3)).collect();
            let ts: Vec<Vec<f32>> = (0..3).map(|_| rand_vec(&mut rng, rs * 3 * hs * d, 0.3)).collect();
            let tables = SphereTables {
                cubic: RpeTables { q: &tc[0], k: &tc[1], v: &tc[2] },
                sphere: RpeTables { q: &ts[0], k: &ts[1], v: &ts[2] },
            };
            let want = sphere_attention_cpu(&q, &k, &v, heads, d, &xyz, &w, tables).unwrap();
            let (qd, kd, vd) = (up16(&dev, &q), up16(&dev, &k), up16(&dev, &v));
            let td = CudaSphereTables::upload(&dev, [&tc[0], &tc[1], &tc[2]], [&ts[0], &ts[1], &ts[2]]).unwrap();
            let mut out = s.alloc_zeros::<f16>(n * channels).unwrap();
            let t = std::time::Instant::now();
            sphere_attention_cuda(&dev, QkvView { q: &qd, k: &kd, v: &vd, ld: channels }, heads, d, &xyz_d, &wd, &td, &mut out).unwrap();
            dev.synchronize().unwrap();
            eprintln!("nuscenes level {level} C{channels}: {n} voxels, cuda {:.3} ms", t.elapsed().as_secs_f64() * 1e3);
            check(&format!("nuscenes sphere attention level {level} C{channels}"), &down16(&dev, &out), &want);
        }
    }
}

/// Shifted 2-D Swin windows (7 × 7, shift 3) with the relative position bias.
#[test]
fn swin_windows_match_cpu() {
    let Some(dev) = gpu("swin_windows_match_cpu") else { return };
    let mut rng = Rng(41);
    let (hh, ww, m, heads) = (28i32, 42i32, 7i32, 3usize);
    // every head_dim the kernels have
    for d in [16usize, 32, 64] {
        for shift in [0, 3] {
            let (part, rc) = swin_partition(2, hh, ww, m, shift).unwrap();
            let n = rc.len();
            let row = heads * d;
            let (q, k, v) = (rand_vec(&mut rng, n * row, 0.3), rand_vec(&mut rng, n * row, 1.0), rand_vec(&mut rng, n * row, 1.0));
            let tl = ((2 * m - 1) * (2 * m - 1)) as usize;
            let table = rand_vec(&mut rng, heads * tl, 1.0);
            let bias = RelativeBias2d { window: [m, m], table: &table, rc: &rc };
            let want = window_attention(&q, &k, &v, HeadSlice::all(heads, d), &part, PositionTerm::Bias2d(bias)).unwrap();
            // the partition built on the host, uploaded as the device layout
            let s = &dev.stream;
            let order = s.clone_htod(&part.order).unwrap();
            let offsets = s.clone_htod(&part.offsets).unwrap();
            let mut win_of = vec![0u32; n];
            for w in 0..part.windows() {
                for p in part.offsets[w]..part.offsets[w + 1] {
                    win_of[p as usize] = w as u32;
                }
            }
            let part_d = sptr::ops::attention::cuda::CudaPartition::new(order, s.clone_htod(&win_of).unwrap(), offsets, n, part.windows(), part.n_max(), [0.0; 3]);
            let packed: Vec<u32> = rc.iter().map(|p| (p[0] as u32) << 16 | p[1] as u32).collect();
            let rc_d = s.clone_htod(&packed).unwrap();
            let table_d = s.clone_htod(&table).unwrap();
            let (qd, kd, vd) = (up16(&dev, &q), up16(&dev, &k), up16(&dev, &v));
            // Every kernel: per query (4 lanes a query), whole window in FP32 (a block per window
            // and head) and whole window on tensor cores (4 warps per window and head).
            for kernel in [Bias2dKernel::PerQuery, Bias2dKernel::WholeWindow, Bias2dKernel::TensorCores] {
                let mut out = s.alloc_zeros::<f16>(n * row).unwrap();
                let term = CudaTerm::Bias2d(CudaBias2d { window: [m, m], rc_packed: &rc_d, table: &table_d, kernel });
                window_attention_cuda(&dev, QkvView { q: &qd, k: &kd, v: &vd, ld: row }, HeadSlice::all(heads, d), &part_d, term, &mut out, row).unwrap();
                check(&format!("swin 7x7 shift {shift} d{d} {} kernel", kernel.name()), &down16(&dev, &out), &want);
            }
            // The packed-qkv form: one [n, 3 * row] buffer holding q before its scale, k and v;
            // q scaled and rounded as it is staged gives the bits of the split call.
            let scale = 1.0 / (d as f32).sqrt();
            let q_raw = rand_vec(&mut rng, n * row, 1.5);
            let q_split: Vec<f32> = q_raw.iter().map(|&x| f16::from_f32(x * scale).to_f32()).collect();
            let mut packed = Vec::with_capacity(3 * n * row);
            for i in 0..n {
                for src in [&q_raw, &k, &v] {
                    packed.extend_from_slice(&src[i * row..(i + 1) * row]);
                }
            }
            let bias = CudaBias2d { window: [m, m], rc_packed: &rc_d, table: &table_d, kernel: Bias2dKernel::TensorCores };
            let mut split_out = s.alloc_zeros::<f16>(n * row).unwrap();
            let qs = up16(&dev, &q_split);
            window_attention_cuda(&dev, QkvView { q: &qs, k: &kd, v: &vd, ld: row }, HeadSlice::all(heads, d), &part_d, CudaTerm::Bias2d(bias), &mut split_out, row).unwrap();
            let mut packed_out = s.alloc_zeros::<f16>(n * row).unwrap();
            window_attention_packed_qkv_cuda(&dev, &up16(&dev, &packed), scale, HeadSlice::all(heads, d), &part_d, bias, &mut packed_out, row, None, None).unwrap();
            let (a, b) = (s.clone_dtoh(&split_out).unwrap(), s.clone_dtoh(&packed_out).unwrap());
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "swin shift {shift} d{d}: packed qkv differs from the split call");
            // a buffer too small for the rows is refused
            let short = up16(&dev, &packed[..packed.len() - 8]);
            assert!(window_attention_packed_qkv_cuda(&dev, &short, scale, HeadSlice::all(heads, d), &part_d, bias, &mut packed_out, row, None, None).is_err());
        }
    }
}

/// The kernels' exponential split takes the exponent of x = (|d| + 2a) / a instead of
/// floor(logf(x) / ln 2) away from powers of two; it must equal the logf path exactly. Probed on
/// 40,001 consecutive floats around every distance where x crosses a power of two (the floor of
/// its log) or a bin's middle edge (3 * 2^h - 2) * a, both signs, plus a million random
/// distances; two values of `a`. Against the CPU reference (the host's ln instead of CUDA's logf)
/// the two may differ only where x lies within a few ulps of a power of two.
#[test]
fn exponential_split_equals_the_logf_path_and_the_cpu() {
    let Some(dev) = gpu("exponential_split_equals_the_logf_path_and_the_cpu") else { return };
    let mut rng = Rng(23);
    for a in [0.0125f32, 0.05] {
        let mut d = Vec::new();
        for k in 1..=24 {
            for center in [(2f32.powi(k) - 2.0) * a, (3.0 * 2f32.powi(k - 1) - 2.0) * a] {
                for sign in [1.0f32, -1.0] {
                    let c = (center * sign).to_bits() as i64;
                    for u in -20_000i64..=20_000 {
                        let x = f32::from_bits((c + u).clamp(0, u32::MAX as i64) as u32);
                        if x.is_finite() && (x >= 0.0) == (sign > 0.0) {
                            d.push(x);
                        }
                    }
                }
            }
        }
        d.extend((0..1_000_000).map(|_| rng.sym() * 500.0));
        d.extend([0.0, -0.0, a, -a, 2.0 * a, -2.0 * a]);
        let got = exponential_split_cuda(&dev, &d, a).unwrap();
        let differ: Vec<_> = d.iter().zip(&got).filter(|(_, g)| g[0] != g[1]).take(5).collect();
        assert!(differ.is_empty(), "a = {a}: the exponent path differs from the logf path at (d, [fast, logf]) = {differ:?}");
        // the host's x, rounded as the kernels round it
        let near_pow2 = |d: f32| {
            let x = (d.abs() + (2.0 * a as f64) as f32) * (1.0f32 / a);
            let m = x.to_bits() & 0x7f_ffff;
            !(4..=0x7f_ffff - 4).contains(&m)
        };
        let mut boundary = 0usize;
        for (&x, g) in d.iter().zip(&got) {
            let want = exponential_split(x, a);
            if want != g[0] {
                assert!(near_pow2(x), "a = {a}: GPU split {} != CPU {want} at d = {x}, away from any power-of-two x", g[0]);
                boundary += 1;
            }
        }
        eprintln!("exponential split, a = {a}: {} distances, exponent path = logf path; {boundary} differ from the host's ln within 4 ulps of a power of two", d.len());
    }
}
