//! The tiled pool's plan, made once per calibration from the cell offsets and the point order.
//!
//! The chunked pool ([`super::pool_plan`]) reads every kept point's context row from L2: 160
//! bytes a point at C 80, though within one cell no pixel repeats. Across neighbouring cells
//! pixels do repeat (a pixel's ray crosses several cells): on the nuScenes calibration a tile of
//! 8 × 8 cells holds 4.9 points per distinct pixel on the seg geometry. The tiled pool gives one
//! block a tile: it copies the tile's distinct context rows into shared memory once, then its
//! warps sum each cell's points from there.
//!
//! A tile whose distinct pixels do not fit in shared memory is split into quarters, down to one
//! (x, y) column; a column that still does not fit is left to the chunked pool (`fallback`). So
//! is every cell of more than `max_cell_points` points: one warp walks a tile's cell, and a long
//! cell would set the kernel's length again (the chunked pool cuts it).
//! Every cell is in exactly one tile or in `fallback`; empty cells are in tiles too, so their
//! zeros are written.

use crate::Error;

/// Tile side in cells unless the caller asks for another.
pub const DEFAULT_TILE_CELLS: usize = 8;

/// Shared memory a block may fill with context rows unless the caller asks for another size
/// (room for two blocks an SM on Hopper and Ampere).
pub const DEFAULT_SHARED_BYTES: usize = 96 * 1024;

/// One block's work: its context rows `rows[row_begin..row_begin + rows]` and the cells
/// `cells[cell_begin..cell_begin + cells]`. Mirrors `uint4` in `bev_pool.cu`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolTile {
    pub row_begin: u32,
    pub rows: u32,
    pub cell_begin: u32,
    pub cells: u32,
}

/// The tiles of one calibration's geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TilePlan {
    /// The most rows a tile holds (what fits in the shared memory asked for).
    pub max_rows: u32,
    pub tiles: Vec<PoolTile>,
    /// The pixel (context row) of each tile row, ascending within a tile.
    pub rows: Vec<u32>,
    /// The cells of each tile, tile after tile, ascending within a tile.
    pub cells: Vec<u32>,
    /// Per kept point (its position in the point order): its row within its tile; 0 for the
    /// points of `fallback` cells.
    pub local: Vec<u16>,
    /// Cells no tile takes: those of more than `max_cell_points` points, and the cells of an
    /// (x, y) column with more distinct pixels than `max_rows`. Ascending.
    pub fallback: Vec<u32>,
    /// The most points a tile's cell holds.
    pub max_cell_points: u32,
}

/// The geometry a plan is made from: cell offsets and point order (depth-tensor indices), the
/// grid's cell counts and the depth bins.
pub struct TileInput<'a> {
    pub cell_start: &'a [u32],
    pub order: &'a [u32],
    pub nx: [usize; 3],
    pub depth_bins: u32,
}

impl TilePlan {
    /// Tiles of `tile` × `tile` cells (split where needed) whose rows of `channels` FP16 values
    /// fit in `shared_bytes`, with no cell of more than `max_cell_points` points.
    pub fn build(g: &TileInput<'_>, channels: usize, tile: usize, shared_bytes: usize, max_cell_points: u32) -> Result<Self, Error> {
        let [nx, ny, nz] = g.nx;
        let cells = nx * ny * nz;
        if g.cell_start.len() != cells + 1 {
            return Err(Error::InvalidInput(format!("tiled pool plan: {} cell offsets for {cells} cells", g.cell_start.len())));
        }
        if g.cell_start[cells] as usize > g.order.len() {
            return Err(Error::InvalidInput(format!("tiled pool plan: {} kept points but an order of {}", g.cell_start[cells], g.order.len())));
        }
        if channels == 0 || tile == 0 || g.depth_bins == 0 {
            return Err(Error::InvalidInput(format!("tiled pool plan: {channels} channels, tiles of {tile} cells, {} depth bins", g.depth_bins)));
        }
        let max_rows = (shared_bytes / (channels * 2)).min(u16::MAX as usize + 1) as u32;
        if max_rows == 0 {
            return Err(Error::InvalidInput(format!("tiled pool plan: {shared_bytes} bytes hold no row of {channels} channels")));
        }
        let long: Vec<u32> = (0..cells as u32).filter(|&c| g.cell_start[c as usize + 1] - g.cell_start[c as usize] > max_cell_points).collect();
        let mut plan = TilePlan { max_rows, tiles: Vec::new(), rows: Vec::new(), cells: Vec::new(), local: vec![0; g.order.len()], fallback: long, max_cell_points };
        for x0 in (0..nx).step_by(tile) {
            for y0 in (0..ny).step_by(tile) {
                plan.region(g, [x0, y0], [tile.min(nx - x0), tile.min(ny - y0)]);
            }
        }
        plan.fallback.sort_unstable();
        Ok(plan)
    }

    /// The cells of the columns `[x0, x0 + w) × [y0, y0 + h)`, every z, ascending, but the long
    /// ones (in the fallback already).
    fn region_cells(&self, g: &TileInput<'_>, [x0, y0]: [usize; 2], [w, h]: [usize; 2]) -> Vec<u32> {
        let [_, ny, nz] = g.nx;
        let mut v = Vec::with_capacity(w * h * nz);
        for x in x0..x0 + w {
            for y in y0..y0 + h {
                for z in 0..nz {
                    let c = ((x * ny + y) * nz + z) as u32;
                    if g.cell_start[c as usize + 1] - g.cell_start[c as usize] <= self.max_cell_points {
                        v.push(c);
                    }
                }
            }
        }
        v
    }

    /// A tile of this region, or its quarters when its pixels do not fit.
    fn region(&mut self, g: &TileInput<'_>, at: [usize; 2], size: [usize; 2]) {
        let cells = self.region_cells(g, at, size);
        let points = |c: u32| g.cell_start[c as usize] as usize..g.cell_start[c as usize + 1] as usize;
        let mut pixels: Vec<u32> = cells.iter().flat_map(|&c| g.order[points(c)].iter().map(|q| q / g.depth_bins)).collect();
        pixels.sort_unstable();
        pixels.dedup();
        if pixels.len() <= self.max_rows as usize {
            let tile = PoolTile { row_begin: self.rows.len() as u32, rows: pixels.len() as u32, cell_begin: self.cells.len() as u32, cells: cells.len() as u32 };
            for &c in &cells {
                for i in points(c) {
                    // the pixel is in `pixels`, which is sorted: its position fits in u16 (max_rows <= 2^16)
                    let p = g.order[i] / g.depth_bins;
                    self.local[i] = pixels.binary_search(&p).unwrap_or(0) as u16;
                }
            }
            self.rows.extend(pixels);
            self.cells.extend(cells);
            self.tiles.push(tile);
            return;
        }
        let [w, h] = size;
        if w * h == 1 {
            self.fallback.extend(cells);
            return;
        }
        let (w0, h0) = (w.div_ceil(2), h.div_ceil(2));
        for (dx, ww) in [(0, w0), (w0, w - w0)] {
            for (dy, hh) in [(0, h0), (h0, h - h0)] {
                if ww > 0 && hh > 0 {
                    self.region(g, [at[0] + dx, at[1] + dy], [ww, hh]);
                }
            }
        }
    }

    /// Points per context row read (kept points of the tiles over their rows): how many times
    /// fewer rows the tiled pool reads than one a point.
    pub fn reuse(&self, cell_start: &[u32]) -> f64 {
        let points: u64 = self.cells.iter().map(|&c| (cell_start[c as usize + 1] - cell_start[c as usize]) as u64).sum();
        points as f64 / self.rows.len().max(1) as f64
    }

    /// The tiles as the kernel reads them: four u32 each.
    pub fn tile_words(&self) -> Vec<u32> {
        self.tiles.iter().flat_map(|t| [t.row_begin, t.rows, t.cell_begin, t.cells]).collect()
    }

    /// The pool on the CPU in the tiled kernel's order of operations (each cell's points in
    /// order, the context read through the plan's rows): what the GPU's tiles must equal.
    /// `depth` `[pixels, D]`, `context` `[pixels, C]`, f32; the fallback cells are left at 0.
    pub fn pool_reference(&self, g: &TileInput<'_>, depth: &[f32], context: &[f32], channels: usize) -> Vec<f32> {
        let cells = g.cell_start.len() - 1;
        let mut out = vec![0f32; cells * channels];
        for t in &self.tiles {
            let rows = &self.rows[t.row_begin as usize..(t.row_begin + t.rows) as usize];
            for &c in &self.cells[t.cell_begin as usize..(t.cell_begin + t.cells) as usize] {
                let acc = &mut out[c as usize * channels..(c as usize + 1) * channels];
                for i in g.cell_start[c as usize] as usize..g.cell_start[c as usize + 1] as usize {
                    let p = depth[g.order[i] as usize];
                    let row = rows[self.local[i] as usize] as usize;
                    for (a, &v) in acc.iter_mut().zip(&context[row * channels..(row + 1) * channels]) {
                        *a += p * v;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4 × 4 × 1 grid, depth 2 bins: cell c holds the points listed (depth-tensor indices
    /// pixel * 2 + bin).
    fn grid() -> (Vec<u32>, Vec<u32>) {
        let per_cell: Vec<Vec<u32>> = (0..16u32)
            .map(|c| match c {
                0 => vec![0, 2, 4],       // pixels 0, 1, 2
                1 => vec![1, 3],          // pixels 0, 1 (the other bins)
                5 => vec![10, 12, 14, 16], // pixels 5..8
                10 => vec![],
                15 => vec![30, 31],       // pixel 15 twice
                c => vec![c * 2],         // pixel c
            })
            .collect();
        let mut start = vec![0u32];
        let mut order = Vec::new();
        for v in per_cell {
            order.extend(v);
            start.push(order.len() as u32);
        }
        (start, order)
    }

    fn check_cover(p: &TilePlan, g: &TileInput<'_>) {
        let mut seen = vec![false; g.cell_start.len() - 1];
        for &c in p.cells.iter().chain(&p.fallback) {
            assert!(!std::mem::replace(&mut seen[c as usize], true), "cell {c} twice");
        }
        assert!(seen.iter().all(|&s| s), "every cell is in a tile or the fallback");
        for t in &p.tiles {
            assert!(t.rows <= p.max_rows);
            let rows = &p.rows[t.row_begin as usize..(t.row_begin + t.rows) as usize];
            assert!(rows.windows(2).all(|w| w[0] < w[1]), "rows ascending and distinct");
            for &c in &p.cells[t.cell_begin as usize..(t.cell_begin + t.cells) as usize] {
                for i in g.cell_start[c as usize] as usize..g.cell_start[c as usize + 1] as usize {
                    assert_eq!(rows[p.local[i] as usize], g.order[i] / g.depth_bins, "point {i}: its row is its pixel");
                }
            }
        }
    }

    #[test]
    fn every_cell_once_and_every_point_reads_its_own_pixel() {
        let (start, order) = grid();
        let g = TileInput { cell_start: &start, order: &order, nx: [4, 4, 1], depth_bins: 2 };
        // rows of 8 channels (16 bytes): 64 bytes hold 4 rows
        let p = TilePlan::build(&g, 8, 4, 64, u32::MAX).unwrap();
        check_cover(&p, &g);
        assert_eq!(p.max_rows, 4);
        // the whole grid has 15 pixels: split into quarters, then the quarters with over 4 pixels again
        assert!(p.tiles.len() > 4);
        // cells 0 and 1 share pixels 0 and 1 when they are in one tile
        let t0 = p.tiles.iter().find(|t| p.cells[t.cell_begin as usize..(t.cell_begin + t.cells) as usize].contains(&0)).unwrap();
        if p.cells[t0.cell_begin as usize..(t0.cell_begin + t0.cells) as usize].contains(&1) {
            assert_eq!(&p.rows[t0.row_begin as usize..(t0.row_begin + t0.rows) as usize][..2], &[0, 1]);
        }
        // cell 5's four pixels fill a tile on their own; the empty cell 10 is in a tile
        assert!(p.fallback.is_empty());
        assert!(p.cells.contains(&10));
    }

    #[test]
    fn a_column_with_too_many_pixels_falls_back_and_one_tile_takes_all_when_it_fits() {
        let (start, order) = grid();
        let g = TileInput { cell_start: &start, order: &order, nx: [4, 4, 1], depth_bins: 2 };
        // 3 rows: cell 5 (four pixels) cannot fit even alone
        let p = TilePlan::build(&g, 8, 4, 48, u32::MAX).unwrap();
        check_cover(&p, &g);
        assert_eq!(p.fallback, vec![5]);
        let all = TilePlan::build(&g, 8, 4, 1 << 20, u32::MAX).unwrap();
        check_cover(&all, &g);
        assert_eq!(all.tiles.len(), 1);
        // pixels 0..=15 but 10 (cell 10 is empty; pixel 15 holds both of cell 15's points)
        assert_eq!(all.rows, (0..16).filter(|&p| p != 10).collect::<Vec<u32>>());
        // 22 points over 15 rows
        assert!((all.reuse(&start) - 22.0 / 15.0).abs() < 1e-12);
    }

    #[test]
    fn long_cells_are_left_to_the_chunked_pool() {
        let (start, order) = grid();
        let g = TileInput { cell_start: &start, order: &order, nx: [4, 4, 1], depth_bins: 2 };
        let p = TilePlan::build(&g, 8, 4, 1 << 20, 2).unwrap();
        check_cover(&p, &g);
        assert_eq!(p.fallback, vec![0, 5], "cells of 3 and 4 points");
        assert!(!p.rows.contains(&5), "a long cell's pixels are no tile's rows");
    }

    #[test]
    fn the_reference_equals_the_plain_pool() {
        let (start, order) = grid();
        let g = TileInput { cell_start: &start, order: &order, nx: [4, 4, 1], depth_bins: 2 };
        let c = 8;
        let depth: Vec<f32> = (0..32).map(|i| 0.01 * i as f32).collect();
        let context: Vec<f32> = (0..16 * c).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let p = TilePlan::build(&g, c, 2, 64, u32::MAX).unwrap();
        let got = p.pool_reference(&g, &depth, &context, c);
        for cell in 0..16 {
            let mut want = vec![0f32; c];
            for &q in &order[start[cell] as usize..start[cell + 1] as usize] {
                for (k, w) in want.iter_mut().enumerate() {
                    *w += depth[q as usize] * context[(q / 2) as usize * c + k];
                }
            }
            assert_eq!(&got[cell * c..(cell + 1) * c], &want[..], "cell {cell}");
        }
    }

    #[test]
    fn bad_inputs_are_errors() {
        let (start, order) = grid();
        let g = TileInput { cell_start: &start, order: &order, nx: [4, 4, 2], depth_bins: 2 };
        assert!(TilePlan::build(&g, 8, 4, 1024, u32::MAX).unwrap_err().to_string().contains("cell offsets"));
        let g = TileInput { cell_start: &start, order: &order, nx: [4, 4, 1], depth_bins: 2 };
        assert!(TilePlan::build(&g, 0, 4, 1024, u32::MAX).is_err());
        assert!(TilePlan::build(&g, 8, 0, 1024, u32::MAX).is_err());
        assert!(TilePlan::build(&g, 8, 4, 8, u32::MAX).unwrap_err().to_string().contains("no row"));
    }
}
