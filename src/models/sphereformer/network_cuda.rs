//! SphereFormer on CUDA: the network of `sphereformer.rs`, uploaded once, with FP16 activations
//! and FP32 accumulation everywhere; or, as `CudaSphereFormer<half::bf16>`, BF16 activations and
//! weights (precision `bf16`, see [`crate::device::storage`]): the same code over the other
//! element type, which picks the kernels' BF16 builds and cuBLAS's BF16 GEMM. The input features
//! stay FP16 in both (the voxelization stores them); the input pad converts them.
//!
//! What runs where:
//! - kernel maps: `ops::sparse_conv::kernel_map_cuda` (submanifold 3×3×3 per level, the 1×1 one of
//!   `blocks_tail.block0`, the k2 s2 down map and its inverse), built once per forward;
//! - convolutions: `ops::sparse_conv::cuda` with the folded BatchNorm + ReLU applied on the gather and
//!   the residual added in the epilogue, exactly as the CPU path's `conv_with` options;
//! - attention: `ops::attention::cuda` (windows built once per level, both window kinds);
//! - Linear: cuBLAS GEMM (FP16 in, FP32 out) followed by `linear_epilogue` (bias, q scale, GELU,
//!   residual, FP16 out); LayerNorm, BatchNorm + ReLU, concatenation and the next level's voxel
//!   positions: `kernels/ops/rowwise.cu`.
//!
//! The head's logits are FP32 (GEMM output + bias), copied back for the arg-max.
//!
//! FP16 range guard ([`crate::device::range_guard`]): every launch that stores an FP16 activation
//! reports values out of FP16's range under its layer's id, registered at upload in execution
//! order with the upstream module path of the tensor (a conv under its own path, its
//! pre-activation pass under the BatchNorm's, e.g. `unet.blocks.block0.conv_branch.0` and
//! `.conv_branch.2`; `input` is the voxel features the network reads, `linear` the logits,
//! flagged only when not finite). One flag buffer per forward; its readback is enqueued after
//! the head and read once the frame's outputs are on the host.

use crate::models::sphereformer::network::{check_inputs, Block, Down, SphereFormer, StageTimes, TransformerBlock, UBlock, DOWN};
use crate::ops::attention::cuda::{sphere_attention_cuda_guarded, CudaSphereTables, CudaSphereWindows, QkvView};
use crate::ops::attention::sphere::SphereLevel;
use crate::device::clock::GpuClock;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::grid_1d;
use crate::device::range::{PendingRange, RangeFlags, RangeReadback, RangeSlot};
use crate::device::storage::Store;
use crate::ops::rowwise::cpu::BatchNorm;
use crate::models::sphereformer::preprocess::cuda::{CudaNetworkInputs, CudaPointMap};
use crate::device::range_guard::{LayerId, LayerNames, RangeReport};
use crate::ops::sparse_conv::cpu::WeightLayout;
use crate::ops::sparse_conv::cuda::{conv_cuda_guarded, ConvAlgo, ConvRange, CudaConvWeights, CudaPreActivation};
use crate::ops::sparse_conv::kernel_map_cuda::{inverse_cuda, strided_cuda_sites, submanifold_cuda_sites, CudaKernelMap, CudaSites};
use crate::ops::sparse_conv::tensor::{validate_geometry, validate_sites};
use crate::Error;
use crate::ops::rowwise::cuda::{elements, epilogue_guarded, qkv_epilogue_guarded, up_f16, up_f32, GpuLayerNorm, GpuLinear};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, PushKernelArg};
use half::f16;
use std::sync::Arc;

const THREADS: u32 = 256;

/// A conv with the best kernel for its weights and map (as `conv_cuda`, or `conv_cuda_post` with
/// `post`), guarded: its output under `conv`, a pre-activation pass under `pre`.
#[allow(clippy::too_many_arguments)]
fn conv<S: Store>(
    dev: &CudaDevice,
    x: &CudaSlice<S>,
    map: &CudaKernelMap,
    w: &CudaConvWeights<S>,
    pre: Option<&CudaPreActivation<'_>>,
    residual: Option<&CudaSlice<S>>,
    post: Option<&CudaPreActivation<'_>>,
    flags: &RangeFlags,
    conv: LayerId,
    pre_id: Option<LayerId>,
) -> Result<CudaSlice<S>, Error> {
    let range = ConvRange { conv: Some(flags.slot(conv)?), pre: pre_id.map(|p| flags.slot(p)).transpose()? };
    let algo = ConvAlgo::best_for_weights(w, map.out_count);
    conv_cuda_guarded(dev, x, map, w, pre, residual, algo, None, post, range)
}

/// Folded BatchNorm: per-channel scale and shift.
struct GpuBatchNorm {
    scale: CudaSlice<f32>,
    shift: CudaSlice<f32>,
}

impl GpuBatchNorm {
    fn upload(dev: &CudaDevice, bn: &BatchNorm) -> Result<Self, Error> {
        Ok(Self { scale: up_f32(dev, &bn.scale, "batch norm")?, shift: up_f32(dev, &bn.shift, "batch norm")? })
    }
    fn pre_relu(&self) -> CudaPreActivation<'_> {
        CudaPreActivation { scale: &self.scale, shift: &self.shift, relu: true }
    }
}

/// A residual block's guarded layers (module paths under the block's `p`): the i_branch conv
/// (`p.i_branch.0`), conv1's input BN + ReLU pass (`p.conv_branch.0`), conv1 with bn2 + ReLU in
/// its epilogue (`p.conv_branch.2`), conv2 plus the identity, the block's output
/// (`p.conv_branch.5`); a VGG block's: its BN + ReLU pass (`p.conv_layers.0`) and conv
/// (`p.conv_layers.2`).
enum GpuBlock<S: Store> {
    Residual {
        i_branch: Option<(CudaConvWeights<S>, LayerId)>,
        bn1: GpuBatchNorm,
        conv1: CudaConvWeights<S>,
        bn2: GpuBatchNorm,
        conv2: CudaConvWeights<S>,
        /// `conv_branch.0`, `.2`, `.5`.
        ids: [LayerId; 3],
    },
    Vgg {
        bn: GpuBatchNorm,
        conv: CudaConvWeights<S>,
        /// `conv_layers.0`, `.2`.
        ids: [LayerId; 2],
    },
}

impl<S: Store> GpuBlock<S> {
    /// The block `p` (module path); its layers are registered in `names` in execution order.
    fn upload(dev: &CudaDevice, b: &Block, p: &str, names: &mut LayerNames) -> Result<Self, Error> {
        let w = |w: &[f32], kv, cin, cout| CudaConvWeights::<S>::upload_store(dev, w, WeightLayout::Rsck, kv, cin, cout, None);
        Ok(match b {
            Block::Residual { cin, cout, i_branch, bn1, conv1, bn2, conv2 } => {
                let i_branch = match i_branch.as_deref() {
                    Some(x) => Some((w(x, 1, *cin, *cout)?, names.add(format!("{p}.i_branch.0")))),
                    None => None,
                };
                let ids = [
                    names.add(format!("{p}.conv_branch.0")),
                    names.add(format!("{p}.conv_branch.2")),
                    names.add(format!("{p}.conv_branch.5")),
                ];
                GpuBlock::Residual {
                    i_branch,
                    bn1: GpuBatchNorm::upload(dev, bn1)?,
                    conv1: w(conv1, 27, *cin, *cout)?,
                    bn2: GpuBatchNorm::upload(dev, bn2)?,
                    conv2: w(conv2, 27, *cout, *cout)?,
                    ids,
                }
            }
            Block::Vgg { cout, bn, conv } => {
                let cin = bn.channels();
                let ids = [names.add(format!("{p}.conv_layers.0")), names.add(format!("{p}.conv_layers.2"))];
                GpuBlock::Vgg { bn: GpuBatchNorm::upload(dev, bn)?, conv: w(conv, 27, cin, *cout)?, ids }
            }
        })
    }

    /// `maps.one` is built on first use (only `blocks_tail.block0` has a 1×1 i_branch).
    fn forward(&self, dev: &CudaDevice, x: &CudaSlice<S>, maps: &mut GpuLevelMaps, flags: &RangeFlags) -> Result<CudaSlice<S>, Error> {
        match self {
            GpuBlock::Vgg { bn, conv: w, ids } => conv(dev, x, &maps.subm, w, Some(&bn.pre_relu()), None, None, flags, ids[1], Some(ids[0])),
            GpuBlock::Residual { i_branch, bn1, conv1, bn2, conv2, ids } => {
                let projected = match i_branch {
                    Some((w, id)) => Some(conv(dev, x, maps.one_by_one(dev)?, w, None, None, None, flags, *id, None)?),
                    None => None,
                };
                let identity = projected.as_ref().unwrap_or(x);
                // conv1's output feeds only conv2, so bn2 + ReLU run in conv1's epilogue
                let h = conv(dev, x, &maps.subm, conv1, Some(&bn1.pre_relu()), None, Some(&bn2.pre_relu()), flags, ids[1], Some(ids[0]))?;
                conv(dev, &h, &maps.subm, conv2, None, Some(identity), None, flags, ids[2], None)
            }
        }
    }
}

/// A level's kernel maps: the 3×3×3 submanifold map (holding the level's sites) and, when asked,
/// the 1×1 one.
struct GpuLevelMaps {
    subm: CudaKernelMap,
    one: Option<CudaKernelMap>,
}

impl GpuLevelMaps {
    fn one_by_one(&mut self, dev: &CudaDevice) -> Result<&CudaKernelMap, Error> {
        if self.one.is_none() {
            self.one = Some(submanifold_cuda_sites(dev, self.subm.out.clone(), [1; 3], [1; 3])?);
        }
        self.one.as_ref().ok_or_else(|| Error::Cuda("1x1 kernel map missing".into()))
    }
}

/// A transformer block's guarded layers, under its `p`: `p.norm1`, `p.attn.qkv` (q, k and v),
/// `p.attn` (the window attention's output, before proj), `p.attn.proj` (plus the block's input),
/// `p.norm2`, `p.mlp.fc1` (with the GELU), `p.mlp.fc2` (plus `x + attn`: the block's output).
struct TransformerIds {
    norm1: LayerId,
    qkv: LayerId,
    attn: LayerId,
    proj: LayerId,
    norm2: LayerId,
    fc1: LayerId,
    fc2: LayerId,
}

impl TransformerIds {
    fn register(p: &str, names: &mut LayerNames) -> Self {
        let mut add = |s: &str| names.add(format!("{p}.{s}"));
        Self {
            norm1: add("norm1"),
            qkv: add("attn.qkv"),
            attn: add("attn"),
            proj: add("attn.proj"),
            norm2: add("norm2"),
            fc1: add("mlp.fc1"),
            fc2: add("mlp.fc2"),
        }
    }
}

struct GpuTransformer<S: Store> {
    ids: TransformerIds,
    level: SphereLevel,
    heads: usize,
    head_dim: usize,
    norm1: GpuLayerNorm,
    tables: CudaSphereTables,
    qkv: GpuLinear<S>,
    proj: GpuLinear<S>,
    norm2: GpuLayerNorm,
    fc1: GpuLinear<S>,
    fc2: GpuLinear<S>,
}

impl<S: Store> GpuTransformer<S> {
    fn upload(dev: &CudaDevice, t: &TransformerBlock, p: &str, names: &mut LayerNames) -> Result<Self, Error> {
        let c = &t.cubic;
        let s = &t.sphere;
        Ok(Self {
            ids: TransformerIds::register(p, names),
            level: t.level.clone(),
            heads: t.heads,
            head_dim: t.head_dim,
            norm1: GpuLayerNorm::upload(dev, &t.norm1)?,
            tables: CudaSphereTables::upload(dev, [&c[0], &c[1], &c[2]], [&s[0], &s[1], &s[2]])?,
            qkv: GpuLinear::upload(dev, &t.qkv, 3)?,
            proj: GpuLinear::upload(dev, &t.proj, 1)?,
            norm2: GpuLayerNorm::upload(dev, &t.norm2)?,
            fc1: GpuLinear::upload(dev, &t.fc1, 1)?,
            fc2: GpuLinear::upload(dev, &t.fc2, 1)?,
        })
    }

    /// `x + proj(attn(norm1(x)))`, then `+ fc2(gelu(fc1(norm2(·))))`, as the CPU path.
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        dev: &CudaDevice,
        blas: &CudaBlas,
        x: &CudaSlice<S>,
        n: usize,
        xyz: &CudaSlice<f32>,
        windows: &CudaSphereWindows,
        flags: &RangeFlags,
    ) -> Result<CudaSlice<S>, Error> {
        let c = self.heads * self.head_dim;
        let id = &self.ids;
        let h = self.norm1.forward_guarded(dev, x, n, Some(flags.slot(id.norm1)?))?;
        let acc = self.qkv.gemm(dev, blas, &h, n)?;
        let scale = (self.head_dim as f32).powf(-0.5);
        let qkv = flags.slot(id.qkv)?;
        let b = &self.qkv.bias;
        let [q, k, v] = qkv_epilogue_guarded::<S>(dev, &acc, n, [&b[0], &b[1], &b[2]], scale, Some(qkv))?;
        drop(acc);
        // SAFETY: the cubic and the spherical heads together write every voxel's c values.
        let mut att = unsafe { dev.alloc_uninit::<S>(n * c, "attention output") }?;
        let qkv_view = QkvView { q: &q, k: &k, v: &v, ld: c };
        let attn = Some(flags.slot(id.attn)?);
        sphere_attention_cuda_guarded(dev, qkv_view, self.heads, self.head_dim, xyz, windows, &self.tables, &mut att, attn)?;
        drop((q, k, v));
        let acc = self.proj.gemm(dev, blas, &att, n)?;
        let y = epilogue_guarded::<S>(dev, &acc, c, 0, n, &self.proj.bias[0], 1.0, false, Some(x), Some(flags.slot(id.proj)?))?;
        let h = self.norm2.forward_guarded(dev, &y, n, Some(flags.slot(id.norm2)?))?;
        let acc = self.fc1.gemm(dev, blas, &h, n)?;
        let hidden = epilogue_guarded::<S>(dev, &acc, self.fc1.fout, 0, n, &self.fc1.bias[0], 1.0, true, None, Some(flags.slot(id.fc1)?))?;
        let acc = self.fc2.gemm(dev, blas, &hidden, n)?;
        epilogue_guarded::<S>(dev, &acc, c, 0, n, &self.fc2.bias[0], 1.0, false, Some(&y), Some(flags.slot(id.fc2)?))
    }
}

/// A level's way down and up; guarded layers under the level's `p`: the down conv's BN + ReLU
/// pass (`p.conv.0`) and conv (`p.conv.2`), the up conv's (`p.deconv.0`, `p.deconv.2`); the
/// concatenation copies guarded values and has none.
struct GpuDown<S: Store> {
    bn: GpuBatchNorm,
    conv: CudaConvWeights<S>,
    /// `conv.0`, `conv.2`.
    conv_ids: [LayerId; 2],
    next: Box<GpuUBlock<S>>,
    up_bn: GpuBatchNorm,
    deconv: CudaConvWeights<S>,
    /// `deconv.0`, `deconv.2`.
    deconv_ids: [LayerId; 2],
    tail: Vec<GpuBlock<S>>,
}

struct GpuUBlock<S: Store> {
    level: usize,
    channels: usize,
    blocks: Vec<GpuBlock<S>>,
    transformer: Option<GpuTransformer<S>>,
    down: Option<GpuDown<S>>,
}

/// One level's voxels on the device: sites (coordinates + hash), their grid, positions, batch.
struct GpuLevel {
    sites: LevelSites,
    origin: [i32; 3],
    spatial_shape: [i32; 3],
    xyz: CudaSlice<f32>,
    batch: CudaSlice<i32>,
    n: usize,
}

/// A level's sites, or their submanifold 3×3×3 map when a caller built it already (the input
/// conv's map is level 1's: the same sites, kernel and dilation).
enum LevelSites {
    Sites(Arc<CudaSites>),
    Map(CudaKernelMap),
}

impl LevelSites {
    fn submanifold_map(self, dev: &CudaDevice) -> Result<CudaKernelMap, Error> {
        match self {
            LevelSites::Sites(sites) => submanifold_cuda_sites(dev, sites, [3; 3], [1; 3]),
            LevelSites::Map(map) => Ok(map),
        }
    }
}

impl<S: Store> GpuUBlock<S> {
    /// Uploads the level and the ones below it, registering their layers in `names` in the
    /// order the forward runs them: blocks, transformer, the way down, the deeper levels, the way
    /// up, the tail blocks.
    fn upload(dev: &CudaDevice, u: &UBlock, names: &mut LayerNames) -> Result<Self, Error> {
        let p = &u.name;
        let mut blocks = Vec::with_capacity(u.blocks.len());
        for (i, b) in u.blocks.iter().enumerate() {
            blocks.push(GpuBlock::upload(dev, b, &format!("{p}.blocks.block{i}"), names)?);
        }
        let transformer = match &u.transformer {
            Some(t) => Some(GpuTransformer::upload(dev, t, &format!("{p}.transformer_block"), names)?),
            None => None,
        };
        let down = match &u.down {
            None => None,
            Some(d) => Some(GpuDown::upload(dev, d, u.channels, p, names)?),
        };
        Ok(Self { level: u.level, channels: u.channels, blocks, transformer, down })
    }

    fn forward(
        &self,
        dev: &CudaDevice,
        blas: &CudaBlas,
        x: CudaSlice<S>,
        lv: GpuLevel,
        clock: &mut GpuClock,
        flags: &RangeFlags,
    ) -> Result<CudaSlice<S>, Error> {
        let k = self.level;
        let GpuLevel { sites, origin, spatial_shape, xyz, batch, n } = lv;
        let mut maps = GpuLevelMaps { subm: sites.submanifold_map(dev)?, one: None };
        clock.mark(dev, format!("l{k}.map"))?;
        let mut x = x;
        for b in &self.blocks {
            x = b.forward(dev, &x, &mut maps, flags)?;
        }
        clock.mark(dev, format!("l{k}.blocks"))?;
        if let Some(tr) = &self.transformer {
            let windows = CudaSphereWindows::build(dev, &xyz, &batch, n, &tr.level)?;
            x = tr.forward(dev, blas, &x, n, &xyz, &windows, flags)?;
            clock.mark(dev, format!("l{k}.attention"))?;
        }
        let Some(d) = &self.down else { return Ok(x) };
        let (map, shape2, origin2) = strided_cuda_sites(dev, &maps.subm.out, origin, spatial_shape, DOWN)?;
        let coarse = conv(dev, &x, &map, &d.conv, Some(&d.bn.pre_relu()), None, None, flags, d.conv_ids[1], Some(d.conv_ids[0]))?;
        let m = map.out_count;
        let (xyz2, batch2) = downsample_positions_cuda(dev, &map, &xyz)?;
        let next = GpuLevel { sites: LevelSites::Sites(map.out.clone()), origin: origin2, spatial_shape: shape2, xyz: xyz2, batch: batch2, n: m };
        clock.mark(dev, format!("l{k}.down"))?;
        let deep = d.next.forward(dev, blas, coarse, next, clock, flags)?;
        let inv = inverse_cuda(dev, &map, maps.subm.out.clone())?;
        let up = conv(dev, &deep, &inv, &d.deconv, Some(&d.up_bn.pre_relu()), None, None, flags, d.deconv_ids[1], Some(d.deconv_ids[0]))?;
        drop(deep);
        let mut y = concat_rows(dev, &x, self.channels, &up, self.channels, n)?;
        clock.mark(dev, format!("l{k}.up"))?;
        for b in &d.tail {
            y = b.forward(dev, &y, &mut maps, flags)?;
        }
        clock.mark(dev, format!("l{k}.tail"))?;
        Ok(y)
    }
}

impl<S: Store> GpuDown<S> {
    /// The way down and up of level `p` (registering, in execution order, the down conv, the
    /// deeper levels, the up conv and the tail blocks).
    fn upload(dev: &CudaDevice, d: &Down, c: usize, p: &str, names: &mut LayerNames) -> Result<Self, Error> {
        let c1 = d.next.channels;
        let conv_ids = [names.add(format!("{p}.conv.0")), names.add(format!("{p}.conv.2"))];
        let bn = GpuBatchNorm::upload(dev, &d.bn)?;
        let conv = CudaConvWeights::<S>::upload_store(dev, &d.conv, WeightLayout::Rsck, 8, c, c1, None)?;
        let next = Box::new(GpuUBlock::upload(dev, &d.next, names)?);
        let deconv_ids = [names.add(format!("{p}.deconv.0")), names.add(format!("{p}.deconv.2"))];
        let up_bn = GpuBatchNorm::upload(dev, &d.up_bn)?;
        let deconv = CudaConvWeights::<S>::upload_store(dev, &d.deconv, WeightLayout::Rsck, 8, c1, c, None)?;
        let mut tail = Vec::with_capacity(d.tail.len());
        for (i, b) in d.tail.iter().enumerate() {
            tail.push(GpuBlock::upload(dev, b, &format!("{p}.blocks_tail.block{i}"), names)?);
        }
        Ok(Self { bn, conv, conv_ids, next, up_bn, deconv, deconv_ids, tail })
    }
}

fn concat_rows<S: Store>(dev: &CudaDevice, a: &CudaSlice<S>, ca: usize, b: &CudaSlice<S>, cb: usize, n: usize) -> Result<CudaSlice<S>, Error> {
    let total = elements(n, ca + cb, "concatenation")?;
    // SAFETY: concat_rows writes all n rows (nothing reads the buffer when n = 0).
    let mut out = unsafe { dev.alloc_uninit::<S>(n * (ca + cb), "concatenation") }?;
    if total == 0 {
        return Ok(out);
    }
    let f = dev.function_in(S::STORAGE, "layers", "concat_rows")?;
    let (ca32, cb32, n32) = (ca as u32, cb as u32, n as u32);
    // SAFETY: matches layers.cu; a holds n * ca, b n * cb, out n * (ca + cb).
    unsafe { dev.stream.launch_builder(&f).arg(a).arg(&ca32).arg(b).arg(&cb32).arg(&n32).arg(&mut out).launch(grid_1d(total, THREADS)) }
        .map_err(cuda_err("concat_rows"))?;
    Ok(out)
}

/// The next level's positions and batch indices from a strided map (upstream
/// `get_downsample_info`; the same sums in the same order as [`crate::models::sphereformer::network::downsample_positions`]).
pub fn downsample_positions_cuda(dev: &CudaDevice, map: &CudaKernelMap, xyz: &CudaSlice<f32>) -> Result<(CudaSlice<f32>, CudaSlice<i32>), Error> {
    let m = map.out_count;
    // SAFETY: downsample_xyz writes all m rows of both (nothing reads them when m = 0).
    let mut out_xyz = unsafe { dev.alloc_uninit::<f32>(m * 3, "downsampled positions") }?;
    // SAFETY: as above.
    let mut out_batch = unsafe { dev.alloc_uninit::<i32>(m, "downsampled batch") }?;
    if m == 0 {
        return Ok((out_xyz, out_batch));
    }
    let f = dev.function("layers", "downsample_xyz")?;
    let (m32, kv32) = (elements(m, 1, "downsample")?, map.kv as u32);
    // SAFETY: matches layers.cu; nbr holds m * kv, xyz 3 per input site, out coords 4 per output.
    unsafe {
        dev.stream
            .launch_builder(&f)
            .arg(&map.nbr).arg(&m32).arg(&kv32).arg(xyz).arg(&map.out.coords).arg(&mut out_xyz).arg(&mut out_batch)
            .launch(grid_1d(m32, THREADS))
    }
    .map_err(cuda_err("downsample_xyz"))?;
    Ok((out_xyz, out_batch))
}

/// The whole network on the device, activations and weights in `S` (FP16 by default).
pub struct CudaSphereFormer<S: Store = f16> {
    blas: CudaBlas,
    input_c: usize,
    m: usize,
    classes: usize,
    input_conv: CudaConvWeights<S>,
    unet: GpuUBlock<S>,
    output_bn: GpuBatchNorm,
    linear: GpuLinear<S>,
    /// The guarded layers in execution order, and those of the head and input.
    names: LayerNames,
    head_ids: HeadIds,
    readback: RangeReadback,
}

/// The guarded layers outside the U-Net: `input` (the voxel features), `input_conv.0`,
/// `output_layer.0` (BN + ReLU before the classifier) and `linear` (the FP32 logits: NaN/inf
/// only).
struct HeadIds {
    input: LayerId,
    input_conv: LayerId,
    output_bn: LayerId,
    linear: LayerId,
}

impl<S: Store> CudaSphereFormer<S> {
    /// Uploads a loaded network (weights in `S`, BatchNorm/LayerNorm parameters and RPE tables
    /// f32).
    pub fn upload(dev: &CudaDevice, net: &SphereFormer) -> Result<Self, Error> {
        let blas = CudaBlas::new(dev.stream.clone())
            .map_err(|e| Error::Cuda(format!("cuBLAS is not usable ({e:?}): the CUDA model needs libcublas from the CUDA toolkit")))?;
        let mut names = LayerNames::new();
        let (input, input_conv_id) = (names.add("input"), names.add("input_conv.0"));
        // Cin padded to a multiple of 8 (4 → 8): the tensor-core conv instead of the direct one.
        let input_conv = CudaConvWeights::<S>::upload_padded_store(dev, &net.input_conv, WeightLayout::Rsck, 27, net.input_c, net.m, net.input_c.next_multiple_of(8), None)?;
        let unet = GpuUBlock::upload(dev, &net.unet, &mut names)?;
        let head_ids = HeadIds { input, input_conv: input_conv_id, output_bn: names.add("output_layer.0"), linear: names.add("linear") };
        Ok(Self {
            blas,
            input_c: net.input_c,
            m: net.m,
            classes: net.classes,
            input_conv,
            unet,
            output_bn: GpuBatchNorm::upload(dev, &net.output_bn)?,
            linear: GpuLinear::<S>::upload(dev, &net.linear, 1)?,
            names,
            head_ids,
            readback: RangeReadback::new(),
        })
    }

    /// The guarded layers, in execution order (the names a [`RangeReport`] uses).
    pub fn layer_names(&self) -> &LayerNames {
        &self.names
    }

    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Logits `[N, classes]` (FP32 on the host) and the FP16 range guard's report, the CUDA
    /// counterpart of [`SphereFormer::forward_cpu_checked`] with the same inputs, checks and
    /// stage names.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        dev: &CudaDevice,
        coords: &[[i32; 4]],
        feats: &[f32],
        xyz: &[[f32; 3]],
        batch: &[i32],
        spatial_shape: [i32; 3],
        t: &mut StageTimes,
    ) -> Result<(Vec<f32>, RangeReport), Error> {
        check_inputs(self.input_c, coords, feats, xyz, batch)?;
        let n = coords.len();
        // The CPU path's coordinate checks (inside the grid, no duplicates), without copying the
        // frame into a host tensor.
        validate_geometry([1; 3], [0; 3], spatial_shape)?;
        validate_sites(coords, [0; 3], spatial_shape)?;
        let mut clock = GpuClock::start(dev)?;
        let sites = CudaSites::upload_sites(dev, coords, [0; 3], spatial_shape)?;
        let x = up_f16(dev, feats, "input features")?;
        let xyz_d = up_f32(dev, xyz.as_flattened(), "voxel positions")?;
        let batch_d = dev.stream.clone_htod(batch).map_err(cuda_err("uploading batch indices"))?;
        let (logits, range) = self.forward_device(dev, sites, &x, xyz_d, batch_d, n, spatial_shape, &mut clock)?;
        let out = dev.stream.clone_dtoh(&logits.slice(..n * self.classes)).map_err(cuda_err("reading logits"))?;
        clock.mark(dev, "logits to host".into())?;
        clock.finish(t)?;
        Ok((out, range.finish(&self.names)?))
    }

    /// Logits `[len, classes]` (FP32, on the GPU) of inputs prepared on the GPU
    /// ([`prepare_inputs_cuda`](crate::models::sphereformer::preprocess::cuda::prepare_inputs_cuda), whose
    /// coordinates are unique and inside the grid by construction). The network takes the
    /// inputs' buffers over (no copies); their point map comes back for the way to the points,
    /// with the FP16 range guard's flags on their way to the host: read them
    /// ([`PendingRange::finish`] with [`CudaSphereFormer::layer_names`]) after the frame's
    /// outputs. Stage boundaries go to `clock`.
    pub fn forward_prepared(
        &self,
        dev: &CudaDevice,
        inputs: CudaNetworkInputs,
        clock: &mut GpuClock,
    ) -> Result<(CudaSlice<f32>, CudaPointMap, PendingRange<'_>), Error> {
        let CudaNetworkInputs { coords, feats, xyz, batch, point_map, len: n, batch_size, spatial_shape, .. } = inputs;
        if n == 0 {
            return Err(Error::InvalidInput("the network needs at least one voxel".into()));
        }
        validate_geometry([1; 3], [0; 3], spatial_shape)?;
        let sites = CudaSites::from_device(dev, coords, n, [0; 3], spatial_shape, batch_size)?;
        let (logits, range) = self.forward_device(dev, sites, &feats, xyz, batch, n, spatial_shape, clock)?;
        Ok((logits, point_map, range))
    }

    /// The input features (FP16) widened to the input conv's padded channel count, in `S`
    /// (guarded against FP16's range: `input`).
    fn pad_input(&self, dev: &CudaDevice, x: &CudaSlice<f16>, n: usize, flags: &RangeFlags) -> Result<CudaSlice<S>, Error> {
        let (c, c_pad) = (self.input_c, self.input_conv.cin);
        // SAFETY: pad_channels_f16 writes all n * c_pad values, zeros in the padding.
        let mut out = unsafe { dev.alloc_uninit::<S>(n * c_pad, "padded input features") }?;
        let f = dev.function_in(S::STORAGE, "layers", "pad_channels_f16")?;
        let total = elements(n, c_pad, "padded input")?;
        let (n32, c32, cp32) = (n as u32, c as u32, c_pad as u32);
        let range = flags.slot(self.head_ids.input)?;
        // SAFETY: matches layers.cu; x holds n * c halves (checked by the callers), out n * c_pad;
        // the range slot's layer lies in its flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(x).arg(&n32).arg(&c32).arg(&cp32).arg(&mut out);
            RangeSlot::push(Some(&range), &mut b);
            b.launch(grid_1d(total, THREADS))
        }
        .map_err(cuda_err("pad_channels_f16"))?;
        Ok(out)
    }

    /// The network on device inputs; the range flags' readback is enqueued after the head.
    #[allow(clippy::too_many_arguments)]
    fn forward_device(
        &self,
        dev: &CudaDevice,
        sites: CudaSites,
        x: &CudaSlice<f16>,
        xyz: CudaSlice<f32>,
        batch: CudaSlice<i32>,
        n: usize,
        spatial_shape: [i32; 3],
        clock: &mut GpuClock,
    ) -> Result<(CudaSlice<f32>, PendingRange<'_>), Error> {
        let flags = RangeFlags::new(dev, &self.names)?;
        let maps = submanifold_cuda_sites(dev, sites, [3; 3], [1; 3])?;
        clock.mark(dev, "input_map".into())?;
        let x = self.pad_input(dev, x, n, &flags)?;
        let x = conv(dev, &x, &maps, &self.input_conv, None, None, None, &flags, self.head_ids.input_conv, None)?;
        // level 1 has the input conv's sites, kernel and dilation: it takes this map as its own
        let level = GpuLevel { sites: LevelSites::Map(maps), origin: [0; 3], spatial_shape, xyz, batch, n };
        clock.mark(dev, "input_conv".into())?;
        let y = self.unet.forward(dev, &self.blas, x, level, clock, &flags)?;
        // SAFETY: bn_relu_rows writes all n * m values.
        let mut h = unsafe { dev.alloc_uninit::<S>(n * self.m, "head input") }?;
        let f = dev.function_in(S::STORAGE, "layers", "bn_relu_rows")?;
        let (n32, m32, k32) = (n as u32, self.m as u32, self.classes as u32);
        let total = elements(n, self.m, "head")?;
        let range = flags.slot(self.head_ids.output_bn)?;
        // SAFETY: matches layers.cu; y and h hold n * m halves; the range slot's layer lies in its
        // flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&y).arg(&n32).arg(&m32).arg(&self.output_bn.scale).arg(&self.output_bn.shift).arg(&mut h);
            RangeSlot::push(Some(&range), &mut b);
            b.launch(grid_1d(total, THREADS))
        }
        .map_err(cuda_err("bn_relu_rows"))?;
        drop(y);
        let mut logits = self.linear.gemm(dev, &self.blas, &h, n)?;
        let f = dev.function_in(S::STORAGE, "layers", "add_bias_f32")?;
        let total = elements(n, self.classes, "head")?;
        let range = flags.slot(self.head_ids.linear)?;
        // SAFETY: matches layers.cu; logits hold n * classes floats; the range slot's layer lies
        // in its flags.
        unsafe {
            let mut b = dev.stream.launch_builder(&f);
            b.arg(&mut logits).arg(&n32).arg(&k32).arg(&self.linear.bias[0]);
            RangeSlot::push(Some(&range), &mut b);
            b.launch(grid_1d(total, THREADS))
        }
        .map_err(cuda_err("add_bias_f32"))?;
        clock.mark(dev, "head".into())?;
        let range = self.readback.enqueue(dev, flags)?;
        Ok((logits, range))
    }
}
