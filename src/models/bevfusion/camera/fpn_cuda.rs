//! The neck on CUDA: `fpn.rs`'s GeneralizedLSSFPN with `ops::dense::cuda`'s ops (bilinear resize,
//! channel concat, conv as cuBLAS GEMM with the folded BatchNorm and ReLU in its epilogue).
//! FP16 range guard: each conv's epilogue, under `encoders.camera.neck.{lateral,fpn}_convs.{i}.conv`
//! (the resize and concatenation only mix or copy guarded values).

use crate::models::bevfusion::camera::fpn::{ConvModule, GeneralizedLssFpn};
use crate::ops::dense::cuda::{bilinear_resize_cuda, concat_channels_cuda, CudaConv2d, CudaFeatureMap};
use crate::ops::dense::Activation;
use crate::device::cuda::CudaDevice;
use crate::device::range::RangeFlags;
use crate::device::range_guard::{LayerId, LayerNames};
use crate::Error;
use cudarc::cublas::CudaBlas;

struct GpuConvModule {
    conv: CudaConv2d,
    act: Activation,
    id: LayerId,
}

impl GpuConvModule {
    fn upload(dev: &CudaDevice, m: &ConvModule, id: LayerId) -> Result<Self, Error> {
        Ok(Self { conv: CudaConv2d::upload(dev, &m.conv)?, act: m.act, id })
    }

    fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap, flags: Option<&RangeFlags>) -> Result<CudaFeatureMap, Error> {
        self.conv.forward_guarded(dev, blas, x, self.act, flags.map(|f| f.slot(self.id)).transpose()?)
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
        Self::upload_named(dev, net, &mut LayerNames::new())
    }

    /// [`CudaFpn::upload`], registering its convs in `names` in the order the forward runs them
    /// (coarsest level first: lateral, then fpn conv).
    pub fn upload_named(dev: &CudaDevice, net: &GeneralizedLssFpn, names: &mut LayerNames) -> Result<Self, Error> {
        let n = net.lateral_convs.len().min(net.fpn_convs.len());
        if net.lateral_convs.len() != net.fpn_convs.len() {
            return Err(Error::InvalidInput(format!("neck: {} lateral convs and {} fpn convs", net.lateral_convs.len(), net.fpn_convs.len())));
        }
        let p = crate::models::bevfusion::camera::encoder::NECK_PREFIX;
        let mut ids = vec![(None, None); n];
        for i in (0..n).rev() {
            ids[i] = (Some(names.add(format!("{p}.lateral_convs.{i}.conv"))), Some(names.add(format!("{p}.fpn_convs.{i}.conv"))));
        }
        let mut lateral = Vec::with_capacity(n);
        let mut fpn = Vec::with_capacity(n);
        for (i, (l, f)) in ids.into_iter().enumerate() {
            let missing = || Error::InvalidInput("neck: a conv without a layer id".into());
            lateral.push(GpuConvModule::upload(dev, &net.lateral_convs[i], l.ok_or_else(missing)?)?);
            fpn.push(GpuConvModule::upload(dev, &net.fpn_convs[i], f.ok_or_else(missing)?)?);
        }
        Ok(Self { in_channels: net.config.in_channels.clone(), align_corners: net.config.align_corners, lateral, fpn })
    }

    /// The neck's outputs (finest first) of the backbone's outputs (finest first), as
    /// [`GeneralizedLssFpn::forward`].
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, inputs: &[CudaFeatureMap]) -> Result<Vec<CudaFeatureMap>, Error> {
        self.forward_guarded(dev, blas, inputs, None)
    }

    /// [`CudaFpn::forward`] with the FP16 range guard reporting into `flags` (made for the
    /// `names` given to [`CudaFpn::upload_named`]).
    pub fn forward_guarded(&self, dev: &CudaDevice, blas: &CudaBlas, inputs: &[CudaFeatureMap], flags: Option<&RangeFlags>) -> Result<Vec<CudaFeatureMap>, Error> {
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
            let y = l.forward(dev, blas, &cat, flags)?;
            drop(cat);
            outs.push(f.forward(dev, blas, &y, flags)?);
        }
        outs.reverse();
        Ok(outs)
    }
}
