//! `F.grid_sample(x, grid, mode='bilinear')` on NHWC maps, CPU reference.
//!
//! The grid holds, per output pixel, a normalized `(x, y)` pair in [-1, 1] (x along the width,
//! y along the height, PyTorch's convention), the same grid for every image of the batch. The
//! arithmetic is PyTorch's CUDA kernel's (`GridSampler.cuh`), in f32 and in its order:
//!
//! ```text
//! align_corners false: ix = ((gx + 1) · W − 1) / 2      true: ix = (gx + 1) / 2 · (W − 1)
//! border padding: ix clamped to [0, W − 1] first
//! nw = (ix_se − ix)(iy_se − iy), ne = (ix − ix_sw)(iy_sw − iy),
//! sw = (ix_ne − ix)(iy − iy_ne), se = (ix − ix_nw)(iy − iy_nw)
//! out = Σ over the four corners inside the map (nw, ne, sw, se order) of value · weight
//! ```
//!
//! Corners outside the map contribute nothing (zero padding; with border padding only corners
//! whose weight is zero can fall outside).

use crate::ops::dense::FeatureMap;
use crate::Error;
use rayon::prelude::*;

/// `padding_mode` of `F.grid_sample` (`reflection` is not implemented).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GridPadding {
    Zeros,
    Border,
}

/// Where one grid point samples: the north-west corner and the four weights (nw, ne, sw, se).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct GridTap {
    pub ix: i64,
    pub iy: i64,
    pub w: [f32; 4],
}

/// The source coordinate along one axis of `size` pixels for a normalized `g`.
pub(crate) fn unnormalize(g: f32, size: usize, align_corners: bool, padding: GridPadding) -> f32 {
    let s = size as f32;
    let c = if align_corners { (g + 1.0) / 2.0 * (s - 1.0) } else { ((g + 1.0) * s - 1.0) / 2.0 };
    match padding {
        GridPadding::Zeros => c,
        // clip_coordinates: min(size − 1, max(c, 0)); a NaN stays NaN (and samples nothing)
        GridPadding::Border => {
            if c.is_nan() {
                c
            } else {
                c.max(0.0).min(s - 1.0)
            }
        }
    }
}

/// The tap of grid point `(gx, gy)` on an `h × w` map.
pub(crate) fn tap(gx: f32, gy: f32, h: usize, w: usize, align_corners: bool, padding: GridPadding) -> GridTap {
    let ix = unnormalize(gx, w, align_corners, padding);
    let iy = unnormalize(gy, h, align_corners, padding);
    let (fx, fy) = (ix.floor(), iy.floor());
    let (ix_nw, iy_nw) = (fx, fy);
    let (ix_ne, iy_ne) = (fx + 1.0, fy);
    let (ix_sw, iy_sw) = (fx, fy + 1.0);
    let (ix_se, iy_se) = (fx + 1.0, fy + 1.0);
    let nw = (ix_se - ix) * (iy_se - iy);
    let ne = (ix - ix_sw) * (iy_sw - iy);
    let sw = (ix_ne - ix) * (iy - iy_ne);
    let se = (ix - ix_nw) * (iy - iy_nw);
    // a NaN or huge coordinate: every corner lies outside (i64::MIN is never in bounds)
    let to_i = |v: f32| if v.is_finite() && v.abs() < 1e9 { v as i64 } else { i64::MIN / 2 };
    GridTap { ix: to_i(fx), iy: to_i(fy), w: [nw, ne, sw, se] }
}

/// `F.grid_sample(x, grid, mode='bilinear', padding_mode, align_corners)` with one grid of
/// `oh × ow` points (`grid[(oy · ow + ox) · 2 + {0: x, 1: y}]`) for every image.
pub fn grid_sample(
    x: &FeatureMap,
    grid: &[f32],
    oh: usize,
    ow: usize,
    padding: GridPadding,
    align_corners: bool,
) -> Result<FeatureMap, Error> {
    let points = oh.checked_mul(ow).and_then(|p| p.checked_mul(2));
    if points != Some(grid.len()) {
        return Err(Error::InvalidInput(format!("grid_sample: grid of {} values for {oh} x {ow} points", grid.len())));
    }
    let mut out = FeatureMap::zeros(x.n, oh, ow, x.c)?;
    if out.data.is_empty() {
        return Ok(out);
    }
    let (h, w, c) = (x.h, x.w, x.c);
    let inside = |iy: i64, ix: i64| iy >= 0 && ix >= 0 && (iy as u64) < h as u64 && (ix as u64) < w as u64;
    out.data.par_chunks_mut(c).enumerate().for_each(|(p, o)| {
        let (b, q) = (p / (oh * ow), p % (oh * ow));
        let t = tap(grid[2 * q], grid[2 * q + 1], h, w, align_corners, padding);
        let corners = [(t.iy, t.ix), (t.iy, t.ix + 1), (t.iy + 1, t.ix), (t.iy + 1, t.ix + 1)];
        for (&(cy, cx), &wt) in corners.iter().zip(&t.w) {
            if inside(cy, cx) {
                let px = x.pixel(b, cy as usize, cx as usize);
                for (a, &v) in o.iter_mut().zip(px) {
                    *a += v * wt;
                }
            }
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook definition in f64: bilinear interpolation of a zero-padded (or clamped) map
    /// at a continuous pixel coordinate.
    fn naive(x: &FeatureMap, gx: f64, gy: f64, b: usize, ch: usize, pad: GridPadding, ac: bool) -> f64 {
        let un = |g: f64, n: usize| if ac { (g + 1.0) / 2.0 * (n as f64 - 1.0) } else { ((g + 1.0) * n as f64 - 1.0) / 2.0 };
        let (mut px, mut py) = (un(gx, x.w), un(gy, x.h));
        if pad == GridPadding::Border {
            px = px.clamp(0.0, x.w as f64 - 1.0);
            py = py.clamp(0.0, x.h as f64 - 1.0);
        }
        let val = |yy: i64, xx: i64| -> f64 {
            if yy < 0 || xx < 0 || yy >= x.h as i64 || xx >= x.w as i64 {
                0.0
            } else {
                x.pixel(b, yy as usize, xx as usize)[ch] as f64
            }
        };
        let (x0, y0) = (px.floor(), py.floor());
        let (lx, ly) = (px - x0, py - y0);
        let (x0, y0) = (x0 as i64, y0 as i64);
        val(y0, x0) * (1.0 - lx) * (1.0 - ly) + val(y0, x0 + 1) * lx * (1.0 - ly) + val(y0 + 1, x0) * (1.0 - lx) * ly + val(y0 + 1, x0 + 1) * lx * ly
    }

    fn map(n: usize, h: usize, w: usize, c: usize) -> FeatureMap {
        let data = (0..n * h * w * c).map(|i| ((i * 37 % 101) as f32) / 50.0 - 1.0).collect();
        FeatureMap::new(n, h, w, c, data).unwrap()
    }

    #[test]
    fn matches_naive_inside_and_outside() {
        let x = map(2, 5, 7, 3);
        // points inside, on the edges, half a pixel outside (zero padding half-weights), far
        // outside, and exactly on the corners
        let g: Vec<f32> = vec![
            0.0, 0.0, -0.93, 0.41, 0.77, -0.6, -1.0, -1.0, 1.0, 1.0, -1.1, 0.2, 1.08, -0.3, 0.3, 1.15, 3.0, 0.0, -1.0, 1.0,
            0.999, -0.999, -0.5, 0.25,
        ];
        let (oh, ow) = (3, 4);
        for pad in [GridPadding::Zeros, GridPadding::Border] {
            for ac in [false, true] {
                let y = grid_sample(&x, &g, oh, ow, pad, ac).unwrap();
                assert_eq!((y.n, y.h, y.w, y.c), (2, 3, 4, 3));
                for b in 0..2 {
                    for q in 0..oh * ow {
                        for ch in 0..3 {
                            let want = naive(&x, g[2 * q] as f64, g[2 * q + 1] as f64, b, ch, pad, ac);
                            let got = y.pixel(b, q / ow, q % ow)[ch] as f64;
                            assert!((got - want).abs() < 1e-5, "{pad:?} ac {ac} b {b} point {q} ch {ch}: {got} vs {want}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn known_values_and_padding() {
        // 1 x 2 map [10, 20]: align_corners false, gx = 0 is between the two pixel centres
        let x = FeatureMap::new(1, 1, 2, 1, vec![10.0, 20.0]).unwrap();
        let y = grid_sample(&x, &[0.0, 0.0], 1, 1, GridPadding::Zeros, false).unwrap();
        assert_eq!(y.data, vec![15.0]);
        // gx = -1 is the left edge of pixel 0 (coordinate -0.5): half of it with zero padding,
        // the edge value with border padding; gy = 0 is the centre of the single row
        let y = grid_sample(&x, &[-1.0, 0.0], 1, 1, GridPadding::Zeros, false).unwrap();
        assert_eq!(y.data, vec![5.0]);
        let y = grid_sample(&x, &[-1.0, 0.0], 1, 1, GridPadding::Border, false).unwrap();
        assert_eq!(y.data, vec![10.0]);
        // far outside: nothing with zeros, the edge with border
        let y = grid_sample(&x, &[5.0, 0.0, 0.0, -7.0], 1, 2, GridPadding::Zeros, false).unwrap();
        assert_eq!(y.data, vec![0.0, 0.0]);
        let y = grid_sample(&x, &[5.0, 0.0], 1, 1, GridPadding::Border, false).unwrap();
        assert_eq!(y.data, vec![20.0]);
        // align_corners true: -1 and 1 are the pixel centres of the ends
        let y = grid_sample(&x, &[-1.0, 0.0, 1.0, 0.0], 1, 2, GridPadding::Zeros, true).unwrap();
        assert_eq!(y.data, vec![10.0, 20.0]);
        // NaN samples nothing
        let y = grid_sample(&x, &[f32::NAN, 0.0], 1, 1, GridPadding::Zeros, false).unwrap();
        assert_eq!(y.data, vec![0.0]);
        // grid size mismatch
        assert!(grid_sample(&x, &[0.0; 3], 1, 2, GridPadding::Zeros, false).is_err());
    }
}
