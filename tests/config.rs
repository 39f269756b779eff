//! Configuration loading (`sptr::models::sphereformer::config`): the shipped model YAMLs and the node params file load,
//! and every rejected value, unknown key, missing file and malformed document gives the right
//! `ConfigError` naming the file and the key.
//!
//! The bad variants are the shipped files edited by string replacement (each replacement must
//! match exactly once), so these tests follow the files as they change.

mod common;

use sptr::error::ConfigError;
use sptr::device::DeviceChoice;
use sptr::frame::params::NodeParams;
use sptr::ops::voxelize::cpu::{KeyPrecision, OutOfRange, VoxelOrigin};
use sptr::models::sphereformer::config::ModelConfig;
use std::path::PathBuf;

const KITTI: &str = "config/models/sphereformer_semantickitti.yaml";
const NUSC: &str = "config/models/sphereformer_nuscenes.yaml";
const NODE: &str = "config/perception.yaml";
const NODE_NUSC: &str = "config/perception_nuscenes.yaml";

fn path(rel: &str) -> PathBuf {
    common::root().join(rel)
}

fn text(rel: &str) -> String {
    std::fs::read_to_string(path(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `text` with `from` (which must occur exactly once) replaced by `to`.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "`{from}` should occur exactly once in the shipped file");
    text.replacen(from, to, 1)
}

/// Writes `contents` to a fresh file under the temp dir and returns its path (not cargo's test
/// tmp dir: a path of the build machine, absent where staged test binaries run).
fn temp_file(name: &str, contents: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sptr-config-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, contents).unwrap();
    p
}

/// Asserts a `Value` error for `key` in `file`, and that its message names both.
fn assert_value_err<T: std::fmt::Debug>(r: Result<T, ConfigError>, file: &str, key: &str) {
    match r {
        Err(e @ ConfigError::Value { .. }) => {
            let ConfigError::Value { file: f, key: k, reason } = &e else { unreachable!() };
            assert_eq!(f, file);
            assert_eq!(k, key, "wrong key (reason: {reason})");
            assert!(!reason.is_empty());
            let msg = e.to_string();
            assert!(msg.contains(file) && msg.contains(&format!("`{key}`")), "message {msg:?} should name {file} and `{key}`");
        }
        other => panic!("expected Value error for `{key}` in {file}, got {other:?}"),
    }
}

/// Asserts a `Parse` error in `file` whose message contains `needle`.
fn assert_parse_err<T: std::fmt::Debug>(r: Result<T, ConfigError>, file: &str, needle: &str) {
    match r {
        Err(e @ ConfigError::Parse { .. }) => {
            let ConfigError::Parse { file: f, reason } = &e else { unreachable!() };
            assert_eq!(f, file);
            assert!(reason.contains(needle), "parse reason {reason:?} lacks {needle:?}");
            let msg = e.to_string();
            assert!(msg.starts_with(file) && msg.contains(needle), "message {msg:?}");
        }
        other => panic!("expected Parse error containing {needle:?} in {file}, got {other:?}"),
    }
}

fn model_value_err(rel: &str, from: &str, to: &str, key: &str) {
    assert_value_err(ModelConfig::parse(&edit(&text(rel), from, to), rel), rel, key);
}

fn node_value_err(from: &str, to: &str, key: &str) {
    assert_value_err(NodeParams::parse(&edit(&text(NODE), from, to), NODE), NODE, key);
}

// ---------------------------------------------------------------------------------------------
// The shipped files

#[test]
fn semantickitti_model_yaml_loads() {
    let c = ModelConfig::load(&path(KITTI)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.source, path(KITTI));
    let y = &c.yaml;
    assert_eq!(y.classes, 19);
    assert_eq!(y.class_names.len(), 19);
    assert_eq!(y.palette.len(), 19);
    assert_eq!(y.voxel_size, [0.05; 3]);
    assert_eq!(y.pc_range, Some([[-51.2, -51.2, -4.0], [51.2, 51.2, 2.4]]));
    assert_eq!(y.voxelization.key_precision, KeyPrecision::F64);
    let p = c.voxel_params();
    p.validate().expect("voxel params of a valid config validate");
    assert_eq!(p.origin, VoxelOrigin::ScanMin);
    assert_eq!(p.out_of_range, OutOfRange::Clip);
    assert_eq!(p.range, y.pc_range);
    assert_eq!(p.max_voxels, y.voxelization.max_voxels);
}

#[test]
fn nuscenes_model_yaml_loads() {
    let c = ModelConfig::load(&path(NUSC)).unwrap_or_else(|e| panic!("{e}"));
    let y = &c.yaml;
    assert_eq!(y.classes, 16);
    assert_eq!(y.class_names.len(), 16);
    assert_eq!(y.palette.len(), 16);
    assert_eq!(y.pc_range, None);
    assert_eq!(y.voxel_size, [0.1; 3]);
    assert_eq!(y.voxelization.key_precision, KeyPrecision::F32);
    let p = c.voxel_params();
    p.validate().expect("voxel params of a valid config validate");
    assert_eq!(p.range, None);
    assert_eq!(p.origin, VoxelOrigin::ScanMin);
}

#[test]
fn parse_agrees_with_load() {
    for rel in [KITTI, NUSC] {
        let loaded = ModelConfig::load(&path(rel)).unwrap();
        assert_eq!(ModelConfig::parse(&text(rel), rel).unwrap(), loaded.yaml);
    }
    assert_eq!(NodeParams::parse(&text(NODE), NODE).unwrap(), NodeParams::load(&path(NODE)).unwrap());
}

#[test]
fn perception_yaml_loads_and_names_a_loadable_model() {
    let p = NodeParams::load(&path(NODE)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.device, DeviceChoice::Cuda);
    assert!(!p.model.config.is_empty());
    assert!((1..=100).contains(&p.input.qos_depth));
    assert!(p.bev.resolution > 0.0);
    assert!(p.bev.range[0] < p.bev.range[2] && p.bev.range[1] < p.bev.range[3]);
    assert!(p.budget.processing_ms > 0.0 && p.budget.error_after_s >= 0.0);
    // `model.config` is relative to the params file's directory.
    let model = path(NODE).parent().unwrap().join(&p.model.config);
    let m = ModelConfig::load(&model).unwrap_or_else(|e| panic!("model.config {}: {e}", model.display()));
    assert!(p.bev.obstacle_classes.iter().all(|&c| (c as usize) < m.yaml.classes), "obstacle class id past the model's classes");
}

/// The node's defaults built into the library (what `sptr replay` uses without `--params`) are
/// config/perception.yaml.
#[test]
fn built_in_defaults_are_perception_yaml() {
    assert_eq!(NodeParams::defaults().unwrap(), NodeParams::load(&path(NODE)).unwrap());
}

/// config/perception_nuscenes.yaml is config/perception.yaml for the nuScenes model: only
/// `model.config`, `bev.obstacle_classes` and `bev.frame_id` differ; those ids are its object
/// classes and `manmade` (ground and vegetation left out, as in perception.yaml), and the grids
/// are in the cloud's frame (`""`: the sample bag's `lidar_top`, so its replay does not warn).
#[test]
fn perception_nuscenes_yaml_is_perception_yaml_for_the_nuscenes_model() {
    let kitti = NodeParams::load(&path(NODE)).unwrap();
    let nus = NodeParams::load(&path(NODE_NUSC)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(nus.bev.frame_id, "", "{NODE_NUSC}: the BEV grids in the cloud's frame");
    let mut same = nus.clone();
    same.model.config = kitti.model.config.clone();
    same.bev.obstacle_classes = kitti.bev.obstacle_classes.clone();
    same.bev.frame_id = kitti.bev.frame_id.clone();
    assert_eq!(same, kitti, "{NODE_NUSC} differs from {NODE} in more than the model");
    let model = path(NODE_NUSC).parent().unwrap().join(&nus.model.config);
    assert_eq!(model, path(NUSC));
    let m = ModelConfig::load(&model).unwrap().yaml;
    let names: Vec<&str> = nus.bev.obstacle_classes.iter().map(|&c| m.class_names[c as usize].as_str()).collect();
    assert_eq!(
        names,
        [
            "barrier", "bicycle", "bus", "car", "construction_vehicle", "motorcycle", "pedestrian",
            "traffic_cone", "trailer", "truck", "manmade"
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Read and parse errors

#[test]
fn missing_model_file_is_a_read_error() {
    let p = path("config/models/no_such_model.yaml");
    match ModelConfig::load(&p) {
        Err(e @ ConfigError::Read { .. }) => {
            let ConfigError::Read { file, reason } = &e else { unreachable!() };
            assert_eq!(file, &p.display().to_string());
            assert!(!reason.is_empty());
            assert!(e.to_string().contains("no_such_model.yaml"));
        }
        other => panic!("expected Read error, got {other:?}"),
    }
}

#[test]
fn missing_params_file_is_a_read_error() {
    let p = path("config/no_such_params.yaml");
    assert!(matches!(NodeParams::load(&p), Err(ConfigError::Read { file, .. }) if file == p.display().to_string()));
}

#[test]
fn unknown_top_level_model_key_is_a_parse_error() {
    for rel in [KITTI, NUSC] {
        let t = format!("{}extra_setting: 1\n", text(rel));
        assert_parse_err(ModelConfig::parse(&t, rel), rel, "unknown field `extra_setting`");
    }
}

#[test]
fn unknown_nested_model_key_is_a_parse_error() {
    for rel in [KITTI, NUSC] {
        let t = edit(&text(rel), "  max_voxels:", "  max_voxel:");
        assert_parse_err(ModelConfig::parse(&t, rel), rel, "unknown field `max_voxel`");
    }
}

#[test]
fn unknown_key_error_from_load_names_the_file() {
    let t = edit(&text(KITTI), "  max_voxels:", "  max_voxel:");
    let p = temp_file("unknown_key.yaml", &t);
    let file = p.display().to_string();
    let r = ModelConfig::load(&p);
    assert!(matches!(&r, Err(e) if e.to_string().contains("unknown_key.yaml")), "{r:?}");
    assert_parse_err(r, &file, "unknown field `max_voxel`");
}

#[test]
fn unknown_params_keys_are_parse_errors() {
    let t = format!("{}extra_node:\n  ros__parameters: {{}}\n", text(NODE));
    assert_parse_err(NodeParams::parse(&t, NODE), NODE, "unknown field `extra_node`");
    let t = edit(&text(NODE), "frame_id:", "frame:");
    assert_parse_err(NodeParams::parse(&t, NODE), NODE, "unknown field `frame`");
    let t = edit(&text(NODE), "qos_depth:", "qos_dept:");
    assert_parse_err(NodeParams::parse(&t, NODE), NODE, "unknown field `qos_dept`");
}

#[test]
fn missing_model_key_is_a_parse_error() {
    let t = edit(&text(KITTI), "  max_points: 4000000\n", "");
    assert_parse_err(ModelConfig::parse(&t, KITTI), KITTI, "missing field `max_points`");
}

#[test]
fn mistyped_values_are_parse_errors() {
    let t = edit(&text(KITTI), "classes: 19", "classes: many");
    assert_parse_err(ModelConfig::parse(&t, KITTI), KITTI, "classes");
    let t = edit(&text(KITTI), "key_precision: f64", "key_precision: f16");
    assert_parse_err(ModelConfig::parse(&t, KITTI), KITTI, "f16");
    let t = edit(&text(NODE), "device: cuda", "device: tpu");
    assert_parse_err(NodeParams::parse(&t, NODE), NODE, "tpu");
}

#[test]
fn malformed_yaml_is_a_parse_error() {
    let t = edit(&text(KITTI), "layers: [32, 64, 128, 256, 256]", "layers: [32, 64, 128, 256, 256");
    assert!(matches!(ModelConfig::parse(&t, KITTI), Err(ConfigError::Parse { file, .. }) if file == KITTI));
    let t = edit(&text(NODE), "      qos_depth: 1", "    qos_depth: 1\n   - x");
    assert!(matches!(NodeParams::parse(&t, NODE), Err(ConfigError::Parse { file, .. }) if file == NODE));
    assert!(matches!(ModelConfig::parse("", KITTI), Err(ConfigError::Parse { .. })));
    assert!(matches!(NodeParams::parse(": : :\n\t", NODE), Err(ConfigError::Parse { .. })));
}

// ---------------------------------------------------------------------------------------------
// Model values

#[test]
fn classes_zero_is_a_value_error() {
    model_value_err(KITTI, "classes: 19", "classes: 0", "classes");
    model_value_err(NUSC, "classes: 16", "classes: 256", "classes");
}

#[test]
fn wrong_arch_is_a_value_error() {
    model_value_err(KITTI, "arch: unet_spherical_transformer", "arch: unet", "arch");
}

#[test]
fn input_c_out_of_range_is_a_value_error() {
    model_value_err(KITTI, "input_c: 4", "input_c: 2", "input_c");
}

#[test]
fn odd_layer_width_is_a_value_error() {
    model_value_err(KITTI, "layers: [32, 64, 128, 256, 256]", "layers: [32, 64, 127, 256, 256]", "layers");
    model_value_err(KITTI, "layers: [32, 64, 128, 256, 256]", "layers: []", "layers");
}

#[test]
fn negative_voxel_size_is_a_value_error() {
    model_value_err(KITTI, "voxel_size: [0.05, 0.05, 0.05]", "voxel_size: [0.05, -0.05, 0.05]", "voxel_size[1]");
    model_value_err(NUSC, "voxel_size: [0.1, 0.1, 0.1]", "voxel_size: [0.1, 0.1, 0]", "voxel_size[2]");
    model_value_err(NUSC, "voxel_size: [0.1, 0.1, 0.1]", "voxel_size: [.nan, 0.1, 0.1]", "voxel_size[0]");
}

#[test]
fn other_non_positive_sizes_are_value_errors() {
    model_value_err(KITTI, "window_size: 6", "window_size: 0", "window_size");
    model_value_err(KITTI, "a: 0.0125", "a: -0.0125", "a");
    model_value_err(KITTI, "quant_size_scale: 24", "quant_size_scale: 0", "quant_size_scale");
    model_value_err(KITTI, "window_size_sphere: [2, 2, 80]", "window_size_sphere: [2, 0, 80]", "window_size_sphere[1]");
    model_value_err(KITTI, "window_size_scale: [2.0, 1.5]", "window_size_scale: [2.0, -1.5]", "window_size_scale[1]");
}

#[test]
fn inverted_pc_range_is_a_value_error() {
    model_value_err(
        KITTI,
        "pc_range: [[-51.2, -51.2, -4], [51.2, 51.2, 2.4]]",
        "pc_range: [[-51.2, -51.2, 3], [51.2, 51.2, 2.4]]",
        "pc_range",
    );
    model_value_err(
        KITTI,
        "pc_range: [[-51.2, -51.2, -4], [51.2, 51.2, 2.4]]",
        "pc_range: [[-51.2, 51.2, -4], [51.2, 51.2, 2.4]]",
        "pc_range",
    );
}

#[test]
fn sphere_layers_out_of_range_is_a_value_error() {
    model_value_err(KITTI, "sphere_layers: [1, 2, 3, 4, 5]", "sphere_layers: [1, 2, 3, 4, 6]", "sphere_layers");
    model_value_err(NUSC, "sphere_layers: [1, 2, 3, 4, 5]", "sphere_layers: [0, 1]", "sphere_layers");
}

#[test]
fn range_min_origin_without_pc_range_is_a_value_error() {
    model_value_err(NUSC, "origin: scan_min", "origin: range_min", "voxelization.origin");
}

#[test]
fn max_voxels_zero_is_a_value_error() {
    model_value_err(KITTI, "max_voxels: 400000", "max_voxels: 0", "voxelization.max_voxels");
    model_value_err(NUSC, "max_voxels: 400000", "max_voxels: 2147483648", "voxelization.max_voxels");
}

#[test]
fn max_points_zero_is_a_value_error() {
    model_value_err(KITTI, "max_points: 4000000", "max_points: 0", "voxelization.max_points");
}

#[test]
fn class_names_length_mismatch_is_a_value_error() {
    model_value_err(KITTI, "pole, traffic-sign]", "pole]", "class_names");
    model_value_err(NUSC, "manmade, vegetation]", "manmade, vegetation, sky]", "class_names");
}

#[test]
fn palette_length_mismatch_is_a_value_error() {
    model_value_err(KITTI, ", [255, 0, 0]]", "]", "palette");
    model_value_err(NUSC, "[0, 175, 0]]", "[0, 175, 0], [1, 2, 3]]", "palette");
}

#[test]
fn value_error_from_load_names_the_file() {
    let p = temp_file("bad_classes.yaml", &edit(&text(KITTI), "classes: 19", "classes: 0"));
    assert_value_err(ModelConfig::load(&p), &p.display().to_string(), "classes");
}

// ---------------------------------------------------------------------------------------------
// Node params values

#[test]
fn empty_model_config_is_a_value_error() {
    node_value_err("config: models/sphereformer_semantickitti.yaml", "config: \"\"", "model.config");
}

#[test]
fn qos_depth_zero_is_a_value_error() {
    node_value_err("qos_depth: 1", "qos_depth: 0", "input.qos_depth");
    node_value_err("qos_depth: 1", "qos_depth: 101", "input.qos_depth");
}

#[test]
fn bev_resolution_zero_is_a_value_error() {
    node_value_err("resolution: 0.4", "resolution: 0", "bev.resolution");
    node_value_err("resolution: 0.4", "resolution: -0.4", "bev.resolution");
}

#[test]
fn inverted_bev_range_is_a_value_error() {
    node_value_err("range: [-51.2, -51.2, 51.2, 51.2]", "range: [51.2, -51.2, -51.2, 51.2]", "bev.range");
    node_value_err("range: [-51.2, -51.2, 51.2, 51.2]", "range: [-51.2, 51.2, 51.2, 51.2]", "bev.range");
}

#[test]
fn too_many_bev_cells_is_a_value_error() {
    // 102.4 m / 0.02 m = 5120 cells a side: 26 million cells.
    node_value_err("resolution: 0.4", "resolution: 0.02", "bev.resolution");
    // 4000 x 4000 = exactly 16 million: still accepted.
    let t = edit(&edit(&text(NODE), "range: [-51.2, -51.2, 51.2, 51.2]", "range: [0, 0, 400, 400]"), "resolution: 0.4", "resolution: 0.1");
    NodeParams::parse(&t, NODE).expect("16 million cells is the limit, inclusive");
}

#[test]
fn negative_budget_is_a_value_error() {
    node_value_err("processing_ms: 100.0", "processing_ms: -1.0", "budget.processing_ms");
    node_value_err("processing_ms: 100.0", "processing_ms: 0", "budget.processing_ms");
    node_value_err("error_after_s: 2.0", "error_after_s: -2.0", "budget.error_after_s");
    let t = edit(&text(NODE), "error_after_s: 2.0", "error_after_s: 0");
    NodeParams::parse(&t, NODE).expect("error_after_s 0 is allowed");
}

/// The config's bound on `voxelization.max_voxels` and `VoxelParams::validate`'s must agree: a
/// value at the edge is either rejected by the config or valid for voxelization, never accepted
/// by one and refused by the other.
#[test]
fn largest_accepted_max_voxels_gives_valid_voxel_params() {
    let t = edit(&text(KITTI), "max_voxels: 400000", "max_voxels: 2147483647");
    match ModelConfig::parse(&t, KITTI) {
        Err(ConfigError::Value { key, .. }) => assert_eq!(key, "voxelization.max_voxels"),
        Err(e) => panic!("{e}"),
        Ok(yaml) => {
            let c = ModelConfig { source: path(KITTI), yaml };
            c.voxel_params().validate().expect("a max_voxels the config accepts must be valid voxel params");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The camera branch's parameters

const NODE_CAMS: &str = "config/perception_nuscenes_cameras.yaml";

/// The six-camera rig file is config/perception_nuscenes.yaml with the camera branch on: only
/// `input.cameras` and `camera.{model_config, calibration_file, map_thresholds}` differ; its
/// cameras' topics are the sample bag's (the node `sptr` in `/`), its model and calibration
/// file exist.
#[test]
fn perception_nuscenes_cameras_yaml_is_the_nuscenes_file_with_cameras() {
    let nus = NodeParams::load(&path(NODE_NUSC)).unwrap();
    let cams = NodeParams::load(&path(NODE_CAMS)).unwrap_or_else(|e| panic!("{e}"));
    assert!(nus.input.cameras.is_empty() && NodeParams::load(&path(NODE)).unwrap().input.cameras.is_empty());
    assert_eq!(cams.input.cameras, ["CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"]);
    let mut same = cams.clone();
    same.input.cameras.clear();
    same.camera.model_config.clear();
    same.camera.calibration_file.clear();
    same.camera.map_thresholds.clear();
    assert_eq!(same, nus, "{NODE_CAMS} differs from {NODE_NUSC} in more than the cameras");
    let dir = path(NODE_CAMS).parent().unwrap().to_path_buf();
    assert!(dir.join(&cams.camera.model_config).is_file());
    assert!(dir.join(&cams.camera.calibration_file).is_file());
    assert_eq!(cams.map_thresholds(6).unwrap(), vec![0.5; 6]);
    assert!(cams.map_thresholds(5).unwrap_err().contains("6 values"));
    assert_eq!(nus.map_thresholds(6).unwrap(), vec![0.5; 6], "[] is 0.5 for every class");
    let inputs = cams.camera_inputs();
    assert_eq!(inputs.len(), 6);
    assert_eq!(inputs[0].image_topic, "~/input/cameras/CAM_FRONT/image/compressed");
    assert_eq!(inputs[5].camera_info_topic, "~/input/cameras/CAM_BACK_RIGHT/camera_info");
    assert!(inputs.iter().all(|c| c.transport == sptr::frame::params::ImageTransport::Compressed && c.intrinsics == sptr::frame::params::IntrinsicsFrom::K));
    assert_eq!((cams.camera.max_camera_lidar_delay, cams.lidar.sweeps, cams.lidar.odom_frame.as_str()), (0.12, 1, "odom"));
    // the camera frame beside the LiDAR path unless told otherwise; a non-boolean names the key
    assert!(cams.camera.beside_lidar && sptr::frame::params::CameraParams::default().beside_lidar);
    let serial = NodeParams::parse(&edit(&text(NODE_CAMS), "beside_lidar: true", "beside_lidar: false"), NODE_CAMS).unwrap();
    assert!(!serial.camera.beside_lidar);
    let e = NodeParams::parse(&edit(&text(NODE_CAMS), "beside_lidar: true", "beside_lidar: sometimes"), NODE_CAMS).unwrap_err().to_string();
    assert!(e.contains("beside_lidar"), "{e}");
    // the map model's CUDA graph: off unless asked for, in the shipped files and without the key
    assert!(!cams.camera.cuda_graph && !nus.camera.cuda_graph && !sptr::frame::params::CameraParams::default().cuda_graph);
    let graph = NodeParams::parse(&edit(&text(NODE_CAMS), "cuda_graph: false", "cuda_graph: true"), NODE_CAMS).unwrap();
    assert!(graph.camera.cuda_graph);
    let e = NodeParams::parse(&edit(&text(NODE_CAMS), "cuda_graph: false", "cuda_graph: 2"), NODE_CAMS).unwrap_err().to_string();
    assert!(e.contains("cuda_graph"), "{e}");
}

#[test]
fn camera_overrides_change_one_camera() {
    let t = edit(
        &text(NODE_CAMS),
        "      max_camera_lidar_delay: 0.12",
        "      overrides:\n        CAM_BACK:\n          transport: raw\n          intrinsics: p\n          image_topic: /rear/image_rect\n      max_camera_lidar_delay: 0.12",
    );
    let p = NodeParams::parse(&t, NODE_CAMS).unwrap();
    let i = p.camera_inputs();
    assert_eq!(i[3].image_topic, "/rear/image_rect");
    assert_eq!(i[3].transport, sptr::frame::params::ImageTransport::Raw);
    assert_eq!(i[3].intrinsics, sptr::frame::params::IntrinsicsFrom::P);
    assert_eq!(i[3].camera_info_topic, "~/input/cameras/CAM_BACK/camera_info");
    assert_eq!(i[2].image_topic, "~/input/cameras/CAM_FRONT_LEFT/image/compressed");
}

#[test]
fn bad_camera_parameters_are_value_errors() {
    let cams = "cameras: [CAM_FRONT, CAM_FRONT_RIGHT, CAM_FRONT_LEFT, CAM_BACK, CAM_BACK_LEFT, CAM_BACK_RIGHT]";
    let bad = |from: &str, to: &str, key: &str| assert_value_err(NodeParams::parse(&edit(&text(NODE_CAMS), from, to), NODE_CAMS), NODE_CAMS, key);
    bad(cams, "cameras: [CAM_FRONT, CAM_FRONT]", "input.cameras");
    bad(cams, "cameras: [CAM-FRONT]", "input.cameras");
    bad(cams, "cameras: [\"\"]", "input.cameras");
    bad("max_camera_lidar_delay: 0.12", "max_camera_lidar_delay: -0.1", "camera.max_camera_lidar_delay");
    bad("map_thresholds: [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]", "map_thresholds: [0.5, 1.5]", "camera.map_thresholds");
    bad("map_thresholds: [0.5, 0.5, 0.5, 0.5, 0.5, 0.5]", "map_thresholds: [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]", "camera.map_thresholds");
    bad("sweeps: 1", "sweeps: 0", "lidar.sweeps");
    bad("sweeps: 1", "sweeps: 21", "lidar.sweeps");
    bad("odom_frame: odom", "odom_frame: \"\"", "lidar.odom_frame");
    bad("image_topic: ~/input/cameras/{camera}/image", "image_topic: ~/input/cameras/image", "camera.image_topic");
    bad("image_topic: ~/input/cameras/{camera}/image", "image_topic: \"a b/{camera}\"", "camera.image_topic");
    bad(
        "      max_camera_lidar_delay: 0.12",
        "      overrides:\n        CAM_SIDE:\n          transport: raw\n      max_camera_lidar_delay: 0.12",
        "camera.overrides.CAM_SIDE",
    );
    bad(
        "      max_camera_lidar_delay: 0.12",
        "      overrides:\n        CAM_BACK:\n          image_topic: \"x//y\"\n      max_camera_lidar_delay: 0.12",
        "camera.overrides.CAM_BACK.image_topic",
    );
    assert_parse_err(NodeParams::parse(&edit(&text(NODE_CAMS), "transport: compressed", "transport: h264"), NODE_CAMS), NODE_CAMS, "h264");
    assert_parse_err(NodeParams::parse(&edit(&text(NODE_CAMS), "intrinsics: k", "intrinsics: q"), NODE_CAMS), NODE_CAMS, "q");
    assert_parse_err(NodeParams::parse(&edit(&text(NODE_CAMS), "sweeps: 1", "sweeps: 1\n      extra: 2"), NODE_CAMS), NODE_CAMS, "extra");
    // 33 cameras: more than the 32-bit camera mask
    let many: Vec<String> = (0..33).map(|i| format!("C{i}")).collect();
    bad(cams, &format!("cameras: [{}]", many.join(", ")), "input.cameras");
}

/// `precision`: optional in the model YAML (default fp16) and in the node params
/// (absent: the model's); fp16, bf16 and auto parse; anything else is a parse error naming the
/// value.
#[test]
fn precision_is_optional_and_checked_in_both_files() {
    use sptr::device::storage::Precision;
    assert_eq!(ModelConfig::load(&path(NUSC)).unwrap().yaml.precision, Precision::Fp16);
    assert_eq!(NodeParams::load(&path(NODE)).unwrap().precision, None);
    let model = text(NUSC);
    let node = text(NODE);
    for (name, p) in [("fp16", Precision::Fp16), ("bf16", Precision::Bf16), ("fp32", Precision::Fp32), ("auto", Precision::Auto)] {
        let y = ModelConfig::parse(&format!("{model}precision: {name}\n"), "m.yaml").unwrap();
        assert_eq!(y.precision, p);
        let n = NodeParams::parse(&edit(&node, "    on_overflow:", &format!("    precision: {name}\n    on_overflow:")), "p.yaml").unwrap();
        assert_eq!(n.precision, Some(p));
    }
    assert_parse_err(ModelConfig::parse(&format!("{model}precision: tf32\n"), "m.yaml"), "m.yaml", "tf32");
    assert_parse_err(NodeParams::parse(&edit(&node, "    on_overflow:", "    precision: half\n    on_overflow:"), "p.yaml"), "p.yaml", "half");
}
