//! `sptr bench bevpool`: the view transform's geometry build and pool on CUDA, JSON lines.
//!
//! Cases: the camera-only seg geometry of the model YAML (6 × 118 × 32 × 88, C 80, 256 × 256 at
//! 0.4 m) and the detection geometry the bev_pool anchors were measured on (x/y bounds
//! [-54, 54, 0.3]: 360 × 360, otherwise the same), both with the nuScenes sample calibration.
//! Depth and context are random FP16 (depth a softmax per pixel), as after the lift.
//!
//! Bytes the pool must move at least (each once): depth N·H·W·D·2, context N·H·W·C·2, the
//! table kept·4 + (cells + 1)·4 + cells·4 (point order, cell offsets, launch order), the output
//! cells·C·2. The DRAM floor is those bytes over the
//! device's DRAM bandwidth (`--dram-gbps`, H100 SXM 3350 GB/s). The inputs (≈ 6.7 MB) fit in the
//! 50 MB L2 of an H100, so warm runs can beat that floor; it is a scale, not a bound.

use crate::models::bevfusion::lss::config::{BevGrid, LssConfig};
use crate::models::bevfusion::lss::cuda::{build_geometry_cuda, pool_cuda, upload_frustum, CudaLssTransform};
use crate::models::bevfusion::lss::geometry::{LssGeometry, LssParams};
use crate::models::bevfusion::lss::transform::{random_tensors, softmax_into, CameraMask, LssTransform, PREFIX};
use crate::sensors::calib::camera::Calibration;
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::ops::dense::FeatureMap;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::nn::random::SplitMix;
use crate::nn::Weights;
use crate::Error;
use half::f16;

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct BevPoolBench {
    pub iters: usize,
    /// DRAM bandwidth for the floor, GB/s.
    pub dram_gbps: f64,
}

/// The detection-geometry variant of `cfg`: x and y bounds [-54, 54, 0.3].
pub fn detection_config(cfg: &LssConfig) -> LssConfig {
    let mut c = cfg.clone();
    c.vtransform.xbound = [-54.0, 54.0, 0.3];
    c.vtransform.ybound = [-54.0, 54.0, 0.3];
    c
}

fn random_lifted(seed: u64, pixels: usize, d: usize, c: usize) -> (Vec<f16>, Vec<f16>) {
    let mut rng = SplitMix(seed);
    let mut depth = Vec::with_capacity(pixels * d);
    let mut row = vec![0f32; d];
    for _ in 0..pixels {
        let logits: Vec<f32> = (0..d).map(|_| rng.uniform(-3.0, 3.0)).collect();
        softmax_into(&logits, &mut row);
        depth.extend(row.iter().map(|&v| f16::from_f32(v)));
    }
    let context = (0..pixels * c).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0))).collect();
    (depth, context)
}

fn pool_bytes(g: &LssGeometry, channels: usize) -> usize {
    let pixels = g.cameras * g.pixels_per_camera();
    let cells = g.grid.cells();
    pixels * g.depth_bins * 2 + pixels * channels * 2 + g.kept() * 4 + (cells + 1) * 4 + cells * 4 + cells * channels * 2
}

/// One case: JSON line.
fn case(dev: &CudaDevice, name: &str, cfg: &LssConfig, calib: &Calibration, opt: &BevPoolBench) -> Result<String, Error> {
    let params = LssParams::from_config(cfg);
    let t0 = std::time::Instant::now();
    let cpu = LssGeometry::build(&params, calib)?;
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
    let frustum = upload_frustum(dev, &params)?;
    let iters = opt.iters.max(1);
    let geom_ms = dev.time_median_ms(2, iters.min(20), || build_geometry_cuda(dev, &params, &frustum, calib).map(|_| ()))?;
    let geom = build_geometry_cuda(dev, &params, &frustum, calib)?;
    let (d, c) = (cpu.depth_bins, cfg.channels());
    let pixels = cpu.cameras * cpu.pixels_per_camera();
    let (depth, context) = random_lifted(7, pixels, d, c);
    let gd = dev.stream.clone_htod(&depth).map_err(cuda_err("uploading depth"))?;
    let gc = dev.stream.clone_htod(&context).map_err(cuda_err("uploading context"))?;
    let pool_ms = dev.time_median_ms(5, iters, || pool_cuda(dev, &geom, &gd, &gc, c, CameraMask::ALL).map(|_| ()))?;
    let bytes = pool_bytes(&cpu, c);
    let floor_ms = bytes as f64 / (opt.dram_gbps * 1e9) * 1e3;
    let iv = cpu.intervals();
    let max_len = iv.iter().map(|i| i.len).max().unwrap_or(0);
    let BevGrid { nx, .. } = params.grid;
    Ok(format!(
        "{{\"bench\":\"bevpool\",\"case\":\"{name}\",\"device\":\"{}\",\"cameras\":{},\"depth_bins\":{d},\"feature\":[{},{}],\"channels\":{c},\
         \"grid\":[{},{},{}],\"points\":{},\"kept\":{},\"intervals\":{},\"max_interval\":{max_len},\"geometry_ms\":{geom_ms:.4},\
         \"geometry_cpu_ms\":{cpu_ms:.2},\"pool_ms\":{pool_ms:.4},\"pool_bytes\":{bytes},\"dram_gbps\":{},\"dram_floor_ms\":{floor_ms:.4},\
         \"ratio_to_floor\":{:.2},\"bar_ms\":0.17,\"goal_ms\":0.116}}",
        dev.name,
        cpu.cameras,
        cpu.height,
        cpu.width,
        nx[0],
        nx[1],
        nx[2],
        geom.points,
        cpu.kept(),
        iv.len(),
        opt.dram_gbps,
        pool_ms / floor_ms
    ))
}

/// The whole view transform (depthnet GEMM, softmax, pool, downsample) on random weights and
/// features, geometry cached: JSON line.
fn transform_case(dev: &CudaDevice, cfg: &LssConfig, calib: &Calibration, iters: usize) -> Result<String, Error> {
    let w = Weights::from_tensors("random", random_tensors(cfg, PREFIX, 1))?;
    let t = LssTransform::from_weights_exact(cfg, w, PREFIX)?;
    let blas = cudarc::cublas::CudaBlas::new(dev.stream.clone()).map_err(|e| Error::Cuda(format!("cuBLAS: {e:?}")))?;
    let mut gt = CudaLssTransform::upload(dev, &t)?;
    let [h, wd] = cfg.feature_size();
    let n = calib.len();
    let cin = cfg.vtransform.in_channels;
    let mut rng = SplitMix(3);
    let x = FeatureMap::new(n, h, wd, cin, (0..n * h * wd * cin).map(|_| rng.uniform(-1.0, 1.0)).collect())?;
    let gx = CudaFeatureMap::upload(dev, &x)?;
    gt.ensure_geometry(dev, calib)?;
    let lift_ms = dev.time_median_ms(3, iters, || gt.lift(dev, &blas, &gx).map(|_| ()))?;
    let all_ms = dev.time_median_ms(3, iters, || gt.forward(dev, &blas, calib, &gx, CameraMask::ALL).map(|_| ()))?;
    Ok(format!(
        "{{\"bench\":\"bevpool\",\"case\":\"seg_vtransform\",\"device\":\"{}\",\"lift_ms\":{lift_ms:.4},\"vtransform_ms\":{all_ms:.4},\
         \"note\":\"depthnet GEMM + softmax; then pool and the three downsample convs, geometry cached\"}}",
        dev.name
    ))
}

/// Every case, one JSON line each.
pub fn bench_bevpool(dev: &CudaDevice, seg: &LssConfig, calib: &Calibration, opt: &BevPoolBench) -> Result<Vec<String>, Error> {
    Ok(vec![
        case(dev, "seg", seg, calib, opt)?,
        case(dev, "det", &detection_config(seg), calib, opt)?,
        transform_case(dev, seg, calib, opt.iters.clamp(1, 50))?,
    ])
}
