//! models

pub mod bevfusion;
pub mod sphereformer;

