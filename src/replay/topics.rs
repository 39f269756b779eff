//! Which topics a replay reads: the LiDAR topic (given, the node's default, or the bag's only
//! PointCloud2 topic) and the label topic, both checked to exist and be PointCloud2 before any
//! frame is read, so a wrong name or type is an error naming the bag and topic.

use super::{LabelSource, ReplayError, ReplayOptions};
use crate::bag::Bag;

/// The LiDAR topic of the node's default parameters (node `sptr`, `~/input/points`).
pub const DEFAULT_LIDAR_TOPIC: &str = "/sptr/input/points";
pub(crate) const POINTCLOUD2: &str = "sensor_msgs/msg/PointCloud2";

/// Picks the LiDAR topic and checks its type and that of the label topic.
pub(crate) fn resolve_topics(bag: &Bag, opts: &ReplayOptions) -> Result<String, ReplayError> {
    let err = |reason: String| ReplayError::Topic {
        bag: bag.path().to_path_buf(),
        reason,
    };
    let list = || {
        bag.topics()
            .iter()
            .map(|t| format!("{} ({})", t.name, t.type_name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let check = |name: &str, what: &str| -> Result<(), ReplayError> {
        match bag.topics().iter().find(|t| t.name == name) {
            None => Err(err(format!(
                "no {what} topic {name} in the bag; its topics: [{}]",
                list()
            ))),
            Some(t) if t.type_name != POINTCLOUD2 && t.type_name != "sensor_msgs/PointCloud2" => {
                Err(err(format!(
                    "{what} topic {name} has type {}, expected {POINTCLOUD2}",
                    t.type_name
                )))
            }
            Some(_) => Ok(()),
        }
    };
    let label_topic = match &opts.labels {
        Some(LabelSource::Topic(t)) => {
            check(t, "label")?;
            Some(t.as_str())
        }
        _ => None,
    };
    let lidar = match &opts.lidar_topic {
        Some(t) => t.clone(),
        None if bag.topics().iter().any(|t| t.name == DEFAULT_LIDAR_TOPIC) => {
            DEFAULT_LIDAR_TOPIC.to_string()
        }
        None => {
            let clouds: Vec<&str> = bag
                .topics()
                .iter()
                .filter(|t| t.type_name == POINTCLOUD2 && Some(t.name.as_str()) != label_topic)
                .map(|t| t.name.as_str())
                .collect();
            match clouds[..] {
                [one] => one.to_string(),
                [] => {
                    return Err(err(format!(
                        "no {POINTCLOUD2} topic to replay; its topics: [{}]",
                        list()
                    )))
                }
                _ => {
                    return Err(err(format!(
                        "several PointCloud2 topics ({}): choose one with --lidar-topic",
                        clouds.join(", ")
                    )))
                }
            }
        }
    };
    check(&lidar, "LiDAR")?;
    if label_topic == Some(lidar.as_str()) {
        return Err(err(format!(
            "the label topic and the LiDAR topic are both {lidar}"
        )));
    }
    Ok(lidar)
}
