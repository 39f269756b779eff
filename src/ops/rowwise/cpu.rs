//! Dense per-row layers on row-major `[N, C]` features (CPU reference, f32, rayon over rows):
//! Linear, LayerNorm, exact GELU, and inference BatchNorm folded to a per-channel affine map.
//!
//! Every row is computed by one thread in a fixed order, so results do not depend on the thread
//! count.

use crate::ops::sparse_conv::cpu::{fold_batch_norm, PreActivation};
use crate::Error;
use rayon::prelude::*;

/// `nn.Linear`: `y = x W^T + b`, weight `[out, in]` as PyTorch stores it.
#[derive(Debug, Clone)]
pub struct Linear {
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    pub in_features: usize,
    pub out_features: usize,
}

impl Linear {
    pub fn new(weight: Vec<f32>, bias: Option<Vec<f32>>, in_features: usize, out_features: usize) -> Result<Self, Error> {
        if in_features == 0 || out_features == 0 || weight.len() != in_features * out_features {
            return Err(Error::InvalidInput(format!(
                "linear: weight has {} values for [{out_features}, {in_features}]",
                weight.len()
            )));
        }
        if bias.as_ref().is_some_and(|b| b.len() != out_features) {
            return Err(Error::InvalidInput(format!("linear: bias length differs from {out_features} outputs")));
        }
        Ok(Self { weight, bias, in_features, out_features })
    }

    /// `x` is `[N, in]`; returns `[N, out]`.
    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>, Error> {
        let (fi, fo) = (self.in_features, self.out_features);
        if !x.len().is_multiple_of(fi) {
            return Err(Error::InvalidInput(format!("linear: input of {} values is not [N, {fi}]", x.len())));
        }
        let n = x.len() / fi;
        let mut out = vec![0f32; n * fo];
        out.par_chunks_mut(fo).zip(x.par_chunks(fi)).for_each(|(y, xr)| {
            for (o, yo) in y.iter_mut().enumerate() {
                let w = &self.weight[o * fi..(o + 1) * fi];
                let dot: f32 = w.iter().zip(xr).map(|(a, b)| a * b).sum();
                *yo = dot + self.bias.as_ref().map_or(0.0, |b| b[o]);
            }
        });
        Ok(out)
    }
}

/// `nn.LayerNorm(C)` over the last axis (biased variance, as PyTorch).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    pub gamma: Vec<f32>,
    pub beta: Vec<f32>,
    pub eps: f64,
}

/// PyTorch's default LayerNorm epsilon (SphereFormer uses the default).
pub const LAYER_NORM_EPS: f64 = 1e-5;

impl LayerNorm {
    pub fn new(gamma: Vec<f32>, beta: Vec<f32>) -> Result<Self, Error> {
        if gamma.is_empty() || gamma.len() != beta.len() {
            return Err(Error::InvalidInput(format!(
                "layer norm: weight {} and bias {} must have one equal, non-zero length",
                gamma.len(),
                beta.len()
            )));
        }
        Ok(Self { gamma, beta, eps: LAYER_NORM_EPS })
    }

    pub fn forward(&self, x: &[f32]) -> Result<Vec<f32>, Error> {
        let c = self.gamma.len();
        if !x.len().is_multiple_of(c) {
            return Err(Error::InvalidInput(format!("layer norm: input of {} values is not [N, {c}]", x.len())));
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(c).zip(x.par_chunks(c)).for_each(|(y, xr)| {
            // f64 statistics: the row mean/variance then carry no f32 cancellation error.
            let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
            let inv = 1.0 / (var + self.eps).sqrt();
            for i in 0..c {
                y[i] = ((xr[i] as f64 - mean) * inv * self.gamma[i] as f64 + self.beta[i] as f64) as f32;
            }
        });
        Ok(out)
    }
}

/// The error function, |error| < 1e-14 (std has no stable `erf`): a positive-term series below 3,
/// continued fraction of erfc above, ±1 past 6 where erfc(6) ≈ 2e-17 is below f64 resolution.
pub fn erf(x: f64) -> f64 {
    let a = x.abs();
    let r = if a < 3.0 {
        erf_series(a)
    } else if a < 6.0 {
        1.0 - erfc_continued_fraction(a)
    } else {
        1.0
    };
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// `erf(x) = 2/√π · exp(-x²) · Σ x (2x²)^n / (2n+1)!!`: every term positive, so no cancellation
/// (the alternating Maclaurin series loses ~3 digits near 3); ~70 terms at x = 3.
fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    for n in 1..300 {
        term *= 2.0 * x2 / (2 * n + 1) as f64;
        sum += term;
        if term < 1e-17 * sum {
            break;
        }
    }
    sum * (-x2).exp() * std::f64::consts::FRAC_2_SQRT_PI
}

/// `erfc(x) = exp(-x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …))))` for x ≥ 3, evaluated
/// bottom-up with enough terms to converge there.
fn erfc_continued_fraction(x: f64) -> f64 {
    let mut f = x;
    for k in (1..=80).rev() {
        f = x + (k as f64 / 2.0) / f;
    }
    (-x * x).exp() / (f * std::f64::consts::PI.sqrt())
}

/// Exact GELU `x · Φ(x) = 0.5 x (1 + erf(x / √2))` (`nn.GELU()` default, not the tanh form).
pub fn gelu(x: f32) -> f32 {
    let v = x as f64;
    (0.5 * v * (1.0 + erf(v * std::f64::consts::FRAC_1_SQRT_2))) as f32
}

/// GELU over a buffer, in place.
pub fn gelu_inplace(x: &mut [f32]) {
    x.par_iter_mut().for_each(|v| *v = gelu(*v));
}

/// SphereFormer's BatchNorm epsilon (`norm_fn = partial(nn.BatchNorm1d, eps=1e-4)`).
pub const BATCH_NORM_EPS: f32 = 1e-4;

/// Inference BatchNorm as `y = x · scale + shift` per channel (folded at load).
#[derive(Debug, Clone)]
pub struct BatchNorm {
    pub scale: Vec<f32>,
    pub shift: Vec<f32>,
}

impl BatchNorm {
    /// Folds `weight`, `bias`, `running_mean`, `running_var` with eps 1e-4.
    pub fn fold(gamma: &[f32], beta: &[f32], mean: &[f32], var: &[f32]) -> Result<Self, Error> {
        if let Some(v) = var.iter().find(|v| !(v.is_finite() && **v + BATCH_NORM_EPS > 0.0)) {
            return Err(Error::InvalidInput(format!("batch norm: running_var {v} gives no real 1/sqrt(var + eps)")));
        }
        let (scale, shift) = fold_batch_norm(gamma, beta, mean, var, BATCH_NORM_EPS)?;
        Ok(Self { scale, shift })
    }

    pub fn channels(&self) -> usize {
        self.scale.len()
    }

    /// BN followed by ReLU, fused into a conv's input gather.
    pub fn pre_relu(&self) -> PreActivation<'_> {
        PreActivation { scale: &self.scale, shift: &self.shift, relu: true }
    }

    /// BN + ReLU on `[N, C]` features (the `output_layer`), in place.
    pub fn relu_inplace(&self, x: &mut [f32]) -> Result<(), Error> {
        let c = self.channels();
        if c == 0 || !x.len().is_multiple_of(c) {
            return Err(Error::InvalidInput(format!("batch norm: input of {} values is not [N, {c}]", x.len())));
        }
        x.par_chunks_mut(c).for_each(|row| {
            for (i, v) in row.iter_mut().enumerate() {
                *v = (*v * self.scale[i] + self.shift[i]).max(0.0);
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_reference_values() {
        // Values from the closed tables (Abramowitz & Stegun 7.1 / high-precision software).
        let cases = [
            (0.0, 0.0),
            (0.1, 0.1124629160182849),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (2.9, 0.9999589021219005),
            (3.0, 0.9999779095030014),
            (3.5, 0.9999992569016276),
            (4.0, 0.9999999845827421),
            (6.5, 1.0),
        ];
        for (x, want) in cases {
            assert!((erf(x) - want).abs() < 1e-14, "erf({x}) = {} want {want}", erf(x));
            assert!((erf(-x) + want).abs() < 1e-14);
        }
    }

    #[test]
    fn gelu_values() {
        // GELU(1) = Φ(1) = 0.8413447460685429; GELU(-1) = -0.15865525393145707.
        assert!((gelu(1.0) as f64 - 0.841_344_746_068_542_9).abs() < 1e-7);
        assert!((gelu(-1.0) as f64 + 0.158_655_253_931_457_07).abs() < 1e-7);
        assert_eq!(gelu(0.0), 0.0);
    }

    #[test]
    fn linear_and_layer_norm() {
        let l = Linear::new(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], Some(vec![0.5, -0.5]), 3, 2).unwrap();
        assert_eq!(l.forward(&[1.0, 0.0, -1.0]).unwrap(), vec![-1.5, -2.5]);
        let ln = LayerNorm::new(vec![1.0, 1.0], vec![0.0, 0.0]).unwrap();
        let y = ln.forward(&[1.0, 3.0]).unwrap();
        // mean 2, var 1 -> ±1 / sqrt(1 + 1e-5)
        assert!((y[0] + 0.999995).abs() < 1e-6 && (y[1] - 0.999995).abs() < 1e-6);
    }
}
