//! CUDA voxelization and GPU primitives against the CPU reference. Without a GPU these tests
//! report themselves skipped; with SPTR_REQUIRE_GPU=1 a missing GPU is a failure.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{gpu, rel_err, nuscenes_sweep, rotated_z, Rng};
use sptr::ops::voxelize::cpu::{KeyPrecision, OutOfRange, VoxelOrigin};
use sptr::models::sphereformer::config::ModelConfig;
use sptr::device::cuda::{driver_available, CudaDevice};
use sptr::device::primitives::{bits_for, exclusive_scan_u32, radix_sort_pairs};
use sptr::ops::voxelize::cpu::{voxelize_cpu, VoxelParams, Voxels};
use sptr::ops::voxelize::cuda::voxelize_cuda;
use sptr::Points;


fn model_params(name: &str) -> VoxelParams {
    let path = common::root().join("config/models").join(name);
    ModelConfig::load(&path).expect("model yaml loads").voxel_params()
}


/// CUDA equals CPU: exact coordinates, counts, map and stats; features within FP16 rounding.
fn assert_same(case: &str, gpu: &Voxels, cpu: &Voxels) {
    assert_eq!(gpu.stats, cpu.stats, "{case}: stats");
    assert_eq!(gpu.coords.len(), cpu.coords.len(), "{case}: voxel count");
    let first_diff = gpu.coords.iter().zip(&cpu.coords).position(|(a, b)| a != b);
    assert!(first_diff.is_none(), "{case}: coords differ first at voxel {first_diff:?}");
    assert_eq!(gpu.counts, cpu.counts, "{case}: counts");
    assert_eq!(gpu.point_to_voxel, cpu.point_to_voxel, "{case}: point_to_voxel");
    assert!(gpu.feats.iter().all(|v| v.is_finite()), "{case}: non-finite GPU feature");
    // FP16 storage: relative rounding 2^-11 ≈ 4.9e-4 per element.
    let fe = rel_err(&gpu.feats, &cpu.feats);
    assert!(fe <= 1e-3, "{case}: feature rel err {fe:.3e}");
    let gx: Vec<f32> = gpu.xyz.iter().flatten().copied().collect();
    let cx: Vec<f32> = cpu.xyz.iter().flatten().copied().collect();
    let xe = rel_err(&gx, &cx);
    assert!(xe <= 1e-6, "{case}: xyz rel err {xe:.3e} (same f32 arithmetic on both sides)");
    eprintln!("{case}: {} voxels, feature rel err {fe:.2e}, xyz rel err {xe:.2e}", cpu.len());
}

fn check(dev: &CudaDevice, case: &str, batch: &[&Points], params: &VoxelParams) {
    let cpu = voxelize_cpu(batch, params).expect("cpu voxelization");
    let t = std::time::Instant::now();
    let g = voxelize_cuda(dev, batch, params).expect("cuda voxelization");
    dev.synchronize().expect("sync");
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let g = g.to_host(dev).expect("download");
    eprintln!("{case}: cuda {ms:.3} ms (includes upload)");
    assert_same(case, &g, &cpu);
}

#[test]
fn cuda_voxelize_nuscenes_sample_both_models() {
    let Some(dev) = gpu("cuda_voxelize_nuscenes_sample_both_models") else { return };
    let pts = nuscenes_sweep();
    for model in ["sphereformer_nuscenes.yaml", "sphereformer_semantickitti.yaml"] {
        let mut p = model_params(model);
        check(&dev, &format!("nuscenes/{model}"), &[&pts], &p);
        p.voxel_size = [0.05; 3];
        check(&dev, &format!("nuscenes/{model}@0.05"), &[&pts], &p);
    }
}

#[test]
fn cuda_voxelize_large_real_batch() {
    let Some(dev) = gpu("cuda_voxelize_large_real_batch") else { return };
    // Six rotated copies of the real sweep as a batch: 208k real points, six samples.
    let base = nuscenes_sweep();
    let copies: Vec<Points> = (0..6).map(|k| rotated_z(&base, 60.0 * k as f32)).collect();
    let batch: Vec<&Points> = copies.iter().collect();
    assert!(batch.iter().map(|p| p.len()).sum::<usize>() >= 200_000);
    let mut p = model_params("sphereformer_semantickitti.yaml");
    p.voxel_size = [0.05; 3];
    check(&dev, "nuscenes x6 batch", &batch, &p);
    // The same points as one sample: the biggest single-sample case.
    let mut one = Points::default();
    for c in &copies {
        one.x.extend(&c.x);
        one.y.extend(&c.y);
        one.z.extend(&c.z);
        one.intensity.extend(&c.intensity);
    }
    check(&dev, "nuscenes x6 merged", &[&one], &p);
}

fn random_cloud(rng: &mut Rng, n: usize, extent: f32, bad_every: usize) -> Points {
    let mut p = Points::default();
    for i in 0..n {
        let mut v = [rng.uniform(-extent, extent), rng.uniform(-extent, extent), rng.uniform(-3.0, 3.0)];
        if bad_every > 0 && i % bad_every == 7 {
            v[i % 3] = if i % 2 == 0 { f32::NAN } else { f32::INFINITY };
        }
        p.x.push(v[0]);
        p.y.push(v[1]);
        p.z.push(v[2]);
        p.intensity.push(rng.uniform(0.0, 255.0));
    }
    p.has_intensity = true;
    p
}

#[test]
fn cuda_voxelize_random_all_modes() {
    let Some(dev) = gpu("cuda_voxelize_random_all_modes") else { return };
    let mut rng = Rng(0x5EED_0001);
    let a = random_cloud(&mut rng, 120_000, 60.0, 97);
    let b = random_cloud(&mut rng, 3, 60.0, 0);
    let empty = Points::default();
    for origin in [VoxelOrigin::ScanMin, VoxelOrigin::RangeMin, VoxelOrigin::Zero] {
        for oor in [OutOfRange::Clip, OutOfRange::Drop] {
            for precision in [KeyPrecision::F32, KeyPrecision::F64] {
                for max_voxels in [1usize << 30, 50_000] {
                    let p = VoxelParams {
                        voxel_size: [0.1, 0.1, 0.15],
                        range: Some([[-40.0, -35.5, -2.0], [40.0, 35.5, 2.5]]),
                        out_of_range: oor,
                        origin,
                        precision,
                        max_voxels,
                    };
                    let case = format!("random {origin:?} {oor:?} {precision:?} cap {max_voxels}");
                    check(&dev, &case, &[&a, &empty, &b], &p);
                }
            }
        }
    }
    // No range at all, negative coordinates.
    let p = VoxelParams {
        voxel_size: [0.05; 3],
        range: None,
        out_of_range: OutOfRange::Drop,
        origin: VoxelOrigin::Zero,
        precision: KeyPrecision::F32,
        max_voxels: 1 << 30,
    };
    check(&dev, "random no range, zero origin", &[&a], &p);
}

/// Voxels with thousands of points (what clipping to the range piles onto its faces) are summed
/// by a whole warp on the GPU; the sums must still take their points in input order, so the
/// positions equal the CPU's bit for bit.
#[test]
fn cuda_voxelize_big_voxels_sum_in_input_order() {
    let Some(dev) = gpu("cuda_voxelize_big_voxels_sum_in_input_order") else { return };
    let mut rng = Rng(0x5EED_0002);
    let mut p = random_cloud(&mut rng, 20_000, 30.0, 0);
    for i in 0..5_000 {
        // one voxel of 0.1 m holding 5,000 points, and 3,000 points far outside the range
        p.x.push(1.0 + 0.09 * rng.uniform(0.0, 1.0));
        p.y.push(2.0 + 0.09 * rng.uniform(0.0, 1.0));
        p.z.push(0.5 + 0.09 * rng.uniform(0.0, 1.0));
        p.intensity.push(i as f32);
        if i < 3_000 {
            p.x.push(rng.uniform(100.0, 200.0));
            p.y.push(rng.uniform(-200.0, -100.0));
            p.z.push(rng.uniform(10.0, 20.0));
            p.intensity.push(rng.uniform(0.0, 255.0));
        }
    }
    for precision in [KeyPrecision::F32, KeyPrecision::F64] {
        let params = VoxelParams {
            voxel_size: [0.1, 0.1, 0.1],
            range: Some([[-20.0, -20.0, -2.0], [20.0, 20.0, 2.0]]),
            out_of_range: OutOfRange::Clip,
            origin: VoxelOrigin::ScanMin,
            precision,
            max_voxels: 1 << 30,
        };
        let cpu = voxelize_cpu(&[&p], &params).unwrap();
        let biggest = cpu.counts.iter().copied().max().unwrap_or(0);
        assert!(biggest >= 3_000, "a voxel holds thousands of points (largest {biggest})");
        let g = voxelize_cuda(&dev, &[&p], &params).unwrap().to_host(&dev).unwrap();
        assert_same(&format!("big voxels {precision:?}"), &g, &cpu);
        assert_eq!(g.xyz, cpu.xyz, "big voxels {precision:?}: mean positions differ (summation order)");
    }
}

#[test]
fn cuda_voxelize_empty_and_all_invalid() {
    let Some(dev) = gpu("cuda_voxelize_empty_and_all_invalid") else { return };
    let p = model_params("sphereformer_nuscenes.yaml");
    let empty = Points::default();
    check(&dev, "empty", &[&empty], &p);
    check(&dev, "no samples", &[], &p);
    let mut nan = Points::default();
    for _ in 0..1000 {
        nan.x.push(f32::NAN);
        nan.y.push(1.0);
        nan.z.push(1.0);
        nan.intensity.push(0.0);
    }
    check(&dev, "all NaN", &[&nan], &p);
}

/// A point with finite x, y, z and a NaN/Inf intensity gets no voxel on the GPU either (the
/// host uploads its x as NaN): CUDA equals the CPU, which counts it non-finite, in a batch of two
/// samples (the scan-minimum origin of each sample ignores it).
#[test]
fn cuda_voxelize_drops_points_with_a_non_finite_intensity() {
    let Some(dev) = gpu("cuda_voxelize_drops_points_with_a_non_finite_intensity") else { return };
    let base = nuscenes_sweep();
    let mut bad = base.clone();
    // the sweep's lowest point on each axis gets a NaN intensity: the scan minimum must move
    for axis in 0..3 {
        let v = [&bad.x, &bad.y, &bad.z][axis];
        let i = (0..v.len()).min_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap();
        bad.intensity[i] = f32::NAN;
    }
    bad.intensity[100] = f32::INFINITY;
    bad.intensity[200] = f32::NEG_INFINITY;
    let rot = rotated_z(&bad, 90.0);
    for model in ["sphereformer_nuscenes.yaml", "sphereformer_semantickitti.yaml"] {
        let p = model_params(model);
        let cpu = voxelize_cpu(&[&bad, &rot], &p).expect("cpu voxelization");
        let n_bad = bad.intensity.iter().filter(|v| !v.is_finite()).count();
        assert_eq!(cpu.stats.non_finite, 2 * n_bad, "{model}");
        let g = voxelize_cuda(&dev, &[&bad, &rot], &p).expect("cuda voxelization").to_host(&dev).expect("download");
        assert_same(&format!("non-finite intensity/{model}"), &g, &cpu);
    }
}

#[test]
fn cuda_scan_matches_cpu() {
    let Some(dev) = gpu("cuda_scan_matches_cpu") else { return };
    let mut rng = Rng(42);
    // one tile, tiles scanned by one block (up to 8 tiles of 4096), the three passes
    for n in [1usize, 31, 1024, 4095, 4096, 4097, 8192, 12_345, 32_768, 32_769, 100_003, 5_000_000] {
        let v: Vec<u32> = (0..n).map(|_| (rng.next_u64() % 7) as u32).collect();
        let input = dev.stream.clone_htod(&v).unwrap();
        let mut out = dev.stream.alloc_zeros::<u32>(n).unwrap();
        let total = exclusive_scan_u32(&dev, &input, &mut out, n).unwrap();
        let got = dev.stream.clone_dtoh(&out).unwrap();
        let mut acc = 0u32;
        for i in 0..n {
            assert_eq!(got[i], acc, "n={n} i={i}");
            acc += v[i];
        }
        assert_eq!(total, acc, "n={n} total");
    }
}

#[test]
fn cuda_radix_sort_is_stable_and_sorted() {
    let Some(dev) = gpu("cuda_radix_sort_is_stable_and_sorted") else { return };
    let mut rng = Rng(7);
    for (n, max_key) in [(1usize, 5u64), (2047, 3), (2049, 1 << 20), (300_001, 1 << 40), (1_000_000, u64::MAX >> 1)] {
        let keys: Vec<u64> = (0..n).map(|_| rng.next_u64() % max_key).collect();
        let mut dk = dev.stream.clone_htod(&keys).unwrap();
        let vals: Vec<u32> = (0..n as u32).collect();
        let mut dv = dev.stream.clone_htod(&vals).unwrap();
        radix_sort_pairs(&dev, &mut dk, &mut dv, n, bits_for(max_key - 1)).unwrap();
        let gk = dev.stream.clone_dtoh(&dk).unwrap();
        let gv = dev.stream.clone_dtoh(&dv).unwrap();
        let mut expect: Vec<u32> = vals.clone();
        expect.sort_by_key(|&i| keys[i as usize]); // std sort_by_key is stable
        assert_eq!(gv, expect, "n={n}: permutation (stability)");
        let ek: Vec<u64> = expect.iter().map(|&i| keys[i as usize]).collect();
        assert_eq!(gk, ek, "n={n}: keys");
    }
}

#[test]
fn no_driver_is_an_error_not_a_panic() {
    if !driver_available() {
        let e = CudaDevice::new(0).err().expect("no driver must give an error");
        let e = e.to_string();
        assert!(e.contains("driver (needed for every GPU path): not found") && e.contains("install an NVIDIA driver"), "{e}");
    }
}

/// Uploads through the page-locked staging buffer hold what was written, one after another
/// without a wait in between (each fill waits for the copy before it to have read the buffer),
/// through growth of the buffer, and give the voxels of the ordinary upload.
#[test]
fn cuda_staged_uploads_equal_ordinary_ones() {
    let Some(plain) = gpu("cuda_staged_uploads_equal_ordinary_ones") else { return };
    let Some(mut staged) = gpu("cuda_staged_uploads_equal_ordinary_ones") else { return };
    staged.set_pinned_staging(true);
    // back to back, each large enough that its copy is still running when the next fill starts
    // if nothing waits; the third outgrows the first two's buffer
    let sizes = [3_000_000usize, 3_000_000, 9_000_000, 5];
    let uploads: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| staged.upload_f32_with(n, "test values", |h| h.iter_mut().enumerate().for_each(|(i, v)| *v = (i * 7 + k) as f32)).expect("staged upload"))
        .collect();
    for (k, (u, &n)) in uploads.iter().zip(&sizes).enumerate() {
        let got = staged.stream.clone_dtoh(u).expect("download");
        assert_eq!(got.len(), n.max(1));
        if let Some(i) = (0..n).find(|&i| got[i] != (i * 7 + k) as f32) {
            panic!("staged upload {k}: value {i} is {} (another upload's?)", got[i]);
        }
    }
    let mut p = model_params("sphereformer_semantickitti.yaml");
    p.voxel_size = [0.05; 3];
    let sweep = nuscenes_sweep();
    let copies: Vec<Points> = (0..6).map(|k| rotated_z(&sweep, 60.0 * k as f32)).collect();
    let mut rng = Rng(0x5EED_0002);
    let tiny = random_cloud(&mut rng, 3, 60.0, 0);
    let clouds: Vec<Vec<&Points>> = vec![vec![&tiny], vec![&sweep], copies.iter().collect(), vec![&sweep, &tiny], vec![]];
    // every cloud voxelized on the staged device before any is read back
    let staged_out: Vec<_> = clouds.iter().map(|b| voxelize_cuda(&staged, b, &p).expect("staged voxelization")).collect();
    for (b, s) in clouds.iter().zip(&staged_out) {
        let case = format!("staged upload, {} samples, {} points", b.len(), b.iter().map(|c| c.len()).sum::<usize>());
        let s = s.to_host(&staged).expect("download");
        let o = voxelize_cuda(&plain, b, &p).expect("ordinary voxelization").to_host(&plain).expect("download");
        assert_eq!(s.stats, o.stats, "{case}: stats");
        assert_eq!((&s.coords, &s.counts, &s.point_to_voxel), (&o.coords, &o.counts, &o.point_to_voxel), "{case}");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&s.feats), bits(&o.feats), "{case}: features");
        assert_same(&case, &s, &voxelize_cpu(b, &p).expect("cpu voxelization"));
    }
}
