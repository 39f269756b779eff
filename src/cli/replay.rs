//! `sptr replay`: a rosbag2 bag's LiDAR frames through the segmentation pipeline
//! ([`crate::replay::run`] does the work); this prints where the results are and sets the exit
//! status.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::args::{precision_arg, progress_mode};
use super::device::DeviceArg;
use super::status::OutOfRange;
use crate::device::storage::Precision;
use crate::replay::{LabelSource, ReplayOutcome, ReplayRequest, Shard, WeightsSource};

#[derive(clap::Args)]
pub struct ReplayArgs {
    /// Bag directory (with metadata.yaml), its metadata.yaml, or a single .mcap file.
    bag: PathBuf,
    /// Model YAML (`config/models/sphereformer_*.yaml`).
    #[arg(long)]
    model: PathBuf,
    /// safetensors weights with the upstream state_dict names.
    #[arg(long, required_unless_present = "random_weights", conflicts_with = "random_weights")]
    weights: Option<PathBuf>,
    /// Untrained deterministic random weights with this seed instead of --weights (smoke
    /// runs: real timings, meaningless labels).
    #[arg(long, value_name = "SEED")]
    random_weights: Option<u64>,
    #[command(flatten)]
    device: DeviceArg,
    /// LiDAR PointCloud2 topic (default: the --params file's topics.input_points when it is not
    /// the node's default; else /sptr/input/points, else the bag's only PointCloud2 topic).
    #[arg(long)]
    lidar_topic: Option<String>,
    /// Ground truth: a PointCloud2 topic with a `label` (or `class_id`) field, point by point
    /// with the LiDAR cloud of the same header stamp.
    #[arg(long, conflicts_with = "labels_dir")]
    labels_topic: Option<String>,
    /// Ground truth: SemanticKITTI `.label` files, frame i (from 0) in `{i:06}.label`.
    #[arg(long)]
    labels_dir: Option<PathBuf>,
    /// Label map YAML (SemanticKITTI `learning_map` form; `semantic-kitti.yaml` works as is).
    #[arg(long)]
    label_map: Option<PathBuf>,
    /// Learning id not evaluated (default: the map's `ignore_index` or 0; 255 without a map).
    #[arg(long)]
    ignore: Option<u32>,
    /// Node params file whose `bev` section sets the BEV grid and its frame (default: the
    /// node's defaults, config/perception.yaml, made for the SemanticKITTI model; for the
    /// nuScenes model: config/perception_nuscenes.yaml). With `input.cameras` set (e.g.
    /// config/perception_nuscenes_cameras.yaml) the cameras are read from the bag and
    /// synchronised as the node does (cameras.json).
    #[arg(long)]
    params: Option<PathBuf>,
    /// Output directory (bag/, report.json, report.md, plots, bev/).
    #[arg(long, default_value = "replay_out")]
    out: PathBuf,
    /// Frame indices (of this shard's frames) whose BEV grid is also written as PNG, e.g. 0,10,20.
    #[arg(long, value_delimiter = ',')]
    bev_png_frames: Vec<u64>,
    /// Process frames with index % n == i only (merge shards with `sptr eval merge`).
    #[arg(long, default_value = "0/1")]
    shard: Shard,
    /// Progress on stderr: auto (bar on a terminal, lines otherwise), plain, quiet.
    #[arg(long, default_value = "auto", value_parser = ["auto", "plain", "quiet"])]
    progress: String,
    /// Exit 0 even when frames' activations left the FP16 range (default: exit status 4 after
    /// writing the report, which lists them).
    #[arg(long)]
    allow_overflow: bool,
    /// CUDA activation storage: fp16, bf16, fp32 or auto (FP16, switching to FP32 for good when a
    /// frame leaves FP16's range; docs/precision.md). Default: the model YAML's `precision`.
    #[arg(long, value_parser = precision_arg)]
    precision: Option<Precision>,
    /// BEV map model YAML instead of the params file's camera.model_config (needs --params with
    /// cameras).
    #[arg(long)]
    camera_model: Option<PathBuf>,
    /// BEV map model weights instead of camera.model_weights: a safetensors file, or
    /// random:SEED for untrained deterministic weights.
    #[arg(long)]
    camera_weights: Option<String>,
    /// Directory of BEV map ground-truth masks, <frame index, 6 digits>.npy, float32
    /// [classes, nx, ny] (docs/cameras.md, "Map ground truth"): per-class IoU and mIoU in the report.
    #[arg(long)]
    map_ground_truth: Option<PathBuf>,
}

/// The library does the work; this prints where the results are.
pub fn command(a: ReplayArgs) -> Result<()> {
    let allow_overflow = a.allow_overflow;
    let req = request(a)?;
    let outcome = crate::replay::run(&req).map_err(|e| anyhow::anyhow!("{e}"))?;
    print_outcome(&outcome.report, &outcome.out);
    print_cameras(&outcome);
    status(&outcome, allow_overflow)
}

/// What the arguments ask of [`crate::replay::run`].
fn request(a: ReplayArgs) -> Result<ReplayRequest> {
    let weights = match (a.weights, a.random_weights) {
        (Some(w), _) => WeightsSource::File(w),
        (None, Some(seed)) => WeightsSource::Random(seed),
        (None, None) => anyhow::bail!("pass --weights FILE (or --random-weights SEED for an untrained smoke run)"),
    };
    Ok(ReplayRequest {
        bag: a.bag,
        model: a.model,
        weights,
        device: a.device.device,
        lidar_topic: a.lidar_topic,
        labels: a.labels_topic.map(LabelSource::Topic).or(a.labels_dir.map(LabelSource::Dir)),
        label_map: a.label_map,
        ignore: a.ignore,
        params: a.params,
        out: a.out,
        bev_png_frames: a.bev_png_frames,
        camera_model: a.camera_model,
        camera_weights: a.camera_weights,
        map_ground_truth: a.map_ground_truth,
        shard: a.shard,
        progress: progress_mode(&a.progress),
        precision: a.precision,
    })
}

/// The camera branch's and the BEV map model's summary on stderr.
fn print_cameras(outcome: &ReplayOutcome) {
    for c in &outcome.cameras {
        let why: Vec<String> = c.masked_by.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join(", ")) };
        eprintln!("camera {}: used in {} frame(s), masked in {}{why}", c.name, c.used, c.masked);
    }
    if !outcome.cameras.is_empty() {
        eprintln!("cameras: {}", outcome.out.join(crate::replay::cameras::CAMERAS_FILE).display());
    }
    if let Some((made, failed)) = outcome.bev_maps {
        eprintln!("BEV maps: {made} made, {failed} failed (cameras.json lists each frame's, report.md the last failure)");
    }
    if let Some(m) = &outcome.map_metrics {
        let per: Vec<String> = m.classes.iter().map(|c| format!("{} {:.3}", c.name, c.max)).collect();
        eprintln!("BEV map: mIoU {:.4} over {} frame(s) ({})", m.miou, m.frames, per.join(", "));
    }
    if !outcome.bev_png_missing.is_empty() {
        eprintln!(
            "sptr: warning: no BEV PNG for --bev-png-frames {:?}: those frames were skipped or not in the bag (see {})",
            outcome.bev_png_missing,
            outcome.out.join("report.md").display()
        );
    }
}

/// The replay's verdict: frames out of the FP16 range (status 4), every frame skipped, every
/// map failed or a damaged bag (status 1), else success.
fn status(outcome: &ReplayOutcome, allow_overflow: bool) -> Result<()> {
    let report_md = outcome.out.join("report.md");
    // Frames out of the FP16 range (status 4) before "every frame skipped" (1): dropped frames
    // out of range are skipped too, and this names why; a damaged bag keeps its status 1.
    let oor = &outcome.report.out_of_range;
    if let (Some(first), None) = (oor.first(), &outcome.damage) {
        let msg = format!(
            "{} frame(s) left the FP16 range (first: frame {}, {}); the report ({}) lists them",
            oor.len(),
            first.frame,
            first.layers.first().map_or("?", String::as_str),
            report_md.display()
        );
        if !allow_overflow {
            return Err(OutOfRange(msg).into());
        }
        eprintln!("sptr: warning: {msg} (--allow-overflow)");
    }
    let f = &outcome.report.frames;
    if f.total > 0 && f.skipped == f.total {
        let why = outcome.report.skipped.first().map_or(String::new(), |s| format!("; the first: {}", s.reason));
        anyhow::bail!(
            "every one of the {} LiDAR frames was skipped, none segmented{why}; the report ({}) lists them all",
            f.total,
            report_md.display()
        );
    }
    // A map model that made no map of any frame it ran on (every forward failed) fails the
    // replay, as LiDAR frames that were all skipped do.
    if let Some((0, failed @ 1..)) = outcome.bev_maps {
        anyhow::bail!(
            "the BEV map model failed on every one of the {failed} frames it ran on, no map was made; cameras.json and the report ({}) say why",
            report_md.display()
        );
    }
    if let Some(d) = &outcome.damage {
        anyhow::bail!(
            "the bag is damaged after {} LiDAR frames: {}; the report ({}) covers the frames before it",
            d.frames_before,
            d.error,
            report_md.display()
        );
    }
    Ok(())
}

/// A replay's (or merged shards') summary on stdout.
pub fn print_outcome(r: &crate::eval::Report, out: &Path) {
    let f = &r.frames;
    println!("frames: {} of {} replayed, {} evaluated, {} without ground truth, {} skipped", f.total - f.skipped, f.in_bag, f.evaluated, f.no_ground_truth, f.skipped);
    if !r.out_of_range.is_empty() {
        println!("out of the FP16 range: {} frame(s), labels not to be trusted (listed in the report)", r.out_of_range.len());
    }
    if let Some(m) = &r.metrics {
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.2} %", 100.0 * v));
        println!("mIoU {}  accuracy {}  ({} points)", pct(m.miou), pct(m.accuracy), m.points_evaluated);
    }
    if let Some(e) = &r.latency_ms.end_to_end {
        println!("latency end to end: p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  max {:.1} ms", e.p50_ms, e.p90_ms, e.p99_ms, e.max_ms);
    }
    if let Some(fps) = r.throughput.frames_per_s {
        println!("throughput: {fps:.2} frames/s");
    }
    println!("report: {}", out.join("report.md").display());
}
