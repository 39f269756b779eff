//! Weights read from safetensors, keyed by the upstream PyTorch `state_dict` names.
//!
//! safetensors only (never pickle: a checkpoint must not be able to run code). F32, F16 and BF16
//! tensors are converted to f32, and so are I64 / I32 tensors whose values f32 holds exactly
//! (integer parameters such as BEVFusion's `nx`). A leading `module.` (what `DistributedDataParallel` adds) is
//! stripped. BatchNorm's `num_batches_tracked` counters (int64, training bookkeeping) are accepted
//! in any dtype and dropped: inference never reads them, and exports may or may not carry them.
//! A NaN or infinite value in any tensor is an error at load ([`ModelError::NonFinite`], every
//! such tensor listed): one would otherwise spread through the network into NaN outputs or,
//! behind a ReLU or a max, into plausible-looking but wrong ones.

use crate::nn::{Misshaped, ModelError, NonFiniteTensor};
use half::{bf16, f16};
use safetensors::{Dtype, SafeTensors};
use std::collections::BTreeMap;
use std::path::Path;

/// One tensor: row-major f32 values of `shape`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// A tensor the architecture expects: its `state_dict` name and shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

impl WeightSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Named f32 tensors and where they came from (for error messages).
#[derive(Debug, Clone, Default)]
pub struct Weights {
    source: String,
    tensors: BTreeMap<String, Tensor>,
}

/// Counters BatchNorm keeps for training; never needed at inference.
pub fn is_ignored(name: &str) -> bool {
    name.ends_with("num_batches_tracked")
}

fn strip_module(name: &str) -> &str {
    name.strip_prefix("module.").unwrap_or(name)
}

fn file_err(file: &str, reason: impl Into<String>) -> ModelError {
    ModelError::File { file: file.to_string(), reason: reason.into() }
}

/// Little-endian bytes of `dtype` to f32; `None` for dtypes a weight cannot have.
fn to_f32(dtype: Dtype, bytes: &[u8]) -> Option<Vec<f32>> {
    match dtype {
        Dtype::F32 => Some(
            bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
        ),
        Dtype::F16 => Some(
            bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        ),
        Dtype::BF16 => Some(
            bytes.chunks_exact(2).map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect(),
        ),
        // Integer parameters and buffers (BEVFusion's `nx`, Swin's `relative_position_index`):
        // accepted when every value is exact in f32 (|v| <= 2^24).
        Dtype::I64 => bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .map(|v| (v.unsigned_abs() <= 1 << 24).then_some(v as f32))
            .collect(),
        Dtype::I32 => bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .map(|v| (v.unsigned_abs() <= 1 << 24).then_some(v as f32))
            .collect(),
        _ => None,
    }
}

/// The NaN / ±inf count of `data` and its first non-finite index; None when all are finite.
/// One pass over the values, no allocation (the clean case is a plain `position` scan).
fn non_finite(name: &str, data: &[f32]) -> Option<NonFiniteTensor> {
    let first = data.iter().position(|v| !v.is_finite())?;
    let (mut nan, mut pos_inf, mut neg_inf) = (0, 0, 0);
    for v in &data[first..] {
        if v.is_nan() {
            nan += 1;
        } else if *v == f32::INFINITY {
            pos_inf += 1;
        } else if *v == f32::NEG_INFINITY {
            neg_inf += 1;
        }
    }
    Some(NonFiniteTensor { name: name.to_string(), nan, pos_inf, neg_inf, first, numel: data.len() })
}

impl Weights {
    /// Reads a safetensors file. Errors name the file.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| file_err(&file, format!("cannot read: {e}")))?;
        Self::from_bytes(&bytes, &file)
    }

    /// Parses safetensors bytes; `source` names them in errors. Every value must be finite.
    pub fn from_bytes(bytes: &[u8], source: &str) -> Result<Self, ModelError> {
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| file_err(source, format!("not a valid safetensors file: {e}")))?;
        let mut w = Weights { source: source.to_string(), tensors: BTreeMap::new() };
        let mut bad = Vec::new();
        for (raw_name, view) in st.iter() {
            if is_ignored(raw_name) {
                continue;
            }
            let data = to_f32(view.dtype(), view.data()).ok_or_else(|| {
                file_err(
                    source,
                    format!(
                        "tensor `{raw_name}` has dtype {:?}; weights must be F32, F16 or BF16 (or I64/I32 \
                         with values up to 2^24 in magnitude)",
                        view.dtype()
                    ),
                )
            })?;
            bad.extend(non_finite(raw_name, &data));
            w.insert(raw_name, view.shape().to_vec(), data)?;
        }
        w.finite(bad)
    }

    /// Weights from in-memory tensors (names as in a `state_dict`). Every value must be finite.
    pub fn from_tensors<I>(source: &str, tensors: I) -> Result<Self, ModelError>
    where
        I: IntoIterator<Item = (String, Vec<usize>, Vec<f32>)>,
    {
        let mut w = Weights { source: source.to_string(), tensors: BTreeMap::new() };
        let mut bad = Vec::new();
        for (name, shape, data) in tensors {
            if is_ignored(&name) {
                continue;
            }
            let numel: usize = shape.iter().product();
            if numel != data.len() {
                return Err(file_err(
                    source,
                    format!("tensor `{name}` has {} values for shape {shape:?}", data.len()),
                ));
            }
            bad.extend(non_finite(&name, &data));
            w.insert(&name, shape, data)?;
        }
        w.finite(bad)
    }

    /// `self`, or the error listing the non-finite tensors (sorted by name: the file's own order
    /// is not kept by every reader).
    fn finite(self, mut bad: Vec<NonFiniteTensor>) -> Result<Self, ModelError> {
        if bad.is_empty() {
            return Ok(self);
        }
        bad.sort_by(|a, b| a.name.cmp(&b.name));
        Err(ModelError::NonFinite { file: self.source, tensors: bad })
    }

    fn insert(&mut self, raw_name: &str, shape: Vec<usize>, data: Vec<f32>) -> Result<(), ModelError> {
        let name = strip_module(raw_name).to_string();
        if self.tensors.contains_key(&name) {
            // `module.x` and `x` in one file: which one is meant is unknowable.
            return Err(file_err(
                &self.source,
                format!("two tensors are named `{name}` once a `module.` prefix is stripped"),
            ));
        }
        self.tensors.insert(name, Tensor { shape, data });
        Ok(())
    }

    pub fn source(&self) -> &str {
        &self.source
    }
    pub fn len(&self) -> usize {
        self.tensors.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Checks the tensors against what an architecture needs; the error lists every missing,
    /// unexpected and mis-shaped tensor.
    pub fn check(&self, specs: &[WeightSpec]) -> Result<(), ModelError> {
        let mut missing = Vec::new();
        let mut misshaped = Vec::new();
        let mut wanted = std::collections::HashSet::with_capacity(specs.len());
        for s in specs {
            wanted.insert(s.name.as_str());
            match self.tensors.get(&s.name) {
                None => missing.push(s.name.clone()),
                Some(t) if t.shape != s.shape => misshaped.push(Misshaped {
                    name: s.name.clone(),
                    expected: s.shape.clone(),
                    found: t.shape.clone(),
                }),
                Some(_) => {}
            }
        }
        let unexpected: Vec<String> =
            self.tensors.keys().filter(|n| !wanted.contains(n.as_str())).cloned().collect();
        if missing.is_empty() && unexpected.is_empty() && misshaped.is_empty() {
            Ok(())
        } else {
            Err(ModelError::Mismatch { file: self.source.clone(), missing, unexpected, misshaped })
        }
    }

    /// Moves the tensors whose names `keep` accepts into a store of their own, named like this
    /// one (their values were checked when they were loaded).
    pub fn split_off(&mut self, keep: impl Fn(&str) -> bool) -> Weights {
        let names: Vec<String> = self.tensors.keys().filter(|n| keep(n)).cloned().collect();
        let tensors = names.into_iter().filter_map(|n| self.tensors.remove(&n).map(|t| (n, t))).collect();
        Weights { source: self.source.clone(), tensors }
    }

    /// A copy of the tensors whose names `keep` accepts, named like this store.
    pub fn select(&self, keep: impl Fn(&str) -> bool) -> Weights {
        let tensors = self.tensors.iter().filter(|(n, _)| keep(n)).map(|(n, t)| (n.clone(), t.clone())).collect();
        Weights { source: self.source.clone(), tensors }
    }

    /// Removes and returns a tensor, if present (optional buffers a model checks itself).
    pub fn remove(&mut self, name: &str) -> Option<Tensor> {
        self.tensors.remove(name)
    }

    /// Removes and returns a tensor's values, checking its shape.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        match self.tensors.remove(name) {
            Some(t) if t.shape == shape => Ok(t.data),
            Some(t) => Err(ModelError::Mismatch {
                file: self.source.clone(),
                missing: vec![],
                unexpected: vec![],
                misshaped: vec![Misshaped {
                    name: name.to_string(),
                    expected: shape.to_vec(),
                    found: t.shape,
                }],
            }),
            None => Err(ModelError::Mismatch {
                file: self.source.clone(),
                missing: vec![name.to_string()],
                unexpected: vec![],
                misshaped: vec![],
            }),
        }
    }
}

/// Where a model builder gets each tensor: the weights file, or a [`SpecRecorder`] that lists the
/// specs. Every model (SphereFormer, the camera encoder) builds its layers through one `load`
/// path from either, so the spec list and the loader can never disagree.
pub(crate) trait TensorSource {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError>;
}

impl TensorSource for Weights {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.take(name, shape)
    }
}

/// Lists every tensor a builder asks for, in `state_dict` order; hands out ones, values every
/// layer constructor accepts (a BatchNorm variance of zero would not fold without an eps).
#[derive(Default)]
pub(crate) struct SpecRecorder(pub(crate) Vec<WeightSpec>);

impl TensorSource for SpecRecorder {
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        self.0.push(WeightSpec { name: name.to_string(), shape: shape.to_vec() });
        Ok(vec![1.0; shape.iter().product()])
    }
}

/// A layer constructor's error on loaded values, as a model error naming the tensor.
pub(crate) fn bad_weights(name: &str, e: crate::Error) -> ModelError {
    ModelError::Config(format!("{name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    /// safetensors bytes of `(name, dtype, shape, raw little-endian bytes)`.
    fn file(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let views: Vec<(String, TensorView)> =
            tensors.iter().map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
        safetensors::serialize(views, None).unwrap()
    }

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn non_finite_of(bytes: &[u8]) -> Vec<NonFiniteTensor> {
        match Weights::from_bytes(bytes, "w.safetensors") {
            Err(ModelError::NonFinite { file, tensors }) => {
                assert_eq!(file, "w.safetensors");
                tensors
            }
            other => panic!("expected a non-finite error, got {other:?}"),
        }
    }

    #[test]
    fn finite_tensors_load() {
        let b = file(&[("a.weight", Dtype::F32, vec![2], f32s(&[1.0, f32::MAX])), ("n", Dtype::I64, vec![1], 7i64.to_le_bytes().to_vec())]);
        let w = Weights::from_bytes(&b, "w").unwrap();
        assert_eq!(w.get("a.weight").unwrap().data, vec![1.0, f32::MAX]);
        assert_eq!(w.get("n").unwrap().data, vec![7.0]);
    }

    #[test]
    fn nan_and_infinities_in_f32_are_counted() {
        let b = file(&[
            ("ok", Dtype::F32, vec![3], f32s(&[0.0, 1.0, -2.0])),
            ("x.nan", Dtype::F32, vec![2, 2], f32s(&[0.5, f32::NAN, 1.0, f32::NAN])),
            ("x.pinf", Dtype::F32, vec![3], f32s(&[f32::INFINITY, 0.0, 0.0])),
            ("x.ninf", Dtype::F32, vec![4], f32s(&[0.0, 0.0, 1.0, f32::NEG_INFINITY])),
        ]);
        let t = non_finite_of(&b);
        let nf = |name: &str, nan, pos_inf, neg_inf, first, numel| NonFiniteTensor { name: name.into(), nan, pos_inf, neg_inf, first, numel };
        assert_eq!(t, vec![nf("x.nan", 2, 0, 0, 1, 4), nf("x.ninf", 0, 0, 1, 3, 4), nf("x.pinf", 0, 1, 0, 0, 3)]);
    }

    #[test]
    fn half_precision_inf_and_nan_are_caught() {
        let f16b: Vec<u8> = [1.0f32, f32::INFINITY, -1.0].iter().flat_map(|v| f16::from_f32(*v).to_le_bytes()).collect();
        let t = non_finite_of(&file(&[("h", Dtype::F16, vec![3], f16b)]));
        assert_eq!((t[0].name.as_str(), t[0].pos_inf, t[0].nan, t[0].first), ("h", 1, 0, 1));
        let bf16b: Vec<u8> = [f32::NAN, 2.0].iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
        let t = non_finite_of(&file(&[("module.b", Dtype::BF16, vec![2], bf16b)]));
        // named as in the file, `module.` and all
        assert_eq!((t[0].name.as_str(), t[0].nan, t[0].first), ("module.b", 1, 0));
        // F16's largest finite value is finite
        let max: Vec<u8> = f16::MAX.to_le_bytes().to_vec();
        assert!(Weights::from_bytes(&file(&[("m", Dtype::F16, vec![1], max)]), "w").is_ok());
    }

    #[test]
    fn the_message_names_file_tensors_counts_and_index() {
        let mut v = vec![0.0f32; 100];
        v[37] = f32::NAN;
        v[40] = f32::INFINITY;
        v[41] = f32::NEG_INFINITY;
        v[42] = f32::NAN;
        let e = Weights::from_bytes(&file(&[("heads.map.classifier.6.weight", Dtype::F32, vec![100], f32s(&v))]), "ckpt.safetensors").unwrap_err().to_string();
        for want in ["ckpt.safetensors", "1 tensor holds NaN or infinite values", "heads.map.classifier.6.weight", "2 NaN, 1 +inf, 1 -inf of 100 values", "first at index 37", "export the weights again"] {
            assert!(e.contains(want), "`{want}` not in: {e}");
        }
        // every bad tensor is counted; the first few are listed, then "and N more"
        let many: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = (0..11).map(|i| (format!("t{i:02}"), Dtype::F32, vec![1], f32s(&[f32::NAN]))).collect();
        let refs: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = many.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
        let e = Weights::from_bytes(&file(&refs), "w").unwrap_err().to_string();
        assert!(e.contains("11 tensors hold"), "{e}");
        assert!(e.contains("t00: 1 NaN") && e.contains("t07: 1 NaN") && !e.contains("t08:"), "{e}");
        assert!(e.contains("and 3 more"), "{e}");
    }

    #[test]
    fn in_memory_tensors_are_checked_too() {
        let t = vec![("a".to_string(), vec![2], vec![1.0, 2.0]), ("b".to_string(), vec![1], vec![f32::NEG_INFINITY])];
        match Weights::from_tensors("mem", t) {
            Err(ModelError::NonFinite { file, tensors }) => {
                assert_eq!(file, "mem");
                assert_eq!((tensors.len(), tensors[0].name.as_str(), tensors[0].neg_inf), (1, "b", 1));
            }
            other => panic!("{other:?}"),
        }
        // an ignored counter is not checked (it is dropped)
        let t = vec![("bn.num_batches_tracked".to_string(), vec![1], vec![f32::NAN])];
        assert!(Weights::from_tensors("mem", t).unwrap().is_empty());
    }

    #[test]
    fn split_off_and_select_keep_the_source() {
        let t = vec![("a.x".to_string(), vec![1], vec![1.0]), ("b.y".to_string(), vec![1], vec![2.0])];
        let mut w = Weights::from_tensors("f", t).unwrap();
        let s = w.select(|n| n.starts_with("a."));
        assert_eq!((s.source(), s.len(), w.len()), ("f", 1, 2));
        let a = w.split_off(|n| n.starts_with("a."));
        assert_eq!((a.source(), a.names().collect::<Vec<_>>(), w.names().collect::<Vec<_>>()), ("f", vec!["a.x"], vec!["b.y"]));
    }
}
