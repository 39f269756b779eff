//! CUDA BEV label grids equal the CPU reference exactly (integer votes), on the real nuScenes
//! sweep with pseudo-labels and on random points. Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

use crate::common::{gpu, nuscenes_sweep, Rng};
use sptr::ops::label_grid::cpu::{label_grid_cpu, BevGridParams};
use sptr::ops::label_grid::cuda::label_grid_cuda;
use sptr::device::cuda::CudaDevice;


fn check(dev: &CudaDevice, case: &str, x: &[f32], y: &[f32], c: &[u8], p: &[f32], params: &BevGridParams) {
    let cpu = label_grid_cpu(x, y, c, p, params).unwrap();
    let s = &dev.stream;
    let (dx, dy) = (s.clone_htod(x).unwrap(), s.clone_htod(y).unwrap());
    let (dc, dp) = (s.clone_htod(c).unwrap(), s.clone_htod(p).unwrap());
    let t = std::time::Instant::now();
    let g = label_grid_cuda(dev, &dx, &dy, &dc, &dp, x.len(), params).unwrap();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(g, cpu, "{case}: CUDA grids differ from the CPU reference");
    let filled = cpu.labels.iter().filter(|&&l| l != 255).count();
    eprintln!("{case}: {} points, {}x{} cells ({filled} filled), cuda {ms:.3} ms incl. readback", x.len(), g.width, g.height);
}

#[test]
fn cuda_bev_grid_equals_cpu() {
    let Some(dev) = gpu("cuda_bev_grid_equals_cpu") else { return };
    let pts = nuscenes_sweep();
    // Pseudo-labels from geometry (height bands, ring-like distance classes) and probabilities
    // from a hash: real point positions, deterministic labels.
    let mut rng = Rng(99);
    let classes = 16usize;
    let cls: Vec<u8> = (0..pts.len())
        .map(|i| ((pts.z[i] + 3.0).max(0.0) as usize * 3 + (pts.x[i].hypot(pts.y[i]) / 7.0) as usize + (rng.next_u64() % 2) as usize) as u8 % classes as u8)
        .collect();
    let prob: Vec<f32> = (0..pts.len()).map(|_| rng.uniform(0.0, 1.0)).collect();
    let params = BevGridParams {
        range: [-51.2, -51.2, 51.2, 51.2],
        resolution: 0.4,
        classes,
        obstacle_classes: (0..10).collect(),
        palette: (0..classes).map(|c| [c as u8 * 15, 255 - c as u8 * 15, 7]).collect(),
    };
    check(&dev, "nuscenes 0.4 m", &pts.x, &pts.y, &cls, &prob, &params);
    let mut fine = params.clone();
    fine.resolution = 0.1;
    check(&dev, "nuscenes 0.1 m", &pts.x, &pts.y, &cls, &prob, &fine);
    // Dense random points: many votes per cell, ties likely with few classes.
    let n = 2_000_000;
    let x: Vec<f32> = (0..n).map(|_| rng.uniform(-60.0, 60.0)).collect();
    let y: Vec<f32> = (0..n).map(|_| rng.uniform(-60.0, 60.0)).collect();
    let c: Vec<u8> = (0..n).map(|_| (rng.next_u64() % 3) as u8).collect();
    let p: Vec<f32> = (0..n).map(|i| if i % 5 == 0 { 1.0 } else { rng.uniform(-0.1, 1.1) }).collect();
    let mut few = params.clone();
    few.classes = 3;
    few.obstacle_classes = vec![1];
    few.palette.truncate(3);
    check(&dev, "random 2M points, 3 classes", &x, &y, &c, &p, &few);
    check(&dev, "no points", &[], &[], &[], &[], &params);
}
