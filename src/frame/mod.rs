//! frame

pub mod bev_png;
pub mod budget;
pub mod cameras;
pub mod map_files;
pub mod map_messages;
pub mod messages;
pub mod outputs;
pub mod params;
pub mod processor;
pub mod sweeps;
pub mod sync;

