//! `sptr eval agreement A B`: how often two replays gave the same class to a point, frame by
//! frame, from their output bags (`/sptr/output/points`, `class_id`). This is the CPU-vs-CUDA
//! check: replay a bag with `--device cpu` and `--device cuda`, then compare (the target is at
//! least 99.5 % of points agreeing).

use std::path::{Path, PathBuf};

use crate::bag::cdr::{CdrMessage, PointCloud2};
use crate::bag::Bag;
use crate::cloud::field_values;
use crate::outputs::OutputTopics;

use super::ReplayError;

/// Agreement of one frame.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameAgreement {
    pub timestamp_ns: i64,
    pub points: u64,
    pub same: u64,
}

/// Agreement of two replays.
#[derive(Debug, Clone, PartialEq)]
pub struct Agreement {
    pub frames: Vec<FrameAgreement>,
    pub points: u64,
    pub same: u64,
}

impl Agreement {
    /// Fraction of points with the same class (`None` without points).
    pub fn fraction(&self) -> Option<f64> {
        (self.points > 0).then(|| self.same as f64 / self.points as f64)
    }
}

/// `(receive time, class ids)` of every labeled cloud in a replay output (its directory or
/// its `bag/`).
fn class_ids(out: &Path) -> Result<Vec<(i64, Vec<f64>)>, ReplayError> {
    let dir: PathBuf = if out.join("bag").join("metadata.yaml").is_file() {
        out.join("bag")
    } else {
        out.to_path_buf()
    };
    let bag = Bag::open(&dir)?;
    let topic = OutputTopics::default().points;
    let mut v = Vec::new();
    for m in bag.messages(&[topic.as_str()]) {
        let m = m?;
        let bad = |why: String| {
            ReplayError::Setup(format!(
                "{}: labeled cloud at {} ns: {why}",
                dir.display(),
                m.timestamp_ns
            ))
        };
        let c = PointCloud2::from_cdr(&m.data).map_err(|e| bad(e.to_string()))?;
        let ids = field_values(&c.view(), &["class_id"])
            .map_err(|e| bad(e.to_string()))?
            .ok_or_else(|| bad("no class_id field".into()))?;
        v.push((m.timestamp_ns, ids));
    }
    Ok(v)
}

/// Compares the labeled clouds of two replay outputs frame by frame (matched by receive time;
/// the frames and their point counts must be the same).
pub fn agreement(a: &Path, b: &Path) -> Result<Agreement, ReplayError> {
    let (ca, cb) = (class_ids(a)?, class_ids(b)?);
    if ca.len() != cb.len() {
        return Err(ReplayError::Setup(format!(
            "{} has {} labeled frames, {} has {}: compare replays of the same bag and shard",
            a.display(),
            ca.len(),
            b.display(),
            cb.len()
        )));
    }
    let mut out = Agreement {
        frames: Vec::new(),
        points: 0,
        same: 0,
    };
    for ((ta, la), (tb, lb)) in ca.iter().zip(&cb) {
        if ta != tb || la.len() != lb.len() {
            return Err(ReplayError::Setup(format!(
                "frame at {ta} ns ({} points) in {} meets frame at {tb} ns ({} points) in {}: not replays of the same frames",
                la.len(),
                a.display(),
                lb.len(),
                b.display()
            )));
        }
        let same = la.iter().zip(lb).filter(|(x, y)| x == y).count() as u64;
        out.frames.push(FrameAgreement {
            timestamp_ns: *ta,
            points: la.len() as u64,
            same,
        });
        out.points += la.len() as u64;
        out.same += same;
    }
    Ok(out)
}
