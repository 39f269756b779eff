//! An MCAP file read through the chunk index of its summary: chunks are read in order of their
//! first message's log time, each decompressed only when the merge needs it, so memory holds the
//! chunks whose time ranges overlap the read position, not the file.
//!
//! The order is that of a stable sort of the file's messages by log time. A message's key is
//! (log time, its chunk's file offset), and within a chunk its place after a stable sort of that
//! chunk. The heap holds the first undelivered message of each chunk held. The next chunk
//! (in order of (indexed start time, offset)) is read while its key sorts before the smallest
//! key held; once it does not, no unread chunk can hold a message that sorts before the one on
//! top, because every message of a chunk has a log time at or after the chunk's indexed start
//! (checked as the chunk is read: an index that lies is damage).
//!
//! Damage in a chunk (a bad CRC, a decompression error) stops the read there: the messages held
//! that sort before the first chunk not read are delivered in order, those the damaged chunk gave
//! before the damage showed included (as the linear reader delivers them), then the error.
//! Chunks with no message on the wanted topics are read and checked all the same, so damage
//! anywhere in the file is reported, as before.
//!
//! The index is used only where it is trustworthy and complete; otherwise [`IndexedMcap::open`]
//! gives `None` and the file is read linearly: the summary's CRC, where the writer stored one,
//! must match; every chunk index must point at a chunk record of its length, inside the data
//! section, not overlapping another; and the records between chunks must parse and hold no
//! message and no unindexed chunk (the data section of a rosbag2 MCAP holds chunks, message
//! indexes, and schema and channel records, which must agree with the summary's).

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mcap::read::ChannelAccumulator;
use mcap::records::{op, ChunkIndex, MessageHeader, Record};
use mcap::sans_io::{LinearReadEvent, LinearReader, LinearReaderOptions};
use mcap::{Channel, McapError, Schema, Summary, MAGIC};

use super::mcap_check::{self, RecordError};
use super::records::{log_time_ns, raw_message, record_length_limit, topic_wanted, BagError, BufferUse, Held, RawMessage};

/// Opcode and length that start every record.
const RECORD_PREFIX: u64 = 1 + 8;
/// The footer record (summary start, summary offset start, summary CRC) and the end magic.
const FOOTER_AND_END_MAGIC: u64 = RECORD_PREFIX + 8 + 8 + 4 + 8;
/// Records between chunks are read whole to check them; a larger gap (an attachment) is not
/// worth it, and the file is read linearly instead.
const GAP_READ_LIMIT: u64 = 64 << 20;
/// Block size for the summary CRC.
const CRC_BLOCK: u64 = 1 << 20;

/// A chunk's place in the merge: its indexed start time, then its file offset.
type MergeKey = (i64, u64);

fn merge_key(chunk: &ChunkIndex) -> MergeKey {
    (
        log_time_ns(chunk.message_start_time),
        chunk.chunk_start_offset,
    )
}

/// Why a chunk could not be read.
enum ChunkError {
    Io(io::Error),
    Record(RecordError),
}

impl From<io::Error> for ChunkError {
    fn from(e: io::Error) -> Self {
        ChunkError::Io(e)
    }
}

impl From<McapError> for ChunkError {
    fn from(e: McapError) -> Self {
        ChunkError::Record(e.into())
    }
}

impl From<RecordError> for ChunkError {
    fn from(e: RecordError) -> Self {
        ChunkError::Record(e)
    }
}

/// A chunk that failed to read: the messages held that sort before the first chunk not read
/// (`before`; `None`: it was the last) are still delivered, then the error.
struct Damage {
    before: Option<MergeKey>,
    cause: ChunkError,
}

pub(super) struct IndexedMcap {
    path: PathBuf,
    file: File,
    /// The file's length: bounds the records inside a chunk (see `decode_chunk`).
    file_len: u64,
    channels: HashMap<u16, Arc<Channel<'static>>>,
    /// Channel ids on the filter's topics; `None`: every channel.
    wanted: Option<HashSet<u16>>,
    /// Chunks not read yet, in merge order.
    unread: VecDeque<ChunkIndex>,
    /// Undelivered messages of the chunks read, by chunk offset, each in its delivery order.
    held_chunks: HashMap<u64, VecDeque<RawMessage>>,
    /// The key of each held chunk's first undelivered message, smallest on top.
    heads: BinaryHeap<Reverse<MergeKey>>,
    held: Held,
    delivered: u64,
    last_ts: Option<i64>,
    damage: Option<Damage>,
    ended: bool,
}

impl IndexedMcap {
    /// The file's reader through its chunk index, or `None` when it has no usable index (see the
    /// module notes) or cannot be opened; the linear reader then reads it, or reports why not.
    pub(super) fn open(path: &Path, filter: &[String]) -> Option<IndexedMcap> {
        let file = File::open(path).ok()?;
        let len = file.metadata().ok()?.len();
        let (summary, data_end) = read_checked_summary(&file, len)?;
        let chunks = chunks_covering_data(&file, &summary, data_end)?;
        let wanted = wanted_channels(&summary, filter);
        let unread = merge_plan(chunks);
        Some(IndexedMcap {
            path: path.to_path_buf(),
            file,
            file_len: len,
            channels: summary.channels,
            wanted,
            unread,
            held_chunks: HashMap::new(),
            heads: BinaryHeap::new(),
            held: Held::default(),
            delivered: 0,
            last_ts: None,
            damage: None,
            ended: false,
        })
    }

    pub(super) fn peak_buffered(&self) -> BufferUse {
        self.held.peak
    }

    /// Reads chunks until no unread one could hold a message that sorts before the first held.
    fn read_due_chunks(&mut self) {
        while self.damage.is_none() {
            let Some(next) = self.unread.front() else {
                return;
            };
            if self
                .heads
                .peek()
                .is_some_and(|Reverse(first)| *first < merge_key(next))
            {
                return;
            }
            let Some(chunk) = self.unread.pop_front() else {
                return;
            };
            let (msgs, error) = self.read_chunk_messages(&chunk);
            self.hold(chunk.chunk_start_offset, msgs);
            if let Some(cause) = error {
                // Nothing past the damage is read; what is held and sorts before the first unread
                // chunk is still in order.
                let before = self.unread.front().map(merge_key);
                self.damage = Some(Damage { before, cause });
            }
        }
    }

    /// The wanted messages of one chunk, stably sorted by log time, and the error that stopped
    /// the read part way, if any. The messages read before it are kept, as the linear reader
    /// keeps them (the chunk CRC is checked at the chunk's end).
    fn read_chunk_messages(&self, chunk: &ChunkIndex) -> (Vec<RawMessage>, Option<ChunkError>) {
        let mut msgs = Vec::new();
        let error = self.decode_chunk(chunk, &mut msgs).err();
        msgs.sort_by_key(|m| m.timestamp_ns); // stable: equal stamps keep file order
        (msgs, error)
    }

    /// Decompresses one chunk, adding its wanted messages to `msgs` in file order.
    fn decode_chunk(
        &self,
        chunk: &ChunkIndex,
        msgs: &mut Vec<RawMessage>,
    ) -> Result<(), ChunkError> {
        let record = read_at(&self.file, chunk.chunk_start_offset, chunk.chunk_length)?;
        if record.first() != Some(&op::CHUNK) {
            return Err(McapError::BadIndex.into());
        }
        let start = log_time_ns(chunk.message_start_time);
        // The chunk record goes through a linear reader rather than the crate's `ChunkReader`,
        // which has no record length limit: a record inside the chunk that declared 8e18 bytes
        // made it reserve them (found by the fuzzer). The limit is the linear path's; the
        // reader checks the chunk's CRC where the writer stored one. Each record's length
        // fields are checked before the crate parses it (see `mcap_check`).
        let mut reader = LinearReader::new_with_options(
            LinearReaderOptions::default()
                .with_skip_start_magic(true)
                .with_skip_end_magic(true)
                .with_validate_chunk_crcs(true)
                .with_record_length_limit(record_length_limit(self.file_len)),
        );
        let mut input: &[u8] = &record;
        while let Some(event) = reader.next_event() {
            match event? {
                LinearReadEvent::ReadRequest(want) => feed(&mut reader, &mut input, want),
                LinearReadEvent::Record { opcode, data } => {
                    match mcap_check::parse_record(opcode, data)? {
                        Record::Message { header, data } => {
                            msgs.extend(self.wanted_message(&header, data, start)?);
                        }
                        Record::Channel(ch) if !channel_agrees(&self.channels, &ch) => {
                            return Err(McapError::ConflictingChannels(ch.topic).into());
                        }
                        _ => {}
                    }
                }
            }
        }
        Ok(())
    }

    /// The message as the reader yields it, if it is on a wanted topic.
    fn wanted_message(
        &self,
        header: &MessageHeader,
        data: Cow<'_, [u8]>,
        chunk_start: i64,
    ) -> Result<Option<RawMessage>, McapError> {
        if self
            .wanted
            .as_ref()
            .is_some_and(|w| !w.contains(&header.channel_id))
        {
            return Ok(None);
        }
        let channel = self
            .channels
            .get(&header.channel_id)
            .ok_or(McapError::UnknownChannel(
                header.sequence,
                header.channel_id,
            ))?;
        // The merge trusts the index's start time: a message before it would be out of order.
        if log_time_ns(header.log_time) < chunk_start {
            return Err(McapError::BadIndex);
        }
        Ok(Some(raw_message(
            channel,
            header.log_time,
            data.into_owned(),
        )))
    }

    fn hold(&mut self, offset: u64, msgs: Vec<RawMessage>) {
        let Some(first) = msgs.first() else {
            return;
        };
        self.heads.push(Reverse((first.timestamp_ns, offset)));
        let bytes = msgs.iter().map(|m| m.data.len() as u64).sum();
        self.held.add(1, bytes);
        self.held_chunks.insert(offset, msgs.into());
    }

    /// The first message held, unless damage stops the read before it.
    fn pop_first(&mut self) -> Option<RawMessage> {
        let Reverse((ts, offset)) = *self.heads.peek()?;
        let past_damage = self
            .damage
            .as_ref()
            .and_then(|d| d.before)
            .is_some_and(|before| (ts, offset) >= before);
        if past_damage {
            return None;
        }
        self.heads.pop();
        let queue = self.held_chunks.get_mut(&offset)?;
        let msg = queue.pop_front()?;
        match queue.front() {
            Some(next) => self.heads.push(Reverse((next.timestamp_ns, offset))),
            None => {
                self.held_chunks.remove(&offset);
                self.held.remove(1, 0);
            }
        }
        self.held.remove(0, msg.data.len() as u64);
        self.delivered += 1;
        self.last_ts = Some(msg.timestamp_ns);
        Some(msg)
    }

    fn bag_error(&self, cause: ChunkError) -> BagError {
        match cause {
            ChunkError::Io(source) => BagError::Io {
                path: self.path.clone(),
                source,
            },
            ChunkError::Record(e) => e.at_message(&self.path, self.delivered, self.last_ts),
        }
    }
}

impl Iterator for IndexedMcap {
    type Item = Result<RawMessage, BagError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        self.read_due_chunks();
        if let Some(m) = self.pop_first() {
            return Some(Ok(m));
        }
        self.ended = true;
        let damage = self.damage.take()?;
        Some(Err(self.bag_error(damage.cause)))
    }
}

/// The channel ids on the filter's topics; `None` for an empty filter (every channel).
fn wanted_channels(summary: &Summary, filter: &[String]) -> Option<HashSet<u16>> {
    if filter.is_empty() {
        return None;
    }
    Some(
        summary
            .channels
            .values()
            .filter(|c| topic_wanted(filter, &c.topic))
            .map(|c| c.id)
            .collect(),
    )
}

/// Every chunk, in merge order. Chunks with no message on a wanted topic are read too (their
/// messages dropped as they are decoded): their CRC is checked, so damage anywhere in the file
/// is an error, as with the linear reader.
fn merge_plan(mut chunks: Vec<ChunkIndex>) -> VecDeque<ChunkIndex> {
    chunks.sort_by_key(merge_key);
    chunks.into()
}

/// Whether a channel record read from the data section is the summary's channel of that id.
fn channel_agrees(
    channels: &HashMap<u16, Arc<Channel<'static>>>,
    record: &mcap::records::Channel,
) -> bool {
    channels.get(&record.id).is_some_and(|c| {
        c.topic == record.topic && c.schema.as_ref().map_or(0, |s| s.id) == record.schema_id
    })
}

/// `len` bytes of the file from `offset`.
fn read_at(mut file: &File, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0; len];
    file.read_exact(&mut buf)?;
    Ok(buf)
}

fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// What the footer says about the summary.
struct Footer {
    summary_start: u64,
    summary_crc: u32,
}

fn read_footer(file: &File, len: u64) -> Option<Footer> {
    let at = len.checked_sub(FOOTER_AND_END_MAGIC)?;
    let bytes = read_at(file, at, FOOTER_AND_END_MAGIC).ok()?;
    let magic_at = (FOOTER_AND_END_MAGIC as usize).checked_sub(MAGIC.len())?;
    if bytes.first() != Some(&op::FOOTER) || bytes.get(magic_at..) != Some(MAGIC) {
        return None;
    }
    Some(Footer {
        summary_start: le_u64(&bytes, 9)?,
        summary_crc: le_u32(&bytes, 25)?,
    })
}

/// The summary and where the data section ends (the summary's start), if the file has a summary
/// whose CRC (where the writer stored one) matches.
fn read_checked_summary(file: &File, len: u64) -> Option<(Summary, u64)> {
    let footer = read_footer(file, len)?;
    let footer_at = len.checked_sub(FOOTER_AND_END_MAGIC)?;
    if footer.summary_start < MAGIC.len() as u64 || footer.summary_start > footer_at {
        return None;
    }
    if footer.summary_crc != 0
        && summary_crc(file, footer.summary_start, len).ok()? != footer.summary_crc
    {
        return None;
    }
    let summary = read_summary(file, footer.summary_start, len).ok()?;
    Some((summary, footer.summary_start))
}

/// The CRC32 of the summary section and the footer up to its CRC field, as the writer computes
/// it: a damaged summary must not steer the read.
fn summary_crc(file: &File, summary_start: u64, len: u64) -> io::Result<u32> {
    let end = len
        .checked_sub(MAGIC.len() as u64 + 4)
        .ok_or(io::ErrorKind::InvalidData)?;
    let mut hasher = crc32fast::Hasher::new();
    let mut at = summary_start;
    while at < end {
        let n = CRC_BLOCK.min(end - at);
        hasher.update(&read_at(file, at, n)?);
        at += n;
    }
    Ok(hasher.finalize())
}

/// The summary section's indexes, schemas and channels: the records from `summary_start` to the
/// end of the file (the footer and the end magic included) read as the crate's `SummaryReader`
/// reads them, each record's length fields checked before the crate parses it (see
/// `mcap_check`). No record may be longer than the rest of the file.
fn read_summary(mut file: &File, summary_start: u64, len: u64) -> Result<Summary, RecordError> {
    let rest = len.saturating_sub(summary_start);
    let mut reader = LinearReader::new_with_options(
        LinearReaderOptions::default()
            .with_skip_start_magic(true)
            .with_record_length_limit(usize::try_from(rest).unwrap_or(usize::MAX)),
    );
    file.seek(SeekFrom::Start(summary_start))?;
    let mut pos = summary_start;
    let mut summary = Summary::default();
    let mut linked = ChannelAccumulator::default();
    while let Some(event) = reader.next_event() {
        match event? {
            LinearReadEvent::ReadRequest(n) => {
                // The reader's buffer grows by the request: never past the end of the file.
                let left = usize::try_from(len.saturating_sub(pos)).unwrap_or(usize::MAX);
                if left == 0 {
                    return Err(McapError::UnexpectedEof.into());
                }
                let got = file.read(reader.insert(n.min(left)))?;
                reader.notify_read(got);
                pos += got as u64;
            }
            LinearReadEvent::Record { opcode, data } => {
                match mcap_check::parse_record(opcode, data)? {
                    Record::Schema { header, data } => {
                        let schema = Schema {
                            id: header.id,
                            name: header.name.clone(),
                            encoding: header.encoding.clone(),
                            data: Cow::Owned(data.to_vec()),
                        };
                        linked.add_schema(header, data.into_owned().into())?;
                        summary.schemas.entry(schema.id).or_insert_with(|| Arc::new(schema));
                    }
                    Record::Channel(channel) => {
                        let id = channel.id;
                        linked.add_channel(channel)?;
                        if let Some(channel) = linked.get(id) {
                            summary.channels.insert(id, channel);
                        }
                    }
                    Record::ChunkIndex(index) => summary.chunk_indexes.push(index),
                    Record::AttachmentIndex(index) => summary.attachment_indexes.push(index),
                    Record::MetadataIndex(index) => summary.metadata_indexes.push(index),
                    Record::Statistics(stats) => summary.stats = Some(stats),
                    _ => {}
                }
            }
        }
    }
    Ok(summary)
}

/// The summary's chunk indexes in file order, if they account for every message of the data
/// section `[magic, data_end)` (see the module notes).
fn chunks_covering_data(file: &File, summary: &Summary, data_end: u64) -> Option<Vec<ChunkIndex>> {
    if summary.chunk_indexes.is_empty() || read_at(file, 0, MAGIC.len() as u64).ok()? != MAGIC {
        return None;
    }
    let mut chunks = summary.chunk_indexes.clone();
    chunks.sort_by_key(|c| c.chunk_start_offset);
    let mut pos = MAGIC.len() as u64;
    for chunk in &chunks {
        let channels_known = chunk
            .message_index_offsets
            .keys()
            .all(|id| summary.channels.contains_key(id));
        if !channels_known {
            return None;
        }
        gap_holds_no_messages(file, summary, pos, chunk.chunk_start_offset)?;
        chunk_record_at(file, chunk)?;
        pos = chunk.chunk_start_offset.checked_add(chunk.chunk_length)?;
    }
    gap_holds_no_messages(file, summary, pos, data_end).map(|()| chunks)
}

/// `Some` if the file holds a chunk record of the indexed length at the indexed offset.
fn chunk_record_at(file: &File, chunk: &ChunkIndex) -> Option<()> {
    let body_len = chunk.chunk_length.checked_sub(RECORD_PREFIX)?;
    let prefix = read_at(file, chunk.chunk_start_offset, RECORD_PREFIX).ok()?;
    (prefix.first() == Some(&op::CHUNK) && le_u64(&prefix, 1)? == body_len).then_some(())
}

/// `Some` if the records in `[from, to)` parse and hold no message (loose or in a chunk) and no
/// channel that disagrees with the summary.
fn gap_holds_no_messages(file: &File, summary: &Summary, from: u64, to: u64) -> Option<()> {
    let len = to.checked_sub(from)?;
    if len > GAP_READ_LIMIT {
        return None;
    }
    let bytes = read_at(file, from, len).ok()?;
    // Records (those inside chunks included) as the crate's in-memory linear reader yields
    // them, each checked (see `mcap_check`) before it is parsed.
    let mut reader = LinearReader::new_with_options(
        LinearReaderOptions::default()
            .with_skip_start_magic(true)
            .with_skip_end_magic(true)
            .with_record_length_limit(bytes.len()),
    );
    let mut input: &[u8] = &bytes;
    while let Some(event) = reader.next_event() {
        match event.ok()? {
            LinearReadEvent::ReadRequest(want) => feed(&mut reader, &mut input, want),
            LinearReadEvent::Record { opcode, data } => {
                match mcap_check::parse_record(opcode, data).ok()? {
                    Record::Message { .. } | Record::Chunk { .. } => return None,
                    Record::Channel(ch) if !channel_agrees(&summary.channels, &ch) => return None,
                    _ => {}
                }
            }
        }
    }
    Some(())
}

/// Answers an in-memory sans-io reader's request for `want` bytes from the front of `input`
/// (fewer at its end, which the reader then sees as the end of the data).
fn feed(reader: &mut LinearReader, input: &mut &[u8], want: usize) {
    let n = want.min(input.len());
    reader.insert(n).copy_from_slice(&input[..n]);
    reader.notify_read(n);
    *input = &input[n..];
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(path: &str) -> (File, u64) {
        let p = crate::repo_root().join(path);
        let file = File::open(&p).expect("fixture");
        let len = file.metadata().expect("metadata").len();
        (file, len)
    }

    /// The checked summary read gives the crate's summary for the fixture bags.
    #[test]
    fn summary_reads_like_the_crates() {
        for bag in ["mcap_small", "mcap_zstd", "nuscenes_sample"] {
            let path = format!("tests/data/bags/{bag}/{bag}.mcap");
            let (file, len) = fixture(&path);
            let footer = read_footer(&file, len).expect("footer");
            let ours = read_summary(&file, footer.summary_start, len).expect("summary");
            let bytes =
                std::fs::read(crate::repo_root().join(&path)).expect("read");
            let crates = Summary::read(&bytes).expect("crate's summary").expect("a summary");
            assert!(!ours.chunk_indexes.is_empty(), "{bag}");
            assert_eq!(ours, crates, "{bag}");
        }
    }

    /// A summary record with a length beyond the record is refused, naming it; the file is then
    /// not read through its index.
    #[test]
    fn summary_record_with_a_length_beyond_it_is_refused() {
        let (file, len) = fixture("tests/data/fuzz/mcap_file/summary_schema_data_huge.mcap");
        let footer = read_footer(&file, len).expect("footer");
        match read_summary(&file, footer.summary_start, len) {
            Err(RecordError::Length(e)) => {
                assert!(e.starts_with("Schema record: data declares 4294967040 bytes"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        assert!(read_checked_summary(&file, len).is_none());
    }

    /// A record between chunks with a length beyond it makes the index unusable (the linear
    /// read then reports it).
    #[test]
    fn gap_record_with_a_length_beyond_it_is_not_trusted() {
        fn record(opcode: u8, body: &[u8]) -> Vec<u8> {
            [&[opcode][..], &(body.len() as u64).to_le_bytes(), body].concat()
        }
        // Header: profile "", library "x".
        let header = record(op::HEADER, &[0, 0, 0, 0, 1, 0, 0, 0, b'x']);
        // Metadata: name declaring 0xFFFF_FFF0 bytes, then 3.
        let metadata = record(op::METADATA, &[0xF0, 0xFF, 0xFF, 0xFF, b'a', b'b', b'c']);
        let dir = std::env::temp_dir().join(format!("sptr-mcap-gap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("gap.bin");
        let summary = Summary::default();
        let gap = |records: &[&[u8]]| {
            let bytes = records.concat();
            std::fs::write(&path, &bytes).expect("write");
            let file = File::open(&path).expect("open");
            gap_holds_no_messages(&file, &summary, 0, bytes.len() as u64)
        };
        let good = gap(&[&header, &header]);
        let bad = gap(&[&header, &metadata]);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(good.is_some());
        assert!(bad.is_none());
    }
}
