//! What the replay tests with cameras share: the cut-down SphereFormer with random weights and
//! the BEV parameters of the six-camera params file, and replay options with quiet progress.
#![allow(dead_code)]

use std::path::Path;

use sptr::device::Device;
use sptr::frame::params::NodeParams;
use sptr::models::sphereformer::config::{ModelConfig, ModelYaml};
use sptr::eval::LabelMap;
use sptr::models::sphereformer::random::random_weights;
use sptr::frame::outputs::OutputTopics;
use sptr::frame::processor::Processor;
use sptr::replay::{bev_params, CameraReplayOptions, ProgressMode, ReplayOptions, Shard};

/// The six-camera params file (the sample bag's topics, the sample calibration file).
pub const CAMS_PARAMS: &str = "config/perception_nuscenes_cameras.yaml";

/// The nuScenes SphereFormer cut down (as tests/replay.rs does) with random weights, BEV
/// parameters of the six-camera params file; the YAML is written to `dir`.
pub fn processor(dir: &Path) -> (ModelYaml, Processor) {
    let text = std::fs::read_to_string(crate::common::root().join("config/models/sphereformer_nuscenes.yaml")).unwrap();
    let text = text
        .replace("\nm: 32\n", "\nm: 16\n")
        .replace("block_reps: 2", "block_reps: 1")
        .replace("layers: [32, 64, 128, 256, 256]", "layers: [16, 32, 48]")
        .replace("sphere_layers: [1, 2, 3, 4, 5]", "sphere_layers: [1, 2]");
    let path = dir.join("small_nuscenes.yaml");
    std::fs::write(&path, text).unwrap();
    let yaml = ModelConfig::load(&path).unwrap().yaml;
    let params_path = crate::common::root().join(CAMS_PARAMS);
    let node = NodeParams::load(&params_path).unwrap();
    let (bev, _) = bev_params(&yaml, Some((&params_path, &node))).unwrap();
    let p = Processor::with_weights(Device::Cpu, &yaml, random_weights(&yaml, 7).unwrap(), bev).unwrap();
    (yaml, p)
}

/// Replay options of `bag` into `out` for the cut-down model, quiet, with `cameras`.
pub fn options(bag: &Path, out: &Path, cameras: Option<CameraReplayOptions>) -> ReplayOptions {
    ReplayOptions {
        bag: bag.to_path_buf(),
        lidar_topic: None,
        labels: None,
        label_map: LabelMap::identity(),
        out: out.to_path_buf(),
        bev_frame_id: String::new(),
        bev_png_frames: Default::default(),
        shard: Shard::WHOLE,
        topics: OutputTopics::default(),
        model_name: "small".into(),
        weights_name: "random 7".into(),
        device_name: "cpu".into(),
        progress: ProgressMode::Quiet,
        cameras,
    }
}
