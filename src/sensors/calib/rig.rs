//! The camera rig's calibration as it stands at each frame: per camera the intrinsics from its
//! latest valid CameraInfo (`K`, or `P` for rectified images), else from the calibration file;
//! the camera → LiDAR extrinsic from TF (camera frame = the CameraInfo's `frame_id`, LiDAR frame
//! = the cloud's), else from the calibration file.
//!
//! [`CalibrationRig::resolve`] gives a [`Calibration`] of every camera, in camera order, for
//! each frame. A camera without intrinsics or extrinsic gets a placeholder entry (identity
//! extrinsic, a nominal pinhole) and is reported `uncalibrated`: the frame masks it out, and the
//! network's camera count stays fixed. A calibration that differs from the previous frame's is
//! counted as a change; the LSS geometry is cached per [`Calibration`]
//! (the view transform's geometry cache) and rebuilt exactly then, without a restart.

use crate::msgs::cdr::CameraInfo;
use crate::sensors::calib::camera::{CameraCalib, Calibration, Mat3};
use crate::sensors::calib::file::{camera_info_intrinsics, CalibrationFile};
use crate::sensors::calib::tf::{TfBuffer, IDENTITY};
use crate::Error;

/// Where a camera's extrinsic came from this frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtrinsicSource {
    Tf,
    File,
}

/// A camera's calibration state this frame.
#[derive(Debug, Clone, PartialEq)]
pub enum CameraCalibState {
    /// Usable: intrinsics from CameraInfo (`from_camera_info`) or the file, extrinsic from `source`.
    Ready { source: ExtrinsicSource, from_camera_info: bool },
    /// Masked: why (no CameraInfo and none in the file, no TF and not in the file, invalid).
    Uncalibrated(String),
    /// Masked: its latest CameraInfo (intrinsics from `K`) has lens distortion beyond the
    /// tolerance; why, with what to do.
    Distorted(String),
}

impl CameraCalibState {
    pub fn is_ready(&self) -> bool {
        matches!(self, CameraCalibState::Ready { .. })
    }

    /// For diagnostics: `tf`, `file`, or `uncalibrated: <why>`.
    pub fn describe(&self) -> String {
        match self {
            CameraCalibState::Ready { source: ExtrinsicSource::Tf, from_camera_info } => {
                format!("extrinsic from tf, intrinsics from {}", if *from_camera_info { "camera_info" } else { "file" })
            }
            CameraCalibState::Ready { source: ExtrinsicSource::File, from_camera_info } => {
                format!("extrinsic from file, intrinsics from {}", if *from_camera_info { "camera_info" } else { "file" })
            }
            CameraCalibState::Uncalibrated(why) => format!("uncalibrated: {why}"),
            CameraCalibState::Distorted(why) => format!("distorted: {why}"),
        }
    }
}

/// What a camera's CameraInfo gave.
#[derive(Debug, Clone, PartialEq)]
struct Intrinsics {
    k: Mat3,
    width: usize,
    height: usize,
    frame_id: String,
    /// Why the camera's images cannot be used as they are (lens distortion beyond the
    /// tolerance), if so.
    distorted: Option<String>,
}

/// One frame's calibration.
#[derive(Debug, Clone, PartialEq)]
pub struct RigFrame {
    pub calibration: Calibration,
    /// Per camera, in camera order.
    pub states: Vec<CameraCalibState>,
    /// The calibration differs from the previous frame's (true for the first frame).
    pub changed: bool,
}

/// The cameras' calibration sources and the last calibration handed out.
#[derive(Debug, Clone)]
pub struct CalibrationRig {
    names: Vec<String>,
    /// Per camera: read `P` instead of `K` (rectified images).
    use_projection: Vec<bool>,
    file: Option<CalibrationFile>,
    /// The largest |d| of a CameraInfo read through `K` that still counts as undistorted.
    max_distortion: f64,
    intrinsics: Vec<Option<Intrinsics>>,
    current: Option<Calibration>,
    changes: u64,
}

/// The raw size a placeholder camera gets when nothing else is known (nuScenes').
pub(crate) const PLACEHOLDER_SIZE: (usize, usize) = (1600, 900);

impl CalibrationRig {
    /// `names` in camera order, `use_projection` per camera, the optional calibration file, the
    /// distortion tolerance ([`distortion_problem`]). Errors when the lists differ in length or
    /// the tolerance is negative or not finite.
    pub fn new(names: &[String], use_projection: &[bool], file: Option<CalibrationFile>, max_distortion: f64) -> Result<Self, Error> {
        if names.len() != use_projection.len() {
            return Err(Error::InvalidInput(format!("{} cameras but {} intrinsics choices", names.len(), use_projection.len())));
        }
        if !(max_distortion.is_finite() && max_distortion >= 0.0) {
            return Err(Error::InvalidInput(format!("max_distortion {max_distortion} must be zero or positive")));
        }
        Ok(CalibrationRig {
            names: names.to_vec(),
            use_projection: use_projection.to_vec(),
            file,
            max_distortion,
            intrinsics: vec![None; names.len()],
            current: None,
            changes: 0,
        })
    }

    /// Takes camera `cam`'s CameraInfo. An invalid one (K/P not a pinhole matrix of its image:
    /// [`check_intrinsics`](crate::sensors::calib::camera::check_intrinsics); zero size, empty frame id) is an
    /// error and leaves the camera's previous intrinsics in place.
    pub fn set_camera_info(&mut self, cam: usize, info: &CameraInfo) -> Result<(), Error> {
        let name = self.names.get(cam).ok_or_else(|| Error::InvalidInput(format!("no camera {cam}")))?.clone();
        let k = camera_info_intrinsics(&info.k, &info.p, self.use_projection[cam])?;
        let (w, h) = (info.width as usize, info.height as usize);
        if info.header.frame_id.is_empty() {
            return Err(Error::InvalidInput(format!("camera `{name}`: CameraInfo has an empty frame_id (TF needs the camera's frame)")));
        }
        // Validate as a camera with a neutral extrinsic: K, size.
        CameraCalib::new(&name, k, IDENTITY, w, h)?;
        // A rectified image (intrinsics from P) has no distortion left, whatever `d` says: the
        // CameraInfo of `image_rect` carries the raw camera's coefficients.
        let distorted = if self.use_projection[cam] { None } else { distortion_problem(info, self.max_distortion) };
        self.intrinsics[cam] = Some(Intrinsics { k, width: w, height: h, frame_id: info.header.frame_id.clone(), distorted });
        Ok(())
    }

    /// Camera `cam`'s frame id (from its CameraInfo), when known.
    pub fn frame_id(&self, cam: usize) -> Option<&str> {
        self.intrinsics.get(cam)?.as_ref().map(|i| i.frame_id.as_str())
    }

    /// Calibration changes seen (not counting the first calibration).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The calibration for a cloud in `lidar_frame`, with `tf` as it stands.
    pub fn resolve(&mut self, lidar_frame: &str, tf: &TfBuffer) -> RigFrame {
        let mut states = Vec::with_capacity(self.names.len());
        let mut cams: Vec<Option<CameraCalib>> = Vec::with_capacity(self.names.len());
        for (i, name) in self.names.iter().enumerate() {
            let file_cam = self.file.as_ref().and_then(|f| f.camera(name));
            if let Some(why) = self.intrinsics[i].as_ref().and_then(|x| x.distorted.clone()) {
                states.push(CameraCalibState::Distorted(why));
                cams.push(None);
                continue;
            }
            let (k, w, h, from_info) = match (&self.intrinsics[i], file_cam.and_then(|c| c.intrinsics)) {
                (Some(x), _) => (x.k, x.width, x.height, true),
                (None, Some((k, w, h))) => (k, w, h, false),
                (None, None) => {
                    states.push(CameraCalibState::Uncalibrated("no CameraInfo yet and no intrinsics in the calibration file".into()));
                    cams.push(None);
                    continue;
                }
            };
            let tf_result = match self.intrinsics[i].as_ref().map(|x| x.frame_id.as_str()) {
                Some(frame) if !lidar_frame.is_empty() => tf.lookup(lidar_frame, frame).map_err(|e| e.to_string()),
                Some(_) => Err("the cloud has an empty frame_id".to_string()),
                None => Err("no CameraInfo (its frame_id names the camera's TF frame)".to_string()),
            };
            let (c2l, source) = match (tf_result, file_cam) {
                (Ok(m), _) => (m, ExtrinsicSource::Tf),
                (Err(_), Some(f)) => (f.camera_to_lidar, ExtrinsicSource::File),
                (Err(e), None) => {
                    states.push(CameraCalibState::Uncalibrated(format!("no extrinsic: {e}; and not in the calibration file")));
                    cams.push(None);
                    continue;
                }
            };
            match CameraCalib::new(name, k, c2l, w, h) {
                Ok(c) => {
                    states.push(CameraCalibState::Ready { source, from_camera_info: from_info });
                    cams.push(Some(c));
                }
                Err(e) => {
                    states.push(CameraCalibState::Uncalibrated(e.to_string()));
                    cams.push(None);
                }
            }
        }
        let size = cams.iter().flatten().map(|c| (c.image_width, c.image_height)).next().unwrap_or(PLACEHOLDER_SIZE);
        let cameras: Vec<CameraCalib> = cams
            .into_iter()
            .zip(&self.names)
            .map(|(c, name)| c.unwrap_or_else(|| placeholder_camera(name, size)))
            .collect();
        let calibration = Calibration { cameras };
        let changed = self.current.as_ref() != Some(&calibration);
        if changed {
            if self.current.is_some() {
                self.changes += 1;
            }
            self.current = Some(calibration.clone());
        }
        RigFrame { calibration, states, changed }
    }
}

/// Why a camera with this CameraInfo, read through `K`, cannot be used as it is: a distortion
/// coefficient beyond `max` in magnitude (or not finite). BEVFusion's geometry projects through
/// a pinhole, so a distorted image's pixels would be lifted along the wrong rays (with
/// d = [-0.4, 0.2, ...] a 1600-wide image's corners move by about a hundred pixels); sptr does
/// not undistort, it asks for rectified images. `None` when every |d| <= `max` (an empty `d`
/// too).
pub fn distortion_problem(info: &CameraInfo, max: f64) -> Option<String> {
    let beyond = info.d.iter().any(|v| !(v.abs() <= max));
    if !beyond {
        return None;
    }
    let model = if info.distortion_model.is_empty() { "no model named".to_string() } else { info.distortion_model.clone() };
    Some(format!(
        "CameraInfo has lens distortion d = {:?} ({model}), beyond camera.max_distortion = {max}: the BEV model \
         assumes pinhole images. Feed rectified images (the camera's image_rect topic) with camera.intrinsics: P, \
         or raise camera.max_distortion if this distortion is negligible for your lens",
        info.d
    ))
}

/// A well-formed camera that is never pooled (its mask bit is off): a nominal pinhole looking
/// along its own z, at the LiDAR origin.
pub(crate) fn placeholder_camera(name: &str, (w, h): (usize, usize)) -> CameraCalib {
    let f = w.max(1) as f64;
    CameraCalib {
        name: name.to_string(),
        intrinsics: [[f, 0.0, w as f64 / 2.0], [0.0, f, h as f64 / 2.0], [0.0, 0.0, 1.0]],
        camera_to_lidar: IDENTITY,
        image_width: w.max(1),
        image_height: h.max(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::cdr::{CdrMessage, Header, TfMessage, Time, TransformStamped};
    use crate::sensors::calib::camera::Mat4;

    fn info(frame: &str, fx: f64) -> CameraInfo {
        let mut c = CameraInfo { header: Header { stamp: Time::default(), frame_id: frame.into() }, width: 1600, height: 900, ..Default::default() };
        c.k = [fx, 0.0, 800.0, 0.0, fx, 450.0, 0.0, 0.0, 1.0];
        c.p = [fx * 0.9, 0.0, 790.0, 0.0, 0.0, fx * 0.9, 440.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        c
    }

    fn tf_msg(child: &str, z: f64) -> TfMessage {
        // camera looking forward (+x of base_link): camera z = base x, camera x = -base y
        let q = [-0.5, 0.5, -0.5, 0.5];
        TfMessage {
            transforms: vec![TransformStamped {
                header: Header { stamp: Time::default(), frame_id: "base_link".into() },
                child_frame_id: child.into(),
                translation: [1.5, 0.0, z],
                rotation: q,
            }],
        }
    }

    fn names() -> Vec<String> {
        vec!["CAM_A".into(), "CAM_B".into()]
    }

    #[test]
    fn tf_then_file_then_uncalibrated_and_changes_are_detected() {
        let id = "[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]";
        let file = CalibrationFile::parse(&format!("cameras:\n  CAM_B:\n    camera_to_lidar: {id}\n"), "f.yaml").unwrap();
        let mut rig = CalibrationRig::new(&names(), &[false, true], Some(file), 1e-3).unwrap();
        let mut tf = TfBuffer::new();
        tf.add_message(&tf_msg("base_link_lidar_dummy", 0.0), true);
        // nothing yet: both placeholders, both uncalibrated
        let f0 = rig.resolve("lidar", &tf);
        assert!(f0.changed && f0.states.iter().all(|s| !s.is_ready()), "{:?}", f0.states);
        assert_eq!(f0.calibration.len(), 2);
        // CameraInfos in; TF knows cam_a but not the LiDAR yet: A uncalibrated, B from the file
        rig.set_camera_info(0, &info("cam_a", 1000.0)).unwrap();
        rig.set_camera_info(1, &info("cam_b", 1000.0)).unwrap();
        tf.add_message(&tf_msg("cam_a", 1.0), true);
        let f1 = rig.resolve("lidar", &tf);
        assert!(matches!(&f1.states[0], CameraCalibState::Uncalibrated(w) if w.contains("not connected")), "{:?}", f1.states[0]);
        assert_eq!(f1.states[1], CameraCalibState::Ready { source: ExtrinsicSource::File, from_camera_info: true });
        // B reads P (rectified): fx = 0.9 * 1000
        assert_eq!(f1.calibration.cameras[1].intrinsics[0][0], 900.0);
        assert!(f1.changed);
        // the LiDAR joins the tree: A from TF
        let lidar = TfMessage {
            transforms: vec![TransformStamped {
                header: Header { stamp: Time::default(), frame_id: "base_link".into() },
                child_frame_id: "lidar".into(),
                translation: [0.0, 0.0, 2.0],
                rotation: [0.0, 0.0, 0.0, 1.0],
            }],
        };
        tf.add_message(&lidar, true);
        let f2 = rig.resolve("lidar", &tf);
        assert_eq!(f2.states[0], CameraCalibState::Ready { source: ExtrinsicSource::Tf, from_camera_info: true });
        // camera origin (1.5, 0, 1) in base_link = (1.5, 0, -1) in lidar; optical axis = lidar +x
        let m = f2.calibration.cameras[0].camera_to_lidar;
        assert!((m[0][3] - 1.5).abs() < 1e-12 && (m[2][3] + 1.0).abs() < 1e-12, "{m:?}");
        assert!((m[0][2] - 1.0).abs() < 1e-12, "{m:?}");
        assert!(f2.changed);
        let changes = rig.changes();
        // same inputs: no change
        assert!(!rig.resolve("lidar", &tf).changed);
        assert_eq!(rig.changes(), changes);
        // a calibration change on /tf_static: detected (the geometry cache keys its rebuild on
        // the calibration itself: `GeometryCache`'s own tests)
        let before = rig.resolve("lidar", &tf);
        tf.add_message(&tf_msg("cam_a", 1.2), true);
        let after = rig.resolve("lidar", &tf);
        assert!(after.changed);
        assert_ne!(before.calibration, after.calibration);
        assert_eq!(rig.changes(), changes + 1);
    }

    /// A rotation matrix as a unit quaternion `[x, y, z, w]` (Shepperd's method: the largest of
    /// w, x, y, z first, so no division by a small number): what a TF publisher of these
    /// extrinsics computes.
    fn quaternion(m: &Mat4) -> [f64; 4] {
        let (m00, m11, m22) = (m[0][0], m[1][1], m[2][2]);
        let tr = m00 + m11 + m22;
        if tr > m00.max(m11).max(m22) {
            let s = (1.0 + tr).sqrt() * 2.0; // 4w
            [(m[2][1] - m[1][2]) / s, (m[0][2] - m[2][0]) / s, (m[1][0] - m[0][1]) / s, s / 4.0]
        } else if m00 >= m11 && m00 >= m22 {
            let s = (1.0 + m00 - m11 - m22).sqrt() * 2.0; // 4x
            [s / 4.0, (m[0][1] + m[1][0]) / s, (m[0][2] + m[2][0]) / s, (m[2][1] - m[1][2]) / s]
        } else if m11 >= m22 {
            let s = (1.0 + m11 - m00 - m22).sqrt() * 2.0; // 4y
            [(m[0][1] + m[1][0]) / s, s / 4.0, (m[1][2] + m[2][1]) / s, (m[0][2] - m[2][0]) / s]
        } else {
            let s = (1.0 + m22 - m00 - m11).sqrt() * 2.0; // 4z
            [(m[0][2] + m[2][0]) / s, (m[1][2] + m[2][1]) / s, s / 4.0, (m[1][0] - m[0][1]) / s]
        }
    }

    fn edge(parent: &str, child: &str, m: &Mat4) -> TransformStamped {
        TransformStamped {
            header: Header { stamp: Time::default(), frame_id: parent.into() },
            child_frame_id: child.into(),
            translation: [m[0][3], m[1][3], m[2][3]],
            rotation: quaternion(m),
        }
    }

    /// The nuScenes sample rig as a TF tree, the way a robot publishes it on `/tf_static`:
    /// `base_link → lidar_top` (calib.json's lidar2ego) and `base_link → cam_*` (lidar2ego ·
    /// camera_to_lidar, so the chain reproduces the frame's lidar2cam). With the calibration
    /// file loaded too, TF wins for every camera, and the chained camera → LiDAR transform equals
    /// the file's within 1e-5 (the inputs are f32 values: a rotation orthonormal to ~1e-7, through
    /// a quaternion and back). A cloud in a frame TF does not connect falls back to the file.
    #[test]
    fn nuscenes_rig_from_tf_wins_over_the_file_and_falls_back_to_it() {
        use crate::sensors::calib::camera::NUSCENES_CAMERAS;
        use crate::sensors::calib::tf::mat4_mul;
        let root = crate::repo_root();
        let file = CalibrationFile::load(&root.join("config/calibration/nuscenes_sample.yaml")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("tests/data/nuscenes/calib.json")).unwrap()).unwrap();
        let l2e: Mat4 = serde_json::from_value(json["lidar"]["lidar2ego"].clone()).unwrap();
        let names: Vec<String> = NUSCENES_CAMERAS.iter().map(|s| s.to_string()).collect();
        let mut rig = CalibrationRig::new(&names, &[false; 6], Some(file.clone()), 1e-3).unwrap();
        let mut transforms = vec![edge("base_link", "lidar_top", &l2e)];
        for (i, name) in names.iter().enumerate() {
            let frame = name.to_lowercase();
            let c2e = mat4_mul(&l2e, &file.camera(name).unwrap().camera_to_lidar);
            transforms.push(edge("base_link", &frame, &c2e));
            let mut ci = info(&frame, 1000.0);
            let (k, _, _) = file.camera(name).unwrap().intrinsics.unwrap();
            ci.k = [k[0][0], k[0][1], k[0][2], k[1][0], k[1][1], k[1][2], k[2][0], k[2][1], k[2][2]];
            rig.set_camera_info(i, &ci).unwrap();
        }
        let mut tf = TfBuffer::new();
        // through CDR, as the node receives it
        let bytes = TfMessage { transforms }.to_cdr(true).unwrap();
        assert!(tf.add_message(&TfMessage::from_cdr(&bytes).unwrap(), true).is_empty());

        let f = rig.resolve("lidar_top", &tf);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(f.states[i], CameraCalibState::Ready { source: ExtrinsicSource::Tf, from_camera_info: true }, "{name}");
            let (got, want) = (f.calibration.cameras[i].camera_to_lidar, file.camera(name).unwrap().camera_to_lidar);
            let err = (0..3).flat_map(|r| (0..4).map(move |c| (r, c))).map(|(r, c)| (got[r][c] - want[r][c]).abs()).fold(0.0, f64::max);
            assert!(err < 1e-5, "{name}: TF chain differs from the file by {err}\n{got:?}\n{want:?}");
        }
        // The TF values are not bit-identical to the file's: which one was used is observable.
        assert_ne!(f.calibration.cameras[0].camera_to_lidar, file.camera("CAM_FRONT").unwrap().camera_to_lidar);

        // a cloud in a frame TF does not connect: every camera from the file, exactly
        let g = rig.resolve("velodyne", &tf);
        for (i, name) in names.iter().enumerate() {
            assert_eq!(g.states[i], CameraCalibState::Ready { source: ExtrinsicSource::File, from_camera_info: true }, "{name}");
            assert_eq!(g.calibration.cameras[i].camera_to_lidar, file.camera(name).unwrap().camera_to_lidar);
        }
        assert!(g.changed);
    }

    #[test]
    fn bad_camera_infos_are_errors_and_keep_the_previous_intrinsics() {
        let mut rig = CalibrationRig::new(&names(), &[false, false], None, 1e-3).unwrap();
        rig.set_camera_info(0, &info("cam_a", 1000.0)).unwrap();
        for (bad, needle) in [
            (info("cam_a", 0.0), "focal"),
            (info("", 1000.0), "frame_id"),
            (CameraInfo { width: 0, ..info("cam_a", 1000.0) }, "image size"),
        ] {
            let e = rig.set_camera_info(0, &bad).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        assert_eq!(rig.frame_id(0), Some("cam_a"));
        assert!(rig.set_camera_info(7, &info("x", 1.0)).is_err());
        // intrinsics but no extrinsic anywhere: uncalibrated with the reason
        let f = rig.resolve("lidar", &TfBuffer::new());
        assert!(f.states[0].describe().contains("uncalibrated") && f.states[0].describe().contains("no extrinsic"), "{:?}", f.states[0]);
        assert!(f.states[1].describe().contains("no CameraInfo"), "{:?}", f.states[1]);
        assert!(CalibrationRig::new(&names(), &[false], None, 1e-3).is_err());
        assert!(CalibrationRig::new(&names(), &[false, false], None, -1.0).is_err());
        assert!(CalibrationRig::new(&names(), &[false, false], None, f64::NAN).is_err());
    }
}
