//! One MCAP storage file's messages, sorted by log time (stable: equal stamps keep file order),
//! read from disk a chunk at a time.
//!
//! Which way a file is read:
//!
//! 1. With a summary whose chunk index covers every message: merged chunk by chunk in time
//!    order ([`IndexedMcap`]); memory holds the chunks that overlap in time.
//! 2. Without one (written unindexed, or cut short by a crash, which loses the summary at the
//!    end), a first pass checks whether the wanted messages already come in log-time order, up
//!    to the end or the first damage. They do in a recording whose receive stamps only grow,
//!    and then the file is streamed as it is read: a stable sort would not move any message.
//! 3. Otherwise the wanted messages are read into memory and sorted, as a linear reader must:
//!    without an index, the last message of the file may be the earliest.
//!
//! Paths 2 and 3 give exactly what reading everything and sorting gives, including the error
//! at the damage and the messages before it; path 2 reads the file twice to know that. Path 1
//! gives the same messages in the same order for an intact file; on damage in a chunk it gives
//! the messages that sort before the first chunk it did not read, then the error (damage is
//! where the read stops in time, not in file position).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use mcap::sans_io::LinearReaderOptions;

use super::mcap_indexed::IndexedMcap;
use super::{BagError, BufferUse, RawMessage};

type MessageResult = Result<RawMessage, BagError>;

/// Reads one MCAP file on the first `next()`: chooses how (see the module notes), then yields its
/// (filtered) messages in log-time order, then the error that stopped the read, if any.
pub(super) struct McapFileIter {
    path: PathBuf,
    filter: Vec<String>,
    state: State,
    /// What the whole-file fallback held (the indexed reader keeps its own count).
    sorted_bytes: u64,
}

enum State {
    Unopened,
    Indexed(Box<IndexedMcap>),
    InFileOrder(Box<LinearMessages>),
    Sorted(std::vec::IntoIter<MessageResult>),
    Done,
}

impl McapFileIter {
    pub(super) fn new(path: PathBuf, filter: Vec<String>) -> Self {
        McapFileIter {
            path,
            filter,
            state: State::Unopened,
            sorted_bytes: 0,
        }
    }

    pub(super) fn peak_buffered(&self) -> BufferUse {
        match &self.state {
            State::Indexed(ix) => ix.peak_buffered(),
            _ => BufferUse {
                chunks: 0,
                bytes: self.sorted_bytes,
            },
        }
    }

    fn open(&mut self) -> State {
        if let Some(ix) = IndexedMcap::open(&self.path, &self.filter) {
            return State::Indexed(Box::new(ix));
        }
        let linear = match LinearMessages::open(&self.path, &self.filter) {
            Ok(l) => l,
            Err(e) => return State::Sorted(vec![Err(e)].into_iter()),
        };
        if wanted_messages_in_log_time_order(&self.path, &self.filter) {
            return State::InFileOrder(Box::new(linear));
        }
        let (sorted, bytes) = read_all_sorted(linear);
        self.sorted_bytes = bytes;
        State::Sorted(sorted.into_iter())
    }
}

impl Iterator for McapFileIter {
    type Item = MessageResult;

    fn next(&mut self) -> Option<Self::Item> {
        if matches!(self.state, State::Unopened) {
            self.state = self.open();
        }
        let item = match &mut self.state {
            State::Unopened | State::Done => None,
            State::Indexed(ix) => ix.next(),
            State::InFileOrder(linear) => linear.next(),
            State::Sorted(it) => it.next(),
        };
        if matches!(item, None | Some(Err(_))) {
            // Keep the indexed reader's counts; drop everything else (file handles, buffers).
            if !matches!(self.state, State::Indexed(_)) {
                self.state = State::Done;
            }
        }
        item
    }
}

/// The receive timestamp rosbag2 stores as the MCAP log time (beyond `i64::MAX`, saturated, so
/// such stamps compare equal and keep file order, as a sort by timestamp gives).
pub(super) fn log_time_ns(log_time: u64) -> i64 {
    i64::try_from(log_time).unwrap_or(i64::MAX)
}

/// Whether `filter` (empty: every topic) takes messages of `topic`.
pub(super) fn topic_wanted(filter: &[String], topic: &str) -> bool {
    filter.is_empty() || filter.iter().any(|f| f == topic)
}

/// A message of `channel` as the bag reader yields it.
pub(super) fn raw_message(channel: &mcap::Channel<'_>, log_time: u64, data: Vec<u8>) -> RawMessage {
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

/// Options of every linear read of a file of `file_len` bytes: chunk CRCs checked where the
/// writer stored them (`ros2 bag record` does; a zero CRC, as `rosbags` writes, is skipped), and
/// a record length limit so that a corrupt length field cannot make the reader reserve more
/// memory than the file can back. The crate applies the limit to the records inside compressed
/// chunks too, which may be longer than the file: the bound leaves room for a 64x compression
/// ratio (clouds and images compress 2-4x) and is never under 64 MiB.
fn linear_options(file_len: u64) -> LinearReaderOptions {
    LinearReaderOptions::default().with_validate_chunk_crcs(true).with_record_length_limit(record_length_limit(file_len))
}

/// See [`linear_options`].
pub(super) fn record_length_limit(file_len: u64) -> usize {
    const FLOOR: u64 = 64 << 20;
    usize::try_from(file_len.saturating_mul(64).max(FLOOR)).unwrap_or(usize::MAX)
}

fn open_linear_reader(path: &Path) -> std::io::Result<mcap::io::MessageReader<BufReader<File>>> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    Ok(mcap::io::MessageReader::new_with_options(
        BufReader::new(file),
        linear_options(len),
    ))
}

fn wanted_messages_in_log_time_order(path: &Path, filter: &[String]) -> bool {
    let Ok(reader) = open_linear_reader(path) else {
        // The reading pass reports the error.
        return true;
    };
    let mut last = i64::MIN;
    for item in reader {
        let Ok(m) = item else { break };
        if !topic_wanted(filter, &m.channel.topic) {
            continue;
        }
        let t = log_time_ns(m.log_time);
        if t < last {
            return false;
        }
        last = t;
    }
    true
}

/// Every message of a linear read, sorted by timestamp (stable), then its error, if any; and the
/// payload bytes held.
fn read_all_sorted(linear: LinearMessages) -> (Vec<MessageResult>, u64) {
    let mut msgs = Vec::new();
    let mut error = None;
    for item in linear {
        match item {
            Ok(m) => msgs.push(m),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    msgs.sort_by_key(|m| m.timestamp_ns); // stable
    let bytes = msgs.iter().map(|m| m.data.len() as u64).sum();
    let mut out: Vec<MessageResult> = msgs.into_iter().map(Ok).collect();
    out.extend(error.map(Err));
    (out, bytes)
}

/// An MCAP file's messages on the filter's topics in file order, read through a buffered
/// reader: one chunk decompressed at a time.
struct LinearMessages {
    path: PathBuf,
    filter: Vec<String>,
    reader: mcap::io::MessageReader<BufReader<File>>,
    /// Messages read (on every topic), for the error's position.
    index: u64,
    last_ts: Option<i64>,
    done: bool,
}

impl LinearMessages {
    fn open(path: &Path, filter: &[String]) -> Result<LinearMessages, BagError> {
        let reader = open_linear_reader(path).map_err(|source| BagError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(LinearMessages {
            path: path.to_path_buf(),
            filter: filter.to_vec(),
            reader,
            index: 0,
            last_ts: None,
            done: false,
        })
    }
}

impl Iterator for LinearMessages {
    type Item = MessageResult;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        for item in self.reader.by_ref() {
            match item {
                Ok(m) => {
                    self.index += 1;
                    self.last_ts = Some(log_time_ns(m.log_time));
                    if topic_wanted(&self.filter, &m.channel.topic) {
                        return Some(Ok(raw_message(&m.channel, m.log_time, m.data.into_owned())));
                    }
                }
                Err(source) => {
                    self.done = true;
                    return Some(Err(BagError::Mcap {
                        path: self.path.clone(),
                        index: self.index,
                        last_timestamp_ns: self.last_ts,
                        source,
                    }));
                }
            }
        }
        self.done = true;
        None
    }
}
