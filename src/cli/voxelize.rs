//! `sptr voxelize`: a cloud file voxelized as a model's preprocessing does it, summarised.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Result;

use super::args::stride_arg;
use super::device::DeviceArg;
use super::inputs::load_model;
use crate::device::Device;
use crate::ops::voxelize::cpu::{voxelize_cpu, VoxelParams, Voxels};
use crate::Points;

#[derive(clap::Args)]
pub struct VoxelizeArgs {
    /// KITTI (x, y, z, intensity) or nuScenes (x, y, z, intensity, ring) .bin file.
    cloud: PathBuf,
    /// Model YAML whose voxel settings to use.
    #[arg(long, default_value = "config/models/sphereformer_nuscenes.yaml")]
    model: PathBuf,
    /// float32 columns per point: 4 (KITTI), 5 (nuScenes), 3 (x, y, z only).
    #[arg(long, default_value_t = 5, value_parser = stride_arg)]
    stride: usize,
    #[command(flatten)]
    device: DeviceArg,
}

pub fn command(a: VoxelizeArgs) -> Result<()> {
    let m = load_model(&a.model)?;
    let pts = Points::read_bin(&a.cloud, a.stride)?;
    let params = m.voxel_params();
    let device = a.device.resolve()?.device;
    println!("cloud             {}", a.cloud.display());
    println!("model             {}", a.model.display());
    if device == Device::Cuda {
        return voxelize_cuda(&pts, &params);
    }
    let t = Instant::now();
    let v = voxelize_cpu(&[&pts], &params)?;
    summarize(&v, t.elapsed().as_secs_f64() * 1e3, "cpu");
    Ok(())
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

#[cfg(feature = "cuda-core")]
fn voxelize_cuda(pts: &Points, params: &VoxelParams) -> Result<()> {
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    // First call compiles or loads the kernels; time the second.
    crate::ops::voxelize::cuda::voxelize_cuda(&dev, &[pts], params)?;
    dev.synchronize()?;
    let t = Instant::now();
    let v = crate::ops::voxelize::cuda::voxelize_cuda(&dev, &[pts], params)?;
    dev.synchronize()?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    summarize(&v.to_host(&dev)?, ms, &format!("cuda ({}, {})", dev.name, dev.arch.sm()));
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
fn voxelize_cuda(_: &Points, _: &VoxelParams) -> Result<()> {
    anyhow::bail!("this build has no CUDA support: rebuild with `--features cuda`, or pass --device cpu")
}
