//! Which backend replay runs on. Replay runs frames through the node's own frame processor
//! ([`crate::frame::processor::Processor`]), which owns the device choice; this module only maps
//! `--device` onto it, in one function, [`open_processor`]: `cpu` and `cuda` are passed on,
//! `auto` tries CUDA and falls back to the CPU. When the SphereFormer network gains its CUDA
//! backend inside the processor, replay uses it with no change here.

use std::path::{Path, PathBuf};

use crate::ops::label_grid::cpu::BevGridParams;
use crate::device::DeviceKind;
use crate::models::sphereformer::config::ModelYaml;
use crate::models::sphereformer::random::random_weights;
use crate::nn::weights::Weights;
use crate::frame::processor::Processor;

use super::ReplayError;

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// CUDA when this build and machine can run the whole pipeline there, else the CPU.
    Auto,
    Cpu,
    Cuda,
}

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
        kind: DeviceKind,
        bev: &BevGridParams,
        model_path: &Path,
    ) -> Result<Processor, String> {
        match self {
            WeightsSource::File(p) => Processor::open(kind, model, p, bev.clone()),
            WeightsSource::Random(seed) => {
                let w: Weights = random_weights(model, *seed)
                    .map_err(|e| format!("random weights for {}: {e}", model_path.display()))?;
                Processor::with_weights(kind, model, w, bev.clone())
            }
        }
    }
}

/// Opens the frame processor on `device` (see the module doc). Returns it and the device's
/// name for the report.
pub fn open_processor(
    device: Device,
    model: &ModelYaml,
    model_path: &Path,
    weights: &WeightsSource,
    bev: &BevGridParams,
) -> Result<(Processor, String), ReplayError> {
    let setup = |flag: &str, e: String| ReplayError::Setup(format!("--device {flag}: {e}"));
    match device {
        Device::Cpu => {
            let p = weights
                .load(model, DeviceKind::Cpu, bev, model_path)
                .map_err(|e| setup("cpu", e))?;
            let name = p.device_name().to_string();
            Ok((p, name))
        }
        Device::Cuda => {
            let p = weights
                .load(model, DeviceKind::Cuda, bev, model_path)
                .map_err(|e| setup("cuda", format!("{e} (for sptr replay: pass --device cpu, or --device auto to fall back to the CPU)")))?;
            let name = p.device_name().to_string();
            Ok((p, name))
        }
        Device::Auto => match weights.load(model, DeviceKind::Cuda, bev, model_path) {
            Ok(p) => {
                let name = p.device_name().to_string();
                Ok((p, name))
            }
            Err(_) => {
                let p = weights
                    .load(model, DeviceKind::Cpu, bev, model_path)
                    .map_err(|e| setup("auto", e))?;
                Ok((
                    p,
                    "cpu (auto: the CUDA pipeline is not available on this build or machine)"
                        .to_string(),
                ))
            }
        },
    }
}
