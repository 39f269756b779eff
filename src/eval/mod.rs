//! Evaluation of replayed frames: ground-truth label mapping ([`labels`]), the confusion matrix
//! with per-class IoU, mIoU and accuracy ([`confusion`]), latency percentiles ([`latency`]),
//! the per-shard state that `sptr eval merge` combines ([`state`]) and the reports made from
//! it: JSON with stable keys and Markdown ([`report`]), PNG plots ([`plots`]).
//!
//! Everything but the timings is a pure function of the bag, the model and the options, so a
//! run, a re-run and a merge of shards give the same metrics bit for bit.

pub mod bev_map;
pub mod bev_png;
pub mod confusion;
pub mod labels;
pub mod latency;
pub mod map_files;
pub mod plots;
pub mod report;
pub mod state;

pub use confusion::Confusion;
pub use labels::{GroundTruth, LabelMap};
pub use latency::LatencySummary;
pub use report::Report;
pub use state::{EvalState, FrameRecord, FrameStatus};

/// Errors of the evaluation side: a label map, a shard file, a report that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{path}: {reason}")]
    File {
        path: std::path::PathBuf,
        reason: String,
    },
    #[error("{0}")]
    Invalid(String),
}
