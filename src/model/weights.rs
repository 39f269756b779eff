//! Weights read from safetensors, keyed by the upstream PyTorch `state_dict` names.
//!
//! safetensors only (never pickle: a checkpoint must not be able to run code). F32, F16 and BF16
//! tensors are converted to f32, and so are I64 / I32 tensors whose values f32 holds exactly
//! (integer parameters such as BEVFusion's `nx`). A leading `module.` (what `DistributedDataParallel` adds) is
//! stripped. BatchNorm's `num_batches_tracked` counters (int64, training bookkeeping) are accepted
//! in any dtype and dropped: inference never reads them, and exports may or may not carry them.

use super::{Misshaped, ModelError};
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

impl Weights {
    /// Reads a safetensors file. Errors name the file.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let file = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| file_err(&file, format!("cannot read: {e}")))?;
        Self::from_bytes(&bytes, &file)
    }

    /// Parses safetensors bytes; `source` names them in errors.
    pub fn from_bytes(bytes: &[u8], source: &str) -> Result<Self, ModelError> {
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| file_err(source, format!("not a valid safetensors file: {e}")))?;
        let mut w = Weights { source: source.to_string(), tensors: BTreeMap::new() };
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
            w.insert(raw_name, view.shape().to_vec(), data)?;
        }
        Ok(w)
    }

    /// Weights from in-memory tensors (names as in a `state_dict`).
    pub fn from_tensors<I>(source: &str, tensors: I) -> Result<Self, ModelError>
    where
        I: IntoIterator<Item = (String, Vec<usize>, Vec<f32>)>,
    {
        let mut w = Weights { source: source.to_string(), tensors: BTreeMap::new() };
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
            w.insert(&name, shape, data)?;
        }
        Ok(w)
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
