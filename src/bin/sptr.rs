//! `sptr`: the command-line tool. Subcommands: `voxelize` (a cloud file -> voxel summary),
//! `kernels` (compile every CUDA kernel with NVRTC), `bench voxelize` (JSON timings), `info`,
//! `bag info`, `replay` (rosbag2 replay with evaluation), `eval merge` (shards into one report),
//! `segment`, `prepare`, `random-weights` (deterministic untrained weights for a model YAML) and
//! `bevseg` (BEVFusion BEV map segmentation of one frame).

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use sptr::models::sphereformer::config::ModelConfig;
use sptr::ops::voxelize::cpu::{voxelize_cpu, VoxelParams, Voxels};
use sptr::Points;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser)]
#[command(name = "sptr", version, about = "Sparse LiDAR perception: voxelization, sparse conv, window attention")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum DeviceArg {
    /// CUDA when a GPU and this build's CUDA support are there, else CPU.
    Auto,
    Cpu,
    Cuda,
}

// Value parsers for the numeric arguments: every number is range-checked when it is parsed, so
// no value (zero, negative, huge, NaN) reaches the code below; clap prints the error and exits 2.

/// An integer in `LO..=HI`.
fn int_in<const LO: usize, const HI: usize>(s: &str) -> Result<usize, String> {
    let v: usize = s.trim().parse().map_err(|_| format!("`{s}` is not a whole number from {LO} to {HI}"))?;
    if !(LO..=HI).contains(&v) {
        return Err(format!("{v} is out of range: use {LO} to {HI}"));
    }
    Ok(v)
}

/// A raw image size `WIDTHxHEIGHT`, each side 1 to 16384 pixels.
fn image_size_arg(s: &str) -> Result<(usize, usize), String> {
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(|| format!("`{s}` is not WIDTHxHEIGHT, e.g. 1600x900"))?;
    let side = |v: &str, what: &str| int_in::<1, 16384>(v).map_err(|e| format!("{what} of `{s}`: {e} (pixels)"));
    Ok((side(w, "width")?, side(h, "height")?))
}

/// float32 columns per point in a `.bin` file: at least x, y, z.
fn stride_arg(s: &str) -> Result<usize, String> {
    int_in::<3, 64>(s).map_err(|e| format!("{e} (float32 columns per point: 4 KITTI, 5 nuScenes, 3 x/y/z only)"))
}

/// A voxel size in metres: finite, from 1 mm to 100 m.
fn voxel_size_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number (metres)"))?;
    if !(v.is_finite() && (0.001..=100.0).contains(&v)) {
        return Err(format!("{v} m is not a usable voxel size: use 0.001 to 100 (metres)"));
    }
    Ok(v)
}

/// A memory bandwidth in GB/s: finite, positive, at most 1,000,000.
fn bandwidth_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number (GB/s)"))?;
    if !(v.is_finite() && v > 0.0 && v <= 1e6) {
        return Err(format!("{v} GB/s is not a usable bandwidth: use a positive number up to 1000000"));
    }
    Ok(v)
}

/// A publishing rate in Hz: finite, 0.1 to 1000.
fn rate_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number (Hz)"))?;
    if !(v.is_finite() && (0.1..=1000.0).contains(&v)) {
        return Err(format!("{v} Hz is not a usable rate: use 0.1 to 1000"));
    }
    Ok(v)
}

/// A bench duration in seconds: finite, 0.1 to 86,400.
fn duration_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number (seconds)"))?;
    if !(v.is_finite() && (0.1..=86_400.0).contains(&v)) {
        return Err(format!("{v} s is not a usable duration: use 0.1 to 86400"));
    }
    Ok(v)
}

/// A fraction in [0, 1].
fn fraction_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
        return Err(format!("{v} is not a fraction: use 0 to 1 (e.g. 0.995)"));
    }
    Ok(v)
}

#[derive(Subcommand)]
enum Cmd {
    /// Voxelize a point cloud file (.bin float32 rows) as a model's preprocessing does; print a summary.
    Voxelize {
        /// KITTI (x, y, z, intensity) or nuScenes (x, y, z, intensity, ring) .bin file.
        cloud: PathBuf,
        /// Model YAML whose voxel settings to use.
        #[arg(long, default_value = "config/models/sphereformer_nuscenes.yaml")]
        model: PathBuf,
        /// float32 columns per point: 4 (KITTI), 5 (nuScenes), 3 (x, y, z only).
        #[arg(long, default_value_t = 5, value_parser = stride_arg)]
        stride: usize,
        /// Where to run: auto (the GPU when this build and machine have a usable one, else the CPU), cpu or cuda.
        #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
        device: DeviceArg,
    },
    /// Label every point of a cloud with a SphereFormer model (GPU or CPU): writes a SemanticKITTI
    /// `.label` file (SemanticKITTI raw ids for the SemanticKITTI classes, else class id + 1;
    /// 0 = no voxel) and prints a class histogram and per-stage timings.
    Segment {
        /// KITTI `.bin` (float32 x 4), nuScenes `.pcd.bin` (float32 x 5) or `.pcd` (ascii/binary).
        cloud: PathBuf,
        /// Model YAML (`config/models/sphereformer_*.yaml`).
        #[arg(long)]
        model: PathBuf,
        /// safetensors weights with the upstream state_dict names.
        #[arg(long, required_unless_present = "random_weights", conflicts_with = "random_weights")]
        weights: Option<PathBuf>,
        /// Untrained deterministic random weights with this seed instead of --weights (as
        /// `sptr random-weights` writes them: real timings, meaningless labels).
        #[arg(long, value_name = "SEED")]
        random_weights: Option<u64>,
        /// Where to write the labels (default: none written).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Cloud layout: kitti, nuscenes, xyz (float32 x 3, no intensity) or pcd; default from
        /// the file name (`.pcd`, `.pcd.bin` = nuScenes, other `.bin` = KITTI).
        #[arg(long)]
        format: Option<String>,
        /// Where to run: auto (the GPU when this build and machine have a usable one, else the CPU), cpu or cuda.
        #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
        device: DeviceArg,
        /// Progress of a CPU run on stderr, stage by stage: auto (a bar on a terminal, lines
        /// otherwise, once the run has taken 2 s), plain, quiet.
        #[arg(long, default_value = "auto", value_parser = ["auto", "plain", "quiet"])]
        progress: String,
        /// Write the labels and exit 0 even when the network's activations left the FP16 range
        /// (default: the flagged layers are printed, nothing is written, exit status 4).
        #[arg(long)]
        allow_overflow: bool,
        /// CUDA activation storage: fp16, bf16, fp32 or auto (FP16, switching to FP32 for good when a
        /// frame leaves FP16's range; README: precision). Default: the model YAML's `precision`.
        #[arg(long, value_parser = precision_arg)]
        precision: Option<sptr::device::storage::Precision>,
    },
    /// Run a model's preprocessing on a cloud and write the network inputs (coords.i32, feats.f32,
    /// xyz.f32, batch.i32, inputs.json) for the PyTorch parity reference.
    Prepare {
        /// KITTI `.bin`, nuScenes `.pcd.bin`, float32 x, y, z `.bin` (--format xyz) or `.pcd` cloud.
        cloud: PathBuf,
        /// Cloud layout as for `segment` (kitti, nuscenes, xyz, pcd); default from the name.
        #[arg(long)]
        format: Option<String>,
        /// Model YAML whose preprocessing (voxelization, features) to run.
        #[arg(long)]
        model: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Write deterministic random (untrained) weights for a model YAML (SphereFormer, or a BEVFusion
    /// seg model: `arch: bevfusion_seg`, upstream names) as safetensors, so every
    /// entry point (segment, replay, bench, the node's `model.weights`) runs on a fresh machine:
    /// real timings, meaningless labels. The same model and seed give the same bytes.
    RandomWeights {
        /// Model YAML (`config/models/sphereformer_*.yaml`, `bevfusion_seg_*.yaml`) the weights are for.
        #[arg(long)]
        model: PathBuf,
        /// Seed of the generator (any 64-bit number).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// The safetensors file to write (replaced if it exists).
        #[arg(long)]
        out: PathBuf,
    },
    /// BEVFusion's camera encoder (Swin-T + GeneralizedLSSFPN) on a batch of normalized images:
    /// writes the neck outputs (`neck0.npy` feeds the view transform) and with --stages each
    /// backbone output (`stage{i}.npy`), NCHW float32 like upstream, into --out.
    CameraFeatures {
        /// Camera images (JPEG or PNG), one batch in this order; decoded and preprocessed as the
        /// model YAML says (resize, crop, normalize).
        #[arg(required_unless_present = "input")]
        images: Vec<PathBuf>,
        /// Instead of images: normalized images, float32 NCHW `.npy` `[n, 3, h, w]`.
        #[arg(long, conflicts_with = "images")]
        input: Option<PathBuf>,
        /// Model YAML (reads `model.encoders.camera.backbone` and `.neck`).
        #[arg(long, default_value = "config/models/bevfusion_seg_camera.yaml")]
        model: PathBuf,
        /// safetensors weights with BEVFusion's names: the camera encoder's tensors
        /// (`encoders.camera.backbone.*`, `.neck.*`), alone or in a whole seg checkpoint (the
        /// other tensors are ignored and counted).
        #[arg(long, conflicts_with = "random_weights")]
        weights: Option<PathBuf>,
        /// Deterministic random weights with this seed instead (smoke runs, parity).
        #[arg(long)]
        random_weights: Option<u64>,
        /// Write the random weights as safetensors (for the PyTorch parity reference).
        #[arg(long, requires = "random_weights")]
        save_weights: Option<PathBuf>,
        /// Write the input tensor the encoder consumed (NCHW .npy; FP16-rounded on CUDA).
        #[arg(long)]
        save_input: Option<PathBuf>,
        /// JPEG decoder: cpu (zune-jpeg, CPU preprocessing, the default) or nvjpeg / auto (the
        /// CUDA preprocessing with nvJPEG; JPEG files only; needs the CUDA backend).
        #[arg(long, default_value = "cpu")]
        jpeg_decoder: sptr::sensors::image::compressed::JpegDecoderChoice,
        /// Also write each backbone output.
        #[arg(long)]
        stages: bool,
        /// Where the encoder runs (auto: CUDA when a GPU and this build's CUDA support are there).
        #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
        device: DeviceArg,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// BEVFusion BEV map segmentation (camera-only or camera + LiDAR, from the model YAML) on one
    /// frame: writes the per-class probabilities (`bev_probabilities.f32` + `.json` header, `.npy`)
    /// and `bev_map.png` (classes at --threshold over the LiDAR points) into --out.
    Bevseg {
        /// Model YAML (`config/models/bevfusion_seg_camera.yaml` or `_fusion.yaml`).
        #[arg(long)]
        model: PathBuf,
        /// safetensors weights with BEVFusion's state_dict names (README: from the upstream .pth).
        #[arg(long, required_unless_present = "random_weights", conflicts_with = "random_weights")]
        weights: Option<PathBuf>,
        /// Untrained deterministic random weights with this seed instead (smoke runs, parity).
        #[arg(long, value_name = "SEED")]
        random_weights: Option<u64>,
        /// Also write the random weights as safetensors (for the PyTorch parity reference).
        #[arg(long, requires = "random_weights")]
        save_weights: Option<PathBuf>,
        /// nuScenes-style calib.json (cameras' `cam2img`, `lidar2cam`; intrinsics for
        /// --image-size), or a calibration YAML (.yaml/.yml: `intrinsics` and `image_size` per
        /// camera, as config/calibration/nuscenes_sample.yaml).
        #[arg(long)]
        calib: PathBuf,
        /// The raw image size (WIDTHxHEIGHT) a calib.json's intrinsics are for; default 1600x900
        /// (nuScenes). An image of another size is masked (size_mismatch) with a warning.
        #[arg(long, value_name = "WxH", value_parser = image_size_arg)]
        image_size: Option<(usize, usize)>,
        /// Camera images as CAMERA=FILE (JPEG or PNG), e.g. CAM_FRONT=front.jpg; cameras without
        /// an image, or with one of another size than calibrated, are masked (and reported).
        #[arg(long, required = true, num_args = 1.., value_parser = sptr::cli::bevseg::parse_camera_image)]
        images: Vec<(String, PathBuf)>,
        /// LiDAR cloud (the fusion model needs one): nuScenes `.pcd.bin`, KITTI `.bin` or `.pcd`.
        #[arg(long)]
        cloud: Option<PathBuf>,
        /// Cloud layout as for `segment` (kitti, nuscenes, xyz, pcd); default from the name.
        #[arg(long)]
        format: Option<String>,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Where to run: auto (the GPU when this build and machine have a usable one, else the CPU), cpu or cuda.
        #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
        device: DeviceArg,
        /// Probability at or above which the PNG draws a class.
        #[arg(long, default_value_t = 0.5, value_parser = fraction_arg)]
        threshold: f64,
        /// Also write each stage's tensor (input, camera_bev, lidar_bev, fused, decoder, head) as
        /// NCHW float32 .npy into OUT/stages (the parity harness reads them).
        #[arg(long)]
        dump_stages: bool,
    },
    /// Compile every CUDA kernel with NVRTC for the given architectures (needs libnvrtc, no GPU).
    Kernels {
        /// GPU architectures to compile for, comma-separated (sm_XY).
        #[arg(long, value_delimiter = ',', default_value = "sm_90,sm_87,sm_86")]
        arch: Vec<String>,
    },
    /// Benchmarks with machine-readable JSON output.
    Bench {
        #[command(subcommand)]
        what: BenchCmd,
    },
    /// What this build and machine offer: version, features, GPU, kernels.
    Info,
    /// Rosbag2 bags (MCAP or sqlite3 storage).
    Bag {
        #[command(subcommand)]
        what: BagCmd,
    },
    /// Replay every LiDAR frame of a rosbag2 bag through the segmentation pipeline, in
    /// timestamp order: the node's outputs into OUT/bag (MCAP), a report (JSON, Markdown, PNG
    /// plots) with mIoU when ground truth is given, and per-stage latency.
    Replay(ReplayArgs),
    /// Evaluation reports.
    Eval {
        #[command(subcommand)]
        what: EvalCmd,
    },
}

#[derive(Subcommand)]
enum BagCmd {
    /// Storage, files, duration, topics with types and message counts.
    Info {
        /// Bag directory (with metadata.yaml), its metadata.yaml, or a single .mcap file.
        bag: PathBuf,
        /// Also read every message and count it per topic (checks the bag can be read).
        #[arg(long)]
        count: bool,
    },
}

#[derive(Subcommand)]
enum EvalCmd {
    /// Merge the output directories of `sptr replay --shard i/n` runs into the report a single
    /// run gives.
    Merge {
        /// One `sptr replay --out` directory per shard.
        #[arg(required = true)]
        shard_dirs: Vec<PathBuf>,
        /// Output directory of the merged report (report.json, report.md, plots, eval_state.json).
        #[arg(long)]
        out: PathBuf,
    },
    /// Fraction of points two replays (e.g. --device cpu and --device cuda) gave the same
    /// class, per frame and overall, from their output bags; with BEV maps in both, the fraction
    /// of map cells × classes with the same thresholded value and the largest probability gap.
    Agreement {
        /// The first `sptr replay --out` directory (or its `bag/`).
        a: PathBuf,
        /// The second `sptr replay --out` directory (or its `bag/`), a replay of the same bag.
        b: PathBuf,
        /// Exit with status 1 when the overall agreement is below this fraction (e.g. 0.995).
        #[arg(long, value_parser = fraction_arg)]
        min: Option<f64>,
        /// Exit with status 1 when the BEV maps' cell agreement is below this fraction (e.g.
        /// 0.999), or when the replays wrote no maps.
        #[arg(long, value_parser = fraction_arg)]
        min_map: Option<f64>,
    },
}

#[derive(clap::Args)]
struct ReplayArgs {
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
    /// Where to run: auto (the GPU when this build and machine have a usable one, else the CPU), cpu or cuda.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    device: DeviceArg,
    /// LiDAR PointCloud2 topic (default: /sptr/input/points, else the bag's only PointCloud2 topic).
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
    shard: sptr::replay::Shard,
    /// Progress on stderr: auto (bar on a terminal, lines otherwise), plain, quiet.
    #[arg(long, default_value = "auto", value_parser = ["auto", "plain", "quiet"])]
    progress: String,
    /// Exit 0 even when frames' activations left the FP16 range (default: exit status 4 after
    /// writing the report, which lists them).
    #[arg(long)]
    allow_overflow: bool,
    /// CUDA activation storage: fp16, bf16, fp32 or auto (FP16, switching to FP32 for good when a
    /// frame leaves FP16's range; README: precision). Default: the model YAML's `precision`.
    #[arg(long, value_parser = precision_arg)]
    precision: Option<sptr::device::storage::Precision>,
    /// BEV map model YAML instead of the params file's camera.model_config (needs --params with
    /// cameras).
    #[arg(long)]
    camera_model: Option<PathBuf>,
    /// BEV map model weights instead of camera.model_weights: a safetensors file, or
    /// random:SEED for untrained deterministic weights.
    #[arg(long)]
    camera_weights: Option<String>,
    /// Directory of BEV map ground-truth masks, <frame index, 6 digits>.npy, float32
    /// [classes, nx, ny] (README "Replay with cameras"): per-class IoU and mIoU in the report.
    #[arg(long)]
    map_ground_truth: Option<PathBuf>,
}

/// Exit status of `segment` and `replay` when the network's activations left the FP16 range
/// (NaN/inf on the CPU) and `--allow-overflow` was not given: results not to be trusted.
const EXIT_OUT_OF_RANGE: i32 = 4;

/// The error that makes [`main`] exit with [`EXIT_OUT_OF_RANGE`].
#[derive(Debug)]
struct OutOfRange(String);

impl std::fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutOfRange {}

#[derive(Subcommand)]
enum BenchCmd {
    /// The host probe alone (a fixed CPU workload timed over and over, nothing else of ours
    /// running): whether this machine's cores slow down now and then, to run beside a benchmark
    /// before blaming the code for a tail (JSON; README, the node bench).
    Host {
        /// Seconds to probe.
        #[arg(long, default_value_t = 30.0, value_parser = duration_arg)]
        duration_s: f64,
    },
    /// The perception node's per-frame work without ROS (decode, SphereFormer, BEV grids,
    /// labeled cloud; `sptr::frame::processor`): latency p50/p99 over --frames frames (JSON).
    Pipeline {
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
        /// cpu or cuda (as the node's `device` parameter).
        #[arg(long, default_value = "cpu")]
        device: String,
        /// Timed frames (1 to 1,000,000).
        #[arg(long, default_value_t = 200, value_parser = int_in::<1, 1_000_000>)]
        frames: usize,
        /// Untimed frames first (0 to 10,000).
        #[arg(long, default_value_t = 3, value_parser = int_in::<0, 10_000>)]
        warmup: usize,
        /// Also the cameras and the BEV map (issue 21): per frame the --bag's camera messages
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
    },
    /// Voxelization time, CPU and (if available) CUDA, on a cloud and on a batch of it.
    Voxelize {
        /// Point cloud `.bin` file of float32 rows (--stride columns: x, y, z, ...).
        cloud: PathBuf,
        /// float32 columns per point: 3 (x, y, z, the dense benchmark cloud), 4 (KITTI), 5 (nuScenes).
        #[arg(long, default_value_t = 3, value_parser = stride_arg)]
        stride: usize,
        /// Model YAML whose voxelization rules to use.
        #[arg(long, default_value = "config/models/sphereformer_semantickitti.yaml")]
        model: PathBuf,
        /// Voxel size override in metres (the dense cloud benchmark uses 0.05).
        #[arg(long, value_parser = voxel_size_arg)]
        voxel_size: Option<f64>,
        /// Timed repetitions (the median is reported).
        #[arg(long, default_value_t = 20, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
        /// Also time a batch of the cloud plus a copy rotated about z.
        #[arg(long)]
        batch2: bool,
    },
    /// Sparse conv (CUDA): SubM k3 C=32..256 with the map cached and built in the call, strided
    /// k2 s2 32->64..128->256, on a cloud voxelized at --voxel-size (JSON lines).
    Spconv {
        /// Point cloud `.bin` file of float32 rows (--stride columns: x, y, z, ...).
        cloud: PathBuf,
        /// float32 columns per point: 3 (x, y, z, the dense benchmark cloud), 4 (KITTI), 5 (nuScenes).
        #[arg(long, default_value_t = 3, value_parser = stride_arg)]
        stride: usize,
        /// Model YAML whose voxelization rules to use.
        #[arg(long, default_value = "config/models/sphereformer_semantickitti.yaml")]
        model: PathBuf,
        /// Voxel size in metres (0.05 is the dense cloud benchmark's).
        #[arg(long, default_value_t = 0.05, value_parser = voxel_size_arg)]
        voxel_size: f64,
        /// Batch of the cloud plus a copy rotated 90 degrees about z (>= 250k voxels on the dense cloud).
        #[arg(long)]
        batch2: bool,
        /// Timed repetitions (the median is reported).
        #[arg(long, default_value_t = 50, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
    },
    /// SphereFormer stage attention (CUDA): cubic and spherical window attention with RPE, the
    /// partitions, and the whole stage, at C=32/2 heads and C=64/4 heads (JSON lines).
    Attention {
        /// Point cloud `.bin` file of float32 rows (--stride columns: x, y, z, ...).
        cloud: PathBuf,
        /// float32 columns per point: 3 (x, y, z, the dense benchmark cloud), 4 (KITTI), 5 (nuScenes).
        #[arg(long, default_value_t = 3, value_parser = stride_arg)]
        stride: usize,
        /// Model YAML whose voxelization rules to use.
        #[arg(long, default_value = "config/models/sphereformer_semantickitti.yaml")]
        model: PathBuf,
        /// Voxel size override in metres (the dense cloud benchmark uses 0.05).
        #[arg(long, value_parser = voxel_size_arg)]
        voxel_size: Option<f64>,
        /// U-Net level whose windows to use (1 = full resolution).
        #[arg(long, default_value_t = 1, value_parser = int_in::<1, 64>)]
        level: usize,
        /// Batch of the cloud plus a copy rotated 90 degrees about z.
        #[arg(long)]
        batch2: bool,
        /// Timed repetitions (the median is reported).
        #[arg(long, default_value_t = 30, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
    },
    /// Camera input per frame: JPEG decode (all images in parallel), upload, resize + crop +
    /// normalize on the GPU (and the CPU reference), JSON (`camera::bench`).
    CameraInput {
        /// JPEG files, one per camera (e.g. the six tests/data/nuscenes/*.jpg).
        #[arg(required = true)]
        images: Vec<PathBuf>,
        /// Model YAML with the preprocessing keys (image_size, augment2d, bot_pct_lim, image_normalize).
        #[arg(long, default_value = "config/models/bevfusion_seg_camera.yaml")]
        model: PathBuf,
        /// Timed frames (the median is reported).
        #[arg(long, default_value_t = 50, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
        /// Untimed frames first.
        #[arg(long, default_value_t = 5, value_parser = int_in::<0, 10_000>)]
        warmup: usize,
        /// JPEG decoders compared on CUDA, side by side: cpu (zune-jpeg), nvjpeg, auto.
        #[arg(long, value_delimiter = ',', default_value = "cpu,nvjpeg")]
        decoder: Vec<sptr::sensors::image::compressed::JpegDecoderChoice>,
        /// Alternating rounds of `iters` frames per decoder (each round's median is reported).
        #[arg(long, default_value_t = 3, value_parser = int_in::<1, 100>)]
        rounds: usize,
    },
    /// BEVFusion's LiDAR branch on CUDA (random weights): hard voxelization from host points and
    /// the SparseEncoder to the BEV map, medians and p90 (JSON line).
    LidarEncoder {
        /// nuScenes `.pcd.bin` sweep (float32 x 5; the fifth column is replaced by the time lag).
        cloud: PathBuf,
        /// Model YAML (reads `model.encoders.lidar`).
        #[arg(long, default_value = "config/models/bevfusion_seg_fusion.yaml")]
        model: PathBuf,
        /// Copies of the sweep aggregated as synthetic sweeps (10: a nuScenes-sized cloud).
        #[arg(long, default_value_t = 10, value_parser = int_in::<1, 100>)]
        sweeps: usize,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Untimed frames first.
        #[arg(long, default_value_t = 5, value_parser = int_in::<0, 10_000>)]
        warmup: usize,
        /// Timed frames.
        #[arg(long, default_value_t = 50, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
    },
    /// BEVFusion's fuser, BEV decoder and map head on CUDA (random weights, full-size BEV
    /// maps), cuDNN and im2col + cuBLAS side by side: median/p90/min GPU ms per part (JSON lines).
    BevDecoder {
        /// Model YAMLs (each read for `model.fuser`, `model.decoder`, `model.heads.map`).
        #[arg(long, num_args = 1.., default_values = ["config/models/bevfusion_seg_fusion.yaml", "config/models/bevfusion_seg_camera.yaml"])]
        models: Vec<PathBuf>,
        /// Seed of the random weights and inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Side of the square input BEV map in cells.
        #[arg(long, default_value_t = 128, value_parser = int_in::<1, 4096>)]
        bev: usize,
        /// Untimed runs of each part first (at least 1: cuDNN picks its algorithms on first use).
        #[arg(long, default_value_t = 5, value_parser = int_in::<0, 10_000>)]
        warmup: usize,
        /// Timed runs of each part (median, p90, min reported).
        #[arg(long, default_value_t = 50, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
    },
    /// BEVFusion's camera encoder on CUDA (random weights): Swin-T alone and Swin-T + neck,
    /// median/p90 GPU ms, FLOPs and the H100 tensor-core floor (JSON lines).
    Camera {
        /// Model YAML (reads `model.encoders.camera.backbone` and `.neck`).
        #[arg(long, default_value = "config/models/bevfusion_seg_camera.yaml")]
        model: PathBuf,
        /// Normalized images, float32 NCHW `.npy` (default: --batch synthetic images).
        #[arg(long)]
        input: Option<PathBuf>,
        /// Synthetic images in the batch (without --input).
        #[arg(long, default_value_t = 6, value_parser = int_in::<1, 64>)]
        batch: usize,
        /// Synthetic image height in pixels (without --input).
        #[arg(long, default_value_t = 256, value_parser = int_in::<1, 8192>)]
        height: usize,
        /// Synthetic image width in pixels (without --input).
        #[arg(long, default_value_t = 704, value_parser = int_in::<1, 8192>)]
        width: usize,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Untimed forwards first.
        #[arg(long, default_value_t = 10, value_parser = int_in::<0, 10_000>)]
        warmup: usize,
        /// Timed forwards (median and p90 reported).
        #[arg(long, default_value_t = 50, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
    },
    /// End-to-end segmentation (points on the host -> labels on the host): latency median/p90,
    /// per-stage medians, device memory (JSON line).
    Model {
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
        /// Where to run: auto (the GPU when this build and machine have a usable one, else the CPU), cpu or cuda.
        #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
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
        precision: Vec<sptr::device::storage::Precision>,
        /// Rounds over the precisions (alternating them evens out clocks and heat).
        #[arg(long, default_value_t = 1, value_parser = int_in::<1, 1000>)]
        rounds: usize,
    },
    /// BEVFusion BEV map segmentation on CUDA, from JPEG bytes on the host to the masks on the
    /// host: median / p90 per frame and per stage, peak device memory (one JSON line).
    Bevseg {
        /// Model YAML (`config/models/bevfusion_seg_camera.yaml` or `_fusion.yaml`).
        #[arg(long, default_value = "config/models/bevfusion_seg_fusion.yaml")]
        model: PathBuf,
        /// safetensors weights (default: deterministic random weights, --seed).
        #[arg(long)]
        weights: Option<PathBuf>,
        /// Seed of the random weights.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// nuScenes-style calib.json.
        #[arg(long, default_value = "tests/data/nuscenes/calib.json")]
        calib: PathBuf,
        /// Six JPEGs in nuScenes camera order (CAM_FRONT, CAM_FRONT_RIGHT, CAM_FRONT_LEFT,
        /// CAM_BACK, CAM_BACK_LEFT, CAM_BACK_RIGHT); default: the sample in tests/data/nuscenes.
        #[arg(long, num_args = 6)]
        images: Vec<PathBuf>,
        /// LiDAR cloud for the fusion model (default: the sample sweep in tests/data/nuscenes).
        #[arg(long)]
        cloud: Option<PathBuf>,
        /// The fusion model's cloud as this many synthetic sweeps of --cloud (copies rotated and
        /// shifted, with time lags; 10 is a nuScenes-sized aggregated cloud, ~350k points).
        #[arg(long, default_value_t = 1, value_parser = int_in::<1, 100>)]
        sweeps: usize,
        /// Untimed frames first.
        #[arg(long, default_value_t = 10, value_parser = int_in::<0, 10_000>)]
        warmup: usize,
        /// Timed frames.
        #[arg(long, default_value_t = 50, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
    },
    /// Lift-splat view transform (CUDA): geometry build and bev_pool on the seg and detection
    /// geometries with the nuScenes calibration, bytes moved and the DRAM floor, and the whole
    /// view transform (JSON lines).
    Bevpool {
        /// Model YAML whose view transform (BEV grid, depth bins, image size) to use.
        #[arg(long, default_value = "config/models/bevfusion_seg_camera.yaml")]
        model: PathBuf,
        /// nuScenes-style calib.json (cameras' `cam2img`, `lidar2cam`; 1600 x 900 images).
        #[arg(long, default_value = "tests/data/nuscenes/calib.json")]
        calib: PathBuf,
        /// Timed repetitions (the median is reported).
        #[arg(long, default_value_t = 100, value_parser = int_in::<1, 1_000_000>)]
        iters: usize,
        /// DRAM bandwidth for the floor in GB/s (H100 SXM: 3350).
        #[arg(long, default_value_t = 3350.0, value_parser = bandwidth_arg)]
        dram_gbps: f64,
    },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("sptr: error: {e:#}");
        std::process::exit(if e.downcast_ref::<OutOfRange>().is_some() { EXIT_OUT_OF_RANGE } else { 1 });
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Voxelize { cloud, model, stride, device } => voxelize_cmd(&cloud, &model, stride, device),
        Cmd::Segment { cloud, model, weights, random_weights, out, format, device, progress, allow_overflow, precision } => {
            let w = (weights.as_deref(), random_weights);
            segment_cmd(&cloud, &model, w, out.as_deref(), format.as_deref(), device, progress_mode(&progress), allow_overflow, precision)
        }
        Cmd::RandomWeights { model, seed, out } => random_weights_cmd(&model, seed, &out),
        Cmd::Kernels { arch } => kernels_cmd(&arch),
        Cmd::Bevseg { model, weights, random_weights, save_weights, calib, image_size, images, cloud, format, out, device, threshold, dump_stages } => {
            use sptr::cli::bevseg::{run, BevSegJob, SegWeights};
            let weights = match (weights, random_weights) {
                (Some(w), _) => SegWeights::File(w),
                (None, Some(seed)) => SegWeights::Random { seed, save: save_weights },
                (None, None) => anyhow::bail!("pass --weights FILE (or --random-weights SEED for an untrained smoke run)"),
            };
            let cloud = cloud.map(|c| read_cloud_arg(&c, format.as_deref())).transpose()?;
            let device = resolved(device)?;
            let job = BevSegJob { model, weights, calib, image_size, images, cloud, out, device, dump_stages, threshold: threshold as f32 };
            println!("{}", run(&job)?);
            Ok(())
        }
        Cmd::Prepare { cloud, format, model, out } => {
            let pts = read_cloud_arg(&cloud, format.as_deref())?;
            let cfg = load_model(&model)?.yaml;
            let t = Instant::now();
            let inputs = sptr::models::sphereformer::preprocess::prepare_inputs(&[&pts], &cfg).context("preprocessing")?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            inputs.write_dir(&out, cfg.input_c, &cloud.display().to_string())?;
            println!(
                "{} points -> {} voxels ({} coordinate collisions resolved) in {ms:.1} ms -> {}",
                pts.len(),
                inputs.len(),
                inputs.coord_fixups,
                out.display()
            );
            Ok(())
        }
        Cmd::Bench { what: BenchCmd::Host { duration_s } } => {
            println!("{}", sptr::bench::host_probe::bench_alone(std::time::Duration::from_secs_f64(duration_s)));
            Ok(())
        }
        Cmd::Bench { what: BenchCmd::Voxelize { cloud, stride, model, voxel_size, iters, batch2 } } => {
            bench_voxelize(&cloud, stride, &model, voxel_size, iters, batch2)
        }
        Cmd::Bench { what: BenchCmd::Spconv { cloud, stride, model, voxel_size, batch2, iters } } => {
            bench_spconv_cmd(&cloud, stride, &model, voxel_size, batch2, iters)
        }
        Cmd::Bench { what: BenchCmd::Attention { cloud, stride, model, voxel_size, level, batch2, iters } } => {
            bench_attention_cmd(&cloud, stride, &model, voxel_size, level, batch2, iters)
        }
        Cmd::Bench { what: BenchCmd::Pipeline { cloud, model, weights, params, device, frames, warmup, cameras, bag, camera_model, camera_weights, rate_hz, duration_s, serial, faults_every_s } } => {
            let device = match device.as_str() {
                "cpu" => sptr::device::DeviceChoice::Cpu,
                "cuda" => sptr::device::DeviceChoice::Cuda,
                other => anyhow::bail!("--device {other}: use cpu or cuda"),
            };
            let device = sptr::device::resolve(device).map_err(|e| anyhow::anyhow!("--device {device}: {e} ({CPU_INSTEAD})"))?.device;
            let setup = sptr::bench::lidar::BenchSetup { cloud: &cloud, model: model.as_deref(), weights: weights.as_deref(), params: &params, device, warmup, frames };
            if cameras {
                let pace = rate_hz.zip(duration_s);
                let s = sptr::bench::pipeline::CameraBenchSetup { lidar: setup, bag: &bag, camera_model: camera_model.as_deref(), camera_weights: camera_weights.as_deref(), pace, serial, faults_every_s };
                println!("{}", sptr::bench::pipeline::run(&s).map_err(anyhow::Error::msg)?);
                return Ok(());
            }
            println!("{}", sptr::bench::lidar::bench_pipeline(&setup).map_err(anyhow::Error::msg)?);
            Ok(())
        }
        Cmd::Bench { what: BenchCmd::Model { cloud, format, model, weights, seed, device, iters, case, precision, rounds } } => {
            bench_model_cmd(&cloud, format.as_deref(), &model, weights.as_deref(), seed, device, iters, case, &precision, rounds)
        }
        Cmd::Bench { what: BenchCmd::Bevseg { model, weights, seed, calib, images, cloud, sweeps, warmup, iters } } => {
            bench_bevseg_cmd(model, weights, seed, calib, images, cloud, sweeps, warmup, iters)
        }
        Cmd::Bench { what: BenchCmd::Bevpool { model, calib, iters, dram_gbps } } => bench_bevpool_cmd(&model, &calib, iters, dram_gbps),
        Cmd::Bench { what: BenchCmd::CameraInput { images, model, iters, warmup, decoder, rounds } } => {
            bench_camera_input_cmd(&images, &model, iters, warmup, &decoder, rounds)
        }
        Cmd::CameraFeatures { images, input, model, weights, random_weights, save_weights, save_input, jpeg_decoder, stages, device, out } => {
            camera_features_cmd(images, input, model, weights, random_weights, save_weights, save_input, jpeg_decoder, stages, device, out)
        }
        Cmd::Bench { what: BenchCmd::LidarEncoder { cloud, model, sweeps, seed, warmup, iters } } => {
            bench_lidar_encoder_cmd(&cloud, &model, sweeps, seed, warmup, iters)
        }
        Cmd::Bench { what: BenchCmd::BevDecoder { models, seed, bev, warmup, iters } } => bench_bev_decoder_cmd(models, seed, bev, warmup, iters),
        Cmd::Bench { what: BenchCmd::Camera { model, input, batch, height, width, seed, warmup, iters } } => {
            bench_camera_cmd(model, input, batch, height, width, seed, warmup, iters)
        }
        Cmd::Info => info_cmd(),
        Cmd::Bag { what: BagCmd::Info { bag, count } } => bag_info_cmd(&bag, count),
        Cmd::Replay(args) => replay_cmd(args),
        Cmd::Eval { what: EvalCmd::Merge { shard_dirs, out } } => eval_merge_cmd(&shard_dirs, &out),
        Cmd::Eval { what: EvalCmd::Agreement { a, b, min, min_map } } => eval_agreement_cmd(&a, &b, min, min_map),
    }
}

#[allow(clippy::too_many_arguments)]
fn camera_features_cmd(
    images: Vec<PathBuf>,
    input: Option<PathBuf>,
    model: PathBuf,
    weights: Option<PathBuf>,
    random_weights: Option<u64>,
    save_weights: Option<PathBuf>,
    save_input: Option<PathBuf>,
    jpeg_decoder: sptr::sensors::image::compressed::JpegDecoderChoice,
    stages: bool,
    device: DeviceArg,
    out: PathBuf,
) -> Result<()> {
    use sptr::cli::camera_features::{preprocess_files, run_checked, FeaturesJob, WeightsArg};
    use sptr::ops::image_preprocess::cpu::read_input_npy;
    let weights = match (weights, random_weights) {
        (Some(w), _) => WeightsArg::File(w),
        (None, Some(seed)) => WeightsArg::Random { seed, save: save_weights },
        (None, None) => anyhow::bail!("pass --weights FILE (or --random-weights SEED for an untrained smoke run)"),
    };
    use sptr::sensors::image::compressed::JpegDecoderChoice;
    let (images, n, h, w) = match (input, jpeg_decoder) {
        (Some(p), _) => read_input_npy(&p)?,
        (None, JpegDecoderChoice::Cpu) => preprocess_files(&images, &model)?,
        (None, choice) => camera_input_cuda(&images, &model, choice)?,
    };
    let device = resolved(device)?;
    let job = FeaturesJob { model, weights, images, n, h, w, device, stages, save_input, out };
    let (summary, range) = run_checked(&job)?;
    println!("{summary}");
    if !range.is_clean() {
        print_out_of_range(&range);
        return Err(OutOfRange(format!(
            "the features were written but cannot be trusted (README: FP16 range); {}",
            range.summary(1)
        ))
        .into());
    }
    Ok(())
}

/// `camera-features --jpeg-decoder nvjpeg|auto`: the CUDA preprocessing of the JPEGs.
#[cfg(feature = "cuda")]
fn camera_input_cuda(images: &[PathBuf], model: &Path, choice: sptr::sensors::image::compressed::JpegDecoderChoice) -> Result<(Vec<f32>, usize, usize, usize)> {
    if let Some(why) = sptr::device::cuda_unavailable() {
        anyhow::bail!("--jpeg-decoder {choice} preprocesses on CUDA, and {why}");
    }
    let (data, n, h, w, decoder) = sptr::cli::camera_features::preprocess_files_cuda(images, model, choice)?;
    eprintln!("camera input decoded by {decoder}");
    Ok((data, n, h, w))
}
#[cfg(not(feature = "cuda"))]
fn camera_input_cuda(_: &[PathBuf], _: &Path, choice: sptr::sensors::image::compressed::JpegDecoderChoice) -> Result<(Vec<f32>, usize, usize, usize)> {
    anyhow::bail!("--jpeg-decoder {choice} needs the CUDA backend: rebuild with `--features cuda`")
}

#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
fn bench_camera_cmd(model: PathBuf, input: Option<PathBuf>, n: usize, h: usize, w: usize, seed: u64, warmup: usize, iters: usize) -> Result<()> {
    let args = sptr::bench::camera_encoder::CameraBenchArgs { model, input, n, h, w, seed, warmup, iters };
    for line in sptr::bench::camera_encoder::run_bench(&args)? {
        println!("{line}");
    }
    Ok(())
}
#[cfg(not(feature = "cuda"))]
#[allow(clippy::too_many_arguments)]
fn bench_camera_cmd(_: PathBuf, _: Option<PathBuf>, _: usize, _: usize, _: usize, _: u64, _: usize, _: usize) -> Result<()> {
    anyhow::bail!("`bench camera` needs the CUDA backend: rebuild with `--features cuda`")
}

#[cfg(feature = "cuda")]
fn bench_lidar_encoder_cmd(cloud: &Path, model: &Path, sweeps: usize, seed: u64, warmup: usize, iters: usize) -> Result<()> {
    use sptr::models::bevfusion::lidar_encoder::{cuda, random_weights, LidarEncoder, LidarEncoderConfig};
    use sptr::ops::voxelize::hard::{point_rows, synthetic_sweeps};
    let cfg = LidarEncoderConfig::load(model)?;
    let enc = LidarEncoder::load(&cfg, &random_weights(&cfg, seed)?)?;
    let points = synthetic_sweeps(&point_rows(&Points::read_bin(cloud, 5)?, 0.0), sweeps);
    let dev = sptr::device::cuda::CudaDevice::new(0)?;
    let gpu = cuda::CudaLidarEncoder::upload(&dev, &enc)?;
    println!("{}", cuda::bench(&dev, &gpu, &points, warmup, iters)?);
    Ok(())
}
#[cfg(not(feature = "cuda"))]
fn bench_lidar_encoder_cmd(_: &Path, model: &Path, _: usize, _: u64, _: usize, _: usize) -> Result<()> {
    let _ = sptr::models::bevfusion::lidar_encoder::LidarEncoderConfig::load(model)?;
    anyhow::bail!("`bench lidar-encoder` needs the CUDA backend: rebuild with `--features cuda`")
}

#[cfg(feature = "cuda")]
fn bench_bev_decoder_cmd(models: Vec<PathBuf>, seed: u64, bev: usize, warmup: usize, iters: usize) -> Result<()> {
    let args = sptr::bench::bev_decoder::BevDecoderBenchArgs { models, seed, warmup, iters, bev };
    for line in sptr::bench::bev_decoder::run_bench(&args)? {
        println!("{line}");
    }
    Ok(())
}
#[cfg(not(feature = "cuda"))]
fn bench_bev_decoder_cmd(_: Vec<PathBuf>, _: u64, _: usize, _: usize, _: usize) -> Result<()> {
    anyhow::bail!("`bench bev-decoder` needs the CUDA backend: rebuild with `--features cuda`")
}

fn load_model(path: &Path) -> Result<ModelConfig> {
    // The library's errors name the file: say it once.
    ModelConfig::load(path).map_err(|e| anyhow::anyhow!("model YAML {e}"))
}

/// A copy of `p` rotated by `deg` degrees about z (for a second batch sample).
fn rotated_z(p: &Points, deg: f32) -> Points {
    let (s, c) = deg.to_radians().sin_cos();
    let mut q = p.clone();
    for i in 0..p.len() {
        q.x[i] = c * p.x[i] - s * p.y[i];
        q.y[i] = s * p.x[i] + c * p.y[i];
    }
    q
}

fn summarize(v: &Voxels, took_ms: f64, device: &str) {
    let st = &v.stats;
    println!("device            {device}");
    println!("points            {}", st.points_in);
    println!("  non-finite      {} (NaN/Inf x, y, z or intensity)", st.non_finite);
    println!("  out of range    {}", st.out_of_range);
    println!("  out of grid     {}", st.out_of_grid);
    println!("  capped          {}", st.points_capped);
    println!("voxels            {} kept of {} ({} dropped by max_voxels)", st.voxels_kept, st.voxels_total, st.voxels_dropped());
    if !v.is_empty() {
        let mut lo = [i32::MAX; 4];
        let mut hi = [i32::MIN; 4];
        for c in &v.coords {
            for a in 0..4 {
                lo[a] = lo[a].min(c[a]);
                hi[a] = hi[a].max(c[a]);
            }
        }
        let max_pts = v.counts.iter().max().copied().unwrap_or(0);
        let mean_pts = v.counts.iter().map(|&c| c as f64).sum::<f64>() / v.len() as f64;
        println!("coords [b,x,y,z]  min {:?} max {:?}", lo, hi);
        println!("points per voxel  mean {mean_pts:.2}, max {max_pts}");
    }
    println!("time              {took_ms:.2} ms");
}

fn voxelize_cmd(cloud: &Path, model: &Path, stride: usize, device: DeviceArg) -> Result<()> {
    let m = load_model(model)?;
    let pts = Points::read_bin(cloud, stride)?;
    let params = m.voxel_params();
    let use_cuda = resolved(device)? == sptr::device::Device::Cuda;
    println!("cloud             {}", cloud.display());
    println!("model             {}", model.display());
    if use_cuda {
        return voxelize_cuda_cmd(&pts, &params);
    }
    let t = Instant::now();
    let v = voxelize_cpu(&[&pts], &params)?;
    summarize(&v, t.elapsed().as_secs_f64() * 1e3, "cpu");
    Ok(())
}

/// `--device` resolved ([`sptr::device::resolve`]), its error naming the argument.
fn resolved(device: DeviceArg) -> Result<sptr::device::Device> {
    let choice = match device {
        DeviceArg::Auto => sptr::device::DeviceChoice::Auto,
        DeviceArg::Cpu => sptr::device::DeviceChoice::Cpu,
        DeviceArg::Cuda => sptr::device::DeviceChoice::Cuda,
    };
    let r = sptr::device::resolve(choice).map_err(|e| anyhow::anyhow!("--device {choice}: {e} ({CPU_INSTEAD})"))?;
    Ok(r.device)
}

/// How a command-line user runs on the CPU instead of a GPU that cannot be had.
const CPU_INSTEAD: &str = "pass --device cpu, or --device auto to fall back to the CPU";

/// Whether `auto` resolves to CUDA here (the benches that time CUDA where they can).
#[cfg(feature = "cuda")]
fn auto_is_cuda() -> Result<bool> {
    Ok(sptr::device::resolve(sptr::device::DeviceChoice::Auto)?.is_cuda())
}

#[cfg(feature = "cuda")]
fn voxelize_cuda_cmd(pts: &Points, params: &VoxelParams) -> Result<()> {
    let dev = sptr::device::cuda::CudaDevice::new(0)?;
    // First call compiles or loads the kernels; time the second.
    sptr::ops::voxelize::cuda::voxelize_cuda(&dev, &[pts], params)?;
    dev.synchronize()?;
    let t = Instant::now();
    let v = sptr::ops::voxelize::cuda::voxelize_cuda(&dev, &[pts], params)?;
    dev.synchronize()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    summarize(&v.to_host(&dev)?, ms, &format!("cuda ({}, {})", dev.name, dev.arch.sm()));
    Ok(())
}
#[cfg(not(feature = "cuda"))]
fn voxelize_cuda_cmd(_: &Points, _: &VoxelParams) -> Result<()> {
    anyhow::bail!("this build has no CUDA support: rebuild with `--features cuda`, or pass --device cpu")
}

#[cfg(feature = "cuda")]
fn kernels_cmd(archs: &[String]) -> Result<()> {
    use sptr::device::nvrtc;
    let v = nvrtc::nvrtc_version()?;
    println!("NVRTC {}.{}", v.0, v.1);
    for a in archs {
        let arch: nvrtc::Arch = a.parse()?;
        for k in sptr::device::kernels::ALL {
            for storage in sptr::device::storage::Storage::ALL {
                if storage != sptr::device::storage::Storage::Fp16 && !sptr::device::kernels::has_storage_twin(k.name) {
                    continue;
                }
                let t = Instant::now();
                let c = nvrtc::compile_storage(k, arch, storage)?;
                let name = format!("{} ({storage})", k.name);
                println!("{name:<24} {:<7} {:>8} bytes  {:>6.0} ms", arch.target(), c.cubin.len(), t.elapsed().as_secs_f64() * 1e3);
                if !c.log.is_empty() {
                    println!("{}", c.log);
                }
            }
        }
    }
    Ok(())
}
#[cfg(not(feature = "cuda"))]
fn kernels_cmd(_: &[String]) -> Result<()> {
    anyhow::bail!("this build has no CUDA support: rebuild with `--features cuda`")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

fn bench_voxelize(cloud: &Path, stride: usize, model: &Path, voxel: Option<f64>, iters: usize, batch2: bool) -> Result<()> {
    let m = load_model(model)?;
    let mut params = m.voxel_params();
    if let Some(v) = voxel {
        params.voxel_size = [v; 3];
    }
    let pts = Points::read_bin(cloud, stride)?;
    let rot = rotated_z(&pts, 90.0);
    let mut cases: Vec<(&str, Vec<&Points>)> = vec![("single", vec![&pts])];
    if batch2 {
        cases.push(("batch2_rotated", vec![&pts, &rot]));
    }
    let iters = iters.max(1);
    let mut rows = Vec::new();
    for (name, batch) in &cases {
        let cpu = voxelize_cpu(batch, &params)?;
        let mut t_cpu = Vec::new();
        for _ in 0..iters.min(5) {
            let t = Instant::now();
            voxelize_cpu(batch, &params)?;
            t_cpu.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let cuda_ms = bench_voxelize_cuda(batch, &params, iters)?;
        rows.push(format!(
            "{{\"case\":\"{name}\",\"points\":{},\"voxels\":{},\"cpu_ms\":{:.3},\"cuda_ms\":{},\"speedup\":{}}}",
            cpu.stats.points_in,
            cpu.len(),
            median(t_cpu.clone()),
            cuda_ms.map(|v| format!("{v:.4}")).unwrap_or("null".into()),
            cuda_ms.map(|v| format!("{:.1}", median(t_cpu.clone()) / v)).unwrap_or("null".into()),
        ));
    }
    println!("{{\"bench\":\"voxelize\",\"voxel_size\":{:?},\"iters\":{iters},\"results\":[{}]}}", params.voxel_size, rows.join(","));
    Ok(())
}

#[allow(unused_variables)]
fn bench_camera_input_cmd(
    images: &[PathBuf],
    model: &Path,
    iters: usize,
    warmup: usize,
    decoders: &[sptr::sensors::image::compressed::JpegDecoderChoice],
    rounds: usize,
) -> Result<()> {
    let cfg = sptr::ops::image_preprocess::cpu::ImagePreprocess::load(model)?;
    let limits = sptr::sensors::image::encodings::DecodeLimits::default();
    let jpegs = images.iter().map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display()))).collect::<Result<Vec<_>>>()?;
    #[allow(unused_mut)]
    let mut out = sptr::bench::camera_input::camera_input_bench(&jpegs, &cfg, &limits, warmup, iters)?;
    #[cfg(feature = "cuda")]
    if auto_is_cuda()? {
        let dev = sptr::device::cuda::CudaDevice::new(0)?;
        out["cuda"] = sptr::bench::camera_input::camera_input_bench_cuda(&dev, &jpegs, &cfg, &limits, warmup, iters, decoders, rounds)?;
    }
    println!("{out}");
    Ok(())
}

/// Median wall time of a warm CUDA voxelization (upload + all kernels + readbacks), ms.
#[cfg(feature = "cuda")]
fn bench_voxelize_cuda(batch: &[&Points], params: &VoxelParams, iters: usize) -> Result<Option<f64>> {
    if !auto_is_cuda()? {
        return Ok(None);
    }
    let dev = sptr::device::cuda::CudaDevice::new(0)?;
    for _ in 0..3 {
        sptr::ops::voxelize::cuda::voxelize_cuda(&dev, batch, params)?;
    }
    dev.synchronize()?;
    let mut t = Vec::new();
    for _ in 0..iters {
        let t0 = Instant::now();
        let v = sptr::ops::voxelize::cuda::voxelize_cuda(&dev, batch, params)?;
        dev.synchronize()?;
        t.push(t0.elapsed().as_secs_f64() * 1e3);
        drop(v);
    }
    Ok(Some(median(t)))
}
#[cfg(not(feature = "cuda"))]
fn bench_voxelize_cuda(_: &[&Points], _: &VoxelParams, _: usize) -> Result<Option<f64>> {
    Ok(None)
}

/// Voxel coordinates of a cloud (optionally with a rotated copy as sample 1) and a spatial
/// shape covering them, for the sparse-conv benchmark.
fn bench_sites(cloud: &Path, stride: usize, model: &Path, voxel: f64, batch2: bool) -> Result<(Vec<[i32; 4]>, [i32; 3])> {
    let mut params = load_model(model)?.voxel_params();
    params.voxel_size = [voxel; 3];
    let pts = Points::read_bin(cloud, stride)?;
    let rot = rotated_z(&pts, 90.0);
    let batch: Vec<&Points> = if batch2 { vec![&pts, &rot] } else { vec![&pts] };
    let v = voxelize_cpu(&batch, &params)?;
    let mut shape = [128; 3];
    for c in &v.coords {
        for a in 0..3 {
            shape[a] = shape[a].max(c[a + 1] + 1);
        }
    }
    Ok((v.coords, shape.map(|s| (s + 7) / 8 * 8)))
}

#[cfg(feature = "cuda")]
fn bench_spconv_cmd(cloud: &Path, stride: usize, model: &Path, voxel: f64, batch2: bool, iters: usize) -> Result<()> {
    let (coords, shape) = bench_sites(cloud, stride, model, voxel, batch2)?;
    let dev = sptr::device::cuda::CudaDevice::new(0)?;
    let name = cloud.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = if batch2 { format!("{name}+rot90") } else { name };
    for row in sptr::bench::spconv::bench_spconv(&dev, &name, coords, shape, iters)? {
        println!("{}", row.json());
    }
    Ok(())
}
#[cfg(not(feature = "cuda"))]
fn bench_spconv_cmd(cloud: &Path, stride: usize, model: &Path, voxel: f64, batch2: bool, _: usize) -> Result<()> {
    let _ = bench_sites(cloud, stride, model, voxel, batch2)?;
    anyhow::bail!("`bench spconv` needs the CUDA backend: rebuild with `--features cuda`")
}

/// Voxel positions (float32 mean of each voxel's points, metres) and batch indices of a cloud
/// (optionally with a rotated copy as sample 1), voxelized with the model's rule.
fn bench_voxel_positions(cloud: &Path, stride: usize, model: &ModelConfig, voxel: Option<f64>, batch2: bool) -> Result<(Vec<[f32; 3]>, Vec<i32>)> {
    let mut params = model.voxel_params();
    if let Some(v) = voxel {
        params.voxel_size = [v; 3];
    }
    let pts = Points::read_bin(cloud, stride)?;
    let rot = rotated_z(&pts, 90.0);
    let batch: Vec<&Points> = if batch2 { vec![&pts, &rot] } else { vec![&pts] };
    let v = voxelize_cpu(&batch, &params)?;
    let b = v.coords.iter().map(|c| c[0]).collect();
    Ok((v.xyz, b))
}

#[cfg(feature = "cuda")]
fn bench_attention_cmd(cloud: &Path, stride: usize, model: &Path, voxel: Option<f64>, level: usize, batch2: bool, iters: usize) -> Result<()> {
    let cfg = load_model(model)?;
    let mut m = cfg.yaml.clone();
    if let Some(v) = voxel {
        m.voxel_size = [v; 3];
    }
    let lvl = sptr::ops::attention::SphereLevel::from_model(&m, level)?;
    let (xyz, batch) = bench_voxel_positions(cloud, stride, &cfg, voxel, batch2)?;
    let dev = sptr::device::cuda::CudaDevice::new(0)?;
    let name = cloud.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = if batch2 { format!("{name}+rot90") } else { name };
    for row in sptr::bench::attention::bench_attention(&dev, &format!("{name}/level{level}"), &xyz, &batch, &lvl, iters)? {
        println!("{}", row.json());
    }
    Ok(())
}
#[cfg(not(feature = "cuda"))]
fn bench_attention_cmd(cloud: &Path, stride: usize, model: &Path, voxel: Option<f64>, level: usize, batch2: bool, _: usize) -> Result<()> {
    let cfg = load_model(model)?;
    sptr::ops::attention::SphereLevel::from_model(&cfg.yaml, level)?;
    let _ = bench_voxel_positions(cloud, stride, &cfg, voxel, batch2)?;
    anyhow::bail!("`bench attention` needs the CUDA backend: rebuild with `--features cuda`")
}

fn info_cmd() -> Result<()> {
    println!("sptr {}", env!("CARGO_PKG_VERSION"));
    println!("features: cuda={} ros={}", cfg!(feature = "cuda"), cfg!(feature = "ros"));
    println!("kernel modules: {}", sptr::device::kernels::ALL.iter().map(|k| k.name).collect::<Vec<_>>().join(", "));
    #[cfg(feature = "cuda")]
    {
        use sptr::device::{cuda, nvrtc};
        match nvrtc::nvrtc_version() {
            Ok(v) => println!("NVRTC {}.{}; kernel cache {}", v.0, v.1, nvrtc::cache_dir().display()),
            Err(e) => println!("NVRTC: {e}"),
        }
        match cuda::CudaDevice::new(0) {
            Ok(d) => println!("GPU 0: {} ({})", d.name, d.arch.sm()),
            Err(e) => println!("GPU: {e}"),
        }
    }
    Ok(())
}

/// A cloud file in the layout `format` names (or the file name tells).
fn read_cloud_arg(cloud: &Path, format: Option<&str>) -> Result<Points> {
    use sptr::sensors::cloud_files::{read_cloud, CloudFormat};
    let fmt = match format {
        Some("kitti") => CloudFormat::KittiBin,
        Some("nuscenes") => CloudFormat::NuScenesBin,
        Some("pcd") => CloudFormat::Pcd,
        Some("xyz") => CloudFormat::XyzBin,
        Some(other) => anyhow::bail!("--format {other}: use kitti, nuscenes, xyz or pcd"),
        None => CloudFormat::from_path(cloud)
            .with_context(|| format!("{}: cannot tell the layout from the name; pass --format", cloud.display()))?,
    };
    read_cloud(cloud, fmt).map_err(|e| anyhow::anyhow!("{e}")) // names the file
}

/// A segmenter on the chosen device (`auto`: CUDA when usable, else the CPU).
fn segmenter_on(cfg: sptr::models::sphereformer::config::ModelYaml, weights: sptr::nn::Weights, device: DeviceArg) -> Result<sptr::models::sphereformer::segmenter::Segmenter> {
    let kind = resolved(device)?;
    sptr::models::sphereformer::segmenter::Segmenter::on_device(cfg, weights, kind).with_context(|| format!("building the model on {kind:?}"))
}

/// A CPU segmenter moved to the chosen device (`auto`: CUDA when usable, else the CPU).
fn segmenter_device(seg: sptr::models::sphereformer::segmenter::Segmenter, device: DeviceArg) -> Result<sptr::models::sphereformer::segmenter::Segmenter> {
    let kind = resolved(device)?;
    seg.into_device(kind).with_context(|| format!("building the model on {kind:?}"))
}

/// `--precision`'s values.
fn precision_arg(v: &str) -> Result<sptr::device::storage::Precision, String> {
    v.parse().map_err(|e: sptr::Error| e.to_string())
}

/// `sptr random-weights`: deterministic random weights for a model YAML, as safetensors.
fn random_weights_cmd(model: &Path, seed: u64, out: &Path) -> Result<()> {
    use sptr::models::bevfusion::seg as seg;
    let tensors = if seg::is_bevfusion_seg_yaml(model) {
        let cfg = seg::BevSegConfig::load(model)?;
        seg::random_tensors(&cfg, seed).context("making random BEVFusion seg weights")?
    } else {
        let cfg = load_model(model)?.yaml;
        sptr::models::sphereformer::random::random_tensors(&cfg, seed).context("making random weights")?
    };
    sptr::nn::random::save_tensors(out, &tensors).map_err(|e| anyhow::anyhow!("{e}"))?;
    let params: usize = tensors.iter().map(|(_, _, v)| v.len()).sum();
    println!(
        "wrote {} ({} tensors, {params} parameters, F32) for {}, seed {seed}: untrained, for trying the tools (meaningless labels)",
        out.display(),
        tensors.len(),
        model.display()
    );
    Ok(())
}

/// The layers a range report flags, one per line (at most 20), for `segment`.
fn print_out_of_range(range: &sptr::device::range_guard::RangeReport) {
    eprintln!(
        "sptr: the network's activations left the FP16 range (NaN/inf on the CPU) in {} layer(s), in execution order \
         (the first is where the range was left):",
        range.layers.len()
    );
    for l in range.layers.iter().take(20) {
        eprintln!("  {l}");
    }
    if range.layers.len() > 20 {
        eprintln!("  ... and {} more", range.layers.len() - 20);
    }
}

/// `sptr segment`: read, segment, report, optionally write a `.label` file.
#[allow(clippy::too_many_arguments)]
fn segment_cmd(
    cloud: &Path,
    model: &Path,
    (weights, random_seed): (Option<&Path>, Option<u64>),
    out: Option<&Path>,
    format: Option<&str>,
    device: DeviceArg,
    progress: sptr::replay::ProgressMode,
    allow_overflow: bool,
    precision: Option<sptr::device::storage::Precision>,
) -> Result<()> {
    use sptr::cli::segment_files::{write_label_file, LabelIds};
    use sptr::models::sphereformer::segmenter::UNLABELED;
    let pts = read_cloud_arg(cloud, format)?;
    let t0 = Instant::now();
    let mut cfg = load_model(model)?.yaml;
    if let Some(p) = precision {
        cfg.precision = p;
    }
    let w = match (weights, random_seed) {
        (Some(p), _) => sptr::nn::Weights::from_file(p).map_err(|e| anyhow::anyhow!("weights {e}"))?,
        (None, Some(seed)) => sptr::models::sphereformer::random::random_weights(&cfg, seed).context("making random weights")?,
        (None, None) => anyhow::bail!("pass --weights FILE (or --random-weights SEED for untrained weights)"),
    };
    // A mismatch error names the weights file itself.
    let mut seg = segmenter_on(cfg, w, device).with_context(|| format!("model {}", model.display()))?;
    let source = weights.map_or_else(|| format!("random weights, seed {}", random_seed.unwrap_or(0)), |p| p.display().to_string());
    println!("model loaded on {:?} in {:.1} ms ({source})", seg.device(), t0.elapsed().as_secs_f64() * 1e3);
    // The CPU takes minutes on a few hundred thousand voxels: say where it is, stage by stage.
    let stages = (seg.device() == sptr::device::Device::Cpu).then(|| {
        let p = sptr::cli::segment_progress::StageProgress::new(progress, sptr::models::sphereformer::network::cpu_stage_names(seg.config()));
        seg.set_stage_hook(Some(p.hook()));
        p
    });
    let r = seg.segment(&[&pts]);
    if let Some(p) = stages {
        p.finish();
    }
    let r = r.context("segmenting")?;
    if let Some(fp16) = &r.recomputed_from {
        eprintln!(
            "sptr: precision auto: the FP16 forward left FP16's range ({}); the labels are the FP32 forward's",
            fp16.summary(3)
        );
    }
    if !r.range.is_clean() {
        print_out_of_range(&r.range);
        if !allow_overflow {
            return Err(OutOfRange(format!(
                "the labels cannot be trusted, none written (README: FP16 range); {}; --allow-overflow to write them anyway",
                r.range.summary(1)
            ))
            .into());
        }
        eprintln!("sptr: warning: labels out of the FP16 range kept (--allow-overflow)");
    }
    let names = &seg.config().class_names;
    let mut hist = vec![0usize; names.len()];
    let mut unlabeled = 0usize;
    for &l in &r.labels {
        match hist.get_mut(l as usize) {
            Some(h) if l != UNLABELED => *h += 1,
            _ => unlabeled += 1,
        }
    }
    println!("{} points, {} voxels ({} coordinate collisions resolved)", pts.len(), r.voxels, r.coord_fixups);
    for (name, count) in names.iter().zip(&hist).filter(|(_, &c)| c > 0) {
        println!("  {name:<22} {count:>9}  {:5.1} %", 100.0 * *count as f64 / pts.len().max(1) as f64);
    }
    if unlabeled > 0 {
        let st = &r.voxel_stats;
        println!(
            "  {:<22} {unlabeled:>9}  (no voxel: {} NaN/Inf x, y, z or intensity, {} out of range, {} beyond the grid, {} over max_voxels)",
            "unlabeled", st.non_finite, st.out_of_range, st.out_of_grid, st.points_capped
        );
    }
    for (stage, d) in &r.times.stages {
        println!("  {stage:<16} {:9.2} ms", d.as_secs_f64() * 1e3);
    }
    println!("  {:<16} {:9.2} ms", "total", r.times.total().as_secs_f64() * 1e3);
    if let Some(path) = out {
        let ids = LabelIds::for_classes(names);
        write_label_file(path, &r.labels, ids).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} ({ids:?} ids)", path.display());
    }
    Ok(())
}

/// `sptr bag info`.
fn bag_info_cmd(bag: &Path, count: bool) -> Result<()> {
    // Library errors already carry their cause in their message: show it once.
    let b = sptr::bag::Bag::open(bag).map_err(|e| anyhow::anyhow!("{e}"))?;
    let (text, error) = sptr::bag::info::summary(&b, count);
    print!("{text}");
    match error {
        Some(e) => anyhow::bail!("reading the messages: {e}"),
        None => Ok(()),
    }
}

fn progress_mode(s: &str) -> sptr::replay::ProgressMode {
    match s {
        "plain" => sptr::replay::ProgressMode::Plain,
        "quiet" => sptr::replay::ProgressMode::Quiet,
        _ => sptr::replay::ProgressMode::Auto,
    }
}

/// `sptr replay`: the library does the work; this prints where the results are.
fn replay_cmd(a: ReplayArgs) -> Result<()> {
    let allow_overflow = a.allow_overflow;
    use sptr::device::DeviceChoice;
    use sptr::replay::{LabelSource, ProgressMode, ReplayRequest, WeightsSource};
    let weights = match (a.weights, a.random_weights) {
        (Some(w), _) => WeightsSource::File(w),
        (None, Some(seed)) => WeightsSource::Random(seed),
        (None, None) => anyhow::bail!("pass --weights FILE (or --random-weights SEED for an untrained smoke run)"),
    };
    let req = ReplayRequest {
        bag: a.bag,
        model: a.model,
        weights,
        device: match a.device {
            DeviceArg::Auto => DeviceChoice::Auto,
            DeviceArg::Cpu => DeviceChoice::Cpu,
            DeviceArg::Cuda => DeviceChoice::Cuda,
        },
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
        progress: match a.progress.as_str() {
            "plain" => ProgressMode::Plain,
            "quiet" => ProgressMode::Quiet,
            _ => ProgressMode::Auto,
        },
        precision: a.precision,
    };
    let outcome = sptr::replay::run(&req).map_err(|e| anyhow::anyhow!("{e}"))?;
    print_outcome(&outcome.report, &outcome.out);
    for c in &outcome.cameras {
        let why: Vec<String> = c.masked_by.iter().map(|(r, n)| format!("{r} {n}")).collect();
        let why = if why.is_empty() { String::new() } else { format!(" ({})", why.join(", ")) };
        eprintln!("camera {}: used in {} frame(s), masked in {}{why}", c.name, c.used, c.masked);
    }
    if !outcome.cameras.is_empty() {
        eprintln!("cameras: {}", outcome.out.join(sptr::replay::cameras::CAMERAS_FILE).display());
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
    // Frames out of the FP16 range (status 4) before "every frame skipped" (1): dropped frames
    // out of range are skipped too, and this names why; a damaged bag keeps its status 1.
    let oor = &outcome.report.out_of_range;
    if let (Some(first), None) = (oor.first(), &outcome.damage) {
        let msg = format!(
            "{} frame(s) left the FP16 range (first: frame {}, {}); the report ({}) lists them",
            oor.len(),
            first.frame,
            first.layers.first().map_or("?", String::as_str),
            outcome.out.join("report.md").display()
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
            outcome.out.join("report.md").display()
        );
    }
    // A map model that made no map of any frame it ran on (every forward failed) fails the
    // replay, as LiDAR frames that were all skipped do.
    if let Some((0, failed @ 1..)) = outcome.bev_maps {
        anyhow::bail!(
            "the BEV map model failed on every one of the {failed} frames it ran on, no map was made; cameras.json and the report ({}) say why",
            outcome.out.join("report.md").display()
        );
    }
    if let Some(d) = outcome.damage {
        anyhow::bail!(
            "the bag is damaged after {} LiDAR frames: {}; the report ({}) covers the frames before it",
            d.frames_before,
            d.error,
            outcome.out.join("report.md").display()
        );
    }
    Ok(())
}

/// `sptr eval merge`.
fn eval_merge_cmd(dirs: &[PathBuf], out: &Path) -> Result<()> {
    let report = sptr::replay::merge_shards(dirs, out).map_err(|e| anyhow::anyhow!("{e}"))?;
    print_outcome(&report, out);
    Ok(())
}

/// `sptr eval agreement`.
fn eval_agreement_cmd(a: &Path, b: &Path, min: Option<f64>, min_map: Option<f64>) -> Result<()> {
    let ag = sptr::replay::agreement::agreement(a, b).map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, f) in ag.frames.iter().enumerate() {
        println!("frame {i:>6}  {} ns  {:>9} points  {:8.4} % agree", f.timestamp_ns, f.points, 100.0 * f.same as f64 / f.points.max(1) as f64);
    }
    let frac = ag.fraction().unwrap_or(1.0);
    println!("total: {} of {} points agree ({:.4} %) over {} frames", ag.same, ag.points, 100.0 * frac, ag.frames.len());
    if let Some(map) = &ag.map {
        let f = map.fraction().unwrap_or(1.0);
        println!(
            "BEV map: {} of {} cells x classes agree ({:.4} %) over {} frames, {} classes; largest probability gap {} %",
            map.same_bits, map.cell_bits, 100.0 * f, map.frames, map.classes, map.max_probability_diff
        );
    }
    if let Some(m) = min {
        if frac < m {
            anyhow::bail!("agreement {:.4} % is below --min {:.4} %", 100.0 * frac, 100.0 * m);
        }
    }
    if let Some(m) = min_map {
        let Some(map) = &ag.map else {
            anyhow::bail!("--min-map: the replays wrote no BEV map (replay with --camera-model and cameras in the bag)");
        };
        let f = map.fraction().unwrap_or(1.0);
        if f < m {
            anyhow::bail!("BEV map agreement {:.4} % is below --min-map {:.4} %", 100.0 * f, 100.0 * m);
        }
    }
    Ok(())
}

fn print_outcome(r: &sptr::eval::Report, out: &Path) {
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

/// `sptr bench model`: end-to-end segmentation latency and device memory (JSON line).
#[allow(clippy::too_many_arguments)]
fn bench_model_cmd(
    cloud: &Path,
    format: Option<&str>,
    model: &Path,
    weights: Option<&Path>,
    seed: u64,
    device: DeviceArg,
    iters: usize,
    case: Option<String>,
    precisions: &[sptr::device::storage::Precision],
    rounds: usize,
) -> Result<()> {
    let pts = read_cloud_arg(cloud, format)?;
    let cfg = load_model(model)?.yaml;
    let w = match weights {
        Some(p) => sptr::nn::Weights::from_file(p).map_err(|e| anyhow::anyhow!("weights {e}"))?,
        None => sptr::models::sphereformer::random::random_weights(&cfg, seed).context("making random weights")?,
    };
    let case = case.unwrap_or_else(|| cloud.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    // every precision's model loaded first (one CPU model, one upload each), then timed in turn
    let base = sptr::models::sphereformer::segmenter::Segmenter::new(cfg.clone(), w).with_context(|| format!("model {}", model.display()))?;
    let list = if precisions.is_empty() { vec![cfg.precision] } else { precisions.to_vec() };
    let mut segs = Vec::with_capacity(list.len());
    for p in list {
        let mut seg = base.clone();
        seg.set_precision(p)?;
        segs.push(segmenter_device(seg, device)?);
    }
    for _ in 0..rounds {
        for seg in &segs {
            let row = sptr::bench::model::bench_segment(seg, &case, &[&pts], 3, iters)?;
            println!("{}", row.json());
        }
    }
    Ok(())
}

#[cfg(feature = "cuda")]
fn bench_bevpool_cmd(model: &Path, calib: &Path, iters: usize, dram_gbps: f64) -> Result<()> {
    use sptr::sensors::calib::camera::{Calibration, NUSCENES_CAMERAS};
    let cfg = sptr::models::bevfusion::lss::LssConfig::load(model)?;
    let calib = Calibration::load_nuscenes_json(calib, &NUSCENES_CAMERAS, 1600, 900)?;
    let dev = sptr::device::cuda::CudaDevice::new(0)?;
    let opt = sptr::bench::bevpool::BevPoolBench { iters, dram_gbps };
    for line in sptr::bench::bevpool::bench_bevpool(&dev, &cfg, &calib, &opt)? {
        println!("{line}");
    }
    Ok(())
}
#[cfg(not(feature = "cuda"))]
fn bench_bevpool_cmd(model: &Path, _: &Path, _: usize, _: f64) -> Result<()> {
    let _ = sptr::models::bevfusion::lss::LssConfig::load(model)?;
    anyhow::bail!("`bench bevpool` needs the CUDA backend: rebuild with `--features cuda`")
}

/// The sample's file in tests/data/nuscenes whose name contains `part`.
fn nuscenes_sample(part: &str) -> Result<PathBuf> {
    let dir = Path::new("tests/data/nuscenes");
    let mut hits: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("{}: pass the files explicitly", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().contains(part)))
        .collect();
    hits.sort();
    hits.into_iter().next().with_context(|| format!("no file with `{part}` in {}", dir.display()))
}

#[allow(clippy::too_many_arguments)]
fn bench_bevseg_cmd(model: PathBuf, weights: Option<PathBuf>, seed: u64, calib: PathBuf, images: Vec<PathBuf>, cloud: Option<PathBuf>, sweeps: usize, warmup: usize, iters: usize) -> Result<()> {
    use sptr::models::bevfusion::seg::{BevSegConfig, BevSegKind};
    let cfg = BevSegConfig::load(&model)?;
    let images = if images.is_empty() {
        sptr::sensors::calib::camera::NUSCENES_CAMERAS.iter().map(|c| nuscenes_sample(&format!("__{c}__"))).collect::<Result<Vec<_>>>()?
    } else {
        images
    };
    let cloud = match (cfg.kind, cloud) {
        (BevSegKind::Camera, None) if sweeps > 1 => anyhow::bail!("{} is the camera-only model: --sweeps is for the fusion model", model.display()),
        (BevSegKind::Camera, None) => None,
        (BevSegKind::Camera, Some(_)) => anyhow::bail!("{} is the camera-only model: it takes no --cloud", model.display()),
        (BevSegKind::Fusion, c) => {
            let path = match c {
                Some(p) => p,
                None => nuscenes_sample(".pcd.bin")?,
            };
            let rows = sptr::cli::bevseg::points5(&read_cloud_arg(&path, None)?);
            Some(sptr::ops::voxelize::hard::synthetic_sweeps(&rows, sweeps))
        }
    };
    run_bevseg_bench(model, weights, seed, calib, images, cloud, warmup, iters)
}

#[cfg(feature = "cuda")]
#[allow(clippy::too_many_arguments)]
fn run_bevseg_bench(model: PathBuf, weights: Option<PathBuf>, seed: u64, calib: PathBuf, images: Vec<PathBuf>, cloud: Option<Vec<[f32; 5]>>, warmup: usize, iters: usize) -> Result<()> {
    let args = sptr::bench::bevseg::BevSegBenchArgs { model, weights, seed, calib, images, cloud, warmup, iters };
    println!("{}", sptr::bench::bevseg::run_bench(&args)?);
    Ok(())
}
#[cfg(not(feature = "cuda"))]
#[allow(clippy::too_many_arguments)]
fn run_bevseg_bench(_: PathBuf, _: Option<PathBuf>, _: u64, _: PathBuf, _: Vec<PathBuf>, _: Option<Vec<[f32; 5]>>, _: usize, _: usize) -> Result<()> {
    anyhow::bail!("`bench bevseg` needs the CUDA backend: rebuild with `--features cuda`")
}
