//! The BEV half of a BEVFusion seg model as one unit: fuser (if any), decoder, map head — their
//! `state_dict` specs, checked loading, deterministic random weights and the CPU forward.

use super::bev_config::{BevConfig, FpnBranch, DecoderConfig};
use super::bev_decoder::BevDecoder;
use super::bev_head::{BevMaps, BevSegHead};
use super::fuser::BevFuser;
use super::random::SplitMix;
use super::weights::{SpecRecorder, TensorSource, WeightSpec, Weights};
use super::ModelError;
use crate::dense::FeatureMap;
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
            .map(|(i, _)| format!("{}.neck.deblocks.{i}.0.weight", super::bev_decoder::DECODER_PREFIX))
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
