//! The node's parameters file (`config/perception.yaml`, `sptr: ros__parameters:`): parsed with
//! serde_yaml into structs that deny unknown keys, every value range-checked, every error naming
//! the file and the key. The node, replay and the benches read the same file.

use serde::Deserialize;
use std::path::Path;

use crate::error::{value_err, ConfigError};

pub use crate::device::DeviceChoice;


/// `sptr: ros__parameters:` of `config/perception.yaml`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeParams {
    pub device: DeviceChoice,
    pub model: ModelParams,
    pub input: InputParams,
    pub bev: BevParams,
    pub budget: BudgetParams,
    /// What a CUDA error while processing a frame does (default `exit`).
    #[serde(default)]
    pub on_cuda_error: CudaErrorPolicy,
    /// What a frame whose activations left the FP16 range gives (default `drop`).
    #[serde(default)]
    pub on_overflow: OverflowPolicy,
    /// The CUDA network's precision (`fp16`, `bf16`, `auto`), overriding the model YAML's
    /// `precision`; absent: the YAML's (see [`crate::device::storage::Precision`]).
    #[serde(default)]
    pub precision: Option<crate::device::storage::Precision>,
    /// Topic names (default: the private `~/...` names; remapping works on either).
    #[serde(default)]
    pub topics: TopicParams,
    /// The camera branch (used when `input.cameras` is not empty); default: none configured.
    #[serde(default)]
    pub camera: CameraParams,
    /// The fusion model's LiDAR input.
    #[serde(default)]
    pub lidar: LidarParams,
}

/// `on_cuda_error`: what the node does when a frame fails with a CUDA error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CudaErrorPolicy {
    /// Report it in diagnostics (ERROR), drop the frame, go on with the next one.
    Recover,
    /// Log it and exit with a non-zero status (a supervisor, e.g. launch `respawn`, restarts
    /// the node with a fresh CUDA context: most CUDA errors leave the context unusable).
    #[default]
    Exit,
}

/// `on_overflow`: what a frame gives whose activations left FP16's range on the GPU (or were
/// NaN/inf on the CPU; see `device::range_guard`). Either way the frame is an ERROR in diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OverflowPolicy {
    /// Publish nothing for the frame (counted as rejected, reason `overflow`).
    #[default]
    Drop,
    /// Publish the labeled cloud with every `probability` 0 (class ids as computed) and BEV
    /// grids with every cell unknown, for consumers that must get a message per cloud.
    ZeroProbability,
}

impl OverflowPolicy {
    /// The parameter value.
    pub fn name(self) -> &'static str {
        match self {
            OverflowPolicy::Drop => "drop",
            OverflowPolicy::ZeroProbability => "zero_probability",
        }
    }
}

/// `topics:` names of the node's topics (relative and `~/` names resolve as usual in ROS 2).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TopicParams {
    pub input_points: String,
    pub output_points: String,
    pub bev_labels: String,
    pub bev_labels_color: String,
    pub bev_occupancy: String,
}

impl Default for TopicParams {
    fn default() -> Self {
        TopicParams {
            input_points: "~/input/points".into(),
            output_points: "~/output/points".into(),
            bev_labels: "~/output/bev/labels".into(),
            bev_labels_color: "~/output/bev/labels_color".into(),
            bev_occupancy: "~/output/bev/occupancy".into(),
        }
    }
}

impl TopicParams {
    /// `(parameter name, topic)` for every topic.
    pub fn all(&self) -> [(&'static str, &str); 5] {
        [
            ("topics.input_points", &self.input_points),
            ("topics.output_points", &self.output_points),
            ("topics.bev_labels", &self.bev_labels),
            ("topics.bev_labels_color", &self.bev_labels_color),
            ("topics.bev_occupancy", &self.bev_occupancy),
        ]
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelParams {
    /// Model YAML; a relative path is resolved against the params file's directory.
    pub config: String,
    /// safetensors weights; empty means none given (the node refuses to start without them).
    pub weights: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputParams {
    pub qos_depth: usize,
    /// Camera names in the BEV model's camera order (nuScenes: CAM_FRONT, CAM_FRONT_RIGHT,
    /// CAM_FRONT_LEFT, CAM_BACK, CAM_BACK_LEFT, CAM_BACK_RIGHT); each names its topics through
    /// the `camera` section's templates. Empty: no camera branch.
    pub cameras: Vec<String>,
}

/// How a camera's images arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageTransport {
    /// `sensor_msgs/Image` on the image topic.
    Raw,
    /// `sensor_msgs/CompressedImage` (JPEG or PNG) on `<image topic>/compressed`, the
    /// image_transport convention.
    Compressed,
}

/// Which CameraInfo matrix gives the intrinsics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntrinsicsFrom {
    /// `K` (the raw, distorted image's camera matrix).
    K,
    /// `P` (fx = P[0], fy = P[5], cx = P[2], cy = P[6]): for rectified images.
    P,
}

/// `camera.overrides.<name>`: one camera's settings where they differ from the section's.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CameraOverride {
    pub image_topic: Option<String>,
    pub camera_info_topic: Option<String>,
    pub transport: Option<ImageTransport>,
    pub intrinsics: Option<IntrinsicsFrom>,
}

/// `camera:` the camera branch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CameraParams {
    /// BEVFusion seg model YAML (`config/models/bevfusion_seg_*.yaml`); relative to the params
    /// file. Empty: no BEV map (the cameras are still synchronised, decoded and diagnosed).
    pub model_config: String,
    /// Its safetensors weights; relative to the params file.
    pub model_weights: String,
    /// Default transport of every camera.
    pub transport: ImageTransport,
    /// Default intrinsics source of every camera.
    pub intrinsics: IntrinsicsFrom,
    /// Image topic template: `{camera}` is replaced by the camera's name (for `compressed`,
    /// `/compressed` is appended).
    pub image_topic: String,
    /// CameraInfo topic template (`{camera}` as above).
    pub camera_info_topic: String,
    /// Seconds a camera's latest image may differ from the cloud's stamp (either way) and still
    /// be used; beyond, the camera is masked for that frame (autoware_bevfusion's 0.12 s).
    pub max_camera_lidar_delay: f64,
    /// The largest |d| (each coefficient of a CameraInfo's distortion `d`) that still counts as
    /// an undistorted image when the intrinsics come from `K`. Beyond it the camera is masked
    /// as `distorted` (the model's geometry is a pinhole's; sptr does not undistort): feed
    /// rectified images (`image_rect`) with `intrinsics: P`, whose `d` is not read.
    pub max_distortion: f64,
    /// Calibration file (docs/cameras.md, "Calibration file"): extrinsics where TF has none,
    /// intrinsics until a CameraInfo arrives. Empty: TF and CameraInfo only. Relative to the
    /// params file.
    pub calibration_file: String,
    /// Per class of the BEV model, the probability at or above which a cell is that class in the
    /// mono8 and rgb8 map images; empty: 0.5 for every class.
    pub map_thresholds: Vec<f64>,
    /// Per camera name: settings that differ from the defaults above.
    pub overrides: std::collections::BTreeMap<String, CameraOverride>,
    /// The node runs each camera frame (host part, BEV map model, map messages) on a thread
    /// beside the LiDAR path: on one GPU the two models overlap, the whole frame ends sooner
    /// (H100 node, p50: 16.8 ms instead of 23.0) but the LiDAR outputs come later (15.3 ms, where
    /// the LiDAR stage alone takes 8.6; docs/node.md, "The node over DDS with cameras").
    /// `false`: after the LiDAR outputs, on the processing thread.
    pub beside_lidar: bool,
    /// The BEV map model's network replayed as a CUDA graph, captured on the first frame of each
    /// calibration, image size and set of masked cameras (the same probabilities, bit for bit;
    /// 1.02-1.03× faster on an H100; docs/cameras.md). A frame whose cameras differ from the
    /// captured graph's is captured again, so off (the default) suits rigs whose cameras drop
    /// in and out. No effect on the CPU.
    pub cuda_graph: bool,
}

impl Default for CameraParams {
    fn default() -> Self {
        CameraParams {
            model_config: String::new(),
            model_weights: String::new(),
            transport: ImageTransport::Compressed,
            intrinsics: IntrinsicsFrom::K,
            image_topic: "~/input/cameras/{camera}/image".into(),
            camera_info_topic: "~/input/cameras/{camera}/camera_info".into(),
            max_camera_lidar_delay: 0.12,
            max_distortion: 1e-3,
            calibration_file: String::new(),
            map_thresholds: Vec::new(),
            overrides: Default::default(),
            beside_lidar: true,
            cuda_graph: false,
        }
    }
}

/// One camera's resolved settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CameraInput {
    pub name: String,
    /// The topic subscribed to (for `compressed`, with `/compressed`).
    pub image_topic: String,
    pub camera_info_topic: String,
    pub transport: ImageTransport,
    pub intrinsics: IntrinsicsFrom,
}

/// `lidar:` the fusion model's LiDAR input.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LidarParams {
    /// Clouds aggregated (upstream: 10), moved into the current frame by the ego motion from TF
    /// (`odom_frame` → the cloud's frame); without that TF only the current cloud is used.
    pub sweeps: usize,
    /// The odometry frame ego motion is looked up in.
    pub odom_frame: String,
}

impl Default for LidarParams {
    fn default() -> Self {
        LidarParams { sweeps: 1, odom_frame: "odom".into() }
    }
}

/// Whether `topic` is a ROS 2 topic name as the node accepts them.
fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && !topic.ends_with('/')
        && !topic.contains("//")
        && topic.chars().all(|c| c.is_ascii_alphanumeric() || "_/~{}".contains(c))
}

impl NodeParams {
    /// Every camera's topics and settings, in camera order (`camera` templates with the name
    /// substituted, then its `overrides`).
    pub fn camera_inputs(&self) -> Vec<CameraInput> {
        let c = &self.camera;
        self.input
            .cameras
            .iter()
            .map(|name| {
                let o = c.overrides.get(name).cloned().unwrap_or_default();
                let transport = o.transport.unwrap_or(c.transport);
                let base = o.image_topic.unwrap_or_else(|| c.image_topic.replace("{camera}", name));
                let image_topic = match transport {
                    ImageTransport::Raw => base,
                    ImageTransport::Compressed => format!("{base}/compressed"),
                };
                CameraInput {
                    name: name.clone(),
                    image_topic,
                    camera_info_topic: o.camera_info_topic.unwrap_or_else(|| c.camera_info_topic.replace("{camera}", name)),
                    transport,
                    intrinsics: o.intrinsics.unwrap_or(c.intrinsics),
                }
            })
            .collect()
    }

    /// The map thresholds for a model of `classes` classes (0.5 each when none are given).
    /// Errors when the count differs from the model's.
    pub fn map_thresholds(&self, classes: usize) -> Result<Vec<f32>, String> {
        let t = &self.camera.map_thresholds;
        if t.is_empty() {
            return Ok(vec![0.5; classes]);
        }
        if t.len() != classes {
            return Err(format!("parameter `camera.map_thresholds` has {} values but the BEV model has {classes} classes", t.len()));
        }
        Ok(t.iter().map(|&v| v as f32).collect())
    }

    /// Checks the camera and LiDAR sections (called by [`NodeParams::parse`]).
    fn validate_cameras(&self, file: &str) -> Result<(), ConfigError> {
        let names = &self.input.cameras;
        if names.len() > 32 {
            return Err(value_err(file, "input.cameras", format!("has {} cameras; at most 32 are supported", names.len())));
        }
        for (i, n) in names.iter().enumerate() {
            if n.is_empty() || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(value_err(file, "input.cameras", format!("camera name `{n}` must be letters, digits and `_` (it is part of topic names)")));
            }
            if names[..i].contains(n) {
                return Err(value_err(file, "input.cameras", format!("camera `{n}` is listed twice")));
            }
        }
        let c = &self.camera;
        if let Some(k) = c.overrides.keys().find(|k| !names.contains(k)) {
            return Err(value_err(file, &format!("camera.overrides.{k}"), format!("`{k}` is not a camera of input.cameras {names:?}")));
        }
        let d = c.max_camera_lidar_delay;
        if !(d.is_finite() && d >= 0.0) {
            return Err(value_err(file, "camera.max_camera_lidar_delay", format!("must be zero or positive seconds, got {d}")));
        }
        let m = c.max_distortion;
        if !(m.is_finite() && m >= 0.0) {
            return Err(value_err(file, "camera.max_distortion", format!("must be zero or positive (the largest |d| of an undistorted CameraInfo), got {m}")));
        }
        if let Some(t) = c.map_thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
            return Err(value_err(file, "camera.map_thresholds", format!("values must be in 0..=1, got {t}")));
        }
        if c.map_thresholds.len() > 8 {
            return Err(value_err(file, "camera.map_thresholds", format!("has {} values: the mono8 map image holds at most 8 classes", c.map_thresholds.len())));
        }
        for (key, template) in [("camera.image_topic", &c.image_topic), ("camera.camera_info_topic", &c.camera_info_topic)] {
            if !valid_topic(template) {
                return Err(value_err(file, key, format!("must be a ROS 2 topic name (letters, digits, `_`, `/`, `~`, `{{camera}}`), got `{template}`")));
            }
        }
        let inputs = self.camera_inputs();
        for (i, cam) in inputs.iter().enumerate() {
            for (what, topic) in [("image_topic", &cam.image_topic), ("camera_info_topic", &cam.camera_info_topic)] {
                if !valid_topic(topic) || topic.contains(['{', '}']) {
                    return Err(value_err(file, &format!("camera.overrides.{}.{what}", cam.name), format!("gives `{topic}`, not a ROS 2 topic name")));
                }
            }
            if let Some(other) = inputs[..i].iter().find(|o| o.image_topic == cam.image_topic || o.camera_info_topic == cam.camera_info_topic) {
                return Err(value_err(
                    file,
                    "camera.image_topic",
                    format!("cameras `{}` and `{}` get the same topic (use `{{camera}}` in the templates, or camera.overrides)", other.name, cam.name),
                ));
            }
        }
        if !(1..=20).contains(&self.lidar.sweeps) {
            return Err(value_err(file, "lidar.sweeps", format!("must be in 1..=20 (upstream: 10), got {}", self.lidar.sweeps)));
        }
        if self.lidar.odom_frame.is_empty() {
            return Err(value_err(file, "lidar.odom_frame", "must name a frame (e.g. odom)"));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BevParams {
    pub frame_id: String,
    /// `[xmin, ymin, xmax, ymax]` in metres, in `frame_id`.
    pub range: [f64; 4],
    pub resolution: f64,
    /// Class ids counted as obstacles in the occupancy grid.
    pub obstacle_classes: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetParams {
    pub processing_ms: f64,
    pub error_after_s: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RosParamsFile {
    sptr: RosParamsNode,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RosParamsNode {
    #[serde(rename = "ros__parameters")]
    ros_parameters: NodeParams,
}

/// `config/perception.yaml` as this build was made with it: the node's default parameters
/// (the launch file's default `params_file` is the installed copy of the same file; the node
/// has no defaults of its own). Built in so `sptr replay` without `--params` uses exactly them
/// wherever it runs, with no second list of defaults to drift.
pub const DEFAULT_NODE_PARAMS: &str = include_str!("../../config/perception.yaml");
/// Where [`DEFAULT_NODE_PARAMS`] comes from, for messages.
pub const DEFAULT_NODE_PARAMS_FILE: &str = "config/perception.yaml";

impl NodeParams {
    /// The node's default parameters: [`DEFAULT_NODE_PARAMS`], parsed and validated.
    pub fn defaults() -> Result<NodeParams, ConfigError> {
        NodeParams::parse(
            DEFAULT_NODE_PARAMS,
            &format!("{DEFAULT_NODE_PARAMS_FILE} (built into sptr)"),
        )
    }

    pub fn load(path: &Path) -> Result<NodeParams, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
        NodeParams::parse(&text, &file)
    }

    pub fn parse(text: &str, file: &str) -> Result<NodeParams, ConfigError> {
        let parsed: RosParamsFile = serde_yaml::from_str(text)
            .map_err(|e| ConfigError::Parse { file: file.to_string(), reason: e.to_string() })?;
        let p = parsed.sptr.ros_parameters;
        if p.model.config.is_empty() {
            return Err(value_err(file, "model.config", "must name a model YAML"));
        }
        if !(1..=100).contains(&p.input.qos_depth) {
            return Err(value_err(file, "input.qos_depth", format!("must be in 1..=100, got {}", p.input.qos_depth)));
        }
        let r = p.bev.range;
        if !(r.iter().all(|v| v.is_finite()) && r[0] < r[2] && r[1] < r[3]) {
            return Err(value_err(file, "bev.range", format!("must be [xmin, ymin, xmax, ymax] with min < max, got {r:?}")));
        }
        if !(p.bev.resolution.is_finite() && p.bev.resolution > 0.0) {
            return Err(value_err(file, "bev.resolution", format!("must be positive, got {}", p.bev.resolution)));
        }
        let cells = ((r[2] - r[0]) / p.bev.resolution).ceil() * ((r[3] - r[1]) / p.bev.resolution).ceil();
        if cells > 16.0e6 {
            return Err(value_err(file, "bev.resolution", format!("gives {cells} cells (over 16 million); use a coarser resolution or a smaller range")));
        }
        if !(p.budget.processing_ms.is_finite() && p.budget.processing_ms > 0.0) {
            return Err(value_err(file, "budget.processing_ms", format!("must be positive, got {}", p.budget.processing_ms)));
        }
        if !(p.budget.error_after_s.is_finite() && p.budget.error_after_s >= 0.0) {
            return Err(value_err(file, "budget.error_after_s", format!("must be zero or positive, got {}", p.budget.error_after_s)));
        }
        for (key, topic) in p.topics.all() {
            if !valid_topic(topic) {
                return Err(value_err(file, key, format!("must be a ROS 2 topic name (letters, digits, `_`, `/`, `~`), got `{topic}`")));
            }
        }
        p.validate_cameras(file)?;
        Ok(p)
    }
}
