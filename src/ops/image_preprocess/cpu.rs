//! The camera network's input: BEVFusion's test-time image preprocessing on the CPU (f32 NHWC).
//!
//! Upstream (mit-han-lab/bevfusion at db75150, `ImageAug3D` with `is_train: false`, then
//! `ImageNormalize`) does, per camera image of `W × H`:
//!
//! 1. `resize = mean(augment2d.resize[1])` (the test pair), `newW = int(W · resize)`,
//!    `newH = int(H · resize)` (float64 products, truncated);
//! 2. crop box `(x0, y0, x0 + fW, y0 + fH)` with `fH, fW = image_size`,
//!    `y0 = int((1 − mean(bot_pct_lim)) · newH) − fH`, `x0 = int(max(0, newW − fW) / 2)`;
//! 3. `PIL.Image.resize((newW, newH))` then `crop(box)` (parts of the box outside the resized
//!    image are black, as PIL's crop makes them); rotation 0 and no flip are no-ops;
//! 4. `ToTensor` (`/ 255` in float32) and `Normalize` (`(x − mean) / std`, float32).
//!
//! The resize filter: upstream calls `img.resize(resize_dims)` without a filter, and its README
//! pins Pillow 8.4.0, whose default for RGB images is `BICUBIC` (since Pillow 7.0; before it was
//! `NEAREST`). Pillow's bicubic resize (`libImaging/Resample.c`) is a separable convolution with
//! the Keys cubic (a = −0.5), support 2 input pixels, widened by the scale when downsampling
//! (antialiasing: support = 2 · in/out, so 1600 → 768 uses up to 11 taps), coefficients computed
//! in float64 per output pixel, normalised to sum 1, then rounded to 22-bit fixed point; a
//! horizontal pass into an 8-bit image (round half up, clamped), then a vertical pass the same
//! way. We compute the same coefficient tables and run the same integer arithmetic, so our
//! resized pixels equal Pillow's bit for bit on the CPU and on CUDA (measured on the six nuScenes
//! images: max abs difference 0; `tests/camera_image.rs` checks it against a committed Pillow
//! reference). What differs from upstream's input is only the JPEG decoder (see
//! `compressed.rs`). The coefficient tables depend on the image size only: [`ResizeTaps`] holds
//! them for the crop window, and the CUDA path uploads the same tables.
//!
//! Output: `n × fH × fW × 3` float32 (NHWC), camera order as given.

use crate::sensors::image::encodings::{ImageError, RgbImage};
use crate::error::ConfigError;
use rayon::prelude::*;
use serde::Deserialize;
use std::path::Path;

/// The image preprocessing a model YAML asks for (`image_size`, `augment2d.resize`,
/// `bot_pct_lim`, `image_normalize`).
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePreprocess {
    /// Network input height and width (`image_size`).
    pub out_h: usize,
    pub out_w: usize,
    /// The test-time resize range (`augment2d.resize[1]`); its mean is the ratio.
    pub resize_lim: [f64; 2],
    /// `bot_pct_lim`: the fraction of the resized image's bottom cut off (mean of the two).
    pub bot_pct_lim: [f64; 2],
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

#[derive(Deserialize)]
struct Augment2dYaml {
    resize: Vec<[f64; 2]>,
}

#[derive(Deserialize)]
struct NormalizeYaml {
    mean: [f32; 3],
    std: [f32; 3],
}

/// The keys this module reads; the rest of the model YAML is other modules' business.
#[derive(Deserialize)]
struct PreprocessYaml {
    image_size: [usize; 2],
    augment2d: Augment2dYaml,
    bot_pct_lim: [f64; 2],
    image_normalize: NormalizeYaml,
}

/// Largest network input side accepted from a YAML (BEVFusion uses 256 × 704).
const MAX_OUT_SIDE: usize = 8192;

impl ImagePreprocess {
    pub fn load(path: &Path) -> Result<ImagePreprocess, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
        ImagePreprocess::parse(&text, &file)
    }

    /// Reads the preprocessing keys of a model YAML's text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ImagePreprocess, ConfigError> {
        let y: PreprocessYaml =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse { file: file.to_string(), reason: e.to_string() })?;
        let bad = |key: &str, reason: String| ConfigError::Value { file: file.to_string(), key: key.to_string(), reason };
        let [h, w] = y.image_size;
        if !(1..=MAX_OUT_SIDE).contains(&h) || !(1..=MAX_OUT_SIDE).contains(&w) {
            return Err(bad("image_size", format!("must be two sides in 1..={MAX_OUT_SIDE}, got {:?}", y.image_size)));
        }
        if y.augment2d.resize.len() != 2 {
            return Err(bad(
                "augment2d.resize",
                format!("must hold the [train, test] resize ranges (two pairs), got {} pair(s)", y.augment2d.resize.len()),
            ));
        }
        let resize_lim = y.augment2d.resize[1];
        if resize_lim.iter().any(|r| !r.is_finite() || *r <= 0.0 || *r > 64.0) {
            return Err(bad("augment2d.resize", format!("test range {resize_lim:?} must be ratios in (0, 64]")));
        }
        if y.bot_pct_lim.iter().any(|p| !p.is_finite() || !(0.0..1.0).contains(p)) {
            return Err(bad("bot_pct_lim", format!("{:?} must be fractions in [0, 1)", y.bot_pct_lim)));
        }
        let n = &y.image_normalize;
        if n.mean.iter().any(|m| !m.is_finite()) || n.std.iter().any(|s| !s.is_finite() || *s == 0.0) {
            return Err(bad("image_normalize", format!("mean {:?} / std {:?} must be finite, std non-zero", n.mean, n.std)));
        }
        Ok(ImagePreprocess { out_h: h, out_w: w, resize_lim, bot_pct_lim: y.bot_pct_lim, mean: n.mean, std: n.std })
    }

    /// BEVFusion's nuScenes settings (`configs/nuscenes/default.yaml`): 256 × 704, resize 0.48,
    /// no bottom crop, ImageNet mean / std.
    pub fn bevfusion_nuscenes() -> ImagePreprocess {
        ImagePreprocess {
            out_h: 256,
            out_w: 704,
            resize_lim: [0.48, 0.48],
            bot_pct_lim: [0.0, 0.0],
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
        }
    }

    /// The checks [`ImagePreprocess::parse`] makes on the output size, for a value built in code.
    pub fn check(&self) -> Result<(), ImageError> {
        if !(1..=MAX_OUT_SIDE).contains(&self.out_h) || !(1..=MAX_OUT_SIDE).contains(&self.out_w) {
            return Err(ImageError::BadOutputSize { h: self.out_h, w: self.out_w, max: MAX_OUT_SIDE });
        }
        Ok(())
    }

    /// The resize ratio: numpy's `mean` of the two-element range, `(a + b) / 2` in float64.
    pub fn resize(&self) -> f64 {
        (self.resize_lim[0] + self.resize_lim[1]) / 2.0
    }

    /// The resize and crop of a `width × height` image.
    pub fn aug_for(&self, width: usize, height: usize) -> Result<ImageAug, ImageError> {
        ImageAug::new(width, height, self)
    }

    /// `ToTensor` + `Normalize` of one 8-bit value of channel `c`, in float32 op by op as
    /// torchvision computes it (`x / 255`, `− mean`, `/ std`).
    #[inline]
    pub fn normalize(&self, v: u8, c: usize) -> f32 {
        (v as f32 / 255.0 - self.mean[c]) / self.std[c]
    }
}

/// How one camera image becomes the network input: resize ratio, resized size, crop box.
/// Geometry needs the same numbers ([`image_aug_matrix`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ImageAug {
    /// Input image `[width, height]`.
    pub input: [usize; 2],
    /// The resize ratio (float64, as upstream's numpy value).
    pub resize: f64,
    /// `[newW, newH]`.
    pub resized: [usize; 2],
    /// Crop box `[x0, y0, x1, y1]` in the resized image (may reach outside it: black there).
    pub crop: [i64; 4],
    /// Network input `[height, width]`.
    pub out: [usize; 2],
}

impl ImageAug {
    /// `ImageAug3D.sample_augmentation` with `is_train: false` for a `width × height` image.
    pub fn new(width: usize, height: usize, cfg: &ImagePreprocess) -> Result<ImageAug, ImageError> {
        let r = cfg.resize();
        // Python's int() of a non-negative float truncates; sizes are far below 2^53.
        let new_w = (width as f64 * r) as usize;
        let new_h = (height as f64 * r) as usize;
        if new_w == 0 || new_h == 0 {
            return Err(ImageError::TooSmallToResize { width: width as u64, height: height as u64, resize: r });
        }
        let (fh, fw) = (cfg.out_h as i64, cfg.out_w as i64);
        let bot = (cfg.bot_pct_lim[0] + cfg.bot_pct_lim[1]) / 2.0;
        let y0 = ((1.0 - bot) * new_h as f64) as i64 - fh;
        // int(max(0, newW - fW) / 2): true division then truncation, non-negative.
        let x0 = ((new_w as i64 - fw).max(0) as f64 / 2.0) as i64;
        Ok(ImageAug { input: [width, height], resize: r, resized: [new_w, new_h], crop: [x0, y0, x0 + fw, y0 + fh], out: [cfg.out_h, cfg.out_w] })
    }
}

/// The 4 × 4 image augmentation matrix upstream stores as `img_aug_matrix` (float32): the 2 × 2
/// block `diag(resize)` (`post_rots`), the translation `−(x0, y0)` (`post_trans`); identity
/// elsewhere. A pixel `(u, v)` of the input lands at `M · (u, v, d, 1)` in the network input.
pub fn image_aug_matrix(aug: &ImageAug) -> [[f32; 4]; 4] {
    // torch: `rotation *= resize` on a float32 tensor (the float64 ratio rounded to float32),
    // `translation -= Tensor(crop[:2])`.
    let r = aug.resize as f32;
    [
        [r, 0.0, 0.0, -(aug.crop[0] as f32)],
        [0.0, r, 0.0, -(aug.crop[1] as f32)],
        [0.0, 0.0, 1.0, 0.0],
        [0.0, 0.0, 0.0, 1.0],
    ]
}

/// Pillow's fixed-point precision for 8-bit resampling (`PRECISION_BITS = 32 − 8 − 2`).
pub const PRECISION_BITS: u32 = 22;

/// The taps of one axis of Pillow's bicubic resize, for the output indices of a crop window.
/// Output index `o` reads inputs `first[o] .. first[o] + count[o]` with weights
/// `coeffs[o * ksize ..][..count[o]]` (22-bit fixed point). `count[o] == 0` marks an index
/// outside the resized image (the crop's black border).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AxisTaps {
    pub ksize: usize,
    pub first: Vec<i32>,
    pub count: Vec<i32>,
    pub coeffs: Vec<i32>,
}

impl AxisTaps {
    pub fn len(&self) -> usize {
        self.first.len()
    }

    pub fn is_empty(&self) -> bool {
        self.first.is_empty()
    }

    /// Input indices `[lo, hi)` read by any output index (`lo == hi` when none is).
    pub fn input_range(&self) -> (usize, usize) {
        let mut lo = usize::MAX;
        let mut hi = 0usize;
        for (&f, &c) in self.first.iter().zip(&self.count) {
            if c > 0 {
                lo = lo.min(f as usize);
                hi = hi.max((f + c) as usize);
            }
        }
        if lo >= hi {
            (0, 0)
        } else {
            (lo, hi)
        }
    }
}

/// Pillow's bicubic kernel (`bicubic_filter`, a = −0.5), evaluated in the same order.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// The taps of resizing an axis of `in_size` pixels to `out_size`, for output indices
/// `offset .. offset + len` (indices outside `0..out_size` get no taps): Pillow's
/// `precompute_coeffs` (box = the whole axis) then `normalize_coeffs_8bpc`, step for step in
/// float64.
pub fn bicubic_taps(in_size: usize, out_size: usize, offset: i64, len: usize) -> Result<AxisTaps, ImageError> {
    const SUPPORT: f64 = 2.0;
    // Pillow: `scale = (double)(in1 - in0) / outSize`, in0 = 0 and in1 = in_size as floats.
    let scale = (in_size as f32) as f64 / out_size as f64;
    let filterscale = scale.max(1.0);
    let support = SUPPORT * filterscale;
    let ksize = support.ceil() as usize * 2 + 1;
    let ss = 1.0 / filterscale;
    let mut taps = AxisTaps { ksize, first: vec![0; len], count: vec![0; len], coeffs: vec![0; len * ksize] };
    let mut k = vec![0f64; ksize];
    for o in 0..len {
        let xx = offset + o as i64;
        if xx < 0 || xx >= out_size as i64 {
            continue;
        }
        let center = (xx as f64 + 0.5) * scale;
        // C's (int) cast truncates toward zero; then clamped to the axis.
        let xmin = ((center - support + 0.5) as i64).max(0);
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) - xmin;
        let n = xmax.clamp(0, ksize as i64) as usize;
        let mut ww = 0.0;
        for (x, kx) in k.iter_mut().enumerate().take(n) {
            let w = bicubic(((x as i64 + xmin) as f64 - center + 0.5) * ss);
            *kx = w;
            ww += w;
        }
        let mut abs_sum: i64 = 0;
        for (dst, &kx) in taps.coeffs[o * ksize..o * ksize + n].iter_mut().zip(&k) {
            let v = if ww != 0.0 { kx / ww } else { kx };
            let scaled = v * (1u32 << PRECISION_BITS) as f64;
            // C's (int) cast of `±0.5 + scaled`: round half away from zero.
            let fixed = if v < 0.0 { (-0.5 + scaled) as i32 } else { (0.5 + scaled) as i32 };
            *dst = fixed;
            abs_sum += (fixed as i64).abs();
        }
        // 255 · Σ|k| + 2^21 must fit in i32 for the integer passes (CPU and CUDA alike); the
        // Keys cubic keeps Σ|k| ≤ 1.25 · 2^22, so this never fails for a real image.
        if 255 * abs_sum + (1 << (PRECISION_BITS - 1)) > i32::MAX as i64 {
            return Err(ImageError::UnsupportedResize { in_size: in_size as u64, out_size: out_size as u64 });
        }
        taps.first[o] = xmin as i32;
        taps.count[o] = n as i32;
    }
    Ok(taps)
}

/// Both axes' taps of an [`ImageAug`]: columns of the crop window (`out[1]` entries) and rows
/// (`out[0]` entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizeTaps {
    pub horizontal: AxisTaps,
    pub vertical: AxisTaps,
}

impl ResizeTaps {
    pub fn new(aug: &ImageAug) -> Result<ResizeTaps, ImageError> {
        Ok(ResizeTaps {
            horizontal: bicubic_taps(aug.input[0], aug.resized[0], aug.crop[0], aug.out[1])?,
            vertical: bicubic_taps(aug.input[1], aug.resized[1], aug.crop[1], aug.out[0])?,
        })
    }
}

/// Rounds a 22-bit fixed-point sum (with its half already added) to 8 bits, clamped:
/// Pillow's `clip8`.
#[inline]
fn clip8(ss: i32) -> u8 {
    (ss >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Resize + crop of one image as PIL does them: `out[0] × out[1]` RGB8, row-major.
pub fn resize_crop(img: &RgbImage, aug: &ImageAug, taps: &ResizeTaps) -> Result<Vec<u8>, ImageError> {
    if [img.width, img.height] != aug.input {
        return Err(ImageError::SizeMismatch { expected: aug.input, got: [img.width, img.height] });
    }
    let (oh, ow) = (aug.out[0], aug.out[1]);
    let (h, v) = (&taps.horizontal, &taps.vertical);
    let half = 1i32 << (PRECISION_BITS - 1);
    // Horizontal pass over the rows the vertical pass reads (Pillow's imTemp, cut to the crop).
    let (r0, r1) = v.input_range();
    let mut tmp = vec![0u8; (r1 - r0) * ow * 3];
    for (ty, trow) in tmp.chunks_exact_mut(ow * 3).enumerate() {
        let src = &img.data[(r0 + ty) * img.width * 3..(r0 + ty + 1) * img.width * 3];
        for ox in 0..ow {
            let (first, n) = (h.first[ox] as usize, h.count[ox] as usize);
            let k = &h.coeffs[ox * h.ksize..ox * h.ksize + n];
            let mut ss = [half; 3];
            for (i, &kk) in k.iter().enumerate() {
                let p = &src[(first + i) * 3..(first + i) * 3 + 3];
                for c in 0..3 {
                    ss[c] += p[c] as i32 * kk;
                }
            }
            for c in 0..3 {
                trow[ox * 3 + c] = clip8(ss[c]);
            }
        }
    }
    let mut out = vec![0u8; oh * ow * 3];
    for (oy, orow) in out.chunks_exact_mut(ow * 3).enumerate() {
        let (first, n) = (v.first[oy] as usize, v.count[oy] as usize);
        let k = &v.coeffs[oy * v.ksize..oy * v.ksize + n];
        for ox in 0..ow {
            let mut ss = [half; 3];
            for (j, &kk) in k.iter().enumerate() {
                let t = (first + j - r0) * ow * 3 + ox * 3;
                for c in 0..3 {
                    ss[c] += tmp[t + c] as i32 * kk;
                }
            }
            for c in 0..3 {
                orow[ox * 3 + c] = clip8(ss[c]);
            }
        }
    }
    Ok(out)
}

/// Preprocessed camera images on the CPU: `n × h × w × 3` float32, NHWC.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraBatch {
    pub data: Vec<f32>,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    /// Each camera's resize and crop (for geometry: [`image_aug_matrix`]).
    pub augs: Vec<ImageAug>,
}

/// Preprocesses camera images (any sizes, each its own resize and crop) into the network input.
pub fn preprocess_cpu(images: &[&RgbImage], cfg: &ImagePreprocess) -> Result<CameraBatch, ImageError> {
    cfg.check()?;
    let per: Vec<(ImageAug, Vec<f32>)> = images
        .par_iter()
        .map(|img| {
            let aug = cfg.aug_for(img.width, img.height)?;
            let taps = ResizeTaps::new(&aug)?;
            let rgb = resize_crop(img, &aug, &taps)?;
            let vals = rgb.chunks_exact(3).flat_map(|p| (0..3).map(move |c| cfg.normalize(p[c], c))).collect();
            Ok((aug, vals))
        })
        .collect::<Result<_, ImageError>>()?;
    let mut data = Vec::with_capacity(images.len() * cfg.out_h * cfg.out_w * 3);
    let mut augs = Vec::with_capacity(images.len());
    for (aug, vals) in per {
        augs.push(aug);
        data.extend_from_slice(&vals);
    }
    Ok(CameraBatch { data, n: images.len(), h: cfg.out_h, w: cfg.out_w, augs })
}

/// Reads a normalized NCHW float32 `.npy` batch `[n, 3, h, w]` as NHWC `(data, n, h, w)`.
pub fn read_input_npy(path: &std::path::Path) -> Result<(Vec<f32>, usize, usize, usize), crate::Error> {
    use crate::Error;
    let (shape, data) = crate::nn::npy::read_f32(path)?;
    let [n, c, h, w] = shape[..] else {
        return Err(Error::InvalidInput(format!("{}: images must be NCHW [n, 3, h, w], got shape {shape:?}", path.display())));
    };
    if c != 3 || n == 0 || h == 0 || w == 0 {
        return Err(Error::InvalidInput(format!("{}: images must be NCHW [n, 3, h, w] with n, h, w > 0, got {shape:?}", path.display())));
    }
    let m = crate::ops::dense::FeatureMap::from_nchw(n, c, h, w, &data)?;
    Ok((m.data, n, h, w))
}
