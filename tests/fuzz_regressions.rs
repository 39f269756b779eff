//! Inputs found by the fuzzers (scripts/fuzz.sh, fuzz/) that once crashed a decoder, kept in
//! tests/data/fuzz/<target>/ and run here through the same public function the fuzz target calls.
//! Each must now give the error named below (and never panic). The fuzzers also reuse these files
//! as seeds.

use sptr::pipeline::files::parse_pcd;
use std::path::Path;

fn data(target: &str, name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/fuzz").join(target).join(name);
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
    use sptr::bag::cdr::{decode_message, Message};
    use sptr::bev::calib::intrinsics_from_k;
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
