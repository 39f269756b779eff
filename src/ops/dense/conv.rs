//! `nn.Conv2d` (groups 1, dilation 1) on NHWC maps, CPU reference, with an inference BatchNorm
//! folded into its weight and bias.

use crate::ops::dense::{volume, Activation, FeatureMap};
use crate::ops::rowwise::cpu::BatchNorm;
use crate::ops::sparse_conv::cpu::fold_batch_norm;
use crate::Error;
use rayon::prelude::*;

/// `nn.BatchNorm2d`'s default epsilon (BEVFusion's camera encoder and view transform use it).
pub const BATCH_NORM_2D_EPS: f32 = 1e-5;

/// An `nn.BatchNorm2d` (eps 1e-5) folded to `y = x · scale + shift` per channel, from its
/// `weight`, `bias`, `running_mean`, `running_var`.
pub fn batch_norm_2d(gamma: &[f32], beta: &[f32], mean: &[f32], var: &[f32]) -> Result<BatchNorm, Error> {
    batch_norm_2d_eps(gamma, beta, mean, var, BATCH_NORM_2D_EPS)
}

/// [`batch_norm_2d`] with another epsilon (mmcv's `BN` with `eps=1e-3` in SECOND / SECONDFPN).
/// The epsilon must be positive and finite; `var + eps` must be positive.
pub fn batch_norm_2d_eps(gamma: &[f32], beta: &[f32], mean: &[f32], var: &[f32], eps: f32) -> Result<BatchNorm, Error> {
    if !(eps.is_finite() && eps > 0.0) {
        return Err(Error::InvalidInput(format!("batch norm: eps {eps} must be a positive number")));
    }
    if let Some(v) = var.iter().find(|v| !(v.is_finite() && **v + eps > 0.0)) {
        return Err(Error::InvalidInput(format!("batch norm: running_var {v} gives no real 1/sqrt(var + eps)")));
    }
    let (scale, shift) = fold_batch_norm(gamma, beta, mean, var, eps)?;
    Ok(BatchNorm { scale, shift })
}

/// A 2-D convolution with PyTorch's weight layout `[cout, cin, kh, kw]`; zero padding.
#[derive(Debug, Clone, PartialEq)]
pub struct Conv2d {
    pub cin: usize,
    pub cout: usize,
    pub kh: usize,
    pub kw: usize,
    /// `[vertical, horizontal]`, as PyTorch's `stride=(sh, sw)`.
    pub stride: [usize; 2],
    /// `[vertical, horizontal]` zero padding on both sides.
    pub padding: [usize; 2],
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
}

impl Conv2d {
    /// Checks every size: non-zero channels, kernel and stride, weight `cout · cin · kh · kw`
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
                "conv2d: cin {cin}, cout {cout}, kernel {kh}x{kw}, stride {stride:?} must all be non-zero"
            )));
        }
        let len = volume(cout, cin, kh, kw, "conv2d weight")?;
        if weight.len() != len {
            return Err(Error::InvalidInput(format!(
                "conv2d: weight has {} values for [{cout}, {cin}, {kh}, {kw}]",
                weight.len()
            )));
        }
        if let Some(b) = &bias {
            if b.len() != cout {
                return Err(Error::InvalidInput(format!("conv2d: bias has {} values for {cout} outputs", b.len())));
            }
        }
        Ok(Self { cin, cout, kh, kw, stride, padding, weight, bias })
    }

    /// Folds a BatchNorm that follows this conv: `w' = w · scale[co]`,
    /// `b' = b · scale[co] + shift[co]` (b = 0 without a bias).
    pub fn fold_bn(&mut self, bn: &BatchNorm) -> Result<(), Error> {
        if bn.scale.len() != self.cout || bn.shift.len() != self.cout {
            return Err(Error::InvalidInput(format!(
                "conv2d: batch norm of {} channels after a conv of {} outputs",
                bn.scale.len(),
                self.cout
            )));
        }
        let per_out = self.cin * self.kh * self.kw;
        for (co, w) in self.weight.chunks_mut(per_out).enumerate() {
            w.iter_mut().for_each(|v| *v *= bn.scale[co]);
        }
        let bias = (0..self.cout)
            .map(|co| self.bias.as_ref().map_or(0.0, |b| b[co]) * bn.scale[co] + bn.shift[co])
            .collect();
        self.bias = Some(bias);
        Ok(())
    }

    /// Output height and width for an `h × w` input; errors when the kernel does not fit.
    pub fn output_size(&self, h: usize, w: usize) -> Result<(usize, usize), Error> {
        let (ph, pw) = (h + 2 * self.padding[0], w + 2 * self.padding[1]);
        if ph < self.kh || pw < self.kw {
            return Err(Error::InvalidInput(format!(
                "conv2d: a {}x{} kernel does not fit a {h}x{w} input padded by {:?}",
                self.kh, self.kw, self.padding
            )));
        }
        Ok(((ph - self.kh) / self.stride[0] + 1, (pw - self.kw) / self.stride[1] + 1))
    }

    /// The weight as `[kh, kw, cin, cout]`: the GEMM operand order of an NHWC input, output
    /// channels contiguous.
    fn weight_hwio(&self) -> Vec<f32> {
        let (ci_n, co_n, kh, kw) = (self.cin, self.cout, self.kh, self.kw);
        let mut t = vec![0f32; self.weight.len()];
        for co in 0..co_n {
            for ci in 0..ci_n {
                for ky in 0..kh {
                    for kx in 0..kw {
                        t[((ky * kw + kx) * ci_n + ci) * co_n + co] = self.weight[((co * ci_n + ci) * kh + ky) * kw + kx];
                    }
                }
            }
        }
        t
    }

    /// `act(conv(x) + bias)`. Each output pixel sums its taps in (ky, kx, ci) order, in f32,
    /// then adds the bias (the order the CUDA path's GEMM + epilogue follows).
    pub fn forward(&self, x: &FeatureMap, act: Activation) -> Result<FeatureMap, Error> {
        if x.c != self.cin {
            return Err(Error::InvalidInput(format!("conv2d: input has {} channels, the conv takes {}", x.c, self.cin)));
        }
        let (oh, ow) = self.output_size(x.h, x.w)?;
        let mut out = FeatureMap::zeros(x.n, oh, ow, self.cout)?;
        if out.data.is_empty() {
            return Ok(out);
        }
        let wt = self.weight_hwio();
        let (cin, cout) = (self.cin, self.cout);
        let row_len = ow * cout;
        out.data.par_chunks_mut(row_len).enumerate().for_each(|(row, orow)| {
            let (b, oy) = (row / oh, row % oh);
            for ox in 0..ow {
                let acc = &mut orow[ox * cout..(ox + 1) * cout];
                for ky in 0..self.kh {
                    // padded input row; outside [0, h) is zero padding
                    let iy = (oy * self.stride[0] + ky) as isize - self.padding[0] as isize;
                    if iy < 0 || iy >= x.h as isize {
                        continue;
                    }
                    for kx in 0..self.kw {
                        let ix = (ox * self.stride[1] + kx) as isize - self.padding[1] as isize;
                        if ix < 0 || ix >= x.w as isize {
                            continue;
                        }
                        let px = x.pixel(b, iy as usize, ix as usize);
                        let wk = &wt[(ky * self.kw + kx) * cin * cout..(ky * self.kw + kx + 1) * cin * cout];
                        for (ci, &xv) in px.iter().enumerate() {
                            let wrow = &wk[ci * cout..(ci + 1) * cout];
                            for (a, &wv) in acc.iter_mut().zip(wrow) {
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
    use crate::nn::random::SplitMix;

    fn random(rng: &mut SplitMix, len: usize) -> Vec<f32> {
        (0..len).map(|_| rng.uniform(-1.0, 1.0)).collect()
    }

    /// PyTorch's definition written out over NCHW input and output, in f64.
    fn direct_nchw(conv: &Conv2d, x: &[f64], n: usize, h: usize, w: usize) -> (Vec<f64>, usize, usize) {
        let oh = (h + 2 * conv.padding[0] - conv.kh) / conv.stride[0] + 1;
        let ow = (w + 2 * conv.padding[1] - conv.kw) / conv.stride[1] + 1;
        let mut y = vec![0f64; n * conv.cout * oh * ow];
        for b in 0..n {
            for co in 0..conv.cout {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut s = conv.bias.as_ref().map_or(0.0, |v| v[co] as f64);
                        for ci in 0..conv.cin {
                            for ky in 0..conv.kh {
                                for kx in 0..conv.kw {
                                    let iy = (oy * conv.stride[0] + ky) as i64 - conv.padding[0] as i64;
                                    let ix = (ox * conv.stride[1] + kx) as i64 - conv.padding[1] as i64;
                                    if iy < 0 || ix < 0 || iy >= h as i64 || ix >= w as i64 {
                                        continue;
                                    }
                                    let xv = x[((b * conv.cin + ci) * h + iy as usize) * w + ix as usize];
                                    let wv = conv.weight[((co * conv.cin + ci) * conv.kh + ky) * conv.kw + kx] as f64;
                                    s += xv * wv;
                                }
                            }
                        }
                        y[((b * conv.cout + co) * oh + oy) * ow + ox] = s;
                    }
                }
            }
        }
        (y, oh, ow)
    }

    #[test]
    fn conv_matches_direct_loop() {
        let mut rng = SplitMix(7);
        // (cin, cout, k, stride, pad, n, h, w): 1x1, 3x3 pad 1, 3x3 stride 2 pad 1, 4x4 stride 4
        // (a patch embedding), an asymmetric 1x3 and a kernel larger than the stride.
        let cases = [
            (5, 7, [1, 1], [1, 1], [0, 0], 2, 6, 9),
            (4, 6, [3, 3], [1, 1], [1, 1], 1, 7, 5),
            (6, 3, [3, 3], [2, 2], [1, 1], 2, 9, 8),
            (3, 8, [4, 4], [4, 4], [0, 0], 1, 16, 12),
            (2, 4, [1, 3], [1, 2], [0, 1], 1, 5, 7),
            (3, 2, [5, 5], [2, 3], [2, 1], 1, 11, 10),
        ];
        for (i, &(cin, cout, k, s, p, n, h, w)) in cases.iter().enumerate() {
            let weight = random(&mut rng, cout * cin * k[0] * k[1]);
            let bias = if i % 2 == 0 { Some(random(&mut rng, cout)) } else { None };
            let conv = Conv2d::new(cin, cout, k[0], k[1], s, p, weight, bias).unwrap();
            let x_nchw = random(&mut rng, n * cin * h * w);
            let x = FeatureMap::from_nchw(n, cin, h, w, &x_nchw).unwrap();
            let xd: Vec<f64> = x_nchw.iter().map(|&v| v as f64).collect();
            let (want, oh, ow) = direct_nchw(&conv, &xd, n, h, w);
            for act in [Activation::None, Activation::Relu] {
                let y = conv.forward(&x, act).unwrap();
                assert_eq!((y.n, y.h, y.w, y.c), (n, oh, ow, cout), "case {i}");
                let got = y.to_nchw();
                for (j, (&g, &r)) in got.iter().zip(&want).enumerate() {
                    let r = if act == Activation::Relu { r.max(0.0) } else { r };
                    // f32 sums of at most 75 products of values in [-1, 1]
                    assert!((g as f64 - r).abs() < 1e-5, "case {i} {act:?} value {j}: {g} vs {r}");
                }
            }
        }
    }

    #[test]
    fn batch_norm_folds_into_weight_and_bias() {
        let mut rng = SplitMix(11);
        let (cin, cout) = (3, 4);
        let conv = Conv2d::new(cin, cout, 3, 3, [1, 1], [1, 1], random(&mut rng, cout * cin * 9), Some(random(&mut rng, cout))).unwrap();
        let gamma = random(&mut rng, cout);
        let beta = random(&mut rng, cout);
        let mean = random(&mut rng, cout);
        let var: Vec<f32> = (0..cout).map(|_| rng.uniform(0.5, 1.5)).collect();
        let bn = batch_norm_2d(&gamma, &beta, &mean, &var).unwrap();
        let mut folded = conv.clone();
        folded.fold_bn(&bn).unwrap();
        let x = FeatureMap::new(1, 5, 4, cin, random(&mut rng, 5 * 4 * cin)).unwrap();
        let y = conv.forward(&x, Activation::None).unwrap();
        let yf = folded.forward(&x, Activation::Relu).unwrap();
        for (i, (&a, &b)) in y.data.iter().zip(&yf.data).enumerate() {
            let co = i % cout;
            // BatchNorm2d at inference, written out (eps 1e-5)
            let bn_ref = (a - mean[co]) / (var[co] + 1e-5).sqrt() * gamma[co] + beta[co];
            assert!((bn_ref.max(0.0) - b).abs() < 1e-5, "value {i}: {} vs {b}", bn_ref.max(0.0));
        }
        // a conv without bias gets one
        let mut nb = Conv2d::new(cin, cout, 1, 1, [1, 1], [0, 0], random(&mut rng, cout * cin), None).unwrap();
        nb.fold_bn(&bn).unwrap();
        assert_eq!(nb.bias.as_deref(), Some(&bn.shift[..]));
        // channel count mismatch
        let bn3 = batch_norm_2d(&gamma[..3], &beta[..3], &mean[..3], &var[..3]).unwrap();
        assert!(nb.fold_bn(&bn3).is_err());
        assert!(batch_norm_2d(&gamma, &beta, &mean, &[1.0, -1.0, 1.0, 1.0]).is_err());
        assert!(batch_norm_2d(&gamma, &beta, &mean, &[1.0, f32::NAN, 1.0, 1.0]).is_err());
    }

    #[test]
    fn batch_norm_eps_is_used() {
        // var 0: scale = gamma / sqrt(eps) exactly shows which eps was used
        let bn = batch_norm_2d_eps(&[1.0], &[0.5], &[2.0], &[0.0], 1e-3).unwrap();
        let want = 1.0 / 1e-3f32.sqrt();
        assert!((bn.scale[0] - want).abs() < 1e-6 * want, "{} vs {want}", bn.scale[0]);
        assert!((bn.shift[0] - (0.5 - 2.0 * want)).abs() < 1e-4);
        // the default is 1e-5, unchanged for existing callers
        let d = batch_norm_2d(&[1.0], &[0.0], &[0.0], &[0.0]).unwrap();
        let e = batch_norm_2d_eps(&[1.0], &[0.0], &[0.0], &[0.0], BATCH_NORM_2D_EPS).unwrap();
        assert_eq!((&d.scale, &d.shift), (&e.scale, &e.shift));
        assert!((d.scale[0] - 1.0 / 1e-5f32.sqrt()).abs() < 1e-2);
        // var -5e-4 folds with eps 1e-3 but not with 1e-5; a bad eps is an error
        assert!(batch_norm_2d_eps(&[1.0], &[0.0], &[0.0], &[-5e-4], 1e-3).is_ok());
        assert!(batch_norm_2d(&[1.0], &[0.0], &[0.0], &[-5e-4]).is_err());
        for eps in [0.0, -1e-3, f32::NAN, f32::INFINITY] {
            assert!(batch_norm_2d_eps(&[1.0], &[0.0], &[0.0], &[1.0], eps).is_err(), "eps {eps}");
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(Conv2d::new(0, 1, 1, 1, [1, 1], [0, 0], vec![], None).is_err());
        assert!(Conv2d::new(1, 1, 1, 1, [0, 1], [0, 0], vec![1.0], None).is_err());
        assert!(Conv2d::new(2, 1, 1, 1, [1, 1], [0, 0], vec![1.0], None).is_err());
        assert!(Conv2d::new(1, 2, 1, 1, [1, 1], [0, 0], vec![1.0, 2.0], Some(vec![0.0])).is_err());
        let c = Conv2d::new(1, 1, 3, 3, [1, 1], [0, 0], vec![0.0; 9], None).unwrap();
        // wrong channel count, kernel larger than the input
        assert!(c.forward(&FeatureMap::zeros(1, 4, 4, 2).unwrap(), Activation::None).is_err());
        assert!(c.forward(&FeatureMap::zeros(1, 2, 4, 1).unwrap(), Activation::None).is_err());
        assert_eq!(c.output_size(4, 5).unwrap(), (2, 3));
    }
}
