//! A small CDR (OMG XCDR1, what ROS 2 and rosbag2 store) reader and writer for the few message
//! types replay needs, with no ROS libraries.
//!
//! # Format
//!
//! * A 4-byte encapsulation header: `00 01` = CDR little endian, `00 00` = CDR big endian, then
//!   two option bytes (ignored). Any other identifier (XCDR2, parameter lists) is
//!   [`CdrError::Encapsulation`].
//! * Every primitive is aligned to its own size (1, 2, 4 or 8) counted from the first byte
//!   after the header; padding bytes are skipped unread.
//! * `string`: `u32` length including the terminating NUL, the UTF-8 bytes, the NUL. A length of
//!   0 (no NUL at all) is accepted as the empty string, as some writers emit it.
//! * `sequence<T>`: `u32` element count, then the elements; fixed arrays `T[N]` (CameraInfo's
//!   `k`, `r`, `p`) have no count.
//! * `bool` is one byte, 0 or 1 (anything else is [`CdrError::InvalidBool`], as in Fast-CDR).
//! * Up to 3 bytes may follow the message (writers pad to a multiple of 4); more is
//!   [`CdrError::TrailingBytes`].
//!
//! # Robustness
//!
//! Every malformed buffer gives a [`CdrError`], never a panic. Before anything is allocated
//! for a sequence its count is checked against the bytes left (each element takes at least one
//! byte, strings and structs at least four), so a corrupt count cannot make a huge
//! allocation: the memory used is bounded by a small multiple of the input's size.
//!
//! # Use
//!
//! ```
//! use sptr::msgs::cdr::{CdrMessage, Image};
//! # let bytes = Image::default().to_cdr(true)?;
//! let img = Image::from_cdr(&bytes)?;                    // rosbag2 message data
//! assert_eq!(img.header.frame_id, "");
//! # Ok::<(), sptr::bag::CdrError>(())
//! ```
//!
//! [`decode_message`] dispatches on the rosbag2 type name (`sensor_msgs/msg/PointCloud2`).

use crate::msgs::cloud::{CloudBuf, CloudView, PointField};

/// A CDR buffer that cannot be decoded. `what` names the field being read
/// (`CameraInfo.header.frame_id`), `offset` is counted from the first byte after the
/// encapsulation header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdrError {
    #[error("CDR message of {len} bytes is shorter than the 4-byte encapsulation header")]
    NoHeader { len: usize },

    #[error(
        "unknown CDR encapsulation {id:02x?} (expected 00 01 = CDR little endian or 00 00 = CDR \
         big endian); the data is not plain CDR (XCDR2 or a parameter list?)"
    )]
    Encapsulation { id: [u8; 2] },

    #[error(
        "CDR message truncated reading {what}: {need} bytes needed at offset {offset}, only \
         {have} left"
    )]
    Truncated {
        what: &'static str,
        offset: usize,
        need: u64,
        have: usize,
    },

    #[error("CDR string {what} at offset {offset} (length {len}) does not end with a NUL byte")]
    StringNoNul {
        what: &'static str,
        offset: usize,
        len: u32,
    },

    #[error("CDR string {what} at offset {offset} is not valid UTF-8")]
    StringUtf8 { what: &'static str, offset: usize },

    #[error(
        "CDR sequence {what} at offset {offset} declares {count} elements (at least {min_elem} \
         bytes each) but only {have} bytes are left; the count is corrupt"
    )]
    SequenceTooLong {
        what: &'static str,
        offset: usize,
        count: u32,
        min_elem: usize,
        have: usize,
    },

    #[error("cannot write a CDR sequence or string of {count} elements: CDR counts are 32-bit")]
    CountTooLarge { count: usize },

    #[error("CDR bool {what} at offset {offset} has byte value {value}, expected 0 or 1")]
    InvalidBool {
        what: &'static str,
        offset: usize,
        value: u8,
    },

    #[error(
        "CDR message {type_name} ends at offset {end} but the buffer has {len} bytes after the \
         header; the data is not a {type_name} or is corrupt"
    )]
    TrailingBytes {
        type_name: &'static str,
        end: usize,
        len: usize,
    },

    #[error(
        "message type {type_name} cannot be decoded here (supported: sensor_msgs/msg/PointCloud2, \
         Image, CompressedImage, CameraInfo)"
    )]
    UnsupportedType { type_name: String },
}

// ---------------------------------------------------------------------------------------------
// Reader

/// Reads CDR primitives from a message payload (the bytes after the encapsulation header).
#[derive(Debug, Clone)]
pub struct CdrReader<'a> {
    buf: &'a [u8],
    pos: usize,
    big_endian: bool,
}

macro_rules! read_prim {
    ($name:ident, $t:ty, $n:expr) => {
        #[doc = concat!("Reads an aligned `", stringify!($t), "`.")]
        pub fn $name(&mut self, what: &'static str) -> Result<$t, CdrError> {
            self.align($n, what)?;
            let b = self.take($n, what)?;
            let mut a = [0u8; $n];
            a.copy_from_slice(b);
            Ok(if self.big_endian {
                <$t>::from_be_bytes(a)
            } else {
                <$t>::from_le_bytes(a)
            })
        }
    };
}

impl<'a> CdrReader<'a> {
    /// Checks the 4-byte encapsulation header of `message` and returns a reader over the rest.
    pub fn new(message: &'a [u8]) -> Result<CdrReader<'a>, CdrError> {
        if message.len() < 4 {
            return Err(CdrError::NoHeader { len: message.len() });
        }
        let big_endian = match [message[0], message[1]] {
            [0x00, 0x01] => false,
            [0x00, 0x00] => true,
            id => return Err(CdrError::Encapsulation { id }),
        };
        Ok(CdrReader {
            buf: &message[4..],
            pos: 0,
            big_endian,
        })
    }

    /// Whether the message is big endian (`00 00` encapsulation).
    pub fn is_big_endian(&self) -> bool {
        self.big_endian
    }

    /// Offset of the next byte, from the start of the payload.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn truncated(&self, what: &'static str, need: u64) -> CdrError {
        CdrError::Truncated {
            what,
            offset: self.pos,
            need,
            have: self.remaining(),
        }
    }

    fn align(&mut self, n: usize, what: &'static str) -> Result<(), CdrError> {
        let pad = (n - self.pos % n) % n;
        if pad > self.remaining() {
            return Err(self.truncated(what, pad as u64));
        }
        self.pos += pad;
        Ok(())
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CdrError> {
        if n > self.remaining() {
            return Err(self.truncated(what, n as u64));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    read_prim!(read_u16, u16, 2);
    read_prim!(read_i16, i16, 2);
    read_prim!(read_u32, u32, 4);
    read_prim!(read_i32, i32, 4);
    read_prim!(read_u64, u64, 8);
    read_prim!(read_i64, i64, 8);
    read_prim!(read_f32, f32, 4);
    read_prim!(read_f64, f64, 8);

    /// Reads a `uint8` / `byte` / `char`.
    pub fn read_u8(&mut self, what: &'static str) -> Result<u8, CdrError> {
        Ok(self.take(1, what)?[0])
    }

    /// Reads an `int8`.
    pub fn read_i8(&mut self, what: &'static str) -> Result<i8, CdrError> {
        Ok(self.read_u8(what)? as i8)
    }

    /// Reads a `bool` (0 or 1).
    pub fn read_bool(&mut self, what: &'static str) -> Result<bool, CdrError> {
        let offset = self.pos;
        match self.read_u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(CdrError::InvalidBool {
                what,
                offset,
                value,
            }),
        }
    }

    /// Reads a sequence count and checks that `count` elements of at least `min_elem` bytes
    /// each fit in what is left.
    pub fn read_count(&mut self, what: &'static str, min_elem: usize) -> Result<usize, CdrError> {
        let count = self.read_u32(what)?;
        let offset = self.pos;
        let have = self.remaining();
        if (count as u64) * (min_elem.max(1) as u64) > have as u64 {
            return Err(CdrError::SequenceTooLong {
                what,
                offset,
                count,
                min_elem,
                have,
            });
        }
        Ok(count as usize)
    }

    /// Reads a `string`.
    pub fn read_string(&mut self, what: &'static str) -> Result<String, CdrError> {
        let len = self.read_u32(what)?;
        let offset = self.pos;
        if len == 0 {
            return Ok(String::new());
        }
        if len as u64 > self.remaining() as u64 {
            return Err(self.truncated(what, len as u64));
        }
        let bytes = self.take(len as usize, what)?;
        let (body, nul) = bytes.split_at(bytes.len() - 1);
        if nul[0] != 0 {
            return Err(CdrError::StringNoNul { what, offset, len });
        }
        match std::str::from_utf8(body) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(CdrError::StringUtf8 { what, offset }),
        }
    }

    /// Reads a `sequence<uint8>` (or `sequence<byte>`).
    pub fn read_bytes(&mut self, what: &'static str) -> Result<Vec<u8>, CdrError> {
        let n = self.read_count(what, 1)?;
        Ok(self.take(n, what)?.to_vec())
    }

    /// Reads a `sequence<float64>`.
    pub fn read_f64_seq(&mut self, what: &'static str) -> Result<Vec<f64>, CdrError> {
        let n = self.read_count(what, 8)?;
        // The count was checked against the bytes left before padding: recheck after aligning.
        self.align(8, what)?;
        if n * 8 > self.remaining() {
            return Err(self.truncated(what, n as u64 * 8));
        }
        (0..n).map(|_| self.read_f64(what)).collect()
    }

    /// Reads a fixed array `float64[N]` (no count).
    pub fn read_f64_array<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[f64; N], CdrError> {
        let mut a = [0.0; N];
        for v in a.iter_mut() {
            *v = self.read_f64(what)?;
        }
        Ok(a)
    }

    /// Fails when more than 3 bytes (a writer's end padding) are left.
    pub fn finish(&self, type_name: &'static str) -> Result<(), CdrError> {
        if self.remaining() > 3 {
            return Err(CdrError::TrailingBytes {
                type_name,
                end: self.pos,
                len: self.buf.len(),
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Writer

/// Writes CDR (XCDR1) with the same alignment rules; [`CdrWriter::finish`] gives the message
/// with its encapsulation header. No end padding is added (as `rosbags` writes).
#[derive(Debug, Clone)]
pub struct CdrWriter {
    out: Vec<u8>,
    big_endian: bool,
    /// First count that did not fit in 32 bits; `finish` reports it.
    too_large: Option<usize>,
}

macro_rules! write_prim {
    ($name:ident, $t:ty, $n:expr) => {
        #[doc = concat!("Writes an aligned `", stringify!($t), "`.")]
        pub fn $name(&mut self, v: $t) {
            self.align($n);
            if self.big_endian {
                self.out.extend_from_slice(&v.to_be_bytes());
            } else {
                self.out.extend_from_slice(&v.to_le_bytes());
            }
        }
    };
}

impl CdrWriter {
    /// A writer for a little-endian (`little_endian = true`) or big-endian message.
    pub fn new(little_endian: bool) -> CdrWriter {
        let id = if little_endian { 0x01 } else { 0x00 };
        CdrWriter {
            out: vec![0x00, id, 0x00, 0x00],
            big_endian: !little_endian,
            too_large: None,
        }
    }

    fn align(&mut self, n: usize) {
        let pos = self.out.len() - 4;
        let pad = (n - pos % n) % n;
        self.out.resize(self.out.len() + pad, 0);
    }

    write_prim!(write_u16, u16, 2);
    write_prim!(write_i16, i16, 2);
    write_prim!(write_u32, u32, 4);
    write_prim!(write_i32, i32, 4);
    write_prim!(write_u64, u64, 8);
    write_prim!(write_i64, i64, 8);
    write_prim!(write_f32, f32, 4);
    write_prim!(write_f64, f64, 8);

    pub fn write_u8(&mut self, v: u8) {
        self.out.push(v);
    }

    pub fn write_bool(&mut self, v: bool) {
        self.out.push(v as u8);
    }

    /// Writes a sequence count. A count over `u32::MAX` (CDR cannot represent it) makes
    /// `finish` fail with `CountTooLarge`.
    pub fn write_count(&mut self, n: usize) {
        let v = u32::try_from(n).unwrap_or_else(|_| {
            self.too_large.get_or_insert(n);
            u32::MAX
        });
        self.write_u32(v);
    }

    pub fn write_string(&mut self, s: &str) {
        self.write_count(s.len() + 1);
        self.out.extend_from_slice(s.as_bytes());
        self.out.push(0);
    }

    pub fn write_bytes(&mut self, b: &[u8]) {
        self.write_count(b.len());
        self.out.extend_from_slice(b);
    }

    pub fn write_f64_seq(&mut self, v: &[f64]) {
        self.write_count(v.len());
        for &x in v {
            self.write_f64(x);
        }
    }

    pub fn write_f64_array(&mut self, v: &[f64]) {
        for &x in v {
            self.write_f64(x);
        }
    }

    /// The message: encapsulation header and payload.
    /// The message bytes, or the error of a count that did not fit.
    pub fn finish(self) -> Result<Vec<u8>, CdrError> {
        match self.too_large {
            Some(count) => Err(CdrError::CountTooLarge { count }),
            None => Ok(self.out),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Messages

/// A message type with a CDR form.
pub trait CdrMessage: Sized {
    /// The rosbag2 type name, `pkg/msg/Type`.
    const TYPE_NAME: &'static str;

    /// Reads the message's fields (the reader is past the encapsulation header).
    fn read(r: &mut CdrReader<'_>) -> Result<Self, CdrError>;

    /// Writes the message's fields.
    fn write(&self, w: &mut CdrWriter);

    /// Decodes a whole CDR message (encapsulation header included), as stored in a rosbag2.
    fn from_cdr(message: &[u8]) -> Result<Self, CdrError> {
        let mut r = CdrReader::new(message)?;
        let m = Self::read(&mut r)?;
        r.finish(Self::TYPE_NAME)?;
        Ok(m)
    }

    /// Encodes the message with its encapsulation header.
    fn to_cdr(&self, little_endian: bool) -> Result<Vec<u8>, CdrError> {
        let mut w = CdrWriter::new(little_endian);
        self.write(&mut w);
        w.finish()
    }
}

/// `builtin_interfaces/Time`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time {
    pub sec: i32,
    pub nanosec: u32,
}

impl Time {
    /// Nanoseconds since the epoch.
    pub fn as_nanos(&self) -> i64 {
        self.sec as i64 * 1_000_000_000 + self.nanosec as i64
    }
}

/// `std_msgs/Header`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    pub stamp: Time,
    pub frame_id: String,
}

impl Header {
    fn read(r: &mut CdrReader<'_>, what: [&'static str; 3]) -> Result<Header, CdrError> {
        let sec = r.read_i32(what[0])?;
        let nanosec = r.read_u32(what[1])?;
        let frame_id = r.read_string(what[2])?;
        Ok(Header {
            stamp: Time { sec, nanosec },
            frame_id,
        })
    }

    fn write(&self, w: &mut CdrWriter) {
        w.write_i32(self.stamp.sec);
        w.write_u32(self.stamp.nanosec);
        w.write_string(&self.frame_id);
    }
}

impl CdrMessage for Header {
    const TYPE_NAME: &'static str = "std_msgs/msg/Header";
    fn read(r: &mut CdrReader<'_>) -> Result<Self, CdrError> {
        Header::read(
            r,
            [
                "Header.stamp.sec",
                "Header.stamp.nanosec",
                "Header.frame_id",
            ],
        )
    }
    fn write(&self, w: &mut CdrWriter) {
        Header::write(self, w)
    }
}

/// `sensor_msgs/PointCloud2`: the header and the body, which [`crate::msgs::cloud::decode`] decodes
/// (`crate::msgs::cloud::decode(&msg.cloud.view())`).
#[derive(Debug, Clone, PartialEq)]
pub struct PointCloud2 {
    pub header: Header,
    pub cloud: CloudBuf,
}

impl Default for PointCloud2 {
    fn default() -> Self {
        PointCloud2 {
            header: Header::default(),
            cloud: CloudBuf {
                height: 0,
                width: 0,
                fields: Vec::new(),
                is_bigendian: false,
                point_step: 0,
                row_step: 0,
                data: Vec::new(),
                is_dense: true,
            },
        }
    }
}

impl PointCloud2 {
    /// Borrowed view of the body, for [`crate::msgs::cloud::decode`].
    pub fn view(&self) -> CloudView<'_> {
        self.cloud.view()
    }
}

impl CdrMessage for PointCloud2 {
    const TYPE_NAME: &'static str = "sensor_msgs/msg/PointCloud2";
    fn read(r: &mut CdrReader<'_>) -> Result<Self, CdrError> {
        let header = Header::read(
            r,
            [
                "PointCloud2.header.stamp.sec",
                "PointCloud2.header.stamp.nanosec",
                "PointCloud2.header.frame_id",
            ],
        )?;
        let height = r.read_u32("PointCloud2.height")?;
        let width = r.read_u32("PointCloud2.width")?;
        // A PointField is at least 4 (name length) + 4 (offset) + 1 (datatype) + 4 (count) bytes.
        let n = r.read_count("PointCloud2.fields", 13)?;
        let mut fields = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.read_string("PointCloud2.fields[].name")?;
            let offset = r.read_u32("PointCloud2.fields[].offset")?;
            let datatype = r.read_u8("PointCloud2.fields[].datatype")?;
            let count = r.read_u32("PointCloud2.fields[].count")?;
            fields.push(PointField {
                name,
                offset,
                datatype,
                count,
            });
        }
        let is_bigendian = r.read_bool("PointCloud2.is_bigendian")?;
        let point_step = r.read_u32("PointCloud2.point_step")?;
        let row_step = r.read_u32("PointCloud2.row_step")?;
        let data = r.read_bytes("PointCloud2.data")?;
        let is_dense = r.read_bool("PointCloud2.is_dense")?;
        Ok(PointCloud2 {
            header,
            cloud: CloudBuf {
                height,
                width,
                fields,
                is_bigendian,
                point_step,
                row_step,
                data,
                is_dense,
            },
        })
    }

    fn write(&self, w: &mut CdrWriter) {
        let c = &self.cloud;
        self.header.write(w);
        w.write_u32(c.height);
        w.write_u32(c.width);
        w.write_count(c.fields.len());
        for f in &c.fields {
            w.write_string(&f.name);
            w.write_u32(f.offset);
            w.write_u8(f.datatype);
            w.write_u32(f.count);
        }
        w.write_bool(c.is_bigendian);
        w.write_u32(c.point_step);
        w.write_u32(c.row_step);
        w.write_bytes(&c.data);
        w.write_bool(c.is_dense);
    }
}

/// `sensor_msgs/Image`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Image {
    pub header: Header,
    pub height: u32,
    pub width: u32,
    pub encoding: String,
    pub is_bigendian: u8,
    pub step: u32,
    pub data: Vec<u8>,
}

impl CdrMessage for Image {
    const TYPE_NAME: &'static str = "sensor_msgs/msg/Image";
    fn read(r: &mut CdrReader<'_>) -> Result<Self, CdrError> {
        Ok(Image {
            header: Header::read(
                r,
                [
                    "Image.header.stamp.sec",
                    "Image.header.stamp.nanosec",
                    "Image.header.frame_id",
                ],
            )?,
            height: r.read_u32("Image.height")?,
            width: r.read_u32("Image.width")?,
            encoding: r.read_string("Image.encoding")?,
            is_bigendian: r.read_u8("Image.is_bigendian")?,
            step: r.read_u32("Image.step")?,
            data: r.read_bytes("Image.data")?,
        })
    }

    fn write(&self, w: &mut CdrWriter) {
        self.header.write(w);
        w.write_u32(self.height);
        w.write_u32(self.width);
        w.write_string(&self.encoding);
        w.write_u8(self.is_bigendian);
        w.write_u32(self.step);
        w.write_bytes(&self.data);
    }
}

/// `sensor_msgs/CompressedImage`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompressedImage {
    pub header: Header,
    pub format: String,
    pub data: Vec<u8>,
}

impl CdrMessage for CompressedImage {
    const TYPE_NAME: &'static str = "sensor_msgs/msg/CompressedImage";
    fn read(r: &mut CdrReader<'_>) -> Result<Self, CdrError> {
        Ok(CompressedImage {
            header: Header::read(
                r,
                [
                    "CompressedImage.header.stamp.sec",
                    "CompressedImage.header.stamp.nanosec",
                    "CompressedImage.header.frame_id",
                ],
            )?,
            format: r.read_string("CompressedImage.format")?,
            data: r.read_bytes("CompressedImage.data")?,
        })
    }

    fn write(&self, w: &mut CdrWriter) {
        self.header.write(w);
        w.write_string(&self.format);
        w.write_bytes(&self.data);
    }
}

/// `sensor_msgs/RegionOfInterest`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RegionOfInterest {
    pub x_offset: u32,
    pub y_offset: u32,
    pub height: u32,
    pub width: u32,
    pub do_rectify: bool,
}

/// `sensor_msgs/CameraInfo`. `k` (3×3), `r` (3×3) and `p` (3×4) are row-major fixed arrays.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CameraInfo {
    pub header: Header,
    pub height: u32,
    pub width: u32,
    pub distortion_model: String,
    pub d: Vec<f64>,
    pub k: [f64; 9],
    pub r: [f64; 9],
    pub p: [f64; 12],
    pub binning_x: u32,
    pub binning_y: u32,
    pub roi: RegionOfInterest,
}

impl CdrMessage for CameraInfo {
    const TYPE_NAME: &'static str = "sensor_msgs/msg/CameraInfo";
    fn read(r: &mut CdrReader<'_>) -> Result<Self, CdrError> {
        Ok(CameraInfo {
            header: Header::read(
                r,
                [
                    "CameraInfo.header.stamp.sec",
                    "CameraInfo.header.stamp.nanosec",
                    "CameraInfo.header.frame_id",
                ],
            )?,
            height: r.read_u32("CameraInfo.height")?,
            width: r.read_u32("CameraInfo.width")?,
            distortion_model: r.read_string("CameraInfo.distortion_model")?,
            d: r.read_f64_seq("CameraInfo.d")?,
            k: r.read_f64_array("CameraInfo.k")?,
            r: r.read_f64_array("CameraInfo.r")?,
            p: r.read_f64_array("CameraInfo.p")?,
            binning_x: r.read_u32("CameraInfo.binning_x")?,
            binning_y: r.read_u32("CameraInfo.binning_y")?,
            roi: RegionOfInterest {
                x_offset: r.read_u32("CameraInfo.roi.x_offset")?,
                y_offset: r.read_u32("CameraInfo.roi.y_offset")?,
                height: r.read_u32("CameraInfo.roi.height")?,
                width: r.read_u32("CameraInfo.roi.width")?,
                do_rectify: r.read_bool("CameraInfo.roi.do_rectify")?,
            },
        })
    }

    fn write(&self, w: &mut CdrWriter) {
        self.header.write(w);
        w.write_u32(self.height);
        w.write_u32(self.width);
        w.write_string(&self.distortion_model);
        w.write_f64_seq(&self.d);
        w.write_f64_array(&self.k);
        w.write_f64_array(&self.r);
        w.write_f64_array(&self.p);
        w.write_u32(self.binning_x);
        w.write_u32(self.binning_y);
        let roi = &self.roi;
        w.write_u32(roi.x_offset);
        w.write_u32(roi.y_offset);
        w.write_u32(roi.height);
        w.write_u32(roi.width);
        w.write_bool(roi.do_rectify);
    }
}

/// `geometry_msgs/Pose` (position and orientation quaternion), as in a map's origin.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pose {
    pub position: [f64; 3],
    /// `x, y, z, w`.
    pub orientation: [f64; 4],
}

/// `nav_msgs/MapMetaData`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MapMetaData {
    pub map_load_time: Time,
    /// Metres per cell.
    pub resolution: f32,
    pub width: u32,
    pub height: u32,
    /// Pose of cell (0, 0)'s corner in the header's frame.
    pub origin: Pose,
}

/// `nav_msgs/OccupancyGrid`: row-major cells, 0..=100 occupancy, -1 unknown. Replay writes it
/// for the BEV occupancy output (the node publishes the same message).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OccupancyGrid {
    pub header: Header,
    pub info: MapMetaData,
    pub data: Vec<i8>,
}

impl CdrMessage for OccupancyGrid {
    const TYPE_NAME: &'static str = "nav_msgs/msg/OccupancyGrid";
    fn read(r: &mut CdrReader<'_>) -> Result<Self, CdrError> {
        let header = Header::read(
            r,
            [
                "OccupancyGrid.header.stamp.sec",
                "OccupancyGrid.header.stamp.nanosec",
                "OccupancyGrid.header.frame_id",
            ],
        )?;
        let map_load_time = Time {
            sec: r.read_i32("OccupancyGrid.info.map_load_time.sec")?,
            nanosec: r.read_u32("OccupancyGrid.info.map_load_time.nanosec")?,
        };
        let resolution = r.read_f32("OccupancyGrid.info.resolution")?;
        let width = r.read_u32("OccupancyGrid.info.width")?;
        let height = r.read_u32("OccupancyGrid.info.height")?;
        let mut position = [0.0; 3];
        for v in position.iter_mut() {
            *v = r.read_f64("OccupancyGrid.info.origin.position")?;
        }
        let mut orientation = [0.0; 4];
        for v in orientation.iter_mut() {
            *v = r.read_f64("OccupancyGrid.info.origin.orientation")?;
        }
        let data = r
            .read_bytes("OccupancyGrid.data")?
            .into_iter()
            .map(|b| b as i8)
            .collect();
        Ok(OccupancyGrid {
            header,
            info: MapMetaData {
                map_load_time,
                resolution,
                width,
                height,
                origin: Pose {
                    position,
                    orientation,
                },
            },
            data,
        })
    }

    fn write(&self, w: &mut CdrWriter) {
        self.header.write(w);
        let i = &self.info;
        w.write_i32(i.map_load_time.sec);
        w.write_u32(i.map_load_time.nanosec);
        w.write_f32(i.resolution);
        w.write_u32(i.width);
        w.write_u32(i.height);
        w.write_f64_array(&i.origin.position);
        w.write_f64_array(&i.origin.orientation);
        w.write_count(self.data.len());
        w.out.extend(self.data.iter().map(|&v| v as u8)); // one reserve, not a push per cell
    }
}

/// `geometry_msgs/TransformStamped`: the pose of `child_frame_id` in `header.frame_id` (a point
/// `p` in the child frame is `R(rotation) p + translation` in the parent frame).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TransformStamped {
    pub header: Header,
    pub child_frame_id: String,
    pub translation: [f64; 3],
    /// `x, y, z, w`.
    pub rotation: [f64; 4],
}

/// `tf2_msgs/TFMessage` (`/tf`, `/tf_static`). Decoded here rather than through a generated
/// interface package: the PyPI ROS 2 toolchain has no tf2_msgs, and the node subscribes to the
/// raw bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TfMessage {
    pub transforms: Vec<TransformStamped>,
}

impl CdrMessage for TfMessage {
    const TYPE_NAME: &'static str = "tf2_msgs/msg/TFMessage";
    fn read(r: &mut CdrReader<'_>) -> Result<Self, CdrError> {
        // header (8 + 4 bytes at least), child frame id (4), 7 doubles (56)
        let n = r.read_count("TFMessage.transforms", 72)?;
        let mut transforms = Vec::with_capacity(n);
        for _ in 0..n {
            let header = Header::read(
                r,
                [
                    "TFMessage.transforms.header.stamp.sec",
                    "TFMessage.transforms.header.stamp.nanosec",
                    "TFMessage.transforms.header.frame_id",
                ],
            )?;
            let child_frame_id = r.read_string("TFMessage.transforms.child_frame_id")?;
            let translation = r.read_f64_array("TFMessage.transforms.transform.translation")?;
            let rotation = r.read_f64_array("TFMessage.transforms.transform.rotation")?;
            transforms.push(TransformStamped {
                header,
                child_frame_id,
                translation,
                rotation,
            });
        }
        Ok(TfMessage { transforms })
    }

    fn write(&self, w: &mut CdrWriter) {
        w.write_count(self.transforms.len());
        for t in &self.transforms {
            t.header.write(w);
            w.write_string(&t.child_frame_id);
            w.write_f64_array(&t.translation);
            w.write_f64_array(&t.rotation);
        }
    }
}

/// One decoded message of a type replay reads. (CameraInfo's 360 bytes inline are fine: a
/// message is decoded once per frame and its buffers dwarf the enum.)
#[derive(Debug, Clone, PartialEq)]
#[allow(clippy::large_enum_variant)]
pub enum Message {
    PointCloud2(PointCloud2),
    Image(Image),
    CompressedImage(CompressedImage),
    CameraInfo(CameraInfo),
}

/// The rosbag2 type name (`pkg/msg/Type`) of `type_name`, which may also be written the ROS 1
/// way (`pkg/Type`).
fn canonical_type(type_name: &str) -> Option<&'static str> {
    let t = type_name.trim();
    let (pkg, name) = match t.split('/').collect::<Vec<_>>()[..] {
        [pkg, "msg", name] => (pkg, name),
        [pkg, name] => (pkg, name),
        _ => return None,
    };
    [
        PointCloud2::TYPE_NAME,
        Image::TYPE_NAME,
        CompressedImage::TYPE_NAME,
        CameraInfo::TYPE_NAME,
    ]
    .into_iter()
    .find(|full| {
        let mut it = full.split('/');
        it.next() == Some(pkg) && it.nth(1) == Some(name)
    })
}

/// Whether [`decode_message`] can decode messages of `type_name`.
pub fn is_supported_type(type_name: &str) -> bool {
    canonical_type(type_name).is_some()
}

/// Decodes a rosbag2 message's CDR `data` given its type name (`sensor_msgs/msg/Image`, or
/// `sensor_msgs/Image`). An unsupported type is [`CdrError::UnsupportedType`].
pub fn decode_message(type_name: &str, data: &[u8]) -> Result<Message, CdrError> {
    match canonical_type(type_name) {
        Some(PointCloud2::TYPE_NAME) => PointCloud2::from_cdr(data).map(Message::PointCloud2),
        Some(Image::TYPE_NAME) => Image::from_cdr(data).map(Message::Image),
        Some(CompressedImage::TYPE_NAME) => {
            CompressedImage::from_cdr(data).map(Message::CompressedImage)
        }
        Some(CameraInfo::TYPE_NAME) => CameraInfo::from_cdr(data).map(Message::CameraInfo),
        _ => Err(CdrError::UnsupportedType {
            type_name: type_name.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_relative_to_payload() {
        // u8 then u32: 3 padding bytes after the header's 4.
        let mut w = CdrWriter::new(true);
        w.write_u8(7);
        w.write_u32(0x0102_0304);
        w.write_f64(1.5);
        let b = w.finish().unwrap();
        assert_eq!(b.len(), 4 + 1 + 3 + 4 + 8);
        let mut r = CdrReader::new(&b).unwrap();
        assert_eq!(r.read_u8("a").unwrap(), 7);
        assert_eq!(r.read_u32("b").unwrap(), 0x0102_0304);
        assert_eq!(r.read_f64("c").unwrap(), 1.5);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn type_names() {
        assert!(is_supported_type("sensor_msgs/msg/PointCloud2"));
        assert!(is_supported_type("sensor_msgs/CameraInfo"));
        assert!(!is_supported_type("sensor_msgs/msg/Imu"));
        assert!(!is_supported_type("Image"));
    }
}
