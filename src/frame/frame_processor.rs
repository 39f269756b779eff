//! The frame processor: one LiDAR cloud (and the camera messages that arrived before it) in; the
//! labeled cloud, the BEV grids and, with cameras, the BEV map's messages out.
//!
//! The node, `sptr replay` and `sptr bench pipeline` all run a frame through
//! [`FrameProcessor::process`], so what replay evaluates and what the bench times is the node's
//! own code path:
//!
//! 1. the cloud is decoded once ([`Processor::decode`]), for both paths;
//! 2. the LiDAR path ([`Processor::process_decoded`]: SphereFormer, labels, BEV grids, the
//!    labeled cloud) and the camera path ([`CameraPath`]: sync, calibration, image checks, sweeps,
//!    the BEV map model, the map messages) run beside each other (`camera.beside_lidar: true`; on
//!    the GPU each model on a stream of its own, the LiDAR's of the greater priority), or the
//!    camera path after the LiDAR outputs (`false`);
//! 3. the caller's `on_lidar` takes the LiDAR result as soon as it is ready (the node publishes
//!    it there, before the camera path is done); a cloud the LiDAR path rejects gets no map.
//!
//! How messages reach the camera branch is the shell's: the node's subscriptions, replay's bag,
//! the bench's re-stamped messages all go through [`CameraBranch::on_image`],
//! [`CameraBranch::on_camera_info`] and [`CameraBranch::on_tf`] before the frame.

use std::time::Instant;

use crate::frame::cameras::{BevMapModel, CameraBranch, CameraReport, CameraStatus, MapGraphCounts};
use crate::frame::map_messages::{map_messages, MapMessages, MapStyle};
use crate::frame::processor::{FrameOutput, Processor, Rejected};
use crate::models::bevfusion::map::BevMap;
use crate::msgs::cdr::Time;
use crate::msgs::cloud::CloudView;
use crate::Points;

/// The camera half of the frame processor: the branch (its state between frames) and the BEV
/// map model with the style of its messages.
pub struct CameraPath {
    pub branch: CameraBranch,
    /// `None`: the branch runs (sync, calibration, statistics) but no map is made.
    pub model: Option<Box<dyn BevMapModel + Send>>,
    /// How a map becomes messages (thresholds, palette); `None`: no messages are made.
    pub style: Option<MapStyle>,
    /// The node's `bev.frame_id` (empty: the cloud's frame).
    pub bev_frame: String,
}

/// The camera path of one frame, borrowed from whoever keeps it between frames (the node's and
/// the bench's [`CameraPath`], replay's camera replay).
pub struct CameraParts<'a> {
    pub branch: &'a mut CameraBranch,
    pub model: Option<&'a mut (dyn BevMapModel + Send)>,
    pub style: Option<&'a MapStyle>,
    pub bev_frame: &'a str,
}

impl CameraPath {
    /// The path's parts, borrowed for one frame.
    pub fn parts(&mut self) -> CameraParts<'_> {
        let model: Option<&mut (dyn BevMapModel + Send)> = match self.model.as_mut() {
            Some(m) => Some(&mut **m),
            None => None,
        };
        CameraParts { branch: &mut self.branch, model, style: self.style.as_ref(), bev_frame: &self.bev_frame }
    }
}

/// What the camera path made of one frame.
#[derive(Debug)]
pub struct CameraOutput {
    /// When the camera path started (the node reports its whole time).
    pub started: Instant,
    /// The branch's host part (sync, calibration, image checks or decodes, sweeps), ms.
    pub branch_ms: f64,
    /// The branch's stages `camera_sync`, `camera_decode`, `sweeps`, ms.
    pub branch_stages: [(&'static str, f64); 3],
    /// Per camera, after the model (a camera whose JPEG the model could not decode is a
    /// `decode_error` here).
    pub cameras: Vec<CameraReport>,
    /// The calibration differs from the previous frame's.
    pub calibration_changed: bool,
    /// Cameras whose image the model could not decode `(camera, why)`: masked for this frame.
    pub decode_failures: Vec<(usize, String)>,
    /// The model's map (`None`: no model, or the cloud was rejected); `Err`: the model failed.
    pub map: Option<Result<BevMap, String>>,
    /// The model's forward, ms, and its own stages.
    pub map_ms: f64,
    pub model_stages: Vec<(String, f64)>,
    /// The model's CUDA graph counts after this frame (`None`: no graph).
    pub map_graph: Option<MapGraphCounts>,
    /// The map's messages (`None`: no map or no style); `Err`: the map cannot be a message.
    pub messages: Option<Result<MapMessages, String>>,
    /// Making the messages, ms.
    pub messages_ms: f64,
}

impl CameraOutput {
    /// Per camera, its status this frame.
    pub fn statuses(&self) -> Vec<CameraStatus> {
        self.cameras.iter().map(|c| c.status).collect()
    }
}

/// One frame's results: the caller's LiDAR result (what `on_lidar` returned) and the camera
/// path's output (`None` without cameras, or for a cloud that does not decode).
pub struct FrameResult<R> {
    pub lidar: Result<R, Rejected>,
    pub cameras: Option<CameraOutput>,
}

/// The LiDAR processor, the camera path and the schedule between them.
pub struct FrameProcessor {
    pub lidar: Processor,
    pub cameras: Option<CameraPath>,
    /// `camera.beside_lidar`: the camera path on a thread of its own beside the LiDAR path.
    pub beside_lidar: bool,
    /// The decoded cloud, reused frame after frame.
    points: Points,
}

impl FrameProcessor {
    pub fn new(lidar: Processor, cameras: Option<CameraPath>, beside_lidar: bool) -> Self {
        let mut fp = FrameProcessor { lidar, cameras, beside_lidar, points: Points::default() };
        if let Some(c) = fp.cameras.as_mut() {
            let defer = c.model.as_ref().is_some_and(|m| m.decodes_jpeg());
            c.branch.set_defer_jpeg(defer);
        }
        fp
    }

    /// One frame: the cloud `view` (stamped `stamp`, in frame `frame_id`) decoded once, then the
    /// LiDAR path and the camera path in the configured schedule. `on_lidar` gets the LiDAR
    /// result (a rejection included) on the calling thread as soon as it is ready; what it
    /// returns is the frame's `lidar` result. The camera path's map is dropped when the LiDAR
    /// result is an error: a cloud the LiDAR path rejects gets no map.
    pub fn process<R>(
        &mut self,
        view: &CloudView,
        stamp: Time,
        frame_id: &str,
        on_lidar: impl FnOnce(Result<FrameOutput, Rejected>) -> Result<R, Rejected>,
    ) -> FrameResult<R> {
        let cameras = self.cameras.as_mut().map(CameraPath::parts);
        process_frame(&mut self.lidar, cameras, self.beside_lidar, &mut self.points, view, stamp, frame_id, on_lidar)
    }
}

/// [`FrameProcessor::process`] on borrowed parts (replay keeps its camera branch in its camera
/// replay and borrows the model): `points` is the reused decode buffer.
#[allow(clippy::too_many_arguments)]
pub fn process_frame<R>(
    lidar: &mut Processor,
    cameras: Option<CameraParts<'_>>,
    beside_lidar: bool,
    points: &mut Points,
    view: &CloudView,
    stamp: Time,
    frame_id: &str,
    on_lidar: impl FnOnce(Result<FrameOutput, Rejected>) -> Result<R, Rejected>,
) -> FrameResult<R> {
    lidar.start_frame();
    let t = Instant::now();
    let report = match lidar.decode(view, points) {
        Ok(r) => r,
        Err(r) => return FrameResult { lidar: on_lidar(Err(r)), cameras: None },
    };
    let decode_ms = t.elapsed().as_secs_f64() * 1e3;
    let points: &Points = points;
    let (lidar, mut cameras) = match cameras {
        None => (on_lidar(lidar.process_decoded(points, report, decode_ms)), None),
        Some(path) if beside_lidar => std::thread::scope(|s| {
            let camera = s.spawn(move || path.frame(stamp, frame_id, points));
            let lidar = on_lidar(lidar.process_decoded(points, report, decode_ms));
            // a panic in the camera path is this thread's, as if it ran here
            let cameras = camera.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
            (lidar, Some(cameras))
        }),
        Some(path) => {
            let lidar = on_lidar(lidar.process_decoded(points, report, decode_ms));
            (lidar, Some(path.frame(stamp, frame_id, points)))
        }
    };
    if lidar.is_err() {
        if let Some(c) = cameras.as_mut() {
            c.map = None;
            c.messages = None;
        }
    }
    FrameResult { lidar, cameras }
}

impl CameraParts<'_> {
    /// The camera half of a frame on the decoded cloud: the branch's inputs, the model's map,
    /// the map's messages.
    pub fn frame(self, stamp: Time, frame_id: &str, points: &Points) -> CameraOutput {
        let started = Instant::now();
        let mut inputs = self.branch.frame(stamp.as_nanos(), frame_id, points);
        let branch_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut out = CameraOutput {
            started,
            branch_ms,
            branch_stages: inputs.stages,
            cameras: Vec::new(),
            calibration_changed: inputs.calibration_changed,
            decode_failures: Vec::new(),
            map: None,
            map_ms: 0.0,
            model_stages: Vec::new(),
            map_graph: None,
            messages: None,
            messages_ms: 0.0,
        };
        if let Some(model) = self.model {
            let t = Instant::now();
            let (map, failures) = self.branch.run_model(model, &mut inputs);
            out.map_ms = t.elapsed().as_secs_f64() * 1e3;
            out.model_stages = model.last_stages();
            out.map_graph = model.graph_counts();
            out.decode_failures = failures;
            if let (Ok(map), Some(style)) = (&map, self.style) {
                let t = Instant::now();
                out.messages = Some(map_messages(map, style, stamp, frame_id, self.bev_frame).map_err(|e| e.to_string()));
                out.messages_ms = t.elapsed().as_secs_f64() * 1e3;
            }
            out.map = Some(map.map_err(|e| e.to_string()));
        }
        out.cameras = inputs.cameras;
        out
    }
}
