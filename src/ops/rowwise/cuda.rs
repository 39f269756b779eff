//! Dense per-row layers on CUDA shared by the networks (SphereFormer, the camera encoder):
//! uploads, `nn.Linear` as a cuBLAS GEMM (FP16 in, FP32 out) plus an epilogue kernel (bias,
//! scale, GELU, residual, FP16 out), and `nn.LayerNorm` (kernels in `kernels/ops/rowwise.cu`).
//!
//! Activations and weights are FP16 (`half::f16`) or, for a model in BF16 precision, BF16
//! (`half::bf16`): the types and functions taking them are generic over
//! [`Store`](crate::device::storage::Store) (`GpuLinear` defaults to FP16), which picks the
//! kernel build and cuBLAS's data type. The FP16-only entry points the camera encoder calls
//! ([`epilogue`], [`GpuLayerNorm::forward`]) keep their signatures.

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::grid_1d;
use crate::device::range::RangeSlot;
use crate::device::storage::Store;
use crate::ops::rowwise::cpu::{LayerNorm, Linear};
use crate::Error;
use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use half::f16;

const THREADS: u32 = 256;
/// LayerNorm's widest row: `LN_WIDE_PER_LANE` × 32 in layers.cu (Swin's 4 · 384 = 1536 features
/// before its last patch merging's reduction).
pub const LAYER_NORM_MAX_C: usize = 1536;
/// Rows up to this width take the narrow kernel (`LN_MAX_PER_LANE` × 32), fewer registers.
const LAYER_NORM_NARROW_C: usize = 512;

/// Uploads f32 values.
pub fn up_f32(dev: &CudaDevice, v: &[f32], what: &str) -> Result<CudaSlice<f32>, Error> {
    dev.stream.clone_htod(v).map_err(cuda_err(format!("uploading {what}")))
}

/// Uploads f32 values as FP16.
pub fn up_f16(dev: &CudaDevice, v: &[f32], what: &str) -> Result<CudaSlice<f16>, Error> {
    up_store::<f16>(dev, v, what)
}

/// Uploads f32 values in the storage type `S` (rounded to nearest even).
pub fn up_store<S: Store>(dev: &CudaDevice, v: &[f32], what: &str) -> Result<CudaSlice<S>, Error> {
    let h: Vec<S> = v.iter().map(|&x| S::from_f32(x)).collect();
    dev.stream.clone_htod(&h).map_err(cuda_err(format!("uploading {what}")))
}

/// Downloads values of the storage type `S` as f32 (waits for the stream).
pub fn down_store<S: Store>(dev: &CudaDevice, v: &CudaSlice<S>, what: &str) -> Result<Vec<f32>, Error> {
    let h = dev.stream.clone_dtoh(v).map_err(cuda_err(format!("reading {what}")))?;
    Ok(h.into_iter().map(S::to_f32).collect())
}

/// Device memory for `len` elements that the next kernel overwrites entirely.
pub fn alloc<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(dev: &CudaDevice, len: usize, what: &str) -> Result<CudaSlice<T>, Error> {
    dev.stream.alloc_zeros::<T>(len.max(1)).map_err(cuda_err(format!("allocating {what}")))
}

/// `n · c` as a kernel's u32 element count.
pub fn elements(n: usize, c: usize, what: &str) -> Result<u32, Error> {
    u32::try_from(n * c).map_err(|_| Error::InvalidInput(format!("{what}: {n} x {c} values exceed 2^32")))
}

/// `nn.Linear`: weight `[out, in]` (PyTorch's layout) in the storage type `S`, FP32 bias split
/// into `parts` equal column ranges (the qkv Linear's q, k and v).
pub struct GpuLinear<S: Store = f16> {
    pub weight: CudaSlice<S>,
    pub bias: Vec<CudaSlice<f32>>,
    pub fin: usize,
    pub fout: usize,
}

impl<S: Store> GpuLinear<S> {
    pub fn upload(dev: &CudaDevice, l: &Linear, parts: usize) -> Result<Self, Error> {
        let zeros = vec![0f32; l.out_features];
        let b = l.bias.as_deref().unwrap_or(&zeros);
        let w = l.out_features / parts;
        let bias = (0..parts).map(|p| up_f32(dev, &b[p * w..(p + 1) * w], "linear bias")).collect::<Result<_, _>>()?;
        Ok(Self { weight: up_store::<S>(dev, &l.weight, "linear weight")?, bias, fin: l.in_features, fout: l.out_features })
    }

    /// `acc[n, fout] = x[n, fin] · Wᵀ` in FP32 (no bias: the epilogue adds it).
    pub fn gemm(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaSlice<S>, n: usize) -> Result<CudaSlice<f32>, Error> {
        if n == 0 {
            return alloc::<f32>(dev, 1, "linear output");
        }
        // SAFETY: the GEMM below (beta = 0, so C is not read) writes all n * fout values.
        let mut acc = unsafe { dev.alloc_uninit::<f32>(n * self.fout, "linear output")? };
        let dims = |v: usize| i32::try_from(v).map_err(|_| Error::InvalidInput(format!("linear: dimension {v} exceeds 2^31")));
        let (m, nn, k) = (dims(self.fout)?, dims(n)?, dims(self.fin)?);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let s = &dev.stream;
        let (w_ptr, w_sync) = self.weight.device_ptr(s);
        let (x_ptr, x_sync) = x.device_ptr(s);
        let (y_ptr, y_sync) = acc.device_ptr_mut(s);
        // Row-major y[n, out] = x[n, in] · W[out, in]ᵀ is column-major yᵀ = op(W) · xᵀ with
        // op = transpose (W row-major is Wᵀ column-major): m = out, n = rows, k = in.
        // SAFETY: the pointers are live device buffers of the sizes above; the handle is bound
        // to this stream.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                nn,
                k,
                (&alpha) as *const f32 as *const _,
                w_ptr as *const _,
                S::blas_type(),
                k,
                x_ptr as *const _,
                S::blas_type(),
                k,
                (&beta) as *const f32 as *const _,
                y_ptr as *mut _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                m,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::Cuda(format!("cuBLAS GEMM [{n} x {}] x [{} x {}]: {e:?}", self.fin, self.fin, self.fout)))?;
        drop((w_sync, x_sync, y_sync));
        Ok(acc)
    }
}

/// Epilogue of a Linear: `act((acc[:, part] + bias) * scale) (+ residual)` as FP16 `[n, c]`
/// (not guarded: [`epilogue_guarded`]).
#[allow(clippy::too_many_arguments)]
pub fn epilogue(
    dev: &CudaDevice,
    acc: &CudaSlice<f32>,
    acc_ld: usize,
    col0: usize,
    n: usize,
    bias: &CudaSlice<f32>,
    scale: f32,
    gelu: bool,
    residual: Option<&CudaSlice<f16>>,
) -> Result<CudaSlice<f16>, Error> {
    epilogue_guarded(dev, acc, acc_ld, col0, n, bias, scale, gelu, residual, None)
}

/// [`epilogue`] in the storage type `S`, with the range guard ([`crate::device::range_guard`]) of its
/// output reporting into `range` (the Linear's output before the GELU, and what is stored).
#[allow(clippy::too_many_arguments)]
pub fn epilogue_guarded<S: Store>(
    dev: &CudaDevice,
    acc: &CudaSlice<f32>,
    acc_ld: usize,
    col0: usize,
    n: usize,
    bias: &CudaSlice<f32>,
    scale: f32,
    gelu: bool,
    residual: Option<&CudaSlice<S>>,
    range: Option<RangeSlot<'_>>,
) -> Result<CudaSlice<S>, Error> {
    let c = bias.len();
    let total = elements(n, c, "linear epilogue")?;
    if total == 0 {
        return alloc::<S>(dev, 1, "linear epilogue output");
    }
    // SAFETY: linear_epilogue writes every one of the n * c outputs (one thread each).
    let mut out = unsafe { dev.alloc_uninit::<S>(n * c, "linear epilogue output")? };
    // four values a thread where the rows allow it (the pass is bound by its per-thread work,
    // not by memory, at these sizes)
    let by4 = c % 4 == 0 && acc_ld % 4 == 0 && col0 % 4 == 0;
    let f = dev.function_in(S::STORAGE, "layers", if by4 { "linear_epilogue4" } else { "linear_epilogue" })?;
    let threads = if by4 { total / 4 } else { total };
    let (ld, col0, n32, c32, act) = (acc_ld as u32, col0 as u32, n as u32, c as u32, gelu as u32);
    let null: u64 = 0;
    let s = &dev.stream;
    let mut b = s.launch_builder(&f);
    b.arg(acc).arg(&ld).arg(&col0).arg(&n32).arg(&c32).arg(bias).arg(&scale).arg(&act);
    match residual {
        Some(r) => b.arg(r),
        None => b.arg(&null),
    };
    b.arg(&mut out);
    RangeSlot::push(range.as_ref(), &mut b);
    // SAFETY: matches layers.cu's signature; acc holds n * acc_ld floats, residual/out n * c;
    // the range slot's layer lies in its flags.
    unsafe { b.launch(grid_1d(threads, THREADS)) }.map_err(cuda_err("linear_epilogue"))?;
    Ok(out)
}

/// A packed qkv Linear's q, k and v (each `[n, c]` in `S`) from its FP32 GEMM output `acc`
/// (`[n, 3c]`, no bias) in one launch: q = (acc[:, 0:c] + bias\[0\]) · `q_scale`, k and v plus their
/// biases, the same values as three [`epilogue_guarded`] calls; the range guard of all three
/// reports into `range`. `c` must be a multiple of 4.
pub fn qkv_epilogue_guarded<S: Store>(
    dev: &CudaDevice,
    acc: &CudaSlice<f32>,
    n: usize,
    bias: [&CudaSlice<f32>; 3],
    q_scale: f32,
    range: Option<RangeSlot<'_>>,
) -> Result<[CudaSlice<S>; 3], Error> {
    let c = bias[0].len();
    if c % 4 != 0 || bias.iter().any(|b| b.len() != c) {
        return Err(Error::InvalidInput(format!(
            "qkv epilogue: biases of {}, {} and {} channels; they must be equal and a multiple of 4",
            bias[0].len(),
            bias[1].len(),
            bias[2].len()
        )));
    }
    if acc.len() < n * 3 * c {
        return Err(Error::InvalidInput(format!("qkv epilogue: {} accumulators for {n} rows of 3 x {c}", acc.len())));
    }
    let quads = elements(n, 3 * c / 4, "qkv epilogue")?;
    // SAFETY: qkv_epilogue writes every one of the n * c values of each output (a thread per
    // four consecutive values of a row).
    let mut out = unsafe { [dev.alloc_uninit::<S>(n * c, "q")?, dev.alloc_uninit::<S>(n * c, "k")?, dev.alloc_uninit::<S>(n * c, "v")?] };
    if quads == 0 {
        return Ok(out);
    }
    let f = dev.function_in(S::STORAGE, "layers", "qkv_epilogue")?;
    let (n32, c32) = (n as u32, c as u32);
    let [q, k, v] = &mut out;
    let mut b = dev.stream.launch_builder(&f);
    b.arg(acc).arg(&n32).arg(&c32).arg(bias[0]).arg(bias[1]).arg(bias[2]).arg(&q_scale).arg(q).arg(k).arg(v);
    RangeSlot::push(range.as_ref(), &mut b);
    // SAFETY: matches layers.cu's signature; acc holds n * 3c floats (checked), each bias c, each
    // output n * c; c % 4 == 0 keeps the 16-byte loads aligned; the range slot's layer lies in
    // its flags.
    unsafe { b.launch(grid_1d(quads, THREADS)) }.map_err(cuda_err("qkv_epilogue"))?;
    Ok(out)
}

/// `nn.LayerNorm(C)`: FP32 gamma and beta.
pub struct GpuLayerNorm {
    pub gamma: CudaSlice<f32>,
    pub beta: CudaSlice<f32>,
    pub eps: f32,
}

impl GpuLayerNorm {
    pub fn upload(dev: &CudaDevice, ln: &LayerNorm) -> Result<Self, Error> {
        if ln.gamma.len() > LAYER_NORM_MAX_C {
            return Err(Error::InvalidInput(format!("CUDA LayerNorm supports up to {LAYER_NORM_MAX_C} channels, not {}", ln.gamma.len())));
        }
        Ok(Self { gamma: up_f32(dev, &ln.gamma, "layer norm")?, beta: up_f32(dev, &ln.beta, "layer norm")?, eps: ln.eps as f32 })
    }

    /// `x` `[n, C]` normalised (not guarded: [`GpuLayerNorm::forward_guarded`]).
    pub fn forward(&self, dev: &CudaDevice, x: &CudaSlice<f16>, n: usize) -> Result<CudaSlice<f16>, Error> {
        self.forward_guarded(dev, x, n, None)
    }

    /// [`GpuLayerNorm::forward`] in the storage type `S`, with the range guard of its output
    /// reporting into `range`.
    pub fn forward_guarded<S: Store>(&self, dev: &CudaDevice, x: &CudaSlice<S>, n: usize, range: Option<RangeSlot<'_>>) -> Result<CudaSlice<S>, Error> {
        let c = self.gamma.len();
        if n == 0 {
            return alloc::<S>(dev, 1, "layer norm output");
        }
        // SAFETY: the kernel writes all c values of each of the n rows (one warp a row).
        let mut out = unsafe { dev.alloc_uninit::<S>(n * c, "layer norm output")? };
        if x.len() < n * c {
            return Err(Error::InvalidInput(format!("layer norm: {} input halves for {n} rows of {c}", x.len())));
        }
        let name = if c <= LAYER_NORM_NARROW_C { "layer_norm_rows" } else { "layer_norm_rows_wide" };
        let f = dev.function_in(S::STORAGE, "layers", name)?;
        let (n32, c32) = (elements(n, 1, "layer norm")?, c as u32);
        // 8 rows (warps) a block
        let cfg = cudarc::driver::LaunchConfig { grid_dim: (n32.div_ceil(8), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let s = &dev.stream;
        // SAFETY: matches layers.cu; x and out hold n * c halves; the range slot's layer lies in
        // its flags.
        unsafe {
            let mut b = s.launch_builder(&f);
            b.arg(x).arg(&n32).arg(&c32).arg(&self.gamma).arg(&self.beta).arg(&self.eps).arg(&mut out);
            RangeSlot::push(range.as_ref(), &mut b);
            b.launch(cfg)
        }
        .map_err(cuda_err(name))?;
        Ok(out)
    }
}

