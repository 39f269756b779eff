//! The camera encoder on CUDA: [`CudaSwin`] then [`CudaFpn`], FP16 activations, FP32
//! accumulation; outputs NHWC FP16 on the device. [`CudaCameraEncoder::forward_guarded`] runs it
//! with the FP16 range guard ([`crate::device::range_guard`]) over every layer of both, named by their
//! upstream module paths.

use crate::models::bevfusion::camera::encoder::{CameraEncoder, EncoderOutput};
use crate::models::bevfusion::camera::fpn_cuda::CudaFpn;
use crate::models::bevfusion::camera::swin_cuda::{CudaSwin, SwinPlan};
use crate::ops::attention::cuda::Bias2dKernel;
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::range::{PendingRange, RangeFlags, RangeReadback};
use crate::device::range_guard::{LayerNames, RangeReport};
use crate::device::clock::GpuClock;
use crate::device::libraries::{self, Lib};
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
    /// The guarded layers of backbone and neck, in execution order.
    names: LayerNames,
    readback: RangeReadback,
}

impl CudaCameraEncoder {
    /// Uploads a loaded encoder (weights FP16, norms and biases f32).
    pub fn upload(dev: &CudaDevice, enc: &CameraEncoder) -> Result<Self, Error> {
        libraries::require(&[Lib::Cublas, Lib::CublasLt])?;
        let blas = CudaBlas::new(dev.stream.clone())
            .map_err(|e| Error::Cuda(format!("cuBLAS is not usable ({e:?}): the CUDA camera encoder needs libcublas from the CUDA toolkit")))?;
        let mut names = LayerNames::new();
        let backbone = CudaSwin::upload_named(dev, &enc.backbone, &mut names)?;
        let neck = CudaFpn::upload_named(dev, &enc.neck, &mut names)?;
        Ok(Self { blas, backbone, neck, names, readback: RangeReadback::new() })
    }

    /// The guarded layers, in execution order (the names a [`RangeReport`] uses).
    pub fn layer_names(&self) -> &LayerNames {
        &self.names
    }

    /// [`forward`](Self::forward) with the FP16 range guard: the outputs, and the flags on their
    /// way to the host (read them with [`PendingRange::finish`] and
    /// [`CudaCameraEncoder::layer_names`] once the outputs are read, or after a synchronisation).
    pub fn forward_guarded(&self, dev: &CudaDevice, plan: &SwinPlan, images: &CudaSlice<f16>) -> Result<(CudaEncoderOutput, PendingRange<'_>), Error> {
        let flags = RangeFlags::new(dev, &self.names)?;
        let stages = self.backbone.forward_guarded_timed(dev, &self.blas, plan, images, None, Some(&flags))?;
        let neck = self.neck.forward_guarded(dev, &self.blas, &stages, Some(&flags))?;
        let range = self.readback.enqueue(dev, flags)?;
        Ok((CudaEncoderOutput { stages, neck }, range))
    }

    /// Selects the backbone's fused or unfused GEMM path (`CudaSwin::set_fused`).
    pub fn set_swin_fused(&mut self, dev: &CudaDevice, fused: bool) -> Result<(), Error> {
        self.backbone.set_fused(dev, fused)
    }

    /// Selects the backbone's window-attention kernel (`CudaSwin::set_attention_kernel`).
    pub fn set_swin_attention_kernel(&mut self, kernel: Bias2dKernel) {
        self.backbone.set_attention_kernel(kernel)
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
        self.forward_host_checked(dev, plan, images).map(|(out, _)| out)
    }

    /// [`forward_host`](Self::forward_host) with the FP16 range guard's report.
    pub fn forward_host_checked(&self, dev: &CudaDevice, plan: &SwinPlan, images: &[f32]) -> Result<(EncoderOutput, RangeReport), Error> {
        let want = plan.n * self.backbone.config.in_channels * plan.h * plan.w;
        if images.len() != want {
            return Err(Error::InvalidInput(format!("camera encoder: {} image values, the plan is for {want}", images.len())));
        }
        let h16: Vec<f16> = images.iter().map(|&v| f16::from_f32(v)).collect();
        let x = dev.stream.clone_htod(&h16).map_err(cuda_err("uploading images"))?;
        let (out, range) = self.forward_guarded(dev, plan, &x)?;
        // the flags' copy was enqueued before the downloads, which wait for the stream
        let out = out.download(dev)?;
        Ok((out, range.finish(&self.names)?))
    }
}
