//! The layout of the three BEV messages of a frame, in one place for the node (r2r messages,
//! `ros::node::bev_messages`) and replay (CDR messages, [`crate::frame::outputs::bev_messages`]), so
//! a replayed bag holds the messages the node publishes: both fill their message types field
//! for field from a [`BevLayout`] and the grids' data.
//!
//! - `labels`: `sensor_msgs/Image`, mono8, the class id per cell
//!   ([`NO_DATA`](crate::ops::label_grid::cpu::NO_DATA): no point);
//! - `color`: `sensor_msgs/Image`, rgb8, the model's palette colour of that class;
//! - `occupancy`: `nav_msgs/OccupancyGrid`, 0-100 from the obstacle classes, -1 unknown.
//!
//! All three are row-major with cell (0, 0) at (`xmin`, `ymin`) and x along a row (see
//! [`crate::ops::label_grid::cpu`]), under one header: the cloud's stamp and the frame of [`bev_frame_id`].
//! No transform is applied: the cloud's x, y are taken as coordinates in that frame.

use crate::msgs::cdr::{Header, MapMetaData, Pose, Time};
use crate::ops::label_grid::cpu::{BevGridParams, BevGrids};
use crate::Error;

/// Encoding of the class image: one byte, the class id, per cell.
pub const LABELS_ENCODING: &str = "mono8";
/// Encoding of the colour image: the class's palette RGB, three bytes per cell.
pub const COLOR_ENCODING: &str = "rgb8";

/// A `sensor_msgs/Image` of a BEV grid less its header and data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageLayout {
    pub height: u32,
    pub width: u32,
    pub encoding: &'static str,
    /// Always 0: the pixels are single bytes, so byte order does not apply.
    pub is_bigendian: u8,
    /// Bytes per row.
    pub step: u32,
}

/// Everything of the three BEV messages of a frame but their data (`grids.labels`, `grids.rgb`,
/// `grids.occupancy`, which go in unchanged).
#[derive(Debug, Clone, PartialEq)]
pub struct BevLayout {
    /// The header of all three messages.
    pub header: Header,
    /// The mono8 class image.
    pub labels: ImageLayout,
    /// The rgb8 palette image.
    pub color: ImageLayout,
    /// The `info` of the occupancy grid.
    pub map: MapMetaData,
}

/// The frame the BEV messages are stamped with: `bev.frame_id`, or the cloud's frame when that
/// parameter is empty.
pub fn bev_frame_id<'a>(bev_frame_id: &'a str, cloud_frame_id: &'a str) -> &'a str {
    if bev_frame_id.is_empty() {
        cloud_frame_id
    } else {
        bev_frame_id
    }
}

/// When `bev.frame_id` names a frame other than the cloud's, what to tell the user: the grids
/// then claim a frame their coordinates are not in (no TF is applied). `None` when they agree.
pub fn frame_mismatch(bev_frame_id: &str, cloud_frame_id: &str) -> Option<String> {
    (!bev_frame_id.is_empty() && bev_frame_id != cloud_frame_id).then(|| {
        format!(
            "the BEV grids are stamped `{bev_frame_id}` (bev.frame_id) but the cloud is in \
             `{cloud_frame_id}`: no transform is applied"
        )
    })
}

impl BevLayout {
    /// The layout of the messages of `grids` (made with `bev`) for a cloud stamped `stamp` in
    /// `cloud_frame_id`; `bev_frame_id` is the `bev.frame_id` parameter.
    ///
    /// Errors: a grid too large for the messages' `u32` sizes, or grids that do not match
    /// their own size or `bev`'s (a bug upstream; the message would describe other cells than
    /// it holds).
    pub fn new(
        grids: &BevGrids,
        bev: &BevGridParams,
        stamp: Time,
        cloud_frame_id: &str,
        bev_frame_id: &str,
    ) -> Result<BevLayout, Error> {
        let (w, h) = (grids.width, grids.height);
        let too_big = || {
            Error::InvalidInput(format!(
                "BEV grid {w} x {h} is too large for a message (width, height and the rgb8 row \
                 of 3 x width bytes must fit in 32 bits); use a coarser bev.resolution or a \
                 smaller bev.range"
            ))
        };
        let width = u32::try_from(w).map_err(|_| too_big())?;
        let height = u32::try_from(h).map_err(|_| too_big())?;
        let color_step = width.checked_mul(3).ok_or_else(too_big)?;
        let cells = w.checked_mul(h).ok_or_else(too_big)?;
        let rgb_bytes = cells.checked_mul(3).ok_or_else(too_big)?;
        if grids.labels.len() != cells
            || grids.rgb.len() != rgb_bytes
            || grids.occupancy.len() != cells
        {
            return Err(Error::InvalidInput(format!(
                "BEV grids of {w} x {h} cells hold {} labels, {} rgb bytes and {} occupancy \
                 cells (expected {cells}, {rgb_bytes}, {cells})",
                grids.labels.len(),
                grids.rgb.len(),
                grids.occupancy.len()
            )));
        }
        if (w, h) != (bev.width(), bev.height()) {
            return Err(Error::InvalidInput(format!(
                "BEV grids of {w} x {h} cells do not match bev.range and bev.resolution ({} x {} \
                 cells)",
                bev.width(),
                bev.height()
            )));
        }
        let header = Header {
            stamp,
            frame_id: self::bev_frame_id(bev_frame_id, cloud_frame_id).to_string(),
        };
        let image = |encoding, step| ImageLayout {
            height,
            width,
            encoding,
            is_bigendian: 0,
            step,
        };
        Ok(BevLayout {
            labels: image(LABELS_ENCODING, width),
            color: image(COLOR_ENCODING, color_step),
            map: MapMetaData {
                // The grid is made anew from each cloud, so it is "loaded" at the cloud's stamp
                // (not at the wall-clock time of processing: replay and the node agree, and a
                // consumer can tell a stale grid from the stamp alone).
                map_load_time: stamp,
                // nav_msgs/MapMetaData's resolution is a float32.
                resolution: bev.resolution as f32,
                width,
                height,
                // Cell (0, 0)'s corner at (xmin, ymin), grid axes along the frame's x and y
                // (identity rotation), in the frame's z = 0 plane: the grid has no height.
                origin: Pose {
                    position: [bev.range[0], bev.range[1], 0.0],
                    orientation: [0.0, 0.0, 0.0, 1.0],
                },
            },
            header,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::label_grid::cpu::label_grid_cpu;

    /// 4 m x 2 m at 0.5 m: 8 x 4 cells, two classes, class 1 an obstacle.
    fn params() -> BevGridParams {
        BevGridParams {
            range: [-2.0, -1.0, 2.0, 1.0],
            resolution: 0.5,
            classes: 2,
            obstacle_classes: vec![1],
            palette: vec![[1, 2, 3], [4, 5, 6]],
        }
    }

    const STAMP: Time = Time { sec: 3, nanosec: 4 };

    #[test]
    fn sizes_steps_encodings_and_origin() {
        let p = params();
        let g = label_grid_cpu(&[0.1], &[0.1], &[1], &[0.9], &p).unwrap();
        let l = BevLayout::new(&g, &p, STAMP, "lidar", "base_link").unwrap();
        assert_eq!(
            l.labels,
            ImageLayout {
                height: 4,
                width: 8,
                encoding: "mono8",
                is_bigendian: 0,
                step: 8
            }
        );
        assert_eq!(
            l.color,
            ImageLayout {
                height: 4,
                width: 8,
                encoding: "rgb8",
                is_bigendian: 0,
                step: 24
            }
        );
        assert_eq!(
            l.map,
            MapMetaData {
                map_load_time: STAMP,
                resolution: 0.5,
                width: 8,
                height: 4,
                origin: Pose {
                    position: [-2.0, -1.0, 0.0],
                    orientation: [0.0, 0.0, 0.0, 1.0]
                },
            }
        );
        assert_eq!(
            l.header,
            Header {
                stamp: STAMP,
                frame_id: "base_link".into()
            }
        );
        // Rows of `step` bytes, `height` of them: the data fill the messages exactly.
        assert_eq!(g.labels.len(), (l.labels.step * l.labels.height) as usize);
        assert_eq!(g.rgb.len(), (l.color.step * l.color.height) as usize);
        assert_eq!(g.occupancy.len(), (l.map.width * l.map.height) as usize);
    }

    #[test]
    fn frame_is_bev_frame_id_or_else_the_clouds() {
        let p = params();
        let g = label_grid_cpu(&[], &[], &[], &[], &p).unwrap();
        let frame = |bev: &str| {
            BevLayout::new(&g, &p, STAMP, "lidar", bev)
                .unwrap()
                .header
                .frame_id
        };
        assert_eq!(frame(""), "lidar");
        assert_eq!(frame("base_link"), "base_link");
        assert_eq!(bev_frame_id("", "lidar"), "lidar");
        assert_eq!(bev_frame_id("map", "lidar"), "map");
        assert_eq!(frame_mismatch("", "lidar"), None);
        assert_eq!(frame_mismatch("lidar", "lidar"), None);
        let note = frame_mismatch("base_link", "lidar").unwrap();
        assert!(
            note.contains("`base_link`") && note.contains("`lidar`"),
            "{note}"
        );
    }

    #[test]
    fn too_large_grids_are_errors() {
        let p = params();
        let grids = |width: usize, height: usize| BevGrids {
            width,
            height,
            ..BevGrids::default()
        };
        // Width past u32; height past u32; 3 x width past u32 (the rgb8 step).
        for (w, h) in [
            (u32::MAX as usize + 1, 1),
            (1, u32::MAX as usize + 1),
            (u32::MAX as usize / 3 + 1, 1),
        ] {
            let e = BevLayout::new(&grids(w, h), &p, STAMP, "lidar", "")
                .unwrap_err()
                .to_string();
            assert!(e.contains("too large for a message"), "{w} x {h}: {e}");
        }
        // The largest width whose rgb8 row still fits is not "too large" (it fails later,
        // on its data).
        let e = BevLayout::new(&grids(u32::MAX as usize / 3, 1), &p, STAMP, "lidar", "")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("too large"), "{e}");
    }

    #[test]
    fn grids_that_do_not_match_their_size_or_the_params_are_errors() {
        let p = params();
        let mut g = label_grid_cpu(&[], &[], &[], &[], &p).unwrap();
        g.rgb.pop();
        let e = BevLayout::new(&g, &p, STAMP, "lidar", "").unwrap_err();
        assert!(e.to_string().contains("rgb bytes"), "{e}");
        let g = label_grid_cpu(&[], &[], &[], &[], &p).unwrap();
        let coarser = BevGridParams {
            resolution: 1.0,
            ..params()
        };
        let e = BevLayout::new(&g, &coarser, STAMP, "lidar", "").unwrap_err();
        assert!(e.to_string().contains("do not match"), "{e}");
    }
}
