//! BEVFusion's LiDAR branch on CUDA against the CPU reference: hard voxelization identical
//! (coordinates and order, counts, float32 means bit for bit, FP16 features = the CPU means
//! rounded, stats), and the full SparseEncoder with random weights: every stage's sites identical
//! and features, and the BEV map, within rel 2e-3 (FP16 storage, FP32 accumulation, ~20 layers:
//! each FP16 rounding is 2^-11 ≈ 4.9e-4 relative), no NaN. Skips without a GPU unless
//! SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{gpu, rel_err};
use half::f16;
use sptr::device::cuda::CudaDevice;
use sptr::models::bevfusion::lidar_encoder::cuda::{CudaLidarEncoder, INPUT_CHANNELS_PADDED};
use sptr::models::bevfusion::lidar_encoder::{random_weights, LidarEncoder, LidarEncoderConfig};
use sptr::ops::voxelize::hard::{hard_voxelize_cpu, point_rows, synthetic_sweeps, HardVoxelParams, POINT_COLUMNS};
use sptr::ops::voxelize::hard_cuda::hard_voxelize_cuda;

fn config() -> LidarEncoderConfig {
    LidarEncoderConfig::load(&common::root().join("config/models/bevfusion_seg_fusion.yaml")).expect("fusion model YAML")
}

fn sweep() -> Vec<[f32; POINT_COLUMNS]> {
    point_rows(&common::nuscenes_sweep(), 0.0)
}

fn check_voxelize(dev: &CudaDevice, case: &str, pts: &[[f32; POINT_COLUMNS]], p: &HardVoxelParams) {
    let cpu = hard_voxelize_cpu(pts, p).expect("CPU voxelization");
    let g = hard_voxelize_cuda(dev, pts, p, INPUT_CHANNELS_PADDED).expect("CUDA voxelization");
    let host = g.to_host(dev).expect("download");
    assert_eq!(host.stats, cpu.stats, "{case}: stats");
    assert_eq!(host.coords.len(), cpu.coords.len(), "{case}: voxel count");
    let first = host.coords.iter().zip(&cpu.coords).position(|(a, b)| a != b);
    assert!(first.is_none(), "{case}: coordinates differ first at voxel {first:?}");
    assert_eq!(host.counts, cpu.counts, "{case}: counts");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&host.feats) == bits(&cpu.feats), "{case}: float32 means differ");
    let f16s = g.feats16_to_host(dev).expect("FP16 features");
    for (v, row) in f16s.chunks(INPUT_CHANNELS_PADDED).enumerate() {
        for c in 0..INPUT_CHANNELS_PADDED {
            let want = if c < POINT_COLUMNS { f16::from_f32(cpu.feats[v * POINT_COLUMNS + c]).to_f32() } else { 0.0 };
            assert!(row[c].to_bits() == want.to_bits(), "{case}: FP16 feature ({v}, {c}) {} vs {want}", row[c]);
        }
    }
    eprintln!("{case}: {} points -> {} voxels {:?}", pts.len(), cpu.len(), cpu.stats);
}

#[test]
fn hard_voxelize_cuda_equals_cpu() {
    let Some(dev) = gpu("hard_voxelize_cuda_equals_cpu") else { return };
    let p = config().voxelize;
    let one = sweep();
    check_voxelize(&dev, "sweep", &one, &p);
    // ten synthetic sweeps: 346,880 points, more voxels than max_voxels (120,000): the cap keeps
    // the voxels of the first points, as upstream
    let ten = synthetic_sweeps(&one, 10);
    let cpu = hard_voxelize_cpu(&ten, &p).unwrap();
    assert!(cpu.stats.voxels_total > p.max_voxels, "{:?}", cpu.stats);
    check_voxelize(&dev, "ten sweeps", &ten, &p);
    let mut q = p.clone();
    q.max_num_points = 2;
    q.max_voxels = 5000;
    check_voxelize(&dev, "2 points, 5000 voxels", &ten, &q);
    q.round_points_to_fp16 = true;
    check_voxelize(&dev, "FP16-rounded points", &ten, &q);
    // points on the range's faces: kept by the voxelizer alone, dropped by PointsRangeFilter
    let faces: Vec<[f32; POINT_COLUMNS]> = (0..2000)
        .map(|i| {
            let t = i as f32 / 2000.0;
            [-51.2 + (i % 3) as f32 * 0.05, 102.4 * t - 51.2, -5.0 + 8.0 * t, t, 0.0]
        })
        .collect();
    let mut nf = p.clone();
    nf.range_filter = false;
    check_voxelize(&dev, "faces, no range filter", &faces, &nf);
    check_voxelize(&dev, "faces, range filter", &faces, &p);
    // non-finite points sprinkled in, one per 101
    let mut dirty = ten.clone();
    for (i, r) in dirty.iter_mut().enumerate().filter(|(i, _)| i % 101 == 0) {
        r[i % 5] = if i % 2 == 0 { f32::NAN } else { f32::INFINITY };
    }
    check_voxelize(&dev, "NaN/Inf points", &dirty, &p);
    // degenerate clouds
    check_voxelize(&dev, "empty", &[], &p);
    check_voxelize(&dev, "one point", &[[1.0, 2.0, 0.5, 3.0, 0.0]], &p);
    check_voxelize(&dev, "all out of range", &[[90.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 5.0, 1.0, 0.0]], &p);
    check_voxelize(&dev, "all NaN", &[[f32::NAN; 5]; 3], &p);
    check_voxelize(&dev, "beyond FP16", &[[0.0, 0.0, 0.0, 1.0e6, 0.0], [0.0, 0.0, 0.0, 65504.0, -65505.0], [1.0, 1.0, 0.0, 65504.0, 0.0]], &p);
}

#[test]
fn lidar_encoder_cuda_matches_cpu_full_config() {
    let Some(dev) = gpu("lidar_encoder_cuda_matches_cpu_full_config") else { return };
    let cfg = config();
    let enc = LidarEncoder::load(&cfg, &random_weights(&cfg, 20261124).unwrap()).expect("encoder");
    let gpu_enc = CudaLidarEncoder::upload(&dev, &enc).expect("upload");
    for (case, pts) in [("sweep", sweep()), ("ten sweeps", synthetic_sweeps(&sweep(), 10))] {
        let cpu_v = enc.voxelize(&pts).unwrap();
        let (cpu_bev, cpu_stages) = enc.forward_voxels(&cpu_v, true).expect("CPU forward");
        let v = gpu_enc.voxelize(&dev, &pts).expect("CUDA voxelize");
        let (bev, stages) = gpu_enc.forward_voxels(&dev, v, true).expect("CUDA forward");
        assert_eq!(stages.len(), cpu_stages.len());
        for (g, c) in stages.iter().zip(&cpu_stages) {
            assert_eq!(g.name, c.name, "{case}");
            assert_eq!(g.coords, c.tensor.coords(), "{case} {}: sites", g.name);
            assert!(g.feats.iter().all(|v| v.is_finite()), "{case} {}: non-finite", g.name);
            let e = rel_err(&g.feats, c.tensor.feats());
            eprintln!("{case} {}: {} sites x {} channels, rel err {e:.2e}", g.name, g.coords.len(), g.channels);
            assert!(e <= 2e-3, "{case} {}: rel err {e:.3e}", g.name);
        }
        let got = bev.download(&dev).expect("download");
        assert_eq!((got.n, got.h, got.w, got.c), (1, 128, 128, 256), "{case}");
        assert!(got.data.iter().all(|v| v.is_finite()), "{case}: non-finite BEV value");
        let e = rel_err(&got.data, &cpu_bev.data);
        eprintln!("{case}: BEV [1, 128, 128, 256] rel err {e:.2e}");
        assert!(e <= 2e-3, "{case}: BEV rel err {e:.3e}");
        // the plain entry point gives the same map and stats
        let (bev2, stats) = gpu_enc.forward(&dev, &pts).expect("forward");
        assert_eq!(stats, cpu_v.stats);
        assert_eq!(bev2.download(&dev).unwrap().data, got.data, "{case}: run to run");
    }
}

#[test]
fn lidar_encoder_cuda_bad_clouds() {
    let Some(dev) = gpu("lidar_encoder_cuda_bad_clouds") else { return };
    let cfg = config();
    let enc = LidarEncoder::load(&cfg, &random_weights(&cfg, 5).unwrap()).unwrap();
    let g = CudaLidarEncoder::upload(&dev, &enc).unwrap();
    for (what, pts) in [("empty", vec![]), ("all NaN", vec![[f32::NAN; 5]; 2]), ("all out of range", vec![[0.0, 0.0, -7.0, 0.0, 0.0]])] {
        let e = g.forward(&dev, &pts).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("no voxel"), "{what}: {e}");
    }
}
