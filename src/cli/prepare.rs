//! `sptr prepare`: a model's preprocessing on a cloud, the network inputs written for the
//! PyTorch parity reference.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};

use super::inputs::{load_model, read_cloud_arg};

#[derive(clap::Args)]
pub struct PrepareArgs {
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
}

pub fn command(a: PrepareArgs) -> Result<()> {
    let pts = read_cloud_arg(&a.cloud, a.format.as_deref())?;
    let cfg = load_model(&a.model)?.yaml;
    let t = Instant::now();
    let inputs = crate::models::sphereformer::preprocess::prepare_inputs(&[&pts], &cfg).context("preprocessing")?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    inputs.write_dir(&a.out, cfg.input_c, &a.cloud.display().to_string())?;
    println!(
        "{} points -> {} voxels ({} coordinate collisions resolved) in {ms:.1} ms -> {}",
        pts.len(),
        inputs.len(),
        inputs.coord_fixups,
        a.out.display()
    );
    Ok(())
}
