//! The calibration file (node parameter `calibration_file`, `sptr replay --calibration`): the
//! camera → LiDAR extrinsics to use where TF does not connect a camera's frame to the cloud's,
//! and intrinsics for a camera until (or unless) its CameraInfo arrives. YAML:
//!
//! ```yaml
//! cameras:
//!   CAM_FRONT:                      # a name of the `cameras` parameter
//!     # the extrinsic, exactly one of (4 x 4, row-major, last row [0, 0, 0, 1]):
//!     camera_to_lidar: [[...], [...], [...], [0, 0, 0, 1]]   # BEVFusion's camera2lidar
//!     lidar_to_camera: [[...], [...], [...], [0, 0, 0, 1]]   # nuScenes' lidar2cam
//!     # optional, both or neither: used while the camera has no (valid) CameraInfo
//!     intrinsics: [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]
//!     image_size: [1600, 900]       # width, height of the raw image
//! ```
//!
//! Unknown keys are errors (a misspelt `lidar2camera` must not be ignored). Every matrix is
//! validated as [`CameraCalib::new`] validates it; errors name the file and the camera.
//! `config/calibration/nuscenes_sample.yaml` is the nuScenes sample frame's file.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::sensors::calib::camera::{intrinsics_from_k, mat4_inverse_affine, CameraCalib, Calibration, Mat3, Mat4, NUSCENES_CAMERAS};
use crate::Error;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileYaml {
    cameras: BTreeMap<String, CameraYaml>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
struct CameraYaml {
    camera_to_lidar: Option<Mat4>,
    lidar_to_camera: Option<Mat4>,
    intrinsics: Option<Mat3>,
    image_size: Option<[usize; 2]>,
}

/// One camera of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileCamera {
    pub camera_to_lidar: Mat4,
    /// `(K, width, height)`, when the file gives them.
    pub intrinsics: Option<(Mat3, usize, usize)>,
}

/// A parsed, validated calibration file.
#[derive(Debug, Clone, PartialEq)]
pub struct CalibrationFile {
    pub source: String,
    pub cameras: BTreeMap<String, FileCamera>,
}

impl CalibrationFile {
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io(format!("calibration file {}: cannot read: {e}", path.display())))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses and validates the YAML `text`; `source` names it in errors.
    pub fn parse(text: &str, source: &str) -> Result<Self, Error> {
        let y: FileYaml = serde_yaml::from_str(text).map_err(|e| Error::InvalidInput(format!("calibration file {source}: {e}")))?;
        let mut cameras = BTreeMap::new();
        for (name, c) in y.cameras {
            let what = |s: &str| format!("calibration file {source}: camera `{name}`: {s}");
            let c2l = match (c.camera_to_lidar, c.lidar_to_camera) {
                (Some(m), None) => m,
                (None, Some(l2c)) => mat4_inverse_affine(&l2c, &what("lidar_to_camera"))?,
                _ => return Err(Error::InvalidInput(what("give exactly one of `camera_to_lidar` and `lidar_to_camera`"))),
            };
            let intrinsics = match (c.intrinsics, c.image_size) {
                (Some(k), Some([w, h])) => Some((k, w, h)),
                (None, None) => None,
                _ => return Err(Error::InvalidInput(what("give both `intrinsics` and `image_size`, or neither"))),
            };
            // Validate as a camera (a placeholder K where the file has none).
            let (k, w, h) = intrinsics.unwrap_or(([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]], 1, 1));
            CameraCalib::new(&name, k, c2l, w, h).map_err(|e| Error::InvalidInput(format!("calibration file {source}: {e}")))?;
            cameras.insert(name, FileCamera { camera_to_lidar: c2l, intrinsics });
        }
        Ok(CalibrationFile { source: source.to_string(), cameras })
    }

    pub fn camera(&self, name: &str) -> Option<&FileCamera> {
        self.cameras.get(name)
    }
}

/// nuScenes' raw camera image size, what its calib.json's `cam2img` is for.
pub const NUSCENES_IMAGE_SIZE: (usize, usize) = (1600, 900);

/// Whether `path` names a calibration YAML (`.yaml` / `.yml`) rather than a nuScenes calib.json.
pub fn is_calibration_yaml(path: &Path) -> bool {
    path.extension().and_then(|e| e.to_str()).is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

/// A rig's calibration from a file alone, for the commands that have no CameraInfo and no TF
/// (`sptr bevseg`, `sptr bench bevseg`): a calibration YAML with `intrinsics` and `image_size`
/// for every camera (any names, any count, any image size; nuScenes' six in nuScenes order,
/// others in name order), or else a nuScenes `calib.json` (its six cameras) whose intrinsics are
/// for `json_image_size`.
pub fn calibration_from_file(path: &Path, json_image_size: (usize, usize)) -> Result<Calibration, Error> {
    if !is_calibration_yaml(path) {
        let (w, h) = json_image_size;
        return Calibration::load_nuscenes_json(path, &NUSCENES_CAMERAS, w, h);
    }
    let source = path.display().to_string();
    let file = CalibrationFile::load(path)?;
    if file.cameras.is_empty() {
        return Err(Error::InvalidInput(format!("calibration file {source}: no camera: list the rig's cameras under `cameras:`")));
    }
    let names: Vec<&str> = if file.cameras.len() == NUSCENES_CAMERAS.len() && NUSCENES_CAMERAS.iter().all(|n| file.cameras.contains_key(*n)) {
        NUSCENES_CAMERAS.to_vec()
    } else {
        file.cameras.keys().map(String::as_str).collect()
    };
    let mut cams = Vec::with_capacity(names.len());
    for name in names {
        let c = file.camera(name).ok_or_else(|| Error::InvalidInput(format!("calibration file {source}: no camera `{name}`")))?;
        let (k, w, h) = c.intrinsics.ok_or_else(|| {
            Error::InvalidInput(format!(
                "calibration file {source}: camera `{name}` has no `intrinsics` and `image_size`: without CameraInfo messages they come from the file alone, so give both"
            ))
        })?;
        cams.push(CameraCalib::new(name, k, c.camera_to_lidar, w, h).map_err(|e| Error::InvalidInput(format!("calibration file {source}: {e}")))?);
    }
    Calibration::new(cams)
}

/// `K` from a CameraInfo: its `k`, or its projection `p` for a rectified image
/// (`intrinsics: p` in the camera's parameters). Checks nothing beyond the shape: the camera's
/// calibration ([`CameraCalib::new`]) checks K against its image size, field by field.
pub fn camera_info_intrinsics(k: &[f64; 9], p: &[f64; 12], use_projection: bool) -> Result<Mat3, Error> {
    if use_projection {
        crate::sensors::calib::camera::intrinsics_from_projection(p)
    } else {
        intrinsics_from_k(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sensors::calib::camera::{Calibration, NUSCENES_CAMERAS};

    fn root() -> std::path::PathBuf {
        crate::repo_root()
    }

    /// The committed file of the sample frame holds calib.json's extrinsics and intrinsics: the
    /// calibration built from it equals the one built from calib.json, to 1e-12 relative (the
    /// JSON loader's float parsing is not correctly rounded: 491.50706579294757 becomes the next
    /// double down; the YAML parser's is).
    #[test]
    fn nuscenes_sample_file_matches_calib_json() {
        let f = CalibrationFile::load(&root().join("config/calibration/nuscenes_sample.yaml")).unwrap();
        let json = Calibration::load_nuscenes_json(&root().join("tests/data/nuscenes/calib.json"), &NUSCENES_CAMERAS, 1600, 900).unwrap();
        assert_eq!(f.cameras.len(), 6);
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(1.0);
        for cam in &json.cameras {
            let c = f.camera(&cam.name).unwrap();
            let (k, w, h) = c.intrinsics.unwrap();
            assert_eq!((w, h), (1600, 900));
            assert!(k.iter().flatten().zip(cam.intrinsics.iter().flatten()).all(|(a, b)| close(*a, *b)), "{}: {k:?}", cam.name);
            let m = &c.camera_to_lidar;
            assert!(m.iter().flatten().zip(cam.camera_to_lidar.iter().flatten()).all(|(a, b)| close(*a, *b)), "{}: {m:?}", cam.name);
        }
    }

    #[test]
    fn bad_files_are_clear_errors() {
        let id = "[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]";
        let k = "[[1000, 0, 800], [0, 1000, 450], [0, 0, 1]]";
        let ok = format!("cameras:\n  A:\n    camera_to_lidar: {id}\n    intrinsics: {k}\n    image_size: [1600, 900]\n  B:\n    lidar_to_camera: {id}\n");
        let f = CalibrationFile::parse(&ok, "t.yaml").unwrap();
        assert_eq!(f.camera("B").unwrap().intrinsics, None);
        for (text, needle) in [
            (format!("cameras:\n  A:\n    camera_to_lidar: {id}\n    lidar_to_camera: {id}\n"), "exactly one"),
            ("cameras:\n  A:\n    intrinsics: [[1, 0, 0], [0, 1, 0], [0, 0, 1]]\n".to_string(), "exactly one"),
            (format!("cameras:\n  A:\n    camera_to_lidar: {id}\n    intrinsics: {k}\n"), "both"),
            (format!("cameras:\n  A:\n    lidar2camera: {id}\n"), "lidar2camera"),
            ("cameras:\n  A:\n    camera_to_lidar: [[1, 0, 0], [0, 1, 0]]\n".to_string(), "t.yaml"),
            ("cameras:\n  A:\n    camera_to_lidar: [[2, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]\n".to_string(), "orthonormal"),
            (format!("cameras:\n  A:\n    camera_to_lidar: {id}\n    intrinsics: [[0, 0, 800], [0, 0, 450], [0, 0, 1]]\n    image_size: [1600, 900]\n"), "focal"),
            ("cameras: 3\n".to_string(), "t.yaml"),
        ] {
            let e = CalibrationFile::parse(&text, "t.yaml").unwrap_err().to_string();
            assert!(e.contains(needle) && e.contains("t.yaml"), "{needle}: {e}");
        }
        assert!(CalibrationFile::load(Path::new("/nonexistent/c.yaml")).unwrap_err().to_string().contains("cannot read"));
    }

    #[test]
    fn camera_info_k_or_p() {
        let k = [1000.0, 0.0, 640.0, 0.0, 990.0, 360.0, 0.0, 0.0, 1.0];
        let p = [900.0, 0.0, 600.0, 0.0, 0.0, 890.0, 350.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        assert_eq!(camera_info_intrinsics(&k, &p, false).unwrap()[0][0], 1000.0);
        assert_eq!(camera_info_intrinsics(&k, &p, true).unwrap(), [[900.0, 0.0, 600.0], [0.0, 890.0, 350.0], [0.0, 0.0, 1.0]]);
    }
}
