//! 2-D convolutions through cuDNN (loaded at run time by cudarc: `libcudnn.so.9`), NHWC FP16 in
//! and out with FP32 accumulation ("pseudo-half": compute type FLOAT), tensor-core math; the bias
//! (a folded BatchNorm's shift), an optional residual and the activation follow in one FP16 pass
//! (`bias_act_f16`, kernels/ops/bev_dense.cu).
//!
//! Layouts: the input and output are `CUDNN_TENSOR_NHWC` tensors described by their (n, c, h, w)
//! sizes; the filter is `CUDNN_TENSOR_NHWC` too, which cuDNN reads as KRSC
//! (`[cout][kh][kw][cin]`), the order [`CudnnConv2d::upload`] writes. Cross-correlation (PyTorch's
//! `conv2d`), dilation 1, groups 1.
//!
//! Algorithm: chosen once per input shape and cached — measured by
//! `cudnnFindConvolutionForwardAlgorithm` (cuDNN's heuristics `_v7` if that call fails), the
//! fastest that succeeded among IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM, GEMM and DIRECT with a
//! workspace up to [`WORKSPACE_CAP`]. FFT and Winograd are excluded: their transforms run in
//! FP16 here and lose accuracy beyond what the FP32-accumulated GEMMs give. The perf result's math
//! type is set on the descriptor, then the workspace size is asked for that algorithm and
//! allocated once per shape.
//!
//! Errors are typed: a cuDNN status becomes `Error::Cuda` naming the call; a missing library is
//! reported by [`CudnnContext::new`] (callers fall back to im2col + cuBLAS).

use crate::ops::dense::cuda::CudaFeatureMap;
use crate::ops::dense::cuda_ops::bias_act_f16;
use crate::ops::dense::{Activation, Conv2d};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::libraries::{self, Lib};
use crate::Error;
use cudarc::cudnn::{result as cr, sys as cs};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::f16;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};

/// The largest workspace a convolution may use (bytes).
pub const WORKSPACE_CAP: usize = 256 << 20;

fn err(what: &str) -> impl Fn(cr::CudnnError) -> Error + '_ {
    move |e| Error::Cuda(format!("cuDNN {what}: {e:?}"))
}

fn status(what: &str, s: cs::cudnnStatus_t) -> Result<(), Error> {
    if s == cs::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda(format!("cuDNN {what}: {s:?}")))
    }
}

fn c_int_of(v: usize, what: &str) -> Result<c_int, Error> {
    c_int::try_from(v).map_err(|_| Error::InvalidInput(format!("{what}: {v} exceeds cuDNN's int range")))
}

/// A cuDNN handle bound to the device's stream.
pub struct CudnnContext {
    handle: cs::cudnnHandle_t,
    /// `cudnnGetVersion()`: major · 10000 + minor · 100 + patch.
    pub version: usize,
}

// SAFETY: cuDNN allows a handle to be used from any host thread as long as no two threads use it
// at once. The context has no clones and is not Sync, so moving it moves its only user.
unsafe impl Send for CudnnContext {}

impl CudnnContext {
    /// Loads cuDNN and makes a handle on `dev`'s stream. The error is a sentence for a log line
    /// (the library is missing, is not cuDNN 9, or the handle cannot be made).
    pub fn new(dev: &CudaDevice) -> Result<Self, String> {
        // Found where cudarc will find it, cuDNN 9 for this build's CUDA major: another is refused
        // here (the caller falls back), never called through the wrong API table.
        libraries::require(&[Lib::Cudnn]).map_err(|e| e.to_string())?;
        let version = cr::get_version();
        if version / 10000 != 9 {
            return Err(format!("cuDNN {version} was found; sptr uses the cuDNN 9 API"));
        }
        dev.ctx.bind_to_thread().map_err(|e| format!("binding the CUDA context: {e:?}"))?;
        let handle = cr::create_handle().map_err(|e| format!("cudnnCreate failed: {e:?}"))?;
        let ctx = Self { handle, version };
        // SAFETY: the handle is live; the stream belongs to the device's context.
        unsafe { cr::set_stream(ctx.handle, dev.stream.cu_stream() as cs::cudaStream_t) }
            .map_err(|e| format!("cudnnSetStream failed: {e:?}"))?;
        Ok(ctx)
    }
}

impl Drop for CudnnContext {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreate, destroyed once; a failure here cannot be acted upon.
        let _ = unsafe { cr::destroy_handle(self.handle) };
    }
}

/// Owned descriptors (destroyed on drop). Host-side structures without thread affinity.
struct TensorDesc(cs::cudnnTensorDescriptor_t);
struct FilterDesc(cs::cudnnFilterDescriptor_t);
struct ConvDesc(cs::cudnnConvolutionDescriptor_t);
// SAFETY: descriptors are plain host memory owned by these wrappers; cuDNN reads them only during
// calls made by their owner.
unsafe impl Send for TensorDesc {}
unsafe impl Send for FilterDesc {}
unsafe impl Send for ConvDesc {}

impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateTensorDescriptor, destroyed once.
        let _ = unsafe { cr::destroy_tensor_descriptor(self.0) };
    }
}
impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateFilterDescriptor, destroyed once.
        let _ = unsafe { cr::destroy_filter_descriptor(self.0) };
    }
}
impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreateConvolutionDescriptor, destroyed once.
        let _ = unsafe { cr::destroy_convolution_descriptor(self.0) };
    }
}

impl TensorDesc {
    /// An NHWC FP16 tensor of `n × c × h × w`.
    fn nhwc_f16(n: usize, c: usize, h: usize, w: usize) -> Result<Self, Error> {
        let d = TensorDesc(cr::create_tensor_descriptor().map_err(err("cudnnCreateTensorDescriptor"))?);
        let dims = [c_int_of(n, "batch")?, c_int_of(c, "channels")?, c_int_of(h, "height")?, c_int_of(w, "width")?];
        // SAFETY: the descriptor is live.
        unsafe {
            cr::set_tensor4d_descriptor(d.0, cs::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC, cs::cudnnDataType_t::CUDNN_DATA_HALF, dims)
        }
        .map_err(err("cudnnSetTensor4dDescriptor"))?;
        Ok(d)
    }
}

/// `cudnnConvolutionFwdAlgoPerf_t` with plain integers where the C struct has enums, so a value
/// this binding does not know (a newer cuDNN's status or algorithm) is data, not undefined
/// behaviour. Layout: algo, status (int), time (float), memory (size_t, 8-aligned), determinism,
/// mathType (int), reserved[3].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FwdPerf {
    algo: i32,
    status: i32,
    time: f32,
    memory: usize,
    determinism: i32,
    math_type: i32,
    reserved: [i32; 3],
}

const _: () = assert!(std::mem::size_of::<FwdPerf>() == std::mem::size_of::<cs::cudnnConvolutionFwdAlgoPerf_t>());

/// The algorithms accepted (see the module doc), by their C value.
fn accepted_algo(v: i32) -> Option<cs::cudnnConvolutionFwdAlgo_t> {
    use cs::cudnnConvolutionFwdAlgo_t as A;
    match v {
        0 => Some(A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM),
        1 => Some(A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM),
        2 => Some(A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM),
        3 => Some(A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT),
        _ => None,
    }
}

fn math_type(v: i32) -> Option<cs::cudnnMathType_t> {
    use cs::cudnnMathType_t as M;
    match v {
        0 => Some(M::CUDNN_DEFAULT_MATH),
        1 => Some(M::CUDNN_TENSOR_OP_MATH),
        2 => Some(M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION),
        3 => Some(M::CUDNN_FMA_MATH),
        _ => None,
    }
}

/// What one input shape runs with.
struct Plan {
    x: TensorDesc,
    y: TensorDesc,
    conv: ConvDesc,
    algo: cs::cudnnConvolutionFwdAlgo_t,
    workspace: Option<CudaSlice<u8>>,
    workspace_bytes: usize,
    oh: usize,
    ow: usize,
}

/// A [`Conv2d`] run by cuDNN: FP16 KRSC weight, FP32 bias (zeros without one).
pub struct CudnnConv2d {
    pub cin: usize,
    pub cout: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    filter: FilterDesc,
    weight: CudaSlice<f16>,
    bias: CudaSlice<f32>,
    /// Per input (n, h, w): descriptors, algorithm, workspace. Built on first use.
    plans: RefCell<HashMap<(usize, usize, usize), Plan>>,
}

impl CudnnConv2d {
    pub fn upload(dev: &CudaDevice, conv: &Conv2d) -> Result<Self, Error> {
        let (cin, cout, kh, kw) = (conv.cin, conv.cout, conv.kh, conv.kw);
        // [cout, cin, kh, kw] -> KRSC [cout, kh, kw, cin]
        let mut w = vec![f16::ZERO; conv.weight.len()];
        for co in 0..cout {
            for ci in 0..cin {
                for ky in 0..kh {
                    for kx in 0..kw {
                        w[((co * kh + ky) * kw + kx) * cin + ci] = f16::from_f32(conv.weight[((co * cin + ci) * kh + ky) * kw + kx]);
                    }
                }
            }
        }
        let filter = FilterDesc(cr::create_filter_descriptor().map_err(err("cudnnCreateFilterDescriptor"))?);
        let dims = [c_int_of(cout, "conv outputs")?, c_int_of(cin, "conv inputs")?, c_int_of(kh, "kernel")?, c_int_of(kw, "kernel")?];
        // SAFETY: the descriptor is live. With NHWC format the filter is KRSC.
        unsafe {
            cr::set_filter4d_descriptor(filter.0, cs::cudnnDataType_t::CUDNN_DATA_HALF, cs::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC, dims)
        }
        .map_err(err("cudnnSetFilter4dDescriptor"))?;
        let bias = conv.bias.clone().unwrap_or_else(|| vec![0.0; cout]);
        Ok(Self {
            cin,
            cout,
            kh,
            kw,
            stride: conv.stride,
            padding: conv.padding,
            filter,
            weight: dev.stream.clone_htod(&w).map_err(cuda_err("uploading conv weights"))?,
            bias: dev.stream.clone_htod(&bias).map_err(cuda_err("uploading a conv bias"))?,
            plans: RefCell::new(HashMap::new()),
        })
    }

    /// Output height and width for an `h × w` input.
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

    /// The algorithm cuDNN picked for an input of `n × h × w`, once planned (for benchmarks).
    pub fn algorithm(&self, n: usize, h: usize, w: usize) -> Option<String> {
        self.plans.borrow().get(&(n, h, w)).map(|p| format!("{:?}", p.algo))
    }

    fn plan(&self, dev: &CudaDevice, ctx: &CudnnContext, n: usize, h: usize, w: usize) -> Result<Plan, Error> {
        let (oh, ow) = self.output_size(h, w)?;
        let x = TensorDesc::nhwc_f16(n, self.cin, h, w)?;
        let y = TensorDesc::nhwc_f16(n, self.cout, oh, ow)?;
        let conv = ConvDesc(cr::create_convolution_descriptor().map_err(err("cudnnCreateConvolutionDescriptor"))?);
        // SAFETY: the descriptor is live. FP32 compute on FP16 data: "pseudo-half".
        unsafe {
            cr::set_convolution2d_descriptor(
                conv.0,
                c_int_of(self.padding[0], "padding")?,
                c_int_of(self.padding[1], "padding")?,
                c_int_of(self.stride[0], "stride")?,
                c_int_of(self.stride[1], "stride")?,
                1,
                1,
                cs::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                cs::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
        }
        .map_err(err("cudnnSetConvolution2dDescriptor"))?;
        // SAFETY: the descriptor is live.
        unsafe { cr::set_convolution_math_type(conv.0, cs::cudnnMathType_t::CUDNN_TENSOR_OP_MATH) }
            .map_err(err("cudnnSetConvolutionMathType"))?;
        // cuDNN's output size must be ours
        let (mut dn, mut dc, mut dh, mut dw) = (0 as c_int, 0 as c_int, 0 as c_int, 0 as c_int);
        // SAFETY: live descriptors, four valid out-pointers.
        status("cudnnGetConvolution2dForwardOutputDim", unsafe {
            cs::cudnnGetConvolution2dForwardOutputDim(conv.0, x.0, self.filter.0, &mut dn, &mut dc, &mut dh, &mut dw)
        })?;
        if (dn as usize, dc as usize, dh as usize, dw as usize) != (n, self.cout, oh, ow) {
            return Err(Error::Cuda(format!(
                "cuDNN computes a [{dn}, {dc}, {dh}, {dw}] output where the conv gives [{n}, {}, {oh}, {ow}]",
                self.cout
            )));
        }
        dev.ctx.bind_to_thread().map_err(cuda_err("binding the CUDA context"))?;
        const REQUESTED: usize = 8;
        let mut perf = [FwdPerf::default(); REQUESTED];
        let mut returned: c_int = 0;
        // SAFETY: live handle and descriptors; `perf` holds REQUESTED results of the C struct's
        // layout (checked size; integer fields where the C struct has enums).
        let found = status("cudnnFindConvolutionForwardAlgorithm", unsafe {
            cs::cudnnFindConvolutionForwardAlgorithm(
                ctx.handle,
                x.0,
                self.filter.0,
                conv.0,
                y.0,
                REQUESTED as c_int,
                &mut returned,
                perf.as_mut_ptr() as *mut cs::cudnnConvolutionFwdAlgoPerf_t,
            )
        });
        if found.is_err() {
            returned = 0;
            perf = [FwdPerf::default(); REQUESTED];
            // SAFETY: as above.
            status("cudnnGetConvolutionForwardAlgorithm_v7", unsafe {
                cs::cudnnGetConvolutionForwardAlgorithm_v7(
                    ctx.handle,
                    x.0,
                    self.filter.0,
                    conv.0,
                    y.0,
                    REQUESTED as c_int,
                    &mut returned,
                    perf.as_mut_ptr() as *mut cs::cudnnConvolutionFwdAlgoPerf_t,
                )
            })
            .map_err(|e| Error::Cuda(format!("{e} (after cudnnFindConvolutionForwardAlgorithm: {})", found.as_ref().err().map_or(String::new(), |f| f.to_string()))))?;
        }
        let returned = (returned.max(0) as usize).min(REQUESTED);
        // results come fastest first; status 0 is CUDNN_STATUS_SUCCESS
        let pick = perf[..returned]
            .iter()
            .find(|p| p.status == 0 && p.memory <= WORKSPACE_CAP && accepted_algo(p.algo).is_some() && math_type(p.math_type).is_some())
            .ok_or_else(|| {
                Error::Cuda(format!(
                    "cuDNN offers no usable algorithm for a {}x{} conv {} -> {} on [{n}, {h}, {w}]: {:?}",
                    self.kh,
                    self.kw,
                    self.cin,
                    self.cout,
                    &perf[..returned]
                ))
            })?;
        let (algo, math) = match (accepted_algo(pick.algo), math_type(pick.math_type)) {
            (Some(a), Some(m)) => (a, m),
            _ => return Err(Error::Cuda("cuDNN algorithm selection".into())),
        };
        // SAFETY: the descriptor is live.
        unsafe { cr::set_convolution_math_type(conv.0, math) }.map_err(err("cudnnSetConvolutionMathType"))?;
        // SAFETY: live handle and descriptors.
        let workspace_bytes = unsafe { cr::get_convolution_forward_workspace_size(ctx.handle, x.0, self.filter.0, conv.0, y.0, algo) }
            .map_err(err("cudnnGetConvolutionForwardWorkspaceSize"))?;
        let workspace = if workspace_bytes > 0 {
            Some(dev.stream.alloc_zeros::<u8>(workspace_bytes).map_err(cuda_err("allocating the cuDNN workspace"))?)
        } else {
            None
        };
        Ok(Plan { x, y, conv, algo, workspace, workspace_bytes, oh, ow })
    }

    /// `act(conv(x) + bias (+ residual))` as FP16.
    pub fn forward(
        &self,
        dev: &CudaDevice,
        ctx: &CudnnContext,
        x: &CudaFeatureMap,
        act: Activation,
        residual: Option<&CudaFeatureMap>,
    ) -> Result<CudaFeatureMap, Error> {
        if x.c != self.cin {
            return Err(Error::InvalidInput(format!("conv2d: input has {} channels, the conv takes {}", x.c, self.cin)));
        }
        if x.data.len() < x.len() {
            return Err(Error::InvalidInput(format!("conv2d: input buffer holds {} of {} halves", x.data.len(), x.len())));
        }
        let (oh, ow) = self.output_size(x.h, x.w)?;
        if x.is_empty() || oh == 0 || ow == 0 {
            return CudaFeatureMap::zeros(dev, x.n, oh, ow, self.cout);
        }
        let key = (x.n, x.h, x.w);
        if !self.plans.borrow().contains_key(&key) {
            let p = self.plan(dev, ctx, x.n, x.h, x.w)?;
            self.plans.borrow_mut().insert(key, p);
        }
        let mut plans = self.plans.borrow_mut();
        let plan = plans.get_mut(&key).ok_or_else(|| Error::Cuda("cuDNN plan cache".into()))?;
        debug_assert_eq!((plan.oh, plan.ow), (oh, ow));
        let len = crate::ops::dense::volume(x.n, oh, ow, self.cout, "conv output")?;
        // SAFETY: cuDNN writes every output value (beta = 0).
        let data = unsafe { dev.alloc_uninit::<f16>(len, "a conv output") }?;
        let mut out = CudaFeatureMap::from_slice(x.n, oh, ow, self.cout, data)?;
        dev.ctx.bind_to_thread().map_err(cuda_err("binding the CUDA context"))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let s = &dev.stream;
        {
            let (xp, _xg) = x.data.device_ptr(s);
            let (wp, _wg) = self.weight.device_ptr(s);
            let (yp, _yg) = out.data.device_ptr_mut(s);
            let ws = plan.workspace.as_mut().map(|w| w.device_ptr_mut(s));
            let ws_ptr = ws.as_ref().map_or(std::ptr::null_mut(), |(p, _)| *p as *mut c_void);
            // SAFETY: descriptors match the buffers: x is n·h·w·cin halves NHWC, the weight
            // cout·kh·kw·cin halves KRSC, out n·oh·ow·cout halves NHWC (checked sizes); the
            // workspace holds workspace_bytes; alpha / beta are FP32 as the compute type needs;
            // the handle runs on `s`, the stream every buffer belongs to.
            unsafe {
                cr::convolution_forward(
                    ctx.handle,
                    (&alpha) as *const f32 as *const c_void,
                    plan.x.0,
                    xp as *const c_void,
                    self.filter.0,
                    wp as *const c_void,
                    plan.conv.0,
                    plan.algo,
                    ws_ptr,
                    plan.workspace_bytes,
                    (&beta) as *const f32 as *const c_void,
                    plan.y.0,
                    yp as *mut c_void,
                )
            }
            .map_err(err("cudnnConvolutionForward"))?;
        }
        drop(plans);
        bias_act_f16(dev, &mut out, &self.bias, residual, act)?;
        Ok(out)
    }
}
