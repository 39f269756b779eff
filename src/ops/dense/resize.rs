//! Bilinear resizing exactly as `F.interpolate(mode='bilinear')` and channel concatenation.

use crate::ops::dense::FeatureMap;
use crate::Error;
use rayon::prelude::*;

/// Source coordinate weights along one axis, PyTorch's `upsample_bilinear2d` arithmetic in f32
/// (its `opmath` type for float): per output index the lower source index, the upper one (the
/// same at the last row/column) and the upper weight.
pub(crate) fn axis_taps(input: usize, output: usize, align_corners: bool) -> Vec<(usize, usize, f32)> {
    // area_pixel_compute_scale: with align_corners the corners map onto each other; otherwise
    // in / out. (Called with `scale_factor=s`, PyTorch uses 1 / s, which equals in / out when
    // out = in · s exactly: the case for every caller in BEVFusion.)
    let scale = if align_corners {
        if output > 1 {
            (input as f32 - 1.0) / (output as f32 - 1.0)
        } else {
            0.0
        }
    } else {
        input as f32 / output as f32
    };
    (0..output)
        .map(|o| {
            let src = if align_corners {
                scale * o as f32
            } else {
                // half-pixel centres, clamped at 0 (linear mode)
                (scale * (o as f32 + 0.5) - 0.5).max(0.0)
            };
            let i0 = (src.floor() as usize).min(input - 1);
            let i1 = if i0 < input - 1 { i0 + 1 } else { i0 };
            let l1 = (src - i0 as f32).clamp(0.0, 1.0);
            (i0, i1, l1)
        })
        .collect()
}

/// `F.interpolate(x, size=(oh, ow), mode='bilinear', align_corners=...)` on an NHWC map. Each
/// output is `(1-ly)·((1-lx)·x00 + lx·x01) + ly·((1-lx)·x10 + lx·x11)` in f32, PyTorch's order.
pub fn bilinear_resize(x: &FeatureMap, oh: usize, ow: usize, align_corners: bool) -> FeatureMap {
    let (n, c) = (x.n, x.c);
    let mut data = vec![0f32; n * oh * ow * c];
    if data.is_empty() || x.h == 0 || x.w == 0 {
        return FeatureMap { n, h: oh, w: ow, c, data };
    }
    let ty = axis_taps(x.h, oh, align_corners);
    let tx = axis_taps(x.w, ow, align_corners);
    data.par_chunks_mut(ow * c).enumerate().for_each(|(row, out)| {
        let (b, oy) = (row / oh, row % oh);
        let (y0, y1, ly) = ty[oy];
        let hy = 1.0 - ly;
        for (ox, &(x0, x1, lx)) in tx.iter().enumerate() {
            let hx = 1.0 - lx;
            let (p00, p01) = (x.pixel(b, y0, x0), x.pixel(b, y0, x1));
            let (p10, p11) = (x.pixel(b, y1, x0), x.pixel(b, y1, x1));
            for ch in 0..c {
                out[ox * c + ch] = hy * (hx * p00[ch] + lx * p01[ch]) + ly * (hx * p10[ch] + lx * p11[ch]);
            }
        }
    });
    FeatureMap { n, h: oh, w: ow, c, data }
}

/// `torch.cat([a, b], dim=1)` of NCHW tensors: each pixel's channels are `a`'s then `b`'s.
pub fn concat_channels(a: &FeatureMap, b: &FeatureMap) -> Result<FeatureMap, Error> {
    if (a.n, a.h, a.w) != (b.n, b.h, b.w) {
        return Err(Error::InvalidInput(format!(
            "concat: maps of [n {}, h {}, w {}] and [n {}, h {}, w {}] differ in size",
            a.n, a.h, a.w, b.n, b.h, b.w
        )));
    }
    let c = a.c + b.c;
    let mut out = FeatureMap::zeros(a.n, a.h, a.w, c)?;
    if c == 0 {
        return Ok(out);
    }
    out.data.par_chunks_mut(c).enumerate().for_each(|(p, o)| {
        o[..a.c].copy_from_slice(&a.data[p * a.c..(p + 1) * a.c]);
        o[a.c..].copy_from_slice(&b.data[p * b.c..(p + 1) * b.c]);
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_channel(h: usize, w: usize, v: &[f32]) -> FeatureMap {
        FeatureMap::new(1, h, w, 1, v.to_vec()).unwrap()
    }

    #[test]
    fn bilinear_half_pixel_upsample_by_two() {
        // 1 x 2 -> 1 x 4, align_corners False: scale 0.5, sources -0.25 -> 0, 0.25, 0.75, 1.25
        // (clamped to the last column): values 1, 1.25, 1.75, 2 for input [1, 2].
        let y = bilinear_resize(&one_channel(1, 2, &[1.0, 2.0]), 1, 4, false);
        assert_eq!(y.data, vec![1.0, 1.25, 1.75, 2.0]);
        // 2 x 2 -> 3 x 3 (size given, scale 2/3): source coordinate of output i is
        // (i + 0.5)·2/3 - 0.5 = -1/6 -> 0, 0.5, 7/6 -> (1, weight 1/6 ignored: clamped to 1).
        let x = one_channel(2, 2, &[0.0, 10.0, 20.0, 30.0]);
        let y = bilinear_resize(&x, 3, 3, false);
        let want = [0.0, 5.0, 10.0, 10.0, 15.0, 20.0, 20.0, 25.0, 30.0];
        for (g, w) in y.data.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{:?} vs {want:?}", y.data);
        }
    }

    #[test]
    fn bilinear_align_corners() {
        // 1 x 3 -> 1 x 5 with align_corners: scale (3-1)/(5-1) = 0.5, sources 0, 0.5, 1, 1.5, 2.
        let y = bilinear_resize(&one_channel(1, 3, &[0.0, 4.0, 6.0]), 1, 5, true);
        assert_eq!(y.data, vec![0.0, 2.0, 4.0, 5.0, 6.0]);
        // 2 x 2 -> 4 x 4: corners kept, the centre the mean of all four.
        let x = one_channel(2, 2, &[1.0, 2.0, 3.0, 4.0]);
        let y = bilinear_resize(&x, 4, 4, true);
        assert_eq!((y.data[0], y.data[3], y.data[12], y.data[15]), (1.0, 2.0, 3.0, 4.0));
        // output (1, 2): source (1/3, 2/3) -> 1 + 2/3 + 2·1/3 = 7/3
        assert!((y.data[6] - 7.0 / 3.0).abs() < 1e-6);
        // one output row: scale 0, the first input row
        let y = bilinear_resize(&x, 1, 2, true);
        assert_eq!(y.data, vec![1.0, 2.0]);
    }

    #[test]
    fn bilinear_downsample_and_channels() {
        // 1 x 4 -> 1 x 2 without align_corners: sources 0.5 and 2.5
        let x = FeatureMap::new(1, 1, 4, 2, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]).unwrap();
        let y = bilinear_resize(&x, 1, 2, false);
        // channel 0 holds 0, 2, 4, 6; channel 1 holds 1, 3, 5, 7
        assert_eq!(y.data, vec![1.0, 2.0, 5.0, 6.0]);
        // identity size is the identity
        assert_eq!(bilinear_resize(&x, 1, 4, false).data, x.data);
        assert_eq!(bilinear_resize(&x, 1, 4, true).data, x.data);
    }

    #[test]
    fn concat_puts_a_first() {
        let a = FeatureMap::new(1, 1, 2, 2, vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = FeatureMap::new(1, 1, 2, 1, vec![9.0, 8.0]).unwrap();
        let c = concat_channels(&a, &b).unwrap();
        assert_eq!((c.c, c.data.clone()), (3, vec![1.0, 2.0, 9.0, 3.0, 4.0, 8.0]));
        let wrong = FeatureMap::zeros(1, 2, 1, 1).unwrap();
        assert!(concat_channels(&a, &wrong).is_err());
    }
}
