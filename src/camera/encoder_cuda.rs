//! The camera encoder on CUDA: [`CudaSwin`] then [`CudaFpn`], FP16 activations, FP32
//! accumulation; outputs NHWC FP16 on the device.

use super::encoder::{CameraEncoder, EncoderOutput};
use super::fpn_cuda::CudaFpn;
use super::swin_cuda::{CudaSwin, SwinPlan};
use crate::dense::cuda::CudaFeatureMap;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::model::sphereformer::cuda::GpuClock;
use crate::Error;
use cudarc::cublas::CudaBlas;
use cudarc::driver::CudaSlice;
use half::f16;

/// The encoder's outputs on the device (see [`EncoderOutput`]).
pub struct CudaEncoderOutput {
    pub stages: Vec<CudaFeatureMap>,
    pub neck: Vec<CudaFeatureMap>,
}

impl CudaEncoderOutput {
    /// Copies every output back as f32 (synchronises the stream).
    pub fn download(&self, dev: &CudaDevice) -> Result<EncoderOutput, Error> {
        Ok(EncoderOutput {
            stages: self.stages.iter().map(|m| m.download(dev)).collect::<Result<_, _>>()?,
            neck: self.neck.iter().map(|m| m.download(dev)).collect::<Result<_, _>>()?,
        })
    }
}

/// The whole encoder on the device.
pub struct CudaCameraEncoder {
    blas: CudaBlas,
    pub backbone: CudaSwin,
    pub neck: CudaFpn,
}

impl CudaCameraEncoder {
    /// Uploads a loaded encoder (weights FP16, norms and biases f32).
    pub fn upload(dev: &CudaDevice, enc: &CameraEncoder) -> Result<Self, Error> {
        let blas = CudaBlas::new(dev.stream.clone())
            .map_err(|e| Error::Cuda(format!("cuBLAS is not usable ({e:?}): the CUDA camera encoder needs libcublas from the CUDA toolkit")))?;
        Ok(Self { blas, backbone: CudaSwin::upload(dev, &enc.backbone)?, neck: CudaFpn::upload(dev, &enc.neck)? })
    }

    /// Selects the backbone's fused or unfused GEMM path (`CudaSwin::set_fused`).
    pub fn set_swin_fused(&mut self, dev: &CudaDevice, fused: bool) -> Result<(), Error> {
        self.backbone.set_fused(dev, fused)
    }

    /// Selects the backbone's window-attention kernel (`CudaSwin::set_whole_window_attention`).
    pub fn set_swin_whole_window_attention(&mut self, on: bool) {
        self.backbone.set_whole_window_attention(on)
    }

    /// The window partitions for batches of `n` images of `h × w` (build once, reuse per frame).
    pub fn plan(&self, dev: &CudaDevice, n: usize, h: usize, w: usize) -> Result<SwinPlan, Error> {
        self.backbone.plan(dev, n, h, w)
    }

    /// The backbone alone (its outputs at `out_indices`).
    pub fn backbone(&self, dev: &CudaDevice, plan: &SwinPlan, images: &CudaSlice<f16>) -> Result<Vec<CudaFeatureMap>, Error> {
        self.backbone.forward(dev, &self.blas, plan, images)
    }

    /// The neck on the backbone's outputs.
    pub fn neck(&self, dev: &CudaDevice, stages: &[CudaFeatureMap]) -> Result<Vec<CudaFeatureMap>, Error> {
        self.neck.forward(dev, &self.blas, stages)
    }

    /// Backbone and neck on normalized NHWC FP16 images `[plan.n, plan.h, plan.w, 3]` (device).
    pub fn forward(&self, dev: &CudaDevice, plan: &SwinPlan, images: &CudaSlice<f16>) -> Result<CudaEncoderOutput, Error> {
        let stages = self.backbone(dev, plan, images)?;
        let neck = self.neck(dev, &stages)?;
        Ok(CudaEncoderOutput { stages, neck })
    }

    /// [`forward`](Self::forward) with the backbone's stage boundaries and `neck` marked on `clock`.
    pub fn forward_timed(&self, dev: &CudaDevice, plan: &SwinPlan, images: &CudaSlice<f16>, clock: &mut GpuClock) -> Result<CudaEncoderOutput, Error> {
        let stages = self.backbone.forward_timed(dev, &self.blas, plan, images, Some(&mut *clock))?;
        let neck = self.neck(dev, &stages)?;
        clock.mark(dev, "neck".into())?;
        Ok(CudaEncoderOutput { stages, neck })
    }

    /// [`forward`](Self::forward) on host NHWC images (rounded to FP16 on upload), outputs
    /// copied back (tests, the CLI).
    pub fn forward_host(&self, dev: &CudaDevice, plan: &SwinPlan, images: &[f32]) -> Result<EncoderOutput, Error> {
        let want = plan.n * self.backbone.config.in_channels * plan.h * plan.w;
        if images.len() != want {
            return Err(Error::InvalidInput(format!("camera encoder: {} image values, the plan is for {want}", images.len())));
        }
        let h16: Vec<f16> = images.iter().map(|&v| f16::from_f32(v)).collect();
        let x = dev.stream.clone_htod(&h16).map_err(cuda_err("uploading images"))?;
        self.forward(dev, plan, &x)?.download(dev)
    }
}
