//! `sptr segment`: every point of a cloud labelled by a SphereFormer model, a class histogram,
//! per-stage timings and optionally a SemanticKITTI `.label` file.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};

use super::args::{precision_arg, progress_mode};
use super::device::DeviceArg;
use super::inputs::{load_model, read_cloud_arg};
use super::status::{print_out_of_range, OutOfRange};
use crate::device::storage::Precision;
use crate::device::Device;
use crate::models::sphereformer::segmenter::{Segmentation, Segmenter, UNLABELED};
use crate::Points;

#[derive(clap::Args)]
pub struct SegmentArgs {
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
    #[command(flatten)]
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
    /// frame leaves FP16's range; docs/precision.md). Default: the model YAML's `precision`.
    #[arg(long, value_parser = precision_arg)]
    precision: Option<Precision>,
}

/// Read, segment, report, optionally write a `.label` file.
pub fn command(a: SegmentArgs) -> Result<()> {
    let pts = read_cloud_arg(&a.cloud, a.format.as_deref())?;
    let t0 = Instant::now();
    let mut cfg = load_model(&a.model)?.yaml;
    if let Some(p) = a.precision {
        cfg.precision = p;
    }
    let w = match (&a.weights, a.random_weights) {
        (Some(p), _) => crate::nn::Weights::from_file(p).map_err(|e| anyhow::anyhow!("weights {e}"))?,
        (None, Some(seed)) => crate::models::sphereformer::random::random_weights(&cfg, seed).context("making random weights")?,
        (None, None) => anyhow::bail!("pass --weights FILE (or --random-weights SEED for untrained weights)"),
    };
    // A mismatch error names the weights file itself.
    let device = a.device.resolve()?.device;
    let mut seg = Segmenter::on_device(cfg, w, device)
        .with_context(|| format!("building the model on {device:?}"))
        .with_context(|| format!("model {}", a.model.display()))?;
    let source = a.weights.as_ref().map_or_else(|| format!("random weights, seed {}", a.random_weights.unwrap_or(0)), |p| p.display().to_string());
    println!("model loaded on {:?} in {:.1} ms ({source})", seg.device(), t0.elapsed().as_secs_f64() * 1e3);
    // The CPU takes minutes on a few hundred thousand voxels: say where it is, stage by stage.
    let stages = (seg.device() == Device::Cpu).then(|| {
        let p = super::segment_progress::StageProgress::new(
            progress_mode(&a.progress),
            crate::models::sphereformer::network::cpu_stage_names(seg.config()),
        );
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
        if !a.allow_overflow {
            return Err(OutOfRange(format!(
                "the labels cannot be trusted, none written (docs/precision.md); {}; --allow-overflow to write them anyway",
                r.range.summary(1)
            ))
            .into());
        }
        eprintln!("sptr: warning: labels out of the FP16 range kept (--allow-overflow)");
    }
    report(&seg, &pts, &r);
    if let Some(path) = &a.out {
        use super::segment_files::{write_label_file, LabelIds};
        let ids = LabelIds::for_classes(&seg.config().class_names);
        write_label_file(path, &r.labels, ids).with_context(|| format!("writing {}", path.display()))?;
        println!("wrote {} ({ids:?} ids)", path.display());
    }
    Ok(())
}

/// The class histogram and the stage times on stdout.
fn report(seg: &Segmenter, pts: &Points, r: &Segmentation) {
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
}
