//! Bird's-eye-view grids: the labeled-points -> BEV class/colour/occupancy grids the node
//! publishes and the layout of their messages; the camera calibration (`calib`) and the
//! lift-splat view transform (`lss`: geometry per calibration, depth lift, `bev_pool`).
//!
//! The camera branch's plumbing around the BEV map model: `map` (the [`map::BevMap`] a model
//! gives), `map_messages` (its OccupancyGrid / mono8 / rgb8 messages), `sync` (latest image of
//! each camera per LiDAR cloud, masking), `tf` (TFMessage edges chained between frames),
//! `calib_file` (the calibration file), `rig` (the calibration per frame from CameraInfo, TF and
//! the file, with change detection), `sweeps` (multi-sweep LiDAR input with ego motion), and
//! `branch`, which puts them together per LiDAR cloud for the model ([`branch::BevMapModel`]).

pub mod branch;
pub mod calib;
pub mod calib_file;
pub mod label_grid;
#[cfg(feature = "cuda")]
pub mod label_grid_cuda;
pub mod lss;
pub mod map;
pub mod map_messages;
pub mod messages;
pub mod seg_map;
pub mod rig;
pub mod sweeps;
pub mod sync;
pub mod tf;
