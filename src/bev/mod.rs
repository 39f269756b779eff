//! Bird's-eye-view grids: the labeled-points -> BEV class/colour/occupancy grids the node
//! publishes and the layout of their messages; the camera calibration (`calib`) and the
//! lift-splat view transform (`lss`: geometry per calibration, depth lift, `bev_pool`).

pub mod calib;
pub mod label_grid;
#[cfg(feature = "cuda")]
pub mod label_grid_cuda;
pub mod lss;
pub mod messages;
pub mod seg_map;
