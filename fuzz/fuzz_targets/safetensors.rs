//! A weights file (`--weights`): the safetensors header and tensors, then the checked loading
//! against the nuScenes SphereFormer's expected tensors (names, shapes, dtype conversion).
#![no_main]
use libfuzzer_sys::fuzz_target;
use sptr::models::sphereformer::config::ModelConfig;
use sptr::nn::weights::{WeightSpec, Weights};
use std::sync::OnceLock;

const MODEL: &str = include_str!("../../config/models/sphereformer_nuscenes.yaml");

static SPECS: OnceLock<Vec<WeightSpec>> = OnceLock::new();

fuzz_target!(
    init: {
        // The expected tensors, built once before fuzzing (building them takes longer than one
        // input may).
        let cfg = ModelConfig::parse(MODEL, "sphereformer_nuscenes.yaml").expect("the committed model YAML parses");
        let specs = sptr::models::sphereformer::network::weight_specs(&cfg).expect("the committed model has weight specs");
        let _ = SPECS.set(specs);
    },
    |data: &[u8]| {
        let Some(specs) = SPECS.get() else {
            return;
        };
        if let Ok(weights) = Weights::from_bytes(data, "fuzz.safetensors") {
            let _ = weights.check(specs);
        }
    }
);
