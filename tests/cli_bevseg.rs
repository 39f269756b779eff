//! `sptr bevseg` and `sptr random-weights` for the BEVFusion seg models on the CPU: the files
//! written (raw float32 + JSON header, .npy, PNG, the stage dumps), the weights round trip through
//! safetensors, and clear failures (non-zero exit, the problem named, no panic) on bad arguments.

mod common;
#[path = "common/bevseg.rs"]
mod seg;

use seg::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sptr(args: &[String]) -> Output {
    Command::new(common::sptr_exe()).current_dir(common::root()).args(args).output().expect("run sptr")
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sptr-cli-bevseg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `--images CAM=FILE` for the six cameras (all, or all but `skip`).
fn image_args(skip: Option<&str>) -> Vec<String> {
    let mut v = vec!["--images".to_string()];
    for c in sptr::sensors::calib::camera::NUSCENES_CAMERAS {
        if Some(c) != skip {
            v.push(format!("{c}={}", camera_jpeg(c).display()));
        }
    }
    v
}

fn ok(args: &[String]) -> String {
    let out = sptr(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sptr {args:?} failed:\n{err}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn refused(args: &[String], expect: &[&str]) {
    let out = sptr(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sptr {args:?} succeeded");
    assert!(out.status.code().is_some() && !err.contains("panicked"), "sptr {args:?} crashed:\n{err}");
    for e in expect {
        assert!(err.contains(e), "sptr {args:?}: the error does not say `{e}`:\n{err}");
    }
}

fn sweep_path() -> String {
    std::fs::read_dir(common::data("nuscenes"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".pcd.bin"))
        .unwrap()
        .display()
        .to_string()
}

fn base(model: &Path, out: &Path) -> Vec<String> {
    let calib = common::data("nuscenes/calib.json");
    s(&["bevseg", "--model", &model.display().to_string(), "--calib", &calib.display().to_string(), "--out", &out.display().to_string(), "--device", "cpu"])
}

fn read_npy(p: &Path) -> (Vec<usize>, Vec<f32>) {
    sptr::nn::npy::read_f32(p).unwrap()
}

#[test]
fn camera_model_writes_the_map_files() {
    let out = tmp("camera");
    let w = out.join("w.safetensors");
    let mut a = base(&small("camera"), &out);
    a.extend(s(&["--random-weights", "5", "--save-weights", &w.display().to_string(), "--dump-stages"]));
    a.extend(image_args(Some("CAM_BACK_LEFT")));
    let text = ok(&a);
    assert!(text.contains("masked cameras: 1 of 6 (no image: CAM_BACK_LEFT)"), "{text}");
    let h: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("bev_probabilities.json")).unwrap()).unwrap();
    assert_eq!(h["shape"], serde_json::json!([6, 50, 50]));
    assert_eq!(h["classes"][0], "drivable_area");
    assert_eq!(h["masked_cameras"], serde_json::json!(["CAM_BACK_LEFT"]));
    assert_eq!(h["resolution"], 2.0);
    let raw = std::fs::read(out.join("bev_probabilities.f32")).unwrap();
    assert_eq!(raw.len(), 6 * 50 * 50 * 4);
    let (shape, npy) = read_npy(&out.join("bev_probabilities.npy"));
    assert_eq!(shape, vec![6, 50, 50]);
    let rawf: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(rawf, npy);
    assert!(std::fs::metadata(out.join("bev_map.png")).unwrap().len() > 1000);
    for st in ["input", "camera_bev", "decoder", "head"] {
        assert!(out.join("stages").join(format!("{st}.npy")).exists(), "stage {st}");
    }
    assert!(!out.join("stages/lidar_bev.npy").exists());
    // the head stage is the map, NCHW
    let (hs, hv) = read_npy(&out.join("stages/head.npy"));
    assert_eq!(hs, vec![1, 6, 50, 50]);
    assert_eq!(hv, npy);
    // the saved weights give the same map (same bits) through --weights
    let out2 = tmp("camera2");
    let mut b = base(&small("camera"), &out2);
    b.extend(s(&["--weights", &w.display().to_string()]));
    b.extend(image_args(Some("CAM_BACK_LEFT")));
    ok(&b);
    assert_eq!(read_npy(&out2.join("bev_probabilities.npy")).1, npy);
    // random-weights writes the same file
    let w2 = out.join("w2.safetensors");
    ok(&s(&["random-weights", "--model", &small("camera").display().to_string(), "--seed", "5", "--out", &w2.display().to_string()]));
    assert_eq!(std::fs::read(&w).unwrap(), std::fs::read(&w2).unwrap());
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&out2);
}

#[test]
fn fusion_model_writes_lidar_stats_and_stages() {
    let out = tmp("fusion");
    let mut a = base(&small("fusion"), &out);
    a.extend(s(&["--random-weights", "6", "--dump-stages", "--cloud", &sweep_path()]));
    a.extend(image_args(None));
    let text = ok(&a);
    assert!(text.contains("LiDAR: 34688 points"), "{text}");
    let h: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("bev_probabilities.json")).unwrap()).unwrap();
    assert_eq!(h["lidar"]["points_in"], 34688);
    assert!(h["lidar"]["voxels"].as_u64().unwrap() > 1000);
    for st in ["lidar_bev", "fused"] {
        assert!(out.join("stages").join(format!("{st}.npy")).exists(), "stage {st}");
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_arguments_fail_clearly() {
    let out = tmp("bad");
    let cam = small("camera");
    let fus = small("fusion");
    let with = |model: &Path, extra: &[String]| {
        let mut a = base(model, &out);
        a.extend(s(&["--random-weights", "1"]));
        a.extend(extra.iter().cloned());
        a
    };
    refused(&with(&cam, &s(&["--images", "CAM_FRONT"])), &["CAMERA=FILE"]);
    refused(&with(&cam, &s(&["--images", "CAM_SIDE=x.jpg"])), &["unknown camera", "CAM_SIDE"]);
    let front = format!("CAM_FRONT={}", camera_jpeg("CAM_FRONT").display());
    refused(&with(&cam, &s(&["--images", &front, &front])), &["CAM_FRONT is given twice"]);
    refused(&with(&cam, &s(&["--images", "CAM_FRONT=/nonexistent.jpg"])), &["/nonexistent.jpg"]);
    refused(&with(&fus, &image_args(None)), &["--cloud"]);
    let mut c = image_args(None);
    c.extend(s(&["--cloud", &sweep_path()]));
    refused(&with(&cam, &c), &["camera-only", "--cloud"]);
    let mut t = image_args(None);
    t.extend(s(&["--threshold", "1.5"]));
    refused(&with(&cam, &t), &["--threshold"]);
    // a calibration file missing a camera
    let calib = tmp("calib");
    std::fs::create_dir_all(&calib).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(common::data("nuscenes/calib.json")).unwrap()).unwrap();
    doc["cameras"].as_object_mut().unwrap().remove("CAM_FRONT_LEFT");
    let cj = calib.join("calib.json");
    std::fs::write(&cj, doc.to_string()).unwrap();
    let mut a = with(&cam, &image_args(None));
    let i = a.iter().position(|x| x == "--calib").unwrap();
    a[i + 1] = cj.display().to_string();
    refused(&a, &["no camera `CAM_FRONT_LEFT`"]);
    // weights of the other model
    let w = calib.join("cam.safetensors");
    ok(&s(&["random-weights", "--model", &cam.display().to_string(), "--out", &w.display().to_string()]));
    let mut a = base(&fus, &out);
    a.extend(s(&["--weights", &w.display().to_string(), "--cloud", &sweep_path()]));
    a.extend(image_args(None));
    refused(&a, &["look like BEVFusion's camera-only seg model"]);
    // the bench's numbers are range-checked before anything runs
    refused(&s(&["bench", "bevseg", "--iters", "0"]), &["--iters"]);
    refused(&s(&["bench", "bevseg", "--warmup=x"]), &["--warmup"]);
    refused(&s(&["bench", "bevseg", "--images", "a.jpg"]), &["--images"]);
    refused(&s(&["bench", "bevseg", "--sweeps", "0"]), &["--sweeps"]);
    refused(&s(&["bench", "bevseg", "--model", &cam.display().to_string(), "--sweeps", "2"]), &["camera-only", "--sweeps"]);
    // neither weights nor random weights
    let mut a = base(&cam, &out);
    a.extend(image_args(None));
    refused(&a, &["--weights"]);
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&calib);
}

/// An image of another size than its camera's calibration is masked (`size_mismatch`, the
/// node's rule): a warning names the camera and both sizes, the summary counts it, and the map
/// lists it among the masked cameras. calib.json's intrinsics are for --image-size (1600 x 900
/// by default); the calibration YAML gives each camera's size. With no image left, the
/// camera-only model fails.
#[test]
fn images_of_another_size_than_calibrated_are_masked() {
    let out = tmp("size-mismatch");
    let small_jpg = common::data("camera/small.jpg").display().to_string(); // 64 x 40
    let cam = small("camera").display().to_string();
    let front = format!("CAM_FRONT={small_jpg}");
    let back = format!("CAM_BACK={}", camera_jpeg("CAM_BACK").display());
    // the calibration YAML (image_size per camera): CAM_FRONT masked, CAM_BACK used
    let yaml = common::root().join("config/calibration/nuscenes_sample.yaml").display().to_string();
    let a = s(&["bevseg", "--model", &cam, "--calib", &yaml, "--out", &out.display().to_string(), "--device", "cpu", "--random-weights", "3", "--images", &front, &back]);
    let o = sptr(&a);
    let (text, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(err.contains("warning: camera CAM_FRONT") && err.contains("is 64 x 40 but its calibration is for 1600 x 900") && err.contains("size_mismatch"), "{err}");
    assert!(!err.contains("CAM_BACK"), "{err}");
    assert!(text.contains("masked cameras: 5 of 6 (no image: CAM_FRONT_RIGHT, CAM_FRONT_LEFT, CAM_BACK_LEFT, CAM_BACK_RIGHT; size_mismatch: CAM_FRONT)"), "{text}");
    let h: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("bev_probabilities.json")).unwrap()).unwrap();
    let masked: Vec<&str> = h["masked_cameras"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert!(masked.contains(&"CAM_FRONT") && !masked.contains(&"CAM_BACK"), "{masked:?}");
    let _ = std::fs::remove_dir_all(&out);

    // calib.json (1600 x 900 unless --image-size): the camera-only model with no usable image
    let mut a = base(&small("camera"), &out);
    a.extend(s(&["--random-weights", "3", "--images", &front]));
    refused(&a, &["CAM_FRONT (64 x 40)", "size_mismatch", "calibrated for 1600 x 900", "--image-size"]);
    // --image-size says what calib.json is for: nuScenes' intrinsics do not fit a 64 x 40 image
    let mut b = a.clone();
    b.extend(s(&["--image-size", "64x40"]));
    refused(&b, &["cx (K[2], P[2])", "64 x 40 image"]);
    // a calibration YAML has its own sizes
    let mut c = s(&["bevseg", "--model", &cam, "--calib", &yaml, "--out", &out.display().to_string(), "--random-weights", "3", "--images", &back]);
    c.extend(s(&["--image-size", "1600x900"]));
    refused(&c, &["--image-size", "calibration YAML"]);
    let _ = std::fs::remove_dir_all(&out);
}
