//! The Swin backbone on CUDA: the network of `swin.rs`, uploaded once, FP16 activations and FP32
//! accumulation everywhere.
//!
//! What runs where, per block (tokens `[n, h, w, C]` FP16, NHWC):
//! - norm1 + zero padding to the window grid: `swin_ln_pad` (kernels/models/bevfusion/swin.cu);
//! - qkv: cuBLAS GEMM (FP16 in, FP32 out) on the padded grid, then `swin_qkv_split` (bias, q
//!   scale, FP16 q / k / v);
//! - attention: the project's varlen window-attention kernel (`ops::attention::cuda`, 2-D relative
//!   bias mode) over the stage's partitions ([`SwinPlan`]: built once per image size on the host,
//!   the shift and its -100 mask expressed as smaller windows as on the CPU, so no roll);
//! - proj: GEMM on the padded grid, then `swin_crop_residual` (crop, bias, residual);
//! - norm2, fc1 + exact GELU, fc2 + residual: layers.cu's LayerNorm and Linear epilogue.
//!
//! The patch embedding is an im2col (`swin_patch_im2col`) + GEMM + LayerNorm, patch merging a
//! gather in `nn.Unfold` order (`swin_merge_gather`) + LayerNorm(4C) + a bias-free GEMM; the
//! stage outputs go through their `norm{i}` into NHWC [`CudaFeatureMap`]s.
//!
//! Two GEMM paths, both kept so they can be timed side by side ([`CudaSwin::set_fused`]):
//! - fused (default): cuBLASLt GEMMs write FP16 with the bias added in their epilogue, fc2's
//!   residual added through the GEMM's C matrix (`ops::rowwise::lt`); what is left after a GEMM
//!   reads FP16, eight values a thread (`swin_qkv_split_h`, `swin_crop_residual_h`,
//!   `swin_gelu_h`). Per value of a
//!   Linear's output this moves 2 bytes (+ 2 + 2 for a following elementwise pass) where the
//!   unfused path moves 4 (FP32 write) + 4 (read) + 2 (FP16 write): 4 bytes less a value for
//!   qkv, proj and fc1, 8 for fc2 (its residual rides in the GEMM). Over Swin-T at 6 × 256 × 704
//!   that is 1.38 GB less DRAM traffic a frame (stages 1-4: 0.55 / 0.27 / 0.46 / 0.10 GB; stage
//!   1's padded grid is 76,440 tokens at C = 96), ≈ 0.46 ms at ~3 TB/s of the 4.2 ms measured
//!   (less what L2 already caught in the small later stages).
//!   Numerically: the same FP32 sums; the biases are FP16 (cuBLASLt's bias type for FP16
//!   output; rounding ≤ 2⁻¹¹ of the bias), and q, proj's output and fc1's output are rounded to
//!   FP16 once more before the q scale / residual / GELU (≤ 2⁻¹¹ relative each).
//! - unfused (`SPTR_SWIN_UNFUSED=1`, or `set_fused(false)`): cuBLAS GEMMs write FP32 and the
//!   epilogue kernels above add bias, scale, GELU and residual before the one rounding.
//!
//! Window attention ([`Bias2dKernel`]): by default the whole-window kernel on tensor cores
//! (`attn_bias2d_win_tc_d*` in attention_core.cu: a block of 4 warps per window and head, q·kᵀ
//! and p·v as `mma.sync` tiles with FP32 accumulation, the probabilities rounded to FP16 once;
//! docs/kernels.md has its count of work). `SPTR_SWIN_ATTN=window` selects the FP32 whole-window
//! kernel (`attn_bias2d_win_d*`: K and V staged in shared memory once, one thread per query,
//! every product in FP32), `SPTR_SWIN_ATTN=perquery` the per-query kernel (4 lanes a query,
//! every key row loaded from global memory / L1 by each of its window's 49 queries: 7.8 GB of
//! L1/L2 traffic over Swin-T against 0.24 GB staged by the whole-window kernels), or
//! [`CudaSwin::set_attention_kernel`] does.
//!
//! Packed qkv (fused path, tensor-core attention; [`CudaSwin::set_packed_qkv`], or
//! `SPTR_SWIN_QKV=split` for the split kernel first): the attention kernel reads the qkv GEMM's
//! `[rows, 3C]` output itself, multiplying q by its scale and rounding as it stages it, as
//! `swin_qkv_split_h` does value for value, and flags the qkv layer's range as that kernel does.
//! The output keeps its bits; a frame saves writing and reading q, k and v once more (Swin-T:
//! 2.05 against 2.18 ms on the H100).
//!
//! FP16 range guard ([`crate::device::range_guard`]): every launch that computes and stores an FP16
//! activation reports under a layer registered at upload in execution order with its upstream
//! module path (`encoders.camera.backbone.stages.1.blocks.0.attn.w_msa.qkv`; `.attn.w_msa` is the
//! window attention's output, `.attn.w_msa.proj` proj plus the residual, `.ffn.layers.1` fc2 plus
//! the residual), when the forward is given flags ([`CudaSwin::forward_guarded_timed`]). On the
//! fused path, where cuBLASLt stores a Linear's FP16 output, the kernel that reads it next flags
//! it under the Linear's layer (`swin_qkv_split_h`, `swin_crop_residual_h`, `swin_gelu_h`), and
//! the outputs no kernel reads (patch embedding, fc2 + residual, patch merging) are scanned by
//! `swin_range_scan_h`, only when guarded; a value the GEMM rounded to ±65504 or ±inf counts as
//! saturated, as its FP32 value would on the unfused path.

use crate::models::bevfusion::camera::swin::{PatchEmbed, PatchMerging, StageWindows, SwinBlock, SwinTransformer};
use crate::models::bevfusion::camera::encoder::SwinConfig;
use crate::device::storage::Storage;
use crate::ops::attention::cuda::{window_attention_cuda_guarded, window_attention_packed_qkv_cuda, Bias2dKernel, CudaBias2d, CudaPartition, CudaTerm, QkvView, TILED_MIN_WINDOW};
use crate::ops::attention::{HeadSlice, Partition};
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::range::{RangeFlags, RangeSlot};
use crate::ops::rowwise::cuda::{elements, epilogue_guarded, up_f16, up_f32, GpuLayerNorm, GpuLinear};
use crate::ops::rowwise::lt::LtGemm;
use crate::ops::rowwise::cpu::Linear;
use crate::device::range_guard::{LayerId, LayerNames};
use crate::device::clock::GpuClock;
use crate::Error;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PushKernelArg};
use half::f16;

const THREADS: u32 = 256;
/// `swin_ln_pad` handles up to this many channels (8 values a lane), `swin_ln_pad_wide` up to
/// [`LN_PAD_MAX_C`] (24 a lane).
const LN_PAD_NARROW_C: usize = 256;
const LN_PAD_MAX_C: usize = 768;

/// The slot of layer `id` in `flags`, if the forward is guarded.
fn slot(flags: Option<&RangeFlags>, id: LayerId) -> Result<Option<RangeSlot<'_>>, Error> {
    flags.map(|f| f.slot(id)).transpose()
}

fn grid(total: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (total.div_ceil(THREADS).max(1), 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// Device memory for `len` elements that the next kernel or GEMM writes entirely.
fn scratch<T: DeviceRepr>(dev: &CudaDevice, len: usize, what: &str) -> Result<CudaSlice<T>, Error> {
    // SAFETY: every caller passes the buffer to a kernel or GEMM that writes all `len` elements
    // before anything reads them.
    unsafe { dev.alloc_uninit::<T>(len, what) }
}

/// One stage's partitions on the device (see [`StageWindows`]).
struct GpuWindows {
    part: CudaPartition,
    /// Rolled (row, col) of each padded token, packed `(row << 16) | col`.
    rc: CudaSlice<u32>,
}

impl GpuWindows {
    fn upload(dev: &CudaDevice, part: &Partition, rc: &[[i32; 2]]) -> Result<Self, Error> {
        let s = &dev.stream;
        let n = part.order.len();
        let mut win_of = vec![0u32; n];
        for w in 0..part.windows() {
            for p in part.offsets[w]..part.offsets[w + 1] {
                win_of[p as usize] = w as u32;
            }
        }
        // rows and columns of a padded grid stay below 2^16 (checked by SwinPlan::build)
        let packed: Vec<u32> = rc.iter().map(|p| ((p[0] as u32) << 16) | p[1] as u32).collect();
        let up = |v: &[u32], what: &str| s.clone_htod(v).map_err(cuda_err(format!("uploading {what}")));
        let part = CudaPartition::new(
            up(&part.order, "the window order")?,
            up(&win_of, "the window of each token")?,
            up(&part.offsets, "the window offsets")?,
            n,
            part.windows(),
            part.n_max(),
            [0.0; 3],
        );
        Ok(Self { part, rc: up(&packed, "token positions")? })
    }
}

struct StagePlan {
    /// Token grid `[h, w]` and its padding to the window `[hp, wp]`.
    hw: [usize; 2],
    padded: [usize; 2],
    plain: GpuWindows,
    shifted: Option<GpuWindows>,
}

/// Everything the backbone derives from the batch size and image size alone (each stage's grid
/// and window partitions): built once, reused by every frame of that size.
pub struct SwinPlan {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    stages: Vec<StagePlan>,
}

impl SwinPlan {
    /// Plans `n` images of `h × w` pixels for `cfg`.
    pub fn build(dev: &CudaDevice, cfg: &SwinConfig, n: usize, h: usize, w: usize) -> Result<Self, Error> {
        if n == 0 || h == 0 || w == 0 {
            return Err(Error::InvalidInput(format!("swin: empty image batch [{n}, {h}, {w}]")));
        }
        let m = cfg.window;
        let mut stages = Vec::with_capacity(cfg.stages());
        for (i, [hh, ww]) in cfg.stage_sizes(h, w).into_iter().enumerate() {
            let windows = StageWindows::build(n, hh, ww, m, cfg.depths[i] > 1)?;
            let [hp, wp] = windows.padded;
            if hp >= 1 << 16 || wp >= 1 << 16 {
                return Err(Error::InvalidInput(format!("swin: a {hp} x {wp} token grid exceeds the kernel's 16-bit positions")));
            }
            let plain = GpuWindows::upload(dev, &windows.plain.0, &windows.plain.1)?;
            let shifted = windows.shifted.as_ref().map(|(p, rc)| GpuWindows::upload(dev, p, rc)).transpose()?;
            stages.push(StagePlan { hw: [hh, ww], padded: [hp, wp], plain, shifted });
        }
        Ok(Self { n, h, w, stages })
    }
}

/// A Linear's bias as FP16 for the cuBLASLt epilogue (zeros when it has none).
fn bias_f16(dev: &CudaDevice, l: &Linear) -> Result<CudaSlice<f16>, Error> {
    let zeros = vec![0f32; l.out_features];
    up_f16(dev, l.bias.as_deref().unwrap_or(&zeros), "linear bias (FP16)")
}

/// Values / `width` as a kernel count, for the fused path's kernels that take `width` values a
/// thread: 8 for the block kernels (every block's channel count is a multiple of 8, checked at
/// upload), 2 for the range scan (every fused-path tensor has an even channel count).
fn groups(rows: usize, c: usize, width: usize, what: &str) -> Result<u32, Error> {
    if !c.is_multiple_of(width) {
        return Err(Error::InvalidInput(format!("{what}: {c} channels, not a multiple of {width} as its fused-path kernel takes")));
    }
    elements(rows, c / width, what)
}

/// `y` `[rows, c]` FP16 through exact GELU, in place; `range` guards fc1's output and the GELU's.
fn gelu_in_place(dev: &CudaDevice, y: &mut CudaSlice<f16>, rows: usize, c: usize, range: Option<RangeSlot<'_>>) -> Result<(), Error> {
    let p = groups(rows, c, 8, "GELU")?;
    let f = dev.function("swin", "swin_gelu_h")?;
    // SAFETY: matches swin.cu; y holds rows * c halves (8 * p), 16-byte aligned (a whole
    // allocation); the range slot's layer lies in its flags.
    unsafe {
        let mut b = dev.stream.launch_builder(&f);
        b.arg(y).arg(&p);
        RangeSlot::push(range.as_ref(), &mut b);
        b.launch(grid(p))
    }
    .map_err(cuda_err("swin_gelu_h"))?;
    Ok(())
}

/// The FP16 range guard over a fused GEMM's output `y` `[rows, c]` that no guarded kernel reads
/// (module docs): `swin_range_scan_h` when the forward is guarded, nothing otherwise.
fn range_scan(dev: &CudaDevice, y: &CudaSlice<f16>, rows: usize, c: usize, range: Option<RangeSlot<'_>>) -> Result<(), Error> {
    let Some(range) = range else { return Ok(()) };
    let p = groups(rows, c, 2, "range scan")?;
    if y.len() < 2 * p as usize {
        return Err(Error::InvalidInput(format!("swin range scan: {} values for [{rows}, {c}]", y.len())));
    }
    let f = dev.function("swin", "swin_range_scan_h")?;
    // SAFETY: matches swin.cu; y holds at least rows * c halves (2 * p, checked), 4-byte aligned
    // (a whole allocation); the range slot's layer lies in its flags.
    unsafe {
        let mut b = dev.stream.launch_builder(&f);
        b.arg(y).arg(&p);
        RangeSlot::push(Some(&range), &mut b);
        b.launch(grid(p))
    }
    .map_err(cuda_err("swin_range_scan_h"))?;
    Ok(())
}

struct GpuPatchEmbed {
    cin: usize,
    patch: usize,
    proj: GpuLinear,
    proj_bh: CudaSlice<f16>,
    norm: Option<GpuLayerNorm>,
    /// `patch_embed.projection`, `patch_embed.norm`.
    ids: [LayerId; 2],
}

impl GpuPatchEmbed {
    fn upload(dev: &CudaDevice, p: &PatchEmbed, names: &mut LayerNames) -> Result<Self, Error> {
        let ids = [names.add(format!("{BACKBONE}.patch_embed.projection")), names.add(format!("{BACKBONE}.patch_embed.norm"))];
        Ok(Self {
            cin: p.in_channels,
            patch: p.patch,
            proj: GpuLinear::upload(dev, &p.proj, 1)?,
            proj_bh: bias_f16(dev, &p.proj)?,
            norm: p.norm.as_ref().map(|l| GpuLayerNorm::upload(dev, l)).transpose()?,
            ids,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, lt: Option<&LtGemm>, img: &CudaSlice<f16>, n: usize, h: usize, w: usize, flags: Option<&RangeFlags>) -> Result<CudaSlice<f16>, Error> {
        let p = self.patch;
        let (ho, wo) = (h.div_ceil(p), w.div_ceil(p));
        let k = self.cin * p * p;
        let rows = n * ho * wo;
        let total = elements(rows, k, "patch embedding")?;
        let mut cols = scratch::<f16>(dev, rows * k, "patch columns")?;
        let f = dev.function("swin", "swin_patch_im2col")?;
        let a = [n, self.cin, h, w, p, ho, wo].map(|v| v as u32);
        // SAFETY: matches swin.cu; img holds n * h * w * cin halves (checked by the caller), cols rows * k.
        unsafe {
            dev.stream
                .launch_builder(&f)
                .arg(img).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]).arg(&a[4]).arg(&a[5]).arg(&a[6]).arg(&mut cols)
                .launch(grid(total))
        }
        .map_err(cuda_err("swin_patch_im2col"))?;
        let t = match lt {
            Some(lt) => {
                let t = lt.linear(dev, &self.proj.weight, &self.proj_bh, self.proj.fin, self.proj.fout, &cols, rows, None)?;
                range_scan(dev, &t, rows, self.proj.fout, slot(flags, self.ids[0])?)?;
                t
            }
            None => {
                let acc = self.proj.gemm(dev, blas, &cols, rows)?;
                drop(cols);
                epilogue_guarded::<f16>(dev, &acc, self.proj.fout, 0, rows, &self.proj.bias[0], 1.0, false, None, slot(flags, self.ids[0])?)?
            }
        };
        match &self.norm {
            Some(ln) => ln.forward_guarded(dev, &t, rows, slot(flags, self.ids[1])?),
            None => Ok(t),
        }
    }
}

struct GpuBlock {
    c: usize,
    heads: usize,
    window: i32,
    shift: usize,
    scale: f32,
    norm1: GpuLayerNorm,
    /// `[heads, (2M - 1)²]` f32.
    table: CudaSlice<f32>,
    qkv: GpuLinear,
    proj: GpuLinear,
    norm2: GpuLayerNorm,
    fc1: GpuLinear,
    fc2: GpuLinear,
    /// FP16 biases of qkv, proj, fc1, fc2 (the fused path).
    bh: [CudaSlice<f16>; 4],
    ids: BlockIds,
}

/// A block's guarded layers under its module path `p`: `p.norm1` (with the window padding),
/// `p.attn.w_msa.qkv`, `p.attn.w_msa` (the window attention's output), `p.attn.w_msa.proj` (plus
/// the block's input), `p.norm2`, `p.ffn.layers.0.0` (with the GELU), `p.ffn.layers.1` (plus the
/// residual: the block's output).
struct BlockIds {
    norm1: LayerId,
    qkv: LayerId,
    attn: LayerId,
    proj: LayerId,
    norm2: LayerId,
    fc1: LayerId,
    fc2: LayerId,
}

impl BlockIds {
    fn register(p: &str, names: &mut LayerNames) -> Self {
        let mut add = |s: &str| names.add(format!("{p}.{s}"));
        Self {
            norm1: add("norm1"),
            qkv: add("attn.w_msa.qkv"),
            attn: add("attn.w_msa"),
            proj: add("attn.w_msa.proj"),
            norm2: add("norm2"),
            fc1: add("ffn.layers.0.0"),
            fc2: add("ffn.layers.1"),
        }
    }
}

impl GpuBlock {
    fn upload(dev: &CudaDevice, b: &SwinBlock, p: &str, names: &mut LayerNames) -> Result<Self, Error> {
        let d = b.channels / b.heads;
        if ![16, 32, 64].contains(&d) {
            return Err(Error::InvalidInput(format!(
                "swin on CUDA: head_dim {d} ({} channels / {} heads) is not one the window-attention kernel has (16, 32, 64)",
                b.channels, b.heads
            )));
        }
        if b.channels > LN_PAD_MAX_C || !b.channels.is_multiple_of(8) {
            return Err(Error::InvalidInput(format!("swin on CUDA: {} channels; blocks take multiples of 8 up to {LN_PAD_MAX_C}", b.channels)));
        }
        Ok(Self {
            c: b.channels,
            heads: b.heads,
            window: b.window as i32,
            shift: b.shift,
            scale: b.scale,
            norm1: GpuLayerNorm::upload(dev, &b.norm1)?,
            table: up_f32(dev, &b.bias_table, "relative position bias")?,
            qkv: GpuLinear::upload(dev, &b.qkv, 1)?,
            proj: GpuLinear::upload(dev, &b.proj, 1)?,
            norm2: GpuLayerNorm::upload(dev, &b.norm2)?,
            fc1: GpuLinear::upload(dev, &b.fc1, 1)?,
            fc2: GpuLinear::upload(dev, &b.fc2, 1)?,
            bh: [bias_f16(dev, &b.qkv)?, bias_f16(dev, &b.proj)?, bias_f16(dev, &b.fc1)?, bias_f16(dev, &b.fc2)?],
            ids: BlockIds::register(p, names),
        })
    }

    /// The block on the fused path (module docs): the same steps as [`GpuBlock::forward`], guarded
    /// under the same layers.
    #[allow(clippy::too_many_arguments)]
    fn forward_lt(&self, dev: &CudaDevice, lt: &LtGemm, x: &CudaSlice<f16>, n: usize, stage: &StagePlan, kernel: Bias2dKernel, packed_qkv: bool, flags: Option<&RangeFlags>) -> Result<CudaSlice<f16>, Error> {
        let c = self.c;
        let [h, w] = stage.hw;
        let [hp, wp] = stage.padded;
        let (rows, np) = (n * h * w, n * hp * wp);
        let id = &self.ids;
        let padded = self.ln_pad(dev, x, n, stage.hw, stage.padded, slot(flags, id.norm1)?)?;
        let y = lt.linear(dev, &self.qkv.weight, &self.bh[0], c, 3 * c, &padded, np, None)?;
        drop(padded);
        let windows = if self.shift == 0 {
            &stage.plain
        } else {
            stage.shifted.as_ref().ok_or_else(|| Error::InvalidInput("swin: the plan has no shifted windows for a shifted block".into()))?
        };
        let bias = CudaBias2d { window: [self.window, self.window], rc_packed: &windows.rc, table: &self.table, kernel };
        let heads = HeadSlice::all(self.heads, c / self.heads);
        let mut att = scratch::<f16>(dev, np * c, "attention output")?;
        if packed_qkv && bias.kernel_for(Storage::Fp16, windows.part.n_max) == Bias2dKernel::TensorCores {
            // the qkv split happens as the attention stages its windows (module docs)
            window_attention_packed_qkv_cuda(dev, &y, self.scale, heads, &windows.part, bias, &mut att, c, slot(flags, id.qkv)?, slot(flags, id.attn)?)?;
            drop(y);
        } else {
            self.split_attention(dev, y, np, heads, &windows.part, bias, &mut att, flags)?;
        }
        self.proj_residual_lt(dev, lt, x, att, n, stage, rows, np, flags)
    }

    /// The fused path's qkv split (`swin_qkv_split_h`) and window attention as two launches.
    #[allow(clippy::too_many_arguments)]
    fn split_attention(&self, dev: &CudaDevice, y: CudaSlice<f16>, np: usize, heads: HeadSlice, part: &CudaPartition, bias: CudaBias2d, att: &mut CudaSlice<f16>, flags: Option<&RangeFlags>) -> Result<(), Error> {
        let c = self.c;
        let id = &self.ids;
        let (mut q, mut k, mut v) = (scratch::<f16>(dev, np * c, "q")?, scratch::<f16>(dev, np * c, "k")?, scratch::<f16>(dev, np * c, "v")?);
        let f = dev.function("swin", "swin_qkv_split_h")?;
        let (p, c32) = (groups(np, 3 * c, 8, "qkv")?, c as u32);
        let range = slot(flags, id.qkv)?;
        // SAFETY: matches swin.cu; y holds np * 3c halves (8 * p), q/k/v np * c each; whole
        // allocations, so 16-byte aligned; c a multiple of 8 (upload); the range slot's layer
        // lies in its flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&y).arg(&p).arg(&c32).arg(&self.scale).arg(&mut q).arg(&mut k).arg(&mut v);
            RangeSlot::push(range.as_ref(), &mut b);
            b.launch(grid(p))
        }
        .map_err(cuda_err("swin_qkv_split_h"))?;
        drop(y);
        let qkv = QkvView { q: &q, k: &k, v: &v, ld: c };
        window_attention_cuda_guarded(dev, qkv, heads, part, CudaTerm::Bias2d(bias), att, c, TILED_MIN_WINDOW, None, slot(flags, id.attn)?)
    }

    /// The fused path's proj on the attention output `att`, cropped plus the residual `x`, then
    /// the MLP half of the block.
    #[allow(clippy::too_many_arguments)]
    fn proj_residual_lt(&self, dev: &CudaDevice, lt: &LtGemm, x: &CudaSlice<f16>, att: CudaSlice<f16>, n: usize, stage: &StagePlan, rows: usize, np: usize, flags: Option<&RangeFlags>) -> Result<CudaSlice<f16>, Error> {
        let c = self.c;
        let [h, w] = stage.hw;
        let [hp, wp] = stage.padded;
        let id = &self.ids;
        debug_assert_eq!((rows, np), (n * h * w, n * hp * wp));
        let yp = lt.linear(dev, &self.proj.weight, &self.bh[1], c, c, &att, np, None)?;
        drop(att);
        let mut y1 = scratch::<f16>(dev, rows * c, "block residual")?;
        let f = dev.function("swin", "swin_crop_residual_h")?;
        let p = groups(rows, c, 8, "proj")?;
        let a = [h, w, hp, wp, c].map(|v| v as u32);
        let range = slot(flags, id.proj)?;
        // SAFETY: matches swin.cu; yp holds np * c halves, x and y1 rows * c (8 * p); whole
        // allocations, so 16-byte aligned; c a multiple of 8; the range slot's layer lies in its
        // flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&yp).arg(&p).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]).arg(&a[4]).arg(x).arg(&mut y1);
            RangeSlot::push(range.as_ref(), &mut b);
            b.launch(grid(p))
        }
        .map_err(cuda_err("swin_crop_residual_h"))?;
        drop(yp);
        let h2 = self.norm2.forward_guarded(dev, &y1, rows, slot(flags, id.norm2)?)?;
        let mut hidden = lt.linear(dev, &self.fc1.weight, &self.bh[2], c, self.fc1.fout, &h2, rows, None)?;
        drop(h2);
        gelu_in_place(dev, &mut hidden, rows, self.fc1.fout, slot(flags, id.fc1)?)?;
        let out = lt.linear(dev, &self.fc2.weight, &self.bh[3], self.fc1.fout, c, &hidden, rows, Some(&y1))?;
        range_scan(dev, &out, rows, c, slot(flags, id.fc2)?)?;
        Ok(out)
    }

    /// norm1 of `x` `[n, h, w, C]` into the zero-padded `[n, hp, wp, C]` grid.
    fn ln_pad(&self, dev: &CudaDevice, x: &CudaSlice<f16>, n: usize, hw: [usize; 2], padded: [usize; 2], range: Option<RangeSlot<'_>>) -> Result<CudaSlice<f16>, Error> {
        let c = self.c;
        let rows = n * padded[0] * padded[1];
        let mut out = scratch::<f16>(dev, rows * c, "padded tokens")?;
        let name = if c <= LN_PAD_NARROW_C { "swin_ln_pad" } else { "swin_ln_pad_wide" };
        let f = dev.function("swin", name)?;
        let rows32 = elements(rows, 1, "padded tokens")?;
        let a = [n, hw[0], hw[1], padded[0], padded[1], c].map(|v| v as u32);
        // 8 rows (warps) a block
        let cfg = LaunchConfig { grid_dim: (rows32.div_ceil(8), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: matches swin.cu; x holds n * h * w * c halves, out rows * c; the range slot's
        // layer lies in its flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(x).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]).arg(&a[4]).arg(&a[5])
                .arg(&self.norm1.gamma).arg(&self.norm1.beta).arg(&self.norm1.eps).arg(&mut out);
            RangeSlot::push(range.as_ref(), &mut b);
            b.launch(cfg)
        }
        .map_err(cuda_err(name))?;
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaSlice<f16>, n: usize, stage: &StagePlan, kernel: Bias2dKernel, flags: Option<&RangeFlags>) -> Result<CudaSlice<f16>, Error> {
        let c = self.c;
        let [h, w] = stage.hw;
        let [hp, wp] = stage.padded;
        let (rows, np) = (n * h * w, n * hp * wp);
        let id = &self.ids;
        let padded = self.ln_pad(dev, x, n, stage.hw, stage.padded, slot(flags, id.norm1)?)?;
        let acc = self.qkv.gemm(dev, blas, &padded, np)?;
        drop(padded);
        let (mut q, mut k, mut v) = (scratch::<f16>(dev, np * c, "q")?, scratch::<f16>(dev, np * c, "k")?, scratch::<f16>(dev, np * c, "v")?);
        let f = dev.function("swin", "swin_qkv_split")?;
        let (np32, c32) = (elements(np, 1, "qkv")?, c as u32);
        let range = slot(flags, id.qkv)?;
        // SAFETY: matches swin.cu; acc holds np * 3c floats, bias 3c, q/k/v np * c halves; the
        // range slot's layer lies in its flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&acc).arg(&np32).arg(&c32).arg(&self.qkv.bias[0]).arg(&self.scale).arg(&mut q).arg(&mut k).arg(&mut v);
            RangeSlot::push(range.as_ref(), &mut b);
            b.launch(grid(elements(np, 3 * c, "qkv")?))
        }
        .map_err(cuda_err("swin_qkv_split"))?;
        drop(acc);
        let windows = if self.shift == 0 {
            &stage.plain
        } else {
            stage.shifted.as_ref().ok_or_else(|| Error::InvalidInput("swin: the plan has no shifted windows for a shifted block".into()))?
        };
        let mut att = scratch::<f16>(dev, np * c, "attention output")?;
        let term = CudaTerm::Bias2d(CudaBias2d { window: [self.window, self.window], rc_packed: &windows.rc, table: &self.table, kernel });
        let qkv = QkvView { q: &q, k: &k, v: &v, ld: c };
        let heads = HeadSlice::all(self.heads, c / self.heads);
        window_attention_cuda_guarded(dev, qkv, heads, &windows.part, term, &mut att, c, TILED_MIN_WINDOW, None, slot(flags, id.attn)?)?;
        drop((q, k, v));
        let acc = self.proj.gemm(dev, blas, &att, np)?;
        drop(att);
        let mut y = scratch::<f16>(dev, rows * c, "block residual")?;
        let f = dev.function("swin", "swin_crop_residual")?;
        let a = [n, h, w, hp, wp, c].map(|v| v as u32);
        let range = slot(flags, id.proj)?;
        // SAFETY: matches swin.cu; acc holds np * c floats, x and y rows * c halves; the range
        // slot's layer lies in its flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&acc).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]).arg(&a[4]).arg(&a[5]).arg(&self.proj.bias[0]).arg(x).arg(&mut y);
            RangeSlot::push(range.as_ref(), &mut b);
            b.launch(grid(elements(rows, c, "proj")?))
        }
        .map_err(cuda_err("swin_crop_residual"))?;
        drop(acc);
        let h2 = self.norm2.forward_guarded(dev, &y, rows, slot(flags, id.norm2)?)?;
        let acc = self.fc1.gemm(dev, blas, &h2, rows)?;
        drop(h2);
        let hidden = epilogue_guarded::<f16>(dev, &acc, self.fc1.fout, 0, rows, &self.fc1.bias[0], 1.0, true, None, slot(flags, id.fc1)?)?;
        drop(acc);
        let acc = self.fc2.gemm(dev, blas, &hidden, rows)?;
        drop(hidden);
        epilogue_guarded(dev, &acc, c, 0, rows, &self.fc2.bias[0], 1.0, false, Some(&y), slot(flags, id.fc2)?)
    }
}

struct GpuMerge {
    c: usize,
    norm: Option<GpuLayerNorm>,
    reduction: GpuLinear,
    reduction_bh: CudaSlice<f16>,
    /// `p.norm`, `p.reduction`.
    ids: [LayerId; 2],
}

impl GpuMerge {
    fn upload(dev: &CudaDevice, m: &PatchMerging, p: &str, names: &mut LayerNames) -> Result<Self, Error> {
        let ids = [names.add(format!("{p}.norm")), names.add(format!("{p}.reduction"))];
        Ok(Self {
            c: m.channels,
            norm: m.norm.as_ref().map(|l| GpuLayerNorm::upload(dev, l)).transpose()?,
            reduction: GpuLinear::upload(dev, &m.reduction, 1)?,
            reduction_bh: bias_f16(dev, &m.reduction)?,
            ids,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, lt: Option<&LtGemm>, x: &CudaSlice<f16>, n: usize, h: usize, w: usize, flags: Option<&RangeFlags>) -> Result<CudaSlice<f16>, Error> {
        let c = self.c;
        let (ho, wo) = (h.div_ceil(2), w.div_ceil(2));
        let rows = n * ho * wo;
        let mut u = scratch::<f16>(dev, rows * 4 * c, "unfolded tokens")?;
        let f = dev.function("swin", "swin_merge_gather")?;
        let a = [n, h, w, c, ho, wo].map(|v| v as u32);
        // SAFETY: matches swin.cu; x holds n * h * w * c halves, u rows * 4c.
        unsafe {
            dev.stream
                .launch_builder(&f)
                .arg(x).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]).arg(&a[4]).arg(&a[5]).arg(&mut u)
                .launch(grid(elements(rows, 4 * c, "patch merging")?))
        }
        .map_err(cuda_err("swin_merge_gather"))?;
        let u = match &self.norm {
            Some(ln) => ln.forward_guarded(dev, &u, rows, slot(flags, self.ids[0])?)?,
            None => u,
        };
        if let Some(lt) = lt {
            let out = lt.linear(dev, &self.reduction.weight, &self.reduction_bh, 4 * c, 2 * c, &u, rows, None)?;
            range_scan(dev, &out, rows, 2 * c, slot(flags, self.ids[1])?)?;
            return Ok(out);
        }
        let acc = self.reduction.gemm(dev, blas, &u, rows)?;
        epilogue_guarded::<f16>(dev, &acc, 2 * c, 0, rows, &self.reduction.bias[0], 1.0, false, None, slot(flags, self.ids[1])?)
    }
}

struct GpuStage {
    c: usize,
    blocks: Vec<GpuBlock>,
    merge: Option<GpuMerge>,
}

/// The backbone on the device.
pub struct CudaSwin {
    pub config: SwinConfig,
    patch: GpuPatchEmbed,
    stages: Vec<GpuStage>,
    out_norms: Vec<GpuLayerNorm>,
    /// The fused GEMM path's cuBLASLt handle (module docs); None: the unfused path.
    lt: Option<LtGemm>,
    /// The window-attention kernel (module docs).
    attention_kernel: Bias2dKernel,
    /// On the fused path with tensor-core attention: the qkv split done by the attention kernel
    /// as it stages its windows (module docs); false: `swin_qkv_split_h` first.
    packed_qkv: bool,
    /// `norm{i}` of each output.
    out_norm_ids: Vec<LayerId>,
}

/// The window-attention kernel `SPTR_SWIN_ATTN` names (`tensor`, `window` or `perquery`;
/// unset: tensor cores).
fn attention_kernel_from_env() -> Result<Bias2dKernel, Error> {
    match std::env::var("SPTR_SWIN_ATTN") {
        Err(_) => Ok(Bias2dKernel::TensorCores),
        Ok(v) => Bias2dKernel::from_name(&v)
            .ok_or_else(|| Error::InvalidInput(format!("SPTR_SWIN_ATTN={v}: expected tensor, window or perquery"))),
    }
}

/// The backbone's module path (upstream state_dict names).
const BACKBONE: &str = crate::models::bevfusion::camera::encoder::BACKBONE_PREFIX;

impl CudaSwin {
    /// Uploads a loaded backbone (weights FP16; norms, biases and bias tables f32).
    pub fn upload(dev: &CudaDevice, net: &SwinTransformer) -> Result<Self, Error> {
        Self::upload_named(dev, net, &mut LayerNames::new())
    }

    /// [`CudaSwin::upload`], registering its guarded layers in `names` in execution order
    /// (patch embedding; per stage its blocks, its output's `norm{i}`, its patch merging).
    pub fn upload_named(dev: &CudaDevice, net: &SwinTransformer, names: &mut LayerNames) -> Result<Self, Error> {
        let patch = GpuPatchEmbed::upload(dev, &net.patch_embed, names)?;
        let mut stages = Vec::with_capacity(net.stages.len());
        let mut out_norm_ids = vec![None; net.out_norms.len()];
        for (i, s) in net.stages.iter().enumerate() {
            let mut blocks = Vec::with_capacity(s.blocks.len());
            for (j, b) in s.blocks.iter().enumerate() {
                blocks.push(GpuBlock::upload(dev, b, &format!("{BACKBONE}.stages.{i}.blocks.{j}"), names)?);
            }
            if let Some(k) = net.config.out_indices.iter().position(|&o| o == i) {
                if let Some(slot) = out_norm_ids.get_mut(k) {
                    *slot = Some(names.add(format!("{BACKBONE}.norm{i}")));
                }
            }
            let merge = match &s.downsample {
                Some(m) => Some(GpuMerge::upload(dev, m, &format!("{BACKBONE}.stages.{i}.downsample"), names)?),
                None => None,
            };
            stages.push(GpuStage { c: s.channels, blocks, merge });
        }
        let out_norm_ids = out_norm_ids
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| Error::InvalidInput("swin: out_indices and the output norms do not match".into()))?;
        Ok(Self {
            config: net.config.clone(),
            patch,
            stages,
            out_norms: net.out_norms.iter().map(|l| GpuLayerNorm::upload(dev, l)).collect::<Result<_, _>>()?,
            lt: if std::env::var("SPTR_SWIN_UNFUSED").is_ok_and(|v| v == "1") { None } else { Some(LtGemm::new(dev)?) },
            attention_kernel: attention_kernel_from_env()?,
            packed_qkv: !std::env::var("SPTR_SWIN_QKV").is_ok_and(|v| v == "split"),
            out_norm_ids,
        })
    }

    /// Selects the window-attention kernel (module docs; the default is tensor cores unless
    /// `SPTR_SWIN_ATTN` names another).
    pub fn set_attention_kernel(&mut self, kernel: Bias2dKernel) {
        self.attention_kernel = kernel;
    }

    pub fn attention_kernel(&self) -> Bias2dKernel {
        self.attention_kernel
    }

    /// Selects whether the tensor-core attention reads the qkv Linear's output as it is (true,
    /// the default unless `SPTR_SWIN_QKV=split`) or after `swin_qkv_split_h` (false); the output
    /// has the same bits either way.
    pub fn set_packed_qkv(&mut self, on: bool) {
        self.packed_qkv = on;
    }

    /// Selects the fused (cuBLASLt, FP16 out) or unfused (cuBLAS FP32 out + epilogues) GEMM path
    /// (module docs); the default is fused unless `SPTR_SWIN_UNFUSED=1`.
    pub fn set_fused(&mut self, dev: &CudaDevice, fused: bool) -> Result<(), Error> {
        self.lt = match (fused, self.lt.take()) {
            (true, Some(lt)) => Some(lt),
            (true, None) => Some(LtGemm::new(dev)?),
            (false, _) => None,
        };
        Ok(())
    }

    pub fn is_fused(&self) -> bool {
        self.lt.is_some()
    }

    /// The partitions for `n` images of `h × w`.
    pub fn plan(&self, dev: &CudaDevice, n: usize, h: usize, w: usize) -> Result<SwinPlan, Error> {
        SwinPlan::build(dev, &self.config, n, h, w)
    }

    /// The outputs at `out_indices` (NHWC FP16, after their norms) of normalized NHWC FP16
    /// images `[plan.n, plan.h, plan.w, in_channels]` (the GPU preprocessing's output).
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, plan: &SwinPlan, images: &CudaSlice<f16>) -> Result<Vec<CudaFeatureMap>, Error> {
        self.forward_timed(dev, blas, plan, images, None)
    }

    /// [`forward`](Self::forward) with its stage boundaries (`patch_embed`, `stage{i}`,
    /// `merge{i}`) marked on `clock`.
    pub fn forward_timed(
        &self,
        dev: &CudaDevice,
        blas: &CudaBlas,
        plan: &SwinPlan,
        images: &CudaSlice<f16>,
        clock: Option<&mut GpuClock>,
    ) -> Result<Vec<CudaFeatureMap>, Error> {
        self.forward_guarded_timed(dev, blas, plan, images, clock, None)
    }

    /// [`forward_timed`](Self::forward_timed) with the FP16 range guard reporting into `flags`
    /// (made for the `names` given to [`CudaSwin::upload_named`]).
    pub fn forward_guarded_timed(
        &self,
        dev: &CudaDevice,
        blas: &CudaBlas,
        plan: &SwinPlan,
        images: &CudaSlice<f16>,
        mut clock: Option<&mut GpuClock>,
        flags: Option<&RangeFlags>,
    ) -> Result<Vec<CudaFeatureMap>, Error> {
        let mut mark = |name: String| -> Result<(), Error> {
            match clock.as_deref_mut() {
                Some(c) => c.mark(dev, name),
                None => Ok(()),
            }
        };
        let (n, h, w) = (plan.n, plan.h, plan.w);
        let want = n * self.config.in_channels * h * w;
        if images.len() < want || plan.stages.len() != self.stages.len() {
            return Err(Error::InvalidInput(format!(
                "swin on CUDA: {} image values for [{n}, {h}, {w}, {}] (a plan of {} stages for {})",
                images.len(),
                self.config.in_channels,
                plan.stages.len(),
                self.stages.len()
            )));
        }
        let lt = self.lt.as_ref();
        let mut x = self.patch.forward(dev, blas, lt, images, n, h, w, flags)?;
        mark("patch_embed".into())?;
        let mut outs = Vec::with_capacity(self.out_norms.len());
        for (i, (stage, sp)) in self.stages.iter().zip(&plan.stages).enumerate() {
            let [hh, ww] = sp.hw;
            for b in &stage.blocks {
                x = match lt {
                    Some(lt) => b.forward_lt(dev, lt, &x, n, sp, self.attention_kernel, self.packed_qkv, flags)?,
                    None => b.forward(dev, blas, &x, n, sp, self.attention_kernel, flags)?,
                };
            }
            if let Some(k) = self.config.out_indices.iter().position(|&o| o == i) {
                let y = self.out_norms[k].forward_guarded(dev, &x, n * hh * ww, slot(flags, self.out_norm_ids[k])?)?;
                outs.push(CudaFeatureMap::from_slice(n, hh, ww, stage.c, y)?);
            }
            mark(format!("stage{i}"))?;
            if let Some(m) = &stage.merge {
                x = m.forward(dev, blas, lt, &x, n, hh, ww, flags)?;
                mark(format!("merge{i}"))?;
            }
        }
        Ok(outs)
    }
}
