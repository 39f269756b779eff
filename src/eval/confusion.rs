//! The confusion matrix of ground-truth classes (rows) against predicted classes (columns),
//! and the metrics made from it.
//!
//! A ground-truth point the model gave no class (no voxel) is counted in `unpredicted[gt]`: a
//! miss for its class (a false negative), a false positive for none. Ignored, unmapped and
//! out-of-range ground truth is counted apart and never enters the matrix.
//!
//! * IoU of class `c` = TP / (TP + FP + FN), with FN including `unpredicted[c]`. A class with
//!   no ground-truth point and no prediction has no IoU (`None`) and does not enter mIoU.
//! * mIoU = the mean IoU over classes that have one.
//! * accuracy = Σ TP / ground-truth points evaluated (unpredicted ones included).
//!
//! Counts are integers, so shards add up exactly to the single-run matrix.

use serde::{Deserialize, Serialize};

use super::labels::GroundTruth;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confusion {
    pub classes: usize,
    /// Row-major `[gt][pred]`, `classes × classes`.
    pub matrix: Vec<u64>,
    /// Per ground-truth class: points the model gave no class.
    pub unpredicted: Vec<u64>,
    /// Ground-truth points not evaluated.
    pub ignored: u64,
    pub unmapped: u64,
    pub out_of_range: u64,
}

impl Confusion {
    pub fn new(classes: usize) -> Confusion {
        Confusion {
            classes,
            matrix: vec![0; classes * classes],
            unpredicted: vec![0; classes],
            ignored: 0,
            unmapped: 0,
            out_of_range: 0,
        }
    }

    /// Builds a matrix from rows (tests and hand-computed examples).
    pub fn from_rows(rows: &[Vec<u64>]) -> Confusion {
        let k = rows.len();
        let mut c = Confusion::new(k);
        for (g, row) in rows.iter().enumerate() {
            for (p, &v) in row.iter().enumerate().take(k) {
                c.matrix[g * k + p] = v;
            }
        }
        c
    }

    /// Whether the sizes agree (`classes²` cells, `classes` unpredicted counts): a matrix read
    /// from a file is checked before use.
    pub fn check(&self) -> Result<(), String> {
        if self.matrix.len() != self.classes * self.classes
            || self.unpredicted.len() != self.classes
        {
            return Err(format!(
                "confusion matrix of {} classes has {} cells and {} unpredicted counts (expected {} and {})",
                self.classes,
                self.matrix.len(),
                self.unpredicted.len(),
                self.classes * self.classes,
                self.classes
            ));
        }
        Ok(())
    }

    pub fn get(&self, gt: usize, pred: usize) -> u64 {
        self.matrix[gt * self.classes + pred]
    }

    /// Adds one point: its ground truth and predicted class (`None`: no class).
    pub fn add(&mut self, gt: GroundTruth, pred: Option<u32>) {
        match gt {
            GroundTruth::Class(g) => {
                let g = g as usize;
                if g >= self.classes {
                    self.out_of_range += 1;
                    return;
                }
                match pred.map(|p| p as usize).filter(|&p| p < self.classes) {
                    Some(p) => self.matrix[g * self.classes + p] += 1,
                    None => self.unpredicted[g] += 1,
                }
            }
            GroundTruth::Ignored => self.ignored += 1,
            GroundTruth::Unmapped => self.unmapped += 1,
            GroundTruth::OutOfRange => self.out_of_range += 1,
        }
    }

    /// Adds another matrix of the same class count (a shard).
    pub fn merge(&mut self, other: &Confusion) -> Result<(), String> {
        if other.classes != self.classes
            || other.matrix.len() != self.matrix.len()
            || other.unpredicted.len() != self.unpredicted.len()
        {
            return Err(format!(
                "confusion matrices of {} and {} classes cannot be added",
                self.classes, other.classes
            ));
        }
        for (a, b) in self.matrix.iter_mut().zip(&other.matrix) {
            *a += b;
        }
        for (a, b) in self.unpredicted.iter_mut().zip(&other.unpredicted) {
            *a += b;
        }
        self.ignored += other.ignored;
        self.unmapped += other.unmapped;
        self.out_of_range += other.out_of_range;
        Ok(())
    }

    pub fn true_positives(&self, c: usize) -> u64 {
        self.get(c, c)
    }

    /// Ground-truth points of class `c` (predicted or not).
    pub fn gt_points(&self, c: usize) -> u64 {
        (0..self.classes).map(|p| self.get(c, p)).sum::<u64>() + self.unpredicted[c]
    }

    /// Points predicted as `c` among evaluated ground truth.
    pub fn pred_points(&self, c: usize) -> u64 {
        (0..self.classes).map(|g| self.get(g, c)).sum()
    }

    /// Evaluated ground-truth points.
    pub fn evaluated(&self) -> u64 {
        self.matrix.iter().sum::<u64>() + self.unpredicted.iter().sum::<u64>()
    }

    /// IoU of class `c`, `None` when it has neither ground truth nor predictions.
    pub fn iou(&self, c: usize) -> Option<f64> {
        let tp = self.true_positives(c);
        let union = self.gt_points(c) + self.pred_points(c) - tp;
        (union > 0).then(|| tp as f64 / union as f64)
    }

    /// Mean IoU over the classes that have one; `None` when none has.
    pub fn miou(&self) -> Option<f64> {
        let ious: Vec<f64> = (0..self.classes).filter_map(|c| self.iou(c)).collect();
        (!ious.is_empty()).then(|| ious.iter().sum::<f64>() / ious.len() as f64)
    }

    /// Σ TP / evaluated points; `None` when nothing was evaluated.
    pub fn accuracy(&self) -> Option<f64> {
        let n = self.evaluated();
        (n > 0).then(|| {
            (0..self.classes)
                .map(|c| self.true_positives(c))
                .sum::<u64>() as f64
                / n as f64
        })
    }
}
