//! Lift-splat geometry, computed once per calibration: the LiDAR-frame point of every
//! (camera, depth bin, feature row, feature column), its BEV cell, and the points grouped by cell.
//!
//! Arithmetic: upstream (`get_geometry` and `bev_pool` in vtransforms/base.py at db75150) runs in
//! float32 with torch's matrix kernels, whose rounding depends on the device and library. We
//! compute in float64 from upstream's float32 inputs (K, camera2lidar, the augmentation matrix
//! and the frustum are float32 tensors there), in a fixed order that the CUDA kernel repeats op
//! for op, so CPU and GPU give the same cells bit for bit. The points differ from a float32
//! evaluation by ~1e-5 m; a point that close to a cell face can land in the neighbouring cell
//! compared to upstream (the tests count them: a few per million). Per point:
//!
//! ```text
//! p = frustum[d, h, w] - post_trans          (u, v, d)
//! q = inv(post_rots) · p                     row i: (a0·p0 + a1·p1) + a2·p2
//! r = (q0 · q2, q1 · q2, q2)
//! s = (R_cam2lidar · inv(K)) · r + t          row i: ((c0·r0 + c1·r1) + c2·r2) + t_i
//! cell axis i: trunc((s_i - (bx - dx/2)) / dx), kept when 0 <= it < nx   (BevGrid::cell_of)
//! ```
//!
//! The LiDAR augmentation of upstream's `get_geometry` (`extra_rots`, `extra_trans`) is the
//! identity at inference and is not applied.
//!
//! Points are numbered as upstream flattens `(B, N, D, H, W)` with B = 1:
//! `i = ((n · D + d) · H + h) · W + w`. Grouped by cell they become a CSR table: the points of
//! cell `c` are `order[cell_start[c]..cell_start[c + 1]]`, in ascending `i` (a stable sort: the
//! fixed summation order of the pool). `order` holds each point's index into the depth tensor,
//! which is pixel-major: `q = ((n · H + h) · W + w) · D + d`.

use crate::models::bevfusion::lss::config::{BevGrid, Frustum, ImageAug, LssConfig};
use crate::sensors::calib::camera::{mat3_inverse, mat3_mul, CameraCalib, Calibration, Mat3};
use crate::Error;
use rayon::prelude::*;

/// One camera's geometry constants, float64 from float32-rounded inputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CameraGeometry {
    pub post_trans: [f64; 3],
    pub inv_post_rot: Mat3,
    /// `R_cam2lidar · inv(K)`.
    pub combine: Mat3,
    pub trans: [f64; 3],
}

fn f32_round(v: f64) -> f64 {
    v as f32 as f64
}

impl CameraGeometry {
    pub fn new(cam: &CameraCalib, aug: &ImageAug) -> Result<Self, Error> {
        let k = cam.intrinsics.map(|r| r.map(f32_round));
        let t = &cam.camera_to_lidar;
        let rot: Mat3 = [0, 1, 2].map(|i| [0, 1, 2].map(|j| f32_round(t[i][j])));
        let trans = [0, 1, 2].map(|i| f32_round(t[i][3]));
        let inv_k = mat3_inverse(&k, &format!("camera `{}`: intrinsics", cam.name))?;
        let inv_post_rot = mat3_inverse(&aug.post_rot(), &format!("camera `{}`: image augmentation", cam.name))?;
        Ok(Self { post_trans: aug.post_trans(), inv_post_rot, combine: mat3_mul(&rot, &inv_k), trans })
    }

    /// The LiDAR-frame point of frustum entry `f = (u, v, d)` (module docs: the exact order).
    pub fn point(&self, f: [f32; 3]) -> [f64; 3] {
        let p = [f[0] as f64 - self.post_trans[0], f[1] as f64 - self.post_trans[1], f[2] as f64 - self.post_trans[2]];
        let a = &self.inv_post_rot;
        let q = [0, 1, 2].map(|i| a[i][0] * p[0] + a[i][1] * p[1] + a[i][2] * p[2]);
        let r = [q[0] * q[2], q[1] * q[2], q[2]];
        let c = &self.combine;
        [0, 1, 2].map(|i| c[i][0] * r[0] + c[i][1] * r[1] + c[i][2] * r[2] + self.trans[i])
    }
}

/// What the geometry depends on besides the calibration: the frustum, the grid and the
/// augmentation rule (from the YAML, or the frustum / grid a checkpoint carries).
#[derive(Debug, Clone, PartialEq)]
pub struct LssParams {
    pub cfg: LssConfig,
    pub frustum: Frustum,
    pub grid: BevGrid,
}

impl LssParams {
    pub fn from_config(cfg: &LssConfig) -> Self {
        let v = &cfg.vtransform;
        Self { cfg: cfg.clone(), frustum: Frustum::from_config(cfg), grid: BevGrid::from_bounds(v.xbound, v.ybound, v.zbound) }
    }

    /// Every camera's geometry constants; errors on a calibration the geometry cannot use
    /// (singular matrices, an image the crop does not fit, more than 32 cameras).
    pub fn cameras(&self, calib: &Calibration) -> Result<Vec<CameraGeometry>, Error> {
        if calib.is_empty() || calib.len() > MAX_CAMERAS {
            return Err(Error::InvalidInput(format!("calibration has {} cameras: 1 to {MAX_CAMERAS} are supported", calib.len())));
        }
        calib.cameras.iter().map(|c| self.camera(c)).collect()
    }

    /// One camera's geometry constants; errors on a camera the geometry cannot use (an image the
    /// crop does not fit, singular intrinsics). The camera branch asks this of every camera
    /// before a frame ([`crate::frame::cameras::BevMapModel::check_camera`]), so one such camera is
    /// masked instead of failing the frame.
    pub fn camera(&self, c: &CameraCalib) -> Result<CameraGeometry, Error> {
        let aug = ImageAug::test_time(&self.cfg, c.image_width, c.image_height).map_err(|e| Error::InvalidInput(format!("camera `{}`: {e}", c.name)))?;
        CameraGeometry::new(c, &aug)
    }

    /// Points per frame: `N · D · H · W`, checked to fit the u32 indices of the tables.
    pub fn points(&self, cameras: usize) -> Result<usize, Error> {
        let f = &self.frustum;
        let n = cameras
            .checked_mul(f.depth_bins * f.height * f.width)
            .filter(|&n| n < u32::MAX as usize)
            .ok_or_else(|| Error::InvalidInput(format!("{cameras} cameras x frustum {:?}: more points than 32-bit indices hold", f.shape())))?;
        if self.grid.cells() >= u32::MAX as usize {
            return Err(Error::InvalidInput(format!("BEV grid {:?}: more cells than 32-bit indices hold", self.grid.nx)));
        }
        Ok(n)
    }
}

/// At most this many cameras (the pool's camera mask is a 32-bit word).
pub const MAX_CAMERAS: usize = 32;

/// The BEV cell of every point (`i` order), `None` where outside the grid.
pub fn point_cells(params: &LssParams, cams: &[CameraGeometry]) -> Vec<Option<u32>> {
    let f = &params.frustum;
    let per_cam = f.depth_bins * f.height * f.width;
    let mut cells = vec![None; cams.len() * per_cam];
    cells.par_chunks_mut(f.height * f.width).enumerate().for_each(|(nd, out)| {
        let (n, d) = (nd / f.depth_bins, nd % f.depth_bins);
        for h in 0..f.height {
            for w in 0..f.width {
                let p = cams[n].point(f.at(d, h, w));
                out[h * f.width + w] = params.grid.cell_of(p).map(|c| c as u32);
            }
        }
    });
    cells
}

/// The CSR table of one calibration (module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct LssGeometry {
    pub cameras: usize,
    pub depth_bins: usize,
    pub height: usize,
    pub width: usize,
    pub grid: BevGrid,
    /// `cells + 1` offsets into `order`.
    pub cell_start: Vec<u32>,
    /// Depth-tensor index of each kept point, grouped by cell.
    pub order: Vec<u32>,
}

/// A run of kept points in one BEV cell (upstream's interval: start and length in the sorted
/// kept points).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    pub cell: u32,
    pub start: u32,
    pub len: u32,
}

impl LssGeometry {
    /// Builds the table on the CPU: cells per point, then a counting sort by cell (stable).
    pub fn build(params: &LssParams, calib: &Calibration) -> Result<Self, Error> {
        let cams = params.cameras(calib)?;
        params.points(cams.len())?;
        let cells = point_cells(params, &cams);
        Ok(Self::from_point_cells(params, cams.len(), &cells))
    }

    /// The table from per-point cells (`i` order).
    pub fn from_point_cells(params: &LssParams, cameras: usize, cells: &[Option<u32>]) -> Self {
        let f = &params.frustum;
        let (dn, h, w) = (f.depth_bins, f.height, f.width);
        let n_cells = params.grid.cells();
        let mut cell_start = vec![0u32; n_cells + 1];
        for c in cells.iter().flatten() {
            cell_start[*c as usize + 1] += 1;
        }
        for i in 0..n_cells {
            cell_start[i + 1] += cell_start[i];
        }
        let mut next = cell_start.clone();
        let mut order = vec![0u32; cell_start[n_cells] as usize];
        for (i, c) in cells.iter().enumerate() {
            if let Some(c) = c {
                order[next[*c as usize] as usize] = depth_index(i, dn, h, w) as u32;
                next[*c as usize] += 1;
            }
        }
        Self { cameras, depth_bins: dn, height: h, width: w, grid: params.grid, cell_start, order }
    }

    /// Points kept (inside the grid).
    pub fn kept(&self) -> usize {
        self.order.len()
    }

    /// Non-empty cells in ascending order with their runs (upstream's `interval_starts`,
    /// `interval_lengths` and the cell each one pools into).
    pub fn intervals(&self) -> Vec<Interval> {
        self.cell_start
            .windows(2)
            .enumerate()
            .filter(|(_, s)| s[1] > s[0])
            .map(|(c, s)| Interval { cell: c as u32, start: s[0], len: s[1] - s[0] })
            .collect()
    }

    /// Pixels per camera (`H · W`).
    pub fn pixels_per_camera(&self) -> usize {
        self.height * self.width
    }
}

/// Depth-tensor index `((n · H + h) · W + w) · D + d` of point `i = ((n · D + d) · H + h) · W + w`.
pub fn depth_index(i: usize, d_n: usize, h_n: usize, w_n: usize) -> usize {
    let w = i % w_n;
    let h = (i / w_n) % h_n;
    let d = (i / (w_n * h_n)) % d_n;
    let n = i / (w_n * h_n * d_n);
    ((n * h_n + h) * w_n + w) * d_n + d
}

/// The geometry of the last calibration seen, rebuilt only when a calibration differs from it
/// (exact comparison): a calibration change takes effect on the next frame without a restart.
#[derive(Debug, Default)]
pub struct GeometryCache {
    current: Option<(Calibration, LssGeometry)>,
    builds: usize,
}

impl GeometryCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The geometry for `calib`, building it when the calibration changed. A failed build keeps
    /// the previous geometry cached (and returns the error).
    pub fn get(&mut self, params: &LssParams, calib: &Calibration) -> Result<&LssGeometry, Error> {
        let stale = self.current.as_ref().is_none_or(|(c, _)| c != calib);
        if stale {
            let g = LssGeometry::build(params, calib)?;
            self.current = Some((calib.clone(), g));
            self.builds += 1;
        }
        self.current.as_ref().map(|(_, g)| g).ok_or_else(|| Error::InvalidInput("geometry cache is empty".into()))
    }

    /// How many times a geometry was built (tests and diagnostics).
    pub fn builds(&self) -> usize {
        self.builds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sensors::calib::camera::{Mat4, NUSCENES_CAMERAS};
    use std::collections::BTreeMap;

    fn root() -> std::path::PathBuf {
        crate::repo_root()
    }

    fn seg_params() -> LssParams {
        LssParams::from_config(&LssConfig::load(&root().join("config/models/bevfusion_seg_camera.yaml")).unwrap())
    }

    fn nuscenes() -> Calibration {
        Calibration::load_nuscenes_json(&root().join("tests/data/nuscenes/calib.json"), &NUSCENES_CAMERAS, 1600, 900).unwrap()
    }

    // ---- a direct float32 transcription of upstream's get_geometry + the cell formula ----

    fn inv3_f32(m: [[f32; 3]; 3]) -> [[f32; 3]; 3] {
        let c = |r0: usize, r1: usize, c0: usize, c1: usize| m[r0][c0] * m[r1][c1] - m[r0][c1] * m[r1][c0];
        let det = m[0][0] * c(1, 2, 1, 2) - m[0][1] * c(1, 2, 0, 2) + m[0][2] * c(1, 2, 0, 1);
        let cof = [
            [c(1, 2, 1, 2), -c(1, 2, 0, 2), c(1, 2, 0, 1)],
            [-c(0, 2, 1, 2), c(0, 2, 0, 2), -c(0, 2, 0, 1)],
            [c(0, 1, 1, 2), -c(0, 1, 0, 2), c(0, 1, 0, 1)],
        ];
        [0, 1, 2].map(|i| [0, 1, 2].map(|j| cof[j][i] / det))
    }

    fn mv_f32(m: &[[f32; 3]; 3], v: [f32; 3]) -> [f32; 3] {
        [0, 1, 2].map(|i| m[i][0] * v[0] + m[i][1] * v[1] + m[i][2] * v[2])
    }

    /// Upstream's float32 constants of one camera: inverse(post_rots), post_trans,
    /// rots · inverse(intrins), trans.
    struct UpstreamF32 {
        inv_pr: [[f32; 3]; 3],
        pt: [f32; 3],
        combine: [[f32; 3]; 3],
        t: [f32; 3],
    }

    fn upstream_f32(cam: &CameraCalib, aug: &ImageAug) -> UpstreamF32 {
        let k = cam.intrinsics.map(|r| r.map(|v| v as f32));
        let rot = [0, 1, 2].map(|i| [0, 1, 2].map(|j| cam.camera_to_lidar[i][j] as f32));
        let ik = inv3_f32(k);
        UpstreamF32 {
            inv_pr: inv3_f32(aug.post_rot().map(|r| r.map(|v| v as f32))),
            pt: aug.post_trans().map(|v| v as f32),
            combine: [0, 1, 2].map(|i| [0, 1, 2].map(|j| rot[i][0] * ik[0][j] + rot[i][1] * ik[1][j] + rot[i][2] * ik[2][j])),
            t: [0, 1, 2].map(|i| cam.camera_to_lidar[i][3] as f32),
        }
    }

    /// Upstream's arithmetic in float32, written from base.py: points = frustum - post_trans;
    /// inverse(post_rots) · points; (x·z, y·z, z); (rots · inverse(intrins)) · points + trans.
    fn upstream_point_f32(u: &UpstreamF32, f: [f32; 3]) -> [f32; 3] {
        let p = [f[0] - u.pt[0], f[1] - u.pt[1], f[2] - u.pt[2]];
        let q = mv_f32(&u.inv_pr, p);
        let r = [q[0] * q[2], q[1] * q[2], q[2]];
        let s = mv_f32(&u.combine, r);
        [s[0] + u.t[0], s[1] + u.t[1], s[2] + u.t[2]]
    }

    fn upstream_cell_f32(g: &BevGrid, p: [f32; 3]) -> Option<usize> {
        let mut idx = [0i64; 3];
        for i in 0..3 {
            let v = ((p[i] - (g.bx[i] - g.dx[i] / 2.0)) / g.dx[i]) as i64; // .long(): truncation
            if v < 0 || v >= g.nx[i] as i64 {
                return None;
            }
            idx[i] = v;
        }
        Some(((idx[0] as usize * g.nx[1] + idx[1] as usize) * g.nx[2]) + idx[2] as usize)
    }

    #[test]
    fn geometry_matches_upstream_formula_on_nuscenes() {
        let params = seg_params();
        let calib = nuscenes();
        let cams = params.cameras(&calib).unwrap();
        let f = &params.frustum;
        let (mut max_err, mut differ, mut kept_f32, mut total) = (0f64, 0usize, 0usize, 0usize);
        for (n, cam) in calib.cameras.iter().enumerate() {
            let up32 = upstream_f32(cam, &ImageAug::test_time(&params.cfg, 1600, 900).unwrap());
            for d in 0..f.depth_bins {
                for h in 0..f.height {
                    for w in 0..f.width {
                        let ours = cams[n].point(f.at(d, h, w));
                        let up = upstream_point_f32(&up32, f.at(d, h, w));
                        for i in 0..3 {
                            max_err = max_err.max((ours[i] - up[i] as f64).abs());
                        }
                        let a = params.grid.cell_of(ours);
                        let b = upstream_cell_f32(&params.grid, up);
                        differ += (a != b) as usize;
                        kept_f32 += b.is_some() as usize;
                        total += 1;
                    }
                }
            }
        }
        eprintln!("nuScenes geometry: max |f64 - f32 upstream| {max_err:.2e} m, {differ} of {total} points in another cell ({kept_f32} kept by f32)");
        assert!(max_err < 1e-4, "max error {max_err} m");
        // f32 rounding (~1e-5 m) moves only points that close to a cell face: a few per million
        assert!(differ * 10_000 < total, "{differ} of {total} points differ");
        assert!(kept_f32 > total / 4, "the nuScenes frustum mostly lies inside the 102.4 m grid");
    }

    #[test]
    fn csr_matches_brute_force_scatter() {
        let params = seg_params();
        let calib = nuscenes();
        let cams = params.cameras(&calib).unwrap();
        let cells = point_cells(&params, &cams);
        let g = LssGeometry::from_point_cells(&params, cams.len(), &cells);
        assert_eq!(g, LssGeometry::build(&params, &calib).unwrap());
        // brute force: every point appended to its cell's list in index order
        let f = &params.frustum;
        let mut by_cell: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (i, c) in cells.iter().enumerate() {
            if let Some(c) = c {
                by_cell.entry(*c).or_default().push(depth_index(i, f.depth_bins, f.height, f.width) as u32);
            }
        }
        let iv = g.intervals();
        assert_eq!(iv.len(), by_cell.len());
        let mut start = 0u32;
        for (itv, (cell, pts)) in iv.iter().zip(&by_cell) {
            assert_eq!((itv.cell, itv.start, itv.len as usize), (*cell, start, pts.len()));
            assert_eq!(&g.order[itv.start as usize..(itv.start + itv.len) as usize], &pts[..]);
            start += itv.len;
        }
        assert_eq!(start as usize, g.kept());
        assert_eq!(*g.cell_start.last().unwrap() as usize, g.kept());
        assert!(g.kept() > 100_000 && g.kept() < cells.len());
        // the depth index is a bijection onto 0..N·D·H·W
        let mut seen = vec![false; cells.len()];
        for i in 0..cells.len() {
            let q = depth_index(i, f.depth_bins, f.height, f.width);
            assert!(!seen[q]);
            seen[q] = true;
        }
    }

    /// One camera looking along LiDAR +x from the origin with K = identity-like, so every point is
    /// known by hand: pixel (u, v) at depth d is camera (u·d, v·d, d).
    fn pinned_setup(translation: [f64; 3]) -> (LssParams, Calibration) {
        let text = std::fs::read_to_string(root().join("config/models/bevfusion_seg_camera.yaml")).unwrap();
        let text = text
            .replace("image_size: [256, 704]          #", "image_size: [2, 3]          #")
            .replace("image_size: [256, 704]\n        feature_size: [32, 88]", "image_size: [2, 3]\n        feature_size: [2, 3]")
            .replace("xbound: [-51.2, 51.2, 0.4]", "xbound: [0.0, 4.0, 1.0]")
            .replace("ybound: [-51.2, 51.2, 0.4]", "ybound: [0.0, 4.0, 1.0]")
            .replace("dbound: [1.0, 60.0, 0.5]", "dbound: [1.0, 3.0, 1.0]")
            .replace("resize: [[0.38, 0.55], [0.48, 0.48]]", "resize: [[1.0, 1.0], [1.0, 1.0]]");
        let cfg = LssConfig::parse(&text, "pinned").unwrap();
        let params = LssParams::from_config(&cfg);
        // camera axes as LiDAR axes: camera x (u) -> LiDAR x, camera y (v) -> LiDAR y,
        // camera z (depth) -> LiDAR z; K = I so (u, v, d) -> (u·d, v·d, d)
        let mut c2l: Mat4 = [[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]];
        for i in 0..3 {
            c2l[i][3] = translation[i];
        }
        let k = [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]];
        let cam = CameraCalib::new("pinned", k, c2l, 3, 2).unwrap();
        (params, Calibration::new(vec![cam]).unwrap())
    }

    #[test]
    fn pinned_points_truncate_and_drop() {
        // point index of u = 2, v = 0, depth bin 1 (d = 2): (1 · 2 + 0) · 3 + 2
        const POINT_U2_V0_D2: usize = 8;
        // frustum u in {0, 1, 2}, v in {0, 1}, d in {1, 2}; z cell [-10, 10) shifted by -d
        let (params, calib) = pinned_setup([-0.5, 0.0, -1.0]);
        let g = LssGeometry::build(&params, &calib).unwrap();
        let cams = params.cameras(&calib).unwrap();
        let cells = point_cells(&params, &cams);
        // point i = (d·2 + v)·3 + u: x = u·d - 0.5, y = v·d, z = d - 1
        let want = |u: usize, v: usize, d: usize| -> Option<u32> {
            let x = u as f64 * d as f64 - 0.5; // -0.5 lands in cell 0 (truncation toward zero)
            let y = v as f64 * d as f64;
            let (cx, cy) = (x.max(0.0).trunc() as u32, y as u32);
            (x < 4.0 && y < 4.0).then_some(cx * 4 + cy)
        };
        for d in 0..2 {
            for v in 0..2 {
                for u in 0..3 {
                    let i = (d * 2 + v) * 3 + u;
                    assert_eq!(cells[i], want(u, v, d + 1), "u {u} v {v} d {}", d + 1);
                }
            }
        }
        // x = -0.5 at u = 0 is kept in cell x 0; (u 2, d 2) gives x = 3.5 (cell 3)
        assert_eq!(cells[0], Some(0));
        assert_eq!(cells[POINT_U2_V0_D2], Some(3 * 4));
        assert_eq!(g.kept(), cells.iter().flatten().count());
        // shifted by exactly -1 cell more, u = 0 sits at x = -1.5 (dropped), u = 1, d = 1 at -0.5 (kept)
        let (params, calib) = pinned_setup([-1.5, 0.0, 0.0]);
        let cells = point_cells(&params, &params.cameras(&calib).unwrap());
        assert_eq!(cells[0], None);
        assert_eq!(cells[1], Some(0));
        // x exactly -1.0 (u = 0, shift -1): q = -1, trunc -1: dropped
        let (params, calib) = pinned_setup([-1.0, 0.0, 0.0]);
        let cells = point_cells(&params, &params.cameras(&calib).unwrap());
        assert_eq!(cells[0], None);
        // the upper face: u = 2, d = 2 at x = 4.0 exactly (shift 0): dropped; at 3.99 kept
        let (params, calib) = pinned_setup([0.0, 0.0, 0.0]);
        let cells = point_cells(&params, &params.cameras(&calib).unwrap());
        assert_eq!(cells[POINT_U2_V0_D2], None);
        let (params, calib) = pinned_setup([-0.01, 0.0, 0.0]);
        let cells = point_cells(&params, &params.cameras(&calib).unwrap());
        assert_eq!(cells[POINT_U2_V0_D2], Some(3 * 4));
        // z outside [-10, 10): everything dropped
        // z: d = 1 at 9.5 inside, d = 2 at 10.5 above the z cell [-10, 10)
        let (params, calib) = pinned_setup([0.5, 0.5, 8.5]);
        let cells = point_cells(&params, &params.cameras(&calib).unwrap());
        assert!(cells.iter().take(6).all(|c| c.is_some()), "{cells:?}");
        assert!(cells.iter().skip(6).all(|c| c.is_none()), "{cells:?}");
    }

    #[test]
    fn cache_rebuilds_only_on_change() {
        let params = seg_params();
        let calib = nuscenes();
        let mut cache = GeometryCache::new();
        let kept = cache.get(&params, &calib).unwrap().kept();
        cache.get(&params, &calib.clone()).unwrap();
        assert_eq!(cache.builds(), 1);
        let mut moved = calib.clone();
        moved.cameras[0].camera_to_lidar[0][3] += 0.5;
        cache.get(&params, &moved).unwrap();
        assert_eq!(cache.builds(), 2);
        assert_ne!(cache.get(&params, &moved).unwrap().order, LssGeometry::build(&params, &calib).unwrap().order);
        assert_eq!(cache.builds(), 2);
        cache.get(&params, &calib).unwrap();
        assert_eq!((cache.builds(), cache.get(&params, &calib).unwrap().kept()), (3, kept));
        // a calibration the geometry cannot use: the error, and the cache keeps the last one
        let mut small = calib.clone();
        small.cameras[2].image_width = 640;
        assert!(cache.get(&params, &small).unwrap_err().to_string().contains("CAM_FRONT_LEFT"));
        assert_eq!(cache.builds(), 3);
    }

    #[test]
    fn too_many_cameras() {
        let params = seg_params();
        let calib = nuscenes();
        let mut many = calib.clone();
        while many.len() <= MAX_CAMERAS {
            many.cameras.push(calib.cameras[0].clone());
        }
        assert!(LssGeometry::build(&params, &many).is_err());
    }
}
