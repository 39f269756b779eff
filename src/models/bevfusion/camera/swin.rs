//! mmdet 2.20's `SwinTransformer` (the backbone of BEVFusion's camera encoder) on the CPU, f32,
//! written for clarity: the reference the CUDA path is tested against.
//!
//! Module tree and `state_dict` names (under `encoders.camera.backbone.`):
//!
//! ```text
//! patch_embed.projection      Conv2d(in, E, k = s = patch) with bias, after AdaptivePadding
//!                             ('corner': zeros right and bottom up to a multiple of patch)
//! patch_embed.norm            LayerNorm(E)                               (patch_norm)
//! stages.{i}.blocks.{j}       SwinBlock, C = E · 2^i, shift = window // 2 for odd j:
//!   norm1                     LayerNorm(C)
//!   attn.w_msa                WindowMSA: relative_position_bias_table [(2M-1)², heads],
//!                             relative_position_index (buffer [M², M²]), qkv (C → 3C), proj
//!   norm2                     LayerNorm(C)
//!   ffn.layers.0.0, .layers.1 Linear(C, r·C), GELU (exact), Linear(r·C, C)
//! stages.{i}.downsample       PatchMerging (all stages but the last): nn.Unfold(2, stride 2)
//!   norm, reduction           after 'corner' padding to even size; LayerNorm(4C), Linear(4C, 2C)
//!                             without bias
//! norm{i}                     LayerNorm(C_i) on stage i's output, for i in out_indices
//! ```
//!
//! A block: `x = x + proj(attn(pad(norm1(x))))` (cropped back), `x = x + fc2(gelu(fc1(norm2(x))))`.
//! The attention pads the normed tokens with zeros right and bottom to multiples of the window M
//! (so padded tokens carry only the qkv bias and, in unshifted windows, are attended to like any
//! other token), rolls by `-shift` when shifted, attends within M × M windows with the relative
//! position bias, and masks pairs from different regions of the rolled image with -100. Here the
//! roll and the mask are a partition ([`swin_partition`]): a shifted window with its mask is a set
//! of smaller windows, one per region (see the note on exp(-100) at [`SwinBlock::forward`]).
//!
//! Stage outputs are taken before the stage's patch merging, then `norm{i}`; all NHWC here (the
//! NCHW permute of upstream is only a layout change).

use crate::models::bevfusion::camera::config::SwinConfig;
use crate::nn::weights::{bad_weights, TensorSource as Source};
use crate::ops::attention::swin::swin_partition;
use crate::ops::attention::{window_attention, HeadSlice, Partition, PositionTerm, RelativeBias2d};
use crate::ops::dense::FeatureMap;
use crate::ops::rowwise::cpu::{gelu_inplace, LayerNorm, Linear};
use crate::nn::ModelError;
use crate::Error;
use rayon::prelude::*;

/// The relative position index of an `m × m` window as upstream's buffer holds it (as f32):
/// `index[a][b] = (r_a - r_b + m - 1) · (2m - 1) + (c_a - c_b + m - 1)` for tokens a (query) and
/// b (key) in row-major window order.
pub fn relative_position_index(m: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(m * m * m * m);
    for a in 0..m * m {
        for b in 0..m * m {
            let (ra, ca, rb, cb) = (a / m, a % m, b / m, b % m);
            out.push(((ra + m - 1 - rb) * (2 * m - 1) + (ca + m - 1 - cb)) as f32);
        }
    }
    out
}

fn layer_norm(src: &mut dyn Source, p: &str, c: usize, eps: f64) -> Result<LayerNorm, ModelError> {
    let g = src.tensor(&format!("{p}.weight"), &[c])?;
    let b = src.tensor(&format!("{p}.bias"), &[c])?;
    let mut ln = LayerNorm::new(g, b).map_err(|e| bad_weights(p, e))?;
    ln.eps = eps;
    Ok(ln)
}

fn linear(src: &mut dyn Source, p: &str, fin: usize, fout: usize, bias: bool) -> Result<Linear, ModelError> {
    let w = src.tensor(&format!("{p}.weight"), &[fout, fin])?;
    let b = if bias { Some(src.tensor(&format!("{p}.bias"), &[fout])?) } else { None };
    Linear::new(w, b, fin, fout).map_err(|e| bad_weights(p, e))
}

/// Zero-pads `[n, h, w, c]` tokens right and bottom to `[n, hp, wp, c]`.
pub fn pad_tokens(x: &[f32], n: usize, h: usize, w: usize, c: usize, hp: usize, wp: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * hp * wp * c];
    out.par_chunks_mut(wp * c).enumerate().for_each(|(row, o)| {
        let (b, r) = (row / hp, row % hp);
        if r < h {
            let src = (b * h + r) * w * c;
            o[..w * c].copy_from_slice(&x[src..src + w * c]);
        }
    });
    out
}

/// The top-left `[n, h, w, c]` of `[n, hp, wp, c]` tokens.
pub fn crop_tokens(x: &[f32], n: usize, hp: usize, wp: usize, c: usize, h: usize, w: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * h * w * c];
    out.par_chunks_mut(w * c).enumerate().for_each(|(row, o)| {
        let (b, r) = (row / h, row % h);
        let src = (b * hp + r) * wp * c;
        o.copy_from_slice(&x[src..src + w * c]);
    });
    out
}

fn add_inplace(dst: &mut [f32], src: &[f32]) {
    dst.par_iter_mut().zip(src.par_iter()).for_each(|(d, s)| *d += *s);
}

/// `PatchEmbed`: a `patch × patch` stride-`patch` convolution (as im2col + Linear over the
/// patch's `(channel, row, col)` values, PyTorch's weight order) and the optional LayerNorm.
#[derive(Debug, Clone)]
pub struct PatchEmbed {
    pub in_channels: usize,
    pub patch: usize,
    /// Weight `[E, in · patch · patch]` (the conv weight flattened), bias `[E]`.
    pub proj: Linear,
    pub norm: Option<LayerNorm>,
}

impl PatchEmbed {
    fn load(src: &mut dyn Source, p: &str, cfg: &SwinConfig) -> Result<Self, ModelError> {
        let (e, cin, k) = (cfg.embed_dims, cfg.in_channels, cfg.patch_size);
        let w = src.tensor(&format!("{p}.projection.weight"), &[e, cin, k, k])?;
        let b = src.tensor(&format!("{p}.projection.bias"), &[e])?;
        let proj = Linear::new(w, Some(b), cin * k * k, e).map_err(|er| bad_weights(p, er))?;
        let norm = if cfg.patch_norm { Some(layer_norm(src, &format!("{p}.norm"), e, cfg.ln_eps)?) } else { None };
        Ok(Self { in_channels: cin, patch: k, proj, norm })
    }

    /// Patches of NHWC images as rows `[n · ho · wo, in · patch²]` in the conv weight's
    /// (channel, row, col) order, zeros past the image (AdaptivePadding 'corner'); returns them
    /// with `(ho, wo)`.
    pub fn im2col(&self, x: &[f32], n: usize, h: usize, w: usize) -> (Vec<f32>, usize, usize) {
        let (cin, p) = (self.in_channels, self.patch);
        let (ho, wo) = (h.div_ceil(p), w.div_ceil(p));
        let k = cin * p * p;
        let mut cols = vec![0f32; n * ho * wo * k];
        cols.par_chunks_mut(k).enumerate().for_each(|(t, row)| {
            let (b, i, j) = (t / (ho * wo), (t / wo) % ho, t % wo);
            for ci in 0..cin {
                for di in 0..p {
                    let y = i * p + di;
                    if y >= h {
                        continue;
                    }
                    for dj in 0..p {
                        let xx = j * p + dj;
                        if xx < w {
                            row[(ci * p + di) * p + dj] = x[((b * h + y) * w + xx) * cin + ci];
                        }
                    }
                }
            }
        });
        (cols, ho, wo)
    }

    /// Tokens `[n, ho, wo, E]` of NHWC images.
    pub fn forward(&self, x: &[f32], n: usize, h: usize, w: usize) -> Result<(Vec<f32>, usize, usize), Error> {
        let (cols, ho, wo) = self.im2col(x, n, h, w);
        let t = self.proj.forward(&cols)?;
        let t = match &self.norm {
            Some(ln) => ln.forward(&t)?,
            None => t,
        };
        Ok((t, ho, wo))
    }
}

/// One Swin block (`SwinBlock` with its `ShiftWindowMSA`).
#[derive(Debug, Clone)]
pub struct SwinBlock {
    pub channels: usize,
    pub heads: usize,
    pub window: usize,
    /// 0 (W-MSA) or `window / 2` (SW-MSA).
    pub shift: usize,
    /// Multiplies q before q · k (`qk_scale` or `head_dim^-0.5`).
    pub scale: f32,
    pub norm1: LayerNorm,
    /// The relative position bias as `[heads, (2M - 1)²]` (upstream stores `[(2M - 1)², heads]`).
    pub bias_table: Vec<f32>,
    pub qkv: Linear,
    pub proj: Linear,
    pub norm2: LayerNorm,
    pub fc1: Linear,
    pub fc2: Linear,
}

/// The window partitions of one stage's padded token grid, unshifted and shifted, with each
/// token's rolled (row, col) for the relative position bias. Built once per stage and image
/// size; every block of the stage reuses them.
#[derive(Debug, Clone)]
pub struct StageWindows {
    /// Padded grid `[hp, wp]` (multiples of the window).
    pub padded: [usize; 2],
    pub plain: (Partition, Vec<[i32; 2]>),
    pub shifted: Option<(Partition, Vec<[i32; 2]>)>,
}

impl StageWindows {
    /// Partitions of `n` images of `h × w` tokens for window `m` (and shift `m / 2` when
    /// `shifted`).
    pub fn build(n: usize, h: usize, w: usize, m: usize, shifted: bool) -> Result<Self, Error> {
        let (hp, wp) = (h.next_multiple_of(m), w.next_multiple_of(m));
        let dim = |v: usize| i32::try_from(v).map_err(|_| Error::InvalidInput(format!("swin: {v} tokens per axis exceed 2^31")));
        let (hp32, wp32, m32) = (dim(hp)?, dim(wp)?, dim(m)?);
        if (n * hp * wp) as u64 > u32::MAX as u64 {
            return Err(Error::InvalidInput(format!("swin: {n} x {hp} x {wp} tokens exceed the 32-bit window index")));
        }
        let plain = swin_partition(n, hp32, wp32, m32, 0)?;
        let shifted = if shifted && m / 2 > 0 { Some(swin_partition(n, hp32, wp32, m32, m32 / 2)?) } else { None };
        Ok(Self { padded: [hp, wp], plain, shifted })
    }

    fn get(&self, shift: usize) -> Result<&(Partition, Vec<[i32; 2]>), Error> {
        if shift == 0 {
            return Ok(&self.plain);
        }
        self.shifted.as_ref().ok_or_else(|| Error::InvalidInput("swin: shifted windows were not built".into()))
    }
}

impl SwinBlock {
    fn load(src: &mut dyn Source, p: &str, cfg: &SwinConfig, stage: usize, shift: usize) -> Result<Self, ModelError> {
        let c = cfg.channels(stage);
        let heads = cfg.heads[stage];
        let m = cfg.window;
        let tl = (2 * m - 1) * (2 * m - 1);
        let norm1 = layer_norm(src, &format!("{p}.norm1"), c, cfg.ln_eps)?;
        let table = src.tensor(&format!("{p}.attn.w_msa.relative_position_bias_table"), &[tl, heads])?;
        let mut bias_table = vec![0f32; tl * heads];
        for r in 0..tl {
            for h in 0..heads {
                bias_table[h * tl + r] = table[r * heads + h];
            }
        }
        let qkv = linear(src, &format!("{p}.attn.w_msa.qkv"), c, 3 * c, cfg.qkv_bias)?;
        let proj = linear(src, &format!("{p}.attn.w_msa.proj"), c, c, true)?;
        let norm2 = layer_norm(src, &format!("{p}.norm2"), c, cfg.ln_eps)?;
        let hidden = cfg.mlp_ratio * c;
        let fc1 = linear(src, &format!("{p}.ffn.layers.0.0"), c, hidden, true)?;
        let fc2 = linear(src, &format!("{p}.ffn.layers.1"), hidden, c, true)?;
        Ok(Self { channels: c, heads, window: m, shift, scale: cfg.scale(stage), norm1, bias_table, qkv, proj, norm2, fc1, fc2 })
    }

    /// The attention branch on `[n, h, w, C]` tokens (norm1, pad, qkv, window attention, crop,
    /// proj), without the residual.
    ///
    /// Masking by partition: upstream adds -100 to the logits of pairs from different regions
    /// and softmaxes over the whole 7 × 7 window, so each masked key still gets a weight of
    /// exp(l_masked - 100 - max) / Σ; here masked pairs are simply not in one window (weight 0).
    /// The two agree to f32 resolution (relative 2^-24) unless a masked logit exceeds the row's
    /// largest unmasked logit by more than ~83, which needs |q · k| far beyond what LayerNormed
    /// tokens and trained weights produce (tests/bevfusion_camera_encoder/cpu.rs checks the literal
    /// masked attention on random weights).
    pub fn attention(&self, x: &[f32], n: usize, h: usize, w: usize, windows: &StageWindows) -> Result<Vec<f32>, Error> {
        let c = self.channels;
        let [hp, wp] = windows.padded;
        let normed = self.norm1.forward(x)?;
        let padded = pad_tokens(&normed, n, h, w, c, hp, wp);
        let qkv = self.qkv.forward(&padded)?;
        let np = n * hp * wp;
        // qkv row = [q | k | v], each `[heads, head_dim]` (upstream's reshape (B, N, 3, H, D))
        let (mut q, mut k, mut v) = (vec![0f32; np * c], vec![0f32; np * c], vec![0f32; np * c]);
        q.par_chunks_mut(c)
            .zip(k.par_chunks_mut(c))
            .zip(v.par_chunks_mut(c))
            .zip(qkv.par_chunks(3 * c))
            .for_each(|(((qr, kr), vr), row)| {
                for j in 0..c {
                    qr[j] = row[j] * self.scale;
                }
                kr.copy_from_slice(&row[c..2 * c]);
                vr.copy_from_slice(&row[2 * c..]);
            });
        let (part, rc) = windows.get(self.shift)?;
        let m = self.window as i32;
        let bias = RelativeBias2d { window: [m, m], table: &self.bias_table, rc };
        let att = window_attention(&q, &k, &v, HeadSlice::all(self.heads, c / self.heads), part, PositionTerm::Bias2d(bias))?;
        let att = crop_tokens(&att, n, hp, wp, c, h, w);
        self.proj.forward(&att)
    }

    /// The block on `[n, h, w, C]` tokens.
    pub fn forward(&self, x: &[f32], n: usize, h: usize, w: usize, windows: &StageWindows) -> Result<Vec<f32>, Error> {
        let mut y = self.attention(x, n, h, w, windows)?;
        add_inplace(&mut y, x);
        let mut hidden = self.fc1.forward(&self.norm2.forward(&y)?)?;
        gelu_inplace(&mut hidden);
        let mut out = self.fc2.forward(&hidden)?;
        add_inplace(&mut out, &y);
        Ok(out)
    }
}

/// `PatchMerging`: each 2 × 2 block of tokens (zero-padded right and bottom to even size) becomes
/// one token of `4C` features in `nn.Unfold`'s order, feature `c · 4 + (dh · 2 + dw)`, then
/// LayerNorm(4C) and a bias-free Linear(4C, 2C).
#[derive(Debug, Clone)]
pub struct PatchMerging {
    pub channels: usize,
    pub norm: Option<LayerNorm>,
    pub reduction: Linear,
}

impl PatchMerging {
    fn load(src: &mut dyn Source, p: &str, cfg: &SwinConfig, stage: usize) -> Result<Self, ModelError> {
        let c = cfg.channels(stage);
        let norm = if cfg.patch_norm { Some(layer_norm(src, &format!("{p}.norm"), 4 * c, cfg.ln_eps)?) } else { None };
        let reduction = linear(src, &format!("{p}.reduction"), 4 * c, 2 * c, false)?;
        Ok(Self { channels: c, norm, reduction })
    }

    /// The unfolded tokens `[n, ceil(h/2), ceil(w/2), 4C]` of `[n, h, w, C]` tokens.
    pub fn unfold(&self, x: &[f32], n: usize, h: usize, w: usize) -> (Vec<f32>, usize, usize) {
        let c = self.channels;
        let (ho, wo) = (h.div_ceil(2), w.div_ceil(2));
        let mut out = vec![0f32; n * ho * wo * 4 * c];
        out.par_chunks_mut(4 * c).enumerate().for_each(|(t, row)| {
            let (b, i, j) = (t / (ho * wo), (t / wo) % ho, t % wo);
            for dh in 0..2 {
                for dw in 0..2 {
                    let (y, xx) = (2 * i + dh, 2 * j + dw);
                    if y < h && xx < w {
                        let src = &x[((b * h + y) * w + xx) * c..][..c];
                        for (ci, &v) in src.iter().enumerate() {
                            row[ci * 4 + dh * 2 + dw] = v;
                        }
                    }
                }
            }
        });
        (out, ho, wo)
    }

    pub fn forward(&self, x: &[f32], n: usize, h: usize, w: usize) -> Result<(Vec<f32>, usize, usize), Error> {
        let (u, ho, wo) = self.unfold(x, n, h, w);
        let u = match &self.norm {
            Some(ln) => ln.forward(&u)?,
            None => u,
        };
        Ok((self.reduction.forward(&u)?, ho, wo))
    }
}

/// One stage (`SwinBlockSequence`): its blocks and the patch merging after it.
#[derive(Debug, Clone)]
pub struct SwinStage {
    pub channels: usize,
    pub blocks: Vec<SwinBlock>,
    pub downsample: Option<PatchMerging>,
}

/// The backbone.
#[derive(Debug, Clone)]
pub struct SwinTransformer {
    pub config: SwinConfig,
    pub patch_embed: PatchEmbed,
    pub stages: Vec<SwinStage>,
    /// `norm{i}` for each `i` of `out_indices`, in that order.
    pub out_norms: Vec<LayerNorm>,
}

impl SwinTransformer {
    /// Builds the backbone from tensors under `prefix` (registration order, as `state_dict`).
    pub(crate) fn load(src: &mut dyn Source, prefix: &str, cfg: &SwinConfig) -> Result<Self, ModelError> {
        let patch_embed = PatchEmbed::load(src, &format!("{prefix}.patch_embed"), cfg)?;
        let mut stages = Vec::with_capacity(cfg.stages());
        for (i, &depth) in cfg.depths.iter().enumerate() {
            let mut blocks = Vec::with_capacity(depth);
            for j in 0..depth {
                let shift = if j % 2 == 1 { cfg.window / 2 } else { 0 };
                blocks.push(SwinBlock::load(src, &format!("{prefix}.stages.{i}.blocks.{j}"), cfg, i, shift)?);
            }
            let downsample = if i + 1 < cfg.stages() {
                Some(PatchMerging::load(src, &format!("{prefix}.stages.{i}.downsample"), cfg, i)?)
            } else {
                None
            };
            stages.push(SwinStage { channels: cfg.channels(i), blocks, downsample });
        }
        let mut out_norms = Vec::with_capacity(cfg.out_indices.len());
        for &i in &cfg.out_indices {
            out_norms.push(layer_norm(src, &format!("{prefix}.norm{i}"), cfg.channels(i), cfg.ln_eps)?);
        }
        Ok(Self { config: cfg.clone(), patch_embed, stages, out_norms })
    }

    /// Checks normalized NHWC images `[n, h, w, in_channels]`.
    pub fn check_input(&self, x_len: usize, n: usize, h: usize, w: usize) -> Result<(), Error> {
        let c = self.config.in_channels;
        if n == 0 || h == 0 || w == 0 {
            return Err(Error::InvalidInput(format!("swin: empty image batch [{n}, {h}, {w}, {c}]")));
        }
        let want = n.checked_mul(c).and_then(|v| v.checked_mul(h)).and_then(|v| v.checked_mul(w));
        if want != Some(x_len) {
            return Err(Error::InvalidInput(format!("swin: {x_len} input values for images [{n}, {h}, {w}, {c}]")));
        }
        Ok(())
    }

    /// The outputs at `out_indices` (NHWC, after their norms) of normalized NHWC images
    /// `[n, h, w, in_channels]` (the camera preprocessing's layout; upstream's NCHW tensor
    /// transposed).
    pub fn forward(&self, x: &[f32], n: usize, h: usize, w: usize) -> Result<Vec<FeatureMap>, Error> {
        self.check_input(x.len(), n, h, w)?;
        let (mut t, mut hh, mut ww) = self.patch_embed.forward(x, n, h, w)?;
        let mut outs = Vec::with_capacity(self.out_norms.len());
        for (i, stage) in self.stages.iter().enumerate() {
            if !stage.blocks.is_empty() {
                let windows = StageWindows::build(n, hh, ww, self.config.window, stage.blocks.len() > 1)?;
                for b in &stage.blocks {
                    t = b.forward(&t, n, hh, ww, &windows)?;
                }
            }
            if let Some(k) = self.config.out_indices.iter().position(|&o| o == i) {
                let data = self.out_norms[k].forward(&t)?;
                outs.push(FeatureMap::new(n, hh, ww, stage.channels, data)?);
            }
            if let Some(d) = &stage.downsample {
                (t, hh, ww) = d.forward(&t, n, hh, ww)?;
            }
        }
        Ok(outs)
    }
}
