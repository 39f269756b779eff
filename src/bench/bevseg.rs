//! `sptr bench bevseg`: a BEVFusion seg model on CUDA, from JPEG bytes on the host to the
//! thresholded masks on the host, per frame: wall time median / p90, each stage's median and
//! p90 (GPU time between events; JPEG decode + upload on the host clock), and the device
//! memory the process holds at its peak (weights, plans, the frame's high-water mark), as one
//! JSON line per model.
//!
//! Then, in the same process, the same frames with the network replayed as a CUDA graph
//! (`graph`: its median and p90, the ratio eager / graph, whether its probabilities have the eager
//! run's bits, and the capture's counts or why it was refused). It runs after the eager frames,
//! so a capture the driver refuses costs none of the eager figures. Then, with nvJPEG, the eager
//! frames with each JPEG's scans checked the other way against the decode (`scan_checks` is the
//! model's default, `before_decode` or `beside_decode`; `scan_checks_other`: the other one's
//! median, p90, and its ratio to the default).

use crate::bench::percentiles::Percentiles;
use crate::models::bevfusion::seg::{random_tensors, BevSegConfig, BevSegModel, BevSegOutput, Point5};
use crate::models::bevfusion::seg_cuda::CudaBevSeg;
use crate::sensors::calib::camera::Calibration;
use crate::sensors::image::compressed::jpeg_size;
use crate::sensors::image::encodings::DecodeLimits;
use crate::sensors::image::jpeg_markers::ScanCheckTiming;
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
    /// The rig's cameras.
    pub calib: Calibration,
    /// One JPEG per camera, in the calibration's order, each of its camera's calibrated size.
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

/// The JPEGs of `images`, one per camera of `calib` in its order, each checked to be its
/// camera's calibrated size (the bench runs on valid frames only: a masked camera would time
/// less work).
fn read_rig_jpegs(calib: &Calibration, images: &[PathBuf]) -> Result<Vec<Vec<u8>>, Error> {
    if images.len() != calib.len() {
        return Err(Error::InvalidInput(format!("{} images for the calibration's {} cameras: give one per camera", images.len(), calib.len())));
    }
    let mut jpegs = Vec::with_capacity(images.len());
    for (path, cam) in images.iter().zip(&calib.cameras) {
        let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("{}: cannot read: {e}", path.display())))?;
        let (w, h) = jpeg_size(&bytes, &DecodeLimits::default()).map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))?;
        if (w, h) != (cam.image_width, cam.image_height) {
            return Err(Error::InvalidInput(format!(
                "{}: {w} x {h}, but camera {} is calibrated for {} x {}: give images of the calibrated size",
                path.display(),
                cam.name,
                cam.image_width,
                cam.image_height
            )));
        }
        jpegs.push(bytes);
    }
    Ok(jpegs)
}

/// Runs the benchmark; returns the JSON line.
pub fn run_bench(a: &BevSegBenchArgs) -> Result<String, Error> {
    let cfg = BevSegConfig::load(&a.model)?;
    let calib = &a.calib;
    let jpegs = read_rig_jpegs(calib, &a.images)?;
    let (w, h) = (calib.cameras[0].image_width, calib.cameras[0].image_height);
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
        gpu.forward_jpeg(&dev, calib, &refs, cloud)?;
    }
    let mut totals = Vec::with_capacity(a.iters);
    let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut cells_on = 0usize;
    let mut lidar = None;
    for _ in 0..a.iters.max(1) {
        let t = Instant::now();
        let out = gpu.forward_jpeg(&dev, calib, &refs, cloud)?;
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
    let graph = graph_timing(&dev, &mut gpu, calib, &refs, cloud, a.warmup, a.iters.max(1), ms);
    let scan_checks = gpu.decodes_jpeg_on_gpu().then(|| gpu.jpeg_scan_checks().name());
    let scan_checks_other = other_scan_checks_timing(&dev, &mut gpu, calib, &refs, cloud, a.warmup, a.iters.max(1), ms);
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
        "cameras": calib.cameras.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
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
        "graph": graph,
        "scan_checks": scan_checks,
        "scan_checks_other": scan_checks_other,
    });
    Ok(line.to_string())
}

/// The eager frames again with the JPEGs' scans checked the other way against the nvJPEG decode
/// (`ScanCheckTiming`: before it where the default is beside it, and the other way round), in
/// the same process: JSON (`null` without nvJPEG, where zune-jpeg's decode walks the scans;
/// `error` when it could not run).
#[allow(clippy::too_many_arguments)]
fn other_scan_checks_timing(dev: &CudaDevice, gpu: &mut CudaBevSeg, calib: &Calibration, refs: &[&[u8]], cloud: Option<&[Point5]>, warmup: usize, iters: usize, default_ms: f64) -> serde_json::Value {
    if !gpu.decodes_jpeg_on_gpu() {
        return serde_json::Value::Null;
    }
    let default = gpu.jpeg_scan_checks();
    let other = match default {
        ScanCheckTiming::BesideDecode => ScanCheckTiming::BeforeDecode,
        ScanCheckTiming::BeforeDecode => ScanCheckTiming::BesideDecode,
    };
    let mut run = || -> Result<serde_json::Value, Error> {
        gpu.set_jpeg_scan_checks(other);
        let totals = timed_frames(dev, gpu, calib, refs, cloud, warmup, iters, |_| ())?;
        let (ms, p90) = median_p90(&totals);
        Ok(serde_json::json!({
            "timing": other.name(),
            "ms": (ms * 1e4).round() / 1e4,
            "p90_ms": (p90 * 1e4).round() / 1e4,
            "other_over_default": (ms / default_ms * 1e3).round() / 1e3,
        }))
    };
    let v = run().unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }));
    gpu.set_jpeg_scan_checks(default);
    v
}

/// `warmup` untimed frames (at least one), then `iters` timed ones, JPEG bytes to masks on the
/// host (ms each); `each` sees every timed frame's output after its clock stopped.
#[allow(clippy::too_many_arguments)]
fn timed_frames(dev: &CudaDevice, gpu: &mut CudaBevSeg, calib: &Calibration, refs: &[&[u8]], cloud: Option<&[Point5]>, warmup: usize, iters: usize, mut each: impl FnMut(&BevSegOutput)) -> Result<Vec<f64>, Error> {
    for _ in 0..warmup.max(1) {
        gpu.forward_jpeg(dev, calib, refs, cloud)?;
    }
    let mut totals = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let out = gpu.forward_jpeg(dev, calib, refs, cloud)?;
        let _masks = out.map.masks(0.5);
        totals.push(t.elapsed().as_secs_f64() * 1e3);
        each(&out);
    }
    Ok(totals)
}

/// The frames again with the network as a CUDA graph: JSON (`error` instead of the times when it
/// could not run).
#[allow(clippy::too_many_arguments)]
fn graph_timing(dev: &CudaDevice, gpu: &mut CudaBevSeg, calib: &Calibration, refs: &[&[u8]], cloud: Option<&[Point5]>, warmup: usize, iters: usize, eager_ms: f64) -> serde_json::Value {
    let mut run = || -> Result<serde_json::Value, Error> {
        gpu.set_graphs(false);
        let eager = gpu.forward_jpeg(dev, calib, refs, cloud)?.map.probabilities;
        // whether the eager path itself repeats its bits (cuDNN's chosen algorithms may not)
        let eager_repeats = gpu.forward_jpeg(dev, calib, refs, cloud)?.map.probabilities.iter().map(|v| v.to_bits()).eq(eager.iter().map(|v| v.to_bits()));
        gpu.set_graphs(true);
        let mut same_bits = true;
        let totals = timed_frames(dev, gpu, calib, refs, cloud, warmup, iters, |out| {
            same_bits &= out.map.probabilities.iter().map(|v| v.to_bits()).eq(eager.iter().map(|v| v.to_bits()));
        })?;
        let st = gpu.graph_status().clone();
        gpu.set_graphs(false);
        let (ms, p90) = median_p90(&totals);
        Ok(serde_json::json!({
            "replays": st.replays,
            "captures": st.captures,
            "refused": st.refused,
            "refusal": st.last_refusal,
            "ms": (ms * 1e4).round() / 1e4,
            "p90_ms": (p90 * 1e4).round() / 1e4,
            "eager_over_graph": if st.replays > 0 { serde_json::json!((eager_ms / ms * 1e3).round() / 1e3) } else { serde_json::Value::Null },
            "same_bits_as_eager": same_bits,
            "eager_repeats_its_bits": eager_repeats,
        }))
    };
    run().unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }))
}
