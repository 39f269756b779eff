//! BEVFusion's BEV decoders (mit-han-lab/bevfusion at db75150), CPU reference:
//!
//! - the fusion model's `SECOND` (mmdet3d/models/backbones/second.py) + `SECONDFPN`
//!   (necks/second.py): stages of conv3×3-BN-ReLU (the first with the stage's stride), then per
//!   stage a branch — conv (`use_conv_for_no_stride`, stride 1) or `ConvTranspose2d` (kernel =
//!   stride) — with BN-ReLU, the branches concatenated in order;
//! - the camera-only model's `GeneralizedResNet` (backbones/resnet.py: mmcv's `make_res_layer`
//!   of torchvision-style `BasicBlock`s) + `LSSFPN` (necks/lss.py: bilinear upsampling with
//!   `align_corners=True`, `cat([upsampled deep, shallow])`, conv1×1-BN-ReLU, conv3×3-BN-ReLU,
//!   then upsample ×scale_factor (align_corners=True) and conv3×3-BN-ReLU).
//!
//! BatchNorm is folded into the convs at load (SECOND's eps from its `norm_cfg`, 1e-3 in
//! BEVFusion; `nn.BatchNorm2d`'s 1e-5 in the ResNet and LSSFPN). Maps are NHWC with H = the
//! LiDAR x cell and W = the y cell (upstream's (B, C, X, Y)).
//!
//! `state_dict` names (prefix `decoder.`): `backbone.blocks.{i}.{3j}` conv /
//! `backbone.blocks.{i}.{3j+1}` BN; `neck.deblocks.{i}.0` conv or deconv, `neck.deblocks.{i}.1`
//! BN; `backbone.{l}.{b}.{conv1, bn1, conv2, bn2}`, `backbone.{l}.0.downsample.{0, 1}`;
//! `neck.fuse.{0, 1, 3, 4}`, `neck.upsample.{1, 2}`.

use crate::models::bevfusion::config::{DecoderConfig, FpnBranch, LssFpnConfig, ResNetConfig, SecondConfig, SecondFpnConfig};
use crate::models::bevfusion::load::{conv_bn, deconv_bn, ConvSpec};
use crate::ops::dense::{bilinear_resize, concat_channels, Activation, Conv2d, ConvTranspose2d, FeatureMap, BATCH_NORM_2D_EPS};
use crate::nn::weights::{TensorSource, Weights};
use crate::nn::ModelError;
use crate::Error;

/// Where the decoder's tensors live.
pub const DECODER_PREFIX: &str = "decoder";

const BN2D: f64 = BATCH_NORM_2D_EPS as f64;

fn check_input(x: &FeatureMap, c: usize, what: &str) -> Result<(), Error> {
    if x.c != c {
        return Err(Error::InvalidInput(format!("{what}: input has {} channels, expected {c}", x.c)));
    }
    if x.n == 0 || x.h == 0 || x.w == 0 {
        return Err(Error::InvalidInput(format!("{what}: empty input [n {}, {} x {}]", x.n, x.h, x.w)));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// SECOND + SECONDFPN
// ---------------------------------------------------------------------------------------------

/// One SECONDFPN branch, BatchNorm folded (ReLU follows).
#[derive(Debug, Clone)]
pub enum FpnUp {
    Conv(Conv2d),
    Deconv(ConvTranspose2d),
}

impl FpnUp {
    pub fn forward(&self, x: &FeatureMap) -> Result<FeatureMap, Error> {
        match self {
            FpnUp::Conv(c) => c.forward(x, Activation::Relu),
            FpnUp::Deconv(d) => d.forward(x, Activation::Relu),
        }
    }
}

/// `SECOND` + `SECONDFPN`.
#[derive(Debug, Clone)]
pub struct SecondDecoder {
    pub backbone: SecondConfig,
    pub neck: SecondFpnConfig,
    /// Per stage its convs (each followed by ReLU), the first strided.
    pub stages: Vec<Vec<Conv2d>>,
    /// Per stage its neck branch.
    pub deblocks: Vec<FpnUp>,
}

impl SecondDecoder {
    /// Builds the decoder from `{prefix}.backbone.*` and `{prefix}.neck.*` tensors.
    pub(crate) fn load(b: &SecondConfig, n: &SecondFpnConfig, src: &mut dyn TensorSource, prefix: &str) -> Result<Self, ModelError> {
        let mut stages = Vec::with_capacity(b.out_channels.len());
        let mut cin = b.in_channels;
        for (i, (&cout, (&layers, &stride))) in b.out_channels.iter().zip(b.layer_nums.iter().zip(&b.layer_strides)).enumerate() {
            let mut convs = Vec::with_capacity(layers + 1);
            for j in 0..=layers {
                let p = format!("{prefix}.backbone.blocks.{i}");
                let spec = ConvSpec { cin: if j == 0 { cin } else { cout }, cout, k: 3, stride: if j == 0 { stride } else { 1 }, pad: 1, bias: b.conv_bias };
                convs.push(conv_bn(src, &format!("{p}.{}", 3 * j), spec, Some((&format!("{p}.{}", 3 * j + 1), b.bn_eps)))?);
            }
            stages.push(convs);
            cin = cout;
        }
        let mut deblocks = Vec::with_capacity(n.branches.len());
        for (i, (&br, (&ci, &co))) in n.branches.iter().zip(n.in_channels.iter().zip(&n.out_channels)).enumerate() {
            let p = format!("{prefix}.neck.deblocks.{i}");
            let bn = (format!("{p}.1"), n.bn_eps);
            deblocks.push(match br {
                FpnBranch::Conv(s) => {
                    let spec = ConvSpec { cin: ci, cout: co, k: s, stride: s, pad: 0, bias: n.conv_bias };
                    FpnUp::Conv(conv_bn(src, &format!("{p}.0"), spec, Some((&bn.0, bn.1)))?)
                }
                FpnBranch::Deconv(s) => FpnUp::Deconv(deconv_bn(src, &format!("{p}.0"), ci, co, s, n.deconv_bias, (&bn.0, bn.1))?),
            });
        }
        Ok(Self { backbone: b.clone(), neck: n.clone(), stages, deblocks })
    }

    /// SECOND's stage outputs.
    pub fn backbone_forward(&self, x: &FeatureMap) -> Result<Vec<FeatureMap>, Error> {
        check_input(x, self.backbone.in_channels, "SECOND")?;
        let mut outs: Vec<FeatureMap> = Vec::with_capacity(self.stages.len());
        for convs in &self.stages {
            let mut y = convs[0].forward(outs.last().unwrap_or(x), Activation::Relu)?;
            for c in &convs[1..] {
                y = c.forward(&y, Activation::Relu)?;
            }
            outs.push(y);
        }
        Ok(outs)
    }

    /// SECONDFPN of the stage outputs: the branches' outputs concatenated.
    pub fn neck_forward(&self, stages: &[FeatureMap]) -> Result<FeatureMap, Error> {
        if stages.len() != self.deblocks.len() {
            return Err(Error::InvalidInput(format!("SECONDFPN: {} inputs for {} branches", stages.len(), self.deblocks.len())));
        }
        let mut out: Option<FeatureMap> = None;
        for (d, x) in self.deblocks.iter().zip(stages) {
            let y = d.forward(x)?;
            out = Some(match out {
                None => y,
                Some(o) => concat_channels(&o, &y)?,
            });
        }
        out.ok_or_else(|| Error::InvalidInput("SECONDFPN: no branches".into()))
    }
}

// ---------------------------------------------------------------------------------------------
// GeneralizedResNet + LSSFPN
// ---------------------------------------------------------------------------------------------

/// A `BasicBlock`: `relu(bn2(conv2(relu(bn1(conv1(x))))) + identity)`, identity =
/// `downsample(x)` (conv1×1 with the block's stride + BN) where the block changes stride or
/// channels, else `x`. conv1 carries the stride.
#[derive(Debug, Clone)]
pub struct BasicBlock {
    pub conv1: Conv2d,
    pub conv2: Conv2d,
    pub downsample: Option<Conv2d>,
}

impl BasicBlock {
    fn load(src: &mut dyn TensorSource, p: &str, cin: usize, cout: usize, stride: usize) -> Result<Self, ModelError> {
        let c3 = |cin| ConvSpec { cin, cout, k: 3, stride: 1, pad: 1, bias: false };
        let conv1 = conv_bn(src, &format!("{p}.conv1"), ConvSpec { stride, ..c3(cin) }, Some((&format!("{p}.bn1"), BN2D)))?;
        let conv2 = conv_bn(src, &format!("{p}.conv2"), c3(cout), Some((&format!("{p}.bn2"), BN2D)))?;
        let downsample = if stride != 1 || cin != cout {
            let spec = ConvSpec { cin, cout, k: 1, stride, pad: 0, bias: false };
            Some(conv_bn(src, &format!("{p}.downsample.0"), spec, Some((&format!("{p}.downsample.1"), BN2D)))?)
        } else {
            None
        };
        Ok(Self { conv1, conv2, downsample })
    }

    pub fn forward(&self, x: &FeatureMap) -> Result<FeatureMap, Error> {
        let y = self.conv1.forward(x, Activation::Relu)?;
        let mut y = self.conv2.forward(&y, Activation::None)?;
        let id = match &self.downsample {
            Some(d) => d.forward(x, Activation::None)?,
            None => x.clone(),
        };
        if id.data.len() != y.data.len() {
            return Err(Error::InvalidInput(format!("BasicBlock: identity of {} values for {}", id.data.len(), y.data.len())));
        }
        for (a, b) in y.data.iter_mut().zip(&id.data) {
            *a = (*a + b).max(0.0);
        }
        Ok(y)
    }
}

/// `GeneralizedResNet` + `LSSFPN`.
#[derive(Debug, Clone)]
pub struct ResNetDecoder {
    pub backbone: ResNetConfig,
    pub neck: LssFpnConfig,
    /// Per layer its blocks.
    pub layers: Vec<Vec<BasicBlock>>,
    /// `fuse.0` + `fuse.1` (1×1, ReLU) and `fuse.3` + `fuse.4` (3×3, ReLU).
    pub fuse: [Conv2d; 2],
    /// `upsample.1` + `upsample.2` (3×3, ReLU) when `scale_factor > 1`.
    pub upsample: Option<Conv2d>,
}

impl ResNetDecoder {
    /// Builds the decoder from `{prefix}.backbone.*` and `{prefix}.neck.*` tensors.
    pub(crate) fn load(b: &ResNetConfig, n: &LssFpnConfig, src: &mut dyn TensorSource, prefix: &str) -> Result<Self, ModelError> {
        let mut layers = Vec::with_capacity(b.blocks.len());
        let mut cin = b.in_channels;
        for (l, &[count, cout, stride]) in b.blocks.iter().enumerate() {
            let mut blocks = Vec::with_capacity(count);
            for j in 0..count {
                let p = format!("{prefix}.backbone.{l}.{j}");
                blocks.push(if j == 0 { BasicBlock::load(src, &p, cin, cout, stride)? } else { BasicBlock::load(src, &p, cout, cout, 1)? });
            }
            layers.push(blocks);
            cin = cout;
        }
        let (o, p) = (n.out_channels, format!("{prefix}.neck"));
        let fuse0 = conv_bn(src, &format!("{p}.fuse.0"), ConvSpec { cin: n.in_channels[0] + n.in_channels[1], cout: o, k: 1, stride: 1, pad: 0, bias: false }, Some((&format!("{p}.fuse.1"), BN2D)))?;
        let c3 = ConvSpec { cin: o, cout: o, k: 3, stride: 1, pad: 1, bias: false };
        let fuse1 = conv_bn(src, &format!("{p}.fuse.3"), c3, Some((&format!("{p}.fuse.4"), BN2D)))?;
        let upsample = if n.scale_factor > 1 { Some(conv_bn(src, &format!("{p}.upsample.1"), c3, Some((&format!("{p}.upsample.2"), BN2D)))?) } else { None };
        Ok(Self { backbone: b.clone(), neck: n.clone(), layers, fuse: [fuse0, fuse1], upsample })
    }

    /// The backbone's layer outputs.
    pub fn backbone_forward(&self, x: &FeatureMap) -> Result<Vec<FeatureMap>, Error> {
        check_input(x, self.backbone.in_channels, "GeneralizedResNet")?;
        let mut outs: Vec<FeatureMap> = Vec::with_capacity(self.layers.len());
        for blocks in &self.layers {
            let mut y = blocks[0].forward(outs.last().unwrap_or(x))?;
            for b in &blocks[1..] {
                y = b.forward(&y)?;
            }
            outs.push(y);
        }
        Ok(outs)
    }

    /// LSSFPN of the backbone's outputs.
    pub fn neck_forward(&self, outs: &[FeatureMap]) -> Result<FeatureMap, Error> {
        let [i1, i2] = self.neck.in_indices;
        let (x1, x2) = match (outs.get(i1), outs.get(i2)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(Error::InvalidInput(format!("LSSFPN: {} inputs, indices {:?}", outs.len(), self.neck.in_indices))),
        };
        let up = bilinear_resize(x1, x2.h, x2.w, true);
        let cat = concat_channels(&up, x2)?;
        let y = self.fuse[0].forward(&cat, Activation::Relu)?;
        let y = self.fuse[1].forward(&y, Activation::Relu)?;
        match &self.upsample {
            None => Ok(y),
            Some(c) => {
                let s = self.neck.scale_factor;
                let up = bilinear_resize(&y, y.h * s, y.w * s, true);
                c.forward(&up, Activation::Relu)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Either
// ---------------------------------------------------------------------------------------------

/// The decoder of a BEVFusion seg model (built once per model: the variants' size difference
/// does not matter).
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum BevDecoder {
    Second(SecondDecoder),
    ResNet(ResNetDecoder),
}

impl BevDecoder {
    /// Builds the configured decoder from `decoder.*` tensors (taken out of `weights`).
    pub fn load(cfg: &DecoderConfig, weights: &mut Weights) -> Result<Self, ModelError> {
        Self::build(cfg, weights)
    }

    pub(crate) fn build(cfg: &DecoderConfig, src: &mut dyn TensorSource) -> Result<Self, ModelError> {
        Ok(match cfg {
            DecoderConfig::Second { backbone, neck } => BevDecoder::Second(SecondDecoder::load(backbone, neck, src, DECODER_PREFIX)?),
            DecoderConfig::ResNet { backbone, neck } => BevDecoder::ResNet(ResNetDecoder::load(backbone, neck, src, DECODER_PREFIX)?),
        })
    }

    /// Backbone then neck: the map the head reads.
    pub fn forward(&self, x: &FeatureMap) -> Result<FeatureMap, Error> {
        match self {
            BevDecoder::Second(d) => d.neck_forward(&d.backbone_forward(x)?),
            BevDecoder::ResNet(d) => d.neck_forward(&d.backbone_forward(x)?),
        }
    }

    pub fn in_channels(&self) -> usize {
        match self {
            BevDecoder::Second(d) => d.backbone.in_channels,
            BevDecoder::ResNet(d) => d.backbone.in_channels,
        }
    }

    pub fn out_channels(&self) -> usize {
        match self {
            BevDecoder::Second(d) => d.neck.out_channels.iter().sum(),
            BevDecoder::ResNet(d) => d.neck.out_channels,
        }
    }
}
