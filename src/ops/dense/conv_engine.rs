//! Which implementation runs a model's dense convolutions on CUDA: im2col + cuBLAS
//! ([`CudaConv2d`]) or cuDNN ([`CudnnConv2d`]), chosen when the model is uploaded. Asking for
//! cuDNN where it cannot be loaded falls back to im2col + cuBLAS with one log line.

use crate::ops::dense::cuda::{CudaConv2d, CudaFeatureMap};
use crate::ops::dense::cuda_ops::conv_residual_cuda;
use crate::ops::dense::cudnn::{CudnnContext, CudnnConv2d};
use crate::ops::dense::{Activation, Conv2d};
use crate::device::cuda::CudaDevice;
use crate::Error;
use cudarc::cublas::CudaBlas;

/// A dense-convolution implementation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvBackend {
    /// im2col (FP16) + one cuBLAS GEMM (FP32 accumulate) + epilogue kernel.
    Im2col,
    /// cuDNN's forward convolution (NHWC FP16, FP32 accumulate, tensor cores) + bias/act kernel.
    Cudnn,
}

impl ConvBackend {
    /// `im2col` or `cudnn`.
    pub fn parse(s: &str) -> Result<Self, Error> {
        match s {
            "im2col" => Ok(ConvBackend::Im2col),
            "cudnn" => Ok(ConvBackend::Cudnn),
            other => Err(Error::InvalidInput(format!("conv backend `{other}`: use `im2col` or `cudnn`"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ConvBackend::Im2col => "im2col",
            ConvBackend::Cudnn => "cudnn",
        }
    }
}

/// The backend a model's convolutions run on, with its cuDNN handle when that is cuDNN. One per
/// model part: the handle is used by that part alone.
pub struct ConvEngine {
    cudnn: Option<CudnnContext>,
}

impl ConvEngine {
    /// The engine for `wanted`; cuDNN that cannot be loaded gives im2col and a log line saying why.
    pub fn new(dev: &CudaDevice, wanted: ConvBackend) -> Self {
        match wanted {
            ConvBackend::Im2col => Self { cudnn: None },
            ConvBackend::Cudnn => match CudnnContext::new(dev) {
                Ok(c) => Self { cudnn: Some(c) },
                Err(reason) => {
                    // once per process: every model part asks
                    static LOGGED: std::sync::Once = std::sync::Once::new();
                    LOGGED.call_once(|| eprintln!("sptr: cuDNN is not available ({reason}); dense convolutions use im2col + cuBLAS"));
                    Self { cudnn: None }
                }
            },
        }
    }

    /// The backend actually in use.
    pub fn backend(&self) -> ConvBackend {
        if self.cudnn.is_some() {
            ConvBackend::Cudnn
        } else {
            ConvBackend::Im2col
        }
    }

    /// The loaded cuDNN version, if cuDNN is in use.
    pub fn cudnn_version(&self) -> Option<usize> {
        self.cudnn.as_ref().map(|c| c.version)
    }
}

/// A conv on the engine's backend.
pub enum GpuConv {
    Im2col(CudaConv2d),
    Cudnn(CudnnConv2d),
}

impl GpuConv {
    pub fn upload(dev: &CudaDevice, engine: &ConvEngine, conv: &Conv2d) -> Result<Self, Error> {
        Ok(match engine.backend() {
            ConvBackend::Im2col => GpuConv::Im2col(CudaConv2d::upload(dev, conv)?),
            ConvBackend::Cudnn => GpuConv::Cudnn(CudnnConv2d::upload(dev, conv)?),
        })
    }

    pub fn cout(&self) -> usize {
        match self {
            GpuConv::Im2col(c) => c.cout,
            GpuConv::Cudnn(c) => c.cout,
        }
    }

    /// `act(conv(x) + bias (+ residual))` as FP16.
    pub fn forward(
        &self,
        dev: &CudaDevice,
        blas: &CudaBlas,
        engine: &ConvEngine,
        x: &CudaFeatureMap,
        act: Activation,
        residual: Option<&CudaFeatureMap>,
    ) -> Result<CudaFeatureMap, Error> {
        match (self, residual) {
            (GpuConv::Im2col(c), None) => c.forward(dev, blas, x, act),
            (GpuConv::Im2col(c), Some(r)) => conv_residual_cuda(dev, blas, c, x, r, act),
            (GpuConv::Cudnn(c), r) => match &engine.cudnn {
                Some(ctx) => c.forward(dev, ctx, x, act, r),
                None => Err(Error::InvalidInput("a cuDNN convolution run on an engine without cuDNN".into())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_round_trip() {
        for b in [ConvBackend::Im2col, ConvBackend::Cudnn] {
            assert_eq!(ConvBackend::parse(b.name()).unwrap(), b);
        }
        let e = ConvBackend::parse("cudnn8").unwrap_err().to_string();
        assert!(e.contains("im2col") && e.contains("cudnn"), "{e}");
    }
}
