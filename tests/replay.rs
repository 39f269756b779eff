//! `sptr replay` end to end on the CPU: the committed sample bags (nuScenes frame in MCAP,
//! SemanticKITTI frames with a label topic in sqlite3), shard + merge against a single run,
//! the output bag, and damaged or mistyped input. Models are a small configuration of the
//! SphereFormer architecture with deterministic random weights, to keep debug-build CI fast.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sptr::msgs::cdr::{CdrMessage, Header, Image, OccupancyGrid, PointCloud2, Time};
use sptr::bag::{Bag, BagWriter};
use sptr::msgs::cloud::{datatype, decode, encode_points, CloudBuf, Layout, PointField};
use sptr::device::Device;
use sptr::frame::params::NodeParams;
use sptr::models::sphereformer::config::{ModelConfig, ModelYaml};
use sptr::eval::state::FrameStatus;
use sptr::eval::LabelMap;
use sptr::models::sphereformer::random::random_weights;
use sptr::frame::outputs::OutputTopics;
use sptr::frame::processor::Processor;
use sptr::models::sphereformer::segmenter::Segmenter;
use sptr::replay::{
    bev_params, replay, LabelSource, ProgressMode, ReplayOptions, ReplayOutcome, Shard,
};
use sptr::Points;

const LIDAR: &str = "/sptr/input/points";
const LABELS: &str = "/sptr/ground_truth/labels";

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sptr-replay-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The model YAML `base` cut down (3 levels of 16/32/48 channels, one block, attention on
/// levels 1-2), written to `dir`; returns its path.
fn small_model_yaml(base: &str, dir: &Path) -> PathBuf {
    small_model_yaml_with(base, dir, |t| t)
}

/// [`small_model_yaml`] with a further edit of the YAML text.
fn small_model_yaml_with(base: &str, dir: &Path, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(common::root().join("config/models").join(base)).unwrap();
    let text = edit(text)
        .replace("\nm: 32\n", "\nm: 16\n")
        .replace("block_reps: 2", "block_reps: 1")
        .replace("layers: [32, 64, 128, 256, 256]", "layers: [16, 32, 48]")
        .replace("sphere_layers: [1, 2, 3, 4, 5]", "sphere_layers: [1, 2]");
    let path = dir.join(format!("small_{base}"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The node's frame processor on the CPU with deterministic random weights, as replay opens it.
struct Model {
    yaml: ModelYaml,
    processor: Processor,
}

impl Model {
    /// With the node's default BEV parameters (for the SemanticKITTI model's class ids).
    fn load(model_yaml: &Path) -> Model {
        Self::load_with_params(model_yaml, None)
    }

    /// With the `bev` section of the node params file `params` (relative to the repository),
    /// as `sptr replay --params` takes it.
    fn load_with_params(model_yaml: &Path, params: Option<&str>) -> Model {
        let yaml = ModelConfig::load(model_yaml).unwrap().yaml;
        let params = params.map(|p| {
            let path = common::root().join(p);
            let node = NodeParams::load(&path).unwrap();
            (path, node)
        });
        let (bev, _) = bev_params(&yaml, params.as_ref().map(|(p, n)| (p.as_path(), n))).unwrap();
        let processor = Processor::with_weights(
            Device::Cpu,
            &yaml,
            random_weights(&yaml, 7).unwrap(),
            bev,
        )
        .unwrap();
        Model { yaml, processor }
    }

    fn replay(&mut self, opts: &ReplayOptions) -> Result<ReplayOutcome, sptr::replay::ReplayError> {
        replay(&mut self.processor, &self.yaml, opts)
    }

    /// The same model as a bare segmenter (for the labels replay should reproduce).
    fn segmenter(&self) -> Segmenter {
        Segmenter::new(self.yaml.clone(), random_weights(&self.yaml, 7).unwrap()).unwrap()
    }
}

fn options(bag: &Path, out: &Path) -> ReplayOptions {
    ReplayOptions {
        bag: bag.to_path_buf(),
        lidar_topic: None,
        labels: None,
        label_map: LabelMap::identity(),
        out: out.to_path_buf(),
        bev_frame_id: String::new(),
        bev_png_frames: BTreeSet::new(),
        shard: Shard::WHOLE,
        topics: OutputTopics::default(),
        model_name: "small".into(),
        weights_name: "random 7".into(),
        device_name: "cpu".into(),
        progress: ProgressMode::Quiet,
        cameras: None,
    }
}

fn kitti_points() -> Points {
    Points::read_bin(&common::data("semantickitti/000000.bin"), 4).unwrap()
}

fn kitti_label_map() -> LabelMap {
    LabelMap::load(&common::data("semantickitti/label_map.yaml")).unwrap()
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn is_png(path: &Path) -> bool {
    std::fs::read(path)
        .map(|b| b.starts_with(b"\x89PNG\r\n\x1a\n") && b.len() > 100)
        .unwrap_or(false)
}

/// The committed nuScenes sample bag: one frame through the whole replay, outputs readable.
#[test]
fn nuscenes_sample_bag_replays_end_to_end() {
    let dir = temp_dir("nuscenes");
    // 0.2 m voxels instead of 0.1 m: the whole sweep at a fraction of the debug-build cost.
    let coarse =
        |t: String| t.replace("voxel_size: [0.1, 0.1, 0.1]", "voxel_size: [0.2, 0.2, 0.2]");
    let mut m = Model::load_with_params(
        &small_model_yaml_with("sphereformer_nuscenes.yaml", &dir, coarse),
        Some("config/perception_nuscenes.yaml"),
    );
    assert_eq!(m.yaml.voxel_size, [0.2; 3]);
    let bag = common::data("bags/nuscenes_sample");
    let out = dir.join("out");
    let mut opts = options(&bag, &out);
    opts.bev_png_frames = [0].into();
    let outcome = m.replay(&opts).expect("replay");
    assert!(outcome.damage.is_none());

    let report = read_json(&out.join("report.json"));
    assert_eq!(report["format"], "sptr-eval-report/1");
    assert_eq!(report["frames"]["total"], 1);
    assert_eq!(report["frames"]["skipped"], 0);
    assert_eq!(report["run"]["lidar_topic"], LIDAR);
    assert!(report["metrics"].is_null(), "no ground truth, no metrics");
    assert_eq!(report["throughput"]["points"], 34_688);
    let stages: Vec<&str> = report["latency_ms"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["stage"].as_str().unwrap())
        .collect();
    for s in [
        "deserialize",
        "decode",
        "voxelize",
        "network",
        "devoxelize",
        "bev",
        "encode",
        "write",
    ] {
        assert!(stages.contains(&s), "stage {s} in {stages:?}");
    }
    assert!(
        report["latency_ms"]["end_to_end"]["p99_ms"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(std::fs::read_to_string(out.join("report.md"))
        .unwrap()
        .contains("## Latency (ms)"));
    assert!(is_png(&out.join("latency.png")));
    assert!(is_png(&out.join("bev/frame_000000.png")));

    // The output bag: the node's four topics, one message each, decodable.
    let ob = Bag::open(&out.join("bag")).expect("output bag opens");
    let topics: Vec<(String, String, u64)> = ob
        .topics()
        .iter()
        .map(|t| (t.name.clone(), t.type_name.clone(), t.count))
        .collect();
    assert_eq!(
        topics,
        vec![
            (
                "/sptr/output/bev/labels".into(),
                "sensor_msgs/msg/Image".into(),
                1
            ),
            (
                "/sptr/output/bev/labels_color".into(),
                "sensor_msgs/msg/Image".into(),
                1
            ),
            (
                "/sptr/output/bev/occupancy".into(),
                "nav_msgs/msg/OccupancyGrid".into(),
                1
            ),
            (
                "/sptr/output/points".into(),
                "sensor_msgs/msg/PointCloud2".into(),
                1
            ),
        ]
    );
    let input = PointCloud2::from_cdr(
        &Bag::open(&bag)
            .unwrap()
            .messages(&[LIDAR])
            .next()
            .unwrap()
            .unwrap()
            .data,
    )
    .unwrap();
    for m in ob.messages(&[]) {
        let m = m.unwrap();
        assert_eq!(m.timestamp_ns, 1_532_402_927_647_951_000);
        match m.topic.as_str() {
            "/sptr/output/points" => {
                let c = PointCloud2::from_cdr(&m.data).unwrap();
                assert_eq!(c.header, input.header);
                let names: Vec<&str> = c.cloud.fields.iter().map(|f| f.name.as_str()).collect();
                assert_eq!(
                    names,
                    ["x", "y", "z", "intensity", "class_id", "probability"]
                );
                let (p, _) = decode(&c.view()).unwrap();
                assert_eq!(p.len(), 34_688);
                let ids = sptr::msgs::cloud::field_values(&c.view(), &["class_id"])
                    .unwrap()
                    .unwrap();
                assert!(ids.iter().all(|&v| v < 16.0 || v == 255.0));
            }
            "/sptr/output/bev/labels" | "/sptr/output/bev/labels_color" => {
                let img = Image::from_cdr(&m.data).unwrap();
                assert_eq!((img.width, img.height), (256, 256));
                let bpp = if img.encoding == "rgb8" { 3 } else { 1 };
                assert_eq!(img.data.len(), 256 * 256 * bpp);
            }
            _ => {
                let g = OccupancyGrid::from_cdr(&m.data).unwrap();
                assert_eq!(
                    (g.info.width, g.info.height, g.data.len()),
                    (256, 256, 65_536)
                );
                assert!(g.data.iter().all(|&v| v == -1 || (0..=100).contains(&v)));
                assert!(g.data.iter().any(|&v| v >= 0));
            }
        }
    }
}

/// Ground truth from the label topic and from `.label` files give the same matrix; a replay
/// split in 3 shards and merged gives the single run's report (all but measured times), and
/// replays are deterministic.
#[test]
fn shards_merge_to_the_single_run() {
    let dir = temp_dir("shards");
    let mut m = Model::load(&small_model_yaml("sphereformer_semantickitti.yaml", &dir));
    let bag = common::data("bags/semantickitti_labels");
    let mut run = |name: &str, shard: Shard, labels: LabelSource| {
        let mut o = options(&bag, &dir.join(name));
        o.labels = Some(labels);
        o.label_map = kitti_label_map();
        o.shard = shard;
        m.replay(&o).expect("replay")
    };
    let topic = || LabelSource::Topic(LABELS.into());
    let single = run("single", Shard::WHOLE, topic());
    let r = &single.report;
    assert_eq!(
        (r.frames.total, r.frames.evaluated, r.frames.in_bag),
        (6, 6, 6)
    );
    let m = r.metrics.as_ref().expect("metrics");
    // 50 points a frame; raw labels 0 and 52 map to "unlabeled" and are ignored.
    let labels =
        sptr::replay::ground_truth::read_label_file(&common::data("semantickitti/000000.label"))
            .unwrap();
    let ignored = labels
        .iter()
        .filter(|&&l| matches!(l & 0xFFFF, 0 | 52))
        .count() as u64;
    assert_eq!(m.points_ignored, 6 * ignored);
    assert_eq!(m.points_evaluated + m.points_ignored, 300);
    assert!(m.miou.is_some() && m.accuracy.is_some());

    // Same ground truth from SemanticKITTI .label files (every frame has the sample's labels).
    let label_dir = dir.join("labels");
    std::fs::create_dir_all(&label_dir).unwrap();
    for i in 0..6 {
        std::fs::copy(
            common::data("semantickitti/000000.label"),
            label_dir.join(format!("{i:06}.label")),
        )
        .unwrap();
    }
    let from_files = run("files", Shard::WHOLE, LabelSource::Dir(label_dir.clone()));
    assert_eq!(from_files.state.confusion, single.state.confusion);
    // A missing file: that frame is replayed, not evaluated, and the report names the file.
    std::fs::remove_file(label_dir.join("000004.label")).unwrap();
    let missing = run("files", Shard::WHOLE, LabelSource::Dir(label_dir));
    assert_eq!(
        (
            missing.report.frames.evaluated,
            missing.report.frames.no_ground_truth
        ),
        (5, 1)
    );
    let why = &missing.report.skipped[0].reason;
    assert!(
        why.contains("frame 4") && why.contains("000004.label"),
        "{why}"
    );

    // Deterministic: the same labeled clouds, byte for byte.
    let again = run("again", Shard::WHOLE, topic());
    let clouds = |out: &Path| -> Vec<Vec<u8>> {
        Bag::open(&out.join("bag"))
            .unwrap()
            .messages(&["/sptr/output/points"])
            .map(|m| m.unwrap().data)
            .collect()
    };
    assert_eq!(clouds(&single.out), clouds(&again.out));
    assert_eq!(again.state.confusion, single.state.confusion);

    let shard_dirs: Vec<PathBuf> = (0..3)
        .map(|i| run(&format!("shard{i}"), Shard { index: i, count: 3 }, topic()).out)
        .collect();
    let s1 = sptr::eval::EvalState::load(&shard_dirs[1]).unwrap();
    assert_eq!(
        s1.frames.iter().map(|f| f.index).collect::<Vec<_>>(),
        vec![1, 4]
    );
    let merged_dir = dir.join("merged");
    let merged = sptr::replay::merge_shards(&shard_dirs, &merged_dir).expect("merge");
    let strip = |v: serde_json::Value| {
        let mut v = v;
        v["latency_ms"] = serde_json::Value::Null;
        v["throughput"]["processing_s"] = serde_json::Value::Null;
        v["throughput"]["frames_per_s"] = serde_json::Value::Null;
        v["throughput"]["points_per_s"] = serde_json::Value::Null;
        v["run"]["shards"] = serde_json::Value::Null;
        v
    };
    let single_json = read_json(&single.out.join("report.json"));
    let merged_json = read_json(&merged_dir.join("report.json"));
    assert_eq!(strip(merged_json.clone()), strip(single_json.clone()));
    assert_eq!(merged_json["run"]["shards"], 3);
    assert_eq!(
        merged_json["metrics"], single_json["metrics"],
        "metrics bit for bit"
    );
    // Latency: the same stages and sample counts; the figures are the pooled shard samples'.
    let stage_counts = |v: &serde_json::Value| -> Vec<(String, u64)> {
        v["latency_ms"]["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["stage"].as_str().unwrap().to_string(),
                    s["count"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(stage_counts(&merged_json), stage_counts(&single_json));
    let pooled: Vec<u64> = shard_dirs
        .iter()
        .flat_map(|d| sptr::eval::EvalState::load(d).unwrap().frames)
        .map(|f| {
            f.stages_ns
                .iter()
                .find(|(n, _)| n == "end_to_end")
                .unwrap()
                .1
        })
        .collect();
    assert_eq!(
        merged.latency_ms.end_to_end,
        sptr::eval::LatencySummary::of(&pooled)
    );
    for name in [
        "confusion.png",
        "iou.png",
        "latency.png",
        "report.md",
        "eval_state.json",
    ] {
        assert!(merged_dir.join(name).is_file(), "{name}");
    }
    assert!(is_png(&merged_dir.join("confusion.png")) && is_png(&merged_dir.join("iou.png")));
}

// ------------------------------------------------------------------------------------------
// Synthetic bags for damage and mismatches

/// A label cloud: x, y, z float32 and `label` uint32.
fn label_cloud(p: &Points, labels: &[u32]) -> CloudBuf {
    let mut data = Vec::with_capacity(p.len() * 16);
    for (i, label) in labels.iter().enumerate() {
        let j = i.min(p.len().saturating_sub(1));
        for v in [p.x[j], p.y[j], p.z[j]] {
            data.extend_from_slice(&v.to_le_bytes());
        }
        data.extend_from_slice(&label.to_le_bytes());
    }
    CloudBuf {
        height: 1,
        width: labels.len() as u32,
        fields: vec![
            PointField::new("x", 0, datatype::FLOAT32),
            PointField::new("y", 4, datatype::FLOAT32),
            PointField::new("z", 8, datatype::FLOAT32),
            PointField::new("label", 12, datatype::UINT32),
        ],
        is_bigendian: false,
        point_step: 16,
        row_step: 16 * labels.len() as u32,
        data,
        is_dense: true,
    }
}

/// An MCAP bag of `frames` SemanticKITTI sample frames (small chunks: one frame each) with a
/// label topic; `label_len(k)` is the label count of frame k, `corrupt_cdr` frames get garbage.
fn synthetic_bag(
    dir: &Path,
    frames: usize,
    label_len: impl Fn(usize) -> usize,
    corrupt_cdr: &[usize],
) -> PathBuf {
    let p = kitti_points();
    let labels =
        sptr::replay::ground_truth::read_label_file(&common::data("semantickitti/000000.label"))
            .unwrap();
    let bag = dir.join("bag");
    let mut w = BagWriter::create_with_chunk_size(&bag, Some(256)).unwrap();
    w.add_topic(LIDAR, "sensor_msgs/msg/PointCloud2").unwrap();
    w.add_topic(LABELS, "sensor_msgs/msg/PointCloud2").unwrap();
    w.add_topic("/cam/image", "sensor_msgs/msg/Image").unwrap();
    for k in 0..frames {
        let t = 1_000_000_000 + k as i64 * 100_000_000;
        let header = Header {
            stamp: Time {
                sec: 1,
                nanosec: k as u32 * 100_000_000,
            },
            frame_id: "velodyne".into(),
        };
        let cloud = PointCloud2 {
            header: header.clone(),
            cloud: encode_points(&p, Layout::XyzI32).unwrap(),
        };
        let mut data = cloud.to_cdr(true).unwrap();
        if corrupt_cdr.contains(&k) {
            data.truncate(40);
        }
        w.write(LIDAR, t, &data).unwrap();
        let n = label_len(k);
        let lab: Vec<u32> = (0..n).map(|i| labels[i % labels.len()]).collect();
        let lc = PointCloud2 {
            header,
            cloud: label_cloud(&p, &lab),
        };
        w.write(LABELS, t + 1, &lc.to_cdr(true).unwrap()).unwrap();
        let img = Image {
            height: 1,
            width: 1,
            encoding: "mono8".into(),
            step: 1,
            data: vec![0],
            ..Default::default()
        };
        w.write("/cam/image", t + 2, &img.to_cdr(true).unwrap())
            .unwrap();
    }
    w.finish().unwrap();
    bag
}

fn kitti_opts(bag: &Path, out: &Path) -> ReplayOptions {
    let mut o = options(bag, out);
    o.labels = Some(LabelSource::Topic(LABELS.into()));
    o.label_map = kitti_label_map();
    o
}

fn mcap_file(bag: &Path) -> PathBuf {
    std::fs::read_dir(bag)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "mcap"))
        .unwrap()
}

/// A truncated bag: the frames before the cut are evaluated, the report names the file and
/// the damage; the frames of a CDR-corrupt message and a short label cloud are listed.
#[test]
fn truncated_bag_keeps_frames_before_the_damage() {
    let dir = temp_dir("truncated");
    let mut m = Model::load(&small_model_yaml("sphereformer_semantickitti.yaml", &dir));
    let bag = synthetic_bag(&dir, 8, |k| if k == 2 { 49 } else { 50 }, &[1]);
    // Complete bag first: every frame is accounted for.
    let full = m.replay(&kitti_opts(&bag, &dir.join("full"))).unwrap();
    assert!(full.damage.is_none());
    let st: Vec<FrameStatus> = full.state.frames.iter().map(|f| f.status).collect();
    assert_eq!(
        st[..3],
        [
            FrameStatus::Evaluated,
            FrameStatus::Skipped,
            FrameStatus::NoGroundTruth
        ]
    );
    assert_eq!(full.report.frames.evaluated, 6);
    let skipped = &full.report.skipped;
    assert_eq!(skipped.len(), 2);
    assert!(
        skipped[0].reason.contains("frame 1") && skipped[0].reason.contains("CDR"),
        "{}",
        skipped[0].reason
    );
    let why = &skipped[1].reason;
    assert!(
        why.contains("frame 2")
            && why.contains(LABELS)
            && why.contains("49 labels")
            && why.contains("50 points"),
        "{why}"
    );
    assert!(std::fs::read_to_string(full.out.join("report.md"))
        .unwrap()
        .contains("Frames not evaluated"));

    // Cut the file in the middle of the data.
    let file = mcap_file(&bag);
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() * 6 / 10]).unwrap();
    let cut = m.replay(&kitti_opts(&bag, &dir.join("cut"))).unwrap();
    let d = cut.damage.expect("damage reported");
    assert!(d.file.ends_with(".mcap"), "{}", d.file);
    assert!(d.frames_before >= 2 && d.frames_before < 8, "{d:?}");
    assert_eq!(cut.report.frames.in_bag, d.frames_before);
    assert_eq!(cut.report.frames.total, d.frames_before);
    let report = read_json(&cut.out.join("report.json"));
    assert_eq!(report["damage"]["file"], d.file.as_str());
    assert!(report["metrics"]["points_evaluated"].as_u64().unwrap() > 0);
    // The frames before the damage have the same records as in the complete replay.
    let key = |f: &sptr::eval::FrameRecord| {
        (
            f.index,
            f.status,
            f.points,
            f.labeled_points,
            f.reason.clone(),
        )
    };
    // (The last one may have lost its label cloud, received after it, to the cut.)
    let n = d.frames_before as usize;
    assert_eq!(
        cut.state.frames[..n - 1]
            .iter()
            .map(key)
            .collect::<Vec<_>>(),
        full.state.frames[..n - 1]
            .iter()
            .map(key)
            .collect::<Vec<_>>()
    );
    let last = &cut.state.frames[n - 1];
    assert!(
        last.status == FrameStatus::Evaluated
            || last
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("no label cloud")),
        "{last:?}"
    );
}

/// Flipped bytes inside a chunk: a CRC or decompression error naming the file.
#[test]
fn corrupt_chunk_is_reported_with_its_file() {
    let dir = temp_dir("corrupt");
    let mut m = Model::load(&small_model_yaml("sphereformer_semantickitti.yaml", &dir));
    let bag = synthetic_bag(&dir, 6, |_| 50, &[]);
    let file = mcap_file(&bag);
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    for b in &mut bytes[at..at + 64] {
        *b ^= 0x5A;
    }
    std::fs::write(&file, &bytes).unwrap();
    let r = m.replay(&kitti_opts(&bag, &dir.join("out"))).unwrap();
    let d = r.damage.expect("damage reported");
    assert!(
        d.file
            .contains(&file.file_name().unwrap().to_string_lossy().to_string()),
        "{d:?}"
    );
    assert!(d.frames_before < 6);
    assert_eq!(r.report.frames.evaluated, d.frames_before);
}

/// Bags that cannot be opened or have the wrong topics: errors that name the file or topic.
#[test]
fn unusable_bags_and_topics_are_clear_errors() {
    let dir = temp_dir("unusable");
    let mut m = Model::load(&small_model_yaml("sphereformer_semantickitti.yaml", &dir));
    let bag = synthetic_bag(&dir, 2, |_| 50, &[]);
    let mut err = |o: &ReplayOptions| m.replay(o).expect_err("an error").to_string();

    // A wrong-typed LiDAR topic and label topic.
    let mut o = kitti_opts(&bag, &dir.join("o1"));
    o.lidar_topic = Some("/cam/image".into());
    let e = err(&o);
    assert!(
        e.contains("/cam/image")
            && e.contains("sensor_msgs/msg/Image")
            && e.contains("PointCloud2"),
        "{e}"
    );
    let mut o = kitti_opts(&bag, &dir.join("o2"));
    o.labels = Some(LabelSource::Topic("/cam/image".into()));
    let e = err(&o);
    assert!(e.contains("label topic /cam/image"), "{e}");
    // Two PointCloud2 topics and no default: the user must choose... here the default exists.
    let mut o = kitti_opts(&bag, &dir.join("o3"));
    o.lidar_topic = Some("/nope".into());
    assert!(err(&o).contains("no LiDAR topic /nope"));

    // Unknown storage id.
    let meta = bag.join("metadata.yaml");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(
        &meta,
        text.replace("storage_identifier: mcap", "storage_identifier: rosbag_v9"),
    )
    .unwrap();
    let e = err(&kitti_opts(&bag, &dir.join("o4")));
    assert!(
        e.contains("rosbag_v9") && e.contains("metadata.yaml"),
        "{e}"
    );

    // No metadata.yaml.
    std::fs::remove_file(&meta).unwrap();
    let e = err(&kitti_opts(&bag, &dir.join("o5")));
    assert!(
        e.contains("metadata.yaml") && e.contains(&bag.display().to_string()),
        "{e}"
    );
}

/// The output bag writer: what it writes reads back through the reader, with a schema per
/// channel so viewers can decode it.
#[test]
fn written_bags_read_back_with_schemas() {
    let dir = temp_dir("writer");
    let bag = synthetic_bag(&dir, 3, |_| 50, &[]);
    let b = Bag::open(&bag).unwrap();
    assert_eq!(b.message_count(), 9);
    assert_eq!(
        b.topics().iter().find(|t| t.name == LIDAR).map(|t| t.count),
        Some(3)
    );
    let msgs: Vec<_> = b.messages(&[LIDAR]).map(|m| m.unwrap()).collect();
    assert_eq!(
        msgs.iter().map(|m| m.timestamp_ns).collect::<Vec<_>>(),
        vec![1_000_000_000, 1_100_000_000, 1_200_000_000]
    );
    assert_eq!(
        decode(&PointCloud2::from_cdr(&msgs[0].data).unwrap().view())
            .unwrap()
            .0,
        kitti_points()
    );
    let bytes = std::fs::read(mcap_file(&bag)).unwrap();
    let mut schemas = BTreeSet::new();
    for m in mcap::MessageStream::new(&bytes).unwrap() {
        let m = m.unwrap();
        let s = m.channel.schema.clone().unwrap();
        assert_eq!(
            (s.encoding.as_str(), m.channel.message_encoding.as_str()),
            ("ros2msg", "cdr")
        );
        assert!(std::str::from_utf8(&s.data)
            .unwrap()
            .contains("std_msgs/Header header"));
        schemas.insert(s.name.clone());
    }
    assert_eq!(
        schemas,
        [
            "sensor_msgs/msg/Image".to_string(),
            "sensor_msgs/msg/PointCloud2".to_string()
        ]
        .into()
    );
}

/// `nav_msgs/OccupancyGrid` encodes to exactly the bytes `rosbags` serializes.
#[test]
fn occupancy_grid_cdr_matches_rosbags() {
    let bytes = std::fs::read(common::data("cdr/occupancy_grid.le.cdr")).unwrap();
    let v = read_json(&common::data("cdr/occupancy_grid.json"));
    let stamp = v["stamp_ns"].as_i64().unwrap();
    let time = Time {
        sec: (stamp / 1_000_000_000) as i32,
        nanosec: (stamp % 1_000_000_000) as u32,
    };
    let f = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let g = OccupancyGrid {
        header: Header {
            stamp: time,
            frame_id: v["frame_id"].as_str().unwrap().into(),
        },
        info: sptr::msgs::cdr::MapMetaData {
            map_load_time: time,
            resolution: v["resolution"].as_f64().unwrap() as f32,
            width: 3,
            height: 2,
            origin: sptr::msgs::cdr::Pose {
                position: f("origin").try_into().unwrap(),
                orientation: f("orientation").try_into().unwrap(),
            },
        },
        data: v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap() as i8)
            .collect(),
    };
    assert_eq!(g.to_cdr(true).unwrap(), bytes);
    assert_eq!(OccupancyGrid::from_cdr(&bytes).unwrap(), g);
}

fn cuda_usable() -> bool {
    sptr::device::cuda_unavailable().is_none()
}

/// The CLI: `bag info` lists the sample bag's topics; `--device cuda` runs on a usable GPU and is
/// a clear error without one.
#[test]
fn cli_bag_info_and_device_choice() {
    let exe = common::sptr_exe();
    let out = std::process::Command::new(&exe)
        .args(["bag", "info"])
        .arg(common::data("bags/nuscenes_sample"))
        .arg("--count")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for s in [
        "storage:    mcap",
        LIDAR,
        "sensor_msgs/msg/CompressedImage",
        "/sptr/input/cameras/CAM_BACK_LEFT/camera_info",
        "messages:   13",
    ] {
        assert!(text.contains(s), "{s} in\n{text}");
    }
    let dir = temp_dir("cli");
    let model = small_model_yaml("sphereformer_semantickitti.yaml", &dir);
    let out = std::process::Command::new(&exe)
        .args([
            "replay",
            "--device",
            "cuda",
            "--random-weights",
            "1",
            "--model",
        ])
        .arg(&model)
        .arg(common::data("bags/semantickitti_labels"))
        .arg("--out")
        .arg(dir.join("out"))
        .output()
        .unwrap();
    // with a usable GPU the replay runs there; without one it is a clear error naming the fix
    if cuda_usable() {
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    } else {
        assert!(!out.status.success());
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("--device cuda") && e.contains("--device cpu"), "{e}");
    }
    // A directory that is not a bag.
    let out = std::process::Command::new(&exe)
        .args(["bag", "info"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("no metadata.yaml") && e.contains(&dir.display().to_string()),
        "{e}"
    );
}

/// `sptr replay` without `--params` writes the BEV messages the node publishes with its default
/// parameters (config/perception.yaml): the 256 x 256 grid of 0.4 m cells from (-51.2, -51.2),
/// stamped `base_link`, saying once that the cloud is in another frame; a model the default
/// obstacle classes do not fit is a clear error naming the fix.
#[test]
fn cli_replay_without_params_uses_the_nodes_defaults() {
    let exe = common::sptr_exe();
    let dir = temp_dir("cli-defaults");
    let replay = |model: &Path, bag: &str, out: &str| {
        std::process::Command::new(&exe)
            .args(["replay", "--device", "cpu", "--random-weights", "1", "--progress", "plain"])
            .arg("--model")
            .arg(model)
            .arg(common::data(bag))
            .arg("--out")
            .arg(dir.join(out))
            .output()
            .unwrap()
    };
    let kitti = small_model_yaml("sphereformer_semantickitti.yaml", &dir);
    let run = replay(&kitti, "bags/semantickitti_labels", "kitti");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert_eq!(
        stderr.matches("no transform is applied").count(),
        1,
        "one note that the grids' frame is not the cloud's:\n{stderr}"
    );
    let ob = Bag::open(&dir.join("kitti/bag")).unwrap();
    let mut seen = 0;
    for m in ob.messages(&["/sptr/output/bev/labels", "/sptr/output/bev/occupancy"]) {
        let m = m.unwrap();
        if m.topic == "/sptr/output/bev/labels" {
            let img = Image::from_cdr(&m.data).unwrap();
            assert_eq!(img.header.frame_id, "base_link");
            assert_eq!((img.width, img.height, img.step), (256, 256, 256));
        } else {
            let g = OccupancyGrid::from_cdr(&m.data).unwrap();
            assert_eq!(g.header.frame_id, "base_link");
            assert_eq!((g.info.width, g.info.height, g.info.resolution), (256, 256, 0.4));
            assert_eq!(g.info.origin.position, [-51.2, -51.2, 0.0]);
        }
        seen += 1;
    }
    assert_eq!(seen, 12, "6 frames x 2 topics");

    let nus = small_model_yaml("sphereformer_nuscenes.yaml", &dir);
    let run = replay(&nus, "bags/nuscenes_sample", "nus");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        stderr.contains("--params") && stderr.contains("config/perception_nuscenes.yaml"),
        "{stderr}"
    );
}

/// Points the codec drops (NaN x/y/z) are dropped from the ground truth too, so the labels
/// stay aligned: ground truth equal to the model's own output scores 100 %.
#[test]
fn labels_stay_aligned_when_nan_points_are_dropped() {
    let dir = temp_dir("nan");
    let mut m = Model::load(&small_model_yaml("sphereformer_semantickitti.yaml", &dir));
    let p = kitti_points();
    let pred = m.segmenter().segment(&[&p]).unwrap().labels;
    assert!(
        pred.iter().all(|&l| l < 19),
        "every sample point has a voxel"
    );
    // Insert two NaN points (label 0) at positions 3 and 11 of the message.
    let mut q = p.clone();
    let mut gt = pred.clone();
    for at in [3usize, 11] {
        q.x.insert(at, f32::NAN);
        q.y.insert(at, 0.0);
        q.z.insert(at, 0.0);
        q.intensity.insert(at, 0.0);
        gt.insert(at, 0);
    }
    let bag = dir.join("bag");
    let mut w = BagWriter::create(&bag).unwrap();
    w.add_topic(LIDAR, "sensor_msgs/msg/PointCloud2").unwrap();
    w.add_topic(LABELS, "sensor_msgs/msg/PointCloud2").unwrap();
    let header = Header {
        stamp: Time { sec: 5, nanosec: 0 },
        frame_id: "velodyne".into(),
    };
    let cloud = PointCloud2 {
        header: header.clone(),
        cloud: encode_points(&q, Layout::XyzI32).unwrap(),
    };
    w.write(LIDAR, 5_000_000_000, &cloud.to_cdr(true).unwrap())
        .unwrap();
    let lc = PointCloud2 {
        header,
        cloud: label_cloud(&q, &gt),
    };
    w.write(LABELS, 5_000_000_001, &lc.to_cdr(true).unwrap())
        .unwrap();
    w.finish().unwrap();
    let mut o = options(&bag, &dir.join("out"));
    o.labels = Some(LabelSource::Topic(LABELS.into()));
    let r = m.replay(&o).unwrap();
    let m = r.report.metrics.expect("metrics");
    assert_eq!((m.points_evaluated, m.accuracy), (50, Some(1.0)));
    assert_eq!(r.state.frames[0].points, 50);
}

/// `sptr eval agreement`: a replay agrees with itself; a replay of other frames is refused.
#[test]
fn agreement_of_two_replays() {
    let dir = temp_dir("agreement");
    let mut m = Model::load(&small_model_yaml("sphereformer_semantickitti.yaml", &dir));
    let bag = common::data("bags/semantickitti_labels");
    let a = m.replay(&options(&bag, &dir.join("a"))).unwrap();
    let b = m.replay(&options(&bag, &dir.join("b"))).unwrap();
    let ag = sptr::replay::agreement::agreement(&a.out, &b.out.join("bag")).unwrap();
    assert_eq!(
        (ag.frames.len(), ag.points, ag.fraction()),
        (6, 300, Some(1.0))
    );
    let mut half = options(&bag, &dir.join("c"));
    half.shard = Shard { index: 0, count: 2 };
    let c = m.replay(&half).unwrap();
    let e = sptr::replay::agreement::agreement(&a.out, &c.out)
        .unwrap_err()
        .to_string();
    assert!(e.contains("6 labeled frames") && e.contains("has 3"), "{e}");
}
