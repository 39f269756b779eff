//! How a [`BevMap`] (the one map type, [`crate::models::bevfusion::map`]) is written to files, by `sptr bevseg`
//! and replay: raw float32 with a JSON header beside it, `.npy`, and a colour PNG of the
//! thresholded classes over the LiDAR points.
//!
//! Layout: `probabilities[(class · nx + ix) · ny + iy]`, upstream's `masks_bev[class, x, y]`
//! (dim 1 along the LiDAR x axis, dim 2 along y); cell `(ix, iy)` covers
//! `[x_range[0] + ix · res, x_range[0] + (ix + 1) · res)` and the same for y.

use crate::ops::label_grid::cpu::{BevGrids, NO_DATA};
use crate::models::bevfusion::map::{class_colour, BevMap, LidarStats};
use crate::eval::bev_png::{write_bev_png, BevLegend};
use crate::Error;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Colour of cells with LiDAR points and no class above the threshold.
pub const POINTS_RGB: [u8; 3] = [235, 235, 235];

/// The JSON header written beside the raw probabilities.
#[derive(Debug, Clone, Serialize)]
pub struct BevMapHeader<'a> {
    /// The raw file this header describes.
    pub data: String,
    pub dtype: &'static str,
    pub byte_order: &'static str,
    /// `[classes, nx, ny]`, C order.
    pub shape: [usize; 3],
    pub axes: [&'static str; 3],
    pub classes: &'a [String],
    pub resolution: f64,
    pub x_range: [f64; 2],
    pub y_range: [f64; 2],
    pub masked_cameras: &'a [String],
    pub lidar: Option<&'a LidarStats>,
    /// What the PNG's classes are thresholded at.
    pub png_threshold: f32,
}

/// The files [`BevMap::write_dir`] wrote.
#[derive(Debug, Clone)]
pub struct Written {
    pub raw: PathBuf,
    pub header: PathBuf,
    pub npy: PathBuf,
    pub png: PathBuf,
}

impl BevMap {
    /// The colour grid of the PNG: each cell the colour of the last class (in class order, as
    /// upstream's `visualize_map` paints) at or above `threshold`; else [`POINTS_RGB`] where a
    /// LiDAR point `(x, y)` falls; else no data. The grid's cell `(ix, iy)` is at `iy · nx + ix`
    /// (the layout of [`BevGrids`]); the label is the class id, `classes` for "points only".
    pub fn colour_grid(&self, threshold: f32, points: &[(f32, f32)]) -> Result<BevGrids, Error> {
        self.check()?;
        let (nx, ny, k) = (self.nx, self.ny, self.classes.len());
        if k >= NO_DATA as usize {
            return Err(Error::InvalidInput(format!("BEV map PNG: {k} classes; at most {} can be drawn", NO_DATA - 1)));
        }
        let mut g = BevGrids { width: nx, height: ny, labels: vec![NO_DATA; nx * ny], rgb: vec![0; nx * ny * 3], occupancy: vec![-1; nx * ny] };
        let res = self.resolution;
        for &(x, y) in points {
            let fx = ((x as f64 - self.x_range[0]) / res).floor();
            let fy = ((y as f64 - self.y_range[0]) / res).floor();
            // NaN fails both comparisons
            if fx >= 0.0 && fy >= 0.0 && fx < nx as f64 && fy < ny as f64 {
                let cell = fy as usize * nx + fx as usize;
                g.labels[cell] = k as u8;
                g.rgb[cell * 3..cell * 3 + 3].copy_from_slice(&POINTS_RGB);
            }
        }
        for (c, name) in self.classes.iter().enumerate() {
            let colour = class_colour(name);
            for ix in 0..nx {
                for iy in 0..ny {
                    if self.at(c, ix, iy) >= threshold {
                        let cell = iy * nx + ix;
                        g.labels[cell] = c as u8;
                        g.rgb[cell * 3..cell * 3 + 3].copy_from_slice(&colour);
                    }
                }
            }
        }
        Ok(g)
    }

    /// Writes `bev_probabilities.f32` (raw little-endian float32, `[class][x][y]`) with its
    /// header `bev_probabilities.json`, `bev_probabilities.npy`, and `bev_map.png` (classes at
    /// `threshold` over the LiDAR points `(x, y)`) into `dir` (created if missing).
    pub fn write_dir(&self, dir: &Path, threshold: f32, points: &[(f32, f32)], title: &str) -> Result<Written, Error> {
        self.check()?;
        std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("{}: cannot create: {e}", dir.display())))?;
        let io = |p: &Path, e: std::io::Error| Error::Io(format!("{}: cannot write: {e}", p.display()));
        let raw = dir.join("bev_probabilities.f32");
        let bytes: Vec<u8> = self.probabilities.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&raw, bytes).map_err(|e| io(&raw, e))?;
        let header = dir.join("bev_probabilities.json");
        let h = BevMapHeader {
            data: "bev_probabilities.f32".into(),
            dtype: "float32",
            byte_order: "little",
            shape: [self.classes.len(), self.nx, self.ny],
            axes: ["class", "x", "y"],
            classes: &self.classes,
            resolution: self.resolution,
            x_range: self.x_range,
            y_range: self.y_range,
            masked_cameras: &self.masked_cameras,
            lidar: self.lidar.as_ref(),
            png_threshold: threshold,
        };
        let text = serde_json::to_string_pretty(&h).map_err(|e| Error::Io(format!("BEV map header: {e}")))?;
        std::fs::write(&header, text + "\n").map_err(|e| io(&header, e))?;
        let npy = dir.join("bev_probabilities.npy");
        crate::nn::npy::write_f32(&npy, &[self.classes.len(), self.nx, self.ny], &self.probabilities)?;
        let png = dir.join("bev_map.png");
        let grid = self.colour_grid(threshold, points)?;
        let mut names = self.classes.clone();
        names.push("LiDAR points only".into());
        let mut palette: Vec<[u8; 3]> = self.classes.iter().map(|c| class_colour(c)).collect();
        palette.push(POINTS_RGB);
        let legend = BevLegend { class_names: &names, palette: &palette, resolution: self.resolution, title: title.to_string() };
        write_bev_png(&png, &grid, &legend).map_err(|e| Error::Io(e.to_string()))?;
        Ok(Written { raw, header, npy, png })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> BevMap {
        // 2 classes, 3 x 2 cells, 1 m cells from (-1.5, -1)
        let probabilities = vec![
            0.9, 0.1, 0.2, 0.6, 0.5, 0.49, // class 0: x 0..3, y 0..2
            0.7, 0.0, 0.0, 0.0, 0.0, 0.8, // class 1
        ];
        BevMap {
            classes: vec!["drivable_area".into(), "divider".into()],
            nx: 3,
            ny: 2,
            probabilities,
            resolution: 1.0,
            x_range: [-1.5, 1.5],
            y_range: [-1.0, 1.0],
            masked_cameras: vec!["CAM_BACK".into()],
            lidar: None,
        }
    }

    #[test]
    fn masks_and_colours() {
        let m = map();
        assert_eq!(m.at(0, 1, 1), 0.6);
        assert_eq!(m.at(1, 2, 1), 0.8);
        assert_eq!(m.masks(0.5), vec![1, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 1]);
        // a point in cell (1, 0): x in [-0.5, 0.5), y in [-1, 0); one outside; one NaN
        let g = m.colour_grid(0.5, &[(0.0, -0.5), (5.0, 0.0), (f32::NAN, 0.0)]).unwrap();
        let at = |ix: usize, iy: usize| (g.labels[iy * 3 + ix], [g.rgb[(iy * 3 + ix) * 3], g.rgb[(iy * 3 + ix) * 3 + 1], g.rgb[(iy * 3 + ix) * 3 + 2]]);
        // (0, 0): both classes; the later one (divider) is drawn on top
        assert_eq!(at(0, 0), (1, class_colour("divider")));
        assert_eq!(at(0, 1), (NO_DATA, [0, 0, 0]));
        assert_eq!(at(1, 0), (2, POINTS_RGB));
        assert_eq!(at(1, 1), (0, class_colour("drivable_area")));
        assert_eq!(at(2, 0), (0, class_colour("drivable_area")));
        assert_eq!(at(2, 1), (1, class_colour("divider")));
        let mut bad = m.clone();
        bad.probabilities.pop();
        assert!(bad.colour_grid(0.5, &[]).is_err());
    }

    #[test]
    fn writes_raw_header_npy_png() {
        let m = map();
        let dir = std::env::temp_dir().join(format!("sptr-bevmap-{}", std::process::id()));
        let w = m.write_dir(&dir, 0.5, &[(0.0, -0.5)], "test").unwrap();
        let raw = std::fs::read(&w.raw).unwrap();
        let back: Vec<f32> = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(back, m.probabilities);
        let h: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&w.header).unwrap()).unwrap();
        assert_eq!(h["shape"], serde_json::json!([2, 3, 2]));
        assert_eq!(h["axes"], serde_json::json!(["class", "x", "y"]));
        assert_eq!(h["masked_cameras"], serde_json::json!(["CAM_BACK"]));
        assert_eq!(h["dtype"], "float32");
        let (shape, data) = crate::nn::npy::read_f32(&w.npy).unwrap();
        assert_eq!(shape, vec![2, 3, 2]);
        assert_eq!(data, m.probabilities);
        assert!(std::fs::metadata(&w.png).unwrap().len() > 1000);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
