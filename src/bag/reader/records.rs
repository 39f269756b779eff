//! What every reader of a bag's storage files shares: the error type, one message as read, the
//! buffer accounting, and the MCAP record helpers of both MCAP readers.

use std::io;
use std::path::{Path, PathBuf};

/// Errors reading a bag. Each names the file it is about.
#[derive(Debug, thiserror::Error)]
pub enum BagError {
    #[error("{dir}: no metadata.yaml in this directory (not a rosbag2 bag directory?)")]
    MissingMetadata { dir: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: malformed rosbag2 metadata: {source}")]
    Metadata {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{path}: unknown storage_identifier '{id}' (supported: mcap, sqlite3)")]
    UnknownStorage { path: PathBuf, id: String },
    #[error(
        "{path}: rosbag2 {mode} compression ({format}) is not supported; decompress the bag first"
    )]
    UnsupportedCompression {
        path: PathBuf,
        mode: String,
        format: String,
    },
    #[error("{path}: metadata lists no storage files")]
    NoFiles { path: PathBuf },
    #[error("{path}: not an MCAP file or damaged before any message: {source}")]
    McapOpen {
        path: PathBuf,
        #[source]
        source: mcap::McapError,
    },
    #[error("{path}: MCAP damaged at message {index} of this file (last good timestamp {}): {source}", fmt_ts(*.last_timestamp_ns))]
    Mcap {
        path: PathBuf,
        /// Messages of this file read before the damage: in file order, or, for a file read
        /// through its chunk index, the messages delivered (in time order) before it.
        index: u64,
        /// The timestamp of the last of those messages.
        last_timestamp_ns: Option<i64>,
        #[source]
        source: mcap::McapError,
    },
    /// A record whose string, byte field or map declares more bytes than the record holds,
    /// refused before the `mcap` crate parses it (it would reserve the declared length first).
    #[error("{path}: MCAP damaged at message {index} of this file (last good timestamp {}): {detail}", fmt_ts(*.last_timestamp_ns))]
    McapRecord {
        path: PathBuf,
        /// As for [`BagError::Mcap`].
        index: u64,
        last_timestamp_ns: Option<i64>,
        /// The record type, the field, its declared length and the bytes left.
        detail: String,
    },
    #[error("{path}: SQLite error opening the bag file: {source}")]
    SqliteOpen {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{path}: SQLite error at message {index} of this file (last good timestamp {}): {source}", fmt_ts(*.last_timestamp_ns))]
    Sqlite {
        path: PathBuf,
        /// Messages of this file read before the error.
        index: u64,
        last_timestamp_ns: Option<i64>,
        #[source]
        source: rusqlite::Error,
    },
}

fn fmt_ts(t: Option<i64>) -> String {
    match t {
        Some(t) => format!("{t} ns"),
        None => "none".to_string(),
    }
}

impl BagError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            BagError::MissingMetadata { dir } => dir,
            BagError::Io { path, .. }
            | BagError::Metadata { path, .. }
            | BagError::UnknownStorage { path, .. }
            | BagError::UnsupportedCompression { path, .. }
            | BagError::NoFiles { path }
            | BagError::McapOpen { path, .. }
            | BagError::Mcap { path, .. }
            | BagError::McapRecord { path, .. }
            | BagError::SqliteOpen { path, .. }
            | BagError::Sqlite { path, .. } => path,
        }
    }
}

/// One message: its topic, type, receive timestamp and serialized (CDR) bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawMessage {
    pub topic: String,
    pub type_name: String,
    pub timestamp_ns: i64,
    pub data: Vec<u8>,
}

/// How much a [`Messages`] iterator held decoded at once, waiting to be delivered: what its
/// memory grows with (see [`Messages::peak_buffered`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferUse {
    /// MCAP chunks read through the file's chunk index with messages not yet delivered.
    pub chunks: usize,
    /// Payload bytes of the messages held.
    pub bytes: u64,
}

impl BufferUse {
    /// Each count the larger of the two (the peaks of chunks and of bytes may be at different
    /// times).
    pub(crate) fn max(self, other: BufferUse) -> BufferUse {
        BufferUse {
            chunks: self.chunks.max(other.chunks),
            bytes: self.bytes.max(other.bytes),
        }
    }
}

/// The current and the most [`BufferUse`] of one reader.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Held {
    pub(crate) now: BufferUse,
    pub(crate) peak: BufferUse,
}

impl Held {
    pub(crate) fn add(&mut self, chunks: usize, bytes: u64) {
        self.now.chunks += chunks;
        self.now.bytes += bytes;
        self.peak = self.peak.max(self.now);
    }

    pub(crate) fn remove(&mut self, chunks: usize, bytes: u64) {
        self.now.chunks = self.now.chunks.saturating_sub(chunks);
        self.now.bytes = self.now.bytes.saturating_sub(bytes);
    }
}

/// The receive timestamp rosbag2 stores as the MCAP log time (beyond `i64::MAX`, saturated, so
/// such stamps compare equal and keep file order, as a sort by timestamp gives).
pub(crate) fn log_time_ns(log_time: u64) -> i64 {
    i64::try_from(log_time).unwrap_or(i64::MAX)
}

/// Whether `filter` (empty: every topic) takes messages of `topic`.
pub(crate) fn topic_wanted(filter: &[String], topic: &str) -> bool {
    filter.is_empty() || filter.iter().any(|f| f == topic)
}

/// A message of `channel` as the bag reader yields it.
pub(crate) fn raw_message(channel: &mcap::Channel<'_>, log_time: u64, data: Vec<u8>) -> RawMessage {
    RawMessage {
        topic: channel.topic.clone(),
        type_name: channel
            .schema
            .as_ref()
            .map(|s| s.name.clone())
            .unwrap_or_default(),
        timestamp_ns: log_time_ns(log_time),
        data,
    }
}

/// The record length limit of every read of a file of `file_len` bytes: a corrupt length field
/// cannot make the reader reserve more memory than the file can back, with room for a 64x
/// compression ratio inside chunks, and never under 64 MiB.
pub(crate) fn record_length_limit(file_len: u64) -> usize {
    const FLOOR: u64 = 64 << 20;
    usize::try_from(file_len.saturating_mul(64).max(FLOOR)).unwrap_or(usize::MAX)
}

