//! Ground-truth labels: raw ids (a SemanticKITTI `.label` file's low 16 bits, or a label
//! field of a PointCloud2) → the model's class ids.
//!
//! A label map YAML is SemanticKITTI's own config form (`semantic-kitti.yaml` works as is;
//! keys other than these are ignored):
//!
//! ```yaml
//! learning_map: {0: 0, 1: 0, 10: 1, 11: 2, ...}   # raw id -> learning id
//! ignore_index: 0     # optional: learning id that is not evaluated (default 0)
//! first_class: 1      # optional: learning id of the model's class 0 (default 1)
//! ```
//!
//! Per point: `v = learning_map[raw & 0xFFFF]` (a raw id missing from the map is ignored and
//! counted as `unmapped`); `v == ignore` is ignored; else the class is `v - first_class`. The
//! defaults are the SemanticKITTI and nuScenes-lidarseg convention SphereFormer trains with
//! (learning id 0 = unlabeled, 1.. = classes). Without a map, `v = raw & 0xFFFF`, the ignore id
//! is 255 (the labeled cloud's "no class") and `first_class` is 0, so a cloud of class ids, such
//! as replay's own output, is ground truth as it is. A class at or past the model's class count
//! is counted as `out_of_range`, never evaluated.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use super::EvalError;

/// Raw id → learning id, the ignored learning id and the learning id of class 0.
#[derive(Debug, Clone, PartialEq)]
pub struct LabelMap {
    map: Option<HashMap<u32, u32>>,
    pub ignore: u32,
    pub first_class: u32,
}

#[derive(Deserialize)]
struct LabelMapYaml {
    learning_map: Option<HashMap<u32, u32>>,
    ignore_index: Option<u32>,
    first_class: Option<u32>,
}

/// One point's ground truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroundTruth {
    Class(u32),
    Ignored,
    /// The raw id has no entry in the label map.
    Unmapped,
    /// Mapped to a class id the model does not have.
    OutOfRange,
}

impl LabelMap {
    /// No map: raw ids are class ids, 255 is ignored (see the module doc).
    pub fn identity() -> LabelMap {
        LabelMap {
            map: None,
            ignore: 255,
            first_class: 0,
        }
    }

    /// Reads a label map YAML.
    pub fn load(path: &Path) -> Result<LabelMap, EvalError> {
        let text = std::fs::read_to_string(path).map_err(|e| EvalError::File {
            path: path.to_path_buf(),
            reason: format!("cannot read the label map: {e}"),
        })?;
        Self::parse(&text).map_err(|reason| EvalError::File {
            path: path.to_path_buf(),
            reason,
        })
    }

    /// Parses label map YAML text.
    pub fn parse(text: &str) -> Result<LabelMap, String> {
        let y: LabelMapYaml = serde_yaml::from_str(text).map_err(|e| {
            format!("not a label map YAML ({e}); expected `learning_map: {{raw: id, ...}}`")
        })?;
        let map = y.learning_map.ok_or(
            "no `learning_map` key: a label map needs `learning_map: {raw id: learning id, ...}`",
        )?;
        if map.is_empty() {
            return Err("`learning_map` is empty".into());
        }
        Ok(LabelMap {
            map: Some(map),
            ignore: y.ignore_index.unwrap_or(0),
            first_class: y.first_class.unwrap_or(1),
        })
    }

    /// Whether a `learning_map` is in use (else raw ids are class ids).
    pub fn has_map(&self) -> bool {
        self.map.is_some()
    }

    /// The ground truth of raw id `raw` for a model of `classes` classes.
    pub fn resolve(&self, raw: u32, classes: usize) -> GroundTruth {
        let raw = raw & 0xFFFF;
        let v = match &self.map {
            Some(m) => match m.get(&raw) {
                Some(&v) => v,
                None => return GroundTruth::Unmapped,
            },
            None => raw,
        };
        if v == self.ignore {
            return GroundTruth::Ignored;
        }
        match v.checked_sub(self.first_class) {
            Some(c) if (c as usize) < classes => GroundTruth::Class(c),
            Some(_) => GroundTruth::OutOfRange,
            None => GroundTruth::Ignored,
        }
    }

    /// A one-line description for reports.
    pub fn describe(&self) -> String {
        match &self.map {
            Some(m) => format!(
                "learning_map ({} raw ids), ignore {}, first class {}",
                m.len(),
                self.ignore,
                self.first_class
            ),
            None => format!("raw ids are class ids, ignore {}", self.ignore),
        }
    }
}

/// Raw label values of a label field (`f64`, as [`crate::msgs::cloud::field_values`] reads them) as
/// `u32`; a value that is negative, fractional or too large becomes `u32::MAX` (ignored unless
/// the map says otherwise, since `u32::MAX & 0xFFFF` = 65535 is no real id).
pub fn raw_ids(values: &[f64]) -> Vec<u32> {
    values
        .iter()
        .map(|&v| {
            if v >= 0.0 && v <= u32::MAX as f64 && v.fract() == 0.0 {
                v as u32
            } else {
                u32::MAX
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semantickitti_form() {
        let m =
            LabelMap::parse("labels: {0: unlabeled}\nlearning_map: {0: 0, 10: 1, 40: 9, 44: 10}\n")
                .unwrap();
        assert_eq!(m.resolve(10, 19), GroundTruth::Class(0));
        assert_eq!(
            m.resolve(40 | (7 << 16), 19),
            GroundTruth::Class(8),
            "instance bits are dropped"
        );
        assert_eq!(m.resolve(0, 19), GroundTruth::Ignored);
        assert_eq!(m.resolve(99, 19), GroundTruth::Unmapped);
        assert_eq!(m.resolve(44, 9), GroundTruth::OutOfRange);
    }

    #[test]
    fn identity_ignores_255() {
        let m = LabelMap::identity();
        assert_eq!(m.resolve(3, 16), GroundTruth::Class(3));
        assert_eq!(m.resolve(255, 16), GroundTruth::Ignored);
        assert_eq!(m.resolve(16, 16), GroundTruth::OutOfRange);
    }

    #[test]
    fn bad_maps_say_what_is_wrong() {
        assert!(LabelMap::parse("foo: 1\n")
            .unwrap_err()
            .contains("learning_map"));
        assert!(LabelMap::parse("learning_map: {}\n")
            .unwrap_err()
            .contains("empty"));
        assert!(LabelMap::parse("learning_map: [1, 2]\n")
            .unwrap_err()
            .contains("not a label map"));
    }

    #[test]
    fn raw_values_must_be_whole() {
        assert_eq!(
            raw_ids(&[0.0, 7.0, -1.0, 2.5, f64::NAN]),
            vec![0, 7, u32::MAX, u32::MAX, u32::MAX]
        );
    }
}
