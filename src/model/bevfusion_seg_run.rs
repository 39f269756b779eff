//! `sptr bevseg`: a BEVFusion seg model on one frame of files — camera images named by camera,
//! a nuScenes-style `calib.json`, optionally a LiDAR cloud — written as the BEV map files of
//! [`BevMap::write_dir`](crate::bev::map::BevMap::write_dir), with `--dump-stages` each
//! stage's tensor as NCHW float32 `.npy` for the parity harness.

use super::bevfusion_seg::{BevSegConfig, BevSegKind, BevSegModel, BevSegStages, Point5};
use crate::bev::calib::{Calibration, NUSCENES_CAMERAS};
use crate::camera::compressed::decode_compressed;
use crate::camera::image::{DecodeLimits, RgbImage};
use crate::camera::npy;
use crate::dense::FeatureMap;
use crate::model::random::save_tensors;
use crate::model::Weights;
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
    /// `(camera name, image file)`; cameras of the calibration without an image are masked.
    pub images: Vec<(String, PathBuf)>,
    pub cloud: Option<Points>,
    pub out: PathBuf,
    pub cuda: bool,
    /// Write each stage's tensor into `out/stages/`.
    pub dump_stages: bool,
    /// Threshold of the PNG's classes.
    pub threshold: f32,
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

/// Decodes the images and orders them as the calibration's cameras (the nuScenes camera order
/// of the model); checks that every image names a camera and that no camera has two.
pub fn load_frame(job: &BevSegJob) -> Result<(Calibration, Vec<Option<RgbImage>>), Error> {
    if job.images.is_empty() {
        return Err(Error::InvalidInput("no camera images given (--images CAM=FILE ...)".into()));
    }
    let limits = DecodeLimits::default();
    let mut slots: Vec<Option<RgbImage>> = vec![None; NUSCENES_CAMERAS.len()];
    for (cam, file) in &job.images {
        let i = NUSCENES_CAMERAS.iter().position(|c| c == cam).ok_or_else(|| {
            Error::InvalidInput(format!("--images {cam}={}: unknown camera; the model's cameras are {}", file.display(), NUSCENES_CAMERAS.join(", ")))
        })?;
        if slots[i].is_some() {
            return Err(Error::InvalidInput(format!("--images: camera {cam} is given twice")));
        }
        let bytes = std::fs::read(file).map_err(|e| Error::Io(format!("{}: cannot read: {e}", file.display())))?;
        let img = decode_compressed("", &bytes, &limits).map_err(|e| Error::InvalidInput(format!("{}: {e}", file.display())))?;
        slots[i] = Some(img);
    }
    // calib.json has no image sizes: each camera takes its image's, a masked camera the first one's
    let first = slots.iter().flatten().next().map(|i| (i.width, i.height)).ok_or_else(|| Error::InvalidInput("no image decoded".into()))?;
    let mut calib = Calibration::load_nuscenes_json(&job.calib, &NUSCENES_CAMERAS, first.0, first.1)?;
    for (cam, img) in calib.cameras.iter_mut().zip(&slots) {
        if let Some(img) = img {
            cam.image_width = img.width;
            cam.image_height = img.height;
        }
    }
    Ok((calib, slots))
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
            let t = super::bevfusion_seg::random_tensors(&cfg, *seed)?;
            if let Some(p) = save {
                if let Some(dir) = p.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: cannot create: {e}", dir.display())))?;
                }
                save_tensors(p, &t)?;
            }
            Weights::from_tensors(&format!("random BEVFusion seg weights (seed {seed})"), t)?
        }
    };
    let (calib, images) = load_frame(job)?;
    let cloud = job.cloud.as_ref().map(points5);
    if cfg.kind == BevSegKind::Fusion && cloud.is_none() {
        return Err(Error::InvalidInput(format!("{} is the camera + LiDAR model: pass --cloud FILE", job.model.display())));
    }
    if cfg.kind == BevSegKind::Camera && cloud.is_some() {
        return Err(Error::InvalidInput(format!("{} is the camera-only model: it takes no --cloud", job.model.display())));
    }
    let refs: Vec<Option<&RgbImage>> = images.iter().map(Option::as_ref).collect();
    let start = std::time::Instant::now();
    let out = if job.cuda {
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
        if job.cuda { "cuda" } else { "cpu" },
        out.map.classes.len(),
        out.map.nx,
        out.map.ny,
        out.map.resolution
    )];
    let stage_line: Vec<String> = out.times.0.iter().map(|(n, ms)| format!("{n} {ms:.1}")).collect();
    lines.push(format!("stages (ms{}): {}", if job.cuda { ", GPU time" } else { "" }, stage_line.join(", ")));
    if !out.map.masked_cameras.is_empty() {
        lines.push(format!("masked cameras (no image): {}", out.map.masked_cameras.join(", ")));
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

#[cfg(feature = "cuda")]
fn run_cuda(
    cfg: &BevSegConfig,
    weights: Weights,
    calib: &Calibration,
    images: &[Option<&RgbImage>],
    cloud: Option<&[Point5]>,
    stages: bool,
) -> Result<super::bevfusion_seg::BevSegOutput, Error> {
    let model = BevSegModel::from_weights(cfg, weights)?;
    let dev = crate::device::cuda::CudaDevice::new(0)?;
    let mut gpu = super::bevfusion_seg_cuda::CudaBevSeg::upload(&dev, &model, crate::dense::conv_engine::ConvBackend::Cudnn)?;
    gpu.forward_images(&dev, calib, images, cloud, stages)
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(
    _: &BevSegConfig,
    _: Weights,
    _: &Calibration,
    _: &[Option<&RgbImage>],
    _: Option<&[Point5]>,
    _: bool,
) -> Result<super::bevfusion_seg::BevSegOutput, Error> {
    Err(Error::InvalidInput("this build has no CUDA backend: rebuild with `--features cuda` or use --device cpu".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
