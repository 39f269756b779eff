//! The library's error type: every failure a caller can act on, with what went wrong in words.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("{0}")]
    Io(String),
    #[error(transparent)]
    Cloud(#[from] CloudError),
    #[error(transparent)]
    Config(#[from] crate::error::ConfigError),
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("kernel compile: {0}")]
    KernelCompile(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A configuration file that cannot be used: unreadable, not parseable, or a value out of range;
/// the file and the key are named so the user knows what to fix.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("{file}: cannot read: {reason}")]
    Read { file: String, reason: String },
    /// serde's message names the unknown or mistyped key and its line.
    #[error("{file}: {reason}")]
    Parse { file: String, reason: String },
    #[error("{file}: `{key}` {reason}")]
    Value { file: String, key: String, reason: String },
}

pub(crate) fn value_err(file: &str, key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: file.to_string(), key: key.to_string(), reason: reason.into() }
}

/// A PointCloud2 body that cannot be decoded, or points that cannot be encoded.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CloudError {
    #[error(
        "PointCloud2 has point_step 0 with width {width} and height {height}: every point needs \
         at least the bytes of its x, y, z fields; the publisher filled the message wrongly"
    )]
    ZeroPointStep { width: u32, height: u32 },

    #[error(
        "PointCloud2 row_step {row_step} is smaller than width {width} × point_step {point_step} \
         = {needed} bytes, so rows would overlap; the publisher must set row_step >= \
         width * point_step"
    )]
    RowStepTooSmall {
        row_step: u32,
        width: u32,
        point_step: u32,
        needed: u64,
    },

    #[error(
        "PointCloud2 data is truncated: {actual} bytes, but height {height} × row_step \
         {row_step} = {expected} bytes are declared; the message was cut short or its \
         height/width/row_step are wrong"
    )]
    Truncated {
        height: u32,
        row_step: u32,
        expected: u64,
        actual: usize,
    },

    #[error(
        "PointCloud2 field `{name}` (offset {offset}, {size}-byte elements × count {count}) ends \
         at byte {end}, past point_step {point_step}; the field table does not match the point \
         layout"
    )]
    FieldOutOfBounds {
        name: String,
        offset: u32,
        size: u32,
        count: u32,
        end: u64,
        point_step: u32,
    },

    #[error(
        "PointCloud2 has no `{name}` field (fields present: [{present}]); x, y and z are required \
         (publish a cloud with xyz coordinates, or rename the fields upstream)"
    )]
    MissingField { name: &'static str, present: String },

    #[error(
        "PointCloud2 field `{name}` has datatype {datatype}, which is not a sensor_msgs/PointField \
         datatype (1 = INT8 ... 8 = FLOAT64)"
    )]
    UnknownDatatype { name: String, datatype: u8 },

    #[error(
        "PointCloud2 field `{name}` has count 0, so it holds no value; a field must have count >= 1"
    )]
    ZeroCount { name: String },

    #[error("PointCloud2 sizes overflow: {what}; the header's width/height/steps are corrupt or too large for this machine")]
    SizeOverflow { what: String },

    #[error(
        "cannot encode: {what} has {actual} entries but the cloud has {expected} points; pass one \
         entry per point"
    )]
    LengthMismatch {
        what: &'static str,
        expected: usize,
        actual: usize,
    },
}
