//! The node's output messages for one frame as CDR-encodable structs ([`crate::msgs::cdr`]), for
//! writing bags: the labeled cloud (`x, y, z, intensity` float32, `class_id` uint8,
//! `probability` float32, from [`crate::msgs::cloud::encode_labeled`]) and the BEV grids (a mono8
//! class image, an rgb8 palette image and a `nav_msgs/OccupancyGrid`).
//!
//! The frame's work is [`crate::frame::processor::Processor`]'s, shared with the node, and the BEV
//! messages' layout (sizes, steps, encodings, origin, header) is
//! [`crate::frame::messages::BevLayout`]'s, which the node's r2r messages are filled from too
//! (`ros::node::bev_messages`), so a replayed bag holds what the node publishes. The labeled
//! cloud keeps the input's header; the BEV grids are stamped with the input's stamp and the
//! `bev.frame_id` of the node's parameters (empty: the cloud's frame). No TF is applied, as in
//! the node.

use crate::msgs::cdr::{Header, Image, OccupancyGrid, PointCloud2};
use crate::ops::label_grid::cpu::{BevGridParams, BevGrids};
use crate::frame::messages::{BevLayout, ImageLayout};
use crate::msgs::cloud::CloudBuf;
use crate::frame::processor::FrameOutput;
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

/// The three BEV messages of `grids` (mono8 class image, rgb8 palette image, occupancy grid)
/// for the cloud with header `cloud`: [`BevLayout`]'s fields and the grids' data, field for
/// field (the node's `ros::node::bev_messages` is the same in r2r types).
pub fn bev_messages(
    grids: &BevGrids,
    bev: &BevGridParams,
    cloud: &Header,
    bev_frame_id: &str,
) -> Result<(Image, Image, OccupancyGrid), Error> {
    let layout = BevLayout::new(grids, bev, cloud.stamp, &cloud.frame_id, bev_frame_id)?;
    let image = |l: &ImageLayout, data: &[u8]| Image {
        header: layout.header.clone(),
        height: l.height,
        width: l.width,
        encoding: l.encoding.to_string(),
        is_bigendian: l.is_bigendian,
        step: l.step,
        data: data.to_vec(),
    };
    Ok((
        image(&layout.labels, &grids.labels),
        image(&layout.color, &grids.rgb),
        OccupancyGrid {
            header: layout.header.clone(),
            info: layout.map,
            data: grids.occupancy.clone(),
        },
    ))
}

/// The output messages of a processed frame: its labeled cloud under the input's `header`,
/// its BEV grids as [`bev_messages`] makes them.
pub fn build(
    out: &FrameOutput,
    header: &Header,
    bev_frame_id: &str,
    bev: &BevGridParams,
) -> Result<FrameOutputs, Error> {
    let cloud: CloudBuf = out.cloud.clone();
    let (bev_labels, bev_color, occupancy) = bev_messages(&out.grids, bev, header, bev_frame_id)?;
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
    use crate::msgs::cdr::{MapMetaData, Pose, Time};
    use crate::ops::label_grid::cpu::label_grid_cpu;

    #[test]
    fn bev_messages_are_the_layout_and_the_grids() {
        let p = BevGridParams {
            range: [-2.0, -1.0, 2.0, 1.0],
            resolution: 0.5,
            classes: 2,
            obstacle_classes: vec![1],
            palette: vec![[1, 2, 3], [4, 5, 6]],
        };
        let g = label_grid_cpu(&[0.1], &[0.1], &[1], &[0.9], &p).unwrap();
        let cloud = Header {
            stamp: Time { sec: 3, nanosec: 4 },
            frame_id: "lidar".into(),
        };
        let (labels, color, occ) = bev_messages(&g, &p, &cloud, "").unwrap();
        let header = Header {
            stamp: cloud.stamp,
            frame_id: "lidar".into(),
        };
        assert_eq!(
            labels,
            Image {
                header: header.clone(),
                height: 4,
                width: 8,
                encoding: "mono8".into(),
                is_bigendian: 0,
                step: 8,
                data: g.labels.clone(),
            }
        );
        assert_eq!(
            color,
            Image {
                header: header.clone(),
                height: 4,
                width: 8,
                encoding: "rgb8".into(),
                is_bigendian: 0,
                step: 24,
                data: g.rgb.clone(),
            }
        );
        assert_eq!(
            occ,
            OccupancyGrid {
                header,
                info: MapMetaData {
                    map_load_time: cloud.stamp,
                    resolution: 0.5,
                    width: 8,
                    height: 4,
                    origin: Pose {
                        position: [-2.0, -1.0, 0.0],
                        orientation: [0.0, 0.0, 0.0, 1.0],
                    },
                },
                data: g.occupancy.clone(),
            }
        );
        let (labels, _, occ) = bev_messages(&g, &p, &cloud, "base_link").unwrap();
        assert_eq!(labels.header.frame_id, "base_link");
        assert_eq!(occ.header.frame_id, "base_link");
    }
}
