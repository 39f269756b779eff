//! The BEV map: per class, a probability per cell of a 2-D grid (what BEVFusion's seg head gives:
//! `masks_bev`, sigmoid outputs, `(classes, X, Y)` with dim 1 along the LiDAR x axis).
//!
//! [`BevMap`] is the plain struct both sides use: the model's forward produces it, the node's and
//! replay's encoders ([`crate::frame::map_messages`]) turn it into messages, the evaluation reads it.
//! Layout `[class][x][y]`: `probabilities[(c * nx + x) * ny + y]` is class `c`'s probability at
//! the cell whose lower corner is `(x_range[0] + x * resolution, y_range[0] + y * resolution)`.
//! The model's report on its inputs travels with the map: which cameras were masked and what
//! happened to the LiDAR input ([`LidarStats`]). The writers (raw float32 + JSON header, `.npy`,
//! PNG) are in [`crate::eval::map_files`]; the class colours ([`class_colour`]) are upstream's, used by
//! every drawing of a map (the PNG and the node's rgb8 image).

use crate::Error;
use serde::Serialize;

/// The six map classes of BEVFusion's nuScenes seg configs, in the head's output order.
pub const NUSCENES_MAP_CLASSES: [&str; 6] =
    ["drivable_area", "ped_crossing", "walkway", "stop_line", "carpark_area", "divider"];

/// Upstream's visualisation colours for the map classes (`MAP_PALETTE` of
/// `mmdet3d/core/utils/visualize.py`); classes it does not list are drawn grey. The one palette
/// of the project: the PNGs, the node's and replay's rgb8 map image.
pub fn class_colour(name: &str) -> [u8; 3] {
    match name {
        "drivable_area" => [166, 206, 227],
        "road_segment" => [31, 120, 180],
        "road_block" => [178, 223, 138],
        "lane" => [51, 160, 44],
        "ped_crossing" => [251, 154, 153],
        "walkway" => [227, 26, 28],
        "stop_line" => [253, 191, 111],
        "carpark_area" => [255, 127, 0],
        "road_divider" => [202, 178, 214],
        "lane_divider" | "divider" => [106, 61, 154],
        _ => [128, 128, 128],
    }
}

/// What happened to the LiDAR input of a fusion frame.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LidarStats {
    /// Points given.
    pub points_in: usize,
    /// Points dropped for a NaN or infinite value (or one beyond FP16's range) in any column.
    pub points_non_finite: usize,
    /// Points inside the point cloud range (what voxelization kept before `max_voxels`).
    pub points_in_range: usize,
    /// Voxels made.
    pub voxels: usize,
    /// Voxels dropped because `max_voxels` was reached.
    pub voxels_dropped: usize,
    /// Points dropped because their voxel already held `max_num_points`.
    pub points_over_voxel_cap: usize,
    /// True when no point was left: the LiDAR BEV was all zero for this frame.
    pub empty: bool,
}

/// A BEV map of per-class probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct BevMap {
    /// Class names, in the order of `probabilities`' first dimension.
    pub classes: Vec<String>,
    /// Cells along x (the first grid dimension) and y.
    pub nx: usize,
    pub ny: usize,
    /// `[class][x][y]`, each in 0..=1 (NaN: unknown).
    pub probabilities: Vec<f32>,
    /// Metres per cell (square cells).
    pub resolution: f64,
    /// `[lower, upper)` along x and y, metres, in the map's (the LiDAR's) frame.
    pub x_range: [f64; 2],
    pub y_range: [f64; 2],
    /// Cameras that did not contribute (no usable image): their depth was treated as zero.
    pub masked_cameras: Vec<String>,
    /// The fusion model's LiDAR input; None for the camera-only model (or a map made by hand).
    pub lidar: Option<LidarStats>,
}

impl BevMap {
    /// A map of zeros. Errors on an empty class list or grid, a non-positive or non-finite
    /// resolution, or a size whose cell count overflows.
    pub fn zeros(classes: &[&str], nx: usize, ny: usize, resolution: f64, origin: [f64; 2]) -> Result<BevMap, Error> {
        let n = classes
            .len()
            .checked_mul(nx)
            .and_then(|v| v.checked_mul(ny))
            .ok_or_else(|| Error::InvalidInput(format!("BEV map {} x {nx} x {ny}: too many cells", classes.len())))?;
        let m = BevMap {
            classes: classes.iter().map(|s| s.to_string()).collect(),
            nx,
            ny,
            probabilities: vec![0.0; n],
            resolution,
            x_range: [origin[0], origin[0] + nx as f64 * resolution],
            y_range: [origin[1], origin[1] + ny as f64 * resolution],
            masked_cameras: Vec::new(),
            lidar: None,
        };
        m.check()?;
        Ok(m)
    }

    /// The upstream seg head's output grid: 200 × 200 cells of 0.5 m over [-50, 50] m, the six
    /// nuScenes map classes, all zero.
    pub fn nuscenes_zeros() -> BevMap {
        BevMap {
            classes: NUSCENES_MAP_CLASSES.iter().map(|s| s.to_string()).collect(),
            nx: 200,
            ny: 200,
            probabilities: vec![0.0; 6 * 200 * 200],
            resolution: 0.5,
            x_range: [-50.0, 50.0],
            y_range: [-50.0, 50.0],
            masked_cameras: Vec::new(),
            lidar: None,
        }
    }

    /// Cells per class plane.
    pub fn cells(&self) -> usize {
        self.nx * self.ny
    }

    /// Probability of `class` at cell `(ix, iy)`; the indices must be inside the map (use
    /// [`BevMap::prob`] for indices from outside).
    pub fn at(&self, class: usize, ix: usize, iy: usize) -> f32 {
        self.probabilities[(class * self.nx + ix) * self.ny + iy]
    }

    /// Thresholded masks `[class][x][y]`, 1 where `p >= threshold` (upstream's comparison).
    pub fn masks(&self, threshold: f32) -> Vec<u8> {
        self.probabilities.iter().map(|&p| u8::from(p >= threshold)).collect()
    }

    /// Checks that the fields agree: classes and cells non-empty, `probabilities` of
    /// `classes × nx × ny` values, a positive finite resolution, finite ranges of `nx` and `ny`
    /// cells of that size.
    pub fn check(&self) -> Result<(), Error> {
        let bad = |why: String| Err(Error::InvalidInput(format!("BEV map: {why}")));
        if self.classes.is_empty() || self.nx == 0 || self.ny == 0 {
            return bad(format!("{} classes of {} x {} cells: none may be zero", self.classes.len(), self.nx, self.ny));
        }
        let want = self.classes.len().checked_mul(self.nx).and_then(|v| v.checked_mul(self.ny));
        if want != Some(self.probabilities.len()) {
            return bad(format!(
                "{} probabilities for {} classes x {} x {} cells",
                self.probabilities.len(),
                self.classes.len(),
                self.nx,
                self.ny
            ));
        }
        if !(self.resolution.is_finite() && self.resolution > 0.0) {
            return bad(format!("resolution {} must be positive", self.resolution));
        }
        for (axis, r, n) in [("x", self.x_range, self.nx), ("y", self.y_range, self.ny)] {
            let span = n as f64 * self.resolution;
            if !(r.iter().all(|v| v.is_finite()) && ((r[1] - r[0]) - span).abs() <= 1e-6 * span.max(1.0)) {
                return bad(format!("{axis} range {r:?} is not {n} cells of {} m", self.resolution));
            }
        }
        Ok(())
    }

    /// Class `c`'s probability at cell `(x, y)`; `None` outside the map.
    pub fn prob(&self, c: usize, x: usize, y: usize) -> Option<f32> {
        if c >= self.classes.len() || x >= self.nx || y >= self.ny {
            return None;
        }
        self.probabilities.get((c * self.nx + x) * self.ny + y).copied()
    }

    /// Class `c`'s plane, `[x][y]`.
    pub fn class_plane(&self, c: usize) -> Option<&[f32]> {
        let n = self.nx * self.ny;
        self.probabilities.get(c * n..(c + 1) * n)
    }

    /// The index of the class named `name`.
    pub fn class_index(&self, name: &str) -> Option<usize> {
        self.classes.iter().position(|c| c == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_class_x_y() {
        let mut m = BevMap::zeros(&["a", "b"], 3, 4, 0.5, [-1.0, -2.0]).unwrap();
        // class 1, x 2, y 3: the last value
        *m.probabilities.last_mut().unwrap() = 0.75;
        m.probabilities[4] = 0.25; // class 0, x 1, y 0
        assert_eq!(m.prob(1, 2, 3), Some(0.75));
        assert_eq!(m.prob(0, 1, 0), Some(0.25));
        assert_eq!(m.prob(2, 0, 0), None);
        assert_eq!(m.prob(0, 3, 0), None);
        assert_eq!(m.class_plane(1).unwrap().len(), 12);
        assert_eq!(m.class_index("b"), Some(1));
        let n = BevMap::nuscenes_zeros();
        n.check().unwrap();
        assert_eq!((n.nx, n.ny, n.classes.len(), n.resolution, n.x_range, n.y_range), (200, 200, 6, 0.5, [-50.0, 50.0], [-50.0, 50.0]));
        assert_eq!((m.x_range, m.y_range), ([-1.0, 0.5], [-2.0, 0.0]));
    }

    #[test]
    fn inconsistent_maps_are_errors() {
        assert!(BevMap::zeros(&[], 3, 4, 0.5, [0.0; 2]).is_err());
        assert!(BevMap::zeros(&["a"], 0, 4, 0.5, [0.0; 2]).is_err());
        assert!(BevMap::zeros(&["a"], 3, 4, 0.0, [0.0; 2]).is_err());
        assert!(BevMap::zeros(&["a"], 3, 4, f64::NAN, [0.0; 2]).is_err());
        assert!(BevMap::zeros(&["a"], 3, 4, 0.5, [f64::INFINITY, 0.0]).is_err());
        assert!(BevMap::zeros(&["a"], usize::MAX, 2, 0.5, [0.0; 2]).is_err());
        let mut m = BevMap::zeros(&["a"], 3, 4, 0.5, [0.0; 2]).unwrap();
        m.probabilities.pop();
        let e = m.check().unwrap_err().to_string();
        assert!(e.contains("11 probabilities"), "{e}");
        let mut m = BevMap::zeros(&["a"], 3, 4, 0.5, [0.0; 2]).unwrap();
        m.y_range[1] = 3.0;
        let e = m.check().unwrap_err().to_string();
        assert!(e.contains("y range"), "{e}");
    }
}
