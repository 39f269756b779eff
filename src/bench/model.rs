//! `sptr bench model`: end-to-end segmentation latency (points on the host → preprocessing →
//! network → labels of every point on the host) and device memory, as JSON lines.

use crate::device::Device;
use crate::models::sphereformer::segmenter::Segmenter;
use crate::{Error, Points};
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
    /// `Segmenter::segment` wall time: median and 90th percentile.
    pub ms: f64,
    pub p90_ms: f64,
    /// Median of each stage (`voxelize`, the network's stages, `devoxelize`).
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

impl ModelBenchRow {
    pub fn json(&self) -> String {
        let opt = |v: Option<f64>| v.map(|m| format!("{m:.1}")).unwrap_or_else(|| "null".into());
        let stages: Vec<String> = self.stage_ms.iter().map(|(k, v)| format!("\"{k}\":{v:.4}")).collect();
        let name = |v: Option<&str>| v.map(|s| format!("\"{s}\"")).unwrap_or_else(|| "null".into());
        format!(
            "{{\"bench\":\"model\",\"case\":\"{}\",\"device\":\"{:?}\",\"precision\":{},\"storage\":{},\"recomputed_frames\":{},\"points\":{},\"voxels\":{},\"iters\":{},\"ms\":{:.4},\"p90_ms\":{:.4},\"frame_peak_mb\":{},\"stage_ms\":{{{}}}}}",
            self.case,
            self.device,
            name(self.precision.map(|p| p.name())),
            name(self.storage.map(|s| s.name())),
            self.recomputed_frames,
            self.points,
            self.voxels,
            self.iters,
            self.ms,
            self.p90_ms,
            opt(self.frame_peak_mb),
            stages.join(",")
        )
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// Runs `seg.segment(clouds)` `warmup + iters` times; the frame's device memory is the pool's
/// high-water mark over the timed runs (the pool is trimmed first and keeps what frames free).
pub fn bench_segment(seg: &Segmenter, case: &str, clouds: &[&Points], warmup: usize, iters: usize) -> Result<ModelBenchRow, Error> {
    for _ in 0..warmup {
        seg.segment(clouds)?;
    }
    #[cfg(feature = "cuda")]
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
    #[cfg(feature = "cuda")]
    let frame_peak_mb = match (before, seg.cuda_device()) {
        (Some(b), Some(dev)) => {
            dev.synchronize()?;
            Some(b.saturating_sub(crate::device::cuda::free_device_bytes()?) as f64 / 1e6)
        }
        _ => None,
    };
    #[cfg(not(feature = "cuda"))]
    let frame_peak_mb = None;
    #[cfg(feature = "cuda")]
    let status = seg.precision_status();
    #[cfg(feature = "cuda")]
    let (precision, recomputed_frames) = (status.map(|s| s.precision), status.map_or(0, |s| s.recomputed_frames));
    #[cfg(not(feature = "cuda"))]
    let (precision, recomputed_frames) = (None, 0);
    totals.sort_by(f64::total_cmp);
    let stage_ms = stages
        .into_iter()
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            (k, quantile(&v, 0.5))
        })
        .collect();
    Ok(ModelBenchRow {
        case: case.to_string(),
        device: seg.device(),
        points: clouds.iter().map(|c| c.len()).sum(),
        voxels,
        iters: iters.max(1),
        ms: quantile(&totals, 0.5),
        p90_ms: quantile(&totals, 0.9),
        stage_ms,
        frame_peak_mb,
        precision,
        storage,
        recomputed_frames,
    })
}
