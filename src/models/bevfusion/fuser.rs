//! BEVFusion's `ConvFuser` (mmdet3d/models/fusers/conv.py at db75150): the BEV maps of the
//! sensors concatenated along channels in the model's order (camera first, then LiDAR), then
//! conv3×3 (padding 1, no bias) → BatchNorm2d (eps 1e-5) → ReLU. `state_dict` names:
//! `fuser.0.weight` `[out, Σ in, 3, 3]`, `fuser.1.{weight, bias, running_mean, running_var}`.

use crate::models::bevfusion::config::FuserConfig;
use crate::models::bevfusion::load::{conv_bn, ConvSpec};
use crate::ops::dense::{concat_channels, Activation, Conv2d, FeatureMap, BATCH_NORM_2D_EPS};
use crate::nn::weights::{TensorSource, Weights};
use crate::nn::ModelError;
use crate::Error;

/// Where the fuser's tensors live.
pub const FUSER_PREFIX: &str = "fuser";

/// The fuser with its BatchNorm folded.
#[derive(Debug, Clone)]
pub struct BevFuser {
    pub config: FuserConfig,
    pub conv: Conv2d,
}

impl BevFuser {
    /// Builds the fuser from `fuser.*` tensors (taken out of `weights`).
    pub fn load(cfg: &FuserConfig, weights: &mut Weights) -> Result<Self, ModelError> {
        Self::build(cfg, weights)
    }

    pub(crate) fn build(cfg: &FuserConfig, src: &mut dyn TensorSource) -> Result<Self, ModelError> {
        let spec = ConvSpec { cin: cfg.in_channels.iter().sum(), cout: cfg.out_channels, k: 3, stride: 1, pad: 1, bias: false };
        let conv = conv_bn(src, &format!("{FUSER_PREFIX}.0"), spec, Some((&format!("{FUSER_PREFIX}.1"), BATCH_NORM_2D_EPS as f64)))?;
        Ok(Self { config: cfg.clone(), conv })
    }

    /// Fuses the sensors' BEV maps, given in the config's order (BEVFusion: camera, LiDAR).
    pub fn forward(&self, inputs: &[&FeatureMap]) -> Result<FeatureMap, Error> {
        check_inputs(&self.config, inputs.iter().map(|m| (m.n, m.h, m.w, m.c)))?;
        let mut cat = inputs[0].clone();
        for m in &inputs[1..] {
            cat = concat_channels(&cat, m)?;
        }
        self.conv.forward(&cat, Activation::Relu)
    }
}

/// The inputs' count, channels and sizes against the config: one map per input, the
/// configured channels, one batch and BEV size for all.
pub(crate) fn check_inputs(cfg: &FuserConfig, dims: impl Iterator<Item = (usize, usize, usize, usize)>) -> Result<(), Error> {
    let dims: Vec<_> = dims.collect();
    let chans: Vec<usize> = dims.iter().map(|d| d.3).collect();
    if chans != cfg.in_channels {
        return Err(Error::InvalidInput(format!(
            "fuser: inputs of {chans:?} channels, the fuser takes {:?} (camera first, then LiDAR)",
            cfg.in_channels
        )));
    }
    if let Some(d) = dims.iter().find(|d| (d.0, d.1, d.2) != (dims[0].0, dims[0].1, dims[0].2)) {
        return Err(Error::InvalidInput(format!(
            "fuser: BEV maps of [n {}, {} x {}] and [n {}, {} x {}] differ in size",
            dims[0].0, dims[0].1, dims[0].2, d.0, d.1, d.2
        )));
    }
    Ok(())
}
