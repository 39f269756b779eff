//! `sptr bevseg`: a BEVFusion seg model on one frame of files — camera images named by camera,
//! a nuScenes-style `calib.json` (intrinsics for `--image-size`, nuScenes' raw 1600 × 900 by
//! default) or the project's calibration YAML (`image_size` per camera), optionally a LiDAR
//! cloud — written as the BEV map files of
//! [`BevMap::write_dir`](crate::models::bevfusion::map::BevMap::write_dir), with `--dump-stages` each
//! stage's tensor as NCHW float32 `.npy` for the parity harness.
//!
//! An image whose size is not its camera's calibrated size is masked (`size_mismatch`, as the
//! node and replay mask it: intrinsics are only valid for the image size they were calibrated
//! at), with a warning; the camera-only model with no usable image is an error.

use crate::device::Device;
use crate::models::bevfusion::seg::{BevSegConfig, BevSegKind, BevSegModel, BevSegStages, Point5};
use crate::sensors::calib::camera::Calibration;
use crate::sensors::calib::file::{calibration_from_file, is_calibration_yaml};
use crate::sensors::calib::file::NUSCENES_IMAGE_SIZE;
use crate::sensors::image::compressed::decode_compressed;
use crate::sensors::image::encodings::{DecodeLimits, RgbImage};
use crate::nn::npy;
use crate::ops::dense::FeatureMap;
use crate::nn::random::save_tensors;
use crate::nn::Weights;
use crate::Points;
use crate::Error;
use std::path::{Path, PathBuf};

/// Where the weights come from.
#[derive(Debug, Clone)]
pub enum SegWeights {
    File(PathBuf),
    /// Deterministic random weights with this seed (optionally also written as safetensors).
    Random { seed: u64, save: Option<PathBuf> },
}

/// What `sptr bevseg` does.
#[derive(Debug, Clone)]
pub struct BevSegJob {
    pub model: PathBuf,
    pub weights: SegWeights,
    pub calib: PathBuf,
    /// The raw image size a calib.json's intrinsics are for (None: [`NUSCENES_IMAGE_SIZE`]); a
    /// calibration YAML gives each camera's own, and this must then be None.
    pub image_size: Option<(usize, usize)>,
    /// `(camera name, image file)`; cameras of the calibration without an image are masked.
    pub images: Vec<(String, PathBuf)>,
    pub cloud: Option<Points>,
    pub out: PathBuf,
    /// Where the model runs (resolved from `--device`).
    pub device: Device,
    /// Write each stage's tensor into `out/stages/`.
    pub dump_stages: bool,
    /// Threshold of the PNG's classes.
    pub threshold: f32,
}

/// A camera whose image is not the size its calibration is for: masked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeMismatch {
    pub camera: String,
    pub file: PathBuf,
    /// The image's `(width, height)`.
    pub image: (usize, usize),
    /// The calibration's.
    pub calibrated: (usize, usize),
}

impl std::fmt::Display for SizeMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "camera {}: image {} is {} x {} but its calibration is for {} x {}: masked (size_mismatch)",
            self.camera,
            self.file.display(),
            self.image.0,
            self.image.1,
            self.calibrated.0,
            self.calibrated.1
        )
    }
}

/// The rig's cameras from `path` ([`calibration_from_file`]); `image_size` says what a
/// calib.json's intrinsics are for (default [`NUSCENES_IMAGE_SIZE`]) and is refused with a
/// calibration YAML, which gives each camera's own.
pub fn load_calibration(path: &Path, image_size: Option<(usize, usize)>) -> Result<Calibration, Error> {
    if let (true, Some((w, h))) = (is_calibration_yaml(path), image_size) {
        return Err(Error::InvalidInput(format!(
            "--image-size {w}x{h}: {} is a calibration YAML, which gives each camera's image_size; --image-size is for a calib.json",
            path.display()
        )));
    }
    calibration_from_file(path, image_size.unwrap_or(NUSCENES_IMAGE_SIZE))
}

/// Parses `CAM=FILE`.
pub fn parse_camera_image(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((cam, file)) if !cam.is_empty() && !file.is_empty() => Ok((cam.to_string(), PathBuf::from(file))),
        _ => Err(format!("`{s}`: expected CAMERA=FILE, e.g. CAM_FRONT=front.jpg")),
    }
}

/// The upstream point layout of a decoded cloud: `(x, y, z, intensity, time lag)`, the lag the
/// cloud's per-point time when it has one, else 0 (a single sweep: upstream zeroes column 4 of
/// the key frame).
pub fn points5(p: &Points) -> Vec<Point5> {
    (0..p.len()).map(|i| [p.x[i], p.y[i], p.z[i], p.intensity[i], p.time.as_ref().map_or(0.0, |t| t[i])]).collect()
}

/// `--images CAM=FILE` in the calibration's camera order: each camera's file, `None` for a
/// camera without one; an unknown camera or one given twice is an error naming the
/// calibration's cameras.
pub fn images_by_camera<'a>(calib: &Calibration, images: &'a [(String, PathBuf)]) -> Result<Vec<Option<&'a PathBuf>>, Error> {
    let mut slots = vec![None; calib.len()];
    for (cam, file) in images {
        let i = calib.cameras.iter().position(|c| &c.name == cam).ok_or_else(|| {
            let names: Vec<&str> = calib.cameras.iter().map(|c| c.name.as_str()).collect();
            Error::InvalidInput(format!("--images {cam}={}: unknown camera; the calibration's cameras are {}", file.display(), names.join(", ")))
        })?;
        if slots[i].replace(file).is_some() {
            return Err(Error::InvalidInput(format!("--images: camera {cam} is given twice")));
        }
    }
    Ok(slots)
}

/// Decodes the images and orders them as the calibration's cameras; checks that every image
/// names a camera of the calibration and that no camera has two. An image
/// of another size than its camera's calibration is left out (its slot None: masked) and
/// returned in the mismatches.
pub fn load_frame(job: &BevSegJob) -> Result<(Calibration, Vec<Option<RgbImage>>, Vec<SizeMismatch>), Error> {
    if job.images.is_empty() {
        return Err(Error::InvalidInput("no camera images given (--images CAM=FILE ...)".into()));
    }
    let calib = load_calibration(&job.calib, job.image_size)?;
    let limits = DecodeLimits::default();
    let mut slots: Vec<Option<RgbImage>> = vec![None; calib.len()];
    let mut mismatches = Vec::new();
    for (i, file) in images_by_camera(&calib, &job.images)?.into_iter().enumerate() {
        let Some(file) = file else { continue };
        let bytes = std::fs::read(file).map_err(|e| Error::Io(format!("{}: cannot read: {e}", file.display())))?;
        let img = decode_compressed("", &bytes, &limits).map_err(|e| Error::InvalidInput(format!("{}: {e}", file.display())))?;
        let c = &calib.cameras[i];
        if (img.width, img.height) != (c.image_width, c.image_height) {
            mismatches.push(SizeMismatch { camera: c.name.clone(), file: file.clone(), image: (img.width, img.height), calibrated: (c.image_width, c.image_height) });
        } else {
            slots[i] = Some(img);
        }
    }
    Ok((calib, slots, mismatches))
}

fn write_stage(dir: &Path, name: &str, m: &FeatureMap) -> Result<(), Error> {
    npy::write_f32(&dir.join(format!("{name}.npy")), &[m.n, m.c, m.h, m.w], &m.to_nchw())
}

/// Writes the stage tensors NCHW (`input`, `camera_bev`, `lidar_bev`, `fused`, `decoder`, `head`).
pub fn write_stages(dir: &Path, s: &BevSegStages) -> Result<Vec<String>, Error> {
    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: cannot create: {e}", dir.display())))?;
    let mut names = Vec::new();
    for (name, m) in s.named() {
        write_stage(dir, name, m)?;
        names.push(name.to_string());
    }
    Ok(names)
}

/// Runs the job; returns a printable summary.
pub fn run(job: &BevSegJob) -> Result<String, Error> {
    let cfg = BevSegConfig::load(&job.model)?;
    let weights = match &job.weights {
        SegWeights::File(p) => Weights::from_file(p)?,
        SegWeights::Random { seed, save } => {
            let t = crate::models::bevfusion::seg::random_tensors(&cfg, *seed)?;
            if let Some(p) = save {
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: cannot create: {e}", dir.display())))?;
                }
                save_tensors(p, &t)?;
            }
            Weights::from_tensors(&format!("random BEVFusion seg weights (seed {seed})"), t)?
        }
    };
    let (calib, images, mismatches) = load_frame(job)?;
    for m in &mismatches {
        eprintln!("sptr: warning: {m}");
    }
    let cloud = job.cloud.as_ref().map(points5);
    if cfg.kind == BevSegKind::Fusion && cloud.is_none() {
        return Err(Error::InvalidInput(format!("{} is the camera + LiDAR model: pass --cloud FILE", job.model.display())));
    }
    if cfg.kind == BevSegKind::Camera && cloud.is_some() {
        return Err(Error::InvalidInput(format!("{} is the camera-only model: it takes no --cloud", job.model.display())));
    }
    if cfg.kind == BevSegKind::Camera && images.iter().all(Option::is_none) {
        let list: Vec<String> = mismatches.iter().map(|m| format!("{} ({} x {})", m.camera, m.image.0, m.image.1)).collect();
        return Err(Error::InvalidInput(format!(
            "no camera image fits its calibration ({}: size_mismatch; calibrated for {}), and the camera-only model needs at least one: \
             give images of the calibrated size, or say which size a calib.json is for with --image-size WxH",
            list.join(", "),
            calibrated_sizes(&calib)
        )));
    }
    let refs: Vec<Option<&RgbImage>> = images.iter().map(Option::as_ref).collect();
    let start = std::time::Instant::now();
    let out = if job.device == Device::Cuda {
        run_cuda(&cfg, weights, &calib, &refs, cloud.as_deref(), job.dump_stages)?
    } else {
        let mut model = BevSegModel::from_weights(&cfg, weights)?;
        model.forward(&calib, &refs, cloud.as_deref(), job.dump_stages)?
    };
    let took = start.elapsed().as_secs_f64() * 1e3;
    let pts: Vec<(f32, f32)> = cloud.iter().flatten().map(|p| (p[0], p[1])).collect();
    let title = format!("{} ({}) — classes at p >= {}", job.model.display(), cfg.kind.name(), job.threshold);
    let w = out.map.write_dir(&job.out, job.threshold, &pts, &title)?;
    let mut lines = vec![format!(
        "{} model on {} in {took:.0} ms (load and first-frame setup included): {} classes x {} x {} cells at {} m",
        cfg.kind.name(),
        job.device,
        out.map.classes.len(),
        out.map.nx,
        out.map.ny,
        out.map.resolution
    )];
    let stage_line: Vec<String> = out.times.0.iter().map(|(n, ms)| format!("{n} {ms:.1}")).collect();
    lines.push(format!("stages (ms{}): {}", if job.device == Device::Cuda { ", GPU time" } else { "" }, stage_line.join(", ")));
    if !out.map.masked_cameras.is_empty() {
        let (sized, absent): (Vec<&String>, Vec<&String>) = out.map.masked_cameras.iter().partition(|c| mismatches.iter().any(|m| &m.camera == *c));
        let mut why = Vec::new();
        if !absent.is_empty() {
            why.push(format!("no image: {}", absent.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")));
        }
        if !sized.is_empty() {
            why.push(format!("size_mismatch: {}", sized.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")));
        }
        lines.push(format!("masked cameras: {} of {} ({})", out.map.masked_cameras.len(), calib.len(), why.join("; ")));
    }
    if let Some(l) = &out.map.lidar {
        lines.push(format!(
            "LiDAR: {} points, {} non-finite dropped, {} in range, {} voxels ({} dropped at max_voxels){}",
            l.points_in,
            l.points_non_finite,
            l.points_in_range,
            l.voxels,
            l.voxels_dropped,
            if l.empty { "; no usable point: the LiDAR BEV is zero" } else { "" }
        ));
    }
    for (c, name) in out.map.classes.iter().enumerate() {
        let n = out.map.probabilities[c * out.map.cells()..(c + 1) * out.map.cells()].iter().filter(|&&p| p >= job.threshold).count();
        lines.push(format!("  {name}: {n} cells >= {}", job.threshold));
    }
    lines.push(format!("wrote {}, {}, {}, {}", w.raw.display(), w.header.display(), w.npy.display(), w.png.display()));
    if let Some(s) = &out.stages {
        let dir = job.out.join("stages");
        let names = write_stages(&dir, s)?;
        lines.push(format!("stages ({}) -> {}", names.join(", "), dir.display()));
    }
    Ok(lines.join("\n"))
}

/// The calibration's image sizes, e.g. `1600 x 900` (or each camera's when they differ).
fn calibrated_sizes(calib: &Calibration) -> String {
    let sizes: Vec<(usize, usize)> = calib.cameras.iter().map(|c| (c.image_width, c.image_height)).collect();
    if sizes.windows(2).all(|w| w[0] == w[1]) {
        sizes.first().map(|(w, h)| format!("{w} x {h}")).unwrap_or_default()
    } else {
        calib.cameras.iter().map(|c| format!("{} {} x {}", c.name, c.image_width, c.image_height)).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(feature = "cuda-core")]
fn run_cuda(
    cfg: &BevSegConfig,
    weights: Weights,
    calib: &Calibration,
    images: &[Option<&RgbImage>],
    cloud: Option<&[Point5]>,
    stages: bool,
) -> Result<crate::models::bevfusion::seg::BevSegOutput, Error> {
    let model = BevSegModel::from_weights(cfg, weights)?;
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    let mut gpu = crate::models::bevfusion::seg_cuda::CudaBevSeg::upload(&dev, &model, crate::ops::dense::conv_engine::ConvBackend::Cudnn)?;
    gpu.forward_images(&dev, calib, images, cloud, stages)
}

#[cfg(not(feature = "cuda-core"))]
fn run_cuda(
    _: &BevSegConfig,
    _: Weights,
    _: &Calibration,
    _: &[Option<&RgbImage>],
    _: Option<&[Point5]>,
    _: bool,
) -> Result<crate::models::bevfusion::seg::BevSegOutput, Error> {
    Err(Error::InvalidInput("this build has no CUDA backend: rebuild with `--features cuda` or use --device cpu".into()))
}

/// `sptr bevseg`'s arguments.
#[derive(clap::Args)]
pub struct BevsegArgs {
    /// Model YAML (`config/models/bevfusion_seg_camera.yaml` or `_fusion.yaml`).
    #[arg(long)]
    model: PathBuf,
    /// safetensors weights with BEVFusion's state_dict names (docs/models.md, from the upstream .pth).
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
    #[arg(long, value_name = "WxH", value_parser = super::args::image_size_arg)]
    image_size: Option<(usize, usize)>,
    /// Camera images as CAMERA=FILE (JPEG or PNG), e.g. CAM_FRONT=front.jpg; cameras without
    /// an image, or with one of another size than calibrated, are masked (and reported).
    #[arg(long, required = true, num_args = 1.., value_parser = parse_camera_image)]
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
    #[command(flatten)]
    device: super::device::DeviceArg,
    /// Probability at or above which the PNG draws a class.
    #[arg(long, default_value_t = 0.5, value_parser = super::args::fraction_arg)]
    threshold: f64,
    /// Also write each stage's tensor (input, camera_bev, lidar_bev, fused, decoder, head) as
    /// NCHW float32 .npy into OUT/stages (the parity harness reads them).
    #[arg(long)]
    dump_stages: bool,
}

/// `sptr bevseg`: the job from the arguments, run, its summary printed.
pub fn command(a: BevsegArgs) -> anyhow::Result<()> {
    let weights = match (a.weights, a.random_weights) {
        (Some(w), _) => SegWeights::File(w),
        (None, Some(seed)) => SegWeights::Random { seed, save: a.save_weights },
        (None, None) => anyhow::bail!("pass --weights FILE (or --random-weights SEED for an untrained smoke run)"),
    };
    let cloud = a.cloud.map(|c| super::inputs::read_cloud_arg(&c, a.format.as_deref())).transpose()?;
    let device = a.device.resolve()?.device;
    let job = BevSegJob {
        model: a.model,
        weights,
        calib: a.calib,
        image_size: a.image_size,
        images: a.images,
        cloud,
        out: a.out,
        device,
        dump_stages: a.dump_stages,
        threshold: a.threshold as f32,
    };
    println!("{}", run(&job)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sensors::calib::camera::NUSCENES_CAMERAS;

    /// A calibration YAML of `names`, each 1920 x 1080 with a pinhole looking along its own yaw.
    fn rig_yaml(names: &[&str]) -> String {
        let mut y = String::from("cameras:\n");
        for (i, n) in names.iter().enumerate() {
            let a = i as f64 * std::f64::consts::TAU / names.len() as f64;
            let (c, s) = (a.cos(), a.sin());
            // camera z (optical axis) along (c, s, 0) of the LiDAR, camera x to its right, y down
            y.push_str(&format!(
                "  {n}:\n    camera_to_lidar: [[{}, 0, {c}, 0], [{}, 0, {s}, 0], [0, -1, 0, 1.5], [0, 0, 0, 1]]\n    \
                 intrinsics: [[1200, 0, 960], [0, 1200, 540], [0, 0, 1]]\n    image_size: [1920, 1080]\n",
                s, -c
            ));
        }
        y
    }

    #[test]
    fn any_rig_of_a_calibration_file_is_the_models_cameras() {
        let dir = std::env::temp_dir().join(format!("sptr-bevseg-rig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("rig5.yaml");
        std::fs::write(&path, rig_yaml(&["rear_right", "front", "front_left", "front_right", "rear_left"])).unwrap();
        let calib = load_calibration(&path, None).unwrap();
        let names: Vec<&str> = calib.cameras.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["front", "front_left", "front_right", "rear_left", "rear_right"]);
        assert!(calib.cameras.iter().all(|c| (c.image_width, c.image_height) == (1920, 1080)));
        // an image of a camera the file does not have is refused, naming the file's cameras
        let job = BevSegJob {
            model: PathBuf::new(),
            weights: SegWeights::Random { seed: 0, save: None },
            calib: path.clone(),
            image_size: None,
            images: vec![("CAM_FRONT".into(), dir.join("x.jpg"))],
            cloud: None,
            out: dir.clone(),
            device: crate::device::Device::Cpu,
            dump_stages: false,
            threshold: 0.5,
        };
        let e = load_frame(&job).unwrap_err().to_string();
        assert!(e.contains("unknown camera") && e.contains("front, front_left, front_right, rear_left, rear_right"), "{e}");
        // nuScenes' six keep nuScenes' order
        std::fs::write(&path, rig_yaml(&NUSCENES_CAMERAS)).unwrap();
        let calib = load_calibration(&path, None).unwrap();
        let names: Vec<&str> = calib.cameras.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, NUSCENES_CAMERAS);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn camera_image_args() {
        assert_eq!(parse_camera_image("CAM_FRONT=a/b.jpg").unwrap(), ("CAM_FRONT".to_string(), PathBuf::from("a/b.jpg")));
        assert!(parse_camera_image("CAM_FRONT").is_err());
        assert!(parse_camera_image("=x.jpg").is_err());
        assert!(parse_camera_image("CAM_FRONT=").is_err());
    }

    #[test]
    fn points_take_the_time_lag() {
        let mut p = Points { x: vec![1.0, 2.0], y: vec![3.0, 4.0], z: vec![5.0, 6.0], intensity: vec![7.0, 8.0], has_intensity: true, ring: None, time: None };
        assert_eq!(points5(&p), vec![[1.0, 3.0, 5.0, 7.0, 0.0], [2.0, 4.0, 6.0, 8.0, 0.0]]);
        p.time = Some(vec![0.0, 0.05]);
        assert_eq!(points5(&p)[1][4], 0.05);
    }
}
