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

use crate::bev::calib::Calibration;
use crate::bev::lss::{CameraMask, GeometryCache, LssConfig, LssTransform};
use crate::bev::seg_map::{BevMap, LidarStats};
use crate::camera::encoder::{CameraEncoder, CameraEncoderConfig};
use crate::camera::image::RgbImage;
use crate::camera::preprocess::{preprocess_cpu, ImagePreprocess};
use crate::config::ConfigError;
use crate::dense::FeatureMap;
use crate::model::weights::{Tensor, Weights};
use crate::model::ModelError;
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
    let names: Vec<String> = w.names().filter(|n| n.starts_with(prefix) && !exclude.iter().any(|x| n.starts_with(x))).map(str::to_string).collect();
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        if let Some(Tensor { shape, data }) = w.remove(&n) {
            out.push((n, shape, data));
        }
    }
    Weights::from_tensors(w.source(), out)
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

/// Drops points with a non-finite value; returns the kept ones and how many were dropped.
pub fn finite_points(points: &[Point5]) -> (Vec<Point5>, usize) {
    let kept: Vec<Point5> = points.iter().filter(|p| p.iter().all(|v| v.is_finite())).copied().collect();
    let dropped = points.len() - kept.len();
    (kept, dropped)
}

/// The images as one preprocessed batch, in calibration order; masked cameras get a zero image
/// (their features are never pooled). Checks the count and each image's size against `calib`.
pub fn camera_batch(pre: &ImagePreprocess, calib: &Calibration, images: &[Option<&RgbImage>]) -> Result<(FeatureMap, CameraMask, Vec<String>), Error> {
    if images.len() != calib.len() {
        return Err(Error::InvalidInput(format!(
            "{} camera images for a calibration of {} cameras ({}): give one per camera, in that order (a missing one is masked)",
            images.len(),
            calib.len(),
            calib.cameras.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
        )));
    }
    let mut mask = CameraMask::ALL;
    let mut masked = Vec::new();
    let mut present = Vec::new();
    for (i, (img, cam)) in images.iter().zip(&calib.cameras).enumerate() {
        match img {
            None => {
                mask = mask.without(i);
                masked.push(cam.name.clone());
            }
            Some(im) => {
                if (im.width, im.height) != (cam.image_width, cam.image_height) {
                    return Err(Error::InvalidInput(format!(
                        "camera `{}`: image is {}x{} but its calibration is for {}x{} (the geometry depends on it)",
                        cam.name, im.width, im.height, cam.image_width, cam.image_height
                    )));
                }
                present.push(*im);
            }
        }
    }
    if present.is_empty() {
        return Err(Error::InvalidInput("no camera image at all: the camera BEV would be empty; give at least one image".into()));
    }
    let batch = preprocess_cpu(&present, pre)?;
    let per = batch.h * batch.w * 3;
    let mut data = vec![0f32; images.len() * per];
    let mut k = 0;
    for (i, img) in images.iter().enumerate() {
        if img.is_some() {
            data[i * per..(i + 1) * per].copy_from_slice(&batch.data[k * per..(k + 1) * per]);
            k += 1;
        }
    }
    Ok((FeatureMap::new(images.len(), batch.h, batch.w, 3, data)?, mask, masked))
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

/// Reports built from the LiDAR input.
pub fn empty_lidar_stats(points_in: usize, non_finite: usize) -> LidarStats {
    LidarStats { points_in, points_non_finite: non_finite, empty: true, ..Default::default() }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn root(p: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
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
    fn points_with_nan_are_dropped_and_counted() {
        let pts = [[1.0, 2.0, 0.0, 5.0, 0.0], [f32::NAN, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, f32::INFINITY, 0.0], [3.0, 1.0, 0.5, 1.0, 0.0]];
        let (kept, dropped) = finite_points(&pts);
        assert_eq!(dropped, 2);
        assert_eq!(kept, vec![pts[0], pts[3]]);
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
