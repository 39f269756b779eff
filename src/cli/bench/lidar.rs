//! `sptr bench host`, `bench pipeline` and `bench model`: the host probe, the node's per-frame
//! work without ROS, and SphereFormer end to end.

use std::path::PathBuf;

use anyhow::{Context, Result};

use crate::cli::args::{duration_arg, int_in, precision_arg, rate_arg};
use crate::cli::device::{resolve, DeviceArg, DeviceParser};
use crate::cli::inputs::{load_model, read_cloud_arg};
use crate::device::DeviceChoice;
use crate::models::sphereformer::segmenter::Segmenter;

#[derive(clap::Args)]
pub struct HostArgs {
    /// Seconds to probe.
    #[arg(long, default_value_t = 30.0, value_parser = duration_arg)]
    duration_s: f64,
}

pub fn host(a: HostArgs) -> Result<()> {
    println!("{}", crate::bench::host_probe::bench_alone(std::time::Duration::from_secs_f64(a.duration_s)));
    Ok(())
}

#[derive(clap::Args)]
pub struct PipelineArgs {
    /// KITTI `.bin`, nuScenes `.pcd.bin` or `.pcd` cloud.
    cloud: PathBuf,
    /// Model YAML (default: the params file's `model.config`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// safetensors weights (default: deterministic random weights, the same compute).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// The node's params file (BEV range, resolution, obstacle classes).
    #[arg(long, default_value = "config/perception.yaml")]
    params: PathBuf,
    /// cpu, cuda or auto (as the node's `device` parameter).
    #[arg(long, default_value = "cpu", value_parser = DeviceParser::PLAIN)]
    device: DeviceChoice,
    /// Timed frames (1 to 1,000,000).
    #[arg(long, default_value_t = 200, value_parser = int_in::<1, 1_000_000>)]
    frames: usize,
    /// Untimed frames first (0 to 10,000).
    #[arg(long, default_value_t = 3, value_parser = int_in::<0, 10_000>)]
    warmup: usize,
    /// Also the cameras and the BEV map: per frame the --bag's camera messages
    /// (re-stamped to the cloud) through the node's camera branch, the BEV map model and the
    /// map messages' encoding; needs --params with input.cameras (JSON `pipeline_cameras`).
    #[arg(long)]
    cameras: bool,
    /// With --cameras: the bag holding one image and CameraInfo per camera.
    #[arg(long, default_value = "tests/data/bags/nuscenes_sample", requires = "cameras")]
    bag: PathBuf,
    /// With --cameras: overrides the params' camera.model_config (BEVFusion seg model YAML).
    #[arg(long, requires = "cameras")]
    camera_model: Option<PathBuf>,
    /// With --cameras: overrides camera.model_weights: safetensors file or random:SEED.
    #[arg(long, requires = "cameras")]
    camera_weights: Option<String>,
    /// With --cameras: frames paced at this rate (with --duration-s; replaces --frames); a
    /// frame ending after the next tick counts in `frames_over_period`.
    #[arg(long, requires_all = ["cameras", "duration_s"], value_parser = rate_arg)]
    rate_hz: Option<f64>,
    /// With --rate-hz: seconds of paced frames.
    #[arg(long, requires = "rate_hz", value_parser = duration_arg)]
    duration_s: Option<f64>,
    /// With --cameras: the camera frame after the LiDAR path on one thread, not beside it as
    /// the node runs it (the anchor for the overlap's gain; JSON `overlap: false`).
    #[arg(long, requires = "cameras")]
    serial: bool,
    /// With --rate-hz: a fault every this many seconds (more than 3.5), the kinds in turn: a
    /// camera silent for 3 s, a stamp collision, a corrupt JPEG, a calibration change, three
    /// 3-million-point clouds; JSON `faults` says what was injected and counted.
    #[arg(long, requires = "rate_hz", value_parser = duration_arg)]
    faults_every_s: Option<f64>,
    /// With --cameras on CUDA: the BEV map model's network replayed as a CUDA graph (captured
    /// on the first frame; the stage `network (CUDA graph)` shows it ran; JSON `camera_graph`).
    #[arg(long, requires = "cameras")]
    camera_graph: bool,
}

pub fn pipeline(a: PipelineArgs) -> Result<()> {
    let device = resolve(a.device)?.device;
    let setup = crate::bench::lidar::BenchSetup {
        cloud: &a.cloud,
        model: a.model.as_deref(),
        weights: a.weights.as_deref(),
        params: &a.params,
        device,
        warmup: a.warmup,
        frames: a.frames,
    };
    if a.cameras {
        let s = crate::bench::pipeline::CameraBenchSetup {
            lidar: setup,
            bag: &a.bag,
            camera_model: a.camera_model.as_deref(),
            camera_weights: a.camera_weights.as_deref(),
            pace: a.rate_hz.zip(a.duration_s),
            serial: a.serial,
            faults_every_s: a.faults_every_s,
            camera_graph: a.camera_graph,
        };
        println!("{}", crate::bench::pipeline::run(&s).map_err(anyhow::Error::msg)?);
        return Ok(());
    }
    println!("{}", crate::bench::lidar::bench_pipeline(&setup).map_err(anyhow::Error::msg)?);
    Ok(())
}

#[derive(clap::Args)]
pub struct ModelArgs {
    /// KITTI `.bin`, nuScenes `.pcd.bin` or `.pcd` cloud (--format for others).
    cloud: PathBuf,
    /// Cloud layout as for `segment` (kitti, nuscenes, xyz, pcd); default from the name.
    #[arg(long)]
    format: Option<String>,
    /// Model YAML to run.
    #[arg(long, default_value = "config/models/sphereformer_semantickitti.yaml")]
    model: PathBuf,
    /// safetensors weights; default: deterministic random weights (--seed).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Seed of the random weights used without --weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[command(flatten)]
    device: DeviceArg,
    /// Timed repetitions after 3 warm-up runs (median and p90 reported).
    #[arg(long, default_value_t = 20, value_parser = int_in::<1, 1_000_000>)]
    iters: usize,
    /// Case name in the JSON (default: the cloud's file name).
    #[arg(long)]
    case: Option<String>,
    /// CUDA precisions to time side by side, e.g. fp16,bf16,fp32,auto: the models are loaded
    /// together and timed in turn, `--rounds` times (one JSON line each, with `precision`
    /// and the `storage` the frames ran in). Default: the model YAML's `precision`.
    #[arg(long, value_delimiter = ',', value_parser = precision_arg)]
    precision: Vec<crate::device::storage::Precision>,
    /// Rounds over the precisions (alternating them evens out clocks and heat).
    #[arg(long, default_value_t = 1, value_parser = int_in::<1, 1000>)]
    rounds: usize,
}

/// End-to-end segmentation latency and device memory (JSON line per precision and round).
pub fn model(a: ModelArgs) -> Result<()> {
    let pts = read_cloud_arg(&a.cloud, a.format.as_deref())?;
    let cfg = load_model(&a.model)?.yaml;
    let w = match &a.weights {
        Some(p) => crate::nn::Weights::from_file(p).map_err(|e| anyhow::anyhow!("weights {e}"))?,
        None => crate::models::sphereformer::random::random_weights(&cfg, a.seed).context("making random weights")?,
    };
    let case = a.case.unwrap_or_else(|| a.cloud.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    // every precision's model loaded first (one CPU model, one upload each), then timed in turn
    let base = Segmenter::new(cfg.clone(), w).with_context(|| format!("model {}", a.model.display()))?;
    let list = if a.precision.is_empty() { vec![cfg.precision] } else { a.precision.clone() };
    let device = a.device.resolve()?.device;
    let mut segs = Vec::with_capacity(list.len());
    for p in list {
        let mut seg = base.clone();
        seg.set_precision(p)?;
        segs.push(seg.into_device(device).with_context(|| format!("building the model on {device:?}"))?);
    }
    for _ in 0..a.rounds {
        for seg in &segs {
            let row = crate::bench::model::bench_segment(seg, &case, &[&pts], 3, a.iters)?;
            println!("{}", row.json());
        }
    }
    Ok(())
}
