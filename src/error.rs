//! The library's error type: every failure a caller can act on, with what went wrong in words.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Cloud(#[from] crate::msgs::cloud::CloudError),
    #[error(transparent)]
    Config(#[from] crate::error::ConfigError),
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("kernel compile: {0}")]
    KernelCompile(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A configuration file that cannot be used: unreadable, not parseable, or a value out of range;
/// the file and the key are named so the user knows what to fix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("{file}: cannot read: {reason}")]
    Read { file: String, reason: String },
    /// serde's message names the unknown or mistyped key and its line.
    #[error("{file}: {reason}")]
    Parse { file: String, reason: String },
    #[error("{file}: `{key}` {reason}")]
    Value { file: String, key: String, reason: String },
}

pub(crate) fn value_err(file: &str, key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: file.to_string(), key: key.to_string(), reason: reason.into() }
}
