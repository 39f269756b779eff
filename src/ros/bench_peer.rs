//! The node benchmark's publisher (binary `node_bench_peer`): drives a running `perception_node`
//! over DDS as a vehicle's sensors would, and measures it from outside.
//!
//! Every period (`rate_hz`) it publishes one frame: each message of the bag (the last one per
//! topic: the cloud, and each camera's image and CameraInfo) as the serialized bytes the bag holds,
//! with the header stamp set to the wall clock, the cameras first and the cloud last. It never
//! waits for the node: a frame the node skips, rejects or loses shows as dropped.
//!
//! It subscribes to every output the node publishes per frame (the LiDAR outputs and, with a map
//! model, the BEV map topics) and matches them to frames by stamp. A frame's latency is from the
//! cloud's publication to the last of its outputs received: message bytes in to published
//! messages out, DDS both ways included. `/diagnostics` gives the node's counters and its memory
//! (host RSS, device memory in use), sampled once a second, for the leak check.
//!
//! Phases: frames until the first one whose outputs all arrive (`start_timeout_s`: discovery, the
//! first CUDA frame), `warmup_s` more, then `duration_s` of timed frames, then `grace_s` for the
//! last outputs. Only the timed frames are reported.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use r2r::diagnostic_msgs::msg::DiagnosticArray;
use r2r::QosProfile;

use serde::Serialize;

use crate::bag::Bag;
use crate::bench::host_probe::ProbeFrames;
use crate::bench::json::{line, Fixed, MemorySamples, Whole};
use crate::bench::percentiles::Percentiles;

/// What the peer runs against.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    /// One message per topic is used (the last): a `sensor_msgs/msg/PointCloud2` (exactly one
    /// such topic) and any camera `CompressedImage`, `Image` and `CameraInfo` topics. Topic names
    /// are the node's as in the root namespace (the sample bag's `/sptr/input/...`).
    pub bag: PathBuf,
    /// The node's namespace ("" for the root): prefixed to every topic.
    pub namespace: String,
    /// The node's name (`sptr`).
    pub node_name: String,
    /// The BEV map model's classes: their map topics are expected too. Empty: LiDAR outputs only.
    pub map_classes: Vec<String>,
    pub rate_hz: f64,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub start_timeout_s: f64,
    pub grace_s: f64,
}

/// One output topic the node publishes per frame.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputTopic {
    pub name: String,
    pub type_name: &'static str,
}

/// The per-frame outputs of a node named `node_name` in `namespace`: the LiDAR ones (the default
/// `topics.*`), then, for `map_classes`, one OccupancyGrid per class and the two map images.
pub fn output_topics(namespace: &str, node_name: &str, map_classes: &[String]) -> Vec<OutputTopic> {
    let node = format!("{}/{node_name}", namespace.trim_end_matches('/'));
    let t = |rel: &str, type_name| OutputTopic { name: rel.replacen('~', &node, 1), type_name };
    let mut out = vec![
        t("~/output/points", "sensor_msgs/msg/PointCloud2"),
        t("~/output/bev/labels", "sensor_msgs/msg/Image"),
        t("~/output/bev/labels_color", "sensor_msgs/msg/Image"),
        t("~/output/bev/occupancy", "nav_msgs/msg/OccupancyGrid"),
    ];
    if !map_classes.is_empty() {
        for name in super::cameras::map_topic_names(map_classes) {
            out.push(t(&name, "nav_msgs/msg/OccupancyGrid"));
        }
        out.push(t("~/output/bev/map_bits", "sensor_msgs/msg/Image"));
        out.push(t("~/output/bev/map_color", "sensor_msgs/msg/Image"));
    }
    out
}

/// Sets the header stamp of a serialized (little-endian CDR) message whose first field is a
/// `std_msgs/Header`: seconds at bytes 4..8, nanoseconds at 8..12, after the encapsulation.
pub fn set_stamp(cdr: &mut [u8], stamp: (i32, u32)) -> Result<(), String> {
    check_header(cdr)?;
    cdr[4..8].copy_from_slice(&stamp.0.to_le_bytes());
    cdr[8..12].copy_from_slice(&stamp.1.to_le_bytes());
    Ok(())
}

/// The header stamp of a serialized message (see [`set_stamp`]).
pub fn stamp_of(cdr: &[u8]) -> Result<(i32, u32), String> {
    check_header(cdr)?;
    let word = |at: usize| [cdr[at], cdr[at + 1], cdr[at + 2], cdr[at + 3]];
    Ok((i32::from_le_bytes(word(4)), u32::from_le_bytes(word(8))))
}

fn check_header(cdr: &[u8]) -> Result<(), String> {
    if cdr.len() < 12 {
        return Err(format!("a serialized message of {} bytes has no header stamp", cdr.len()));
    }
    if cdr[0..2] != [0, 1] {
        return Err(format!(
            "not little-endian CDR (encapsulation {:02x} {:02x}, expected 00 01)",
            cdr[0], cdr[1]
        ));
    }
    Ok(())
}

/// A message the peer publishes every frame.
struct Input {
    topic: String,
    type_name: String,
    data: Vec<u8>,
}

/// The bag's inputs: the cameras' messages, then the cloud (published last).
fn read_inputs(cfg: &PeerConfig) -> Result<Vec<Input>, String> {
    let bag = Bag::open(&cfg.bag).map_err(|e| format!("{}: {e}", cfg.bag.display()))?;
    let ns = cfg.namespace.trim_end_matches('/');
    let mut cameras = Vec::new();
    let mut clouds = Vec::new();
    for topic in bag.topics() {
        let kind = topic.type_name.as_str();
        let is_cloud = kind == "sensor_msgs/msg/PointCloud2";
        let is_camera = matches!(
            kind,
            "sensor_msgs/msg/CompressedImage" | "sensor_msgs/msg/Image" | "sensor_msgs/msg/CameraInfo"
        );
        if !is_cloud && !is_camera {
            continue;
        }
        let mut last = None;
        for m in bag.messages(&[topic.name.as_str()]) {
            last = Some(m.map_err(|e| format!("{}: {}: {e}", cfg.bag.display(), topic.name))?.data);
        }
        let Some(data) = last else { continue };
        stamp_of(&data).map_err(|e| format!("{}: {}: {e}", cfg.bag.display(), topic.name))?;
        let input = Input { topic: format!("{ns}{}", topic.name), type_name: topic.type_name.clone(), data };
        if is_cloud {
            clouds.push(input);
        } else {
            cameras.push(input);
        }
    }
    if clouds.len() != 1 {
        return Err(format!(
            "{}: needs exactly one sensor_msgs/msg/PointCloud2 topic with a message, found {}",
            cfg.bag.display(),
            clouds.len()
        ));
    }
    cameras.extend(clouds);
    Ok(cameras)
}

/// An output message received: which output, its stamp, when.
struct Arrival {
    output: usize,
    stamp: (i32, u32),
    at: Instant,
}

/// A frame the peer published.
struct FrameRecord {
    published: Instant,
    /// How far after its tick the cloud went out (the publisher's own lateness), ms.
    late_ms: f64,
    arrivals: Vec<Option<Instant>>,
}

impl FrameRecord {
    fn complete(&self) -> bool {
        self.arrivals.iter().all(Option::is_some)
    }

    /// When the last output came (complete frames only).
    fn last_arrival(&self) -> Option<Instant> {
        self.arrivals.iter().copied().collect::<Option<Vec<_>>>()?.into_iter().max()
    }

    /// Cloud publication to the last output, ms (complete frames only).
    fn latency_ms(&self) -> Option<f64> {
        Some(self.last_arrival()?.saturating_duration_since(self.published).as_secs_f64() * 1e3)
    }
}

/// A thread that sleeps [`PROBE_SLEEP`] in a loop and records each wake-up later than
/// [`STALL_MS`]: host scheduling stalls that no work of ours caused (another tenant, the
/// hypervisor), to tell them from the node's own tail.
const PROBE_SLEEP: Duration = Duration::from_millis(1);
const STALL_MS: f64 = 5.0;

/// Stalls seen by the probe: when it woke up, and how late (ms).
type StallLog = Arc<Mutex<Vec<(Instant, f64)>>>;

fn spawn_stall_probe(stop: Arc<std::sync::atomic::AtomicBool>, log: StallLog) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let t = Instant::now();
            std::thread::sleep(PROBE_SLEEP);
            let late = (t.elapsed().saturating_sub(PROBE_SLEEP)).as_secs_f64() * 1e3;
            if late > STALL_MS {
                log.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), late));
            }
        }
    })
}

/// CPU time stolen by the hypervisor from all CPUs so far, ms (Linux `/proc/stat`, USER_HZ 100).
fn steal_ms() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().find(|l| l.starts_with("cpu "))?;
    let steal: f64 = cpu.split_whitespace().nth(8)?.parse().ok()?;
    Some(steal * 10.0)
}

/// Whether a node's `/diagnostics` values count the frame stamped `stamp`: their `last processed
/// stamp` (`sec.nanosec`) is that frame's or a later one's (the node processes in order).
fn counts_frame(values: &BTreeMap<String, String>, stamp: (i32, u32)) -> bool {
    let Some((sec, nanosec)) = values.get("last processed stamp").and_then(|v| v.split_once('.')) else {
        return false;
    };
    match (sec.parse::<i32>(), nanosec.parse::<u32>()) {
        (Ok(sec), Ok(nanosec)) => (sec, nanosec) >= stamp,
        _ => false,
    }
}

/// `/diagnostics` reports of the node: when, and their key-values.
type DiagLog = Arc<Mutex<Vec<(Instant, BTreeMap<String, String>)>>>;

/// What the benchmark measured (timed frames only); [`PeerReport::json`] is its output.
#[derive(Debug, Clone)]
pub struct PeerReport {
    pub rate_hz: f64,
    pub duration_s: f64,
    pub outputs: Vec<String>,
    pub inputs: Vec<String>,
    /// Seconds from the first frame to the first frame with all its outputs.
    pub start_s: f64,
    pub published: usize,
    pub complete: usize,
    /// Frames with some outputs but not all.
    pub partial: usize,
    /// Frames with no output at all.
    pub dropped: usize,
    /// Cloud publication to the last output, complete frames.
    pub latency: Option<Percentiles>,
    /// Each timed frame's latency in order, `None` when incomplete (a tail's pattern over time).
    pub frame_latency_ms: Vec<Option<f64>>,
    /// Cloud publication to the labeled cloud.
    pub lidar_latency: Option<Percentiles>,
    /// Complete frames whose latency exceeded the period.
    pub frames_over_period: usize,
    /// The peer's own lateness publishing the clouds.
    pub publish_late: Option<Percentiles>,
    /// Per output, timed frames that never got it.
    pub missing_by_output: Vec<(String, usize)>,
    /// Node memory from `/diagnostics` during the timed frames: (seconds since the timed start, MB).
    pub host_rss_mb: Vec<(f64, f64)>,
    pub device_used_mb: Vec<(f64, f64)>,
    /// The node's last `/diagnostics` values.
    pub node: BTreeMap<String, String>,
    /// Host stalls during the timed frames (a sleeping probe thread woke up over 5 ms late):
    /// (timed frame it fell in, ms late).
    pub host_stalls: Vec<(usize, f64)>,
    /// CPU time the hypervisor stole from all CPUs during the timed frames, ms.
    pub steal_ms: Option<f64>,
    /// The host probe ([`crate::bench::host_probe::HostProbe`], in this process): its median run, ms,
    /// and per timed frame its slowest run from the cloud's publication to the last output, over
    /// that median (`None` for an incomplete frame). Slow frames with a slow probe: the host's
    /// cores slowed down, not the node alone.
    pub probe_median_ms: Option<f64>,
    pub probe_ratio: Vec<Option<f64>>,
}

/// The JSON of a [`PeerReport`], keys in this order.
#[derive(Serialize)]
struct ReportJson<'a> {
    bench: &'static str,
    rate_hz: f64,
    duration_s: f64,
    start_s: Fixed<2>,
    inputs: &'a [String],
    outputs: &'a [String],
    frames: FrameCounts,
    latency: &'a Option<Percentiles>,
    lidar_latency: &'a Option<Percentiles>,
    frames_over_period: usize,
    publish_late: &'a Option<Percentiles>,
    missing_by_output: BTreeMap<&'a str, usize>,
    host_rss_mb: Option<MemorySamples<f64>>,
    device_used_mb: Option<MemorySamples<f64>>,
    node: &'a BTreeMap<String, String>,
    host_stalls: HostStalls,
    steal_ms: Option<Whole>,
    host_probe: ProbeFrames,
    frame_latency_ms: Vec<Option<Fixed<2>>>,
}

/// What became of the timed frames.
#[derive(Serialize)]
struct FrameCounts {
    published: usize,
    complete: usize,
    partial: usize,
    dropped: usize,
}

/// Host stalls: how many, the longest (ms late), and each as `[timed frame, ms late]`.
#[derive(Serialize)]
struct HostStalls {
    count: usize,
    max_ms: Fixed<2>,
    at: Vec<(usize, Fixed<2>)>,
}

impl PeerReport {
    /// One JSON object (`"bench":"node_dds"`).
    pub fn json(&self) -> String {
        line(&ReportJson {
            bench: "node_dds",
            rate_hz: self.rate_hz,
            duration_s: self.duration_s,
            start_s: Fixed(self.start_s),
            inputs: &self.inputs,
            outputs: &self.outputs,
            frames: FrameCounts { published: self.published, complete: self.complete, partial: self.partial, dropped: self.dropped },
            latency: &self.latency,
            lidar_latency: &self.lidar_latency,
            frames_over_period: self.frames_over_period,
            publish_late: &self.publish_late,
            missing_by_output: self.missing_by_output.iter().map(|(k, v)| (k.as_str(), *v)).collect(),
            host_rss_mb: MemorySamples::of(&self.host_rss_mb),
            device_used_mb: MemorySamples::of(&self.device_used_mb),
            node: &self.node,
            host_stalls: HostStalls {
                count: self.host_stalls.len(),
                max_ms: Fixed(self.host_stalls.iter().map(|s| s.1).fold(0.0, f64::max)),
                at: self.host_stalls.iter().map(|&(f, ms)| (f, Fixed(ms))).collect(),
            },
            steal_ms: self.steal_ms.map(Whole),
            host_probe: ProbeFrames::of(
                self.probe_median_ms,
                &self.frame_latency_ms.iter().copied().zip(self.probe_ratio.iter().copied()).collect::<Vec<_>>(),
            ),
            frame_latency_ms: self.frame_latency_ms.iter().map(|l| l.map(Fixed)).collect(),
        })
    }
}

fn wall_stamp() -> (i32, u32) {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (t.as_secs().min(i32::MAX as u64) as i32, t.subsec_nanos())
}

/// Runs the benchmark against a node that is running (or starting): see the module doc.
pub fn run(cfg: &PeerConfig) -> Result<PeerReport, String> {
    if !(cfg.rate_hz > 0.0 && cfg.rate_hz.is_finite()) || !(cfg.duration_s > 0.0) {
        return Err(format!("rate_hz {} and duration_s {} must be > 0", cfg.rate_hz, cfg.duration_s));
    }
    let mut inputs = read_inputs(cfg)?;
    let outputs = output_topics(&cfg.namespace, &cfg.node_name, &cfg.map_classes);

    let ctx = r2r::Context::create().map_err(|e| format!("ROS context: {e}"))?;
    let mut node = r2r::Node::create(ctx, "sptr_bench_peer", "").map_err(|e| format!("ROS node: {e}"))?;
    let mut publishers = Vec::with_capacity(inputs.len());
    for i in &inputs {
        // Sensor data QoS, as a camera or LiDAR driver publishes.
        let p = node
            .create_publisher_untyped(&i.topic, &i.type_name, QosProfile::sensor_data())
            .map_err(|e| format!("publisher {}: {e}", i.topic))?;
        publishers.push(p);
    }
    let (tx, rx) = mpsc::channel::<Arrival>();
    let mut readers = Vec::new();
    for (k, o) in outputs.iter().enumerate() {
        let mut sub = node
            .subscribe_raw(&o.name, o.type_name, QosProfile::default().keep_last(16))
            .map_err(|e| format!("subscription {}: {e}", o.name))?;
        let tx = tx.clone();
        readers.push(std::thread::spawn(move || {
            futures::executor::block_on(async {
                while let Some(bytes) = sub.next().await {
                    let at = Instant::now();
                    if let Ok(stamp) = stamp_of(&bytes) {
                        if tx.send(Arrival { output: k, stamp, at }).is_err() {
                            break;
                        }
                    }
                }
            })
        }));
    }
    drop(tx);
    let diag: DiagLog = Arc::default();
    {
        let mut sub = node
            .subscribe::<DiagnosticArray>("/diagnostics", QosProfile::default())
            .map_err(|e| format!("subscription /diagnostics: {e}"))?;
        let prefix = format!("{}/{}: ", cfg.namespace.trim_end_matches('/'), cfg.node_name);
        let diag = diag.clone();
        readers.push(std::thread::spawn(move || {
            futures::executor::block_on(async {
                while let Some(msg) = sub.next().await {
                    for s in msg.status.iter().filter(|s| s.name.starts_with(&prefix)) {
                        let values = s.values.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect();
                        diag.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), values));
                    }
                }
            })
        }));
    }
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinner = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                node.spin_once(Duration::from_millis(5));
            }
            drop(node); // ends the subscriptions' streams, so the reader threads end
        })
    };

    let stalls: StallLog = Arc::default();
    let probe = spawn_stall_probe(stop.clone(), stalls.clone());
    let host_probe = crate::bench::host_probe::HostProbe::start();
    let result = drive(cfg, &mut inputs, &publishers, &outputs, &rx, &diag, &stalls);
    let host_probe = host_probe.stop();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = probe.join();
    let _ = spinner.join();
    drop(rx);
    for r in readers {
        let _ = r.join();
    }
    result.map(|(mut report, windows)| {
        report.probe_median_ms = host_probe.median_ms();
        report.probe_ratio = windows.iter().map(|w| w.and_then(|(from, to)| host_probe.max_ratio_in(from, to))).collect();
        report
    })
}

/// Each timed frame's span, from the cloud's publication to its last output (`None`: incomplete).
type FrameWindows = Vec<Option<(Instant, Instant)>>;

/// The frames the peer published and the outputs matched to them so far.
#[derive(Default)]
struct Frames {
    list: Vec<FrameRecord>,
    by_stamp: HashMap<(i32, u32), usize>,
    /// The stamp of the last frame published.
    last_stamp: Option<(i32, u32)>,
}

impl Frames {
    /// An output received: counted for the frame of its stamp (the first arrival per output).
    fn arrived(&mut self, a: Arrival) {
        if let Some(&i) = self.by_stamp.get(&a.stamp) {
            self.list[i].arrivals[a.output].get_or_insert(a.at);
        }
    }
}

/// How the publishing loop went: when it started, the first frame with all its outputs, the
/// first timed frame, and the hypervisor's steal counter at the timed frames' start and end.
struct Phases {
    t0: Instant,
    first_complete: Option<(usize, Instant)>,
    timed_start: (usize, Instant),
    steal_at_start: Option<f64>,
    steal_at_end: Option<f64>,
}

/// The publishing loop and the report (see [`run`]), with the timed frames' spans.
fn drive(
    cfg: &PeerConfig,
    inputs: &mut [Input],
    publishers: &[r2r::PublisherUntyped],
    outputs: &[OutputTopic],
    rx: &mpsc::Receiver<Arrival>,
    diag: &DiagLog,
    stalls: &StallLog,
) -> Result<(PeerReport, FrameWindows), String> {
    let mut frames = Frames::default();
    let phases = publish_frames(cfg, inputs, publishers, outputs, rx, &mut frames)?;
    wait_for_last_frame(cfg, rx, diag, &mut frames);
    Ok(report(cfg, inputs, outputs, &frames.list, &phases, diag, stalls))
}

/// One frame per tick until the timed frames are out: the start (until a frame gets all its
/// outputs, at most `start_timeout_s`), the warm-up, the timed frames; outputs matched between
/// ticks.
fn publish_frames(
    cfg: &PeerConfig,
    inputs: &mut [Input],
    publishers: &[r2r::PublisherUntyped],
    outputs: &[OutputTopic],
    rx: &mpsc::Receiver<Arrival>,
    frames: &mut Frames,
) -> Result<Phases, String> {
    let period = Duration::from_secs_f64(1.0 / cfg.rate_hz);
    let timed_frames = (cfg.rate_hz * cfg.duration_s).round().max(1.0) as usize;
    let warmup_frames = (cfg.rate_hz * cfg.warmup_s).round() as usize;
    let t0 = Instant::now();
    let mut first_complete: Option<(usize, Instant)> = None;
    let mut timed_start: Option<(usize, Instant)> = None;
    let mut tick = 0u32;
    let mut steal_at_start = None;
    loop {
        let deadline = t0 + period * tick;
        // Take outputs until this frame's tick.
        loop {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            match rx.recv_timeout(deadline - now) {
                Ok(a) => frames.arrived(a),
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err("the subscriptions ended".into()),
            }
        }
        while let Ok(a) = rx.try_recv() {
            frames.arrived(a);
        }
        if first_complete.is_none() {
            if frames.list.iter().any(FrameRecord::complete) {
                first_complete = Some((frames.list.len(), Instant::now()));
            } else if t0.elapsed().as_secs_f64() > cfg.start_timeout_s {
                return Err(no_complete_frame(cfg, outputs, &frames.list));
            }
        }
        if let Some((after, _)) = first_complete {
            if timed_start.is_none() && frames.list.len() >= after + warmup_frames {
                timed_start = Some((frames.list.len(), Instant::now()));
                steal_at_start = steal_ms();
            }
        }
        if let Some(start) = timed_start {
            if frames.list.len() >= start.0 + timed_frames {
                // the steal counter when the last timed frame was out
                return Ok(Phases { t0, first_complete, timed_start: start, steal_at_start, steal_at_end: steal_ms() });
            }
        }
        publish_frame(inputs, publishers, outputs.len(), deadline, frames)?;
        tick += 1;
    }
}

/// The error when no frame got all its outputs in `start_timeout_s`: which outputs came at all.
fn no_complete_frame(cfg: &PeerConfig, outputs: &[OutputTopic], frames: &[FrameRecord]) -> String {
    let got: Vec<&str> = outputs
        .iter()
        .enumerate()
        .filter(|(k, _)| frames.iter().any(|f| f.arrivals[*k].is_some()))
        .map(|(_, o)| o.name.as_str())
        .collect();
    format!(
        "no frame got all its outputs within {} s ({} frames published; outputs seen at all: {got:?}): \
         is the node running, in namespace `{}`, with the map model the peer expects?",
        cfg.start_timeout_s,
        frames.len(),
        cfg.namespace
    )
}

/// One frame: every input stamped with the wall clock and published, the cloud last; the frame
/// is recorded when its cloud went out.
fn publish_frame(inputs: &mut [Input], publishers: &[r2r::PublisherUntyped], outputs: usize, deadline: Instant, frames: &mut Frames) -> Result<(), String> {
    let stamp = wall_stamp();
    let n = inputs.len();
    for (i, (input, p)) in inputs.iter_mut().zip(publishers).enumerate() {
        set_stamp(&mut input.data, stamp)?;
        let published = Instant::now();
        p.publish_raw(&input.data).map_err(|e| format!("publish {}: {e}", input.topic))?;
        if i + 1 == n {
            frames.by_stamp.insert(stamp, frames.list.len());
            frames.last_stamp = Some(stamp);
            frames.list.push(FrameRecord {
                published,
                late_ms: published.saturating_duration_since(deadline).as_secs_f64() * 1e3,
                arrivals: vec![None; outputs],
            });
        }
    }
    Ok(())
}

/// The last frame's outputs (the node works in order: the frames before it are done by then, or
/// were skipped), then a `/diagnostics` report that counts it (they come at 1 Hz; a busy node's
/// may be late), each for at most the grace time.
fn wait_for_last_frame(cfg: &PeerConfig, rx: &mpsc::Receiver<Arrival>, diag: &DiagLog, frames: &mut Frames) {
    let grace_end = Instant::now() + Duration::from_secs_f64(cfg.grace_s);
    while frames.list.last().is_some_and(|f| !f.complete()) {
        let now = Instant::now();
        if now >= grace_end {
            break;
        }
        match rx.recv_timeout(grace_end - now) {
            Ok(a) => frames.arrived(a),
            Err(_) => break,
        }
    }
    // Judged by the stamp the report names, not by when it came: a report made just before the
    // node counted the frame can arrive after the frame's outputs.
    let Some(last) = frames.last_stamp else {
        return;
    };
    let wait_end = Instant::now() + Duration::from_secs_f64(cfg.grace_s.max(3.0));
    loop {
        let counted = diag.lock().unwrap_or_else(|p| p.into_inner()).last().is_some_and(|d| counts_frame(&d.1, last));
        if counted || Instant::now() >= wait_end {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The report of the timed frames, with their spans for the host probe.
fn report(
    cfg: &PeerConfig,
    inputs: &[Input],
    outputs: &[OutputTopic],
    frames: &[FrameRecord],
    phases: &Phases,
    diag: &DiagLog,
    stalls: &StallLog,
) -> (PeerReport, FrameWindows) {
    let period = Duration::from_secs_f64(1.0 / cfg.rate_hz);
    let (timed_from, timed_at) = phases.timed_start;
    let timed = &frames[timed_from..];
    let latencies: Vec<f64> = timed.iter().filter_map(FrameRecord::latency_ms).collect();
    let lidar: Vec<f64> = timed
        .iter()
        .filter_map(|f| f.arrivals[0].map(|a| a.saturating_duration_since(f.published).as_secs_f64() * 1e3))
        .collect();
    let period_ms = period.as_secs_f64() * 1e3;
    let diag_log = diag.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let series = |key: &str| -> Vec<(f64, f64)> {
        diag_log
            .iter()
            .filter(|(t, _)| *t >= timed_at)
            .filter_map(|(t, v)| Some(((t.duration_since(timed_at).as_secs_f64() * 10.0).round() / 10.0, v.get(key)?.parse().ok()?)))
            .collect()
    };
    let windows = timed
        .iter()
        .map(|f| Some((f.published, f.last_arrival()?)))
        .collect();
    let report = PeerReport {
        rate_hz: cfg.rate_hz,
        duration_s: cfg.duration_s,
        outputs: outputs.iter().map(|o| o.name.clone()).collect(),
        inputs: inputs.iter().map(|i| i.topic.clone()).collect(),
        start_s: phases.first_complete.map_or(0.0, |(_, t)| t.duration_since(phases.t0).as_secs_f64()),
        published: timed.len(),
        complete: timed.iter().filter(|f| f.complete()).count(),
        partial: timed.iter().filter(|f| !f.complete() && f.arrivals.iter().any(Option::is_some)).count(),
        dropped: timed.iter().filter(|f| f.arrivals.iter().all(Option::is_none)).count(),
        frames_over_period: latencies.iter().filter(|&&l| l > period_ms).count(),
        latency: Percentiles::of(&latencies),
        frame_latency_ms: timed.iter().map(FrameRecord::latency_ms).collect(),
        lidar_latency: Percentiles::of(&lidar),
        publish_late: Percentiles::of(&timed.iter().map(|f| f.late_ms).collect::<Vec<_>>()),
        missing_by_output: outputs
            .iter()
            .enumerate()
            .map(|(k, o)| (o.name.clone(), timed.iter().filter(|f| f.arrivals[k].is_none()).count()))
            .collect(),
        host_rss_mb: series("host rss MB"),
        device_used_mb: series("device memory used MB"),
        node: diag_log.last().map(|d| d.1.clone()).unwrap_or_default(),
        host_stalls: {
            let end = frames.last().map_or(timed_at, |f| f.published + period);
            let log = stalls.lock().unwrap_or_else(|p| p.into_inner());
            log.iter()
                .filter(|(t, _)| *t >= timed_at && *t <= end)
                .map(|(t, ms)| ((t.duration_since(timed_at).as_secs_f64() / period.as_secs_f64()) as usize, *ms))
                .collect()
        },
        steal_ms: phases.steal_at_start.zip(phases.steal_at_end).map(|(a, b)| b - a),
        probe_median_ms: None,
        probe_ratio: Vec::new(),
    };
    (report, windows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_are_written_and_read_after_the_encapsulation() {
        let mut m = vec![0u8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 9];
        set_stamp(&mut m, (1_700_000_000, 123_456_789)).unwrap();
        assert_eq!(stamp_of(&m).unwrap(), (1_700_000_000, 123_456_789));
        assert_eq!(&m[12..], &[9, 9], "the rest of the message is untouched");
        assert!(stamp_of(&m[..11]).unwrap_err().contains("11 bytes"));
        let mut big_endian = m.clone();
        big_endian[1] = 0;
        assert!(set_stamp(&mut big_endian, (1, 2)).unwrap_err().contains("little-endian"));
    }

    #[test]
    fn stamps_match_what_r2r_serializes() {
        use r2r::WrappedTypesupport;
        let mut m = r2r::sensor_msgs::msg::CompressedImage::default();
        m.header.stamp.sec = 42;
        m.header.stamp.nanosec = 7;
        m.format = "jpeg".into();
        let bytes = m.to_serialized_bytes().unwrap();
        assert_eq!(stamp_of(&bytes).unwrap(), (42, 7));
    }

    #[test]
    fn output_topics_follow_the_namespace_and_the_map_classes() {
        let lidar = output_topics("", "sptr", &[]);
        assert_eq!(lidar.len(), 4);
        assert_eq!(lidar[0].name, "/sptr/output/points");
        let classes = vec!["drivable_area".to_string(), "divider".to_string()];
        let all = output_topics("/bench/", "sptr", &classes);
        let names: Vec<&str> = all.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "/bench/sptr/output/points",
                "/bench/sptr/output/bev/labels",
                "/bench/sptr/output/bev/labels_color",
                "/bench/sptr/output/bev/occupancy",
                "/bench/sptr/output/bev/map/drivable_area",
                "/bench/sptr/output/bev/map/divider",
                "/bench/sptr/output/bev/map_bits",
                "/bench/sptr/output/bev/map_color",
            ]
        );
    }

    #[test]
    fn latency_is_to_the_last_output_and_only_for_complete_frames() {
        let t = Instant::now();
        let mut f = FrameRecord {
            published: t,
            late_ms: 0.0,
            arrivals: vec![Some(t + Duration::from_millis(5)), None],
        };
        assert!(!f.complete());
        assert_eq!(f.latency_ms(), None);
        f.arrivals[1] = Some(t + Duration::from_millis(12));
        assert!(f.complete());
        assert!((f.latency_ms().unwrap() - 12.0).abs() < 1e-9);
    }

    #[test]
    fn a_report_counts_the_frames_up_to_its_last_processed_stamp() {
        let report = |v: &str| BTreeMap::from([("last processed stamp".to_string(), v.to_string())]);
        let frame = (1_700_000_000, 500_000_000);
        assert!(counts_frame(&report("1700000000.500000000"), frame));
        assert!(counts_frame(&report("1700000001.000000000"), frame));
        assert!(!counts_frame(&report("1700000000.499999999"), frame), "an earlier frame's report");
        assert!(!counts_frame(&report("none"), frame), "nothing processed yet");
        assert!(!counts_frame(&report("1700000000"), frame), "no nanoseconds");
        assert!(!counts_frame(&BTreeMap::new(), frame), "a node without the key");
    }

    /// The report parses back with its keys in the order the line has always had them.
    #[test]
    fn the_report_is_json_with_its_keys_in_order() {
        let report = PeerReport {
            rate_hz: 10.0,
            duration_s: 60.0,
            outputs: vec!["/sptr/output/points".into(), "/sptr/output/bev/labels".into()],
            inputs: vec!["/sptr/input/points".into()],
            start_s: 3.14159,
            published: 3,
            complete: 2,
            partial: 0,
            dropped: 1,
            latency: Percentiles::of(&[20.0, 30.0]),
            frame_latency_ms: vec![Some(20.0), Some(30.0), None],
            lidar_latency: Percentiles::of(&[10.0, 11.0]),
            frames_over_period: 0,
            publish_late: None,
            missing_by_output: vec![("/sptr/output/points".into(), 1), ("/sptr/output/bev/labels".into(), 1)],
            host_rss_mb: vec![(0.3, 1394.0), (1.3, 1427.6)],
            device_used_mb: vec![],
            node: BTreeMap::from([("processed".to_string(), "12".to_string())]),
            host_stalls: vec![(1, 6.256)],
            steal_ms: Some(12.4),
            probe_median_ms: Some(0.2),
            probe_ratio: vec![Some(1.0), Some(1.26), None],
        };
        let text = report.json();
        let keys = [
            "bench", "rate_hz", "duration_s", "start_s", "inputs", "outputs", "frames", "latency", "lidar_latency",
            "frames_over_period", "publish_late", "missing_by_output", "host_rss_mb", "device_used_mb", "node", "host_stalls",
            "steal_ms", "host_probe", "frame_latency_ms",
        ];
        let j = crate::bench::json::parse_row(&text, &keys);
        assert_eq!(j["bench"], "node_dds");
        assert_eq!(j["start_s"].as_f64(), Some(3.14));
        assert_eq!(j["frames"]["dropped"], 1);
        assert_eq!(j["latency"]["n"], 2);
        assert!(j["publish_late"].is_null() && j["device_used_mb"].is_null(), "{text}");
        assert_eq!(j["missing_by_output"].as_object().map(|m| m.len()), Some(2));
        assert_eq!(j["host_rss_mb"]["last"].as_f64(), Some(1427.6));
        assert_eq!(j["host_stalls"]["at"][0][1].as_f64(), Some(6.26));
        assert_eq!(j["steal_ms"], 12, "whole ms");
        assert_eq!(j["host_probe"]["probe_ratio"][1].as_f64(), Some(1.26));
        assert!(j["frame_latency_ms"][0].is_f64() && j["frame_latency_ms"][2].is_null(), "{text}");
    }

    #[test]
    fn the_sample_bag_gives_six_cameras_then_the_cloud() {
        let cfg = PeerConfig {
            bag: crate::repo_root().join("tests/data/bags/nuscenes_sample"),
            namespace: "/b".into(),
            node_name: "sptr".into(),
            map_classes: vec![],
            rate_hz: 10.0,
            duration_s: 1.0,
            warmup_s: 0.0,
            start_timeout_s: 1.0,
            grace_s: 0.0,
        };
        let inputs = read_inputs(&cfg).unwrap();
        assert_eq!(inputs.len(), 13);
        assert_eq!(inputs[12].topic, "/b/sptr/input/points");
        assert_eq!(inputs[12].type_name, "sensor_msgs/msg/PointCloud2");
        assert_eq!(inputs.iter().filter(|i| i.type_name.ends_with("CompressedImage")).count(), 6);
        assert_eq!(inputs.iter().filter(|i| i.type_name.ends_with("CameraInfo")).count(), 6);
    }
}
