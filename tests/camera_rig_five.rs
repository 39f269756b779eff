//! A camera rig that is not nuScenes' through the entry points of the frame processor, on the
//! CPU with the reduced BEV map model (random weights): five 1920 × 1080 cameras named `front`,
//! `front_left`, `front_right`, `rear_left`, `rear_right`, with their own intrinsics, extrinsics
//! and topics (tests/data/rig5, tests/data/bags/rig5_1920x1080, made by
//! tests/fixtures/make_rig5.py). `sptr replay` (the command and the library) calibrates them from
//! the bag's /tf_static, `sptr bench pipeline --cameras` from the rig's calibration file. The
//! node on the same rig: tests/ros_node.rs.

mod common;
#[path = "common/replay.rs"]
mod replay_setup;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sptr::bag::Bag;
use sptr::frame::cameras::{BevFrameInputs, BevMapModel, CameraStatus, FrameImage};
use sptr::frame::map_model::{SegMapModel, SegWeightsSource};
use sptr::frame::params::NodeParams;
use sptr::models::bevfusion::map::{BevMap, NUSCENES_MAP_CLASSES};
use sptr::msgs::cdr::{CdrMessage, OccupancyGrid, PointCloud2};
use sptr::replay::request::camera_options;
use sptr::replay::replay_with;
use sptr::sensors::calib::file::CalibrationFile;

/// The rig's params file (its cameras, topics and calibration file).
const RIG_PARAMS: &str = "tests/data/rig5/perception_rig5.yaml";
/// The rig's bag, under tests/data.
const RIG_BAG: &str = "bags/rig5_1920x1080";
/// The rig's cameras, in the params file's order.
const RIG_CAMERAS: [&str; 5] = ["front", "front_left", "front_right", "rear_left", "rear_right"];
/// Frames in the rig's bag.
const RIG_FRAMES: usize = 2;

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sptr-rig5-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn sptr(args: &[&str]) -> Output {
    Command::new(common::sptr_exe()).current_dir(common::root()).args(args).output().expect("run sptr")
}

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn bag_messages(bag: &Path, topic: &str) -> Vec<(i64, Vec<u8>)> {
    let b = Bag::open(bag).unwrap();
    b.messages(&[topic]).map(|m| m.unwrap()).map(|m| (m.timestamp_ns, m.data)).collect()
}

/// `sptr replay --params` with the rig's params file and the reduced fusion model: both frames of
/// the bag replayed, a map made for each, every one of the five cameras used in every frame
/// (cameras.json, report.json), calibrated from the bag's /tf_static, on the params file's
/// topics; the maps in the output bag stamped like their clouds, in the cloud's frame.
#[test]
fn a_five_camera_1920x1080_rig_replays_with_every_camera_used() {
    let dir = temp_dir("replay-cli");
    let model = common::small_nuscenes_model(&dir);
    let out = dir.join("out");
    let outs = out.display().to_string();
    let bag = common::data(RIG_BAG).display().to_string();
    let small = common::data("bevseg/fusion_small.yaml").display().to_string();
    let args = [
        "replay", &bag, "--model", &model, "--random-weights", "0", "--device", "cpu", "--progress", "quiet", "--out", &outs, "--params", RIG_PARAMS,
        "--camera-model", &small, "--camera-weights", "random:0", "--bev-png-frames", "0,1",
    ];
    let o = sptr(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "sptr {args:?} failed:\n{err}");

    let report = json(&out.join("report.json"));
    let frames = &report["frames"];
    assert_eq!((frames["in_bag"].as_u64(), frames["total"].as_u64(), frames["skipped"].as_u64()), (Some(2), Some(2), Some(0)), "{report}");
    let cams = &report["cameras"];
    assert_eq!((cams["bev_map_model"].as_bool(), cams["bev_maps"].as_u64(), cams["bev_map_errors"].as_u64()), (Some(true), Some(2), Some(0)), "{report}");
    let names: Vec<&str> = cams["cameras"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, RIG_CAMERAS, "{report}");
    for c in cams["cameras"].as_array().unwrap() {
        assert_eq!((c["used"].as_u64(), c["masked"].as_u64()), (Some(RIG_FRAMES as u64), Some(0)), "{c}");
    }

    let cj = json(&out.join("cameras.json"));
    assert_eq!(cj["frames"].as_array().map(Vec::len), Some(RIG_FRAMES), "{cj}");
    for f in cj["frames"].as_array().unwrap() {
        assert_eq!(f["status"], serde_json::json!(vec!["used"; 5]), "{f}");
        assert_eq!(f["map"], true, "{f}");
        // each camera 5 + 3 i ms before its cloud
        let ages: Vec<f64> = f["age_ms"].as_array().unwrap().iter().map(|a| a.as_f64().unwrap()).collect();
        for (i, a) in ages.iter().enumerate() {
            assert!((a - (5.0 + 3.0 * i as f64)).abs() < 1e-6, "{ages:?}");
        }
    }
    for (c, name) in cj["cameras"].as_array().unwrap().iter().zip(RIG_CAMERAS) {
        assert_eq!(c["name"], name);
        assert_eq!(c["image_topic"], format!("/cameras/{name}/image/compressed"), "{c}");
        assert_eq!(c["camera_info_topic"], format!("/cameras/{name}/camera_info"), "{c}");
        assert!(c["calibration"].as_str().unwrap().contains("extrinsic from tf"), "{c}");
        assert!(c["last_problem"].is_null(), "{c}");
    }

    // a map per frame in the output bag, stamped like its cloud, in the cloud's frame
    let ob = out.join("bag");
    let clouds: Vec<PointCloud2> = bag_messages(&ob, "/sptr/output/points").iter().map(|(_, d)| PointCloud2::from_cdr(d).unwrap()).collect();
    assert_eq!(clouds.len(), RIG_FRAMES);
    for class in NUSCENES_MAP_CLASSES {
        let maps = bag_messages(&ob, &format!("/sptr/output/bev/map/{class}"));
        assert_eq!(maps.len(), RIG_FRAMES, "{class}");
        for ((_, m), cloud) in maps.iter().zip(&clouds) {
            let g = OccupancyGrid::from_cdr(m).unwrap();
            assert_eq!((g.header.stamp, g.header.frame_id.as_str()), (cloud.header.stamp, "lidar"));
            assert_eq!((g.info.width, g.info.height, g.info.resolution), (50, 50, 2.0));
        }
    }
    for k in 0..RIG_FRAMES {
        assert!(out.join(format!("bev/map_{k:06}.png")).is_file(), "frame {k}'s map PNG");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Checks every frame's inputs on their way into the model it wraps, and keeps the maps.
struct RigInputs<'a> {
    inner: &'a mut SegMapModel,
    file: CalibrationFile,
    maps: Vec<BevMap>,
}

impl BevMapModel for RigInputs<'_> {
    fn forward(&mut self, inputs: &BevFrameInputs) -> Result<BevMap, sptr::Error> {
        assert_eq!(inputs.lidar_frame, "lidar");
        assert_eq!(inputs.used(), 5, "{:?}", inputs.cameras);
        assert!(inputs.cameras.iter().all(|c| c.status == CameraStatus::Used));
        let names: Vec<&str> = inputs.calibration.cameras.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, RIG_CAMERAS);
        for (c, image) in inputs.calibration.cameras.iter().zip(&inputs.images) {
            assert_eq!((c.image_width, c.image_height), (1920, 1080), "{}", c.name);
            let size = image.as_ref().map(FrameImage::size);
            assert_eq!(size, Some((1920, 1080)), "{}", c.name);
            // the bag's CameraInfo gives the intrinsics, its /tf_static the extrinsic: both the
            // rig's calibration file's
            let f = self.file.camera(&c.name).unwrap_or_else(|| panic!("{} is not in the calibration file", c.name));
            assert_eq!(Some(c.intrinsics), f.intrinsics.map(|(k, _, _)| k), "{}", c.name);
            for r in 0..4 {
                for col in 0..4 {
                    let (tf, file) = (c.camera_to_lidar[r][col], f.camera_to_lidar[r][col]);
                    assert!((tf - file).abs() < 1e-6, "{} [{r}][{col}]: TF {tf}, file {file}", c.name);
                }
            }
        }
        let m = self.inner.forward(inputs)?;
        self.maps.push(m.clone());
        Ok(m)
    }
    fn last_stages(&self) -> Vec<(String, f64)> {
        self.inner.last_stages()
    }
}

/// The library path of `sptr replay` on the rig: the model is handed, every frame, five used
/// 1920 × 1080 cameras in the params file's order, calibrated from the bag (CameraInfo and
/// /tf_static) exactly as the rig's calibration file says; it masks none of them, makes a map
/// per frame from them and the cloud, and the replay counts every camera used in every frame.
#[test]
fn the_five_camera_rig_reaches_the_map_model_calibrated_as_its_calibration_file_says() {
    let dir = temp_dir("replay-lib");
    let (yaml, mut p) = replay_setup::processor(&dir);
    let params = common::root().join(RIG_PARAMS);
    let node = NodeParams::load(&params).unwrap();
    assert_eq!(node.input.cameras, RIG_CAMERAS);
    let cams = camera_options(&params, &node).unwrap().expect("the rig's params file has cameras");
    let file = cams.branch.calibration_file.clone().expect("the rig's params file names its calibration file");
    assert!(file.source.ends_with("tests/data/rig5/calibration.yaml"), "{}", file.source);
    let mut seg = SegMapModel::open(&common::data("bevseg/fusion_small.yaml"), &SegWeightsSource::Random(3), sptr::device::Device::Cpu).unwrap();
    let mut rig = RigInputs { inner: &mut seg, file, maps: Vec::new() };
    let out = dir.join("out");
    let o = replay_with(&mut p, &yaml, &replay_setup::options(&common::data(RIG_BAG), &out, Some(cams)), Some(&mut rig)).unwrap();
    assert_eq!(o.state.frames.len(), RIG_FRAMES);
    assert!(o.state.frames.iter().all(|f| f.reason.is_none()), "{:?}", o.state.frames);
    assert_eq!(rig.maps.len(), RIG_FRAMES);
    for m in &rig.maps {
        assert!(m.masked_cameras.is_empty(), "{:?}", m.masked_cameras);
        assert!(m.lidar.as_ref().is_some_and(|l| l.points_in > 1000 && !l.empty), "{:?}", m.lidar);
        assert!(m.probabilities.iter().all(|p| p.is_finite() && (0.0..=1.0).contains(p)));
    }
    // the same cloud and images, 100 ms later: the same map
    assert_eq!(rig.maps[0], rig.maps[1]);
    let names: Vec<&str> = o.cameras.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, RIG_CAMERAS);
    for c in &o.cameras {
        assert_eq!((c.used, c.masked), (RIG_FRAMES as u64, 0), "{c:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sptr bench pipeline --cameras` with the rig's params file and bag: the five cameras'
/// messages re-stamped every frame, calibrated from the rig's calibration file (the bench reads
/// no TF), all used; the JSON says five cameras and the reduced model's map.
#[test]
fn the_pipeline_bench_runs_the_five_camera_1920x1080_rig_with_every_camera_used() {
    let dir = temp_dir("bench");
    let model = common::small_nuscenes_model(&dir);
    let cloud = common::nuscenes_sweep_arg();
    let bag = common::data(RIG_BAG).display().to_string();
    let args = [
        "bench", "pipeline", &cloud, "--model", &model, "--params", RIG_PARAMS, "--cameras", "--bag", &bag, "--camera-model",
        "tests/data/bevseg/fusion_small.yaml", "--camera-weights", "random:0", "--frames", "1", "--warmup", "1",
    ];
    let out = sptr(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sptr {args:?} failed:\n{err}");
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{line}"));
    assert_eq!((v["bench"].as_str(), v["device"].as_str()), (Some("pipeline_cameras"), Some("cpu")), "{v}");
    assert_eq!((v["frames"].as_u64(), v["latency"]["n"].as_u64()), (Some(1), Some(1)), "{v}");
    assert_eq!(v["cameras"], 5, "{v}");
    assert_eq!(v["camera_status"], serde_json::json!(vec!["used"; 5]), "{v}");
    let map = &v["map"];
    assert_eq!((map["classes"].as_u64(), map["width"].as_u64(), map["height"].as_u64()), (Some(6), Some(50), Some(50)), "{v}");
    for k in ["cameras/camera_sync", "cameras/camera_decode", "bev_map", "bev_map/backbone", "bev_map/depth+pool", "map_encode"] {
        let ms = v["stage_p50_ms"][k].as_f64().unwrap_or_else(|| panic!("no stage {k}: {v}"));
        assert!(ms >= 0.0 && ms.is_finite(), "{k}: {ms}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The rig's calibration file (intrinsics and image size for every camera).
const RIG_CALIBRATION: &str = "tests/data/rig5/calibration.yaml";

/// `CAM=FILE` for the rig's cameras (all, or all but `skip`).
fn rig_image_args(skip: Option<&str>) -> Vec<String> {
    RIG_CAMERAS
        .iter()
        .filter(|c| Some(**c) != skip)
        .map(|c| format!("{c}={}", common::data(&format!("rig5/{c}.jpg")).display()))
        .collect()
}

fn sptr_strings(args: &[String]) -> Output {
    sptr(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `sptr bevseg` on the rig from its calibration file alone: the five 1920 × 1080 images matched
/// by camera name, none masked, the map written for every class; a camera left out is masked and
/// named.
#[test]
fn bevseg_maps_the_five_camera_rig_from_its_calibration_file() {
    let dir = temp_dir("bevseg");
    for (skip, summary, masked) in [
        (None, None, vec![]),
        (Some("rear_right"), Some("masked cameras: 1 of 5 (no image: rear_right)"), vec!["rear_right"]),
    ] {
        let out = dir.join(skip.unwrap_or("all"));
        let mut args: Vec<String> = ["bevseg", "--model", "tests/data/bevseg/camera_small.yaml", "--calib", RIG_CALIBRATION, "--device", "cpu", "--random-weights", "3", "--out"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(out.display().to_string());
        args.push("--images".into());
        args.extend(rig_image_args(skip));
        let o = sptr_strings(&args);
        let (text, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "sptr {args:?} failed:\n{err}");
        match summary {
            Some(line) => assert!(text.contains(line), "{text}"),
            None => assert!(!text.contains("masked cameras") && text.contains("6 classes x 50 x 50"), "{text}"),
        }
        assert!(!err.contains("size_mismatch"), "the rig's images are its calibrated size:\n{err}");
        let h = json(&out.join("bev_probabilities.json"));
        assert_eq!(h["masked_cameras"], serde_json::json!(masked), "{h}");
        assert_eq!(h["classes"].as_array().map(Vec::len), Some(NUSCENES_MAP_CLASSES.len()), "{h}");
        assert!(std::fs::metadata(out.join("bev_map.png")).unwrap().len() > 1000);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sptr bench bevseg` takes the rig from its calibration file, its images matched by camera
/// name (or given in the calibration's order); it times whole frames, so an unknown, repeated or
/// missing camera is an error naming the rig's cameras, before any GPU work. With a GPU it runs
/// the full camera-only model on the five 1920 × 1080 images.
#[test]
fn bench_bevseg_takes_the_five_camera_rig() {
    let base: Vec<String> = ["bench", "bevseg", "--model", "config/models/bevfusion_seg_camera.yaml", "--calib", RIG_CALIBRATION, "--warmup", "1", "--iters", "2", "--images"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let refused = |images: Vec<String>, expect: &[&str]| {
        let mut args = base.clone();
        args.extend(images);
        let o = sptr_strings(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "sptr {args:?} succeeded");
        assert!(o.status.code().is_some() && !err.contains("panicked"), "sptr {args:?} crashed:\n{err}");
        for e in expect {
            assert!(err.contains(e), "sptr {args:?}: the error does not say `{e}`:\n{err}");
        }
    };
    let all = rig_image_args(None);
    let mut unknown = all.clone();
    unknown[0] = unknown[0].replacen("front=", "CAM_FRONT=", 1);
    refused(unknown, &["unknown camera", "front, front_left, front_right, rear_left, rear_right"]);
    let mut twice = all.clone();
    twice[1] = twice[0].clone();
    refused(twice, &["camera front is given twice"]);
    refused(rig_image_args(Some("rear_left")), &["no image for rear_left", "whole frames"]);
    let plain: Vec<String> = all.iter().take(4).map(|a| a.split_once('=').unwrap().1.to_string()).collect();
    refused(plain.clone(), &["4 images for the calibration's 5 cameras", "front, front_left"]);
    let mut mixed = plain;
    mixed.push(all[4].clone());
    refused(mixed, &["CAM=FILE"]);

    #[cfg(feature = "cuda-core")]
    if common::gpu("bench_bevseg_takes_the_five_camera_rig").is_some() {
        let mut args = base.clone();
        args.extend(all);
        let o = sptr_strings(&args);
        let (text, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "sptr {args:?} failed:\n{err}");
        let row: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(row["cameras"], serde_json::json!(RIG_CAMERAS), "{row}");
        assert_eq!(row["images"], 5, "{row}");
        assert_eq!(row["image_size"], serde_json::json!([1920, 1080]), "{row}");
        assert!(row["ms"].as_f64().is_some_and(|ms| ms > 0.0), "{row}");
    }
}

/// The rig's bag with a second PointCloud2 topic (`/lidar/points_raw`, a copy of its clouds).
fn rig_bag_with_two_clouds(dir: &Path) -> PathBuf {
    let src = Bag::open(&common::data(RIG_BAG)).unwrap();
    let path = dir.join("two_clouds");
    let mut w = sptr::bag::BagWriter::create(&path).unwrap();
    for t in src.topics() {
        w.add_topic(&t.name, &t.type_name).unwrap();
    }
    w.add_topic("/lidar/points_raw", "sensor_msgs/msg/PointCloud2").unwrap();
    let names: Vec<&str> = src.topics().iter().map(|t| t.name.as_str()).collect();
    for m in src.messages(&names) {
        let m = m.unwrap();
        w.write(&m.topic, m.timestamp_ns, &m.data).unwrap();
        if m.topic == "/lidar/points" {
            w.write("/lidar/points_raw", m.timestamp_ns + 1, &m.data).unwrap();
        }
    }
    w.finish().unwrap();
    path
}

/// `sptr replay --params` reads the clouds from the params file's `topics.input_points` (the
/// rig's `lidar/points`), as the node would subscribe, when the bag has several PointCloud2
/// topics; `--lidar-topic` still overrides it.
#[test]
fn replay_takes_the_lidar_topic_of_the_params_file() {
    let dir = temp_dir("two-clouds");
    let bag = rig_bag_with_two_clouds(&dir).display().to_string();
    let model = common::small_nuscenes_model(&dir);
    let small = common::data("bevseg/camera_small.yaml").display().to_string();
    for (extra, topic) in [(None, "/lidar/points"), (Some("/lidar/points_raw"), "/lidar/points_raw")] {
        let out = dir.join(format!("out{}", extra.is_some() as u8));
        let outs = out.display().to_string();
        let mut args = vec![
            "replay", &bag, "--model", &model, "--random-weights", "0", "--device", "cpu", "--progress", "quiet", "--out", &outs, "--params", RIG_PARAMS,
            "--camera-model", &small, "--camera-weights", "random:0",
        ];
        if let Some(t) = extra {
            args.extend(["--lidar-topic", t]);
        }
        let o = sptr(&args);
        assert!(o.status.success(), "sptr {args:?} failed:\n{}", String::from_utf8_lossy(&o.stderr));
        let report = json(&out.join("report.json"));
        assert_eq!(report["run"]["lidar_topic"], topic, "{report}");
        assert_eq!(report["frames"]["total"].as_u64(), Some(RIG_FRAMES as u64), "{report}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
