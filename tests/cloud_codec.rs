//! PointCloud2 codec: decoding of hand-built driver layouts, every malformed case, encoders,
//! and property tests (round trips, no panics on arbitrary input).
//!
//! The clouds here are built byte by byte with this file's own writer, not with the crate's
//! encoders, so the decoder is checked against an independent picture of the format.

use proptest::prelude::*;
use sptr::msgs::cloud::datatype::*;
use sptr::msgs::cloud::{decode, decode_into, encode_labeled, encode_points, encode_points_with, CloudError, CloudView, DecodeReport, Layout, PointField};
use sptr::Points;

// ---------------------------------------------------------------------------------------------
// An independent PointCloud2 writer

fn field(name: &str, offset: u32, datatype: u8) -> PointField {
    PointField {
        name: name.to_string(),
        offset,
        datatype,
        count: 1,
    }
}

/// Writes `v` as `dt` at `buf[off..]` in the given byte order (integers: `v` must be in range).
fn put(buf: &mut [u8], off: usize, dt: u8, v: f64, big: bool) {
    let b: Vec<u8> = match (dt, big) {
        (INT8, _) => vec![(v as i8) as u8],
        (UINT8, _) => vec![v as u8],
        (INT16, false) => (v as i16).to_le_bytes().to_vec(),
        (INT16, true) => (v as i16).to_be_bytes().to_vec(),
        (UINT16, false) => (v as u16).to_le_bytes().to_vec(),
        (UINT16, true) => (v as u16).to_be_bytes().to_vec(),
        (INT32, false) => (v as i32).to_le_bytes().to_vec(),
        (INT32, true) => (v as i32).to_be_bytes().to_vec(),
        (UINT32, false) => (v as u32).to_le_bytes().to_vec(),
        (UINT32, true) => (v as u32).to_be_bytes().to_vec(),
        (FLOAT32, false) => (v as f32).to_le_bytes().to_vec(),
        (FLOAT32, true) => (v as f32).to_be_bytes().to_vec(),
        (FLOAT64, false) => v.to_le_bytes().to_vec(),
        (FLOAT64, true) => v.to_be_bytes().to_vec(),
        _ => panic!("test writer: bad datatype {dt}"),
    };
    buf[off..off + b.len()].copy_from_slice(&b);
}

/// A cloud under construction: `width × height` points of `point_step` bytes, rows of
/// `row_step` bytes; padding bytes are filled with `fill` so that reading them would show.
struct Cloud {
    fields: Vec<PointField>,
    width: u32,
    height: u32,
    point_step: u32,
    row_step: u32,
    big: bool,
    data: Vec<u8>,
}

impl Cloud {
    fn new(
        fields: Vec<PointField>,
        point_step: u32,
        width: u32,
        height: u32,
        row_step: u32,
    ) -> Cloud {
        Cloud {
            fields,
            width,
            height,
            point_step,
            row_step,
            big: false,
            data: vec![0xFF; (row_step * height) as usize],
        }
    }

    /// Packed single-row cloud.
    fn row(fields: Vec<PointField>, point_step: u32, width: u32) -> Cloud {
        Cloud::new(fields, point_step, width, 1, point_step * width)
    }

    fn big_endian(mut self) -> Cloud {
        self.big = true;
        self
    }

    /// Writes the named field of point `(row, col)`.
    fn set_rc(&mut self, row: usize, col: usize, name: &str, v: f64) {
        let f = self
            .fields
            .iter()
            .find(|f| f.name == name)
            .expect("test: field exists")
            .clone();
        let base = row * self.row_step as usize + col * self.point_step as usize;
        put(
            &mut self.data,
            base + f.offset as usize,
            f.datatype,
            v,
            self.big,
        );
    }

    fn set(&mut self, i: usize, name: &str, v: f64) {
        self.set_rc(0, i, name, v);
    }

    fn view(&self) -> CloudView<'_> {
        CloudView {
            height: self.height,
            width: self.width,
            fields: &self.fields,
            is_bigendian: self.big,
            point_step: self.point_step,
            row_step: self.row_step,
            data: &self.data,
            is_dense: false,
        }
    }
}

fn ok(c: &Cloud) -> (Points, DecodeReport) {
    match decode(&c.view()) {
        Ok(r) => r,
        Err(e) => panic!("decode failed: {e}"),
    }
}

fn err(c: &Cloud) -> CloudError {
    match decode(&c.view()) {
        Ok((p, _)) => panic!("expected an error, decoded {} points", p.len()),
        Err(e) => e,
    }
}

fn report(total: usize, kept: usize) -> DecodeReport {
    DecodeReport {
        total,
        kept,
        dropped_non_finite: total - kept,
    }
}

fn xyz_f32_fields() -> Vec<PointField> {
    vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT32),
    ]
}

// ---------------------------------------------------------------------------------------------
// Layouts decoded value by value

#[test]
fn layout_1_plain_xyz_f32() {
    let pts = [
        [1.5, -2.25, 3.0],
        [0.0, -0.0, 1e-30],
        [-1234.5, 987.125, f32::MAX as f64],
    ];
    let mut c = Cloud::row(xyz_f32_fields(), 12, 3);
    for (i, p) in pts.iter().enumerate() {
        c.set(i, "x", p[0]);
        c.set(i, "y", p[1]);
        c.set(i, "z", p[2]);
    }
    let (p, r) = ok(&c);
    assert_eq!(r, report(3, 3));
    assert_eq!(p.x, vec![1.5, 0.0, -1234.5]);
    assert_eq!(p.y, vec![-2.25, -0.0, 987.125]);
    assert_eq!(p.z, vec![3.0, 1e-30, f32::MAX]);
    assert_eq!(p.intensity, vec![0.0; 3]);
    assert!(!p.has_intensity);
    assert_eq!(p.ring, None);
    assert_eq!(p.time, None);
}

#[test]
fn layout_2_xyzi_velodyne_padded_point_step_32() {
    // x y z at 0 4 8, 4 bytes padding, intensity at 16, 12 bytes padding (filled 0xFF = NaN).
    let fields = vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT32),
        field("intensity", 16, FLOAT32),
    ];
    let mut c = Cloud::row(fields, 32, 4);
    for i in 0..4 {
        c.set(i, "x", i as f64 * 10.0 + 0.5);
        c.set(i, "y", -(i as f64) * 2.0);
        c.set(i, "z", 0.25 * i as f64 - 1.0);
        c.set(i, "intensity", 17.0 * i as f64);
    }
    let (p, r) = ok(&c);
    assert_eq!(r, report(4, 4));
    assert_eq!(p.x, vec![0.5, 10.5, 20.5, 30.5]);
    assert_eq!(p.y, vec![0.0, -2.0, -4.0, -6.0]);
    assert_eq!(p.z, vec![-1.0, -0.75, -0.5, -0.25]);
    assert_eq!(p.intensity, vec![0.0, 17.0, 34.0, 51.0]);
    assert!(p.has_intensity);
    assert_eq!(p.ring, None);
    assert_eq!(p.time, None);
}

#[test]
fn layout_3_autoware_xyzirc() {
    let fields = vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT32),
        field("intensity", 12, UINT8),
        field("return_type", 13, UINT8),
        field("channel", 14, UINT16),
    ];
    let mut c = Cloud::row(fields, 16, 3);
    let vals = [
        (1.0, 2.0, 3.0, 0.0, 1.0, 0.0),
        (4.0, 5.0, 6.0, 128.0, 2.0, 63.0),
        (-7.0, -8.0, -9.0, 255.0, 0.0, 65535.0),
    ];
    for (i, v) in vals.iter().enumerate() {
        c.set(i, "x", v.0);
        c.set(i, "y", v.1);
        c.set(i, "z", v.2);
        c.set(i, "intensity", v.3);
        c.set(i, "return_type", v.4);
        c.set(i, "channel", v.5);
    }
    let (p, r) = ok(&c);
    assert_eq!(r, report(3, 3));
    assert_eq!(p.x, vec![1.0, 4.0, -7.0]);
    assert_eq!(p.y, vec![2.0, 5.0, -8.0]);
    assert_eq!(p.z, vec![3.0, 6.0, -9.0]);
    assert_eq!(p.intensity, vec![0.0, 128.0, 255.0]);
    assert!(p.has_intensity);
    assert_eq!(p.ring, Some(vec![0, 63, 65535]));
    assert_eq!(p.time, None);
}

#[test]
fn layout_4_big_endian() {
    // Mixed types, all big endian: xyz f32, intensity u16, ring u16, time f64 seconds.
    let fields = vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT32),
        field("intensity", 12, UINT16),
        field("ring", 14, UINT16),
        field("time", 16, FLOAT64),
    ];
    let mut c = Cloud::row(fields, 24, 2).big_endian();
    c.set(0, "x", 1.0);
    c.set(0, "y", -2.5);
    c.set(0, "z", 1e6);
    c.set(0, "intensity", 258.0); // 0x0102: byte order matters
    c.set(0, "ring", 1.0);
    c.set(0, "time", 0.0625);
    c.set(1, "x", 3.75);
    c.set(1, "y", 0.125);
    c.set(1, "z", -9.0);
    c.set(1, "intensity", 65535.0);
    c.set(1, "ring", 513.0);
    c.set(1, "time", -0.5);
    let (p, r) = ok(&c);
    assert_eq!(r, report(2, 2));
    assert_eq!(p.x, vec![1.0, 3.75]);
    assert_eq!(p.y, vec![-2.5, 0.125]);
    assert_eq!(p.z, vec![1e6, -9.0]);
    assert_eq!(p.intensity, vec![258.0, 65535.0]);
    assert_eq!(p.ring, Some(vec![1, 513]));
    assert_eq!(p.time, Some(vec![0.0625, -0.5]));

    // The same bytes read as little endian give other values: the flag is honoured.
    let mut le = c.view();
    le.is_bigendian = false;
    let (q, _) = decode(&le).expect("decodes");
    assert_eq!(q.intensity[0], 513.0);
    assert_eq!(q.ring, Some(vec![256, 258]));
}

#[test]
fn layout_5_f64_xyz_shuffled_fields() {
    // Table order differs from byte order: z at 0, intensity at 8, x at 16, y at 24.
    let fields = vec![
        field("intensity", 8, FLOAT32),
        field("y", 24, FLOAT64),
        field("z", 0, FLOAT64),
        field("x", 16, FLOAT64),
    ];
    let mut c = Cloud::row(fields, 32, 3);
    let xs = [1.0, -2.5, 0.1];
    let ys = [1e-3, 123456.789, -0.0];
    let zs = [1e40, -3.0, 7.0]; // 1e40 overflows f32: the point is dropped as non-finite
    for i in 0..3 {
        c.set(i, "x", xs[i]);
        c.set(i, "y", ys[i]);
        c.set(i, "z", zs[i]);
        c.set(i, "intensity", i as f64 + 0.5);
    }
    let (p, r) = ok(&c);
    assert_eq!(
        r,
        DecodeReport {
            total: 3,
            kept: 2,
            dropped_non_finite: 1
        }
    );
    assert_eq!(p.x, vec![-2.5, 0.1f64 as f32]);
    assert_eq!(p.y, vec![123456.789f64 as f32, -0.0]);
    assert_eq!(p.z, vec![-3.0, 7.0]);
    assert_eq!(p.intensity, vec![1.5, 2.5]);
}

#[test]
fn layout_6_organized_with_row_padding_and_nan() {
    // 3 rows × 4 columns, point_step 16 (x y z f32, intensity u16, ring u16), rows padded to 72
    // bytes with 0xFF (which reads as NaN if the decoder strays into the padding).
    let fields = vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT32),
        field("intensity", 12, UINT16),
        field("ring", 14, UINT16),
    ];
    let (w, h) = (4usize, 3usize);
    let mut c = Cloud::new(fields, 16, w as u32, h as u32, 72);
    let bad: &[(usize, usize, &str, f64)] = &[
        (0, 1, "x", f64::NAN),
        (1, 0, "y", f64::INFINITY),
        (1, 3, "z", f64::NEG_INFINITY),
        (2, 2, "x", f64::NAN),
    ];
    let mut want = (vec![], vec![], vec![], vec![], vec![]);
    for r in 0..h {
        for col in 0..w {
            let k = (r * w + col) as f64;
            c.set_rc(r, col, "x", k);
            c.set_rc(r, col, "y", -k);
            c.set_rc(r, col, "z", k * 0.5);
            c.set_rc(r, col, "intensity", 100.0 + k);
            c.set_rc(r, col, "ring", r as f64);
            if let Some(&(_, _, name, v)) = bad.iter().find(|b| b.0 == r && b.1 == col) {
                c.set_rc(r, col, name, v);
            } else {
                want.0.push(k as f32);
                want.1.push(-k as f32);
                want.2.push((k * 0.5) as f32);
                want.3.push((100.0 + k) as f32);
                want.4.push(r as u16);
            }
        }
    }
    let (p, rep) = ok(&c);
    assert_eq!(
        rep,
        DecodeReport {
            total: 12,
            kept: 8,
            dropped_non_finite: 4
        }
    );
    assert_eq!(p.x, want.0);
    assert_eq!(p.y, want.1);
    assert_eq!(p.z, want.2);
    assert_eq!(p.intensity, want.3);
    assert_eq!(p.ring, Some(want.4));
    assert_eq!(p.x, vec![0.0, 2.0, 3.0, 5.0, 6.0, 8.0, 9.0, 11.0]);
}

#[test]
fn layout_7_ouster_t_u32_nanoseconds_and_ring() {
    // ouster-ros legacy point: x y z f32, pad, intensity f32 @16, t u32 ns @20,
    // reflectivity u16 @24, ring u16 @26, ambient u16 @28, range u32 @32, point_step 48.
    let fields = vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT32),
        field("intensity", 16, FLOAT32),
        field("t", 20, UINT32),
        field("reflectivity", 24, UINT16),
        field("ring", 26, UINT16),
        field("ambient", 28, UINT16),
        field("range", 32, UINT32),
    ];
    let mut c = Cloud::row(fields, 48, 3);
    let ts = [0u32, 50_000_000, 4_000_000_000];
    for (i, t) in ts.iter().enumerate() {
        c.set(i, "x", i as f64);
        c.set(i, "y", 1.0);
        c.set(i, "z", 2.0);
        c.set(i, "intensity", 40.0 * i as f64);
        c.set(i, "t", *t as f64);
        c.set(i, "reflectivity", 7.0);
        c.set(i, "ring", 127.0 - i as f64);
        c.set(i, "ambient", 9.0);
        c.set(i, "range", 1234.0);
    }
    let (p, r) = ok(&c);
    assert_eq!(r, report(3, 3));
    assert_eq!(p.x, vec![0.0, 1.0, 2.0]);
    assert_eq!(p.intensity, vec![0.0, 40.0, 80.0]);
    assert_eq!(p.ring, Some(vec![127, 126, 125]));
    let t = p.time.expect("t decodes as time");
    assert_eq!(t, vec![0.0, 0.05, 4.0]);
}

#[test]
fn layout_8_int16_int8_coordinates() {
    let fields = vec![
        field("x", 0, INT16),
        field("y", 2, INT16),
        field("z", 4, INT8),
        field("intensity", 5, INT8),
    ];
    let mut c = Cloud::row(fields, 6, 3);
    let v = [
        (-32768.0, 32767.0, -128.0, -1.0),
        (0.0, -1.0, 127.0, 100.0),
        (1234.0, -4321.0, 5.0, -128.0),
    ];
    for (i, p) in v.iter().enumerate() {
        c.set(i, "x", p.0);
        c.set(i, "y", p.1);
        c.set(i, "z", p.2);
        c.set(i, "intensity", p.3);
    }
    let (p, r) = ok(&c);
    assert_eq!(r, report(3, 3));
    assert_eq!(p.x, vec![-32768.0, 0.0, 1234.0]);
    assert_eq!(p.y, vec![32767.0, -1.0, -4321.0]);
    assert_eq!(p.z, vec![-128.0, 127.0, 5.0]);
    assert_eq!(p.intensity, vec![-1.0, 100.0, -128.0]);
}

// ---------------------------------------------------------------------------------------------
// Conversions, names, counts

#[test]
fn every_datatype_converts_for_every_attribute() {
    let cases: &[(u8, f64)] = &[
        (INT8, -100.0),
        (UINT8, 200.0),
        (INT16, -30000.0),
        (UINT16, 60000.0),
        (INT32, -2_000_000_000.0),
        (UINT32, 4_000_000_000.0),
        (FLOAT32, -1.25),
        (FLOAT64, 1e-7),
    ];
    for &(dt, v) in cases {
        for big in [false, true] {
            // x, y, z and intensity all of type `dt`, at 8-byte slots.
            let fields = vec![
                field("x", 0, dt),
                field("y", 8, dt),
                field("z", 16, dt),
                field("intensity", 24, dt),
            ];
            let mut c = Cloud::row(fields, 32, 1);
            c.big = big;
            for name in ["x", "y", "z", "intensity"] {
                c.set(0, name, v);
            }
            let (p, _) = ok(&c);
            let want = v as f32;
            assert_eq!(
                (p.x[0], p.y[0], p.z[0], p.intensity[0]),
                (want, want, want, want),
                "dt {dt} big {big}"
            );
        }
    }
}

#[test]
fn ring_and_time_conversions() {
    // ring from float (truncated), negative int (saturates to 0), huge u32 (saturates);
    // time from f32 seconds, f64 seconds, u32/i32 ns.
    let ring_cases: &[(u8, f64, u16)] = &[
        (FLOAT32, 31.9, 31),
        (INT32, -5.0, 0),
        (UINT32, 70000.0, 65535),
        (UINT8, 12.0, 12),
        (INT16, 300.0, 300),
    ];
    for &(dt, v, want) in ring_cases {
        let mut fields = xyz_f32_fields();
        fields.push(field("ring", 12, dt));
        let mut c = Cloud::row(fields, 16, 1);
        c.set(0, "x", 0.0);
        c.set(0, "y", 0.0);
        c.set(0, "z", 0.0);
        c.set(0, "ring", v);
        assert_eq!(ok(&c).0.ring, Some(vec![want]), "ring dt {dt} value {v}");
    }
    let time_cases: &[(u8, f64, f32)] = &[
        (FLOAT32, 0.099, 0.099),
        (FLOAT64, 0.1, 0.1),
        (UINT32, 99_000_000.0, 0.099),
        (INT32, -1_000_000.0, -0.001),
        (UINT16, 50_000.0, 5e-5),
    ];
    for &(dt, v, want) in time_cases {
        let mut fields = xyz_f32_fields();
        fields.push(field("time", 16, dt));
        let mut c = Cloud::row(fields, 24, 1);
        c.set(0, "x", 0.0);
        c.set(0, "y", 0.0);
        c.set(0, "z", 0.0);
        c.set(0, "time", v);
        assert_eq!(ok(&c).0.time, Some(vec![want]), "time dt {dt} value {v}");
    }
}

/// One point of xyz f32 plus `extra` fields (at 12, 16, ...; all f32 unless given), each set to
/// its index + 1, decoded.
fn decode_with_extra(extra: &[(&str, u8)]) -> Points {
    let mut fields = xyz_f32_fields();
    for (k, &(name, dt)) in extra.iter().enumerate() {
        fields.push(field(name, 12 + 8 * k as u32, dt));
    }
    let step = 12 + 8 * extra.len() as u32;
    let mut c = Cloud::row(fields, step, 1);
    for name in ["x", "y", "z"] {
        c.set(0, name, 1.0);
    }
    for (k, &(name, _)) in extra.iter().enumerate() {
        c.set(0, name, k as f64 + 1.0);
    }
    ok(&c).0
}

#[test]
fn field_name_aliases_and_preference() {
    let p = decode_with_extra(&[("i", FLOAT32)]);
    assert!(p.has_intensity);
    assert_eq!(p.intensity, vec![1.0]);
    // `intensity` is preferred over `i` wherever it is in the table.
    let p = decode_with_extra(&[("i", FLOAT32), ("intensity", FLOAT32)]);
    assert_eq!(p.intensity, vec![2.0]);
    let p = decode_with_extra(&[("channel", UINT16)]);
    assert_eq!(p.ring, Some(vec![1]));
    let p = decode_with_extra(&[("channel", UINT16), ("ring", UINT16)]);
    assert_eq!(p.ring, Some(vec![2]));
    let p = decode_with_extra(&[("t", FLOAT32)]);
    assert_eq!(p.time, Some(vec![1.0]));
    let p = decode_with_extra(&[("timestamp", FLOAT64)]);
    assert_eq!(p.time, Some(vec![1.0]));
    let p = decode_with_extra(&[("timestamp", FLOAT64), ("t", FLOAT64), ("time", FLOAT64)]);
    assert_eq!(p.time, Some(vec![3.0]));
    // Names are exact: `Intensity`, `rings`, `x ` are not ours.
    let p = decode_with_extra(&[
        ("Intensity", FLOAT32),
        ("rings", UINT16),
        ("times", FLOAT32),
    ]);
    assert!(!p.has_intensity);
    assert_eq!(p.intensity, vec![0.0]);
    assert_eq!(p.ring, None);
    assert_eq!(p.time, None);
}

#[test]
fn count_above_one_reads_element_zero() {
    let fields = vec![
        PointField {
            name: "x".into(),
            offset: 0,
            datatype: FLOAT32,
            count: 3,
        }, // x y z packed as a vector
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT32),
        PointField {
            name: "intensity".into(),
            offset: 12,
            datatype: UINT16,
            count: 2,
        },
    ];
    let mut c = Cloud::row(fields, 16, 1);
    c.set(0, "x", 1.0);
    c.set(0, "y", 2.0);
    c.set(0, "z", 3.0);
    c.set(0, "intensity", 4.0);
    put(&mut c.data, 14, UINT16, 999.0, false);
    let (p, _) = ok(&c);
    assert_eq!(
        (p.x[0], p.y[0], p.z[0], p.intensity[0]),
        (1.0, 2.0, 3.0, 4.0)
    );
}

#[test]
fn unused_fields_are_not_validated() {
    // Fields we do not read may be anything: unknown type, count 0, out of the point.
    let mut fields = xyz_f32_fields();
    fields.push(field("rgb", 12, 42));
    fields.push(PointField {
        name: "label".into(),
        offset: 0,
        datatype: UINT8,
        count: 0,
    });
    fields.push(field("normal_x", 1000, FLOAT64));
    let mut c = Cloud::row(fields, 12, 1);
    for name in ["x", "y", "z"] {
        c.set(0, name, 5.0);
    }
    assert_eq!(ok(&c).0.x, vec![5.0]);
}

/// The network reads intensity too: a NaN/Inf intensity drops the point like a NaN/Inf
/// coordinate (and is counted with them); a finite one keeps it.
#[test]
fn non_finite_intensity_drops_the_point() {
    let mut fields = xyz_f32_fields();
    fields.push(field("intensity", 12, FLOAT32));
    let mut c = Cloud::row(fields, 16, 4);
    for i in 0..4 {
        c.set(i, "x", i as f64);
        c.set(i, "y", 1.0);
        c.set(i, "z", 1.0);
    }
    c.set(0, "intensity", f64::NAN);
    c.set(1, "intensity", f64::INFINITY);
    c.set(2, "intensity", 7.0);
    c.set(3, "intensity", f64::NEG_INFINITY);
    let (p, r) = ok(&c);
    assert_eq!(r, report(4, 1));
    assert_eq!((p.x, p.intensity), (vec![2.0], vec![7.0]));
    // f64 intensity beyond the f32 range is infinite as f32: dropped too
    let mut fields = xyz_f32_fields();
    fields.push(field("intensity", 12, FLOAT64));
    let mut c = Cloud::row(fields, 20, 2);
    for i in 0..2 {
        c.set(i, "x", 1.0);
        c.set(i, "y", 1.0);
        c.set(i, "z", 1.0);
    }
    c.set(0, "intensity", 1e300);
    c.set(1, "intensity", 3.0);
    let (p, r) = ok(&c);
    assert_eq!(r, report(2, 1));
    assert_eq!(p.intensity, vec![3.0]);
}

#[test]
fn all_points_non_finite() {
    let mut c = Cloud::row(xyz_f32_fields(), 12, 5); // 0xFF fill: every coordinate is NaN
    let (p, r) = ok(&c);
    assert_eq!(
        r,
        DecodeReport {
            total: 5,
            kept: 0,
            dropped_non_finite: 5
        }
    );
    assert!(p.is_empty());
    c.big = true;
    assert_eq!(
        ok(&c).1,
        DecodeReport {
            total: 5,
            kept: 0,
            dropped_non_finite: 5
        }
    );
}

#[test]
fn zero_point_clouds_are_valid() {
    // A default message: no fields, nothing at all.
    let c = Cloud::new(vec![], 0, 0, 0, 0);
    let (p, r) = ok(&c);
    assert_eq!(r, DecodeReport::default());
    assert_eq!(p, Points::default());
    // width 0 with a real field table: flags follow the table.
    let mut fields = xyz_f32_fields();
    fields.push(field("intensity", 12, FLOAT32));
    fields.push(field("ring", 16, UINT16));
    let c = Cloud::new(fields.clone(), 18, 0, 1, 0);
    let (p, r) = ok(&c);
    assert_eq!(r, report(0, 0));
    assert!(p.is_empty() && p.has_intensity);
    assert_eq!(p.ring, Some(vec![]));
    assert_eq!(p.time, None);
    // height 0 with width > 0 and no data.
    let c = Cloud::new(fields, 18, 100, 0, 1800);
    assert!(ok(&c).0.is_empty());
}

#[test]
fn trailing_bytes_are_ignored() {
    let mut c = Cloud::row(xyz_f32_fields(), 12, 1);
    for name in ["x", "y", "z"] {
        c.set(0, name, 2.0);
    }
    c.data.extend_from_slice(&[1, 2, 3, 4, 5]);
    assert_eq!(ok(&c).1, report(1, 1));
}

#[test]
fn decode_into_reuses_buffers_and_resets_optional_columns() {
    let mut with_ring = Cloud::row(
        vec![
            field("x", 0, FLOAT32),
            field("y", 4, FLOAT32),
            field("z", 8, FLOAT32),
            field("ring", 12, UINT16),
        ],
        14,
        2,
    );
    for i in 0..2 {
        for name in ["x", "y", "z", "ring"] {
            with_ring.set(i, name, i as f64 + 1.0);
        }
    }
    let mut plain = Cloud::row(xyz_f32_fields(), 12, 1);
    for name in ["x", "y", "z"] {
        plain.set(0, name, 9.0);
    }
    let mut out = Points::default();
    decode_into(&with_ring.view(), &mut out).expect("decodes");
    assert_eq!(out.ring, Some(vec![1, 2]));
    let cap = out.x.capacity();
    decode_into(&plain.view(), &mut out).expect("decodes");
    assert_eq!(out.x, vec![9.0]);
    assert_eq!(out.ring, None);
    assert_eq!(out.intensity, vec![0.0]);
    assert!(out.x.capacity() >= cap);
    decode_into(&with_ring.view(), &mut out).expect("decodes");
    assert_eq!(out, decode(&with_ring.view()).expect("decodes").0);
    // An error leaves no points behind.
    let mut broken = with_ring.view();
    broken.data = &broken.data[..10];
    assert!(decode_into(&broken, &mut out).is_err());
    assert!(out.is_empty() && out.y.is_empty() && out.intensity.is_empty());
}

// ---------------------------------------------------------------------------------------------
// Malformed messages: typed errors

#[test]
fn malformed_truncated() {
    let mut c = Cloud::row(xyz_f32_fields(), 12, 4);
    c.data.pop();
    assert_eq!(
        err(&c),
        CloudError::Truncated {
            height: 1,
            row_step: 48,
            expected: 48,
            actual: 47
        }
    );
    // Organized, padded rows: the last row's padding is part of height * row_step.
    let mut c = Cloud::new(xyz_f32_fields(), 12, 2, 3, 32);
    c.data.truncate(2 * 32 + 24);
    assert_eq!(
        err(&c),
        CloudError::Truncated {
            height: 3,
            row_step: 32,
            expected: 96,
            actual: 88
        }
    );
    let c = Cloud {
        data: vec![],
        ..Cloud::row(xyz_f32_fields(), 12, 1)
    };
    assert!(matches!(
        err(&c),
        CloudError::Truncated {
            expected: 12,
            actual: 0,
            ..
        }
    ));
}

#[test]
fn malformed_row_step_too_small() {
    let c = Cloud::new(xyz_f32_fields(), 12, 4, 2, 47);
    assert_eq!(
        err(&c),
        CloudError::RowStepTooSmall {
            row_step: 47,
            width: 4,
            point_step: 12,
            needed: 48
        }
    );
}

#[test]
fn malformed_field_out_of_bounds() {
    let fields = vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        field("z", 9, FLOAT32),
    ];
    let c = Cloud::row(fields, 12, 1);
    assert_eq!(
        err(&c),
        CloudError::FieldOutOfBounds {
            name: "z".into(),
            offset: 9,
            size: 4,
            count: 1,
            end: 13,
            point_step: 12
        }
    );
    // count pushes an optional field past the point.
    let mut fields = xyz_f32_fields();
    fields.push(PointField {
        name: "intensity".into(),
        offset: 12,
        datatype: FLOAT32,
        count: 2,
    });
    let c = Cloud::row(fields, 16, 1);
    assert!(
        matches!(err(&c), CloudError::FieldOutOfBounds { ref name, end: 20, .. } if name == "intensity")
    );
    // f64 that would fit as f32.
    let fields = vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT64),
    ];
    let c = Cloud::row(fields, 12, 1);
    assert!(matches!(
        err(&c),
        CloudError::FieldOutOfBounds { end: 16, .. }
    ));
    // Offsets near u32::MAX with a huge count do not wrap.
    let fields = vec![
        PointField {
            name: "x".into(),
            offset: u32::MAX,
            datatype: FLOAT64,
            count: u32::MAX,
        },
        field("y", 4, FLOAT32),
        field("z", 8, FLOAT32),
    ];
    let c = Cloud::row(fields, 12, 1);
    assert!(matches!(err(&c), CloudError::FieldOutOfBounds { .. }));
}

#[test]
fn malformed_zero_point_step() {
    let c = Cloud {
        point_step: 0,
        ..Cloud::row(xyz_f32_fields(), 12, 3)
    };
    assert_eq!(
        err(&c),
        CloudError::ZeroPointStep {
            width: 3,
            height: 1
        }
    );
}

#[test]
fn malformed_missing_xyz_names_the_field() {
    for missing in ["x", "y", "z"] {
        let fields: Vec<PointField> = [("x", 0), ("y", 4), ("z", 8), ("intensity", 12)]
            .iter()
            .filter(|(n, _)| *n != missing)
            .map(|&(n, o)| field(n, o, FLOAT32))
            .collect();
        let c = Cloud::row(fields, 16, 2);
        match err(&c) {
            CloudError::MissingField { name, present } => {
                assert_eq!(name, missing);
                assert!(present.contains("intensity"), "{present}");
                let msg = CloudError::MissingField { name, present }.to_string();
                assert!(msg.contains(&format!("`{missing}`")), "{msg}");
            }
            e => panic!("expected MissingField, got {e:?}"),
        }
    }
}

#[test]
fn malformed_unknown_datatype() {
    for bad in [0u8, 9, 255] {
        let fields = vec![
            field("x", 0, FLOAT32),
            field("y", 4, bad),
            field("z", 8, FLOAT32),
        ];
        let c = Cloud::row(fields, 12, 1);
        assert_eq!(
            err(&c),
            CloudError::UnknownDatatype {
                name: "y".into(),
                datatype: bad
            }
        );
        // Also for an optional field we would read.
        let mut fields = xyz_f32_fields();
        fields.push(field("t", 12, bad));
        let c = Cloud::row(fields, 16, 1);
        assert_eq!(
            err(&c),
            CloudError::UnknownDatatype {
                name: "t".into(),
                datatype: bad
            }
        );
    }
}

#[test]
fn malformed_zero_count() {
    let fields = vec![
        field("x", 0, FLOAT32),
        field("y", 4, FLOAT32),
        PointField {
            name: "z".into(),
            offset: 8,
            datatype: FLOAT32,
            count: 0,
        },
    ];
    let c = Cloud::row(fields, 12, 1);
    assert_eq!(err(&c), CloudError::ZeroCount { name: "z".into() });
    let mut fields = xyz_f32_fields();
    fields.push(PointField {
        name: "ring".into(),
        offset: 12,
        datatype: UINT16,
        count: 0,
    });
    let c = Cloud::row(fields, 14, 1);
    assert_eq!(
        err(&c),
        CloudError::ZeroCount {
            name: "ring".into()
        }
    );
}

#[test]
fn malformed_size_overflow() {
    // width × height × point_step overflows 64 bits; no allocation is attempted.
    let fields = xyz_f32_fields();
    let v = CloudView {
        height: u32::MAX,
        width: u32::MAX,
        fields: &fields,
        is_bigendian: false,
        point_step: u32::MAX,
        row_step: u32::MAX,
        data: &[],
        is_dense: true,
    };
    assert!(matches!(decode(&v), Err(CloudError::SizeOverflow { .. })));
    // Huge but representable sizes are plain truncation, not an allocation.
    let v = CloudView {
        point_step: 12,
        row_step: u32::MAX,
        width: 1 << 20,
        ..v
    };
    assert!(matches!(decode(&v), Err(CloudError::Truncated { .. })));
}

#[test]
fn errors_read_well_and_convert_to_crate_error() {
    let e = CloudError::RowStepTooSmall {
        row_step: 1,
        width: 2,
        point_step: 3,
        needed: 6,
    };
    let msg = e.to_string();
    assert!(
        msg.contains("row_step 1") && msg.contains("width 2") && msg.contains("point_step 3"),
        "{msg}"
    );
    let e: sptr::Error = e.into();
    assert!(matches!(
        e,
        sptr::Error::Cloud(CloudError::RowStepTooSmall { .. })
    ));
    assert_eq!(e.to_string(), msg);
}

// ---------------------------------------------------------------------------------------------
// Encoders

fn sample_points() -> Points {
    Points {
        x: vec![1.0, -2.5, 3.25],
        y: vec![0.5, 100.0, -0.0],
        z: vec![-1.0, 2.0, 1e-20],
        intensity: vec![0.0, 12.5, 255.0],
        has_intensity: true,
        ring: Some(vec![0, 7, 127]),
        time: Some(vec![0.0, 0.05, 0.099]),
    }
}

fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[test]
fn encode_labeled_layout_and_round_trip() {
    let pts = sample_points();
    let class_id = [3u8, 0, 255];
    let prob = [0.9f32, 0.25, 1.0];
    let buf = encode_labeled(&pts, &class_id, &prob).expect("encodes");
    assert_eq!(
        buf.fields,
        vec![
            field("x", 0, FLOAT32),
            field("y", 4, FLOAT32),
            field("z", 8, FLOAT32),
            field("intensity", 12, FLOAT32),
            field("class_id", 16, UINT8),
            field("probability", 17, FLOAT32),
        ]
    );
    assert_eq!(
        (buf.height, buf.width, buf.point_step, buf.row_step),
        (1, 3, 21, 63)
    );
    assert!(!buf.is_bigendian);
    assert!(buf.is_dense);
    assert_eq!(buf.data.len(), 63);
    for i in 0..3 {
        let p = &buf.data[i * 21..(i + 1) * 21];
        assert_eq!(f32_at(p, 0), pts.x[i]);
        assert_eq!(f32_at(p, 4), pts.y[i]);
        assert_eq!(f32_at(p, 8), pts.z[i]);
        assert_eq!(f32_at(p, 12), pts.intensity[i]);
        assert_eq!(p[16], class_id[i]);
        assert_eq!(f32_at(p, 17), prob[i]);
    }
    let (back, r) = decode(&buf.view()).expect("decodes");
    assert_eq!(r, report(3, 3));
    assert_eq!(
        (back.x, back.y, back.z, back.intensity),
        (pts.x, pts.y, pts.z, pts.intensity)
    );
    assert!(back.has_intensity);
    assert_eq!(back.ring, None);
}

#[test]
fn encode_labeled_without_intensity_and_empty() {
    let pts = Points {
        x: vec![1.0],
        y: vec![2.0],
        z: vec![3.0],
        ..Points::default()
    };
    let buf = encode_labeled(&pts, &[1], &[0.5]).expect("encodes");
    assert_eq!(f32_at(&buf.data, 12), 0.0);
    let buf = encode_labeled(&Points::default(), &[], &[]).expect("encodes");
    assert_eq!((buf.width, buf.row_step, buf.data.len()), (0, 0, 0));
    assert!(decode(&buf.view()).expect("decodes").0.is_empty());
    // Non-finite input is written as is and flagged.
    let pts = Points {
        x: vec![f32::NAN],
        y: vec![0.0],
        z: vec![0.0],
        ..Points::default()
    };
    assert!(
        !encode_labeled(&pts, &[0], &[0.0])
            .expect("encodes")
            .is_dense
    );
}

#[test]
fn encode_labeled_length_mismatches() {
    let pts = sample_points();
    assert_eq!(
        encode_labeled(&pts, &[1, 2], &[0.0; 3]),
        Err(CloudError::LengthMismatch {
            what: "class_id",
            expected: 3,
            actual: 2
        })
    );
    assert_eq!(
        encode_labeled(&pts, &[1, 2, 3], &[0.0; 4]),
        Err(CloudError::LengthMismatch {
            what: "probability",
            expected: 3,
            actual: 4
        })
    );
    let mut bad = sample_points();
    bad.y.pop();
    assert_eq!(
        encode_labeled(&bad, &[1, 2, 3], &[0.0; 3]),
        Err(CloudError::LengthMismatch {
            what: "points.y",
            expected: 3,
            actual: 2
        })
    );
}

#[test]
fn encode_points_layout_tables() {
    for layout in Layout::ALL {
        let fields = layout.fields();
        let step = layout.point_step();
        // Fields lie inside the point and do not overlap.
        let mut used = vec![false; step as usize];
        for f in &fields {
            let size = size_of(f.datatype).expect("known datatype");
            for b in f.offset..f.offset + size * f.count {
                assert!(!used[b as usize], "{layout:?}: {} overlaps", f.name);
                used[b as usize] = true;
            }
        }
        let buf = encode_points(&sample_points(), layout).expect("encodes");
        assert_eq!(
            (buf.height, buf.width, buf.point_step, buf.row_step),
            (1, 3, step, 3 * step)
        );
        assert_eq!(buf.data.len(), 3 * step as usize);
        assert_eq!(buf.fields, fields);
    }
    assert_eq!(
        Layout::XyzIrc.fields(),
        vec![
            field("x", 0, FLOAT32),
            field("y", 4, FLOAT32),
            field("z", 8, FLOAT32),
            field("intensity", 12, UINT8),
            field("return_type", 13, UINT8),
            field("channel", 14, UINT16),
        ]
    );
    assert_eq!(Layout::XyzIrc.point_step(), 16);
    assert_eq!(Layout::XyzI32.point_step(), 16);
}

#[test]
fn encode_points_quantizes_u8_intensity_and_ns_time() {
    let pts = Points {
        x: vec![0.0; 4],
        y: vec![0.0; 4],
        z: vec![0.0; 4],
        intensity: vec![-5.0, 12.6, 300.0, f32::NAN],
        has_intensity: true,
        ring: None,
        time: Some(vec![0.0, 1.7e-9, 0.1, 10.0]),
    };
    let buf = encode_points(&pts, Layout::XyzIrc).expect("encodes");
    let (p, _) = decode(&buf.view()).expect("decodes");
    assert_eq!(p.intensity, vec![0.0, 13.0, 255.0, 0.0]);
    assert_eq!(p.ring, Some(vec![0; 4])); // channel written 0 when the points have no ring
    let buf = encode_points(&pts, Layout::Ouster).expect("encodes");
    let ns: Vec<u32> = (0..4)
        .map(|i| {
            let o = i * 48 + 20;
            u32::from_le_bytes([
                buf.data[o],
                buf.data[o + 1],
                buf.data[o + 2],
                buf.data[o + 3],
            ])
        })
        .collect();
    // 0.1f32 is 0.100000001490116... s; 10 s saturates u32 nanoseconds.
    assert_eq!(ns, vec![0, 2, 100_000_001, u32::MAX]);
}

#[test]
fn encode_points_length_mismatch() {
    let mut p = sample_points();
    p.ring = Some(vec![1]);
    assert_eq!(
        encode_points(&p, Layout::XyzIrt),
        Err(CloudError::LengthMismatch {
            what: "points.ring",
            expected: 3,
            actual: 1
        })
    );
    let mut p = sample_points();
    p.intensity.push(1.0);
    assert!(matches!(
        encode_points(&p, Layout::Xyz32),
        Err(CloudError::LengthMismatch {
            what: "points.intensity",
            ..
        })
    ));
}

#[test]
fn big_endian_encode_is_really_big_endian() {
    let p = Points {
        x: vec![1.0],
        y: vec![2.0],
        z: vec![3.0],
        ..Points::default()
    };
    let buf = encode_points_with(&p, Layout::Xyz32, true).expect("encodes");
    assert!(buf.is_bigendian);
    assert_eq!(&buf.data[0..4], &1.0f32.to_be_bytes());
    assert_eq!(decode(&buf.view()).expect("decodes").0.x, vec![1.0]);
}

// ---------------------------------------------------------------------------------------------
// Properties

fn finite_f32() -> impl Strategy<Value = f32> {
    prop::num::f32::NORMAL | prop::num::f32::SUBNORMAL | prop::num::f32::ZERO
}

prop_compose! {
    /// Random points (some with non-finite coordinates) and the mask of finite ones.
    fn arb_points()(n in 0usize..48)(
        xyz in prop::collection::vec((finite_f32(), finite_f32(), finite_f32()), n),
        bad in prop::collection::vec(prop::option::weighted(0.15, (0usize..3, prop::sample::select(vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY]))), n),
        has_intensity in any::<bool>(),
        intensity in prop::collection::vec(prop_oneof![finite_f32(), -10.0f32..300.0], n),
        ring in prop::option::of(prop::collection::vec(any::<u16>(), n)),
        time in prop::option::of(prop::collection::vec(0.0f32..4.0, n)),
    ) -> Points {
        let mut p = Points {
            x: xyz.iter().map(|v| v.0).collect(),
            y: xyz.iter().map(|v| v.1).collect(),
            z: xyz.iter().map(|v| v.2).collect(),
            intensity: if has_intensity { intensity } else { vec![0.0; xyz.len()] },
            has_intensity,
            ring,
            time,
        };
        for (i, b) in bad.iter().enumerate() {
            if let Some((axis, v)) = b {
                [&mut p.x, &mut p.y, &mut p.z][*axis][i] = *v;
            }
        }
        p
    }
}

/// What decoding `p` encoded in `layout` must give.
fn expected(p: &Points, layout: Layout) -> Points {
    let keep: Vec<usize> = (0..p.len())
        .filter(|&i| p.x[i].is_finite() && p.y[i].is_finite() && p.z[i].is_finite())
        .collect();
    let pick = |v: &[f32]| keep.iter().map(|&i| v[i]).collect::<Vec<f32>>();
    let n = keep.len();
    let (has_i, has_ring, has_time) = match layout {
        Layout::Xyz32 => (false, false, false),
        Layout::XyzI32 | Layout::Xyz64I32 => (true, false, false),
        Layout::XyzIrc => (true, true, false),
        Layout::XyzIrt | Layout::Ouster => (true, true, true),
    };
    let mut intensity = if has_i {
        pick(&p.intensity)
    } else {
        vec![0.0; n]
    };
    if layout == Layout::XyzIrc {
        for v in &mut intensity {
            *v = if v.is_nan() {
                0.0
            } else {
                v.round().clamp(0.0, 255.0) + 0.0
            }; // u8 has no -0
        }
    }
    Points {
        x: pick(&p.x),
        y: pick(&p.y),
        z: pick(&p.z),
        intensity,
        has_intensity: has_i,
        ring: has_ring.then(|| {
            keep.iter()
                .map(|&i| p.ring.as_ref().map_or(0, |r| r[i]))
                .collect()
        }),
        time: has_time.then(|| pick(p.time.as_deref().unwrap_or(&vec![0.0; p.len()]))),
    }
}

/// A random table of fields drawn from the names the decoder looks for and some it ignores.
fn arb_fields(max_offset: u32) -> impl Strategy<Value = Vec<PointField>> {
    let name = prop::sample::select(vec![
        "x",
        "y",
        "z",
        "intensity",
        "i",
        "ring",
        "channel",
        "time",
        "t",
        "timestamp",
        "rgb",
    ]);
    let f = (
        name,
        prop_oneof![4 => 0..=max_offset, 1 => any::<u32>()],
        prop_oneof![8 => 1u8..=8, 1 => any::<u8>()],
        prop_oneof![8 => Just(1u32), 1 => 0u32..4, 1 => any::<u32>()],
    )
        .prop_map(|(n, offset, datatype, count)| PointField {
            name: n.to_string(),
            offset,
            datatype,
            count,
        });
    prop::collection::vec(f, 0..10)
}

fn check_consistent(p: &Points, r: &DecodeReport) {
    let n = p.len();
    assert_eq!(r.kept, n);
    assert_eq!(r.kept + r.dropped_non_finite, r.total);
    assert_eq!((p.y.len(), p.z.len(), p.intensity.len()), (n, n, n));
    assert!(p.ring.as_ref().map_or(true, |v| v.len() == n));
    assert!(p.time.as_ref().map_or(true, |v| v.len() == n));
    assert!(p.x.iter().chain(&p.y).chain(&p.z).all(|v| v.is_finite()));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn encode_decode_round_trip(
        p in arb_points(),
        layout in prop::sample::select(Layout::ALL.to_vec()),
        big in any::<bool>(),
    ) {
        let buf = encode_points_with(&p, layout, big).expect("encodes");
        prop_assert_eq!(buf.is_dense, p.x.iter().chain(&p.y).chain(&p.z).all(|v| v.is_finite()));
        let (got, r) = decode(&buf.view()).expect("decodes");
        check_consistent(&got, &r);
        let want = expected(&p, layout);
        prop_assert_eq!(r.total, p.len());
        prop_assert_eq!(&got.x, &want.x);
        prop_assert_eq!(&got.y, &want.y);
        prop_assert_eq!(&got.z, &want.z);
        // Bitwise for intensity (NaN-free here, but -0.0 must stay -0.0).
        prop_assert_eq!(
            got.intensity.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            want.intensity.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
        prop_assert_eq!(got.has_intensity, want.has_intensity);
        prop_assert_eq!(&got.ring, &want.ring);
        match (&got.time, &want.time) {
            (Some(g), Some(w)) if layout == Layout::Ouster => {
                // Whole nanoseconds, then f32 seconds.
                for (a, b) in g.iter().zip(w) {
                    prop_assert!((a - b).abs() <= 1e-9 + b.abs() * 2.4e-7, "time {} vs {}", a, b);
                }
            }
            (g, w) => prop_assert_eq!(g, w),
        }
        // The two byte orders decode identically.
        let other = encode_points_with(&p, layout, !big).expect("encodes");
        prop_assert_eq!(decode(&other.view()).expect("decodes").0, got);
    }

    #[test]
    fn labeled_round_trip(p in arb_points(), seed in any::<u64>()) {
        let n = p.len();
        let class_id: Vec<u8> = (0..n).map(|i| (seed.rotate_left(i as u32) & 0xFF) as u8).collect();
        let prob: Vec<f32> = (0..n).map(|i| ((seed >> (i % 32)) & 0xFFFF) as f32 / 65535.0).collect();
        let buf = encode_labeled(&p, &class_id, &prob).expect("encodes");
        for i in 0..n {
            let b = &buf.data[i * 21..];
            prop_assert_eq!(b[16], class_id[i]);
            prop_assert_eq!(f32_at(b, 17), prob[i]);
        }
        let (got, r) = decode(&buf.view()).expect("decodes");
        check_consistent(&got, &r);
        let want = expected(&p, Layout::XyzI32);
        prop_assert_eq!((&got.x, &got.y, &got.z), (&want.x, &want.y, &want.z));
        prop_assert_eq!(&got.intensity, &want.intensity);
    }

    /// Arbitrary headers, field tables and bytes: Ok or Err, never a panic.
    #[test]
    fn decode_arbitrary_never_panics(
        fields in arb_fields(64),
        width in prop_oneof![4 => 0u32..16, 1 => any::<u32>()],
        height in prop_oneof![4 => 0u32..4, 1 => any::<u32>()],
        point_step in prop_oneof![4 => 0u32..64, 1 => any::<u32>()],
        row_step in prop_oneof![4 => 0u32..512, 1 => any::<u32>()],
        big in any::<bool>(),
        data in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        let v = CloudView { height, width, fields: &fields, is_bigendian: big, point_step, row_step, data: &data, is_dense: false };
        if let Ok((p, r)) = decode(&v) {
            check_consistent(&p, &r);
        }
    }

    /// Headers consistent with the data and fields inside the point, so most inputs decode
    /// and the per-point loop runs on random bytes.
    #[test]
    fn decode_nearly_valid_never_panics(
        fields in arb_fields(40),
        width in 0u32..12,
        height in 0u32..4,
        point_step in 1u32..48,
        pad in 0u32..9,
        short in prop_oneof![6 => Just(0usize), 1 => 0usize..8],
        big in any::<bool>(),
        seed in prop::collection::vec(any::<u8>(), 1..64),
    ) {
        let row_step = width * point_step + pad;
        let len = ((row_step * height) as usize).saturating_sub(short);
        let data: Vec<u8> = (0..len).map(|i| seed[i % seed.len()].wrapping_add((i / seed.len()) as u8)).collect();
        let v = CloudView { height, width, fields: &fields, is_bigendian: big, point_step, row_step, data: &data, is_dense: false };
        match decode(&v) {
            Ok((p, r)) => {
                check_consistent(&p, &r);
                prop_assert_eq!(r.total, (width * height) as usize);
            }
            Err(CloudError::Truncated { .. }) => prop_assert!(short > 0),
            Err(_) => {}
        }
    }
}
