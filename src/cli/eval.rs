//! `sptr eval`: reports over replays' outputs (shards merged, two replays compared).

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::args::fraction_arg;
use super::replay::print_outcome;

#[derive(clap::Subcommand)]
pub enum EvalCmd {
    /// Merge the output directories of `sptr replay --shard i/n` runs into the report a single
    /// run gives.
    Merge {
        /// One `sptr replay --out` directory per shard.
        #[arg(required = true)]
        shard_dirs: Vec<PathBuf>,
        /// Output directory of the merged report (report.json, report.md, plots, eval_state.json).
        #[arg(long)]
        out: PathBuf,
    },
    /// Fraction of points two replays (e.g. --device cpu and --device cuda) gave the same
    /// class, per frame and overall, from their output bags; with BEV maps in both, the fraction
    /// of map cells × classes with the same thresholded value and the largest probability gap.
    Agreement {
        /// The first `sptr replay --out` directory (or its `bag/`).
        a: PathBuf,
        /// The second `sptr replay --out` directory (or its `bag/`), a replay of the same bag.
        b: PathBuf,
        /// Exit with status 1 when the overall agreement is below this fraction (e.g. 0.995).
        #[arg(long, value_parser = fraction_arg)]
        min: Option<f64>,
        /// Exit with status 1 when the BEV maps' cell agreement is below this fraction (e.g.
        /// 0.999), or when the replays wrote no maps.
        #[arg(long, value_parser = fraction_arg)]
        min_map: Option<f64>,
    },
}

pub fn command(what: EvalCmd) -> Result<()> {
    match what {
        EvalCmd::Merge { shard_dirs, out } => {
            let report = crate::replay::merge_shards(&shard_dirs, &out).map_err(|e| anyhow::anyhow!("{e}"))?;
            print_outcome(&report, &out);
            Ok(())
        }
        EvalCmd::Agreement { a, b, min, min_map } => agreement(&a, &b, min, min_map),
    }
}

/// `sptr eval agreement`.
fn agreement(a: &Path, b: &Path, min: Option<f64>, min_map: Option<f64>) -> Result<()> {
    let ag = crate::replay::agreement::agreement(a, b).map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, f) in ag.frames.iter().enumerate() {
        println!("frame {i:>6}  {} ns  {:>9} points  {:8.4} % agree", f.timestamp_ns, f.points, 100.0 * f.same as f64 / f.points.max(1) as f64);
    }
    let frac = ag.fraction().unwrap_or(1.0);
    println!("total: {} of {} points agree ({:.4} %) over {} frames", ag.same, ag.points, 100.0 * frac, ag.frames.len());
    if let Some(map) = &ag.map {
        let f = map.fraction().unwrap_or(1.0);
        println!(
            "BEV map: {} of {} cells x classes agree ({:.4} %) over {} frames, {} classes; largest probability gap {} %",
            map.same_bits, map.cell_bits, 100.0 * f, map.frames, map.classes, map.max_probability_diff
        );
    }
    if let Some(m) = min {
        if frac < m {
            anyhow::bail!("agreement {:.4} % is below --min {:.4} %", 100.0 * frac, 100.0 * m);
        }
    }
    if let Some(m) = min_map {
        let Some(map) = &ag.map else {
            anyhow::bail!("--min-map: the replays wrote no BEV map (replay with --camera-model and cameras in the bag)");
        };
        let f = map.fraction().unwrap_or(1.0);
        if f < m {
            anyhow::bail!("BEV map agreement {:.4} % is below --min-map {:.4} %", 100.0 * f, 100.0 * m);
        }
    }
    Ok(())
}
