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

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use mcap::read::ChannelAccumulator;
use mcap::records::{op, Record};
use mcap::sans_io::{LinearReadEvent, LinearReader, LinearReaderOptions};
use mcap::McapError;

use super::mcap_check::{self, RecordError};
use super::mcap_indexed::IndexedMcap;
use super::records::{log_time_ns, raw_message, record_length_limit, topic_wanted, BagError, BufferUse, RawMessage};

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

/// Options of every linear read of a file of `file_len` bytes: chunk CRCs checked where the
/// writer stored them (`ros2 bag record` does; a zero CRC, as `rosbags` writes, is skipped), and
/// a record length limit so that a corrupt length field cannot make the reader reserve more
/// memory than the file can back. The crate applies the limit to the records inside compressed
/// chunks too, which may be longer than the file: the bound leaves room for a 64x compression
/// ratio (clouds and images compress 2-4x) and is never under 64 MiB.
fn linear_options(file_len: u64) -> LinearReaderOptions {
    LinearReaderOptions::default().with_validate_chunk_crcs(true).with_record_length_limit(record_length_limit(file_len))
}

fn open_linear_reader(path: &Path) -> std::io::Result<CheckedMessageReader<BufReader<File>>> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    Ok(CheckedMessageReader::new(BufReader::new(file), linear_options(len)))
}

/// The messages of an MCAP stream in file order, linked to their channels: what
/// `mcap::io::MessageReader` yields (the same records read by the same sans-io reader, the same
/// checks of schemas and channels, nothing after the first error), but every record goes through
/// [`mcap_check::parse_record`], so that a length field beyond its record is refused before the
/// crate reserves it.
struct CheckedMessageReader<R> {
    source: R,
    reader: LinearReader,
    framing: TopLevelFraming,
    channels: ChannelAccumulator<'static>,
    /// Past the data end record: the summary's records are parsed (and checked), not linked.
    past_data_end: bool,
    /// Whether the read ends at the data end record (the reader then does not look for the
    /// end magic).
    skip_end_magic: bool,
    done: bool,
}

impl<R: Read> CheckedMessageReader<R> {
    fn new(source: R, options: LinearReaderOptions) -> Self {
        // The reader must hand out the records inside chunks, not the chunks.
        let options = options.with_emit_chunks(false);
        let first_record = if options.skip_start_magic {
            0
        } else {
            mcap::MAGIC.len() as u64
        };
        let framing = TopLevelFraming::new(first_record);
        let skip_end_magic = options.skip_end_magic;
        CheckedMessageReader {
            source,
            reader: LinearReader::new_with_options(options),
            framing,
            channels: ChannelAccumulator::default(),
            past_data_end: false,
            skip_end_magic,
            done: false,
        }
    }

    fn next_message(&mut self) -> Option<Result<mcap::Message<'static>, RecordError>> {
        loop {
            let event = match self.reader.next_event()? {
                Ok(event) => event,
                Err(e) => return Some(Err(e.into())),
            };
            match event {
                LinearReadEvent::ReadRequest(need) => {
                    let buf = self.reader.insert(need);
                    let n = loop {
                        match self.source.read(buf) {
                            Ok(n) => break n,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                            Err(e) => return Some(Err(e.into())),
                        }
                    };
                    self.framing.feed(&buf[..n]);
                    self.reader.notify_read(n);
                }
                // A data end record inside a chunk (never valid) is passed over; the one after
                // the data section starts the summary, whose records repeat those read.
                LinearReadEvent::Record { opcode: op::DATA_END, .. } => {
                    if self.framing.in_chunk() {
                        continue;
                    }
                    if self.skip_end_magic {
                        return None;
                    }
                    self.past_data_end = true;
                }
                LinearReadEvent::Record { opcode, data } => {
                    let record = match mcap_check::parse_record(opcode, data) {
                        Ok(r) => r,
                        Err(e) => return Some(Err(e)),
                    };
                    if self.past_data_end {
                        continue;
                    }
                    let linked = match record {
                        Record::Schema { header, data } => {
                            self.channels.add_schema(header, Cow::Owned(data.into_owned()))
                        }
                        Record::Channel(channel) => self.channels.add_channel(channel),
                        Record::Message { header, data } => {
                            return Some(match self.channels.get(header.channel_id) {
                                Some(channel) => Ok(mcap::Message {
                                    channel,
                                    sequence: header.sequence,
                                    log_time: header.log_time,
                                    publish_time: header.publish_time,
                                    data: Cow::Owned(data.into_owned()),
                                }),
                                None => Err(McapError::UnknownChannel(
                                    header.sequence,
                                    header.channel_id,
                                )
                                .into()),
                            });
                        }
                        _ => Ok(()),
                    };
                    if let Err(e) = linked {
                        return Some(Err(e.into()));
                    }
                }
            }
        }
    }
}

impl<R: Read> Iterator for CheckedMessageReader<R> {
    type Item = Result<mcap::Message<'static>, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.next_message();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}

/// Where the top-level records lie in the bytes given to a linear reader: enough to tell a data
/// end record inside a chunk from the one that ends the data section (the sans-io reader knows,
/// but does not say). The reader asks for no byte past a chunk before it has read the records
/// inside it, and for every byte of the data end record after it before it yields that one.
struct TopLevelFraming {
    /// Bytes fed so far.
    fed: u64,
    /// Where the next top-level record starts.
    next_record: u64,
    /// Its opcode and length, as far as fed.
    prefix: [u8; 9],
    prefix_len: usize,
    /// The end of the last top-level chunk record whose prefix was fed.
    chunk_end: Option<u64>,
}

impl TopLevelFraming {
    fn new(first_record: u64) -> Self {
        TopLevelFraming {
            fed: 0,
            next_record: first_record,
            prefix: [0; 9],
            prefix_len: 0,
            chunk_end: None,
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.fed < self.next_record {
                let skip = usize::try_from(self.next_record - self.fed)
                    .unwrap_or(usize::MAX)
                    .min(bytes.len());
                bytes = &bytes[skip..];
                self.fed += skip as u64;
                continue;
            }
            let n = (self.prefix.len() - self.prefix_len).min(bytes.len());
            self.prefix[self.prefix_len..self.prefix_len + n].copy_from_slice(&bytes[..n]);
            self.prefix_len += n;
            bytes = &bytes[n..];
            self.fed += n as u64;
            if self.prefix_len == self.prefix.len() {
                let mut len = [0; 8];
                len.copy_from_slice(&self.prefix[1..]);
                let end = self.fed.saturating_add(u64::from_le_bytes(len));
                if self.prefix[0] == op::CHUNK {
                    self.chunk_end = Some(end);
                }
                self.next_record = end;
                self.prefix_len = 0;
            }
        }
    }

    /// Whether the record the reader yields now lies inside a chunk.
    fn in_chunk(&self) -> bool {
        self.chunk_end.is_some_and(|end| self.fed <= end)
    }
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
    reader: CheckedMessageReader<BufReader<File>>,
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
                Err(e) => {
                    self.done = true;
                    return Some(Err(e.at_message(&self.path, self.index, self.last_ts)));
                }
            }
        }
        self.done = true;
        None
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::io::Cursor;

    use super::*;

    /// Messages (topic, sequence, log time, data) and the error, if any, in the order read.
    type Outcome = (Vec<(String, u32, u64, Vec<u8>)>, Option<String>);

    fn message(m: mcap::Message<'_>) -> (String, u32, u64, Vec<u8>) {
        (m.channel.topic.clone(), m.sequence, m.log_time, m.data.into_owned())
    }

    fn ours(bytes: &[u8]) -> Outcome {
        let mut out = (Vec::new(), None);
        for m in CheckedMessageReader::new(Cursor::new(bytes), linear_options(bytes.len() as u64)) {
            match m {
                Ok(m) => out.0.push(message(m)),
                Err(RecordError::Mcap(e)) => out.1 = Some(format!("{e:?}")),
                Err(RecordError::Length(e)) => out.1 = Some(e),
            }
        }
        out
    }

    /// What the crate's blocking message reader gives with the same options.
    fn the_crates(bytes: &[u8]) -> Outcome {
        let mut out = (Vec::new(), None);
        let options = linear_options(bytes.len() as u64);
        for m in mcap::io::MessageReader::new_with_options(Cursor::new(bytes), options) {
            match m {
                Ok(m) => out.0.push(message(m)),
                Err(e) => out.1 = Some(format!("{e:?}")),
            }
        }
        out
    }

    fn written(compression: Option<mcap::Compression>, use_chunks: bool) -> Vec<u8> {
        let mut buf = Vec::new();
        {
            let mut w = mcap::WriteOptions::new()
                .compression(compression)
                .use_chunks(use_chunks)
                .chunk_size(Some(300))
                .create(Cursor::new(&mut buf))
                .expect("writer");
            let schema = w.add_schema("pkg/msg/T", "ros2msg", b"int32 a").expect("schema");
            let meta = BTreeMap::from([("offered_qos_profiles".to_string(), String::new())]);
            let a = w.add_channel(schema, "/a", "cdr", &meta).expect("channel");
            let b = w.add_channel(0, "/b", "cdr", &BTreeMap::new()).expect("channel");
            for i in 0..40u32 {
                let header = mcap::records::MessageHeader {
                    channel_id: if i % 3 == 0 { b } else { a },
                    sequence: i,
                    log_time: u64::from(40 - i) * 7,
                    publish_time: 0,
                };
                w.write_to_known_channel(&header, &[i as u8; 37]).expect("message");
            }
            w.finish().expect("finish");
        }
        buf
    }

    /// Offsets of the top-level records with `opcode`.
    fn records(bytes: &[u8], opcode: u8) -> Vec<usize> {
        let mut at = mcap::MAGIC.len();
        let mut found = Vec::new();
        while at + 9 <= bytes.len() {
            if bytes[at] == opcode {
                found.push(at);
            }
            at += 9 + u64::from_le_bytes(bytes[at + 1..at + 9].try_into().unwrap()) as usize;
        }
        found
    }

    /// The file with a data end record added at the start of its first (uncompressed) chunk's
    /// records, the chunk's lengths grown to match and its CRC cleared.
    fn data_end_inside_first_chunk(bytes: &[u8]) -> Vec<u8> {
        let chunk = records(bytes, op::CHUNK)[0];
        let body = chunk + 9;
        assert_eq!(bytes[body + 28..body + 32], [0; 4], "the chunk must be uncompressed");
        let records_len_at = body + 32;
        let data_end = [&[op::DATA_END][..], &4u64.to_le_bytes(), &[0; 4]].concat();
        let mut out = bytes.to_vec();
        for at in [chunk + 1, body + 16, records_len_at] {
            let v = u64::from_le_bytes(out[at..at + 8].try_into().unwrap()) + data_end.len() as u64;
            out[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        out[body + 24..body + 28].copy_from_slice(&[0; 4]);
        out.splice(records_len_at + 8..records_len_at + 8, data_end);
        out
    }

    fn files() -> Vec<(String, Vec<u8>)> {
        let mut files = Vec::new();
        let dir = crate::repo_root().join("tests/data/bags");
        for bag in ["mcap_small", "mcap_zstd", "nuscenes_sample"] {
            let p = dir.join(bag).join(format!("{bag}.mcap"));
            files.push((bag.to_string(), std::fs::read(&p).expect("fixture bag")));
        }
        for (name, compression) in [
            ("none", None),
            ("zstd", Some(mcap::Compression::Zstd)),
            ("lz4", Some(mcap::Compression::Lz4)),
        ] {
            files.push((format!("chunked {name}"), written(compression, true)));
        }
        files.push(("unchunked".into(), written(None, false)));
        let spliced = data_end_inside_first_chunk(&written(None, true));
        files.push(("data end inside a chunk".into(), spliced));
        files
    }

    /// The checked reader yields what the crate's message reader yields, messages and errors
    /// alike, for whole files and for files cut anywhere (a cut leaves every record it yields
    /// whole: the check has nothing to refuse).
    #[test]
    fn checked_reader_reads_like_the_crates_message_reader() {
        for (name, bytes) in files() {
            let whole = ours(&bytes);
            assert_eq!(whole, the_crates(&bytes), "{name}");
            assert!(whole.1.is_none() && !whole.0.is_empty(), "{name}: {:?}", whole.1);
            let step = (bytes.len() / 97).max(1);
            for cut in (0..bytes.len()).step_by(step) {
                assert_eq!(ours(&bytes[..cut]), the_crates(&bytes[..cut]), "{name} cut at {cut}");
            }
        }
    }

    /// A data end record inside a chunk does not end the messages; the one after the data
    /// section does (the summary's records are not linked again).
    #[test]
    fn only_the_data_end_after_the_data_section_starts_the_summary() {
        let plain = ours(&written(None, true));
        let spliced = ours(&data_end_inside_first_chunk(&written(None, true)));
        assert_eq!(spliced, plain);
        assert_eq!(plain.0.len(), 40);
    }

    /// A Channel record whose topic declares 4 GiB is refused, naming the field, after the
    /// messages before it.
    #[test]
    fn a_length_field_beyond_its_record_is_refused_in_order() {
        let mut bytes = written(None, false);
        let channel_b = records(&bytes, op::CHANNEL)
            .into_iter()
            .find(|&at| bytes[at + 13..at + 19] == [2, 0, 0, 0, b'/', b'b'])
            .expect("channel /b");
        let topic_len_at = channel_b + 9 + 2 + 2;
        bytes[topic_len_at..topic_len_at + 4].copy_from_slice(&0xFFFF_FFF0u32.to_le_bytes());
        let (msgs, error) = ours(&bytes);
        let error = error.expect("refused");
        assert!(error.starts_with("Channel record: topic declares 4294967280 bytes"), "{error}");
        let before = records(&bytes, op::MESSAGE).iter().filter(|&&at| at < channel_b).count();
        assert_eq!(msgs.len(), before, "{msgs:?}");
    }
}
