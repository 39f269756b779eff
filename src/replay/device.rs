//! Which backend replay runs on. Replay runs frames through the node's own frame processor
//! ([`crate::frame::processor::Processor`]); this module opens it, in one function,
//! [`open_processor`], on the device `--device` resolves to ([`crate::device::resolve`]: `cpu`,
//! `cuda`, or `auto`: CUDA when it can be had, else the CPU, the report naming why). When the
//! SphereFormer network gains its CUDA backend inside the processor, replay uses it with no
//! change here.

use std::path::{Path, PathBuf};

use crate::ops::label_grid::cpu::BevGridParams;
use crate::device::{resolve, Device, DeviceChoice};
use crate::models::sphereformer::config::ModelYaml;
use crate::models::sphereformer::random::random_weights;
use crate::nn::weights::Weights;
use crate::frame::processor::Processor;

use super::ReplayError;

/// Where the weights come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightsSource {
    /// A safetensors file with the upstream `state_dict` names.
    File(PathBuf),
    /// Deterministic random weights ([`crate::nn::random`]) for smoke runs and tests: the
    /// labels mean nothing, the timings are real.
    Random(u64),
}

impl WeightsSource {
    /// How the report names the weights.
    pub fn describe(&self) -> String {
        match self {
            WeightsSource::File(p) => p.display().to_string(),
            WeightsSource::Random(seed) => {
                format!("random (seed {seed}; untrained, metrics are meaningless)")
            }
        }
    }

    fn load(
        &self,
        model: &ModelYaml,
        device: Device,
        bev: &BevGridParams,
        model_path: &Path,
    ) -> Result<Processor, String> {
        match self {
            WeightsSource::File(p) => Processor::open(device, model, p, bev.clone()),
            WeightsSource::Random(seed) => {
                let w: Weights = random_weights(model, *seed)
                    .map_err(|e| format!("random weights for {}: {e}", model_path.display()))?;
                Processor::with_weights(device, model, w, bev.clone())
            }
        }
    }
}

/// The frame processor opened on the device `choice` resolves to (see the module doc), that
/// device, and its name for the report (`cpu (auto: <why>)` when `auto` fell back to the CPU).
pub fn open_processor(
    choice: DeviceChoice,
    model: &ModelYaml,
    model_path: &Path,
    weights: &WeightsSource,
    bev: &BevGridParams,
) -> Result<(Processor, Device, String), ReplayError> {
    let setup = |e: String| {
        let hint = match choice {
            DeviceChoice::Cuda => " (for sptr replay: pass --device cpu, or --device auto to fall back to the CPU)",
            DeviceChoice::Auto | DeviceChoice::Cpu => "",
        };
        ReplayError::Setup(format!("--device {choice}: {e}{hint}"))
    };
    let resolved = resolve(choice).map_err(|e| setup(e.to_string()))?;
    let p = weights.load(model, resolved.device, bev, model_path).map_err(setup)?;
    let name = match resolved.fallback {
        Some(_) => resolved.describe(),
        None => p.device_name().to_string(),
    };
    Ok((p, resolved.device, name))
}
