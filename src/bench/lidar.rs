//! The LiDAR half of `sptr bench pipeline`: the node's frame processor on one cloud body,
//! timed frame after frame, and the JSON row it prints.

use std::path::Path;
use std::time::Instant;

use crate::bench::percentiles::Percentiles;
use crate::frame::processor::{bev_params, ms, Processor, Rejected, STAGES};
use crate::device::Device;
use crate::msgs::cloud::{self, CloudBuf};

/// `sptr bench pipeline`: the node's frame processing without ROS, `frames` times on one cloud
/// body (after `warmup` untimed frames). Returns one JSON object: the device, points, voxels,
/// latency percentiles of the whole frame, and the median of each stage.
pub fn bench(
    proc_: &mut Processor,
    body: &CloudBuf,
    warmup: usize,
    frames: usize,
) -> Result<String, Rejected> {
    let view = body.view();
    for _ in 0..warmup {
        proc_.process(&view)?;
    }
    let mut total = Vec::with_capacity(frames);
    let mut per_stage: Vec<Vec<f64>> = vec![Vec::with_capacity(frames); STAGES.len()];
    let mut last = None;
    for _ in 0..frames.max(1) {
        let t = Instant::now();
        let out = proc_.process(&view)?;
        total.push(ms(t.elapsed()));
        for (i, v) in out.stages.iter().enumerate() {
            per_stage[i].push(*v);
        }
        last = Some((out.points_kept, out.voxels));
    }
    let (points, voxels) = last.unwrap_or((0, 0));
    let stages: Vec<String> = STAGES
        .iter()
        .zip(&per_stage)
        .map(|(n, v)| format!("\"{n}\":{:.3}", Percentiles::of(v).map_or(0.0, |p| p.p50)))
        .collect();
    let lat = Percentiles::of(&total).map_or_else(|| "null".into(), |p| p.json());
    Ok(format!(
        "{{\"bench\":\"pipeline\",\"device\":{},\"points\":{points},\"voxels\":{voxels},\"warmup\":{warmup},\"latency\":{lat},\"stage_p50_ms\":{{{}}}}}",
        json_str(proc_.device_name()),
        stages.join(",")
    ))
}

/// What `sptr bench pipeline` runs on.
pub struct BenchSetup<'a> {
    pub cloud: &'a Path,
    /// None: the params file's `model.config` (relative to the params file, as the node does).
    pub model: Option<&'a Path>,
    /// None: deterministic random weights (the same compute as trained ones).
    pub weights: Option<&'a Path>,
    /// The node's params file, for the BEV grid (`bev.range`, `bev.resolution`,
    /// `bev.obstacle_classes`).
    pub params: &'a Path,
    pub device: Device,
    pub warmup: usize,
    pub frames: usize,
}

/// The LiDAR half of `sptr bench pipeline`, loaded: the frame processor, the cloud body as the
/// node receives it, and what the JSON names (model file, weights, the params file's contents).
pub struct BenchLidar {
    pub processor: Processor,
    pub body: CloudBuf,
    pub model_path: std::path::PathBuf,
    pub weights: String,
    pub params: crate::frame::params::NodeParams,
}

/// Loads what [`bench_pipeline`] runs on: encodes the cloud as the node receives it
/// (`x, y, z, intensity` float32) and opens the processor. Errors name the file or setting at fault.
pub fn open_bench(b: &BenchSetup) -> Result<BenchLidar, String> {
    use crate::sensors::cloud_files::{read_cloud, CloudFormat};
    let node = crate::frame::params::NodeParams::load(b.params).map_err(|e| format!("--params: {e}"))?;
    let model_path = match b.model {
        Some(m) => m.to_path_buf(),
        None => b
            .params
            .parent()
            .unwrap_or(Path::new("."))
            .join(&node.model.config),
    };
    let model = crate::models::sphereformer::config::ModelConfig::load(&model_path)
        .map_err(|e| format!("model: {e}"))?
        .yaml;
    let bev = bev_params(
        &model,
        node.bev.range,
        node.bev.resolution,
        &node.bev.obstacle_classes,
    );
    let fmt = CloudFormat::from_path(b.cloud)
        .ok_or_else(|| format!("{}: not a .bin, .pcd.bin or .pcd cloud", b.cloud.display()))?;
    let pts = read_cloud(b.cloud, fmt).map_err(|e| e.to_string())?; // names the file
    let body = cloud::encode_points(&pts, cloud::Layout::XyzI32)
        .map_err(|e| format!("{}: {e}", b.cloud.display()))?;
    let (processor, weights) = match b.weights {
        Some(w) => (
            Processor::open(b.device, &model, w, bev)?,
            w.display().to_string(),
        ),
        None => {
            let w = crate::models::sphereformer::random::random_weights(&model, 1)
                .map_err(|e| format!("random weights: {e}"))?;
            (
                Processor::with_weights(b.device, &model, w, bev)?,
                "random (seed 1)".to_string(),
            )
        }
    };
    Ok(BenchLidar { processor, body, model_path, weights, params: node })
}

/// `sptr bench pipeline`: [`open_bench`], then [`bench`].
pub fn bench_pipeline(b: &BenchSetup) -> Result<String, String> {
    let mut l = open_bench(b)?;
    let json = bench(&mut l.processor, &l.body, b.warmup, b.frames)
        .map_err(|e| format!("the cloud was rejected: {e}"))?;
    Ok(format!(
        "{},\"model\":{},\"weights\":{},\"cloud\":{}}}",
        &json[..json.len() - 1],
        json_str(&l.model_path.display().to_string()),
        json_str(&l.weights),
        json_str(&b.cloud.display().to_string())
    ))
}

/// `s` as a JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
