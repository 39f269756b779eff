//! SphereFormer's `Semantic` network (dvlab-research/SphereFormer, arch
//! `unet_spherical_transformer`) on the CPU, from weights with the upstream `state_dict` names.
//!
//! Module tree (names are upstream's; `nn.Sequential` / `SparseSequential` indices count the
//! ReLUs too, so a BN-ReLU-conv triple is `.0`, (ReLU `.1`), `.2`):
//!
//! ```text
//! input_conv.0            SubMConv3d(input_c, m, 3)                       map subm1
//! unet                    UBlock(layers), level k = 1.. (prefix `unet.` + `u.` per level down)
//!   blocks.block{i}       block_reps × ResidualBlock(C, C) (or VGGBlock)  map subm{k}
//!   transformer_block     if k in sphere_layers: x += proj(attn(norm1(x))); x += mlp(norm2(x))
//!   conv                  BN, ReLU, SparseConv3d(C, C', k2 s2)            map spconv{k}
//!   u                     the next level, on xyz/batch averaged over the conv's pairs
//!   deconv                BN, ReLU, SparseInverseConv3d(C', C, k2)        map spconv{k}, inverted
//!   blocks_tail.block{i}  on concat(skip, up): block0 2C→C (1×1 i_branch), block1 C→C
//! output_layer.0          BN + ReLU
//! linear                  Linear(m, classes)
//! ```
//!
//! ResidualBlock: `i_branch.0` (SubMConv3d 1×1, only when Cin ≠ Cout), `conv_branch` = BN(0),
//! ReLU, SubMConv3d 3(2), BN(3), ReLU, SubMConv3d 3(5); output = conv_branch(x) + i_branch(x).
//! VGGBlock: `conv_layers` = BN(0), ReLU, SubMConv3d 3(2). BatchNorm eps 1e-4, folded at load and
//! applied on the conv's input gather. The attention (heads = C / 16, half on cubic windows, half on
//! spherical ones, contextual RPE) is `ops::attention::sphere_attention_cpu`; its windows are built once
//! per level, as upstream caches them per `indice_key`.

use crate::ops::rowwise::cpu::{gelu_inplace, BatchNorm, LayerNorm, Linear};
use crate::device::range_guard::{CpuRangeScan, RangeReport};
use crate::nn::weights::{bad_weights, SpecRecorder, TensorSource as Source, WeightSpec, Weights};
use crate::nn::ModelError;
use crate::ops::attention::cpu::RpeTables;
use crate::ops::attention::sphere::{cubic_heads, sphere_attention_cpu, SphereLevel, SphereTables, SphereWindows, SPHEREFORMER_HEAD_DIM};
use crate::models::sphereformer::config::ModelYaml;
pub use crate::device::clock::{StageHook, StageTimes};
use crate::ops::sparse_conv::cpu::{conv_with, spconv_layout, to_rsck, ConvOptions, WeightLayout};
use crate::ops::sparse_conv::kernel_map::{inverse, strided, submanifold, ConvGeometry, KernelMap};
use crate::ops::sparse_conv::tensor::SparseTensor;
use crate::Error;
use std::time::Instant;

#[cfg(feature = "cuda-core")]
#[path = "network_cuda.rs"]
pub mod cuda;

/// Every tensor of the upstream `state_dict` for this config (BatchNorm's `num_batches_tracked`
/// counters excepted: they are not weights), in `state_dict` order.
pub fn weight_specs(cfg: &ModelYaml) -> Result<Vec<WeightSpec>, ModelError> {
    let mut rec = SpecRecorder::default();
    build(cfg, &mut rec)?;
    Ok(rec.0)
}

fn batch_norm(src: &mut dyn Source, prefix: &str, c: usize) -> Result<BatchNorm, ModelError> {
    let g = src.tensor(&format!("{prefix}.weight"), &[c])?;
    let b = src.tensor(&format!("{prefix}.bias"), &[c])?;
    let m = src.tensor(&format!("{prefix}.running_mean"), &[c])?;
    let v = src.tensor(&format!("{prefix}.running_var"), &[c])?;
    BatchNorm::fold(&g, &b, &m, &v).map_err(|e| bad_weights(prefix, e))
}

fn linear(src: &mut dyn Source, prefix: &str, fin: usize, fout: usize) -> Result<Linear, ModelError> {
    let w = src.tensor(&format!("{prefix}.weight"), &[fout, fin])?;
    let b = src.tensor(&format!("{prefix}.bias"), &[fout])?;
    Linear::new(w, Some(b), fin, fout).map_err(|e| bad_weights(prefix, e))
}

fn layer_norm(src: &mut dyn Source, prefix: &str, c: usize) -> Result<LayerNorm, ModelError> {
    let g = src.tensor(&format!("{prefix}.weight"), &[c])?;
    let b = src.tensor(&format!("{prefix}.bias"), &[c])?;
    LayerNorm::new(g, b).map_err(|e| bad_weights(prefix, e))
}

/// A spconv conv weight `[Cout, k, k, k, Cin]`, repacked once here to `Rsck` (the layout the
/// conv reads without copying) from the layout spconv reads it in. Every conv of the model is
/// submanifold (k 1, 3) or a k2 s2 down/inverse conv, so k = 1 is spconv's 1x1 quirk layout.
fn conv_weight(src: &mut dyn Source, name: &str, cout: usize, k: usize, cin: usize) -> Result<Vec<f32>, ModelError> {
    let w = src.tensor(name, &[cout, k, k, k, cin])?;
    let kv = k * k * k;
    to_rsck(&w, spconv_layout(kv, k != 2), kv, cin, cout).map_err(|e| bad_weights(name, e))
}

/// `ResidualBlock` or `VGGBlock`.
#[derive(Debug, Clone)]
enum Block {
    Residual {
        cin: usize,
        cout: usize,
        /// 1×1 SubMConv3d when Cin ≠ Cout, else identity.
        i_branch: Option<Vec<f32>>,
        bn1: BatchNorm,
        conv1: Vec<f32>,
        bn2: BatchNorm,
        conv2: Vec<f32>,
    },
    Vgg {
        cout: usize,
        bn: BatchNorm,
        conv: Vec<f32>,
    },
}

impl Block {
    fn load(src: &mut dyn Source, p: &str, residual: bool, cin: usize, cout: usize) -> Result<Self, ModelError> {
        if !residual {
            let bn = batch_norm(src, &format!("{p}.conv_layers.0"), cin)?;
            let conv = conv_weight(src, &format!("{p}.conv_layers.2.weight"), cout, 3, cin)?;
            return Ok(Block::Vgg { cout, bn, conv });
        }
        // Registration order: i_branch before conv_branch.
        let i_branch = if cin != cout {
            Some(conv_weight(src, &format!("{p}.i_branch.0.weight"), cout, 1, cin)?)
        } else {
            None
        };
        let bn1 = batch_norm(src, &format!("{p}.conv_branch.0"), cin)?;
        let conv1 = conv_weight(src, &format!("{p}.conv_branch.2.weight"), cout, 3, cin)?;
        let bn2 = batch_norm(src, &format!("{p}.conv_branch.3"), cout)?;
        let conv2 = conv_weight(src, &format!("{p}.conv_branch.5.weight"), cout, 3, cout)?;
        Ok(Block::Residual { cin, cout, i_branch, bn1, conv1, bn2, conv2 })
    }

    /// The block `p` (module path); its layer outputs are checked by `scan` (names as the CUDA
    /// path's: `p.i_branch.0`, `p.conv_branch.2`, `p.conv_branch.5`, `p.conv_layers.2`).
    fn forward(&self, x: &SparseTensor, maps: &LevelMaps, p: &str, scan: &mut CpuRangeScan) -> Result<SparseTensor, Error> {
        let subm = &maps.subm;
        match self {
            Block::Vgg { cout, bn, conv } => {
                let f = conv_with(x, subm, conv, WeightLayout::Rsck, x.channels(), *cout, &pre(bn))?;
                scan.check(&f, || format!("{p}.conv_layers.2"));
                x.with_feats(f, *cout)
            }
            Block::Residual { cin, cout, i_branch, bn1, conv1, bn2, conv2 } => {
                let identity = match i_branch {
                    None => x.feats().to_vec(),
                    Some(w) => {
                        let one = maps.one_by_one(x)?;
                        let f = conv_with(x, one, w, WeightLayout::Rsck, *cin, *cout, &ConvOptions::default())?;
                        scan.check(&f, || format!("{p}.i_branch.0"));
                        f
                    }
                };
                let h = conv_with(x, subm, conv1, WeightLayout::Rsck, *cin, *cout, &pre(bn1))?;
                scan.check(&h, || format!("{p}.conv_branch.2"));
                let h = x.with_feats(h, *cout)?;
                let opts = ConvOptions { residual: Some(&identity), ..pre(bn2) };
                let f = conv_with(&h, subm, conv2, WeightLayout::Rsck, *cout, *cout, &opts)?;
                scan.check(&f, || format!("{p}.conv_branch.5"));
                x.with_feats(f, *cout)
            }
        }
    }
}

fn pre(bn: &BatchNorm) -> ConvOptions<'_> {
    ConvOptions { pre: Some(bn.pre_relu()), ..Default::default() }
}

/// The kernel maps of one level: the 3×3×3 submanifold map every block shares (`subm{k}`) and,
/// for `blocks_tail.block0`'s 1×1 i_branch, the identity map (spconv builds no pairs for it).
struct LevelMaps {
    subm: KernelMap,
    one: std::sync::OnceLock<KernelMap>,
}

impl LevelMaps {
    fn new(x: &SparseTensor) -> Result<Self, Error> {
        Ok(Self { subm: submanifold(x, [3; 3], [1; 3])?, one: std::sync::OnceLock::new() })
    }

    fn one_by_one(&self, x: &SparseTensor) -> Result<&KernelMap, Error> {
        if let Some(m) = self.one.get() {
            return Ok(m);
        }
        let m = submanifold(x, [1; 3], [1; 3])?;
        Ok(self.one.get_or_init(|| m))
    }
}

/// SphereFormer's transformer block (`SphereFormer` + `SparseMultiheadSASphereConcat`).
#[derive(Debug, Clone)]
struct TransformerBlock {
    level: SphereLevel,
    channels: usize,
    heads: usize,
    head_dim: usize,
    norm1: LayerNorm,
    /// Tables `[rows, 3, heads_of_branch, head_dim]`: query, key, value.
    cubic: [Vec<f32>; 3],
    sphere: [Vec<f32>; 3],
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// Heads and head width of a level with `c` channels (`num_heads = C // 16`,
/// `head_dim = C // num_heads`, and upstream's reshape needs `heads · head_dim = C`).
fn heads_of(c: usize, level: usize) -> Result<(usize, usize), ModelError> {
    let heads = c / SPHEREFORMER_HEAD_DIM;
    if heads == 0 || !c.is_multiple_of(heads) {
        return Err(ModelError::Config(format!(
            "level {level} has {c} channels: a SphereFormer attention level needs at least {SPHEREFORMER_HEAD_DIM} \
             channels and a multiple of C / {SPHEREFORMER_HEAD_DIM} heads"
        )));
    }
    Ok((heads, c / heads))
}

impl TransformerBlock {
    fn load(src: &mut dyn Source, p: &str, cfg: &ModelYaml, level: usize, c: usize) -> Result<Self, ModelError> {
        let (heads, head_dim) = heads_of(c, level)?;
        let lv = SphereLevel::from_model(cfg, level).map_err(|e| ModelError::Config(format!("level {level}: {e}")))?;
        let (hc, hs) = (cubic_heads(heads), heads - cubic_heads(heads));
        let cubic_rows = 2 * lv.cubic_grid_length as usize - 1;
        let sphere_rows = 2 * lv.sphere_grid_length as usize;
        let norm1 = layer_norm(src, &format!("{p}.norm1"), c)?;
        let mut table = |kind: &str, suffix: &str, rows: usize, h: usize| {
            src.tensor(&format!("{p}.attn.relative_pos_{kind}_table{suffix}"), &[rows, 3, h, head_dim])
        };
        let cubic = [table("query", "", cubic_rows, hc)?, table("key", "", cubic_rows, hc)?, table("value", "", cubic_rows, hc)?];
        let sphere = [
            table("query", "_sphere", sphere_rows, hs)?,
            table("key", "_sphere", sphere_rows, hs)?,
            table("value", "_sphere", sphere_rows, hs)?,
        ];
        let qkv = linear(src, &format!("{p}.attn.qkv"), c, 3 * c)?;
        let proj = linear(src, &format!("{p}.attn.proj"), c, c)?;
        let norm2 = layer_norm(src, &format!("{p}.norm2"), c)?;
        // `mlp_ratio = 4.0`: hidden = int(C * 4.0).
        let fc1 = linear(src, &format!("{p}.mlp.fc1"), c, 4 * c)?;
        let fc2 = linear(src, &format!("{p}.mlp.fc2"), 4 * c, c)?;
        Ok(Self { level: lv, channels: c, heads, head_dim, norm1, cubic, sphere, qkv, proj, norm2, fc1, fc2 })
    }

    /// `x + proj(attn(norm1(x)))`, then `+ fc2(gelu(fc1(norm2(·))))`; the block is `p`, its
    /// layer outputs checked by `scan`.
    fn forward(&self, x: &[f32], xyz: &[[f32; 3]], windows: &SphereWindows, p: &str, scan: &mut CpuRangeScan) -> Result<Vec<f32>, Error> {
        let (c, n) = (self.channels, xyz.len());
        let h = self.norm1.forward(x)?;
        scan.check(&h, || format!("{p}.norm1"));
        let qkv = self.qkv.forward(&h)?;
        scan.check(&qkv, || format!("{p}.attn.qkv"));
        // qkv row = [q | k | v], each `[heads, head_dim]` (upstream reshape (N, 3, H, D)).
        let mut q = vec![0f32; n * c];
        let mut k = vec![0f32; n * c];
        let mut v = vec![0f32; n * c];
        let scale = (self.head_dim as f32).powf(-0.5);
        for i in 0..n {
            let row = &qkv[i * 3 * c..(i + 1) * 3 * c];
            for j in 0..c {
                q[i * c + j] = row[j] * scale;
            }
            k[i * c..(i + 1) * c].copy_from_slice(&row[c..2 * c]);
            v[i * c..(i + 1) * c].copy_from_slice(&row[2 * c..]);
        }
        let tables = SphereTables {
            cubic: RpeTables { q: &self.cubic[0], k: &self.cubic[1], v: &self.cubic[2] },
            sphere: RpeTables { q: &self.sphere[0], k: &self.sphere[1], v: &self.sphere[2] },
        };
        let att = sphere_attention_cpu(&q, &k, &v, self.heads, self.head_dim, xyz, windows, tables)?;
        scan.check(&att, || format!("{p}.attn"));
        let mut y = self.proj.forward(&att)?;
        add_inplace(&mut y, x);
        scan.check(&y, || format!("{p}.attn.proj"));
        let h = self.norm2.forward(&y)?;
        scan.check(&h, || format!("{p}.norm2"));
        let mut h = self.fc1.forward(&h)?;
        gelu_inplace(&mut h);
        scan.check(&h, || format!("{p}.mlp.fc1"));
        let mut out = self.fc2.forward(&h)?;
        add_inplace(&mut out, &y);
        scan.check(&out, || format!("{p}.mlp.fc2"));
        Ok(out)
    }
}

fn add_inplace(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += *s;
    }
}

/// The down path of a level that is not the last one.
#[derive(Debug, Clone)]
struct Down {
    bn: BatchNorm,
    conv: Vec<f32>,
    next: Box<UBlock>,
    up_bn: BatchNorm,
    deconv: Vec<f32>,
    tail: Vec<Block>,
}

/// One U-Net level (upstream `UBlock`; level 1 is `unet`, each deeper one its parent's `u`).
#[derive(Debug, Clone)]
struct UBlock {
    /// Module path (`unet`, `unet.u`, ...): the prefix of its layers' names in range reports.
    name: String,
    level: usize,
    channels: usize,
    blocks: Vec<Block>,
    transformer: Option<TransformerBlock>,
    down: Option<Down>,
}

/// SphereFormer's down conv: kernel 2, stride 2, no padding (`SparseConv3d(k=2, s=2)`).
const DOWN: ConvGeometry = ConvGeometry { kernel: [2; 3], stride: [2; 3], padding: [0; 3], dilation: [1; 3] };

impl UBlock {
    fn load(src: &mut dyn Source, p: &str, cfg: &ModelYaml, level: usize) -> Result<Self, ModelError> {
        let planes = &cfg.layers[level - 1..];
        let c = planes[0];
        let mut blocks = Vec::with_capacity(cfg.block_reps);
        for i in 0..cfg.block_reps {
            blocks.push(Block::load(src, &format!("{p}.blocks.block{i}"), cfg.block_residual, c, c)?);
        }
        let transformer = if cfg.sphere_layers.contains(&level) {
            Some(TransformerBlock::load(src, &format!("{p}.transformer_block"), cfg, level, c)?)
        } else {
            None
        };
        let down = if planes.len() > 1 {
            let c1 = planes[1];
            let bn = batch_norm(src, &format!("{p}.conv.0"), c)?;
            let conv = conv_weight(src, &format!("{p}.conv.2.weight"), c1, 2, c)?;
            let next = Box::new(UBlock::load(src, &format!("{p}.u"), cfg, level + 1)?);
            let up_bn = batch_norm(src, &format!("{p}.deconv.0"), c1)?;
            let deconv = conv_weight(src, &format!("{p}.deconv.2.weight"), c, 2, c1)?;
            let mut tail = Vec::with_capacity(cfg.block_reps);
            for i in 0..cfg.block_reps {
                // Upstream: block(nPlanes[0] * (2 - i), nPlanes[0]); block_reps ≤ 2 is checked.
                tail.push(Block::load(src, &format!("{p}.blocks_tail.block{i}"), cfg.block_residual, c * (2 - i), c)?);
            }
            Some(Down { bn, conv, next, up_bn, deconv, tail })
        } else {
            None
        };
        Ok(Self { name: p.to_string(), level, channels: c, blocks, transformer, down })
    }

    fn forward(&self, x: SparseTensor, xyz: &[[f32; 3]], batch: &[i32], t: &mut StageTimes, scan: &mut CpuRangeScan) -> Result<SparseTensor, Error> {
        let k = self.level;
        let p = &self.name;
        let start = Instant::now();
        let maps = LevelMaps::new(&x)?;
        let mut x = x;
        for (i, b) in self.blocks.iter().enumerate() {
            x = b.forward(&x, &maps, &format!("{p}.blocks.block{i}"), scan)?;
        }
        t.record(format!("l{k}.blocks"), start);
        if let Some(tr) = &self.transformer {
            let start = Instant::now();
            let windows = SphereWindows::build(xyz, batch, &tr.level)?;
            let f = tr.forward(x.feats(), xyz, &windows, &format!("{p}.transformer_block"), scan)?;
            x = x.with_feats(f, self.channels)?;
            t.record(format!("l{k}.attention"), start);
        }
        let Some(d) = &self.down else { return Ok(x) };
        let start = Instant::now();
        let map = strided(&x, DOWN)?;
        let cout = d.next.channels;
        let coarse = conv_with(&x, &map, &d.conv, WeightLayout::Rsck, self.channels, cout, &pre(&d.bn))?;
        scan.check(&coarse, || format!("{p}.conv.2"));
        let coarse = map.output_tensor(coarse, cout)?;
        let (xyz_next, batch_next) = downsample_positions(&map, xyz)?;
        t.record(format!("l{k}.down"), start);
        let deep = d.next.forward(coarse, &xyz_next, &batch_next, t, scan)?;
        let start = Instant::now();
        let inv = inverse(&map)?;
        let up = conv_with(&deep, &inv, &d.deconv, WeightLayout::Rsck, cout, self.channels, &pre(&d.up_bn))?;
        scan.check(&up, || format!("{p}.deconv.2"));
        let cat = concat_channels(x.feats(), self.channels, &up, self.channels);
        let mut y = x.with_feats(cat, 2 * self.channels)?;
        t.record(format!("l{k}.up"), start);
        let start = Instant::now();
        for (i, b) in d.tail.iter().enumerate() {
            y = b.forward(&y, &maps, &format!("{p}.blocks_tail.block{i}"), scan)?;
        }
        t.record(format!("l{k}.tail"), start);
        Ok(y)
    }
}

/// Row-wise `[a | b]`.
fn concat_channels(a: &[f32], ca: usize, b: &[f32], cb: usize) -> Vec<f32> {
    let n = a.len() / ca;
    let mut out = Vec::with_capacity(n * (ca + cb));
    for i in 0..n {
        out.extend_from_slice(&a[i * ca..(i + 1) * ca]);
        out.extend_from_slice(&b[i * cb..(i + 1) * cb]);
    }
    out
}

/// Upstream `get_downsample_info`: the next level's xyz is the float32 mean of the xyz of every
/// (input → output) pair of the down conv, summed offset after offset in pair order. Its batch
/// is the mean of the inputs' batch indices truncated to an integer: a strided conv never mixes
/// batches, so that mean is exactly the output's own batch index, which is what is returned.
pub fn downsample_positions(map: &KernelMap, xyz: &[[f32; 3]]) -> Result<(Vec<[f32; 3]>, Vec<i32>), Error> {
    if xyz.len() != map.in_count() {
        return Err(Error::InvalidInput(format!(
            "downsample: {} positions for {} input sites",
            xyz.len(),
            map.in_count()
        )));
    }
    let n = map.out_count();
    let mut sum = vec![[0f32; 3]; n];
    let mut count = vec![0u32; n];
    for list in &map.pairs {
        for &(i, o) in list {
            let (i, o) = (i as usize, o as usize);
            for a in 0..3 {
                sum[o][a] += xyz[i][a];
            }
            count[o] += 1;
        }
    }
    // Every strided output has at least one pair (it exists because an input reached it).
    let xyz_next = sum
        .iter()
        .zip(&count)
        .map(|(s, &c)| s.map(|v| v / c.max(1) as f32))
        .collect();
    let batch_next = map.out_coords.iter().map(|c| c[0]).collect();
    Ok((xyz_next, batch_next))
}

/// The stages a CPU segmentation records, in order: `voxelize`, the network's
/// ([`SphereFormer::forward_cpu_timed`]: `input_conv`, per level down the U-Net `l<k>.blocks`,
/// `l<k>.attention` on `sphere_layers`, `l<k>.down` but on the last level, then back up
/// `l<k>.up`, `l<k>.tail`, and `head`), `devoxelize`.
pub fn cpu_stage_names(cfg: &ModelYaml) -> Vec<String> {
    let levels = cfg.layers.len();
    let mut names = vec!["voxelize".to_string(), "input_conv".to_string()];
    for k in 1..=levels {
        names.push(format!("l{k}.blocks"));
        if cfg.sphere_layers.contains(&k) {
            names.push(format!("l{k}.attention"));
        }
        if k < levels {
            names.push(format!("l{k}.down"));
        }
    }
    for k in (1..levels).rev() {
        names.push(format!("l{k}.up"));
        names.push(format!("l{k}.tail"));
    }
    names.extend(["head".to_string(), "devoxelize".to_string()]);
    names
}

/// The network with BatchNorm folded, ready to run.
#[derive(Debug, Clone)]
pub struct SphereFormer {
    input_c: usize,
    m: usize,
    classes: usize,
    input_conv: Vec<f32>,
    unet: UBlock,
    output_bn: BatchNorm,
    linear: Linear,
}

/// Upstream configurations the `Semantic` constructor or forward would reject.
fn check_config(cfg: &ModelYaml) -> Result<(), ModelError> {
    if cfg.layers.first() != Some(&cfg.m) {
        return Err(ModelError::Config(format!(
            "`m` ({}) must equal `layers[0]` ({:?}): input_conv's output feeds the first level",
            cfg.m,
            cfg.layers.first()
        )));
    }
    if cfg.block_reps > 2 && cfg.layers.len() > 1 {
        return Err(ModelError::Config(format!(
            "block_reps {} > 2: upstream's blocks_tail.block2 would have 0 input channels",
            cfg.block_reps
        )));
    }
    if !(cfg.rel_query && cfg.rel_key && cfg.rel_value) {
        return Err(ModelError::Config("upstream supports only rel_query = rel_key = rel_value = true".into()));
    }
    if cfg.layers.contains(&0) || cfg.classes == 0 || cfg.input_c == 0 {
        return Err(ModelError::Config("channels, classes and input_c must be > 0".into()));
    }
    Ok(())
}

fn build(cfg: &ModelYaml, src: &mut dyn Source) -> Result<SphereFormer, ModelError> {
    check_config(cfg)?;
    let input_conv = conv_weight(src, "input_conv.0.weight", cfg.m, 3, cfg.input_c)?;
    let unet = UBlock::load(src, "unet", cfg, 1)?;
    let output_bn = batch_norm(src, "output_layer.0", cfg.m)?;
    let linear = linear(src, "linear", cfg.m, cfg.classes)?;
    Ok(SphereFormer { input_c: cfg.input_c, m: cfg.m, classes: cfg.classes, input_conv, unet, output_bn, linear })
}

impl SphereFormer {
    /// Builds the network from weights: every tensor is checked first (one error lists all
    /// missing, unexpected and mis-shaped ones), then BatchNorm is folded.
    pub fn from_weights(cfg: &ModelYaml, mut weights: Weights) -> Result<Self, ModelError> {
        weights.check(&weight_specs(cfg)?)?;
        build(cfg, &mut weights)
    }

    pub fn classes(&self) -> usize {
        self.classes
    }
    pub fn input_channels(&self) -> usize {
        self.input_c
    }

    /// Logits `[N, classes]` for N voxels: coordinates `[b, x, y, z]` in `[0, spatial_shape)`,
    /// features `[N, input_c]`, positions `xyz` (metres) and batch index per voxel (equal to
    /// `coords[i][0]`, as upstream asserts). Rows of the output follow the input rows. Errors on
    /// zero voxels, duplicate or out-of-range coordinates and mismatched lengths.
    pub fn forward_cpu(
        &self,
        coords: &[[i32; 4]],
        feats: &[f32],
        xyz: &[[f32; 3]],
        batch: &[i32],
        spatial_shape: [i32; 3],
    ) -> Result<Vec<f32>, Error> {
        self.forward_cpu_timed(coords, feats, xyz, batch, spatial_shape, &mut StageTimes::default())
    }

    /// [`forward_cpu`](Self::forward_cpu) recording per-stage wall times into `t` (the range
    /// guard's report is dropped: see [`forward_cpu_checked`](Self::forward_cpu_checked)).
    pub fn forward_cpu_timed(
        &self,
        coords: &[[i32; 4]],
        feats: &[f32],
        xyz: &[[f32; 3]],
        batch: &[i32],
        spatial_shape: [i32; 3],
        t: &mut StageTimes,
    ) -> Result<Vec<f32>, Error> {
        self.forward_cpu_checked(coords, feats, xyz, batch, spatial_shape, t).map(|(logits, _)| logits)
    }

    /// [`forward_cpu_timed`](Self::forward_cpu_timed) and the range guard's report: the layers
    /// (upstream module paths, in execution order, as the CUDA path names them) whose f32 output
    /// held a NaN or an infinity, `input` for the input features.
    pub fn forward_cpu_checked(
        &self,
        coords: &[[i32; 4]],
        feats: &[f32],
        xyz: &[[f32; 3]],
        batch: &[i32],
        spatial_shape: [i32; 3],
        t: &mut StageTimes,
    ) -> Result<(Vec<f32>, RangeReport), Error> {
        let n = coords.len();
        self.check_inputs(coords, feats, xyz, batch)?;
        let mut scan = CpuRangeScan::new();
        let start = Instant::now();
        scan.check(feats, || "input".into());
        let x = SparseTensor::new(coords.to_vec(), feats.to_vec(), self.input_c, spatial_shape)?;
        let subm1 = submanifold(&x, [3; 3], [1; 3])?;
        let f = conv_with(&x, &subm1, &self.input_conv, WeightLayout::Rsck, self.input_c, self.m, &ConvOptions::default())?;
        scan.check(&f, || "input_conv.0".into());
        let x = x.with_feats(f, self.m)?;
        t.record("input_conv", start);
        let y = self.unet.forward(x, xyz, batch, t, &mut scan)?;
        let start = Instant::now();
        let mut h = y.into_feats();
        self.output_bn.relu_inplace(&mut h)?;
        scan.check(&h, || "output_layer.0".into());
        let logits = self.linear.forward(&h)?;
        scan.check(&logits, || "linear".into());
        t.record("head", start);
        debug_assert_eq!(logits.len(), n * self.classes);
        Ok((logits, scan.finish()))
    }

    fn check_inputs(&self, coords: &[[i32; 4]], feats: &[f32], xyz: &[[f32; 3]], batch: &[i32]) -> Result<(), Error> {
        check_inputs(self.input_c, coords, feats, xyz, batch)
    }
}

/// The forward's input checks (CPU and CUDA): lengths, batch indices, finite positions.
fn check_inputs(input_c: usize, coords: &[[i32; 4]], feats: &[f32], xyz: &[[f32; 3]], batch: &[i32]) -> Result<(), Error> {
    let n = coords.len();
    if n == 0 {
        return Err(Error::InvalidInput("SphereFormer forward: no voxels".into()));
    }
    if feats.len() != n * input_c || xyz.len() != n || batch.len() != n {
        return Err(Error::InvalidInput(format!(
            "SphereFormer forward: {n} coordinates, {} feature values (input_c {}), {} positions, {} batch indices",
            feats.len(),
            input_c,
            xyz.len(),
            batch.len()
        )));
    }
    if let Some(i) = (0..n).find(|&i| coords[i][0] != batch[i]) {
        return Err(Error::InvalidInput(format!(
            "SphereFormer forward: voxel {i} has batch {} in its coordinate but {} in `batch`",
            coords[i][0], batch[i]
        )));
    }
    if let Some(i) = xyz.iter().position(|p| p.iter().any(|v| !v.is_finite())) {
        return Err(Error::InvalidInput(format!("SphereFormer forward: xyz of voxel {i} is not finite")));
    }
    Ok(())
}
