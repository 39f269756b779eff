//! Sparse convolution on CUDA (kernels in `kernels/ops/sparse_conv.cu`): FP16 features and weights,
//! FP32 accumulation, over a `CudaKernelMap`'s neighbour table; the same function as
//! `conv_cpu::conv_with` (bias, pre-activation on the gather, residual add).
//!
//! Features and weights are FP16, BF16 or FP32 ([`crate::device::storage`]): everything here is
//! generic over the element type [`Store`] (`CudaConvWeights` defaults to FP16), which picks the
//! kernel build (FP32's has the FP32-unit kernels only: `conv_direct`, `conv_fma_tiled`).

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::range::RangeSlot;
use crate::device::storage::Store;
use crate::ops::sparse_conv::cpu::{repack, WeightLayout};
use crate::ops::sparse_conv::kernel_map_cuda::CudaKernelMap;
use crate::Error;
use crate::device::cluster_launch::KernelArgs;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::f16;

/// Widest input the direct kernel stages in shared memory.
pub const MAX_CIN: usize = 512;

/// A conv layer's parameters on the GPU: weight repacked to `[K][Cin][Cout]` FP16, bias f32;
/// on a device with warpgroup MMA, for the layers its kernels take (see
/// [`CudaConvWeights::wgmma_ready`]), also the transpose `[K][Cout][Cin]` they read.
pub struct CudaConvWeights<S: Store = f16> {
    pub kv: usize,
    pub cin: usize,
    pub cout: usize,
    w: CudaSlice<S>,
    wt: Option<CudaSlice<S>>,
    bias: Option<CudaSlice<f32>>,
}

impl CudaConvWeights<f16> {
    /// `weight` as stored upstream in `layout` (spconv: `Krsc`, or `Rsck` for its 1x1x1 layers),
    /// in FP16 ([`CudaConvWeights::upload_store`] for BF16).
    pub fn upload(dev: &CudaDevice, weight: &[f32], layout: WeightLayout, kv: usize, cin: usize, cout: usize, bias: Option<&[f32]>) -> Result<Self, Error> {
        Self::upload_store(dev, weight, layout, kv, cin, cout, bias)
    }

    /// [`CudaConvWeights::upload_padded_store`] in FP16.
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
        Self::upload_padded_store(dev, weight, layout, kv, cin, cout, cin_pad, bias)
    }
}

impl<S: Store> CudaConvWeights<S> {
    /// `weight` as stored upstream in `layout` (spconv: `Krsc`, or `Rsck` for its 1x1x1 layers),
    /// in the storage type `S`.
    pub fn upload_store(dev: &CudaDevice, weight: &[f32], layout: WeightLayout, kv: usize, cin: usize, cout: usize, bias: Option<&[f32]>) -> Result<Self, Error> {
        if cin == 0 || cout == 0 || cin > MAX_CIN {
            return Err(Error::InvalidInput(format!("conv: Cin {cin} must be in 1..={MAX_CIN} and Cout {cout} >= 1")));
        }
        let w = repack(weight, layout, kv, cin, cout)?;
        let w16: Vec<S> = w.iter().map(|&v| S::from_f32(v)).collect();
        let s = &dev.stream;
        let bias = match bias {
            Some(b) if b.len() != cout => return Err(Error::InvalidInput(format!("conv bias has {} values, expected Cout {cout}", b.len()))),
            Some(b) => Some(s.clone_htod(b).map_err(cuda_err("uploading bias"))?),
            None => None,
        };
        let wt = if S::STORAGE.tensor_cores() && dev.arch.has_wgmma() && wgmma_shapes_fit(kv, cin, cout) {
            let mut t = vec![S::default(); w16.len()];
            for k in 0..kv {
                for ci in 0..cin {
                    for co in 0..cout {
                        t[(k * cout + co) * cin + ci] = w16[(k * cin + ci) * cout + co];
                    }
                }
            }
            Some(s.clone_htod(&t).map_err(cuda_err("uploading the transposed weight"))?)
        } else {
            None
        };
        Ok(CudaConvWeights { kv, cin, cout, w: s.clone_htod(&w16).map_err(cuda_err("uploading weight"))?, wt, bias })
    }

    /// Whether the warpgroup-MMA kernels ([`ConvAlgo::Wgmma`]) can run this layer: uploaded to a
    /// compute capability 9.0 device, Cin and Cout multiples of 64, kernel volume up to
    /// [`PIPE_MAX_KV`].
    pub fn wgmma_ready(&self) -> bool {
        self.wt.is_some()
    }
}

/// Layers the warpgroup-MMA kernels take: 64-channel Cin chunks and output tiles without bound
/// checks, the pipelined kernels' per-tile neighbour table.
fn wgmma_shapes_fit(kv: usize, cin: usize, cout: usize) -> bool {
    cin % 64 == 0 && cout % 64 == 0 && kv <= PIPE_MAX_KV
}

impl<S: Store> CudaConvWeights<S> {
    /// [`CudaConvWeights::upload_store`] with the input channels padded with zero weights to `cin_pad`
    /// (≥ `cin`), so a layer with few inputs (SphereFormer's 4: x, y, z, intensity) can take the
    /// tensor-core kernels, which need Cin a multiple of 8. Its input must then have `cin_pad`
    /// channels; the padding channels' values do not matter (their weights are zero), but keep
    /// them finite (0 · NaN is NaN).
    #[allow(clippy::too_many_arguments)]
    pub fn upload_padded_store(
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
        Self::upload_store(dev, &padded, WeightLayout::Rsck, kv, cin_pad, cout, bias)
    }
}

/// Per-input-channel affine (+ ReLU) applied to the gathered input: folded inference BatchNorm.
pub struct CudaPreActivation<'a> {
    pub scale: &'a CudaSlice<f32>,
    pub shift: &'a CudaSlice<f32>,
    pub relu: bool,
}

/// Where a conv's FP16 range guard reports ([`crate::device::range_guard`]): the layer of its output
/// (epilogue, split reduction, and a post-activation) and the layer of its input's
/// pre-activation when a pass of its own stores it in FP16 (the pipelined kernels; the other
/// kernels apply it on the gather: the direct one in FP32, the 64/32-row implicit GEMMs into
/// FP16 shared memory, reported under `conv`). `None`: not guarded.
#[derive(Clone, Copy, Default)]
pub struct ConvRange<'a> {
    pub conv: Option<RangeSlot<'a>>,
    pub pre: Option<RangeSlot<'a>>,
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
    /// The pipelined kernel family with `rows` x `cols` tiles, `depth`-deep Cin chunks and a
    /// `stages`-deep copy ring, 8 warps of 32 rows each, a warp skipping the offsets its rows lack
    /// (`conv_tiled_m*_n*_k*`; the shapes built are [`TILED_VARIANTS`]): for large maps.
    ImplicitGemmTiled { rows: u16, cols: u16, depth: u16, stages: u16 },
    /// Hopper's warpgroup MMA (`conv_wgmma_m128_n*`): 128-row tiles of two warpgroups, `cols`
    /// output channels each (one of [`WGMMA_VARIANTS`]), Cin chunks of 64 read from swizzled
    /// shared memory by `wgmma`; compute capability 9.0, weights that are
    /// [`CudaConvWeights::wgmma_ready`], Cout a multiple of `cols`; a `stages`-deep copy ring.
    Wgmma { cols: u16, stages: u16 },
    /// One thread per output channel, FP32 FMA (`conv_direct`): any channel count; the oracle
    /// the fast kernel is tested against.
    Direct,
    /// 32-row x 32-channel tiles on the FP32 units (`conv_fma_tiled`): any channel count, each
    /// weight read once per tile instead of once per row; the FP32 storage's kernel on large maps
    /// (it has no tensor-core kernels). No offset splits.
    FmaTiled,
}

/// Map outputs from which the tiled kernels are the default below 128 output channels (with
/// fewer, the 32-row pipelined kernel's larger grid is faster).
pub const TILED_MIN_OUTPUTS: usize = 100_000;

/// Output channels from which the tiled kernels are the default at any map size.
pub const TILED_MIN_COUT: usize = 128;

/// One instantiation of the tiled kernels (sparse_conv.cu, TILED_KERNEL).
#[derive(Debug, Clone, Copy)]
pub struct TiledVariant {
    pub rows: u16,
    pub cols: u16,
    pub depth: u16,
    pub stages: u16,
    pub name: &'static str,
}

impl TiledVariant {
    pub fn algo(&self) -> ConvAlgo {
        ConvAlgo::ImplicitGemmTiled { rows: self.rows, cols: self.cols, depth: self.depth, stages: self.stages }
    }

    /// Dynamic shared memory (TiledShape in sparse_conv.cu): `stages` of a rows x (depth + 8) A
    /// tile and a depth x (cols + 8) B tile, FP16, then the tile's tables.
    const fn smem_bytes(&self) -> usize {
        let (bm, bn, bk, s) = (self.rows as usize, self.cols as usize, self.depth as usize, self.stages as usize);
        2 * s * (bm * (bk + 8) + bk * (bn + 8)) + tile_tables_bytes(bm)
    }
}

/// The per-tile tables after a tiled or warpgroup-MMA kernel's copy ring (TileTables in
/// sparse_conv.cu): each active offset's input rows, the output rows, the active offsets and
/// their count.
const fn tile_tables_bytes(rows: usize) -> usize {
    PIPE_MAX_KV * rows * 4 + rows * 4 + (PIPE_MAX_KV + 1) * 4
}

/// The tiled kernels built (rows x cols tiles, Cin chunks of `depth`, cp.async stages); the
/// first of each width and depth is the default ([`tiled_default`]). 32-wide tiles take the
/// 3-stage ring (4 blocks an SM): H100, SubM k3 at 32 channels on the dense cloud x2, 0.0973 ms
/// against 0.1003 for 4 stages, same run.
pub const TILED_VARIANTS: [TiledVariant; 7] = [
    TiledVariant { rows: 128, cols: 32, depth: 32, stages: 3, name: "conv_tiled_m128_n32_k32_s3" },
    TiledVariant { rows: 128, cols: 32, depth: 32, stages: 4, name: "conv_tiled_m128_n32_k32" },
    TiledVariant { rows: 128, cols: 64, depth: 32, stages: 4, name: "conv_tiled_m128_n64_k32" },
    TiledVariant { rows: 128, cols: 64, depth: 64, stages: 3, name: "conv_tiled_m128_n64_k64" },
    TiledVariant { rows: 128, cols: 128, depth: 32, stages: 4, name: "conv_tiled_m128_n128_k32" },
    TiledVariant { rows: 128, cols: 128, depth: 64, stages: 2, name: "conv_tiled_m128_n128_k64" },
    TiledVariant { rows: 128, cols: 128, depth: 64, stages: 3, name: "conv_tiled_m128_n128_k64_s3" },
];

/// One instantiation of the warpgroup-MMA kernels (sparse_conv.cu, WGMMA_KERNEL).
#[derive(Debug, Clone, Copy)]
pub struct WgmmaVariant {
    pub cols: u16,
    pub stages: u16,
    pub name: &'static str,
}

impl WgmmaVariant {
    pub fn algo(&self) -> ConvAlgo {
        ConvAlgo::Wgmma { cols: self.cols, stages: self.stages }
    }

    /// Dynamic shared memory (WgmmaShape in sparse_conv.cu): `stages` of a 128 x 64 A tile and a
    /// cols x 64 B tile (128 bytes a row), the tile's tables, and 1024 bytes to align the tiles to
    /// the swizzle atom.
    const fn smem_bytes(&self) -> usize {
        let (bn, st) = (self.cols as usize, self.stages as usize);
        st * (128 * 128 + bn * 128) + tile_tables_bytes(128) + 1024
    }
}

/// The warpgroup-MMA kernels built (output tiles of 128 rows x `cols` channels); which one a
/// layer gets is [`wgmma_default`]'s choice.
pub const WGMMA_VARIANTS: [WgmmaVariant; 3] = [
    WgmmaVariant { cols: 64, stages: 4, name: "conv_wgmma_m128_n64" },
    WgmmaVariant { cols: 64, stages: 2, name: "conv_wgmma_m128_n64_s2" },
    WgmmaVariant { cols: 128, stages: 3, name: "conv_wgmma_m128_n128" },
];

/// The warpgroup-MMA kernel for `cols`-channel tiles (64 or 128) of a layer with `cout` output
/// channels. Where one 64-wide tile covers every output channel, the 2-stage ring (3 blocks an
/// SM instead of 2): H100, SubM k3 at 64 channels on the dense cloud x2, 0.128 ms against 0.132
/// for 4 stages in the same runs; at 64-wide tiles of 128 and 256 channels 4 stages stay ahead
/// (C256: 0.97 against 1.15 ms).
fn wgmma_default(cols: u16, cout: usize) -> ConvAlgo {
    let stages = match cols {
        128 => 3,
        _ if cout <= 64 => 2,
        _ => 4,
    };
    ConvAlgo::Wgmma { cols, stages }
}

/// The tiled kernel for these channels and map outputs: tiles as wide as the output channels up
/// to 128 (64 on small maps), Cin chunks of 64 where Cin is a multiple of 64 (half the ring's
/// barriers and copy bookkeeping a multiply-add; measured faster at 64-256 channels on an H100),
/// else 32.
fn tiled_default(cin: usize, cout: usize, outputs: usize) -> ConvAlgo {
    // below TILED_MIN_OUTPUTS, 64-wide tiles: twice the blocks (nuScenes, 22.7k outputs: C128
    // 0.063 vs 0.073 ms, C256 0.135 vs 0.153)
    let cols = if cout <= 32 {
        32
    } else if cout <= 64 || outputs < TILED_MIN_OUTPUTS {
        64
    } else {
        128
    };
    let depth = if cols >= 64 && cin % 64 == 0 { 64 } else { 32 };
    TILED_VARIANTS
        .iter()
        .find(|v| v.cols == cols && v.depth == depth)
        .map(|v| v.algo())
        .unwrap_or(ConvAlgo::ImplicitGemmPipe)
}

/// Largest kernel volume the pipelined kernels take (PIPE_MAX_KV in sparse_conv.cu: a 3x3x3
/// kernel; its per-tile neighbour table lives in shared memory).
pub const PIPE_MAX_KV: usize = 27;

impl ConvAlgo {
    /// The fastest kernel that supports these channel counts (`outputs`: the map's output rows).
    /// Measured on an H100 (kernels/PERF.md): the tiled kernels from 128 output
    /// channels at any size and on large maps at any width; on small maps with fewer channels
    /// the 32-row pipelined kernel, whose grid fills the GPU better.
    pub fn best_for(cin: usize, cout: usize, outputs: usize) -> ConvAlgo {
        Self::best_for_volume(cin, cout, outputs, PIPE_MAX_KV)
    }

    /// [`ConvAlgo::best_for`] for a kernel volume `kv`: the pipelined kernels where it allows
    /// (H100, SphereFormer's convs: 34 % less conv time a frame than the others; PERF.md).
    pub fn best_for_volume(cin: usize, cout: usize, outputs: usize, kv: usize) -> ConvAlgo {
        let pipe = kv <= PIPE_MAX_KV;
        if cin % 8 != 0 || cout % 8 != 0 {
            ConvAlgo::Direct
        } else if pipe && (outputs >= TILED_MIN_OUTPUTS || cout >= TILED_MIN_COUT) {
            tiled_default(cin, cout, outputs)
        } else if outputs < 100_000 {
            if pipe { ConvAlgo::ImplicitGemmPipe32 } else { ConvAlgo::ImplicitGemm32 }
        } else if pipe {
            ConvAlgo::ImplicitGemmPipe
        } else {
            ConvAlgo::ImplicitGemm
        }
    }

    /// [`ConvAlgo::best_for_volume`] for uploaded weights: where the tiled kernels would run and
    /// the weights are [`CudaConvWeights::wgmma_ready`], the warpgroup-MMA kernel, with tiles
    /// as wide as the tiled kernel's (128 channels on large maps, else 64).
    /// FP32 weights (the wide fallback, no tensor cores) take the FP32-unit kernels: the tiled
    /// one on large maps, the direct one on small ones (H100, subm k3 at 32-256 channels: tiled
    /// 1.2-1.3x faster at 320k outputs, direct 1.3-1.4x faster at 23k, where a 32-row tile walks
    /// offsets that few of its rows have; the switch at [`TILED_MIN_OUTPUTS`] lies between).
    pub fn best_for_weights<S: Store>(w: &CudaConvWeights<S>, outputs: usize) -> ConvAlgo {
        if !S::STORAGE.tensor_cores() {
            return if outputs >= TILED_MIN_OUTPUTS { ConvAlgo::FmaTiled } else { ConvAlgo::Direct };
        }
        match Self::best_for_volume(w.cin, w.cout, outputs, w.kv) {
            ConvAlgo::ImplicitGemmTiled { cols, .. } if w.wgmma_ready() => wgmma_default(if cols >= 128 && w.cout % 128 == 0 { 128 } else { 64 }, w.cout),
            algo => algo,
        }
    }
}

/// `x`: `[map.in_count, cin]` FP16. Returns `[map.out_count, cout]` FP16. Uses the best kernel.
pub fn conv_cuda<S: Store>(
    dev: &CudaDevice,
    x: &CudaSlice<S>,
    map: &CudaKernelMap,
    w: &CudaConvWeights<S>,
    pre: Option<&CudaPreActivation<'_>>,
    residual: Option<&CudaSlice<S>>,
) -> Result<CudaSlice<S>, Error> {
    conv_cuda_split(dev, x, map, w, pre, residual, ConvAlgo::best_for_weights(w, map.out_count), None, None)
}

/// [`conv_cuda`] whose output goes through the next layer's BN (+ ReLU) in the epilogue:
/// `post(conv(x) + bias + residual)`, for a conv whose raw output nothing else reads (it saves
/// the next conv a pre-activation pass over its input).
pub fn conv_cuda_post<S: Store>(
    dev: &CudaDevice,
    x: &CudaSlice<S>,
    map: &CudaKernelMap,
    w: &CudaConvWeights<S>,
    pre: Option<&CudaPreActivation<'_>>,
    post: &CudaPreActivation<'_>,
) -> Result<CudaSlice<S>, Error> {
    let algo = ConvAlgo::best_for_weights(w, map.out_count);
    conv_cuda_split(dev, x, map, w, pre, None, algo, None, Some(post))
}

/// `relu?(x * scale + shift)` per channel over `[n, c]` FP16 rows (conv_pre_activate), its
/// values guarded under `range`.
fn pre_activate<S: Store>(
    dev: &CudaDevice,
    x: &CudaSlice<S>,
    n: usize,
    c: usize,
    p: &CudaPreActivation<'_>,
    range: Option<&RangeSlot<'_>>,
) -> Result<CudaSlice<S>, Error> {
    let s = &dev.stream;
    let total = u32::try_from(n * c).map_err(|_| Error::InvalidInput("conv input exceeds 2^32 values".into()))?;
    if total == 0 {
        return s.alloc_zeros::<S>(1).map_err(cuda_err("allocating the pre-activated input"));
    }
    // SAFETY: conv_pre_activate writes all n * c values.
    let mut out = unsafe { dev.alloc_uninit::<S>(n * c, "the pre-activated input") }?;
    // four values a thread where the rows allow it (an elementwise pass is bound by its
    // per-thread work, not by memory, at these sizes)
    let by4 = c % 4 == 0;
    let f = dev.function_in(S::STORAGE, "sparse_conv", if by4 { "conv_pre_activate4" } else { "conv_pre_activate" })?;
    let threads = if by4 { total / 4 } else { total };
    let (n32, c32, relu) = (n as u32, c as u32, p.relu as u32);
    // SAFETY: matches sparse_conv.cu; x holds >= n * c halves (checked by the caller), scale and
    // shift c floats, out n * c halves; the range slot's layer lies in its flags.
    unsafe {
        let mut b = s.launch_builder(&f);
        b.arg(x).arg(&n32).arg(&c32).arg(p.scale).arg(p.shift).arg(&relu).arg(&mut out);
        RangeSlot::push(range, &mut b);
        b.launch(crate::device::primitives::grid_1d(threads, 256))
    }
    .map_err(cuda_err("conv_pre_activate"))?;
    Ok(out)
}

/// Blocks an implicit-GEMM conv should have in flight before splitting its kernel offsets over
/// more blocks pays (a few per SM of an H100's 132). Every implicit-GEMM kernel takes the same
/// target: with half of it for the 256-thread tiles, the nuScenes frame's convs took 14 % longer
/// (measured), though a single C128 conv of 22.7k outputs ran faster unsplit.
const CONV_TARGET_BLOCKS: usize = 4 * 132;
/// The most offset splits a tile's on-chip sum takes: one cluster a tile, at most the portable
/// cluster size (8 blocks). More splits go through partials in device memory.
const MAX_CLUSTER_SPLITS: usize = 8;
/// At most this many offset splits, each of at least this many offsets.
const MAX_OFFSET_SPLITS: usize = 9;
const MIN_OFFSETS_PER_SPLIT: usize = 3;

/// Offset splits for an implicit-GEMM conv of `blocks` output tiles and kernel volume `kv`: with
/// few outputs and wide channels (the deep levels of a sparse sweep) each block would walk every
/// offset with most of the GPU idle.
fn auto_offset_splits(blocks: usize, kv: usize) -> usize {
    let by_blocks = CONV_TARGET_BLOCKS.div_ceil(blocks.max(1));
    let by_offsets = (kv / MIN_OFFSETS_PER_SPLIT).max(1);
    by_blocks.min(by_offsets).clamp(1, MAX_OFFSET_SPLITS)
}

/// The offset splits a conv of `kv` kernel offsets runs when `asked` for: each split walks
/// ceil(kv / asked) offsets (the kernels' `per`), so as many splits as that fills, none empty
/// (27 offsets asked in 8 would leave the eighth with none: it gets 7 splits of 4).
pub fn nonempty_splits(asked: usize, kv: usize) -> usize {
    let kv = kv.max(1);
    kv.div_ceil(kv.div_ceil(asked.clamp(1, kv)))
}

/// [`conv_cuda`] with the kernel chosen by the caller, the implicit GEMM's kernel-offset splits
/// (`None`: chosen from the grid size; 1: no split; ignored by the direct kernel) and an optional
/// post-activation (see [`conv_cuda_post`]), not guarded — for tests and benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn conv_cuda_split<S: Store>(
    dev: &CudaDevice,
    x: &CudaSlice<S>,
    map: &CudaKernelMap,
    w: &CudaConvWeights<S>,
    pre: Option<&CudaPreActivation<'_>>,
    residual: Option<&CudaSlice<S>>,
    algo: ConvAlgo,
    offset_splits: Option<usize>,
    post: Option<&CudaPreActivation<'_>>,
) -> Result<CudaSlice<S>, Error> {
    conv_cuda_guarded(dev, x, map, w, pre, residual, algo, offset_splits, post, ConvRange::default())
}

/// The arguments of [`conv_cuda_guarded`] checked before any launch: the algorithm against the
/// storage, the weights and the map; every buffer against the sizes the kernels read.
#[allow(clippy::too_many_arguments)]
fn check_conv_args<S: Store>(
    dev: &CudaDevice,
    x: &CudaSlice<S>,
    map: &CudaKernelMap,
    w: &CudaConvWeights<S>,
    pre: Option<&CudaPreActivation<'_>>,
    residual: Option<&CudaSlice<S>>,
    algo: ConvAlgo,
    post: Option<&CudaPreActivation<'_>>,
) -> Result<(), Error> {
    let pipelined = matches!(algo, ConvAlgo::ImplicitGemmPipe | ConvAlgo::ImplicitGemmPipe32 | ConvAlgo::ImplicitGemmTiled { .. } | ConvAlgo::Wgmma { .. });
    if pipelined && w.kv > PIPE_MAX_KV {
        return Err(Error::InvalidInput(format!("the pipelined conv takes kernel volumes up to {PIPE_MAX_KV}, got {}", w.kv)));
    }
    let simt = matches!(algo, ConvAlgo::Direct | ConvAlgo::FmaTiled);
    if !simt && !S::STORAGE.tensor_cores() {
        return Err(Error::InvalidInput(format!(
            "{} storage has no tensor-core conv: use ConvAlgo::FmaTiled or ConvAlgo::Direct, not {algo:?}",
            S::STORAGE
        )));
    }
    if !simt && (w.cin % 8 != 0 || w.cout % 8 != 0) {
        return Err(Error::InvalidInput(format!("implicit GEMM conv needs Cin and Cout multiples of 8, got {} and {}", w.cin, w.cout)));
    }
    if pipelined && map.sorted.is_none() && map.out_count > 0 {
        // maps of up to 64 offsets always carry it (kernel_map_cuda::mask_order)
        return Err(Error::InvalidInput("the pipelined conv needs the map's outputs sorted by neighbour mask".into()));
    }
    if let ConvAlgo::Wgmma { cols, .. } = algo {
        if !w.wgmma_ready() {
            return Err(Error::InvalidInput(format!(
                "the warpgroup-MMA conv needs a compute capability 9.0 GPU (this one is {}) and Cin and Cout multiples of 64 \
                 (got {} and {}); use ConvAlgo::best_for_weights to pick a kernel",
                dev.arch.sm(),
                w.cin,
                w.cout
            )));
        }
        if w.cout % cols as usize != 0 {
            return Err(Error::InvalidInput(format!("the warpgroup-MMA conv with {cols}-channel tiles needs Cout a multiple of {cols}, got {}", w.cout)));
        }
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
    Ok(())
}

/// [`conv_cuda_split`] with the FP16 range guard reporting into `range` — the one entry with
/// every option, for the model's wrappers, tests and benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn conv_cuda_guarded<S: Store>(
    dev: &CudaDevice,
    x: &CudaSlice<S>,
    map: &CudaKernelMap,
    w: &CudaConvWeights<S>,
    pre: Option<&CudaPreActivation<'_>>,
    residual: Option<&CudaSlice<S>>,
    algo: ConvAlgo,
    offset_splits: Option<usize>,
    post: Option<&CudaPreActivation<'_>>,
    range: ConvRange<'_>,
) -> Result<CudaSlice<S>, Error> {
    check_conv_args(dev, x, map, w, pre, residual, algo, post)?;
    let pipelined = matches!(algo, ConvAlgo::ImplicitGemmPipe | ConvAlgo::ImplicitGemmPipe32 | ConvAlgo::ImplicitGemmTiled { .. } | ConvAlgo::Wgmma { .. });
    let s = &dev.stream;
    if let (ConvAlgo::Direct, Some(p)) = (algo, post) {
        // conv_direct has no post-activation in its epilogue: a separate pass, guarded as the
        // fused epilogue is, under the conv's layer
        let raw = conv_cuda_guarded(dev, x, map, w, pre, residual, algo, offset_splits, None, range)?;
        return pre_activate(dev, &raw, map.out_count, w.cout, p, range.conv.as_ref());
    }
    if map.out_count == 0 {
        return s.alloc_zeros::<S>(1).map_err(cuda_err("allocating conv output"));
    }
    // SAFETY: every kernel below writes every output value (each output row lies in one tile,
    // or one direct block; a split's reduce pass writes them all), so nothing reads it unset.
    // Not zeroing it saves a pass over the output (164 MB at 320k rows x 256 channels).
    let mut out = unsafe { dev.alloc_uninit::<S>(map.out_count * w.cout, "conv output") }?;
    // The pipelined kernels copy rows straight into shared memory, so a pre-activation is applied
    // to the whole input once here (each row would otherwise be transformed at every gather).
    let activated = match pre {
        Some(p) if pipelined => Some(pre_activate(dev, x, map.in_count, w.cin, p, range.pre.as_ref())?),
        _ => None,
    };
    let (x, pre) = match &activated {
        Some(a) => (a, None),
        None => (x, pre),
    };
    // Whether a split of this conv may sum on chip (the pipelined kernels, on a GPU with clusters).
    let clusters = pipelined && dev.cluster_reduce();
    // An implicit GEMM's grid: output tiles of tile_rows x tile_cols, each split over the kernel
    // offsets; returns the launch and the split count.
    let implicit_launch = |tile_rows: u32, tile_cols: u32, threads: u32, smem: u32| -> (LaunchConfig, usize) {
        let tiles = ((map.out_count as u32).div_ceil(tile_rows), (w.cout as u32).div_ceil(tile_cols));
        let auto = || {
            let asked = auto_offset_splits(tiles.0 as usize * tiles.1 as usize, w.kv);
            // summed on chip where the splits fit one cluster
            if clusters { asked.min(MAX_CLUSTER_SPLITS) } else { asked }
        };
        let splits = nonempty_splits(offset_splits.unwrap_or_else(auto), w.kv);
        let cfg = LaunchConfig { grid_dim: (tiles.0, tiles.1, splits as u32), block_dim: (threads, 1, 1), shared_mem_bytes: smem };
        (cfg, splits)
    };
    let (f, cfg, splits) = match algo {
        ConvAlgo::Direct => {
            let threads = (w.cout.min(256) as u32).div_ceil(32) * 32;
            let cfg = LaunchConfig {
                grid_dim: (map.out_count as u32, (w.cout as u32).div_ceil(threads), 1),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: 0,
            };
            (dev.function_in(S::STORAGE, "sparse_conv", "conv_direct")?, cfg, 1)
        }
        ConvAlgo::FmaTiled => {
            // 32 x 32 tiles, 32 x 8 threads (sparse_conv.cu: FMA_ROWS, FMA_COLS); one split
            let cfg = LaunchConfig {
                grid_dim: ((map.out_count as u32).div_ceil(32), (w.cout as u32).div_ceil(32), 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            };
            (dev.function_in(S::STORAGE, "sparse_conv", "conv_fma_tiled")?, cfg, 1)
        }
        ConvAlgo::ImplicitGemm | ConvAlgo::ImplicitGemm32 | ConvAlgo::ImplicitGemmPipe | ConvAlgo::ImplicitGemmPipe32 => {
            // BM x 64 output tiles, 128 threads (sparse_conv.cu: BM = 32 * MI, IG_BN).
            let (bm, name) = match algo {
                ConvAlgo::ImplicitGemm => (64, "conv_implicit_gemm"),
                ConvAlgo::ImplicitGemm32 => (32, "conv_implicit_gemm_m32"),
                ConvAlgo::ImplicitGemmPipe => (64, "conv_implicit_gemm_pipe"),
                _ => (32, "conv_implicit_gemm_pipe_m32"),
            };
            let (cfg, splits) = implicit_launch(bm, 64, 128, 0);
            (dev.function_in(S::STORAGE, "sparse_conv", name)?, cfg, splits)
        }
        ConvAlgo::ImplicitGemmTiled { rows, cols, depth, stages } => {
            let v = TILED_VARIANTS.iter().find(|v| (v.rows, v.cols, v.depth, v.stages) == (rows, cols, depth, stages)).ok_or_else(|| {
                Error::InvalidInput(format!("no tiled conv kernel with {rows} x {cols} tiles, {depth}-deep chunks and {stages} stages is built"))
            })?;
            let bytes = v.smem_bytes();
            let (cfg, splits) = implicit_launch(rows as u32, cols as u32, 256, bytes as u32);
            (dev.function_with_shared_in(S::STORAGE, "sparse_conv", v.name, bytes)?, cfg, splits)
        }
        ConvAlgo::Wgmma { cols, stages } => {
            let v = WGMMA_VARIANTS.iter().find(|v| (v.cols, v.stages) == (cols, stages)).ok_or_else(|| {
                Error::InvalidInput(format!("no warpgroup-MMA conv kernel with {cols}-channel tiles and {stages} stages is built"))
            })?;
            let bytes = v.smem_bytes();
            let (cfg, splits) = implicit_launch(128, cols as u32, 256, bytes as u32);
            (dev.function_with_shared_in(S::STORAGE, "sparse_conv", v.name, bytes)?, cfg, splits)
        }
    };
    let null: u64 = 0; // a NULL device pointer for absent optional inputs
    let (m32, kv32, cin32, cout32) = (map.out_count as u32, w.kv as u32, w.cin as u32, w.cout as u32);
    let post_relu = post.map(|p| p.relu as u32).unwrap_or(0);
    let splits32 = splits as u32;
    // The splits of a tile summed on chip, as one cluster (its blocks must fit a portable
    // cluster), or in FP32 partials that a second pass adds.
    let on_chip = clusters && (2..=MAX_CLUSTER_SPLITS).contains(&splits);
    let mut partial = if splits > 1 && !on_chip {
        // SAFETY: each split's blocks store their whole partial, zeros where a block had no
        // offset to walk (implicit_gemm*: the epilogue runs whatever the offset count).
        Some(unsafe { dev.alloc_uninit::<f32>(splits * map.out_count * w.cout, "conv split partials") }?)
    } else {
        None
    };
    let mut b = KernelArgs::new();
    b.buf(dev, x).buf(dev, &map.nbr);
    if algo != ConvAlgo::Direct {
        match &map.sorted {
            Some(sorted) => b.buf(dev, &sorted.order).buf(dev, &sorted.masks),
            None => b.null().null(),
        };
    }
    b.u32(m32).u32(kv32).buf(dev, &w.w).u32(cin32).u32(cout32).opt_buf(dev, w.bias.as_ref());
    match pre {
        Some(p) => b.buf(dev, p.scale).buf(dev, p.shift).u32(1).u32(p.relu as u32),
        None => b.null().null().u32(0).u32(0),
    };
    b.opt_buf(dev, residual).buf_mut(dev, &mut out);
    if algo != ConvAlgo::Direct {
        // NULL partials with splits: the on-chip sums (tile_store in sparse_conv.cu)
        b.u32(splits32);
        match &mut partial {
            Some(p) => b.buf_mut(dev, p),
            None => b.null(),
        };
        match post {
            Some(p) => b.buf(dev, p.scale).buf(dev, p.shift),
            None => b.null().null(),
        };
        b.u32(post_relu);
    }
    RangeSlot::push_raw(range.conv.as_ref(), dev, &mut b);
    if let (ConvAlgo::Wgmma { .. }, Some(wt)) = (algo, &w.wt) {
        b.buf(dev, wt);
    }
    // SAFETY: the argument lists match the kernels (the implicit GEMMs also take `order` and
    // `masks`, m entries each, or NULL; every kernel the range slot, whose layer lies in its
    // flags; the warpgroup-MMA kernels then the transposed weight, present: checked above);
    // buffer sizes checked above. On chip, grid z is the split count, so each tile's splits
    // are one cluster.
    unsafe { b.launch(dev, &f, cfg, on_chip.then_some((1, 1, splits32)), &format!("sparse conv ({algo:?})")) }?;
    let Some(partial) = partial else { return Ok(out) };
    let total = u32::try_from(map.out_count * w.cout).map_err(|_| Error::InvalidInput("conv output exceeds 2^32 values".into()))?;
    // four values a thread where the rows allow it, as the pre-activation pass
    let by4 = w.cout % 4 == 0;
    let f = dev.function_in(S::STORAGE, "sparse_conv", if by4 { "conv_split_reduce4" } else { "conv_split_reduce" })?;
    let threads = if by4 { total / 4 } else { total };
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
        RangeSlot::push(range.conv.as_ref(), &mut b);
        b.launch(crate::device::primitives::grid_1d(threads, 256)).map_err(cuda_err("conv_split_reduce"))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_choice_follows_the_measured_defaults() {
        // large maps: 32-wide tiles on the 3-stage ring; 64 and 128 channels 64-deep chunks
        let large = TILED_MIN_OUTPUTS;
        assert_eq!(ConvAlgo::best_for(32, 32, large), ConvAlgo::ImplicitGemmTiled { rows: 128, cols: 32, depth: 32, stages: 3 });
        assert_eq!(ConvAlgo::best_for(64, 64, large), ConvAlgo::ImplicitGemmTiled { rows: 128, cols: 64, depth: 64, stages: 3 });
        assert_eq!(ConvAlgo::best_for(32, 64, large), ConvAlgo::ImplicitGemmTiled { rows: 128, cols: 64, depth: 32, stages: 4 });
        assert_eq!(ConvAlgo::best_for(128, 128, large), ConvAlgo::ImplicitGemmTiled { rows: 128, cols: 128, depth: 64, stages: 2 });
        // small maps below 128 output channels: the 32-row pipelined kernel
        assert_eq!(ConvAlgo::best_for(32, 32, large - 1), ConvAlgo::ImplicitGemmPipe32);
        // every choice names a kernel that is built
        for (cin, cout) in [(32, 32), (32, 64), (64, 64), (64, 128), (128, 128), (256, 256)] {
            for outputs in [1000, large] {
                if let ConvAlgo::ImplicitGemmTiled { rows, cols, depth, stages } = ConvAlgo::best_for(cin, cout, outputs) {
                    assert!(TILED_VARIANTS.iter().any(|v| (v.rows, v.cols, v.depth, v.stages) == (rows, cols, depth, stages)), "{cin}->{cout} at {outputs}");
                }
            }
        }
        // warpgroup MMA: the 2-stage ring where one 64-wide tile covers the layer, else 4 stages
        assert_eq!(wgmma_default(64, 64), ConvAlgo::Wgmma { cols: 64, stages: 2 });
        assert_eq!(wgmma_default(64, 256), ConvAlgo::Wgmma { cols: 64, stages: 4 });
        assert_eq!(wgmma_default(128, 256), ConvAlgo::Wgmma { cols: 128, stages: 3 });
        for cout in [32, 64, 128, 256] {
            for cols in [64u16, 128] {
                let ConvAlgo::Wgmma { cols: c, stages } = wgmma_default(cols, cout) else { unreachable!() };
                assert!(WGMMA_VARIANTS.iter().any(|v| (v.cols, v.stages) == (c, stages)), "cols {cols}, cout {cout}");
            }
        }
    }
}
