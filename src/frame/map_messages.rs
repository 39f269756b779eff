//! The messages of a [`BevMap`], for the node (converted field for field to r2r types) and
//! replay (written to the output bag as they are):
//!
//! - per class a `nav_msgs/OccupancyGrid` (topic `~/output/bev/map/<class>`): the probability
//!   as 0..=100 (`round(100 p)`, clamped), -1 where it is NaN (unknown), so rviz and Foxglove
//!   show it as is;
//! - a `mono8` `sensor_msgs/Image` (`~/output/bev/map_bits`): bit `c` of a cell set when class
//!   `c`'s probability is at least its threshold (at most 8 classes);
//! - an `rgb8` image (`~/output/bev/map_color`): each cell the palette colour of the last class
//!   (in class order) at or above its threshold, black where none is, so lines (upstream's
//!   `divider`, last) are drawn over areas (`drivable_area`, first).
//!
//! Every one is row-major with `width = nx` (x along a row) and `height = ny`, cell (0, 0) at
//! the map's origin, as the LiDAR label grids ([`crate::frame::messages`]): one layout for every BEV
//! message of the node. Header: the cloud's stamp, the frame [`crate::frame::messages::bev_frame_id`]
//! picks (`bev.frame_id`, or the cloud's frame when empty). No transform is applied: the map is
//! in the LiDAR frame the model saw.

use rayon::prelude::*;
use crate::msgs::cdr::{Header, Image, MapMetaData, OccupancyGrid, Pose, Time};
use crate::models::bevfusion::map::BevMap;
use crate::frame::messages::bev_frame_id;
use crate::Error;

/// How a map is drawn: a threshold and a colour per class.
#[derive(Debug, Clone, PartialEq)]
pub struct MapStyle {
    /// Per class, in 0..=1: a cell is that class when its probability is at least this.
    pub thresholds: Vec<f32>,
    pub palette: Vec<[u8; 3]>,
}

impl MapStyle {
    /// Checks the style against a map of `classes` classes: one finite threshold in 0..=1 and
    /// one colour per class, at most 8 classes (one bit each in the mono8 image).
    pub fn check(&self, classes: usize) -> Result<(), Error> {
        if classes > 8 {
            return Err(Error::InvalidInput(format!("BEV map of {classes} classes: the mono8 bit image holds at most 8")));
        }
        if self.thresholds.len() != classes || self.palette.len() != classes {
            return Err(Error::InvalidInput(format!(
                "BEV map of {classes} classes drawn with {} thresholds and {} colours",
                self.thresholds.len(),
                self.palette.len()
            )));
        }
        if let Some(t) = self.thresholds.iter().find(|t| !(0.0..=1.0).contains(*t)) {
            return Err(Error::InvalidInput(format!("BEV map threshold {t} is not in 0..=1")));
        }
        Ok(())
    }
}

/// `src` (`rows` x `cols`, row-major) transposed into `dst` (`cols` x `rows`), in square tiles so
/// that both sides stay in cache.
fn transpose<T: Copy>(src: &[T], rows: usize, cols: usize, dst: &mut [T]) {
    const TILE: usize = 32;
    debug_assert!(src.len() == rows * cols && dst.len() == rows * cols);
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * rows + r] = src[r * cols + c];
                }
            }
        }
    }
}

/// The messages of one map.
#[derive(Debug, Clone, PartialEq)]
pub struct MapMessages {
    /// One grid per class, in class order.
    pub grids: Vec<OccupancyGrid>,
    /// mono8, one bit per class.
    pub bits: Image,
    /// rgb8.
    pub color: Image,
}

/// `p` as an OccupancyGrid cell: `round(100 p)` clamped to 0..=100, -1 for NaN.
pub fn occupancy_value(p: f32) -> i8 {
    let x = p * 100.0;
    if x.is_nan() {
        -1
    } else if x <= 0.0 {
        0
    } else if x >= 100.0 {
        100
    } else {
        // round() half away from zero, without the libm call `f32::round` makes on a target
        // without SSE4.1 (1 ms a frame for 240,000 cells): x - trunc(x) is exact below 2^23.
        let t = x as i32;
        (t + i32::from(x - t as f32 >= 0.5)) as i8
    }
}

/// The topic suffix of class `name` under `~/output/bev/map/`: the name with every character
/// other than an ASCII letter, digit or `_` replaced by `_` (a valid ROS name token).
pub fn class_topic_token(name: &str) -> String {
    let s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        format!("c_{s}")
    } else {
        s
    }
}

/// The messages of `map` (see the module doc) for a cloud stamped `stamp` in `cloud_frame_id`;
/// `bev_frame` is the `bev.frame_id` parameter.
pub fn map_messages(map: &BevMap, style: &MapStyle, stamp: Time, cloud_frame_id: &str, bev_frame: &str) -> Result<MapMessages, Error> {
    map.check()?;
    style.check(map.classes.len())?;
    let (nx, ny) = (map.nx, map.ny);
    let too_big = || Error::InvalidInput(format!("BEV map of {nx} x {ny} cells is too large for a message"));
    let width = u32::try_from(nx).map_err(|_| too_big())?;
    let height = u32::try_from(ny).map_err(|_| too_big())?;
    let step3 = width.checked_mul(3).ok_or_else(too_big)?;
    let header = Header { stamp, frame_id: bev_frame_id(bev_frame, cloud_frame_id).to_string() };
    let info = MapMetaData {
        map_load_time: stamp,
        resolution: map.resolution as f32,
        width,
        height,
        origin: Pose { position: [map.x_range[0], map.y_range[0], 0.0], orientation: [0.0, 0.0, 0.0, 1.0] },
    };
    let cells = nx * ny;
    // Message cell (row y, column x) = map cell (x, y). Each class plane is read once in its own
    // order (x-major, contiguous) into x-major values and its class bit, which are then transposed
    // in tiles (a cell-by-cell transposed write costs a cache miss per cell: 2 ms a frame on the
    // H100 host for 6 x 200 x 200 cells). The classes are independent: one rayon task each (1.3 ms
    // a frame on one core of the H100 host for 6 classes).
    let planes = (0..map.classes.len()).map(|c| map.class_plane(c).ok_or_else(too_big)).collect::<Result<Vec<_>, _>>()?;
    let per_class: Vec<(Vec<i8>, Vec<u8>)> = planes
        .par_iter()
        .enumerate()
        .map(|(c, plane)| {
            let t = style.thresholds[c];
            let mut x_major = vec![0i8; cells];
            let mut bit_x_major = vec![0u8; cells];
            for ((v, b), &p) in x_major.iter_mut().zip(bit_x_major.iter_mut()).zip(plane.iter()) {
                *v = occupancy_value(p);
                // NaN >= t is false: an unknown cell has no class
                *b = u8::from(p >= t) << c;
            }
            let mut data = vec![0i8; cells];
            transpose(&x_major, nx, ny, &mut data);
            (data, bit_x_major)
        })
        .collect();
    let mut bits_x_major = vec![0u8; cells];
    let mut grids: Vec<Vec<i8>> = Vec::with_capacity(per_class.len());
    for (data, bit) in per_class {
        for (b, v) in bits_x_major.iter_mut().zip(&bit) {
            *b |= v;
        }
        grids.push(data);
    }
    let mut bits = vec![0u8; cells];
    transpose(&bits_x_major, nx, ny, &mut bits);
    // The last class (highest bit) at or above its threshold gives the colour.
    let mut rgb = vec![0u8; cells * 3];
    for (px, &b) in rgb.chunks_exact_mut(3).zip(&bits) {
        if b != 0 {
            px.copy_from_slice(&style.palette[7 - b.leading_zeros() as usize]);
        }
    }
    let grids: Vec<OccupancyGrid> = grids.into_iter().map(|data| OccupancyGrid { header: header.clone(), info, data }).collect();
    let image = |encoding: &str, step: u32, data: Vec<u8>| Image {
        header: header.clone(),
        height,
        width,
        encoding: encoding.to_string(),
        is_bigendian: 0,
        step,
        data,
    };
    Ok(MapMessages { grids, bits: image("mono8", width, bits), color: image("rgb8", step3, rgb) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::cdr::CdrMessage;

    /// 3 x 2 cells, two classes; class 0 rises along x, class 1 is high only at (2, 1).
    fn map() -> BevMap {
        let mut m = BevMap::zeros(&["drivable_area", "divider"], 3, 2, 0.5, [-1.0, -0.5]).unwrap();
        // [class][x][y]
        let c0 = [[0.0, 0.1], [0.5, 0.449], [0.996, f32::NAN]];
        for x in 0..3 {
            for y in 0..2 {
                m.probabilities[x * 2 + y] = c0[x][y];
            }
        }
        m.probabilities[6 + 2 * 2 + 1] = 0.9; // class 1, x 2, y 1
        m.probabilities[6] = 1.5; // class 1, x 0, y 0: out of 0..1, clamped in the grid
        m
    }

    fn style() -> MapStyle {
        MapStyle { thresholds: vec![0.45, 0.5], palette: vec![[1, 2, 3], [7, 8, 9]] }
    }

    #[test]
    fn occupancy_value_rounds_like_f32_round() {
        let mut p = -0.01f32;
        while p <= 1.01 {
            for q in [p, f32::from_bits(p.to_bits() + 1), f32::from_bits(p.to_bits().saturating_sub(1))] {
                let want = if q.is_nan() { -1 } else { (q * 100.0).round().clamp(0.0, 100.0) as i8 };
                assert_eq!(occupancy_value(q), want, "p = {q:e}");
            }
            p += 0.00005;
        }
        for (q, want) in [(0.005f32, 1i8), (0.004999, 0), (0.995, 100), (f32::NAN, -1), (f32::INFINITY, 100), (f32::NEG_INFINITY, 0), (-0.0, 0), (2.0, 100)] {
            assert_eq!(occupancy_value(q), want, "p = {q}");
        }
    }

    #[test]
    fn transposed_in_tiles_like_cell_by_cell() {
        for (rows, cols) in [(1, 1), (3, 70), (65, 33), (200, 200)] {
            let src: Vec<u32> = (0..(rows * cols) as u32).collect();
            let mut dst = vec![0u32; rows * cols];
            transpose(&src, rows, cols, &mut dst);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(dst[c * rows + r], src[r * cols + c]);
                }
            }
        }
    }

    #[test]
    fn byte_layout_of_grids_and_images() {
        let stamp = Time { sec: 5, nanosec: 6 };
        let m = map_messages(&map(), &style(), stamp, "lidar_top", "").unwrap();
        assert_eq!(m.grids.len(), 2);
        let g = &m.grids[0];
        assert_eq!(g.header, Header { stamp, frame_id: "lidar_top".into() });
        assert_eq!((g.info.width, g.info.height, g.info.resolution), (3, 2, 0.5));
        assert_eq!(g.info.origin.position, [-1.0, -0.5, 0.0]);
        assert_eq!(g.info.map_load_time, stamp);
        // rows are y, columns x
        assert_eq!(g.data, vec![0, 50, 100, 10, 45, -1]);
        assert_eq!(m.grids[1].data, vec![100, 0, 0, 0, 0, 90]);
        // bits: class 0 >= 0.45 at (1,0), (2,0); class 1 >= 0.5 at (0,0), (2,1); NaN none
        assert_eq!((m.bits.encoding.as_str(), m.bits.width, m.bits.height, m.bits.step), ("mono8", 3, 2, 3));
        assert_eq!(m.bits.data, vec![0b10, 0b01, 0b01, 0, 0, 0b10]);
        assert_eq!((m.color.encoding.as_str(), m.color.step), ("rgb8", 9));
        assert_eq!(m.color.data, vec![7, 8, 9, 1, 2, 3, 1, 2, 3, 0, 0, 0, 0, 0, 0, 7, 8, 9]);
        // the frame: bev.frame_id when set
        let m2 = map_messages(&map(), &style(), stamp, "lidar_top", "base_link").unwrap();
        assert_eq!(m2.bits.header.frame_id, "base_link");
        // and they encode as CDR and back
        let back = OccupancyGrid::from_cdr(&g.to_cdr(true).unwrap()).unwrap();
        assert_eq!(&back, g);
        assert_eq!(Image::from_cdr(&m.color.to_cdr(false).unwrap()).unwrap(), m.color);
    }

    #[test]
    fn occupancy_values() {
        assert_eq!(occupancy_value(0.0), 0);
        assert_eq!(occupancy_value(0.004), 0);
        assert_eq!(occupancy_value(0.005), 1);
        assert_eq!(occupancy_value(1.0), 100);
        assert_eq!(occupancy_value(-0.2), 0);
        assert_eq!(occupancy_value(f32::INFINITY), 100);
        assert_eq!(occupancy_value(f32::NAN), -1);
    }

    #[test]
    fn bad_styles_and_maps_are_errors() {
        let s = |t: Vec<f32>, p: usize| MapStyle { thresholds: t, palette: vec![[0; 3]; p] };
        for (st, needle) in [
            (s(vec![0.5], 2), "1 thresholds"),
            (s(vec![0.5, 0.5], 1), "1 colours"),
            (s(vec![0.5, 1.5], 2), "1.5"),
            (s(vec![0.5, f32::NAN], 2), "NaN"),
        ] {
            let e = map_messages(&map(), &st, Time::default(), "l", "").unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        let names: Vec<String> = (0..9).map(|i| format!("c{i}")).collect();
        let refs: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        let nine = BevMap::zeros(&refs, 1, 1, 1.0, [0.0; 2]).unwrap();
        let e = map_messages(&nine, &s(vec![0.5; 9], 9), Time::default(), "l", "").unwrap_err().to_string();
        assert!(e.contains("at most 8"), "{e}");
        let mut broken = map();
        broken.probabilities.pop();
        assert!(map_messages(&broken, &style(), Time::default(), "l", "").is_err());
    }

    #[test]
    fn class_topic_tokens() {
        assert_eq!(class_topic_token("drivable_area"), "drivable_area");
        assert_eq!(class_topic_token("ped-crossing 2"), "ped_crossing_2");
        assert_eq!(class_topic_token("2d"), "c_2d");
        assert_eq!(class_topic_token(""), "c_");
    }
}
