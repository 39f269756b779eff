//! BEVFusion BEV map segmentation end to end on the CPU: both models on reduced
//! configurations (tests/data/bevseg/*_small.yaml: the full models' module tree with small sizes)
//! on the nuScenes frame of tests/data/nuscenes (six JPEGs + the sweep), random weights:
//! deterministic to the bit, the stages' shapes, and every bad input — a missing
//! camera (masked, reported), the wrong image count or size, a cloud with NaN or with no point,
//! a weights file of the other model, a calibration missing a camera.

use crate::common;
use crate::seg::*;
use sptr::sensors::calib::camera::{Calibration, NUSCENES_CAMERAS};
use sptr::sensors::image::encodings::RgbImage;
use sptr::models::bevfusion::seg::{random_tensors, BevSegConfig, BevSegKind, BevSegModel, BevSegOutput, Point5};
use sptr::nn::Weights;

fn model(cfg: &BevSegConfig, seed: u64) -> BevSegModel {
    let w = Weights::from_tensors("random", random_tensors(cfg, seed).unwrap()).unwrap();
    BevSegModel::from_weights(cfg, w).unwrap()
}

fn run(m: &mut BevSegModel, imgs: &[RgbImage], mask: &[bool], cloud: Option<&[Point5]>) -> Result<BevSegOutput, sptr::Error> {
    let refs: Vec<Option<&RgbImage>> = imgs.iter().zip(mask).map(|(i, &on)| on.then_some(i)).collect();
    m.forward(&calib(), &refs, cloud, true)
}

const ALL: [bool; 6] = [true; 6];

fn check_map(out: &BevSegOutput, classes: usize, cells: [usize; 2]) {
    let m = &out.map;
    assert_eq!((m.classes.len(), m.nx, m.ny), (classes, cells[0], cells[1]));
    assert_eq!(m.probabilities.len(), classes * cells[0] * cells[1]);
    assert!(m.probabilities.iter().all(|p| p.is_finite() && (0.0..=1.0).contains(p)), "probabilities outside [0, 1]");
    // random weights still give a spread of probabilities, not a constant
    let (lo, hi) = m.probabilities.iter().fold((1f32, 0f32), |(a, b), &p| (a.min(p), b.max(p)));
    assert!(hi - lo > 1e-3, "constant output {lo}..{hi}");
}

#[test]
fn camera_only_end_to_end_is_deterministic() {
    let cfg = config(&small("camera"));
    assert_eq!(cfg.kind, BevSegKind::Camera);
    let imgs = images();
    let mut m = model(&cfg, 7);
    let a = run(&mut m, &imgs, &ALL, None).unwrap();
    check_map(&a, 6, [50, 50]);
    assert!(a.map.masked_cameras.is_empty());
    assert!(a.map.lidar.is_none());
    assert_eq!((a.map.resolution, a.map.x_range, a.map.y_range), (2.0, [-50.0, 50.0], [-50.0, 50.0]));
    let s = a.stages.as_ref().unwrap();
    assert_eq!((s.input.n, s.input.h, s.input.w, s.input.c), (6, 64, 176, 3));
    assert_eq!((s.camera_bev.h, s.camera_bev.w, s.camera_bev.c), (32, 32, 8));
    assert!(s.lidar_bev.is_none() && s.fused.is_none());
    assert_eq!((s.decoder.h, s.decoder.w, s.decoder.c), (32, 32, 32));
    assert_eq!((s.head.h, s.head.w, s.head.c), (50, 50, 6));
    // the camera BEV has content from every direction (cells in front and behind)
    let cells_on = s.camera_bev.data.chunks(8).filter(|c| c.iter().any(|&v| v != 0.0)).count();
    assert!(cells_on > 100, "camera BEV nearly empty: {cells_on} cells");
    // a second run, and a second model from the same weights: the same bits
    let b = run(&mut m, &imgs, &ALL, None).unwrap();
    assert_eq!(a.map, b.map);
    let c = run(&mut model(&cfg, 7), &imgs, &ALL, None).unwrap();
    assert_eq!(a.map.probabilities, c.map.probabilities);
    // stage names the timing hooks report
    let names: Vec<&str> = a.times.0.iter().map(|(n, _)| n.as_str()).collect();
    for want in ["preprocess", "backbone", "fpn", "depth+pool"] {
        assert!(names.contains(&want), "{names:?}");
    }
}

#[test]
fn fusion_end_to_end_is_deterministic() {
    let cfg = config(&small("fusion"));
    assert_eq!(cfg.kind, BevSegKind::Fusion);
    let imgs = images();
    let pts = sweep5();
    let mut m = model(&cfg, 11);
    let a = run(&mut m, &imgs, &ALL, Some(&pts)).unwrap();
    check_map(&a, 6, [50, 50]);
    let l = a.map.lidar.as_ref().unwrap();
    assert_eq!(l.points_in, pts.len());
    assert_eq!(l.points_non_finite, 0);
    assert!(l.voxels > 1000 && !l.empty, "{l:?}");
    assert!(l.points_in_range <= l.points_in);
    let s = a.stages.as_ref().unwrap();
    let lb = s.lidar_bev.as_ref().unwrap();
    assert_eq!((lb.h, lb.w, lb.c), (32, 32, 32));
    assert!(lb.data.iter().any(|&v| v != 0.0));
    let f = s.fused.as_ref().unwrap();
    assert_eq!((f.h, f.w, f.c), (32, 32, 32));
    assert_eq!((s.head.h, s.head.w, s.head.c), (50, 50, 6));
    let b = run(&mut m, &imgs, &ALL, Some(&pts)).unwrap();
    assert_eq!(a.map, b.map);
    // the LiDAR matters: without points the map differs, and says why
    let e = run(&mut m, &imgs, &ALL, Some(&[])).unwrap();
    let le = e.map.lidar.as_ref().unwrap();
    assert!(le.empty && le.points_in == 0 && le.voxels == 0, "{le:?}");
    assert!(e.stages.as_ref().unwrap().lidar_bev.as_ref().unwrap().data.iter().all(|&v| v == 0.0));
    assert_ne!(e.map.probabilities, a.map.probabilities);
    check_map(&e, 6, [50, 50]);
}

#[test]
fn nan_points_are_dropped_and_counted() {
    let cfg = config(&small("fusion"));
    let imgs = images();
    let pts = sweep5();
    let mut m = model(&cfg, 11);
    let clean = run(&mut m, &imgs, &ALL, Some(&pts)).unwrap();
    // NaN and infinite values in every column, spread through the cloud
    let mut dirty = pts.clone();
    let bad = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
    for k in 0..15 {
        let mut p = pts[k * 997 % pts.len()];
        p[k % 5] = bad[k % 3];
        dirty.insert(k * 2000, p);
    }
    let d = run(&mut m, &imgs, &ALL, Some(&dirty)).unwrap();
    let l = d.map.lidar.as_ref().unwrap();
    assert_eq!(l.points_in, pts.len() + 15);
    assert_eq!(l.points_non_finite, 15);
    // the finite points are the clean cloud's, in its order: the same map
    assert_eq!(d.map.probabilities, clean.map.probabilities);
    // a cloud of NaN only: no voxel, LiDAR BEV zero, reported
    let nan_only = vec![[f32::NAN; 5]; 10];
    let n = run(&mut m, &imgs, &ALL, Some(&nan_only)).unwrap();
    let l = n.map.lidar.as_ref().unwrap();
    assert!(l.empty && l.points_non_finite == 10 && l.voxels == 0, "{l:?}");
    // points all outside the range: empty too
    let far = vec![[500.0, 0.0, 0.0, 1.0, 0.0]; 10];
    let l = run(&mut m, &imgs, &ALL, Some(&far)).unwrap().map.lidar.unwrap();
    assert!(l.empty && l.points_in_range == 0, "{l:?}");
}

#[test]
fn missing_camera_is_masked_and_reported() {
    let cfg = config(&small("camera"));
    let imgs = images();
    let mut m = model(&cfg, 7);
    let full = run(&mut m, &imgs, &ALL, None).unwrap();
    let mask = [true, true, true, false, true, true];
    let a = run(&mut m, &imgs, &mask, None).unwrap();
    assert_eq!(a.map.masked_cameras, vec!["CAM_BACK".to_string()]);
    check_map(&a, 6, [50, 50]);
    assert_ne!(a.map.probabilities, full.map.probabilities);
    // the camera matters where it sees: the camera BEV differs from the full run's
    let cb = &a.stages.as_ref().unwrap().camera_bev;
    let cf = &full.stages.as_ref().unwrap().camera_bev;
    assert!(cb.data.iter().zip(&cf.data).any(|(x, y)| x != y));
    // and its input slot holds the blank image (zeros normalized), not the image
    let blank = &a.stages.as_ref().unwrap().input;
    let per = 64 * 176 * 3;
    let norm0 = [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225];
    assert!(blank.data[3 * per..4 * per].chunks(3).all(|p| (0..3).all(|c| (p[c] - norm0[c] as f32).abs() < 1e-5)));
    // no image at all: an error, not an empty map
    let e = run(&mut m, &imgs, &[false; 6], None).unwrap_err().to_string();
    assert!(e.contains("no camera image"), "{e}");
}

#[test]
fn wrong_image_count_or_size_is_an_error() {
    let cfg = config(&small("camera"));
    let imgs = images();
    let mut m = model(&cfg, 7);
    let refs: Vec<Option<&RgbImage>> = imgs.iter().take(5).map(Some).collect();
    let e = m.forward(&calib(), &refs, None, false).unwrap_err().to_string();
    assert!(e.contains("5 camera images for a calibration of 6 cameras"), "{e}");
    let small_img = RgbImage::zeroed(800, 450);
    let mut refs: Vec<Option<&RgbImage>> = imgs.iter().map(Some).collect();
    refs[2] = Some(&small_img);
    let e = m.forward(&calib(), &refs, None, false).unwrap_err().to_string();
    assert!(e.contains("CAM_FRONT_LEFT") && e.contains("800x450") && e.contains("1600x900"), "{e}");
    // a calibration whose images are too small for the crop: an error naming the camera
    let mut c = calib();
    for cam in &mut c.cameras {
        cam.image_width = 800;
        cam.image_height = 450;
    }
    let tiny: Vec<RgbImage> = (0..6).map(|_| RgbImage::zeroed(800, 450)).collect();
    let refs: Vec<Option<&RgbImage>> = tiny.iter().map(Some).collect();
    assert!(m.forward(&c, &refs, None, false).is_err());
    // the camera-only model refuses a cloud; the fusion model needs one
    let refs: Vec<Option<&RgbImage>> = imgs.iter().map(Some).collect();
    let e = m.forward(&calib(), &refs, Some(&sweep5()), false).unwrap_err().to_string();
    assert!(e.contains("camera-only"), "{e}");
    let fcfg = config(&small("fusion"));
    let e = model(&fcfg, 1).forward(&calib(), &refs, None, false).unwrap_err().to_string();
    assert!(e.contains("needs a LiDAR cloud"), "{e}");
}

#[test]
fn calibration_missing_a_camera_is_an_error() {
    let text = std::fs::read_to_string(common::data("nuscenes/calib.json")).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["cameras"].as_object_mut().unwrap().remove("CAM_BACK_RIGHT");
    let e = Calibration::from_nuscenes_json(&doc.to_string(), "calib.json", &NUSCENES_CAMERAS, 1600, 900).unwrap_err().to_string();
    assert!(e.contains("no camera `CAM_BACK_RIGHT`"), "{e}");
    // a calibration of five cameras given six images: the count error
    let cfg = config(&small("camera"));
    let five = Calibration::new(calib().cameras[..5].to_vec()).unwrap();
    let imgs = images();
    let refs: Vec<Option<&RgbImage>> = imgs.iter().map(Some).collect();
    let e = model(&cfg, 7).forward(&five, &refs, None, false).unwrap_err().to_string();
    assert!(e.contains("6 camera images for a calibration of 5 cameras"), "{e}");
}

#[test]
fn weights_of_the_other_model_are_named() {
    let cam = config(&small("camera"));
    let fus = config(&small("fusion"));
    let cam_w = || Weights::from_tensors("camera.safetensors", random_tensors(&cam, 1).unwrap()).unwrap();
    let fus_w = || Weights::from_tensors("fusion.safetensors", random_tensors(&fus, 1).unwrap()).unwrap();
    let e = BevSegModel::from_weights(&fus, cam_w()).unwrap_err().to_string();
    assert!(e.contains("look like BEVFusion's camera-only seg model"), "{e}");
    assert!(e.contains("config/models/bevfusion_seg_camera.yaml"), "{e}");
    assert!(e.contains("missing: encoders.lidar.backbone.conv_input.0.weight"), "{e}");
    assert!(e.contains("missing: fuser.0.weight"), "{e}");
    let e = BevSegModel::from_weights(&cam, fus_w()).unwrap_err().to_string();
    assert!(e.contains("look like BEVFusion's camera + LiDAR fusion seg model"), "{e}");
    assert!(e.contains("unexpected: fuser.0.weight"), "{e}");
    assert!(e.contains("unexpected: encoders.lidar.backbone.conv_input.0.weight"), "{e}");
    // the right model with a tensor missing, one extra and one mis-shaped: all listed at once
    let mut t = random_tensors(&cam, 1).unwrap();
    let gone = t.remove(5).0;
    t.push(("heads.map.extra".into(), vec![1], vec![0.0]));
    let i = t.iter().position(|(n, _, _)| n.starts_with("decoder.")).unwrap();
    t[i].1.push(1);
    let bad_name = t[i].0.clone();
    let e = BevSegModel::from_weights(&cam, Weights::from_tensors("w", t).unwrap()).unwrap_err().to_string();
    assert!(!e.contains("look like"), "{e}");
    assert!(e.contains(&format!("missing: {gone}")), "{e}");
    assert!(e.contains("unexpected: heads.map.extra"), "{e}");
    assert!(e.contains(&format!("mis-shaped: {bad_name}")), "{e}");
}

#[test]
fn full_configs_load_and_agree() {
    // the shipped YAMLs parse, their parts agree on the BEV maps they hand over, and their random
    // weights have the upstream names and counts the released checkpoints have
    for (kind, k) in [("camera", BevSegKind::Camera), ("fusion", BevSegKind::Fusion)] {
        let cfg = config(&full(kind));
        assert_eq!(cfg.kind, k);
        let t = random_tensors(&cfg, 0).unwrap();
        let names: std::collections::HashSet<&str> = t.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(names.len(), t.len(), "{kind}: duplicate names");
        for want in ["encoders.camera.backbone.patch_embed.projection.weight", "encoders.camera.vtransform.depthnet.weight", "heads.map.classifier.0.weight"] {
            assert!(names.contains(want), "{kind}: {want}");
        }
        assert_eq!(names.contains("fuser.0.weight"), k == BevSegKind::Fusion);
        assert_eq!(names.iter().any(|n| n.starts_with("encoders.lidar.")), k == BevSegKind::Fusion);
    }
    // a fusion YAML whose fuser does not take the camera BEV's channels: a clear config error
    let text = std::fs::read_to_string(full("fusion")).unwrap();
    let e = BevSegConfig::parse(&text.replace("in_channels: [80, 256]", "in_channels: [64, 256]"), "f.yaml").unwrap_err().to_string();
    assert!(e.contains("fuser"), "{e}");
}
