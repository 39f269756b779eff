//! Replay's evaluation of the BEV map against ground-truth masks (upstream's `evaluate_map`:
//! [`crate::eval::bev_map`]'s threshold sweep, per-class IoU at the best threshold, mIoU).
//!
//! Ground truth is a directory of masks, one file per replayed LiDAR frame:
//! `<dir>/<frame index, 6 digits>.npy` (`000000.npy` for frame 0), a float32 `.npy` array of
//! shape `[classes, nx, ny]` in the map's layout (`[class][x][y]`, the model's class order, the
//! head's output grid; upstream's `gt_masks_bev`), non-zero where the class is. A frame without
//! a file is not evaluated (its index is listed in the report); a file of the wrong shape is an
//! error of that frame, listed with its reason.

use std::path::{Path, PathBuf};

use serde_json::json;

use crate::models::bevfusion::map::BevMap;
use crate::eval::bev_map::{MapEval, MapMetrics, THRESHOLDS};

/// The ground-truth file of frame `index`.
pub fn mask_file(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("{index:06}.npy"))
}

/// The masks of one frame for `map` (`Ok(None)`: no file for this frame).
pub fn load_masks(dir: &Path, index: u64, map: &BevMap) -> Result<Option<Vec<u8>>, String> {
    let path = mask_file(dir, index);
    if !path.is_file() {
        return Ok(None);
    }
    let (shape, data) = crate::nn::npy::read_f32(&path).map_err(|e| e.to_string())?;
    let want = [map.classes.len(), map.nx, map.ny];
    if shape != want {
        return Err(format!("{}: shape {shape:?}, the map is {want:?} (classes, nx, ny)", path.display()));
    }
    Ok(Some(data.iter().map(|&v| u8::from(v != 0.0)).collect()))
}

/// The evaluation during a replay.
pub struct MapGroundTruth {
    dir: PathBuf,
    eval: MapEval,
    /// Frames with a map and no mask file.
    pub missing: Vec<u64>,
    /// `(frame, why)` for mask files that could not be used.
    pub errors: Vec<(u64, String)>,
}

impl MapGroundTruth {
    pub fn new(dir: &Path, classes: &[String]) -> Result<Self, String> {
        if !dir.is_dir() {
            return Err(format!("BEV map ground truth {}: not a directory", dir.display()));
        }
        let eval = MapEval::new(classes).map_err(|e| e.to_string())?;
        Ok(MapGroundTruth { dir: dir.to_path_buf(), eval, missing: Vec::new(), errors: Vec::new() })
    }

    /// Adds frame `index`'s map; returns a note when its mask could not be used.
    pub fn add(&mut self, index: u64, map: &BevMap) -> Option<String> {
        let r = load_masks(&self.dir, index, map).and_then(|m| match m {
            Some(masks) => self.eval.add(&map.probabilities, &masks).map(|_| true).map_err(|e| e.to_string()),
            None => Ok(false),
        });
        match r {
            Ok(true) => None,
            Ok(false) => {
                self.missing.push(index);
                None
            }
            Err(e) => {
                self.errors.push((index, e.clone()));
                Some(format!("frame {index}: BEV map ground truth: {e}"))
            }
        }
    }

    pub fn result(&self) -> MapMetrics {
        self.eval.result()
    }

    /// The report's `bev_map` entry.
    pub fn to_json(&self) -> serde_json::Value {
        let m = self.result();
        json!({
            "ground_truth": self.dir.display().to_string(),
            "frames": m.frames,
            "thresholds": THRESHOLDS,
            "miou": m.miou,
            "classes": m.classes.iter().map(|c| json!({
                "name": c.name,
                "iou": c.max,
                "best_threshold": c.best_threshold,
                "iou_at_thresholds": c.ious,
            })).collect::<Vec<_>>(),
            "frames_without_ground_truth": self.missing,
            "ground_truth_errors": self.errors.iter().map(|(i, e)| json!({"frame": i, "error": e})).collect::<Vec<_>>(),
        })
    }

    /// The report's markdown section.
    pub fn to_markdown(&self) -> String {
        let m = self.result();
        let mut s = format!(
            "\n## BEV map segmentation\n\nGround truth: `{}`, {} frame(s) evaluated (upstream's `evaluate_map`: IoU per class at its best threshold of {:?}).\n\n| class | IoU | best threshold |\n|---|---|---|\n",
            self.dir.display(),
            m.frames,
            THRESHOLDS
        );
        for c in &m.classes {
            s += &format!("| {} | {:.4} | {:.2} |\n", c.name, c.max, c.best_threshold);
        }
        s += &format!("| **mIoU** | **{:.4}** | |\n", m.miou);
        if !self.missing.is_empty() {
            s += &format!("\nFrames without a mask file (not evaluated): {:?}\n", self.missing);
        }
        for (i, e) in &self.errors {
            s += &format!("\nFrame {i}: {e}\n");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sptr-map-eval-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// A map equal to its mask scores IoU 1 at every threshold; a frame without a file is listed;
    /// a mask of the wrong shape is that frame's error.
    #[test]
    fn perfect_missing_and_bad_masks() {
        let d = dir("a");
        let mut m = BevMap::zeros(&["a", "b"], 2, 3, 1.0, [0.0, 0.0]).unwrap();
        let masks: Vec<f32> = (0..12).map(|i| (i % 3 == 0) as u8 as f32).collect();
        m.probabilities = masks.iter().map(|&v| if v > 0.0 { 0.9 } else { 0.1 }).collect();
        crate::nn::npy::write_f32(&mask_file(&d, 0), &[2, 2, 3], &masks).unwrap();
        crate::nn::npy::write_f32(&mask_file(&d, 2), &[2, 3, 2], &masks).unwrap();
        let mut g = MapGroundTruth::new(&d, &m.classes).unwrap();
        assert_eq!(g.add(0, &m), None);
        assert_eq!(g.add(1, &m), None);
        assert!(g.add(2, &m).is_some_and(|e| e.contains("shape")));
        let r = g.result();
        assert_eq!(r.frames, 1);
        assert!((r.miou - 1.0).abs() < 1e-6, "{r:?}");
        assert_eq!(g.missing, vec![1]);
        assert_eq!(g.errors.len(), 1);
        let j = g.to_json();
        assert_eq!(j["classes"][0]["name"], "a");
        assert!(g.to_markdown().contains("mIoU"));
        assert!(MapGroundTruth::new(&d.join("nope"), &m.classes).is_err());
        let _ = std::fs::remove_dir_all(&d);
    }
}
