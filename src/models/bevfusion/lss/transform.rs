//! `LSSTransform` on the CPU: weights, lift (depthnet, depth softmax), pool, downsample.
//!
//! Shapes for one frame of N cameras (B = 1; the node processes one frame at a time):
//! - input features: NHWC `[N, fH, fW, in_channels]` (the encoder's stride-8 map);
//! - lift: depthnet 1×1 conv → `[N, fH, fW, D + C]`; depth = softmax over the first D channels,
//!   context = the last C; depth is stored pixel-major `[N, fH, fW, D]`, context `[N, fH, fW, C]`;
//! - pool: per BEV cell, `sum_points depth[q] · context[pixel(q)]` (never the N·D·H·W·C outer
//!   product), a map `[1, nx, ny, nz · C]`: h = x index, w = y index, channel `z · C + c`, which
//!   is upstream's `(B, C · Z, X, Y)` in channels-last form;
//! - downsample (when `downsample: 2`): conv3×3 + BN + ReLU, conv3×3 stride 2 + BN + ReLU,
//!   conv3×3 + BN + ReLU, all 80 → 80 without bias, BatchNorm2d eps 1e-5 folded into the convs.

use crate::models::bevfusion::lss::config::{BevGrid, Frustum, LssConfig};
use crate::models::bevfusion::lss::geometry::{LssGeometry, LssParams};
use crate::ops::dense::{batch_norm_2d, Activation, Conv2d, FeatureMap};
use crate::nn::random::{NamedTensors, SplitMix};
use crate::nn::{ModelError, WeightSpec, Weights};
use crate::Error;
use rayon::prelude::*;

/// The view transform's `state_dict` prefix inside a BEVFusion checkpoint.
pub const PREFIX: &str = "encoders.camera.vtransform.";

/// Which cameras contribute to a frame: bit `n` set = camera `n` is pooled. A masked camera (a
/// stale image) contributes exactly what a camera with all-zero depth would: nothing. Bits at or
/// above the camera count are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CameraMask(pub u32);

impl CameraMask {
    pub const ALL: CameraMask = CameraMask(u32::MAX);

    pub fn contains(&self, camera: usize) -> bool {
        camera < 32 && (self.0 >> camera) & 1 == 1
    }

    /// Every camera but `camera`.
    pub fn without(self, camera: usize) -> Self {
        if camera < 32 {
            CameraMask(self.0 & !(1 << camera))
        } else {
            self
        }
    }
}

/// The names and shapes of the view transform's tensors under `prefix` (upstream's
/// `state_dict` order): the grid parameters `frustum`, `dx`, `bx`, `nx`, then `depthnet`, then
/// the downsample convs and BatchNorms.
pub fn weight_specs(cfg: &LssConfig, prefix: &str) -> Vec<WeightSpec> {
    let spec = |name: &str, shape: &[usize]| WeightSpec { name: format!("{prefix}{name}"), shape: shape.to_vec() };
    let v = &cfg.vtransform;
    let (d, c) = (cfg.depth_bins(), cfg.channels());
    let [fh, fw] = v.feature_size;
    let mut s = vec![
        spec("dx", &[3]),
        spec("bx", &[3]),
        spec("nx", &[3]),
        spec("frustum", &[d, fh, fw, 3]),
        spec("depthnet.weight", &[d + c, v.in_channels, 1, 1]),
        spec("depthnet.bias", &[d + c]),
    ];
    if v.downsample > 1 {
        for (conv, bn) in [(0, 1), (3, 4), (6, 7)] {
            s.push(spec(&format!("downsample.{conv}.weight"), &[c, c, 3, 3]));
            for p in ["weight", "bias", "running_mean", "running_var"] {
                s.push(spec(&format!("downsample.{bn}.{p}"), &[c]));
            }
        }
    }
    s
}

/// The grid parameters' values the YAML implies (what a checkpoint of this config holds).
fn grid_tensors(params: &LssParams) -> [(&'static str, Vec<f32>); 4] {
    let g = &params.grid;
    [
        ("dx", g.dx.to_vec()),
        ("bx", g.bx.to_vec()),
        ("nx", g.nx.iter().map(|&n| n as f32).collect()),
        ("frustum", params.frustum.data.clone()),
    ]
}

/// Deterministic random weights with the upstream names (tests, benchmarks, parity): conv
/// weights and the depthnet bias uniform ±1/sqrt(fan_in) (PyTorch's default bound), BatchNorm
/// as `nn::random` (weight 1 ± 0.1, bias ± 0.1, mean ± 0.1, var in [0.5, 1.5]); the grid
/// parameters are the YAML's.
pub fn random_tensors(cfg: &LssConfig, prefix: &str, seed: u64) -> NamedTensors {
    let params = LssParams::from_config(cfg);
    let grid = grid_tensors(&params);
    let mut rng = SplitMix(seed);
    weight_specs(cfg, prefix)
        .into_iter()
        .map(|s| {
            let short = &s.name[prefix.len()..];
            let data = if let Some((_, v)) = grid.iter().find(|(n, _)| *n == short) {
                v.clone()
            } else {
                let (lo, hi) = if short.ends_with("running_mean") {
                    (-0.1, 0.1)
                } else if short.ends_with("running_var") {
                    (0.5, 1.5)
                } else if short.starts_with("downsample") && s.shape.len() == 1 && short.ends_with("weight") {
                    (0.9, 1.1)
                } else if short.starts_with("downsample") && s.shape.len() == 1 {
                    (-0.1, 0.1)
                } else {
                    let fan_in = if short == "depthnet.bias" { cfg.vtransform.in_channels } else { s.shape[1..].iter().product() };
                    let b = 1.0 / (fan_in as f64).sqrt();
                    (-b, b)
                };
                (0..s.numel()).map(|_| rng.uniform(lo, hi)).collect()
            };
            (s.name, s.shape, data)
        })
        .collect()
}

/// The view transform with BatchNorm folded into the downsample convs.
#[derive(Debug, Clone)]
pub struct LssTransform {
    pub params: LssParams,
    pub depthnet: Conv2d,
    /// The three downsample convs (empty when `downsample: 1`), each followed by ReLU.
    pub downsample: Vec<Conv2d>,
}

fn config_err(reason: String) -> ModelError {
    ModelError::Config(reason)
}

impl LssTransform {
    /// Takes the view transform's tensors under `prefix` out of `w`. `frustum`, `dx`, `bx`,
    /// `nx` are optional (upstream checkpoints have them; a bare export may not): when present
    /// they must agree with the YAML (dx, bx to 1e-6 relative, nx exactly, frustum to 1e-3 px / m)
    /// and their values are the ones used, as upstream's `load_state_dict` replaces its own; a
    /// disagreement is an error naming both values (the checkpoint was trained with another
    /// grid, image or feature size, or depth range: fix the YAML).
    pub fn from_weights(cfg: &LssConfig, w: &mut Weights, prefix: &str) -> Result<Self, ModelError> {
        let mut params = LssParams::from_config(cfg);
        let specs = weight_specs(cfg, prefix);
        let take = |w: &mut Weights, n: &str| -> Result<Vec<f32>, ModelError> {
            let full = format!("{prefix}{n}");
            let shape = specs.iter().find(|s| s.name == full).map(|s| s.shape.clone()).unwrap_or_default();
            w.take(&full, &shape)
        };
        // grid parameters: the present ones are checked against the YAML, then used
        for (name, want) in grid_tensors(&params) {
            let full = format!("{prefix}{name}");
            if w.get(&full).is_none() {
                continue;
            }
            let got = take(w, name)?;
            let agree = |a: f32, b: f32| match name {
                "nx" => a == b,
                "frustum" => (a - b).abs() <= 1e-3,
                _ => (a - b).abs() <= 1e-6 * a.abs().max(b.abs()).max(1.0),
            };
            if let Some(i) = (0..want.len()).find(|&i| !agree(got[i], want[i])) {
                let keys = match name {
                    "frustum" => "image_size, feature_size and dbound",
                    _ => "xbound, ybound and zbound",
                };
                return Err(config_err(format!(
                    "{full}[{i}] is {} in the weights but {} from the model YAML's {keys}: the checkpoint was made for \
                     another view-transform geometry; make the YAML match it",
                    got[i], want[i]
                )));
            }
            match name {
                "frustum" => params.frustum.data = got,
                "dx" => params.grid.dx = [got[0], got[1], got[2]],
                "bx" => params.grid.bx = [got[0], got[1], got[2]],
                _ => {} // nx: equal to the YAML's
            }
        }
        let v = &cfg.vtransform;
        let (d, c) = (cfg.depth_bins(), cfg.channels());
        let dw = take(w, "depthnet.weight")?;
        let db = take(w, "depthnet.bias")?;
        let depthnet = Conv2d::new(v.in_channels, d + c, 1, 1, [1, 1], [0, 0], dw, Some(db)).map_err(|e| config_err(e.to_string()))?;
        let mut downsample = Vec::new();
        if v.downsample > 1 {
            for (conv, bn, stride) in [(0, 1, 1), (3, 4, v.downsample), (6, 7, 1)] {
                let weight = take(w, &format!("downsample.{conv}.weight"))?;
                let mut k = Conv2d::new(c, c, 3, 3, [stride, stride], [1, 1], weight, None).map_err(|e| config_err(e.to_string()))?;
                let g = take(w, &format!("downsample.{bn}.weight"))?;
                let b = take(w, &format!("downsample.{bn}.bias"))?;
                let m = take(w, &format!("downsample.{bn}.running_mean"))?;
                let var = take(w, &format!("downsample.{bn}.running_var"))?;
                let norm = batch_norm_2d(&g, &b, &m, &var).map_err(|e| config_err(format!("{prefix}downsample.{bn}: {e}")))?;
                k.fold_bn(&norm).map_err(|e| config_err(e.to_string()))?;
                downsample.push(k);
            }
        }
        Ok(Self { params, depthnet, downsample })
    }

    /// From a weights store holding only this transform's tensors: every tensor is checked
    /// first, so the error lists all missing, unexpected and mis-shaped names at once (the grid
    /// parameters may be absent).
    pub fn from_weights_exact(cfg: &LssConfig, mut w: Weights, prefix: &str) -> Result<Self, ModelError> {
        let specs: Vec<WeightSpec> = weight_specs(cfg, prefix)
            .into_iter()
            .filter(|s| !is_grid_param(&s.name, prefix) || w.get(&s.name).is_some())
            .collect();
        w.check(&specs)?;
        Self::from_weights(cfg, &mut w, prefix)
    }

    pub fn config(&self) -> &LssConfig {
        &self.params.cfg
    }

    pub fn grid(&self) -> &BevGrid {
        &self.params.grid
    }

    pub fn frustum(&self) -> &Frustum {
        &self.params.frustum
    }

    /// Checks that `x` is a feature map this transform and `geom` can take.
    pub fn check_features(&self, geom: &LssGeometry, cameras: usize, h: usize, w: usize, c: usize) -> Result<(), Error> {
        let f = &self.params.frustum;
        if (h, w) != (f.height, f.width) {
            return Err(Error::InvalidInput(format!(
                "camera features are {h}x{w} but the view transform expects feature_size {}x{} \
                 (image_size / 8 of the encoder): the image or the encoder does not match the model YAML",
                f.height, f.width
            )));
        }
        if c != self.depthnet.cin {
            return Err(Error::InvalidInput(format!("camera features have {c} channels, the depthnet takes {}", self.depthnet.cin)));
        }
        if cameras != geom.cameras {
            return Err(Error::InvalidInput(format!(
                "{cameras} camera feature maps for a calibration of {} cameras",
                geom.cameras
            )));
        }
        if (geom.depth_bins, geom.height, geom.width) != (f.depth_bins, f.height, f.width) || geom.grid != self.params.grid {
            return Err(Error::InvalidInput("the geometry was built for another view transform".into()));
        }
        Ok(())
    }

    /// depthnet + softmax over depth.
    pub fn lift(&self, x: &FeatureMap) -> Result<Lifted, Error> {
        let y = self.depthnet.forward(x, Activation::None)?;
        let (d, c) = (self.params.frustum.depth_bins, self.params.cfg.channels());
        let pixels = y.pixels();
        let mut depth = vec![0f32; pixels * d];
        let mut context = vec![0f32; pixels * c];
        depth.par_chunks_mut(d).zip(context.par_chunks_mut(c)).zip(y.data.par_chunks(d + c)).for_each(|((dp, cx), row)| {
            softmax_into(&row[..d], dp);
            cx.copy_from_slice(&row[d..]);
        });
        Ok(Lifted { cameras: x.n, height: x.h, width: x.w, depth_bins: d, channels: c, depth, context })
    }

    /// lift → pool → downsample: the camera BEV map `[1, nx / s, ny / s, nz · C]`.
    pub fn forward(&self, geom: &LssGeometry, x: &FeatureMap, mask: CameraMask) -> Result<FeatureMap, Error> {
        self.check_features(geom, x.n, x.h, x.w, x.c)?;
        let lifted = self.lift(x)?;
        let mut bev = pool(geom, &lifted.depth, &lifted.context, lifted.channels, mask)?;
        for conv in &self.downsample {
            bev = conv.forward(&bev, Activation::Relu)?;
        }
        Ok(bev)
    }
}

fn is_grid_param(name: &str, prefix: &str) -> bool {
    matches!(name.strip_prefix(prefix), Some("frustum" | "dx" | "bx" | "nx"))
}

/// Softmax of `x` into `out` (max subtracted, f32, sequential sums).
pub fn softmax_into(x: &[f32], out: &mut [f32]) {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut s = 0f32;
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v - m).exp();
        s += *o;
    }
    for o in out.iter_mut() {
        *o /= s;
    }
}

/// The lifted tensors of one frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Lifted {
    pub cameras: usize,
    pub height: usize,
    pub width: usize,
    pub depth_bins: usize,
    pub channels: usize,
    /// `[N, H, W, D]` depth probabilities.
    pub depth: Vec<f32>,
    /// `[N, H, W, C]` context features.
    pub context: Vec<f32>,
}

/// The pool: BEV map `[1, nx, ny, nz · C]` with `out[cell, c] = Σ depth[q] · context[q / D, c]`
/// over the cell's points in table order (f32, sequential), cameras outside `mask` skipped.
pub fn pool(geom: &LssGeometry, depth: &[f32], context: &[f32], channels: usize, mask: CameraMask) -> Result<FeatureMap, Error> {
    let d = geom.depth_bins;
    let pixels = geom.cameras * geom.pixels_per_camera();
    if depth.len() != pixels * d || context.len() != pixels * channels || channels == 0 {
        return Err(Error::InvalidInput(format!(
            "pool: depth has {} values and context {} for {} cameras x {}x{} pixels x ({d} bins, {channels} channels)",
            depth.len(),
            context.len(),
            geom.cameras,
            geom.height,
            geom.width
        )));
    }
    let [nx, ny, nz] = geom.grid.nx;
    let mut out = FeatureMap::zeros(1, nx, ny, nz * channels)?;
    let per_camera = geom.pixels_per_camera() * d;
    out.data.par_chunks_mut(channels).enumerate().for_each(|(cell, acc)| {
        let (s, e) = (geom.cell_start[cell] as usize, geom.cell_start[cell + 1] as usize);
        for &q in &geom.order[s..e] {
            let q = q as usize;
            if !mask.contains(q / per_camera) {
                continue;
            }
            let p = depth[q];
            let f = &context[(q / d) * channels..(q / d + 1) * channels];
            for (a, &v) in acc.iter_mut().zip(f) {
                *a += p * v;
            }
        }
    });
    Ok(out)
}
