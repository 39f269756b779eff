//! Deterministic random weights for a SphereFormer config (tests, benchmarks, and runs without a
//! checkpoint): every tensor of [`weight_specs`], drawn by [`tensors_for_specs`].

use crate::models::sphereformer::config::ModelYaml;
use crate::models::sphereformer::network::weight_specs;
use crate::nn::random::{tensors_for_specs, NamedTensors};
use crate::nn::weights::Weights;
use crate::nn::ModelError;

/// Random tensors `(name, shape, values)` for every weight of `cfg`, in `state_dict` order.
pub fn random_tensors(cfg: &ModelYaml, seed: u64) -> Result<NamedTensors, ModelError> {
    Ok(tensors_for_specs(&weight_specs(cfg)?, seed))
}

/// [`random_tensors`] as a [`Weights`] store.
pub fn random_weights(cfg: &ModelYaml, seed: u64) -> Result<Weights, ModelError> {
    Weights::from_tensors(&format!("random weights (seed {seed})"), random_tensors(cfg, seed)?)
}
