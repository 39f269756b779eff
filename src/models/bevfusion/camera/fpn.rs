//! BEVFusion's `GeneralizedLSSFPN` (mmdet3d/models/necks/generalized_lss.py at db75150) on the
//! CPU: the neck between the Swin backbone and the view transform.
//!
//! With inputs `x_0 … x_L` (finest first), for `i = L - 1` down to 0:
//!
//! ```text
//! x_i = fpn_convs[i](lateral_convs[i](cat[x_i, interpolate(x_{i+1}, size of x_i, bilinear)]))
//! ```
//!
//! where `x_{i+1}` is the raw last input for `i = L - 1` and the previous step's output below it;
//! the outputs are `x_0 … x_{L-1}` (upstream's `num_outs` does not change that). Each conv is an
//! mmcv `ConvModule`: lateral 1 × 1, fpn 3 × 3 padding 1, each followed by BatchNorm2d and ReLU;
//! with a norm the conv has no bias (`bias='auto'`). `state_dict` names (under
//! `encoders.camera.neck.`): `lateral_convs.{i}.conv.weight`, `lateral_convs.{i}.bn.*`, then
//! `fpn_convs.{i}.*` likewise. BatchNorm is folded into the conv at load.

use crate::models::bevfusion::camera::config::FpnConfig;
use crate::nn::weights::{bad_weights, TensorSource as Source};
use crate::ops::dense::{bilinear_resize, concat_channels, Activation, Conv2d, FeatureMap};
use crate::ops::rowwise::cpu::BatchNorm;
use crate::nn::ModelError;
use crate::ops::sparse_conv::cpu::fold_batch_norm;
use crate::Error;

/// An mmcv `ConvModule` (conv, optional BatchNorm folded in, optional ReLU).
#[derive(Debug, Clone)]
pub struct ConvModule {
    pub conv: Conv2d,
    pub act: Activation,
}

impl ConvModule {
    #[allow(clippy::too_many_arguments)]
    fn load(src: &mut dyn Source, p: &str, cin: usize, cout: usize, k: usize, bn_eps: Option<f64>, relu: bool) -> Result<Self, ModelError> {
        let w = src.tensor(&format!("{p}.conv.weight"), &[cout, cin, k, k])?;
        // `bias='auto'`: a conv followed by a norm has no bias
        let b = if bn_eps.is_none() { Some(src.tensor(&format!("{p}.conv.bias"), &[cout])?) } else { None };
        let pad = k / 2;
        let mut conv = Conv2d::new(cin, cout, k, k, [1, 1], [pad, pad], w, b).map_err(|e| bad_weights(p, e))?;
        if let Some(eps) = bn_eps {
            let bn = format!("{p}.bn");
            let g = src.tensor(&format!("{bn}.weight"), &[cout])?;
            let beta = src.tensor(&format!("{bn}.bias"), &[cout])?;
            let mean = src.tensor(&format!("{bn}.running_mean"), &[cout])?;
            let var = src.tensor(&format!("{bn}.running_var"), &[cout])?;
            if let Some(v) = var.iter().find(|v| !(v.is_finite() && (**v as f64 + eps) > 0.0)) {
                return Err(ModelError::Config(format!("{bn}.running_var: {v} gives no real 1/sqrt(var + eps)")));
            }
            let (scale, shift) = fold_batch_norm(&g, &beta, &mean, &var, eps as f32).map_err(|e| bad_weights(&bn, e))?;
            conv.fold_bn(&BatchNorm { scale, shift }).map_err(|e| bad_weights(&bn, e))?;
        }
        Ok(Self { conv, act: if relu { Activation::Relu } else { Activation::None } })
    }

    pub fn forward(&self, x: &FeatureMap) -> Result<FeatureMap, Error> {
        self.conv.forward(x, self.act)
    }
}

/// The neck.
#[derive(Debug, Clone)]
pub struct GeneralizedLssFpn {
    pub config: FpnConfig,
    pub lateral_convs: Vec<ConvModule>,
    pub fpn_convs: Vec<ConvModule>,
}

impl GeneralizedLssFpn {
    /// Builds the neck from tensors under `prefix` (`state_dict` order: every lateral conv,
    /// then every fpn conv).
    pub(crate) fn load(src: &mut dyn Source, prefix: &str, cfg: &FpnConfig) -> Result<Self, ModelError> {
        let out = cfg.out_channels;
        let mut lateral_convs = Vec::with_capacity(cfg.outputs());
        for i in 0..cfg.outputs() {
            lateral_convs.push(ConvModule::load(src, &format!("{prefix}.lateral_convs.{i}"), cfg.lateral_in(i), out, 1, cfg.lateral_bn_eps, cfg.relu)?);
        }
        let mut fpn_convs = Vec::with_capacity(cfg.outputs());
        for i in 0..cfg.outputs() {
            fpn_convs.push(ConvModule::load(src, &format!("{prefix}.fpn_convs.{i}"), out, out, 3, cfg.fpn_bn_eps, cfg.relu)?);
        }
        Ok(Self { config: cfg.clone(), lateral_convs, fpn_convs })
    }

    /// One top-down step: `x` (level i) with the coarser `coarse`, through pair i.
    pub fn step(&self, i: usize, x: &FeatureMap, coarse: &FeatureMap) -> Result<FeatureMap, Error> {
        let up = bilinear_resize(coarse, x.h, x.w, self.config.align_corners);
        let cat = concat_channels(x, &up)?;
        let y = self.lateral_convs[i].forward(&cat)?;
        self.fpn_convs[i].forward(&y)
    }

    /// The neck's outputs (finest first) of the backbone's outputs (finest first).
    pub fn forward(&self, inputs: &[FeatureMap]) -> Result<Vec<FeatureMap>, Error> {
        let levels = self.config.in_channels.len();
        if inputs.len() != levels {
            return Err(Error::InvalidInput(format!("neck: {} inputs for {levels} levels", inputs.len())));
        }
        for (i, (x, &c)) in inputs.iter().zip(&self.config.in_channels).enumerate() {
            if x.c != c || x.n != inputs[0].n {
                return Err(Error::InvalidInput(format!(
                    "neck: input {i} has {} channels and batch {}, expected {c} and {}",
                    x.c, x.n, inputs[0].n
                )));
            }
        }
        // built coarsest first: each step reads the previous step's output
        let mut outs: Vec<FeatureMap> = Vec::with_capacity(levels - 1);
        for i in (0..levels - 1).rev() {
            let coarse = outs.last().unwrap_or(&inputs[levels - 1]);
            let y = self.step(i, &inputs[i], coarse)?;
            outs.push(y);
        }
        outs.reverse();
        Ok(outs)
    }
}
