//! The BEV half of a BEVFusion seg model as one unit: fuser (if any), decoder, map head — their
//! `state_dict` specs, checked loading, deterministic random weights and the CPU forward.

use crate::models::bevfusion::config::{BevConfig, FpnBranch, DecoderConfig};
use crate::models::bevfusion::decoder::{BevDecoder, FpnUp};
use crate::models::bevfusion::head::{BevMaps, BevSegHead};
use crate::models::bevfusion::fuser::BevFuser;
use crate::nn::random::SplitMix;
use crate::nn::weights::{SpecRecorder, TensorSource, WeightSpec, Weights};
use crate::nn::ModelError;
use crate::ops::dense::{Conv2d, FeatureMap};
use crate::Error;

/// Builds every part from one tensor source, in `state_dict` order (fuser, decoder, head).
fn build(cfg: &BevConfig, src: &mut dyn TensorSource) -> Result<(Option<BevFuser>, BevDecoder, BevSegHead), ModelError> {
    let fuser = cfg.fuser.as_ref().map(|f| BevFuser::build(f, src)).transpose()?;
    let decoder = BevDecoder::build(&cfg.decoder, src)?;
    let head = BevSegHead::build(&cfg.head, src)?;
    Ok((fuser, decoder, head))
}

/// Every tensor of the fuser, decoder and map head (`fuser.*`, `decoder.*`, `heads.map.*`), in
/// `state_dict` order; BatchNorm's `num_batches_tracked` excepted (the loader drops it).
pub fn weight_specs(cfg: &BevConfig) -> Result<Vec<WeightSpec>, ModelError> {
    let mut rec = SpecRecorder::default();
    build(cfg, &mut rec)?;
    Ok(rec.0)
}

/// Fuser, decoder and head with BatchNorm folded.
#[derive(Debug, Clone)]
pub struct BevStack {
    pub config: BevConfig,
    pub fuser: Option<BevFuser>,
    pub decoder: BevDecoder,
    pub head: BevSegHead,
}

/// What the stack computes, stage by stage (for parity and tests).
#[derive(Debug, Clone)]
pub struct BevStages {
    /// The fuser's output (None without a fuser).
    pub fused: Option<FeatureMap>,
    pub decoded: FeatureMap,
    pub maps: BevMaps,
}

impl BevStack {
    /// Takes this stack's tensors out of `weights` (the rest of a whole-model file stays).
    /// Callers check the whole file first ([`Weights::check`] with every part's specs).
    pub fn load(cfg: &BevConfig, weights: &mut Weights) -> Result<Self, ModelError> {
        let (fuser, decoder, head) = build(cfg, weights)?;
        Ok(Self { config: cfg.clone(), fuser, decoder, head })
    }

    /// Builds the stack from a file holding exactly its tensors: one error lists every missing,
    /// unexpected and mis-shaped tensor.
    pub fn from_weights(cfg: &BevConfig, mut weights: Weights) -> Result<Self, ModelError> {
        weights.check(&weight_specs(cfg)?)?;
        Self::load(cfg, &mut weights)
    }

    /// Sensors' BEV maps (camera first; one map for a model without a fuser) → probabilities.
    pub fn forward(&self, inputs: &[&FeatureMap]) -> Result<BevStages, Error> {
        let fused = match &self.fuser {
            Some(f) => Some(f.forward(inputs)?),
            None if inputs.len() == 1 => None,
            None => return Err(Error::InvalidInput(format!("BEV decoder: {} input maps for a model without a fuser (1)", inputs.len()))),
        };
        let x = fused.as_ref().unwrap_or(inputs[0]);
        let decoded = self.decoder.forward(x)?;
        let maps = self.head.forward(&decoded)?;
        Ok(BevStages { fused, decoded, maps })
    }
}

/// How one tensor is drawn (uniform in the returned range): conv weights fan-in scaled to unit
/// output variance (uniform ±sqrt(3 / fan_in); a deconv's fan-in is its input channels, since
/// kernel = stride gives each output one tap), BatchNorm statistics and affine parameters
/// deliberately not the identity (a wrong fold or eps shows), biases ±0.1.
fn rule(spec: &WeightSpec, deconvs: &[String]) -> (f64, f64) {
    let (name, s) = (spec.name.as_str(), &spec.shape);
    if name.ends_with("running_mean") {
        return (-0.1, 0.1);
    }
    if name.ends_with("running_var") {
        return (0.5, 1.5);
    }
    let unit = |fan_in: usize| {
        let b = (3.0 / fan_in.max(1) as f64).sqrt();
        (-b, b)
    };
    match s.len() {
        4 if deconvs.iter().any(|d| d == name) => unit(s[0]),
        4 => unit(s[1] * s[2] * s[3]),
        _ if name.ends_with(".weight") => (0.9, 1.1),
        _ => (-0.1, 0.1),
    }
}

/// Owned tensors `(name, shape, values)`.
pub type NamedTensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Deterministic random tensors for every weight of `cfg`, in `state_dict` order (splitmix64
/// seeded once, drawn in order).
pub fn random_tensors(cfg: &BevConfig, seed: u64) -> Result<NamedTensors, ModelError> {
    let deconvs: Vec<String> = match &cfg.decoder {
        DecoderConfig::Second { neck, .. } => neck
            .branches
            .iter()
            .enumerate()
            .filter(|(_, b)| matches!(b, FpnBranch::Deconv(_)))
            .map(|(i, _)| format!("{}.neck.deblocks.{i}.0.weight", crate::models::bevfusion::decoder::DECODER_PREFIX))
            .collect(),
        DecoderConfig::ResNet { .. } => vec![],
    };
    let mut rng = SplitMix(seed);
    Ok(weight_specs(cfg)?
        .into_iter()
        .map(|s| {
            let (lo, hi) = rule(&s, &deconvs);
            let data = (0..s.numel()).map(|_| rng.uniform(lo, hi)).collect();
            (s.name, s.shape, data)
        })
        .collect())
}

/// [`random_tensors`] as a [`Weights`] store.
pub fn random_weights(cfg: &BevConfig, seed: u64) -> Result<Weights, ModelError> {
    Weights::from_tensors(&format!("random BEV decoder weights (seed {seed})"), random_tensors(cfg, seed)?)
}

/// Multiply-add FLOPs (×2) of a conv producing `pixels` output pixels.
fn conv_flops(c: &Conv2d, pixels: usize) -> f64 {
    2.0 * pixels as f64 * (c.cout * c.cin * c.kh * c.kw) as f64
}

/// GFLOP of the fuser, the decoder and the head for a `bev × bev` input (convs and the deconv;
/// element-wise steps left out).
pub fn part_gflop(stack: &BevStack, bev: usize) -> [f64; 3] {
    let fuser = stack.fuser.as_ref().map_or(0.0, |f| conv_flops(&f.conv, bev * bev));
    let mut dec = 0.0;
    let mut side = bev;
    match &stack.decoder {
        BevDecoder::Second(d) => {
            let mut sides = Vec::new();
            for (convs, &s) in d.stages.iter().zip(&d.backbone.layer_strides) {
                side = side.div_ceil(s);
                dec += convs.iter().map(|c| conv_flops(c, side * side)).sum::<f64>();
                sides.push(side);
            }
            for (b, &s) in d.deblocks.iter().zip(&sides) {
                dec += match b {
                    FpnUp::Conv(c) => conv_flops(c, (s / c.stride[0]).pow(2)),
                    FpnUp::Deconv(t) => 2.0 * (s * s) as f64 * (t.cin * t.cout * t.kh * t.kw) as f64,
                };
            }
        }
        BevDecoder::ResNet(d) => {
            let mut sides = Vec::new();
            for (blocks, b) in d.layers.iter().zip(&d.backbone.blocks) {
                side = side.div_ceil(b[2]);
                for blk in blocks {
                    dec += conv_flops(&blk.conv1, side * side) + conv_flops(&blk.conv2, side * side);
                    dec += blk.downsample.as_ref().map_or(0.0, |c| conv_flops(c, side * side));
                }
                sides.push(side);
            }
            let s2 = sides[d.neck.in_indices[1]];
            dec += conv_flops(&d.fuse[0], s2 * s2) + conv_flops(&d.fuse[1], s2 * s2);
            let up = s2 * d.neck.scale_factor;
            dec += d.upsample.as_ref().map_or(0.0, |c| conv_flops(c, up * up));
        }
    }
    let out = stack.head.out_x * stack.head.out_y;
    let head = conv_flops(&stack.head.convs[0], out) + conv_flops(&stack.head.convs[1], out) + conv_flops(&stack.head.logits, out);
    [fuser / 1e9, dec / 1e9, head / 1e9]
}
