//! `sptr bench bevseg`: a BEVFusion seg model on CUDA, from JPEG bytes on the host to the
//! thresholded masks on the host, per frame: wall time median / p90, each stage's median and
//! p90 (GPU time between events; JPEG decode + upload on the host clock), and the device
//! memory the process holds at its peak (weights, plans, the frame's high-water mark), as one
//! JSON line per model.

use crate::bench::percentiles::Percentiles;
use crate::models::bevfusion::seg::{random_tensors, BevSegConfig, BevSegModel, Point5};
use crate::models::bevfusion::seg_cuda::CudaBevSeg;
use crate::sensors::calib::camera::{Calibration, NUSCENES_CAMERAS};
use crate::sensors::image::compressed::jpeg_size;
use crate::sensors::image::encodings::DecodeLimits;
use crate::ops::dense::conv_engine::ConvBackend;
use crate::device::cuda::{free_device_bytes, CudaDevice};
use crate::nn::Weights;
use crate::Error;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone)]
pub struct BevSegBenchArgs {
    pub model: PathBuf,
    /// None: deterministic random weights (`seed`).
    pub weights: Option<PathBuf>,
    pub seed: u64,
    pub calib: PathBuf,
    /// One JPEG per nuScenes camera, in `NUSCENES_CAMERAS` order.
    pub images: Vec<PathBuf>,
    /// The fusion model's points.
    pub cloud: Option<Vec<Point5>>,
    pub warmup: usize,
    pub iters: usize,
}

/// Median and 90th percentile of `v` (nearest rank; `NaN`, `null` in the JSON, when empty).
fn median_p90(v: &[f64]) -> (f64, f64) {
    Percentiles::of(v).map_or((f64::NAN, f64::NAN), |p| (p.p50, p.p90))
}

/// Runs the benchmark; returns the JSON line.
pub fn run_bench(a: &BevSegBenchArgs) -> Result<String, Error> {
    let cfg = BevSegConfig::load(&a.model)?;
    if a.images.len() != NUSCENES_CAMERAS.len() {
        return Err(Error::InvalidInput(format!("{} images: give the six nuScenes cameras' JPEGs in the order {}", a.images.len(), NUSCENES_CAMERAS.join(", "))));
    }
    let jpegs: Vec<Vec<u8>> = a.images.iter().map(|p| std::fs::read(p).map_err(|e| Error::Io(format!("{}: cannot read: {e}", p.display())))).collect::<Result<_, _>>()?;
    let (w, h) = jpeg_size(&jpegs[0], &DecodeLimits::default()).map_err(|e| Error::InvalidInput(format!("{}: {e}", a.images[0].display())))?;
    let calib = Calibration::load_nuscenes_json(&a.calib, &NUSCENES_CAMERAS, w, h)?;
    let weights = match &a.weights {
        Some(p) => Weights::from_file(p)?,
        None => Weights::from_tensors(&format!("random BEVFusion seg weights (seed {})", a.seed), random_tensors(&cfg, a.seed)?)?,
    };
    let model = BevSegModel::from_weights(&cfg, weights)?;
    let dev = CudaDevice::new(0)?;
    dev.synchronize()?;
    let free0 = free_device_bytes()?;
    let mut gpu = CudaBevSeg::upload(&dev, &model, ConvBackend::Cudnn)?;
    drop(model);
    let refs: Vec<&[u8]> = jpegs.iter().map(Vec::as_slice).collect();
    let cloud = a.cloud.as_deref();
    for _ in 0..a.warmup {
        gpu.forward_jpeg(&dev, &calib, &refs, cloud)?;
    }
    let mut totals = Vec::with_capacity(a.iters);
    let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut cells_on = 0usize;
    let mut lidar = None;
    for _ in 0..a.iters.max(1) {
        let t = Instant::now();
        let out = gpu.forward_jpeg(&dev, &calib, &refs, cloud)?;
        // the masks on the host are the unit of work (upstream's evaluation thresholds at 0.5 too)
        let masks = out.map.masks(0.5);
        totals.push(t.elapsed().as_secs_f64() * 1e3);
        cells_on = masks.iter().map(|&m| m as usize).sum();
        lidar = out.map.lidar.clone();
        for (name, ms) in out.times.0 {
            if !order.contains(&name) {
                order.push(name.clone());
            }
            stages.entry(name).or_default().push(ms);
        }
    }
    dev.synchronize()?;
    let peak_mb = free0.saturating_sub(free_device_bytes()?) as f64 / 1e6;
    let (ms, p90) = median_p90(&totals);
    let mut stage_ms = serde_json::Map::new();
    let mut stage_p90 = serde_json::Map::new();
    for name in &order {
        let (m, p) = median_p90(&stages.remove(name).unwrap_or_default());
        stage_ms.insert(name.clone(), serde_json::json!((m * 1e4).round() / 1e4));
        stage_p90.insert(name.clone(), serde_json::json!((p * 1e4).round() / 1e4));
    }
    let line = serde_json::json!({
        "bench": "bevseg",
        "model": a.model.display().to_string(),
        "kind": cfg.kind.name(),
        "gpu": dev.name.clone(),
        "images": a.images.len(),
        "image_size": [w, h],
        "points": a.cloud.as_ref().map(Vec::len),
        "voxels": lidar.as_ref().map(|l| l.voxels),
        "weights": if a.weights.is_some() { "file" } else { "random" },
        "iters": a.iters.max(1),
        "ms": (ms * 1e4).round() / 1e4,
        "p90_ms": (p90 * 1e4).round() / 1e4,
        "peak_device_mb": (peak_mb * 10.0).round() / 10.0,
        "mask_cells_at_0.5": cells_on,
        "stage_ms": stage_ms,
        "stage_p90_ms": stage_p90,
        "geometry_builds": gpu.geometry_builds(),
        "conv_backend": gpu.conv_backend().name(),
    });
    Ok(line.to_string())
}
