//! Which implementation runs a model's dense convolutions on CUDA: im2col + cuBLAS
//! ([`CudaConv2d`]) or cuDNN ([`CudnnConv2d`]), chosen when the model is uploaded. Asking for
//! cuDNN where it cannot be loaded falls back to im2col + cuBLAS with one log line.
//!
//! With cuDNN, each conv also keeps its im2col + cuBLAS form and runs, per input shape, whichever
//! of the two measured faster on this GPU at its first call ([`GpuConv::Fastest`]; the im2col
//! form only where its scratch memory is small, [`GEMM_SCRATCH_CAP`]). cuDNN's legacy forward
//! API picks poorly for many of the BEV decoders' shapes: on the H100 its best algorithms for
//! the 80- and 160-channel convs are SIMT kernels 4-5× slower than a cuBLAS GEMM on the im2col
//! matrix, and the GEMM wins the 128- to 640-channel decoder convs too, while cuDNN is faster for
//! the map head's 512-channel convs on 200 × 200.

use crate::ops::dense::cuda::{CudaConv2d, CudaFeatureMap};
use crate::ops::dense::cuda_ops::conv_residual_cuda;
use crate::ops::dense::cudnn::{CudnnContext, CudnnConv2d};
use crate::ops::dense::{Activation, Conv2d};
use crate::device::cuda::CudaDevice;
use crate::Error;
use cudarc::cublas::CudaBlas;
use std::cell::RefCell;
use std::collections::HashMap;

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

    /// The cuDNN handle, if cuDNN is in use.
    pub fn cudnn_context(&self) -> Option<&CudnnContext> {
        self.cudnn.as_ref()
    }

    /// The loaded cuDNN version, if cuDNN is in use.
    pub fn cudnn_version(&self) -> Option<usize> {
        self.cudnn.as_ref().map(|c| c.version)
    }
}

/// A conv on the engine's backend.
pub enum GpuConv {
    Im2col(CudaConv2d),
    /// cuDNN and im2col + cuBLAS, the faster per input shape (the module doc).
    Fastest(Box<FastestConv>),
}

/// One conv in both forms, with the form each input shape runs on.
pub struct FastestConv {
    cudnn: CudnnConv2d,
    gemm: CudaConv2d,
    /// Per input (n, h, w): true when cuDNN measured faster.
    cudnn_wins: RefCell<HashMap<(usize, usize, usize), bool>>,
}

/// Timed runs of each form when a shape is first seen (after one untimed run that plans it).
const TIMED_RUNS: usize = 3;

/// Convs enqueued back to back in one timed run: in a frame the host queues launches ahead of
/// the GPU, so a form's host-side cost (cuDNN's legacy API spends tens of µs a call) is hidden
/// unless it exceeds the GPU time; one conv between two events would count it in full.
const BACK_TO_BACK: usize = 4;

/// The im2col + cuBLAS form is tried only where its im2col matrix and accumulators take at most
/// this much device memory: the memory pool keeps what a frame once used, so a 369 MB matrix
/// (the map head's 512-channel conv on 200 × 200) would stay allocated for good. Larger convs
/// run on cuDNN, which measured faster on every such shape so far.
const GEMM_SCRATCH_CAP: usize = 64 << 20;

impl FastestConv {
    /// The cuDNN form.
    pub fn cudnn_form(&self) -> &CudnnConv2d {
        &self.cudnn
    }

    /// The im2col + cuBLAS form.
    pub fn gemm_form(&self) -> &CudaConv2d {
        &self.gemm
    }

    /// The form an `n × h × w` input runs on, once measured.
    pub fn picked(&self, n: usize, h: usize, w: usize) -> Option<ConvBackend> {
        self.cudnn_wins.borrow().get(&(n, h, w)).map(|&c| if c { ConvBackend::Cudnn } else { ConvBackend::Im2col })
    }

    fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, ctx: &CudnnContext, x: &CudaFeatureMap, act: Activation, residual: Option<&CudaFeatureMap>) -> Result<CudaFeatureMap, Error> {
        let run_cudnn = || self.cudnn.forward(dev, ctx, x, act, residual);
        let run_gemm = || im2col_forward(dev, blas, &self.gemm, x, act, residual);
        let key = (x.n, x.h, x.w);
        let known = self.cudnn_wins.borrow().get(&key).copied();
        let cudnn_wins = match known {
            Some(w) => w,
            None if self.gemm.scratch_bytes(x.n, x.h, x.w)? > GEMM_SCRATCH_CAP => {
                self.cudnn_wins.borrow_mut().insert(key, true);
                true
            }
            None => {
                // medians of a few runs each, the outputs dropped (a host wait: first frame only)
                let timed = |run: &dyn Fn() -> Result<CudaFeatureMap, Error>| {
                    let ms = dev.time_median_ms(1, TIMED_RUNS, || (0..BACK_TO_BACK).try_for_each(|_| run().map(drop)))?;
                    Ok::<f64, Error>(ms / BACK_TO_BACK as f64)
                };
                let (t_cudnn, t_gemm) = (timed(&run_cudnn)?, timed(&run_gemm)?);
                let w = t_cudnn <= t_gemm;
                if std::env::var_os("SPTR_VERBOSE").is_some() {
                    let c = &self.cudnn;
                    eprintln!(
                        "sptr: conv {}x{} s{:?} {} -> {} on [{}, {}, {}]: cuDNN {t_cudnn:.4} ms, im2col + cuBLAS {t_gemm:.4} ms: {}",
                        c.kh,
                        c.kw,
                        c.stride,
                        c.cin,
                        c.cout,
                        x.n,
                        x.h,
                        x.w,
                        if w { "cuDNN" } else { "im2col + cuBLAS" }
                    );
                }
                self.cudnn_wins.borrow_mut().insert(key, w);
                w
            }
        };
        if cudnn_wins {
            run_cudnn()
        } else {
            run_gemm()
        }
    }
}

impl GpuConv {
    pub fn upload(dev: &CudaDevice, engine: &ConvEngine, conv: &Conv2d) -> Result<Self, Error> {
        Ok(match engine.backend() {
            ConvBackend::Im2col => GpuConv::Im2col(CudaConv2d::upload(dev, conv)?),
            ConvBackend::Cudnn => GpuConv::Fastest(Box::new(FastestConv {
                cudnn: CudnnConv2d::upload(dev, conv)?,
                gemm: CudaConv2d::upload(dev, conv)?,
                cudnn_wins: RefCell::new(HashMap::new()),
            })),
        })
    }

    pub fn cout(&self) -> usize {
        match self {
            GpuConv::Im2col(c) => c.cout,
            GpuConv::Fastest(c) => c.cudnn.cout,
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
        match self {
            GpuConv::Im2col(c) => im2col_forward(dev, blas, c, x, act, residual),
            GpuConv::Fastest(c) => match &engine.cudnn {
                Some(ctx) => c.forward(dev, blas, ctx, x, act, residual),
                None => Err(Error::InvalidInput("a cuDNN convolution run on an engine without cuDNN".into())),
            },
        }
    }
}

/// `act(conv(x) + bias (+ residual))` on im2col + cuBLAS.
fn im2col_forward(dev: &CudaDevice, blas: &CudaBlas, c: &CudaConv2d, x: &CudaFeatureMap, act: Activation, residual: Option<&CudaFeatureMap>) -> Result<CudaFeatureMap, Error> {
    match residual {
        None => c.forward(dev, blas, x, act),
        Some(r) => conv_residual_cuda(dev, blas, c, x, r, act),
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
