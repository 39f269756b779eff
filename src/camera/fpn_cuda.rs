//! The neck on CUDA: `fpn.rs`'s GeneralizedLSSFPN with `dense::cuda`'s ops (bilinear resize,
//! channel concat, conv as cuBLAS GEMM with the folded BatchNorm and ReLU in its epilogue).

use super::fpn::{ConvModule, GeneralizedLssFpn};
use crate::dense::cuda::{bilinear_resize_cuda, concat_channels_cuda, CudaConv2d, CudaFeatureMap};
use crate::dense::Activation;
use crate::device::cuda::CudaDevice;
use crate::Error;
use cudarc::cublas::CudaBlas;

struct GpuConvModule {
    conv: CudaConv2d,
    act: Activation,
}

impl GpuConvModule {
    fn upload(dev: &CudaDevice, m: &ConvModule) -> Result<Self, Error> {
        Ok(Self { conv: CudaConv2d::upload(dev, &m.conv)?, act: m.act })
    }
}

/// The neck on the device.
pub struct CudaFpn {
    in_channels: Vec<usize>,
    align_corners: bool,
    lateral: Vec<GpuConvModule>,
    fpn: Vec<GpuConvModule>,
}

impl CudaFpn {
    pub fn upload(dev: &CudaDevice, net: &GeneralizedLssFpn) -> Result<Self, Error> {
        Ok(Self {
            in_channels: net.config.in_channels.clone(),
            align_corners: net.config.align_corners,
            lateral: net.lateral_convs.iter().map(|m| GpuConvModule::upload(dev, m)).collect::<Result<_, _>>()?,
            fpn: net.fpn_convs.iter().map(|m| GpuConvModule::upload(dev, m)).collect::<Result<_, _>>()?,
        })
    }

    /// The neck's outputs (finest first) of the backbone's outputs (finest first), as
    /// [`GeneralizedLssFpn::forward`].
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, inputs: &[CudaFeatureMap]) -> Result<Vec<CudaFeatureMap>, Error> {
        let levels = self.in_channels.len();
        if inputs.len() != levels || inputs.iter().zip(&self.in_channels).any(|(x, &c)| x.c != c || x.n != inputs[0].n) {
            return Err(Error::InvalidInput(format!(
                "neck on CUDA: inputs of {:?} channels for levels of {:?}",
                inputs.iter().map(|x| x.c).collect::<Vec<_>>(),
                self.in_channels
            )));
        }
        let mut outs: Vec<CudaFeatureMap> = Vec::with_capacity(levels - 1);
        for i in (0..levels - 1).rev() {
            let x = &inputs[i];
            let coarse = outs.last().unwrap_or(&inputs[levels - 1]);
            let up = bilinear_resize_cuda(dev, coarse, x.h, x.w, self.align_corners)?;
            let cat = concat_channels_cuda(dev, x, &up)?;
            drop(up);
            let (l, f) = (&self.lateral[i], &self.fpn[i]);
            let y = l.conv.forward(dev, blas, &cat, l.act)?;
            drop(cat);
            outs.push(f.conv.forward(dev, blas, &y, f.act)?);
        }
        outs.reverse();
        Ok(outs)
    }
}
