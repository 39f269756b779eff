//! Camera calibration for the lift-splat view transform: per camera the intrinsics `K`, the
//! camera → LiDAR extrinsic and the raw image size (which fixes the image augmentation of the
//! encoder's resize + crop).
//!
//! A [`Calibration`] compares exactly (`==` on every matrix entry and size): the geometry cache
//! rebuilds when, and only when, the comparison says it changed.
//!
//! Sources: a `sensor_msgs/CameraInfo` (`K`, or `P` with fx = P[0], fy = P[5], cx = P[2],
//! cy = P[6] as autoware_bevfusion reads it) plus a transform, or the nuScenes `calib.json` of
//! the test data (`cam2img`, `lidar2cam`; camera → LiDAR = inv(lidar2cam)).

use crate::Error;
use std::path::Path;

/// Row-major 3×3.
pub type Mat3 = [[f64; 3]; 3];
/// Row-major 4×4 homogeneous transform.
pub type Mat4 = [[f64; 4]; 4];

/// `a · b`, each entry `(a0·b0 + a1·b1) + a2·b2`.
pub fn mat3_mul(a: &Mat3, b: &Mat3) -> Mat3 {
    let mut m = [[0.0; 3]; 3];
    for (i, row) in m.iter_mut().enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            *v = a[i][0] * b[0][j] + a[i][1] * b[1][j] + a[i][2] * b[2][j];
        }
    }
    m
}

/// Inverse by the adjugate; errors when the matrix is singular or not finite. `what` names it.
pub fn mat3_inverse(m: &Mat3, what: &str) -> Result<Mat3, Error> {
    if m.iter().flatten().any(|v| !v.is_finite()) {
        return Err(Error::InvalidInput(format!("{what}: not finite: {m:?}")));
    }
    let c = |r0: usize, r1: usize, c0: usize, c1: usize| m[r0][c0] * m[r1][c1] - m[r0][c1] * m[r1][c0];
    let cof = [
        [c(1, 2, 1, 2), -c(1, 2, 0, 2), c(1, 2, 0, 1)],
        [-c(0, 2, 1, 2), c(0, 2, 0, 2), -c(0, 2, 0, 1)],
        [c(0, 1, 1, 2), -c(0, 1, 0, 2), c(0, 1, 0, 1)],
    ];
    let det = m[0][0] * cof[0][0] + m[0][1] * cof[0][1] + m[0][2] * cof[0][2];
    let scale = m.iter().flatten().fold(0f64, |a, v| a.max(v.abs()));
    // singular relative to the entries' size (a 3x3 with entries ~s has a determinant ~s^3)
    let invertible = det.abs() > 1e-12 * scale.powi(3); // false for NaN too
    if !invertible {
        return Err(Error::InvalidInput(format!("{what}: singular (determinant {det:e}): {m:?}")));
    }
    let mut inv = [[0.0; 3]; 3];
    for (i, row) in inv.iter_mut().enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            *v = cof[j][i] / det;
        }
    }
    Ok(inv)
}

/// Inverse of a homogeneous transform `[R t; 0 1]`: `[R⁻¹, -R⁻¹ t]` (R inverted in general,
/// not transposed, so a slightly non-orthonormal R is inverted exactly as `np.linalg.inv` does).
pub fn mat4_inverse_affine(m: &Mat4, what: &str) -> Result<Mat4, Error> {
    check_affine(m, what)?;
    let r = [[m[0][0], m[0][1], m[0][2]], [m[1][0], m[1][1], m[1][2]], [m[2][0], m[2][1], m[2][2]]];
    let ri = mat3_inverse(&r, what)?;
    let t = [m[0][3], m[1][3], m[2][3]];
    let mut out = [[0.0; 4]; 4];
    for i in 0..3 {
        out[i][..3].copy_from_slice(&ri[i]);
        out[i][3] = -(ri[i][0] * t[0] + ri[i][1] * t[1] + ri[i][2] * t[2]);
    }
    out[3][3] = 1.0;
    Ok(out)
}

fn check_affine(m: &Mat4, what: &str) -> Result<(), Error> {
    if m.iter().flatten().any(|v| !v.is_finite()) {
        return Err(Error::InvalidInput(format!("{what}: not finite: {m:?}")));
    }
    if m[3] != [0.0, 0.0, 0.0, 1.0] {
        return Err(Error::InvalidInput(format!("{what}: last row is {:?}, not [0, 0, 0, 1]", m[3])));
    }
    Ok(())
}

/// One camera's calibration.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraCalib {
    pub name: String,
    /// Pinhole intrinsics `[[fx, s, cx], [0, fy, cy], [0, 0, 1]]` of the raw image.
    pub intrinsics: Mat3,
    /// Camera frame → LiDAR frame (the transform BEVFusion calls `camera2lidar`).
    pub camera_to_lidar: Mat4,
    /// Raw image size in pixels (before the encoder's resize and crop).
    pub image_width: usize,
    pub image_height: usize,
}

impl CameraCalib {
    /// Validates every part: a non-empty image; pinhole intrinsics ([`check_intrinsics`]); a
    /// finite rigid extrinsic (orthonormal rotation within 1e-3, last row `[0, 0, 0, 1]`).
    pub fn new(name: &str, intrinsics: Mat3, camera_to_lidar: Mat4, image_width: usize, image_height: usize) -> Result<Self, Error> {
        let what = |part: &str| format!("camera `{name}`: {part}");
        if image_width == 0 || image_height == 0 {
            return Err(Error::InvalidInput(format!("{}: image size {image_width}x{image_height}", what("image"))));
        }
        check_intrinsics(&intrinsics, image_width, image_height).map_err(|e| Error::InvalidInput(format!("{}: {e}", what("intrinsics"))))?;
        check_affine(&camera_to_lidar, &what("camera-to-LiDAR extrinsic"))?;
        let r = |i: usize, j: usize| camera_to_lidar[i][j];
        for i in 0..3 {
            for j in 0..3 {
                let dot = r(0, i) * r(0, j) + r(1, i) * r(1, j) + r(2, i) * r(2, j);
                let want = if i == j { 1.0 } else { 0.0 };
                if (dot - want).abs() > 1e-3 {
                    return Err(Error::InvalidInput(format!(
                        "{}: rotation is not orthonormal (column {i} · column {j} = {dot}): {camera_to_lidar:?}",
                        what("camera-to-LiDAR extrinsic")
                    )));
                }
            }
        }
        Ok(Self { name: name.to_string(), intrinsics, camera_to_lidar, image_width, image_height })
    }

    /// From a LiDAR → camera transform (nuScenes `lidar2cam`, or a TF lookup the other way round).
    pub fn from_lidar_to_camera(name: &str, intrinsics: Mat3, lidar_to_camera: &Mat4, image_width: usize, image_height: usize) -> Result<Self, Error> {
        let c2l = mat4_inverse_affine(lidar_to_camera, &format!("camera `{name}`: LiDAR-to-camera extrinsic"))?;
        Self::new(name, intrinsics, c2l, image_width, image_height)
    }
}

/// "W x H image" in messages, formatted only when a message is made.
struct SizeText(usize, usize);

impl std::fmt::Display for SizeText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} x {} image", self.0, self.1)
    }
}

/// The entries of `K` by row-major index, as a user knows them from a CameraInfo (`k[i]`; `P`
/// holds fx, cx, fy, cy at 0, 2, 5, 6).
const K_FIELDS: [&str; 9] = ["fx (K[0], P[0])", "skew (K[1])", "cx (K[2], P[2])", "K[3]", "fy (K[4], P[5])", "cy (K[5], P[6])", "K[6]", "K[7]", "K[8]"];

/// Checks a pinhole `K = [[fx, s, cx], [0, fy, cy], [0, 0, 1]]` of a `w × h` image, field by
/// field, before anything inverts it: every entry finite; fx, fy positive; |skew| at most fx
/// (pixel axes less than 45° from square); the principal point (cx, cy) within [-w, 2w] ×
/// [-h, 2h]; K[3] = 0 and the bottom row [0, 0, 1]. The principal point is where the optical
/// axis meets the image: at the centre for most lenses, off it for a crop or a shifted sensor,
/// but never more than an image's size beyond the border, where the image would see only
/// rays more than ~45° off its own axis (with fx near the image width). Further out it is K of
/// another image size, or not in pixels at all, and the lift would be silently wrong. Errors
/// name the field, its value, the image size and what was expected.
pub fn check_intrinsics(k: &Mat3, w: usize, h: usize) -> Result<(), String> {
    let size = SizeText(w, h);
    // (runs for every camera of every frame: no allocation here until something is wrong)
    if let Some(i) = k.iter().flatten().position(|v| !v.is_finite()) {
        return Err(format!("{} is {} (for a {size}); every entry of K must be finite", K_FIELDS[i], k[i / 3][i % 3]));
    }
    let (fx, s, cx, fy, cy) = (k[0][0], k[0][1], k[0][2], k[1][1], k[1][2]);
    for (i, v) in [(0, fx), (4, fy)] {
        if v <= 0.0 {
            return Err(format!(
                "{} is {v} (for a {size}); focal lengths must be positive, in pixels (a zero K or P means an uncalibrated camera)",
                K_FIELDS[i]
            ));
        }
    }
    if s.abs() > fx {
        return Err(format!("{} is {s} with fx {fx} (for a {size}); expected |skew| <= fx, usually 0", K_FIELDS[1]));
    }
    // The principal point within [-side, 2 side] of its axis: well off-centre lenses pass, a K
    // for another image size or in other units does not.
    let centre = |field: &str, v: f64, side: usize| {
        let side = side as f64;
        if (-side..=2.0 * side).contains(&v) {
            return Ok(());
        }
        Err(format!(
            "{field} is {v}, outside [{}, {}] for a {size}; expected near the image centre ({}): is K for another image size, or not in pixels?",
            -side,
            2.0 * side,
            side / 2.0
        ))
    };
    centre(K_FIELDS[2], cx, w)?;
    centre(K_FIELDS[5], cy, h)?;
    if k[1][0] != 0.0 {
        return Err(format!("{} is {} (for a {size}); expected 0 (K is upper triangular)", K_FIELDS[3], k[1][0]));
    }
    if k[2] != [0.0, 0.0, 1.0] {
        return Err(format!("the bottom row (K[6..9]) is {:?} (for a {size}); expected [0, 0, 1]", k[2]));
    }
    // K is now triangular with a positive diagonal: invertible in exact arithmetic; what is
    // left is a focal length so small next to cx, cy that the inverse is all rounding
    mat3_inverse(k, "K").map_err(|_| format!("fx {fx} and fy {fy} are too small next to the principal point ({cx}, {cy}) of a {size} to invert K accurately; expected focal lengths in pixels"))?;
    Ok(())
}

/// `K` from a CameraInfo's row-major `k` (9 values).
pub fn intrinsics_from_k(k: &[f64]) -> Result<Mat3, Error> {
    if k.len() != 9 {
        return Err(Error::InvalidInput(format!("CameraInfo K has {} values, not 9", k.len())));
    }
    finite_values(k, "K")?;
    Ok([[k[0], k[1], k[2]], [k[3], k[4], k[5]], [k[6], k[7], k[8]]])
}

/// `K` from a CameraInfo's row-major projection `p` (12 values): fx = P[0], fy = P[5],
/// cx = P[2], cy = P[6], no skew (autoware_bevfusion's reading; P of a rectified image).
pub fn intrinsics_from_projection(p: &[f64]) -> Result<Mat3, Error> {
    if p.len() != 12 {
        return Err(Error::InvalidInput(format!("CameraInfo P has {} values, not 12", p.len())));
    }
    finite_values(p, "P")?;
    Ok([[p[0], 0.0, p[2]], [0.0, p[5], p[6]], [0.0, 0.0, 1.0]])
}

/// A CameraInfo matrix with a NaN or infinite entry is refused (the geometry would be NaN).
fn finite_values(m: &[f64], what: &str) -> Result<(), Error> {
    match m.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(Error::InvalidInput(format!("CameraInfo {what}[{i}] is {}: the camera driver published a broken calibration", m[i]))),
        None => Ok(()),
    }
}

/// Every camera of a frame, in the order the network sees them.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    pub cameras: Vec<CameraCalib>,
}

/// nuScenes camera order (BEVFusion's data pipeline).
pub const NUSCENES_CAMERAS: [&str; 6] = ["CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"];

fn json_matrix<const R: usize, const C: usize>(v: &serde_json::Value, what: &str) -> Result<[[f64; C]; R], Error> {
    let rows = v.as_array().filter(|r| r.len() == R).ok_or_else(|| Error::InvalidInput(format!("{what}: not a {R}x{C} matrix")))?;
    let mut m = [[0.0; C]; R];
    for (i, row) in rows.iter().enumerate() {
        let vals = row.as_array().filter(|r| r.len() == C).ok_or_else(|| Error::InvalidInput(format!("{what}: row {i} does not have {C} numbers")))?;
        for (j, x) in vals.iter().enumerate() {
            m[i][j] = x.as_f64().ok_or_else(|| Error::InvalidInput(format!("{what}: entry ({i}, {j}) is not a number")))?;
        }
    }
    Ok(m)
}

impl Calibration {
    pub fn new(cameras: Vec<CameraCalib>) -> Result<Self, Error> {
        if cameras.is_empty() {
            return Err(Error::InvalidInput("calibration: no cameras".into()));
        }
        Ok(Self { cameras })
    }

    pub fn len(&self) -> usize {
        self.cameras.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cameras.is_empty()
    }

    /// The cameras `names` (in that order) of a nuScenes-style `calib.json` text: an object
    /// `cameras` whose members have `cam2img` (3×3) and `lidar2cam` (4×4). Every camera's raw
    /// image is `width × height` (nuScenes: 1600 × 900).
    pub fn from_nuscenes_json(text: &str, source: &str, names: &[&str], width: usize, height: usize) -> Result<Self, Error> {
        let doc: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::InvalidInput(format!("{source}: not JSON: {e}")))?;
        let cams = doc.get("cameras").ok_or_else(|| Error::InvalidInput(format!("{source}: no `cameras` object")))?;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let c = cams.get(*name).ok_or_else(|| Error::InvalidInput(format!("{source}: no camera `{name}`")))?;
            let field = |f: &str| c.get(f).ok_or_else(|| Error::InvalidInput(format!("{source}: camera `{name}` has no `{f}`")));
            let k: Mat3 = json_matrix(field("cam2img")?, &format!("{source}: {name}.cam2img"))?;
            let l2c: Mat4 = json_matrix(field("lidar2cam")?, &format!("{source}: {name}.lidar2cam"))?;
            out.push(CameraCalib::from_lidar_to_camera(name, k, &l2c, width, height)?);
        }
        Self::new(out)
    }

    /// [`Calibration::from_nuscenes_json`] of a file.
    pub fn load_nuscenes_json(path: &Path, names: &[&str], width: usize, height: usize) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Io(format!("{}: cannot read: {e}", path.display())))?;
        Self::from_nuscenes_json(&text, &path.display().to_string(), names, width, height)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rot_z(deg: f64) -> Mat4 {
        let (s, c) = deg.to_radians().sin_cos();
        [[c, -s, 0.0, 1.0], [s, c, 0.0, -2.0], [0.0, 0.0, 1.0, 0.5], [0.0, 0.0, 0.0, 1.0]]
    }

    const K: Mat3 = [[1266.4, 0.0, 816.3], [0.0, 1266.4, 491.5], [0.0, 0.0, 1.0]];

    #[test]
    fn inverses() {
        let m = [[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 4.0]];
        let i = mat3_inverse(&m, "m").unwrap();
        let p = mat3_mul(&m, &i);
        for (r, row) in p.iter().enumerate() {
            for (c, v) in row.iter().enumerate() {
                assert!((v - if r == c { 1.0 } else { 0.0 }).abs() < 1e-14);
            }
        }
        assert!(mat3_inverse(&[[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]], "m").is_err());
        assert!(mat3_inverse(&[[0.0; 3]; 3], "m").is_err());
        let t = rot_z(30.0);
        let ti = mat4_inverse_affine(&t, "t").unwrap();
        // t · t⁻¹ applied to a point returns it
        let p = [3.0, -1.0, 2.0];
        let q: Vec<f64> = (0..3).map(|r| t[r][0] * p[0] + t[r][1] * p[1] + t[r][2] * p[2] + t[r][3]).collect();
        let back: Vec<f64> = (0..3).map(|r| ti[r][0] * q[0] + ti[r][1] * q[1] + ti[r][2] * q[2] + ti[r][3]).collect();
        for r in 0..3 {
            assert!((back[r] - p[r]).abs() < 1e-13);
        }
    }

    #[test]
    fn camera_validation() {
        assert!(CameraCalib::new("c", K, rot_z(10.0), 1600, 900).is_ok());
        let mut zero = K;
        zero[0][0] = 0.0;
        let e = CameraCalib::new("c", zero, rot_z(10.0), 1600, 900).unwrap_err().to_string();
        assert!(e.contains("focal"), "{e}");
        assert!(CameraCalib::new("c", [[0.0; 3]; 3], rot_z(0.0), 1600, 900).is_err());
        let mut nan = K;
        nan[0][2] = f64::NAN;
        assert!(CameraCalib::new("c", nan, rot_z(0.0), 1600, 900).is_err());
        let mut bottom = K;
        bottom[2][2] = 0.0;
        assert!(CameraCalib::new("c", bottom, rot_z(0.0), 1600, 900).is_err());
        let mut inf = rot_z(0.0);
        inf[1][3] = f64::INFINITY;
        let e = CameraCalib::new("c", K, inf, 1600, 900).unwrap_err().to_string();
        assert!(e.contains("not finite"), "{e}");
        let mut scaled = rot_z(0.0);
        scaled[0][0] = 2.0;
        assert!(CameraCalib::new("c", K, scaled, 1600, 900).is_err());
        let mut last = rot_z(0.0);
        last[3][0] = 1.0;
        assert!(CameraCalib::new("c", K, last, 1600, 900).is_err());
        assert!(CameraCalib::new("c", K, rot_z(0.0), 0, 900).is_err());
        // a LiDAR-to-camera NaN is caught before the inversion
        let mut l2c = rot_z(5.0);
        l2c[0][0] = f64::NAN;
        assert!(CameraCalib::from_lidar_to_camera("c", K, &l2c, 10, 10).is_err());
        assert!(Calibration::new(vec![]).is_err());
    }

    /// Each intrinsics check names the field, its value, the image size and what is expected,
    /// before any inversion (a far-off principal point is not called singular).
    #[test]
    fn intrinsics_checks_name_the_field() {
        let err = |k: Mat3| CameraCalib::new("CAM_X", k, rot_z(0.0), 1600, 900).unwrap_err().to_string();
        let with = |r: usize, c: usize, v: f64| {
            let mut k = K;
            k[r][c] = v;
            k
        };
        let has = |e: &str, parts: &[&str]| {
            for p in parts {
                assert!(e.contains(p), "`{p}` not in: {e}");
            }
            assert!(!e.contains("singular"), "{e}");
        };
        has(&err(with(0, 2, 1e7)), &["camera `CAM_X`", "cx (K[2], P[2]) is 10000000", "outside [-1600, 3200]", "1600 x 900 image", "centre (800)"]);
        has(&err(with(0, 2, -1700.0)), &["cx (K[2], P[2]) is -1700"]);
        assert!(CameraCalib::new("c", with(0, 2, -1600.0), rot_z(0.0), 1600, 900).is_ok(), "the range's ends are inside");
        assert!(CameraCalib::new("c", with(0, 2, 3200.0), rot_z(0.0), 1600, 900).is_ok());
        has(&err(with(1, 2, 1801.0)), &["cy (K[5], P[6]) is 1801", "outside [-900, 1800]", "centre (450)"]);
        has(&err(with(1, 2, -1e9)), &["cy (K[5], P[6]) is -1000000000"]);
        has(&err(with(0, 0, 0.0)), &["fx (K[0], P[0]) is 0", "1600 x 900 image", "must be positive"]);
        has(&err(with(1, 1, -5.0)), &["fy (K[4], P[5]) is -5", "must be positive"]);
        has(&err(with(0, 0, f64::INFINITY)), &["fx (K[0], P[0]) is inf", "must be finite"]);
        has(&err(with(1, 2, f64::NAN)), &["cy (K[5], P[6]) is NaN", "must be finite"]);
        has(&err(with(0, 1, 2000.0)), &["skew (K[1]) is 2000", "|skew| <= fx"]);
        has(&err(with(1, 0, 3.0)), &["K[3] is 3", "expected 0"]);
        has(&err(with(2, 2, 0.0)), &["bottom row", "[0.0, 0.0, 0.0]", "expected [0, 0, 1]"]);
        has(&err(with(2, 0, 1.0)), &["bottom row", "expected [0, 0, 1]"]);
        // a focal length so small that K is numerically singular: said so in those words
        let tiny = [[1e-9, 0.0, 800.0], [0.0, 1e-9, 450.0], [0.0, 0.0, 1.0]];
        let e = CameraCalib::new("c", tiny, rot_z(0.0), 1600, 900).unwrap_err().to_string();
        assert!(e.contains("too small next to the principal point (800, 450)"), "{e}");
        // the image size is checked first (the principal point's range depends on it)
        assert!(err_size().contains("image size 0x900"));
    }

    fn err_size() -> String {
        CameraCalib::new("c", K, rot_z(0.0), 0, 900).unwrap_err().to_string()
    }

    #[test]
    fn camera_info_intrinsics() {
        let p = [1000.0, 0.0, 640.0, 0.0, 0.0, 990.0, 360.0, 0.0, 0.0, 0.0, 1.0, 0.0];
        assert_eq!(intrinsics_from_projection(&p).unwrap(), [[1000.0, 0.0, 640.0], [0.0, 990.0, 360.0], [0.0, 0.0, 1.0]]);
        assert!(intrinsics_from_projection(&p[..9]).is_err());
        let k = [1000.0, 0.0, 640.0, 0.0, 990.0, 360.0, 0.0, 0.0, 1.0];
        assert_eq!(intrinsics_from_k(&k).unwrap(), intrinsics_from_projection(&p).unwrap());
        assert!(intrinsics_from_k(&k[..8]).is_err());
        // an all-zero CameraInfo (uncalibrated driver) is refused when the camera is built
        let zero = intrinsics_from_projection(&[0.0; 12]).unwrap();
        assert!(CameraCalib::new("c", zero, rot_z(0.0), 10, 10).is_err());
    }

    #[test]
    fn nuscenes_calib_json() {
        let path = crate::repo_root().join("tests/data/nuscenes/calib.json");
        let c = Calibration::load_nuscenes_json(&path, &NUSCENES_CAMERAS, 1600, 900).unwrap();
        assert_eq!(c.len(), 6);
        assert_eq!(c.cameras[0].name, "CAM_FRONT");
        assert!((c.cameras[0].intrinsics[0][0] - 1266.417203046554).abs() < 1e-9);
        let t = &c.cameras[0].camera_to_lidar;
        // camera2lidar = inv(lidar2cam): CAM_FRONT's optical axis (camera z) is the nuScenes
        // LiDAR's +y, which points forward
        assert!(t[1][2] > 0.99, "{t:?}");
        // equality is exact and sensitive to one bit
        let mut d = c.clone();
        assert_eq!(d, c);
        d.cameras[3].camera_to_lidar[0][3] = f64::from_bits(d.cameras[3].camera_to_lidar[0][3].to_bits() + 1);
        assert_ne!(d, c);
        assert!(Calibration::from_nuscenes_json("{}", "x", &["CAM_FRONT"], 1600, 900).is_err());
        assert!(Calibration::from_nuscenes_json("{\"cameras\": {\"A\": {\"cam2img\": [[1]]}}}", "x", &["A"], 1, 1).is_err());
        assert!(Calibration::from_nuscenes_json("not json", "x", &["A"], 1, 1).is_err());
        assert!(Calibration::load_nuscenes_json(Path::new("/nonexistent.json"), &["A"], 1, 1).is_err());
    }
}
