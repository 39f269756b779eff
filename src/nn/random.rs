//! Deterministic random weights for a model config, and a safetensors writer, so tests and the
//! GPU parity harness run on the same weights without committing weight files.
//!
//! Values come from a splitmix64 stream seeded once and drawn in `state_dict` order, so the same
//! (config, seed) always gives the same bytes. Rules, by tensor kind:
//!
//! | tensor | values |
//! | --- | --- |
//! | spconv weight `[Cout, k, k, k, Cin]` | uniform ±sqrt(3 / (k³·Cin)) (unit output variance) |
//! | Linear weight `[out, in]` | uniform ±1/sqrt(in) (PyTorch's default bound) |
//! | Linear bias | uniform ±1/sqrt(in) |
//! | RPE table `[rows, 3, heads, dim]` | uniform with std 0.02 (±0.02·√3), upstream's init scale |
//! | BatchNorm / LayerNorm weight | 1 + uniform ±0.1 |
//! | BatchNorm / LayerNorm bias | uniform ±0.1 |
//! | `running_mean` | uniform ±0.1 |
//! | `running_var` | uniform [0.5, 1.5] |
//!
//! BatchNorm statistics are deliberately not the identity (mean 0, var 1), so a wrong fold or a
//! skipped BN shows up in the outputs.

use crate::nn::weights::WeightSpec;
use crate::nn::ModelError;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::Path;

/// splitmix64: tiny, seedable, and the same on every platform.
#[derive(Debug, Clone)]
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f32 {
        (lo + (hi - lo) * self.unit()) as f32
    }
}

/// How one tensor is drawn.
fn rule(spec: &WeightSpec, shapes: &HashMap<&str, &[usize]>) -> (f64, f64) {
    let name = spec.name.as_str();
    let s = &spec.shape;
    if name.ends_with("running_mean") {
        return (-0.1, 0.1);
    }
    if name.ends_with("running_var") {
        return (0.5, 1.5);
    }
    match s.len() {
        5 => {
            let fan_in = (s[1] * s[2] * s[3] * s[4]).max(1) as f64;
            let b = (3.0 / fan_in).sqrt();
            (-b, b)
        }
        4 => {
            let b = 0.02 * 3f64.sqrt();
            (-b, b)
        }
        2 => {
            let b = 1.0 / (s[1].max(1) as f64).sqrt();
            (-b, b)
        }
        _ => {
            // Rank 1: a Linear's bias (its weight is rank 2) or a norm's weight / bias.
            let owner = name.strip_suffix(".bias").map(|p| format!("{p}.weight"));
            let linear_fan_in = owner.and_then(|w| shapes.get(w.as_str()).filter(|ws| ws.len() == 2).map(|ws| ws[1]));
            match linear_fan_in {
                Some(fi) => {
                    let b = 1.0 / (fi.max(1) as f64).sqrt();
                    (-b, b)
                }
                None if name.ends_with(".weight") => (0.9, 1.1),
                None => (-0.1, 0.1),
            }
        }
    }
}

/// Owned tensors `(name, shape, values)`.
pub type NamedTensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Random tensors `(name, shape, values)` for every spec, in order: each drawn by the rule of
/// its name (see [`rule`]), from one stream seeded with `seed`.
pub fn tensors_for_specs(specs: &[WeightSpec], seed: u64) -> NamedTensors {
    let shapes: HashMap<&str, &[usize]> = specs.iter().map(|s| (s.name.as_str(), s.shape.as_slice())).collect();
    let mut rng = SplitMix(seed);
    specs
        .iter()
        .map(|s| {
            let (lo, hi) = rule(s, &shapes);
            let data = (0..s.numel()).map(|_| rng.uniform(lo, hi)).collect();
            (s.name.clone(), s.shape.clone(), data)
        })
        .collect()
}

/// safetensors bytes (F32, little endian) of `(name, shape, values)` tensors.
pub fn safetensors_bytes(tensors: &[(&str, &[usize], &[f32])]) -> Result<Vec<u8>, ModelError> {
    let err = |reason: String| ModelError::File { file: "<safetensors writer>".into(), reason };
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let mut views = Vec::with_capacity(tensors.len());
    for ((name, shape, _), b) in tensors.iter().zip(&bytes) {
        let view = TensorView::new(Dtype::F32, shape.to_vec(), b)
            .map_err(|e| err(format!("tensor `{name}` {shape:?}: {e}")))?;
        views.push((name.to_string(), view));
    }
    safetensors::serialize(views, None).map_err(|e| err(e.to_string()))
}

/// Writes `(name, shape, values)` tensors to a safetensors file (F32).
pub fn save_safetensors(path: &Path, tensors: &[(&str, &[usize], &[f32])]) -> Result<(), ModelError> {
    let bytes = safetensors_bytes(tensors)?;
    std::fs::write(path, bytes).map_err(|e| ModelError::File { file: path.display().to_string(), reason: format!("cannot write: {e}") })
}

/// Writes owned tensors (e.g. [`random_tensors`]' output).
pub fn save_tensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<(), ModelError> {
    let refs: Vec<(&str, &[usize], &[f32])> = tensors.iter().map(|(n, s, v)| (n.as_str(), s.as_slice(), v.as_slice())).collect();
    save_safetensors(path, &refs)
}
