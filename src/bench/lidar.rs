//! The LiDAR half of `sptr bench pipeline`: the node's frame processor on one cloud body,
//! timed frame after frame, and the JSON row it prints.

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::bench::json::{line, Fixed, InOrder};
use crate::bench::percentiles::Percentiles;
use crate::frame::processor::{bev_params, ms, Processor, Rejected, STAGES};
use crate::device::Device;
use crate::msgs::cloud::{self, CloudBuf};

/// The JSON row of `sptr bench pipeline` (`"bench":"pipeline"`).
#[derive(Debug, Clone, Serialize)]
pub struct PipelineRow {
    pub bench: &'static str,
    pub device: String,
    pub points: usize,
    pub voxels: usize,
    pub warmup: usize,
    /// The whole frame's latency (`null` without frames).
    pub latency: Option<Percentiles>,
    /// The median of each of [`STAGES`], ms to 0.001, in that order.
    pub stage_p50_ms: InOrder<&'static str, Fixed<3>>,
    /// What ran: the model file, the weights and the cloud (from [`bench_pipeline`]).
    #[serde(flatten)]
    pub inputs: Option<PipelineInputs>,
}

/// The files `sptr bench pipeline` ran on.
#[derive(Debug, Clone, Serialize)]
pub struct PipelineInputs {
    pub model: String,
    pub weights: String,
    pub cloud: String,
}

/// `sptr bench pipeline`: the node's frame processing without ROS, `frames` times on one cloud
/// body (after `warmup` untimed frames). Returns the row: the device, points, voxels, latency
/// percentiles of the whole frame, and the median of each stage.
pub fn bench(
    proc_: &mut Processor,
    body: &CloudBuf,
    warmup: usize,
    frames: usize,
) -> Result<PipelineRow, Rejected> {
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
    Ok(PipelineRow {
        bench: "pipeline",
        device: proc_.device_name().to_string(),
        points,
        voxels,
        warmup,
        latency: Percentiles::of(&total),
        stage_p50_ms: STAGES.iter().zip(&per_stage).map(|(n, v)| (*n, Fixed(Percentiles::of(v).map_or(0.0, |p| p.p50)))).collect(),
        inputs: None,
    })
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

/// `sptr bench pipeline`: [`open_bench`], then [`bench`]; the row as one JSON line.
pub fn bench_pipeline(b: &BenchSetup) -> Result<String, String> {
    let mut l = open_bench(b)?;
    let mut row = bench(&mut l.processor, &l.body, b.warmup, b.frames)
        .map_err(|e| format!("the cloud was rejected: {e}"))?;
    row.inputs = Some(PipelineInputs {
        model: l.model_path.display().to_string(),
        weights: l.weights,
        cloud: b.cloud.display().to_string(),
    });
    Ok(line(&row))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::json::parse_row;

    /// The row's keys, in the order the line has always had them; names with quotes escaped.
    #[test]
    fn the_row_is_json_with_its_keys_in_order() {
        let mut row = PipelineRow {
            bench: "pipeline",
            device: "cpu".into(),
            points: 100,
            voxels: 40,
            warmup: 2,
            latency: Percentiles::of(&[10.0, 12.0, 11.0]),
            stage_p50_ms: STAGES.iter().map(|n| (*n, Fixed(1.23456))).collect(),
            inputs: None,
        };
        let v = parse_row(&line(&row), &["bench", "device", "points", "voxels", "warmup", "latency", "stage_p50_ms"]);
        assert_eq!(v["bench"], "pipeline");
        assert_eq!(v["latency"]["p50_ms"].as_f64(), Some(11.0));
        assert_eq!(v["stage_p50_ms"][STAGES[0]].as_f64(), Some(1.235));
        row.inputs = Some(PipelineInputs { model: "m.yaml".into(), weights: "random (seed 1)".into(), cloud: "a\"b.bin".into() });
        let text = line(&row);
        let v = parse_row(&text, &["bench", "device", "points", "voxels", "warmup", "latency", "stage_p50_ms", "model", "weights", "cloud"]);
        assert!(text.starts_with(r#"{"bench":"pipeline","device":"cpu","points":100,"voxels":40,"warmup":2,"latency":{"n":3,"#), "{text}");
        assert!(text.ends_with(r#","model":"m.yaml","weights":"random (seed 1)","cloud":"a\"b.bin"}"#), "{text}");
        let stages = text.find("stage_p50_ms").unwrap();
        let order: Vec<usize> = STAGES.iter().map(|n| text[stages..].find(&format!("\"{n}\"")).unwrap()).collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "stages in their order: {text}");
        assert_eq!(v["cloud"], "a\"b.bin");
    }
}
