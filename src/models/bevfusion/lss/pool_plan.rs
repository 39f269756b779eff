//! The CUDA pool's work plan, made once per calibration from the cell offsets.
//!
//! The pool gives each work item one slice of a warp (the lanes that hold one context row: ten
//! at 80 channels, so a warp takes three neighbouring items). A cell of at most `chunk` points
//! is one item and its slice writes the cell's FP16 sums. A longer cell (the cells next to the
//! cameras hold up to ~1,200 points) is cut into items of `chunk` points whose slices write FP32
//! partial sums to slots, and a second pass adds each split cell's partials in item order.
//! Without the cut, the few longest cells' slices walk their points one batch of dependent
//! loads after another and set the kernel's length; with it no slice walks more than `chunk`
//! points. Every sum keeps a fixed order (an item's points in order, items in plan order), so
//! the output has the same bits on every run.
//!
//! Items are launched in bands of length, longest first, so the split cells' chunks start at
//! once and a warp's items are about as long as each other (a warp lasts as long as its longest
//! item); within a band the cells follow a Morton curve over the grid, so the items that run
//! together pool neighbouring cells, whose points share context rows that L1 then serves
//! ([`DEFAULT_BAND_POINTS`]); each block's run of items is then put longest first, so that the
//! three items of a warp differ little in length. Empty cells get an item too: its slice writes
//! the zeros, so the output needs no memset.
//!
//! A plan with spans ([`PoolPlan::with_span_points`]) runs the tensor-core pool at 80 channels, a
//! warp a span: up to [`SPAN_ITEMS`] items that follow each other in the launch order, one item a
//! row of the MMA, their points one after another in a list built on the GPU once per
//! calibration ([`PoolSpan`]). Short cells then share a warp's 16-point MMA steps instead of each
//! padding its own. It is measured beside the slice pool and not the default (kernels.md says why).

use crate::models::bevfusion::lss::config::BevGrid;
use crate::Error;

/// Points per work item unless the caller asks for another size. On an H100 (`sptr bench
/// bevpool`, five runs) 128 was the fastest of 32, 64, 128 and 256 on both geometries: seg
/// 0.054 ms against 0.072 at 256, 0.057 at 64 and 0.222 uncut; detection 0.062 against 0.079
/// at 256. An item's slice walks its points in batches of dependent loads, so the longest item
/// sets the kernel's tail; a shorter cut costs partial sums.
pub const DEFAULT_CHUNK_POINTS: u32 = 128;

/// Points a length band of the default launch order holds ([`PoolOrder::Banded`]). On an H100
/// (`sptr bench bevpool`, chunk 128, four alternating rounds, each block's run of items longest
/// first) bands of 16 points: seg 0.0461 ms, as bands of 8, detection 0.0508 against 0.0517;
/// bands of 1, 2 and 4 slower (seg 0.050, 0.050, 0.048). Longest first: seg 0.054, detection
/// 0.058.
pub const DEFAULT_BAND_POINTS: u32 = 16;

/// `PoolItem::slot` of an item that is its whole cell: its warp writes the cell's output.
pub const WHOLE_CELL: u32 = u32::MAX;

/// Items a span holds at most: the rows of the tensor-core pool's `m16n8k16` MMA, one item a
/// row (`SPAN_ROWS` in `bev_pool.cu`).
pub const SPAN_ITEMS: u32 = 16;

/// Points a span holds at most unless one item alone holds more (then it is a span of its own):
/// the budget `sptr bench bevpool` times the tensor-core pool with beside others.
pub const DEFAULT_SPAN_POINTS: u32 = 128;

/// One warp's work: the points `[begin, end)` of the sorted point order, all in `cell`.
/// Mirrors `uint4` in `kernels/models/bevfusion/bev_pool.cu` (cell, begin, end, slot).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolItem {
    pub cell: u32,
    pub begin: u32,
    pub end: u32,
    /// [`WHOLE_CELL`], or the partial-sum slot this item writes (FP32, `C` values).
    pub slot: u32,
}

/// A split cell: its partials are the slots `[first_slot, first_slot + slots)`, added in that
/// order. Mirrors `uint4` in `bev_pool.cu` (cell, first slot, slots, unused).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolMerge {
    pub cell: u32,
    pub first_slot: u32,
    pub slots: u32,
    pub unused: u32,
}

/// One warp's work in the tensor-core pool: the items `[first_item, first_item + items)` of the
/// plan, whose points lie one item after another at `[list_begin, list_begin + points)` of the
/// span list (the point order regrouped by span, each entry tagged with its item's row). Mirrors
/// `uint4` in `bev_pool.cu` (list begin, points, first item, items).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpan {
    pub list_begin: u32,
    pub points: u32,
    pub first_item: u32,
    pub items: u32,
}

/// The items and merges of one calibration's geometry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPlan {
    pub chunk_points: u32,
    pub order: PoolOrder,
    pub items: Vec<PoolItem>,
    pub merges: Vec<PoolMerge>,
    /// Partial-sum slots the items write (the sum of the merges' `slots`).
    pub slots: u32,
    /// The items in runs of consecutive items for the tensor-core pool
    /// ([`PoolPlan::with_span_points`]); empty (the slice pool) unless asked for.
    pub spans: Vec<PoolSpan>,
}

/// The order in which the plan launches its cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolOrder {
    /// By descending point count, ties in cell order ([`launch_order`]).
    LongestFirst,
    /// By descending band of item length (`band` points a band, a cut cell's items being the
    /// chunk long), and within a band along a Morton curve over the grid's cells, whose rows
    /// are `row_cells` long (cell `c` is row `c / row_cells`, column `c % row_cells`). Items
    /// launched together then pool neighbouring cells, which share context rows that L1 can
    /// hold, while the long items still start first.
    Banded { band: u32, row_cells: u32 },
}

impl PoolOrder {
    /// [`PoolOrder::Banded`] over `grid`, bands of `band` points: cell `(x, y, z)` is
    /// `(x·ny + y)·nz + z`, so a row of the Morton curve's grid is `ny·nz` cells.
    pub fn banded(grid: &BevGrid, band: u32) -> Self {
        PoolOrder::Banded { band, row_cells: (grid.nx[1] * grid.nx[2]) as u32 }
    }
}

/// The cells in launch order: by descending point count, ties in cell order.
pub fn launch_order(cell_start: &[u32]) -> Vec<u32> {
    let cells = cell_start.len().saturating_sub(1);
    let mut order: Vec<u32> = (0..cells as u32).collect();
    let len = |c: u32| cell_start[c as usize + 1] - cell_start[c as usize];
    // stable: equal lengths keep ascending cell order
    order.sort_by_key(|&c| std::cmp::Reverse(len(c)));
    order
}

/// Interleaves the bits of `a` and `b` (`b` in the even bits): the cell's place on a Morton curve.
fn morton(a: u32, b: u32) -> u64 {
    let spread = |v: u32| {
        let mut x = v as u64;
        x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
        x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
        x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
        x = (x | (x << 2)) & 0x3333_3333_3333_3333;
        (x | (x << 1)) & 0x5555_5555_5555_5555
    };
    (spread(a) << 1) | spread(b)
}

/// The cells by descending band of item length, then along the Morton curve (`cell_start`
/// already checked to not decrease).
fn band_curve_order(cell_start: &[u32], chunk_points: u32, band: u32, row_cells: u32) -> Vec<u32> {
    let cells = cell_start.len().saturating_sub(1);
    let (band, row) = (band.max(1), row_cells.max(1));
    // each cell's key made once: made in every comparison, the keys took the plan of a 360 x 360
    // grid 50-60 ms on a 2-core machine (5 ms now); no two cells share a Morton code: no ties
    let mut keyed: Vec<(std::cmp::Reverse<u32>, u64, u32)> = (0..cells as u32)
        .map(|c| {
            let len = (cell_start[c as usize + 1] - cell_start[c as usize]).min(chunk_points);
            (std::cmp::Reverse(len.div_ceil(band)), morton(c / row, c % row), c)
        })
        .collect();
    keyed.sort_unstable();
    keyed.into_iter().map(|(_, _, c)| c).collect()
}

/// Items a block of the pool takes at C 80 (8 warps of 3 slices).
const BLOCK_ITEMS: usize = 24;

/// The cells in [`PoolOrder::Banded`] order: [`band_curve_order`], then each run of a block's
/// items longest first (stable: ties keep the curve). A warp's three items then differ less in
/// length, so its slices idle for fewer steps, while a block still pools the same neighbouring
/// cells (H100, same runs: detection geometry 0.0522 against 0.0533-0.0565 ms, seg unchanged;
/// and bands of 16 points then tie bands of 8 on the seg geometry and beat them on detection).
fn banded_order(cell_start: &[u32], chunk_points: u32, band: u32, row_cells: u32) -> Vec<u32> {
    let mut order = band_curve_order(cell_start, chunk_points, band, row_cells);
    let len = |c: u32| (cell_start[c as usize + 1] - cell_start[c as usize]).min(chunk_points);
    for run in order.chunks_mut(BLOCK_ITEMS) {
        run.sort_by_key(|&c| std::cmp::Reverse(len(c)));
    }
    order
}

impl PoolPlan {
    /// The plan of the geometry whose cell `c` holds the points `cell_start[c]..cell_start[c + 1]`,
    /// with items of at most `chunk_points` points (`u32::MAX`: every cell one item), launched
    /// longest first.
    pub fn build(cell_start: &[u32], chunk_points: u32) -> Result<Self, Error> {
        Self::build_ordered(cell_start, chunk_points, PoolOrder::LongestFirst)
    }

    /// [`PoolPlan::build`] with the cells launched in `order`. The order changes which items run
    /// together, never a sum: every order gives the same output bits.
    pub fn build_ordered(cell_start: &[u32], chunk_points: u32, order: PoolOrder) -> Result<Self, Error> {
        if chunk_points == 0 {
            return Err(Error::InvalidInput("bev_pool plan: chunk_points is 0; it must be at least 1".into()));
        }
        if cell_start.is_empty() {
            return Err(Error::InvalidInput("bev_pool plan: no cell offsets (a geometry has cells + 1 of them)".into()));
        }
        if let Some(w) = cell_start.windows(2).position(|w| w[1] < w[0]) {
            return Err(Error::InvalidInput(format!(
                "bev_pool plan: cell offsets decrease at cell {w} ({} then {})",
                cell_start[w],
                cell_start[w + 1]
            )));
        }
        let mut items = Vec::with_capacity(cell_start.len());
        let mut merges = Vec::new();
        let mut slots = 0u32;
        let cells = match order {
            PoolOrder::LongestFirst => launch_order(cell_start),
            PoolOrder::Banded { band, row_cells } => banded_order(cell_start, chunk_points, band, row_cells),
        };
        for cell in cells {
            let (begin, end) = (cell_start[cell as usize], cell_start[cell as usize + 1]);
            if end - begin <= chunk_points {
                items.push(PoolItem { cell, begin, end, slot: WHOLE_CELL });
                continue;
            }
            let first_slot = slots;
            let mut b = begin;
            while b < end {
                let e = end - (end - b).saturating_sub(chunk_points);
                items.push(PoolItem { cell, begin: b, end: e, slot: slots });
                slots += 1;
                b = e;
            }
            merges.push(PoolMerge { cell, first_slot, slots: slots - first_slot, unused: 0 });
        }
        Ok(Self { chunk_points, order, items, merges, slots, spans: Vec::new() })
    }

    /// This plan with its spans packed to at most `span_points` points (`None`: no spans, so the
    /// pool runs the slice kernel).
    pub fn with_span_points(mut self, span_points: Option<u32>) -> Self {
        self.spans = span_points.map(|p| spans(&self.items, p)).unwrap_or_default();
        self
    }

    /// The spans as the kernel reads them: four u32 each.
    pub fn span_words(&self) -> Vec<u32> {
        self.spans.iter().flat_map(|s| [s.list_begin, s.points, s.first_item, s.items]).collect()
    }

    /// The items as the kernel reads them: four u32 each.
    pub fn item_words(&self) -> Vec<u32> {
        self.items.iter().flat_map(|i| [i.cell, i.begin, i.end, i.slot]).collect()
    }

    /// The merges as the kernel reads them: four u32 each.
    pub fn merge_words(&self) -> Vec<u32> {
        self.merges.iter().flat_map(|m| [m.cell, m.first_slot, m.slots, m.unused]).collect()
    }

    /// The most points one item holds.
    pub fn longest_item(&self) -> u32 {
        self.items.iter().map(|i| i.end - i.begin).max().unwrap_or(0)
    }
}

/// `items` in launch order cut into runs: a run takes the next item while it holds fewer than
/// [`SPAN_ITEMS`] items and the item's points fit in `span_points` (an item longer than that
/// starts a run of its own). Short cells then share a warp's 16 MMA rows (on the nuScenes
/// calibration 1.05 times the points in 16-point MMA steps, against 1.25 with one item a warp).
fn spans(items: &[PoolItem], span_points: u32) -> Vec<PoolSpan> {
    let mut spans: Vec<PoolSpan> = Vec::new();
    let mut list = 0u32;
    for (i, it) in items.iter().enumerate() {
        let len = it.end - it.begin;
        match spans.last_mut() {
            Some(s) if s.items < SPAN_ITEMS && s.points + len <= span_points => {
                s.points += len;
                s.items += 1;
            }
            _ => spans.push(PoolSpan { list_begin: list, points: len, first_item: i as u32, items: 1 }),
        }
        list += len;
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cell starts of cells of lengths `lens` (and the end).
    fn starts(lens: &[u32]) -> Vec<u32> {
        std::iter::once(0).chain(lens.iter().scan(0u32, |end, &l| {
            *end += l;
            Some(*end)
        })).collect()
    }

    /// Cells of lengths 0, 5, 300, 1, 129, 0, 128.
    fn offsets() -> Vec<u32> {
        starts(&[0, 5, 300, 1, 129, 0, 128])
    }

    #[test]
    fn every_point_once_in_cell_order_and_no_item_over_the_chunk() {
        let s = offsets();
        let p = PoolPlan::build(&s, 128).unwrap();
        // every cell appears, in launch order: 300, 129, 128, 5, 1, then the empty ones by cell
        let firsts: Vec<u32> = p.items.iter().map(|i| i.cell).fold(Vec::new(), |mut v, c| {
            if v.last() != Some(&c) {
                v.push(c);
            }
            v
        });
        assert_eq!(firsts, vec![2, 4, 6, 1, 3, 0, 5]);
        assert!(p.longest_item() <= 128);
        // each cell's items tile its points in order
        for cell in 0..7u32 {
            let its: Vec<&PoolItem> = p.items.iter().filter(|i| i.cell == cell).collect();
            assert_eq!(its[0].begin, s[cell as usize]);
            assert_eq!(its.last().unwrap().end, s[cell as usize + 1]);
            for w in its.windows(2) {
                assert_eq!(w[0].end, w[1].begin, "cell {cell}");
            }
        }
        // cell 2 (300 points): 128 + 128 + 44 in slots 0..3; cell 4 (129): 128 + 1 in slots 3..5
        assert_eq!(p.merges, vec![
            PoolMerge { cell: 2, first_slot: 0, slots: 3, unused: 0 },
            PoolMerge { cell: 4, first_slot: 3, slots: 2, unused: 0 },
        ]);
        assert_eq!(p.slots, 5);
        let split: Vec<(u32, u32, u32)> = p.items.iter().filter(|i| i.slot != WHOLE_CELL).map(|i| (i.cell, i.end - i.begin, i.slot)).collect();
        assert_eq!(split, vec![(2, 128, 0), (2, 128, 1), (2, 44, 2), (4, 128, 3), (4, 1, 4)]);
        // exactly 128 points stay whole; empty cells are whole items with no points
        assert!(p.items.iter().any(|i| i.cell == 6 && i.slot == WHOLE_CELL && i.end - i.begin == 128));
        assert!(p.items.iter().any(|i| i.cell == 5 && i.begin == i.end && i.slot == WHOLE_CELL));
        assert_eq!(p.item_words().len(), 4 * p.items.len());
        assert_eq!(&p.merge_words()[..4], &[2, 0, 3, 0]);
    }

    #[test]
    fn an_unlimited_chunk_keeps_every_cell_whole_and_chunk_one_splits_every_point() {
        let s = offsets();
        let whole = PoolPlan::build(&s, u32::MAX).unwrap();
        assert_eq!(whole.items.len(), 7);
        assert!(whole.merges.is_empty() && whole.slots == 0);
        assert_eq!(whole.items.iter().map(|i| i.cell).collect::<Vec<_>>(), launch_order(&s));
        let ones = PoolPlan::build(&s, 1).unwrap();
        // the 1-point cell stays whole; every other point is its own slot
        assert_eq!(ones.slots, 5 + 300 + 129 + 128);
        assert_eq!(ones.longest_item(), 1);
    }

    #[test]
    fn launch_order_is_longest_first_ties_by_cell() {
        assert_eq!(launch_order(&[0, 2, 2, 4, 5, 7]), vec![0, 2, 4, 3, 1]);
        assert!(launch_order(&[0]).is_empty());
    }

    #[test]
    fn banded_order_takes_length_bands_first_then_the_morton_curve() {
        // a 4 x 4 grid (rows of 4 cells); lengths: cells 5 and 10 long (20 and 17, one band at
        // band 8 and chunk 16: both cut), cells 0, 3, 15 of 9..16 points, the rest of 1..8 or empty
        let mut lens = [0u32; 16];
        lens[5] = 20;
        lens[10] = 17;
        lens[0] = 9;
        lens[3] = 16;
        lens[15] = 12;
        lens[1] = 3;
        lens[4] = 8;
        lens[6] = 1;
        lens[12] = 2;
        let s = starts(&lens);
        let order = band_curve_order(&s, 16, 8, 4);
        // band 2 (9..16 points after the cut): Morton (row, col) 5=(1,1)->3, 10=(2,2)->12,
        // 0=(0,0)->0, 3=(0,3)->5, 15=(3,3)->15; band 1: 1=(0,1)->1, 4=(1,0)->2, 6=(1,2)->6,
        // 12=(3,0)->10; band 0: the empty cells along the curve
        assert_eq!(&order[..9], &[0, 5, 3, 10, 15, 1, 4, 6, 12]);
        assert_eq!(&order[9..], &[2, 7, 8, 9, 13, 11, 14]);
        assert_eq!(morton(3, 3), 15);
        assert_eq!(morton(2, 0), 8);
        // same items per cell as longest first, only launched in another order
        // a 4 x 4 x 1 grid's rows are 4 cells
        let grid = BevGrid { dx: [1.0; 3], bx: [0.5; 3], nx: [4, 4, 1] };
        assert_eq!(PoolOrder::banded(&grid, 8), PoolOrder::Banded { band: 8, row_cells: 4 });
        let banded = PoolPlan::build_ordered(&s, 16, PoolOrder::banded(&grid, 8)).unwrap();
        let longest = PoolPlan::build(&s, 16).unwrap();
        let per_cell = |p: &PoolPlan| {
            let mut v: Vec<(u32, u32, u32)> = p.items.iter().map(|i| (i.cell, i.begin, i.end)).collect();
            v.sort();
            v
        };
        assert_eq!(per_cell(&banded), per_cell(&longest));
        assert_eq!((banded.slots, banded.merges.len()), (longest.slots, longest.merges.len()));
        // a cut cell's slots still run in its point order
        for m in &banded.merges {
            let its: Vec<&PoolItem> = banded.items.iter().filter(|i| i.cell == m.cell).collect();
            for (k, it) in its.iter().enumerate() {
                assert_eq!(it.slot, m.first_slot + k as u32);
            }
        }
    }

    #[test]
    fn each_blocks_run_of_the_banded_order_is_longest_first() {
        // a 16 x 16 grid of lengths 0..40 (chunk 32: a few cut), so runs of 24 span bands
        let lens: Vec<u32> = (0..256u32).map(|c| (c * 37 + c / 16 * 11) % 41).collect();
        let s = starts(&lens);
        let curve = band_curve_order(&s, 32, 8, 16);
        let order = banded_order(&s, 32, 8, 16);
        let len = |c: u32| lens[c as usize].min(32);
        // each cell's position along the curve
        let mut at = vec![0usize; 256];
        for (k, &c) in curve.iter().enumerate() {
            at[c as usize] = k;
        }
        assert_eq!(order.len(), 256);
        for (k, (run, same)) in order.chunks(BLOCK_ITEMS).zip(curve.chunks(BLOCK_ITEMS)).enumerate() {
            // the same cells as the curve's run, longest first, ties in the curve's order
            let mut a = run.to_vec();
            let mut b = same.to_vec();
            a.sort();
            b.sort();
            assert_eq!(a, b, "run {k}");
            for w in run.windows(2) {
                assert!(len(w[0]) >= len(w[1]), "run {k}: {} before {}", len(w[0]), len(w[1]));
                if len(w[0]) == len(w[1]) {
                    assert!(at[w[0] as usize] < at[w[1] as usize], "run {k}: a tie out of the curve's order");
                }
            }
        }
    }

    #[test]
    fn spans_take_consecutive_items_up_to_sixteen_and_the_point_budget() {
        // lengths 0, 5, 300, 1, 129, 0, 128 at chunk 128: items 128, 128, 44, 128, 1, 128, 5, 1,
        // 0, 0 (cells 2, 2, 2, 4, 4, 6, 1, 3, 0, 5 in launch order)
        let p = PoolPlan::build(&offsets(), 128).unwrap();
        assert!(p.spans.is_empty(), "no spans unless asked for");
        let p = p.with_span_points(Some(DEFAULT_SPAN_POINTS));
        let lens: Vec<u32> = p.items.iter().map(|i| i.end - i.begin).collect();
        assert_eq!(lens, vec![128, 128, 44, 128, 1, 128, 5, 1, 0, 0]);
        let got: Vec<(u32, u32, u32, u32)> = p.spans.iter().map(|s| (s.list_begin, s.points, s.first_item, s.items)).collect();
        assert_eq!(got, vec![(0, 128, 0, 1), (128, 128, 1, 1), (256, 44, 2, 1), (300, 128, 3, 1), (428, 1, 4, 1), (429, 128, 5, 1), (557, 6, 6, 4)]);
        assert_eq!(p.span_words()[24..], [557, 6, 6, 4]);
        // every item in exactly one span, in order; the list covers every point once
        let mut next = (0u32, 0u32);
        for s in &p.spans {
            assert_eq!((s.first_item, s.list_begin), next);
            assert!(s.items >= 1 && s.items <= SPAN_ITEMS);
            let pts: u32 = lens[s.first_item as usize..(s.first_item + s.items) as usize].iter().sum();
            assert_eq!(pts, s.points);
            assert!(s.items == 1 || s.points <= DEFAULT_SPAN_POINTS);
            next = (s.first_item + s.items, s.list_begin + s.points);
        }
        assert_eq!(next, (p.items.len() as u32, 563));
        // at most sixteen items a span: 40 one-point cells take three spans (16, 16, 8)
        let ones = PoolPlan::build(&starts(&[1; 40]), 128).unwrap().with_span_points(Some(128));
        assert_eq!(ones.spans.iter().map(|s| s.items).collect::<Vec<_>>(), vec![16, 16, 8]);
        // a budget of 2 points: 1 + 1 then a new span; none: no spans
        let two = ones.clone().with_span_points(Some(2));
        assert_eq!(two.spans.len(), 20);
        assert!(ones.with_span_points(None).spans.is_empty());
    }

    #[test]
    fn bad_inputs_are_errors() {
        let e = PoolPlan::build(&offsets(), 0).unwrap_err().to_string();
        assert!(e.contains("chunk_points is 0"), "{e}");
        assert!(PoolPlan::build(&[], 128).is_err());
        let e = PoolPlan::build(&[0, 5, 3], 128).unwrap_err().to_string();
        assert!(e.contains("decrease at cell 1"), "{e}");
    }
}
