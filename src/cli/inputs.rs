//! The input files the commands share: a model YAML, a cloud file in a named or guessed layout.

use std::path::Path;

use anyhow::{Context, Result};

use crate::models::sphereformer::config::ModelConfig;
use crate::Points;

/// A SphereFormer model YAML.
pub fn load_model(path: &Path) -> Result<ModelConfig> {
    // The library's errors name the file: say it once.
    ModelConfig::load(path).map_err(|e| anyhow::anyhow!("model YAML {e}"))
}

/// A cloud file in the layout `format` names (or the file name tells).
pub fn read_cloud_arg(cloud: &Path, format: Option<&str>) -> Result<Points> {
    use crate::sensors::cloud_files::{read_cloud, CloudFormat};
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

/// A copy of `p` rotated by `deg` degrees about z (for a second batch sample).
pub fn rotated_z(p: &Points, deg: f32) -> Points {
    let (s, c) = deg.to_radians().sin_cos();
    let mut q = p.clone();
    for i in 0..p.len() {
        q.x[i] = c * p.x[i] - s * p.y[i];
        q.y[i] = s * p.x[i] + c * p.y[i];
    }
    q
}
