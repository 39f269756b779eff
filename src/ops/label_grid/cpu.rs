//! Labeled points -> BEV grids: a class per cell (`labels`, mono8), its palette colour (`rgb`,
//! rgb8) and an occupancy grid (0-100, -1 unknown), in the layout of `nav_msgs/OccupancyGrid`:
//! row-major, cell `(ix, iy)` at `iy * width + ix`, cell (0, 0) at (`xmin`, `ymin`), x along a row.
//!
//! Which class wins a cell: a confidence-weighted majority vote. Each point votes for its class
//! with weight `1 + round(p * 65535)` (p its probability clamped to [0, 1]); the class with the
//! most votes wins, ties to the lowest id. Why not the single highest-probability point: one
//! confident outlier (a mislabeled return, a bird) would repaint a cell that fifty other points
//! agree on; why not a plain count: a few confident points should outweigh many uncertain ones.
//! The `1 +` keeps every point in the vote even at p = 0. Votes are integers, so the CUDA path
//! (atomics in any order) gives exactly these grids.
//!
//! Occupancy = round(100 * votes for obstacle classes / all votes): graded, so a cell where half
//! the points say "car" and half "road" reads 50, not a hard 0 or 100.

use crate::Error;

/// No data in the cell (mono8 value).
pub const NO_DATA: u8 = 255;

#[derive(Debug, Clone, PartialEq)]
pub struct BevGridParams {
    /// `[xmin, ymin, xmax, ymax]` metres, in the grid's frame.
    pub range: [f64; 4],
    pub resolution: f64,
    pub classes: usize,
    pub obstacle_classes: Vec<u8>,
    /// RGB per class, `classes` entries.
    pub palette: Vec<[u8; 3]>,
}

impl BevGridParams {
    pub fn width(&self) -> usize {
        ((self.range[2] - self.range[0]) / self.resolution).ceil() as usize
    }
    pub fn height(&self) -> usize {
        ((self.range[3] - self.range[1]) / self.resolution).ceil() as usize
    }

    pub fn validate(&self) -> Result<(), Error> {
        let r = self.range;
        if !(r.iter().all(|v| v.is_finite()) && r[0] < r[2] && r[1] < r[3]) {
            return Err(Error::InvalidInput(format!("BEV range must be [xmin, ymin, xmax, ymax] with min < max, got {r:?}")));
        }
        if !(self.resolution.is_finite() && self.resolution > 0.0) {
            return Err(Error::InvalidInput(format!("BEV resolution must be positive, got {}", self.resolution)));
        }
        if self.width() * self.height() > 16_000_000 {
            return Err(Error::InvalidInput(format!("BEV grid of {} x {} cells is over 16 million", self.width(), self.height())));
        }
        if !(1..=255).contains(&self.classes) {
            return Err(Error::InvalidInput(format!("BEV grid needs 1..=255 classes, got {}", self.classes)));
        }
        if self.palette.len() != self.classes {
            return Err(Error::InvalidInput(format!("palette has {} colours for {} classes", self.palette.len(), self.classes)));
        }
        if let Some(c) = self.obstacle_classes.iter().find(|&&c| c as usize >= self.classes) {
            return Err(Error::InvalidInput(format!("obstacle class {c} is not below the class count {}", self.classes)));
        }
        Ok(())
    }

    /// Obstacle classes as a 256-bit mask (8 words), the kernel's form.
    pub fn obstacle_bits(&self) -> [u32; 8] {
        let mut bits = [0u32; 8];
        for &c in &self.obstacle_classes {
            bits[c as usize >> 5] |= 1 << (c & 31);
        }
        bits
    }
}

/// The three grids, `width * height` cells each (`rgb` three bytes a cell).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BevGrids {
    pub width: usize,
    pub height: usize,
    pub labels: Vec<u8>,
    pub rgb: Vec<u8>,
    pub occupancy: Vec<i8>,
}

/// Cell of (x, y) or None: the same float arithmetic as `bev_cell` in kernels/ops/label_grid.cu.
pub(crate) fn cell_of(xmin: f32, ymin: f32, res: f32, w: usize, h: usize, x: f32, y: f32) -> Option<usize> {
    if !(x.is_finite() && y.is_finite()) {
        return None;
    }
    let fx = ((x - xmin) / res).floor();
    let fy = ((y - ymin) / res).floor();
    if !(fx >= 0.0 && fy >= 0.0 && fx < w as f32 && fy < h as f32) {
        return None;
    }
    Some(fy as usize * w + fx as usize)
}

/// Vote weight of a point with probability `p` (see module doc).
pub(crate) fn vote_weight(p: f32) -> u64 {
    let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
    1 + (p * 65535.0).round_ties_even() as u64
}

/// CPU reference. `x`, `y`, `class_id`, `prob` are per point; points outside the grid, with a
/// class id not below `classes`, or non-finite x/y are ignored.
pub fn label_grid_cpu(x: &[f32], y: &[f32], class_id: &[u8], prob: &[f32], p: &BevGridParams) -> Result<BevGrids, Error> {
    p.validate()?;
    let n = x.len();
    if y.len() != n || class_id.len() != n || prob.len() != n {
        return Err(Error::InvalidInput(format!(
            "BEV grid: x, y, class_id, probability lengths differ ({n}, {}, {}, {})",
            y.len(),
            class_id.len(),
            prob.len()
        )));
    }
    let (w, h, k) = (p.width(), p.height(), p.classes);
    let (xmin, ymin, res) = (p.range[0] as f32, p.range[1] as f32, p.resolution as f32);
    let mut votes = vec![0u64; w * h * k];
    for i in 0..n {
        let c = class_id[i] as usize;
        if c >= k {
            continue;
        }
        if let Some(cell) = cell_of(xmin, ymin, res, w, h, x[i], y[i]) {
            votes[cell * k + c] += vote_weight(prob[i]);
        }
    }
    let obstacle = p.obstacle_bits();
    let mut g = BevGrids { width: w, height: h, labels: vec![NO_DATA; w * h], rgb: vec![0; w * h * 3], occupancy: vec![-1; w * h] };
    for cell in 0..w * h {
        let v = &votes[cell * k..(cell + 1) * k];
        let (mut best, mut best_c, mut total, mut obs) = (0u64, None, 0u64, 0u64);
        for (c, &wt) in v.iter().enumerate() {
            total += wt;
            if obstacle[c >> 5] >> (c & 31) & 1 == 1 {
                obs += wt;
            }
            if wt > best {
                best = wt;
                best_c = Some(c);
            }
        }
        if let Some(c) = best_c {
            g.labels[cell] = c as u8;
            g.rgb[cell * 3..cell * 3 + 3].copy_from_slice(&p.palette[c]);
            g.occupancy[cell] = ((200 * obs + total) / (2 * total)) as i8;
        }
    }
    Ok(g)
}
