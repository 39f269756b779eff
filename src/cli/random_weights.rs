//! `sptr random-weights`: deterministic random (untrained) weights for a model YAML, as
//! safetensors.

use std::path::PathBuf;

use anyhow::{Context, Result};

use super::inputs::load_model;

#[derive(clap::Args)]
pub struct RandomWeightsArgs {
    /// Model YAML (`config/models/sphereformer_*.yaml`, `bevfusion_seg_*.yaml`) the weights are for.
    #[arg(long)]
    model: PathBuf,
    /// Seed of the generator (any 64-bit number).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The safetensors file to write (replaced if it exists).
    #[arg(long)]
    out: PathBuf,
}

pub fn command(a: RandomWeightsArgs) -> Result<()> {
    use crate::models::bevfusion::seg;
    let (model, seed, out) = (&a.model, a.seed, &a.out);
    let tensors = if seg::is_bevfusion_seg_yaml(model) {
        let cfg = seg::BevSegConfig::load(model)?;
        seg::random_tensors(&cfg, seed).context("making random BEVFusion seg weights")?
    } else {
        let cfg = load_model(model)?.yaml;
        crate::models::sphereformer::random::random_tensors(&cfg, seed).context("making random weights")?
    };
    crate::nn::random::save_tensors(out, &tensors).map_err(|e| anyhow::anyhow!("{e}"))?;
    let params: usize = tensors.iter().map(|(_, _, v)| v.len()).sum();
    println!(
        "wrote {} ({} tensors, {params} parameters, F32) for {}, seed {seed}: untrained, for trying the tools (meaningless labels)",
        out.display(),
        tensors.len(),
        model.display()
    );
    Ok(())
}
