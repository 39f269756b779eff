//! Window partition: which voxels attend to each other.
//!
//! A window is the set of voxels of one batch whose positions fall in the same cell of a grid of
//! `window`-sized cells. Upstream (sptr's `get_indices_params` → torch_geometric `voxel_grid` →
//! torch_cluster `grid`) computes the cell per axis as `trunc((p - start) / window)` in float32,
//! with `start` the minimum over all positions of the call (all batches together); with a
//! half-window shift the positions are shifted by `window / 2` while `start` stays the unshifted
//! minimum. The batch index is a fourth, most significant, grid axis.
//!
//! The partition is a permutation of the voxels grouped window after window (`order`) plus the
//! window boundaries (`offsets`), the varlen layout the attention kernel reads. Windows are in
//! (batch, z, y, x) cell order and the voxels of a window in ascending index order: neither order
//! changes the attention, only the layout.

use crate::ops::attention::rpe::min_position;
use crate::Error;

/// Voxels grouped by window: window `w` holds `order[offsets[w]..offsets[w + 1]]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Partition {
    pub order: Vec<u32>,
    pub offsets: Vec<u32>,
}

impl Partition {
    /// Number of windows.
    pub fn windows(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Voxels in window `w`.
    pub fn window(&self, w: usize) -> &[u32] {
        &self.order[self.offsets[w] as usize..self.offsets[w + 1] as usize]
    }

    /// Size of the largest window (0 when empty).
    pub fn n_max(&self) -> usize {
        self.offsets.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0)
    }

    /// Σ n_i²: the (query, key) pairs a materializing implementation stores.
    pub fn pair_count(&self) -> u64 {
        self.offsets.windows(2).map(|w| ((w[1] - w[0]) as u64).pow(2)).sum()
    }

    /// For every voxel, the size of its window (a layout-independent fingerprint of the partition).
    pub fn window_size_of_each(&self, n: usize) -> Vec<u32> {
        let mut out = vec![0u32; n];
        for w in 0..self.windows() {
            let members = self.window(w);
            for &v in members {
                out[v as usize] = members.len() as u32;
            }
        }
        out
    }

    /// Checks that the partition is a permutation of `0..n` with increasing offsets.
    pub fn validate(&self, n: usize) -> Result<(), Error> {
        if self.order.len() != n
            || self.offsets.first() != Some(&0)
            || self.offsets.last().map(|&x| x as usize) != Some(n)
            || self.offsets.windows(2).any(|w| w[1] <= w[0])
        {
            return Err(Error::InvalidInput(format!(
                "window partition: {} voxels in order and offsets ending at {:?} for {n} voxels",
                self.order.len(),
                self.offsets.last()
            )));
        }
        let mut seen = vec![false; n];
        for &v in &self.order {
            let v = v as usize;
            if v >= n || seen[v] {
                return Err(Error::InvalidInput(format!(
                    "window partition: voxel {v} missing or repeated"
                )));
            }
            seen[v] = true;
        }
        Ok(())
    }
}

/// The window cell of every voxel: `[batch, cz, cy, cx]` (upstream's float32 arithmetic).
pub fn window_cells(
    pos: &[[f32; 3]],
    batch: &[i32],
    window: [f32; 3],
    shift: bool,
) -> Result<Vec<[i64; 4]>, Error> {
    if pos.len() != batch.len() {
        return Err(Error::InvalidInput(format!(
            "window partition: {} positions but {} batch indices",
            pos.len(),
            batch.len()
        )));
    }
    if window.iter().any(|w| !(w.is_finite() && *w > 0.0)) {
        return Err(Error::InvalidInput(format!(
            "window partition: window {window:?} must be finite and > 0"
        )));
    }
    if let Some(b) = batch.iter().find(|&&b| b < 0) {
        return Err(Error::InvalidInput(format!("window partition: negative batch index {b}")));
    }
    let start = min_position(pos)?;
    Ok(pos
        .iter()
        .zip(batch)
        .map(|(p, &b)| {
            let mut c = [b as i64, 0, 0, 0];
            for a in 0..3 {
                let shifted = if shift { p[a] + 0.5 * window[a] } else { p[a] };
                // `as i64` truncates toward zero like torch's `.to(torch.long)`
                c[3 - a] = ((shifted - start[a]) / window[a]) as i64;
            }
            c
        })
        .collect())
}

/// Groups voxels into windows of size `window` (see the module notes).
pub fn window_partition(
    pos: &[[f32; 3]],
    batch: &[i32],
    window: [f32; 3],
    shift: bool,
) -> Result<Partition, Error> {
    if pos.len() > u32::MAX as usize {
        return Err(Error::InvalidInput(format!(
            "window partition: {} voxels exceed the 32-bit index range",
            pos.len()
        )));
    }
    let cells = window_cells(pos, batch, window, shift)?;
    Ok(partition_by_key(&cells))
}

/// Groups indices by equal key, keys ascending, indices ascending within a group.
pub fn partition_by_key<K: Ord + Copy>(keys: &[K]) -> Partition {
    let mut order: Vec<u32> = (0..keys.len() as u32).collect();
    order.sort_by_key(|&i| (keys[i as usize], i));
    let mut offsets = Vec::with_capacity(keys.len() / 4 + 2);
    offsets.push(0u32);
    for i in 1..order.len() {
        if keys[order[i] as usize] != keys[order[i - 1] as usize] {
            offsets.push(i as u32);
        }
    }
    if !order.is_empty() {
        offsets.push(order.len() as u32);
    }
    Partition { order, offsets }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_by_cell_and_batch() {
        let pos = [[0.0, 0.0, 0.0], [0.1, 0.1, 0.1], [0.35, 0.0, 0.0], [0.1, 0.1, 0.1]];
        let batch = [0, 0, 0, 1];
        let p = window_partition(&pos, &batch, [0.3; 3], false).unwrap();
        p.validate(4).unwrap();
        assert_eq!(p.windows(), 3);
        assert_eq!(p.window(0), &[0, 1]);
        assert_eq!(p.window(1), &[2]);
        assert_eq!(p.window(2), &[3]);
        assert_eq!(p.n_max(), 2);
        assert_eq!(p.pair_count(), 6);
        assert_eq!(p.window_size_of_each(4), vec![2, 2, 1, 1]);
    }

    #[test]
    fn shift_moves_the_grid_by_half_a_window() {
        let pos = [[0.0, 0.0, 0.0], [0.2, 0.0, 0.0]];
        let plain = window_partition(&pos, &[0, 0], [0.3; 3], false).unwrap();
        let shifted = window_partition(&pos, &[0, 0], [0.3; 3], true).unwrap();
        assert_eq!(plain.windows(), 1);
        assert_eq!(shifted.windows(), 2);
    }

    #[test]
    fn empty_and_bad_input() {
        let p = window_partition(&[], &[], [1.0; 3], false).unwrap();
        assert_eq!(p.windows(), 0);
        p.validate(0).unwrap();
        assert!(window_partition(&[[0.0; 3]], &[0, 0], [1.0; 3], false).is_err());
        assert!(window_partition(&[[f32::NAN, 0.0, 0.0]], &[0], [1.0; 3], false).is_err());
        assert!(window_partition(&[[0.0; 3]], &[-1], [1.0; 3], false).is_err());
        assert!(window_partition(&[[0.0; 3]], &[0], [0.0, 1.0, 1.0], false).is_err());
    }
}
