//! `sensor_msgs/PointCloud2` bodies ⇄ [`Points`], with no ROS dependency.
//!
//! The ROS node and the rosbag reader both hand this module the message's fields and byte
//! buffer ([`CloudView`]); encoders produce an owned body ([`CloudBuf`]) that either side turns
//! into a message.
//!
//! # Decoding
//!
//! [`decode`] (and its buffer-reusing twin [`decode_into`]) accepts any field layout:
//!
//! * every `sensor_msgs/PointField` datatype (see [`datatype`]), in any field order, at any
//!   offset (aligned or not), big or little endian (`is_bigendian`);
//! * `count > 1` fields (element 0 is read); `count == 0` on a field we read is malformed;
//! * organized clouds (`height > 1`) and padded rows: row `r` starts at byte `r * row_step`;
//! * `is_dense = false` clouds: points with a NaN or infinite `x`, `y`, `z` or `intensity` (every
//!   value the network reads) are dropped and counted in [`DecodeReport::dropped_non_finite`];
//!   their ring/time go with them. (`ring` and `time` are not read by the network and are not
//!   checked.)
//!
//! Field names (matched exactly, first match wins; other fields are ignored and not validated):
//!
//! | attribute | field names, in order of preference | conversion |
//! | --- | --- | --- |
//! | x, y, z (required) | `x`, `y`, `z` | value as `f32` (integers taken literally, no scale; `f64` values beyond the `f32` range become infinite and the point is dropped) |
//! | intensity | `intensity`, `i` | value as `f32`, not normalized (a `u8` intensity decodes to 0..=255; NaN, infinite, or an `f64` beyond the `f32` range: the point is dropped); absent → zeros and `has_intensity = false` |
//! | ring | `ring`, `channel` | value saturated to `u16` (fractions truncated, negatives and NaN → 0) |
//! | time | `time`, `t`, `timestamp` | **float32/float64: seconds; integer types: nanoseconds** (Ouster's `t` is `u32` ns), converted to `f32` seconds |
//!
//! `Points::time` is meant as an offset from the message stamp; a driver that writes absolute
//! epoch time in `timestamp` (some Hesai and Livox drivers) decodes to an `f32` that has lost
//! most of its precision: subtract the stamp upstream if such a source matters.
//!
//! Malformed messages give a [`CloudError`], never a panic. A zero-point cloud (`width == 0`
//! or `height == 0`) is always valid and decodes to empty [`Points`] (its field table is only
//! consulted for `has_intensity` and whether `ring`/`time` are `Some`).
//!
//! Field accessors (offset, datatype, endianness) are resolved once per message, then one pass
//! runs over the rows; little-endian `float32` x/y/z (nearly every driver) take a specialized
//! loop. Nothing is allocated per point.
//!
//! # Encoding
//!
//! [`encode_labeled`] writes the segmentation output (Autoware's PTv3 node layout);
//! [`encode_points`] / [`encode_points_with`] write one of a few common driver layouts
//! ([`Layout`]), for tests and tools.

use crate::msgs::points::Points;

/// `sensor_msgs/PointField` datatype constants.
pub mod datatype {
    pub const INT8: u8 = 1;
    pub const UINT8: u8 = 2;
    pub const INT16: u8 = 3;
    pub const UINT16: u8 = 4;
    pub const INT32: u8 = 5;
    pub const UINT32: u8 = 6;
    pub const FLOAT32: u8 = 7;
    pub const FLOAT64: u8 = 8;

    /// Size in bytes of one element of `datatype`, `None` for a value that is not a
    /// `sensor_msgs/PointField` datatype.
    pub const fn size_of(datatype: u8) -> Option<u32> {
        match datatype {
            INT8 | UINT8 => Some(1),
            INT16 | UINT16 => Some(2),
            INT32 | UINT32 | FLOAT32 => Some(4),
            FLOAT64 => Some(8),
            _ => None,
        }
    }
}

/// One `sensor_msgs/PointField`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointField {
    pub name: String,
    pub offset: u32,
    pub datatype: u8,
    pub count: u32,
}

impl PointField {
    /// A field of `count` 1.
    pub fn new(name: &str, offset: u32, datatype: u8) -> PointField {
        PointField {
            name: name.to_string(),
            offset,
            datatype,
            count: 1,
        }
    }
}

/// Borrowed view of a PointCloud2 message body (everything but the header).
#[derive(Debug, Clone, Copy)]
pub struct CloudView<'a> {
    pub height: u32,
    pub width: u32,
    pub fields: &'a [PointField],
    pub is_bigendian: bool,
    pub point_step: u32,
    pub row_step: u32,
    pub data: &'a [u8],
    pub is_dense: bool,
}

/// Owned PointCloud2 body, what the encoders produce.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudBuf {
    pub height: u32,
    pub width: u32,
    pub fields: Vec<PointField>,
    pub is_bigendian: bool,
    pub point_step: u32,
    pub row_step: u32,
    pub data: Vec<u8>,
    pub is_dense: bool,
}

impl CloudBuf {
    pub fn view(&self) -> CloudView<'_> {
        CloudView {
            height: self.height,
            width: self.width,
            fields: &self.fields,
            is_bigendian: self.is_bigendian,
            point_step: self.point_step,
            row_step: self.row_step,
            data: &self.data,
            is_dense: self.is_dense,
        }
    }
}

/// What [`decode`] did with the message's points.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeReport {
    /// Points in the message (`width * height`).
    pub total: usize,
    /// Points in the output.
    pub kept: usize,
    /// Points dropped because x, y, z or intensity was NaN or infinite.
    pub dropped_non_finite: usize,
}

pub use crate::error::CloudError;

/// Point layouts [`encode_points`] can write. Every layout has height 1 and `is_dense` set
/// from the data. Fields a layout has but [`Points`] lacks are written as 0 (for example a
/// missing `ring`), and decode back as zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `x, y, z` float32 at 0, 4, 8; point_step 12. No intensity.
    Xyz32,
    /// `x, y, z, intensity` float32 at 0, 4, 8, 12; point_step 16 (PCL `PointXYZI` packed, KITTI).
    XyzI32,
    /// Autoware `PointXYZIRC`: `x, y, z` float32 at 0, 4, 8, `intensity` uint8 at 12,
    /// `return_type` uint8 at 13 (written 0), `channel` uint16 at 14 (from `ring`);
    /// point_step 16. Intensity is rounded and clamped to 0..=255.
    XyzIrc,
    /// Velodyne-driver XYZIRT, packed: `x, y, z, intensity` float32 at 0, 4, 8, 12, `ring`
    /// uint16 at 16, `time` float32 seconds at 18 (unaligned); point_step 22.
    XyzIrt,
    /// Ouster (`ouster-ros` legacy point): `x, y, z` float32 at 0, 4, 8, `intensity` float32 at
    /// 16, `t` uint32 nanoseconds at 20, `reflectivity` uint16 at 24, `ring` uint16 at 26,
    /// `ambient` uint16 at 28, `range` uint32 at 32; point_step 48. Time is rounded to whole
    /// nanoseconds (clamped to 0..=u32::MAX); reflectivity, ambient and range are written 0.
    Ouster,
    /// `x, y, z` float64 at 0, 8, 16, `intensity` float32 at 24; point_step 32 (4 bytes padding).
    Xyz64I32,
}

/// Where an encoded field's value comes from.
#[derive(Clone, Copy)]
enum Source {
    X,
    Y,
    Z,
    Intensity,
    Ring,
    Time,
    Zero,
}

impl Layout {
    /// Every layout, for tests and tools.
    pub const ALL: [Layout; 6] = [
        Layout::Xyz32,
        Layout::XyzI32,
        Layout::XyzIrc,
        Layout::XyzIrt,
        Layout::Ouster,
        Layout::Xyz64I32,
    ];

    /// Bytes per point.
    pub fn point_step(self) -> u32 {
        match self {
            Layout::Xyz32 => 12,
            Layout::XyzI32 => 16,
            Layout::XyzIrc => 16,
            Layout::XyzIrt => 22,
            Layout::Ouster => 48,
            Layout::Xyz64I32 => 32,
        }
    }

    fn table(self) -> &'static [(&'static str, u32, u8, Source)] {
        use datatype::*;
        use Source::*;
        match self {
            Layout::Xyz32 => &[
                ("x", 0, FLOAT32, X),
                ("y", 4, FLOAT32, Y),
                ("z", 8, FLOAT32, Z),
            ],
            Layout::XyzI32 => &[
                ("x", 0, FLOAT32, X),
                ("y", 4, FLOAT32, Y),
                ("z", 8, FLOAT32, Z),
                ("intensity", 12, FLOAT32, Intensity),
            ],
            Layout::XyzIrc => &[
                ("x", 0, FLOAT32, X),
                ("y", 4, FLOAT32, Y),
                ("z", 8, FLOAT32, Z),
                ("intensity", 12, UINT8, Intensity),
                ("return_type", 13, UINT8, Zero),
                ("channel", 14, UINT16, Ring),
            ],
            Layout::XyzIrt => &[
                ("x", 0, FLOAT32, X),
                ("y", 4, FLOAT32, Y),
                ("z", 8, FLOAT32, Z),
                ("intensity", 12, FLOAT32, Intensity),
                ("ring", 16, UINT16, Ring),
                ("time", 18, FLOAT32, Time),
            ],
            Layout::Ouster => &[
                ("x", 0, FLOAT32, X),
                ("y", 4, FLOAT32, Y),
                ("z", 8, FLOAT32, Z),
                ("intensity", 16, FLOAT32, Intensity),
                ("t", 20, UINT32, Time),
                ("reflectivity", 24, UINT16, Zero),
                ("ring", 26, UINT16, Ring),
                ("ambient", 28, UINT16, Zero),
                ("range", 32, UINT32, Zero),
            ],
            Layout::Xyz64I32 => &[
                ("x", 0, FLOAT64, X),
                ("y", 8, FLOAT64, Y),
                ("z", 16, FLOAT64, Z),
                ("intensity", 24, FLOAT32, Intensity),
            ],
        }
    }

    /// The layout's PointField table.
    pub fn fields(self) -> Vec<PointField> {
        self.table()
            .iter()
            .map(|&(name, offset, dt, _)| PointField::new(name, offset, dt))
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Scalar access

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    F32,
    F64,
}

impl Kind {
    fn from_datatype(dt: u8) -> Option<Kind> {
        Some(match dt {
            datatype::INT8 => Kind::I8,
            datatype::UINT8 => Kind::U8,
            datatype::INT16 => Kind::I16,
            datatype::UINT16 => Kind::U16,
            datatype::INT32 => Kind::I32,
            datatype::UINT32 => Kind::U32,
            datatype::FLOAT32 => Kind::F32,
            datatype::FLOAT64 => Kind::F64,
            _ => return None,
        })
    }

    fn is_float(self) -> bool {
        matches!(self, Kind::F32 | Kind::F64)
    }
}

/// `N` bytes of `p` at `o`. Callers have checked `o + N <= p.len()` (field bounds are validated
/// against `point_step` before any point is read).
#[inline(always)]
fn bytes<const N: usize>(p: &[u8], o: usize) -> [u8; N] {
    let mut b = [0u8; N];
    b.copy_from_slice(&p[o..o + N]);
    b
}

/// A resolved field: where element 0 is in a point, its type, the message's byte order.
#[derive(Debug, Clone, Copy)]
struct Accessor {
    offset: usize,
    kind: Kind,
    big: bool,
}

impl Accessor {
    /// The value as `f64` (exact for every PointField type).
    #[inline(always)]
    fn get(&self, p: &[u8]) -> f64 {
        let o = self.offset;
        macro_rules! rd {
            ($t:ty, $n:expr) => {{
                let b = bytes::<$n>(p, o);
                (if self.big {
                    <$t>::from_be_bytes(b)
                } else {
                    <$t>::from_le_bytes(b)
                }) as f64
            }};
        }
        match self.kind {
            Kind::I8 => p[o] as i8 as f64,
            Kind::U8 => p[o] as f64,
            Kind::I16 => rd!(i16, 2),
            Kind::U16 => rd!(u16, 2),
            Kind::I32 => rd!(i32, 4),
            Kind::U32 => rd!(u32, 4),
            Kind::F32 => rd!(f32, 4),
            Kind::F64 => rd!(f64, 8),
        }
    }

    /// The value as `f32` (one rounding from the stored value).
    #[inline(always)]
    fn get_f32(&self, p: &[u8]) -> f32 {
        match (self.kind, self.big) {
            (Kind::F32, false) => f32::from_le_bytes(bytes::<4>(p, self.offset)),
            (Kind::F32, true) => f32::from_be_bytes(bytes::<4>(p, self.offset)),
            _ => self.get(p) as f32,
        }
    }
}

/// Writes `v` at `o` as `kind`: floats are stored as is (f32 rounds once), integers are
/// rounded to nearest and saturated to the type's range (NaN → 0).
fn put(p: &mut [u8], o: usize, kind: Kind, v: f64, big: bool) {
    macro_rules! wr {
        ($x:expr) => {{
            let x = $x;
            let b = if big {
                x.to_be_bytes()
            } else {
                x.to_le_bytes()
            };
            p[o..o + b.len()].copy_from_slice(&b);
        }};
    }
    match kind {
        Kind::I8 => wr!(v.round() as i8),
        Kind::U8 => wr!(v.round() as u8),
        Kind::I16 => wr!(v.round() as i16),
        Kind::U16 => wr!(v.round() as u16),
        Kind::I32 => wr!(v.round() as i32),
        Kind::U32 => wr!(v.round() as u32),
        Kind::F32 => wr!(v as f32),
        Kind::F64 => wr!(v),
    }
}

// ---------------------------------------------------------------------------------------------
// Decoding

fn find<'a>(fields: &'a [PointField], names: &[&str]) -> Option<&'a PointField> {
    names
        .iter()
        .find_map(|n| fields.iter().find(|f| f.name == *n))
}

fn resolve(f: &PointField, point_step: u32, big: bool) -> Result<Accessor, CloudError> {
    let kind = Kind::from_datatype(f.datatype).ok_or_else(|| CloudError::UnknownDatatype {
        name: f.name.clone(),
        datatype: f.datatype,
    })?;
    let size = datatype::size_of(f.datatype).unwrap_or(1);
    if f.count == 0 {
        return Err(CloudError::ZeroCount {
            name: f.name.clone(),
        });
    }
    // u32 + 8 * u32 cannot overflow u64.
    let end = f.offset as u64 + size as u64 * f.count as u64;
    if end > point_step as u64 {
        return Err(CloudError::FieldOutOfBounds {
            name: f.name.clone(),
            offset: f.offset,
            size,
            count: f.count,
            end,
            point_step,
        });
    }
    let offset = usize::try_from(f.offset).map_err(|_| CloudError::SizeOverflow {
        what: format!("field offset {}", f.offset),
    })?;
    Ok(Accessor { offset, kind, big })
}

const INTENSITY: &[&str] = &["intensity", "i"];
const RING: &[&str] = &["ring", "channel"];
const TIME: &[&str] = &["time", "t", "timestamp"];

/// Resolved optional attributes.
struct Extras {
    intensity: Option<Accessor>,
    ring: Option<Accessor>,
    /// Accessor and the factor to seconds (1 for floats, 1e-9 for integer nanoseconds).
    time: Option<(Accessor, f64)>,
}

/// Reads x, y, z of one point.
trait XyzRead {
    fn read(&self, p: &[u8]) -> (f32, f32, f32);
}

/// The common case: little-endian float32 x, y, z.
struct LeF32 {
    x: usize,
    y: usize,
    z: usize,
}

impl XyzRead for LeF32 {
    #[inline(always)]
    fn read(&self, p: &[u8]) -> (f32, f32, f32) {
        (
            f32::from_le_bytes(bytes::<4>(p, self.x)),
            f32::from_le_bytes(bytes::<4>(p, self.y)),
            f32::from_le_bytes(bytes::<4>(p, self.z)),
        )
    }
}

/// Any datatype, any byte order.
struct AnyXyz([Accessor; 3]);

impl XyzRead for AnyXyz {
    #[inline(always)]
    fn read(&self, p: &[u8]) -> (f32, f32, f32) {
        (
            self.0[0].get_f32(p),
            self.0[1].get_f32(p),
            self.0[2].get_f32(p),
        )
    }
}

/// Geometry of a validated message, in `usize`.
struct Geometry {
    height: usize,
    row_bytes: usize,
    row_step: usize,
    point_step: usize,
}

/// Decodes a PointCloud2 body into new [`Points`]. See the module documentation for the
/// accepted layouts and the conversions.
pub fn decode(view: &CloudView) -> Result<(Points, DecodeReport), CloudError> {
    let mut points = Points::default();
    let report = decode_into(view, &mut points)?;
    Ok((points, report))
}

/// The message geometry every reader of a non-empty cloud needs, checked (checked arithmetic
/// throughout): a non-zero point step, a point count and byte sizes that fit, rows wide enough for
/// their points and data covering every row. Returns the geometry, the point count and the bytes
/// the rows span.
fn checked_geometry(view: &CloudView) -> Result<(Geometry, usize, usize), CloudError> {
    if view.point_step == 0 {
        return Err(CloudError::ZeroPointStep {
            width: view.width,
            height: view.height,
        });
    }
    let (w, h, ps, rs) = (
        view.width as u64,
        view.height as u64,
        view.point_step as u64,
        view.row_step as u64,
    );
    let overflow = |what: String| CloudError::SizeOverflow { what };
    let total_points = w
        .checked_mul(h)
        .ok_or_else(|| overflow(format!("width {w} × height {h}")))?;
    total_points.checked_mul(ps).ok_or_else(|| {
        overflow(format!(
            "width {w} × height {h} × point_step {ps} does not fit in 64 bits"
        ))
    })?;
    let row_bytes = w * ps; // u32 × u32 fits u64
    if rs < row_bytes {
        return Err(CloudError::RowStepTooSmall {
            row_step: view.row_step,
            width: view.width,
            point_step: view.point_step,
            needed: row_bytes,
        });
    }
    let expected = h * rs; // u32 × u32 fits u64
    let expected_usize = usize::try_from(expected).map_err(|_| {
        overflow(format!(
            "height {h} × row_step {rs} = {expected} bytes exceeds this machine's address space"
        ))
    })?;
    if view.data.len() < expected_usize {
        return Err(CloudError::Truncated {
            height: view.height,
            row_step: view.row_step,
            expected,
            actual: view.data.len(),
        });
    }
    // Everything below is bounded by data.len(), so it fits usize.
    let to_usize = |v: u64, what: &str| {
        usize::try_from(v).map_err(|_| overflow(format!("{what} {v} does not fit in usize")))
    };
    let geom = Geometry {
        height: to_usize(h, "height")?,
        row_bytes: to_usize(row_bytes, "row bytes")?,
        row_step: to_usize(rs, "row_step")?,
        point_step: to_usize(ps, "point_step")?,
    };
    let total = to_usize(total_points, "point count")?;
    Ok((geom, total, expected_usize))
}

/// [`decode`] into an existing [`Points`], reusing its buffers (no allocation once they are
/// large enough). On error `out` holds no points.
pub fn decode_into(view: &CloudView, out: &mut Points) -> Result<DecodeReport, CloudError> {
    clear(out);
    let fields = view.fields;
    let big = view.is_bigendian;

    if view.width == 0 || view.height == 0 {
        out.has_intensity = find(fields, INTENSITY).is_some();
        keep_if(&mut out.ring, find(fields, RING).is_some(), 0);
        keep_if(&mut out.time, find(fields, TIME).is_some(), 0);
        return Ok(DecodeReport::default());
    }

    // --- message geometry ---
    let (geom, total, expected_usize) = checked_geometry(view)?;

    // --- fields, resolved once ---
    let required = |name: &'static str| -> Result<Accessor, CloudError> {
        let f = find(fields, &[name]).ok_or_else(|| CloudError::MissingField {
            name,
            present: fields
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        resolve(f, view.point_step, big)
    };
    let (ax, ay, az) = (required("x")?, required("y")?, required("z")?);
    let optional = |names: &[&str]| -> Result<Option<Accessor>, CloudError> {
        find(fields, names)
            .map(|f| resolve(f, view.point_step, big))
            .transpose()
    };
    let extras = Extras {
        intensity: optional(INTENSITY)?,
        ring: optional(RING)?,
        time: optional(TIME)?.map(|a| (a, if a.kind.is_float() { 1.0 } else { 1e-9 })),
    };

    // --- one pass over the rows ---
    reserve(out, total, &extras);
    let data = &view.data[..expected_usize];
    let kept = if ax.kind == Kind::F32 && ay.kind == Kind::F32 && az.kind == Kind::F32 && !big {
        let xyz = LeF32 {
            x: ax.offset,
            y: ay.offset,
            z: az.offset,
        };
        run(data, &geom, &xyz, &extras, out)
    } else {
        run(data, &geom, &AnyXyz([ax, ay, az]), &extras, out)
    };
    Ok(DecodeReport {
        total,
        kept,
        dropped_non_finite: total - kept,
    })
}

/// Empties `out`, keeping its allocations (including those of `ring` and `time`).
fn clear(out: &mut Points) {
    out.x.clear();
    out.y.clear();
    out.z.clear();
    out.intensity.clear();
    out.has_intensity = false;
    if let Some(v) = out.ring.as_mut() {
        v.clear();
    }
    if let Some(v) = out.time.as_mut() {
        v.clear();
    }
}

/// `Some(v)` (reusing `v` when there is one) if `present`, else `None`.
fn keep_if<T>(slot: &mut Option<Vec<T>>, present: bool, n: usize) {
    if present {
        let v = slot.get_or_insert_with(Vec::new);
        v.reserve(n);
    } else {
        *slot = None;
    }
}

fn reserve(out: &mut Points, n: usize, extras: &Extras) {
    out.x.reserve(n);
    out.y.reserve(n);
    out.z.reserve(n);
    out.intensity.reserve(n);
    out.has_intensity = extras.intensity.is_some();
    keep_if(&mut out.ring, extras.ring.is_some(), n);
    keep_if(&mut out.time, extras.time.is_some(), n);
}

/// The decode loop; returns the number of points kept.
#[inline(always)]
fn run<R: XyzRead>(data: &[u8], g: &Geometry, xyz: &R, ex: &Extras, out: &mut Points) -> usize {
    let Points {
        x,
        y,
        z,
        intensity,
        ring,
        time,
        ..
    } = out;
    let mut ring = ring.as_mut().filter(|_| ex.ring.is_some());
    let mut time = time.as_mut().filter(|_| ex.time.is_some());
    for r in 0..g.height {
        let start = r * g.row_step;
        let row = &data[start..start + g.row_bytes];
        for p in row.chunks_exact(g.point_step) {
            let (px, py, pz) = xyz.read(p);
            let pi = match &ex.intensity {
                Some(a) => a.get_f32(p),
                None => 0.0,
            };
            // The network reads x, y, z and intensity: a NaN/Inf in any of them drops the point.
            if !(px.is_finite() && py.is_finite() && pz.is_finite() && pi.is_finite()) {
                continue;
            }
            x.push(px);
            y.push(py);
            z.push(pz);
            intensity.push(pi);
            if let (Some(a), Some(v)) = (&ex.ring, ring.as_deref_mut()) {
                v.push(a.get(p) as u16);
            }
            if let (Some((a, scale)), Some(v)) = (&ex.time, time.as_deref_mut()) {
                v.push((a.get(p) * scale) as f32);
            }
        }
    }
    x.len()
}

// ---------------------------------------------------------------------------------------------
// Encoding

/// Checks that every per-point array of `points` has one entry per point; returns the count.
fn check_points(points: &Points) -> Result<usize, CloudError> {
    let n = points.x.len();
    let check = |what: &'static str, len: usize| {
        if len == n {
            Ok(())
        } else {
            Err(CloudError::LengthMismatch {
                what,
                expected: n,
                actual: len,
            })
        }
    };
    check("points.y", points.y.len())?;
    check("points.z", points.z.len())?;
    // An intensity-less cloud may leave `intensity` empty instead of zero-filled.
    if points.has_intensity || !points.intensity.is_empty() {
        check("points.intensity", points.intensity.len())?;
    }
    if let Some(r) = &points.ring {
        check("points.ring", r.len())?;
    }
    if let Some(t) = &points.time {
        check("points.time", t.len())?;
    }
    Ok(n)
}

/// `n` points of `point_step` bytes as one row: (width, row_step, byte length).
fn row_geometry(n: usize, point_step: u32) -> Result<(u32, u32, usize), CloudError> {
    let too_many = || CloudError::SizeOverflow {
        what: format!(
            "{n} points × point_step {point_step} does not fit a PointCloud2 row (row_step is u32)"
        ),
    };
    let width = u32::try_from(n).map_err(|_| too_many())?;
    let row_step = width.checked_mul(point_step).ok_or_else(too_many)?;
    let len = usize::try_from(row_step).map_err(|_| too_many())?;
    Ok((width, row_step, len))
}

fn all_finite(points: &Points) -> bool {
    points
        .x
        .iter()
        .chain(&points.y)
        .chain(&points.z)
        .all(|v| v.is_finite())
}

/// Offsets of [`encode_labeled`]'s fields (packed, point_step [`LABELED_POINT_STEP`]).
pub const LABELED_CLASS_ID_OFFSET: u32 = 16;
/// Offset of the `probability` float32 in [`encode_labeled`]'s layout.
pub const LABELED_PROBABILITY_OFFSET: u32 = 17;
/// Bytes per point of [`encode_labeled`]'s layout.
pub const LABELED_POINT_STEP: u32 = 21;

/// The segmentation output, as Autoware's PTv3 segmentation node publishes it: fields
/// `x, y, z, intensity` float32 at 0, 4, 8, 12, `class_id` uint8 at 16, `probability` float32
/// at 17 (packed, unaligned); point_step 21, height 1, little endian. `is_dense` is true when
/// every x, y, z is finite (always so for [`decode`]'s output). Intensity is written as 0 when
/// `points` has none.
pub fn encode_labeled(
    points: &Points,
    class_id: &[u8],
    probability: &[f32],
) -> Result<CloudBuf, CloudError> {
    let n = check_points(points)?;
    if class_id.len() != n {
        return Err(CloudError::LengthMismatch {
            what: "class_id",
            expected: n,
            actual: class_id.len(),
        });
    }
    if probability.len() != n {
        return Err(CloudError::LengthMismatch {
            what: "probability",
            expected: n,
            actual: probability.len(),
        });
    }
    let (width, row_step, len) = row_geometry(n, LABELED_POINT_STEP)?;
    let mut data = vec![0u8; len];
    let has_i = points.intensity.len() == n;
    for (i, p) in data
        .chunks_exact_mut(LABELED_POINT_STEP as usize)
        .enumerate()
    {
        p[0..4].copy_from_slice(&points.x[i].to_le_bytes());
        p[4..8].copy_from_slice(&points.y[i].to_le_bytes());
        p[8..12].copy_from_slice(&points.z[i].to_le_bytes());
        let inten = if has_i { points.intensity[i] } else { 0.0 };
        p[12..16].copy_from_slice(&inten.to_le_bytes());
        p[16] = class_id[i];
        p[17..21].copy_from_slice(&probability[i].to_le_bytes());
    }
    use datatype::*;
    Ok(CloudBuf {
        height: 1,
        width,
        fields: vec![
            PointField::new("x", 0, FLOAT32),
            PointField::new("y", 4, FLOAT32),
            PointField::new("z", 8, FLOAT32),
            PointField::new("intensity", 12, FLOAT32),
            PointField::new("class_id", LABELED_CLASS_ID_OFFSET, UINT8),
            PointField::new("probability", LABELED_PROBABILITY_OFFSET, FLOAT32),
        ],
        is_bigendian: false,
        point_step: LABELED_POINT_STEP,
        row_step,
        data,
        is_dense: all_finite(points),
    })
}

/// Encodes `points` in `layout`, little endian. See [`Layout`] for each layout's fields.
pub fn encode_points(points: &Points, layout: Layout) -> Result<CloudBuf, CloudError> {
    encode_points_with(points, layout, false)
}

/// [`encode_points`] with a chosen byte order (`big_endian` sets `is_bigendian`).
pub fn encode_points_with(
    points: &Points,
    layout: Layout,
    big_endian: bool,
) -> Result<CloudBuf, CloudError> {
    let n = check_points(points)?;
    let step = layout.point_step();
    let (width, row_step, len) = row_geometry(n, step)?;
    let mut data = vec![0u8; len];
    let table = layout.table();
    let has_i = points.intensity.len() == n;
    for (i, p) in data.chunks_exact_mut(step as usize).enumerate() {
        for &(_, offset, dt, src) in table {
            let Some(kind) = Kind::from_datatype(dt) else {
                continue;
            };
            let v = match src {
                Source::X => points.x[i] as f64,
                Source::Y => points.y[i] as f64,
                Source::Z => points.z[i] as f64,
                Source::Intensity => {
                    if has_i {
                        points.intensity[i] as f64
                    } else {
                        0.0
                    }
                }
                Source::Ring => points.ring.as_ref().map_or(0.0, |r| r[i] as f64),
                Source::Time => {
                    let t = points.time.as_ref().map_or(0.0, |t| t[i] as f64);
                    if kind.is_float() {
                        t
                    } else {
                        t * 1e9
                    }
                }
                Source::Zero => 0.0,
            };
            put(p, offset as usize, kind, v, big_endian);
        }
    }
    Ok(CloudBuf {
        height: 1,
        width,
        fields: layout.fields(),
        is_bigendian: big_endian,
        point_step: step,
        row_step,
        data,
        is_dense: all_finite(points),
    })
}

// ---------------------------------------------------------------------------------------------
// Per-point values of one field (ground-truth labels, alignment masks)

/// Element 0 of the first field of `names` found in `view`, for **every** point in row order
/// (no point dropped, unlike [`decode`]), as `f64` (exact for every datatype). `Ok(None)` when
/// no such field exists. Replay reads ground-truth label clouds with it, and x/y/z to tell
/// which points [`decode`] dropped, so labels stay aligned point by point. The message
/// geometry is checked as [`decode`] checks it.
pub fn field_values(view: &CloudView, names: &[&str]) -> Result<Option<Vec<f64>>, CloudError> {
    let Some(field) = find(view.fields, names) else {
        return Ok(None);
    };
    if view.width == 0 || view.height == 0 {
        return Ok(Some(Vec::new()));
    }
    let (geom, total, _) = checked_geometry(view)?;
    let acc = resolve(field, view.point_step, view.is_bigendian)?;
    let mut out = Vec::with_capacity(total);
    for r in 0..geom.height {
        let row = &view.data[r * geom.row_step..r * geom.row_step + geom.row_bytes];
        out.extend(row.chunks_exact(geom.point_step).map(|p| acc.get(p)));
    }
    Ok(Some(out))
}

/// Per point of `view` (every point, row order): whether x, y, z and (when the cloud has one)
/// intensity are all finite, i.e. whether [`decode`] keeps it. `None` when x, y or z is missing
/// (decode fails on such a cloud).
pub fn finite_mask(view: &CloudView) -> Result<Option<Vec<bool>>, CloudError> {
    let (Some(x), Some(y), Some(z)) = (
        field_values(view, &["x"])?,
        field_values(view, &["y"])?,
        field_values(view, &["z"])?,
    ) else {
        return Ok(None);
    };
    let intensity = field_values(view, INTENSITY)?;
    // Decode compares the f32 values: round the same way.
    let fin = |v: f64| (v as f32).is_finite();
    Ok(Some(
        x.iter()
            .zip(&y)
            .zip(&z)
            .enumerate()
            .map(|(i, ((&a, &b), &c))| {
                fin(a) && fin(b) && fin(c) && intensity.as_ref().is_none_or(|v| fin(v[i]))
            })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KINDS: [u8; 8] = [
        datatype::INT8,
        datatype::UINT8,
        datatype::INT16,
        datatype::UINT16,
        datatype::INT32,
        datatype::UINT32,
        datatype::FLOAT32,
        datatype::FLOAT64,
    ];

    #[test]
    fn put_then_get_every_kind_both_byte_orders() {
        for dt in KINDS {
            let kind = Kind::from_datatype(dt).expect("known datatype");
            let size = datatype::size_of(dt).expect("known datatype") as usize;
            for big in [false, true] {
                for v in [0.0, 1.0, 100.0, 127.0, -3.0, 65535.0, -70000.5, 1e10] {
                    // 3 bytes in: unaligned on purpose.
                    let mut p = vec![0xAAu8; 3 + size + 2];
                    put(&mut p, 3, kind, v, big);
                    assert_eq!(&p[..3], &[0xAA; 3], "{kind:?} wrote before its offset");
                    assert_eq!(&p[3 + size..], &[0xAA; 2], "{kind:?} wrote past its size");
                    let got = Accessor {
                        offset: 3,
                        kind,
                        big,
                    }
                    .get(&p);
                    // What the type can hold: rounded, saturated, or f32-rounded.
                    let want = match kind {
                        Kind::I8 => v.round() as i8 as f64,
                        Kind::U8 => v.round() as u8 as f64,
                        Kind::I16 => v.round() as i16 as f64,
                        Kind::U16 => v.round() as u16 as f64,
                        Kind::I32 => v.round() as i32 as f64,
                        Kind::U32 => v.round() as u32 as f64,
                        Kind::F32 => v as f32 as f64,
                        Kind::F64 => v,
                    };
                    assert_eq!(got, want, "{kind:?} big {big} value {v}");
                }
            }
        }
    }

    #[test]
    fn fast_and_generic_xyz_readers_agree() {
        let mut p = vec![0u8; 20];
        for (k, v) in [1.5f32, -0.0, f32::NAN, 3.0e-39, f32::INFINITY]
            .iter()
            .enumerate()
        {
            p[4 * k..4 * k + 4].copy_from_slice(&v.to_le_bytes());
        }
        let acc = |offset| Accessor {
            offset,
            kind: Kind::F32,
            big: false,
        };
        for (x, y, z) in [(0, 4, 8), (8, 12, 16), (16, 0, 12)] {
            let a = LeF32 { x, y, z }.read(&p);
            let b = AnyXyz([acc(x), acc(y), acc(z)]).read(&p);
            let bits = |t: (f32, f32, f32)| (t.0.to_bits(), t.1.to_bits(), t.2.to_bits());
            assert_eq!(bits(a), bits(b));
        }
    }
}
