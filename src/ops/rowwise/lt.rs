//! `nn.Linear` as one cuBLASLt GEMM with FP16 output: the bias added in the GEMM's epilogue
//! (`CUBLASLT_EPILOGUE_BIAS`) and, optionally, a residual added through its C matrix
//! (`D = A·B + 1·C + bias`), all in the FP32 accumulator before the one rounding to FP16.
//!
//! Why (against `gpu_layers::GpuLinear::gemm` + `epilogue`): that pair writes the FP32 GEMM
//! result (4 bytes a value), reads it back (4) and writes FP16 (2): 10 bytes a value where this
//! writes 2 (+ 2 read for a residual). At the camera encoder's activation sizes (Swin-T stage 1:
//! 76,440 padded tokens × 288 qkv outputs) those bytes, not the FLOPs, set the time.
//!
//! Layouts, descriptors and the chosen algorithm are built once per (m, n, k, residual) and
//! reused (the heuristic query costs tens of microseconds on the host); the bias pointer is set
//! on the cached descriptor at each call. The workspace is allocated once (32 MiB, NVIDIA's
//! recommendation for Hopper), so a call allocates nothing (CUDA-graph capture safe).

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::libraries::{self, Lib};
use crate::Error;
use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::f16;
use std::collections::HashMap;
use std::sync::Mutex;

const WORKSPACE_BYTES: usize = 32 << 20;

/// Cached per GEMM shape.
struct LtPlan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

/// A cuBLASLt handle with its workspace and plans.
pub struct LtGemm {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: Mutex<HashMap<(u64, u64, u64, bool), LtPlan>>,
}

// SAFETY: the handle and the cached descriptors are only used under the plans' mutex or by
// `&self` calls on the one stream of the device (cuBLASLt handles are thread safe; descriptors
// are modified only under the mutex).
unsafe impl Send for LtGemm {}
unsafe impl Sync for LtGemm {}

fn lt_err(what: &str) -> impl Fn(lt::CublasError) -> Error + '_ {
    move |e| Error::Cuda(format!("cuBLASLt {what}: {e:?}"))
}

impl LtGemm {
    /// A handle, or an error when libcublasLt cannot be loaded.
    pub fn new(dev: &CudaDevice) -> Result<LtGemm, Error> {
        // Found where cudarc will find it and of this build's CUDA major, or an error saying so.
        libraries::require(&[Lib::CublasLt])?;
        let handle = lt::create_handle().map_err(lt_err("create"))?;
        // SAFETY: the workspace is scratch for cuBLASLt only, never read by us.
        let workspace = unsafe { dev.alloc_uninit::<u8>(WORKSPACE_BYTES, "the cuBLASLt workspace") }?;
        Ok(LtGemm { handle, workspace, plans: Mutex::new(HashMap::new()) })
    }

    fn plan(&self, dev: &CudaDevice, m: u64, n: u64, k: u64) -> Result<LtPlan, Error> {
        let f16t = sys::cudaDataType_t::CUDA_R_16F;
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, sys::cudaDataType_t::CUDA_R_32F).map_err(lt_err("matmul desc"))?;
        let set = |attr, v: &i32| {
            // SAFETY: the attribute takes a 32-bit value (cublasOperation_t / cublasLtEpilogue_t).
            unsafe { lt::set_matmul_desc_attribute(desc, attr, v as *const i32 as *const _, std::mem::size_of::<i32>()) }.map_err(lt_err("desc attribute"))
        };
        // Row-major y[n, out] = x[n, in]·Wᵀ is column-major D[m = out, n] = op(W)·x with
        // op = transpose: W [out, in] row-major is [in, out] column-major (ld = in).
        set(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA, &(cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_T as i32))?;
        set(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB, &(cudarc::cublas::sys::cublasOperation_t::CUBLAS_OP_N as i32))?;
        set(sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE, &(sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as i32))?;
        let a = lt::create_matrix_layout(f16t, k, m, k as i64).map_err(lt_err("layout A"))?;
        let b = lt::create_matrix_layout(f16t, k, n, k as i64).map_err(lt_err("layout B"))?;
        let c = lt::create_matrix_layout(f16t, m, n, m as i64).map_err(lt_err("layout C"))?;
        let pref = lt::create_matmul_pref().map_err(lt_err("preference"))?;
        let ws = WORKSPACE_BYTES as u64;
        // SAFETY: the attribute takes a u64 byte count.
        let r = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const u64 as *const _,
                std::mem::size_of::<u64>(),
            )
        }
        .map_err(lt_err("workspace preference"));
        // The bias pointer must be set for the heuristic to see the epilogue as valid: any
        // 256-byte-aligned address (the workspace's) stands in until the call sets the real one.
        let (ws_ptr, _sync) = self.workspace.device_ptr(&dev.stream);
        let bias_set = self.set_bias(desc, ws_ptr);
        // SAFETY: all descriptors were created above; C and D share layout `c`.
        let heur = r.and(bias_set).and_then(|_| unsafe { lt::get_matmul_algo_heuristic(self.handle, desc, a, b, c, c, pref) }.map_err(lt_err("no algorithm for this GEMM")));
        // SAFETY: created above, not used after.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        match heur {
            Ok(h) => Ok(LtPlan { desc, a, b, c, algo: h.algo }),
            Err(e) => {
                // SAFETY: created above, not used after.
                unsafe {
                    let _ = lt::destroy_matrix_layout(a);
                    let _ = lt::destroy_matrix_layout(b);
                    let _ = lt::destroy_matrix_layout(c);
                    let _ = lt::destroy_matmul_desc(desc);
                }
                Err(e)
            }
        }
    }

    fn set_bias(&self, desc: sys::cublasLtMatmulDesc_t, ptr: u64) -> Result<(), Error> {
        // SAFETY: the attribute takes a device pointer (8 bytes).
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                (&ptr) as *const u64 as *const _,
                std::mem::size_of::<u64>(),
            )
        }
        .map_err(lt_err("bias pointer"))
    }

    /// `y[n, out] = x[n, in] · Wᵀ + bias (+ residual)`, FP16 out, FP32 accumulation; `weight`
    /// `[out, in]` FP16 (PyTorch's layout), `bias` `[out]` FP16, `residual` `[n, out]` FP16.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        dev: &CudaDevice,
        weight: &CudaSlice<f16>,
        bias: &CudaSlice<f16>,
        fin: usize,
        fout: usize,
        x: &CudaSlice<f16>,
        n: usize,
        residual: Option<&CudaSlice<f16>>,
    ) -> Result<CudaSlice<f16>, Error> {
        if n == 0 {
            return dev.stream.alloc_zeros::<f16>(1).map_err(cuda_err("allocating linear output"));
        }
        if weight.len() < fin * fout || bias.len() < fout || x.len() < n * fin || residual.is_some_and(|r| r.len() < n * fout) {
            return Err(Error::InvalidInput(format!("cuBLASLt linear [{n} x {fin}] -> {fout}: an operand is too small")));
        }
        // SAFETY: the GEMM writes all n * fout values (beta = 0 without a residual: C not read).
        let mut y = unsafe { dev.alloc_uninit::<f16>(n * fout, "linear output") }?;
        let (m, nn, k) = (fout as u64, n as u64, fin as u64);
        let mut plans = self.plans.lock().map_err(|_| Error::Cuda("cuBLASLt plan cache poisoned".into()))?;
        let key = (m, nn, k, residual.is_some());
        let p = match plans.entry(key) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(self.plan(dev, m, nn, k)?),
        };
        let s = &dev.stream;
        let (b_ptr, b_sync) = bias.device_ptr(s);
        self.set_bias(p.desc, b_ptr)?;
        let (w_ptr, w_sync) = weight.device_ptr(s);
        let (x_ptr, x_sync) = x.device_ptr(s);
        let (y_ptr, y_sync) = y.device_ptr_mut(s);
        let (r_ptr, r_sync) = match residual {
            Some(r) => {
                let (p, sy) = r.device_ptr(s);
                (p, Some(sy))
            }
            None => (y_ptr, None),
        };
        let (ws_ptr, ws_sync) = self.workspace.device_ptr(s);
        let alpha = 1.0f32;
        let beta = if residual.is_some() { 1.0f32 } else { 0.0f32 };
        // SAFETY: pointers are live device buffers of the sizes checked above, laid out as the
        // plan's layouts say; C (the residual, or D itself with beta = 0) and D share layout c.
        unsafe {
            lt::matmul(
                self.handle,
                p.desc,
                (&alpha) as *const f32 as *const _,
                (&beta) as *const f32 as *const _,
                w_ptr as *const _,
                p.a,
                x_ptr as *const _,
                p.b,
                r_ptr as *const _,
                p.c,
                y_ptr as *mut _,
                p.c,
                &p.algo,
                ws_ptr as *mut _,
                WORKSPACE_BYTES,
                s.cu_stream() as *mut _,
            )
        }
        .map_err(|e| Error::Cuda(format!("cuBLASLt GEMM [{n} x {fin}] x [{fin} x {fout}]: {e:?}")))?;
        drop((b_sync, w_sync, x_sync, y_sync, r_sync, ws_sync));
        Ok(y)
    }
}

impl Drop for LtGemm {
    fn drop(&mut self) {
        if let Ok(mut plans) = self.plans.lock() {
            for (_, p) in plans.drain() {
                // SAFETY: each was created by `plan` and is destroyed once.
                unsafe {
                    let _ = lt::destroy_matrix_layout(p.a);
                    let _ = lt::destroy_matrix_layout(p.b);
                    let _ = lt::destroy_matrix_layout(p.c);
                    let _ = lt::destroy_matmul_desc(p.desc);
                }
            }
        }
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}
