//! Ground-truth labels of a LiDAR frame, point by point with the LiDAR message (before any
//! NaN point is dropped), as raw ids for [`crate::eval::LabelMap`]:
//!
//! * a label topic: a PointCloud2 in the same bag whose header stamp equals the LiDAR
//!   message's, with a label field (`label`, `class_id`, `semantic_label` or `labels`, any
//!   integer or float datatype). The label topic is read in a first pass and kept as ids;
//! * a directory of SemanticKITTI `.label` files (little-endian uint32 per point), the file
//!   of frame `i` (timestamp order, from 0) named `{i:06}.label`.
//!
//! A frame whose labels are missing or do not fit (another point count) is replayed but not
//! evaluated; the reason names the file or topic and the frame.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::msgs::cdr::{CdrMessage, PointCloud2};
use crate::bag::Bag;
use crate::msgs::cloud::field_values;
use crate::eval::labels::raw_ids;

/// Label field names, in order of preference.
pub const LABEL_FIELDS: &[&str] = &["label", "class_id", "semantic_label", "labels"];

/// `--labels-topic` or `--labels-dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelSource {
    Topic(String),
    Dir(PathBuf),
}

impl LabelSource {
    pub fn describe(&self) -> String {
        match self {
            LabelSource::Topic(t) => format!("label topic {t}"),
            LabelSource::Dir(d) => format!("SemanticKITTI .label files in {}", d.display()),
        }
    }
}

/// Loaded ground truth, ready to answer per frame.
pub enum GroundTruthSource {
    /// Label topic: ids (or why they are unusable) by header stamp (ns).
    Topic {
        topic: String,
        by_stamp: HashMap<i64, Result<Vec<u32>, String>>,
    },
    Dir(PathBuf),
}

impl GroundTruthSource {
    /// Reads the label topic of `bag` (first pass), or checks the directory.
    pub fn open(bag: &Bag, source: &LabelSource) -> Result<GroundTruthSource, String> {
        match source {
            LabelSource::Dir(d) => {
                if !d.is_dir() {
                    return Err(format!("--labels-dir {}: not a directory", d.display()));
                }
                Ok(GroundTruthSource::Dir(d.clone()))
            }
            LabelSource::Topic(topic) => {
                let mut by_stamp = HashMap::new();
                // Damage ends this pass early; the LiDAR pass meets it too and reports it.
                for m in bag.messages(&[topic.as_str()]).map_while(Result::ok) {
                    let (stamp, ids) = match PointCloud2::from_cdr(&m.data) {
                        Ok(c) => (c.header.stamp.as_nanos(), label_ids(&c, topic)),
                        Err(e) => (
                            m.timestamp_ns,
                            Err(format!(
                                "label message at {} ns on {topic} cannot be decoded: {e}",
                                m.timestamp_ns
                            )),
                        ),
                    };
                    by_stamp.insert(stamp, ids);
                }
                Ok(GroundTruthSource::Topic {
                    topic: topic.clone(),
                    by_stamp,
                })
            }
        }
    }

    /// Raw ids of frame `index` (LiDAR header stamp `stamp_ns`) with `points` points, or why
    /// there are none usable.
    pub fn labels(&self, index: u64, stamp_ns: i64, points: usize) -> Result<Vec<u32>, String> {
        let (ids, from) = match self {
            GroundTruthSource::Topic { topic, by_stamp } => match by_stamp.get(&stamp_ns) {
                Some(Ok(ids)) => (
                    ids.clone(),
                    format!("label cloud on {topic} (stamp {stamp_ns} ns)"),
                ),
                Some(Err(e)) => return Err(e.clone()),
                None => {
                    return Err(format!(
                        "no label cloud on {topic} with stamp {stamp_ns} ns"
                    ))
                }
            },
            GroundTruthSource::Dir(dir) => {
                let path = dir.join(format!("{index:06}.label"));
                (read_label_file(&path)?, path.display().to_string())
            }
        };
        if ids.len() != points {
            return Err(format!(
                "{from} has {} labels but LiDAR frame {index} has {points} points",
                ids.len()
            ));
        }
        Ok(ids)
    }
}

/// The label field of a label cloud as raw ids.
fn label_ids(c: &PointCloud2, topic: &str) -> Result<Vec<u32>, String> {
    match field_values(&c.view(), LABEL_FIELDS) {
        Ok(Some(v)) => Ok(raw_ids(&v)),
        Ok(None) => Err(format!(
            "label cloud on {topic} (stamp {} ns) has no label field (looked for {LABEL_FIELDS:?}; fields: {:?})",
            c.header.stamp.as_nanos(),
            c.cloud.fields.iter().map(|f| f.name.as_str()).collect::<Vec<_>>()
        )),
        Err(e) => Err(format!("label cloud on {topic} (stamp {} ns): {e}", c.header.stamp.as_nanos())),
    }
}

/// A SemanticKITTI `.label` file: one little-endian uint32 per point.
pub fn read_label_file(path: &Path) -> Result<Vec<u32>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if bytes.len() % 4 != 0 {
        return Err(format!(
            "{}: {} bytes is not a whole number of uint32 labels (truncated?)",
            path.display(),
            bytes.len()
        ));
    }
    Ok(bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}
