//! `sptr`: the command-line tool. Subcommands: `voxelize` (a cloud file -> voxel summary),
//! `kernels` (compile every CUDA kernel with NVRTC), `bench voxelize` (JSON timings), `info`,
//! `bag info`, `replay` (rosbag2 replay with evaluation), `eval merge` (shards into one report),
//! `segment`, `prepare`, `random-weights` (deterministic untrained weights for a model YAML) and
//! `bevseg` (BEVFusion BEV map segmentation of one frame). Each lives in `sptr::cli`; this file
//! parses, dispatches and sets the exit status.

use clap::{Parser, Subcommand};
use sptr::cli;

#[derive(Parser)]
#[command(name = "sptr", version, about = "Sparse LiDAR perception: voxelization, sparse conv, window attention")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Voxelize a point cloud file (.bin float32 rows) as a model's preprocessing does; print a summary.
    Voxelize(cli::voxelize::VoxelizeArgs),
    /// Label every point of a cloud with a SphereFormer model (GPU or CPU): writes a SemanticKITTI
    /// `.label` file (SemanticKITTI raw ids for the SemanticKITTI classes, else class id + 1;
    /// 0 = no voxel) and prints a class histogram and per-stage timings.
    Segment(cli::segment::SegmentArgs),
    /// Run a model's preprocessing on a cloud and write the network inputs (coords.i32, feats.f32,
    /// xyz.f32, batch.i32, inputs.json) for the PyTorch parity reference.
    Prepare(cli::prepare::PrepareArgs),
    /// Write deterministic random (untrained) weights for a model YAML (SphereFormer, or a BEVFusion
    /// seg model: `arch: bevfusion_seg`, upstream names) as safetensors, so every
    /// entry point (segment, replay, bench, the node's `model.weights`) runs on a fresh machine:
    /// real timings, meaningless labels. The same model and seed give the same bytes.
    RandomWeights(cli::random_weights::RandomWeightsArgs),
    /// BEVFusion's camera encoder (Swin-T + GeneralizedLSSFPN) on a batch of normalized images:
    /// writes the neck outputs (`neck0.npy` feeds the view transform) and with --stages each
    /// backbone output (`stage{i}.npy`), NCHW float32 like upstream, into --out.
    CameraFeatures(cli::camera_features::CameraFeaturesArgs),
    /// BEVFusion BEV map segmentation (camera-only or camera + LiDAR, from the model YAML) on one
    /// frame: writes the per-class probabilities (`bev_probabilities.f32` + `.json` header, `.npy`)
    /// and `bev_map.png` (classes at --threshold over the LiDAR points) into --out.
    Bevseg(cli::bevseg::BevsegArgs),
    /// Compile every CUDA kernel with NVRTC for the given architectures (needs libnvrtc, no GPU).
    Kernels(cli::kernels::KernelsArgs),
    /// Benchmarks with machine-readable JSON output.
    Bench {
        #[command(subcommand)]
        what: cli::bench::BenchCmd,
    },
    /// What this build and machine offer: version, features, GPU, kernels.
    Info,
    /// Rosbag2 bags (MCAP or sqlite3 storage).
    Bag {
        #[command(subcommand)]
        what: cli::bag::BagCmd,
    },
    /// Replay every LiDAR frame of a rosbag2 bag through the segmentation pipeline, in
    /// timestamp order: the node's outputs into OUT/bag (MCAP), a report (JSON, Markdown, PNG
    /// plots) with mIoU when ground truth is given, and per-stage latency.
    Replay(cli::replay::ReplayArgs),
    /// Evaluation reports.
    Eval {
        #[command(subcommand)]
        what: cli::eval::EvalCmd,
    },
}

fn main() {
    let result = match Cli::parse().cmd {
        Cmd::Voxelize(a) => cli::voxelize::command(a),
        Cmd::Segment(a) => cli::segment::command(a),
        Cmd::Prepare(a) => cli::prepare::command(a),
        Cmd::RandomWeights(a) => cli::random_weights::command(a),
        Cmd::CameraFeatures(a) => cli::camera_features::command(a),
        Cmd::Bevseg(a) => cli::bevseg::command(a),
        Cmd::Kernels(a) => cli::kernels::command(a),
        Cmd::Bench { what } => cli::bench::command(what),
        Cmd::Info => cli::info::command(),
        Cmd::Bag { what } => cli::bag::command(what),
        Cmd::Replay(a) => cli::replay::command(a),
        Cmd::Eval { what } => cli::eval::command(what),
    };
    if let Err(e) = result {
        eprintln!("sptr: error: {e:#}");
        std::process::exit(cli::status::exit_status(&e));
    }
}
