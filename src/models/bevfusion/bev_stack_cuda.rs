//! [`BevStack`] on CUDA: fuser, decoder and head uploaded on one conv backend.

use crate::models::bevfusion::decoder_cuda::{CudaBevDecoder, CudaBevFuser};
use crate::models::bevfusion::head_cuda::{CudaBevMaps, CudaBevSegHead};
use crate::models::bevfusion::bev_stack::BevStack;
use crate::ops::dense::conv_engine::ConvBackend;
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::device::cuda::CudaDevice;
use crate::Error;
use cudarc::cublas::CudaBlas;

/// The stack on the device.
pub struct CudaBevStack {
    pub fuser: Option<CudaBevFuser>,
    pub decoder: CudaBevDecoder,
    pub head: CudaBevSegHead,
}

/// Each stage's output on the device.
pub struct CudaBevStages {
    pub fused: Option<CudaFeatureMap>,
    pub decoded: CudaFeatureMap,
    pub maps: CudaBevMaps,
}

impl CudaBevStack {
    pub fn upload(dev: &CudaDevice, cpu: &BevStack, backend: ConvBackend) -> Result<Self, Error> {
        Ok(Self {
            fuser: cpu.fuser.as_ref().map(|f| CudaBevFuser::upload(dev, f, backend)).transpose()?,
            decoder: CudaBevDecoder::upload(dev, &cpu.decoder, backend)?,
            head: CudaBevSegHead::upload(dev, &cpu.head, backend)?,
        })
    }

    /// The backend the decoder runs on (cuDNN may have fallen back to im2col).
    pub fn backend(&self) -> ConvBackend {
        self.decoder.backend()
    }

    /// Sensors' BEV maps (camera first; one map without a fuser) → probabilities.
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, inputs: &[&CudaFeatureMap]) -> Result<CudaBevStages, Error> {
        let fused = match &self.fuser {
            Some(f) => Some(f.forward(dev, blas, inputs)?),
            None if inputs.len() == 1 => None,
            None => return Err(Error::InvalidInput(format!("BEV decoder: {} input maps for a model without a fuser (1)", inputs.len()))),
        };
        let x = fused.as_ref().unwrap_or(inputs[0]);
        let decoded = self.decoder.forward(dev, blas, x)?;
        let maps = self.head.forward(dev, blas, &decoded)?;
        Ok(CudaBevStages { fused, decoded, maps })
    }
}
