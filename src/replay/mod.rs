//! `sptr replay`: every LiDAR frame of a rosbag2 bag, in timestamp order, through the node's
//! own frame processor ([`crate::frame::processor::Processor`]: decode, voxelize, network,
//! devoxelize, BEV grids, labeled cloud), with the node's outputs written to a new bag and an
//! evaluation report (see [`crate::eval`]).
//!
//! Per frame: the CDR message is deserialized, the processor runs, its outputs become the
//! node's messages ([`crate::frame::outputs`]) in `OUT/bag/` (MCAP), a BEV PNG is written for chosen
//! frames, and the frame's record (stage times, ground-truth comparison) is kept. A frame the
//! processor rejects (malformed, empty, all NaN, too many points) is one the node would drop:
//! it is listed as skipped with the reason. Nothing is skipped otherwise or reordered, so
//! two runs give the same labels and metrics. With `--shard i/n` only frames with
//! `index % n == i` are processed (every shard reads the whole bag, so indices and damage are
//! the same in each); `sptr eval merge` combines shard directories.
//!
//! Damage never loses what came before it: a frame that cannot be decoded or segmented is
//! recorded as skipped with its reason and the replay goes on; a bag that cannot be read past
//! some point (truncated, corrupt) ends the frame loop there, and the report (written in full)
//! names the file, the frames before the damage and the error. [`ReplayOutcome::damage`] lets
//! the CLI exit non-zero after writing it.
//!
//! Output directory: `bag/` (rosbag2, MCAP), `eval_state.json`, `report.json`, `report.md`,
//! `confusion.png` and `iou.png` (with ground truth), `latency.png`, `bev/frame_NNNNNN.png`.

pub mod agreement;
pub mod cameras;
pub mod device;
pub mod error;
pub mod ground_truth;
pub mod map_eval;
pub mod options;
pub mod output_dir;
pub mod progress;
pub mod request;
pub mod topics;

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::msgs::cdr::{CdrMessage, PointCloud2};
use crate::bag::{Bag, BagWriter};
use crate::frame::cameras::BevMapModel;
use crate::frame::messages::frame_mismatch;
use crate::msgs::cloud::{field_values, finite_mask};
use crate::models::sphereformer::config::ModelYaml;
use crate::eval::report::{Report, END_TO_END};
use crate::eval::state::{Damage, EvalState, FrameRecord, FrameStatus, STATE_FILE, STATE_FORMAT};
use crate::eval::Confusion;
use crate::frame::outputs;
use crate::frame::frame_processor::{process_frame, CameraOutput, CameraParts};
use crate::frame::processor::{FrameOutput, Processor, Rejected, NO_CLASS, STAGES};

pub use crate::eval::bev_png::{bev_view, write_bev_png, BevLegend};
pub use cameras::{CameraOutcome, CameraReplay, CameraReplayOptions};
pub use device::{open_processor, WeightsSource};
pub use error::ReplayError;
pub use options::{ReplayOptions, Shard};
pub use ground_truth::LabelSource;
pub use output_dir::{merge_shards, write_reports};
pub use progress::ProgressMode;
pub use request::{bev_params, run, ReplayRequest};
pub use topics::DEFAULT_LIDAR_TOPIC;

use ground_truth::GroundTruthSource;
use output_dir::remove_stale_outputs;
use topics::{resolve_topics, POINTCLOUD2};

/// What a replay produced.
#[derive(Debug, Clone)]
pub struct ReplayOutcome {
    pub state: EvalState,
    pub report: Report,
    pub out: PathBuf,
    /// Set when the bag could not be read to its end.
    pub damage: Option<Damage>,
    /// Frames of `bev_png_frames` whose PNG was not written (skipped frames, or a bag whose
    /// metadata promised more frames than it had).
    pub bev_png_missing: Vec<u64>,
    /// Per camera: frames used and masked (empty without the camera branch).
    pub cameras: Vec<CameraOutcome>,
    /// With a BEV map model: frames whose map was made, frames whose map failed.
    pub bev_maps: Option<(u64, u64)>,
    /// The BEV map evaluation, with a model and ground-truth masks.
    pub map_metrics: Option<crate::eval::bev_map::MapMetrics>,
}

/// What a replay says once, at the first frame it concerns (the node logs it at most once a
/// minute); the report counts every frame.
#[derive(Debug, Default)]
struct OnceNotes {
    /// The cloud's frame differs from `bev.frame_id`.
    frame_mismatch: bool,
    /// A cloud without an intensity field.
    no_intensity: bool,
}

/// A duration in nanoseconds (saturating).
fn ns(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Runs the replay with `processor` (opened for `model`); see the module doc. No BEV map model:
/// [`replay_with`].
pub fn replay(
    processor: &mut Processor,
    model: &ModelYaml,
    opts: &ReplayOptions,
) -> Result<ReplayOutcome, ReplayError> {
    replay_with(processor, model, opts, None)
}

/// [`replay`] with the camera branch's BEV map model, when there is one: its map of every
/// replayed frame is written to the output bag (and drawn for the `bev_png_frames`).
pub fn replay_with(
    processor: &mut Processor,
    model: &ModelYaml,
    opts: &ReplayOptions,
    mut bev_model: Option<&mut (dyn BevMapModel + Send)>,
) -> Result<ReplayOutcome, ReplayError> {
    let ReplaySetup { bag, lidar, mut cams, gt, expected, bev_dir, mut writer, map_classes } =
        open_replay(processor, model, opts, bev_model.as_deref())?;
    let cfg = model;

    let shard_frames = expected / opts.shard.count as u64
        + u64::from(expected % opts.shard.count as u64 > opts.shard.index as u64);
    let mut progress = progress::Progress::new(opts.progress, shard_frames);
    let mut frames = Vec::new();
    let mut confusion = Confusion::new(cfg.classes);
    let mut damage = None;
    let mut index = 0u64;
    let mut once = OnceNotes::default();
    let loop_start = Instant::now();
    let mut filter = vec![lidar.clone()];
    if let Some(c) = &cams {
        for n in c.notes() {
            progress.note(&format!("cameras: {n}"));
        }
        filter.extend(c.topics());
    }
    let filter: Vec<&str> = filter.iter().map(String::as_str).collect();
    let mut camera_notes = 0u64;
    let mut points = crate::Points::default();
    for msg in bag.messages(&filter) {
        let msg = match msg {
            Ok(m) => m,
            Err(e) => {
                damage = Some(Damage {
                    file: e.path().display().to_string(),
                    frames_before: index,
                    error: e.to_string(),
                });
                break;
            }
        };
        if msg.topic != lidar {
            if let Some(c) = cams.as_mut() {
                if let Some(note) = c.on_message(&msg) {
                    // as the node: logged and dropped; the first few shown, all counted
                    camera_notes += 1;
                    if camera_notes <= 10 {
                        progress.note(&format!("dropped a camera message: {note}"));
                    }
                }
            }
            continue;
        }
        let i = index;
        index += 1;
        if !opts.shard.contains(i) {
            continue;
        }
        let ctx = FrameCtx {
            index: i,
            timestamp_ns: msg.timestamp_ns,
            topic: &lidar,
            bag: &opts.bag,
        };
        let start = Instant::now();
        let cloud = match PointCloud2::from_cdr(&msg.data) {
            Ok(m) => m,
            Err(e) => {
                let record = ctx.skipped(format!("PointCloud2 CDR cannot be decoded: {e}"));
                progress.frame(record.reason.as_deref().map(|r| format!("frame {i}: {r}")).as_deref());
                frames.push(record);
                continue;
            }
        };
        let deserialize_ns = ns(start.elapsed());
        // The node's frame processor: the cloud decoded once, the LiDAR path and the camera
        // path in the node's schedule.
        let style = if map_classes.is_some() { opts.cameras.as_ref().and_then(|c| c.map_style.as_ref()) } else { None };
        let beside = opts.cameras.as_ref().is_some_and(|c| c.beside_lidar);
        let model: Option<&mut (dyn BevMapModel + Send)> = match bev_model.as_mut() {
            Some(m) => Some(&mut **m),
            None => None,
        };
        let parts = cams.as_mut().map(|c| CameraParts {
            branch: c.branch_mut(),
            model,
            style,
            bev_frame: &opts.bev_frame_id,
        });
        let result = process_frame(processor, parts, beside, &mut points, &cloud.view(), cloud.header.stamp, &cloud.header.frame_id, |r| r);
        let mut record = lidar_record(
            processor,
            cfg,
            opts,
            &ctx,
            &cloud,
            result.lidar,
            (start, deserialize_ns),
            gt.as_ref(),
            &mut confusion,
            &mut writer,
            &bev_dir,
            &progress,
            &mut once,
        )?;
        if let (Some(c), Some(out)) = (cams.as_mut(), result.cameras) {
            camera_record(c, out, map_classes.as_deref(), opts, &ctx, &cloud.header, &mut record, &mut writer, &bev_dir, &progress)?;
        }
        let note = record.reason.as_ref().map(|r| format!("frame {i}: {r}"));
        progress.frame(note.as_deref());
        frames.push(record);
    }
    let processing_s = loop_start.elapsed().as_secs_f64();
    progress.finish();
    writer.finish()?;
    let replayed = Replayed { lidar, frames, frames_in_bag: index, confusion, processing_s, damage };
    finish(opts, cfg, replayed, cams, bev_model.is_some(), &bev_dir)
}

/// What a replay reads and writes, opened before its first frame.
struct ReplaySetup {
    bag: Bag,
    /// The LiDAR topic.
    lidar: String,
    cams: Option<CameraReplay>,
    gt: Option<GroundTruthSource>,
    /// The LiDAR messages in the bag.
    expected: u64,
    bev_dir: PathBuf,
    writer: BagWriter,
    /// The map's classes when a BEV map model makes maps (their topics are in the output bag).
    map_classes: Option<Vec<String>>,
}

/// The bag, its topics, the camera replay, the ground truth and the outputs, each checked against
/// the options and the model before any frame runs.
fn open_replay(
    processor: &Processor,
    cfg: &ModelYaml,
    opts: &ReplayOptions,
    bev_model: Option<&(dyn BevMapModel + Send)>,
) -> Result<ReplaySetup, ReplayError> {
    let bag = Bag::open(&opts.bag)?;
    let lidar = resolve_topics(&bag, opts)?;
    let mut cams = match &opts.cameras {
        Some(c) => Some(CameraReplay::new(c, &bag)?),
        None => None,
    };
    if let (Some(cr), Some(m)) = (cams.as_mut(), bev_model) {
        cr.set_defer_jpeg(m.decodes_jpeg());
    }
    if processor.bev_params().classes != cfg.classes {
        return Err(ReplayError::Setup(format!(
            "the frame processor's BEV grid has {} classes, the model {}",
            processor.bev_params().classes,
            cfg.classes
        )));
    }
    let gt = match &opts.labels {
        Some(src) => Some(GroundTruthSource::open(&bag, src).map_err(ReplayError::Setup)?),
        None => None,
    };
    let expected = bag
        .topics()
        .iter()
        .find(|x| x.name == lidar)
        .map_or(0, |x| x.count);
    check_bev_png_frames(opts, expected)?;
    let bev_dir = opts.out.join("bev");
    let mut writer = open_outputs(opts, &bev_dir)?;
    let map_classes: Option<Vec<String>> = match (&cams, &opts.cameras) {
        (Some(_), Some(c)) if bev_model.is_some() => {
            let style = c.map_style.as_ref().ok_or_else(|| ReplayError::Setup("a BEV map model needs the map style (thresholds, palette)".into()))?;
            style.check(c.map_classes.len()).map_err(|e| ReplayError::Setup(format!("BEV map: {e}")))?;
            cameras::add_map_topics(&mut writer, &c.map_classes)?;
            if let Some(cr) = cams.as_mut() {
                cr.start_evaluation()?;
            }
            Some(c.map_classes.clone())
        }
        _ => None,
    };
    Ok(ReplaySetup { bag, lidar, cams, gt, expected, bev_dir, writer, map_classes })
}

/// The output directory (stale outputs of an earlier replay removed), the BEV PNG directory when
/// PNGs are asked for, and the output bag with the LiDAR outputs' topics.
fn open_outputs(opts: &ReplayOptions, bev_dir: &Path) -> Result<BagWriter, ReplayError> {
    std::fs::create_dir_all(&opts.out).map_err(|source| ReplayError::Io {
        path: opts.out.clone(),
        source,
    })?;
    remove_stale_outputs(&opts.out)?;
    if !opts.bev_png_frames.is_empty() {
        std::fs::create_dir_all(bev_dir).map_err(|source| ReplayError::Io {
            path: bev_dir.to_path_buf(),
            source,
        })?;
    }
    let mut writer = BagWriter::create(&opts.out.join("bag"))?;
    let t = &opts.topics;
    writer.add_topic(&t.points, POINTCLOUD2)?;
    writer.add_topic(&t.bev_labels, "sensor_msgs/msg/Image")?;
    writer.add_topic(&t.bev_color, "sensor_msgs/msg/Image")?;
    writer.add_topic(&t.bev_occupancy, "nav_msgs/msg/OccupancyGrid")?;
    Ok(writer)
}

/// What the frame loop of a replay gathered.
struct Replayed {
    lidar: String,
    frames: Vec<FrameRecord>,
    frames_in_bag: u64,
    confusion: Confusion,
    processing_s: f64,
    damage: Option<Damage>,
}

/// The replay's state file and reports (with the cameras' and the map evaluation's sections),
/// and its outcome.
fn finish(
    opts: &ReplayOptions,
    cfg: &ModelYaml,
    replayed: Replayed,
    cams: Option<CameraReplay>,
    model_ran: bool,
    bev_dir: &Path,
) -> Result<ReplayOutcome, ReplayError> {
    let Replayed { lidar, frames, frames_in_bag: index, confusion, processing_s, damage } = replayed;
    if let Some(c) = &cams {
        c.write_summary(&opts.out)?;
    }

    let state = EvalState {
        format: STATE_FORMAT,
        bag: opts.bag.display().to_string(),
        lidar_topic: lidar,
        model: opts.model_name.clone(),
        weights: opts.weights_name.clone(),
        device: opts.device_name.clone(),
        class_names: cfg.class_names.clone(),
        ground_truth: opts
            .labels
            .as_ref()
            .map(|l| format!("{}; {}", l.describe(), opts.label_map.describe())),
        shard_count: opts.shard.count,
        shards: vec![opts.shard.index],
        frames,
        frames_in_bag: index,
        confusion,
        processing_s: vec![processing_s],
        damage: damage.clone(),
    };
    state.save(&opts.out.join(STATE_FILE))?;
    let report = write_reports(&state, &opts.out)?;
    if let Some(c) = &cams {
        cameras_into_reports(c, model_ran, &opts.out)?;
    }
    let map_metrics = match cams.as_ref().and_then(|c| c.ground_truth.as_ref()) {
        Some(g) => {
            map_eval_into_reports(g, &opts.out)?;
            Some(g.result())
        }
        None => None,
    };
    let bev_png_missing = opts
        .bev_png_frames
        .iter()
        .copied()
        .filter(|&i| !bev_dir.join(format!("frame_{i:06}.png")).is_file())
        .collect();
    Ok(ReplayOutcome {
        state,
        report,
        out: opts.out.clone(),
        damage,
        bev_png_missing,
        bev_maps: cams.as_ref().filter(|_| model_ran).map(|c| c.map_counts()),
        cameras: cams.map(|c| c.outcome()).unwrap_or_default(),
        map_metrics,
    })
}

/// Adds the camera branch's counts to `report.json` (key `cameras`) and `report.md` (a section).
fn cameras_into_reports(c: &CameraReplay, model: bool, out: &Path) -> Result<(), ReplayError> {
    let io = |path: PathBuf| move |source| ReplayError::Io { path, source };
    let json_path = out.join("report.json");
    let text = std::fs::read_to_string(&json_path).map_err(io(json_path.clone()))?;
    let mut v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ReplayError::Setup(format!("report.json: {e}")))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("cameras".into(), c.report_json(model));
    }
    let text = serde_json::to_string_pretty(&v).map_err(|e| ReplayError::Setup(format!("report.json: {e}")))?;
    std::fs::write(&json_path, text).map_err(io(json_path.clone()))?;
    let md_path = out.join("report.md");
    let mut md = std::fs::read_to_string(&md_path).map_err(io(md_path.clone()))?;
    md += &c.report_markdown(model);
    std::fs::write(&md_path, md).map_err(io(md_path.clone()))
}

/// Adds the BEV map evaluation to `report.json` (key `bev_map`) and `report.md` (a section).
fn map_eval_into_reports(g: &map_eval::MapGroundTruth, out: &Path) -> Result<(), ReplayError> {
    let io = |path: PathBuf| move |source| ReplayError::Io { path, source };
    let json_path = out.join("report.json");
    let text = std::fs::read_to_string(&json_path).map_err(io(json_path.clone()))?;
    let mut v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ReplayError::Setup(format!("report.json: {e}")))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("bev_map".into(), g.to_json());
    }
    let text = serde_json::to_string_pretty(&v).map_err(|e| ReplayError::Setup(format!("report.json: {e}")))?;
    std::fs::write(&json_path, text).map_err(io(json_path.clone()))?;
    let md_path = out.join("report.md");
    let mut md = std::fs::read_to_string(&md_path).map_err(io(md_path.clone()))?;
    md += &g.to_markdown();
    std::fs::write(&md_path, md).map_err(io(md_path.clone()))
}

/// The camera path's output of a frame into replay's records: the branch's stages, the cameras'
/// statuses (`cameras.json`), the map (written to the output bag, evaluated, drawn) or why there
/// is none. A failure of the model is the frame's: counted, noted, no map for this frame, the
/// replay goes on (as the node does).
#[allow(clippy::too_many_arguments)]
fn camera_record(
    cams: &mut CameraReplay,
    out: CameraOutput,
    map_classes: Option<&[String]>,
    opts: &ReplayOptions,
    ctx: &FrameCtx,
    header: &crate::msgs::cdr::Header,
    record: &mut FrameRecord,
    writer: &mut BagWriter,
    bev_dir: &Path,
    progress: &progress::Progress,
) -> Result<(), ReplayError> {
    if record.status == FrameStatus::Skipped {
        return Ok(());
    }
    cams.record(ctx.index, header.stamp.as_nanos(), &out);
    let end = record.stages_ns.iter().position(|(n, _)| n == END_TO_END).unwrap_or(record.stages_ns.len());
    let camera_stages: Vec<(String, u64)> = out.branch_stages.iter().map(|(n, v)| (n.to_string(), (v * 1e6).round() as u64)).collect();
    record.stages_ns.splice(end..end, camera_stages);
    let Some(classes) = map_classes else { return Ok(()) };
    for (cam, why) in &out.decode_failures {
        progress.note(&format!("frame {}: camera {cam}'s image could not be decoded, masked: {why}", ctx.index));
    }
    cams.count_graph(out.map_graph.clone());
    let map = match out.map {
        Some(Ok(m)) => m,
        Some(Err(e)) => {
            progress.note(&format!("frame {}: the BEV map model failed: {e}", ctx.index));
            cams.count_map(Err(e));
            return Ok(());
        }
        None => return Ok(()),
    };
    let messages = match out.messages {
        Some(Ok(m)) => m,
        Some(Err(e)) => return Err(ReplayError::Setup(format!("BEV map messages: {e}"))),
        None => return Ok(()),
    };
    cameras::write_map(writer, classes, &messages, ctx.timestamp_ns)?;
    cams.count_map(Ok(()));
    // the model's own stages (`bev_map/<stage>`), then its whole forward (`bev_map`)
    let end = record.stages_ns.iter().position(|(n, _)| n == END_TO_END).unwrap_or(record.stages_ns.len());
    let mut model_stages: Vec<(String, u64)> =
        out.model_stages.into_iter().map(|(n, v)| (format!("bev_map/{n}"), (v * 1e6).round().max(0.0) as u64)).collect();
    model_stages.push(("bev_map".to_string(), (out.map_ms * 1e6).round() as u64));
    record.stages_ns.splice(end..end, model_stages);
    if let Some(g) = cams.ground_truth.as_mut() {
        if let Some(note) = g.add(ctx.index, &map) {
            progress.note(&note);
        }
    }
    if opts.bev_png_frames.contains(&ctx.index) {
        let palette = opts.cameras.as_ref().and_then(|c| c.map_style.as_ref()).map(|s| s.palette.clone()).unwrap_or_default();
        let legend = BevLegend {
            class_names: &map.classes,
            palette: &palette,
            resolution: map.resolution,
            title: format!("BEV map, frame {} ({} ns)", ctx.index, ctx.timestamp_ns),
        };
        write_bev_png(&bev_dir.join(format!("map_{:06}.png", ctx.index)), &cameras::map_as_grids(&messages), &legend)?;
    }
    Ok(())
}

/// `--bev-png-frames` must name frames this replay processes: below the bag's LiDAR frame count
/// (from its metadata, when it has one) and in this shard. An error names the others.
fn check_bev_png_frames(opts: &ReplayOptions, frames_in_bag: u64) -> Result<(), ReplayError> {
    let beyond: Vec<u64> = opts
        .bev_png_frames
        .iter()
        .copied()
        .filter(|&i| frames_in_bag > 0 && i >= frames_in_bag)
        .collect();
    if !beyond.is_empty() {
        return Err(ReplayError::Setup(format!(
            "--bev-png-frames {beyond:?}: the bag has {frames_in_bag} LiDAR frame(s), indices 0 to {}",
            frames_in_bag - 1
        )));
    }
    let other: Vec<u64> = opts
        .bev_png_frames
        .iter()
        .copied()
        .filter(|&i| !opts.shard.contains(i))
        .collect();
    if !other.is_empty() {
        let (k, n) = (opts.shard.index, opts.shard.count);
        return Err(ReplayError::Setup(format!(
            "--bev-png-frames {other:?}: not frames of shard {k}/{n}, which replays the frames with index % {n} == {k}"
        )));
    }
    Ok(())
}

/// Where a frame is, for its messages.
struct FrameCtx<'a> {
    index: u64,
    timestamp_ns: i64,
    topic: &'a str,
    bag: &'a Path,
}

impl FrameCtx<'_> {
    fn record(&self, status: FrameStatus, reason: Option<String>) -> FrameRecord {
        FrameRecord {
            index: self.index,
            timestamp_ns: self.timestamp_ns,
            status,
            reason,
            points: 0,
            labeled_points: 0,
            stages_ns: Vec::new(),
            out_of_range: Vec::new(),
            recomputed_in_fp32: Vec::new(),
            no_intensity: false,
        }
    }
    fn skipped(&self, what: String) -> FrameRecord {
        self.record(
            FrameStatus::Skipped,
            Some(format!(
                "{} frame {} on {} at {} ns: {what}",
                self.bag.display(),
                self.index,
                self.topic,
                self.timestamp_ns
            )),
        )
    }
}

/// One frame: deserialize, process (the node's work), evaluate, write outputs. Frame-level
/// problems become the record's status; only output-writing failures are errors.
#[allow(clippy::too_many_arguments)]
fn lidar_record(
    processor: &Processor,
    cfg: &ModelYaml,
    opts: &ReplayOptions,
    ctx: &FrameCtx,
    msg: &PointCloud2,
    lidar: Result<FrameOutput, Rejected>,
    (start, deserialize_ns): (Instant, u64),
    gt: Option<&GroundTruthSource>,
    confusion: &mut Confusion,
    writer: &mut BagWriter,
    bev_dir: &Path,
    progress: &progress::Progress,
    once: &mut OnceNotes,
) -> Result<FrameRecord, ReplayError> {
    if !once.frame_mismatch {
        // Once per replay, where the node logs it once a minute.
        if let Some(note) = frame_mismatch(&opts.bev_frame_id, &msg.header.frame_id) {
            once.frame_mismatch = true;
            progress.note(&format!(
                "{note} (as in the node); --params with bev.frame_id: \"\" stamps them with the cloud's frame"
            ));
        }
    }
    let mut stages = vec![("deserialize".to_string(), deserialize_ns)];
    let out = match lidar {
        Ok(o) => o,
        Err(r) => {
            let mut rec = ctx.skipped(format!("rejected as the node would reject it ({r})"));
            rec.out_of_range = flagged_layers(processor.last_range());
            return Ok(rec);
        }
    };
    if !out.has_intensity && !once.no_intensity {
        once.no_intensity = true;
        progress.note(&format!(
            "frame {}: the cloud has no intensity field: the network sees intensity 0 for every point (it was trained \
             with intensity, so labels may be worse); report.json counts such frames (frames.without_intensity)",
            ctx.index
        ));
    }
    stages.extend(
        STAGES
            .iter()
            .zip(out.stages)
            .map(|(n, ms)| (n.to_string(), (ms * 1e6).round() as u64)),
    );
    // The processor's class ids, read back from the labeled cloud: one per decoded point.
    let pred: Vec<Option<u32>> = match field_values(&out.cloud.view(), &["class_id"]) {
        Ok(Some(v)) => v
            .into_iter()
            .map(|c| (c != NO_CLASS as f64).then_some(c as u32))
            .collect(),
        _ => return Ok(ctx.skipped("the labeled cloud has no readable class_id field".into())),
    };

    // Ground truth, aligned with the decoded points.
    let stamp = msg.header.stamp.as_nanos();
    let (status, reason) = match gt {
        None => (FrameStatus::Replayed, None),
        Some(src) => match aligned_labels(src, ctx.index, stamp, msg, &out) {
            Ok(raw) => {
                for (&r, &p) in raw.iter().zip(&pred) {
                    confusion.add(opts.label_map.resolve(r, cfg.classes), p);
                }
                (FrameStatus::Evaluated, None)
            }
            Err(why) => (
                FrameStatus::NoGroundTruth,
                Some(format!(
                    "{} frame {} at {} ns: {why}",
                    opts.bag.display(),
                    ctx.index,
                    ctx.timestamp_ns
                )),
            ),
        },
    };

    let t = Instant::now();
    let messages = outputs::build(
        &out,
        &msg.header,
        &opts.bev_frame_id,
        processor.bev_params(),
    )
    .map_err(|e| ReplayError::Setup(format!("outputs of frame {}: {e}", ctx.index)))?;
    let cdr = |r: Result<Vec<u8>, crate::msgs::cdr::CdrError>| {
        r.map_err(|e| ReplayError::Setup(format!("encoding outputs of frame {}: {e}", ctx.index)))
    };
    let tp = &opts.topics;
    writer.write(
        &tp.points,
        ctx.timestamp_ns,
        &cdr(messages.cloud.to_cdr(true))?,
    )?;
    writer.write(
        &tp.bev_labels,
        ctx.timestamp_ns,
        &cdr(messages.bev_labels.to_cdr(true))?,
    )?;
    writer.write(
        &tp.bev_color,
        ctx.timestamp_ns,
        &cdr(messages.bev_color.to_cdr(true))?,
    )?;
    writer.write(
        &tp.bev_occupancy,
        ctx.timestamp_ns,
        &cdr(messages.occupancy.to_cdr(true))?,
    )?;
    stages.push(("write".to_string(), ns(t.elapsed())));
    stages.push((END_TO_END.to_string(), ns(start.elapsed())));

    if opts.bev_png_frames.contains(&ctx.index) {
        let bev = processor.bev_params();
        let legend = BevLegend {
            class_names: &cfg.class_names,
            palette: &bev.palette,
            resolution: bev.resolution,
            title: format!("BEV classes, frame {} ({} ns)", ctx.index, ctx.timestamp_ns),
        };
        write_bev_png(&bev_dir.join(format!("frame_{:06}.png", ctx.index)), &out.grids, &legend)?;
    }
    let labeled = pred.iter().filter(|p| p.is_some()).count() as u64;
    Ok(FrameRecord {
        points: out.points_kept as u64,
        labeled_points: labeled,
        stages_ns: stages,
        out_of_range: flagged_layers(&out.range),
        recomputed_in_fp32: out.recomputed_from.as_ref().map(flagged_layers).unwrap_or_default(),
        no_intensity: !out.has_intensity,
        ..ctx.record(status, reason)
    })
}

/// A frame record's `out_of_range`: the flagged layers as `name (what)`.
fn flagged_layers(range: &crate::device::range_guard::RangeReport) -> Vec<String> {
    range.layers.iter().map(|l| l.to_string()).collect()
}

/// Raw ground-truth ids for the decoded points of `msg` (points decoding dropped as NaN/Inf
/// are dropped from the labels too).
fn aligned_labels(
    src: &GroundTruthSource,
    index: u64,
    stamp: i64,
    msg: &PointCloud2,
    out: &FrameOutput,
) -> Result<Vec<u32>, String> {
    let raw = src.labels(index, stamp, out.points_in)?;
    if out.points_kept == out.points_in {
        return Ok(raw);
    }
    let mask = finite_mask(&msg.view())
        .map_err(|e| e.to_string())?
        .ok_or("LiDAR cloud lost its x/y/z fields")?;
    Ok(raw
        .into_iter()
        .zip(mask)
        .filter(|(_, keep)| *keep)
        .map(|(r, _)| r)
        .collect())
}
