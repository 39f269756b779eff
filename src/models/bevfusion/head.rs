//! BEVFusion's `BEVSegmentationHead` (mmdet3d/models/heads/segm/vanilla.py at db75150), CPU
//! reference: `BEVGridTransform` (`F.grid_sample`, bilinear, `align_corners=False`, zero
//! padding) from the decoder's grid (`input_scope`, 0.8 m cells over ±51.2 m) to the output grid
//! (`output_scope`, 0.5 m cells over ±50 m: 200 × 200), then conv3×3-BN-ReLU ×2, conv1×1 (with
//! bias) to one logit per class, sigmoid.
//!
//! The grid is built as upstream builds it: per axis `v = arange(omin + ostep / 2, omax,
//! ostep)` normalized by `(v − imin) / (imax − imin) · 2 − 1` (f32 arithmetic); `u, v =
//! meshgrid(x_coords, y_coords, indexing='ij')` and `grid = stack([v, u], -1)`, so output cell
//! (i, j) reads grid_sample's x (the width, W = the LiDAR y cell) from the y scope at j and its y
//! (the height, H = the LiDAR x cell) from the x scope at i.
//!
//! `state_dict` names (prefix `heads.map.`): `classifier.{0, 3}` convs, `classifier.{1, 4}` BNs,
//! `classifier.6.{weight, bias}`.

use crate::models::bevfusion::config::SegHeadConfig;
use crate::models::bevfusion::load::{conv_bn, ConvSpec};
use crate::ops::dense::{grid_sample, Activation, Conv2d, FeatureMap, GridPadding, BATCH_NORM_2D_EPS};
use crate::nn::weights::{TensorSource, Weights};
use crate::nn::ModelError;
use crate::Error;

/// Where the head's tensors live.
pub const HEAD_PREFIX: &str = "heads.map";

/// Per-class probability maps: `data[((b · classes + k) · x + i) · y + j]` for image b, class
/// k, LiDAR x cell i and y cell j (upstream's `masks_bev` layout).
#[derive(Debug, Clone, PartialEq)]
pub struct BevMaps {
    pub n: usize,
    pub classes: usize,
    pub x: usize,
    pub y: usize,
    pub data: Vec<f32>,
}

impl BevMaps {
    /// Class `k` of image `b`: `x · y` probabilities, x-major.
    pub fn class_map(&self, b: usize, k: usize) -> &[f32] {
        let len = self.x * self.y;
        let start = (b * self.classes + k) * len;
        &self.data[start..start + len]
    }
}

/// The normalized coordinates of one axis: `(arange(omin + ostep/2, omax, ostep) − imin) /
/// (imax − imin) · 2 − 1`, as upstream computes them (arange in double, cast to f32, then f32
/// tensor arithmetic with the scalars rounded to f32).
pub fn grid_axis(input: [f64; 3], output: [f64; 3]) -> Vec<f32> {
    let (imin, imax) = (input[0], input[1]);
    let (omin, omax, ostep) = (output[0], output[1], output[2]);
    let start = omin + ostep / 2.0;
    let n = crate::models::bevfusion::config::arange_len(start, omax, ostep);
    let (imin_f, range_f) = (imin as f32, (imax - imin) as f32);
    (0..n).map(|i| (((start + i as f64 * ostep) as f32 - imin_f) / range_f) * 2.0 - 1.0).collect()
}

/// The head's sampling grid: `(x cells, y cells, grid)` with `grid[(i · ny + j) · 2] =
/// y_coords[j]` (grid_sample's x, along W) and `grid[(i · ny + j) · 2 + 1] = x_coords[i]`.
pub fn bev_grid(cfg: &SegHeadConfig) -> (usize, usize, Vec<f32>) {
    let xs = grid_axis(cfg.input_scope[0], cfg.output_scope[0]);
    let ys = grid_axis(cfg.input_scope[1], cfg.output_scope[1]);
    let mut g = Vec::with_capacity(xs.len() * ys.len() * 2);
    for &u in &xs {
        for &v in &ys {
            g.push(v);
            g.push(u);
        }
    }
    (xs.len(), ys.len(), g)
}

/// The head with BatchNorm folded.
#[derive(Debug, Clone)]
pub struct BevSegHead {
    pub config: SegHeadConfig,
    /// `classifier.0` + `.1` and `.3` + `.4` (3×3, ReLU).
    pub convs: [Conv2d; 2],
    /// `classifier.6` (1×1, bias): the logits.
    pub logits: Conv2d,
    /// Output cells along x and y, and the sampling grid ([`bev_grid`]).
    pub out_x: usize,
    pub out_y: usize,
    pub grid: Vec<f32>,
}

impl BevSegHead {
    /// Builds the head from `heads.map.*` tensors (taken out of `weights`).
    pub fn load(cfg: &SegHeadConfig, weights: &mut Weights) -> Result<Self, ModelError> {
        Self::build(cfg, weights)
    }

    pub(crate) fn build(cfg: &SegHeadConfig, src: &mut dyn TensorSource) -> Result<Self, ModelError> {
        let c = cfg.in_channels;
        let p = format!("{HEAD_PREFIX}.classifier");
        let c3 = ConvSpec { cin: c, cout: c, k: 3, stride: 1, pad: 1, bias: false };
        let eps = BATCH_NORM_2D_EPS as f64;
        let conv0 = conv_bn(src, &format!("{p}.0"), c3, Some((&format!("{p}.1"), eps)))?;
        let conv1 = conv_bn(src, &format!("{p}.3"), c3, Some((&format!("{p}.4"), eps)))?;
        let logits = conv_bn(src, &format!("{p}.6"), ConvSpec { cin: c, cout: cfg.classes.len(), k: 1, stride: 1, pad: 0, bias: true }, None)?;
        let (out_x, out_y, grid) = bev_grid(cfg);
        Ok(Self { config: cfg.clone(), convs: [conv0, conv1], logits, out_x, out_y, grid })
    }

    /// The decoder's map resampled onto the output grid (`BEVGridTransform`).
    pub fn transform(&self, x: &FeatureMap) -> Result<FeatureMap, Error> {
        if x.c != self.config.in_channels || x.n == 0 || x.h == 0 || x.w == 0 {
            return Err(Error::InvalidInput(format!(
                "map head: input [n {}, {} x {}, c {}], expected {} channels and a non-empty map",
                x.n, x.h, x.w, x.c, self.config.in_channels
            )));
        }
        grid_sample(x, &self.grid, self.out_x, self.out_y, GridPadding::Zeros, false)
    }

    /// Probability maps of the decoder's map.
    pub fn forward(&self, x: &FeatureMap) -> Result<BevMaps, Error> {
        let y = self.transform(x)?;
        let y = self.convs[0].forward(&y, Activation::Relu)?;
        let y = self.convs[1].forward(&y, Activation::Relu)?;
        let l = self.logits.forward(&y, Activation::None)?;
        Ok(to_class_major(&l))
    }
}

/// `1 / (1 + exp(−v))`.
pub fn sigmoid(v: f32) -> f32 {
    1.0 / (1.0 + (-v).exp())
}

/// NHWC logits `[n, x, y, classes]` → sigmoid probabilities, class-major.
fn to_class_major(l: &FeatureMap) -> BevMaps {
    let (n, x, y, k) = (l.n, l.h, l.w, l.c);
    let mut data = vec![0f32; l.data.len()];
    for b in 0..n {
        for i in 0..x {
            for j in 0..y {
                let px = l.pixel(b, i, j);
                for (c, &v) in px.iter().enumerate() {
                    data[((b * k + c) * x + i) * y + j] = sigmoid(v);
                }
            }
        }
    }
    BevMaps { n, classes: k, x, y, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head_cfg() -> SegHeadConfig {
        SegHeadConfig {
            in_channels: 4,
            input_scope: [[-51.2, 51.2, 0.8], [-51.2, 51.2, 0.8]],
            output_scope: [[-50.0, 50.0, 0.5], [-50.0, 50.0, 0.5]],
            classes: vec!["a".into(), "b".into()],
        }
    }

    #[test]
    fn grid_is_upstreams() {
        let (nx, ny, g) = bev_grid(&head_cfg());
        assert_eq!((nx, ny, g.len()), (200, 200, 80000));
        // cell centres -49.75 .. 49.75 normalized by 51.2: v / 51.2
        for (i, want) in [(0usize, -49.75f64 / 51.2), (1, -49.25 / 51.2), (199, 49.75 / 51.2)] {
            assert!((g[(i * 200) * 2 + 1] as f64 - want).abs() < 1e-6, "x {i}");
            assert!((g[i * 2] as f64 - want).abs() < 1e-6, "y {i}");
        }
        // the x coordinate (grid_sample's y) varies along rows, the y coordinate along columns
        assert_eq!(g[(3 * 200 + 7) * 2], g[7 * 2]);
        assert_eq!(g[(3 * 200 + 7) * 2 + 1], g[(3 * 200) * 2 + 1]);
        // unequal scopes: x takes the first, y the second
        let mut c = head_cfg();
        c.output_scope = [[-10.0, 10.0, 0.5], [-5.0, 5.0, 1.0]];
        let (nx, ny, g) = bev_grid(&c);
        assert_eq!((nx, ny), (40, 10));
        assert!((g[1] as f64 - (-9.75 / 51.2)).abs() < 1e-6 && (g[0] as f64 - (-4.5 / 51.2)).abs() < 1e-6);
        // the sample lands at pixel (v + 51.2) / 0.8 - 0.5 of a 128-cell input (grid_sample's
        // ((g + 1) · 128 − 1) / 2): 51.3125 for x = -9.75
        let ix = ((g[1] + 1.0) * 128.0 - 1.0) / 2.0;
        assert!((ix - 51.3125).abs() < 1e-4, "{ix}");
    }

    #[test]
    fn sigmoid_and_layout() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((sigmoid(2.0) - 0.880_797).abs() < 1e-6);
        // 1 image, 2 x 3 cells, 2 classes: pixel (i, j) has logits (i, -j)
        let mut d = Vec::new();
        for i in 0..2 {
            for j in 0..3 {
                d.push(i as f32);
                d.push(-(j as f32));
            }
        }
        let m = to_class_major(&FeatureMap::new(1, 2, 3, 2, d).unwrap());
        assert_eq!((m.n, m.classes, m.x, m.y), (1, 2, 2, 3));
        assert_eq!(m.class_map(0, 0), &[0.5, 0.5, 0.5, sigmoid(1.0), sigmoid(1.0), sigmoid(1.0)]);
        assert_eq!(m.class_map(0, 1), &[0.5, sigmoid(-1.0), sigmoid(-2.0), 0.5, sigmoid(-1.0), sigmoid(-2.0)]);
    }
}
