//! BEVFusion's BEV map segmentation models (mit-han-lab/bevfusion at db75150,
//! `configs/nuscenes/seg/camera-bev256d2.yaml` and `fusion-bev256d2-lss.yaml`), end to end on
//! the CPU: camera images + calibration [+ a LiDAR cloud] → a 6 × 200 × 200 map of sigmoid
//! probabilities ([`BevMap`]).
//!
//! ```text
//! images ─► preprocess ─► Swin-T + GeneralizedLSSFPN ─► LSSTransform (lift, pool, downsample) ─► camera BEV ─┐
//! cloud  ─► hard voxelize ─► SparseEncoder ─► LiDAR BEV (fusion only) ─────────────────────────────────────┤
//!                                             ConvFuser (fusion only, camera first) ◄───────────────────────┘
//!                                             ─► decoder (SECOND + SECONDFPN | GeneralizedResNet + LSSFPN) ─► BEVSegmentationHead
//! ```
//!
//! One model YAML configures everything (`config/models/bevfusion_seg_{camera,fusion}.yaml`): the
//! camera-only model has `model.encoders.lidar` and `model.fuser` null. All weights come from one
//! safetensors file with the upstream `state_dict` names (a `module.` prefix stripped); every
//! tensor is checked before anything is built, and the error lists all missing, unexpected and
//! mis-shaped ones at once — and when the file is the other model's (camera-only weights for the
//! fusion YAML or the reverse), it says so first.
//!
//! Bad inputs are errors or reports, never panics: a camera without an image is masked (it
//! contributes nothing to the camera BEV, exactly as a camera with zero depth) and named in the
//! result; an image count that is not the calibration's camera count, or an image whose size is
//! not the calibration's, is an error; NaN / infinite points are dropped and counted; a cloud
//! with no usable point gives a zero LiDAR BEV, reported.

use crate::sensors::calib::camera::Calibration;
use crate::models::bevfusion::lss::{CameraMask, GeometryCache, LssConfig, LssTransform};
use crate::models::bevfusion::map::{BevMap, LidarStats};
use crate::models::bevfusion::camera::encoder::{CameraEncoder, CameraEncoderConfig};
use crate::sensors::image::encodings::RgbImage;
use crate::ops::image_preprocess::cpu::{preprocess_cpu, ImagePreprocess};
use crate::error::ConfigError;
use crate::ops::dense::FeatureMap;
use crate::models::bevfusion::config::BevConfig;
use crate::models::bevfusion::head::BevMaps;
use crate::models::bevfusion::bev_stack::BevStack;
use crate::models::bevfusion::lidar_encoder::{LidarEncoder, LidarEncoderConfig};
use crate::ops::voxelize::hard::HardVoxelStats;
use crate::nn::random::NamedTensors;
use crate::nn::weights::Weights;
use crate::nn::ModelError;
use crate::Error;
use std::path::Path;
use std::time::Instant;

/// Which of the two seg models a YAML (or a weights file) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BevSegKind {
    /// `camera-bev256d2`: camera BEV → GeneralizedResNet + LSSFPN → head.
    Camera,
    /// `fusion-bev256d2-lss`: camera BEV + LiDAR BEV → ConvFuser → SECOND + SECONDFPN → head.
    Fusion,
}

impl BevSegKind {
    pub fn name(self) -> &'static str {
        match self {
            BevSegKind::Camera => "camera-only",
            BevSegKind::Fusion => "camera + LiDAR fusion",
        }
    }
    /// The YAML of this repository for the kind.
    pub fn yaml(self) -> &'static str {
        match self {
            BevSegKind::Camera => "config/models/bevfusion_seg_camera.yaml",
            BevSegKind::Fusion => "config/models/bevfusion_seg_fusion.yaml",
        }
    }
}

/// `state_dict` prefixes of the model's parts.
pub const CAMERA_ENCODER_PREFIX: &str = "encoders.camera.";
pub const VTRANSFORM_PREFIX: &str = "encoders.camera.vtransform.";
pub const LIDAR_PREFIX: &str = "encoders.lidar.";
pub const FUSER_PREFIX: &str = "fuser.";
pub const DECODER_PREFIX: &str = "decoder.";
pub const HEAD_PREFIX: &str = "heads.map.";

fn value_err(file: &str, key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: file.to_string(), key: key.to_string(), reason: reason.into() }
}

/// The parts of the YAML this module reads itself (each part parses its own section).
#[derive(Debug, Clone, PartialEq)]
pub struct SegYaml {
    pub kind: BevSegKind,
    /// `map_classes` (= `model.heads.map.classes`).
    pub classes: Vec<String>,
}

/// Reads the model kind and the classes; checks the YAML is a BEVFusion seg model.
pub fn parse_seg_yaml(text: &str, file: &str) -> Result<SegYaml, ConfigError> {
    let doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| ConfigError::Parse { file: file.to_string(), reason: e.to_string() })?;
    let model = doc.get("model").ok_or_else(|| value_err(file, "model", "is missing"))?;
    if let Some(t) = model.get("type").and_then(|t| t.as_str()) {
        if t != "BEVFusion" {
            return Err(value_err(file, "model.type", format!("must be `BEVFusion`, got `{t}`")));
        }
    }
    let present = |v: Option<&serde_yaml::Value>| v.is_some_and(|v| !v.is_null());
    let lidar = present(model.get("encoders").and_then(|e| e.get("lidar")));
    let fuser = present(model.get("fuser"));
    let kind = match (lidar, fuser) {
        (false, false) => BevSegKind::Camera,
        (true, true) => BevSegKind::Fusion,
        (true, false) => return Err(value_err(file, "model.fuser", "is null but model.encoders.lidar is set: the fusion model needs both (the camera-only model neither)")),
        (false, true) => return Err(value_err(file, "model.encoders.lidar", "is null but model.fuser is set: the fusion model needs both (the camera-only model neither)")),
    };
    let map = model.get("heads").and_then(|h| h.get("map")).filter(|m| !m.is_null()).ok_or_else(|| value_err(file, "model.heads.map", "is missing (the seg models' head)"))?;
    if let Some(obj) = model.get("heads").and_then(|h| h.get("object")) {
        if !obj.is_null() {
            return Err(value_err(file, "model.heads.object", "must be null: the detection head is not supported (seg models only)"));
        }
    }
    let strings = |v: &serde_yaml::Value, key: &str| -> Result<Vec<String>, ConfigError> {
        serde_yaml::from_value::<Vec<String>>(v.clone()).map_err(|e| ConfigError::Parse { file: file.to_string(), reason: format!("{key}: {e}") })
    };
    let classes = strings(map.get("classes").ok_or_else(|| value_err(file, "model.heads.map.classes", "is missing"))?, "model.heads.map.classes")?;
    if classes.is_empty() {
        return Err(value_err(file, "model.heads.map.classes", "is empty"));
    }
    if let Some(mc) = doc.get("map_classes") {
        let top = strings(mc, "map_classes")?;
        if top != classes {
            return Err(value_err(file, "map_classes", format!("{top:?} differs from model.heads.map.classes {classes:?}")));
        }
    }
    Ok(SegYaml { kind, classes })
}

/// Which model a set of tensor names looks like: LiDAR encoder or fuser tensors mean fusion;
/// the camera-only decoder's `decoder.backbone.{i}.` (GeneralizedResNet) without them means
/// camera-only; None when neither shows (not a BEVFusion seg checkpoint, or an empty one).
pub fn looks_like<'a>(names: impl IntoIterator<Item = &'a str>) -> Option<BevSegKind> {
    let mut resnet = false;
    for n in names {
        if n.starts_with(LIDAR_PREFIX) || n.starts_with(FUSER_PREFIX) || n.starts_with("decoder.backbone.blocks.") || n.starts_with("decoder.neck.deblocks.") {
            return Some(BevSegKind::Fusion);
        }
        if n.strip_prefix("decoder.backbone.").is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit())) || n.starts_with("decoder.neck.fuse.") {
            resnet = true;
        }
    }
    resnet.then_some(BevSegKind::Camera)
}

/// Moves the tensors whose names start with `prefix` (or are in `also`) into a store of their
/// own, named like the file (so each part's own exact check sees only its tensors).
pub fn split_prefix(w: &mut Weights, prefix: &str, exclude: &[&str]) -> Result<Weights, ModelError> {
    Ok(w.split_off(|n| n.starts_with(prefix) && !exclude.iter().any(|x| n.starts_with(x))))
}

/// The combined mismatch of every part, with a hint first when the file is the other model's.
pub fn mismatch_error(kind: BevSegKind, yaml: &str, file_names: &[String], errors: Vec<ModelError>) -> ModelError {
    let (mut missing, mut unexpected, mut misshaped) = (Vec::new(), Vec::new(), Vec::new());
    let mut other = Vec::new();
    let mut file = String::new();
    for e in errors {
        match e {
            ModelError::Mismatch { file: f, missing: m, unexpected: u, misshaped: s } => {
                file = f;
                missing.extend(m);
                unexpected.extend(u);
                misshaped.extend(s);
            }
            e => other.push(e.to_string()),
        }
    }
    if missing.is_empty() && unexpected.is_empty() && misshaped.is_empty() {
        return ModelError::Config(other.join("; "));
    }
    let full = ModelError::Mismatch { file: file.clone(), missing, unexpected, misshaped };
    match looks_like(file_names.iter().map(String::as_str)) {
        Some(k) if k != kind => ModelError::Config(format!(
            "{file}: these weights look like BEVFusion's {} seg model, but the model YAML {yaml} is the {} model: \
             use {} with this file (or the other model's weights with this YAML)\n{full}",
            k.name(),
            kind.name(),
            k.yaml()
        )),
        _ => full,
    }
}

/// Per-stage wall times of one CPU forward, in order (ms).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageMs(pub Vec<(String, f64)>);

impl StageMs {
    fn mark(&mut self, name: &str, since: &mut Instant) {
        let now = Instant::now();
        self.0.push((name.to_string(), (now - *since).as_secs_f64() * 1e3));
        *since = now;
    }
}

/// A frame's camera input: one image per calibration camera, in the calibration's order; None =
/// no (fresh) image for that camera: it is masked.
pub struct FrameImages<'a> {
    pub images: &'a [Option<&'a RgbImage>],
}

/// Points in upstream's layout `(x, y, z, intensity, time lag)`.
pub type Point5 = [f32; 5];

/// A black image of the calibration's size for every masked camera (None elsewhere): a masked
/// camera still takes its slot in the batch, and its features are never pooled.
pub fn blank_images(calib: &Calibration, images: &[Option<&RgbImage>]) -> Vec<Option<RgbImage>> {
    images.iter().zip(&calib.cameras).map(|(i, c)| i.is_none().then(|| RgbImage::zeroed(c.image_width, c.image_height))).collect()
}

/// Every slot filled: the image, or its blank.
pub fn with_blanks<'a>(images: &[Option<&'a RgbImage>], blanks: &'a [Option<RgbImage>]) -> Result<Vec<&'a RgbImage>, Error> {
    images
        .iter()
        .zip(blanks)
        .map(|(i, b)| i.or(b.as_ref()))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::InvalidInput("a camera has neither an image nor a blank".into()))
}

/// The images as one preprocessed batch `[N, H, W, 3]`, in calibration order (checked by
/// [`check_cameras`]; `lidar`: the model has a LiDAR branch), with the mask and the masked
/// cameras' names.
pub fn camera_batch(pre: &ImagePreprocess, calib: &Calibration, images: &[Option<&RgbImage>], lidar: bool) -> Result<(FeatureMap, CameraMask, Vec<String>), Error> {
    let (mask, masked) = check_cameras(calib, images.iter().map(|i| i.map(|i| (i.width, i.height))), lidar)?;
    let blanks = blank_images(calib, images);
    let all = with_blanks(images, &blanks)?;
    let batch = preprocess_cpu(&all, pre)?;
    Ok((FeatureMap::new(batch.n, batch.h, batch.w, 3, batch.data)?, mask, masked))
}

/// The camera count and each present image's size against the calibration; the mask and the
/// masked cameras' names. No image at all is an error for the camera-only model; the fusion
/// model (`lidar` true) then runs LiDAR-only: every camera masked, nothing pooled, the camera
/// BEV zero before the view transform's downsample (the node's rule when no camera is usable).
pub fn check_cameras(calib: &Calibration, sizes: impl ExactSizeIterator<Item = Option<(usize, usize)>>, lidar: bool) -> Result<(CameraMask, Vec<String>), Error> {
    if sizes.len() != calib.len() {
        return Err(Error::InvalidInput(format!(
            "{} camera images for a calibration of {} cameras: give one per camera, in the calibration's order (a missing one is masked)",
            sizes.len(),
            calib.len()
        )));
    }
    let mut mask = CameraMask::ALL;
    let mut masked = Vec::new();
    for (i, (s, c)) in sizes.zip(&calib.cameras).enumerate() {
        match s {
            None => {
                mask = mask.without(i);
                masked.push(c.name.clone());
            }
            Some((w, h)) if (w, h) != (c.image_width, c.image_height) => {
                return Err(Error::InvalidInput(format!(
                    "camera `{}`: image is {w}x{h} but its calibration is for {}x{} (the geometry depends on it)",
                    c.name, c.image_width, c.image_height
                )));
            }
            Some(_) => {}
        }
    }
    if masked.len() == calib.len() && !lidar {
        return Err(Error::InvalidInput("no camera image at all: the camera BEV would be empty; give at least one image".into()));
    }
    Ok((mask, masked))
}

/// The camera half's configuration from a model YAML.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraHalfConfig {
    pub preprocess: ImagePreprocess,
    pub encoder: CameraEncoderConfig,
    pub lss: LssConfig,
}

impl CameraHalfConfig {
    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        Ok(Self { preprocess: ImagePreprocess::parse(text, file)?, encoder: CameraEncoderConfig::parse(text, file)?, lss: LssConfig::parse(text, file)? })
    }
}

/// Reads a YAML file's text; errors name it.
pub fn read_yaml(path: &Path) -> Result<(String, String), ConfigError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
    Ok((text, file))
}

/// The camera half loaded: encoder and view transform, with the geometry cached per calibration.
#[derive(Debug)]
pub struct CameraHalf {
    pub config: CameraHalfConfig,
    pub encoder: CameraEncoder,
    pub vtransform: LssTransform,
    geometry: GeometryCache,
}

impl CameraHalf {
    /// From the camera tensors of `w` (taken out of it); mismatches are returned, not raised, so
    /// the caller lists every part's at once.
    pub fn from_weights(config: &CameraHalfConfig, w: &mut Weights) -> Result<Self, Vec<ModelError>> {
        let vt = split_prefix(w, VTRANSFORM_PREFIX, &[]).map_err(|e| vec![e])?;
        let enc = split_prefix(w, CAMERA_ENCODER_PREFIX, &[]).map_err(|e| vec![e])?;
        let encoder = CameraEncoder::from_weights(&config.encoder, enc);
        let vtransform = LssTransform::from_weights_exact(&config.lss, vt, VTRANSFORM_PREFIX);
        match (encoder, vtransform) {
            (Ok(encoder), Ok(vtransform)) => Ok(Self { config: config.clone(), encoder, vtransform, geometry: GeometryCache::new() }),
            (e, v) => Err([e.err(), v.err()].into_iter().flatten().collect()),
        }
    }

    /// images → camera BEV `[1, X, Y, C]` (channels-last, h = x cell).
    pub fn forward(&mut self, calib: &Calibration, x: &FeatureMap, mask: CameraMask, t: &mut StageMs, since: &mut Instant) -> Result<FeatureMap, Error> {
        let stages = self.encoder.backbone.forward(&x.data, x.n, x.h, x.w)?;
        t.mark("backbone", since);
        let neck = self.encoder.neck.forward(&stages)?;
        t.mark("fpn", since);
        let feats = neck.first().ok_or_else(|| Error::InvalidInput("the camera neck gave no output".into()))?;
        let geom = self.geometry.get(&self.vtransform.params, calib)?;
        let bev = self.vtransform.forward(geom, feats, mask)?;
        t.mark("depth+pool", since);
        Ok(bev)
    }

    pub fn geometry_builds(&self) -> usize {
        self.geometry.builds()
    }
}

/// The report of a cloud from what voxelization did with it; `empty` (no voxel: the LiDAR BEV
/// is zero) for a cloud with no point, only non-finite points or none in range.
pub fn lidar_stats(v: &HardVoxelStats) -> LidarStats {
    LidarStats {
        points_in: v.points_in,
        points_non_finite: v.non_finite,
        points_in_range: v.points_in - v.non_finite - v.out_of_range,
        voxels: v.voxels_kept,
        voxels_dropped: v.voxels_dropped(),
        points_over_voxel_cap: v.points_over_max,
        empty: v.voxels_kept == 0,
    }
}

/// A BEV map from `[1, X, Y, K]` channels-last probabilities (the head's output layout) and the
/// output grid.
pub fn bev_map_from_nhwc(probs: &FeatureMap, classes: &[String], scope: [[f64; 3]; 2], masked: Vec<String>, lidar: Option<LidarStats>) -> Result<BevMap, Error> {
    if probs.n != 1 || probs.c != classes.len() {
        return Err(Error::InvalidInput(format!("head output [{}, {}, {}, {}] for {} classes", probs.n, probs.h, probs.w, probs.c, classes.len())));
    }
    let (nx, ny, k) = (probs.h, probs.w, probs.c);
    let mut p = vec![0f32; k * nx * ny];
    for ix in 0..nx {
        for iy in 0..ny {
            let px = &probs.data[(ix * ny + iy) * k..(ix * ny + iy + 1) * k];
            for (c, &v) in px.iter().enumerate() {
                p[(c * nx + ix) * ny + iy] = v;
            }
        }
    }
    Ok(BevMap {
        classes: classes.to_vec(),
        nx,
        ny,
        probabilities: p,
        resolution: scope[0][2],
        x_range: [scope[0][0], scope[0][1]],
        y_range: [scope[1][0], scope[1][1]],
        masked_cameras: masked,
        lidar,
    })
}

/// True when the YAML at `path` says `arch: bevfusion_seg` (how `random-weights` tells a
/// BEVFusion seg YAML from a SphereFormer one); false when unreadable (the caller's own loader
/// then reports the problem).
pub fn is_bevfusion_seg_yaml(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(path) else { return false };
    serde_yaml::from_str::<serde_yaml::Value>(&text).ok().and_then(|d| d.get("arch").and_then(|a| a.as_str()).map(|a| a == "bevfusion_seg")).unwrap_or(false)
}

/// The whole model's configuration (one YAML).
#[derive(Debug, Clone, PartialEq)]
pub struct BevSegConfig {
    pub kind: BevSegKind,
    pub classes: Vec<String>,
    pub camera: CameraHalfConfig,
    /// `model.encoders.lidar` (fusion only).
    pub lidar: Option<LidarEncoderConfig>,
    /// `model.fuser`, `model.decoder`, `model.heads.map`.
    pub bev: BevConfig,
    /// The YAML's name (error messages).
    pub file: String,
}

impl BevSegConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let (text, file) = read_yaml(path)?;
        Self::parse(&text, &file)
    }

    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        let seg = parse_seg_yaml(text, file)?;
        let camera = CameraHalfConfig::parse(text, file)?;
        let lidar = match seg.kind {
            BevSegKind::Fusion => Some(LidarEncoderConfig::parse(text, file)?),
            BevSegKind::Camera => None,
        };
        let bev = BevConfig::parse(text, file)?;
        let cfg = Self { kind: seg.kind, classes: seg.classes, camera, lidar, bev, file: file.to_string() };
        cfg.check_shapes()?;
        Ok(cfg)
    }

    /// The BEV maps the parts hand each other must agree: camera BEV (and LiDAR BEV) channels
    /// and sizes into the fuser / decoder, the head's classes.
    fn check_shapes(&self) -> Result<(), ConfigError> {
        let lss = &self.camera.lss;
        let cam_c = lss.channels();
        let g = crate::models::bevfusion::lss::BevGrid::from_bounds(lss.vtransform.xbound, lss.vtransform.ybound, lss.vtransform.zbound);
        let ds = lss.vtransform.downsample;
        let cam_hw = [g.nx[0].div_ceil(ds), g.nx[1].div_ceil(ds)];
        let cam_ch = cam_c * g.nx[2];
        let head_classes = self.bev.head.classes.len();
        if head_classes != self.classes.len() {
            return Err(value_err(&self.file, "model.heads.map.classes", format!("{head_classes} classes in the head, {} in map_classes", self.classes.len())));
        }
        let decoder_in = match (&self.bev.fuser, &self.lidar) {
            (Some(f), Some(l)) => {
                let [lx, ly, lidar_ch] = l.bev_shape().map_err(|e| value_err(&self.file, "model.encoders.lidar", e.to_string()))?;
                let lidar_hw = [lx, ly];
                if lidar_hw != cam_hw {
                    return Err(value_err(
                        &self.file,
                        "model.encoders.lidar",
                        format!("gives a {lidar_hw:?} LiDAR BEV but the camera BEV is {cam_hw:?} (xbound/ybound/downsample): the fuser needs one size"),
                    ));
                }
                if f.in_channels != [cam_ch, lidar_ch] {
                    return Err(value_err(
                        &self.file,
                        "model.fuser.in_channels",
                        format!("is {:?} but the camera BEV has {cam_ch} channels and the LiDAR BEV {lidar_ch} (camera first)", f.in_channels),
                    ));
                }
                f.out_channels
            }
            _ => cam_ch,
        };
        if self.bev.decoder.in_channels() != decoder_in {
            return Err(value_err(
                &self.file,
                "model.decoder.backbone.in_channels",
                format!("is {} but its input (the {}) has {decoder_in} channels", self.bev.decoder.in_channels(), if self.bev.fuser.is_some() { "fuser's output" } else { "camera BEV" }),
            ));
        }
        Ok(())
    }
}

/// Deterministic random weights for every tensor of the model, with upstream names: each part's
/// own generator, seeded `seed`, `seed + 1`, … in `state_dict` order of the parts.
pub fn random_tensors(cfg: &BevSegConfig, seed: u64) -> Result<NamedTensors, ModelError> {
    let mut t = crate::models::bevfusion::camera::encoder::random_tensors(&cfg.camera.encoder, seed)?;
    t.extend(crate::models::bevfusion::lss::transform::random_tensors(&cfg.camera.lss, VTRANSFORM_PREFIX, seed.wrapping_add(1)));
    if let Some(l) = &cfg.lidar {
        t.extend(crate::models::bevfusion::lidar_encoder::random_tensors(l, seed.wrapping_add(2))?);
    }
    t.extend(crate::models::bevfusion::bev_stack::random_tensors(&cfg.bev, seed.wrapping_add(3))?);
    Ok(t)
}

/// Each stage's output of one forward (`--dump-stages`, tests, parity), channels-last.
#[derive(Debug, Clone)]
pub struct BevSegStages {
    /// The normalized images the encoder consumed `[N, H, W, 3]`.
    pub input: FeatureMap,
    pub camera_bev: FeatureMap,
    pub lidar_bev: Option<FeatureMap>,
    pub fused: Option<FeatureMap>,
    pub decoder: FeatureMap,
    /// Probabilities `[1, X, Y, K]`.
    pub head: FeatureMap,
}

impl BevSegStages {
    /// `(name, map)` of every stage present, in order.
    pub fn named(&self) -> Vec<(&'static str, &FeatureMap)> {
        let mut v = vec![("input", &self.input), ("camera_bev", &self.camera_bev)];
        if let Some(l) = &self.lidar_bev {
            v.push(("lidar_bev", l));
        }
        if let Some(f) = &self.fused {
            v.push(("fused", f));
        }
        v.push(("decoder", &self.decoder));
        v.push(("head", &self.head));
        v
    }
}

/// What a forward returns.
#[derive(Debug, Clone)]
pub struct BevSegOutput {
    pub map: BevMap,
    pub times: StageMs,
    pub stages: Option<BevSegStages>,
}

/// The LiDAR BEV of a cloud with no usable point: zeros of the encoder's output shape (upstream
/// would fail on an empty sparse tensor; a zero map is what "no LiDAR evidence" means here).
pub fn zero_lidar_bev(cfg: &LidarEncoderConfig) -> Result<FeatureMap, Error> {
    let [x, y, c] = cfg.bev_shape()?;
    FeatureMap::zeros(1, x, y, c)
}

/// Probabilities `[1, K, X, Y]` (upstream layout) as a channels-last map `[1, X, Y, K]`.
pub fn maps_to_nhwc(m: &BevMaps) -> Result<FeatureMap, Error> {
    let (k, x, y) = (m.classes, m.x, m.y);
    if m.n != 1 || m.data.len() != k * x * y {
        return Err(Error::InvalidInput(format!("head output: {} values for [{}, {k}, {x}, {y}]", m.data.len(), m.n)));
    }
    let mut d = vec![0f32; k * x * y];
    for c in 0..k {
        for i in 0..x * y {
            d[i * k + c] = m.data[c * x * y + i];
        }
    }
    FeatureMap::new(1, x, y, k, d)
}

/// The whole model on the CPU.
#[derive(Debug)]
pub struct BevSegModel {
    pub config: BevSegConfig,
    pub camera: CameraHalf,
    pub lidar: Option<LidarEncoder>,
    pub bev: BevStack,
}

impl BevSegModel {
    /// Checks every tensor of the file against the whole model at once (one error listing all
    /// missing, unexpected and mis-shaped tensors, led by "these weights look like the other
    /// model" when they do), then builds each part with BatchNorm folded.
    pub fn from_weights(cfg: &BevSegConfig, mut w: Weights) -> Result<Self, ModelError> {
        let names: Vec<String> = w.names().map(str::to_string).collect();
        let mut errors = Vec::new();
        // each part gets exactly its tensors; whatever is left is unexpected
        // the encoder's tensors; any other `encoders.lidar.*` stays and is reported unexpected
        let lidar_w = split_prefix(&mut w, crate::models::bevfusion::lidar_encoder::PREFIX, &[]).map_err(|e| vec![e]);
        let camera = CameraHalf::from_weights(&cfg.camera, &mut w);
        let lidar = match (&cfg.lidar, lidar_w) {
            (Some(l), Ok(lw)) => Some(LidarEncoder::load(l, &lw).map_err(|e| vec![e])),
            (None, Ok(lw)) => {
                // the camera-only model has no LiDAR tensors: all of them are unexpected
                if !lw.is_empty() {
                    errors.push(ModelError::Mismatch { file: w.source().to_string(), missing: vec![], unexpected: lw.names().map(str::to_string).collect(), misshaped: vec![] });
                }
                None
            }
            (_, Err(e)) => Some(Err(e)),
        };
        let bev = BevStack::from_weights(&cfg.bev, w);
        let camera = camera.map_err(|e| errors.extend(e)).ok();
        let lidar = match lidar {
            Some(Ok(l)) => Some(Some(l)),
            Some(Err(e)) => {
                errors.extend(e);
                None
            }
            None => Some(None),
        };
        let bev = bev.map_err(|e| errors.push(e)).ok();
        match (camera, lidar, bev) {
            (Some(camera), Some(lidar), Some(bev)) if errors.is_empty() => Ok(Self { config: cfg.clone(), camera, lidar, bev }),
            _ => Err(mismatch_error(cfg.kind, &cfg.file, &names, errors)),
        }
    }

    pub fn kind(&self) -> BevSegKind {
        self.config.kind
    }

    /// One frame: `images` one per calibration camera (None = masked), `cloud` the fusion
    /// model's points `(x, y, z, intensity, time lag)`. `keep_stages` keeps every stage's tensor.
    pub fn forward(&mut self, calib: &Calibration, images: &[Option<&RgbImage>], cloud: Option<&[Point5]>, keep_stages: bool) -> Result<BevSegOutput, Error> {
        // the cheap checks first: a wrong input is refused before any compute
        match (self.lidar.is_some(), cloud) {
            (true, None) => return Err(Error::InvalidInput("the fusion model needs a LiDAR cloud".into())),
            (false, Some(c)) if !c.is_empty() => return Err(Error::InvalidInput("the camera-only model takes no LiDAR cloud".into())),
            _ => {}
        }
        let mut t = StageMs::default();
        let mut since = Instant::now();
        let (input, mask, masked) = camera_batch(&self.config.camera.preprocess, calib, images, self.lidar.is_some())?;
        t.mark("preprocess", &mut since);
        let camera_bev = self.camera.forward(calib, &input, mask, &mut t, &mut since)?;
        let (lidar_bev, lstats) = match (&self.lidar, &self.config.lidar) {
            (Some(enc), Some(lcfg)) => {
                let cloud = cloud.ok_or_else(|| Error::InvalidInput("the fusion model needs a LiDAR cloud".into()))?;
                // voxelization drops and counts non-finite and out-of-range points
                let v = enc.voxelize(cloud)?;
                let stats = lidar_stats(&v.stats);
                let bev = if v.is_empty() { zero_lidar_bev(lcfg)? } else { enc.forward_voxels(&v, false)?.0 };
                t.mark("lidar", &mut since);
                (Some(bev), Some(stats))
            }
            _ => (None, None),
        };
        let mut inputs = vec![&camera_bev];
        if let Some(l) = &lidar_bev {
            inputs.push(l);
        }
        // BevStack::forward's steps one by one, for the per-stage times
        let fused = match &self.bev.fuser {
            Some(f) => {
                let y = f.forward(&inputs)?;
                t.mark("fuser", &mut since);
                Some(y)
            }
            None => None,
        };
        let decoded = self.bev.decoder.forward(fused.as_ref().unwrap_or(&camera_bev))?;
        t.mark("decoder", &mut since);
        let maps = self.bev.head.forward(&decoded)?;
        t.mark("head", &mut since);
        let head = maps_to_nhwc(&maps)?;
        let scope = self.head_scope();
        let map = bev_map_from_nhwc(&head, &self.config.classes, scope, masked, lstats)?;
        let stages = keep_stages.then_some(BevSegStages { input, camera_bev, lidar_bev, fused, decoder: decoded, head });
        Ok(BevSegOutput { map, times: t, stages })
    }

    /// The head's output grid `[[xmin, xmax, step], [ymin, ymax, step]]`.
    pub fn head_scope(&self) -> [[f64; 3]; 2] {
        self.config.bev.head.output_scope
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(p: &str) -> std::path::PathBuf {
        crate::repo_root().join(p)
    }

    #[test]
    fn kinds_from_the_yamls() {
        for (f, k) in [("config/models/bevfusion_seg_camera.yaml", BevSegKind::Camera), ("config/models/bevfusion_seg_fusion.yaml", BevSegKind::Fusion)] {
            let (text, file) = read_yaml(&root(f)).unwrap();
            let y = parse_seg_yaml(&text, &file).unwrap();
            assert_eq!(y.kind, k);
            assert_eq!(y.classes, ["drivable_area", "ped_crossing", "walkway", "stop_line", "carpark_area", "divider"]);
            CameraHalfConfig::parse(&text, &file).unwrap();
        }
        let (text, _) = read_yaml(&root("config/models/bevfusion_seg_fusion.yaml")).unwrap();
        let e = parse_seg_yaml(&text.replace("  fuser:\n    type: ConvFuser", "  fuser: null\n  old_fuser:\n    type: ConvFuser"), "f.yaml").unwrap_err().to_string();
        assert!(e.contains("model.fuser"), "{e}");
        let e = parse_seg_yaml(&text.replace("    object: null", "    object: {type: TransFusionHead}"), "f.yaml").unwrap_err().to_string();
        assert!(e.contains("model.heads.object"), "{e}");
        let e = parse_seg_yaml(&text.replacen("map_classes: [drivable_area, ", "map_classes: [", 1), "f.yaml").unwrap_err().to_string();
        assert!(e.contains("map_classes"), "{e}");
        assert!(parse_seg_yaml("model: {}", "x").is_err());
    }

    #[test]
    fn parts_must_agree_on_the_bev_maps() {
        let (text, _) = read_yaml(&root("config/models/bevfusion_seg_fusion.yaml")).unwrap();
        let cfg = BevSegConfig::parse(&text, "f.yaml").unwrap();
        assert_eq!(cfg.kind, BevSegKind::Fusion);
        assert_eq!(cfg.lidar.as_ref().unwrap().bev_shape().unwrap(), [128, 128, 256]);
        // 0.2 m voxels: a 64 x 64 LiDAR BEV beside the 128 x 128 camera BEV
        let coarse = text
            .replacen("        voxel_size: [0.1, 0.1, 0.2]\n        max_voxels", "        voxel_size: [0.2, 0.2, 0.2]\n        max_voxels", 1)
            .replacen("sparse_shape: [1024, 1024, 41]", "sparse_shape: [512, 512, 41]", 1);
        assert_ne!(coarse, text);
        let e = BevSegConfig::parse(&coarse, "f.yaml").unwrap_err().to_string();
        assert!(e.contains("[64, 64] LiDAR BEV") && e.contains("[128, 128]"), "{e}");
        // the decoder must take the fuser's channels
        let e = BevSegConfig::parse(&text.replacen("      in_channels: 256\n      out_channels: [128, 256]", "      in_channels: 128\n      out_channels: [128, 256]", 1), "f.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("model.decoder.backbone.in_channels"), "{e}");
        // the camera-only decoder takes the camera BEV's 80 channels
        let (cam, _) = read_yaml(&root("config/models/bevfusion_seg_camera.yaml")).unwrap();
        let e = BevSegConfig::parse(&cam.replacen("      in_channels: 80\n", "      in_channels: 64\n", 1), "c.yaml").unwrap_err().to_string();
        assert!(e.contains("camera BEV") && e.contains("80"), "{e}");
    }

    #[test]
    fn which_model_names_look_like() {
        assert_eq!(looks_like(["encoders.lidar.backbone.conv_input.0.weight"]), Some(BevSegKind::Fusion));
        assert_eq!(looks_like(["decoder.backbone.blocks.0.0.weight"]), Some(BevSegKind::Fusion));
        assert_eq!(looks_like(["encoders.camera.neck.x", "decoder.backbone.0.0.conv1.weight"]), Some(BevSegKind::Camera));
        assert_eq!(looks_like(["decoder.neck.fuse.0.weight"]), Some(BevSegKind::Camera));
        assert_eq!(looks_like(["encoders.camera.backbone.patch_embed.projection.weight"]), None);
        assert_eq!(looks_like(Vec::<&str>::new()), None);
    }

    #[test]
    fn split_moves_only_the_prefix() {
        let t = |n: &str| (n.to_string(), vec![1], vec![0.0]);
        let mut w = Weights::from_tensors("f", vec![t("a.x"), t("a.b.y"), t("b.z")]).unwrap();
        let ab = split_prefix(&mut w, "a.", &["a.b."]).unwrap();
        assert_eq!(ab.names().collect::<Vec<_>>(), ["a.x"]);
        assert_eq!(w.names().collect::<Vec<_>>(), ["a.b.y", "b.z"]);
        assert_eq!(ab.source(), "f");
    }

    #[test]
    fn other_models_weights_are_named() {
        let names = vec!["decoder.backbone.0.0.conv1.weight".to_string()];
        let e = ModelError::Mismatch { file: "w.safetensors".into(), missing: vec!["fuser.0.weight".into()], unexpected: vec![], misshaped: vec![] };
        let msg = mismatch_error(BevSegKind::Fusion, "f.yaml", &names, vec![e]).to_string();
        assert!(msg.contains("look like BEVFusion's camera-only seg model"), "{msg}");
        assert!(msg.contains("config/models/bevfusion_seg_camera.yaml"), "{msg}");
        assert!(msg.contains("missing: fuser.0.weight"), "{msg}");
        // the right model with a missing tensor: the plain list
        let e = ModelError::Mismatch { file: "w".into(), missing: vec!["x".into()], unexpected: vec![], misshaped: vec![] };
        let msg = mismatch_error(BevSegKind::Camera, "c.yaml", &names, vec![e]).to_string();
        assert!(!msg.contains("look like"), "{msg}");
        assert!(msg.contains("1 missing"), "{msg}");
    }

    #[test]
    fn head_layout_to_class_x_y() {
        // [1, 2 (x), 3 (y), 2 classes]: value = 100 * class + 10 * x + y
        let mut d = Vec::new();
        for x in 0..2 {
            for y in 0..3 {
                for c in 0..2 {
                    d.push((100 * c + 10 * x + y) as f32);
                }
            }
        }
        let m = FeatureMap::new(1, 2, 3, 2, d).unwrap();
        let classes = vec!["a".to_string(), "b".to_string()];
        let map = bev_map_from_nhwc(&m, &classes, [[-1.0, 1.0, 1.0], [-1.5, 1.5, 1.0]], vec![], None).unwrap();
        for c in 0..2 {
            for x in 0..2 {
                for y in 0..3 {
                    assert_eq!(map.at(c, x, y), (100 * c + 10 * x + y) as f32);
                }
            }
        }
        assert_eq!((map.x_range, map.y_range, map.resolution), ([-1.0, 1.0], [-1.5, 1.5], 1.0));
        assert!(bev_map_from_nhwc(&m, &classes[..1], [[-1.0, 1.0, 1.0]; 2], vec![], None).is_err());
    }
}
