//! Replay's camera branch: the cameras' images and CameraInfos and `/tf`, `/tf_static` read from
//! the bag in timestamp order with the LiDAR clouds, through the node's own
//! [`CameraBranch`] (same sync rule, calibration sources, masking and counts), and for each
//! replayed cloud the frame's camera inputs, its per-camera status and its stage times.
//!
//! With a BEV map model ([`BevMapModel`]) the map of each frame is written to the output bag on
//! the node's topics (`/sptr/output/bev/map/<class>`, `/sptr/output/bev/map_bits`,
//! `/sptr/output/bev/map_color`) and drawn to `bev/map_NNNNNN.png` for chosen frames. Always:
//! `cameras.json`, per camera the frames it was used in and masked out of (by reason), and per
//! frame every camera's status and image age.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use super::map_eval::MapGroundTruth;
use super::ReplayError;
use crate::msgs::cdr::{CameraInfo, CdrMessage, CompressedImage, Image, TfMessage};
use crate::bag::{Bag, BagWriter, RawMessage};
use crate::frame::frame_processor::CameraOutput;
use crate::frame::cameras::{BranchConfig, CameraBranch, CameraImage, CameraStatus, MapGraphCounts};
use crate::ops::label_grid::cpu::{BevGrids, NO_DATA};
use crate::frame::map_messages::{class_topic_token, MapMessages, MapStyle};
use crate::frame::params::{CameraInput, ImageTransport};

/// The TF topics replay reads.
pub const TF_TOPIC: &str = "/tf";
pub const TF_STATIC_TOPIC: &str = "/tf_static";

/// The camera branch of a replay: what to read and how.
#[derive(Debug, Clone)]
pub struct CameraReplayOptions {
    /// Per camera its topics (absolute: [`absolute_topic`] of the node's names).
    pub inputs: Vec<CameraInput>,
    pub branch: BranchConfig,
    /// The BEV map model's classes (its YAML's `map_classes`), in output order.
    pub map_classes: Vec<String>,
    /// How maps are drawn (a threshold and a colour per class), for a model's maps.
    pub map_style: Option<MapStyle>,
    /// A directory of ground-truth masks ([`super::map_eval`]) to evaluate the model's maps on.
    pub map_ground_truth: Option<std::path::PathBuf>,
    /// The node's `camera.beside_lidar`: the frame processor's schedule.
    pub beside_lidar: bool,
}

/// A node-relative topic name as the node `sptr` in namespace `/` resolves it: `~/x` is
/// `/sptr/x`, a relative `x` is `/x`.
pub fn absolute_topic(topic: &str) -> String {
    if let Some(rest) = topic.strip_prefix("~/") {
        format!("/sptr/{rest}")
    } else if topic.starts_with('/') {
        topic.to_string()
    } else {
        format!("/{topic}")
    }
}

/// The node's map topics: per class, then the bit and colour images.
pub fn map_topics(classes: &[String]) -> (Vec<String>, String, String) {
    (
        classes.iter().map(|c| format!("/sptr/output/bev/map/{}", class_topic_token(c))).collect(),
        "/sptr/output/bev/map_bits".to_string(),
        "/sptr/output/bev/map_color".to_string(),
    )
}

#[derive(Debug, Clone, Copy)]
enum Role {
    Image(usize, ImageTransport),
    Info(usize),
    Tf { is_static: bool },
}

/// One frame's cameras, for `cameras.json`.
#[derive(Debug, Clone, Serialize)]
struct FrameCameras {
    frame: u64,
    stamp_ns: i64,
    /// Per camera: status name.
    status: Vec<&'static str>,
    /// Per camera: cloud stamp − image stamp, ms (null without an image).
    age_ms: Vec<Option<f64>>,
    calibration_changed: bool,
    /// With a BEV map model: whether this frame got a map (null without a model, or for a frame
    /// the LiDAR path skipped), and why not.
    map: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    map_error: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct CameraSummary {
    name: String,
    image_topic: String,
    camera_info_topic: String,
    frames: HashMap<&'static str, u64>,
    masked: u64,
    camera_info_errors: u64,
    calibration: String,
    last_problem: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
struct CamerasJson {
    max_camera_lidar_delay_s: f64,
    calibration_changes: u64,
    bad_messages: u64,
    /// Frames with a BEV map, frames whose model forward failed (no map), the last failure.
    bev_maps: u64,
    bev_map_errors: u64,
    last_bev_map_error: Option<String>,
    notes: Vec<String>,
    cameras: Vec<CameraSummary>,
    frames: Vec<FrameCameras>,
}

/// Per camera counts of a finished replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CameraOutcome {
    pub name: String,
    pub used: u64,
    pub masked: u64,
    /// `(status name, frames)` for every masked status with frames.
    pub masked_by: Vec<(&'static str, u64)>,
}

/// The camera branch during a replay.
pub struct CameraReplay {
    opts: CameraReplayOptions,
    branch: CameraBranch,
    roles: HashMap<String, Role>,
    frames: Vec<FrameCameras>,
    notes: Vec<String>,
    bad_messages: u64,
    /// Frames with a map, and frames whose model forward failed (dropped, the replay goes on).
    maps: u64,
    map_errors: u64,
    last_map_error: Option<String>,
    /// The map model's CUDA graph counts after the last frame (`camera.cuda_graph`).
    map_graph: Option<MapGraphCounts>,
    /// The map evaluation, when the options name ground truth and a model runs.
    pub(crate) ground_truth: Option<MapGroundTruth>,
}

impl CameraReplay {
    /// Checks the camera topics against `bag`: a topic the bag lacks is noted (that camera will
    /// be `missing`), a topic of another type is an error.
    pub fn new(opts: &CameraReplayOptions, bag: &Bag) -> Result<Self, ReplayError> {
        let branch = CameraBranch::new(opts.branch.clone()).map_err(|e| ReplayError::Setup(format!("camera branch: {e}")))?;
        let mut roles = HashMap::new();
        let mut notes = Vec::new();
        let expect = |topic: &str, want: &str, role: Role, roles: &mut HashMap<String, Role>, notes: &mut Vec<String>| -> Result<(), ReplayError> {
            match bag.topics().iter().find(|t| t.name == topic) {
                None => {
                    notes.push(format!("no topic {topic} ({want}) in the bag"));
                    Ok(())
                }
                Some(t) if t.type_name != want => Err(ReplayError::Topic {
                    bag: bag.path().to_path_buf(),
                    reason: format!("topic {topic} has type {}, expected {want}", t.type_name),
                }),
                Some(_) => {
                    roles.insert(topic.to_string(), role);
                    Ok(())
                }
            }
        };
        for (i, c) in opts.inputs.iter().enumerate() {
            let want = match c.transport {
                ImageTransport::Raw => Image::TYPE_NAME,
                ImageTransport::Compressed => CompressedImage::TYPE_NAME,
            };
            expect(&c.image_topic, want, Role::Image(i, c.transport), &mut roles, &mut notes)?;
            expect(&c.camera_info_topic, CameraInfo::TYPE_NAME, Role::Info(i), &mut roles, &mut notes)?;
        }
        for (topic, is_static) in [(TF_TOPIC, false), (TF_STATIC_TOPIC, true)] {
            if bag.topics().iter().any(|t| t.name == topic) {
                expect(topic, TfMessage::TYPE_NAME, Role::Tf { is_static }, &mut roles, &mut notes)?;
            }
        }
        Ok(CameraReplay {
            opts: opts.clone(),
            branch,
            roles,
            frames: Vec::new(),
            notes,
            bad_messages: 0,
            maps: 0,
            map_errors: 0,
            map_graph: None,
            last_map_error: None,
            ground_truth: None,
        })
    }

    /// Starts the map evaluation when the options name ground truth (called once a model runs).
    pub fn start_evaluation(&mut self) -> Result<(), ReplayError> {
        if let Some(dir) = &self.opts.map_ground_truth {
            self.ground_truth = Some(MapGroundTruth::new(dir, &self.opts.map_classes).map_err(ReplayError::Setup)?);
        }
        Ok(())
    }

    /// Counts the last frame's map (`Ok`) or the model's failure on it, in the counts and the
    /// frame's record.
    pub fn count_map(&mut self, r: Result<(), String>) {
        let frame = self.frames.last_mut();
        match r {
            Ok(()) => {
                self.maps += 1;
                if let Some(f) = frame {
                    f.map = Some(true);
                }
            }
            Err(e) => {
                self.map_errors += 1;
                if let Some(f) = frame {
                    f.map = Some(false);
                    f.map_error = Some(e.clone());
                }
                self.last_map_error = Some(e);
            }
        }
    }

    /// Keeps the map model's CUDA graph counts of the last frame (`None`: no graph).
    pub fn count_graph(&mut self, counts: Option<MapGraphCounts>) {
        if counts.is_some() {
            self.map_graph = counts;
        }
    }

    /// The cameras' part of `report.json` (key `cameras`) and `report.md`: the maps made and
    /// failed, and per camera the frames used and masked by reason.
    pub fn report_json(&self, model: bool) -> serde_json::Value {
        let cameras: Vec<serde_json::Value> = self
            .outcome()
            .into_iter()
            .map(|c| {
                let by: serde_json::Map<String, serde_json::Value> = c.masked_by.iter().map(|(k, n)| (k.to_string(), (*n).into())).collect();
                serde_json::json!({ "name": c.name, "used": c.used, "masked": c.masked, "masked_by": by })
            })
            .collect();
        serde_json::json!({
            "bev_map_model": model,
            "bev_maps": self.maps,
            "bev_map_errors": self.map_errors,
            "last_bev_map_error": self.last_map_error,
            "bev_map_cuda_graph": graph_json(self.map_graph.as_ref()),
            "cameras": cameras,
        })
    }

    /// [`CameraReplay::report_json`] as a Markdown section.
    pub fn report_markdown(&self, model: bool) -> String {
        let mut m = String::from("\n## Cameras\n\n");
        if model {
            m.push_str(&format!("- BEV maps: {} made, {} failed", self.maps, self.map_errors));
            match &self.last_map_error {
                Some(e) => m.push_str(&format!(" (**the last failure**: {e})\n")),
                None => m.push('\n'),
            }
            if let Some(line) = graph_markdown(self.map_graph.as_ref()) {
                m.push_str(&line);
            }
        } else {
            m.push_str("- no BEV map model: the cameras were synchronised, decoded and counted only\n");
        }
        m.push_str("\n| camera | used | masked | why |\n| --- | ---: | ---: | --- |\n");
        for c in self.outcome() {
            let why: Vec<String> = c.masked_by.iter().map(|(r, n)| format!("{r} {n}")).collect();
            m.push_str(&format!("| {} | {} | {} | {} |\n", c.name, c.used, c.masked, why.join(", ")));
        }
        m
    }

    /// Frames with a map, frames whose map failed.
    pub fn map_counts(&self) -> (u64, u64) {
        (self.maps, self.map_errors)
    }

    /// The topics to read besides the LiDAR's.
    pub fn topics(&self) -> Vec<String> {
        let mut t: Vec<String> = self.roles.keys().cloned().collect();
        t.sort();
        t
    }

    /// Whether `topic` is one of the camera branch's.
    pub fn wants(&self, topic: &str) -> bool {
        self.roles.contains_key(topic)
    }

    /// Feeds one message; a message that cannot be decoded is counted and returned as a note
    /// (the node logs and drops it).
    pub fn on_message(&mut self, msg: &RawMessage) -> Option<String> {
        let role = *self.roles.get(&msg.topic)?;
        let what = |e: String| format!("{} at {} ns: {e}", msg.topic, msg.timestamp_ns);
        let r: Result<(), String> = match role {
            Role::Image(i, ImageTransport::Raw) => Image::from_cdr(&msg.data).map(|m| {
                self.branch.on_image(i, CameraImage::Raw(m));
            }).map_err(|e| e.to_string()),
            Role::Image(i, ImageTransport::Compressed) => CompressedImage::from_cdr(&msg.data).map(|m| {
                self.branch.on_image(i, CameraImage::Compressed(m));
            }).map_err(|e| e.to_string()),
            Role::Info(i) => CameraInfo::from_cdr(&msg.data)
                .map_err(|e| e.to_string())
                .and_then(|m| self.branch.on_camera_info(i, &m).map_err(|e| e.to_string())),
            Role::Tf { is_static } => TfMessage::from_cdr(&msg.data).map_err(|e| e.to_string()).and_then(|m| {
                let errors = self.branch.on_tf(&m, is_static);
                if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
            }),
        };
        r.err().map(|e| {
            self.bad_messages += 1;
            what(e)
        })
    }

    /// The branch, for the frame processor's camera path.
    pub fn branch_mut(&mut self) -> &mut CameraBranch {
        &mut self.branch
    }

    /// Records frame `index`'s cameras as the frame processor's camera path left them (a camera
    /// whose JPEG the model could not decode is a decode error in the record and the counts).
    pub fn record(&mut self, index: u64, stamp_ns: i64, out: &CameraOutput) {
        self.frames.push(FrameCameras {
            frame: index,
            stamp_ns,
            status: out.cameras.iter().map(|c| c.status.name()).collect(),
            age_ms: out.cameras.iter().map(|c| c.age_ns.map(|a| a as f64 * 1e-6)).collect(),
            calibration_changed: out.calibration_changed,
            map: None,
            map_error: None,
        });
    }

    /// Leaves JPEGs to a map model that decodes them itself ([`CameraBranch::set_defer_jpeg`]).
    pub fn set_defer_jpeg(&mut self, defer: bool) {
        self.branch.set_defer_jpeg(defer);
    }

    /// Per camera counts so far.
    pub fn outcome(&self) -> Vec<CameraOutcome> {
        self.branch
            .names()
            .iter()
            .zip(self.branch.stats())
            .map(|(name, s)| CameraOutcome {
                name: name.clone(),
                used: s.count(CameraStatus::Used),
                masked: s.masked(),
                masked_by: CameraStatus::ALL.iter().filter(|&&st| st != CameraStatus::Used && s.count(st) > 0).map(|&st| (st.name(), s.count(st))).collect(),
            })
            .collect()
    }

    /// Notes for the progress output (topics the bag lacks).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Writes `cameras.json` into `out`.
    pub fn write_summary(&self, out: &Path) -> Result<(), ReplayError> {
        let cameras = self
            .opts
            .inputs
            .iter()
            .zip(self.branch.stats())
            .map(|(c, s)| CameraSummary {
                name: c.name.clone(),
                image_topic: c.image_topic.clone(),
                camera_info_topic: c.camera_info_topic.clone(),
                frames: CameraStatus::ALL.iter().map(|&st| (st.name(), s.count(st))).collect(),
                masked: s.masked(),
                camera_info_errors: s.camera_info_errors,
                calibration: s.calibration.clone(),
                last_problem: s.last_problem.clone(),
            })
            .collect();
        let json = CamerasJson {
            max_camera_lidar_delay_s: self.opts.branch.max_camera_lidar_delay_s,
            calibration_changes: self.branch.calibration_changes(),
            bad_messages: self.bad_messages,
            bev_maps: self.maps,
            bev_map_errors: self.map_errors,
            last_bev_map_error: self.last_map_error.clone(),
            notes: self.notes.clone(),
            cameras,
            frames: self.frames.clone(),
        };
        let path = out.join(CAMERAS_FILE);
        let text = serde_json::to_string_pretty(&json).map_err(|e| ReplayError::Setup(format!("cameras.json: {e}")))?;
        std::fs::write(&path, text).map_err(|source| ReplayError::Io { path, source })
    }
}

/// The per-camera summary file of a replay with cameras.
pub const CAMERAS_FILE: &str = "cameras.json";

/// Adds the map topics to the output bag.
pub fn add_map_topics(writer: &mut BagWriter, classes: &[String]) -> Result<(), ReplayError> {
    let (grids, bits, color) = map_topics(classes);
    for t in &grids {
        writer.add_topic(t, "nav_msgs/msg/OccupancyGrid")?;
    }
    writer.add_topic(&bits, "sensor_msgs/msg/Image")?;
    writer.add_topic(&color, "sensor_msgs/msg/Image")?;
    Ok(())
}

/// Writes a frame's map messages at `time_ns`.
pub fn write_map(writer: &mut BagWriter, classes: &[String], m: &MapMessages, time_ns: i64) -> Result<(), ReplayError> {
    let (grids, bits, color) = map_topics(classes);
    let cdr = |r: Result<Vec<u8>, crate::msgs::cdr::CdrError>| r.map_err(|e| ReplayError::Setup(format!("encoding the BEV map: {e}")));
    for (t, g) in grids.iter().zip(&m.grids) {
        writer.write(t, time_ns, &cdr(g.to_cdr(true))?)?;
    }
    writer.write(&bits, time_ns, &cdr(m.bits.to_cdr(true))?)?;
    writer.write(&color, time_ns, &cdr(m.color.to_cdr(true))?)?;
    Ok(())
}

/// The map's colour image as [`BevGrids`] for [`super::write_bev_png`]: each cell labelled with
/// the class whose colour it shows (the last class at or above its threshold), no data where none.
pub fn map_as_grids(m: &MapMessages) -> BevGrids {
    let (w, h) = (m.bits.width as usize, m.bits.height as usize);
    let labels = m.bits.data.iter().map(|&b| if b == 0 { NO_DATA } else { 7 - b.leading_zeros() as u8 }).collect();
    BevGrids { width: w, height: h, labels, rgb: m.color.data.clone(), occupancy: vec![-1; w * h] }
}

/// The CUDA graph counts in `report.json` (null: the map model ran kernel by kernel).
fn graph_json(g: Option<&MapGraphCounts>) -> serde_json::Value {
    match g {
        None => serde_json::Value::Null,
        Some(g) => serde_json::json!({
            "captures": g.captures,
            "replays": g.replays,
            "refused": g.refused,
            "last_refusal": g.last_refusal,
        }),
    }
}

/// The CUDA graph's line of `report.md`; a refused capture is bold (those frames ran kernel by
/// kernel: slower, the same maps).
fn graph_markdown(g: Option<&MapGraphCounts>) -> Option<String> {
    let g = g?;
    let mut line = format!("- BEV map model as a CUDA graph: {} captured, {} frames replayed", g.captures, g.replays);
    if g.refused > 0 {
        line.push_str(&format!(", **{} captures refused** (those frames ran kernel by kernel)", g.refused));
        if let Some(why) = &g.last_refusal {
            line.push_str(&format!("; the last: {why}"));
        }
    }
    line.push('\n');
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_counts_the_map_graph_and_its_refusals() {
        assert_eq!(graph_json(None), serde_json::Value::Null);
        assert_eq!(graph_markdown(None), None);
        let ok = MapGraphCounts { captures: 1, replays: 9, refused: 0, last_refusal: None };
        assert_eq!(graph_json(Some(&ok))["replays"], 9);
        assert_eq!(graph_markdown(Some(&ok)).unwrap(), "- BEV map model as a CUDA graph: 1 captured, 9 frames replayed\n");
        let refused = MapGraphCounts { captures: 0, replays: 0, refused: 3, last_refusal: Some("capture unsupported".into()) };
        let j = graph_json(Some(&refused));
        assert_eq!((j["refused"].as_u64(), j["last_refusal"].as_str()), (Some(3), Some("capture unsupported")));
        let md = graph_markdown(Some(&refused)).unwrap();
        assert!(md.contains("**3 captures refused**") && md.contains("the last: capture unsupported"), "{md}");
    }

    #[test]
    fn topics_resolve_as_the_node_sptr_in_the_root_namespace() {
        assert_eq!(absolute_topic("~/input/cameras/CAM_FRONT/image/compressed"), "/sptr/input/cameras/CAM_FRONT/image/compressed");
        assert_eq!(absolute_topic("/cam/image"), "/cam/image");
        assert_eq!(absolute_topic("cam/image"), "/cam/image");
        let (g, b, c) = map_topics(&["drivable_area".into(), "ped crossing".into()]);
        assert_eq!(g, ["/sptr/output/bev/map/drivable_area", "/sptr/output/bev/map/ped_crossing"]);
        assert_eq!((b.as_str(), c.as_str()), ("/sptr/output/bev/map_bits", "/sptr/output/bev/map_color"));
    }

    #[test]
    fn map_png_labels_are_the_highest_set_bit() {
        let img = |data: Vec<u8>| crate::msgs::cdr::Image { width: 3, height: 1, encoding: "mono8".into(), step: 3, data, ..Default::default() };
        let m = MapMessages { grids: vec![], bits: img(vec![0, 0b101, 0b1]), color: img(vec![0; 9]) };
        let g = map_as_grids(&m);
        assert_eq!(g.labels, vec![NO_DATA, 2, 0]);
        assert_eq!((g.width, g.height), (3, 1));
    }
}
