//! What stops a replay: bad options, an unreadable bag, a wrong topic, outputs that cannot be
//! written.

use std::path::PathBuf;

use crate::bag::BagError;

/// Errors that stop a replay before any frame (bad options, unreadable bag, wrong topic), or
/// outputs that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Bag(#[from] BagError),
    #[error("{0}")]
    Setup(String),
    #[error("{bag}: {reason}")]
    Topic { bag: PathBuf, reason: String },
    #[error("writing the output bag: {0}")]
    Writer(#[from] crate::bag::WriterError),
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

