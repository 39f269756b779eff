//! Labeled points to BEV grids (class per cell, its colour, occupancy): `cpu`, the reference, and
//! `cuda`.

pub mod cpu;
#[cfg(feature = "cuda-core")]
pub mod cuda;

