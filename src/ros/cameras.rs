//! The node's camera branch: per camera an image subscription (`sensor_msgs/Image`, or
//! `CompressedImage` on `<image topic>/compressed`) and a CameraInfo subscription, sensor-data
//! QoS keep last 1; `/tf` and `/tf_static` as raw CDR (decoded by [`crate::msgs::cdr::TfMessage`]);
//! the subscription tasks only drop what arrives into an [`Inbox`] (newest image and CameraInfo
//! per camera, every TF message), so they never wait for the processing thread. After each
//! cloud's LiDAR outputs are out, the worker feeds the inbox to its [`CameraBranch`] and asks it
//! for the frame's camera inputs ([`CameraWorker::frame`]), runs the BEV map model
//! when there is one and publishes its map (`~/output/bev/map/<class>` OccupancyGrids,
//! `~/output/bev/map_bits` mono8, `~/output/bev/map_color` rgb8), and publishes the camera stage
//! times (`~/debug/stage_ms/camera_sync`, `camera_decode`, `sweeps`, `bev_map`) and
//! `~/debug/processing_time_ms/camera`.
//!
//! A bad camera message (undecodable image, zero intrinsics, bad transform) is logged
//! (rate-limited), counted in `/diagnostics` and dropped; the node keeps running. TF needs the
//! `tf2_msgs/msg/TFMessage` type support in the r2r build (a sourced ROS 2 install has it;
//! `scripts/ros_env.sh` builds it into the PyPI venv from `ros/interfaces/tf2_msgs`): without it
//! the node says so once (log and `/diagnostics` "camera tf") and takes extrinsics from
//! `camera.calibration_file`. With it, TF wins per camera wherever it connects the camera's
//! frame to the cloud's ([`crate::sensors::calib::rig`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use r2r::builtin_interfaces::msg::Time;
use r2r::diagnostic_msgs::msg::{DiagnosticArray, KeyValue};
use r2r::geometry_msgs::msg::{Point, Pose, Quaternion};
use r2r::nav_msgs::msg::{MapMetaData, OccupancyGrid};
use r2r::sensor_msgs::msg::{CameraInfo, CompressedImage, Image};
use r2r::std_msgs::msg::{Float64, Header};

use crate::msgs::cdr;
use crate::msgs::cdr::CdrMessage;
use crate::frame::cameras::{BranchConfig, CameraBranch, CameraImage, CameraStats, CameraStatus, MapGraphCounts};
use crate::frame::frame_processor::CameraOutput;
use crate::frame::map_messages::{class_topic_token, MapStyle};
use crate::frame::params::{CameraInput, ImageTransport, NodeParams};

/// At most one log line this often for dropped camera messages (all are counted).
const LOG_EVERY: Duration = Duration::from_secs(5);
/// TF messages kept between two frames (a 100 Hz /tf over 10 s without a cloud).
const MAX_PENDING_TF: usize = 1000;

fn cdr_header(h: &Header) -> cdr::Header {
    cdr::Header { stamp: cdr::Time { sec: h.stamp.sec, nanosec: h.stamp.nanosec }, frame_id: h.frame_id.clone() }
}

fn r2r_header(h: &cdr::Header) -> Header {
    Header { stamp: Time { sec: h.stamp.sec, nanosec: h.stamp.nanosec }, frame_id: h.frame_id.clone() }
}

/// An r2r `Image` as the library's (the data moved, not copied).
pub fn image_from_msg(m: Image) -> cdr::Image {
    cdr::Image {
        header: cdr_header(&m.header),
        height: m.height,
        width: m.width,
        encoding: m.encoding,
        is_bigendian: m.is_bigendian,
        step: m.step,
        data: m.data,
    }
}

/// An r2r `CompressedImage` as the library's (the data moved).
pub fn compressed_from_msg(m: CompressedImage) -> cdr::CompressedImage {
    cdr::CompressedImage { header: cdr_header(&m.header), format: m.format, data: m.data }
}

/// `v` as a fixed array of `N` values (CameraInfo's `k`, `r`, `p`).
fn fixed<const N: usize>(v: &[f64], what: &str) -> Result<[f64; N], String> {
    v.try_into().map_err(|_| format!("CameraInfo {what} has {} values, not {N}", v.len()))
}

/// An r2r `CameraInfo` as the library's; errors when `k`, `r` or `p` has the wrong length.
pub fn camera_info_from_msg(m: &CameraInfo) -> Result<cdr::CameraInfo, String> {
    let k = fixed::<9>(&m.k, "k")?;
    let r = fixed::<9>(&m.r, "r")?;
    let p = fixed::<12>(&m.p, "p")?;
    Ok(cdr::CameraInfo {
        header: cdr_header(&m.header),
        height: m.height,
        width: m.width,
        distortion_model: m.distortion_model.clone(),
        d: m.d.clone(),
        k,
        r,
        p,
        binning_x: m.binning_x,
        binning_y: m.binning_y,
        roi: cdr::RegionOfInterest {
            x_offset: m.roi.x_offset,
            y_offset: m.roi.y_offset,
            height: m.roi.height,
            width: m.roi.width,
            do_rectify: m.roi.do_rectify,
        },
    })
}

/// The library's Image as an r2r message.
pub fn image_to_msg(m: &cdr::Image) -> Image {
    Image {
        header: r2r_header(&m.header),
        height: m.height,
        width: m.width,
        encoding: m.encoding.clone(),
        is_bigendian: m.is_bigendian,
        step: m.step,
        data: m.data.clone(),
    }
}

/// The library's OccupancyGrid as an r2r message.
pub fn grid_to_msg(g: &cdr::OccupancyGrid) -> OccupancyGrid {
    let i = &g.info;
    let [x, y, z] = i.origin.position;
    let [qx, qy, qz, qw] = i.origin.orientation;
    OccupancyGrid {
        header: r2r_header(&g.header),
        info: MapMetaData {
            map_load_time: Time { sec: i.map_load_time.sec, nanosec: i.map_load_time.nanosec },
            resolution: i.resolution,
            width: i.width,
            height: i.height,
            origin: Pose { position: Point { x, y, z }, orientation: Quaternion { x: qx, y: qy, z: qz, w: qw } },
        },
        data: g.data.clone(),
    }
}

/// What the diagnostics report of the cameras (a snapshot, updated after each frame).
#[derive(Debug, Clone, Default)]
pub struct CameraDiag {
    pub names: Vec<String>,
    pub stats: Vec<CameraStats>,
    /// The last frame's status per camera.
    pub last: Vec<CameraStatus>,
    pub calibration_changes: u64,
    pub tf: String,
    pub bev_model: String,
    pub dropped_messages: u64,
    pub last_dropped: Option<String>,
    pub last_camera_ms: Option<f64>,
    /// Frames whose BEV map was published, frames whose map failed (dropped), the last failure.
    pub maps: u64,
    pub map_errors: u64,
    pub last_map_error: Option<String>,
    /// The map model's CUDA graph counts (`camera.cuda_graph` on a CUDA model), after the last
    /// frame.
    pub map_graph: Option<MapGraphCounts>,
}

impl CameraDiag {
    /// The diagnostics' camera values.
    pub fn values(&self) -> Vec<KeyValue> {
        let kv = |k: String, v: String| KeyValue { key: k, value: v };
        let mut out = vec![
            kv("cameras".into(), self.names.join(", ")),
            kv("camera calibration changes".into(), self.calibration_changes.to_string()),
            kv("camera tf".into(), self.tf.clone()),
            kv("bev map model".into(), self.bev_model.clone()),
            kv("bev maps published".into(), self.maps.to_string()),
            kv("bev map errors".into(), self.map_errors.to_string()),
            kv("camera messages dropped".into(), self.dropped_messages.to_string()),
            kv("last camera processing ms".into(), self.last_camera_ms.map_or("none".into(), |v| format!("{v:.3}"))),
        ];
        if let Some(d) = &self.last_dropped {
            out.push(kv("last camera message dropped".into(), d.clone()));
        }
        if let Some(e) = &self.last_map_error {
            out.push(kv("last bev map error".into(), e.clone()));
        }
        if let Some(g) = &self.map_graph {
            out.push(kv("bev map cuda graph captures".into(), g.captures.to_string()));
            out.push(kv("bev map cuda graph replays".into(), g.replays.to_string()));
            // a refused capture leaves those frames kernel by kernel: slower, not wrong
            out.push(kv("bev map cuda graph refused".into(), g.refused.to_string()));
            if let Some(why) = &g.last_refusal {
                out.push(kv("last bev map cuda graph refusal".into(), why.clone()));
            }
        }
        for (i, (name, s)) in self.names.iter().zip(&self.stats).enumerate() {
            let p = format!("camera {name}");
            out.push(kv(format!("{p} age ms"), s.last_age_ns.map_or("none".into(), |a| format!("{:.3}", a as f64 * 1e-6))));
            out.push(kv(format!("{p} used"), s.count(CameraStatus::Used).to_string()));
            out.push(kv(format!("{p} masked"), s.masked().to_string()));
            for st in CameraStatus::ALL.iter().filter(|&&st| st != CameraStatus::Used) {
                out.push(kv(format!("{p} masked.{}", st.name()), s.count(*st).to_string()));
            }
            out.push(kv(format!("{p} last frame"), self.last.get(i).map_or("none", |s| s.name()).to_string()));
            out.push(kv(format!("{p} calibration"), s.calibration.clone()));
            out.push(kv(format!("{p} camera_info errors"), s.camera_info_errors.to_string()));
            if let Some(pr) = &s.last_problem {
                out.push(kv(format!("{p} last problem"), pr.clone()));
            }
        }
        out
    }

    /// A WARN message when the last frame masked cameras (None when all were used or no
    /// frame yet).
    pub fn warning(&self) -> Option<String> {
        if self.last.is_empty() {
            return None;
        }
        let masked: Vec<String> = self
            .names
            .iter()
            .zip(&self.last)
            .filter(|(_, s)| **s != CameraStatus::Used)
            .map(|(n, s)| format!("{n} ({})", s.name()))
            .collect();
        if masked.is_empty() {
            None
        } else if masked.len() == self.names.len() {
            Some(format!("no usable camera in the last frame, LiDAR only: {}", masked.join(", ")))
        } else {
            Some(format!("cameras masked in the last frame: {}", masked.join(", ")))
        }
    }
}

/// Adds the cameras' values to a `/diagnostics` message and, when it is OK otherwise, makes it
/// WARN with the masked cameras of the last frame.
pub fn extend_diagnostics(msg: &mut DiagnosticArray, d: &CameraDiag) {
    if let Some(s) = msg.status.first_mut() {
        s.values.extend(d.values());
        if let (0, Some(w)) = (s.level, d.warning()) {
            s.level = 1;
            s.message = w;
        }
    }
}

/// The map outputs of a BEV map model: per class an OccupancyGrid, the mono8 bits, the rgb8
/// colours (reliable, keep last 1, like the LiDAR outputs).
pub struct MapPublishers {
    classes: Vec<r2r::Publisher<OccupancyGrid>>,
    bits: r2r::Publisher<Image>,
    color: r2r::Publisher<Image>,
}

impl MapPublishers {
    /// `~/output/bev/map/<class>` per class of `classes`, `~/output/bev/map_bits`,
    /// `~/output/bev/map_color`; `style` has a threshold and a colour per class.
    pub fn create(node: &mut r2r::Node, classes: &[String], style: &MapStyle) -> Result<Self, String> {
        style.check(classes.len()).map_err(|e| e.to_string())?;
        let out = r2r::QosProfile::default().reliable().keep_last(1);
        let mut grids = Vec::with_capacity(classes.len());
        for t in map_topic_names(classes) {
            grids.push(node.create_publisher(&t, out.clone()).map_err(|e| format!("{t}: {e}"))?);
        }
        Ok(MapPublishers {
            classes: grids,
            bits: node.create_publisher("~/output/bev/map_bits", out.clone()).map_err(|e| e.to_string())?,
            color: node.create_publisher("~/output/bev/map_color", out).map_err(|e| e.to_string())?,
        })
    }
}

/// What arrived since the worker last looked.
#[derive(Default)]
pub struct Inbox {
    /// Per camera its newest image (an older one not yet taken is replaced: only the newest can
    /// be a frame's).
    images: Vec<Option<CameraImage>>,
    /// Per camera its newest CameraInfo.
    infos: Vec<Option<cdr::CameraInfo>>,
    /// Every `/tf_static` message (rare: each may carry other edges).
    tf_static: Vec<cdr::TfMessage>,
    /// `/tf` messages, the newest [`MAX_PENDING_TF`] (older ones dropped first).
    tf: std::collections::VecDeque<cdr::TfMessage>,
}

/// The node's side of the camera path: the subscriptions' inbox, the diagnostics, the timing
/// and map publishers. The branch and the model are the frame processor's
/// ([`crate::frame::frame_processor::CameraPath`]).
pub struct CameraWorker {
    inbox: Arc<Mutex<Inbox>>,
    diag: Arc<Mutex<CameraDiag>>,
    stages: Vec<r2r::Publisher<Float64>>,
    processing: r2r::Publisher<Float64>,
    /// The map's publishers (`main` creates them with the BEV map model).
    map: Option<MapPublishers>,
    logger: String,
    last_log: Option<Instant>,
}

/// The camera stages published under `~/debug/stage_ms/`.
pub const CAMERA_STAGES: [&str; 4] = ["camera_sync", "camera_decode", "sweeps", "bev_map"];

fn f64_msg(v: f64) -> Float64 {
    Float64 { data: v }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CameraWorker {
    /// The map's publishers, and the model's description for `/diagnostics`.
    pub fn set_map_publishers(&mut self, publishers: MapPublishers, description: String) {
        self.map = Some(publishers);
        lock(&self.diag).bev_model = description;
    }

    /// What arrived since the last frame into the branch: images, CameraInfos, `/tf` and
    /// `/tf_static`. Taken slot by slot: the inbox keeps one slot per camera for the
    /// subscription tasks. Bad CameraInfos and transforms are logged and counted.
    pub fn feed(&mut self, branch: &mut CameraBranch) {
        let arrived = {
            let mut inbox = lock(&self.inbox);
            Inbox {
                images: inbox.images.iter_mut().map(Option::take).collect(),
                infos: inbox.infos.iter_mut().map(Option::take).collect(),
                tf_static: std::mem::take(&mut inbox.tf_static),
                tf: std::mem::take(&mut inbox.tf),
            }
        };
        for (i, img) in arrived.images.into_iter().enumerate() {
            if let Some(img) = img {
                branch.on_image(i, img);
            }
        }
        for (i, info) in arrived.infos.into_iter().enumerate() {
            if let Some(info) = info {
                if let Err(e) = branch.on_camera_info(i, &info) {
                    let name = branch.names().get(i).cloned().unwrap_or_default();
                    dropped(&self.diag, &mut self.last_log, &self.logger, format!("{name} CameraInfo: {e}"));
                }
            }
        }
        let tf = arrived.tf_static.into_iter().map(|m| (m, true)).chain(arrived.tf.into_iter().map(|m| (m, false)));
        for (m, is_static) in tf {
            let errors = branch.on_tf(&m, is_static);
            if !errors.is_empty() {
                let topic = if is_static { "/tf_static" } else { "/tf" };
                dropped(&self.diag, &mut self.last_log, &self.logger, format!("{topic}: {}", errors.join("; ")));
            }
        }
    }

    /// After the cloud's LiDAR outputs: the camera path's map messages (when `open`: the node
    /// is not shutting down), the timings (from the start of the camera path) and the
    /// diagnostics.
    pub fn publish(&mut self, branch: &CameraBranch, out: CameraOutput, open: bool) {
        for (cam, why) in &out.decode_failures {
            let name = branch.names().get(*cam).cloned().unwrap_or_default();
            self.log(&format!("{name}: image could not be decoded, camera masked for this frame: {why}"));
        }
        let mut stage_ms = [0.0f64; 4];
        for (i, (_, v)) in out.branch_stages.iter().enumerate() {
            stage_ms[i] = *v;
        }
        let mut problem = None;
        let mut published = None;
        match (&out.map, &out.messages) {
            (Some(Err(e)), _) => problem = Some(format!("BEV map model failed on a frame: {e}")),
            (Some(Ok(_)), Some(Err(e))) => problem = Some(format!("BEV map not published: {e}")),
            (Some(Ok(_)), Some(Ok(m))) => {
                stage_ms[3] = out.map_ms;
                if let (Some(pubs), true) = (self.map.as_ref(), open) {
                    for (p, g) in pubs.classes.iter().zip(&m.grids) {
                        let _ = p.publish(&grid_to_msg(g));
                    }
                    let _ = pubs.bits.publish(&image_to_msg(&m.bits));
                    let _ = pubs.color.publish(&image_to_msg(&m.color));
                }
                published = Some(true);
            }
            _ => {}
        }
        if problem.is_some() {
            published = Some(false);
        }
        if let Some(p) = &problem {
            self.log(p);
        }
        let diag_update = (branch.stats().to_vec(), branch.calibration_changes(), branch.tf_errors().0);
        let total = out.started.elapsed().as_secs_f64() * 1e3;
        for (p, v) in self.stages.iter().zip(stage_ms) {
            let _ = p.publish(&f64_msg(v));
        }
        let _ = self.processing.publish(&f64_msg(total));
        let mut d = lock(&self.diag);
        d.stats = diag_update.0;
        d.calibration_changes = diag_update.1;
        d.last = out.statuses();
        d.last_camera_ms = Some(total);
        if out.map_graph.is_some() {
            d.map_graph = out.map_graph.clone();
        }
        match published {
            Some(true) => d.maps += 1,
            Some(false) => {
                d.map_errors += 1;
                d.last_map_error = problem;
            }
            None => {}
        }
        if diag_update.2 > 0 && !d.tf.contains("bad transforms") {
            d.tf = format!("{}; bad transforms skipped", d.tf);
        }
    }

    fn log(&mut self, line: &str) {
        if self.last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            r2r::log_warn!(&self.logger, "{line}");
            self.last_log = Some(Instant::now());
        }
    }
}

/// Counts and logs (at most every [`LOG_EVERY`] per camera) a dropped camera message.
fn dropped(diag: &Mutex<CameraDiag>, last: &mut Option<Instant>, logger: &str, what: String) {
    {
        let mut d = lock(diag);
        d.dropped_messages += 1;
        d.last_dropped = Some(what.clone());
    }
    if last.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
        r2r::log_warn!(logger, "dropped a camera message: {what}");
        *last = Some(Instant::now());
    }
}

/// The branch's settings from the node's parameters (`calibration_file` already loaded).
pub fn branch_config(params: &NodeParams, calibration_file: Option<crate::sensors::calib::file::CalibrationFile>) -> BranchConfig {
    let inputs = params.camera_inputs();
    BranchConfig {
        names: params.input.cameras.clone(),
        use_projection: inputs.iter().map(|c| c.intrinsics == crate::frame::params::IntrinsicsFrom::P).collect(),
        max_camera_lidar_delay_s: params.camera.max_camera_lidar_delay,
        max_distortion: params.camera.max_distortion,
        sweeps: params.lidar.sweeps,
        odom_frame: params.lidar.odom_frame.clone(),
        calibration_file,
    }
}

/// Subscribes the camera topics and TF (tasks on `rt`), creates the camera publishers, and
/// returns the worker's camera part and the diagnostics snapshot.
pub fn start(
    node: &mut r2r::Node,
    rt: &tokio::runtime::Runtime,
    params: &NodeParams,
    logger: &str,
) -> r2r::Result<(CameraWorker, Arc<Mutex<CameraDiag>>)> {
    let inputs: Vec<CameraInput> = params.camera_inputs();
    let inbox = Arc::new(Mutex::new(Inbox {
        images: (0..inputs.len()).map(|_| None).collect(),
        infos: vec![None; inputs.len()],
        ..Default::default()
    }));
    let diag = Arc::new(Mutex::new(CameraDiag {
        names: params.input.cameras.clone(),
        stats: vec![CameraStats::default(); inputs.len()],
        // replaced by the model's description when `set_map_publishers` is called
        bev_model: "none (camera.model_config empty): cameras synchronised and checked, no BEV map".into(),
        ..Default::default()
    }));
    let qos = r2r::QosProfile::sensor_data().keep_last(1);
    for (i, cam) in inputs.iter().enumerate() {
        let b = inbox.clone();
        match cam.transport {
            ImageTransport::Raw => {
                let mut sub = node.subscribe::<Image>(&cam.image_topic, qos.clone())?;
                rt.spawn(async move {
                    while let Some(m) = sub.next().await {
                        if let Some(slot) = lock(&b).images.get_mut(i) {
                            *slot = Some(CameraImage::Raw(image_from_msg(m)));
                        }
                    }
                });
            }
            ImageTransport::Compressed => {
                let mut sub = node.subscribe::<CompressedImage>(&cam.image_topic, qos.clone())?;
                rt.spawn(async move {
                    while let Some(m) = sub.next().await {
                        if let Some(slot) = lock(&b).images.get_mut(i) {
                            *slot = Some(CameraImage::Compressed(compressed_from_msg(m)));
                        }
                    }
                });
            }
        }
        let mut info = node.subscribe::<CameraInfo>(&cam.camera_info_topic, qos.clone())?;
        let (b, d, logger, name) = (inbox.clone(), diag.clone(), logger.to_string(), cam.name.clone());
        rt.spawn(async move {
            let mut last = None;
            while let Some(m) = info.next().await {
                match camera_info_from_msg(&m) {
                    Ok(c) => {
                        if let Some(slot) = lock(&b).infos.get_mut(i) {
                            *slot = Some(c);
                        }
                    }
                    Err(e) => dropped(&d, &mut last, &logger, format!("{name} CameraInfo: {e}")),
                }
            }
        });
    }
    // TF as raw CDR: needs tf2_msgs' type support in this build.
    let tf_qos = r2r::QosProfile::default().keep_last(100);
    let tf_static_qos = r2r::QosProfile::default().reliable().transient_local().keep_last(100);
    let mut tf_state = Vec::new();
    for (topic, is_static, q) in [("/tf", false, tf_qos), ("/tf_static", true, tf_static_qos)] {
        match node.subscribe_raw(topic, "tf2_msgs/msg/TFMessage", q) {
            Ok(mut sub) => {
                tf_state.push(format!("{topic} subscribed"));
                let (b, d) = (inbox.clone(), diag.clone());
                let logger = logger.to_string();
                rt.spawn(async move {
                    let mut last = None;
                    while let Some(bytes) = sub.next().await {
                        match cdr::TfMessage::from_cdr(&bytes) {
                            Ok(m) => {
                                let mut inbox = lock(&b);
                                if is_static {
                                    inbox.tf_static.push(m);
                                } else {
                                    // bounded: before the first cloud /tf would pile up
                                    if inbox.tf.len() >= MAX_PENDING_TF {
                                        inbox.tf.pop_front();
                                    }
                                    inbox.tf.push_back(m);
                                }
                            }
                            Err(e) => dropped(&d, &mut last, &logger, format!("{topic}: {e}")),
                        }
                    }
                });
            }
            Err(e) => tf_state.push(format!("{topic} unavailable ({e}): extrinsics from camera.calibration_file only")),
        }
    }
    let tf_line = tf_state.join("; ");
    if tf_line.contains("unavailable") {
        r2r::log_warn!(logger, "TF: {tf_line} (this r2r build has no tf2_msgs type support: source a ROS 2 install that has tf2_msgs, or build with scripts/ros_env.sh, which adds it)");
    }
    lock(&diag).tf = tf_line;
    let q = r2r::QosProfile::default();
    let mut stages = Vec::with_capacity(CAMERA_STAGES.len());
    for s in CAMERA_STAGES {
        stages.push(node.create_publisher(&format!("~/debug/stage_ms/{s}"), q.clone())?);
    }
    let processing = node.create_publisher("~/debug/processing_time_ms/camera", q)?;
    Ok((
        CameraWorker {
            inbox,
            diag: diag.clone(),
            stages,
            processing,
            map: None,
            logger: logger.to_string(),
            last_log: None,
        },
        diag,
    ))
}

/// The map topics of `classes` (relative to the node), for the model's publishers.
pub fn map_topic_names(classes: &[String]) -> Vec<String> {
    classes.iter().map(|c| format!("~/output/bev/map/{}", class_topic_token(c))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2r::WrappedTypesupport;

    /// r2r's CameraInfo → the library's, and the CDR bytes rmw makes decode as the same.
    #[test]
    fn camera_info_conversion_matches_the_wire() {
        let mut m = CameraInfo::default();
        m.header.frame_id = "cam_front".into();
        m.header.stamp.sec = 7;
        m.width = 1600;
        m.height = 900;
        m.k = vec![1266.4, 0.0, 816.3, 0.0, 1266.4, 491.5, 0.0, 0.0, 1.0];
        m.r = vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0];
        m.p = vec![1266.4, 0.0, 816.3, 0.0, 0.0, 1266.4, 491.5, 0.0, 0.0, 0.0, 1.0, 0.0];
        m.d = vec![0.0; 5];
        m.distortion_model = "plumb_bob".into();
        let c = camera_info_from_msg(&m).unwrap();
        let wire = cdr::CameraInfo::from_cdr(&m.to_serialized_bytes().unwrap()).unwrap();
        assert_eq!(c, wire);
        let mut short = m.clone();
        short.k.pop();
        assert!(camera_info_from_msg(&short).unwrap_err().contains("k has 8"));
        let mut empty = m.clone();
        empty.p.clear();
        assert!(camera_info_from_msg(&empty).unwrap_err().contains("p has 0 values, not 12"));
    }

    #[test]
    fn image_conversions_keep_every_field() {
        let m = Image { height: 2, width: 3, encoding: "rgb8".into(), step: 9, data: (0..18).collect(), ..Default::default() };
        let c = image_from_msg(m.clone());
        assert_eq!(c, cdr::Image::from_cdr(&m.to_serialized_bytes().unwrap()).unwrap());
        assert_eq!(image_to_msg(&c), m);
        let g = cdr::OccupancyGrid { data: vec![0, 50, -1], ..Default::default() };
        assert_eq!(cdr::OccupancyGrid::from_cdr(&grid_to_msg(&g).to_serialized_bytes().unwrap()).unwrap(), g);
    }

    /// The diagnostics value under `key`, if there is one.
    fn value(d: &CameraDiag, key: &str) -> Option<String> {
        d.values().into_iter().find(|kv| kv.key == key).map(|kv| kv.value)
    }

    #[test]
    fn diagnostics_name_masked_cameras() {
        let mut d = CameraDiag { names: vec!["A".into(), "B".into()], stats: vec![CameraStats::default(); 2], ..Default::default() };
        assert_eq!(d.warning(), None);
        d.last = vec![CameraStatus::Used, CameraStatus::Stale];
        assert_eq!(d.warning().unwrap(), "cameras masked in the last frame: B (stale)");
        d.last = vec![CameraStatus::Missing, CameraStatus::DecodeError];
        assert!(d.warning().unwrap().contains("LiDAR only"));
        d.stats[1].frames[CameraStatus::Stale as usize] = 3;
        assert_eq!(value(&d, "camera B masked").as_deref(), Some("3"));
        assert_eq!(value(&d, "camera B masked.stale").as_deref(), Some("3"));
        assert_eq!(value(&d, "camera A age ms").as_deref(), Some("none"));
        assert_eq!(value(&d, "camera B last frame").as_deref(), Some("decode_error"));
    }

    #[test]
    fn diagnostics_count_the_map_graph_and_its_refusals() {
        let mut d = CameraDiag::default();
        assert!(!d.values().iter().any(|kv| kv.key.contains("cuda graph")), "no graph, no graph values");
        d.map_graph = Some(MapGraphCounts { captures: 1, replays: 40, refused: 0, last_refusal: None });
        assert_eq!(value(&d, "last bev map cuda graph refusal"), None);
        d.map_graph = Some(MapGraphCounts { captures: 1, replays: 40, refused: 2, last_refusal: Some("capture unsupported".into()) });
        assert_eq!(value(&d, "bev map cuda graph captures").as_deref(), Some("1"));
        assert_eq!(value(&d, "bev map cuda graph replays").as_deref(), Some("40"));
        assert_eq!(value(&d, "bev map cuda graph refused").as_deref(), Some("2"));
        assert_eq!(value(&d, "last bev map cuda graph refusal").as_deref(), Some("capture unsupported"));
    }
}
