//! Inputs of the BEVFusion seg model tests: the nuScenes frame in tests/data/nuscenes (six
//! 1600 x 900 JPEGs in the model's camera order, calib.json, the sweep) and the model YAMLs.
#![allow(dead_code)]

use crate::common::{data, nuscenes_sweep, root};
use sptr::bev::calib::{Calibration, NUSCENES_CAMERAS};
use sptr::camera::compressed::decode_compressed;
use sptr::camera::image::{DecodeLimits, RgbImage};
use sptr::model::bevfusion_seg::{BevSegConfig, Point5};
use std::path::PathBuf;

/// The JPEG of nuScenes camera `cam` (e.g. `CAM_BACK`, not `CAM_BACK_LEFT`).
pub fn camera_jpeg(cam: &str) -> PathBuf {
    let dir = data("nuscenes");
    let tag = format!("__{cam}__");
    std::fs::read_dir(&dir)
        .expect("tests/data/nuscenes")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().contains(&tag))
        .unwrap_or_else(|| panic!("no JPEG of {cam}"))
}

/// The six JPEGs in the model's camera order.
pub fn camera_jpegs() -> Vec<PathBuf> {
    NUSCENES_CAMERAS.iter().map(|c| camera_jpeg(c)).collect()
}

/// The six images decoded, in the model's camera order (decoded once per test binary: the
/// debug-build JPEG decoder is slow).
pub fn images() -> Vec<RgbImage> {
    static IMAGES: std::sync::OnceLock<Vec<RgbImage>> = std::sync::OnceLock::new();
    IMAGES
        .get_or_init(|| camera_jpegs().iter().map(|p| decode_compressed("", &std::fs::read(p).unwrap(), &DecodeLimits::default()).unwrap()).collect())
        .clone()
}

pub fn calib() -> Calibration {
    Calibration::load_nuscenes_json(&data("nuscenes/calib.json"), &NUSCENES_CAMERAS, 1600, 900).unwrap()
}

/// The sweep as upstream's points (x, y, z, intensity, time lag 0).
pub fn sweep5() -> Vec<Point5> {
    let p = nuscenes_sweep();
    (0..p.len()).map(|i| [p.x[i], p.y[i], p.z[i], p.intensity[i], 0.0]).collect()
}

pub fn small(kind: &str) -> PathBuf {
    root().join(format!("tests/data/bevseg/{kind}_small.yaml"))
}

pub fn full(kind: &str) -> PathBuf {
    root().join(format!("config/models/bevfusion_seg_{kind}.yaml"))
}

pub fn config(path: &std::path::Path) -> BevSegConfig {
    BevSegConfig::load(path).unwrap()
}
