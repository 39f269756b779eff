//! The perception node (`perception_node`): r2r spinning on its own thread, the subscription
//! drained by a tokio task into a newest-frame-wins [`Mailbox`], processing (decode, checks,
//! voxelization) on a separate std thread, `/diagnostics` at 1 Hz from another tokio task, and
//! SIGINT/SIGTERM handled by the main thread.
//!
//! Topics (private names resolve under the node, e.g. `/<ns>/sptr/debug/voxels`):
//!
//! | topic | type | what |
//! | --- | --- | --- |
//! | `~/input/points` (sub) | `sensor_msgs/PointCloud2` | LiDAR cloud; sensor-data QoS, depth `input.qos_depth` |
//! | `~/debug/processing_time_ms` | `std_msgs/Float64` | decode + checks + voxelization of the frame |
//! | `~/debug/stage_ms/decode` | `std_msgs/Float64` | PointCloud2 decoding |
//! | `~/debug/stage_ms/voxelize` | `std_msgs/Float64` | voxelization on the configured device |
//! | `~/debug/latency_ms` | `std_msgs/Float64` | message receipt to the end of processing (includes the wait in the mailbox) |
//! | `~/debug/voxels` | `std_msgs/UInt32` | voxels of the frame (after `voxelization.max_voxels`) |
//! | `/diagnostics` | `diagnostic_msgs/DiagnosticArray` | 1 Hz, see [`diagnostics`] |
//!
//! The labeled cloud and the BEV outputs need the SphereFormer model and come with it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use r2r::diagnostic_msgs::msg::{DiagnosticArray, DiagnosticStatus, KeyValue};
use r2r::sensor_msgs::msg::PointCloud2;
use r2r::std_msgs::msg::{Float64, Header, UInt32};

use crate::cloud::{self, PointField};
use crate::config::{DeviceKind, ModelConfig, NodeParams};
use crate::points::Points;
use crate::ros::mailbox::Mailbox;
use crate::ros::params;
use crate::sparse::voxelize::{voxelize_cpu, VoxelParams, VoxelStats};

/// Exit status for invalid parameters (params file, overrides or model YAML).
pub const EXIT_PARAMS: i32 = 2;
/// Exit status when the configured device cannot be used.
pub const EXIT_DEVICE: i32 = 3;
/// Exit status for ROS (rcl) failures.
pub const EXIT_ROS: i32 = 1;
/// How long shutdown waits for the frame being processed.
const SHUTDOWN_WAIT: Duration = Duration::from_millis(700);

/// Why a frame was rejected (no output for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
    /// The PointCloud2 cannot be decoded (truncated data, zero point_step, missing x/y/z, ...).
    Malformed,
    /// Zero points (width or height 0).
    Empty,
    /// Every point has a NaN/Inf coordinate.
    NoFinitePoints,
    /// More points than the model YAML's `voxelization.max_points`.
    TooManyPoints,
    /// Voxelization failed (e.g. a CUDA error).
    ProcessingError,
}

impl Reject {
    pub const ALL: [Reject; 5] = [
        Reject::Malformed,
        Reject::Empty,
        Reject::NoFinitePoints,
        Reject::TooManyPoints,
        Reject::ProcessingError,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Reject::Malformed => "malformed",
            Reject::Empty => "empty",
            Reject::NoFinitePoints => "no_finite_points",
            Reject::TooManyPoints => "too_many_points",
            Reject::ProcessingError => "processing_error",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What the threads share for diagnostics.
#[derive(Debug, Default)]
struct Counters {
    received: u64,
    processed: u64,
    rejected: [u64; 5],
    last_processing_ms: Option<f64>,
    last_voxels: Option<usize>,
    /// Processed frames that had more voxels than `voxelization.max_voxels` (the rest dropped).
    over_voxel_cap: u64,
    last_receipt: Option<Instant>,
    /// Receipt wall time minus the header stamp of the last cloud, ms.
    last_stamp_age_ms: Option<f64>,
    /// Since when every processed frame has been over budget.
    over_budget_since: Option<Instant>,
    last_error: Option<String>,
}

struct Frame {
    msg: PointCloud2,
    received: Instant,
}

/// The device voxelization runs on.
enum Backend {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(crate::device::cuda::CudaDevice),
}

impl Backend {
    fn open(kind: DeviceKind) -> Result<(Backend, String), String> {
        match kind {
            DeviceKind::Cpu => Ok((Backend::Cpu, "cpu".into())),
            #[cfg(feature = "cuda")]
            DeviceKind::Cuda => match crate::device::cuda::CudaDevice::new(0) {
                Ok(d) => {
                    let name = format!("cuda:0 ({}, sm_{}{})", d.name, d.arch.major, d.arch.minor);
                    Ok((Backend::Cuda(d), name))
                }
                Err(e) => Err(format!(
                    "parameter `device` is `cuda` but the GPU cannot be used: {e}; set `device: cpu` \
                     (or pass `-p device:=cpu`) to run on the CPU"
                )),
            },
            #[cfg(not(feature = "cuda"))]
            DeviceKind::Cuda => Err("parameter `device` is `cuda` but this perception_node was built without \
                 CUDA support (cargo feature `cuda`): rebuild with `--features ros,cuda`, or set \
                 `device: cpu` (or pass `-p device:=cpu`)"
                .into()),
        }
    }

    /// Voxel count and statistics of one cloud.
    fn voxelize(
        &self,
        pts: &Points,
        vp: &VoxelParams,
    ) -> Result<(usize, VoxelStats), crate::Error> {
        match self {
            Backend::Cpu => {
                let v = voxelize_cpu(&[pts], vp)?;
                Ok((v.len(), v.stats))
            }
            #[cfg(feature = "cuda")]
            Backend::Cuda(dev) => {
                let v = crate::sparse::voxelize_cuda::voxelize_cuda(dev, &[pts], vp)?;
                Ok((v.len, v.stats))
            }
        }
    }
}

/// At most one log line per second per reject reason (and for frames over the voxel cap);
/// the lines in between are counted and reported with the next one.
struct RateLimit {
    last: [Option<Instant>; 6],
    suppressed: [u64; 6],
}

/// [`RateLimit`] slot of the "over the voxel cap" warning (after the [`Reject`] reasons).
const VOXEL_CAP_SLOT: usize = 5;

impl RateLimit {
    fn new() -> Self {
        RateLimit {
            last: [None; 6],
            suppressed: [0; 6],
        }
    }

    fn warn(&mut self, logger: &str, why: Reject, detail: &str) {
        let line = format!("dropped a cloud ({}): {detail}", why.name());
        self.log(logger, why.index(), &line);
    }

    fn log(&mut self, logger: &str, i: usize, line: &str) {
        let now = Instant::now();
        if self.last[i].is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.suppressed[i] += 1;
            return;
        }
        let more = std::mem::take(&mut self.suppressed[i]);
        let more = if more > 0 {
            format!(" ({more} more since the last such warning)")
        } else {
            String::new()
        };
        r2r::log_warn!(logger, "{line}{more}");
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
    processing: r2r::Publisher<Float64>,
    decode: r2r::Publisher<Float64>,
    voxelize: r2r::Publisher<Float64>,
    latency: r2r::Publisher<Float64>,
    voxels: r2r::Publisher<UInt32>,
}

struct Worker {
    mailbox: Arc<Mailbox<Frame>>,
    counters: Arc<Mutex<Counters>>,
    backend: Backend,
    voxel_params: VoxelParams,
    max_points: usize,
    budget_ms: f64,
    pubs: Publishers,
    logger: String,
}

impl Worker {
    fn run(self) {
        let mut fields: Vec<PointField> = Vec::new();
        let mut points = Points::default();
        let mut limit = RateLimit::new();
        while let Some(frame) = self.mailbox.take() {
            // A bug hit by one frame must not end processing: a panic rejects that frame.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.process(&frame, &mut fields, &mut points)
            }))
            .unwrap_or_else(|panic| {
                points = Points::default();
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err((
                    Reject::ProcessingError,
                    format!("processing panicked: {what}"),
                ))
            });
            match result {
                Ok(stats) if stats.voxels_dropped() > 0 => limit.log(
                    &self.logger,
                    VOXEL_CAP_SLOT,
                    &format!(
                        "cloud over the voxel cap: {} voxels, voxelization.max_voxels {} kept, {} points in dropped voxels",
                        stats.voxels_total, stats.voxels_kept, stats.points_capped
                    ),
                ),
                Ok(_) => {}
                Err((why, detail)) => {
                    let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
                    c.rejected[why.index()] += 1;
                    if why == Reject::ProcessingError {
                        c.last_error = Some(detail.clone());
                    }
                    drop(c);
                    limit.warn(&self.logger, why, &detail);
                }
            }
        }
    }

    fn process(
        &self,
        frame: &Frame,
        fields: &mut Vec<PointField>,
        points: &mut Points,
    ) -> Result<VoxelStats, (Reject, String)> {
        let t0 = Instant::now();
        let msg = &frame.msg;
        let declared = (msg.width as u64).saturating_mul(msg.height as u64);
        if declared > self.max_points as u64 {
            return Err((
                Reject::TooManyPoints,
                format!(
                    "{declared} points ({} × {}) exceed the model's voxelization.max_points {}",
                    msg.width, msg.height, self.max_points
                ),
            ));
        }
        super::fields_into(msg, fields);
        let report = cloud::decode_into(&super::cloud_view(msg, fields), points)
            .map_err(|e| (Reject::Malformed, e.to_string()))?;
        let t_decode = t0.elapsed();
        if report.total == 0 {
            return Err((
                Reject::Empty,
                format!(
                    "the cloud has no points (width {}, height {})",
                    msg.width, msg.height
                ),
            ));
        }
        if report.kept == 0 {
            return Err((
                Reject::NoFinitePoints,
                format!(
                    "all {} points have a NaN or infinite coordinate",
                    report.total
                ),
            ));
        }
        let t1 = Instant::now();
        let (voxels, stats) = self
            .backend
            .voxelize(points, &self.voxel_params)
            .map_err(|e| (Reject::ProcessingError, format!("voxelization failed: {e}")))?;
        let t_vox = t1.elapsed();
        let total = t0.elapsed();
        let latency = frame.received.elapsed();

        let total_ms = ms(total);
        {
            let mut c = self.counters.lock().unwrap_or_else(|p| p.into_inner());
            c.processed += 1;
            c.last_processing_ms = Some(total_ms);
            c.last_voxels = Some(voxels);
            if stats.voxels_dropped() > 0 {
                c.over_voxel_cap += 1;
            }
            if total_ms > self.budget_ms {
                c.over_budget_since.get_or_insert(t0);
            } else {
                c.over_budget_since = None;
            }
        }
        // A failed publish (the node is shutting down) is not the frame's fault.
        let _ = self.pubs.decode.publish(&f64_msg(ms(t_decode)));
        let _ = self.pubs.voxelize.publish(&f64_msg(ms(t_vox)));
        let _ = self.pubs.voxels.publish(&UInt32 {
            data: voxels.min(u32::MAX as usize) as u32,
        });
        let _ = self.pubs.latency.publish(&f64_msg(ms(latency)));
        let _ = self.pubs.processing.publish(&f64_msg(total_ms));
        Ok(stats)
    }
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
}

/// One `/diagnostics` message.
///
/// Level: ERROR when every frame processed during the last `budget.error_after_s` seconds was
/// over `budget.processing_ms`; WARN when the last frame was over budget or voxelization failed
/// since the last report; OK otherwise. Values: received, processed, skipped, rejected (total
/// and `rejected.<reason>`), last processing ms, input age ms (since the last cloud arrived),
/// input stamp age ms (arrival minus header stamp), last voxel count, frames over the voxel
/// cap (`voxelization.max_voxels`; processed with the voxels past it dropped), device, model config,
/// weights, budget.
fn diagnostics(info: &DiagInfo, c: &Counters, skipped: u64, new_errors: bool) -> DiagnosticArray {
    let now = Instant::now();
    let over_for = c
        .over_budget_since
        .map(|t| now.duration_since(t).as_secs_f64());
    let over = c.last_processing_ms.is_some_and(|m| m > info.budget_ms);
    let (level, message) = match (over_for, over) {
        (Some(s), true) if s >= info.error_after_s => (
            LEVEL_ERROR,
            format!(
                "processing over the {} ms budget for {s:.1} s",
                info.budget_ms
            ),
        ),
        (_, true) => (
            LEVEL_WARN,
            format!(
                "processing {:.1} ms, over the {} ms budget",
                c.last_processing_ms.unwrap_or(0.0),
                info.budget_ms
            ),
        ),
        _ if new_errors => (
            LEVEL_WARN,
            format!(
                "processing failed: {}",
                c.last_error.as_deref().unwrap_or("?")
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
        kv(
            "input age ms",
            opt(c.last_receipt.map(|t| ms(now.duration_since(t)))),
        ),
        kv("input stamp age ms", opt(c.last_stamp_age_ms)),
        kv(
            "last voxels",
            c.last_voxels
                .map_or_else(|| "none".into(), |v| v.to_string()),
        ),
        kv("frames over voxel cap", c.over_voxel_cap.to_string()),
        kv("device", info.device.clone()),
        kv("model config", info.model_config.clone()),
        kv("weights", info.weights.clone()),
        kv("budget ms", format!("{:.3}", info.budget_ms)),
        kv("error after s", format!("{:.3}", info.error_after_s)),
    ]);
    if let Some(e) = &c.last_error {
        values.push(kv("last error", e.clone()));
    }
    let t = wall_now();
    let mut header = Header::default();
    header.stamp.sec = t.as_secs() as i32;
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
    backend: Backend,
    device: String,
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
    let model = match ModelConfig::load(&model_path) {
        Ok(m) => m,
        Err(e) => {
            return fail(
                EXIT_PARAMS,
                format!("parameter `model.config`: invalid model YAML: {e}"),
            )
        }
    };

    // 4. The device.
    let (backend, device) = match Backend::open(params.device) {
        Ok(b) => b,
        Err(e) => return fail(EXIT_DEVICE, e),
    };

    run(
        Setup {
            node,
            params,
            model,
            backend,
            device,
        },
        fqn,
    )
}

fn run(setup: Setup, fqn: String) -> i32 {
    let Setup {
        mut node,
        params,
        model,
        backend,
        device,
    } = setup;
    let logger = node.logger().to_string();

    let qos = r2r::QosProfile::sensor_data().keep_last(params.input.qos_depth);
    let sub = match node.subscribe::<PointCloud2>("~/input/points", qos) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_ROS, format!("cannot subscribe to ~/input/points: {e}")),
    };
    let pubs = (|| -> r2r::Result<(Publishers, r2r::Publisher<DiagnosticArray>)> {
        let q = r2r::QosProfile::default();
        Ok((
            Publishers {
                processing: node.create_publisher("~/debug/processing_time_ms", q.clone())?,
                decode: node.create_publisher("~/debug/stage_ms/decode", q.clone())?,
                voxelize: node.create_publisher("~/debug/stage_ms/voxelize", q.clone())?,
                latency: node.create_publisher("~/debug/latency_ms", q.clone())?,
                voxels: node.create_publisher("~/debug/voxels", q.clone())?,
            },
            node.create_publisher("/diagnostics", q)?,
        ))
    })();
    let (pubs, diag_pub) = match pubs {
        Ok(p) => p,
        Err(e) => return fail(EXIT_ROS, format!("cannot create the publishers: {e}")),
    };

    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_ROS, format!("cannot start the tokio runtime: {e}")),
    };
    // Signals first, so a SIGINT from here on is ours.
    let signals = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::interrupt())?,
            signal(SignalKind::terminate())?,
        ))
    });
    let (mut sigint, mut sigterm) = match signals {
        Ok(s) => s,
        Err(e) => {
            return fail(
                EXIT_ROS,
                format!("cannot install the SIGINT/SIGTERM handlers: {e}"),
            )
        }
    };

    let mailbox: Arc<Mailbox<Frame>> = Arc::new(Mailbox::new());
    let counters = Arc::new(Mutex::new(Counters::default()));
    let stop = Arc::new(AtomicBool::new(false));

    // Processing thread.
    let vox = &model.yaml.voxelization;
    let worker = Worker {
        mailbox: mailbox.clone(),
        counters: counters.clone(),
        backend,
        voxel_params: model.voxel_params(),
        max_points: vox.max_points,
        budget_ms: params.budget.processing_ms,
        pubs,
        logger: logger.clone(),
    };
    let worker = match std::thread::Builder::new()
        .name("sptr-process".into())
        .spawn(move || worker.run())
    {
        Ok(h) => h,
        Err(e) => return fail(EXIT_ROS, format!("cannot start the processing thread: {e}")),
    };

    // Subscription -> mailbox.
    {
        let (mailbox, counters) = (mailbox.clone(), counters.clone());
        let mut sub = sub;
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

    // Diagnostics at 1 Hz.
    let info = DiagInfo {
        name: format!("{fqn}: perception"),
        device: device.clone(),
        model_config: model.source.display().to_string(),
        weights: if params.model.weights.is_empty() {
            "(none)".into()
        } else {
            params.model.weights.clone()
        },
        budget_ms: params.budget.processing_ms,
        error_after_s: params.budget.error_after_s,
    };
    {
        let (mailbox, counters) = (mailbox.clone(), counters.clone());
        rt.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut errors_seen = 0u64;
            loop {
                tick.tick().await;
                let skipped = mailbox.skipped();
                let msg = {
                    let c = counters.lock().unwrap_or_else(|p| p.into_inner());
                    let errors = c.rejected[Reject::ProcessingError.index()];
                    let m = diagnostics(&info, &c, skipped, errors > errors_seen);
                    errors_seen = errors;
                    m
                };
                let _ = diag_pub.publish(&msg);
            }
        });
    }

    // Spinning thread: owns the node.
    let spinner = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("sptr-spin".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    node.spin_once(Duration::from_millis(50));
                }
                drop(node);
            })
    };
    let spinner = match spinner {
        Ok(h) => h,
        Err(e) => {
            mailbox.close();
            let _ = worker.join();
            return fail(EXIT_ROS, format!("cannot start the spinning thread: {e}"));
        }
    };

    r2r::log_info!(
        &logger,
        "ready: device {device}, model {} ({} voxels max, {} points max), budget {} ms",
        model.source.display(),
        vox.max_voxels,
        vox.max_points,
        params.budget.processing_ms
    );

    let which = rt.block_on(async {
        tokio::select! {
            _ = sigint.recv() => "SIGINT",
            _ = sigterm.recv() => "SIGTERM",
        }
    });

    // Shutdown within a second: stop taking frames, let the worker finish the frame it has
    // (waiting at most SHUTDOWN_WAIT: a huge cloud on the CPU could take longer; the process
    // exit then ends it), stop spinning (at most one 50 ms spin_once).
    let t = Instant::now();
    stop.store(true, Ordering::Relaxed);
    mailbox.close();
    while !worker.is_finished() && t.elapsed() < SHUTDOWN_WAIT {
        std::thread::sleep(Duration::from_millis(5));
    }
    let worker_ok = if worker.is_finished() {
        worker.join().is_ok()
    } else {
        eprintln!(
            "perception_node: the processing thread is still busy with a frame after {} ms; exiting without it",
            SHUTDOWN_WAIT.as_millis()
        );
        true
    };
    let spinner_ok = spinner.join().is_ok();
    rt.shutdown_timeout(Duration::from_millis(100));
    let c = counters.lock().unwrap_or_else(|p| p.into_inner());
    eprintln!(
        "perception_node: {which}: stopped in {:.0} ms (received {}, processed {}, skipped {}, rejected {})",
        ms(t.elapsed()),
        c.received,
        c.processed,
        mailbox.skipped(),
        c.rejected.iter().sum::<u64>()
    );
    if worker_ok && spinner_ok {
        0
    } else {
        fail(EXIT_ROS, "a thread panicked during shutdown")
    }
}
