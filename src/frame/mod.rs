//! One frame of the node: the frame processor (`frame_processor`: the cloud decoded once, the
//! LiDAR path and the camera path beside each other or one after the other), the LiDAR processor
//! (`processor`), the camera branch (`cameras`, with `sync` and `sweeps`), the BEV map model's
//! adapter (`map_model`), the node's parameters (`params`), the output messages' layouts
//! (`messages`, `map_messages`, `outputs`) and the latency budget (`budget`).

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

