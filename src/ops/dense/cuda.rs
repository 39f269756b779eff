//! Dense NHWC maps on CUDA: FP16 storage, FP32 accumulation (kernels in `kernels/ops/dense.cu`).
//!
//! A convolution is one cuBLAS GEMM (FP16 operands, FP32 accumulate and output) over pixels:
//! 1×1 stride-1 unpadded convs multiply the map itself, every other conv multiplies an im2col
//! matrix (one row per output pixel, `(ky, kx, ci)` order, zero padding); then `conv_epilogue`
//! adds the bias (a folded BatchNorm's shift), applies the activation and writes FP16.

use crate::ops::dense::{Activation, Conv2d, FeatureMap};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::range::RangeSlot;
use crate::Error;
use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg};
use half::f16;

const THREADS: u32 = 256;
/// Grid-stride kernels take at most this many blocks (every element is still visited).
const MAX_BLOCKS: u64 = 1 << 16;

/// A launch covering `total` elements with grid-stride loops.
pub(crate) fn grid_stride(total: u64) -> LaunchConfig {
    let blocks = total.div_ceil(THREADS as u64).clamp(1, MAX_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

pub(crate) fn u32_of(v: usize, what: &str) -> Result<u32, Error> {
    u32::try_from(v).map_err(|_| Error::InvalidInput(format!("{what}: {v} exceeds 2^32-1")))
}

fn i32_of(v: usize, what: &str) -> Result<i32, Error> {
    i32::try_from(v).map_err(|_| Error::InvalidInput(format!("{what}: {v} exceeds 2^31-1 (cuBLAS dimension)")))
}

/// A batch of NHWC maps on the GPU, FP16: `data[((b · h + y) · w + x) · c + ch]`.
pub struct CudaFeatureMap {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub data: CudaSlice<f16>,
}

impl CudaFeatureMap {
    /// A map of the given size whose values the caller's next kernel writes (zeroed memory).
    pub fn zeros(dev: &CudaDevice, n: usize, h: usize, w: usize, c: usize) -> Result<Self, Error> {
        let len = crate::ops::dense::volume(n, h, w, c, "feature map")?;
        let data = dev.stream.alloc_zeros::<f16>(len.max(1)).map_err(cuda_err("allocating a feature map"))?;
        Ok(Self { n, h, w, c, data })
    }

    /// A map already on the GPU; `data` must hold at least `n · h · w · c` halves.
    pub fn from_slice(n: usize, h: usize, w: usize, c: usize, data: CudaSlice<f16>) -> Result<Self, Error> {
        let len = crate::ops::dense::volume(n, h, w, c, "feature map")?;
        if data.len() < len {
            return Err(Error::InvalidInput(format!("feature map: {} halves on the GPU for [{n}, {h}, {w}, {c}]", data.len())));
        }
        Ok(Self { n, h, w, c, data })
    }

    /// Copies a CPU map to the GPU, rounding to FP16.
    pub fn upload(dev: &CudaDevice, x: &FeatureMap) -> Result<Self, Error> {
        let mut h: Vec<f16> = x.data.iter().map(|&v| f16::from_f32(v)).collect();
        if h.is_empty() {
            h.push(f16::ZERO); // zero-length device buffers are not allowed
        }
        let data = dev.stream.clone_htod(&h).map_err(cuda_err("uploading a feature map"))?;
        Ok(Self { n: x.n, h: x.h, w: x.w, c: x.c, data })
    }

    /// Copies the map back as f32 (synchronises the stream).
    pub fn download(&self, dev: &CudaDevice) -> Result<FeatureMap, Error> {
        let len = self.len();
        let h = dev.stream.clone_dtoh(&self.data.slice(0..len.max(1))).map_err(cuda_err("downloading a feature map"))?;
        FeatureMap::new(self.n, self.h, self.w, self.c, h[..len].iter().map(|v| v.to_f32()).collect())
    }

    /// Values in the map (`n · h · w · c`).
    pub fn len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn pixels(&self) -> usize {
        self.n * self.h * self.w
    }
}

/// Mirror of `struct ConvShape` in dense.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ConvShapeC {
    n: u32,
    h: u32,
    w: u32,
    c: u32,
    kh: u32,
    kw: u32,
    sh: u32,
    sw: u32,
    ph: u32,
    pw: u32,
    oh: u32,
    ow: u32,
    kpad: u32,
}
// SAFETY: plain-old-data, same layout as the C struct (thirteen u32).
unsafe impl DeviceRepr for ConvShapeC {}

/// A [`Conv2d`] on the GPU: FP16 weight `[cout, kpad]` in im2col order `(ky, kx, ci)` (zeros past
/// `kh · kw · cin`), FP32 bias (zeros when the conv has none).
pub struct CudaConv2d {
    pub cin: usize,
    pub cout: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    /// Row length of the weight and of im2col rows: `kh · kw · cin`, rounded up to a multiple
    /// of 8 (16-byte rows for the tensor cores) except for 1×1 stride-1 convs, which multiply the
    /// input map directly and keep `cin`.
    kpad: usize,
    weight: CudaSlice<f16>,
    bias: CudaSlice<f32>,
}

/// Whether a conv of this shape is a GEMM on the input map itself (1×1, stride 1, no padding):
/// no im2col matrix, and weight rows of `cin`.
fn multiplies_input(kh: usize, kw: usize, stride: [usize; 2], padding: [usize; 2]) -> bool {
    kh == 1 && kw == 1 && stride == [1, 1] && padding == [0, 0]
}

impl CudaConv2d {
    pub fn upload(dev: &CudaDevice, conv: &Conv2d) -> Result<Self, Error> {
        let taps = conv.kh * conv.kw * conv.cin;
        let direct = multiplies_input(conv.kh, conv.kw, conv.stride, conv.padding);
        let kpad = if direct { taps } else { taps.div_ceil(8) * 8 };
        let mut w = vec![f16::ZERO; conv.cout * kpad];
        for co in 0..conv.cout {
            for ci in 0..conv.cin {
                for ky in 0..conv.kh {
                    for kx in 0..conv.kw {
                        let src = ((co * conv.cin + ci) * conv.kh + ky) * conv.kw + kx;
                        w[co * kpad + (ky * conv.kw + kx) * conv.cin + ci] = f16::from_f32(conv.weight[src]);
                    }
                }
            }
        }
        let bias = conv.bias.clone().unwrap_or_else(|| vec![0.0; conv.cout]);
        Ok(Self {
            cin: conv.cin,
            cout: conv.cout,
            kh: conv.kh,
            kw: conv.kw,
            stride: conv.stride,
            padding: conv.padding,
            kpad,
            weight: dev.stream.clone_htod(&w).map_err(cuda_err("uploading conv weights"))?,
            bias: dev.stream.clone_htod(&bias).map_err(cuda_err("uploading a conv bias"))?,
        })
    }

    /// The FP32 bias (a folded BatchNorm's shift; zeros without a bias).
    pub fn bias(&self) -> &CudaSlice<f32> {
        &self.bias
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

    /// The device memory a forward on an `n × h × w` input holds beside its input and output:
    /// the im2col matrix (none for a 1×1 stride-1 conv) and the FP32 accumulators, in bytes.
    pub fn scratch_bytes(&self, n: usize, h: usize, w: usize) -> Result<usize, Error> {
        let (oh, ow) = self.output_size(h, w)?;
        let m = n * oh * ow;
        let direct = multiplies_input(self.kh, self.kw, self.stride, self.padding);
        let col = if direct { 0 } else { m * self.kpad * 2 };
        Ok(col + m * self.cout * 4)
    }

    /// `act(conv(x) + bias)` as FP16.
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap, act: Activation) -> Result<CudaFeatureMap, Error> {
        self.forward_guarded(dev, blas, x, act, None)
    }

    /// [`CudaConv2d::forward`] with the FP16 range guard ([`crate::device::range_guard`]) of its output
    /// (before the activation) reporting into `range`.
    pub fn forward_guarded(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap, act: Activation, range: Option<RangeSlot<'_>>) -> Result<CudaFeatureMap, Error> {
        let (acc, oh, ow) = self.forward_acc(dev, blas, x)?;
        let m = x.n * oh * ow;
        if m == 0 {
            return CudaFeatureMap::zeros(dev, x.n, oh, ow, self.cout);
        }
        // SAFETY: conv_epilogue below writes all m * cout values.
        let data = unsafe { dev.alloc_uninit::<f16>(m * self.cout, "the conv output") }?;
        let mut out = CudaFeatureMap::from_slice(x.n, oh, ow, self.cout, data)?;
        let (m32, c32, relu) = (u32_of(m, "conv2d pixels")?, self.cout as u32, (act == Activation::Relu) as u32);
        let f = dev.function("dense", "conv_epilogue")?;
        // SAFETY: matches dense.cu; acc holds m * cout floats, bias cout, out m * cout halves; the
        // range slot's layer lies in its flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&acc).arg(&m32).arg(&c32).arg(&self.bias).arg(&relu).arg(&mut out.data);
            RangeSlot::push(range.as_ref(), &mut b);
            b.launch(grid_stride(m as u64 * self.cout as u64))
        }
        .map_err(cuda_err("conv_epilogue"))?;
        Ok(out)
    }

    /// The convolution without bias or activation: FP32 `[n · oh · ow, cout]` (row = output
    /// pixel, NHWC order), with `oh`, `ow`. For callers that fuse their own epilogue.
    pub fn forward_acc(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap) -> Result<(CudaSlice<f32>, usize, usize), Error> {
        if x.c != self.cin {
            return Err(Error::InvalidInput(format!("conv2d: input has {} channels, the conv takes {}", x.c, self.cin)));
        }
        if x.data.len() < x.len() {
            return Err(Error::InvalidInput(format!("conv2d: input buffer holds {} of {} halves", x.data.len(), x.len())));
        }
        let (oh, ow) = self.output_size(x.h, x.w)?;
        let m = x.n * oh * ow;
        let s = &dev.stream;
        if m == 0 {
            let acc = s.alloc_zeros::<f32>(1).map_err(cuda_err("allocating conv accumulators"))?;
            return Ok((acc, oh, ow));
        }
        // SAFETY: the GEMM below (beta 0: the output is not read) writes all m * cout values.
        let mut acc = unsafe { dev.alloc_uninit::<f32>(m * self.cout, "conv accumulators") }?;
        let direct = multiplies_input(self.kh, self.kw, self.stride, self.padding);
        if direct {
            gemm(dev, blas, &x.data, m, self.kpad, &self.weight, self.cout, &mut acc)?;
            return Ok((acc, oh, ow));
        }
        let shape = ConvShapeC {
            n: u32_of(x.n, "conv2d batch")?,
            h: u32_of(x.h, "conv2d height")?,
            w: u32_of(x.w, "conv2d width")?,
            c: u32_of(x.c, "conv2d channels")?,
            kh: self.kh as u32,
            kw: self.kw as u32,
            sh: self.stride[0] as u32,
            sw: self.stride[1] as u32,
            ph: u32_of(self.padding[0], "conv2d padding")?,
            pw: u32_of(self.padding[1], "conv2d padding")?,
            oh: u32_of(oh, "conv2d output height")?,
            ow: u32_of(ow, "conv2d output width")?,
            kpad: u32_of(self.kpad, "conv2d taps")?,
        };
        let total = (m as u64).checked_mul(self.kpad as u64).ok_or_else(|| Error::InvalidInput("conv2d: im2col size overflows".into()))?;
        // SAFETY: im2col_nhwc writes every one of the m * kpad entries (zeros included).
        let mut col = unsafe { dev.alloc_uninit::<f16>(total as usize, "the im2col matrix") }?;
        // 8 halves a thread where rows and channels allow it and the indices fit in 32 bits
        let vector = x.c % 8 == 0 && self.kpad % 8 == 0 && total < u32::MAX as u64 && (x.len() as u64) < u32::MAX as u64;
        if vector {
            let f = dev.function("dense", "im2col_nhwc_v8")?;
            // SAFETY: matches dense.cu; x holds n*h*w*c halves, col m * kpad (both multiples of
            // 8 halves, 16-byte aligned device allocations), indices checked to fit in 32 bits.
            unsafe { s.launch_builder(&f).arg(&x.data).arg(&shape).arg(&mut col).launch(grid_stride(total / 8)) }.map_err(cuda_err("im2col_nhwc_v8"))?;
        } else {
            let f = dev.function("dense", "im2col_nhwc")?;
            // SAFETY: matches dense.cu; x holds n*h*w*c halves, col m * kpad.
            unsafe { s.launch_builder(&f).arg(&x.data).arg(&shape).arg(&mut col).launch(grid_stride(total)) }.map_err(cuda_err("im2col_nhwc"))?;
        }
        gemm(dev, blas, &col, m, self.kpad, &self.weight, self.cout, &mut acc)?;
        Ok((acc, oh, ow))
    }
}

/// `acc[m, cout] = a[m, k] · w[cout, k]ᵀ` with FP16 operands (row-major, `k` halves a row), FP32
/// accumulation and output.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    dev: &CudaDevice,
    blas: &CudaBlas,
    a: &CudaSlice<f16>,
    m: usize,
    k: usize,
    w: &CudaSlice<f16>,
    cout: usize,
    acc: &mut CudaSlice<f32>,
) -> Result<(), Error> {
    if a.len() < m * k || w.len() < cout * k || acc.len() < m * cout {
        return Err(Error::InvalidInput(format!("conv2d GEMM: buffers too small for [{m} x {k}] x [{k} x {cout}]")));
    }
    let (mm, nn, kk) = (i32_of(cout, "conv2d channels")?, i32_of(m, "conv2d pixels")?, i32_of(k, "conv2d taps")?);
    let (alpha, beta) = (1.0f32, 0.0f32);
    let s = &dev.stream;
    let (w_ptr, w_sync) = w.device_ptr(s);
    let (a_ptr, a_sync) = a.device_ptr(s);
    let (y_ptr, y_sync) = acc.device_ptr_mut(s);
    // Row-major acc[m, cout] = a[m, k] · w[cout, k]ᵀ is column-major accᵀ = op(W) · aᵀ with
    // op = transpose: cuBLAS m = cout, n = pixels, k = taps.
    // SAFETY: the pointers are live device buffers of the sizes checked above; the handle is
    // bound to this device's stream.
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            blas_sys::cublasOperation_t::CUBLAS_OP_T,
            blas_sys::cublasOperation_t::CUBLAS_OP_N,
            mm,
            nn,
            kk,
            (&alpha) as *const f32 as *const _,
            w_ptr as *const _,
            blas_sys::cudaDataType_t::CUDA_R_16F,
            kk,
            a_ptr as *const _,
            blas_sys::cudaDataType_t::CUDA_R_16F,
            kk,
            (&beta) as *const f32 as *const _,
            y_ptr as *mut _,
            blas_sys::cudaDataType_t::CUDA_R_32F,
            mm,
            blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| Error::Cuda(format!("cuBLAS GEMM [{m} x {k}] x [{k} x {cout}]: {e:?}")))?;
    drop((w_sync, a_sync, y_sync));
    Ok(())
}

/// [`crate::ops::dense::bilinear_resize`] on the GPU (same f32 source coordinates, FP16 values).
pub fn bilinear_resize_cuda(dev: &CudaDevice, x: &CudaFeatureMap, oh: usize, ow: usize, align_corners: bool) -> Result<CudaFeatureMap, Error> {
    let mut out = CudaFeatureMap::zeros(dev, x.n, oh, ow, x.c)?;
    if out.is_empty() || x.is_empty() {
        return Ok(out);
    }
    let scale = |input: usize, output: usize| -> f32 {
        // the CPU reference's scale (resize.rs axis_taps), computed once here
        if align_corners {
            if output > 1 {
                (input as f32 - 1.0) / (output as f32 - 1.0)
            } else {
                0.0
            }
        } else {
            input as f32 / output as f32
        }
    };
    let (sy, sx) = (scale(x.h, oh), scale(x.w, ow));
    let dims = [x.n, x.h, x.w, x.c, oh, ow].iter().map(|&v| u32_of(v, "bilinear resize")).collect::<Result<Vec<_>, _>>()?;
    let ac = align_corners as u32;
    let cfg = grid_stride(out.len() as u64);
    let f = dev.function("dense", "bilinear_resize_nhwc")?;
    // SAFETY: matches dense.cu; x holds n*h*w*c halves, out n*oh*ow*c.
    unsafe {
        dev.stream
            .launch_builder(&f)
            .arg(&x.data)
            .arg(&dims[0])
            .arg(&dims[1])
            .arg(&dims[2])
            .arg(&dims[3])
            .arg(&dims[4])
            .arg(&dims[5])
            .arg(&sy)
            .arg(&sx)
            .arg(&ac)
            .arg(&mut out.data)
            .launch(cfg)
    }
    .map_err(cuda_err("bilinear_resize_nhwc"))?;
    Ok(out)
}

/// [`crate::ops::dense::concat_channels`] on the GPU.
pub fn concat_channels_cuda(dev: &CudaDevice, a: &CudaFeatureMap, b: &CudaFeatureMap) -> Result<CudaFeatureMap, Error> {
    if (a.n, a.h, a.w) != (b.n, b.h, b.w) {
        return Err(Error::InvalidInput(format!(
            "concat: maps of [n {}, h {}, w {}] and [n {}, h {}, w {}] differ in size",
            a.n, a.h, a.w, b.n, b.h, b.w
        )));
    }
    let mut out = CudaFeatureMap::zeros(dev, a.n, a.h, a.w, a.c + b.c)?;
    if out.is_empty() {
        return Ok(out);
    }
    let (ca, cb, pixels) = (u32_of(a.c, "concat channels")?, u32_of(b.c, "concat channels")?, a.pixels() as u64);
    let cfg = grid_stride(out.len() as u64);
    let f = dev.function("dense", "concat_channels_nhwc")?;
    // SAFETY: matches dense.cu; a/b hold pixels * ca / cb halves, out pixels * (ca + cb).
    unsafe {
        dev.stream
            .launch_builder(&f)
            .arg(&a.data)
            .arg(&ca)
            .arg(&b.data)
            .arg(&cb)
            .arg(&pixels)
            .arg(&mut out.data)
            .launch(cfg)
    }
    .map_err(cuda_err("concat_channels_nhwc"))?;
    Ok(out)
}
