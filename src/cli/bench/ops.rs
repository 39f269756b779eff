//! `sptr bench voxelize`, `bench spconv` and `bench attention`: the sparse ops on a cloud.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;

use crate::cli::args::{int_in, stride_arg, voxel_size_arg};
use crate::cli::inputs::{load_model, rotated_z};
use crate::models::sphereformer::config::ModelConfig;
use crate::ops::voxelize::cpu::{voxelize_cpu, VoxelParams};
use crate::Points;

#[derive(clap::Args)]
pub struct VoxelizeArgs {
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
}

/// Voxelization time on the CPU and, where `auto` resolves to CUDA, on the GPU, its points
/// uploaded from ordinary memory and through the page-locked staging buffer (one JSON line).
pub fn voxelize(a: VoxelizeArgs) -> Result<()> {
    let m = load_model(&a.model)?;
    let mut params = m.voxel_params();
    if let Some(v) = a.voxel_size {
        params.voxel_size = [v; 3];
    }
    let pts = Points::read_bin(&a.cloud, a.stride)?;
    let rot = rotated_z(&pts, 90.0);
    let mut cases: Vec<(&str, Vec<&Points>)> = vec![("single", vec![&pts])];
    if a.batch2 {
        cases.push(("batch2_rotated", vec![&pts, &rot]));
    }
    let iters = a.iters.max(1);
    // the JSON line: keys in this order, cpu_ms to 0.001, cuda_ms to 0.0001, speedup to 0.1
    use crate::bench::json::{line, Fixed};
    use crate::bench::percentiles::Percentiles;
    #[derive(serde::Serialize)]
    struct Row<'a> {
        case: &'a str,
        points: usize,
        voxels: usize,
        cpu_ms: Fixed<3>,
        cuda_ms: Option<Fixed<4>>,
        speedup: Option<Fixed<1>>,
        /// The CUDA voxelization with the points uploaded through the page-locked staging
        /// buffer (`SPTR_PINNED_STAGING`), and `cuda_ms` over it (above 1: staging is faster).
        cuda_pinned_ms: Option<Fixed<4>>,
        pinned_speedup: Option<Fixed<2>>,
    }
    #[derive(serde::Serialize)]
    struct Bench<'a> {
        bench: &'static str,
        voxel_size: [f64; 3],
        iters: usize,
        results: Vec<Row<'a>>,
    }
    let mut rows = Vec::new();
    for (name, batch) in &cases {
        let cpu = voxelize_cpu(batch, &params)?;
        let mut t_cpu = Vec::new();
        for _ in 0..iters.min(5) {
            let t = Instant::now();
            voxelize_cpu(batch, &params)?;
            t_cpu.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let cuda_ms = voxelize_cuda_ms(batch, &params, iters, false)?;
        let cuda_pinned_ms = voxelize_cuda_ms(batch, &params, iters, true)?;
        let cpu_ms = Percentiles::median(&t_cpu);
        rows.push(Row {
            case: name,
            points: cpu.stats.points_in,
            voxels: cpu.len(),
            cpu_ms: Fixed(cpu_ms),
            cuda_ms: cuda_ms.map(Fixed),
            speedup: cuda_ms.map(|v| Fixed(cpu_ms / v)),
            cuda_pinned_ms: cuda_pinned_ms.map(Fixed),
            pinned_speedup: cuda_ms.zip(cuda_pinned_ms).map(|(a, b)| Fixed(a / b)),
        });
    }
    println!("{}", line(&Bench { bench: "voxelize", voxel_size: params.voxel_size, iters, results: rows }));
    Ok(())
}


/// Median wall time of a warm CUDA voxelization (upload + all kernels + readbacks), ms, the
/// points uploaded through the page-locked staging buffer or not (`pinned`); `None` where `auto`
/// resolves to the CPU.
#[cfg(feature = "cuda-core")]
fn voxelize_cuda_ms(batch: &[&Points], params: &VoxelParams, iters: usize, pinned: bool) -> Result<Option<f64>> {
    if !crate::device::resolve(crate::device::DeviceChoice::Auto)?.is_cuda() {
        return Ok(None);
    }
    let mut dev = crate::device::cuda::CudaDevice::new(0)?;
    dev.set_pinned_staging(pinned);
    for _ in 0..3 {
        crate::ops::voxelize::cuda::voxelize_cuda(&dev, batch, params)?;
    }
    dev.synchronize()?;
    let mut t = Vec::new();
    for _ in 0..iters {
        let t0 = Instant::now();
        let v = crate::ops::voxelize::cuda::voxelize_cuda(&dev, batch, params)?;
        dev.synchronize()?;
        t.push(t0.elapsed().as_secs_f64() * 1e3);
        drop(v);
    }
    Ok(Some(crate::bench::percentiles::Percentiles::median(&t)))
}
#[cfg(not(feature = "cuda-core"))]
fn voxelize_cuda_ms(_: &[&Points], _: &VoxelParams, _: usize, _: bool) -> Result<Option<f64>> {
    Ok(None)
}

#[derive(clap::Args)]
pub struct SpconvArgs {
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

/// The case name of a cloud in the JSON (`+rot90` with the rotated copy).
#[cfg(feature = "cuda-core")]
fn case_name(cloud: &Path, batch2: bool) -> String {
    let name = cloud.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    if batch2 {
        format!("{name}+rot90")
    } else {
        name
    }
}

#[cfg(feature = "cuda-core")]
pub fn spconv(a: SpconvArgs) -> Result<()> {
    let (coords, shape) = bench_sites(&a.cloud, a.stride, &a.model, a.voxel_size, a.batch2)?;
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    let name = case_name(&a.cloud, a.batch2);
    for row in crate::bench::spconv::bench_spconv(&dev, &name, coords, shape, a.iters)? {
        println!("{}", row.json());
    }
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
pub fn spconv(a: SpconvArgs) -> Result<()> {
    let _ = bench_sites(&a.cloud, a.stride, &a.model, a.voxel_size, a.batch2)?;
    anyhow::bail!("`bench spconv` needs the CUDA backend: rebuild with `--features cuda`")
}

#[derive(clap::Args)]
pub struct AttentionArgs {
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

#[cfg(feature = "cuda-core")]
pub fn attention(a: AttentionArgs) -> Result<()> {
    let cfg = load_model(&a.model)?;
    let mut m = cfg.yaml.clone();
    if let Some(v) = a.voxel_size {
        m.voxel_size = [v; 3];
    }
    let lvl = crate::ops::attention::SphereLevel::from_model(&m, a.level)?;
    let (xyz, batch) = bench_voxel_positions(&a.cloud, a.stride, &cfg, a.voxel_size, a.batch2)?;
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    let name = format!("{}/level{}", case_name(&a.cloud, a.batch2), a.level);
    for row in crate::bench::attention::bench_attention(&dev, &name, &xyz, &batch, &lvl, a.iters)? {
        println!("{}", row.json());
    }
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
pub fn attention(a: AttentionArgs) -> Result<()> {
    let cfg = load_model(&a.model)?;
    crate::ops::attention::SphereLevel::from_model(&cfg.yaml, a.level)?;
    let _ = bench_voxel_positions(&a.cloud, a.stride, &cfg, a.voxel_size, a.batch2)?;
    anyhow::bail!("`bench attention` needs the CUDA backend: rebuild with `--features cuda`")
}
