//! Dense 2-D feature maps and the ops on them that the camera branch shares: convolution
//! (BatchNorm folded in, optional ReLU), bilinear resizing as `F.interpolate(mode='bilinear')`,
//! and channel concatenation.
//!
//! Layout: channels-last everywhere (NHWC), so a pixel's channels are contiguous: a 1×1 conv is a
//! plain GEMM over pixels and an im2col row is `kh · kw · cin` contiguous runs. PyTorch's NCHW
//! tensors (parity dumps, checkpoints) convert with [`FeatureMap::from_nchw`] /
//! [`FeatureMap::to_nchw`]. Conv weights keep PyTorch's `[cout, cin, kh, kw]` layout; each backend
//! reorders them for itself.
//!
//! CPU reference here (f32, rayon, fixed summation order so results do not depend on the thread
//! count); CUDA in `cuda` (FP16 storage, FP32 accumulation, cuBLAS GEMMs).

pub(crate) mod conv;
#[cfg(feature = "cuda-core")]
pub mod conv_engine;
pub(crate) mod conv_transpose;
#[cfg(feature = "cuda-core")]
pub mod cuda;
#[cfg(feature = "cuda-core")]
pub mod cuda_ops;
#[cfg(feature = "cuda-core")]
pub mod cudnn;
pub(crate) mod grid_sample;
pub(crate) mod resize;

pub use conv::{batch_norm_2d, batch_norm_2d_eps, Conv2d, BATCH_NORM_2D_EPS};
pub use conv_transpose::ConvTranspose2d;
pub use grid_sample::{grid_sample, GridPadding};
pub use resize::{bilinear_resize, concat_channels};

use crate::Error;

/// What follows a conv's bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    None,
    Relu,
}

/// A batch of `n` feature maps of `h × w` pixels and `c` channels, NHWC:
/// `data[((b · h + y) · w + x) · c + ch]`.
#[derive(Debug, Clone, PartialEq)]
pub struct FeatureMap {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub data: Vec<f32>,
}

/// `n · h · w · c`, or an error naming `what` when it overflows.
pub(crate) fn volume(n: usize, h: usize, w: usize, c: usize, what: &str) -> Result<usize, Error> {
    n.checked_mul(h)
        .and_then(|v| v.checked_mul(w))
        .and_then(|v| v.checked_mul(c))
        .ok_or_else(|| Error::InvalidInput(format!("{what}: {n} x {h} x {w} x {c} values overflow")))
}

impl FeatureMap {
    /// A map from NHWC values; errors when `data` does not hold `n · h · w · c` of them.
    pub fn new(n: usize, h: usize, w: usize, c: usize, data: Vec<f32>) -> Result<Self, Error> {
        let len = volume(n, h, w, c, "feature map")?;
        if data.len() != len {
            return Err(Error::InvalidInput(format!(
                "feature map: {} values for [n {n}, h {h}, w {w}, c {c}] (needs {len})",
                data.len()
            )));
        }
        Ok(Self { n, h, w, c, data })
    }

    /// An all-zero map.
    pub fn zeros(n: usize, h: usize, w: usize, c: usize) -> Result<Self, Error> {
        let len = volume(n, h, w, c, "feature map")?;
        Ok(Self { n, h, w, c, data: vec![0.0; len] })
    }

    /// A map from PyTorch's NCHW layout (`data[((b · c + ch) · h + y) · w + x]`).
    pub fn from_nchw(n: usize, c: usize, h: usize, w: usize, data: &[f32]) -> Result<Self, Error> {
        let len = volume(n, c, h, w, "feature map")?;
        if data.len() != len {
            return Err(Error::InvalidInput(format!(
                "feature map: {} values for NCHW [{n}, {c}, {h}, {w}] (needs {len})",
                data.len()
            )));
        }
        let mut out = vec![0f32; len];
        for b in 0..n {
            for ch in 0..c {
                for y in 0..h {
                    for x in 0..w {
                        out[((b * h + y) * w + x) * c + ch] = data[((b * c + ch) * h + y) * w + x];
                    }
                }
            }
        }
        Ok(Self { n, h, w, c, data: out })
    }

    /// The values in PyTorch's NCHW layout.
    pub fn to_nchw(&self) -> Vec<f32> {
        let (n, h, w, c) = (self.n, self.h, self.w, self.c);
        let mut out = vec![0f32; self.data.len()];
        for b in 0..n {
            for y in 0..h {
                for x in 0..w {
                    for ch in 0..c {
                        out[((b * c + ch) * h + y) * w + x] = self.data[((b * h + y) * w + x) * c + ch];
                    }
                }
            }
        }
        out
    }

    /// Pixels in the batch (`n · h · w`).
    pub fn pixels(&self) -> usize {
        self.n * self.h * self.w
    }

    /// The channels of pixel `(b, y, x)`.
    pub fn pixel(&self, b: usize, y: usize, x: usize) -> &[f32] {
        let i = ((b * self.h + y) * self.w + x) * self.c;
        &self.data[i..i + self.c]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nchw_round_trip_and_layout() {
        // NCHW [1, 2, 2, 3] with values 0..12: channel 0 is 0..6, channel 1 is 6..12.
        let nchw: Vec<f32> = (0..12).map(|v| v as f32).collect();
        let m = FeatureMap::from_nchw(1, 2, 2, 3, &nchw).unwrap();
        assert_eq!((m.n, m.h, m.w, m.c), (1, 2, 3, 2));
        // pixel (y 1, x 2) has channel 0 = 5, channel 1 = 11
        assert_eq!(m.pixel(0, 1, 2), &[5.0, 11.0]);
        assert_eq!(m.to_nchw(), nchw);
    }

    #[test]
    fn sizes_are_checked() {
        assert!(FeatureMap::new(1, 2, 2, 3, vec![0.0; 11]).is_err());
        assert!(FeatureMap::from_nchw(1, 2, 2, 3, &[0.0; 13]).is_err());
        assert!(FeatureMap::new(usize::MAX, 2, 2, 2, vec![]).is_err());
        assert!(FeatureMap::zeros(usize::MAX, 2, 1, 1).is_err());
        assert_eq!(FeatureMap::zeros(2, 3, 4, 5).unwrap().data.len(), 120);
    }
}
