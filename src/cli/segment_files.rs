//! Cloud files in, label files out, for `sptr segment`.
//!
//! Inputs: KITTI `.bin` (float32 × 4: x, y, z, intensity), nuScenes `.bin` (float32 × 5: x, y,
//! z, intensity, ring; the first 4 are used, as upstream), x/y/z-only `.bin` (float32 × 3,
//! intensity zero) and PCD (`DATA ascii` or `binary`;
//! fields `x`, `y`, `z` required, `intensity` (or `i`) optional, zero when absent).
//!
//! Output: a SemanticKITTI `.label` file, one little-endian uint32 per input point, the semantic
//! id in the low 16 bits and instance 0 in the high 16. Which ids: see [`LabelIds`].

use crate::models::sphereformer::segmenter::UNLABELED;
use crate::Error;
use std::path::Path;

/// How a class id becomes a `.label` semantic id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelIds {
    /// SemanticKITTI's raw ids (its `learning_map_inv`: car 10, bicycle 11, …), unlabeled 0: what
    /// the SemanticKITTI tools and benchmark read. Used when the model's classes are the 19
    /// SemanticKITTI training classes in order.
    SemanticKitti,
    /// `class id + 1`, unlabeled 0 (the training label space with 0 as "ignore"): any other model.
    TrainPlusOne,
}

/// SemanticKITTI's 19 training classes, in training order (`learning_map` ids 1..=19).
const KITTI_CLASSES: [&str; 19] = [
    "car", "bicycle", "motorcycle", "truck", "other-vehicle", "person", "bicyclist", "motorcyclist", "road",
    "parking", "sidewalk", "other-ground", "building", "fence", "vegetation", "trunk", "terrain", "pole",
    "traffic-sign",
];
/// `learning_map_inv` for ids 1..=19 (SemanticKITTI's `semantic-kitti.yaml`).
const KITTI_RAW_IDS: [u32; 19] = [10, 11, 15, 18, 20, 30, 31, 32, 40, 44, 48, 49, 50, 51, 70, 71, 72, 80, 81];

impl LabelIds {
    /// SemanticKITTI raw ids for a model whose class names are SemanticKITTI's, else class + 1.
    pub fn for_classes(names: &[String]) -> Self {
        if names.len() == KITTI_CLASSES.len() && names.iter().zip(KITTI_CLASSES).all(|(a, b)| a == b) {
            LabelIds::SemanticKitti
        } else {
            LabelIds::TrainPlusOne
        }
    }

    /// The `.label` semantic id of a class (or of [`UNLABELED`]).
    pub fn semantic_id(self, class: u32) -> u32 {
        if class == UNLABELED {
            return 0;
        }
        match self {
            LabelIds::SemanticKitti => KITTI_RAW_IDS.get(class as usize).copied().unwrap_or(0),
            LabelIds::TrainPlusOne => (class + 1) & 0xFFFF,
        }
    }
}

/// Writes a SemanticKITTI `.label` file for per-point class ids.
pub fn write_label_file(path: &Path, labels: &[u32], ids: LabelIds) -> Result<(), Error> {
    let bytes: Vec<u8> = labels.iter().flat_map(|&c| ids.semantic_id(c).to_le_bytes()).collect();
    std::fs::write(path, bytes).map_err(|e| Error::Io(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_ids() {
        let kitti: Vec<String> = KITTI_CLASSES.iter().map(|s| s.to_string()).collect();
        let ids = LabelIds::for_classes(&kitti);
        assert_eq!(ids, LabelIds::SemanticKitti);
        assert_eq!((ids.semantic_id(0), ids.semantic_id(18), ids.semantic_id(UNLABELED)), (10, 81, 0));
        let other = LabelIds::for_classes(&["barrier".to_string()]);
        assert_eq!((other.semantic_id(0), other.semantic_id(UNLABELED)), (1, 0));
    }
}
