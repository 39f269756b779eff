//! Inputs found by the fuzzers (scripts/fuzz.sh, fuzz/) that once crashed a decoder, kept in
//! tests/data/fuzz/<target>/ and run here through the same public function the fuzz target calls.
//! Each must now give the error named below (and never panic). The fuzzers also reuse these files
//! as seeds.

mod common;

use sptr::sensors::cloud_files::parse_pcd;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, noting the largest single allocation of each thread: a decoder must
/// not reserve more than its input can back.
struct NoteLargest;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every call goes to the system allocator unchanged.
unsafe impl GlobalAlloc for NoteLargest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
}

#[global_allocator]
static ALLOCATOR: NoteLargest = NoteLargest;

/// The largest single allocation `f` made on this thread, and what it returned.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (usize, T) {
    LARGEST.with(|l| l.set(0));
    let out = f();
    (LARGEST.with(|l| l.get()), out)
}

fn data(target: &str, name: &str) -> Vec<u8> {
    let p = common::root().join("tests/data/fuzz").join(target).join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A binary PCD whose `z` field has COUNT 0 made the reader slice past the row (index 12 of 8).
#[test]
fn pcd_field_with_count_zero_is_an_error() {
    let e = parse_pcd(&data("pcd", "count_zero_field.pcd")).unwrap_err();
    assert!(e.contains("field `z`") && e.contains("COUNT 0"), "{e}");
}

/// The same in ASCII: a last field of COUNT 0 used to index past the row's tokens.
#[test]
fn pcd_ascii_last_field_count_zero_is_an_error() {
    let text = b"FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nCOUNT 1 1 0\nPOINTS 1\nDATA ascii\n1 2\n";
    let e = parse_pcd(text).unwrap_err();
    assert!(e.contains("field `z`"), "{e}");
}

/// A header claiming 2^40 ASCII points with one row of data must not reserve memory for them.
#[test]
fn pcd_huge_point_count_fails_on_the_rows_not_the_allocation() {
    let text = b"FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nPOINTS 1099511627776\nDATA ascii\n1 2 3\n";
    let e = parse_pcd(text).unwrap_err();
    assert!(e.contains("has 1 rows"), "{e}");
}

/// A PCD `SIZE 55555555555554` for a wanted field made the type check allocate that many bytes.
#[test]
fn pcd_huge_field_size_is_an_error() {
    let e = parse_pcd(&data("pcd", "size_huge.pcd")).unwrap_err();
    assert!(e.contains("field `x`") && e.contains("not supported"), "{e}");
}

/// A CameraInfo whose K holds a NaN was accepted as intrinsics (the geometry would be NaN).
#[test]
fn camera_info_with_nan_intrinsics_is_refused() {
    use sptr::msgs::cdr::{decode_message, Message};
    use sptr::sensors::calib::camera::intrinsics_from_k;
    let Ok(Message::CameraInfo(info)) = decode_message("sensor_msgs/msg/CameraInfo", &data("camera_info_cdr", "nan_in_k.cdr")) else {
        panic!("the reproducer is a well-formed CameraInfo");
    };
    assert!(info.k.iter().any(|v| v.is_nan()));
    let e = intrinsics_from_k(&info.k).unwrap_err().to_string();
    assert!(e.contains("CameraInfo K[7] is NaN"), "{e}");
}

/// An MCAP record whose length field says 7e18 bytes made the reader try to allocate them.
/// Now the read stops with an error that names the record.
#[test]
fn mcap_record_length_beyond_the_file_is_an_error() {
    use sptr::bag::reader::Bag;
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-regression-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("record_length_huge.mcap");
    std::fs::write(&file, data("mcap_file", "record_length_huge.mcap")).unwrap();
    let outcome = match Bag::open(&file) {
        Err(e) => e.to_string(),
        Ok(bag) => match bag.messages(&[]).find_map(|m| m.err()) {
            Some(e) => e.to_string(),
            None => String::from("no error"),
        },
    };
    assert!(outcome.contains("too large") || outcome.contains("RecordTooLarge") || outcome.contains("length"), "{outcome}");
}

/// An uncompressed chunk whose inner record runs past the chunk's end made the mcap crate
/// subtract with overflow (a panic with overflow checks on). The read now ends in an error or
/// in the messages before it, never a panic.
#[test]
fn mcap_chunk_record_overrunning_its_chunk_ends_the_read() {
    use sptr::bag::reader::Bag;
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-regression-chunk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("chunk_record_overruns_chunk.mcap");
    let bytes = data("mcap_file", "chunk_record_overruns_chunk.mcap");
    std::fs::write(&file, &bytes).unwrap();
    if let Ok(bag) = Bag::open(&file) {
        let mut delivered = 0usize;
        for m in bag.messages(&[]) {
            let Ok(m) = m else { break };
            assert!(m.data.len() <= bytes.len());
            delivered += 1;
        }
        assert!(delivered <= bytes.len() / 8, "{delivered} messages from {} bytes", bytes.len());
    }
}

/// An indexed MCAP whose zstd chunk holds a record declaring 8e18 bytes made the chunk reader
/// reserve them (the crate's `ChunkReader` has no record length limit). The read now ends in
/// an error that says the record's length exceeds the limit.
#[test]
fn mcap_record_inside_an_indexed_chunk_with_a_huge_length_is_an_error() {
    use sptr::bag::reader::Bag;
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-regression-inner-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("chunk_inner_record_huge.mcap");
    std::fs::write(&file, data("mcap_file", "chunk_inner_record_huge.mcap")).unwrap();
    let outcome = match Bag::open(&file) {
        Err(e) => e.to_string(),
        Ok(bag) => match bag.messages(&[]).find_map(|m| m.err()) {
            Some(e) => e.to_string(),
            None => String::from("no error"),
        },
    };
    assert!(outcome.contains("length exceeds limit"), "{outcome}");
}

/// A file of `tests/data/fuzz/mcap_file/` opened as a bare `.mcap` and read to the end: the
/// largest single allocation meanwhile, and the error that ended the read (from `Bag::open`,
/// which reads a bare file once for its topics, or from the read).
fn read_mcap_regression(name: &str) -> (usize, String) {
    use sptr::bag::reader::Bag;
    let stem = name.trim_end_matches(".mcap");
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-regression-{stem}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, data("mcap_file", name)).unwrap();
    let (largest, error) = largest_allocation(|| match Bag::open(&file) {
        Err(e) => e.to_string(),
        Ok(bag) => match bag.messages(&[]).find_map(|m| m.err()) {
            Some(e) => e.to_string(),
            None => String::from("no error"),
        },
    });
    let _ = std::fs::remove_dir_all(&dir);
    (largest, error)
}

/// No allocation larger than this while reading a regression file of a few hundred bytes.
const SMALL: usize = 1 << 20;

/// A Channel record whose topic declares 0xFFFF_FFF0 bytes made the mcap crate reserve them
/// before reading the topic (the fuzz script allowed 4 GiB allocations for the bag targets for
/// it). The record's length fields are now checked first: the read stops with an error naming
/// the record, the field and both lengths.
#[test]
fn mcap_channel_topic_longer_than_its_record_is_an_error_not_an_allocation() {
    let (largest, error) = read_mcap_regression("channel_topic_huge.mcap");
    assert!(largest < SMALL, "an allocation of {largest} bytes");
    assert!(
        error.contains(
            "Channel record: topic declares 4294967280 bytes, but only 16 bytes are left in the record"
        ),
        "{error}"
    );
    assert!(error.contains("MCAP damaged at message 1"), "{error}");
}

/// An Attachment whose data declares 2^63 bytes. The crate compares this length with the record
/// itself (without naming the field), but an Attachment with no room for the CRC after its data
/// made it slice out of bounds, a panic. Refused now, naming the field.
#[test]
fn mcap_attachment_data_longer_than_its_record_is_an_error() {
    let (largest, error) = read_mcap_regression("attachment_data_huge.mcap");
    assert!(largest < SMALL, "an allocation of {largest} bytes");
    assert!(
        error.contains(
            "Attachment record: data declares 9223372036854775808 bytes (and the 4-byte CRC after \
             it), but only 6 bytes are left"
        ),
        "{error}"
    );
}

/// An Attachment that ends right after its data length, with no room for the CRC that follows
/// the data: the crate's parser sliced the record out of bounds (a panic). Refused before it.
#[test]
fn mcap_attachment_without_room_for_its_crc_is_an_error_not_a_panic() {
    let (largest, error) = read_mcap_regression("attachment_without_crc.mcap");
    assert!(largest < SMALL, "an allocation of {largest} bytes");
    assert!(
        error.contains(
            "Attachment record: data declares 0 bytes (and the 4-byte CRC after it), but only 0 \
             bytes are left in the record"
        ),
        "{error}"
    );
}

/// A file read through its chunk index whose chunk holds a Schema record with a name declaring
/// 0xFFFF_FFF0 bytes: the chunk's records are checked as the linear read checks them.
#[test]
fn mcap_schema_name_longer_than_its_record_in_an_indexed_chunk_is_an_error() {
    let (largest, error) = read_mcap_regression("chunk_schema_name_huge.mcap");
    assert!(largest < SMALL, "an allocation of {largest} bytes");
    assert!(error.contains("Schema record: name declares 4294967280 bytes"), "{error}");
}

/// A summary whose Schema record's data declares more than the record holds: the summary is
/// not used (the file is read linearly), the messages of the data section are delivered, and
/// the read ends with the summary record refused.
#[test]
fn mcap_summary_schema_data_longer_than_its_record_is_an_error_after_the_messages() {
    use sptr::bag::reader::Bag;
    let (largest, error) = read_mcap_regression("summary_schema_data_huge.mcap");
    assert!(largest < SMALL, "an allocation of {largest} bytes");
    assert!(error.contains("Schema record: data declares 4294967040 bytes"), "{error}");
    assert!(error.contains("MCAP damaged at message 2"), "{error}");
    // In a bag directory (topics from the metadata), the two messages come first.
    let dir = std::env::temp_dir().join(format!("sptr-fuzz-regression-bag-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("b.mcap"), data("mcap_file", "summary_schema_data_huge.mcap")).unwrap();
    std::fs::write(
        dir.join("metadata.yaml"),
        "rosbag2_bagfile_information:\n  version: 5\n  storage_identifier: mcap\n  \
         relative_file_paths: [b.mcap]\n  message_count: 2\n",
    )
    .unwrap();
    let bag = Bag::open(&dir).unwrap();
    let items: Vec<_> = bag.messages(&[]).collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(items.len(), 3);
    assert_eq!(items[0].as_ref().map(|m| m.timestamp_ns).ok(), Some(100));
    assert_eq!(items[1].as_ref().map(|m| m.timestamp_ns).ok(), Some(200));
    let e = items[2].as_ref().err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.contains("Schema record: data declares 4294967040 bytes"), "{e}");
}

/// Found by a 30-minute `mcap_file` run after the length check came in: a summary ChunkIndex
/// whose message_index_offsets map declares 6 bytes of 10-byte entries. The crate reads whole
/// entries while it has read fewer bytes than declared (10 here), so it took `compression`'s
/// length from other bytes than the check walked and reserved 2,449,473,536 bytes for it. A
/// block that is not a whole number of entries is now refused (the record-level case is
/// `mcap_check`'s `chunk_index_offsets_and_compression`): the summary is not used, and the
/// linear read stops at the file's damaged Header record.
#[test]
fn mcap_chunk_index_offsets_map_of_broken_entries_is_an_error_not_an_allocation() {
    let (largest, error) = read_mcap_regression("chunk_index_offsets_not_whole_entries.mcap");
    assert!(largest < SMALL, "an allocation of {largest} bytes");
    assert!(error.contains("record with opcode 01 length exceeds limit"), "{error}");
}
