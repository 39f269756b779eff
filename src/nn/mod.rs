//! What the models share that is not compute: safetensors weights keyed by the upstream
//! `state_dict` names (`weights`), their errors ([`ModelError`]: a file, a mismatch with the
//! architecture, non-finite values), deterministic random weights for tests and benchmarks
//! (`random`) and float32 `.npy` files (`npy`).

pub mod npy;
pub mod random;
pub mod weights;

pub use weights::{WeightSpec, Weights};

/// What can go wrong loading a model: the weights file, its contents against the architecture,
/// or a configuration the architecture cannot be built from.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file cannot be read or is not a valid safetensors file (truncated, bad header,
    /// unsupported dtype, two tensors with one name).
    #[error("{file}: {reason}")]
    File { file: String, reason: String },
    /// The tensors do not match the architecture; every problem is listed at once so a user fixes
    /// a conversion script in one go.
    #[error("{}", mismatch_text(.file, .missing, .unexpected, .misshaped))]
    Mismatch {
        file: String,
        /// Names the architecture needs that the file lacks.
        missing: Vec<String>,
        /// Names in the file the architecture does not have.
        unexpected: Vec<String>,
        /// Names present in both with a different shape.
        misshaped: Vec<Misshaped>,
    },
    /// The model configuration cannot be built (e.g. upstream itself would fail with it).
    #[error("model config: {0}")]
    Config(String),
    /// Tensors holding NaN or infinite values (a corrupt file, or an export of a diverged
    /// run): every such tensor, in the file's name order.
    #[error("{}", non_finite_text(.file, .tensors))]
    NonFinite { file: String, tensors: Vec<NonFiniteTensor> },
}

/// A tensor with NaN or infinite values: how many of each, and where the first one is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NonFiniteTensor {
    pub name: String,
    pub nan: usize,
    pub pos_inf: usize,
    pub neg_inf: usize,
    /// Flat (row-major) index of the first non-finite value.
    pub first: usize,
    /// The tensor's value count.
    pub numel: usize,
}

/// How many non-finite tensors the message names one by one (the rest are counted).
const NON_FINITE_LISTED: usize = 8;

fn non_finite_text(file: &str, tensors: &[NonFiniteTensor]) -> String {
    let mut s = format!(
        "{file}: {} {} NaN or infinite values; the file is corrupt or was exported from a run that \
         diverged: export the weights again from a good checkpoint",
        tensors.len(),
        if tensors.len() == 1 { "tensor holds" } else { "tensors hold" }
    );
    for t in tensors.iter().take(NON_FINITE_LISTED) {
        s.push_str(&format!(
            "\n  {}: {} NaN, {} +inf, {} -inf of {} values (first at index {})",
            t.name, t.nan, t.pos_inf, t.neg_inf, t.numel, t.first
        ));
    }
    if tensors.len() > NON_FINITE_LISTED {
        s.push_str(&format!("\n  and {} more", tensors.len() - NON_FINITE_LISTED));
    }
    s
}

/// A tensor whose shape in the file differs from the architecture's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misshaped {
    pub name: String,
    pub expected: Vec<usize>,
    pub found: Vec<usize>,
}

fn mismatch_text(
    file: &str,
    missing: &[String],
    unexpected: &[String],
    misshaped: &[Misshaped],
) -> String {
    let mut s = format!(
        "{file}: weights do not match the model ({} missing, {} unexpected, {} mis-shaped)",
        missing.len(),
        unexpected.len(),
        misshaped.len()
    );
    for n in missing {
        s.push_str(&format!("\n  missing: {n}"));
    }
    for n in unexpected {
        s.push_str(&format!("\n  unexpected: {n}"));
    }
    for m in misshaped {
        s.push_str(&format!(
            "\n  mis-shaped: {} expected {:?} found {:?}",
            m.name, m.expected, m.found
        ));
    }
    s
}

impl From<ModelError> for crate::Error {
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::File { .. } => crate::Error::Io(e.to_string()),
            _ => crate::Error::InvalidInput(e.to_string()),
        }
    }
}
