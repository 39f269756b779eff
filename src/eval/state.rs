//! What one replay (or one shard of it) measured, saved as `eval_state.json` next to its
//! report: the run's identity, every frame's record (status, point counts, per-stage times),
//! the confusion matrix and any damage that ended the read. A report is a function of this
//! state alone, and `sptr eval merge` adds shard states into the state a single run would have
//! written (frames in index order, matrices summed), so the merged report equals the
//! single-run report in everything but the measured times.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::confusion::Confusion;
use super::EvalError;

/// Version of the state file layout.
pub const STATE_FORMAT: u32 = 1;

/// File name of the state in a replay output directory.
pub const STATE_FILE: &str = "eval_state.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameStatus {
    /// Segmented and compared with ground truth.
    Evaluated,
    /// Segmented; no ground truth was asked for.
    Replayed,
    /// Segmented; ground truth was asked for but this frame has none usable (`reason` says why).
    NoGroundTruth,
    /// Not segmented (`reason` says why: the message could not be decoded, ...).
    Skipped,
}

/// One LiDAR frame of the shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrameRecord {
    /// Index of the frame among the bag's LiDAR messages (timestamp order), from 0.
    pub index: u64,
    /// Receive time in the bag.
    pub timestamp_ns: i64,
    pub status: FrameStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Points in the message and points the model gave a class.
    pub points: u64,
    pub labeled_points: u64,
    /// Per stage, in the order they ran (replay: `deserialize`, the node processor's `decode`,
    /// `voxelize`, `network`, `devoxelize`, `bev`, `encode`, then `write`), and `end_to_end`
    /// (deserialize through write). Nanoseconds.
    pub stages_ns: Vec<(String, u64)>,
    /// The network's activations left the FP16 range (NaN/inf on the CPU): the flagged layers
    /// in execution order (`name (overflow)`), see `device::range_guard`. The frame is then skipped
    /// (`on_overflow: drop`, the default) or replayed with probability 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub out_of_range: Vec<String>,
    /// `precision: auto`: the frame's FP16 pass was flagged (these layers) and the frame was
    /// computed again in FP32; its labels are the FP32 ones (in range: `out_of_range` empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recomputed_in_fp32: Vec<String>,
    /// The cloud had no intensity field: the network saw intensity 0 for every point.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_intensity: bool,
}

/// Damage that ended the read of the bag (frames after it were not seen).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Damage {
    pub file: String,
    /// LiDAR frames read before it.
    pub frames_before: u64,
    pub error: String,
}

/// The measured state of a run or shard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalState {
    pub format: u32,
    pub bag: String,
    pub lidar_topic: String,
    pub model: String,
    pub weights: String,
    pub device: String,
    pub class_names: Vec<String>,
    /// How ground truth was read (`None`: no evaluation asked for).
    pub ground_truth: Option<String>,
    /// `n` of `--shard i/n` (1 for a whole run) and the shard indices this state holds.
    pub shard_count: u32,
    pub shards: Vec<u32>,
    /// This shard's frames, in index order.
    pub frames: Vec<FrameRecord>,
    /// LiDAR frames in the bag that were read (every shard reads them all; frames after damage
    /// are not counted).
    pub frames_in_bag: u64,
    pub confusion: Confusion,
    /// Wall time of the frame loop of each shard (seconds).
    pub processing_s: Vec<f64>,
    pub damage: Option<Damage>,
}

impl EvalState {
    pub fn save(&self, path: &Path) -> Result<(), EvalError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| EvalError::Invalid(format!("state JSON: {e}")))?;
        std::fs::write(path, text + "\n").map_err(|e| EvalError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// Loads a state file, or the one in a replay output directory.
    pub fn load(path: &Path) -> Result<EvalState, EvalError> {
        let file = if path.is_dir() {
            path.join(STATE_FILE)
        } else {
            path.to_path_buf()
        };
        let err = |reason: String| EvalError::File {
            path: file.clone(),
            reason,
        };
        let text = std::fs::read_to_string(&file).map_err(|e| {
            err(format!(
                "cannot read the shard state ({e}); pass a `sptr replay --out` directory"
            ))
        })?;
        let s: EvalState = serde_json::from_str(&text)
            .map_err(|e| err(format!("not a replay state file: {e}")))?;
        if s.format != STATE_FORMAT {
            return Err(err(format!(
                "state format {} (this build reads {STATE_FORMAT})",
                s.format
            )));
        }
        s.confusion.check().map_err(&err)?;
        if s.confusion.classes != s.class_names.len() {
            return Err(err(format!(
                "{} class names for a {}-class confusion matrix",
                s.class_names.len(),
                s.confusion.classes
            )));
        }
        Ok(s)
    }

    /// Combines shard states of one replay into the state of the whole run. Every shard of
    /// `0..n` must be there once, from the same bag, topic, model, weights and ground truth.
    /// Errors name shards by their index ([`EvalState::merge_named`] names their files).
    pub fn merge(shards: Vec<EvalState>) -> Result<EvalState, EvalError> {
        let named = shards
            .into_iter()
            .enumerate()
            .map(|(k, s)| (format!("state #{k}"), s))
            .collect();
        Self::merge_named(named)
    }

    /// [`EvalState::merge`] of `(where it comes from, state)` pairs (e.g. the output directory):
    /// an error names both sides by where they come from and their shard, e.g. "shard 0/2 of
    /// run_b has bag \"y\" but shard 0/2 of run_a has bag \"x\"".
    pub fn merge_named(mut shards: Vec<(String, EvalState)>) -> Result<EvalState, EvalError> {
        if shards.is_empty() {
            return Err(EvalError::Invalid("no shard states to merge".into()));
        }
        shards.sort_by_key(|(_, s)| s.shards.first().copied().unwrap_or(u32::MAX));
        let (first_src, first) = shards[0].clone();
        let n = first.shard_count;
        let mut out = EvalState {
            frames: Vec::new(),
            shards: Vec::new(),
            processing_s: Vec::new(),
            confusion: Confusion::new(first.class_names.len()),
            ..first.clone()
        };
        let label = |src: &str, s: &EvalState| {
            let idx: Vec<String> = s.shards.iter().map(|i| i.to_string()).collect();
            format!("shard {}/{} of {src}", idx.join("+"), s.shard_count)
        };
        let mut seen: Vec<(u32, String)> = Vec::new();
        for (src, s) in &shards {
            let what = |field: &str, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
                EvalError::Invalid(format!(
                    "{} has {field} {b:?} but {} has {field} {a:?}: shards of different replays cannot be merged",
                    label(src, s),
                    label(&first_src, &first)
                ))
            };
            if s.shard_count != n {
                return Err(what("shard count", &n, &s.shard_count));
            }
            for (field, a, b) in [
                ("bag", &first.bag, &s.bag),
                ("lidar topic", &first.lidar_topic, &s.lidar_topic),
                ("model", &first.model, &s.model),
                ("weights", &first.weights, &s.weights),
            ] {
                if a != b {
                    return Err(what(field, a, b));
                }
            }
            if s.class_names != first.class_names {
                return Err(what("classes", &first.class_names, &s.class_names));
            }
            if s.ground_truth != first.ground_truth {
                return Err(what("ground truth", &first.ground_truth, &s.ground_truth));
            }
            for &i in &s.shards {
                if let Some((_, other)) = seen.iter().find(|(j, _)| *j == i) {
                    return Err(EvalError::Invalid(format!(
                        "shard {i}/{n} is given twice: {other} and {src}"
                    )));
                }
                seen.push((i, src.clone()));
                out.shards.push(i);
            }
            out.frames.extend(s.frames.iter().cloned());
            out.processing_s.extend(&s.processing_s);
            out.confusion
                .merge(&s.confusion)
                .map_err(EvalError::Invalid)?;
            // Every shard reads the whole bag: the same damage, the same frame count.
            out.frames_in_bag = out.frames_in_bag.max(s.frames_in_bag);
            if out.damage.is_none() {
                out.damage = s.damage.clone();
            }
        }
        out.shards.sort_unstable();
        let missing: Vec<u32> = (0..n).filter(|i| !out.shards.contains(i)).collect();
        if !missing.is_empty() {
            return Err(EvalError::Invalid(format!(
                "shards {missing:?} of {n} are missing: merge every shard's output directory"
            )));
        }
        out.frames.sort_by_key(|f| f.index);
        if let Some(w) = out.frames.windows(2).find(|w| w[0].index == w[1].index) {
            return Err(EvalError::Invalid(format!(
                "frame {} appears in two shards",
                w[0].index
            )));
        }
        Ok(out)
    }
}
