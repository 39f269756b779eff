//! ops::label_grid

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

