//! CDR reader (src/bag/cdr.rs) against the third-party `rosbags` serializer.
//!
//! The fixtures in tests/data/cdr/ were written by `rosbags` (tests/fixtures/make_cdr_fixtures.py),
//! little and big endian, with the values they hold in expected.json. Here: every fixture
//! decodes to those values, re-encodes to the very same bytes, the PointCloud2 decodes on
//! through the node's codec, every truncation and a catalogue of corruptions give typed errors,
//! and arbitrary bytes never panic.

mod common;

use std::path::PathBuf;

use proptest::prelude::*;
use serde_yaml::Value;
use sptr::msgs::cdr::{decode_message, is_supported_type, CameraInfo, CdrError, CdrMessage, CdrReader, CompressedImage, Header, Image, Message, PointCloud2, RegionOfInterest, Time};
use sptr::msgs::cloud::{CloudBuf, PointField};

const NAMES: [&str; 4] = ["pointcloud2", "image", "compressed_image", "camera_info"];

fn dir() -> PathBuf {
    common::root().join("tests/data/cdr")
}

fn fixture(name: &str, endian: &str) -> Vec<u8> {
    let p = dir().join(format!("{name}.{endian}.cdr"));
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// expected.json (JSON is YAML, so serde_yaml reads it).
fn expected() -> Value {
    let p = dir().join("expected.json");
    let s = std::fs::read_to_string(&p).unwrap();
    serde_yaml::from_str(&s).unwrap()
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v:?}"))
}
fn i(v: &Value) -> i64 {
    v.as_i64()
        .unwrap_or_else(|| panic!("not an integer: {v:?}"))
}
fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v:?}"))
}
fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}
fn b(v: &Value) -> bool {
    v.as_bool().unwrap_or_else(|| panic!("not a bool: {v:?}"))
}
fn seq(v: &Value) -> &Vec<Value> {
    v.as_sequence()
        .unwrap_or_else(|| panic!("not a list: {v:?}"))
}
fn bytes(v: &Value) -> Vec<u8> {
    seq(v).iter().map(|x| u(x) as u8).collect()
}
fn floats(v: &Value) -> Vec<f64> {
    seq(v).iter().map(f).collect()
}

fn check_header(h: &Header, e: &Value) {
    assert_eq!(h.stamp.sec as i64, i(&e["sec"]));
    assert_eq!(h.stamp.nanosec as u64, u(&e["nanosec"]));
    assert_eq!(h.frame_id, s(&e["frame_id"]));
}

fn check_pointcloud2(m: &PointCloud2, e: &Value) {
    check_header(&m.header, &e["header"]);
    let c = &m.cloud;
    assert_eq!(c.height as u64, u(&e["height"]));
    assert_eq!(c.width as u64, u(&e["width"]));
    let fields: Vec<PointField> = seq(&e["fields"])
        .iter()
        .map(|x| PointField {
            name: s(&x["name"]).to_string(),
            offset: u(&x["offset"]) as u32,
            datatype: u(&x["datatype"]) as u8,
            count: u(&x["count"]) as u32,
        })
        .collect();
    assert_eq!(c.fields, fields);
    assert_eq!(c.is_bigendian, b(&e["is_bigendian"]));
    assert_eq!(c.point_step as u64, u(&e["point_step"]));
    assert_eq!(c.row_step as u64, u(&e["row_step"]));
    assert_eq!(c.data, bytes(&e["data"]));
    assert_eq!(c.is_dense, b(&e["is_dense"]));
}

fn check_image(m: &Image, e: &Value) {
    check_header(&m.header, &e["header"]);
    assert_eq!(m.height as u64, u(&e["height"]));
    assert_eq!(m.width as u64, u(&e["width"]));
    assert_eq!(m.encoding, s(&e["encoding"]));
    assert_eq!(m.is_bigendian as u64, u(&e["is_bigendian"]));
    assert_eq!(m.step as u64, u(&e["step"]));
    assert_eq!(m.data, bytes(&e["data"]));
}

fn check_compressed(m: &CompressedImage, e: &Value) {
    check_header(&m.header, &e["header"]);
    assert_eq!(m.format, s(&e["format"]));
    assert_eq!(m.data, bytes(&e["data"]));
}

fn check_camera_info(m: &CameraInfo, e: &Value) {
    check_header(&m.header, &e["header"]);
    assert_eq!(m.height as u64, u(&e["height"]));
    assert_eq!(m.width as u64, u(&e["width"]));
    assert_eq!(m.distortion_model, s(&e["distortion_model"]));
    assert_eq!(m.d, floats(&e["d"]));
    assert_eq!(m.k.to_vec(), floats(&e["k"]));
    assert_eq!(m.r.to_vec(), floats(&e["r"]));
    assert_eq!(m.p.to_vec(), floats(&e["p"]));
    assert_eq!(m.binning_x as u64, u(&e["binning_x"]));
    assert_eq!(m.binning_y as u64, u(&e["binning_y"]));
    let r = &e["roi"];
    assert_eq!(
        m.roi,
        RegionOfInterest {
            x_offset: u(&r["x_offset"]) as u32,
            y_offset: u(&r["y_offset"]) as u32,
            height: u(&r["height"]) as u32,
            width: u(&r["width"]) as u32,
            do_rectify: b(&r["do_rectify"]),
        }
    );
}

/// Decodes fixture `name` with its own type, checks it against expected.json, and checks that
/// re-encoding gives rosbags' bytes exactly.
fn check_fixture(name: &str, endian: &str) {
    let raw = fixture(name, endian);
    let le = endian == "le";
    assert_eq!(CdrReader::new(&raw).unwrap().is_big_endian(), !le);
    let exp = expected();
    let e = &exp[name];
    let ty = s(&e["type"]);
    match name {
        "pointcloud2" => {
            let m = PointCloud2::from_cdr(&raw).unwrap();
            check_pointcloud2(&m, e);
            assert_eq!(
                m.to_cdr(le).unwrap(),
                raw,
                "{name}.{endian}: re-encoded bytes differ"
            );
        }
        "image" => {
            let m = Image::from_cdr(&raw).unwrap();
            check_image(&m, e);
            assert_eq!(
                m.to_cdr(le).unwrap(),
                raw,
                "{name}.{endian}: re-encoded bytes differ"
            );
        }
        "compressed_image" => {
            let m = CompressedImage::from_cdr(&raw).unwrap();
            check_compressed(&m, e);
            assert_eq!(
                m.to_cdr(le).unwrap(),
                raw,
                "{name}.{endian}: re-encoded bytes differ"
            );
        }
        "camera_info" => {
            let m = CameraInfo::from_cdr(&raw).unwrap();
            check_camera_info(&m, e);
            assert_eq!(
                m.to_cdr(le).unwrap(),
                raw,
                "{name}.{endian}: re-encoded bytes differ"
            );
        }
        _ => unreachable!(),
    }
    // The type-name dispatch gives the same message.
    assert!(is_supported_type(ty));
    let any = decode_message(ty, &raw).unwrap();
    let same = match (name, &any) {
        ("pointcloud2", Message::PointCloud2(m)) => *m == PointCloud2::from_cdr(&raw).unwrap(),
        ("image", Message::Image(m)) => *m == Image::from_cdr(&raw).unwrap(),
        ("compressed_image", Message::CompressedImage(m)) => {
            *m == CompressedImage::from_cdr(&raw).unwrap()
        }
        ("camera_info", Message::CameraInfo(m)) => *m == CameraInfo::from_cdr(&raw).unwrap(),
        _ => false,
    };
    assert!(same, "decode_message({ty}) gave {any:?}");
}

#[test]
fn fixtures_little_endian_match_rosbags() {
    for name in NAMES {
        check_fixture(name, "le");
    }
}

#[test]
fn fixtures_big_endian_match_rosbags() {
    for name in NAMES {
        check_fixture(name, "be");
    }
}

#[test]
fn big_and_little_endian_decode_alike() {
    for name in NAMES {
        let ty = s(&expected()[name]["type"]).to_string();
        let le = decode_message(&ty, &fixture(name, "le")).unwrap();
        let be = decode_message(&ty, &fixture(name, "be")).unwrap();
        assert_eq!(le, be, "{name}");
    }
}

#[test]
fn pointcloud2_decodes_through_the_cloud_codec() {
    let exp = expected();
    let want = seq(&exp["pointcloud2"]["points_xyz"]);
    for endian in ["le", "be"] {
        let m = PointCloud2::from_cdr(&fixture("pointcloud2", endian)).unwrap();
        let (pts, report) = sptr::msgs::cloud::decode(&m.view()).unwrap();
        assert_eq!(report.total, want.len());
        assert_eq!(report.kept, want.len());
        assert_eq!(pts.len(), want.len());
        for (k, p) in want.iter().enumerate() {
            let p = floats(p);
            assert_eq!(
                [pts.x[k] as f64, pts.y[k] as f64, pts.z[k] as f64],
                [p[0], p[1], p[2]],
                "point {k} ({endian})"
            );
        }
        assert!(!pts.has_intensity);
    }
}

#[test]
fn type_names_both_spellings() {
    let raw = fixture("image", "le");
    assert!(matches!(
        decode_message("sensor_msgs/Image", &raw),
        Ok(Message::Image(_))
    ));
    assert!(matches!(
        decode_message("sensor_msgs/msg/Imu", &raw),
        Err(CdrError::UnsupportedType { .. })
    ));
}

/// Decodes `raw` as the type of fixture `name`; Ok(()) or the error.
fn decode_as(name: &str, raw: &[u8]) -> Result<(), CdrError> {
    match name {
        "pointcloud2" => PointCloud2::from_cdr(raw).map(drop),
        "image" => Image::from_cdr(raw).map(drop),
        "compressed_image" => CompressedImage::from_cdr(raw).map(drop),
        "camera_info" => CameraInfo::from_cdr(raw).map(drop),
        _ => unreachable!(),
    }
}

#[test]
fn every_truncation_is_an_error() {
    for name in NAMES {
        for endian in ["le", "be"] {
            let raw = fixture(name, endian);
            for cut in 0..raw.len() {
                let err = decode_as(name, &raw[..cut])
                    .expect_err(&format!("{name}.{endian} cut at {cut} decoded"));
                match (cut, &err) {
                    (0..=3, CdrError::NoHeader { .. }) => {}
                    (4.., CdrError::Truncated { .. } | CdrError::SequenceTooLong { .. }) => {}
                    _ => panic!("{name}.{endian} cut at {cut}: unexpected {err:?}"),
                }
                // Errors say what they were reading.
                assert!(!err.to_string().is_empty());
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Hand-built malformed messages (little endian unless stated)

fn le(payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0x00, 0x01, 0x00, 0x00];
    v.extend_from_slice(payload);
    v
}

fn compressed(frame_id_len: u32, frame_id: &[u8]) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&5i32.to_le_bytes());
    p.extend_from_slice(&6u32.to_le_bytes());
    p.extend_from_slice(&frame_id_len.to_le_bytes());
    p.extend_from_slice(frame_id);
    le(&p)
}

#[test]
fn unknown_encapsulation() {
    for id in [
        [0x00, 0x02],
        [0x00, 0x03],
        [0x00, 0x07],
        [0x01, 0x01],
        [0xff, 0xff],
    ] {
        let mut raw = fixture("image", "le");
        raw[0] = id[0];
        raw[1] = id[1];
        assert_eq!(
            Image::from_cdr(&raw),
            Err(CdrError::Encapsulation { id }),
            "{id:02x?}"
        );
    }
    assert_eq!(Image::from_cdr(&[0, 1]), Err(CdrError::NoHeader { len: 2 }));
}

#[test]
fn string_errors() {
    // Length past the end.
    let raw = compressed(1000, b"abc\0");
    assert!(matches!(
        CompressedImage::from_cdr(&raw),
        Err(CdrError::Truncated {
            what: "CompressedImage.header.frame_id",
            need: 1000,
            ..
        })
    ));
    // Huge length.
    let raw = compressed(u32::MAX, b"abc\0");
    assert!(matches!(
        CompressedImage::from_cdr(&raw),
        Err(CdrError::Truncated { .. })
    ));
    // No NUL.
    let mut raw = compressed(4, b"abcd");
    raw.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert!(matches!(
        CompressedImage::from_cdr(&raw),
        Err(CdrError::StringNoNul {
            what: "CompressedImage.header.frame_id",
            offset: 12,
            len: 4
        })
    ));
    // Invalid UTF-8.
    let mut raw = compressed(4, b"a\xff\xfe\0");
    raw.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    assert!(matches!(
        CompressedImage::from_cdr(&raw),
        Err(CdrError::StringUtf8 { .. })
    ));
    // Valid UTF-8 beyond ASCII decodes; a zero length is the empty string.
    // frame_id "é" (length 3 with the NUL) ends at payload offset 15, so format's length
    // starts at 16 after one padding byte; data's count is at 24 after two.
    let mut raw = compressed(3, "é\0".as_bytes());
    raw.push(0xAA); // padding bytes are not read
    raw.extend_from_slice(&[2, 0, 0, 0, b'x', 0, 0xAA, 0xAA, 1, 0, 0, 0, 42]);
    let m = CompressedImage::from_cdr(&raw).unwrap();
    assert_eq!(m.header.frame_id, "é");
    assert_eq!(m.format, "x");
    assert_eq!(m.data, [42]);
    let mut raw2 = compressed(0, &[]);
    raw2.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
    let m = CompressedImage::from_cdr(&raw2).unwrap();
    assert_eq!((m.header.frame_id.as_str(), m.format.as_str()), ("", ""));
    assert!(m.data.is_empty());
}

#[test]
fn absurd_sequence_counts_allocate_nothing() {
    // Image.data count at the end of the fixture: replace it by huge values.
    let raw = fixture("image", "le");
    let data_len = 18usize;
    let count_at = raw.len() - data_len - 4;
    assert_eq!(
        &raw[count_at..count_at + 4],
        &(data_len as u32).to_le_bytes()
    );
    for count in [19u32, 1 << 20, u32::MAX] {
        let mut bad = raw.clone();
        bad[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        assert!(matches!(
            Image::from_cdr(&bad),
            Err(CdrError::SequenceTooLong {
                what: "Image.data",
                have: 18,
                ..
            })
        ));
    }
    // PointCloud2.fields count: each field needs bytes, so a count the rest cannot hold fails
    // before anything is allocated.
    let pc = PointCloud2::from_cdr(&fixture("pointcloud2", "le")).unwrap();
    let mut w = sptr::msgs::cdr::CdrWriter::new(true);
    w.write_i32(pc.header.stamp.sec);
    w.write_u32(pc.header.stamp.nanosec);
    w.write_string(&pc.header.frame_id);
    w.write_u32(1);
    w.write_u32(5);
    w.write_u32(u32::MAX);
    let bad = w.finish().unwrap();
    assert!(matches!(
        PointCloud2::from_cdr(&bad),
        Err(CdrError::SequenceTooLong {
            what: "PointCloud2.fields",
            ..
        })
    ));
    // CameraInfo.d count larger than the rest.
    let raw = fixture("camera_info", "be");
    let ci = CameraInfo::from_cdr(&raw).unwrap();
    let mut w = sptr::msgs::cdr::CdrWriter::new(false);
    w.write_i32(ci.header.stamp.sec);
    w.write_u32(ci.header.stamp.nanosec);
    w.write_string(&ci.header.frame_id);
    w.write_u32(ci.height);
    w.write_u32(ci.width);
    w.write_string(&ci.distortion_model);
    let pos = w.finish().unwrap().len() - 4;
    let count_at = 4 + pos.div_ceil(4) * 4;
    assert_eq!(
        &raw[count_at..count_at + 4],
        &(ci.d.len() as u32).to_be_bytes()
    );
    let mut bad = raw.clone();
    bad[count_at..count_at + 4].copy_from_slice(&0x4000_0000u32.to_be_bytes());
    assert_eq!(bad.len(), raw.len());
    assert!(matches!(
        CameraInfo::from_cdr(&bad),
        Err(CdrError::SequenceTooLong {
            what: "CameraInfo.d",
            ..
        })
    ));
}

#[test]
fn invalid_bool_and_trailing_bytes() {
    let raw = fixture("camera_info", "le");
    let mut bad = raw.clone();
    *bad.last_mut().unwrap() = 2; // roi.do_rectify
    assert!(matches!(
        CameraInfo::from_cdr(&bad),
        Err(CdrError::InvalidBool {
            what: "CameraInfo.roi.do_rectify",
            value: 2,
            ..
        })
    ));
    // Up to 3 bytes of end padding are accepted, 4 are not.
    for extra in 1..=3 {
        let mut padded = raw.clone();
        padded.extend(std::iter::repeat(0).take(extra));
        assert_eq!(
            CameraInfo::from_cdr(&padded).unwrap(),
            CameraInfo::from_cdr(&raw).unwrap()
        );
    }
    let mut long = raw.clone();
    long.extend_from_slice(&[0, 0, 0, 0]);
    assert!(matches!(
        CameraInfo::from_cdr(&long),
        Err(CdrError::TrailingBytes {
            type_name: "sensor_msgs/msg/CameraInfo",
            ..
        })
    ));
}

#[test]
fn wrong_type_is_an_error_not_a_panic() {
    // Decoding each fixture as every other type: errors or (rarely) a garbage message, never a
    // panic; a PointCloud2 read as an Image cannot have its 60-byte data where Image.data is.
    for name in NAMES {
        for other in NAMES {
            let _ = decode_as(other, &fixture(name, "le"));
            let _ = decode_as(other, &fixture(name, "be"));
        }
    }
    assert!(Image::from_cdr(&fixture("pointcloud2", "le")).is_err());
    assert!(CameraInfo::from_cdr(&fixture("image", "le")).is_err());
}

// ---------------------------------------------------------------------------------------------
// Properties

fn arb_header() -> impl Strategy<Value = Header> {
    (any::<i32>(), any::<u32>(), "\\PC{0,12}").prop_map(|(sec, nanosec, frame_id)| Header {
        stamp: Time { sec, nanosec },
        frame_id,
    })
}

fn arb_camera_info() -> impl Strategy<Value = CameraInfo> {
    (
        arb_header(),
        any::<(u32, u32, u32, u32)>(),
        "[a-z_]{0,20}",
        prop::collection::vec(any::<f64>(), 0..10),
        prop::array::uniform9(any::<f64>()),
        prop::array::uniform12(any::<f64>()),
        any::<(u32, u32, u32, u32, bool)>(),
    )
        .prop_map(|(header, (h, w, bx, by), dm, d, k, p, roi)| CameraInfo {
            header,
            height: h,
            width: w,
            distortion_model: dm,
            d,
            k,
            r: [k[8], k[7], k[6], k[5], k[4], k[3], k[2], k[1], k[0]],
            p,
            binning_x: bx,
            binning_y: by,
            roi: RegionOfInterest {
                x_offset: roi.0,
                y_offset: roi.1,
                height: roi.2,
                width: roi.3,
                do_rectify: roi.4,
            },
        })
}

fn arb_pointcloud2() -> impl Strategy<Value = PointCloud2> {
    (
        arb_header(),
        prop::collection::vec(
            ("[a-z]{0,8}", any::<u32>(), any::<u8>(), any::<u32>()),
            0..5,
        ),
        any::<(u32, u32, bool, u32, u32, bool)>(),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(
            |(header, fields, (h, w, big, ps, rs, dense), data)| PointCloud2 {
                header,
                cloud: CloudBuf {
                    height: h,
                    width: w,
                    fields: fields
                        .into_iter()
                        .map(|(name, offset, datatype, count)| PointField {
                            name,
                            offset,
                            datatype,
                            count,
                        })
                        .collect(),
                    is_bigendian: big,
                    point_step: ps,
                    row_step: rs,
                    data,
                    is_dense: dense,
                },
            },
        )
}

/// Compares f64 arrays bit for bit (NaN payloads included).
fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(raw in prop::collection::vec(any::<u8>(), 0..400)) {
        for name in NAMES {
            let _ = decode_as(name, &raw);
        }
    }

    #[test]
    fn random_payloads_never_panic(
        big in any::<bool>(),
        payload in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        let mut raw = vec![0x00, if big { 0x00 } else { 0x01 }, 0x00, 0x00];
        raw.extend_from_slice(&payload);
        for name in NAMES {
            let _ = decode_as(name, &raw);
        }
    }

    #[test]
    fn corrupted_fixtures_never_panic(
        which in 0usize..8,
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let name = NAMES[which / 2];
        let mut raw = fixture(name, if which % 2 == 0 { "le" } else { "be" });
        for (at, v) in edits {
            let k = at.index(raw.len());
            raw[k] = v;
        }
        let _ = decode_as(name, &raw);
        let k = cut.index(raw.len() + 1);
        let _ = decode_as(name, &raw[..k]);
    }

    #[test]
    fn camera_info_round_trips(m in arb_camera_info(), little in any::<bool>()) {
        let raw = m.to_cdr(little).unwrap();
        let back = CameraInfo::from_cdr(&raw).unwrap();
        prop_assert_eq!(&back.header, &m.header);
        prop_assert_eq!(&back.distortion_model, &m.distortion_model);
        prop_assert_eq!(bits(&back.d), bits(&m.d));
        prop_assert_eq!(bits(&back.k), bits(&m.k));
        prop_assert_eq!(bits(&back.r), bits(&m.r));
        prop_assert_eq!(bits(&back.p), bits(&m.p));
        prop_assert_eq!((back.height, back.width, back.binning_x, back.binning_y),
                        (m.height, m.width, m.binning_x, m.binning_y));
        prop_assert_eq!(back.roi, m.roi);
        // Every truncation fails.
        for cut in 0..raw.len() {
            prop_assert!(CameraInfo::from_cdr(&raw[..cut]).is_err());
        }
    }

    #[test]
    fn pointcloud2_image_round_trip(
        m in arb_pointcloud2(),
        little in any::<bool>(),
        enc in "[a-z0-9]{0,10}",
        ib in any::<u8>(),
    ) {
        let raw = m.to_cdr(little).unwrap();
        prop_assert_eq!(PointCloud2::from_cdr(&raw).unwrap(), m.clone());
        let img = Image {
            header: m.header.clone(),
            height: m.cloud.height,
            width: m.cloud.width,
            encoding: enc.clone(),
            is_bigendian: ib,
            step: m.cloud.row_step,
            data: m.cloud.data.clone(),
        };
        prop_assert_eq!(Image::from_cdr(&img.to_cdr(little).unwrap()).unwrap(), img);
        let ci = CompressedImage { header: m.header.clone(), format: enc, data: m.cloud.data.clone() };
        prop_assert_eq!(CompressedImage::from_cdr(&ci.to_cdr(little).unwrap()).unwrap(), ci);
    }
}

#[test]
fn writer_reports_a_count_over_32_bits_instead_of_panicking() {
    let mut w = sptr::msgs::cdr::CdrWriter::new(true);
    w.write_count(u32::MAX as usize + 1);
    match w.finish() {
        Err(sptr::msgs::cdr::CdrError::CountTooLarge { count }) => assert_eq!(count, u32::MAX as usize + 1),
        other => panic!("expected CountTooLarge, got {other:?}"),
    }
    let mut ok = sptr::msgs::cdr::CdrWriter::new(true);
    ok.write_count(u32::MAX as usize);
    assert_eq!(ok.finish().unwrap().len(), 8);
}
