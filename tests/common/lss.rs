//! Shared set-up of the LSS view-transform tests (tests/bevfusion_lss/: cpu.rs, gpu.rs, parity.rs):
//! the model YAML, a reduced copy of it for fast CPU runs, the nuScenes calibration, random
//! inputs. Included with `#[path = "../common/lss.rs"] mod lss_common;`
//! by the main.rs of tests/bevfusion_lss and tests/fp16_range.
#![allow(dead_code)]

use crate::common::{fp16, Rng};
use sptr::sensors::calib::camera::{Calibration, NUSCENES_CAMERAS};
use sptr::models::bevfusion::lss::LssConfig;
use std::path::PathBuf;

/// The repository root ([`crate::common::root`]).
pub fn root() -> PathBuf {
    crate::common::root()
}

pub fn seg_yaml() -> String {
    std::fs::read_to_string(root().join("config/models/bevfusion_seg_camera.yaml")).expect("model YAML")
}

/// The camera-only seg config (6 × 118 × 32 × 88, C 80, 256 × 256 at 0.4 m, downsample 2).
pub fn seg_config() -> LssConfig {
    LssConfig::parse(&seg_yaml(), "bevfusion_seg_camera.yaml").expect("seg config")
}

/// The detection geometry: xbound / ybound [-54, 54, 0.3] (360 × 360),
/// the rest as the seg config.
pub fn det_config() -> LssConfig {
    let text = seg_yaml()
        .replace("xbound: [-51.2, 51.2, 0.4]", "xbound: [-54.0, 54.0, 0.3]")
        .replace("ybound: [-51.2, 51.2, 0.4]", "ybound: [-54.0, 54.0, 0.3]");
    LssConfig::parse(&text, "det").expect("det config")
}

/// A reduced seg config for debug-build CPU tests: 32 → 16 channels, 64 × 176 images (8 × 22
/// features), depth [1, 60, 2] (30 bins), 1.6 m cells (64 × 64), downsample 2.
pub fn small_config() -> LssConfig {
    let text = seg_yaml()
        .replace("image_size: [256, 704]          #", "image_size: [64, 176]          #")
        .replace("image_size: [256, 704]\n        feature_size: [32, 88]", "image_size: [64, 176]\n        feature_size: [8, 22]")
        .replace("in_channels: 256\n        out_channels: 80", "in_channels: 32\n        out_channels: 16")
        .replace("xbound: [-51.2, 51.2, 0.4]", "xbound: [-51.2, 51.2, 1.6]")
        .replace("ybound: [-51.2, 51.2, 0.4]", "ybound: [-51.2, 51.2, 1.6]")
        .replace("dbound: [1.0, 60.0, 0.5]", "dbound: [1.0, 60.0, 2.0]");
    let c = LssConfig::parse(&text, "small").expect("small config");
    assert_eq!((c.depth_bins(), c.channels(), c.feature_size()), (30, 16, [8, 22]), "the YAML changed: update small_config");
    c
}

/// The nuScenes sample's six cameras (1600 × 900 images).
pub fn nuscenes_calib() -> Calibration {
    Calibration::load_nuscenes_json(&root().join("tests/data/nuscenes/calib.json"), &NUSCENES_CAMERAS, 1600, 900).expect("calib.json")
}

/// Random depth distributions `[pixels, d]` (a softmax of logits in ±3, rounded to FP16) and
/// context `[pixels, c]` in ±1 (FP16): what the pool reads on the GPU, so CPU and GPU see the
/// same values.
pub fn random_lifted(seed: u64, pixels: usize, d: usize, c: usize) -> (Vec<f32>, Vec<f32>) {
    let mut s = Rng(seed);
    let mut depth = vec![0f32; pixels * d];
    for row in depth.chunks_mut(d) {
        let logits: Vec<f32> = (0..d).map(|_| 3.0 * s.sym()).collect();
        sptr::models::bevfusion::lss::transform::softmax_into(&logits, row);
        row.iter_mut().for_each(|v| *v = fp16(*v));
    }
    let context = (0..pixels * c).map(|_| fp16(s.sym())).collect();
    (depth, context)
}
