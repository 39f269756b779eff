//! Inputs of the BEVFusion seg model tests: the nuScenes frame in tests/data/nuscenes (six
//! 1600 x 900 JPEGs in the model's camera order, calib.json, the sweep) and the model YAMLs.
#![allow(dead_code)]

use crate::common::{data, nuscenes_sweep, root};
use sptr::sensors::calib::camera::{Calibration, NUSCENES_CAMERAS};
use sptr::sensors::image::compressed::decode_compressed;
use sptr::sensors::image::encodings::{DecodeLimits, RgbImage};
use sptr::models::bevfusion::seg::{BevSegConfig, Point5};
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

/// Byte offset of a JPEG's first `FF code` marker.
fn marker_at(jpeg: &[u8], code: u8) -> usize {
    jpeg.windows(2).position(|w| w == [0xFF, code]).unwrap_or_else(|| panic!("no marker 0xFF{code:02X}"))
}

/// The JPEG with its luma component pointing at quantization table 3, which it does not have:
/// every marker still reads (the headers' checks pass), the decoders refuse the data.
pub fn with_missing_quant_table(jpeg: &mut [u8]) {
    let sof = marker_at(jpeg, 0xC0);
    // FF C0, length (2), precision, height (2), width (2), count, then (id, sampling, table)
    jpeg[sof + 12] = 3;
}

/// The JPEG's components renamed 'R', 'G', 'B' (in the frame and the scan header): nvJPEG is
/// not given such a JPEG (`GpuEligibility::NotYcbcr`), zune-jpeg decodes it.
pub fn with_rgb_component_ids(jpeg: &mut [u8]) {
    let sof = marker_at(jpeg, 0xC0);
    let sos = marker_at(jpeg, 0xDA);
    for (k, id) in [b'R', b'G', b'B'].into_iter().enumerate() {
        jpeg[sof + 10 + 3 * k] = id;
        jpeg[sos + 5 + 2 * k] = id;
    }
}

/// The node's camera branch for the six nuScenes cameras with the sample calibration file, one
/// sweep, 0.12 s sync window; JPEGs left to the model when `defer_jpeg`.
pub fn nuscenes_branch(defer_jpeg: bool) -> sptr::frame::cameras::CameraBranch {
    use sptr::frame::cameras::{BranchConfig, CameraBranch};
    let file = sptr::sensors::calib::file::CalibrationFile::load(&root().join("config/calibration/nuscenes_sample.yaml"))
        .expect("config/calibration/nuscenes_sample.yaml");
    let mut b = CameraBranch::new(BranchConfig {
        names: NUSCENES_CAMERAS.iter().map(|s| s.to_string()).collect(),
        use_projection: vec![false; 6],
        max_camera_lidar_delay_s: 0.12,
        sweeps: 1,
        odom_frame: "odom".into(),
        calibration_file: Some(file),
        max_distortion: 1e-3,
    })
    .expect("the nuScenes branch");
    b.set_defer_jpeg(defer_jpeg);
    b
}
