//! `nn.ConvTranspose2d` (groups 1, dilation 1, no output padding) on NHWC maps, CPU reference,
//! with an inference BatchNorm folded in. SECONDFPN upsamples with it (`deconv`, kernel = stride
//! = 2, no bias).
//!
//! Definition (PyTorch's, written for NHWC): every input pixel `(iy, ix)` scatters
//! `x[iy, ix, ci] · w[ci, co, ky, kx]` onto output pixel `(iy · sh − ph + ky, ix · sw − pw + kx)`;
//! the output is `(h − 1) · s − 2p + k` along each axis. The weight keeps PyTorch's layout
//! `[cin, cout, kh, kw]` (in and out swapped relative to `nn.Conv2d`).

use crate::ops::dense::{volume, Activation, FeatureMap};
use crate::ops::rowwise::cpu::BatchNorm;
use crate::Error;
use rayon::prelude::*;

/// A transposed 2-D convolution.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvTranspose2d {
    pub cin: usize,
    pub cout: usize,
    pub kh: usize,
    pub kw: usize,
    /// `[vertical, horizontal]`.
    pub stride: [usize; 2],
    /// `[vertical, horizontal]`: rows / columns cropped from each side of the full output.
    pub padding: [usize; 2],
    /// `[cin, cout, kh, kw]`.
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

impl ConvTranspose2d {
    /// Checks every size: non-zero channels, kernel and stride, weight `cin · cout · kh · kw`
    /// values, bias `cout`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cin: usize,
        cout: usize,
        kh: usize,
        kw: usize,
        stride: [usize; 2],
        padding: [usize; 2],
        weight: Vec<f32>,
        bias: Option<Vec<f32>>,
    ) -> Result<Self, Error> {
        if cin == 0 || cout == 0 || kh == 0 || kw == 0 || stride[0] == 0 || stride[1] == 0 {
            return Err(Error::InvalidInput(format!(
                "conv_transpose2d: cin {cin}, cout {cout}, kernel {kh}x{kw}, stride {stride:?} must all be non-zero"
            )));
        }
        let len = volume(cin, cout, kh, kw, "conv_transpose2d weight")?;
        if weight.len() != len {
            return Err(Error::InvalidInput(format!(
                "conv_transpose2d: weight has {} values for [{cin}, {cout}, {kh}, {kw}]",
                weight.len()
            )));
        }
        if let Some(b) = &bias {
            if b.len() != cout {
                return Err(Error::InvalidInput(format!("conv_transpose2d: bias has {} values for {cout} outputs", b.len())));
            }
        }
        Ok(Self { cin, cout, kh, kw, stride, padding, weight, bias })
    }

    /// Folds a BatchNorm that follows: `w'[ci, co] = w[ci, co] · scale[co]`,
    /// `b' = b · scale + shift` (b = 0 without a bias).
    pub fn fold_bn(&mut self, bn: &BatchNorm) -> Result<(), Error> {
        if bn.scale.len() != self.cout || bn.shift.len() != self.cout {
            return Err(Error::InvalidInput(format!(
                "conv_transpose2d: batch norm of {} channels after a deconv of {} outputs",
                bn.scale.len(),
                self.cout
            )));
        }
        let taps = self.kh * self.kw;
        for (i, w) in self.weight.iter_mut().enumerate() {
            *w *= bn.scale[(i / taps) % self.cout];
        }
        let bias = (0..self.cout)
            .map(|co| self.bias.as_ref().map_or(0.0, |b| b[co]) * bn.scale[co] + bn.shift[co])
            .collect();
        self.bias = Some(bias);
        Ok(())
    }

    /// Output height and width for an `h × w` input; errors when the padding crops everything.
    pub fn output_size(&self, h: usize, w: usize) -> Result<(usize, usize), Error> {
        let full = |n: usize, s: usize, k: usize| n.checked_sub(1).map(|v| v * s + k);
        let (fh, fw) = match (full(h, self.stride[0], self.kh), full(w, self.stride[1], self.kw)) {
            (Some(a), Some(b)) => (a, b),
            _ => return Err(Error::InvalidInput(format!("conv_transpose2d: empty {h}x{w} input"))),
        };
        if fh <= 2 * self.padding[0] || fw <= 2 * self.padding[1] {
            return Err(Error::InvalidInput(format!(
                "conv_transpose2d: padding {:?} crops the whole {fh}x{fw} output",
                self.padding
            )));
        }
        Ok((fh - 2 * self.padding[0], fw - 2 * self.padding[1]))
    }

    /// `act(conv_transpose(x) + bias)`. Each output value gathers its contributions in
    /// (ky, kx, ci) order in f32 (input pixel `iy = (oy + ph − ky) / sh` where that divides),
    /// then adds the bias.
    pub fn forward(&self, x: &FeatureMap, act: Activation) -> Result<FeatureMap, Error> {
        if x.c != self.cin {
            return Err(Error::InvalidInput(format!(
                "conv_transpose2d: input has {} channels, the deconv takes {}",
                x.c, self.cin
            )));
        }
        let (oh, ow) = self.output_size(x.h, x.w)?;
        let mut out = FeatureMap::zeros(x.n, oh, ow, self.cout)?;
        if out.data.is_empty() {
            return Ok(out);
        }
        // [ky, kx, ci, co]: output channels contiguous
        let (cin, cout, kh, kw) = (self.cin, self.cout, self.kh, self.kw);
        let mut wt = vec![0f32; self.weight.len()];
        for ci in 0..cin {
            for co in 0..cout {
                for ky in 0..kh {
                    for kx in 0..kw {
                        wt[((ky * kw + kx) * cin + ci) * cout + co] = self.weight[((ci * cout + co) * kh + ky) * kw + kx];
                    }
                }
            }
        }
        // the input index along one axis that output `o` reads through tap `k`, if any
        let src = |o: usize, k: usize, s: usize, p: usize, n: usize| -> Option<usize> {
            let t = (o + p).checked_sub(k)?;
            (t % s == 0 && t / s < n).then_some(t / s)
        };
        out.data.par_chunks_mut(ow * cout).enumerate().for_each(|(row, orow)| {
            let (b, oy) = (row / oh, row % oh);
            for ox in 0..ow {
                let acc = &mut orow[ox * cout..(ox + 1) * cout];
                for ky in 0..kh {
                    let Some(iy) = src(oy, ky, self.stride[0], self.padding[0], x.h) else { continue };
                    for kx in 0..kw {
                        let Some(ix) = src(ox, kx, self.stride[1], self.padding[1], x.w) else { continue };
                        let px = x.pixel(b, iy, ix);
                        let wk = &wt[(ky * kw + kx) * cin * cout..(ky * kw + kx + 1) * cin * cout];
                        for (ci, &xv) in px.iter().enumerate() {
                            for (a, &wv) in acc.iter_mut().zip(&wk[ci * cout..(ci + 1) * cout]) {
                                *a += xv * wv;
                            }
                        }
                    }
                }
                for (co, a) in acc.iter_mut().enumerate() {
                    let v = *a + self.bias.as_ref().map_or(0.0, |bias| bias[co]);
                    *a = match act {
                        Activation::None => v,
                        Activation::Relu => v.max(0.0),
                    };
                }
            }
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::dense::batch_norm_2d_eps;
    use crate::nn::random::SplitMix;

    fn random(rng: &mut SplitMix, len: usize) -> Vec<f32> {
        (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect()
    }

    /// PyTorch's definition as a scatter over NCHW input, in f64: every input value times every
    /// tap lands on `iy · s − p + ky`, dropped outside the output.
    fn scatter_nchw(d: &ConvTranspose2d, x: &[f64], n: usize, h: usize, w: usize) -> (Vec<f64>, usize, usize) {
        let oh = (h - 1) * d.stride[0] + d.kh - 2 * d.padding[0];
        let ow = (w - 1) * d.stride[1] + d.kw - 2 * d.padding[1];
        let mut y = vec![0f64; n * d.cout * oh * ow];
        for b in 0..n {
            for co in 0..d.cout {
                let bias = d.bias.as_ref().map_or(0.0, |v| v[co] as f64);
                y[(b * d.cout + co) * oh * ow..(b * d.cout + co + 1) * oh * ow].iter_mut().for_each(|v| *v = bias);
            }
            for ci in 0..d.cin {
                for iy in 0..h {
                    for ix in 0..w {
                        let xv = x[((b * d.cin + ci) * h + iy) * w + ix];
                        for co in 0..d.cout {
                            for ky in 0..d.kh {
                                for kx in 0..d.kw {
                                    let oy = (iy * d.stride[0] + ky) as i64 - d.padding[0] as i64;
                                    let ox = (ix * d.stride[1] + kx) as i64 - d.padding[1] as i64;
                                    if oy < 0 || ox < 0 || oy >= oh as i64 || ox >= ow as i64 {
                                        continue;
                                    }
                                    let wv = d.weight[((ci * d.cout + co) * d.kh + ky) * d.kw + kx] as f64;
                                    y[((b * d.cout + co) * oh + oy as usize) * ow + ox as usize] += xv * wv;
                                }
                            }
                        }
                    }
                }
            }
        }
        (y, oh, ow)
    }

    #[test]
    fn matches_scatter_definition() {
        let mut rng = SplitMix(21);
        // (cin, cout, k, stride, pad, n, h, w): SECONDFPN's k2 s2; k1 s1 (a 1x1 conv with the
        // weight transposed); overlapping k3 s2 p1; asymmetric k (2, 3) s (2, 1); k < s (gaps).
        let cases = [
            (5, 4, [2, 2], [2, 2], [0, 0], 2, 3, 4),
            (3, 6, [1, 1], [1, 1], [0, 0], 1, 4, 3),
            (4, 3, [3, 3], [2, 2], [1, 1], 1, 5, 4),
            (2, 5, [2, 3], [2, 1], [0, 1], 1, 3, 5),
            (3, 2, [1, 2], [3, 2], [0, 0], 2, 2, 3),
        ];
        for (i, &(cin, cout, k, s, p, n, h, w)) in cases.iter().enumerate() {
            let weight = random(&mut rng, cin * cout * k[0] * k[1]);
            let bias = if i % 2 == 1 { Some(random(&mut rng, cout)) } else { None };
            let d = ConvTranspose2d::new(cin, cout, k[0], k[1], s, p, weight, bias).unwrap();
            let x_nchw = random(&mut rng, n * cin * h * w);
            let x = FeatureMap::from_nchw(n, cin, h, w, &x_nchw).unwrap();
            let xd: Vec<f64> = x_nchw.iter().map(|&v| v as f64).collect();
            let (want, oh, ow) = scatter_nchw(&d, &xd, n, h, w);
            assert_eq!(d.output_size(h, w).unwrap(), (oh, ow), "case {i}");
            for act in [Activation::None, Activation::Relu] {
                let y = d.forward(&x, act).unwrap();
                assert_eq!((y.n, y.h, y.w, y.c), (n, oh, ow, cout), "case {i}");
                for (j, (&g, &r)) in y.to_nchw().iter().zip(&want).enumerate() {
                    let r = if act == Activation::Relu { r.max(0.0) } else { r };
                    // f32 sums of at most cin * 4 products of values in [-1, 1]
                    assert!((g as f64 - r).abs() < 1e-5, "case {i} {act:?} value {j}: {g} vs {r}");
                }
            }
        }
    }

    #[test]
    fn batch_norm_folds() {
        let mut rng = SplitMix(5);
        let (cin, cout) = (3, 4);
        let d = ConvTranspose2d::new(cin, cout, 2, 2, [2, 2], [0, 0], random(&mut rng, cin * cout * 4), None).unwrap();
        let (g, b, m) = (random(&mut rng, cout), random(&mut rng, cout), random(&mut rng, cout));
        let var: Vec<f32> = (0..cout).map(|_| rng.uniform(0.5, 1.5)).collect();
        let bn = batch_norm_2d_eps(&g, &b, &m, &var, 1e-3).unwrap();
        let mut f = d.clone();
        f.fold_bn(&bn).unwrap();
        let x = FeatureMap::new(1, 3, 2, cin, random(&mut rng, 6 * cin)).unwrap();
        let y = d.forward(&x, Activation::None).unwrap();
        let yf = f.forward(&x, Activation::Relu).unwrap();
        for (i, (&a, &v)) in y.data.iter().zip(&yf.data).enumerate() {
            let co = i % cout;
            let want = ((a - m[co]) / (var[co] + 1e-3).sqrt() * g[co] + b[co]).max(0.0);
            assert!((want - v).abs() < 1e-5, "value {i}: {want} vs {v}");
        }
        let bn3 = batch_norm_2d_eps(&g[..3], &b[..3], &m[..3], &var[..3], 1e-3).unwrap();
        assert!(f.fold_bn(&bn3).is_err());
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(ConvTranspose2d::new(0, 1, 2, 2, [2, 2], [0, 0], vec![], None).is_err());
        assert!(ConvTranspose2d::new(1, 1, 2, 2, [0, 2], [0, 0], vec![0.0; 4], None).is_err());
        assert!(ConvTranspose2d::new(1, 2, 2, 2, [2, 2], [0, 0], vec![0.0; 4], None).is_err());
        assert!(ConvTranspose2d::new(1, 2, 1, 1, [1, 1], [0, 0], vec![0.0; 2], Some(vec![0.0])).is_err());
        let d = ConvTranspose2d::new(2, 1, 2, 2, [2, 2], [0, 0], vec![0.0; 8], None).unwrap();
        assert!(d.forward(&FeatureMap::zeros(1, 2, 2, 3).unwrap(), Activation::None).is_err());
        assert!(d.forward(&FeatureMap::zeros(1, 0, 2, 2).unwrap(), Activation::None).is_err());
        assert_eq!(d.output_size(3, 5).unwrap(), (6, 10));
        let p = ConvTranspose2d::new(1, 1, 1, 1, [1, 1], [1, 0], vec![1.0], None).unwrap();
        assert!(p.output_size(2, 2).is_err());
    }
}
