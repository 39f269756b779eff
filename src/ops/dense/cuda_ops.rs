//! The BEV decoder's and map head's dense ops on CUDA beyond `cuda.rs` (kernels in
//! `kernels/ops/bev_dense.cu`): a kernel = stride transposed convolution (one cuBLAS GEMM and a
//! scatter), a conv with a residual added before its activation, `grid_sample`, and the head's
//! bias + sigmoid to class-major FP32 maps.

use crate::ops::dense::cuda::{gemm, grid_stride, u32_of, CudaConv2d, CudaFeatureMap};
use crate::ops::dense::{Activation, ConvTranspose2d, GridPadding};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::Error;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, PushKernelArg};
use half::f16;

/// A [`ConvTranspose2d`] whose kernel equals its stride and has no padding (SECONDFPN's deconv):
/// each input pixel writes its own `k × k` output block, so the op is a GEMM of the input pixels
/// by the weight as `[(ky, kx, co), ci]` and a scatter that adds the bias and the activation.
pub struct CudaConvTranspose2d {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    /// FP16 `[(ky · k + kx) · cout + co, ci]`.
    weight: CudaSlice<f16>,
    bias: CudaSlice<f32>,
}

impl CudaConvTranspose2d {
    /// Errors for deconvs this path does not cover (kernel ≠ stride, non-square, padding).
    pub fn upload(dev: &CudaDevice, d: &ConvTranspose2d) -> Result<Self, Error> {
        if d.kh != d.kw || d.stride != [d.kh, d.kw] || d.padding != [0, 0] {
            return Err(Error::InvalidInput(format!(
                "conv_transpose2d on CUDA: kernel {}x{}, stride {:?}, padding {:?}; only kernel = stride, square, unpadded",
                d.kh, d.kw, d.stride, d.padding
            )));
        }
        let (cin, cout, k) = (d.cin, d.cout, d.kh);
        let mut w = vec![f16::ZERO; d.weight.len()];
        for ci in 0..cin {
            for co in 0..cout {
                for ky in 0..k {
                    for kx in 0..k {
                        w[((ky * k + kx) * cout + co) * cin + ci] = f16::from_f32(d.weight[((ci * cout + co) * k + ky) * k + kx]);
                    }
                }
            }
        }
        let bias = d.bias.clone().unwrap_or_else(|| vec![0.0; cout]);
        Ok(Self {
            cin,
            cout,
            k,
            weight: dev.stream.clone_htod(&w).map_err(cuda_err("uploading deconv weights"))?,
            bias: dev.stream.clone_htod(&bias).map_err(cuda_err("uploading a deconv bias"))?,
        })
    }

    /// `act(conv_transpose(x) + bias)` as FP16, `[n, h · k, w · k, cout]`.
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap, act: Activation) -> Result<CudaFeatureMap, Error> {
        if x.c != self.cin || x.data.len() < x.len() {
            return Err(Error::InvalidInput(format!("conv_transpose2d: input has {} channels, the deconv takes {}", x.c, self.cin)));
        }
        let (oh, ow) = (x.h * self.k, x.w * self.k);
        let mut out = CudaFeatureMap::zeros(dev, x.n, oh, ow, self.cout)?;
        let m = x.pixels();
        if m == 0 {
            return Ok(out);
        }
        let cols = self.k * self.k * self.cout;
        let mut acc = dev.stream.alloc_zeros::<f32>(m * cols).map_err(cuda_err("allocating deconv accumulators"))?;
        gemm(dev, blas, &x.data, m, self.cin, &self.weight, cols, &mut acc)?;
        let dims = [x.n, x.h, x.w, self.k, self.cout].iter().map(|&v| u32_of(v, "conv_transpose2d")).collect::<Result<Vec<_>, _>>()?;
        u32_of(out.len(), "conv_transpose2d output")?;
        let relu = (act == Activation::Relu) as u32;
        let cfg = grid_stride(out.len() as u64);
        let f = dev.function("bev_dense", "deconv_scatter")?;
        // SAFETY: matches bev_dense.cu; acc holds m * k*k*cout floats, out n*oh*ow*cout halves.
        unsafe {
            dev.stream
                .launch_builder(&f)
                .arg(&acc)
                .arg(&dims[0])
                .arg(&dims[1])
                .arg(&dims[2])
                .arg(&dims[3])
                .arg(&dims[4])
                .arg(&self.bias)
                .arg(&relu)
                .arg(&mut out.data)
                .launch(cfg)
        }
        .map_err(cuda_err("deconv_scatter"))?;
        Ok(out)
    }
}

/// `act(conv(x) + bias + residual)` as FP16 (a BasicBlock's second conv with its identity).
pub fn conv_residual_cuda(
    dev: &CudaDevice,
    blas: &CudaBlas,
    conv: &CudaConv2d,
    x: &CudaFeatureMap,
    residual: &CudaFeatureMap,
    act: Activation,
) -> Result<CudaFeatureMap, Error> {
    let (acc, oh, ow) = conv.forward_acc(dev, blas, x)?;
    if (residual.n, residual.h, residual.w, residual.c) != (x.n, oh, ow, conv.cout) || residual.data.len() < residual.len() {
        return Err(Error::InvalidInput(format!(
            "conv + residual: residual [{}, {}, {}, {}] for an output [{}, {oh}, {ow}, {}]",
            residual.n, residual.h, residual.w, residual.c, x.n, conv.cout
        )));
    }
    let mut out = CudaFeatureMap::zeros(dev, x.n, oh, ow, conv.cout)?;
    let m = x.n * oh * ow;
    if m == 0 {
        return Ok(out);
    }
    let (m32, c32, relu) = (u32_of(m, "conv pixels")?, conv.cout as u32, (act == Activation::Relu) as u32);
    let f = dev.function("bev_dense", "conv_epilogue_residual")?;
    // SAFETY: matches bev_dense.cu; acc, residual and out hold m * cout values, bias cout.
    unsafe {
        dev.stream
            .launch_builder(&f)
            .arg(&acc)
            .arg(&m32)
            .arg(&c32)
            .arg(conv.bias())
            .arg(&residual.data)
            .arg(&relu)
            .arg(&mut out.data)
            .launch(grid_stride(m as u64 * conv.cout as u64))
    }
    .map_err(cuda_err("conv_epilogue_residual"))?;
    Ok(out)
}

/// In place on an FP16 map `y` of `cout` channels: `y = act(y + bias (+ residual))`.
pub(crate) fn bias_act_f16(
    dev: &CudaDevice,
    y: &mut CudaFeatureMap,
    bias: &CudaSlice<f32>,
    residual: Option<&CudaFeatureMap>,
    act: Activation,
) -> Result<(), Error> {
    if bias.len() < y.c {
        return Err(Error::InvalidInput(format!("bias of {} values for {} channels", bias.len(), y.c)));
    }
    if let Some(r) = residual {
        if (r.n, r.h, r.w, r.c) != (y.n, y.h, y.w, y.c) || r.data.len() < r.len() {
            return Err(Error::InvalidInput(format!(
                "residual [{}, {}, {}, {}] for an output [{}, {}, {}, {}]",
                r.n, r.h, r.w, r.c, y.n, y.h, y.w, y.c
            )));
        }
    }
    let m = y.pixels();
    if m == 0 || y.c == 0 {
        return Ok(());
    }
    let (m32, c32) = (u32_of(m, "conv pixels")?, u32_of(y.c, "conv channels")?);
    let (has_res, relu) = (residual.is_some() as u32, (act == Activation::Relu) as u32);
    let total = m as u64 * y.c as u64;
    // 8 channels a thread where the channels and 32-bit indices allow it
    let vector = y.c % 8 == 0 && total < u32::MAX as u64;
    let f = dev.function("bev_dense", if vector { "bias_act_f16_v8" } else { "bias_act_f16" })?;
    let total = if vector { total / 8 } else { total };
    let res = residual.map(|r| &r.data);
    // SAFETY: matches bev_dense.cu; y (and the residual when has_res) hold m * cout halves. Without
    // a residual the kernel never reads `res`; the bias buffer is passed in its place only so
    // that the argument is a live device pointer.
    unsafe {
        let mut b = dev.stream.launch_builder(&f);
        b.arg(&mut y.data).arg(&m32).arg(&c32).arg(bias);
        match res {
            Some(r) => b.arg(r),
            None => b.arg(bias),
        };
        b.arg(&has_res).arg(&relu).launch(grid_stride(total))
    }
    .map_err(cuda_err("bias_act_f16"))?;
    Ok(())
}

/// [`crate::ops::dense::grid_sample`] on the GPU: `grid` is the FP32 grid already on the device
/// (`oh · ow · 2` values).
pub fn grid_sample_cuda(
    dev: &CudaDevice,
    x: &CudaFeatureMap,
    grid: &CudaSlice<f32>,
    oh: usize,
    ow: usize,
    padding: GridPadding,
    align_corners: bool,
) -> Result<CudaFeatureMap, Error> {
    if Some(grid.len()) != oh.checked_mul(ow).and_then(|p| p.checked_mul(2)) {
        return Err(Error::InvalidInput(format!("grid_sample: grid of {} values for {oh} x {ow} points", grid.len())));
    }
    if x.data.len() < x.len() {
        return Err(Error::InvalidInput(format!("grid_sample: input buffer holds {} of {} halves", x.data.len(), x.len())));
    }
    let len = crate::ops::dense::volume(x.n, oh, ow, x.c, "grid_sample output")?;
    if len == 0 {
        return CudaFeatureMap::zeros(dev, x.n, oh, ow, x.c);
    }
    // SAFETY: the kernel below writes every output value.
    let data = unsafe { dev.alloc_uninit::<f16>(len, "the grid_sample output") }?;
    let mut out = CudaFeatureMap::from_slice(x.n, oh, ow, x.c, data)?;
    let dims = [x.n, x.h, x.w, x.c, oh, ow].iter().map(|&v| u32_of(v, "grid_sample")).collect::<Result<Vec<_>, _>>()?;
    let (border, ac) = ((padding == GridPadding::Border) as u32, align_corners as u32);
    // the kernel indexes corners with i32 arithmetic: keep the input inside that range
    if x.h >= i32::MAX as usize / 2 || x.w >= i32::MAX as usize / 2 {
        return Err(Error::InvalidInput(format!("grid_sample: a {} x {} input is too large", x.h, x.w)));
    }
    // 8 channels a thread where the channels and 32-bit indices allow it
    let vector = x.c % 8 == 0 && (out.len() as u64) < u32::MAX as u64 && (x.len() as u64) < u32::MAX as u64;
    let cfg = grid_stride(if vector { out.len() as u64 / 8 } else { out.len() as u64 });
    let f = dev.function("bev_dense", if vector { "grid_sample_nhwc_v8" } else { "grid_sample_nhwc" })?;
    // SAFETY: matches bev_dense.cu; x holds n*h*w*c halves, grid oh*ow*2 floats, out n*oh*ow*c.
    unsafe {
        dev.stream
            .launch_builder(&f)
            .arg(&x.data)
            .arg(&dims[0])
            .arg(&dims[1])
            .arg(&dims[2])
            .arg(&dims[3])
            .arg(grid)
            .arg(&dims[4])
            .arg(&dims[5])
            .arg(&border)
            .arg(&ac)
            .arg(&mut out.data)
            .launch(cfg)
    }
    .map_err(cuda_err("grid_sample_nhwc"))?;
    Ok(out)
}

/// `sigmoid(acc + bias)` of FP32 NHWC logits `[n · pixels, k]` into FP32 `[n, k, pixels]`.
pub fn sigmoid_class_major_cuda(
    dev: &CudaDevice,
    acc: &CudaSlice<f32>,
    n: usize,
    pixels: usize,
    bias: &CudaSlice<f32>,
) -> Result<CudaSlice<f32>, Error> {
    let k = bias.len();
    let total = n.checked_mul(pixels).and_then(|v| v.checked_mul(k)).ok_or_else(|| Error::InvalidInput("sigmoid: size overflows".into()))?;
    if acc.len() < total {
        return Err(Error::InvalidInput(format!("sigmoid: {} logits for {n} x {pixels} x {k}", acc.len())));
    }
    let mut out = dev.stream.alloc_zeros::<f32>(total.max(1)).map_err(cuda_err("allocating the probability maps"))?;
    if total == 0 {
        return Ok(out);
    }
    let (n32, p32, k32) = (u32_of(n, "sigmoid batch")?, u32_of(pixels, "sigmoid pixels")?, u32_of(k, "sigmoid classes")?);
    let f = dev.function("bev_dense", "sigmoid_class_major")?;
    // SAFETY: matches bev_dense.cu; acc holds n*pixels*k floats, bias k, out n*k*pixels.
    unsafe {
        dev.stream
            .launch_builder(&f)
            .arg(acc)
            .arg(&n32)
            .arg(&p32)
            .arg(&k32)
            .arg(bias)
            .arg(&mut out)
            .launch(grid_stride(total as u64))
    }
    .map_err(cuda_err("sigmoid_class_major"))?;
    Ok(out)
}
