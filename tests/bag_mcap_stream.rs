//! The MCAP reader streams: files written here with the `mcap` crate (small chunks, overlapping
//! time ranges, out-of-order messages, zstd/lz4/uncompressed, indexed or not, truncated or
//! damaged) read in exactly the order of a stable sort by log time, what reading the whole file
//! and sorting it gives (the reference below, the reader's behaviour before it streamed), and the
//! reader holds only the chunks that overlap in time.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use mcap::records::MessageHeader;
use mcap::{Compression, WriteOptions};
use sptr::bag::{Bag, BagError, BufferUse, RawMessage};

const A: &str = "/sensing/lidar/points";
const B: &str = "/cam/camera_info";
const TYPES: [&str; 2] = ["sensor_msgs/msg/PointCloud2", "sensor_msgs/msg/CameraInfo"];

/// One message to write: topic index (0: A, 1: B), log time, payload.
#[derive(Clone)]
struct Msg {
    topic: usize,
    t: u64,
    data: Vec<u8>,
}

type Chunks = Vec<Vec<Msg>>;

/// Chunks of `(topic, log time)`, each payload distinct and `size`-ish bytes.
fn layout(chunks: &[&[(usize, u64)]], size: usize) -> Chunks {
    let mut n = 0u32;
    chunks
        .iter()
        .map(|c| {
            c.iter()
                .map(|&(topic, t)| {
                    n += 1;
                    let mut data = n.to_le_bytes().repeat(size / 4 + (n as usize % 7));
                    data.push(topic as u8);
                    Msg { topic, t, data }
                })
                .collect()
        })
        .collect()
}

/// Chunks whose time ranges overlap, out-of-order messages within and across chunks, equal
/// stamps within a chunk and across chunks, a late chunk earlier than all the others, and
/// chunks of one topic only.
fn tangled() -> Chunks {
    layout(
        &[
            &[(0, 10), (1, 12), (0, 11)],
            &[(0, 12), (1, 15), (0, 13)],
            &[(1, 14), (0, 20)],
            &[(0, 16), (0, 16), (1, 17)],
            &[(0, 30), (1, 25)],
            &[(1, 21), (0, 22)],
            &[(0, 30), (1, 30)],
            &[(0, 5)],
            &[(1, 40), (1, 41)],
            &[(0, 42)],
        ],
        300,
    )
}

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("sptr-mcap-stream-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// The storage file of a new bag directory `name` (its `metadata.yaml` lists the file), so
    /// that a damaged file can still be opened as a bag.
    fn file(&self, name: &str) -> PathBuf {
        let stem = name.trim_end_matches(".mcap");
        let dir = self.0.join(stem);
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("metadata.yaml"),
            format!(
                "rosbag2_bagfile_information:\n  version: 5\n  storage_identifier: mcap\n  \
                 relative_file_paths: [{stem}.mcap]\n"
            ),
        )
        .unwrap();
        dir.join(format!("{stem}.mcap"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Writes `chunks` to `path`, one chunk per group (the writer's own chunk size is off; `flush`
/// closes a chunk).
fn write_mcap(path: &Path, options: WriteOptions, chunks: &Chunks) {
    let file = fs::File::create(path).unwrap();
    let mut w = options
        .chunk_size(None)
        .profile("ros2")
        .create(BufWriter::new(file))
        .unwrap();
    let mut channels = Vec::new();
    for (topic, type_name) in [A, B].iter().zip(TYPES) {
        let schema = w.add_schema(type_name, "ros2msg", b"").unwrap();
        channels.push(
            w.add_channel(schema, topic, "cdr", &BTreeMap::new())
                .unwrap(),
        );
    }
    let mut sequence = 0;
    for chunk in chunks {
        for m in chunk {
            sequence += 1;
            let header = MessageHeader {
                channel_id: channels[m.topic],
                sequence,
                log_time: m.t,
                publish_time: m.t,
            };
            w.write_to_known_channel(&header, &m.data).unwrap();
        }
        w.flush().unwrap();
    }
    w.finish().unwrap();
}

fn indexed(compression: Option<Compression>) -> WriteOptions {
    WriteOptions::new().compression(compression)
}

/// No summary at all (as a recording cut short leaves it, but intact).
fn unindexed(compression: Option<Compression>) -> WriteOptions {
    WriteOptions::new()
        .compression(compression)
        .emit_summary_records(false)
        .emit_summary_offsets(false)
        .emit_statistics(false)
        .emit_chunk_indexes(false)
        .emit_message_indexes(false)
}

const COMPRESSIONS: [Option<Compression>; 3] =
    [None, Some(Compression::Zstd), Some(Compression::Lz4)];

/// What the reader must give: every message in file order, stably sorted by log time.
fn expected(chunks: &Chunks, filter: &[&str]) -> Vec<RawMessage> {
    let mut msgs: Vec<RawMessage> = chunks
        .iter()
        .flatten()
        .filter(|m| filter.is_empty() || filter.contains(&[A, B][m.topic]))
        .map(|m| RawMessage {
            topic: [A, B][m.topic].to_string(),
            type_name: TYPES[m.topic].to_string(),
            timestamp_ns: m.t as i64,
            data: m.data.clone(),
        })
        .collect();
    msgs.sort_by_key(|m| m.timestamp_ns);
    msgs
}

/// The reader before it streamed: the whole file in memory, read linearly, the messages before
/// the first error stably sorted, then whether there was an error.
fn reference_read(path: &Path, filter: &[&str]) -> (Vec<RawMessage>, bool) {
    let bytes = fs::read(path).unwrap();
    let options = mcap::read::Options::ValidateChunkCrcs.into();
    let mut msgs = Vec::new();
    let mut error = false;
    let stream = match mcap::MessageStream::new_with_options(&bytes, options) {
        Ok(s) => s,
        Err(_) => return (msgs, true),
    };
    for item in stream {
        match item {
            Ok(m) => {
                if !filter.is_empty() && !filter.contains(&m.channel.topic.as_str()) {
                    continue;
                }
                msgs.push(RawMessage {
                    topic: m.channel.topic.clone(),
                    type_name: m.channel.schema.as_ref().map(|s| s.name.clone()).unwrap(),
                    timestamp_ns: i64::try_from(m.log_time).unwrap_or(i64::MAX),
                    data: m.data.into_owned(),
                });
            }
            Err(_) => {
                error = true;
                break;
            }
        }
    }
    msgs.sort_by_key(|m| m.timestamp_ns);
    (msgs, error)
}

/// The reader's messages, its error if any (the iterator must end after it), and what it held.
fn read(path: &Path, filter: &[&str]) -> (Vec<RawMessage>, Option<BagError>, BufferUse) {
    let bag = Bag::open(path.parent().unwrap()).unwrap();
    let mut it = bag.messages(filter);
    let mut msgs = Vec::new();
    let mut error = None;
    for item in it.by_ref() {
        match item {
            Ok(m) => msgs.push(m),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    assert!(it.next().is_none(), "iterator must end after an error");
    (msgs, error, it.peak_buffered())
}

fn read_ok(path: &Path, filter: &[&str]) -> (Vec<RawMessage>, BufferUse) {
    let (msgs, error, held) = read(path, filter);
    if let Some(e) = error {
        panic!("{e}");
    }
    (msgs, held)
}

/// What a time-ordered merge may hold at once: when a chunk is read, every chunk still held
/// has a time range that contains the new chunk's start. The most chunks (and their bytes) whose
/// ranges contain one chunk's start.
fn overlap_bound(chunks: &Chunks) -> (usize, u64) {
    let ranges: Vec<(u64, u64, u64)> = chunks
        .iter()
        .filter(|c| !c.is_empty())
        .map(|c| {
            let lo = c.iter().map(|m| m.t).min().unwrap();
            let hi = c.iter().map(|m| m.t).max().unwrap();
            let bytes = c.iter().map(|m| m.data.len() as u64).sum();
            (lo, hi, bytes)
        })
        .collect();
    ranges
        .iter()
        .map(|&(start, _, _)| {
            let over: Vec<_> = ranges
                .iter()
                .filter(|&&(lo, hi, _)| lo <= start && start <= hi)
                .collect();
            (over.len(), over.iter().map(|r| r.2).sum::<u64>())
        })
        .fold((0, 0), |(c, b), (c2, b2)| (c.max(c2), b.max(b2)))
}

fn total_bytes(chunks: &Chunks) -> u64 {
    chunks.iter().flatten().map(|m| m.data.len() as u64).sum()
}

#[test]
fn overlapping_chunks_read_in_stable_log_time_order() {
    let s = Scratch::new("tangled");
    let chunks = tangled();
    let (max_chunks, max_bytes) = overlap_bound(&chunks);
    for (k, compression) in COMPRESSIONS.into_iter().enumerate() {
        let path = s.file(&format!("tangled{k}.mcap"));
        write_mcap(&path, indexed(compression), &chunks);
        let (msgs, held) = read_ok(&path, &[]);
        assert!(
            msgs == expected(&chunks, &[]),
            "{compression:?}: not a stable sort by log time"
        );
        assert_eq!(msgs, reference_read(&path, &[]).0);
        // Read through the chunk index, holding no more than the chunks that overlap.
        assert!(
            held.chunks >= 1,
            "{compression:?}: chunk index not used ({held:?})"
        );
        assert!(held.chunks <= max_chunks, "{held:?} > {max_chunks} chunks");
        assert!(held.bytes <= max_bytes, "{held:?} > {max_bytes} bytes");
    }
}

#[test]
fn topic_filter_keeps_the_order_and_damage_on_other_topics_is_still_seen() {
    let s = Scratch::new("filter");
    let chunks = tangled();
    for (k, compression) in COMPRESSIONS.into_iter().enumerate() {
        let path = s.file(&format!("filter{k}.mcap"));
        write_mcap(&path, indexed(compression), &chunks);
        for filter in [&[A][..], &[B], &[A, B], &["/no/such/topic"]] {
            let (msgs, _) = read_ok(&path, filter);
            assert!(
                msgs == expected(&chunks, filter),
                "{compression:?} {filter:?}"
            );
            assert_eq!(msgs, reference_read(&path, filter).0);
        }
        // Damage in the chunk of topic B only (chunk 8, times 40..41): a read of topic A still
        // checks it, as the whole-file reader did, and stops there.
        let summary = mcap::Summary::read(&fs::read(&path).unwrap())
            .unwrap()
            .unwrap();
        let mut index = summary.chunk_indexes.clone();
        index.sort_by_key(|c| c.chunk_start_offset);
        let damaged = s.file(&format!("filter{k}-damaged.mcap"));
        fs::copy(&path, &damaged).unwrap();
        let c = &index[8];
        flip_bytes(&damaged, c.chunk_start_offset + c.chunk_length - 20, 8);
        let (msgs, error, _) = read(&damaged, &[A]);
        let before: Vec<_> = expected(&chunks, &[A])
            .into_iter()
            .filter(|m| m.timestamp_ns < 40)
            .collect();
        assert!(msgs == before, "{compression:?}");
        let error = error.expect("damage in a chunk of another topic not seen");
        assert_eq!(error.path(), damaged);
    }
}

#[test]
fn memory_holds_the_overlapping_chunks_not_the_file() {
    // 60 chunks of ~8 KB; each overlaps the next by one message, so a merge holds 2 at most.
    let times: Vec<Vec<(usize, u64)>> = (0..60u64)
        .map(|i| {
            let mut c: Vec<_> = (0..4).map(|j| (0, 100 * i + 20 * j)).collect();
            c.push((1, 100 * i + 130));
            c
        })
        .collect();
    let refs: Vec<&[(usize, u64)]> = times.iter().map(|c| &c[..]).collect();
    let chunks = layout(&refs, 2000);
    let (max_chunks, max_bytes) = overlap_bound(&chunks);
    assert_eq!(max_chunks, 2);
    let s = Scratch::new("memory");
    let path = s.file("long.mcap");
    write_mcap(&path, indexed(Some(Compression::Zstd)), &chunks);
    let (msgs, held) = read_ok(&path, &[]);
    assert!(msgs == expected(&chunks, &[]));
    eprintln!(
        "held at most {held:?}; bound {max_chunks} chunks / {max_bytes} bytes; \
         file {} bytes of messages",
        total_bytes(&chunks)
    );
    assert!((1..=max_chunks).contains(&held.chunks), "{held:?}");
    assert!(held.bytes <= max_bytes, "{held:?}");
    assert!(held.bytes * 10 < total_bytes(&chunks));

    // The counter measures what is held: the same messages, unindexed and out of order, can only
    // be sorted whole.
    let mut shuffled = chunks.clone();
    shuffled.reverse();
    let path = s.file("long-unindexed.mcap");
    write_mcap(&path, unindexed(Some(Compression::Zstd)), &shuffled);
    let (msgs, held) = read_ok(&path, &[]);
    assert!(msgs == expected(&shuffled, &[]));
    assert_eq!(held.bytes, total_bytes(&chunks));
}

#[test]
fn unindexed_files_read_like_a_whole_file_sort() {
    let s = Scratch::new("unindexed");
    let in_order = layout(
        &[&[(0, 1), (1, 1), (0, 2)], &[(1, 3), (0, 3)], &[(0, 9)]],
        100,
    );
    for (k, compression) in COMPRESSIONS.into_iter().enumerate() {
        // In order: streamed as read, nothing held.
        let path = s.file(&format!("ordered{k}.mcap"));
        write_mcap(&path, unindexed(compression), &in_order);
        let (msgs, held) = read_ok(&path, &[]);
        assert!(msgs == expected(&in_order, &[]), "{compression:?}");
        assert_eq!(held, BufferUse::default());
        // Out of order: sorted whole.
        let path = s.file(&format!("tangled{k}.mcap"));
        write_mcap(&path, unindexed(compression), &tangled());
        for filter in [&[][..], &[A], &[B]] {
            let (msgs, held) = read_ok(&path, filter);
            assert!(
                msgs == expected(&tangled(), filter),
                "{compression:?} {filter:?}"
            );
            assert_eq!(held.chunks, 0);
        }
    }
    // Messages outside chunks, with a summary (no chunk index): read linearly.
    let path = s.file("loose.mcap");
    write_mcap(&path, WriteOptions::new().use_chunks(false), &tangled());
    let (msgs, held) = read_ok(&path, &[]);
    assert!(msgs == expected(&tangled(), &[]));
    assert_eq!(held.chunks, 0);
}

fn flip_bytes(path: &Path, at: u64, n: usize) {
    let mut bytes = fs::read(path).unwrap();
    for b in &mut bytes[at as usize..at as usize + n] {
        *b ^= 0x5A;
    }
    fs::write(path, bytes).unwrap();
}

/// Cut anywhere, an MCAP file gives what the whole-file reader gave: the messages before the
/// damage, sorted, then an error naming the file.
#[test]
fn truncated_files_read_like_before() {
    let s = Scratch::new("truncated");
    let ordered = layout(
        &(0..12u64)
            .map(|i| vec![(0, 10 * i), (1, 10 * i + 5)])
            .collect::<Vec<_>>()
            .iter()
            .map(|c| &c[..])
            .collect::<Vec<_>>(),
        200,
    );
    for (name, chunks) in [("ordered", ordered), ("tangled", tangled())] {
        for (k, compression) in COMPRESSIONS.into_iter().enumerate() {
            let whole = s.file(&format!("{name}{k}.mcap"));
            write_mcap(&whole, indexed(compression), &chunks);
            let bytes = fs::read(&whole).unwrap();
            let cut = s.file(&format!("{name}{k}-cut.mcap"));
            let mut recovered = Vec::new();
            for step in 0..40 {
                let n = bytes.len() * step / 40;
                fs::write(&cut, &bytes[..n]).unwrap();
                let (want, want_error) = reference_read(&cut, &[]);
                assert!(want_error, "a cut file must be an error");
                let (msgs, error, _) = read(&cut, &[]);
                assert!(
                    msgs == want,
                    "{name} {compression:?} cut at {n}: {:?} vs {:?}, {error:?}",
                    msgs.iter().map(|m| m.timestamp_ns).collect::<Vec<_>>(),
                    want.iter().map(|m| m.timestamp_ns).collect::<Vec<_>>()
                );
                let error = error.expect("an error");
                assert_eq!(error.path(), cut, "{error}");
                assert!(
                    error.to_string().contains(&cut.display().to_string()),
                    "{error}"
                );
                recovered.push(msgs.len());
            }
            assert!(recovered.iter().any(|&n| n > 0), "{recovered:?}");
        }
    }
}

/// Bytes flipped in a chunk of an indexed file: the messages that sort before the damaged chunk
/// are delivered, in order, then an error naming the file.
#[test]
fn damaged_chunk_is_an_error_after_the_messages_before_it() {
    let s = Scratch::new("damaged");
    let chunks = tangled();
    let want = expected(&chunks, &[]);
    for (k, compression) in COMPRESSIONS.into_iter().enumerate() {
        let path = s.file(&format!("damaged{k}.mcap"));
        write_mcap(&path, indexed(compression), &chunks);
        let summary = mcap::Summary::read(&fs::read(&path).unwrap())
            .unwrap()
            .unwrap();
        let mut index = summary.chunk_indexes.clone();
        index.sort_by_key(|c| c.chunk_start_offset);
        // Chunk 4 (times 25..30).
        let c = &index[4];
        flip_bytes(&path, c.chunk_start_offset + c.chunk_length - 12, 4);
        let (msgs, error, _) = read(&path, &[]);
        let error = error.expect("damage not seen");
        assert!(matches!(error, BagError::Mcap { .. }), "{error:?}");
        assert_eq!(error.path(), path);
        // Everything before the damaged chunk, in order; what the damaged chunk gave before the
        // damage showed may follow (in order; an uncompressed chunk's flipped payload is only
        // seen by its CRC, at its end), nothing after the next chunk.
        let before = want.iter().filter(|m| m.timestamp_ns < 25).count();
        assert!(
            msgs.len() >= before,
            "{compression:?}: {} < {before}",
            msgs.len()
        );
        assert!(msgs[..before] == want[..before], "{compression:?}");
        assert!(msgs
            .windows(2)
            .all(|w| w[0].timestamp_ns <= w[1].timestamp_ns));
        assert!(msgs.iter().all(|m| m.timestamp_ns <= 30));
    }
}

/// A damaged summary is not trusted: the file is read linearly, as before.
#[test]
fn damaged_summary_falls_back_to_the_linear_read() {
    let s = Scratch::new("summary");
    let chunks = tangled();
    let path = s.file("summary.mcap");
    write_mcap(&path, indexed(Some(Compression::Zstd)), &chunks);
    let bytes = fs::read(&path).unwrap();
    let summary_start = u64::from_le_bytes(bytes[bytes.len() - 8 - 20..][..8].try_into().unwrap());
    // A byte of the first chunk index's start time (a chunk index record is the first summary
    // record the crate writes after schemas and channels; any summary byte is covered by the CRC).
    let at = summary_start + (bytes.len() as u64 - summary_start) / 2;
    flip_bytes(&path, at, 1);
    let (msgs, error, held) = read(&path, &[]);
    let (want, want_error) = reference_read(&path, &[]);
    assert!(msgs == want);
    assert_eq!(error.is_some(), want_error);
    assert_eq!(held.chunks, 0, "a damaged summary was used");
}

/// The rosbags-written fixtures read as the whole-file reader read them.
#[test]
fn fixture_bags_read_like_before() {
    let root = common::root();
    for name in ["mcap_small", "mcap_zstd", "nuscenes_sample"] {
        let file = root.join(format!("tests/data/bags/{name}/{name}.mcap"));
        let bag = Bag::open(&root.join(format!("tests/data/bags/{name}"))).unwrap();
        let mut filters: Vec<Vec<&str>> = vec![vec![]];
        filters.extend(bag.topics().iter().map(|t| vec![t.name.as_str()]));
        for filter in &filters {
            let (msgs, held) = read_ok(&file, filter);
            assert!(msgs == reference_read(&file, filter).0, "{name} {filter:?}");
            eprintln!("{name} {filter:?}: {} messages, held {held:?}", msgs.len());
        }
    }
}

#[test]
fn messages_iterator_is_send() {
    fn send<T: Send>() {}
    send::<sptr::bag::Messages>();
}
