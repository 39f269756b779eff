//! SphereFormer weights that overflow FP16, drawn at test time (shared by tests/fp16_range/gpu.rs,
//! tests/fp16_range/camera_encoder_gpu.rs and tests/sphereformer/precision_gpu.rs; declared with
//! `#[path]` by those targets' main.rs).
#![allow(dead_code)]

use crate::common::Rng;
use sptr::models::sphereformer::config::ModelYaml;
use sptr::nn::random::NamedTensors;
use sptr::models::sphereformer::network::weight_specs;

/// A normal draw (Box-Muller) from the shared test generator.
pub fn normal(rng: &mut Rng, std: f64) -> f32 {
    let u1 = rng.unit().max(1e-300);
    let u2 = rng.unit();
    ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * std) as f32
}

/// Weights that leave FP16's range: conv and linear weights N(0, 0.05), BN and LN weights
/// U(0.5, 1.5), biases and running means N(0, 0.1), running variances U(0.5, 2); the RPE
/// tables N(0, 0.02) (upstream's initialisation scale). Upstream's
/// FP32 model reaches activations of 1.3e6 with them: past FP16's 65,504, far inside BF16's range.
pub fn overflowing_weights(cfg: &ModelYaml, seed: u64) -> NamedTensors {
    let mut rng = Rng(seed);
    weight_specs(cfg)
        .unwrap()
        .into_iter()
        .map(|s| {
            let name = s.name.as_str();
            let n = s.numel();
            let data: Vec<f32> = if name.ends_with("running_mean") {
                (0..n).map(|_| normal(&mut rng, 0.1)).collect()
            } else if name.ends_with("running_var") {
                (0..n).map(|_| rng.uniform(0.5, 2.0)).collect()
            } else {
                match s.shape.len() {
                    5 | 2 => (0..n).map(|_| normal(&mut rng, 0.05)).collect(),
                    4 => (0..n).map(|_| normal(&mut rng, 0.02)).collect(),
                    _ if name.ends_with(".weight") => (0..n).map(|_| rng.uniform(0.5, 1.5)).collect(),
                    _ => (0..n).map(|_| normal(&mut rng, 0.1)).collect(),
                }
            };
            (s.name, s.shape, data)
        })
        .collect()
}
