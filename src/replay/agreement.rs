//! `sptr eval agreement A B`: how often two replays gave the same class to a point, frame by
//! frame, from their output bags (`/sptr/output/points`, `class_id`), and, when they ran a BEV
//! map model, how often they set the same bits of the BEV map (`/sptr/output/bev/map_bits`, one
//! bit per class and cell at the class's threshold) and how far apart their class probabilities
//! are (`/sptr/output/bev/map/<class>`, 0..=100). This is the CPU-vs-CUDA check: replay a bag
//! with `--device cpu` and `--device cuda`, then compare (the targets: at least 99.5 % of points
//! and 99.9 % of map cells agreeing).

use std::path::{Path, PathBuf};

use crate::msgs::cdr::{CdrMessage, Image, OccupancyGrid, PointCloud2};
use crate::bag::Bag;
use crate::msgs::cloud::field_values;
use crate::frame::outputs::OutputTopics;

use super::ReplayError;

/// Agreement of one frame.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameAgreement {
    pub timestamp_ns: i64,
    pub points: u64,
    pub same: u64,
}

/// Agreement of two replays.
#[derive(Debug, Clone, PartialEq)]
pub struct Agreement {
    pub frames: Vec<FrameAgreement>,
    pub points: u64,
    pub same: u64,
    /// The BEV maps' agreement, when both replays wrote maps.
    pub map: Option<MapAgreement>,
}

/// Agreement of two replays' BEV maps over all frames.
#[derive(Debug, Clone, PartialEq)]
pub struct MapAgreement {
    pub frames: u64,
    pub classes: usize,
    /// Cells × classes compared, and how many had the same bit in `map_bits`.
    pub cell_bits: u64,
    pub same_bits: u64,
    /// The largest difference of a class probability (OccupancyGrid units: percent).
    pub max_probability_diff: u8,
}

impl MapAgreement {
    /// Fraction of (cell, class) pairs with the same thresholded value (`None` without cells).
    pub fn fraction(&self) -> Option<f64> {
        (self.cell_bits > 0).then(|| self.same_bits as f64 / self.cell_bits as f64)
    }
}

impl Agreement {
    /// Fraction of points with the same class (`None` without points).
    pub fn fraction(&self) -> Option<f64> {
        (self.points > 0).then(|| self.same as f64 / self.points as f64)
    }
}

/// `(receive time, class ids)` of every labeled cloud in a replay output (its directory or
/// its `bag/`).
fn output_bag_dir(out: &Path) -> PathBuf {
    if out.join("bag").join("metadata.yaml").is_file() {
        out.join("bag")
    } else {
        out.to_path_buf()
    }
}

fn class_ids(out: &Path) -> Result<Vec<(i64, Vec<f64>)>, ReplayError> {
    let dir = output_bag_dir(out);
    let bag = Bag::open(&dir)?;
    let topic = OutputTopics::default().points;
    let mut v = Vec::new();
    for m in bag.messages(&[topic.as_str()]) {
        let m = m?;
        let bad = |why: String| {
            ReplayError::Setup(format!(
                "{}: labeled cloud at {} ns: {why}",
                dir.display(),
                m.timestamp_ns
            ))
        };
        let c = PointCloud2::from_cdr(&m.data).map_err(|e| bad(e.to_string()))?;
        let ids = field_values(&c.view(), &["class_id"])
            .map_err(|e| bad(e.to_string()))?
            .ok_or_else(|| bad("no class_id field".into()))?;
        v.push((m.timestamp_ns, ids));
    }
    Ok(v)
}

/// Compares the labeled clouds of two replay outputs frame by frame (matched by receive time;
/// the frames and their point counts must be the same).
pub fn agreement(a: &Path, b: &Path) -> Result<Agreement, ReplayError> {
    let (ca, cb) = (class_ids(a)?, class_ids(b)?);
    if ca.len() != cb.len() {
        return Err(ReplayError::Setup(format!(
            "{} has {} labeled frames, {} has {}: compare replays of the same bag and shard",
            a.display(),
            ca.len(),
            b.display(),
            cb.len()
        )));
    }
    let mut out = Agreement {
        frames: Vec::new(),
        points: 0,
        same: 0,
        map: map_agreement(a, b)?,
    };
    for ((ta, la), (tb, lb)) in ca.iter().zip(&cb) {
        if ta != tb || la.len() != lb.len() {
            return Err(ReplayError::Setup(format!(
                "frame at {ta} ns ({} points) in {} meets frame at {tb} ns ({} points) in {}: not replays of the same frames",
                la.len(),
                a.display(),
                lb.len(),
                b.display()
            )));
        }
        let same = la.iter().zip(lb).filter(|(x, y)| x == y).count() as u64;
        out.frames.push(FrameAgreement {
            timestamp_ns: *ta,
            points: la.len() as u64,
            same,
        });
        out.points += la.len() as u64;
        out.same += same;
    }
    Ok(out)
}

const MAP_BITS_TOPIC: &str = "/sptr/output/bev/map_bits";
const MAP_GRID_PREFIX: &str = "/sptr/output/bev/map/";

/// One replay's BEV map messages: the bit images and, per class topic (sorted), the grids.
struct ReplayMaps {
    bits: Vec<(i64, Image)>,
    grids: Vec<(String, Vec<(i64, OccupancyGrid)>)>,
}

fn replay_maps(out: &Path) -> Result<Option<ReplayMaps>, ReplayError> {
    let dir = output_bag_dir(out);
    let bag = Bag::open(&dir)?;
    let mut grid_topics: Vec<String> =
        bag.topics().iter().map(|t| t.name.clone()).filter(|n| n.starts_with(MAP_GRID_PREFIX)).collect();
    grid_topics.sort();
    if !bag.topics().iter().any(|t| t.name == MAP_BITS_TOPIC) {
        return Ok(None);
    }
    let bad = |ns: i64, topic: &str, why: String| {
        ReplayError::Setup(format!("{}: {topic} at {ns} ns: {why}", dir.display()))
    };
    let mut bits = Vec::new();
    for m in bag.messages(&[MAP_BITS_TOPIC]) {
        let m = m?;
        let img = Image::from_cdr(&m.data).map_err(|e| bad(m.timestamp_ns, MAP_BITS_TOPIC, e.to_string()))?;
        if img.encoding != "mono8" || img.data.len() != img.height as usize * img.width as usize {
            return Err(bad(
                m.timestamp_ns,
                MAP_BITS_TOPIC,
                format!("expected a packed mono8 image, got {} {}x{} with {} bytes", img.encoding, img.width, img.height, img.data.len()),
            ));
        }
        bits.push((m.timestamp_ns, img));
    }
    let mut grids = Vec::new();
    for topic in grid_topics {
        let mut v = Vec::new();
        for m in bag.messages(&[topic.as_str()]) {
            let m = m?;
            let g = OccupancyGrid::from_cdr(&m.data).map_err(|e| bad(m.timestamp_ns, &topic, e.to_string()))?;
            v.push((m.timestamp_ns, g));
        }
        grids.push((topic, v));
    }
    Ok(Some(ReplayMaps { bits, grids }))
}

/// Compares the BEV maps of two replays frame by frame; `None` when neither wrote maps, an error
/// when only one did or their frames, classes or grid sizes differ.
pub fn map_agreement(a: &Path, b: &Path) -> Result<Option<MapAgreement>, ReplayError> {
    let (ma, mb) = match (replay_maps(a)?, replay_maps(b)?) {
        (None, None) => return Ok(None),
        (Some(x), Some(y)) => (x, y),
        (x, _) => {
            let (with, without) = if x.is_some() { (a, b) } else { (b, a) };
            return Err(ReplayError::Setup(format!(
                "{} has BEV maps and {} has none: replay both with the same --camera-model (or compare only LiDAR replays)",
                with.display(),
                without.display()
            )));
        }
    };
    let mismatch = |what: String| ReplayError::Setup(format!("BEV maps of {} and {}: {what}", a.display(), b.display()));
    let names = |m: &ReplayMaps| m.grids.iter().map(|(t, _)| t.clone()).collect::<Vec<_>>();
    if names(&ma) != names(&mb) {
        return Err(mismatch(format!("different classes {:?} and {:?}", names(&ma), names(&mb))));
    }
    if ma.bits.len() != mb.bits.len() {
        return Err(mismatch(format!("{} and {} map frames", ma.bits.len(), mb.bits.len())));
    }
    let classes = ma.grids.len();
    let mask: u8 = if classes >= 8 { 0xff } else { (1u16 << classes) as u8 - 1 };
    let mut out = MapAgreement { frames: 0, classes, cell_bits: 0, same_bits: 0, max_probability_diff: 0 };
    for ((ta, ia), (tb, ib)) in ma.bits.iter().zip(&mb.bits) {
        if ta != tb || (ia.width, ia.height) != (ib.width, ib.height) {
            return Err(mismatch(format!(
                "frame at {ta} ns ({}x{}) meets frame at {tb} ns ({}x{}): not replays of the same frames",
                ia.width, ia.height, ib.width, ib.height
            )));
        }
        for (x, y) in ia.data.iter().zip(&ib.data) {
            out.same_bits += u64::from(classes as u32 - ((x ^ y) & mask).count_ones());
        }
        out.cell_bits += ia.data.len() as u64 * classes as u64;
        out.frames += 1;
    }
    for ((topic, ga), (_, gb)) in ma.grids.iter().zip(&mb.grids) {
        if ga.len() != gb.len() {
            return Err(mismatch(format!("{topic}: {} and {} messages", ga.len(), gb.len())));
        }
        for ((ta, x), (tb, y)) in ga.iter().zip(gb) {
            if ta != tb || x.data.len() != y.data.len() {
                return Err(mismatch(format!("{topic}: message at {ta} ns ({} cells) meets one at {tb} ns ({} cells)", x.data.len(), y.data.len())));
            }
            for (p, q) in x.data.iter().zip(&y.data) {
                out.max_probability_diff = out.max_probability_diff.max((i16::from(*p) - i16::from(*q)).unsigned_abs() as u8);
            }
        }
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgs::cdr::Time;
    use crate::bag::BagWriter;
    use crate::models::bevfusion::map::BevMap;
    use crate::frame::map_messages::{class_topic_token, map_messages, MapStyle};

    /// Writes a replay-like output bag with one BEV map per entry of `maps` (frame k at k ms).
    fn write_maps(dir: &Path, maps: &[BevMap]) {
        let style = MapStyle { thresholds: vec![0.5, 0.4], palette: vec![[255, 0, 0], [0, 255, 0]] };
        let mut w = BagWriter::create(dir).unwrap();
        for c in &maps[0].classes {
            w.add_topic(&format!("{MAP_GRID_PREFIX}{}", class_topic_token(c)), OccupancyGrid::TYPE_NAME).unwrap();
        }
        w.add_topic(MAP_BITS_TOPIC, Image::TYPE_NAME).unwrap();
        for (k, m) in maps.iter().enumerate() {
            let ns = k as i64 * 1_000_000;
            let msgs = map_messages(m, &style, Time { sec: 0, nanosec: ns as u32 }, "lidar", "base_link").unwrap();
            for (c, g) in m.classes.iter().zip(&msgs.grids) {
                w.write(&format!("{MAP_GRID_PREFIX}{}", class_topic_token(c)), ns, &g.to_cdr(true).unwrap()).unwrap();
            }
            w.write(MAP_BITS_TOPIC, ns, &msgs.bits.to_cdr(true).unwrap()).unwrap();
        }
        w.finish().unwrap();
    }

    fn map(values: &[(usize, usize, usize, f32)]) -> BevMap {
        let mut m = BevMap::zeros(&["drivable_area", "walkway"], 4, 3, 1.0, [0.0, 0.0]).unwrap();
        for &(c, x, y, v) in values {
            m.probabilities[c * 12 + x * 3 + y] = v;
        }
        m
    }

    fn temp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sptr_map_agreement_{}_{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// Two frames of 2 classes x 12 cells = 48 bits; the second replay differs in exactly two:
    /// frame 0 class 0 (0.6 vs 0.45 at threshold 0.5) and frame 1 class 1 (0.3 vs 0.41 at 0.4);
    /// a third value changes by 0.09 without crossing its threshold (counted as agreeing, and
    /// the largest probability gap is the 15 points of the first difference).
    #[test]
    fn counts_the_cells_whose_thresholded_value_differs() {
        let (a, b) = (temp("a"), temp("b"));
        write_maps(&a, &[map(&[(0, 1, 2, 0.6), (1, 0, 0, 0.9)]), map(&[(1, 3, 1, 0.3)])]);
        write_maps(&b, &[map(&[(0, 1, 2, 0.45), (1, 0, 0, 0.81)]), map(&[(1, 3, 1, 0.41)])]);
        let m = map_agreement(&a, &b).unwrap().expect("both have maps");
        assert_eq!((m.frames, m.classes, m.cell_bits, m.same_bits), (2, 2, 48, 46));
        assert_eq!(m.max_probability_diff, 15);
        let same = map_agreement(&a, &a).unwrap().unwrap();
        assert_eq!((same.same_bits, same.max_probability_diff), (48, 0));
        assert_eq!(same.fraction(), Some(1.0));
    }

    #[test]
    fn refuses_maps_of_different_frames_or_a_replay_without_maps() {
        let (a, b, none) = (temp("fa"), temp("fb"), temp("none"));
        write_maps(&a, &[map(&[]), map(&[])]);
        write_maps(&b, &[map(&[])]);
        let e = map_agreement(&a, &b).unwrap_err().to_string();
        assert!(e.contains("2 and 1 map frames"), "{e}");
        let mut w = BagWriter::create(&none).unwrap();
        w.add_topic("/sptr/output/points", PointCloud2::TYPE_NAME).unwrap();
        w.finish().unwrap();
        let e = map_agreement(&a, &none).unwrap_err().to_string();
        assert!(e.contains("has BEV maps and") && e.contains("has none"), "{e}");
        assert_eq!(map_agreement(&none, &none).unwrap(), None);
    }
}
