//! Sparse convolution on CUDA (kernels in `kernels/sparse_conv.cu`): FP16 features and weights,
//! FP32 accumulation, over a `CudaKernelMap`'s neighbour table; the same function as
//! `conv_cpu::conv_with` (bias, pre-activation on the gather, residual add).

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::sparse::conv_cpu::{repack, WeightLayout};
use crate::sparse::kernel_map_cuda::CudaKernelMap;
use crate::Error;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::f16;

/// Widest input the direct kernel stages in shared memory.
pub const MAX_CIN: usize = 512;

/// A conv layer's parameters on the GPU: weight repacked to `[K][Cin][Cout]` FP16, bias f32.
pub struct CudaConvWeights {
    pub kv: usize,
    pub cin: usize,
    pub cout: usize,
    w: CudaSlice<f16>,
    bias: Option<CudaSlice<f32>>,
}

impl CudaConvWeights {
    /// `weight` as stored upstream in `layout` (spconv: `Krsc`, or `Rsck` for its 1x1x1 layers).
    pub fn upload(dev: &CudaDevice, weight: &[f32], layout: WeightLayout, kv: usize, cin: usize, cout: usize, bias: Option<&[f32]>) -> Result<Self, Error> {
        if cin == 0 || cout == 0 || cin > MAX_CIN {
            return Err(Error::InvalidInput(format!("conv: Cin {cin} must be in 1..={MAX_CIN} and Cout {cout} >= 1")));
        }
        let w = repack(weight, layout, kv, cin, cout)?;
        let w16: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
        let s = &dev.stream;
        let bias = match bias {
            Some(b) if b.len() != cout => return Err(Error::InvalidInput(format!("conv bias has {} values, expected Cout {cout}", b.len()))),
            Some(b) => Some(s.clone_htod(b).map_err(cuda_err("uploading bias"))?),
            None => None,
        };
        Ok(CudaConvWeights { kv, cin, cout, w: s.clone_htod(&w16).map_err(cuda_err("uploading weight"))?, bias })
    }
}

impl CudaConvWeights {
    /// [`CudaConvWeights::upload`] with the input channels padded with zero weights to `cin_pad`
    /// (≥ `cin`), so a layer with few inputs (SphereFormer's 4: x, y, z, intensity) can take the
    /// tensor-core kernels, which need Cin a multiple of 8. Its input must then have `cin_pad`
    /// channels; the padding channels' values do not matter (their weights are zero), but keep
    /// them finite (0 · NaN is NaN).
    #[allow(clippy::too_many_arguments)]
    pub fn upload_padded(
        dev: &CudaDevice,
        weight: &[f32],
        layout: WeightLayout,
        kv: usize,
        cin: usize,
        cout: usize,
        cin_pad: usize,
        bias: Option<&[f32]>,
    ) -> Result<Self, Error> {
        if cin_pad < cin || cin_pad > MAX_CIN {
            return Err(Error::InvalidInput(format!("conv: padded Cin {cin_pad} must be in {cin}..={MAX_CIN}")));
        }
        let w = repack(weight, layout, kv, cin, cout)?;
        let mut padded = vec![0f32; kv * cin_pad * cout];
        for k in 0..kv {
            for ci in 0..cin {
                let src = (k * cin + ci) * cout;
                let dst = (k * cin_pad + ci) * cout;
                padded[dst..dst + cout].copy_from_slice(&w[src..src + cout]);
            }
        }
        Self::upload(dev, &padded, WeightLayout::Rsck, kv, cin_pad, cout, bias)
    }
}

/// Per-input-channel affine (+ ReLU) applied to the gathered input: folded inference BatchNorm.
pub struct CudaPreActivation<'a> {
    pub scale: &'a CudaSlice<f32>,
    pub shift: &'a CudaSlice<f32>,
    pub relu: bool,
}

/// Which kernel computes a conv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvAlgo {
    /// Tensor-core implicit GEMM with 64-row tiles (`conv_implicit_gemm`): the default where it
    /// applies (Cin and Cout multiples of 8).
    ImplicitGemm,
    /// The same with 32-row tiles (`conv_implicit_gemm_m32`): fewer neighbour masks mixed in a
    /// tile, more weight traffic.
    ImplicitGemm32,
    /// [`ConvAlgo::ImplicitGemm`] with the tiles fetched by a 3-stage cp.async pipeline
    /// (`conv_implicit_gemm_pipe`); kernel volumes up to [`PIPE_MAX_KV`].
    ImplicitGemmPipe,
    /// The pipelined kernel with 32-row tiles (`conv_implicit_gemm_pipe_m32`).
    ImplicitGemmPipe32,
    /// The pipelined kernel with 64-row x 128-channel tiles, 8 warps of 32 x 32, fragments by
    /// ldmatrix (`conv_implicit_gemm_wide`): for 128 output channels and more.
    ImplicitGemmWide,
    /// One thread per output channel, FP32 FMA (`conv_direct`): any channel count; the oracle
    /// the fast kernel is tested against.
    Direct,
}

/// Output channels from which the wide-tile kernel is the default (its tiles are 128 wide).
pub const WIDE_MIN_COUT: usize = 128;

/// Dynamic shared memory of `conv_implicit_gemm_wide` (sparse_conv.cu: PIPE_STAGES rings of a
/// 64 x (32 + 8) A tile and a 32 x (128 + 8) B tile, FP16; the per-offset row table; output rows;
/// active offsets and their count).
const WIDE_SMEM_BYTES: usize = 3 * (64 * 40 + 32 * 136) * 2 + PIPE_MAX_KV * 64 * 4 + 64 * 4 + (PIPE_MAX_KV + 1) * 4;

/// Largest kernel volume the pipelined kernels take (PIPE_MAX_KV in sparse_conv.cu: a 3x3x3
/// kernel; its per-tile neighbour table lives in shared memory).
pub const PIPE_MAX_KV: usize = 27;

impl ConvAlgo {
    /// The fastest kernel that supports these channel counts (`outputs`: the map's output rows).
    /// Measured on an H100 (kernels/PERF.md, v3): 32-row tiles are 15-25% faster at 22.7k
    /// outputs (a 64-row grid under-fills the GPU), 3-7% slower at 320k.
    pub fn best_for(cin: usize, cout: usize, outputs: usize) -> ConvAlgo {
        Self::best_for_volume(cin, cout, outputs, PIPE_MAX_KV)
    }

    /// [`ConvAlgo::best_for`] for a kernel volume `kv`: the pipelined kernels where it allows
    /// (H100, SphereFormer's convs: 34 % less conv time a frame than the others; PERF.md).
    pub fn best_for_volume(cin: usize, cout: usize, outputs: usize, kv: usize) -> ConvAlgo {
        let pipe = kv <= PIPE_MAX_KV;
        if cin % 8 != 0 || cout % 8 != 0 {
            ConvAlgo::Direct
        } else if pipe && cout >= WIDE_MIN_COUT {
            ConvAlgo::ImplicitGemmWide
        } else if outputs < 100_000 {
            if pipe { ConvAlgo::ImplicitGemmPipe32 } else { ConvAlgo::ImplicitGemm32 }
        } else if pipe {
            ConvAlgo::ImplicitGemmPipe
        } else {
            ConvAlgo::ImplicitGemm
        }
    }
}

/// `x`: `[map.in_count, cin]` FP16. Returns `[map.out_count, cout]` FP16. Uses the best kernel.
pub fn conv_cuda(
    dev: &CudaDevice,
    x: &CudaSlice<f16>,
    map: &CudaKernelMap,
    w: &CudaConvWeights,
    pre: Option<&CudaPreActivation<'_>>,
    residual: Option<&CudaSlice<f16>>,
) -> Result<CudaSlice<f16>, Error> {
    conv_cuda_split(dev, x, map, w, pre, residual, ConvAlgo::best_for_volume(w.cin, w.cout, map.out_count, w.kv), None, None)
}

/// [`conv_cuda`] whose output goes through the next layer's BN (+ ReLU) in the epilogue:
/// `post(conv(x) + bias + residual)`, for a conv whose raw output nothing else reads (it saves
/// the next conv a pre-activation pass over its input).
pub fn conv_cuda_post(
    dev: &CudaDevice,
    x: &CudaSlice<f16>,
    map: &CudaKernelMap,
    w: &CudaConvWeights,
    pre: Option<&CudaPreActivation<'_>>,
    post: &CudaPreActivation<'_>,
) -> Result<CudaSlice<f16>, Error> {
    let algo = ConvAlgo::best_for_volume(w.cin, w.cout, map.out_count, w.kv);
    conv_cuda_split(dev, x, map, w, pre, None, algo, None, Some(post))
}

/// `relu?(x * scale + shift)` per channel over `[n, c]` FP16 rows (conv_pre_activate).
fn pre_activate(dev: &CudaDevice, x: &CudaSlice<f16>, n: usize, c: usize, p: &CudaPreActivation<'_>) -> Result<CudaSlice<f16>, Error> {
    let s = &dev.stream;
    let mut out = s.alloc_zeros::<f16>((n * c).max(1)).map_err(cuda_err("allocating the pre-activated input"))?;
    let total = u32::try_from(n * c).map_err(|_| Error::InvalidInput("conv input exceeds 2^32 values".into()))?;
    if total == 0 {
        return Ok(out);
    }
    let f = dev.function("sparse_conv", "conv_pre_activate")?;
    let (n32, c32, relu) = (n as u32, c as u32, p.relu as u32);
    // SAFETY: matches sparse_conv.cu; x holds >= n * c halves (checked by the caller), scale and
    // shift c floats, out n * c halves.
    unsafe {
        s.launch_builder(&f)
            .arg(x).arg(&n32).arg(&c32).arg(p.scale).arg(p.shift).arg(&relu).arg(&mut out)
            .launch(crate::device::primitives::grid_1d(total, 256))
    }
    .map_err(cuda_err("conv_pre_activate"))?;
    Ok(out)
}

/// Blocks an implicit-GEMM conv should have in flight before splitting its kernel offsets over
/// more blocks pays (a few per SM of an H100's 132). The wide kernel takes the same target: with
/// half of it, the nuScenes frame's convs took 14 % longer (measured), though a single C128 conv
/// of 22.7k outputs runs faster unsplit.
const CONV_TARGET_BLOCKS: usize = 4 * 132;
/// At most this many offset splits, each of at least this many offsets.
const MAX_OFFSET_SPLITS: usize = 9;
const MIN_OFFSETS_PER_SPLIT: usize = 3;

/// Offset splits for an implicit-GEMM conv of `blocks` output tiles and kernel volume `kv`: with
/// few outputs and wide channels (the deep levels of a sparse sweep) each block would walk every
/// offset with most of the GPU idle.
fn auto_offset_splits(blocks: usize, kv: usize, target: usize) -> usize {
    let by_blocks = target.div_ceil(blocks.max(1));
    let by_offsets = (kv / MIN_OFFSETS_PER_SPLIT).max(1);
    by_blocks.min(by_offsets).clamp(1, MAX_OFFSET_SPLITS)
}

/// [`conv_cuda`] with the kernel chosen by the caller, the implicit GEMM's kernel-offset splits
/// (`None`: chosen from the grid size; 1: no split; ignored by the direct kernel) and an optional
/// post-activation (see [`conv_cuda_post`]) — the one entry with every option, for the model's
/// wrappers, tests and benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn conv_cuda_split(
    dev: &CudaDevice,
    x: &CudaSlice<f16>,
    map: &CudaKernelMap,
    w: &CudaConvWeights,
    pre: Option<&CudaPreActivation<'_>>,
    residual: Option<&CudaSlice<f16>>,
    algo: ConvAlgo,
    offset_splits: Option<usize>,
    post: Option<&CudaPreActivation<'_>>,
) -> Result<CudaSlice<f16>, Error> {
    let pipelined = matches!(algo, ConvAlgo::ImplicitGemmPipe | ConvAlgo::ImplicitGemmPipe32 | ConvAlgo::ImplicitGemmWide);
    if pipelined && w.kv > PIPE_MAX_KV {
        return Err(Error::InvalidInput(format!("the pipelined conv takes kernel volumes up to {PIPE_MAX_KV}, got {}", w.kv)));
    }
    if algo != ConvAlgo::Direct && (w.cin % 8 != 0 || w.cout % 8 != 0) {
        return Err(Error::InvalidInput(format!("implicit GEMM conv needs Cin and Cout multiples of 8, got {} and {}", w.cin, w.cout)));
    }
    if pipelined && map.sorted.is_none() && map.out_count > 0 {
        // maps of up to 64 offsets always carry it (kernel_map_cuda::mask_order)
        return Err(Error::InvalidInput("the pipelined conv needs the map's outputs sorted by neighbour mask".into()));
    }
    if w.kv != map.kv {
        return Err(Error::InvalidInput(format!("conv weight has kernel volume {}, the map {}", w.kv, map.kv)));
    }
    if x.len() < map.in_count * w.cin {
        return Err(Error::InvalidInput(format!("conv input holds {} values, need {} x {}", x.len(), map.in_count, w.cin)));
    }
    if let Some(r) = residual {
        if r.len() < map.out_count * w.cout {
            return Err(Error::InvalidInput("conv residual is smaller than the output".into()));
        }
    }
    if let Some(p) = pre {
        if p.scale.len() < w.cin || p.shift.len() < w.cin {
            return Err(Error::InvalidInput("conv pre-activation needs Cin scales and shifts".into()));
        }
    }
    if let Some(p) = post {
        if p.scale.len() < w.cout || p.shift.len() < w.cout {
            return Err(Error::InvalidInput("conv post-activation needs Cout scales and shifts".into()));
        }
    }
    let s = &dev.stream;
    if algo == ConvAlgo::Direct && post.is_some() {
        // conv_direct has no post-activation in its epilogue: a separate pass
        let raw = conv_cuda_split(dev, x, map, w, pre, residual, algo, offset_splits, None)?;
        return match post {
            Some(p) => pre_activate(dev, &raw, map.out_count, w.cout, p),
            None => Ok(raw),
        };
    }
    let mut out = s.alloc_zeros::<f16>((map.out_count * w.cout).max(1)).map_err(cuda_err("allocating conv output"))?;
    if map.out_count == 0 {
        return Ok(out);
    }
    // The pipelined kernels copy rows straight into shared memory, so a pre-activation is applied
    // to the whole input once here (each row would otherwise be transformed at every gather).
    let activated = match pre {
        Some(p) if pipelined => Some(pre_activate(dev, x, map.in_count, w.cin, p)?),
        _ => None,
    };
    let (x, pre) = match &activated {
        Some(a) => (a, None),
        None => (x, pre),
    };
    let mut splits = 1usize;
    let (f, cfg) = match algo {
        ConvAlgo::Direct => {
            let threads = (w.cout.min(256) as u32).div_ceil(32) * 32;
            let cfg = LaunchConfig {
                grid_dim: (map.out_count as u32, (w.cout as u32).div_ceil(threads), 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            (dev.function("sparse_conv", "conv_direct")?, cfg)
        }
        ConvAlgo::ImplicitGemm | ConvAlgo::ImplicitGemm32 | ConvAlgo::ImplicitGemmPipe | ConvAlgo::ImplicitGemmPipe32 => {
            // BM x 64 output tiles, 128 threads (sparse_conv.cu: BM = 32 * MI, IG_BN).
            let (bm, name) = match algo {
                ConvAlgo::ImplicitGemm => (64, "conv_implicit_gemm"),
                ConvAlgo::ImplicitGemm32 => (32, "conv_implicit_gemm_m32"),
                ConvAlgo::ImplicitGemmPipe => (64, "conv_implicit_gemm_pipe"),
                _ => (32, "conv_implicit_gemm_pipe_m32"),
            };
            let tiles = ((map.out_count as u32).div_ceil(bm), (w.cout as u32).div_ceil(64));
            splits = offset_splits.unwrap_or_else(|| auto_offset_splits(tiles.0 as usize * tiles.1 as usize, w.kv, CONV_TARGET_BLOCKS)).clamp(1, w.kv.max(1));
            let cfg = LaunchConfig {
                grid_dim: (tiles.0, tiles.1, splits as u32),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            (dev.function("sparse_conv", name)?, cfg)
        }
        ConvAlgo::ImplicitGemmWide => {
            // 64 x 128 output tiles, 256 threads, dynamic shared memory (with the static, above the 48 KB default)
            let tiles = ((map.out_count as u32).div_ceil(64), (w.cout as u32).div_ceil(128));
            splits = offset_splits.unwrap_or_else(|| auto_offset_splits(tiles.0 as usize * tiles.1 as usize, w.kv, CONV_TARGET_BLOCKS)).clamp(1, w.kv.max(1));
            let f = dev.function_with_shared("sparse_conv", "conv_implicit_gemm_wide", WIDE_SMEM_BYTES)?;
            let cfg = LaunchConfig {
                grid_dim: (tiles.0, tiles.1, splits as u32),
                block_dim: (256, 1, 1),
                shared_mem_bytes: WIDE_SMEM_BYTES as u32,
            };
            (f, cfg)
        }
    };
    let null: u64 = 0; // a NULL device pointer for absent optional inputs
    let (m32, kv32, cin32, cout32) = (map.out_count as u32, w.kv as u32, w.cin as u32, w.cout as u32);
    let (pre_on, relu) = (pre.is_some() as u32, pre.map(|p| p.relu as u32).unwrap_or(0));
    let post_relu = post.map(|p| p.relu as u32).unwrap_or(0);
    let splits32 = splits as u32;
    let mut partial = if splits > 1 {
        Some(s.alloc_zeros::<f32>(splits * map.out_count * w.cout).map_err(cuda_err("allocating conv split partials"))?)
    } else {
        None
    };
    // SAFETY: the argument lists match the kernels (the implicit GEMMs also take `order` and
    // `masks`, m entries each, or NULL);
    // buffer sizes checked above.
    unsafe {
        let mut b = s.launch_builder(&f);
        b.arg(x).arg(&map.nbr);
        if algo != ConvAlgo::Direct {
            match &map.sorted {
                Some(sorted) => b.arg(&sorted.order).arg(&sorted.masks),
                None => b.arg(&null).arg(&null),
            };
        }
        b.arg(&m32).arg(&kv32).arg(&w.w).arg(&cin32).arg(&cout32);
        match &w.bias {
            Some(bias) => b.arg(bias),
            None => b.arg(&null),
        };
        match pre {
            Some(p) => b.arg(p.scale).arg(p.shift),
            None => b.arg(&null).arg(&null),
        };
        b.arg(&pre_on).arg(&relu);
        match residual {
            Some(r) => b.arg(r),
            None => b.arg(&null),
        };
        b.arg(&mut out);
        if algo != ConvAlgo::Direct {
            b.arg(&splits32);
            match &mut partial {
                Some(p) => b.arg(p),
                None => b.arg(&null),
            };
            match post {
                Some(p) => b.arg(p.scale).arg(p.shift),
                None => b.arg(&null).arg(&null),
            };
            b.arg(&post_relu);
        }
        b.launch(cfg).map_err(cuda_err(format!("sparse conv ({algo:?})")))?;
    }
    let Some(partial) = partial else { return Ok(out) };
    let f = dev.function("sparse_conv", "conv_split_reduce")?;
    let total = u32::try_from(map.out_count * w.cout).map_err(|_| Error::InvalidInput("conv output exceeds 2^32 values".into()))?;
    // SAFETY: partial holds splits * m * cout floats, all written by the split blocks; out and
    // residual hold m * cout halves (checked above), bias cout floats.
    unsafe {
        let mut b = s.launch_builder(&f);
        b.arg(&partial).arg(&splits32).arg(&m32).arg(&cout32);
        match &w.bias {
            Some(bias) => b.arg(bias),
            None => b.arg(&null),
        };
        match residual {
            Some(r) => b.arg(r),
            None => b.arg(&null),
        };
        b.arg(&mut out);
        match post {
            Some(p) => b.arg(p.scale).arg(p.shift),
            None => b.arg(&null).arg(&null),
        };
        b.arg(&post_relu);
        b.launch(crate::device::primitives::grid_1d(total, 256)).map_err(cuda_err("conv_split_reduce"))?;
    }
    Ok(out)
}
