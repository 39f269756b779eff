//! frame

pub mod budget;
pub mod cameras;
pub mod frame_processor;
pub mod map_messages;
pub mod map_model;
pub mod messages;
pub mod outputs;
pub mod params;
pub mod processor;
pub mod sweeps;
pub mod sync;

