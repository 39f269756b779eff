//! The topics the shipped viewer layouts name (`config/rviz/sptr.rviz`, `config/foxglove/sptr.json`),
//! read the way each viewer reads its file, and the outputs the node publishes under the default
//! launch (node `sptr`, no namespace), for the tests that hold the two against each other.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

pub const RVIZ: &str = "config/rviz/sptr.rviz";
pub const FOXGLOVE: &str = "config/foxglove/sptr.json";
/// The node's fully resolved name under the default launch: every topic of the layouts is under it.
pub const NODE: &str = "/sptr";
/// The params file of the camera branch whose BEV map model names the map classes.
pub const CAMERA_PARAMS: &str = "config/perception_nuscenes_cameras.yaml";

pub const POINT_CLOUD2: &str = "sensor_msgs/msg/PointCloud2";
pub const IMAGE: &str = "sensor_msgs/msg/Image";
pub const OCCUPANCY_GRID: &str = "nav_msgs/msg/OccupancyGrid";

fn read(root: &Path, rel: &str) -> String {
    std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// The message type an rviz2 display class subscribes to; None for displays without a topic of
/// their own (grid, group) and for classes these layouts do not use.
fn rviz_message_type(class: &str) -> Option<&'static str> {
    match class {
        "rviz_default_plugins/PointCloud2" => Some(POINT_CLOUD2),
        "rviz_default_plugins/Image" => Some(IMAGE),
        "rviz_default_plugins/Map" => Some(OCCUPANCY_GRID),
        _ => None,
    }
}

/// Every display of the rviz2 config, the members of groups (`rviz_common/Group`, whose
/// displays are under its own `Displays`) in place of the group.
pub fn rviz_displays(root: &Path) -> Vec<serde_yaml::Value> {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(&read(root, RVIZ)).unwrap_or_else(|e| panic!("{RVIZ} is not YAML: {e}"));
    let displays = doc
        .get("Visualization Manager")
        .and_then(|m| m.get("Displays"))
        .and_then(|d| d.as_sequence())
        .unwrap_or_else(|| panic!("{RVIZ}: no `Visualization Manager: Displays:` list"));
    let mut out = Vec::new();
    flatten_groups(displays, &mut out);
    out
}

fn flatten_groups(displays: &[serde_yaml::Value], out: &mut Vec<serde_yaml::Value>) {
    for d in displays {
        if class_of(d) == "rviz_common/Group" {
            let inner = d.get("Displays").and_then(|v| v.as_sequence()).unwrap_or_else(|| panic!("{RVIZ}: a group without Displays"));
            flatten_groups(inner, out);
        } else {
            out.push(d.clone());
        }
    }
}

pub fn class_of(display: &serde_yaml::Value) -> &str {
    display.get("Class").and_then(|c| c.as_str()).unwrap_or_else(|| panic!("{RVIZ}: a display without a Class: {display:?}"))
}

/// The topic a display subscribes to: rviz2 saves it as a mapping (the name under `Value`, the
/// QoS beside it); older files give the bare name.
pub fn topic_of(display: &serde_yaml::Value) -> Option<String> {
    let t = display.get("Topic")?;
    let name = t.get("Value").unwrap_or(t).as_str();
    Some(name.unwrap_or_else(|| panic!("{RVIZ}: {}: Topic is not a name: {t:?}", class_of(display))).to_string())
}

/// Topic -> message type of every display of the rviz2 config that has a topic. Panics on a
/// display with a topic whose class is not one of [`rviz_message_type`]'s, and on a topic shown
/// with two types.
pub fn rviz_topics(root: &Path) -> BTreeMap<String, &'static str> {
    let mut out = BTreeMap::new();
    for d in rviz_displays(root) {
        let Some(topic) = topic_of(&d) else { continue };
        let class = class_of(&d);
        let ty = rviz_message_type(class).unwrap_or_else(|| panic!("{RVIZ}: {topic}: display class {class} is not one this test knows the message type of"));
        if let Some(before) = out.insert(topic.clone(), ty) {
            assert_eq!(before, ty, "{RVIZ}: {topic} shown as {before} and as {ty}");
        }
    }
    out
}

/// The Foxglove layout, parsed.
pub fn foxglove_layout(root: &Path) -> serde_json::Value {
    serde_json::from_str(&read(root, FOXGLOVE)).unwrap_or_else(|e| panic!("{FOXGLOVE} is not JSON: {e}"))
}

/// Every topic the Foxglove layout names: the keys of each 3D panel's `topics` settings, and
/// each Image panel's `imageMode.imageTopic`. Panics on a panel type it does not know: a topic
/// it held would go unchecked.
pub fn foxglove_topics(root: &Path) -> BTreeSet<String> {
    let doc = foxglove_layout(root);
    let panels = doc["configById"].as_object().unwrap_or_else(|| panic!("{FOXGLOVE}: no configById object"));
    let mut out = BTreeSet::new();
    for (id, config) in panels {
        // Foxglove's panel ids are `<panel type>!<unique suffix>`.
        let kind = id.split('!').next().unwrap_or_default();
        match kind {
            "3D" => {
                let topics = config["topics"].as_object().unwrap_or_else(|| panic!("{FOXGLOVE}: {id} has no topics settings"));
                out.extend(topics.keys().cloned());
            }
            "Image" => {
                let t = config["imageMode"]["imageTopic"].as_str().unwrap_or_else(|| panic!("{FOXGLOVE}: {id} has no imageMode.imageTopic"));
                out.insert(t.to_string());
            }
            _ => panic!("{FOXGLOVE}: panel {id}: a type this test does not read the topics of"),
        }
    }
    // Every panel the layout tree places must be configured, and every configured one placed.
    let mut placed = BTreeSet::new();
    collect_layout(&doc["layout"], &mut placed);
    let configured: BTreeSet<String> = panels.keys().cloned().collect();
    assert_eq!(placed, configured, "{FOXGLOVE}: the layout tree's panels and configById differ");
    out
}

fn collect_layout(node: &serde_json::Value, out: &mut BTreeSet<String>) {
    match node {
        serde_json::Value::String(id) => {
            out.insert(id.clone());
        }
        serde_json::Value::Object(split) => {
            assert!(
                matches!(split.get("direction").and_then(|d| d.as_str()), Some("row" | "column")),
                "{FOXGLOVE}: a layout split without direction row or column: {node}"
            );
            for side in ["first", "second"] {
                collect_layout(split.get(side).unwrap_or_else(|| panic!("{FOXGLOVE}: a layout split without `{side}`: {node}")), out);
            }
        }
        _ => panic!("{FOXGLOVE}: layout node {node} is neither a panel id nor a split"),
    }
}

/// A topic name resolved for the node `sptr` in namespace `/`: `~/x` is `/sptr/x`, a relative
/// name is in the root namespace.
fn resolve(name: &str) -> String {
    if let Some(private) = name.strip_prefix("~/") {
        format!("{NODE}/{private}")
    } else if name.starts_with('/') {
        name.to_string()
    } else {
        format!("/{name}")
    }
}

/// The map classes of the camera branch's BEV map model: the one [`CAMERA_PARAMS`] names.
pub fn map_classes(root: &Path) -> Vec<String> {
    let params = sptr::frame::params::NodeParams::load(&root.join(CAMERA_PARAMS)).expect("the camera params file loads");
    let model = root.join("config").join(&params.camera.model_config);
    let text = std::fs::read_to_string(&model).unwrap_or_else(|e| panic!("read {}: {e}", model.display()));
    sptr::models::bevfusion::seg::parse_seg_yaml(&text, &model.display().to_string())
        .expect("the camera params file names a BEVFusion seg model")
        .classes
}

/// What the layouts must show, topic -> message type, resolved for the default launch: the
/// labeled cloud and the three BEV grids under `config/perception.yaml`'s `topics:` names, and
/// the camera branch's map (one OccupancyGrid per class of `map_classes`, and the colour image).
/// The map's `map_bits` (a bit per class in a mono8 image) is left out: a viewer shows it as a
/// near-black picture.
pub fn expected_topics(root: &Path, map_classes: &[String]) -> BTreeMap<String, &'static str> {
    let p = sptr::frame::params::NodeParams::load(&root.join("config/perception.yaml")).expect("config/perception.yaml loads");
    let t = &p.topics;
    let mut out = BTreeMap::from([
        (resolve(&t.output_points), POINT_CLOUD2),
        (resolve(&t.bev_labels), IMAGE),
        (resolve(&t.bev_labels_color), IMAGE),
        (resolve(&t.bev_occupancy), OCCUPANCY_GRID),
        (resolve("~/output/bev/map_color"), IMAGE),
    ]);
    for c in map_classes {
        let token = sptr::frame::map_messages::class_topic_token(c);
        out.insert(resolve(&format!("~/output/bev/map/{token}")), OCCUPANCY_GRID);
    }
    out
}

/// `topic` (a name under [`NODE`]) as the node named `sptr` in namespace `/<ns>` publishes it.
pub fn in_namespace(topic: &str, ns: &str) -> String {
    let rest = topic
        .strip_prefix(NODE)
        .filter(|r| r.starts_with('/'))
        .unwrap_or_else(|| panic!("{topic} is not a topic of the node {NODE}"));
    format!("/{}{NODE}{rest}", ns.trim_matches('/'))
}
