//! CPU reference of varlen window attention (f64 accumulation, rayon over windows).
//!
//! For every query `i` of a window `W` and every head `h` of the slice:
//!
//! ```text
//! logit(i, j) = q_i · (k_j + Σ_a tq[idx_a, a]) + k_j · Σ_a tk[idx_a, a] + bias(i, j)   for j in W
//! out_i       = Σ_j softmax_j(logit(i, ·)) · (v_j + Σ_a tv[idx_a, a])
//! ```
//!
//! with `idx = rpe.pair_index(i, j)` (contextual RPE, SphereFormer) or no table terms, and
//! `bias` an optional additive per-head bias (Swin's relative position bias). `q` is taken as
//! given: SphereFormer multiplies it by `head_dim^-0.5` before the op. Written for clarity:
//! it is what the CUDA kernel is tested against.

use crate::ops::attention::partition::Partition;
use crate::ops::attention::rpe::RpeGeometry;
use crate::Error;
use rayon::prelude::*;

/// Which heads of a `[N, heads, head_dim]` tensor one call reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadSlice {
    /// Heads per row of q, k, v and out.
    pub heads: usize,
    pub head_dim: usize,
    /// First head of the slice and how many.
    pub first: usize,
    pub count: usize,
}

impl HeadSlice {
    /// All heads.
    pub fn all(heads: usize, head_dim: usize) -> Self {
        Self { heads, head_dim, first: 0, count: heads }
    }

    pub fn row(&self) -> usize {
        self.heads * self.head_dim
    }

    pub(crate) fn validate(&self, n: usize, q: &[f32], k: &[f32], v: &[f32]) -> Result<(), Error> {
        if self.head_dim == 0 || self.count == 0 || self.first + self.count > self.heads {
            return Err(Error::InvalidInput(format!(
                "window attention: heads {}..{} of {} with head_dim {} is not a valid slice",
                self.first,
                self.first + self.count,
                self.heads,
                self.head_dim
            )));
        }
        let want = n * self.row();
        for (name, t) in [("q", q), ("k", k), ("v", v)] {
            if t.len() != want {
                return Err(Error::InvalidInput(format!(
                    "window attention: {name} has {} values, expected {n} x {} x {} = {want}",
                    t.len(),
                    self.heads,
                    self.head_dim
                )));
            }
        }
        Ok(())
    }
}

/// Contextual RPE tables, each `[rows, 3, count, head_dim]` (upstream's `[L, 3, H, D]` for the
/// heads of the slice).
#[derive(Debug, Clone, Copy)]
pub struct RpeTables<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
}

/// Everything the contextual RPE needs: geometry, per-voxel positions, tables.
#[derive(Debug, Clone, Copy)]
pub struct ContextualRpe<'a> {
    pub geometry: RpeGeometry,
    /// Positions the geometry quantizes (xyz for cubic windows, (theta, beta, r) for spherical).
    pub positions: &'a [[f32; 3]],
    pub tables: RpeTables<'a>,
}

impl ContextualRpe<'_> {
    pub(crate) fn validate(&self, n: usize, heads: HeadSlice) -> Result<(), Error> {
        if self.positions.len() != n {
            return Err(Error::InvalidInput(format!(
                "window attention: {} RPE positions for {n} voxels",
                self.positions.len()
            )));
        }
        let want = self.geometry.table_rows() * 3 * heads.count * heads.head_dim;
        for (name, t) in [("query", self.tables.q), ("key", self.tables.k), ("value", self.tables.v)] {
            if t.len() != want {
                return Err(Error::InvalidInput(format!(
                    "window attention: relative position {name} table has {} values, expected \
                     [{}, 3, {}, {}] = {want}",
                    t.len(),
                    self.geometry.table_rows(),
                    heads.count,
                    heads.head_dim
                )));
            }
        }
        Ok(())
    }
}

/// An additive logit bias per head from a table indexed by 2-D relative position (Swin's relative
/// position bias): `bias(i, j) = table[h][(r_i - r_j + wh - 1) * (2 ww - 1) + (c_i - c_j + ww - 1)]`.
#[derive(Debug, Clone, Copy)]
pub struct RelativeBias2d<'a> {
    /// Window height and width in tokens.
    pub window: [i32; 2],
    /// `[count, (2wh - 1) * (2ww - 1)]`.
    pub table: &'a [f32],
    /// Token (row, col) in the image; pairs are always in one window, so |Δ| < window.
    pub rc: &'a [[i32; 2]],
}

impl RelativeBias2d<'_> {
    pub fn table_len(&self) -> usize {
        ((2 * self.window[0] - 1) * (2 * self.window[1] - 1)).max(0) as usize
    }

    /// Table column of the pair (i, j), clamped into the table.
    pub fn column(&self, i: usize, j: usize) -> usize {
        let [wh, ww] = self.window;
        let dr = (self.rc[i][0] - self.rc[j][0] + wh - 1).clamp(0, 2 * wh - 2);
        let dc = (self.rc[i][1] - self.rc[j][1] + ww - 1).clamp(0, 2 * ww - 2);
        (dr * (2 * ww - 1) + dc) as usize
    }

    pub(crate) fn validate(&self, n: usize, heads: HeadSlice) -> Result<(), Error> {
        if self.window[0] < 1 || self.window[1] < 1 || self.rc.len() != n {
            return Err(Error::InvalidInput(format!(
                "window attention: 2-D bias with window {:?} and {} token positions for {n} tokens",
                self.window,
                self.rc.len()
            )));
        }
        if self.table.len() != heads.count * self.table_len() {
            return Err(Error::InvalidInput(format!(
                "window attention: 2-D bias table has {} values, expected {} x {}",
                self.table.len(),
                heads.count,
                self.table_len()
            )));
        }
        Ok(())
    }
}

/// What is added to plain dot-product attention.
#[derive(Debug, Clone, Copy)]
pub enum PositionTerm<'a> {
    None,
    Contextual(ContextualRpe<'a>),
    Bias2d(RelativeBias2d<'a>),
}

/// Window attention over the heads in `heads`, written into those heads of `out`
/// (`[N, heads.heads, head_dim]`, other heads untouched).
pub fn window_attention_into(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: HeadSlice,
    part: &Partition,
    term: PositionTerm,
    out: &mut [f32],
) -> Result<(), Error> {
    let n = part.order.len();
    heads.validate(n, q, k, v)?;
    part.validate(n)?;
    if out.len() != n * heads.row() {
        return Err(Error::InvalidInput(format!(
            "window attention: output has {} values, expected {}",
            out.len(),
            n * heads.row()
        )));
    }
    match &term {
        PositionTerm::None => {}
        PositionTerm::Contextual(c) => c.validate(n, heads)?,
        PositionTerm::Bias2d(b) => b.validate(n, heads)?,
    }
    let quant: Vec<[i32; 3]> = match &term {
        PositionTerm::Contextual(c) => c.positions.iter().map(|&p| c.geometry.quantize(p)).collect(),
        _ => Vec::new(),
    };

    let (row, d) = (heads.row(), heads.head_dim);
    // Each window's rows are computed independently, then scattered.
    let results: Vec<Vec<(u32, Vec<f32>)>> = (0..part.windows())
        .into_par_iter()
        .map(|w| {
            let members = part.window(w);
            let mut rows = Vec::with_capacity(members.len());
            let mut logits = vec![0f64; members.len()];
            for &i in members {
                let i = i as usize;
                let mut out_row = vec![0f32; heads.count * d];
                for hs in 0..heads.count {
                    let h = heads.first + hs;
                    let qi = &q[i * row + h * d..][..d];
                    for (jj, &j) in members.iter().enumerate() {
                        let j = j as usize;
                        let kj = &k[j * row + h * d..][..d];
                        let mut s = 0f64;
                        for c in 0..d {
                            s += qi[c] as f64 * kj[c] as f64;
                        }
                        match &term {
                            PositionTerm::None => {}
                            PositionTerm::Contextual(rpe) => {
                                let g = &rpe.geometry;
                                let idx = g.pair_index(
                                    quant[i],
                                    quant[j],
                                    rpe.positions[i][2],
                                    rpe.positions[j][2],
                                );
                                for (a, &r) in idx.iter().enumerate() {
                                    let t = table_row(r as usize, a, hs, heads);
                                    for c in 0..d {
                                        s += qi[c] as f64 * rpe.tables.q[t + c] as f64
                                            + kj[c] as f64 * rpe.tables.k[t + c] as f64;
                                    }
                                }
                            }
                            PositionTerm::Bias2d(b) => {
                                s += b.table[hs * b.table_len() + b.column(i, j)] as f64;
                            }
                        }
                        logits[jj] = s;
                    }
                    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let mut denom = 0f64;
                    for l in logits.iter_mut() {
                        *l = (*l - max).exp();
                        denom += *l;
                    }
                    let mut acc = vec![0f64; d];
                    for (jj, &j) in members.iter().enumerate() {
                        let j = j as usize;
                        let p = logits[jj] / denom;
                        let vj = &v[j * row + h * d..][..d];
                        for c in 0..d {
                            acc[c] += p * vj[c] as f64;
                        }
                        if let PositionTerm::Contextual(rpe) = &term {
                            let g = &rpe.geometry;
                            let idx =
                                g.pair_index(quant[i], quant[j], rpe.positions[i][2], rpe.positions[j][2]);
                            for (a, &r) in idx.iter().enumerate() {
                                let t = table_row(r as usize, a, hs, heads);
                                for (a, &tv) in acc.iter_mut().zip(&rpe.tables.v[t..t + d]) {
                                    *a += p * tv as f64;
                                }
                            }
                        }
                    }
                    for c in 0..d {
                        out_row[hs * d + c] = acc[c] as f32;
                    }
                }
                rows.push((i as u32, out_row));
            }
            rows
        })
        .collect();
    for window_rows in results {
        for (i, vals) in window_rows {
            let base = i as usize * row + heads.first * d;
            out[base..base + vals.len()].copy_from_slice(&vals);
        }
    }
    Ok(())
}

/// Window attention over all heads, returning `[N, heads, head_dim]`.
pub fn window_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: HeadSlice,
    part: &Partition,
    term: PositionTerm,
) -> Result<Vec<f32>, Error> {
    let mut out = vec![0f32; q.len()];
    window_attention_into(q, k, v, heads, part, term, &mut out)?;
    Ok(out)
}

/// Offset of `table[row, axis, head, 0]` in a `[rows, 3, count, head_dim]` table.
#[inline]
fn table_row(row: usize, axis: usize, head: usize, heads: HeadSlice) -> usize {
    ((row * 3 + axis) * heads.count + head) * heads.head_dim
}
