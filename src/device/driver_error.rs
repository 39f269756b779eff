//! CUDA driver errors as this crate's [`Error`], saying what was being done.

use crate::Error;
use cudarc::driver::DriverError;

/// Turns a driver error into ours, naming what was being done.
pub fn cuda_err(what: impl Into<String>) -> impl Fn(DriverError) -> Error {
    let what = what.into();
    move |e| Error::Cuda(format!("{what}: {e:?}"))
}
