//! `sptr bench camera-input`, `lidar-encoder`, `bev-decoder`, `camera`, `bevseg` and
//! `bevpool`: BEVFusion's parts (CUDA, random weights unless given).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::cli::args::{bandwidth_arg, int_in};
use crate::sensors::calib::camera::Calibration;
use crate::sensors::image::compressed::JpegDecoderChoice;

#[derive(clap::Args)]
pub struct CameraInputArgs {
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
    decoder: Vec<JpegDecoderChoice>,
    /// Alternating rounds of `iters` frames per decoder (each round's median is reported).
    #[arg(long, default_value_t = 3, value_parser = int_in::<1, 100>)]
    rounds: usize,
}

/// The CPU reference always; the CUDA preprocessing where `auto` resolves to CUDA.
pub fn camera_input(a: CameraInputArgs) -> Result<()> {
    let cfg = crate::ops::image_preprocess::cpu::ImagePreprocess::load(&a.model)?;
    let limits = crate::sensors::image::encodings::DecodeLimits::default();
    let jpegs = a.images.iter().map(|p| std::fs::read(p).with_context(|| format!("reading {}", p.display()))).collect::<Result<Vec<_>>>()?;
    #[allow(unused_mut)]
    let mut out = crate::bench::camera_input::camera_input_bench(&jpegs, &cfg, &limits, a.warmup, a.iters)?;
    #[cfg(feature = "cuda-core")]
    if crate::device::resolve(crate::device::DeviceChoice::Auto)?.is_cuda() {
        let dev = crate::device::cuda::CudaDevice::new(0)?;
        out["cuda"] = crate::bench::camera_input::camera_input_bench_cuda(&dev, &jpegs, &cfg, &limits, a.warmup, a.iters, &a.decoder, a.rounds)?;
    }
    println!("{out}");
    Ok(())
}

#[derive(clap::Args)]
pub struct LidarEncoderArgs {
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
}

#[cfg(feature = "cuda-core")]
pub fn lidar_encoder(a: LidarEncoderArgs) -> Result<()> {
    use crate::models::bevfusion::lidar_encoder::{cuda, random_weights, LidarEncoder, LidarEncoderConfig};
    use crate::ops::voxelize::hard::{point_rows, synthetic_sweeps};
    let cfg = LidarEncoderConfig::load(&a.model)?;
    let enc = LidarEncoder::load(&cfg, &random_weights(&cfg, a.seed)?)?;
    let points = synthetic_sweeps(&point_rows(&crate::Points::read_bin(&a.cloud, 5)?, 0.0), a.sweeps);
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    let gpu = cuda::CudaLidarEncoder::upload(&dev, &enc)?;
    println!("{}", crate::bench::lidar_encoder::bench(&dev, &gpu, &points, a.warmup, a.iters)?);
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
pub fn lidar_encoder(a: LidarEncoderArgs) -> Result<()> {
    let _ = crate::models::bevfusion::lidar_encoder::LidarEncoderConfig::load(&a.model)?;
    anyhow::bail!("`bench lidar-encoder` needs the CUDA backend: rebuild with `--features cuda`")
}

#[derive(clap::Args)]
pub struct BevDecoderArgs {
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
}

#[cfg(feature = "cuda-core")]
pub fn bev_decoder(a: BevDecoderArgs) -> Result<()> {
    let args = crate::bench::bev_decoder::BevDecoderBenchArgs { models: a.models, seed: a.seed, warmup: a.warmup, iters: a.iters, bev: a.bev };
    for line in crate::bench::bev_decoder::run_bench(&args)? {
        println!("{line}");
    }
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
pub fn bev_decoder(_: BevDecoderArgs) -> Result<()> {
    anyhow::bail!("`bench bev-decoder` needs the CUDA backend: rebuild with `--features cuda`")
}

#[derive(clap::Args)]
pub struct CameraArgs {
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
}

#[cfg(feature = "cuda-core")]
pub fn camera(a: CameraArgs) -> Result<()> {
    let args = crate::bench::camera_encoder::CameraBenchArgs {
        model: a.model,
        input: a.input,
        n: a.batch,
        h: a.height,
        w: a.width,
        seed: a.seed,
        warmup: a.warmup,
        iters: a.iters,
    };
    for line in crate::bench::camera_encoder::run_bench(&args)? {
        println!("{line}");
    }
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
pub fn camera(_: CameraArgs) -> Result<()> {
    anyhow::bail!("`bench camera` needs the CUDA backend: rebuild with `--features cuda`")
}

#[derive(clap::Args)]
pub struct BevsegArgs {
    /// Model YAML (`config/models/bevfusion_seg_camera.yaml` or `_fusion.yaml`).
    #[arg(long, default_value = "config/models/bevfusion_seg_fusion.yaml")]
    model: PathBuf,
    /// safetensors weights (default: deterministic random weights, --seed).
    #[arg(long)]
    weights: Option<PathBuf>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The rig: a calibration YAML (any cameras, each with intrinsics and image_size) or a
    /// nuScenes calib.json (its six cameras, intrinsics for the images' size).
    #[arg(long, default_value = "tests/data/nuscenes/calib.json")]
    calib: PathBuf,
    /// One JPEG per camera of --calib: CAM=FILE (matched by name), or plain files in the
    /// calibration's camera order (a calib.json: CAM_FRONT, CAM_FRONT_RIGHT, CAM_FRONT_LEFT,
    /// CAM_BACK, CAM_BACK_LEFT, CAM_BACK_RIGHT); default: the six of tests/data/nuscenes.
    #[arg(long, num_args = 1..)]
    images: Vec<String>,
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

/// The bench's rig: the calibration (a calibration YAML: any cameras; a calib.json: nuScenes'
/// six, its intrinsics for the images' size) and one JPEG per camera in the calibration's
/// order, from `CAM=FILE` matched by name or plain files in that order (none: the nuScenes
/// sample's six). The bench times whole frames: every camera needs its image.
fn bench_rig(calib_path: &Path, images: &[String]) -> Result<(Calibration, Vec<PathBuf>)> {
    use crate::cli::bevseg::{images_by_camera, parse_camera_image};
    use crate::sensors::calib::file::{calibration_from_file, is_calibration_yaml, NUSCENES_IMAGE_SIZE};
    let named = images.iter().filter(|s| s.contains('=')).count();
    if named != 0 && named != images.len() {
        anyhow::bail!("--images: give every image as CAM=FILE, or none (plain files in the calibration's camera order)");
    }
    let plain: Vec<PathBuf> = match images.is_empty() {
        true => crate::sensors::calib::camera::NUSCENES_CAMERAS.iter().map(|c| nuscenes_sample(&format!("__{c}__"))).collect::<Result<_>>()?,
        false if named == 0 => images.iter().map(PathBuf::from).collect(),
        false => Vec::new(),
    };
    let pairs: Vec<(String, PathBuf)> = images[..named].iter().map(|s| parse_camera_image(s).map_err(|e| anyhow::anyhow!("--images {e}"))).collect::<Result<_>>()?;
    // a calib.json's intrinsics are for the images' size: the first image's (the bench checks
    // every image against its camera's calibrated size)
    let json_size = match is_calibration_yaml(calib_path) {
        true => NUSCENES_IMAGE_SIZE,
        false => {
            let first = pairs.first().map_or_else(|| &plain[0], |(_, f)| f);
            let bytes = std::fs::read(first).with_context(|| format!("--images {}: cannot read", first.display()))?;
            crate::sensors::image::compressed::jpeg_size(&bytes, &crate::sensors::image::encodings::DecodeLimits::default())
                .map_err(|e| anyhow::anyhow!("{}: {e}", first.display()))?
        }
    };
    let calib = calibration_from_file(calib_path, json_size)?;
    let names: Vec<&str> = calib.cameras.iter().map(|c| c.name.as_str()).collect();
    let ordered: Vec<PathBuf> = if named > 0 {
        let slots = images_by_camera(&calib, &pairs)?;
        let missing: Vec<&str> = names.iter().zip(&slots).filter(|(_, f)| f.is_none()).map(|(n, _)| *n).collect();
        if !missing.is_empty() {
            anyhow::bail!("--images: no image for {}: the bench times whole frames, give every camera of the calibration ({})", missing.join(", "), names.join(", "));
        }
        slots.into_iter().flatten().cloned().collect()
    } else {
        if plain.len() != calib.len() {
            anyhow::bail!("--images: {} images for the calibration's {} cameras: give one per camera in the order {} (or CAM=FILE)", plain.len(), calib.len(), names.join(", "));
        }
        plain
    };
    Ok((calib, ordered))
}

/// The rig (default: the nuScenes sample's six images) and, for the fusion model, the cloud as
/// `--sweeps` synthetic sweeps; then the bench.
pub fn bevseg(a: BevsegArgs) -> Result<()> {
    use crate::models::bevfusion::seg::{BevSegConfig, BevSegKind};
    let cfg = BevSegConfig::load(&a.model)?;
    let (calib, images) = bench_rig(&a.calib, &a.images)?;
    let cloud = match (cfg.kind, a.cloud) {
        (BevSegKind::Camera, None) if a.sweeps > 1 => anyhow::bail!("{} is the camera-only model: --sweeps is for the fusion model", a.model.display()),
        (BevSegKind::Camera, None) => None,
        (BevSegKind::Camera, Some(_)) => anyhow::bail!("{} is the camera-only model: it takes no --cloud", a.model.display()),
        (BevSegKind::Fusion, c) => {
            let path = match c {
                Some(p) => p,
                None => nuscenes_sample(".pcd.bin")?,
            };
            let rows = crate::cli::bevseg::points5(&crate::cli::inputs::read_cloud_arg(&path, None)?);
            Some(crate::ops::voxelize::hard::synthetic_sweeps(&rows, a.sweeps))
        }
    };
    run_bevseg_bench(a.model, a.weights, a.seed, calib, images, cloud, a.warmup, a.iters)
}

#[cfg(feature = "cuda-core")]
#[allow(clippy::too_many_arguments)]
fn run_bevseg_bench(model: PathBuf, weights: Option<PathBuf>, seed: u64, calib: Calibration, images: Vec<PathBuf>, cloud: Option<Vec<[f32; 5]>>, warmup: usize, iters: usize) -> Result<()> {
    let args = crate::bench::bevseg::BevSegBenchArgs { model, weights, seed, calib, images, cloud, warmup, iters };
    println!("{}", crate::bench::bevseg::run_bench(&args)?);
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
#[allow(clippy::too_many_arguments)]
fn run_bevseg_bench(_: PathBuf, _: Option<PathBuf>, _: u64, _: Calibration, _: Vec<PathBuf>, _: Option<Vec<[f32; 5]>>, _: usize, _: usize) -> Result<()> {
    anyhow::bail!("`bench bevseg` needs the CUDA backend: rebuild with `--features cuda`")
}

#[derive(clap::Args)]
pub struct BevpoolArgs {
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
    /// L2 read bandwidth for the L2 floor in GB/s (H100 SXM: about 5500 in microbenchmarks).
    #[arg(long, default_value_t = 5500.0, value_parser = bandwidth_arg)]
    l2_gbps: f64,
}

#[cfg(feature = "cuda-core")]
pub fn bevpool(a: BevpoolArgs) -> Result<()> {
    use crate::sensors::calib::camera::{Calibration, NUSCENES_CAMERAS};
    let cfg = crate::models::bevfusion::lss::LssConfig::load(&a.model)?;
    let calib = Calibration::load_nuscenes_json(&a.calib, &NUSCENES_CAMERAS, 1600, 900)?;
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    let opt = crate::bench::bevpool::BevPoolBench { iters: a.iters, dram_gbps: a.dram_gbps, l2_gbps: a.l2_gbps };
    for line in crate::bench::bevpool::bench_bevpool(&dev, &cfg, &calib, &opt)? {
        println!("{line}");
    }
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
pub fn bevpool(a: BevpoolArgs) -> Result<()> {
    let _ = crate::models::bevfusion::lss::LssConfig::load(&a.model)?;
    anyhow::bail!("`bench bevpool` needs the CUDA backend: rebuild with `--features cuda`")
}
