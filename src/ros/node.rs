//! The perception node (`perception_node`): r2r spinning on its own thread, the subscription
//! drained by a tokio task into a newest-frame-wins [`Mailbox`], processing
//! ([`crate::frame::processor::Processor`]: decode, checks, SphereFormer, BEV grids, labeled cloud) on
//! a separate std thread that also publishes, `/diagnostics` at 1 Hz from another tokio task, and
//! SIGINT/SIGTERM handled by the main thread.
//!
//! Topics (default names; each is the parameter `topics.<name>` and can also be remapped):
//!
//! | topic | type | what |
//! | --- | --- | --- |
//! | `~/input/points` (sub) | `sensor_msgs/PointCloud2` | LiDAR cloud; sensor-data QoS (best effort), depth `input.qos_depth` |
//! | `~/output/points` | `sensor_msgs/PointCloud2` | `x, y, z, intensity, class_id, probability`, input frame and stamp |
//! | `~/output/bev/labels` | `sensor_msgs/Image` | mono8 class id per BEV cell (255: no point) |
//! | `~/output/bev/labels_color` | `sensor_msgs/Image` | rgb8, the model YAML's palette |
//! | `~/output/bev/occupancy` | `nav_msgs/OccupancyGrid` | 0-100 from the obstacle classes, -1 unknown |
//! | `~/debug/processing_time_ms` | `std_msgs/Float64` | decode to encoded outputs |
//! | `~/debug/stage_ms/<stage>` | `std_msgs/Float64` | each of [`STAGES`] |
//! | `~/debug/latency_ms` | `std_msgs/Float64` | message receipt to the outputs published |
//! | `~/debug/voxels` | `std_msgs/UInt32` | voxels the network ran on |
//! | `/diagnostics` | `diagnostic_msgs/DiagnosticArray` | 1 Hz, see [`diagnostics`] (+ the cameras' values, [`super::cameras::CameraDiag`]) |
//!
//! With `input.cameras` set, the camera branch ([`super::cameras`]) adds per camera
//! `camera.image_topic` (`Image`, or `CompressedImage` on `<topic>/compressed`) and
//! `camera.camera_info_topic` subscriptions, `/tf` and `/tf_static`, the BEV map outputs (with a
//! model) and `~/debug/stage_ms/{camera_sync, camera_decode, sweeps, bev_map}`,
//! `~/debug/processing_time_ms/camera`; it runs after the LiDAR outputs are published, so the
//! LiDAR path (and `~/debug/processing_time_ms`) is unchanged.
//!
//! Outputs are published reliable (a reliable writer serves best-effort and reliable readers),
//! keep last 1.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use r2r::builtin_interfaces::msg::Time;
use r2r::diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus, KeyValue};
use r2r::geometry_msgs::msg::{Point, Pose, Quaternion};
use r2r::nav_msgs::msg::{MapMetaData, OccupancyGrid};
use r2r::sensor_msgs::msg::{Image, PointCloud2};
use r2r::std_msgs::msg::{Float64, Header, UInt32};

use crate::ops::label_grid::cpu::{BevGridParams, BevGrids};
use crate::frame::messages::{frame_mismatch, BevLayout, ImageLayout};
use crate::frame::budget::BudgetState;
use crate::msgs::cloud::PointField;
use crate::frame::params::{CudaErrorPolicy, NodeParams, OverflowPolicy, TopicParams};
use crate::models::sphereformer::config::ModelConfig;
use crate::frame::frame_processor::{CameraPath, FrameProcessor};
use crate::frame::processor::{bev_params, FrameOutput, OverflowStats, Processor, Reject, Rejected, STAGES};
use crate::ros::mailbox::Mailbox;
use crate::ros::params;
use crate::ros::stop_guard::{Stage as StopStage, StopGuard, STOP_DEADLINE};

/// Exit status for invalid parameters (params file, overrides, model YAML or weights).
pub const EXIT_PARAMS: i32 = 2;
/// Exit status when the configured device cannot be used, or a CUDA error with
/// `on_cuda_error: exit`.
pub const EXIT_DEVICE: i32 = 3;
/// Exit status for ROS (rcl) failures.
pub const EXIT_ROS: i32 = 1;
/// How long shutdown waits for the frame being processed (its outputs are published if it ends
/// in time; a CPU frame of a big cloud takes seconds and is abandoned).
const SHUTDOWN_WAIT: Duration = Duration::from_millis(300);

const N_REJECT: usize = Reject::ALL.len();

/// What the threads share for diagnostics.
#[derive(Debug, Default)]
struct Counters {
    received: u64,
    processed: u64,
    rejected: [u64; N_REJECT],
    last_processing_ms: Option<f64>,
    last_latency_ms: Option<f64>,
    last_voxels: Option<usize>,
    last_points: Option<usize>,
    /// Points of the last processed cloud dropped for a NaN/Inf x, y, z or intensity.
    last_points_dropped: Option<usize>,
    /// Processed frames that had more voxels than `voxelization.max_voxels` (the rest dropped,
    /// their points published with class_id 255).
    over_voxel_cap: u64,
    /// Processed clouds without an intensity field (the network saw intensity 0).
    without_intensity: u64,
    last_receipt: Option<Instant>,
    /// Receipt wall time minus the header stamp of the last cloud, ms.
    last_stamp_age_ms: Option<f64>,
    /// Header stamp (sec, nanosec) of the last processed cloud: tells a subscriber which frame a
    /// report counts (the node bench waits for the report that counts its last frame).
    last_processed_stamp: Option<(i32, u32)>,
    /// Processing against the budget over time (ERROR in the diagnostics; `crate::frame::budget`).
    budget: BudgetState,
    last_error: Option<String>,
    last_reject: Option<String>,
    /// Frames whose activations left the FP16 range (dropped or published with probability 0).
    overflow: OverflowStats,
    /// `precision: auto`: frames whose FP16 pass left the range and were computed again in FP32
    /// (published: their FP32 labels are in range), and the last one's flagged FP16 layers.
    recomputed_fp32: u64,
    last_recomputed_fp32: Option<String>,
    /// Device memory in use (the whole device), MB, sampled by the processing thread (the one
    /// with the CUDA context) at most once per [`MEMORY_EVERY`]; `None` on the CPU.
    device_used_mb: Option<f64>,
}

/// How often the processing thread samples the device memory in use for `/diagnostics`.
const MEMORY_EVERY: Duration = Duration::from_secs(1);

struct Frame {
    msg: PointCloud2,
    received: Instant,
}

/// At most one log line per second per reject reason (and for frames over the voxel cap);
/// the lines in between are counted and reported with the next one.
struct RateLimit {
    last: [Option<Instant>; N_REJECT + 3],
    suppressed: [u64; N_REJECT + 3],
}

/// [`RateLimit`] slot of the "over the voxel cap" warning (after the [`Reject`] reasons).
const VOXEL_CAP_SLOT: usize = N_REJECT;
/// [`RateLimit`] slot of the "cloud frame differs from bev.frame_id" warning.
const FRAME_SLOT: usize = N_REJECT + 1;
/// [`RateLimit`] slot of the "cloud without intensity" warning.
const INTENSITY_SLOT: usize = N_REJECT + 2;

impl RateLimit {
    fn new() -> Self {
        RateLimit {
            last: [None; N_REJECT + 3],
            suppressed: [0; N_REJECT + 3],
        }
    }

    fn warn(&mut self, logger: &str, r: &Rejected) {
        let line = format!("dropped a cloud ({}): {}", r.why.name(), r.detail);
        self.log(logger, r.why.index(), &line, Duration::from_secs(1));
    }

    fn log(&mut self, logger: &str, i: usize, line: &str, every: Duration) {
        self.log_at(logger, i, line, every, false)
    }

    /// [`RateLimit::log`] at ERROR level when `error`.
    fn log_at(&mut self, logger: &str, i: usize, line: &str, every: Duration, error: bool) {
        let now = Instant::now();
        if self.last[i].is_some_and(|t| now.duration_since(t) < every) {
            self.suppressed[i] += 1;
            return;
        }
        let more = std::mem::take(&mut self.suppressed[i]);
        let more = if more > 0 {
            format!(" ({more} more since the last such warning)")
        } else {
            String::new()
        };
        if error {
            r2r::log_error!(logger, "{line}{more}");
        } else {
            r2r::log_warn!(logger, "{line}{more}");
        }
        self.last[i] = Some(now);
    }
}

fn f64_msg(v: f64) -> Float64 {
    Float64 { data: v }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn wall_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

struct Publishers {
    points: r2r::Publisher<PointCloud2>,
    bev_labels: r2r::Publisher<Image>,
    bev_color: r2r::Publisher<Image>,
    occupancy: r2r::Publisher<OccupancyGrid>,
    processing: r2r::Publisher<Float64>,
    stages: Vec<r2r::Publisher<Float64>>,
    latency: r2r::Publisher<Float64>,
    voxels: r2r::Publisher<UInt32>,
}

/// The three BEV messages of `grids` (mono8 class image, rgb8 palette image, occupancy grid)
/// for the cloud with header `cloud`: [`BevLayout`]'s fields and the grids' data, field for
/// field, as `frame::outputs::bev_messages` makes them for replay's bags.
pub fn bev_messages(
    grids: &BevGrids,
    bev: &BevGridParams,
    cloud: &Header,
    bev_frame_id: &str,
) -> Result<(Image, Image, OccupancyGrid), String> {
    let stamp = crate::msgs::cdr::Time {
        sec: cloud.stamp.sec,
        nanosec: cloud.stamp.nanosec,
    };
    let layout = BevLayout::new(grids, bev, stamp, &cloud.frame_id, bev_frame_id)
        .map_err(|e| e.to_string())?;
    let time = |t: crate::msgs::cdr::Time| Time {
        sec: t.sec,
        nanosec: t.nanosec,
    };
    let header = Header {
        stamp: time(layout.header.stamp),
        frame_id: layout.header.frame_id.clone(),
    };
    let image = |l: &ImageLayout, data: &[u8]| Image {
        header: header.clone(),
        height: l.height,
        width: l.width,
        encoding: l.encoding.to_string(),
        is_bigendian: l.is_bigendian,
        step: l.step,
        data: data.to_vec(),
    };
    let map = &layout.map;
    let [x, y, z] = map.origin.position;
    let [qx, qy, qz, qw] = map.origin.orientation;
    let occupancy = OccupancyGrid {
        header: header.clone(),
        info: MapMetaData {
            map_load_time: time(map.map_load_time),
            resolution: map.resolution,
            width: map.width,
            height: map.height,
            origin: Pose {
                position: Point { x, y, z },
                orientation: Quaternion {
                    x: qx,
                    y: qy,
                    z: qz,
                    w: qw,
                },
            },
        },
        data: grids.occupancy.clone(),
    };
    Ok((
        image(&layout.labels, &grids.labels),
        image(&layout.color, &grids.rgb),
        occupancy,
    ))
}

struct Worker {
    mailbox: Arc<Mailbox<Frame>>,
    counters: Arc<Mutex<Counters>>,
    /// The frame processor: the LiDAR path, and the camera path with its schedule.
    frames: FrameProcessor,
    /// Where the LiDAR path's outputs go.
    lidar: LidarOutputs,
    on_cuda_error: CudaErrorPolicy,
    /// Told the reason when a CUDA error must end the node (`on_cuda_error: exit`).
    exit: tokio::sync::mpsc::UnboundedSender<String>,
    /// The camera path's subscriptions, diagnostics and publishers (`input.cameras` not
    /// empty); its map goes out after the LiDAR outputs.
    cameras: Option<super::cameras::CameraWorker>,
    /// `true` while the node exists: held (read) while publishing; shutdown sets it `false`
    /// (write, so after any publish in progress) before the node and its publishers go.
    outputs_open: Arc<RwLock<bool>>,
    logger: String,
    /// The model runs on CUDA (device memory is sampled for `/diagnostics`).
    cuda: bool,
}

impl Worker {
    fn run(mut self) {
        let mut fields: Vec<PointField> = Vec::new();
        let mut limit = RateLimit::new();
        let mut memory_sampled: Option<Instant> = None;
        while let Some(frame) = self.mailbox.take() {
            if self.cuda && memory_sampled.is_none_or(|t| t.elapsed() >= MEMORY_EVERY) {
                memory_sampled = Some(Instant::now());
                let mb = crate::device::memory::device_used_mb(true);
                self.counters.lock().unwrap_or_else(|p| p.into_inner()).device_used_mb = mb;
            }
            self.counters
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .budget
                .frame_started(Instant::now());
            // A bug hit by one frame must not end processing: a panic rejects that frame.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.process(&frame, &mut fields, &mut limit)
            }))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(Rejected {
                    why: Reject::ProcessingError,
                    detail: format!("processing panicked: {what}"),
                })
            });
            let Err(r) = result else { continue };
            {
                let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
                c.budget.frame_rejected();
                c.rejected[r.why.index()] += 1;
                c.overflow.dropped(&r);
                c.last_reject = Some(r.to_string());
                if matches!(r.why, Reject::ProcessingError | Reject::DeviceError) {
                    c.last_error = Some(r.to_string());
                }
            }
            if ends_node(self.on_cuda_error, r.why) {
                r2r::log_error!(
                    &self.logger,
                    "CUDA error, exiting (on_cuda_error: exit): {}",
                    r.detail
                );
                let _ = self.exit.send(r.detail.clone());
                return;
            }
            if r.why == Reject::Overflow {
                let line = format!("dropped a cloud (overflow, on_overflow: drop): {}", r.detail);
                limit.log_at(&self.logger, r.why.index(), &line, Duration::from_secs(1), true);
                continue;
            }
            limit.warn(&self.logger, &r);
        }
    }

    fn process(
        &mut self,
        frame: &Frame,
        fields: &mut Vec<PointField>,
        limit: &mut RateLimit,
    ) -> Result<(), Rejected> {
        let msg = &frame.msg;
        super::fields_into(msg, fields);
        if let (Some(cw), Some(path)) = (self.cameras.as_mut(), self.frames.cameras.as_mut()) {
            cw.feed(&mut path.branch);
        }
        let stamp = crate::msgs::cdr::Time { sec: msg.header.stamp.sec, nanosec: msg.header.stamp.nanosec };
        // The frame processor: the cloud decoded once, the LiDAR outputs published here as soon
        // as they are ready, the camera path beside them (or after them).
        let lidar = &mut self.lidar;
        let result = self.frames.process(&super::cloud_view(msg, fields), stamp, &msg.header.frame_id, |out| {
            lidar.publish(frame, out?, limit)
        });
        // A cloud the LiDAR path rejected gets no map either; the map goes out after the LiDAR
        // outputs.
        result.lidar?;
        if let (Some(cw), Some(c), Some(path)) = (self.cameras.as_mut(), result.cameras, self.frames.cameras.as_ref()) {
            let open = self.outputs_open.read().unwrap_or_else(|p| p.into_inner());
            cw.publish(&path.branch, c, *open);
        }
        Ok(())
    }
}

/// What the LiDAR path of a frame goes out through: the publishers, the counters, the BEV
/// messages' layout.
struct LidarOutputs {
    counters: Arc<Mutex<Counters>>,
    pubs: Publishers,
    logger: String,
    /// `bev.frame_id`; empty: the input cloud's frame.
    bev_frame: String,
    /// The BEV grid of the LiDAR outputs.
    bev_params: BevGridParams,
    budget_ms: f64,
    /// See [`Worker::outputs_open`].
    outputs_open: Arc<RwLock<bool>>,
}

impl LidarOutputs {
    /// The LiDAR outputs of a frame: the labeled cloud and BEV grids published, the counters.
    fn publish(&mut self, frame: &Frame, out: FrameOutput, limit: &mut RateLimit) -> Result<(), Rejected> {
        let msg = &frame.msg;
        let FrameOutput {
            cloud,
            grids,
            voxels,
            voxel_stats,
            points_in,
            points_kept,
            has_intensity: out_has_intensity,
            stages,
            total_ms,
            range,
            recomputed_from,
            ..
        } = out;
        if !range.is_clean() {
            // on_overflow: zero_probability (under drop the processor rejected the frame)
            limit.log_at(
                &self.logger,
                Reject::Overflow.index(),
                &format!(
                    "publishing a cloud with probability 0 and unknown BEV cells (on_overflow: zero_probability): {}",
                    crate::frame::processor::overflow_detail(&range)
                ),
                Duration::from_secs(1),
                true,
            );
        }
        if voxel_stats.voxels_dropped() > 0 {
            limit.log(
                &self.logger,
                VOXEL_CAP_SLOT,
                &format!(
                    "cloud over the voxel cap: {} voxels, voxelization.max_voxels {} kept; {} points in dropped voxels published with class_id 255",
                    voxel_stats.voxels_total, voxel_stats.voxels_kept, voxel_stats.points_capped
                ),
                Duration::from_secs(1),
            );
        }
        if !out_has_intensity {
            limit.log(
                &self.logger,
                INTENSITY_SLOT,
                "the cloud has no intensity field: the network sees intensity 0 for every point (it was trained with \
                 intensity, so labels may be worse); /diagnostics counts such frames (frames without intensity)",
                // once: a sensor without intensity sends every cloud without it; the count goes on
                Duration::MAX,
            );
        }
        if let Some(note) = frame_mismatch(&self.bev_frame, &msg.header.frame_id) {
            limit.log(
                &self.logger,
                FRAME_SLOT,
                &format!(
                    "{note}; publish clouds in `{}`, or set bev.frame_id to \"\" to use the cloud's frame",
                    self.bev_frame
                ),
                Duration::from_secs(60),
            );
        }
        let (labels, color, occupancy) = bev_messages(
            &grids,
            &self.bev_params,
            &msg.header,
            &self.bev_frame,
        )
        .map_err(|detail| Rejected {
            why: Reject::ProcessingError,
            detail,
        })?;
        let cloud_msg = super::to_msg(cloud, msg.header.clone());

        // Counted before its outputs go out: a `/diagnostics` report made after a subscriber has
        // the outputs must count the frame (counted after them, a report in between said
        // "processed 0").
        {
            let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
            c.overflow.published(&range);
            if let Some(fp16) = &recomputed_from {
                c.recomputed_fp32 += 1;
                c.last_recomputed_fp32 = Some(crate::frame::processor::overflow_detail(fp16));
            }
            c.processed += 1;
            c.last_processed_stamp = Some((msg.header.stamp.sec, msg.header.stamp.nanosec));
            c.last_processing_ms = Some(total_ms);
            c.last_voxels = Some(voxels);
            c.last_points = Some(points_kept);
            c.last_points_dropped = Some(points_in - points_kept);
            if voxel_stats.voxels_dropped() > 0 {
                c.over_voxel_cap += 1;
            }
            if !out_has_intensity {
                c.without_intensity += 1;
            }
            c.budget
                .frame_processed(Instant::now(), total_ms > self.budget_ms);
        }

        let open = self.outputs_open.read().unwrap_or_else(|p| p.into_inner());
        if !*open {
            return Ok(()); // shutting down: the node and its publishers are going
        }
        // A failed publish is not the frame's fault.
        let _ = self.pubs.points.publish(&cloud_msg);
        let _ = self.pubs.bev_labels.publish(&labels);
        let _ = self.pubs.bev_color.publish(&color);
        let _ = self.pubs.occupancy.publish(&occupancy);
        let latency = ms(frame.received.elapsed());
        for (p, v) in self.pubs.stages.iter().zip(stages) {
            let _ = p.publish(&f64_msg(v));
        }
        let _ = self.pubs.voxels.publish(&UInt32 {
            data: voxels.min(u32::MAX as usize) as u32,
        });
        let _ = self.pubs.latency.publish(&f64_msg(latency));
        let _ = self.pubs.processing.publish(&f64_msg(total_ms));
        drop(open);
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_latency_ms = Some(latency);
        Ok(())
    }
}

/// Whether a rejected frame ends the node: a CUDA error under `on_cuda_error: exit`. Everything
/// else (bad input, CPU processing errors, CUDA errors under `recover`) drops only the frame.
fn ends_node(policy: CudaErrorPolicy, why: Reject) -> bool {
    why == Reject::DeviceError && policy == CudaErrorPolicy::Exit
}

/// `diagnostic_msgs/DiagnosticStatus` levels (r2r's constants are bindgen enum types).
const LEVEL_OK: u8 = 0;
const LEVEL_WARN: u8 = 1;
const LEVEL_ERROR: u8 = 2;

/// Static facts for the diagnostics.
struct DiagInfo {
    name: String,
    device: String,
    model_config: String,
    weights: String,
    budget_ms: f64,
    error_after_s: f64,
    on_overflow: OverflowPolicy,
    /// The model's `precision` (fp16, bf16, fp32, auto).
    precision: String,
}

/// Counts since the previous report, for the level.
#[derive(Debug, Default, Clone, Copy)]
struct Since {
    device_errors: u64,
    processing_errors: u64,
    rejected: u64,
    /// Frames out of the FP16 range (dropped or not).
    overflows: u64,
    /// Frames `precision: auto` computed again in FP32.
    recomputed_fp32: u64,
}

/// One `/diagnostics` message.
///
/// Level, first match: ERROR when every frame processed during the last `budget.error_after_s`
/// seconds was over `budget.processing_ms`, frame after frame for that long (see
/// [`crate::frame::budget`]: idle time is never over budget), or a CUDA error happened since the last report,
/// or a frame left the FP16 range since the last report (dropped or not, see `on_overflow`);
/// WARN when the last frame was over budget, processing failed, or frames were rejected since
/// the last report; OK otherwise. Values: received, processed, skipped, rejected (total and
/// `rejected.<reason>`), last processing ms, last latency ms (receipt to publication), input age
/// ms (since the last cloud arrived), input stamp age ms (arrival minus header stamp), last
/// processed stamp (header stamp of the last processed cloud), last points, last points dropped (NaN/Inf x, y, z or intensity), last voxels, frames over the voxel cap, frames out of
/// fp16 range, on_overflow, device, host rss MB (this process), device memory used MB (the whole
/// device, sampled once a second before a frame; `none` on the CPU), model config, weights, budget,
/// last reject, last error, last out of fp16 range.
fn diagnostics(info: &DiagInfo, c: &Counters, skipped: u64, since: Since) -> DiagnosticArray {
    let now = Instant::now();
    let over_for = c.budget.error(now, info.budget_ms, info.error_after_s);
    let over = c.last_processing_ms.is_some_and(|m| m > info.budget_ms);
    let last_error = c.last_error.as_deref().unwrap_or("?");
    let (level, message) = match (over_for, over) {
        (Some(s), _) => (
            LEVEL_ERROR,
            format!(
                "processing over the {} ms budget for {s:.1} s",
                info.budget_ms
            ),
        ),
        _ if since.device_errors > 0 => (
            LEVEL_ERROR,
            format!("{} CUDA error(s): {last_error}", since.device_errors),
        ),
        _ if since.overflows > 0 => (
            LEVEL_ERROR,
            c.overflow
                .diagnostic(since.overflows, info.on_overflow)
                .unwrap_or_default(),
        ),
        (_, true) => (
            LEVEL_WARN,
            format!(
                "processing {:.1} ms, over the {} ms budget",
                c.last_processing_ms.unwrap_or(0.0),
                info.budget_ms
            ),
        ),
        _ if since.processing_errors > 0 => {
            (LEVEL_WARN, format!("processing failed: {last_error}"))
        }
        _ if since.rejected > 0 => (
            LEVEL_WARN,
            format!(
                "{} input cloud(s) rejected, last: {}",
                since.rejected,
                c.last_reject.as_deref().unwrap_or("?")
            ),
        ),
        _ if since.recomputed_fp32 > 0 => (
            LEVEL_WARN,
            format!(
                "precision auto: {} frame(s) left the FP16 range and were computed again in FP32 (published; the model stays on FP32): {}",
                since.recomputed_fp32,
                c.last_recomputed_fp32.as_deref().unwrap_or("?")
            ),
        ),
        _ if c.received == 0 => (LEVEL_OK, "no input cloud yet".to_string()),
        _ => (LEVEL_OK, "ok".to_string()),
    };
    let kv = |k: &str, v: String| KeyValue {
        key: k.to_string(),
        value: v,
    };
    let opt = |v: Option<f64>| v.map_or_else(|| "none".to_string(), |v| format!("{v:.3}"));
    let opt_n = |v: Option<usize>| v.map_or_else(|| "none".to_string(), |v| v.to_string());
    let rejected: u64 = c.rejected.iter().sum();
    let mut values = vec![
        kv("received", c.received.to_string()),
        kv("processed", c.processed.to_string()),
        kv("skipped", skipped.to_string()),
        kv("rejected", rejected.to_string()),
    ];
    for r in Reject::ALL {
        values.push(kv(
            &format!("rejected.{}", r.name()),
            c.rejected[r.index()].to_string(),
        ));
    }
    values.extend([
        kv("last processing ms", opt(c.last_processing_ms)),
        kv("last latency ms", opt(c.last_latency_ms)),
        kv(
            "input age ms",
            opt(c.last_receipt.map(|t| ms(now.duration_since(t)))),
        ),
        kv("input stamp age ms", opt(c.last_stamp_age_ms)),
        kv(
            "last processed stamp",
            c.last_processed_stamp
                .map_or_else(|| "none".to_string(), |(s, ns)| format!("{s}.{ns:09}")),
        ),
        kv("last points", opt_n(c.last_points)),
        kv("last points dropped", opt_n(c.last_points_dropped)),
        kv("last voxels", opt_n(c.last_voxels)),
        kv("frames over voxel cap", c.over_voxel_cap.to_string()),
        kv("frames without intensity", c.without_intensity.to_string()),
        kv("frames out of fp16 range", c.overflow.frames.to_string()),
        kv("on_overflow", info.on_overflow.name().to_string()),
        kv("precision", info.precision.clone()),
        kv("frames recomputed in fp32", c.recomputed_fp32.to_string()),
        kv("device", info.device.clone()),
        kv("host rss MB", opt(crate::device::memory::host_rss_mb())),
        kv("device memory used MB", opt(c.device_used_mb)),
        kv("model config", info.model_config.clone()),
        kv("weights", info.weights.clone()),
        kv("budget ms", format!("{:.3}", info.budget_ms)),
        kv("error after s", format!("{:.3}", info.error_after_s)),
    ]);
    if let Some(e) = &c.last_reject {
        values.push(kv("last reject", e.clone()));
    }
    if let Some(e) = &c.last_error {
        values.push(kv("last error", e.clone()));
    }
    if let Some(e) = &c.overflow.last {
        values.push(kv("last out of fp16 range", e.clone()));
    }
    if let Some(e) = &c.last_recomputed_fp32 {
        values.push(kv("last recomputed in fp32", e.clone()));
    }
    let t = wall_now();
    let mut header = Header::default();
    header.stamp.sec = t.as_secs().min(i32::MAX as u64) as i32;
    header.stamp.nanosec = t.subsec_nanos();
    DiagnosticArray {
        header,
        status: vec![DiagnosticStatus {
            level,
            name: info.name.clone(),
            message,
            hardware_id: info.device.clone(),
            values,
        }],
    }
}

/// Everything set up from parameters, before any thread starts.
struct Setup {
    node: r2r::Node,
    params: NodeParams,
    model: ModelConfig,
    weights: PathBuf,
    processor: Processor,
    /// The camera branch's state, when `input.cameras` is set.
    camera_branch: Option<crate::frame::cameras::CameraBranch>,
    /// The BEV map model, when `camera.model_config` is set too.
    map_model: Option<crate::frame::map_model::SegMapModel>,
}

/// Parameter `device` resolved as every entry point resolves it ([`crate::device::resolve`]):
/// `auto` on the CPU is said on stderr with the reason; `cuda` that cannot be had is the message
/// to exit with.
fn resolve_device(choice: crate::device::DeviceChoice) -> Result<crate::device::ResolvedDevice, String> {
    let device = crate::device::resolve(choice).map_err(|e| {
        format!("parameter `device` is `{choice}`: {e}; set `device: cpu` (launch argument device:=cpu) to run on the CPU, or `device: auto` to fall back to it")
    })?;
    if let Some(why) = &device.fallback {
        eprintln!("perception_node: device auto: running on the CPU: {why}");
    }
    Ok(device)
}

fn fail(code: i32, msg: impl std::fmt::Display) -> i32 {
    eprintln!("perception_node: {msg}");
    code
}

/// The node's `main`: returns the process exit status.
pub fn main() -> i32 {
    let args: Vec<String> = std::env::args().skip(1).collect();

    // 1. The params files, before rcl sees them (Context::create panics on a malformed file).
    if params::dangling_params_file(&args) {
        return fail(EXIT_PARAMS, "`--params-file` needs a path after it");
    }
    let files = params::params_files(&args);
    let (name, ns) = params::node_name_from_args(&args);
    let file_maps = match params::validate_params_files(&files, &name, &ns) {
        Ok(m) => m,
        Err(e) => return fail(EXIT_PARAMS, format!("invalid params file: {e}")),
    };

    // 2. ROS.
    let ctx = match std::panic::catch_unwind(r2r::Context::create) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => return fail(EXIT_ROS, format!("cannot initialise ROS 2 (rcl): {e}")),
        Err(_) => {
            return fail(
                EXIT_ROS,
                "cannot initialise ROS 2: rcl rejected the command line (see above)",
            )
        }
    };
    let node = match r2r::Node::create(ctx, "sptr", "") {
        Ok(n) => n,
        Err(e) => return fail(EXIT_ROS, format!("cannot create the node: {e}")),
    };
    let fqn = node
        .fully_qualified_name()
        .unwrap_or_else(|_| "sptr".into());

    // 3. The parameters r2r gives the node (files + `-p` overrides), validated again.
    let ros_params: Vec<(String, r2r::ParameterValue)> = node
        .params
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(k, v)| (k.clone(), v.value.clone()))
        .collect();
    let source = if files.is_empty() {
        format!("parameters of node {fqn} (no --params-file)")
    } else {
        let list: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        format!("parameters of node {fqn} ({} + overrides)", list.join(", "))
    };
    let params = match params::merged(&file_maps, &ros_params, &source) {
        Ok(p) => p,
        Err(e) => return fail(EXIT_PARAMS, format!("invalid parameters: {e}")),
    };
    let model_path: PathBuf = params::model_config_path(&params, &file_maps);
    let mut model = match ModelConfig::load(&model_path) {
        Ok(m) => m,
        Err(e) => {
            return fail(
                EXIT_PARAMS,
                format!("parameter `model.config`: invalid model YAML: {e}"),
            )
        }
    };
    // parameter `precision` overrides the model YAML's
    if let Some(p) = params.precision {
        model.yaml.precision = p;
    }
    if params.model.weights.is_empty() {
        return fail(
            EXIT_PARAMS,
            "parameter `model.weights` is empty: the node needs SphereFormer weights (a safetensors file \
             exported from the upstream checkpoint, see docs/cli.md); set it in the params file, pass \
             `-p model.weights:=/path/model.safetensors`, or the launch argument weights:=/path/model.safetensors",
        );
    }
    let weights = params::weights_path(&params, &file_maps);

    // 4. The model on the device.
    let bev = bev_params(
        &model.yaml,
        params.bev.range,
        params.bev.resolution,
        &params.bev.obstacle_classes,
    );
    let device = match resolve_device(params.device) {
        Ok(d) => d,
        Err(e) => return fail(EXIT_DEVICE, e),
    };
    let t = Instant::now();
    let mut processor = match Processor::open(device.device, &model.yaml, &weights, bev) {
        Ok(p) => p,
        Err(e) if e.starts_with("parameter `device`") => return fail(EXIT_DEVICE, e),
        Err(e) => return fail(EXIT_PARAMS, e),
    };
    processor.set_on_overflow(params.on_overflow);

    // 5. The camera branch and the BEV map model.
    let (camera_branch, map_model) = match open_cameras(&params, &file_maps, &device) {
        Ok(c) => c,
        Err((code, e)) => return fail(code, e),
    };
    eprintln!(
        "perception_node: model {} with weights {} loaded on {} in {:.0} ms",
        model.source.display(),
        weights.display(),
        processor.device_name(),
        ms(t.elapsed())
    );

    let code = run(
        Setup {
            node,
            params,
            model,
            weights,
            processor,
            camera_branch,
            map_model,
        },
        fqn,
    );
    exit_now(code)
}

/// The stop line's counts.
fn stop_counts(c: &Counters, skipped: u64) -> String {
    format!(
        "received {}, processed {}, skipped {}, rejected {}",
        c.received,
        c.processed,
        skipped,
        c.rejected.iter().sum::<u64>()
    )
}

/// Ends the process with `code` when the stop guard's deadline passed (a stage of the orderly
/// stop still running, see [`super::stop_guard`]): flushes the C streams and `_exit`s. Unlike
/// [`exit_now`] it leaves the ROS log files unflushed: the stage that hangs may be inside rcl.
fn exit_forced(code: i32) -> ! {
    use std::io::Write;
    extern "C" {
        fn fflush(stream: *mut std::ffi::c_void) -> i32;
        fn _exit(status: i32) -> !;
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: fflush(NULL) flushes every C stream; _exit does not return.
    unsafe {
        fflush(std::ptr::null_mut());
        _exit(code)
    }
}

/// Ends the process at once with `code`, after the node's orderly stop in [`run`] (threads
/// joined, the node and its DDS participant deleted, the final log line written): flushes
/// stdout, stderr and the ROS log files (`rcl_logging_fini`; r2r configures logging but never
/// finalizes it), then `_exit`. What `exit` would still run are the libraries' static
/// destructors (Fast DDS factories and shared-memory mappings, thread joins): measured at
/// 0.1-0.3 s on a 2-core machine, more when loaded, with nothing left to clean up that the
/// operating system does not release with the process. Skipping them is what a SIGKILL does,
/// which DDS implementations are built to survive; our participant has already said goodbye.
fn exit_now(code: i32) -> ! {
    use std::io::Write;
    extern "C" {
        fn rcl_logging_fini() -> i32;
        fn fflush(stream: *mut std::ffi::c_void) -> i32;
        fn _exit(status: i32) -> !;
    }
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: plain C calls without arguments that need to outlive them: the ROS context was
    // created (logging configured) before `run`, and is shut down; fflush(NULL) flushes every C
    // stream; _exit does not return.
    unsafe {
        rcl_logging_fini();
        fflush(std::ptr::null_mut());
        _exit(code)
    }
}

fn run(setup: Setup, fqn: String) -> i32 {
    let Setup {
        mut node,
        params,
        model,
        weights,
        processor,
        camera_branch,
        map_model,
    } = setup;
    let logger = node.logger().to_string();
    let topics = &params.topics;

    let qos = r2r::QosProfile::sensor_data().keep_last(params.input.qos_depth);
    let sub = match node.subscribe::<PointCloud2>(&topics.input_points, qos) {
        Ok(s) => s,
        Err(e) => {
            return fail(
                EXIT_ROS,
                format!(
                    "cannot subscribe to {} (topics.input_points): {e}",
                    topics.input_points
                ),
            )
        }
    };
    let (pubs, diag_pub) = match create_publishers(&mut node, topics) {
        Ok(p) => p,
        Err(e) => {
            return fail(
                EXIT_ROS,
                format!("cannot create the publishers (check the topics.* parameters): {e}"),
            )
        }
    };

    let (rt, mut sigint, mut sigterm) = match start_runtime() {
        Ok(r) => r,
        Err(e) => return fail(EXIT_ROS, e),
    };

    let (cameras, camera_diag, camera_path) = match start_cameras(&mut node, &rt, &params, camera_branch, map_model, &logger) {
        Ok(c) => c,
        Err((code, e)) => return fail(code, e),
    };

    let mailbox: Arc<Mailbox<Frame>> = Arc::new(Mailbox::new());
    let counters = Arc::new(Mutex::new(Counters::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let (exit_tx, mut exit_rx) = tokio::sync::mpsc::unbounded_channel::<String>();

    // Processing thread.
    let device = processor.device_name().to_string();
    let bev_cells = (
        processor.bev_params().width(),
        processor.bev_params().height(),
    );
    let outputs_open = Arc::new(RwLock::new(true));
    let worker = Worker {
        outputs_open: outputs_open.clone(),
        mailbox: mailbox.clone(),
        counters: counters.clone(),
        lidar: LidarOutputs {
            counters: counters.clone(),
            pubs,
            logger: logger.clone(),
            bev_frame: params.bev.frame_id.clone(),
            bev_params: processor.bev_params().clone(),
            budget_ms: params.budget.processing_ms,
            outputs_open: outputs_open.clone(),
        },
        frames: FrameProcessor::new(processor, camera_path, params.camera.beside_lidar),
        on_cuda_error: params.on_cuda_error,
        exit: exit_tx,
        cameras,
        logger: logger.clone(),
        cuda: device.starts_with("cuda"),
    };
    let worker = match std::thread::Builder::new()
        .name("sptr-process".into())
        .spawn(move || worker.run())
    {
        Ok(h) => h,
        Err(e) => return fail(EXIT_ROS, format!("cannot start the processing thread: {e}")),
    };

    // Subscription -> mailbox.
    spawn_subscription(&rt, sub, mailbox.clone(), counters.clone());

    // Diagnostics at 1 Hz.
    let info = DiagInfo {
        name: format!("{fqn}: perception"),
        device: device.clone(),
        model_config: model.source.display().to_string(),
        weights: weights.display().to_string(),
        budget_ms: params.budget.processing_ms,
        error_after_s: params.budget.error_after_s,
        on_overflow: params.on_overflow,
        precision: if device.starts_with("cpu") {
            format!("{} (not used: the CPU computes in FP32)", model.yaml.precision.name())
        } else {
            model.yaml.precision.name().to_string()
        },
    };
    spawn_diagnostics(&rt, info, mailbox.clone(), counters.clone(), camera_diag, diag_pub);

    // Spinning thread: owns the node.
    let spinner = match spawn_spinner(node, stop.clone()) {
        Ok(h) => h,
        Err(e) => {
            mailbox.close();
            let _ = worker.join();
            return fail(EXIT_ROS, format!("cannot start the spinning thread: {e}"));
        }
    };

    r2r::log_info!(&logger, "{}", ready_line(&params, &model, &device, bev_cells));

    let (which, device_error) = rt.block_on(async {
        tokio::select! {
            _ = sigint.recv() => ("SIGINT", None),
            _ = sigterm.recv() => ("SIGTERM", None),
            Some(e) = exit_rx.recv() => ("CUDA error", Some(e)),
        }
    });

    shutdown(Shutdown { which, device_error, rt, worker, spinner, stop, mailbox, counters, outputs_open })
}

/// The camera branch: its calibration file and state, and the BEV map model (on the `device` of
/// the LiDAR model) from `camera.model_config` / `camera.model_weights`. `Err`: the exit code and
/// why.
#[allow(clippy::type_complexity)]
fn open_cameras(
    params: &NodeParams,
    file_maps: &[(PathBuf, serde_yaml::Mapping)],
    device: &crate::device::ResolvedDevice,
) -> Result<(Option<crate::frame::cameras::CameraBranch>, Option<crate::frame::map_model::SegMapModel>), (i32, String)> {
    let camera_branch = if params.input.cameras.is_empty() {
        None
    } else {
        let file = match params::calibration_file_path(&params, &file_maps) {
            Some(path) => match crate::sensors::calib::file::CalibrationFile::load(&path) {
                Ok(f) => Some(f),
                Err(e) => return Err((EXIT_PARAMS, format!("parameter `camera.calibration_file`: {e}"))),
            },
            None => None,
        };
        match crate::frame::cameras::CameraBranch::new(super::cameras::branch_config(&params, file)) {
            Ok(b) => Some(b),
            Err(e) => return Err((EXIT_PARAMS, format!("camera parameters: {e}"))),
        }
    };
    let map_model = match (&camera_branch, params::camera_model_path(&params, &file_maps)) {
        (Some(_), Some(config)) => {
            use crate::frame::map_model::{SegMapModel, SegWeightsSource};
            // `random:<seed>` as it is; a file relative to the params file that set it
            let weights = match SegWeightsSource::parse(&params.camera.model_weights) {
                Ok(SegWeightsSource::File(_)) => match params::camera_weights_path(&params, &file_maps) {
                    Some(p) => SegWeightsSource::File(p),
                    None => return Err((EXIT_PARAMS, "parameter `camera.model_weights` is empty".into())),
                },
                Ok(w) => w,
                Err(e) => {
                    return Err((EXIT_PARAMS, format!("parameter `camera.model_weights`: {e}; or set camera.model_config to \"\" for no BEV map (launch camera_weights:=)")))
                }
            };
            let cuda = device.is_cuda();
            match SegMapModel::open(&config, &weights, device.device) {
                Ok(mut m) => {
                    if let Some(w) = m.apply_cuda_graph_param(params.camera.cuda_graph) {
                        eprintln!("perception_node: warning: {w}");
                    }
                    Some(m)
                }
                Err(e) if cuda && e.to_string().contains("CUDA") => return Err((EXIT_DEVICE, format!("BEV map model on device cuda: {e}"))),
                Err(e) => return Err((EXIT_PARAMS, format!("parameter `camera.model_config` / `camera.model_weights`: {e}"))),
            }
        }
        _ => None,
    };
    Ok((camera_branch, map_model))
}

/// The tokio runtime of the subscription and diagnostics tasks, with the SIGINT and SIGTERM
/// handlers installed first (so a SIGINT from then on is ours).
fn start_runtime() -> Result<(tokio::runtime::Runtime, tokio::signal::unix::Signal, tokio::signal::unix::Signal), String> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the tokio runtime: {e}"))?;
    let signals = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?))
    });
    let (sigint, sigterm) = signals.map_err(|e| format!("cannot install the SIGINT/SIGTERM handlers: {e}"))?;
    Ok((rt, sigint, sigterm))
}

/// The spinning thread: it owns the node, spins until `stop`, then drops it (its publishers,
/// subscriptions and DDS participant).
fn spawn_spinner(node: r2r::Node, stop: Arc<AtomicBool>) -> std::io::Result<std::thread::JoinHandle<()>> {
    let mut node = node;
    std::thread::Builder::new().name("sptr-spin".into()).spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            node.spin_once(Duration::from_millis(50));
        }
        drop(node);
    })
}

/// The node's "ready" log line: device, model, BEV grid, budget, inputs.
fn ready_line(params: &NodeParams, model: &ModelConfig, device: &str, bev_cells: (usize, usize)) -> String {
    let vox = &model.yaml.voxelization;
    let camera_line = match params.input.cameras.len() {
        0 => String::new(),
        n if params.camera.beside_lidar => format!("; {n} cameras, their frame beside the LiDAR path"),
        n => format!("; {n} cameras, their frame after the LiDAR outputs (camera.beside_lidar: false)"),
    };
    format!(
        "ready: device {device}, model {} ({} voxels max, {} points max), BEV {} x {} cells of {} m, budget {} ms; input {}{camera_line}",
        model.source.display(),
        vox.max_voxels,
        vox.max_points,
        bev_cells.0,
        bev_cells.1,
        params.bev.resolution,
        params.budget.processing_ms,
        params.topics.input_points
    )
}

/// The LiDAR outputs' and the debug topics' publishers, and `/diagnostics`'.
fn create_publishers(node: &mut r2r::Node, topics: &TopicParams) -> r2r::Result<(Publishers, r2r::Publisher<DiagnosticArray>)> {
    let q = r2r::QosProfile::default();
    let out = r2r::QosProfile::default().reliable().keep_last(1);
    let mut stages = Vec::with_capacity(STAGES.len());
    for s in STAGES {
        stages.push(node.create_publisher(&format!("~/debug/stage_ms/{s}"), q.clone())?);
    }
    Ok((
        Publishers {
            points: node.create_publisher(&topics.output_points, out.clone())?,
            bev_labels: node.create_publisher(&topics.bev_labels, out.clone())?,
            bev_color: node.create_publisher(&topics.bev_labels_color, out.clone())?,
            occupancy: node.create_publisher(&topics.bev_occupancy, out)?,
            processing: node.create_publisher("~/debug/processing_time_ms", q.clone())?,
            stages,
            latency: node.create_publisher("~/debug/latency_ms", q.clone())?,
            voxels: node.create_publisher("~/debug/voxels", q.clone())?,
        },
        node.create_publisher("/diagnostics", q)?,
    ))
}

/// The camera branch's subscriptions (tasks on the runtime), diagnostics and map publishers;
/// the branch and the BEV map model go to the frame processor's camera path. `Err`: the exit
/// code and why.
#[allow(clippy::type_complexity)]
fn start_cameras(
    node: &mut r2r::Node,
    rt: &tokio::runtime::Runtime,
    params: &NodeParams,
    camera_branch: Option<crate::frame::cameras::CameraBranch>,
    map_model: Option<crate::frame::map_model::SegMapModel>,
    logger: &str,
) -> Result<(Option<super::cameras::CameraWorker>, Option<Arc<Mutex<super::cameras::CameraDiag>>>, Option<CameraPath>), (i32, String)> {
    // The camera branch's subscriptions (tasks on the runtime) and outputs; the branch and the
    // BEV map model go to the frame processor's camera path.
    let (mut cameras, camera_diag, camera_path) = match camera_branch {
        None => (None, None, None),
        Some(branch) => match super::cameras::start(node, rt, params, logger) {
            Ok((w, d)) => {
                let path = CameraPath { branch, model: None, style: None, bev_frame: params.bev.frame_id.clone() };
                (Some(w), Some(d), Some(path))
            }
            Err(e) => {
                return Err((EXIT_ROS, format!("cannot subscribe to the cameras (check input.cameras and camera.*): {e}")))
            }
        },
    };
    let mut camera_path = camera_path;
    if let (Some(w), Some(path), Some(m)) = (cameras.as_mut(), camera_path.as_mut(), map_model) {
        let classes = m.classes().to_vec();
        let thresholds = match params.map_thresholds(classes.len()) {
            Ok(t) => t,
            Err(e) => return Err((EXIT_PARAMS, e)),
        };
        let palette = classes.iter().map(|c| crate::models::bevfusion::map::class_colour(c)).collect();
        let style = crate::frame::map_messages::MapStyle { thresholds, palette };
        match super::cameras::MapPublishers::create(node, &classes, &style) {
            Ok(p) => {
                w.set_map_publishers(p, m.description().to_string());
                path.model = Some(Box::new(m));
                path.style = Some(style);
            }
            Err(e) => return Err((EXIT_ROS, format!("cannot create the BEV map publishers: {e}"))),
        }
    }
    Ok((cameras, camera_diag, camera_path))
}

/// The cloud subscription's task: every message into the mailbox (the newest wins), counted.
fn spawn_subscription(
    rt: &tokio::runtime::Runtime,
    mut sub: impl futures::Stream<Item = PointCloud2> + Unpin + Send + 'static,
    mailbox: Arc<Mailbox<Frame>>,
    counters: Arc<Mutex<Counters>>,
) {
    rt.spawn(async move {
        while let Some(msg) = sub.next().await {
            let now = Instant::now();
            let stamp = Duration::new(
                msg.header.stamp.sec.max(0) as u64,
                msg.header.stamp.nanosec.min(999_999_999),
            );
            let age = wall_now().as_secs_f64() - stamp.as_secs_f64();
            {
                let mut c = counters.lock().unwrap_or_else(|p| p.into_inner());
                c.received += 1;
                c.last_receipt = Some(now);
                c.last_stamp_age_ms = Some(age * 1e3);
            }
            mailbox.put(Frame { msg, received: now });
        }
    });
}

/// The `/diagnostics` task: one report a second, the counts since the last one.
fn spawn_diagnostics(
    rt: &tokio::runtime::Runtime,
    info: DiagInfo,
    mailbox: Arc<Mailbox<Frame>>,
    counters: Arc<Mutex<Counters>>,
    camera_diag: Option<Arc<Mutex<super::cameras::CameraDiag>>>,
    diag_pub: r2r::Publisher<DiagnosticArray>,
) {
    rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seen = [0u64; N_REJECT];
        let mut seen_overflows = 0u64;
        let mut seen_recomputed = 0u64;
        loop {
            tick.tick().await;
            let skipped = mailbox.skipped();
            let msg = {
                let c = counters.lock().unwrap_or_else(|p| p.into_inner());
                let new = |r: Reject| c.rejected[r.index()] - seen[r.index()];
                let since = Since {
                    device_errors: new(Reject::DeviceError),
                    processing_errors: new(Reject::ProcessingError),
                    rejected: Reject::ALL.iter().map(|&r| new(r)).sum(),
                    overflows: c.overflow.frames - seen_overflows,
                    recomputed_fp32: c.recomputed_fp32 - seen_recomputed,
                };
                let mut m = diagnostics(&info, &c, skipped, since);
                if let Some(d) = &camera_diag {
                    super::cameras::extend_diagnostics(&mut m, &d.lock().unwrap_or_else(|p| p.into_inner()));
                }
                seen = c.rejected;
                seen_overflows = c.overflow.frames;
                seen_recomputed = c.recomputed_fp32;
                m
            };
            let _ = diag_pub.publish(&msg);
        }
    });
}

/// What the node's shutdown stops, in order.
struct Shutdown {
    /// The signal (or the CUDA error) that ends the node.
    which: &'static str,
    device_error: Option<String>,
    rt: tokio::runtime::Runtime,
    worker: std::thread::JoinHandle<()>,
    spinner: std::thread::JoinHandle<()>,
    stop: Arc<AtomicBool>,
    mailbox: Arc<Mailbox<Frame>>,
    counters: Arc<Mutex<Counters>>,
    outputs_open: Arc<RwLock<bool>>,
}

fn shutdown(sd: Shutdown) -> i32 {
    let Shutdown { which, device_error, rt, worker, spinner, stop, mailbox, counters, outputs_open } = sd;
    // Shutdown within a second: stop taking frames, let the worker finish the frame it has
    // (waiting at most SHUTDOWN_WAIT: a big cloud on the CPU takes longer and is abandoned; the
    // process exit ends it). No publisher may be in use when the node goes: close the outputs
    // (after a publish in progress), stop the runtime's tasks (subscription, diagnostics), then
    // the spinner (at most one 50 ms spin_once) drops the node: its publishers, subscription and
    // DDS participant, which tells the other participants we are gone. The stop guard ends the
    // process at STOP_DEADLINE if a stage hangs (DDS's teardown once did, on a loaded machine).
    let t = Instant::now();
    let code = if device_error.is_some() { EXIT_DEVICE } else { 0 };
    let mut guard = {
        let (counters, mailbox) = (counters.clone(), mailbox.clone());
        StopGuard::new(
            which,
            // try_lock: a thread stuck with the counters must not hold up the forced exit
            move || match counters.try_lock() {
                Ok(c) => stop_counts(&c, mailbox.skipped()),
                Err(_) => format!("counts unavailable, skipped {}", mailbox.skipped()),
            },
            Box::new(move |line| {
                eprintln!("{line}");
                exit_forced(code)
            }),
        )
    };
    guard.arm(t, STOP_DEADLINE);
    mailbox.close();
    while !worker.is_finished() && t.elapsed() < SHUTDOWN_WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let worker_wait = t.elapsed();
    let worker_ok = if worker.is_finished() {
        worker.join().is_ok()
    } else {
        eprintln!(
            "perception_node: the processing thread is still busy with a frame after {} ms; exiting without it",
            SHUTDOWN_WAIT.as_millis()
        );
        true
    };
    *outputs_open.write().unwrap_or_else(|p| p.into_inner()) = false;
    guard.stage(StopStage::Runtime);
    let t_runtime = Instant::now();
    rt.shutdown_timeout(Duration::from_millis(100));
    let runtime_stop = t_runtime.elapsed();
    guard.stage(StopStage::RosNode);
    let t_spinner = Instant::now();
    stop.store(true, Ordering::Relaxed);
    let spinner_ok = spinner.join().is_ok();
    let spinner_stop = t_spinner.elapsed();
    guard.stage(StopStage::Report);
    let counts = stop_counts(&counters.lock().unwrap_or_else(|p| p.into_inner()), mailbox.skipped());
    if !guard.finish() {
        // The guard wrote the last line and is ending the process.
        loop {
            std::thread::park();
        }
    }
    // The stages' times say where a slow stop went.
    eprintln!(
        "perception_node: {which}: stopped in {:.0} ms (processing thread {:.0} ms, runtime {:.0} ms, ROS node {:.0} ms; {counts})",
        ms(t.elapsed()),
        ms(worker_wait),
        ms(runtime_stop),
        ms(spinner_stop),
    );
    if let Some(e) = device_error {
        return fail(
            EXIT_DEVICE,
            format!(
                "stopped on a CUDA error (parameter on_cuda_error: exit): {e}; check the GPU (nvidia-smi) \
                 and restart, or set on_cuda_error: recover to drop such frames and keep running"
            ),
        );
    }
    if worker_ok && spinner_ok {
        0
    } else {
        fail(EXIT_ROS, "a thread panicked during shutdown")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> DiagInfo {
        DiagInfo {
            name: "/sptr: perception".into(),
            device: "cpu".into(),
            model_config: "m.yaml".into(),
            weights: "w.safetensors".into(),
            budget_ms: 100.0,
            error_after_s: 2.0,
            on_overflow: OverflowPolicy::Drop,
            precision: "auto".into(),
        }
    }

    fn level_and_values(c: &Counters, since: Since) -> (u8, String, Vec<(String, String)>) {
        let d = diagnostics(&info(), c, 3, since);
        let s = &d.status[0];
        (
            s.level,
            s.message.clone(),
            s.values
                .iter()
                .map(|kv| (kv.key.clone(), kv.value.clone()))
                .collect(),
        )
    }

    #[test]
    fn rejects_warn_cuda_errors_are_errors_and_all_are_counted() {
        let mut c = Counters {
            received: 5,
            processed: 2,
            ..Default::default()
        };
        c.rejected[Reject::Malformed.index()] = 2;
        c.rejected[Reject::DeviceError.index()] = 1;
        c.last_reject = Some("malformed: truncated".into());
        c.last_error = Some("device_error: CUDA: illegal address".into());
        let (level, msg, values) = level_and_values(&c, Since::default());
        assert_eq!(level, LEVEL_OK, "{msg}");
        let get = |k: &str| {
            values
                .iter()
                .find(|(kk, _)| kk == k)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("rejected").as_deref(), Some("3"));
        assert_eq!(get("rejected.malformed").as_deref(), Some("2"));
        assert_eq!(get("rejected.device_error").as_deref(), Some("1"));
        assert_eq!(get("skipped").as_deref(), Some("3"));
        assert_eq!(get("last processed stamp").as_deref(), Some("none"));
        let stamped = Counters {
            last_processed_stamp: Some((1_700_000_000, 5_000)),
            ..Default::default()
        };
        let (_, _, values) = level_and_values(&stamped, Since::default());
        assert!(
            values.contains(&("last processed stamp".into(), "1700000000.000005000".into())),
            "{values:?}"
        );
        let (level, msg, _) = level_and_values(
            &c,
            Since {
                rejected: 2,
                ..Default::default()
            },
        );
        assert_eq!(level, LEVEL_WARN);
        assert!(
            msg.contains("2 input cloud(s) rejected") && msg.contains("truncated"),
            "{msg}"
        );
        let (level, msg, _) = level_and_values(
            &c,
            Since {
                device_errors: 1,
                rejected: 1,
                ..Default::default()
            },
        );
        assert_eq!(level, LEVEL_ERROR);
        assert!(
            msg.contains("CUDA") && msg.contains("illegal address"),
            "{msg}"
        );
    }

    /// The budget's ERROR comes from processed frames only (`crate::frame::budget`): two frames just
    /// over budget, then only rejected clouds for longer than `error_after_s`, is WARN (the last
    /// frame was over budget) with the rejects, never ERROR.
    #[test]
    fn idle_time_after_frames_over_budget_is_not_an_error() {
        let t0 = Instant::now() - Duration::from_secs(5);
        let mut c = Counters {
            received: 30,
            processed: 2,
            last_processing_ms: Some(101.3),
            ..Default::default()
        };
        c.budget.frame_started(t0);
        c.budget
            .frame_processed(t0 + Duration::from_micros(100_900), true);
        c.budget.frame_started(t0 + Duration::from_millis(500));
        c.budget
            .frame_processed(t0 + Duration::from_micros(601_300), true);
        c.rejected[Reject::Empty.index()] = 28;
        let (level, msg, _) = level_and_values(&c, Since::default());
        assert_eq!(level, LEVEL_WARN, "{msg}");
        assert!(msg.contains("over the 100 ms budget") && msg.contains("101.3"), "{msg}");
    }

    /// A frame out of the FP16 range is an ERROR in the next report (dropped or published),
    /// counted, and named; it never ends the node.
    #[test]
    fn overflow_frames_are_errors_and_counted() {
        let mut c = Counters {
            received: 3,
            processed: 1,
            ..Default::default()
        };
        let mut names = crate::device::range_guard::LayerNames::new();
        names.add("input_conv.0");
        let report = names.report(&[crate::device::range_guard::RANGE_SATURATED]);
        let detail = crate::frame::processor::overflow_detail(&report);
        c.rejected[Reject::Overflow.index()] = 1;
        c.overflow.dropped(&Rejected {
            why: Reject::Overflow,
            detail,
        });
        let since = Since {
            rejected: 1,
            overflows: 1,
            ..Default::default()
        };
        let (level, msg, values) = level_and_values(&c, since);
        assert_eq!(level, LEVEL_ERROR, "{msg}");
        assert!(
            msg.contains("1 frame(s) out of the FP16 range")
                && msg.contains("on_overflow: drop")
                && msg.contains("input_conv.0 (overflow)"),
            "{msg}"
        );
        let get = |k: &str| values.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone());
        assert_eq!(get("rejected.overflow").as_deref(), Some("1"));
        assert_eq!(get("frames out of fp16 range").as_deref(), Some("1"));
        assert_eq!(get("on_overflow").as_deref(), Some("drop"));
        assert!(get("last out of fp16 range").is_some_and(|v| v.contains("input_conv.0")));
        // published with probability 0: counted too, still an ERROR; the next report without
        // new such frames is not
        c.overflow.published(&report);
        assert_eq!(c.overflow.frames, 2);
        let (level, _, _) = level_and_values(&c, Since { overflows: 1, ..Default::default() });
        assert_eq!(level, LEVEL_ERROR);
        let (level, msg, _) = level_and_values(&c, Since::default());
        assert_eq!(level, LEVEL_OK, "{msg}");
        for policy in [CudaErrorPolicy::Exit, CudaErrorPolicy::Recover] {
            assert!(!ends_node(policy, Reject::Overflow));
        }
    }

    /// `precision: auto`: a frame computed again in FP32 is published (not an overflow, not a
    /// reject) but counted and named, a WARN in the report right after it; later reports are OK.
    #[test]
    fn diagnostics_count_frames_auto_computed_again_in_fp32() {
        let mut c = Counters::default();
        c.received = 2;
        c.processed = 2;
        let mut names = crate::device::range_guard::LayerNames::default();
        names.add("enc.0.attn.qkv");
        let report = names.report(&[crate::device::range_guard::RANGE_SATURATED]);
        c.recomputed_fp32 = 1;
        c.last_recomputed_fp32 = Some(crate::frame::processor::overflow_detail(&report));
        let (level, msg, values) = level_and_values(&c, Since { recomputed_fp32: 1, ..Default::default() });
        assert_eq!(level, LEVEL_WARN, "{msg}");
        assert!(msg.contains("1 frame(s) left the FP16 range and were computed again in FP32") && msg.contains("enc.0.attn.qkv"), "{msg}");
        let get = |k: &str| values.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone());
        assert_eq!(get("frames recomputed in fp32").as_deref(), Some("1"));
        assert_eq!(get("frames out of fp16 range").as_deref(), Some("0"));
        assert_eq!(get("precision").as_deref(), Some("auto"));
        assert!(get("last recomputed in fp32").is_some_and(|v| v.contains("enc.0.attn.qkv")));
        let (level, msg, _) = level_and_values(&c, Since::default());
        assert_eq!(level, LEVEL_OK, "{msg}");
    }

    #[test]
    fn only_cuda_errors_under_exit_end_the_node() {
        for why in Reject::ALL {
            assert!(!ends_node(CudaErrorPolicy::Recover, why), "{why:?}");
            assert_eq!(
                ends_node(CudaErrorPolicy::Exit, why),
                why == Reject::DeviceError,
                "{why:?}"
            );
        }
    }

    /// The node's r2r BEV messages and replay's CDR messages ([`crate::frame::outputs::build`]) of one
    /// grid: the same fields, and the same bytes on the wire.
    #[test]
    fn bev_messages_equal_replays() {
        use crate::msgs::cdr::CdrMessage;
        use r2r::WrappedTypesupport;

        let p = BevGridParams {
            range: [-2.0, -1.0, 2.0, 1.0],
            resolution: 0.5,
            classes: 2,
            obstacle_classes: vec![1],
            palette: vec![[1, 2, 3], [4, 5, 6]],
        };
        let g = crate::ops::label_grid::cpu::label_grid_cpu(
            &[0.1, -1.9, 1.9],
            &[0.1, -0.9, 0.9],
            &[1, 0, 1],
            &[0.9, 0.5, 0.2],
            &p,
        )
        .unwrap();
        for bev_frame in ["", "base_link"] {
            let cloud = Header {
                stamp: Time {
                    sec: 1_532_402_927,
                    nanosec: 647_951_000,
                },
                frame_id: "lidar_top".into(),
            };
            let (labels, color, occ) = bev_messages(&g, &p, &cloud, bev_frame).unwrap();
            let out = FrameOutput {
                cloud: crate::msgs::cloud::encode_labeled(&crate::Points::default(), &[], &[]).unwrap(),
                grids: g.clone(),
                voxels: 0,
                voxel_stats: Default::default(),
                points_in: 0,
                points_kept: 0,
                has_intensity: true,
                stages: [0.0; STAGES.len()],
                total_ms: 0.0,
                range: Default::default(),
                recomputed_from: None,
            };
            let cdr_cloud = crate::msgs::cdr::Header {
                stamp: crate::msgs::cdr::Time {
                    sec: cloud.stamp.sec,
                    nanosec: cloud.stamp.nanosec,
                },
                frame_id: cloud.frame_id.clone(),
            };
            let replay = crate::frame::outputs::build(&out, &cdr_cloud, bev_frame, &p).unwrap();

            let same_header = |h: &Header, c: &crate::msgs::cdr::Header| {
                assert_eq!(
                    (h.stamp.sec, h.stamp.nanosec, h.frame_id.as_str()),
                    (c.stamp.sec, c.stamp.nanosec, c.frame_id.as_str())
                );
            };
            for (node, replay) in [(&labels, &replay.bev_labels), (&color, &replay.bev_color)] {
                same_header(&node.header, &replay.header);
                assert_eq!(
                    (node.height, node.width, node.encoding.as_str()),
                    (replay.height, replay.width, replay.encoding.as_str())
                );
                assert_eq!(
                    (node.is_bigendian, node.step, &node.data),
                    (replay.is_bigendian, replay.step, &replay.data)
                );
            }
            let (i, ri) = (&occ.info, &replay.occupancy.info);
            same_header(&occ.header, &replay.occupancy.header);
            assert_eq!(
                (i.map_load_time.sec, i.map_load_time.nanosec),
                (ri.map_load_time.sec, ri.map_load_time.nanosec)
            );
            assert_eq!(
                (i.resolution, i.width, i.height),
                (ri.resolution, ri.width, ri.height)
            );
            let o = &i.origin;
            assert_eq!(
                [o.position.x, o.position.y, o.position.z],
                ri.origin.position
            );
            assert_eq!(
                [
                    o.orientation.x,
                    o.orientation.y,
                    o.orientation.z,
                    o.orientation.w
                ],
                ri.origin.orientation
            );
            assert_eq!(occ.data, replay.occupancy.data);

            // Across the wire: what rmw serializes for the node decodes as replay's message, and
            // replay's bytes decode as the node's. (Not a byte comparison: CDR alignment padding
            // is unspecified, and rmw leaves whatever its reused buffer held there.)
            type CdrImage = crate::msgs::cdr::Image;
            type CdrGrid = crate::msgs::cdr::OccupancyGrid;
            assert_eq!(
                CdrImage::from_cdr(&labels.to_serialized_bytes().unwrap()).unwrap(),
                replay.bev_labels
            );
            assert_eq!(
                CdrImage::from_cdr(&color.to_serialized_bytes().unwrap()).unwrap(),
                replay.bev_color
            );
            assert_eq!(
                CdrGrid::from_cdr(&occ.to_serialized_bytes().unwrap()).unwrap(),
                replay.occupancy
            );
            assert_eq!(
                Image::from_serialized_bytes(&replay.bev_labels.to_cdr(true).unwrap()).unwrap(),
                labels
            );
            assert_eq!(
                Image::from_serialized_bytes(&replay.bev_color.to_cdr(true).unwrap()).unwrap(),
                color
            );
            assert_eq!(
                OccupancyGrid::from_serialized_bytes(&replay.occupancy.to_cdr(true).unwrap())
                    .unwrap(),
                occ
            );
        }
    }
}
