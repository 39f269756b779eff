//! `sptr bench pipeline --cameras`: the node's whole per-cloud work without DDS, from message
//! bytes in host memory to encoded output messages, through the node's own
//! [`FrameProcessor`]: the cameras' CompressedImage + CameraInfo messages decoded from CDR into
//! its [`CameraBranch`], the cloud decoded once, the LiDAR path (labels, BEV grids) and the
//! camera path (sync, calibration, JPEG decode, sweeps, the BEV map model, the map messages)
//! beside each other as the node runs them, and the map messages encoded to CDR.
//!
//! The camera messages are read once from a bag (one image and one CameraInfo per camera of the params file) and re-stamped to
//! each frame's cloud stamp before the frame (untimed), so every camera is in sync and decoded
//! afresh each frame, as live images would be. Frames run unpaced (`frames`) or at a fixed
//! period like a publisher (`rate_hz` for `duration_s`): a frame that ends after the next tick
//! is counted in `frames_over_period` (at a real sensor's rate it would delay or drop the next
//! cloud). Host RSS and (CUDA) device memory in use are sampled every [`MEMORY_EVERY`] frames so
//! a leak shows as growth from first to last.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::msgs::cdr::{CameraInfo, CdrMessage, CompressedImage, Image, Time};
use crate::bag::Bag;
use crate::frame::cameras::{CameraBranch, CameraImage};
use crate::frame::frame_processor::{CameraOutput, CameraPath, FrameProcessor};
use crate::frame::params::{CameraInput, ImageTransport};
use crate::msgs::cloud::CloudBuf;
use crate::bench::host_probe::{FrameHost, HostFrames, HostProbe, ProbeLog, ProcCounters};
use crate::bench::json::{line, Fixed, InOrder, MemorySamples};
use crate::device::memory::{device_used_mb, host_rss_mb};
use crate::bench::lidar::{open_bench, BenchSetup};
use crate::bench::percentiles::Percentiles;
use crate::frame::processor::STAGES;
use crate::bench::faults::{big_cloud, patched_jpeg, Fault, FaultSchedule, FrameFaults, BIG_CLOUDS, BIG_CLOUD_POINTS};
use crate::replay::cameras::absolute_topic;
use crate::replay::request::{camera_options, open_map_model_with};

/// Memory is sampled on frames 0, 50, 100, ... and on the last frame.
pub const MEMORY_EVERY: usize = 50;

/// The first cloud's stamp (the sample bag's LiDAR stamp); frame `k` is `k` periods later.
const BASE_STAMP_NS: i64 = 1_532_402_927_647_951_000;

/// What `sptr bench pipeline --cameras` runs on, besides the LiDAR setup.
pub struct CameraBenchSetup<'a> {
    /// Cloud, LiDAR model and weights, params file (which must have `input.cameras`), device,
    /// warmup and (unpaced) frames.
    pub lidar: BenchSetup<'a>,
    /// A bag with one CompressedImage (or Image, per the params' transport) and CameraInfo per
    /// camera on the params' topics (as the node `sptr` resolves them).
    pub bag: &'a Path,
    /// Overrides `camera.model_config` (a BEVFusion seg model YAML).
    pub camera_model: Option<&'a Path>,
    /// Overrides `camera.model_weights`: a safetensors file or `random:<seed>`.
    pub camera_weights: Option<&'a str>,
    /// Paced: frames at `rate_hz` for `duration_s` (both or neither); unpaced without.
    pub pace: Option<(f64, f64)>,
    /// The camera frame after the LiDAR path on one thread (the node before the overlap: the
    /// anchor for its gain) instead of on a thread of its own beside it, as the node runs it.
    pub serial: bool,
    /// The map model's network as a CUDA graph ([`SegMapModel::set_cuda_graph`]).
    pub camera_graph: bool,
    /// Paced only: a fault every this many seconds ([`crate::bench::faults`]).
    pub faults_every_s: Option<f64>,
}

/// One frame's camera half: the branch, the model, the map messages, and their times.
struct CameraFrameOut {
    camera_ms: f64,
    map_ms: f64,
    encode_ms: f64,
    branch_stages: Vec<(&'static str, f64)>,
    model_stages: Vec<(String, f64)>,
    statuses: Vec<&'static str>,
    map: MapSummary,
}

/// One camera's messages of a frame as CDR bytes, `None` for a camera that sent nothing.
type FrameBytes = Vec<(Option<Vec<u8>>, Option<Vec<u8>>)>;

/// The camera messages of a frame into the branch, decoded from CDR as the node's subscriptions
/// and worker do (the frame processor then reads them).
fn feed_cameras(branch: &mut CameraBranch, bytes: &FrameBytes, inputs: &[CameraInput]) -> Result<(), String> {
    for (cam, ((image, info), c)) in bytes.iter().zip(inputs).enumerate() {
        if let Some(image) = image {
            let img = match c.transport {
                ImageTransport::Compressed => CompressedImage::from_cdr(image).map(CameraImage::Compressed),
                ImageTransport::Raw => Image::from_cdr(image).map(CameraImage::Raw),
            }
            .map_err(|e| format!("{}: {e}", c.image_topic))?;
            branch.on_image(cam, img);
        }
        if let Some(info) = info {
            let info = CameraInfo::from_cdr(info).map_err(|e| format!("{}: {e}", c.camera_info_topic))?;
            branch.on_camera_info(cam, &info).map_err(|e| format!("{}: {e}", c.camera_info_topic))?;
        }
    }
    Ok(())
}

/// The camera path's output of frame `k` as the bench reports it: its times, the cameras'
/// statuses, and the map messages encoded as DDS would carry them (an error when the model or
/// the messages failed: the bench runs on good inputs).
fn camera_frame_out(k: usize, feed_ms: f64, c: CameraOutput) -> Result<CameraFrameOut, String> {
    match c.map {
        Some(Ok(_)) => {}
        Some(Err(e)) => return Err(format!("frame {k}: the BEV map model failed: {e}")),
        None => return Err(format!("frame {k}: no BEV map")),
    }
    let m = match c.messages {
        Some(Ok(m)) => m,
        Some(Err(e)) => return Err(format!("BEV map messages: {e}")),
        None => return Err("the params give no map style".into()),
    };
    let t = Instant::now();
    let cdr_err = |e: crate::msgs::cdr::CdrError| format!("encoding the BEV map: {e}");
    let mut cdr_bytes = 0;
    for g in &m.grids {
        cdr_bytes += g.to_cdr(true).map_err(cdr_err)?.len();
    }
    cdr_bytes += m.bits.to_cdr(true).map_err(cdr_err)?.len();
    cdr_bytes += m.color.to_cdr(true).map_err(cdr_err)?.len();
    Ok(CameraFrameOut {
        camera_ms: feed_ms + c.branch_ms,
        map_ms: c.map_ms,
        encode_ms: c.messages_ms + ms(t.elapsed()),
        branch_stages: c.branch_stages.to_vec(),
        model_stages: c.model_stages,
        statuses: c.cameras.iter().map(|c| c.status.name()).collect(),
        map: MapSummary { classes: m.grids.len(), width: m.bits.width, height: m.bits.height, cdr_bytes },
    })
}

/// One camera's messages as the bench feeds them: decoded once (to re-stamp), encoded per frame.
struct CameraMessages {
    image: CameraImage,
    info: CameraInfo,
}

/// Latest message on `topic` in `bag`, or an error naming the topic and the bag.
fn last_message(bag: &Bag, topic: &str) -> Result<Vec<u8>, String> {
    let mut last = None;
    for m in bag.messages(&[topic]) {
        let m = m.map_err(|e| format!("{}: {e}", bag.path().display()))?;
        last = Some(m.data);
    }
    last.ok_or_else(|| format!("{}: no message on {topic}; the bench needs one image and one CameraInfo per camera", bag.path().display()))
}

/// Re-stamps and encodes a camera's messages to CDR (the bytes a subscription would receive).
fn encode_camera(c: &mut CameraMessages, stamp: Time) -> Result<(Vec<u8>, Vec<u8>), String> {
    let cdr_err = |e: crate::msgs::cdr::CdrError| format!("re-encoding a camera message: {e}");
    c.info.header.stamp = stamp;
    let info = c.info.to_cdr(true).map_err(cdr_err)?;
    let image = match &mut c.image {
        CameraImage::Compressed(m) => {
            m.header.stamp = stamp;
            m.to_cdr(true)
        }
        CameraImage::Raw(m) => {
            m.header.stamp = stamp;
            m.to_cdr(true)
        }
    }
    .map_err(cdr_err)?;
    Ok((image, info))
}

/// Frame `k`'s camera messages stamped `stamp` with `f`'s faults in them: the first camera's
/// JPEG cut (stamped `prev`, the previous frame's stamp, for a stamp collision), the second
/// camera's CameraInfo changed, the last camera silent.
fn frame_bytes(cams: &mut [CameraMessages], stamp: Time, prev: Time, f: &FrameFaults) -> Result<FrameBytes, String> {
    let n = cams.len();
    let mut out = Vec::with_capacity(n);
    for (i, c) in cams.iter_mut().enumerate() {
        if f.silent_camera && i + 1 == n {
            out.push((None, None));
            continue;
        }
        let first_faulted = i == 0 && (f.stamp_collision || f.corrupt_jpeg);
        let second_changed = i == 1.min(n - 1) && f.calibration_change;
        if !first_faulted && !second_changed {
            let (img, info) = encode_camera(c, stamp)?;
            out.push((Some(img), Some(info)));
            continue;
        }
        let mut faulty = CameraMessages { image: c.image.clone(), info: c.info.clone() };
        let (mut img, mut info) = encode_camera(&mut faulty, stamp)?;
        if first_faulted {
            let CameraImage::Compressed(m) = &mut faulty.image else {
                return Err("--faults-every-s needs the first camera's images compressed (JPEG)".into());
            };
            if f.stamp_collision {
                m.data.truncate(m.data.len() / 2);
                m.header.stamp = prev;
            } else {
                m.data = patched_jpeg(&m.data);
            }
            img = m.to_cdr(true).map_err(|e| format!("re-encoding a camera message: {e}"))?;
        }
        if second_changed {
            let info_k = &mut faulty.info;
            info_k.k[0] *= 1.01;
            info_k.k[4] *= 1.01;
            info_k.p[0] *= 1.01;
            info_k.p[5] *= 1.01;
            info = faulty.info.to_cdr(true).map_err(|e| format!("re-encoding a camera message: {e}"))?;
        }
        out.push((Some(img), Some(info)));
    }
    Ok(out)
}

/// What a soak with faults saw: per frame whether its cameras and map were what its inputs call
/// for ([`FrameFaults`]), and the counts.
#[derive(Default)]
struct FaultTally {
    /// Faults started, per [`Fault::ALL`].
    injected: [u64; Fault::ALL.len()],
    frames_with_fault: u64,
    good_frames: u64,
    /// Good frames with every camera used and the map made.
    good_answered: u64,
    good_ms: Vec<f64>,
    big_clouds_answered: u64,
    /// Frames whose camera statuses were not what their inputs call for (the first few, named).
    unexpected: Vec<String>,
    unexpected_frames: u64,
}

impl FaultTally {
    /// Timed frame `i` with faults `f`: its camera statuses, the LiDAR points it answered with.
    fn frame(&mut self, i: usize, start: Option<Fault>, f: &FrameFaults, statuses: &[&str], points: usize, ms: f64) {
        if let Some(s) = start {
            self.injected[Fault::ALL.iter().position(|&x| x == s).unwrap_or(0)] += 1;
        }
        let n = statuses.len();
        let ok = statuses.iter().enumerate().all(|(c, &st)| match st {
            "used" => !(c == 0 && (f.stamp_collision || f.corrupt_jpeg)),
            "decode_error" => c == 0 && (f.stamp_collision || f.corrupt_jpeg),
            "stale" => c + 1 == n && f.silent_camera,
            _ => false,
        });
        if f.is_good() {
            self.good_frames += 1;
            self.good_ms.push(ms);
            if ok {
                self.good_answered += 1;
            }
        } else {
            self.frames_with_fault += 1;
        }
        if f.big_cloud && points == BIG_CLOUD_POINTS {
            self.big_clouds_answered += 1;
        }
        if !ok {
            self.unexpected_frames += 1;
            if self.unexpected.len() < 5 {
                self.unexpected.push(format!("frame {i} ({f:?}): {statuses:?}"));
            }
        }
    }

    /// JSON `faults`: what was injected, what the branch counted, the good frames.
    fn json(&self, every_s: f64, branch: &CameraBranch) -> serde_json::Value {
        use crate::frame::cameras::CameraStatus;
        let stats = branch.stats();
        let first = stats.first().map(|s| s.count(CameraStatus::DecodeError)).unwrap_or(0);
        let last = stats.last().map(|s| s.count(CameraStatus::Stale)).unwrap_or(0);
        let decode_expected = self.injected[1] + self.injected[2];
        let calib_expected = 2 * self.injected[3];
        let big_expected = BIG_CLOUDS as u64 * self.injected[4];
        let all_counted = first == decode_expected
            && branch.calibration_changes() == calib_expected
            && self.big_clouds_answered == big_expected
            && (self.injected[0] == 0 || last > 0)
            && self.unexpected_frames == 0
            && self.good_answered == self.good_frames;
        let good = Percentiles::of(&self.good_ms).map(|p| serde_json::json!({ "p50_ms": p.p50, "p99_ms": p.p99, "max_ms": p.max }));
        let injected: serde_json::Map<String, serde_json::Value> = Fault::ALL.iter().zip(self.injected).map(|(f, n)| (f.name().to_string(), n.into())).collect();
        serde_json::json!({
            "every_s": every_s,
            "injected": injected,
            "frames_with_fault": self.frames_with_fault,
            "counted": {
                "first_camera_decode_errors": first,
                "expected_decode_errors": decode_expected,
                "last_camera_stale": last,
                "calibration_changes": branch.calibration_changes(),
                "expected_calibration_changes": calib_expected,
                "big_clouds_answered": self.big_clouds_answered,
                "expected_big_clouds": big_expected,
            },
            "good_frames": self.good_frames,
            "good_frames_answered": self.good_answered,
            "good_frames_latency": good,
            "unexpected_frames": self.unexpected_frames,
            "unexpected": self.unexpected,
            "all_counted": all_counted,
        })
    }
}

/// Per-stage times of the frames, ms, in first-seen order.
#[derive(Default)]
struct StageTimes(Vec<(String, Vec<f64>)>);

impl StageTimes {
    fn add(&mut self, name: &str, v: f64) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some((_, s)) => s.push(v),
            None => self.0.push((name.to_string(), vec![v])),
        }
    }

    /// Each stage's percentile `pick` takes, ms to 0.001 (0 for a stage without times), in
    /// first-seen order.
    fn percentile_ms(&self, pick: fn(&Percentiles) -> f64) -> InOrder<String, Fixed<3>> {
        self.0.iter().map(|(n, v)| (n.clone(), Fixed(Percentiles::of(v).map_or(0.0, |p| pick(&p))))).collect()
    }

    /// The times of `names`, frame by frame, ms to 0.01, after the frames' `total` (a tail's
    /// pattern over time: bursts, a period).
    fn series(&self, total: &[f64], names: &[&str]) -> InOrder<String, Vec<Fixed<2>>> {
        let list = |v: &[f64]| v.iter().map(|&x| Fixed(x)).collect();
        std::iter::once(("total".to_string(), list(total)))
            .chain(self.0.iter().filter(|(n, _)| names.contains(&n.as_str())).map(|(n, v)| (n.clone(), list(v))))
            .collect()
    }

    /// Every stage's time in timed frame `i`, ms to 0.001 (a stage a frame did not have is left
    /// out).
    fn frame(&self, i: usize) -> InOrder<String, Fixed<3>> {
        self.0.iter().filter_map(|(n, v)| v.get(i).map(|&x| (n.clone(), Fixed(x)))).collect()
    }
}

/// The slowest timed frame: its index, time and stages, so that a long tail can be traced to a
/// stage.
#[derive(Serialize)]
struct SlowestFrame {
    frame: usize,
    ms: Fixed<3>,
    stages: InOrder<String, Fixed<3>>,
}

/// The slowest timed frame (`None`, `null` in the JSON, without frames).
fn slowest(total: &[f64], stages: &StageTimes) -> Option<SlowestFrame> {
    let (i, &t) = total.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1))?;
    Some(SlowestFrame { frame: i, ms: Fixed(t), stages: stages.frame(i) })
}

/// How the frames were paced (`null` when unpaced).
#[derive(Serialize)]
struct Pace {
    rate_hz: f64,
    duration_s: f64,
    period_ms: Fixed<3>,
}

/// The JSON row of `sptr bench pipeline --cameras`, keys in this order (README).
#[derive(Serialize)]
struct CamerasRow<'a> {
    bench: &'static str,
    faults: Option<serde_json::Value>,
    device: &'a str,
    frames: usize,
    warmup: usize,
    pace: Option<Pace>,
    frames_over_period: usize,
    overlap: bool,
    latency: Option<Percentiles>,
    stage_p50_ms: InOrder<String, Fixed<3>>,
    stage_p99_ms: InOrder<String, Fixed<3>>,
    slowest_frame: Option<SlowestFrame>,
    per_frame_ms: InOrder<String, Vec<Fixed<2>>>,
    cameras: usize,
    camera_status: Vec<&'static str>,
    map: Option<MapSummary>,
    host_rss_mb: Option<MemorySamples<usize>>,
    device_used_mb: Option<MemorySamples<usize>>,
    host: HostFrames,
    model: String,
    weights: &'a str,
    camera_model: &'a str,
    camera_graph: bool,
    cloud: String,
    bag: String,
}

/// What the last frame's map messages were.
#[derive(Serialize)]
struct MapSummary {
    classes: usize,
    width: u32,
    height: u32,
    cdr_bytes: usize,
}

/// The bench's inputs, read once before the frames: the node's frame processor with its camera
/// path, each camera's messages, the cloud, and what the JSON row names.
struct CameraBench {
    frames_in: FrameProcessor,
    cams: Vec<CameraMessages>,
    inputs: Vec<CameraInput>,
    /// The bag's cloud frame (empty without a cloud in the bag).
    cloud_frame: String,
    body: CloudBuf,
    cuda: bool,
    device_name: String,
    camera_model: String,
    model_path: PathBuf,
    weights: String,
}

/// The params' camera settings, the LiDAR setup, the map model and the camera messages. The
/// camera settings come first: a params file without cameras fails before any model loads.
fn open_camera_bench(s: &CameraBenchSetup) -> Result<CameraBench, String> {
    let params_path = s.lidar.params;
    let node = crate::frame::params::NodeParams::load(params_path).map_err(|e| format!("--params: {e}"))?;
    let opts = camera_options(params_path, &node)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "--cameras: {} has no cameras (input.cameras is empty); give a params file with the camera branch, e.g. config/perception_nuscenes_cameras.yaml",
                params_path.display()
            )
        })?;
    let lidar = open_bench(&s.lidar)?;
    let cuda = lidar.processor.device_name().starts_with("cuda");
    let mut model = open_map_model_with(s.camera_model, s.camera_weights, params_path, &lidar.params, s.lidar.device)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "--cameras: {} has no BEV map model (camera.model_config is empty); give --camera-model",
                params_path.display()
            )
        })?;
    if s.camera_graph && !model.set_cuda_graph(true) {
        return Err("--camera-graph: the BEV map model runs on the CPU; CUDA graphs need --device cuda".into());
    }
    let mut style = opts.map_style.clone().ok_or("--cameras: the params give no map style")?;
    if model.classes().len() != style.thresholds.len() {
        // an overriding model YAML with other classes: its classes, the params' thresholds for them
        style.thresholds = lidar.params.map_thresholds(model.classes().len()).map_err(|e| format!("{}: {e}", params_path.display()))?;
        style.palette = model.classes().iter().map(|c| crate::models::bevfusion::map::class_colour(c)).collect();
    }
    let branch = CameraBranch::new(opts.branch.clone()).map_err(|e| format!("camera branch: {e}"))?;

    // The camera messages, once, from the bag; the cloud's frame from the bag's cloud if it has one.
    let bag = Bag::open(s.bag).map_err(|e| format!("{}: {e}", s.bag.display()))?;
    let mut cams = Vec::with_capacity(opts.inputs.len());
    for c in &opts.inputs {
        let what = |e: crate::msgs::cdr::CdrError, t: &str| format!("{}: {t}: {e}", s.bag.display());
        let bytes = last_message(&bag, &c.image_topic)?;
        let image = match c.transport {
            ImageTransport::Compressed => CameraImage::Compressed(CompressedImage::from_cdr(&bytes).map_err(|e| what(e, &c.image_topic))?),
            ImageTransport::Raw => CameraImage::Raw(Image::from_cdr(&bytes).map_err(|e| what(e, &c.image_topic))?),
        };
        let info = CameraInfo::from_cdr(&last_message(&bag, &c.camera_info_topic)?).map_err(|e| what(e, &c.camera_info_topic))?;
        cams.push(CameraMessages { image, info });
    }
    let points_topic = absolute_topic(&lidar.params.topics.input_points);
    let cloud_frame = match bag.topics().iter().any(|t| t.name == points_topic) {
        true => crate::msgs::cdr::PointCloud2::from_cdr(&last_message(&bag, &points_topic)?)
            .map(|m| m.header.frame_id)
            .map_err(|e| format!("{}: {points_topic}: {e}", s.bag.display()))?,
        false => String::new(),
    };
    let camera_model = model.description().to_string();
    let device_name = lidar.processor.device_name().to_string();
    let path = CameraPath { branch, model: Some(Box::new(model)), style: Some(style), bev_frame: lidar.params.bev.frame_id.clone() };
    Ok(CameraBench {
        // The node's frame processor, its schedule from `--serial` (camera path after the LiDAR's).
        frames_in: FrameProcessor::new(lidar.processor, Some(path), !s.serial),
        cams,
        inputs: opts.inputs,
        cloud_frame,
        body: lidar.body,
        cuda,
        device_name,
        camera_model,
        model_path: lidar.model_path,
        weights: lidar.weights,
    })
}

/// How the frames run: their period (the stamps' spacing; the ticks' when paced) and count, and
/// the faults' schedule.
struct Pacing {
    period: Duration,
    frames: usize,
    schedule: Option<FaultSchedule>,
}

impl Pacing {
    fn of(s: &CameraBenchSetup) -> Result<Pacing, String> {
        let (period, frames) = match s.pace {
            Some((hz, secs)) if !(hz.is_finite() && (0.1..=1000.0).contains(&hz) && secs.is_finite() && (0.1..=86_400.0).contains(&secs)) => {
                return Err(format!("pace {hz} Hz for {secs} s: use 0.1 to 1000 Hz for 0.1 to 86400 s"));
            }
            Some((hz, secs)) => (Duration::from_secs_f64(1.0 / hz), ((hz * secs).round() as usize).max(1)),
            None => (Duration::from_millis(100), s.lidar.frames),
        };
        let schedule = match (s.faults_every_s, s.pace) {
            (None, _) => None,
            (Some(every), Some((hz, _))) => Some(FaultSchedule::new(every, hz)?),
            (Some(_), None) => return Err("--faults-every-s needs --rate-hz and --duration-s (faults are scheduled in time)".into()),
        };
        Ok(Pacing { period, frames, schedule })
    }

    /// Frame `k`'s cloud stamp: `k` periods after the first.
    fn stamp(&self, k: usize) -> Time {
        let stamp_ns = BASE_STAMP_NS + k as i64 * self.period.as_nanos() as i64;
        Time { sec: (stamp_ns / 1_000_000_000) as i32, nanosec: (stamp_ns % 1_000_000_000) as u32 }
    }
}

/// The burst's cloud (faults only), encoded once (untimed), as the node would receive it.
fn burst_cloud(pacing: &Pacing, body: &CloudBuf) -> Result<Option<CloudBuf>, String> {
    if pacing.schedule.is_none() {
        return Ok(None);
    }
    let (pts, _) = crate::msgs::cloud::decode(&body.view()).map_err(|e| format!("the cloud: {e}"))?;
    crate::msgs::cloud::encode_points(&big_cloud(&pts, BIG_CLOUD_POINTS), crate::msgs::cloud::Layout::XyzI32)
        .map(Some)
        .map_err(|e| format!("the big cloud: {e}"))
}

/// What the timed frames left: their times, stages, memory samples, the last frame's cameras and
/// map, the faults' tally and the host's view of each frame.
#[derive(Default)]
struct FrameLog {
    total: Vec<f64>,
    stages: StageTimes,
    over_period: usize,
    host_rss: Vec<(usize, f64)>,
    device_used: Vec<(usize, f64)>,
    camera_status: Vec<&'static str>,
    last_map: Option<MapSummary>,
    tally: FaultTally,
    frame_host: Vec<(Instant, Instant, FrameHost)>,
}

impl FrameLog {
    /// Timed frame `i` of `frames`: its total, the LiDAR path's stages, the camera half's, and
    /// memory every [`MEMORY_EVERY`] frames and on the last.
    fn record(&mut self, i: usize, frames: usize, frame_ms: f64, lidar_ms: f64, lidar_stages: impl IntoIterator<Item = f64>, cam: CameraFrameOut, cuda: bool) {
        self.total.push(frame_ms);
        self.stages.add("lidar", lidar_ms);
        for (n, v) in STAGES.iter().zip(lidar_stages) {
            self.stages.add(&format!("lidar/{n}"), v);
        }
        self.stages.add("cameras", cam.camera_ms);
        for (n, v) in cam.branch_stages {
            self.stages.add(&format!("cameras/{n}"), v);
        }
        self.stages.add("bev_map", cam.map_ms);
        for (n, v) in cam.model_stages {
            self.stages.add(&format!("bev_map/{n}"), v);
        }
        self.stages.add("map_encode", cam.encode_ms);
        if i % MEMORY_EVERY == 0 || i + 1 == frames {
            if let Some(v) = host_rss_mb() {
                self.host_rss.push((i, v));
            }
            if let Some(v) = device_used_mb(cuda) {
                self.device_used.push((i, v));
            }
        }
        self.camera_status = cam.statuses;
        self.last_map = Some(cam.map);
    }
}

/// Paced: the first timed frame starts the schedule; each later one waits for its tick (a tick
/// already past, after a late frame, starts it at once: the schedule never slips).
fn wait_for_tick(next_tick: &mut Option<Instant>) {
    match *next_tick {
        None => *next_tick = Some(Instant::now()),
        Some(tick) => {
            let now = Instant::now();
            if tick > now {
                std::thread::sleep(tick - now);
            }
        }
    }
}

/// The warm-up and timed frames, each as the node runs it: the camera messages into the branch,
/// then the frame processor (the cloud decoded once; the LiDAR path here, the camera path beside
/// it or after it).
fn run_frames(s: &CameraBenchSetup, bench: &mut CameraBench, pacing: &Pacing, burst: Option<&CloudBuf>) -> Result<(FrameLog, Option<ProbeLog>), String> {
    let mut log = FrameLog::default();
    let mut prev_stamp = Time::default();
    let mut next_tick: Option<Instant> = None;
    // Whose is a slow frame: the probe and /proc per frame (crate::bench::host_probe).
    let mut probe = None;
    for k in 0..s.lidar.warmup + pacing.frames {
        let timed = k >= s.lidar.warmup;
        let i = k.saturating_sub(s.lidar.warmup);
        let stamp = pacing.stamp(k);
        // untimed: the bytes the subscriptions would hold when the cloud arrives
        let faults = match (&pacing.schedule, timed) {
            (Some(sch), true) => sch.at(i),
            _ => FrameFaults::default(),
        };
        let bytes = frame_bytes(&mut bench.cams, stamp, prev_stamp, &faults)?;
        prev_stamp = stamp;
        let cloud_body = match (burst, faults.big_cloud) {
            (Some(b), true) => b,
            _ => &bench.body,
        };
        if timed && s.pace.is_some() {
            wait_for_tick(&mut next_tick);
        }
        if timed && probe.is_none() {
            probe = Some(HostProbe::start());
        }
        let counts_before = ProcCounters::now();
        let t0 = Instant::now();
        let branch = &mut bench.frames_in.cameras.as_mut().ok_or("the bench's frame processor has no camera path")?.branch;
        feed_cameras(branch, &bytes, &bench.inputs)?;
        let feed_ms = ms(t0.elapsed());
        let mut lidar_ms = 0.0;
        let result = bench.frames_in.process(&cloud_body.view(), stamp, &bench.cloud_frame, |out| {
            lidar_ms = ms(t0.elapsed());
            out
        });
        let out = result.lidar.map_err(|e| format!("the cloud was rejected: {e}"))?;
        let cam = camera_frame_out(k, feed_ms, result.cameras.ok_or("the cloud's camera path did not run")?)?;
        let frame_ms = ms(t0.elapsed());
        let t_end = Instant::now();
        if !timed {
            continue;
        }
        let counts = ProcCounters::now().since(&counts_before);
        log.frame_host.push((t0, t_end, FrameHost { ms: frame_ms, probe_ratio: None, counts }));
        if let Some(tick) = next_tick {
            let deadline = tick + pacing.period;
            if Instant::now() > deadline {
                log.over_period += 1;
            }
            next_tick = Some(deadline);
        }
        if let Some(sch) = &pacing.schedule {
            log.tally.frame(i, sch.starting_at(i), &faults, &cam.statuses, out.points_kept, frame_ms);
        }
        log.record(i, pacing.frames, frame_ms, lidar_ms, out.stages, cam, bench.cuda);
    }
    Ok((log, probe.map(HostProbe::stop)))
}

/// Runs the bench; returns one JSON object (see docs/node.md, `sptr bench pipeline --cameras`).
pub fn run(s: &CameraBenchSetup) -> Result<String, String> {
    let mut bench = open_camera_bench(s)?;
    let pacing = Pacing::of(s)?;
    let burst = burst_cloud(&pacing, &bench.body)?;
    let (log, probe) = run_frames(s, &mut bench, &pacing, burst.as_ref())?;
    let frame_host: Vec<FrameHost> = log
        .frame_host
        .into_iter()
        .map(|(from, to, f)| FrameHost { probe_ratio: probe.as_ref().and_then(|p| p.max_ratio_in(from, to)), ..f })
        .collect();
    let camera_branch = &bench.frames_in.cameras.as_ref().ok_or("the bench's frame processor has no camera path")?.branch;
    let row = CamerasRow {
        bench: "pipeline_cameras",
        faults: s.faults_every_s.map(|every| log.tally.json(every, camera_branch)),
        device: &bench.device_name,
        frames: log.total.len(),
        warmup: s.lidar.warmup,
        pace: s.pace.map(|(rate_hz, duration_s)| Pace { rate_hz, duration_s, period_ms: Fixed(ms(pacing.period)) }),
        frames_over_period: log.over_period,
        overlap: !s.serial,
        latency: Percentiles::of(&log.total),
        stage_p50_ms: log.stages.percentile_ms(|p| p.p50),
        stage_p99_ms: log.stages.percentile_ms(|p| p.p99),
        slowest_frame: slowest(&log.total, &log.stages),
        per_frame_ms: log.stages.series(&log.total, &["lidar", "lidar/network", "cameras", "bev_map", "map_encode"]),
        cameras: bench.cams.len(),
        camera_status: log.camera_status,
        map: log.last_map,
        host_rss_mb: MemorySamples::of(&log.host_rss),
        device_used_mb: MemorySamples::of(&log.device_used),
        host: HostFrames::of(probe.as_ref(), &frame_host),
        model: bench.model_path.display().to_string(),
        weights: &bench.weights,
        camera_model: &bench.camera_model,
        camera_graph: s.camera_graph,
        cloud: s.lidar.cloud.display().to_string(),
        bag: s.bag.display().to_string(),
    };
    Ok(line(&row))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tally calls a frame right only when its statuses are what its faults call for, and
    /// counts good frames answered.
    #[test]
    fn fault_tally_checks_each_frame_against_its_faults() {
        let mut t = FaultTally::default();
        let used = ["used"; 3];
        let good = FrameFaults::default();
        t.frame(0, None, &good, &used, 10, 1.0);
        let collision = FrameFaults { stamp_collision: true, ..Default::default() };
        t.frame(1, Some(Fault::StampCollision), &collision, &["decode_error", "used", "used"], 10, 2.0);
        // the same fault with the first camera used: the bad image was taken for a good one
        t.frame(2, Some(Fault::StampCollision), &collision, &used, 10, 2.0);
        let silent = FrameFaults { silent_camera: true, ..Default::default() };
        t.frame(3, Some(Fault::SilentCamera), &silent, &["used", "used", "stale"], 10, 1.0);
        // stale on a camera that is not the silent one
        t.frame(4, None, &silent, &["stale", "used", "used"], 10, 1.0);
        let big = FrameFaults { big_cloud: true, ..Default::default() };
        t.frame(5, Some(Fault::BigClouds), &big, &used, BIG_CLOUD_POINTS, 9.0);
        t.frame(6, None, &good, &["used", "missing", "used"], 10, 1.0);
        assert_eq!((t.good_frames, t.good_answered, t.frames_with_fault), (2, 1, 5));
        assert_eq!(t.unexpected_frames, 3);
        assert!(t.unexpected[0].starts_with("frame 2"), "{:?}", t.unexpected);
        assert_eq!(t.big_clouds_answered, 1);
        assert_eq!(t.injected, [1, 2, 0, 0, 1]);
    }

    /// A frame's messages with its faults: the silent camera sends nothing, the first camera's
    /// JPEG is cut (and re-stamped for a collision), the second camera's fx is 1 % larger.
    #[test]
    fn frame_bytes_carry_the_faults() {
        let jpeg: Vec<u8> = (0..200u8).collect();
        let cam = |fx: f64| {
            let mut info = CameraInfo::default();
            info.k[0] = fx;
            CameraMessages { image: CameraImage::Compressed(CompressedImage { data: jpeg.clone(), format: "jpeg".into(), ..Default::default() }), info }
        };
        let mut cams = vec![cam(100.0), cam(200.0), cam(300.0)];
        let (now, prev) = (Time { sec: 5, nanosec: 0 }, Time { sec: 4, nanosec: 950_000_000 });
        let decode = |b: &FrameBytes, i: usize| CompressedImage::from_cdr(b[i].0.as_ref().unwrap()).unwrap();
        let f = FrameFaults { stamp_collision: true, silent_camera: true, calibration_change: true, ..Default::default() };
        let b = frame_bytes(&mut cams, now, prev, &f).unwrap();
        assert_eq!((decode(&b, 0).data.len(), decode(&b, 0).header.stamp), (100, prev));
        assert_eq!((decode(&b, 1).data.len(), decode(&b, 1).header.stamp), (200, now));
        assert!((CameraInfo::from_cdr(b[1].1.as_ref().unwrap()).unwrap().k[0] - 202.0).abs() < 1e-9);
        assert!(b[2].0.is_none() && b[2].1.is_none());
        let f = FrameFaults { corrupt_jpeg: true, ..Default::default() };
        let b = frame_bytes(&mut cams, now, prev, &f).unwrap();
        assert_eq!(decode(&b, 0).data, patched_jpeg(&jpeg));
        assert_eq!(CameraInfo::from_cdr(b[1].1.as_ref().unwrap()).unwrap().k[0], 200.0, "the change was for one frame");
        assert_eq!(decode(&b, 2).data, jpeg);
    }

    #[test]
    fn stage_medians_keep_first_seen_order() {
        let mut s = StageTimes::default();
        for v in [3.0, 1.0, 2.0] {
            s.add("b", v);
            s.add("a", v * 10.0);
        }
        assert_eq!(line(&s.percentile_ms(|p| p.p50)), r#"{"b":2.0,"a":20.0}"#);
        assert_eq!(line(&s.percentile_ms(|p| p.p99)), r#"{"b":3.0,"a":30.0}"#);
        assert_eq!(line(&s.series(&[5.0, 6.0, 7.0], &["a"])), r#"{"total":[5.0,6.0,7.0],"a":[30.0,10.0,20.0]}"#);
        assert_eq!(line(&slowest(&[5.0, 7.0, 6.0], &s)), r#"{"frame":1,"ms":7.0,"stages":{"b":1.0,"a":10.0}}"#);
        assert_eq!(line(&slowest(&[], &s)), "null");
    }

    /// The row parses back with its keys in the order the line has always had them.
    #[test]
    fn the_cameras_row_is_json_with_its_keys_in_order() {
        let mut stages = StageTimes::default();
        stages.add("lidar", 8.0);
        stages.add("cameras", 9.0);
        let total = [12.3456];
        let row = CamerasRow {
            bench: "pipeline_cameras",
            faults: None,
            device: "cuda:0",
            frames: 1,
            warmup: 0,
            pace: Some(Pace { rate_hz: 10.0, duration_s: 1.0, period_ms: Fixed(100.0) }),
            frames_over_period: 0,
            overlap: true,
            latency: Percentiles::of(&total),
            stage_p50_ms: stages.percentile_ms(|p| p.p50),
            stage_p99_ms: stages.percentile_ms(|p| p.p99),
            slowest_frame: slowest(&total, &stages),
            per_frame_ms: stages.series(&total, &["lidar"]),
            cameras: 6,
            camera_status: vec!["used"; 6],
            map: Some(MapSummary { classes: 6, width: 200, height: 200, cdr_bytes: 1234 }),
            host_rss_mb: MemorySamples::of(&[(0, 100.0)]),
            device_used_mb: None,
            host: HostFrames::of(None, &[]),
            model: "m.yaml".into(),
            weights: "random (seed 1)",
            camera_model: "fusion",
            camera_graph: false,
            cloud: "c.bin".into(),
            bag: "bag".into(),
        };
        let text = line(&row);
        let keys = [
            "bench", "faults", "device", "frames", "warmup", "pace", "frames_over_period", "overlap", "latency", "stage_p50_ms",
            "stage_p99_ms", "slowest_frame", "per_frame_ms", "cameras", "camera_status", "map", "host_rss_mb", "device_used_mb",
            "host", "model", "weights", "camera_model", "camera_graph", "cloud", "bag",
        ];
        let v = crate::bench::json::parse_row(&text, &keys);
        assert_eq!(v["bench"], "pipeline_cameras");
        assert!(v["faults"].is_null() && v["device_used_mb"].is_null(), "{text}");
        assert_eq!(v["pace"]["rate_hz"].as_f64(), Some(10.0));
        assert_eq!(v["latency"]["p99_ms"].as_f64(), Some(12.346));
        assert_eq!(v["per_frame_ms"]["total"][0].as_f64(), Some(12.35));
        assert_eq!(v["slowest_frame"]["frame"], 0);
        assert_eq!(v["map"]["cdr_bytes"], 1234);
        assert_eq!(v["host_rss_mb"]["last"].as_f64(), Some(100.0));
        assert_eq!(v["host"]["slow_frames"]["frames"], 0);
    }
}
