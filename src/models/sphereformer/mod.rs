//! models::sphereformer

pub mod config;
pub mod network;
#[cfg(feature = "cuda")]
pub mod precision;
pub mod preprocess;
pub mod random;
pub mod segmenter;

