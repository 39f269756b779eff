//! BEVFusion's camera encoder (mit-han-lab/bevfusion at db75150, `model.encoders.camera`): mmdet
//! 2.20's `SwinTransformer` backbone ([`crate::models::bevfusion::camera::swin`]) and the `GeneralizedLSSFPN` neck
//! ([`crate::models::bevfusion::camera::fpn`]), configured from the model YAML's `model.encoders.camera.backbone` and `.neck`
//! sections and loaded from safetensors with the upstream `state_dict` names
//! (`encoders.camera.backbone.*`, `encoders.camera.neck.*`; a `module.` prefix is stripped by the
//! weights reader).
//!
//! Images go in normalized and channels-last (NHWC, as the camera preprocessing writes them;
//! upstream's NCHW tensor transposed); features come out channels-last too:
//! the backbone's outputs at `out_indices` (stride 8, 16, 32 for BEVFusion: 192, 384, 768
//! channels) and the neck's outputs (stride 8 and 16, 256 channels). The stride-8 neck output
//! (256 × 32 × 88 at 256 × 704) is what the view transform consumes.

use crate::models::bevfusion::camera::fpn::GeneralizedLssFpn;
use crate::models::bevfusion::camera::swin::SwinTransformer;
use crate::ops::dense::FeatureMap;
use crate::nn::random::SplitMix;
use crate::nn::weights::{SpecRecorder, Tensor, WeightSpec, Weights};
use crate::nn::{Misshaped, ModelError};
use crate::Error;

pub use crate::models::bevfusion::camera::config::{BACKBONE_PREFIX, CameraEncoderConfig, FpnConfig, FpnYaml, LayerCfg, NECK_PREFIX, SwinConfig, SwinYaml, UpsampleCfg};

/// Floating-point operations of one forward (a multiply-add counts 2), as upstream executes it:
/// GEMMs, convolutions and the two attention matmuls (q·kᵀ and p·v over full M × M windows of the
/// padded grid, qkv and proj on padded tokens too); norms, softmax and element-wise steps left out
/// (they are memory-bound).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EncoderFlops {
    pub backbone: f64,
    pub neck: f64,
}

impl CameraEncoderConfig {
    /// [`EncoderFlops`] for `n` images of `h × w`.
    pub fn flops(&self, n: usize, h: usize, w: usize) -> EncoderFlops {
        let b = &self.backbone;
        let sizes = b.stage_sizes(h, w);
        let m = b.window;
        let mut f = 2.0 * (n * sizes[0][0] * sizes[0][1]) as f64 * (b.in_channels * b.patch_size * b.patch_size * b.embed_dims) as f64;
        for (i, &[hh, ww]) in sizes.iter().enumerate() {
            let c = b.channels(i) as f64;
            let tokens = (n * hh * ww) as f64;
            let padded = (n * hh.next_multiple_of(m) * ww.next_multiple_of(m)) as f64;
            let per_block = 2.0 * padded * c * 3.0 * c // qkv
                + 2.0 * 2.0 * padded * (m * m) as f64 * c // q·kᵀ and p·v
                + 2.0 * padded * c * c // proj
                + 2.0 * 2.0 * tokens * c * (b.mlp_ratio as f64 * c); // fc1, fc2
            f += b.depths[i] as f64 * per_block;
            if i + 1 < sizes.len() {
                let [h2, w2] = sizes[i + 1];
                f += 2.0 * (n * h2 * w2) as f64 * 4.0 * c * 2.0 * c; // patch merging reduction
            }
        }
        let nk = &self.neck;
        let mut g = 0.0;
        for k in 0..nk.outputs() {
            let [hh, ww] = sizes[b.out_indices[k]];
            let pixels = (n * hh * ww) as f64;
            let out = nk.out_channels as f64;
            g += 2.0 * pixels * nk.lateral_in(k) as f64 * out + 2.0 * pixels * 9.0 * out * out;
        }
        EncoderFlops { backbone: f, neck: g }
    }
}

// ---------------------------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------------------------

/// Every tensor of the encoder's `state_dict` (the backbone's, then the neck's) for this
/// configuration, in `state_dict` order; buffers excepted (`relative_position_index`, which a
/// file may carry — then it is checked — and BatchNorm's `num_batches_tracked`, dropped).
pub fn weight_specs(cfg: &CameraEncoderConfig) -> Result<Vec<WeightSpec>, ModelError> {
    let mut rec = SpecRecorder::default();
    SwinTransformer::load(&mut rec, BACKBONE_PREFIX, &cfg.backbone)?;
    GeneralizedLssFpn::load(&mut rec, NECK_PREFIX, &cfg.neck)?;
    Ok(rec.0)
}

/// The buffers a checkpoint may carry beside the weights: each block's
/// `attn.w_msa.relative_position_index` with its values.
pub fn buffer_specs(cfg: &CameraEncoderConfig) -> Vec<(WeightSpec, Vec<f32>)> {
    let m = cfg.backbone.window;
    let index = crate::models::bevfusion::camera::swin::relative_position_index(m);
    let mut out = Vec::new();
    for (i, &d) in cfg.backbone.depths.iter().enumerate() {
        for j in 0..d {
            let name = format!("{BACKBONE_PREFIX}.stages.{i}.blocks.{j}.attn.w_msa.relative_position_index");
            out.push((WeightSpec { name, shape: vec![m * m, m * m] }, index.clone()));
        }
    }
    out
}

/// Removes the buffers of [`buffer_specs`] from `weights` and checks the ones present: shape
/// (listed as mis-shaped) and values (an index for another window is a config mismatch).
fn take_buffers(cfg: &CameraEncoderConfig, weights: &mut Weights) -> Result<Vec<Misshaped>, ModelError> {
    let mut misshaped = Vec::new();
    for (spec, want) in buffer_specs(cfg) {
        let Some(Tensor { shape, data }) = weights.remove(&spec.name) else { continue };
        if shape != spec.shape {
            misshaped.push(Misshaped { name: spec.name, expected: spec.shape, found: shape });
        } else if data != want {
            return Err(ModelError::Config(format!(
                "{}: `{}` is not the index of a {} x {} window; the file was made for another window_size",
                weights.source(),
                spec.name,
                cfg.backbone.window,
                cfg.backbone.window
            )));
        }
    }
    Ok(misshaped)
}

/// The backbone and neck with BatchNorm folded, ready to run.
#[derive(Debug, Clone)]
pub struct CameraEncoder {
    pub config: CameraEncoderConfig,
    pub backbone: SwinTransformer,
    pub neck: GeneralizedLssFpn,
}

/// What the encoder produces for a batch of images (all NHWC, batch = images).
#[derive(Debug, Clone)]
pub struct EncoderOutput {
    /// The backbone's outputs, one per `out_indices` entry (after their `norm{i}`).
    pub stages: Vec<FeatureMap>,
    /// The neck's outputs, finest first; `neck[0]` feeds the view transform.
    pub neck: Vec<FeatureMap>,
}

impl CameraEncoder {
    /// Builds the encoder from weights: every tensor is checked first (one error lists all
    /// missing, unexpected and mis-shaped ones), then BatchNorm is folded.
    pub fn from_weights(config: &CameraEncoderConfig, mut weights: Weights) -> Result<Self, ModelError> {
        let mut misshaped = take_buffers(config, &mut weights)?;
        match weights.check(&weight_specs(config)?) {
            Ok(()) if misshaped.is_empty() => {}
            Ok(()) => return Err(ModelError::Mismatch { file: weights.source().to_string(), missing: vec![], unexpected: vec![], misshaped }),
            Err(ModelError::Mismatch { file, missing, unexpected, misshaped: mut m }) => {
                m.append(&mut misshaped);
                return Err(ModelError::Mismatch { file, missing, unexpected, misshaped: m });
            }
            Err(e) => return Err(e),
        }
        let backbone = SwinTransformer::load(&mut weights, BACKBONE_PREFIX, &config.backbone)?;
        let neck = GeneralizedLssFpn::load(&mut weights, NECK_PREFIX, &config.neck)?;
        Ok(Self { config: config.clone(), backbone, neck })
    }

    /// The encoder on normalized images `[n, h, w, in_channels]` (NHWC).
    pub fn forward_cpu(&self, images: &[f32], n: usize, h: usize, w: usize) -> Result<EncoderOutput, Error> {
        let stages = self.backbone.forward(images, n, h, w)?;
        let neck = self.neck.forward(&stages)?;
        Ok(EncoderOutput { stages, neck })
    }
}

// ---------------------------------------------------------------------------------------------
// Random weights (tests, benchmarks, parity)
// ---------------------------------------------------------------------------------------------

/// How one tensor is drawn (uniform in the returned range). Weights are fan-in scaled to unit
/// output variance (uniform ±sqrt(3 / fan_in)) so activations stay near unit scale through the
/// twelve blocks; the relative position bias is ±1 (a trained table's spread, far above the
/// 0.02 of upstream's init) so that a wrong bias index shows; norms and BatchNorm statistics
/// are deliberately not the identity, so a wrong fold or a skipped norm shows too.
fn rule(spec: &WeightSpec) -> (f64, f64) {
    let name = spec.name.as_str();
    let s = &spec.shape;
    if name.ends_with("relative_position_bias_table") {
        return (-1.0, 1.0);
    }
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
        4 => unit(s[1] * s[2] * s[3]),
        2 => unit(s[1]),
        // rank 1: a norm's weight (Linear and conv biases are `.bias`), or any bias
        _ if name.ends_with(".weight") => (0.9, 1.1),
        _ => (-0.1, 0.1),
    }
}

/// Owned tensors `(name, shape, values)`.
pub type NamedTensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Deterministic random tensors for every weight of `cfg`, in `state_dict` order (splitmix64
/// seeded once, drawn in order: the same (config, seed) always gives the same values).
pub fn random_tensors(cfg: &CameraEncoderConfig, seed: u64) -> Result<NamedTensors, ModelError> {
    let mut rng = SplitMix(seed);
    Ok(weight_specs(cfg)?
        .into_iter()
        .map(|s| {
            let (lo, hi) = rule(&s);
            let data = (0..s.numel()).map(|_| rng.uniform(lo, hi)).collect();
            (s.name, s.shape, data)
        })
        .collect())
}

/// [`random_tensors`] as a [`Weights`] store.
pub fn random_weights(cfg: &CameraEncoderConfig, seed: u64) -> Result<Weights, ModelError> {
    Weights::from_tensors(&format!("random camera encoder weights (seed {seed})"), random_tensors(cfg, seed)?)
}
