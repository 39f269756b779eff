//! BEVFusion's BEV map segmentation models (mit-han-lab/bevfusion at db75150), camera-only and
//! camera + LiDAR: the YAML read once (`config`), the camera encoder (`camera`: Swin-T and the
//! FPN neck), the view transform (`lss`, with bev_pool), the LiDAR encoder, the fuser, the BEV
//! decoder and head (`bev_stack`), the whole model (`seg`, `seg_cuda`) and its map (`map`).

pub mod bev_stack;
#[cfg(feature = "cuda-core")]
pub mod bev_stack_cuda;
pub mod camera;
pub mod config;
pub mod decoder;
#[cfg(feature = "cuda-core")]
pub mod decoder_cuda;
pub mod fuser;
pub mod head;
#[cfg(feature = "cuda-core")]
pub mod head_cuda;
pub mod lidar_encoder;
pub(crate) mod load;
pub mod lss;
pub mod map;
pub mod seg;
#[cfg(feature = "cuda-core")]
pub mod seg_cuda;
#[cfg(feature = "cuda-core")]
pub mod seg_graph;

