//! A weights file (`--weights`): the safetensors header and tensors, then the checked loading
//! against the nuScenes SphereFormer's expected tensors (names, shapes, dtype conversion).
use sptr::models::sphereformer::config::ModelConfig;
use sptr::nn::weights::{WeightSpec, Weights};
use std::sync::OnceLock;

const MODEL: &str = include_str!("../../config/models/sphereformer_nuscenes.yaml");

static SPECS: OnceLock<Vec<WeightSpec>> = OnceLock::new();

/// The expected tensors, built on the first call and kept. Building them takes longer than one
/// input may, so the fuzz target calls this once before fuzzing (libFuzzer's `init`).
pub fn init() -> &'static [WeightSpec] {
    SPECS.get_or_init(|| {
        let cfg = ModelConfig::parse(MODEL, "sphereformer_nuscenes.yaml").expect("the committed model YAML parses");
        sptr::models::sphereformer::network::weight_specs(&cfg).expect("the committed model has weight specs")
    })
}

/// One input: returns when the decoder refuses it, panics when a check fails.
pub fn check(data: &[u8]) {
    let specs = init();
    if let Ok(weights) = Weights::from_bytes(data, "fuzz.safetensors") {
        let _ = weights.check(specs);
    }
}
