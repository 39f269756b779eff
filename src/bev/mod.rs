//! Bird's-eye-view grids. Today: the labeled-points -> BEV class/colour/occupancy grids the node
//! publishes, and the layout of their messages. Camera geometry, the LSS lift and `bev_pool`
//! come with the camera branch.

pub mod label_grid;
#[cfg(feature = "cuda")]
pub mod label_grid_cuda;
pub mod messages;
