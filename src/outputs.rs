//! The node's output messages for one frame as CDR-encodable structs ([`crate::bag::cdr`]), for
//! writing bags: the labeled cloud (`x, y, z, intensity` float32, `class_id` uint8,
//! `probability` float32, from [`crate::cloud::encode_labeled`]) and the BEV grids (a mono8
//! class image, an rgb8 palette image and a `nav_msgs/OccupancyGrid`).
//!
//! The frame's work is [`crate::perception::Processor`]'s, shared with the node; the node wraps
//! the same [`FrameOutput`] in r2r messages field for field (`ros::node::bev_messages`), so a
//! replayed bag holds what the node publishes. The labeled cloud keeps the input's header; the
//! BEV grids are stamped with the input's stamp and the `bev.frame_id` of the node's
//! parameters (empty: the cloud's frame). No TF is applied, as in the node.

use crate::bag::cdr::{Header, Image, MapMetaData, OccupancyGrid, PointCloud2, Pose};
use crate::bev::label_grid::{BevGridParams, BevGrids};
use crate::cloud::CloudBuf;
use crate::perception::FrameOutput;
use crate::Error;

/// The node's output topics (its private names under the node `sptr`, namespace `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputTopics {
    pub points: String,
    pub bev_labels: String,
    pub bev_color: String,
    pub bev_occupancy: String,
}

impl Default for OutputTopics {
    fn default() -> Self {
        OutputTopics {
            points: "/sptr/output/points".into(),
            bev_labels: "/sptr/output/bev/labels".into(),
            bev_color: "/sptr/output/bev/labels_color".into(),
            bev_occupancy: "/sptr/output/bev/occupancy".into(),
        }
    }
}

/// One frame's output messages.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameOutputs {
    pub cloud: PointCloud2,
    pub bev_labels: Image,
    pub bev_color: Image,
    pub occupancy: OccupancyGrid,
}

/// The header of the BEV grids: the input's stamp, `bev_frame_id` (empty: the input's frame).
pub fn bev_header(input: &Header, bev_frame_id: &str) -> Header {
    Header {
        stamp: input.stamp,
        frame_id: if bev_frame_id.is_empty() {
            input.frame_id.clone()
        } else {
            bev_frame_id.to_string()
        },
    }
}

/// The three BEV messages of `grids`.
pub fn bev_messages(
    grids: &BevGrids,
    bev: &BevGridParams,
    header: &Header,
) -> Result<(Image, Image, OccupancyGrid), Error> {
    let (w, h) = (grids.width, grids.height);
    let too_big = || Error::InvalidInput(format!("BEV grid {w} x {h} is too large for a message"));
    let w32 = u32::try_from(w).map_err(|_| too_big())?;
    let h32 = u32::try_from(h).map_err(|_| too_big())?;
    let step3 = w32.checked_mul(3).ok_or_else(too_big)?;
    let image = |encoding: &str, step: u32, data: Vec<u8>| Image {
        header: header.clone(),
        height: h32,
        width: w32,
        encoding: encoding.to_string(),
        is_bigendian: 0,
        step,
        data,
    };
    let occupancy = OccupancyGrid {
        header: header.clone(),
        info: MapMetaData {
            map_load_time: header.stamp,
            resolution: bev.resolution as f32,
            width: w32,
            height: h32,
            origin: Pose {
                position: [bev.range[0], bev.range[1], 0.0],
                orientation: [0.0, 0.0, 0.0, 1.0],
            },
        },
        data: grids.occupancy.clone(),
    };
    Ok((
        image("mono8", w32, grids.labels.clone()),
        image("rgb8", step3, grids.rgb.clone()),
        occupancy,
    ))
}

/// The output messages of a processed frame: its labeled cloud under the input's `header`,
/// its BEV grids under [`bev_header`].
pub fn build(
    out: &FrameOutput,
    header: &Header,
    bev_frame_id: &str,
    bev: &BevGridParams,
) -> Result<FrameOutputs, Error> {
    let cloud: CloudBuf = out.cloud.clone();
    let (bev_labels, bev_color, occupancy) =
        bev_messages(&out.grids, bev, &bev_header(header, bev_frame_id))?;
    Ok(FrameOutputs {
        cloud: PointCloud2 {
            header: header.clone(),
            cloud,
        },
        bev_labels,
        bev_color,
        occupancy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bag::cdr::Time;

    #[test]
    fn bev_frame_defaults_to_the_cloud_frame() {
        let h = Header {
            stamp: Time { sec: 3, nanosec: 4 },
            frame_id: "lidar".into(),
        };
        assert_eq!(bev_header(&h, "").frame_id, "lidar");
        assert_eq!(bev_header(&h, "base_link").frame_id, "base_link");
        assert_eq!(bev_header(&h, "base_link").stamp, h.stamp);
    }
}
