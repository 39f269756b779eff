//! BEV map segmentation metrics as BEVFusion reports them (`NuScenesDataset.evaluate_map` in
//! mit-han-lab/bevfusion at db75150): for every class and each threshold 0.35, 0.40, … 0.65, a
//! cell is predicted when its probability is `>=` the threshold; true positives, false positives
//! and false negatives are summed over all frames (not averaged per frame); IoU = tp / (tp + fp +
//! fn + 1e-7); a class's score is its best IoU over the thresholds (`iou@max`), and the mIoU is
//! the mean of those per-class maxima (each class at its own best threshold).
//!
//! Counts are exact integers here (upstream adds them into float32 tensors, exact below 2^24
//! cells per class and threshold, i.e. for ~400 frames of 200 × 200; we stay exact for any
//! number). The threshold comparison is in float32 as upstream's (`pred >= torch.tensor([...])`).
//! [`MapEval`] accumulates frame by frame (replay), [`MapEval::merge`] combines shards.

use super::EvalError;

/// Upstream's thresholds (float32, as `torch.tensor([0.35, ...])` stores them).
pub const THRESHOLDS: [f32; 7] = [0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65];

/// Upstream's epsilon in the IoU's denominator.
pub const IOU_EPS: f64 = 1e-7;

/// Counts of one class at one threshold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub tp: u64,
    pub fp: u64,
    pub fn_: u64,
}

impl Counts {
    /// tp / (tp + fp + fn + 1e-7); 0 for a class never predicted nor present.
    pub fn iou(&self) -> f64 {
        self.tp as f64 / ((self.tp + self.fp + self.fn_) as f64 + IOU_EPS)
    }
}

/// One class's result.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassIou {
    pub name: String,
    /// IoU at each of [`THRESHOLDS`].
    pub ious: [f64; 7],
    /// The best of them (`iou@max`).
    pub max: f64,
    /// The first threshold reaching `max`.
    pub best_threshold: f32,
}

/// What [`MapEval::result`] gives: per class, and the mean of the per-class maxima.
#[derive(Debug, Clone, PartialEq)]
pub struct MapMetrics {
    pub classes: Vec<ClassIou>,
    /// `map/mean/iou@max`.
    pub miou: f64,
    pub frames: usize,
}

impl MapMetrics {
    /// Upstream's metric names and values (`map/{class}/iou@max`, `map/{class}/iou@0.35`, …,
    /// `map/mean/iou@max`), in that order.
    pub fn named(&self) -> Vec<(String, f64)> {
        let mut out = Vec::new();
        for c in &self.classes {
            out.push((format!("map/{}/iou@max", c.name), c.max));
            for (t, iou) in THRESHOLDS.iter().zip(c.ious) {
                out.push((format!("map/{}/iou@{t:.2}", c.name), iou));
            }
        }
        out.push(("map/mean/iou@max".into(), self.miou));
        out
    }
}

/// The accumulator: counts per class and threshold over the frames seen.
#[derive(Debug, Clone, PartialEq)]
pub struct MapEval {
    classes: Vec<String>,
    /// `[class][threshold]`.
    counts: Vec<[Counts; 7]>,
    frames: usize,
}

impl MapEval {
    pub fn new(classes: &[String]) -> Result<Self, EvalError> {
        if classes.is_empty() {
            return Err(EvalError::Invalid("map evaluation: no classes".into()));
        }
        Ok(Self { classes: classes.to_vec(), counts: vec![[Counts::default(); 7]; classes.len()], frames: 0 })
    }

    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    pub fn frames(&self) -> usize {
        self.frames
    }

    /// The counts of `class` at threshold index `t`.
    pub fn counts(&self, class: usize, t: usize) -> Option<Counts> {
        self.counts.get(class).and_then(|c| c.get(t)).copied()
    }

    /// Adds one frame: `pred` the probabilities and `label` the ground truth (non-zero = the
    /// class is there, upstream's `.bool()`), both `[class][cells]` row-major with the same
    /// number of cells per class. A NaN probability is never `>=` a threshold (predicted
    /// absent), as in torch.
    pub fn add(&mut self, pred: &[f32], label: &[u8]) -> Result<(), EvalError> {
        let k = self.classes.len();
        if pred.len() != label.len() || !pred.len().is_multiple_of(k) || pred.is_empty() {
            return Err(EvalError::Invalid(format!(
                "map evaluation: {} probabilities and {} labels for {k} classes (both must be classes x cells, cells > 0)",
                pred.len(),
                label.len()
            )));
        }
        let cells = pred.len() / k;
        for (c, counts) in self.counts.iter_mut().enumerate() {
            let (p, l) = (&pred[c * cells..(c + 1) * cells], &label[c * cells..(c + 1) * cells]);
            for (t, thr) in THRESHOLDS.iter().enumerate() {
                let mut n = Counts::default();
                for (&pv, &lv) in p.iter().zip(l) {
                    match (pv >= *thr, lv != 0) {
                        (true, true) => n.tp += 1,
                        (true, false) => n.fp += 1,
                        (false, true) => n.fn_ += 1,
                        (false, false) => {}
                    }
                }
                counts[t].tp += n.tp;
                counts[t].fp += n.fp;
                counts[t].fn_ += n.fn_;
            }
        }
        self.frames += 1;
        Ok(())
    }

    /// Adds another accumulator's counts (shards of one evaluation; same classes in order).
    pub fn merge(&mut self, other: &MapEval) -> Result<(), EvalError> {
        if other.classes != self.classes {
            return Err(EvalError::Invalid(format!("map evaluation: cannot merge classes {:?} into {:?}", other.classes, self.classes)));
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            for (x, y) in a.iter_mut().zip(b) {
                x.tp += y.tp;
                x.fp += y.fp;
                x.fn_ += y.fn_;
            }
        }
        self.frames += other.frames;
        Ok(())
    }

    /// IoUs per class and threshold, each class's best, their mean.
    pub fn result(&self) -> MapMetrics {
        let classes: Vec<ClassIou> = self
            .classes
            .iter()
            .zip(&self.counts)
            .map(|(name, counts)| {
                let ious = counts.map(|c| c.iou());
                // first index of the maximum (torch's max value; the threshold is our addition)
                let mut best = 0;
                for t in 1..ious.len() {
                    if ious[t] > ious[best] {
                        best = t;
                    }
                }
                ClassIou { name: name.clone(), ious, max: ious[best], best_threshold: THRESHOLDS[best] }
            })
            .collect();
        let miou = classes.iter().map(|c| c.max).sum::<f64>() / classes.len() as f64;
        MapMetrics { classes, miou, frames: self.frames }
    }
}

/// `evaluate_map` over `(probabilities, labels)` frames (each `[class][cells]`).
pub fn evaluate_map<'a, I>(classes: &[String], frames: I) -> Result<MapMetrics, EvalError>
where
    I: IntoIterator<Item = (&'a [f32], &'a [u8])>,
{
    let mut e = MapEval::new(classes)?;
    for (p, l) in frames {
        e.add(p, l)?;
    }
    Ok(e.result())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("c{i}")).collect()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn hand_computed_ious_one_frame() {
        // class 0, 4 cells: p = [0.9, 0.5, 0.4, 0.1], label = [1, 1, 0, 1]
        //   t 0.35: pred [1,1,1,0]: tp 2, fp 1, fn 1 -> 2/4
        //   t 0.40: 0.4 >= 0.4f32 -> same 2/4
        //   t 0.45 .. 0.50: pred [1,1,0,0]: tp 2, fp 0, fn 1 -> 2/3
        //   t 0.55 .. 0.65: pred [1,0,0,0]: tp 1, fn 2 -> 1/3
        // class 1: p all 0.6, label [0, 0, 1, 1]
        //   t <= 0.60: tp 2, fp 2 -> 2/4 ; t 0.65: tp 0, fn 2 -> 0
        let pred = [0.9, 0.5, 0.4, 0.1, 0.6, 0.6, 0.6, 0.6];
        let label = [1, 1, 0, 1, 0, 0, 1, 1];
        let m = evaluate_map(&names(2), [(&pred[..], &label[..])]).unwrap();
        let want0 = [2.0 / 4.0, 2.0 / 4.0, 2.0 / 3.0, 2.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0];
        let want1 = [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.0];
        for t in 0..7 {
            // the 1e-7 in the denominator: relative 1e-7 / 4 at most
            assert!((m.classes[0].ious[t] - want0[t]).abs() < 1e-7, "class 0 t {t}: {:?}", m.classes[0].ious);
            assert!((m.classes[1].ious[t] - want1[t]).abs() < 1e-7, "class 1 t {t}: {:?}", m.classes[1].ious);
        }
        assert!(close(m.classes[0].ious[2], 2.0 / (3.0 + 1e-7)));
        assert_eq!(m.classes[0].best_threshold, 0.45);
        assert_eq!(m.classes[1].best_threshold, 0.35);
        assert!(close(m.classes[0].max, 2.0 / (3.0 + 1e-7)));
        assert!(close(m.miou, (2.0 / (3.0 + 1e-7) + 2.0 / (4.0 + 1e-7)) / 2.0));
        let named = m.named();
        assert_eq!(named[0].0, "map/c0/iou@max");
        assert_eq!(named[1].0, "map/c0/iou@0.35");
        assert_eq!(named[7].0, "map/c0/iou@0.65");
        assert_eq!(named.last().unwrap().0, "map/mean/iou@max");
    }

    #[test]
    fn counts_accumulate_over_frames_not_averaged() {
        // frame A: one cell, predicted and present (IoU 1); frame B: three cells, one present, none
        // predicted (IoU 0). Per-frame average would be 0.5; summed counts give 1 / 2 at 0.5.
        let classes = names(1);
        let mut e = MapEval::new(&classes).unwrap();
        e.add(&[0.7], &[1]).unwrap();
        e.add(&[0.1, 0.2, 0.3], &[1, 0, 0]).unwrap();
        let m = e.result();
        assert_eq!(m.frames, 2);
        assert_eq!(e.counts(0, 3), Some(Counts { tp: 1, fp: 0, fn_: 1 }));
        assert!(close(m.classes[0].ious[3], 1.0 / (2.0 + 1e-7)));
        // merging two halves equals adding everything to one
        let mut a = MapEval::new(&classes).unwrap();
        a.add(&[0.7], &[1]).unwrap();
        let mut b = MapEval::new(&classes).unwrap();
        b.add(&[0.1, 0.2, 0.3], &[1, 0, 0]).unwrap();
        a.merge(&b).unwrap();
        assert_eq!(a, e);
        assert!(a.merge(&MapEval::new(&names(2)).unwrap()).is_err());
    }

    #[test]
    fn empty_class_and_bad_input() {
        // never present, never predicted: IoU 0 (0 / 1e-7), as upstream
        let m = evaluate_map(&names(1), [(&[0.1f32, 0.2][..], &[0u8, 0][..])]).unwrap();
        assert_eq!(m.classes[0].max, 0.0);
        // NaN is never >= a threshold: a present cell with NaN is a false negative
        let mut e = MapEval::new(&names(1)).unwrap();
        e.add(&[f32::NAN, 0.9], &[1, 1]).unwrap();
        assert_eq!(e.counts(0, 0), Some(Counts { tp: 1, fp: 0, fn_: 1 }));
        assert!(e.add(&[0.5; 3], &[1; 2]).is_err());
        assert!(MapEval::new(&names(2)).unwrap().add(&[0.5; 3], &[1; 3]).is_err());
        assert!(MapEval::new(&names(1)).unwrap().add(&[], &[]).is_err());
        assert!(MapEval::new(&[]).is_err());
        // the thresholds are float32: 0.45f32 is a hair above 0.45, so p = 0.45f32 counts at 0.45
        let mut e = MapEval::new(&names(1)).unwrap();
        e.add(&[0.45], &[1]).unwrap();
        assert_eq!(e.counts(0, 2), Some(Counts { tp: 1, fp: 0, fn_: 0 }));
        assert_eq!(e.counts(0, 3), Some(Counts { tp: 0, fp: 0, fn_: 1 }));
    }
}
