//! The length fields of an MCAP record, checked against the record before the `mcap` crate
//! parses it.
//!
//! The crate (0.26) reads a length-prefixed string or byte field by reserving the length the field
//! declares and only then reading the bytes: a crafted file whose Channel record declares a
//! 4 GiB topic made it reserve 4 GiB for a record of a few bytes. [`check_record_lengths`] walks
//! a record's body as the MCAP specification lays it out and refuses any declared length that is
//! larger than the bytes the record has left, so that nothing is reserved that the record cannot
//! back. Every record the bag reader gives the crate to parse goes through [`parse_record`],
//! which runs the check first.
//!
//! What is checked, per the specification (strings are a u32 byte count and UTF-8 bytes; maps
//! and arrays a u32 byte count and their entries; `bytes` fields the count their record names):
//!
//! | record | length fields |
//! |---|---|
//! | Header 0x01 | profile, library |
//! | Schema 0x03 | name, encoding, data (u32 count) |
//! | Channel 0x04 | topic, message_encoding, metadata (map of strings, each string inside it) |
//! | Chunk 0x06 | compression, records (u64 count) |
//! | MessageIndex 0x07 | records (array of 16-byte entries) |
//! | ChunkIndex 0x08 | message_index_offsets (map of 10-byte entries), compression |
//! | Attachment 0x09 | name, media_type, data (u64 count, then a 4-byte CRC) |
//! | AttachmentIndex 0x0A | name, media_type |
//! | Statistics 0x0B | channel_message_counts (map of 10-byte entries) |
//! | Metadata 0x0C | name, metadata (map of strings, each string inside it) |
//! | MetadataIndex 0x0D | name |
//!
//! Records without a length field (Footer, Message, SummaryOffset, DataEnd) and unknown opcodes
//! pass. A record too short for a fixed-size field passes too: nothing after it can be read, and
//! the crate's parser reports the short record as it did before. The strings of a map must fit in
//! the map's declared bytes (the specification counts them there), not merely in the record.

use std::path::Path;

use mcap::records::{op, Record};
use mcap::McapError;

use super::records::BagError;

/// Refuses a record of type `opcode` whose body (the bytes after the opcode and the record
/// length) declares a string, byte field, map or array longer than what follows it in the
/// record. The error names the record type, the field, the declared length and the bytes left.
pub(super) fn check_record_lengths(opcode: u8, body: &[u8]) -> Result<(), String> {
    let Some(record) = record_name(opcode) else {
        return Ok(());
    };
    let mut r = Fields::new(record, body);
    let walked = match opcode {
        op::HEADER => r.string("profile").and_then(|()| r.string("library")),
        op::SCHEMA => check_schema(&mut r),
        op::CHANNEL => check_channel(&mut r),
        op::CHUNK => check_chunk(&mut r),
        op::MESSAGE_INDEX => r.fixed(2).and_then(|()| r.block("records", 16)), // log_time, offset
        op::CHUNK_INDEX => check_chunk_index(&mut r),
        op::ATTACHMENT => check_attachment(&mut r),
        op::ATTACHMENT_INDEX => {
            // offset, length, log_time, create_time, data_size
            r.fixed(5 * 8)
                .and_then(|()| r.string("name"))
                .and_then(|()| r.string("media_type"))
        }
        // message_count u64, schema_count u16, channel/attachment/metadata/chunk counts u32,
        // message start and end time u64
        op::STATISTICS => r
            .fixed(8 + 2 + 4 * 4 + 8 + 8)
            .and_then(|()| r.block("channel_message_counts", 2 + 8)),
        op::METADATA => r.string("name").and_then(|()| r.string_map("metadata")),
        // offset, length
        op::METADATA_INDEX => r.fixed(8 + 8).and_then(|()| r.string("name")),
        _ => Ok(()),
    };
    match walked {
        Ok(()) | Err(Stop::Short) => Ok(()),
        Err(Stop::Refused(why)) => Err(why),
    }
}

/// The record type's name, for the records that hold length fields.
fn record_name(opcode: u8) -> Option<&'static str> {
    Some(match opcode {
        op::HEADER => "Header",
        op::SCHEMA => "Schema",
        op::CHANNEL => "Channel",
        op::CHUNK => "Chunk",
        op::MESSAGE_INDEX => "MessageIndex",
        op::CHUNK_INDEX => "ChunkIndex",
        op::ATTACHMENT => "Attachment",
        op::ATTACHMENT_INDEX => "AttachmentIndex",
        op::STATISTICS => "Statistics",
        op::METADATA => "Metadata",
        op::METADATA_INDEX => "MetadataIndex",
        _ => return None,
    })
}

fn check_schema(r: &mut Fields<'_>) -> Walk {
    r.fixed(2)?; // id
    r.string("name")?;
    r.string("encoding")?;
    r.bytes_u32("data")
}

fn check_channel(r: &mut Fields<'_>) -> Walk {
    r.fixed(2 + 2)?; // id, schema_id
    r.string("topic")?;
    r.string("message_encoding")?;
    r.string_map("metadata")
}

fn check_chunk(r: &mut Fields<'_>) -> Walk {
    r.fixed(8 + 8 + 8 + 4)?; // message start and end time, uncompressed size and CRC
    r.string("compression")?;
    let n = r.u64()?;
    r.take("records", n, 0)
}

fn check_chunk_index(r: &mut Fields<'_>) -> Walk {
    r.fixed(4 * 8)?; // message start and end time, chunk start offset, chunk length
    r.block("message_index_offsets", 2 + 8)?; // channel id -> offset
    r.fixed(8)?; // message_index_length
    r.string("compression")
}

fn check_attachment(r: &mut Fields<'_>) -> Walk {
    r.fixed(8 + 8)?; // log_time, create_time
    r.string("name")?;
    r.string("media_type")?;
    let n = r.u64()?;
    // The data is followed by the record's CRC (u32), which must fit too.
    r.take("data", n, 4)
}

/// Why a walk stopped early.
enum Stop {
    /// A fixed-size field (or a length prefix) runs past the record's end: left to the parser.
    Short,
    /// A declared length runs past what is left: the message.
    Refused(String),
}

type Walk = Result<(), Stop>;

/// A cursor over a record's body (or over a map inside it).
struct Fields<'a> {
    record: &'static str,
    /// What `rest` is the end of, for the message: "the record" or "its map".
    within: &'static str,
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(record: &'static str, body: &'a [u8]) -> Self {
        Fields {
            record,
            within: "the record",
            rest: body,
        }
    }

    fn fixed(&mut self, n: usize) -> Walk {
        self.rest = self.rest.get(n..).ok_or(Stop::Short)?;
        Ok(())
    }

    fn u32(&mut self) -> Result<u32, Stop> {
        let (head, rest) = self.rest.split_first_chunk::<4>().ok_or(Stop::Short)?;
        self.rest = rest;
        Ok(u32::from_le_bytes(*head))
    }

    fn u64(&mut self) -> Result<u64, Stop> {
        let (head, rest) = self.rest.split_first_chunk::<8>().ok_or(Stop::Short)?;
        self.rest = rest;
        Ok(u64::from_le_bytes(*head))
    }

    /// Skips `declared` bytes of `field`, and `trailer` bytes after them that belong to the
    /// record, refusing the field if they are not all there.
    fn take(&mut self, field: &str, declared: u64, trailer: usize) -> Walk {
        let left = self.rest.len();
        let end = usize::try_from(declared)
            .ok()
            .and_then(|n| n.checked_add(trailer))
            .filter(|&end| end <= left);
        let Some(end) = end else {
            let and_trailer = if trailer > 0 {
                format!(" (and the {trailer}-byte CRC after it)")
            } else {
                String::new()
            };
            return Err(Stop::Refused(format!(
                "{} record: {field} declares {declared} bytes{and_trailer}, but only {left} bytes are left in {}",
                self.record, self.within
            )));
        };
        self.rest = &self.rest[end..];
        Ok(())
    }

    /// A string: u32 byte count, then the bytes.
    fn string(&mut self, field: &str) -> Walk {
        let n = self.u32()?;
        self.take(field, n.into(), 0)
    }

    /// A byte field with a u32 count.
    fn bytes_u32(&mut self, field: &str) -> Walk {
        self.string(field)
    }

    /// A map or an array of `entry`-byte entries: u32 byte count, then the entries. Nothing
    /// inside has a length of its own. A count that is not a whole number of entries is refused:
    /// the crate reads whole entries while it has read fewer bytes than the count, so it would
    /// read past the block and every field after it from elsewhere than this walk does (a
    /// fuzzed ChunkIndex with a 6-byte map of 10-byte entries made it reserve 2.4 GB for its
    /// `compression` string).
    fn block(&mut self, field: &str, entry: u32) -> Walk {
        let n = self.u32()?;
        if n % entry != 0 {
            return Err(Stop::Refused(format!(
                "{} record: {field} declares {n} bytes, not a whole number of its {entry}-byte entries",
                self.record
            )));
        }
        self.take(field, n.into(), 0)
    }

    /// A map of strings to strings: u32 byte count, then key and value strings, each of which
    /// must fit in the map.
    fn string_map(&mut self, field: &str) -> Walk {
        let n = self.u32()?;
        let before = self.rest;
        self.take(field, n.into(), 0)?;
        let mut map = Fields {
            record: self.record,
            within: "its map",
            rest: &before[..n as usize],
        };
        let key = format!("{field} key");
        let value = format!("{field} value");
        while !map.rest.is_empty() {
            for name in [&key, &value] {
                let left = map.rest.len();
                let n = map.u32().map_err(|_| {
                    Stop::Refused(format!(
                        "{} record: {name}'s 4-byte length is cut off: only {left} bytes are left in its map",
                        self.record
                    ))
                })?;
                map.take(name, n.into(), 0)?;
            }
        }
        Ok(())
    }
}

/// Why a record could not be read.
#[derive(Debug)]
pub(super) enum RecordError {
    /// The `mcap` crate's error (a parse, CRC, decompression or I/O error).
    Mcap(McapError),
    /// A length field that runs past its record (see [`check_record_lengths`]).
    Length(String),
}

impl From<McapError> for RecordError {
    fn from(e: McapError) -> Self {
        RecordError::Mcap(e)
    }
}

impl From<std::io::Error> for RecordError {
    fn from(e: std::io::Error) -> Self {
        RecordError::Mcap(e.into())
    }
}

impl RecordError {
    /// The error as the bag reader reports it: `index` messages of the file at `path` read
    /// before it, the last at `last_timestamp_ns`.
    pub(super) fn at_message(
        self,
        path: &Path,
        index: u64,
        last_timestamp_ns: Option<i64>,
    ) -> BagError {
        match self {
            RecordError::Mcap(source) => BagError::Mcap {
                path: path.to_path_buf(),
                index,
                last_timestamp_ns,
                source,
            },
            RecordError::Length(detail) => BagError::McapRecord {
                path: path.to_path_buf(),
                index,
                last_timestamp_ns,
                detail,
            },
        }
    }
}

/// [`mcap::parse_record`] of a record whose length fields passed [`check_record_lengths`].
pub(super) fn parse_record(opcode: u8, body: &[u8]) -> Result<Record<'_>, RecordError> {
    check_record_lengths(opcode, body).map_err(RecordError::Length)?;
    Ok(mcap::parse_record(opcode, body)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little-endian record body.
    #[derive(Default, Clone)]
    struct Body(Vec<u8>);

    impl Body {
        fn u8s(mut self, n: usize) -> Self {
            self.0.resize(self.0.len() + n, 0);
            self
        }
        fn u32(mut self, v: u32) -> Self {
            self.0.extend(v.to_le_bytes());
            self
        }
        fn u64(mut self, v: u64) -> Self {
            self.0.extend(v.to_le_bytes());
            self
        }
        fn raw(mut self, b: &[u8]) -> Self {
            self.0.extend_from_slice(b);
            self
        }
        /// A string whose length field says what it holds.
        fn str(self, s: &str) -> Self {
            self.u32(s.len() as u32).raw(s.as_bytes())
        }
        /// A map of strings, its byte count right.
        fn map(self, entries: &[(&str, &str)]) -> Self {
            let inner = entries
                .iter()
                .fold(Body::default(), |b, (k, v)| b.str(k).str(v));
            self.u32(inner.0.len() as u32).raw(&inner.0)
        }
    }

    fn refused(opcode: u8, body: &Body) -> String {
        check_record_lengths(opcode, &body.0).expect_err("must be refused")
    }

    fn passes(opcode: u8, body: &Body) {
        if let Err(e) = check_record_lengths(opcode, &body.0) {
            panic!("refused: {e}");
        }
    }

    fn assert_names(e: &str, record: &str, field: &str, declared: u64, left: usize) {
        let want_record = format!("{record} record: {field} ");
        assert!(e.starts_with(&want_record), "{e}");
        assert!(e.contains(&format!("declares {declared} bytes")), "{e}");
        assert!(e.contains(&format!("only {left} bytes are left")), "{e}");
    }

    fn assert_broken_entries(e: &str, record: &str, field: &str, declared: u64, entry: u32) {
        let want = format!("{record} record: {field} declares {declared} bytes, not a whole number of its {entry}-byte entries");
        assert_eq!(e, want);
    }

    /// Each record's bodies: a valid one as the crate writes it, and for each length field a
    /// prefix up to the field's length, to append a length and contents to.
    fn header_prefix() -> Body {
        Body::default()
    }
    fn schema_prefix() -> Body {
        Body::default()
            .u8s(2)
            .str("sensor_msgs/msg/PointCloud2")
            .str("ros2msg")
    }
    fn channel_prefix() -> Body {
        Body::default().u8s(4).str("/points").str("cdr")
    }

    #[test]
    fn header_strings() {
        passes(op::HEADER, &Body::default().str("ros2").str("rosbag2"));
        passes(op::HEADER, &Body::default().str("").str(""));
        let e = refused(op::HEADER, &header_prefix().u32(0xFFFF_FFF0).raw(b"ros2"));
        assert_names(&e, "Header", "profile", 0xFFFF_FFF0, 4);
        let e = refused(
            op::HEADER,
            &header_prefix().str("ros2").u32(8).raw(b"rosbag2"),
        );
        assert_names(&e, "Header", "library", 8, 7);
    }

    #[test]
    fn schema_strings_and_data() {
        passes(op::SCHEMA, &schema_prefix().u32(3).raw(b"abc"));
        passes(op::SCHEMA, &schema_prefix().u32(0));
        passes(op::SCHEMA, &Body::default().u8s(2).str("").str("").u32(0));
        let e = refused(op::SCHEMA, &schema_prefix().u32(4).raw(b"abc"));
        assert_names(&e, "Schema", "data", 4, 3);
        let e = refused(
            op::SCHEMA,
            &Body::default().u8s(2).u32(0xFFFF_FFFF).raw(b"x"),
        );
        assert_names(&e, "Schema", "name", 0xFFFF_FFFF, 1);
        let e = refused(op::SCHEMA, &Body::default().u8s(2).str("n").u32(1));
        assert_names(&e, "Schema", "encoding", 1, 0);
    }

    #[test]
    fn channel_strings_and_metadata() {
        passes(op::CHANNEL, &channel_prefix().map(&[]));
        passes(
            op::CHANNEL,
            &channel_prefix().map(&[("offered_qos_profiles", "- history: 3"), ("", "")]),
        );
        passes(
            op::CHANNEL,
            &Body::default().u8s(4).str("").str("").map(&[]),
        );
        let e = refused(
            op::CHANNEL,
            &Body::default().u8s(4).u32(0xFFFF_FFF0).raw(b"/points"),
        );
        assert_names(&e, "Channel", "topic", 0xFFFF_FFF0, 7);
        let e = refused(
            op::CHANNEL,
            &Body::default().u8s(4).str("/p").u32(4).raw(b"cdr"),
        );
        assert_names(&e, "Channel", "message_encoding", 4, 3);
        let e = refused(op::CHANNEL, &channel_prefix().u32(9).raw(&[0; 8]));
        assert_names(&e, "Channel", "metadata", 9, 8);
        // A string in the map longer than the map, though not than the record.
        let inner = Body::default().u32(20).raw(b"k");
        let e = refused(
            op::CHANNEL,
            &channel_prefix()
                .u32(inner.0.len() as u32)
                .raw(&inner.0)
                .u8s(32),
        );
        assert!(
            e.starts_with("Channel record: metadata key declares 20 bytes")
                && e.contains("its map"),
            "{e}"
        );
        let inner = Body::default().str("k").u32(0xFFFF_FFF0);
        let e = refused(
            op::CHANNEL,
            &channel_prefix().u32(inner.0.len() as u32).raw(&inner.0),
        );
        assert_names(&e, "Channel", "metadata value", 0xFFFF_FFF0, 0);
        // A map whose last entry's length is cut by the map's end.
        let inner = Body::default().str("k").str("v").raw(&[1, 0]);
        let e = refused(
            op::CHANNEL,
            &channel_prefix()
                .u32(inner.0.len() as u32)
                .raw(&inner.0)
                .u8s(8),
        );
        assert!(e.contains("metadata key's 4-byte length is cut off"), "{e}");
    }

    #[test]
    fn chunk_compression_and_records() {
        let fixed = || Body::default().u8s(8 + 8 + 8 + 4);
        passes(op::CHUNK, &fixed().str("zstd").u64(5).u8s(5));
        passes(op::CHUNK, &fixed().str("").u64(0));
        let e = refused(op::CHUNK, &fixed().u32(5).raw(b"zstd"));
        assert_names(&e, "Chunk", "compression", 5, 4);
        let e = refused(op::CHUNK, &fixed().str("").u64(u64::MAX).u8s(3));
        assert_names(&e, "Chunk", "records", u64::MAX, 3);
    }

    #[test]
    fn message_index_records() {
        passes(op::MESSAGE_INDEX, &Body::default().u8s(2).u32(32).u8s(32));
        passes(op::MESSAGE_INDEX, &Body::default().u8s(2).u32(0));
        let e = refused(op::MESSAGE_INDEX, &Body::default().u8s(2).u32(48).u8s(32));
        assert_names(&e, "MessageIndex", "records", 48, 32);
        let e = refused(op::MESSAGE_INDEX, &Body::default().u8s(2).u32(24).u8s(32));
        assert_broken_entries(&e, "MessageIndex", "records", 24, 16);
    }

    #[test]
    fn chunk_index_offsets_and_compression() {
        let fixed = || Body::default().u8s(4 * 8);
        passes(
            op::CHUNK_INDEX,
            &fixed().u32(10).u8s(10).u64(0).str("lz4").u64(0).u64(0),
        );
        passes(
            op::CHUNK_INDEX,
            &fixed().u32(0).u64(0).str("").u64(0).u64(0),
        );
        let e = refused(op::CHUNK_INDEX, &fixed().u32(0x8000_0000 - 8).u8s(40));
        assert_names(&e, "ChunkIndex", "message_index_offsets", 0x8000_0000 - 8, 40);
        // The fuzzer's case: a 6-byte map of 10-byte entries (the crate reads 10 and takes the
        // fields after it from the wrong place: a 2.4 GB `compression`).
        let e = refused(op::CHUNK_INDEX, &fixed().u32(6).u8s(6).u64(0).u32(0x9200_0000).u8s(20));
        assert_broken_entries(&e, "ChunkIndex", "message_index_offsets", 6, 10);
        let e = refused(op::CHUNK_INDEX, &fixed().u32(0).u64(0).u32(17).u8s(16));
        assert_names(&e, "ChunkIndex", "compression", 17, 16);
    }

    #[test]
    fn attachment_strings_data_and_crc() {
        let fixed = || Body::default().u8s(16);
        passes(
            op::ATTACHMENT,
            &fixed()
                .str("calib.json")
                .str("application/json")
                .u64(3)
                .raw(b"{}\n")
                .u32(0),
        );
        passes(op::ATTACHMENT, &fixed().str("").str("").u64(0).u32(0));
        let e = refused(op::ATTACHMENT, &fixed().u32(0xFFFF_FFF0).u8s(12));
        assert_names(&e, "Attachment", "name", 0xFFFF_FFF0, 12);
        let e = refused(op::ATTACHMENT, &fixed().str("a").u32(2).u8s(1));
        assert_names(&e, "Attachment", "media_type", 2, 1);
        let e = refused(
            op::ATTACHMENT,
            &fixed().str("a").str("b").u64(1 << 40).u8s(4 + 4),
        );
        assert_names(&e, "Attachment", "data", 1 << 40, 8);
        // The data fits but leaves no room for the CRC.
        let e = refused(op::ATTACHMENT, &fixed().str("a").str("b").u64(3).u8s(3));
        assert!(e.contains("4-byte CRC"), "{e}");
        assert_names(&e, "Attachment", "data", 3, 3);
        let e = refused(op::ATTACHMENT, &fixed().str("a").str("b").u64(0));
        assert_names(&e, "Attachment", "data", 0, 0);
    }

    #[test]
    fn attachment_index_strings() {
        let fixed = || Body::default().u8s(5 * 8);
        passes(
            op::ATTACHMENT_INDEX,
            &fixed().str("calib.json").str("application/json"),
        );
        passes(op::ATTACHMENT_INDEX, &fixed().str("").str(""));
        let e = refused(op::ATTACHMENT_INDEX, &fixed().u32(100));
        assert_names(&e, "AttachmentIndex", "name", 100, 0);
        let e = refused(op::ATTACHMENT_INDEX, &fixed().str("n").u32(3).raw(b"ab"));
        assert_names(&e, "AttachmentIndex", "media_type", 3, 2);
    }

    #[test]
    fn statistics_channel_counts() {
        let fixed = || Body::default().u8s(8 + 2 + 4 * 4 + 8 + 8);
        passes(op::STATISTICS, &fixed().u32(20).u8s(20));
        passes(op::STATISTICS, &fixed().u32(0));
        let e = refused(op::STATISTICS, &fixed().u32(30).u8s(20));
        assert_names(&e, "Statistics", "channel_message_counts", 30, 20);
        let e = refused(op::STATISTICS, &fixed().u32(21).u8s(30));
        assert_broken_entries(&e, "Statistics", "channel_message_counts", 21, 10);
    }

    #[test]
    fn metadata_name_and_map() {
        passes(
            op::METADATA,
            &Body::default()
                .str("rosbag2")
                .map(&[("serialized_metadata", "x: 1")]),
        );
        passes(op::METADATA, &Body::default().str("").map(&[]));
        let e = refused(op::METADATA, &Body::default().u32(8).raw(b"rosbag2"));
        assert_names(&e, "Metadata", "name", 8, 7);
        let e = refused(
            op::METADATA,
            &Body::default().str("r").u32(0xFFFF_FFFF).u8s(2),
        );
        assert_names(&e, "Metadata", "metadata", 0xFFFF_FFFF, 2);
        let inner = Body::default().str("k").u32(0xFFFF_FFF0).raw(b"v");
        let e = refused(
            op::METADATA,
            &Body::default()
                .str("r")
                .u32(inner.0.len() as u32)
                .raw(&inner.0),
        );
        assert_names(&e, "Metadata", "metadata value", 0xFFFF_FFF0, 1);
    }

    #[test]
    fn metadata_index_name() {
        passes(
            op::METADATA_INDEX,
            &Body::default().u64(0).u64(0).str("rosbag2"),
        );
        passes(op::METADATA_INDEX, &Body::default().u64(0).u64(0).str(""));
        let e = refused(
            op::METADATA_INDEX,
            &Body::default().u64(0).u64(0).u32(8).raw(b"rosbag2"),
        );
        assert_names(&e, "MetadataIndex", "name", 8, 7);
    }

    #[test]
    fn short_records_unknown_opcodes_and_fixed_records_pass() {
        // Too short for a fixed field or a length prefix: the crate's parser reports those.
        passes(op::CHANNEL, &Body::default().u8s(3));
        passes(op::CHANNEL, &Body::default().u8s(4).raw(&[0xFF, 0xFF]));
        passes(
            op::ATTACHMENT,
            &Body::default().u8s(16).str("a").str("b").u8s(7),
        );
        passes(op::HEADER, &Body::default());
        // No length fields.
        for opcode in [
            op::FOOTER,
            op::MESSAGE,
            op::SUMMARY_OFFSET,
            op::DATA_END,
            0x10,
            0x80,
            0xFF,
        ] {
            passes(opcode, &Body::default().u32(0xFFFF_FFFF));
            passes(opcode, &Body::default());
        }
    }

    /// What the check lets through, the crate parses as the record the writer wrote: the check
    /// walks the same layout.
    #[test]
    fn records_written_by_the_crate_pass_and_parse() {
        use std::collections::BTreeMap;
        use std::io::Cursor;
        let mut buf = Vec::new();
        {
            let mut w = mcap::WriteOptions::new()
                .compression(None)
                .create(Cursor::new(&mut buf))
                .expect("writer");
            let schema = w
                .add_schema("pkg/msg/T", "ros2msg", b"int32 a")
                .expect("schema");
            let meta = BTreeMap::from([
                ("k".to_string(), "v".to_string()),
                ("qos".to_string(), String::new()),
            ]);
            let ch = w.add_channel(schema, "/t", "cdr", &meta).expect("channel");
            w.write_to_known_channel(
                &mcap::records::MessageHeader {
                    channel_id: ch,
                    sequence: 1,
                    log_time: 5,
                    publish_time: 5,
                },
                b"payload",
            )
            .expect("message");
            w.attach(&mcap::Attachment {
                log_time: 1,
                create_time: 2,
                name: "calib.json".into(),
                media_type: "application/json".into(),
                data: std::borrow::Cow::Borrowed(b"{}"),
            })
            .expect("attachment");
            w.write_metadata(&mcap::records::Metadata {
                name: "rosbag2".into(),
                metadata: meta.clone(),
            })
            .expect("metadata");
            w.finish().expect("finish");
        }
        // Every top-level record, and every record inside the (uncompressed) chunks.
        let mut seen = std::collections::BTreeSet::new();
        let mut stack = vec![buf[mcap::MAGIC.len()..buf.len() - mcap::MAGIC.len()].to_vec()];
        while let Some(bytes) = stack.pop() {
            let mut at = 0;
            while at + 9 <= bytes.len() {
                let opcode = bytes[at];
                let len = u64::from_le_bytes(bytes[at + 1..at + 9].try_into().unwrap()) as usize;
                let body = &bytes[at + 9..at + 9 + len];
                if let Err(e) = check_record_lengths(opcode, body) {
                    panic!("opcode {opcode:#04x}: {e}");
                }
                match parse_record(opcode, body) {
                    Ok(Record::Chunk { data, .. }) => stack.push(data.into_owned()),
                    Ok(_) => {}
                    Err(e) => panic!("opcode {opcode:#04x}: {e:?}"),
                }
                seen.insert(opcode);
                at += 9 + len;
            }
        }
        for opcode in [
            op::HEADER,
            op::SCHEMA,
            op::CHANNEL,
            op::MESSAGE,
            op::CHUNK,
            op::MESSAGE_INDEX,
            op::CHUNK_INDEX,
            op::ATTACHMENT,
            op::ATTACHMENT_INDEX,
            op::STATISTICS,
            op::METADATA,
            op::METADATA_INDEX,
            op::SUMMARY_OFFSET,
            op::DATA_END,
            op::FOOTER,
        ] {
            assert!(
                seen.contains(&opcode),
                "no record {opcode:#04x} written: {seen:?}"
            );
        }
    }

    /// The check is never stricter than the crate on a record cut short: a record cut anywhere
    /// that the check refuses, the crate cannot read either (it errs, having only small lengths
    /// here to reserve, or panics: an Attachment with no room for its CRC made it slice out of
    /// bounds), and one that passes goes to the crate, which reads or refuses it without a panic.
    #[test]
    fn records_cut_anywhere_are_refused_by_the_crate_too() {
        let records: Vec<(u8, Body)> = vec![
            (op::HEADER, Body::default().str("ros2").str("rosbag2")),
            (op::SCHEMA, schema_prefix().u32(3).raw(b"abc")),
            (op::CHANNEL, channel_prefix().map(&[("a", "bc"), ("d", "")])),
            (op::CHUNK, Body::default().u8s(28).str("").u64(2).u8s(2)),
            (op::MESSAGE_INDEX, Body::default().u8s(2).u32(16).u8s(16)),
            (
                op::CHUNK_INDEX,
                Body::default()
                    .u8s(32)
                    .u32(10)
                    .u8s(10)
                    .u64(0)
                    .str("zstd")
                    .u64(0)
                    .u64(0),
            ),
            (
                op::ATTACHMENT,
                Body::default()
                    .u8s(16)
                    .str("n")
                    .str("m")
                    .u64(2)
                    .raw(b"xy")
                    .u32(0),
            ),
            (
                op::ATTACHMENT_INDEX,
                Body::default().u8s(40).str("n").str("m"),
            ),
            (op::STATISTICS, Body::default().u8s(42).u32(10).u8s(10)),
            (op::METADATA, Body::default().str("n").map(&[("k", "v")])),
            (op::METADATA_INDEX, Body::default().u8s(16).str("n")),
        ];
        for (opcode, body) in records {
            assert!(mcap::parse_record(opcode, &body.0).is_ok(), "{opcode:#04x}");
            passes(opcode, &body);
            for cut in 0..body.0.len() {
                let short = &body.0[..cut];
                match check_record_lengths(opcode, short) {
                    Ok(()) => {
                        let _ = mcap::parse_record(opcode, short);
                    }
                    Err(e) => {
                        let crate_reads_it =
                            std::panic::catch_unwind(|| mcap::parse_record(opcode, short).is_ok());
                        assert!(
                            !matches!(crate_reads_it, Ok(true)),
                            "{opcode:#04x} cut at {cut}: refused ({e}) but the crate reads it"
                        );
                    }
                }
            }
        }
    }
}
