//! msgs

pub mod cdr;
pub mod cloud;
pub mod points;

