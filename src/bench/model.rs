//! `sptr bench model`: end-to-end segmentation latency (points on the host → preprocessing →
//! network → labels of every point on the host) and device memory, as JSON lines.

use crate::bench::json::{fixed, fixed_opt, line, Fixed};
use crate::bench::percentiles::Percentiles;
use crate::device::Device;
use crate::models::sphereformer::segmenter::Segmenter;
use crate::{Error, Points};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// One benchmarked case.
#[derive(Debug, Clone)]
pub struct ModelBenchRow {
    pub case: String,
    pub device: Device,
    pub points: usize,
    pub voxels: usize,
    pub iters: usize,
    /// `Segmenter::segment` wall time: median and 90th percentile (nearest rank).
    pub ms: f64,
    pub p90_ms: f64,
    /// Median (nearest rank) of each stage (`voxelize`, the network's stages, `devoxelize`).
    pub stage_ms: BTreeMap<String, f64>,
    /// Device memory a frame needs beyond the loaded model (CUDA only).
    pub frame_peak_mb: Option<f64>,
    /// The CUDA model's `precision` setting (`None` on the CPU).
    pub precision: Option<crate::device::storage::Precision>,
    /// What the last timed frame was computed in (`None` on the CPU).
    pub storage: Option<crate::device::storage::Storage>,
    /// Frames `auto` computed again in FP32 (warm-up included; 0 unless `auto` met a frame out
    /// of FP16's range).
    pub recomputed_frames: u64,
}

/// The JSON of a [`ModelBenchRow`], keys in this order; times to 0.0001 ms, memory to 0.1 MB.
#[derive(Serialize)]
struct ModelRowJson<'a> {
    bench: &'static str,
    case: &'a str,
    /// `Cuda` or `Cpu`.
    device: String,
    precision: Option<&'static str>,
    storage: Option<&'static str>,
    recomputed_frames: u64,
    points: usize,
    voxels: usize,
    iters: usize,
    #[serde(serialize_with = "fixed::<4, _>")]
    ms: f64,
    #[serde(serialize_with = "fixed::<4, _>")]
    p90_ms: f64,
    #[serde(serialize_with = "fixed_opt::<1, _>")]
    frame_peak_mb: Option<f64>,
    stage_ms: BTreeMap<&'a str, Fixed<4>>,
}

impl ModelBenchRow {
    pub fn json(&self) -> String {
        line(&ModelRowJson {
            bench: "model",
            case: &self.case,
            device: format!("{:?}", self.device),
            precision: self.precision.map(|p| p.name()),
            storage: self.storage.map(|s| s.name()),
            recomputed_frames: self.recomputed_frames,
            points: self.points,
            voxels: self.voxels,
            iters: self.iters,
            ms: self.ms,
            p90_ms: self.p90_ms,
            frame_peak_mb: self.frame_peak_mb,
            stage_ms: self.stage_ms.iter().map(|(k, v)| (k.as_str(), Fixed(*v))).collect(),
        })
    }
}

/// Runs `seg.segment(clouds)` `warmup + iters` times; the frame's device memory is the pool's
/// high-water mark over the timed runs (the pool is trimmed first and keeps what frames free).
pub fn bench_segment(seg: &Segmenter, case: &str, clouds: &[&Points], warmup: usize, iters: usize) -> Result<ModelBenchRow, Error> {
    for _ in 0..warmup {
        seg.segment(clouds)?;
    }
    #[cfg(feature = "cuda-core")]
    let before = match seg.cuda_device() {
        Some(dev) => {
            dev.trim_pool()?;
            Some(crate::device::cuda::free_device_bytes()?)
        }
        None => None,
    };
    let mut totals = Vec::with_capacity(iters);
    let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut voxels = 0;
    let mut storage = None;
    for _ in 0..iters.max(1) {
        let t = Instant::now();
        let out = seg.segment(clouds)?;
        totals.push(t.elapsed().as_secs_f64() * 1e3);
        voxels = out.voxels;
        storage = out.storage;
        for (name, d) in &out.times.stages {
            stages.entry(name.clone()).or_default().push(d.as_secs_f64() * 1e3);
        }
    }
    #[cfg(feature = "cuda-core")]
    let frame_peak_mb = match (before, seg.cuda_device()) {
        (Some(b), Some(dev)) => {
            dev.synchronize()?;
            Some(b.saturating_sub(crate::device::cuda::free_device_bytes()?) as f64 / 1e6)
        }
        _ => None,
    };
    #[cfg(not(feature = "cuda-core"))]
    let frame_peak_mb = None;
    #[cfg(feature = "cuda-core")]
    let status = seg.precision_status();
    #[cfg(feature = "cuda-core")]
    let (precision, recomputed_frames) = (status.map(|s| s.precision), status.map_or(0, |s| s.recomputed_frames));
    #[cfg(not(feature = "cuda-core"))]
    let (precision, recomputed_frames) = (None, 0);
    let total = Percentiles::of(&totals);
    let stage_ms = stages.into_iter().map(|(k, v)| (k, Percentiles::median(&v))).collect();
    Ok(ModelBenchRow {
        case: case.to_string(),
        device: seg.device(),
        points: clouds.iter().map(|c| c.len()).sum(),
        voxels,
        iters: iters.max(1),
        ms: total.as_ref().map_or(f64::NAN, |p| p.p50),
        p90_ms: total.as_ref().map_or(f64::NAN, |p| p.p90),
        stage_ms,
        frame_peak_mb,
        precision,
        storage,
        recomputed_frames,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row parses back with its keys in the order the line has always had them.
    #[test]
    fn the_row_is_json_with_its_keys_in_order() {
        let row = ModelBenchRow {
            case: "nuscenes".into(),
            device: Device::Cuda,
            points: 34688,
            voxels: 20000,
            iters: 20,
            ms: 12.345678,
            p90_ms: 13.0,
            stage_ms: BTreeMap::from([("voxelize".to_string(), 0.5), ("devoxelize".to_string(), 0.25)]),
            frame_peak_mb: Some(250.06),
            precision: Some(crate::device::storage::Precision::Auto),
            storage: Some(crate::device::storage::Storage::Fp16),
            recomputed_frames: 0,
        };
        let text = row.json();
        let keys = [
            "bench", "case", "device", "precision", "storage", "recomputed_frames", "points", "voxels", "iters", "ms", "p90_ms",
            "frame_peak_mb", "stage_ms",
        ];
        let v = crate::bench::json::parse_row(&text, &keys);
        assert_eq!((v["bench"].as_str(), v["device"].as_str(), v["precision"].as_str()), (Some("model"), Some("Cuda"), Some("auto")));
        assert_eq!(v["ms"].as_f64(), Some(12.3457));
        assert_eq!(v["frame_peak_mb"].as_f64(), Some(250.1));
        assert!(text.contains(r#""stage_ms":{"devoxelize":0.25,"voxelize":0.5}"#), "{text}");
        let cpu = ModelBenchRow { device: Device::Cpu, frame_peak_mb: None, precision: None, storage: None, ..row };
        let v: serde_json::Value = serde_json::from_str(&cpu.json()).unwrap();
        assert!(v["frame_peak_mb"].is_null() && v["precision"].is_null() && v["storage"].is_null(), "{v}");
        assert_eq!(v["device"], "Cpu");
    }
}
