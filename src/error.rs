//! The library's error type: every failure a caller can act on, with what went wrong in words.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Cloud(#[from] crate::cloud::CloudError),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("kernel compile: {0}")]
    KernelCompile(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
