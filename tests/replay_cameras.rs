//! `sptr replay` with the camera branch, on the CPU: the committed nuScenes sample bag
//! (six CompressedImages + CameraInfos, no /tf_static: the calibration file), a bag written here
//! with /tf_static, a stale camera, a corrupt JPEG, a bad CameraInfo and a calibration change, and
//! a bag without cameras. A small deterministic stand-in ([`CameraCountModel`]) checks the map's
//! path into the output bag exactly; the real seg model (reduced YAML, random weights) runs on the
//! sample bag with ground-truth masks.

mod common;
#[path = "common/replay.rs"]
mod replay_setup;
#[path = "common/bevseg.rs"]
mod seg;

use std::path::{Path, PathBuf};

use sptr::msgs::cdr::{CameraInfo, CdrMessage, CompressedImage, Header, Image, OccupancyGrid, PointCloud2, TfMessage, Time, TransformStamped};
use sptr::bag::{Bag, BagWriter};
use sptr::frame::cameras::{BevFrameInputs, BevMapModel};
use sptr::models::bevfusion::map::{BevMap, NUSCENES_MAP_CLASSES};
use sptr::msgs::cloud::{encode_points, Layout};
use sptr::frame::params::NodeParams;
use sptr::replay::request::camera_options;
use sptr::replay::{replay, replay_with, CameraReplayOptions, ReplayOutcome};

use replay_setup::{options, processor, CAMS_PARAMS};

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sptr-replay-cams-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}


fn cams_options() -> CameraReplayOptions {
    let path = common::root().join(CAMS_PARAMS);
    camera_options(&path, &NodeParams::load(&path).unwrap()).unwrap().expect("the params file has cameras")
}


/// A stand-in for the BEV map model, deterministic in what the plumbing hands it: every class's
/// probability is `used cameras / cameras` in the cells in front of the LiDAR (x ≥ 0) and 0
/// behind, plus the number of aggregated LiDAR points / 1e6 on class 0 (so the cloud matters).
struct CameraCountModel {
    calls: usize,
}

impl BevMapModel for CameraCountModel {
    fn forward(&mut self, inputs: &BevFrameInputs) -> Result<BevMap, sptr::Error> {
        self.calls += 1;
        let mut m = BevMap::nuscenes_zeros();
        let p = inputs.used() as f32 / inputs.cameras.len() as f32;
        for c in 0..6 {
            for x in 100..200 {
                for y in 0..200 {
                    m.probabilities[(c * 200 + x) * 200 + y] = p;
                }
            }
        }
        m.probabilities[0] += inputs.points.len() as f32 * 1e-6;
        Ok(m)
    }
}

fn bag_messages(bag: &Path, topic: &str) -> Vec<(i64, Vec<u8>)> {
    let b = Bag::open(bag).unwrap();
    b.messages(&[topic]).map(|m| m.unwrap()).map(|m| (m.timestamp_ns, m.data)).collect()
}

/// The sample bag: its one frame uses all six cameras (calibration from the params file's
/// calibration file: the bag has no /tf_static), the camera stages join the latency table, and
/// with a model the map topics are in the output bag, stamped like the cloud, 200 x 200, the
/// same bytes on a second run; the map PNG is written.
#[test]
fn sample_bag_uses_all_six_cameras_and_writes_the_map() {
    let dir = temp_dir("sample");
    let (yaml, mut p) = processor(&dir);
    let bag = common::data("bags/nuscenes_sample");
    let out = dir.join("plain");
    let o = replay(&mut p, &yaml, &options(&bag, &out, Some(cams_options()))).unwrap();
    assert_eq!(o.cameras.len(), 6);
    for c in &o.cameras {
        assert_eq!((c.used, c.masked), (1, 0), "{c:?}");
    }
    let stages: Vec<&str> = o.state.frames[0].stages_ns.iter().map(|(n, _)| n.as_str()).collect();
    for s in ["camera_sync", "camera_decode", "sweeps"] {
        assert!(stages.contains(&s), "{stages:?}");
    }
    assert_eq!(stages.last(), Some(&"end_to_end"));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("cameras.json")).unwrap()).unwrap();
    assert_eq!(json["frames"][0]["status"], serde_json::json!(["used", "used", "used", "used", "used", "used"]));
    assert!(json["cameras"][0]["calibration"].as_str().unwrap().contains("extrinsic from file"), "{json}");
    // ages: the cloud (…647951) minus each camera's stamp, all within 0.12 s
    let ages: Vec<f64> = json["frames"][0]["age_ms"].as_array().unwrap().iter().map(|a| a.as_f64().unwrap()).collect();
    assert!(ages.iter().all(|a| (0.0..=120.0).contains(a)), "{ages:?}");
    assert!(Bag::open(&out.join("bag")).unwrap().topics().iter().all(|t| !t.name.contains("/map")));

    // with the stand-in model
    let mut runs = Vec::new();
    for k in 0..2 {
        let out = dir.join(format!("model{k}"));
        let mut opts = options(&bag, &out, Some(cams_options()));
        opts.bev_png_frames = [0].into_iter().collect();
        let mut model = CameraCountModel { calls: 0 };
        let o: ReplayOutcome = replay_with(&mut p, &yaml, &opts, Some(&mut model)).unwrap();
        assert_eq!(model.calls, 1);
        assert!(o.state.frames[0].stages_ns.iter().any(|(n, _)| n == "bev_map"));
        assert!(out.join("bev/map_000000.png").is_file());
        let ob = out.join("bag");
        let clouds = bag_messages(&ob, "/sptr/output/points");
        let cloud = PointCloud2::from_cdr(&clouds[0].1).unwrap();
        let mut frame = Vec::new();
        for class in NUSCENES_MAP_CLASSES {
            let m = bag_messages(&ob, &format!("/sptr/output/bev/map/{class}"));
            assert_eq!(m.len(), 1, "{class}");
            let g = OccupancyGrid::from_cdr(&m[0].1).unwrap();
            assert_eq!(g.header, Header { stamp: cloud.header.stamp, frame_id: "lidar_top".into() });
            assert_eq!((g.info.width, g.info.height, g.info.resolution), (200, 200, 0.5));
            assert_eq!(g.info.origin.position, [-50.0, -50.0, 0.0]);
            // six of six cameras: 100 in front (cell x ≥ 100 is column ≥ 100 of each row)
            assert_eq!(g.data[0 * 200 + 150], 100);
            assert_eq!(g.data[0 * 200 + 50], 0);
            frame.push(m[0].1.clone());
        }
        for (t, enc) in [("/sptr/output/bev/map_bits", "mono8"), ("/sptr/output/bev/map_color", "rgb8")] {
            let m = bag_messages(&ob, t);
            let img = Image::from_cdr(&m[0].1).unwrap();
            assert_eq!((img.encoding.as_str(), img.width, img.height, img.header.stamp), (enc, 200, 200, cloud.header.stamp));
            frame.push(m[0].1.clone());
        }
        let bits = Image::from_cdr(&bag_messages(&ob, "/sptr/output/bev/map_bits")[0].1).unwrap();
        assert_eq!(bits.data[150], 0b11_1111, "every class at or above 0.5 in front");
        assert_eq!(bits.data[50], 0);
        runs.push(frame);
    }
    assert_eq!(runs[0], runs[1], "the same map bytes every run");
}

fn header(ns: i64, frame: &str) -> Header {
    Header { stamp: Time { sec: (ns / 1_000_000_000) as i32, nanosec: (ns % 1_000_000_000) as u32 }, frame_id: frame.into() }
}

fn tf_static(cam_b_x: f64) -> TfMessage {
    let q = [-0.5, 0.5, -0.5, 0.5]; // camera looking along +x
    let t = |child: &str, x: f64, rot: [f64; 4]| TransformStamped { header: header(0, "base_link"), child_frame_id: child.into(), translation: [x, 0.0, 1.5], rotation: rot };
    TfMessage { transforms: vec![t("lidar_top", 0.0, [0.0, 0.0, 0.0, 1.0]), t("cam_a", 1.0, q), t("cam_b", cam_b_x, q)] }
}

fn info(frame: &str, fx: f64) -> CameraInfo {
    let mut c = CameraInfo { header: header(0, frame), width: 16, height: 8, distortion_model: "plumb_bob".into(), ..Default::default() };
    c.k = [fx, 0.0, 8.0, 0.0, fx, 4.0, 0.0, 0.0, 1.0];
    c
}

fn raw(ns: i64, frame: &str) -> Image {
    Image { header: header(ns, frame), height: 8, width: 16, encoding: "rgb8".into(), is_bigendian: 0, step: 48, data: vec![100; 16 * 8 * 3] }
}

/// A two-camera bag written here (MCAP, through sptr's writer): /tf_static with both cameras,
/// CAM_A (raw rgb8) fine every frame; CAM_B (JPEG) fine at frame 0, a truncated JPEG at frame 1
/// (still its latest image at frame 2), stale at frame 3, when its transform on /tf_static moves
/// (a calibration change) and a CameraInfo with zero intrinsics arrives (counted, ignored).
#[test]
fn written_bag_with_tf_static_stale_corrupt_and_a_calibration_change() {
    let dir = temp_dir("written");
    let bag = dir.join("in");
    let mut w = BagWriter::create(&bag).unwrap();
    let topics = [
        ("/sptr/input/points", "sensor_msgs/msg/PointCloud2"),
        ("/tf_static", "tf2_msgs/msg/TFMessage"),
        ("/sptr/input/cameras/CAM_A/image", "sensor_msgs/msg/Image"),
        ("/sptr/input/cameras/CAM_A/camera_info", "sensor_msgs/msg/CameraInfo"),
        ("/sptr/input/cameras/CAM_B/image/compressed", "sensor_msgs/msg/CompressedImage"),
        ("/sptr/input/cameras/CAM_B/camera_info", "sensor_msgs/msg/CameraInfo"),
    ];
    for (t, ty) in topics {
        w.add_topic(t, ty).unwrap();
    }
    let jpeg = std::fs::read(common::data("camera/small.jpg")).unwrap();
    let ms = 1_000_000i64;
    let t0 = 1_700_000_000 * 1_000_000_000i64;
    let mut sweep = common::nuscenes_sweep();
    sweep.x.truncate(200);
    sweep.y.truncate(200);
    sweep.z.truncate(200);
    sweep.intensity.truncate(200);
    sweep.ring = None;
    let cloud = |ns: i64| PointCloud2 { header: header(ns, "lidar_top"), cloud: encode_points(&sweep, Layout::XyzI32).unwrap() };
    let compressed = |ns: i64, data: Vec<u8>| CompressedImage { header: header(ns, "cam_b"), format: "jpeg".into(), data };
    let write = |w: &mut BagWriter, t: &str, ns: i64, bytes: Vec<u8>| w.write(t, ns, &bytes).unwrap();
    let setup = t0 - 50 * ms; // before the first cloud
    write(&mut w, "/tf_static", setup, tf_static(1.0).to_cdr(true).unwrap());
    write(&mut w, topics[3].0, setup, info("cam_a", 10.0).to_cdr(true).unwrap());
    // CAM_B's images are the small JPEG: its CameraInfo says its size
    let (jw, jh) = {
        let img = sptr::sensors::image::compressed::decode_compressed("jpeg", &jpeg, &Default::default()).unwrap();
        (img.width as u32, img.height as u32)
    };
    let mut info_b = info("cam_b", 10.0);
    info_b.width = jw;
    info_b.height = jh;
    write(&mut w, topics[5].0, setup, info_b.to_cdr(true).unwrap());
    for k in 0..4i64 {
        let t = t0 + k * 100 * ms;
        write(&mut w, topics[2].0, t - 10 * ms, raw(t - 10 * ms, "cam_a").to_cdr(true).unwrap());
        match k {
            0 => write(&mut w, topics[4].0, t - 5 * ms, compressed(t - 5 * ms, jpeg.clone()).to_cdr(true).unwrap()),
            1 => write(&mut w, topics[4].0, t - 5 * ms, compressed(t - 5 * ms, jpeg[..jpeg.len() / 2].to_vec()).to_cdr(true).unwrap()),
            2 => {} // stale at frame 2: its last image is 105 ms old... and 205 ms at frame 3
            _ => {
                write(&mut w, "/tf_static", t - 2 * ms, tf_static(1.2).to_cdr(true).unwrap());
                write(&mut w, topics[5].0, t - 2 * ms, info("cam_b", 0.0).to_cdr(true).unwrap());
            }
        }
        write(&mut w, "/sptr/input/points", t, cloud(t).to_cdr(true).unwrap());
    }
    w.finish().unwrap();

    let (yaml, mut p) = processor(&dir);
    let mut cams = cams_options();
    // two cameras: CAM_A raw, CAM_B compressed, TF first (no calibration file)
    let params_path = common::root().join(CAMS_PARAMS);
    let mut node = NodeParams::load(&params_path).unwrap();
    node.input.cameras = vec!["CAM_A".into(), "CAM_B".into()];
    node.camera.overrides.insert("CAM_A".into(), sptr::frame::params::CameraOverride { transport: Some(sptr::frame::params::ImageTransport::Raw), ..Default::default() });
    node.camera.calibration_file.clear();
    let c2 = camera_options(&params_path, &node).unwrap().unwrap();
    cams.inputs = c2.inputs;
    cams.branch = c2.branch;
    let out = dir.join("out");
    let o = replay(&mut p, &yaml, &options(&bag, &out, Some(cams))).unwrap();
    assert_eq!(o.state.frames.len(), 4);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("cameras.json")).unwrap()).unwrap();
    let status: Vec<Vec<String>> = json["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["status"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .collect();
    assert_eq!(status, [["used", "used"], ["used", "decode_error"], ["used", "decode_error"], ["used", "stale"]], "{json}");
    // frame 2: the corrupt image is still CAM_B's latest (95 ms + 10 ms = 105 ms old): masked again
    // as a decode error (decoded once); frame 3: 205 ms old, stale.
    let changed: Vec<bool> = json["frames"].as_array().unwrap().iter().map(|f| f["calibration_changed"].as_bool().unwrap()).collect();
    assert_eq!(changed, [true, false, false, true]);
    assert_eq!(json["calibration_changes"], 1);
    assert_eq!(json["cameras"][1]["camera_info_errors"], 1);
    assert_eq!(json["bad_messages"], 1, "the zero-intrinsics CameraInfo");
    assert!(json["cameras"][0]["calibration"].as_str().unwrap().contains("extrinsic from tf"), "{json}");
    let b = &o.cameras[1];
    assert_eq!((b.used, b.masked), (1, 3));
    assert_eq!(b.masked_by, vec![("stale", 1), ("decode_error", 2)]);
}

/// A bag without cameras replays LiDAR-only with the camera branch on: every camera missing,
/// every frame replayed.
#[test]
fn bag_without_cameras_replays_lidar_only() {
    let dir = temp_dir("nocams");
    let bag = dir.join("in");
    let mut w = BagWriter::create(&bag).unwrap();
    w.add_topic("/sptr/input/points", "sensor_msgs/msg/PointCloud2").unwrap();
    let mut sweep = common::nuscenes_sweep();
    for v in [&mut sweep.x, &mut sweep.y, &mut sweep.z, &mut sweep.intensity] {
        v.truncate(100);
    }
    sweep.ring = None;
    for k in 0..2i64 {
        let t = 1_000_000_000 + k * 100_000_000;
        let m = PointCloud2 { header: header(t, "lidar_top"), cloud: encode_points(&sweep, Layout::XyzI32).unwrap() };
        w.write("/sptr/input/points", t, &m.to_cdr(true).unwrap()).unwrap();
    }
    w.finish().unwrap();
    let (yaml, mut p) = processor(&dir);
    let out = dir.join("out");
    let o = replay(&mut p, &yaml, &options(&bag, &out, Some(cams_options()))).unwrap();
    assert_eq!(o.state.frames.len(), 2);
    assert!(o.state.frames.iter().all(|f| f.reason.is_none()), "{:?}", o.state.frames);
    for c in &o.cameras {
        assert_eq!(c.masked_by, vec![("missing", 2)], "{c:?}");
    }
    // and without the camera branch, no cameras.json
    let out2 = dir.join("out2");
    let o2 = replay(&mut p, &yaml, &options(&bag, &out2, None)).unwrap();
    assert!(o2.cameras.is_empty() && !out2.join("cameras.json").exists());
}

/// Records the maps of the model it wraps (the test's window into what replay wrote).
struct Recording<'a> {
    inner: &'a mut sptr::frame::map_model::SegMapModel,
    maps: Vec<BevMap>,
}

impl BevMapModel for Recording<'_> {
    fn forward(&mut self, inputs: &BevFrameInputs) -> Result<BevMap, sptr::Error> {
        let m = self.inner.forward(inputs)?;
        self.maps.push(m.clone());
        Ok(m)
    }
    fn last_stages(&self) -> Vec<(String, f64)> {
        self.inner.last_stages()
    }
}

/// The real seg model (the reduced fusion YAML, random weights, CPU) on the sample bag: the map
/// topics are in the output bag with the cloud's stamp and the head's 50 x 50 grid at 2 m, the
/// PNG is written, the model's stages join the latency table, a second run gives the same map,
/// and ground-truth masks made from the first map (p >= 0.5) score IoU 1 at threshold 0.5 for
/// every class present (report.json's `bev_map`, report.md's section).
#[test]
fn sample_bag_with_the_seg_model_writes_and_evaluates_the_map() {
    use sptr::frame::map_model::{SegMapModel, SegWeightsSource};
    let dir = temp_dir("segmodel");
    let (yaml, mut p) = processor(&dir);
    let bag = common::data("bags/nuscenes_sample");
    let small = common::data("bevseg/fusion_small.yaml");
    let mut seg = SegMapModel::open(&small, &SegWeightsSource::Random(3), sptr::device::Device::Cpu).unwrap();
    let gt = dir.join("gt");
    std::fs::create_dir_all(&gt).unwrap();
    let mut maps = Vec::new();
    for k in 0..2 {
        let out = dir.join(format!("run{k}"));
        let mut cams = cams_options();
        if k == 1 {
            cams.map_ground_truth = Some(gt.clone());
        }
        let mut opts = options(&bag, &out, Some(cams));
        opts.bev_png_frames = [0].into_iter().collect();
        let mut rec = Recording { inner: &mut seg, maps: Vec::new() };
        let o = replay_with(&mut p, &yaml, &opts, Some(&mut rec)).unwrap();
        assert_eq!(rec.maps.len(), 1);
        let map = rec.maps.pop().unwrap();
        assert_eq!((map.classes.len(), map.nx, map.ny, map.resolution), (6, 50, 50, 2.0));
        assert!(map.masked_cameras.is_empty(), "{:?}", map.masked_cameras);
        assert!(map.lidar.as_ref().is_some_and(|l| l.points_in > 1000 && !l.empty), "{:?}", map.lidar);
        let stages: Vec<&str> = o.state.frames[0].stages_ns.iter().map(|(n, _)| n.as_str()).collect();
        for s in ["bev_map/preprocess", "bev_map/lidar", "bev_map/decoder", "bev_map/head", "bev_map"] {
            assert!(stages.contains(&s), "{s}: {stages:?}");
        }
        assert!(out.join("bev/map_000000.png").is_file());
        let ob = out.join("bag");
        let cloud = PointCloud2::from_cdr(&bag_messages(&ob, "/sptr/output/points")[0].1).unwrap();
        for (c, class) in NUSCENES_MAP_CLASSES.iter().enumerate() {
            let m = bag_messages(&ob, &format!("/sptr/output/bev/map/{class}"));
            assert_eq!(m.len(), 1, "{class}");
            let g = OccupancyGrid::from_cdr(&m[0].1).unwrap();
            assert_eq!(g.header.stamp, cloud.header.stamp);
            assert_eq!((g.info.width, g.info.height, g.info.resolution), (50, 50, 2.0));
            // row-major, x along a row: cell (x, y) is data[y * 50 + x]
            assert_eq!(g.data[7 * 50 + 3], sptr::frame::map_messages::occupancy_value(map.at(c, 3, 7)));
        }
        for (t, enc) in [("/sptr/output/bev/map_bits", "mono8"), ("/sptr/output/bev/map_color", "rgb8")] {
            let img = Image::from_cdr(&bag_messages(&ob, t)[0].1).unwrap();
            assert_eq!((img.encoding.as_str(), img.width, img.height, img.header.stamp), (enc, 50, 50, cloud.header.stamp));
        }
        let cams_json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("cameras.json")).unwrap()).unwrap();
        assert_eq!((cams_json["bev_maps"].as_u64(), cams_json["bev_map_errors"].as_u64()), (Some(1), Some(0)));
        if k == 0 {
            assert!(o.map_metrics.is_none());
            let masks: Vec<f32> = map.probabilities.iter().map(|&v| if v >= 0.5 { 1.0 } else { 0.0 }).collect();
            sptr::nn::npy::write_f32(&gt.join("000000.npy"), &[6, 50, 50], &masks).unwrap();
        } else {
            let m = o.map_metrics.expect("evaluated");
            assert_eq!(m.frames, 1);
            for (c, ci) in m.classes.iter().enumerate() {
                let present = map.class_plane(c).unwrap().iter().any(|&v| v >= 0.5);
                assert_eq!(ci.ious[3] > 0.999_999, present, "{ci:?}");
            }
            let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
            assert_eq!(report["bev_map"]["frames"], 1);
            assert!((report["bev_map"]["miou"].as_f64().unwrap() - m.miou).abs() < 1e-12);
            assert!(std::fs::read_to_string(out.join("report.md")).unwrap().contains("## BEV map segmentation"));
        }
        maps.push(map);
    }
    assert_eq!(maps[0], maps[1], "the same map every run");
    // `sptr eval agreement`'s map measure on the two runs: every cell and class the same
    let ag = sptr::replay::agreement::agreement(&dir.join("run0"), &dir.join("run1")).unwrap();
    let m = ag.map.expect("both replays wrote maps");
    assert_eq!((m.frames, m.classes, m.cell_bits, m.same_bits, m.max_probability_diff), (1, 6, 6 * 2500, 6 * 2500, 0));
}

/// The adapter's masking: a frame with no usable camera runs the fusion model LiDAR-only (every
/// camera named as masked) and is a per-frame error for the camera-only model.
#[test]
fn no_usable_camera_is_lidar_only_for_fusion_and_an_error_for_camera_only() {
    use sptr::frame::map_model::{SegMapModel, SegWeightsSource};
    let mut b = seg::nuscenes_branch(false);
    let pts = sptr::Points { x: vec![5.0, 10.0], y: vec![1.0, -2.0], z: vec![0.5, 0.0], intensity: vec![3.0, 9.0], has_intensity: true, ring: None, time: None };
    let inputs = b.frame(1_000_000_000, "lidar_top", &pts);
    assert_eq!(inputs.used(), 0);
    let mut fusion = SegMapModel::open(&common::data("bevseg/fusion_small.yaml"), &SegWeightsSource::Random(1), sptr::device::Device::Cpu).unwrap();
    let m = fusion.forward(&inputs).unwrap();
    assert_eq!(m.masked_cameras.len(), 6);
    assert_eq!(m.lidar.as_ref().map(|l| l.points_in), Some(2));
    assert!(m.probabilities.iter().all(|p| p.is_finite() && (0.0..=1.0).contains(p)));
    let mut camera = SegMapModel::open(&common::data("bevseg/camera_small.yaml"), &SegWeightsSource::Random(1), sptr::device::Device::Cpu).unwrap();
    let e = camera.forward(&inputs).unwrap_err().to_string();
    assert!(e.contains("no camera image"), "{e}");
    // camera.cuda_graph on a CPU model: ignored with a warning, and no graph counts reported
    assert_eq!(camera.apply_cuda_graph_param(false), None);
    assert!(camera.apply_cuda_graph_param(true).is_some_and(|w| w.contains("CPU")));
    assert_eq!(camera.graph_counts(), None);
    // weights parameter values
    assert_eq!(SegWeightsSource::parse("random:7").unwrap(), SegWeightsSource::Random(7));
    assert!(SegWeightsSource::parse("random:x").is_err());
    assert!(SegWeightsSource::parse("").is_err());
    assert!(SegMapModel::open(&common::data("bevseg/fusion_small.yaml"), &SegWeightsSource::File("/nonexistent.safetensors".into()), sptr::device::Device::Cpu).is_err());
}
