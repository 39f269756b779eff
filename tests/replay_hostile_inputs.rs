//! Hostile camera and LiDAR inputs through `sptr replay`: a bag written here from the nuScenes
//! sample frame, seven frames 50 ms apart, each bad input between good frames:
//!
//! - frame 1: CAM_FRONT's JPEG cut in half, stamped like frame 0's CAM_FRONT image (a driver that
//!   re-stamps): a decode error, not frame 0's picture;
//! - frame 3: CAM_FRONT's JPEG cut at 60 % with an end-of-image marker appended: a decode error,
//!   not a partly grey image;
//! - frame 4: a cloud without an intensity field: counted in the report;
//! - frame 5: CAM_FRONT_LEFT's CameraInfo with lens distortion: `distorted` until frame 6's
//!   undistorted CameraInfo;
//! - every frame: CAM_BACK is a 1280 x 720 camera (raw rgb8, its CameraInfo consistent) that the
//!   model's resize + crop cannot take: `unsupported_size`, and the other cameras still make
//!   the map.
//!
//! The same bag without the camera faults (CAM_BACK and frame 4's cloud as they are) is replayed
//! too: the good frames' maps are byte-identical to it, and every frame got a map. The map model
//! there is a stand-in whose map is a function of every used camera's pixels and of the cloud
//! (so an image taken for another, or a stale one, shows), asking the real model (the reduced
//! fusion YAML) which cameras it takes; the real model's forward with CAM_BACK masked runs in
//! its own test (a CPU forward per frame would make this one minutes long). Finally `sptr
//! replay` (the binary) exits non-zero when the map model fails on every frame.

mod common;
#[path = "common/replay.rs"]
mod replay_setup;

use std::path::{Path, PathBuf};

use sptr::msgs::cdr::{CameraInfo, CdrMessage, CompressedImage, Header, Image, PointCloud2, Time};
use sptr::frame::cameras::{BevFrameInputs, BevMapModel};
use sptr::sensors::calib::camera::CameraCalib;
use sptr::models::bevfusion::map::BevMap;
use sptr::bag::{Bag, BagWriter};
use sptr::msgs::cloud::{encode_points, Layout};
use sptr::frame::params::{CameraOverride, ImageTransport, NodeParams};
use sptr::frame::map_model::{SegMapModel, SegWeightsSource};
use sptr::replay::request::camera_options;
use sptr::replay::{replay_with, CameraReplayOptions, ReplayOptions};

use replay_setup::{processor, CAMS_PARAMS};

fn options(bag: &Path, out: &Path) -> ReplayOptions {
    replay_setup::options(bag, out, Some(cams_options()))
}
const MS: i64 = 1_000_000;
const FRAMES: i64 = 7;
const POINTS_TOPIC: &str = "/sptr/input/points";
const CAM_BACK_RAW: &str = "/sptr/input/cameras/CAM_BACK/image";

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sptr-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn header(ns: i64, frame: &str) -> Header {
    Header { stamp: Time { sec: (ns / 1_000_000_000) as i32, nanosec: (ns % 1_000_000_000) as u32 }, frame_id: frame.into() }
}

/// The sample bag's one frame: the cloud, and per camera its topics, image and CameraInfo.
struct SampleFrame {
    cloud: PointCloud2,
    cameras: Vec<(String, String, CompressedImage, String, CameraInfo)>,
}

fn sample_frame() -> SampleFrame {
    let bag = Bag::open(&common::data("bags/nuscenes_sample")).unwrap();
    let topics: Vec<String> = bag.topics().iter().map(|t| t.name.clone()).collect();
    let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
    let mut cloud = None;
    let mut images = std::collections::BTreeMap::new();
    let mut infos = std::collections::BTreeMap::new();
    for m in bag.messages(&refs) {
        let m = m.unwrap();
        if m.topic == POINTS_TOPIC {
            cloud = Some(PointCloud2::from_cdr(&m.data).unwrap());
        } else if let Some(cam) = m.topic.strip_suffix("/image/compressed") {
            images.insert(cam.to_string(), (m.topic.clone(), CompressedImage::from_cdr(&m.data).unwrap()));
        } else if let Some(cam) = m.topic.strip_suffix("/camera_info") {
            infos.insert(cam.to_string(), (m.topic.clone(), CameraInfo::from_cdr(&m.data).unwrap()));
        }
    }
    // camera order of the params file
    let order = ["CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"];
    let cameras = order
        .iter()
        .map(|n| {
            let key = format!("/sptr/input/cameras/{n}");
            let (it, img) = images.remove(&key).unwrap();
            let (ct, info) = infos.remove(&key).unwrap();
            (n.to_string(), it, img, ct, info)
        })
        .collect();
    SampleFrame { cloud: cloud.unwrap(), cameras }
}

/// Frame `k`'s cloud: the sample sweep's first 1,000 points moved 0.25 m per frame along x (so
/// every frame's right map differs), with or without the intensity field.
fn cloud(sample: &SampleFrame, k: i64, stamp: i64, intensity: bool) -> PointCloud2 {
    let (mut p, _) = sptr::msgs::cloud::decode(&sample.cloud.view()).unwrap();
    for v in [&mut p.x, &mut p.y, &mut p.z, &mut p.intensity] {
        v.truncate(1000);
    }
    p.ring = None;
    p.time = None;
    p.x.iter_mut().for_each(|x| *x += 0.25 * k as f32);
    let layout = if intensity { Layout::XyzI32 } else { Layout::Xyz32 };
    PointCloud2 { header: header(stamp, &sample.cloud.header.frame_id), cloud: encode_points(&p, layout).unwrap() }
}

/// A 1280 x 720 raw rgb8 image (a gradient) and its consistent CameraInfo.
fn cam_back_720p(stamp: i64, info_like: &CameraInfo) -> (Image, CameraInfo) {
    let (w, h) = (1280u32, 720u32);
    let data: Vec<u8> = (0..w * h * 3).map(|i| ((i / 3) % w * 255 / w) as u8).collect();
    let img = Image { header: header(stamp, &info_like.header.frame_id), height: h, width: w, encoding: "rgb8".into(), is_bigendian: 0, step: 3 * w, data };
    let mut info = info_like.clone();
    info.width = w;
    info.height = h;
    info.k = [1000.0, 0.0, 640.0, 0.0, 1000.0, 360.0, 0.0, 0.0, 1.0];
    (img, info)
}

/// Writes the seven-frame bag; `faults` adds the camera faults of the module docs.
fn write_bag(dir: &Path, sample: &SampleFrame, faults: bool) -> PathBuf {
    let path = dir.join(if faults { "hostile" } else { "clean" });
    let mut w = BagWriter::create(&path).unwrap();
    w.add_topic(POINTS_TOPIC, PointCloud2::TYPE_NAME).unwrap();
    w.add_topic(CAM_BACK_RAW, Image::TYPE_NAME).unwrap();
    for (name, image_topic, _, info_topic, _) in &sample.cameras {
        if name != "CAM_BACK" {
            w.add_topic(image_topic, CompressedImage::TYPE_NAME).unwrap();
        }
        w.add_topic(info_topic, CameraInfo::TYPE_NAME).unwrap();
    }
    let t0 = sample.cloud.header.stamp.as_nanos();
    let write = |w: &mut BagWriter, topic: &str, ns: i64, bytes: Vec<u8>| w.write(topic, ns, &bytes).unwrap();
    let setup = t0 - 40 * MS;
    for (name, _, _, info_topic, info) in &sample.cameras {
        let info = if name == "CAM_BACK" { cam_back_720p(0, info).1 } else { info.clone() };
        write(&mut w, info_topic, setup, info.to_cdr(true).unwrap());
    }
    let front = &sample.cameras[0];
    let front_left = &sample.cameras[2];
    for k in 0..FRAMES {
        let t = t0 + k * 50 * MS;
        let image_ns = t - 10 * MS;
        if faults && k == 5 {
            let mut d = front_left.4.clone();
            d.distortion_model = "plumb_bob".into();
            d.d = vec![-0.4, 0.2, 0.0, 0.0, 0.0];
            write(&mut w, &front_left.3, t - 20 * MS, d.to_cdr(true).unwrap());
        }
        if faults && k == 6 {
            write(&mut w, &front_left.3, t - 20 * MS, front_left.4.to_cdr(true).unwrap());
        }
        for (name, image_topic, img, _, info) in &sample.cameras {
            if name == "CAM_BACK" {
                let (raw, _) = cam_back_720p(image_ns, info);
                write(&mut w, CAM_BACK_RAW, image_ns, raw.to_cdr(true).unwrap());
                continue;
            }
            let mut m = img.clone();
            m.header.stamp = header(image_ns, "").stamp;
            if faults && name == &front.0 && k == 1 {
                // cut in half, stamped like frame 0's image
                m.data.truncate(m.data.len() / 2);
                m.header.stamp = header(t0 - 10 * MS, "").stamp;
            }
            if faults && name == &front.0 && k == 3 {
                m.data.truncate(m.data.len() * 6 / 10);
                m.data.extend_from_slice(&[0xFF, 0xD9]);
            }
            write(&mut w, image_topic, image_ns, m.to_cdr(true).unwrap());
        }
        write(&mut w, POINTS_TOPIC, t, cloud(sample, k, t, k != 4).to_cdr(true).unwrap());
    }
    w.finish().unwrap();
    path
}


/// The params file's six cameras with CAM_BACK on the raw image topic.
fn cams_options() -> CameraReplayOptions {
    let path = common::root().join(CAMS_PARAMS);
    let mut node = NodeParams::load(&path).unwrap();
    node.camera.overrides.insert("CAM_BACK".into(), CameraOverride { transport: Some(ImageTransport::Raw), ..Default::default() });
    camera_options(&path, &node).unwrap().expect("the params file has cameras")
}


/// Every map message of the output bag, per frame (the class grids, the bits and colour images).
fn maps_per_frame(out: &Path) -> Vec<Vec<Vec<u8>>> {
    let bag = Bag::open(&out.join("bag")).unwrap();
    let mut topics: Vec<String> = bag.topics().iter().map(|t| t.name.clone()).filter(|t| t.contains("/bev/map")).collect();
    topics.sort();
    let mut frames: std::collections::BTreeMap<i64, Vec<Vec<u8>>> = Default::default();
    for topic in &topics {
        for m in bag.messages(&[topic.as_str()]) {
            let m = m.unwrap();
            frames.entry(m.timestamp_ns).or_default().push(m.data);
        }
    }
    frames.into_values().collect()
}

/// The map model of the replay test: the real model's [`BevMapModel::check_camera`], and a map
/// that is a function of the inputs: class `c` holds, in cell (0, `c`), a checksum of camera
/// `c`'s pixels (0 when masked), and class 0's cell (1, 0) the cloud's mean x / 100.
struct PixelSumModel {
    real: SegMapModel,
}

impl BevMapModel for PixelSumModel {
    fn forward(&mut self, inputs: &BevFrameInputs) -> Result<BevMap, sptr::Error> {
        let mut m = BevMap::nuscenes_zeros();
        for (c, img) in inputs.images.iter().enumerate() {
            let Some(img) = img else { continue };
            let rgb = img.to_rgb(&Default::default()).map_err(sptr::Error::InvalidInput)?;
            let sum: u64 = rgb.data.iter().map(|&v| v as u64).sum();
            m.probabilities[c * 200 * 200 + c] = (sum % 1_000_003) as f32 / 1_000_003.0;
        }
        let p = &inputs.points;
        m.probabilities[200] = p.x.iter().map(|&x| x as f64).sum::<f64>() as f32 / p.len().max(1) as f32 / 100.0;
        Ok(m)
    }

    fn check_camera(&self, camera: &CameraCalib) -> Result<(), String> {
        self.real.check_camera(camera)
    }
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn hostile_camera_and_cloud_inputs_are_counted_and_the_good_frames_are_unaffected() {
    let dir = temp_dir("replay");
    let sample = sample_frame();
    let (yaml, mut p) = processor(&dir);
    let real = SegMapModel::open(&common::data("bevseg/fusion_small.yaml"), &SegWeightsSource::Random(3), sptr::device::Device::Cpu).unwrap();
    let mut seg = PixelSumModel { real };
    let mut outs = Vec::new();
    for faults in [true, false] {
        let bag = write_bag(&dir, &sample, faults);
        let out = dir.join(if faults { "out_hostile" } else { "out_clean" });
        let o = replay_with(&mut p, &yaml, &options(&bag, &out), Some(&mut seg)).unwrap();
        assert_eq!(o.state.frames.len(), FRAMES as usize);
        assert_eq!(o.bev_maps, Some((FRAMES as u64, 0)), "every frame got a map");
        outs.push((o, out));
    }
    let (hostile, out) = &outs[0];
    let cams = json(&out.join("cameras.json"));
    let status: Vec<Vec<String>> = cams["frames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["status"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .collect();
    let good = |k: usize| -> Vec<&str> {
        let mut s = vec!["used"; 6];
        s[3] = "unsupported_size";
        if k == 1 || k == 3 {
            s[0] = "decode_error";
        }
        if k == 5 {
            s[2] = "distorted";
        }
        s
    };
    for (k, st) in status.iter().enumerate() {
        assert_eq!(st, &good(k), "frame {k}: {cams}");
    }
    let frames = cams["frames"].as_array().unwrap();
    assert!(frames.iter().all(|f| f["map"] == true), "{cams}");
    let cam = |i: usize| &cams["cameras"][i];
    assert!(cam(3)["last_problem"].as_str().unwrap().contains("1280x720"), "{}", cam(3));
    assert!(cam(2)["last_problem"].as_str().unwrap().contains("image_rect"), "{}", cam(2));
    assert_eq!(cam(0)["frames"]["decode_error"], 2);
    assert_eq!(cam(2)["frames"]["distorted"], 1);
    assert_eq!(cam(3)["frames"]["unsupported_size"], FRAMES);
    // the report counts the cloud without intensity and carries the cameras' counts
    let report = json(&out.join("report.json"));
    assert_eq!(report["frames"]["without_intensity"], 1, "{}", report["frames"]);
    assert_eq!(report["cameras"]["bev_maps"], FRAMES);
    assert_eq!(report["cameras"]["bev_map_errors"], 0);
    assert_eq!(report["cameras"]["cameras"][3]["masked_by"]["unsupported_size"], FRAMES);
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(md.contains("1 frame(s) without an intensity field") && md.contains("## Cameras"), "{md}");
    assert!(hostile.state.frames[4].no_intensity && !hostile.state.frames[3].no_intensity);

    // the good frames' maps are the clean run's, byte for byte; the others differ from it, and
    // no frame's map repeats an earlier frame's (every frame's cloud differs)
    let (h, c) = (maps_per_frame(out), maps_per_frame(&outs[1].1));
    assert_eq!((h.len(), c.len()), (FRAMES as usize, FRAMES as usize));
    for k in 0..FRAMES as usize {
        let faulted = [1, 3, 5].contains(&k);
        assert_eq!(h[k] == c[k], !faulted, "frame {k}");
        for j in 0..k {
            assert_ne!(h[k], h[j], "frames {j} and {k}");
        }
    }
}

/// The real model (the reduced fusion YAML, random weights, CPU) on a frame whose CAM_BACK's
/// CameraInfo says 1280 x 720, which the model's resize + crop cannot take: with a 1280 x 720
/// image CAM_BACK is masked as `unsupported_size`, with the 1600 x 900 JPEG (a mismatched
/// CameraInfo) as `size_mismatch`, with no image as `missing`; each time the map is made from the
/// other five cameras, the same map (a camera the model cannot take costs that camera only).
#[test]
fn the_real_model_makes_the_map_without_a_camera_it_cannot_take() {
    let sample = sample_frame();
    let mut model = SegMapModel::open(&common::data("bevseg/fusion_small.yaml"), &SegWeightsSource::Random(3), sptr::device::Device::Cpu).unwrap();
    let mut maps = Vec::new();
    for (case, want) in [("raw 1280 x 720", "unsupported_size"), ("the 1600 x 900 JPEG", "size_mismatch"), ("no image", "missing")] {
        let mut branch = sptr::frame::cameras::CameraBranch::new(cams_options().branch).unwrap();
        let t = sample.cloud.header.stamp.as_nanos();
        for (i, (name, _, img, _, info)) in sample.cameras.iter().enumerate() {
            let mut jpeg = img.clone();
            jpeg.header.stamp = header(t - 10 * MS, "").stamp;
            if name == "CAM_BACK" {
                let (raw, info) = cam_back_720p(t - 10 * MS, info);
                branch.on_camera_info(i, &info).unwrap();
                match want {
                    "unsupported_size" => branch.on_image(i, sptr::frame::cameras::CameraImage::Raw(raw)),
                    "size_mismatch" => branch.on_image(i, sptr::frame::cameras::CameraImage::Compressed(jpeg)),
                    _ => true,
                };
                continue;
            }
            branch.on_camera_info(i, info).unwrap();
            branch.on_image(i, sptr::frame::cameras::CameraImage::Compressed(jpeg));
        }
        let (points, _) = sptr::msgs::cloud::decode(&cloud(&sample, 0, t, true).view()).unwrap();
        let mut inputs = branch.frame(t, &sample.cloud.header.frame_id, &points);
        let (map, _) = branch.run_model(&mut model, &mut inputs);
        let map = map.unwrap_or_else(|e| panic!("{case}: {e}"));
        let status: Vec<&str> = inputs.cameras.iter().map(|c| c.status.name()).collect();
        assert_eq!(status, ["used", "used", "used", want, "used", "used"], "{case}");
        assert_eq!(map.masked_cameras, ["CAM_BACK"], "{case}");
        assert!(map.probabilities.iter().all(|p| p.is_finite()), "{case}");
        maps.push(map.probabilities);
    }
    assert!(maps.windows(2).all(|w| w[0] == w[1]), "CAM_BACK contributes nothing in every case");
}

/// `sptr replay` fails (non-zero exit, a message naming the map model) when the map model
/// made no map of any frame: the camera-only model on a bag without cameras.
#[test]
fn replay_exits_non_zero_when_no_frame_got_a_map() {
    let dir = temp_dir("cli");
    let sample = sample_frame();
    let bag = dir.join("lidar_only");
    let mut w = BagWriter::create(&bag).unwrap();
    w.add_topic(POINTS_TOPIC, PointCloud2::TYPE_NAME).unwrap();
    let t0 = sample.cloud.header.stamp.as_nanos();
    for k in 0..2 {
        let t = t0 + k * 100 * MS;
        w.write(POINTS_TOPIC, t, &cloud(&sample, k, t, true).to_cdr(true).unwrap()).unwrap();
    }
    w.finish().unwrap();
    let root = common::root();
    let small = dir.join("small.yaml");
    processor(&dir); // writes small_nuscenes.yaml
    std::fs::rename(dir.join("small_nuscenes.yaml"), &small).unwrap();
    let out = std::process::Command::new(common::sptr_exe())
        .args(["replay"])
        .arg(&bag)
        .args(["--model"])
        .arg(&small)
        .args(["--random-weights", "7", "--device", "cpu", "--progress", "quiet", "--params"])
        .arg(root.join(CAMS_PARAMS))
        .args(["--camera-model"])
        .arg(common::data("bevseg/camera_small.yaml"))
        .args(["--camera-weights", "random:1", "--out"])
        .arg(dir.join("out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("BEV map model failed on every one of the 2 frames"), "{stderr}");
    assert!(stderr.contains("BEV maps: 0 made, 2 failed"), "{stderr}");
}
