//! The FP16 range guard's reporting paths on the CPU: a network whose activations
//! leave the range is reported, never passed on as plausible labels. The CPU path (f32) flags
//! NaN and inf; the weight of `unet.blocks.block0.conv_branch.2` set to -f32::MAX (finite: a
//! NaN weight is refused at load) makes that conv's output -inf wherever its input (after a
//! ReLU, so non-negative) is not tiny, while the next BatchNorm (positive scale) keeps it -inf
//! and its ReLU launders it to 0, so the logits stay finite: exactly the silent failure the
//! guard exists for, on the CPU. What is checked:
//! - `Segmenter::segment`: the report names the conv first; clean weights give a clean report;
//! - the node's frame processor: `on_overflow: drop` rejects the frame (reason `overflow`),
//!   `zero_probability` publishes probability 0 everywhere and unknown BEV cells;
//! - `sptr segment`: exit status 4, the layer on stderr, no label file; `--allow-overflow` writes
//!   it and exits 0;
//! - `sptr replay`: the frame in report.json (`out_of_range`) and report.md, exit status 4 unless
//!   `--allow-overflow`.
//!
//! The model is a small configuration of the nuScenes SphereFormer (3 levels of 16/32/48
//! channels, 0.2 m voxels) with deterministic random weights, to keep debug-build CI fast.

use crate::common;
use std::path::{Path, PathBuf};
use std::process::Command;

use sptr::msgs::cloud::{decode, encode_points, field_values, Layout};
use sptr::device::Device;
use sptr::frame::params::{NodeParams, OverflowPolicy};
use sptr::models::sphereformer::config::{ModelConfig, ModelYaml};
use sptr::models::sphereformer::random::random_tensors;
use sptr::nn::random::{save_tensors, NamedTensors};
use sptr::nn::weights::Weights;
use sptr::frame::processor::{Processor, Reject, NO_CLASS};
use sptr::models::sphereformer::segmenter::Segmenter;
use sptr::Points;

/// The conv whose weight gets the NaN, and so the first layer the guard must name.
const NAN_LAYER: &str = "unet.blocks.block0.conv_branch.2";

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sptr-fp16-range-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The nuScenes model YAML cut down (see the module doc), written to `dir`.
fn small_model(dir: &Path) -> (PathBuf, ModelYaml) {
    let path = PathBuf::from(common::small_nuscenes_model(dir));
    let yaml = ModelConfig::load(&path).unwrap().yaml;
    assert_eq!((yaml.m, yaml.layers.as_slice(), yaml.voxel_size), (16, &[16, 32, 48][..], [0.2; 3]), "the YAML edits applied");
    (path, yaml)
}

/// Random weights (seed 3); when `nan`, [`NAN_LAYER`]'s weight is -f32::MAX everywhere, so
/// its output overflows to -inf (the BatchNorm after it has a positive scale: random norm
/// weights are drawn in [0.9, 1.1)).
fn tensors(yaml: &ModelYaml, nan: bool) -> NamedTensors {
    let mut t = random_tensors(yaml, 3).unwrap();
    if nan {
        let w = t.iter_mut().find(|(n, _, _)| n == &format!("{NAN_LAYER}.weight")).expect("the conv's weight");
        w.2.iter_mut().for_each(|v| *v = -f32::MAX);
    }
    t
}

fn weights(yaml: &ModelYaml, nan: bool) -> Weights {
    Weights::from_tensors("test weights", tensors(yaml, nan)).unwrap()
}

fn sweep() -> Points {
    common::nuscenes_sweep()
}

#[test]
fn segmenter_names_the_layer_that_went_non_finite() {
    let dir = temp_dir("segmenter");
    let (_, yaml) = small_model(&dir);
    let pts = sweep();
    let bad = Segmenter::new(yaml.clone(), weights(&yaml, true)).unwrap().segment(&[&pts]).unwrap();
    let first = bad.range.first().expect("a flagged layer");
    assert_eq!(first.name, NAN_LAYER, "{}", bad.range.summary(10));
    assert!(first.non_finite && !first.saturated);
    // the laundering the guard exists for: the labels themselves look like any others
    assert!(bad.labels.iter().any(|&l| l != sptr::models::sphereformer::segmenter::UNLABELED));
    assert!(bad.probs.iter().all(|p| p.is_finite()));
    let good = Segmenter::new(yaml.clone(), weights(&yaml, false)).unwrap().segment(&[&pts]).unwrap();
    assert!(good.range.is_clean(), "{}", good.range.summary(10));
}

/// The node's per-frame work: `drop` rejects the frame, `zero_probability` publishes it with
/// probability 0 and unknown BEV cells; in-range frames are untouched.
#[test]
fn node_processor_drops_or_zeroes_frames_out_of_range() {
    let dir = temp_dir("processor");
    let (_, yaml) = small_model(&dir);
    let node = NodeParams::load(&common::root().join("config/perception_nuscenes.yaml")).unwrap();
    assert_eq!(node.on_overflow, OverflowPolicy::Drop, "the node's default");
    let bev = sptr::frame::processor::bev_params(&yaml, node.bev.range, node.bev.resolution, &node.bev.obstacle_classes);
    let body = encode_points(&sweep(), Layout::XyzI32).unwrap();

    let mut p = Processor::with_weights(Device::Cpu, &yaml, weights(&yaml, true), bev.clone()).unwrap();
    assert_eq!(p.on_overflow(), OverflowPolicy::Drop);
    let r = p.process(&body.view()).expect_err("dropped");
    assert_eq!(r.why, Reject::Overflow);
    assert!(r.detail.contains(NAN_LAYER) && r.detail.contains("FP16 range"), "{}", r.detail);
    assert_eq!(p.last_range().first().map(|l| l.name.as_str()), Some(NAN_LAYER));

    p.set_on_overflow(OverflowPolicy::ZeroProbability);
    let out = p.process(&body.view()).expect("published");
    assert_eq!(out.range.first().map(|l| l.name.as_str()), Some(NAN_LAYER));
    let probs = field_values(&out.cloud.view(), &["probability"]).unwrap().unwrap();
    assert_eq!(probs.len(), out.points_kept);
    assert!(probs.iter().all(|&v| v == 0.0), "every probability 0");
    let g = &out.grids;
    assert!(g.labels.iter().all(|&c| c == NO_CLASS) && g.occupancy.iter().all(|&o| o == -1) && g.rgb.iter().all(|&c| c == 0));
    assert_eq!(g.labels.len(), bev.width() * bev.height());

    // a clean frame after a bad one: nothing carried over
    let mut ok = Processor::with_weights(Device::Cpu, &yaml, weights(&yaml, false), bev).unwrap();
    let out = ok.process(&body.view()).expect("in range");
    assert!(out.range.is_clean() && ok.last_range().is_clean());
    let probs = field_values(&out.cloud.view(), &["probability"]).unwrap().unwrap();
    assert!(probs.iter().any(|&v| v > 0.0));
    assert!(out.grids.labels.iter().any(|&c| c != NO_CLASS));
    // the decoded cloud is the input's (the labeled cloud keeps x, y, z)
    assert_eq!(decode(&out.cloud.view()).unwrap().0.len(), out.points_kept);
}

/// `sptr` with `args` (paths and words alike).
fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> std::process::Output {
    Command::new(common::sptr_exe()).args(args.iter().map(|a| a.as_ref())).output().unwrap()
}

/// `sptr segment` exits 4 and writes nothing when the guard flags the frame, unless
/// `--allow-overflow`; in range it exits 0.
#[test]
fn cli_segment_exit_status_and_label_file() {
    let dir = temp_dir("cli-segment");
    let (model, yaml) = small_model(&dir);
    let cloud = std::fs::read_dir(common::data("nuscenes"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".pcd.bin"))
        .expect("the nuScenes sweep");
    let (bad, good) = (dir.join("nan.safetensors"), dir.join("ok.safetensors"));
    save_tensors(&bad, &tensors(&yaml, true)).unwrap();
    save_tensors(&good, &tensors(&yaml, false)).unwrap();
    let segment = |weights: &Path, label: &Path, extra: &[&str]| {
        let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"segment", &cloud, &"--model", &model, &"--weights", &weights];
        a.extend([&"--out" as &dyn AsRef<std::ffi::OsStr>, &label, &"--device", &"cpu"]);
        a.extend(extra.iter().map(|s| s as &dyn AsRef<std::ffi::OsStr>));
        run(&a)
    };

    let label = dir.join("nan.label");
    let out = segment(&bad, &label, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains(NAN_LAYER) && stderr.contains("FP16 range") && stderr.contains("--allow-overflow"), "{stderr}");
    assert!(!label.exists(), "no label file for a frame out of range");

    let out = segment(&bad, &label, &["--allow-overflow"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains(NAN_LAYER) && stderr.contains("warning"), "{stderr}");
    assert!(label.exists());

    let label = dir.join("ok.label");
    let out = segment(&good, &label, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("FP16 range"), "{stderr}");
    assert!(label.exists());
}

/// `sptr replay` lists the frame in report.json and report.md and exits 4 unless
/// `--allow-overflow`; with `on_overflow: zero_probability` in the params file the frame is
/// replayed (probability 0) and still listed.
#[test]
fn cli_replay_lists_frames_out_of_range() {
    let dir = temp_dir("cli-replay");
    let (model, yaml) = small_model(&dir);
    let bad = dir.join("nan.safetensors");
    save_tensors(&bad, &tensors(&yaml, true)).unwrap();
    let params = common::root().join("config/perception_nuscenes.yaml");
    let bag = common::data("bags/nuscenes_sample");
    let replay = |params: &Path, out: &Path, extra: &[&str]| {
        let mut a: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&"replay", &bag, &"--model", &model, &"--weights", &bad];
        a.extend([&"--params" as &dyn AsRef<std::ffi::OsStr>, &params, &"--device", &"cpu", &"--progress", &"quiet", &"--out", &out]);
        a.extend(extra.iter().map(|s| s as &dyn AsRef<std::ffi::OsStr>));
        run(&a)
    };

    let out_dir = dir.join("out");
    let out = replay(&params, &out_dir, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("1 frame(s) left the FP16 range") && stderr.contains(NAN_LAYER), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap()).unwrap();
    let oor = report["out_of_range"].as_array().expect("out_of_range list");
    assert_eq!(oor.len(), 1, "{oor:?}");
    assert_eq!(oor[0]["frame"], 0);
    assert_eq!(oor[0]["status"], "skipped", "dropped as the node drops it");
    assert_eq!(oor[0]["layers"][0], format!("{NAN_LAYER} (NaN/inf)"));
    assert_eq!(report["frames"]["skipped"], 1);
    let md = std::fs::read_to_string(out_dir.join("report.md")).unwrap();
    assert!(md.contains("## Frames out of the FP16 range") && md.contains(NAN_LAYER), "{md}");
    assert!(md.contains("1 frame(s) left the FP16 range"), "{md}");

    // zero_probability: replayed and written, still listed; --allow-overflow: exit 0
    let zero = dir.join("zero.yaml");
    let text = std::fs::read_to_string(&params).unwrap().replace("on_overflow: drop", "on_overflow: zero_probability");
    std::fs::write(&zero, text.replace("models/sphereformer_nuscenes.yaml", &common::root().join("config/models/sphereformer_nuscenes.yaml").display().to_string())).unwrap();
    let out_dir = dir.join("out-zero");
    let out = replay(&zero, &out_dir, &["--allow-overflow"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("warning") && stderr.contains("--allow-overflow"), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out_dir.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["out_of_range"][0]["status"], "replayed");
    assert_eq!(report["frames"]["skipped"], 0);
}
