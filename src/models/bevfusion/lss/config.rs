//! The view transform's configuration (`model.encoders.camera.vtransform` of a BEVFusion model
//! YAML, plus the test-time image augmentation keys `image_size`, `augment2d.resize`,
//! `bot_pct_lim`) and what upstream derives from it: the BEV grid (`dx`, `bx`, `nx`), the
//! frustum, and each camera's image augmentation matrix.

use crate::error::ConfigError;
use serde::Deserialize;
use std::path::Path;

/// `model.encoders.camera.vtransform`, upstream keys (`LSSTransform` at db75150).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VtransformYaml {
    #[serde(rename = "type")]
    pub kind: String,
    pub in_channels: usize,
    pub out_channels: usize,
    /// Network input `[height, width]` after resize + crop.
    pub image_size: [usize; 2],
    /// Feature map `[height, width]` the encoder gives the view transform.
    pub feature_size: [usize; 2],
    /// `[lower, upper, step]` in metres, LiDAR frame.
    pub xbound: [f64; 3],
    pub ybound: [f64; 3],
    pub zbound: [f64; 3],
    /// Depth bins `[first, end (exclusive), step]` in metres (torch.arange).
    pub dbound: [f64; 3],
    #[serde(default = "one")]
    pub downsample: usize,
}

fn one() -> usize {
    1
}

/// The parts of a model YAML the view transform reads (other keys are other modules' business).
#[derive(Debug, Clone, PartialEq)]
pub struct LssConfig {
    pub vtransform: VtransformYaml,
    /// Test-time resize factor: the mean of `augment2d.resize[1]` (ImageAug3D with is_train false).
    pub resize: f64,
    /// Test-time bottom crop fraction: the mean of `bot_pct_lim`.
    pub bot_pct: f64,
}

fn value_err(file: &str, key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: file.to_string(), key: key.to_string(), reason: reason.into() }
}

fn parse_err(file: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Parse { file: file.to_string(), reason: reason.into() }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len() as f64
}

/// `torch.arange(start, end, step)`'s length: ceil((end - start) / step) in double.
pub fn arange_len(b: [f64; 3]) -> usize {
    ((b[1] - b[0]) / b[2]).ceil().max(0.0) as usize
}

impl LssConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
        Self::parse(&text, &file)
    }

    /// Reads and validates the view transform's keys from a model YAML's text.
    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        let doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| parse_err(file, e.to_string()))?;
        let vt = doc
            .get("model")
            .and_then(|m| m.get("encoders"))
            .and_then(|e| e.get("camera"))
            .and_then(|c| c.get("vtransform"))
            .ok_or_else(|| value_err(file, "model.encoders.camera.vtransform", "is missing"))?;
        let vtransform: VtransformYaml =
            serde_yaml::from_value(vt.clone()).map_err(|e| parse_err(file, format!("model.encoders.camera.vtransform: {e}")))?;
        let resize_pairs: Vec<Vec<f64>> = doc
            .get("augment2d")
            .and_then(|a| a.get("resize"))
            .ok_or_else(|| value_err(file, "augment2d.resize", "is missing"))
            .and_then(|v| serde_yaml::from_value(v.clone()).map_err(|e| parse_err(file, format!("augment2d.resize: {e}"))))?;
        let test_resize = match resize_pairs.as_slice() {
            [_, test] if !test.is_empty() => mean(test),
            _ => return Err(value_err(file, "augment2d.resize", "must be [[train lo, hi], [test lo, hi]]")),
        };
        let bot: Vec<f64> = doc
            .get("bot_pct_lim")
            .ok_or_else(|| value_err(file, "bot_pct_lim", "is missing"))
            .and_then(|v| serde_yaml::from_value(v.clone()).map_err(|e| parse_err(file, format!("bot_pct_lim: {e}"))))?;
        if bot.is_empty() {
            return Err(value_err(file, "bot_pct_lim", "must hold at least one number"));
        }
        let image_size: [usize; 2] = doc
            .get("image_size")
            .ok_or_else(|| value_err(file, "image_size", "is missing"))
            .and_then(|v| serde_yaml::from_value(v.clone()).map_err(|e| parse_err(file, format!("image_size: {e}"))))?;
        let cfg = Self { vtransform, resize: test_resize, bot_pct: mean(&bot) };
        cfg.validate(file, image_size)?;
        Ok(cfg)
    }

    fn validate(&self, file: &str, image_size: [usize; 2]) -> Result<(), ConfigError> {
        let v = &self.vtransform;
        let key = |k: &str| format!("model.encoders.camera.vtransform.{k}");
        if v.kind != "LSSTransform" {
            return Err(value_err(file, &key("type"), format!("must be `LSSTransform` (the seg configs' view transform), got `{}`", v.kind)));
        }
        if v.in_channels == 0 || v.out_channels == 0 {
            return Err(value_err(file, &key("in_channels/out_channels"), "must be positive"));
        }
        if v.image_size.contains(&0) || v.feature_size.contains(&0) {
            return Err(value_err(file, &key("image_size/feature_size"), "must be positive"));
        }
        if v.image_size != image_size {
            return Err(value_err(
                file,
                &key("image_size"),
                format!("{:?} differs from the top-level image_size {image_size:?} the images are cropped to", v.image_size),
            ));
        }
        for (name, b) in [("xbound", v.xbound), ("ybound", v.ybound), ("zbound", v.zbound), ("dbound", v.dbound)] {
            if !(b.iter().all(|x| x.is_finite()) && b[2] > 0.0 && b[1] > b[0]) {
                return Err(value_err(file, &key(name), format!("{b:?} must be [lower, upper, step] with upper > lower and step > 0")));
            }
        }
        for (name, b) in [("xbound", v.xbound), ("ybound", v.ybound), ("zbound", v.zbound)] {
            if ((b[1] - b[0]) / b[2]) < 1.0 {
                return Err(value_err(file, &key(name), format!("{b:?} gives no whole cell")));
            }
        }
        if v.dbound[0] <= 0.0 {
            return Err(value_err(file, &key("dbound"), "the first depth must be positive"));
        }
        if !(v.downsample == 1 || v.downsample == 2) {
            return Err(value_err(file, &key("downsample"), format!("must be 1 or 2 (upstream asserts 2 when > 1), got {}", v.downsample)));
        }
        if !(self.resize.is_finite() && self.resize > 0.0) {
            return Err(value_err(file, "augment2d.resize", format!("test-time resize {} must be positive", self.resize)));
        }
        if !(self.bot_pct.is_finite() && (0.0..1.0).contains(&self.bot_pct)) {
            return Err(value_err(file, "bot_pct_lim", format!("mean {} must be in [0, 1)", self.bot_pct)));
        }
        Ok(())
    }

    /// Depth bins `D` (118 for dbound [1, 60, 0.5]).
    pub fn depth_bins(&self) -> usize {
        arange_len(self.vtransform.dbound)
    }

    /// Depth logits plus context channels of the depthnet (`D + C`).
    pub fn depthnet_channels(&self) -> usize {
        self.depth_bins() + self.vtransform.out_channels
    }

    /// Context channels `C` (80).
    pub fn channels(&self) -> usize {
        self.vtransform.out_channels
    }

    /// `[height, width]` of the feature map.
    pub fn feature_size(&self) -> [usize; 2] {
        self.vtransform.feature_size
    }
}

/// BEV grid as upstream's `gen_dx_bx`: `dx = step`, `bx = lower + step / 2` (computed in double,
/// stored as float32 tensors), `nx = long((upper - lower) / step)` (truncated). Cell
/// `(x, y, z)` is flattened to `(x · ny + y) · nz + z`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BevGrid {
    pub dx: [f32; 3],
    pub bx: [f32; 3],
    pub nx: [usize; 3],
}

impl BevGrid {
    pub fn from_bounds(x: [f64; 3], y: [f64; 3], z: [f64; 3]) -> Self {
        let rows = [x, y, z];
        Self {
            dx: rows.map(|r| r[2] as f32),
            bx: rows.map(|r| (r[0] + r[2] / 2.0) as f32),
            nx: rows.map(|r| ((r[1] - r[0]) / r[2]) as usize),
        }
    }

    pub fn cells(&self) -> usize {
        self.nx[0] * self.nx[1] * self.nx[2]
    }

    /// The grid's lower corner `bx - dx / 2` as upstream computes it (float32 tensors), widened.
    pub fn lower(&self) -> [f64; 3] {
        [0, 1, 2].map(|i| (self.bx[i] - self.dx[i] / 2.0) as f64)
    }

    /// The cell of a LiDAR-frame point, or None outside the grid: per axis
    /// `q = (p - lower) / dx` in f64 and `.long()` (truncation toward zero), kept when
    /// `0 <= trunc(q) < n`, i.e. `-1 < q < n` (so up to one cell below the lower bound lands in
    /// cell 0, as upstream). NaN is outside.
    pub fn cell_of(&self, p: [f64; 3]) -> Option<usize> {
        let lower = self.lower();
        let mut idx = [0usize; 3];
        for i in 0..3 {
            let q = (p[i] - lower[i]) / self.dx[i] as f64;
            if !(q > -1.0 && q < self.nx[i] as f64) {
                return None;
            }
            idx[i] = q.trunc() as usize;
        }
        Some((idx[0] * self.nx[1] + idx[1]) * self.nx[2] + idx[2])
    }
}

/// `torch.linspace(start, end, steps)` in float32 by its scalar formula (the CPU kernel's
/// non-vectorized branch and the CUDA kernel without FMA): `step = (end - start) / (steps - 1)`,
/// `start + step · i` for the first half, `end - step · (steps - 1 - i)` for the rest.
pub fn linspace_f32(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps).map(|i| if i < half { start + step * i as f32 } else { end - step * (steps - 1 - i) as f32 }).collect()
}

/// Upstream's `frustum` parameter `[D, fH, fW, 3]` of `(u, v, d)`: u = linspace(0, iW - 1, fW),
/// v = linspace(0, iH - 1, fH), d = arange(dbound) (double arithmetic, stored as float32).
#[derive(Debug, Clone, PartialEq)]
pub struct Frustum {
    pub depth_bins: usize,
    pub height: usize,
    pub width: usize,
    /// `[D, fH, fW, 3]` row-major.
    pub data: Vec<f32>,
}

impl Frustum {
    pub fn from_config(cfg: &LssConfig) -> Self {
        let v = &cfg.vtransform;
        let [ih, iw] = v.image_size;
        let [fh, fw] = v.feature_size;
        let xs = linspace_f32(0.0, (iw - 1) as f32, fw);
        let ys = linspace_f32(0.0, (ih - 1) as f32, fh);
        let d_n = cfg.depth_bins();
        let mut data = Vec::with_capacity(d_n * fh * fw * 3);
        for d in 0..d_n {
            let depth = (v.dbound[0] + d as f64 * v.dbound[2]) as f32;
            for &y in &ys {
                for &x in &xs {
                    data.extend_from_slice(&[x, y, depth]);
                }
            }
        }
        Self { depth_bins: d_n, height: fh, width: fw, data }
    }

    /// `(u, v, d)` of depth bin `d`, row `h`, column `w`.
    pub fn at(&self, d: usize, h: usize, w: usize) -> [f32; 3] {
        let i = ((d * self.height + h) * self.width + w) * 3;
        [self.data[i], self.data[i + 1], self.data[i + 2]]
    }

    pub fn shape(&self) -> [usize; 4] {
        [self.depth_bins, self.height, self.width, 3]
    }
}

/// The test-time resize + crop of ImageAug3D for one raw image size, and the matrix it implies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageAug {
    pub resize: f64,
    /// `(int(W · r), int(H · r))`.
    pub resized: [usize; 2],
    /// Crop origin `(crop_w, crop_h)` in the resized image; the crop is the network input size.
    pub crop: [usize; 2],
}

impl ImageAug {
    /// `resize = cfg.resize`; `newW, newH = int(W·r), int(H·r)`;
    /// `crop_h = int((1 - bot_pct) · newH) - fH`; `crop_w = int(max(0, newW - fW) / 2)`.
    /// Errors when the crop would leave the resized image (upstream would pad with black).
    pub fn test_time(cfg: &LssConfig, width: usize, height: usize) -> Result<Self, crate::Error> {
        let r = cfg.resize;
        let [fh, fw] = cfg.vtransform.image_size;
        let new_w = (width as f64 * r) as usize;
        let new_h = (height as f64 * r) as usize;
        let bottom = ((1.0 - cfg.bot_pct) * new_h as f64) as usize;
        if new_w < fw || bottom < fh {
            return Err(crate::Error::InvalidInput(format!(
                "image {width}x{height} resized by {r} is {new_w}x{new_h}: too small for the network input {fw}x{fh} \
                 (image_size in the model YAML; with bot_pct_lim {})",
                cfg.bot_pct
            )));
        }
        Ok(Self { resize: r, resized: [new_w, new_h], crop: [(new_w - fw) / 2, bottom - fh] })
    }

    /// `post_rots` (3×3 of img_aug_matrix): diag(r, r, 1) with r rounded to float32 as upstream's
    /// `rotation *= resize` on a float32 tensor.
    pub fn post_rot(&self) -> [[f64; 3]; 3] {
        let r = self.resize as f32 as f64;
        [[r, 0.0, 0.0], [0.0, r, 0.0], [0.0, 0.0, 1.0]]
    }

    /// `post_trans`: `(-crop_w, -crop_h, 0)`.
    pub fn post_trans(&self) -> [f64; 3] {
        [-(self.crop[0] as f64), -(self.crop[1] as f64), 0.0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg() -> LssConfig {
        LssConfig::load(&crate::repo_root().join("config/models/bevfusion_seg_camera.yaml")).unwrap()
    }

    #[test]
    fn seg_config_values() {
        let c = seg();
        assert_eq!(c.depth_bins(), 118);
        assert_eq!(c.depthnet_channels(), 198);
        assert_eq!(c.resize, 0.48);
        assert_eq!(c.bot_pct, 0.0);
        assert_eq!(c.vtransform.downsample, 2);
        let g = BevGrid::from_bounds(c.vtransform.xbound, c.vtransform.ybound, c.vtransform.zbound);
        assert_eq!(g.nx, [256, 256, 1]);
        assert_eq!(g.dx, [0.4, 0.4, 20.0]);
        assert_eq!(g.bx, [-51.0, -51.0, 0.0]);
        // the detection grid: (54 - -54) / 0.3 = 360 in double
        let det = BevGrid::from_bounds([-54.0, 54.0, 0.3], [-54.0, 54.0, 0.3], [-10.0, 10.0, 20.0]);
        assert_eq!(det.nx, [360, 360, 1]);
        assert_eq!(det.bx[0], -53.85f32);
    }

    #[test]
    fn image_aug_nuscenes() {
        // 1600x900 * 0.48 = 768x432; crop (32, 176) to 704x256 (BEVFUSION_NOTES)
        let a = ImageAug::test_time(&seg(), 1600, 900).unwrap();
        assert_eq!(a.resized, [768, 432]);
        assert_eq!(a.crop, [32, 176]);
        assert_eq!(a.post_trans(), [-32.0, -176.0, 0.0]);
        assert_eq!(a.post_rot()[0][0], 0.48f32 as f64);
        // too small an image
        assert!(ImageAug::test_time(&seg(), 1280, 500).is_err());
        assert!(ImageAug::test_time(&seg(), 1400, 900).is_err());
        // a bottom crop fraction moves the crop up
        let mut c = seg();
        c.bot_pct = 0.2;
        let a = ImageAug::test_time(&c, 1600, 900).unwrap();
        assert_eq!(a.crop, [32, (0.8f64 * 432.0) as usize - 256]);
    }

    #[test]
    fn frustum_values() {
        let f = Frustum::from_config(&seg());
        assert_eq!(f.shape(), [118, 32, 88, 3]);
        assert_eq!(f.at(0, 0, 0), [0.0, 0.0, 1.0]);
        assert_eq!(f.at(117, 31, 87), [703.0, 255.0, 59.5]);
        // linspace(0, 703, 88): step 703/87 (float32)
        let step = 703.0f32 / 87.0;
        assert_eq!(f.at(3, 5, 10)[0], step * 10.0);
        assert_eq!(f.at(3, 5, 80)[0], 703.0 - step * 7.0);
        assert_eq!(f.at(3, 5, 10)[1], 255.0 / 31.0 * 5.0);
        assert_eq!(f.at(3, 5, 10)[2], 2.5);
        assert_eq!(linspace_f32(2.0, 5.0, 1), vec![2.0]);
        assert_eq!(linspace_f32(0.0, 3.0, 4), vec![0.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn config_errors_name_the_key() {
        let text = std::fs::read_to_string(crate::repo_root().join("config/models/bevfusion_seg_camera.yaml")).unwrap();
        let bad = |from: &str, to: &str| {
            assert!(text.contains(from), "{from}");
            LssConfig::parse(&text.replacen(from, to, 1), "m.yaml").unwrap_err().to_string()
        };
        assert!(bad("type: LSSTransform", "type: DepthLSSTransform").contains("LSSTransform"));
        assert!(bad("dbound: [1.0, 60.0, 0.5]", "dbound: [1.0, 60.0, 0.0]").contains("dbound"));
        assert!(bad("xbound: [-51.2, 51.2, 0.4]", "xbound: [51.2, -51.2, 0.4]").contains("xbound"));
        assert!(bad("downsample: 2", "downsample: 4").contains("downsample"));
        assert!(bad("feature_size: [32, 88]", "feature_size: [32, 88]\n        extra_key: 1").contains("extra_key"));
        assert!(bad("image_size: [256, 704]          #", "image_size: [256, 640]          #").contains("image_size"));
        assert!(bad("bot_pct_lim: [0.0, 0.0]", "bot_pct_lim: [1.0, 1.0]").contains("bot_pct_lim"));
        assert!(bad("resize: [[0.38, 0.55], [0.48, 0.48]]", "resize: [[0.38, 0.55]]").contains("augment2d.resize"));
        assert!(LssConfig::parse("model: {}", "m.yaml").unwrap_err().to_string().contains("vtransform"));
    }

    #[test]
    fn cells_truncate_toward_zero_and_drop_outside() {
        // grid [0, 4) step 1 on x and y, one z cell [-1, 1): lower corner exactly 0 and -1
        let g = BevGrid::from_bounds([0.0, 4.0, 1.0], [0.0, 4.0, 1.0], [-1.0, 1.0, 2.0]);
        assert_eq!(g.lower(), [0.0, 0.0, -1.0]);
        let c = |x: f64, y: f64| g.cell_of([x, y, 0.0]);
        assert_eq!(c(0.5, 0.5), Some(0));
        assert_eq!(c(1.5, 2.25), Some(4 + 2));
        // up to one cell below the lower bound truncates to cell 0 (upstream's .long())
        assert_eq!(c(-0.5, 0.5), Some(0));
        assert_eq!(c(-0.999, 3.999), Some(3));
        // exactly one cell below: trunc(-1) = -1, dropped
        assert_eq!(c(-1.0, 0.5), None);
        // the upper bound is outside, just below it inside
        assert_eq!(c(4.0, 0.5), None);
        assert_eq!(c(3.9999999, 0.5), Some(12));
        assert_eq!(c(0.5, f64::NAN), None);
        assert_eq!(g.cell_of([0.5, 0.5, 1.0]), None);
        assert_eq!(g.cell_of([0.5, 0.5, -1.5]), Some(0));
        // z cells are 2 m: one cell below the lower face -1 is -3
        assert_eq!(g.cell_of([0.5, 0.5, -2.9]), Some(0));
        assert_eq!(g.cell_of([0.5, 0.5, -3.0]), None);
    }
}
