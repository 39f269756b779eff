//! SphereFormer on CUDA: the network of `sphereformer.rs`, uploaded once, with FP16 activations
//! and FP32 accumulation everywhere.
//!
//! What runs where:
//! - kernel maps: `sparse::kernel_map_cuda` (submanifold 3×3×3 per level, the 1×1 one of
//!   `blocks_tail.block0`, the k2 s2 down map and its inverse), built once per forward;
//! - convolutions: `sparse::conv_cuda` with the folded BatchNorm + ReLU applied on the gather and
//!   the residual added in the epilogue, exactly as the CPU path's `conv_with` options;
//! - attention: `attention::cuda` (windows built once per level, both window kinds);
//! - Linear: cuBLAS GEMM (FP16 in, FP32 out) followed by `linear_epilogue` (bias, q scale, GELU,
//!   residual, FP16 out); LayerNorm, BatchNorm + ReLU, concatenation and the next level's voxel
//!   positions: `kernels/layers.cu`.
//!
//! The head's logits are FP32 (GEMM output + bias), copied back for the arg-max.

use super::{check_inputs, Block, Down, SphereFormer, StageTimes, TransformerBlock, UBlock, DOWN};
use crate::attention::cuda::{sphere_attention_cuda, CudaSphereTables, CudaSphereWindows, QkvView};
use crate::attention::sphere::SphereLevel;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::grid_1d;
use crate::model::layers::BatchNorm;
use crate::model::preprocess::cuda::{CudaNetworkInputs, CudaPointMap};
use crate::sparse::conv_cpu::WeightLayout;
use crate::sparse::conv_cuda::{conv_cuda, conv_cuda_post, CudaConvWeights, CudaPreActivation};
use crate::sparse::kernel_map_cuda::{inverse_cuda, strided_cuda_sites, submanifold_cuda_sites, CudaKernelMap, CudaSites};
use crate::sparse::tensor::{validate_geometry, validate_sites};
use crate::Error;
use crate::model::gpu_layers::{alloc, elements, epilogue, up_f16, up_f32, GpuLayerNorm, GpuLinear};
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaSlice, PushKernelArg};
use half::f16;

const THREADS: u32 = 256;

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

enum GpuBlock {
    Residual { i_branch: Option<CudaConvWeights>, bn1: GpuBatchNorm, conv1: CudaConvWeights, bn2: GpuBatchNorm, conv2: CudaConvWeights },
    Vgg { bn: GpuBatchNorm, conv: CudaConvWeights },
}

impl GpuBlock {
    fn upload(dev: &CudaDevice, b: &Block) -> Result<Self, Error> {
        let w = |w: &[f32], kv, cin, cout| CudaConvWeights::upload(dev, w, WeightLayout::Rsck, kv, cin, cout, None);
        Ok(match b {
            Block::Residual { cin, cout, i_branch, bn1, conv1, bn2, conv2 } => GpuBlock::Residual {
                i_branch: i_branch.as_deref().map(|x| w(x, 1, *cin, *cout)).transpose()?,
                bn1: GpuBatchNorm::upload(dev, bn1)?,
                conv1: w(conv1, 27, *cin, *cout)?,
                bn2: GpuBatchNorm::upload(dev, bn2)?,
                conv2: w(conv2, 27, *cout, *cout)?,
            },
            Block::Vgg { cout, bn, conv } => {
                let cin = bn.channels();
                GpuBlock::Vgg { bn: GpuBatchNorm::upload(dev, bn)?, conv: w(conv, 27, cin, *cout)? }
            }
        })
    }

    /// `maps.one` is built on first use (only `blocks_tail.block0` has a 1×1 i_branch).
    fn forward(&self, dev: &CudaDevice, x: &CudaSlice<f16>, maps: &mut GpuLevelMaps) -> Result<CudaSlice<f16>, Error> {
        match self {
            GpuBlock::Vgg { bn, conv } => conv_cuda(dev, x, &maps.subm, conv, Some(&bn.pre_relu()), None),
            GpuBlock::Residual { i_branch, bn1, conv1, bn2, conv2 } => {
                let projected = match i_branch {
                    Some(w) => Some(conv_cuda(dev, x, maps.one_by_one(dev)?, w, None, None)?),
                    None => None,
                };
                let identity = projected.as_ref().unwrap_or(x);
                // conv1's output feeds only conv2, so bn2 + ReLU run in conv1's epilogue
                let h = conv_cuda_post(dev, x, &maps.subm, conv1, Some(&bn1.pre_relu()), &bn2.pre_relu())?;
                conv_cuda(dev, &h, &maps.subm, conv2, None, Some(identity))
            }
        }
    }
}

/// A level's kernel maps: the 3×3×3 submanifold map (it owns the level's sites) and, when asked,
/// the 1×1 one.
struct GpuLevelMaps {
    subm: CudaKernelMap,
    one: Option<CudaKernelMap>,
}

impl GpuLevelMaps {
    fn one_by_one(&mut self, dev: &CudaDevice) -> Result<&CudaKernelMap, Error> {
        if self.one.is_none() {
            self.one = Some(submanifold_cuda_sites(dev, self.subm.out.try_clone(dev)?, [1; 3], [1; 3])?);
        }
        self.one.as_ref().ok_or_else(|| Error::Cuda("1x1 kernel map missing".into()))
    }
}

struct GpuTransformer {
    level: SphereLevel,
    heads: usize,
    head_dim: usize,
    norm1: GpuLayerNorm,
    tables: CudaSphereTables,
    qkv: GpuLinear,
    proj: GpuLinear,
    norm2: GpuLayerNorm,
    fc1: GpuLinear,
    fc2: GpuLinear,
}

impl GpuTransformer {
    fn upload(dev: &CudaDevice, t: &TransformerBlock) -> Result<Self, Error> {
        let c = &t.cubic;
        let s = &t.sphere;
        Ok(Self {
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
        x: &CudaSlice<f16>,
        n: usize,
        xyz: &CudaSlice<f32>,
        windows: &CudaSphereWindows,
    ) -> Result<CudaSlice<f16>, Error> {
        let c = self.heads * self.head_dim;
        let h = self.norm1.forward(dev, x, n)?;
        let acc = self.qkv.gemm(dev, blas, &h, n)?;
        let scale = (self.head_dim as f32).powf(-0.5);
        let q = epilogue(dev, &acc, 3 * c, 0, n, &self.qkv.bias[0], scale, false, None)?;
        let k = epilogue(dev, &acc, 3 * c, c, n, &self.qkv.bias[1], 1.0, false, None)?;
        let v = epilogue(dev, &acc, 3 * c, 2 * c, n, &self.qkv.bias[2], 1.0, false, None)?;
        drop(acc);
        let mut att = alloc::<f16>(dev, n * c, "attention output")?;
        sphere_attention_cuda(dev, QkvView { q: &q, k: &k, v: &v, ld: c }, self.heads, self.head_dim, xyz, windows, &self.tables, &mut att)?;
        drop((q, k, v));
        let acc = self.proj.gemm(dev, blas, &att, n)?;
        let y = epilogue(dev, &acc, c, 0, n, &self.proj.bias[0], 1.0, false, Some(x))?;
        let h = self.norm2.forward(dev, &y, n)?;
        let acc = self.fc1.gemm(dev, blas, &h, n)?;
        let hidden = epilogue(dev, &acc, self.fc1.fout, 0, n, &self.fc1.bias[0], 1.0, true, None)?;
        let acc = self.fc2.gemm(dev, blas, &hidden, n)?;
        epilogue(dev, &acc, c, 0, n, &self.fc2.bias[0], 1.0, false, Some(&y))
    }
}

struct GpuDown {
    bn: GpuBatchNorm,
    conv: CudaConvWeights,
    next: Box<GpuUBlock>,
    up_bn: GpuBatchNorm,
    deconv: CudaConvWeights,
    tail: Vec<GpuBlock>,
}

struct GpuUBlock {
    level: usize,
    channels: usize,
    blocks: Vec<GpuBlock>,
    transformer: Option<GpuTransformer>,
    down: Option<GpuDown>,
}

/// One level's voxels on the device: sites (coordinates + hash), their grid, positions, batch.
struct GpuLevel {
    sites: CudaSites,
    origin: [i32; 3],
    spatial_shape: [i32; 3],
    xyz: CudaSlice<f32>,
    batch: CudaSlice<i32>,
    n: usize,
}

impl GpuUBlock {
    fn upload(dev: &CudaDevice, u: &UBlock) -> Result<Self, Error> {
        let down = match &u.down {
            None => None,
            Some(d) => Some(GpuDown::upload(dev, d, u.channels)?),
        };
        Ok(Self {
            level: u.level,
            channels: u.channels,
            blocks: u.blocks.iter().map(|b| GpuBlock::upload(dev, b)).collect::<Result<_, _>>()?,
            transformer: u.transformer.as_ref().map(|t| GpuTransformer::upload(dev, t)).transpose()?,
            down,
        })
    }

    fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, x: CudaSlice<f16>, lv: GpuLevel, clock: &mut GpuClock) -> Result<CudaSlice<f16>, Error> {
        let k = self.level;
        let GpuLevel { sites, origin, spatial_shape, xyz, batch, n } = lv;
        let mut maps = GpuLevelMaps { subm: submanifold_cuda_sites(dev, sites, [3; 3], [1; 3])?, one: None };
        clock.mark(dev, format!("l{k}.map"))?;
        let mut x = x;
        for b in &self.blocks {
            x = b.forward(dev, &x, &mut maps)?;
        }
        clock.mark(dev, format!("l{k}.blocks"))?;
        if let Some(tr) = &self.transformer {
            let windows = CudaSphereWindows::build(dev, &xyz, &batch, n, &tr.level)?;
            x = tr.forward(dev, blas, &x, n, &xyz, &windows)?;
            clock.mark(dev, format!("l{k}.attention"))?;
        }
        let Some(d) = &self.down else { return Ok(x) };
        let (map, shape2, origin2) = strided_cuda_sites(dev, &maps.subm.out, origin, spatial_shape, DOWN)?;
        let coarse = conv_cuda(dev, &x, &map, &d.conv, Some(&d.bn.pre_relu()), None)?;
        let m = map.out_count;
        let (xyz2, batch2) = downsample_positions_cuda(dev, &map, &xyz)?;
        let next = GpuLevel { sites: map.out.try_clone(dev)?, origin: origin2, spatial_shape: shape2, xyz: xyz2, batch: batch2, n: m };
        clock.mark(dev, format!("l{k}.down"))?;
        let deep = d.next.forward(dev, blas, coarse, next, clock)?;
        let inv = inverse_cuda(dev, &map, maps.subm.out.try_clone(dev)?)?;
        let up = conv_cuda(dev, &deep, &inv, &d.deconv, Some(&d.up_bn.pre_relu()), None)?;
        drop(deep);
        let mut y = concat_rows(dev, &x, self.channels, &up, self.channels, n)?;
        clock.mark(dev, format!("l{k}.up"))?;
        for b in &d.tail {
            y = b.forward(dev, &y, &mut maps)?;
        }
        clock.mark(dev, format!("l{k}.tail"))?;
        Ok(y)
    }
}

impl GpuDown {
    fn upload(dev: &CudaDevice, d: &Down, c: usize) -> Result<Self, Error> {
        let c1 = d.next.channels;
        Ok(Self {
            bn: GpuBatchNorm::upload(dev, &d.bn)?,
            conv: CudaConvWeights::upload(dev, &d.conv, WeightLayout::Rsck, 8, c, c1, None)?,
            next: Box::new(GpuUBlock::upload(dev, &d.next)?),
            up_bn: GpuBatchNorm::upload(dev, &d.up_bn)?,
            deconv: CudaConvWeights::upload(dev, &d.deconv, WeightLayout::Rsck, 8, c1, c, None)?,
            tail: d.tail.iter().map(|b| GpuBlock::upload(dev, b)).collect::<Result<_, _>>()?,
        })
    }
}

/// Stage boundaries as CUDA events on the stream, so a frame needs no host synchronisation per
/// stage: the durations (GPU time between consecutive boundaries, idle gaps included) are read
/// in [`GpuClock::finish`], once the frame's results are back on the host.
pub struct GpuClock {
    start: cudarc::driver::CudaEvent,
    marks: Vec<(String, cudarc::driver::CudaEvent)>,
}

impl GpuClock {
    /// A clock whose first stage starts with the work enqueued from now on.
    pub fn start(dev: &CudaDevice) -> Result<Self, Error> {
        Ok(Self { start: timing_event(dev)?, marks: Vec::new() })
    }

    /// Ends stage `name` after the work enqueued so far.
    pub fn mark(&mut self, dev: &CudaDevice, name: String) -> Result<(), Error> {
        self.marks.push((name, timing_event(dev)?));
        Ok(())
    }

    /// Appends every stage's GPU time to `t` (waits for the last boundary).
    pub fn finish(self, t: &mut StageTimes) -> Result<(), Error> {
        let mut prev = &self.start;
        for (name, ev) in &self.marks {
            let ms = prev.elapsed_ms(ev).map_err(cuda_err(format!("reading the time of stage {name}")))?;
            t.stages.push((name.clone(), std::time::Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3)));
            prev = ev;
        }
        Ok(())
    }
}

fn timing_event(dev: &CudaDevice) -> Result<cudarc::driver::CudaEvent, Error> {
    dev.stream
        .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(cuda_err("recording a timing event"))
}

fn concat_rows(dev: &CudaDevice, a: &CudaSlice<f16>, ca: usize, b: &CudaSlice<f16>, cb: usize, n: usize) -> Result<CudaSlice<f16>, Error> {
    let total = elements(n, ca + cb, "concatenation")?;
    let mut out = alloc::<f16>(dev, n * (ca + cb), "concatenation")?;
    if total == 0 {
        return Ok(out);
    }
    let f = dev.function("layers", "concat_rows")?;
    let (ca32, cb32, n32) = (ca as u32, cb as u32, n as u32);
    // SAFETY: matches layers.cu; a holds n * ca, b n * cb, out n * (ca + cb).
    unsafe { dev.stream.launch_builder(&f).arg(a).arg(&ca32).arg(b).arg(&cb32).arg(&n32).arg(&mut out).launch(grid_1d(total, THREADS)) }
        .map_err(cuda_err("concat_rows"))?;
    Ok(out)
}

/// The next level's positions and batch indices from a strided map (upstream
/// `get_downsample_info`; the same sums in the same order as [`super::downsample_positions`]).
pub fn downsample_positions_cuda(dev: &CudaDevice, map: &CudaKernelMap, xyz: &CudaSlice<f32>) -> Result<(CudaSlice<f32>, CudaSlice<i32>), Error> {
    let m = map.out_count;
    let mut out_xyz = alloc::<f32>(dev, m * 3, "downsampled positions")?;
    let mut out_batch = alloc::<i32>(dev, m, "downsampled batch")?;
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

/// The whole network on the device.
pub struct CudaSphereFormer {
    blas: CudaBlas,
    input_c: usize,
    m: usize,
    classes: usize,
    input_conv: CudaConvWeights,
    unet: GpuUBlock,
    output_bn: GpuBatchNorm,
    linear: GpuLinear,
}

impl CudaSphereFormer {
    /// Uploads a loaded network (weights FP16, BatchNorm/LayerNorm parameters and RPE tables f32).
    pub fn upload(dev: &CudaDevice, net: &SphereFormer) -> Result<Self, Error> {
        let blas = CudaBlas::new(dev.stream.clone())
            .map_err(|e| Error::Cuda(format!("cuBLAS is not usable ({e:?}): the CUDA model needs libcublas from the CUDA toolkit")))?;
        Ok(Self {
            blas,
            input_c: net.input_c,
            m: net.m,
            classes: net.classes,
            // Cin padded to a multiple of 8 (4 → 8): the tensor-core conv instead of the direct one.
            input_conv: CudaConvWeights::upload_padded(dev, &net.input_conv, WeightLayout::Rsck, 27, net.input_c, net.m, net.input_c.next_multiple_of(8), None)?,
            unet: GpuUBlock::upload(dev, &net.unet)?,
            output_bn: GpuBatchNorm::upload(dev, &net.output_bn)?,
            linear: GpuLinear::upload(dev, &net.linear, 1)?,
        })
    }

    pub fn classes(&self) -> usize {
        self.classes
    }

    /// Logits `[N, classes]` (FP32 on the host), the CUDA counterpart of
    /// [`SphereFormer::forward_cpu_timed`] with the same inputs, checks and stage names.
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
    ) -> Result<Vec<f32>, Error> {
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
        let logits = self.forward_device(dev, sites, &x, xyz_d, batch_d, n, spatial_shape, &mut clock)?;
        let out = dev.stream.clone_dtoh(&logits.slice(..n * self.classes)).map_err(cuda_err("reading logits"))?;
        clock.mark(dev, "logits to host".into())?;
        clock.finish(t)?;
        Ok(out)
    }

    /// Logits `[len, classes]` (FP32, on the GPU) of inputs prepared on the GPU
    /// ([`prepare_inputs_cuda`](crate::model::preprocess::cuda::prepare_inputs_cuda), whose
    /// coordinates are unique and inside the grid by construction). The network takes the
    /// inputs' buffers over (no copies); their point map comes back for the way to the points.
    /// Stage boundaries go to `clock`.
    pub fn forward_prepared(&self, dev: &CudaDevice, inputs: CudaNetworkInputs, clock: &mut GpuClock) -> Result<(CudaSlice<f32>, CudaPointMap), Error> {
        let CudaNetworkInputs { coords, feats, xyz, batch, point_map, len: n, batch_size, spatial_shape, .. } = inputs;
        if n == 0 {
            return Err(Error::InvalidInput("the network needs at least one voxel".into()));
        }
        validate_geometry([1; 3], [0; 3], spatial_shape)?;
        let sites = CudaSites::from_device(dev, coords, n, [0; 3], spatial_shape, batch_size)?;
        let logits = self.forward_device(dev, sites, &feats, xyz, batch, n, spatial_shape, clock)?;
        Ok((logits, point_map))
    }

    /// The input features widened to the input conv's padded channel count.
    fn pad_input(&self, dev: &CudaDevice, x: &CudaSlice<f16>, n: usize) -> Result<CudaSlice<f16>, Error> {
        let (c, c_pad) = (self.input_c, self.input_conv.cin);
        let mut out = alloc::<f16>(dev, n * c_pad, "padded input features")?;
        let f = dev.function("layers", "pad_channels_f16")?;
        let total = elements(n, c_pad, "padded input")?;
        let (n32, c32, cp32) = (n as u32, c as u32, c_pad as u32);
        // SAFETY: matches layers.cu; x holds n * c halves (checked by the callers), out n * c_pad.
        unsafe { dev.stream.launch_builder(&f).arg(x).arg(&n32).arg(&c32).arg(&cp32).arg(&mut out).launch(grid_1d(total, THREADS)) }
            .map_err(cuda_err("pad_channels_f16"))?;
        Ok(out)
    }

    /// The network on device inputs.
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
    ) -> Result<CudaSlice<f32>, Error> {
        let maps = submanifold_cuda_sites(dev, sites, [3; 3], [1; 3])?;
        clock.mark(dev, "input_map".into())?;
        let x = self.pad_input(dev, x, n)?;
        let x = conv_cuda(dev, &x, &maps, &self.input_conv, None, None)?;
        let level = GpuLevel { sites: maps.out, origin: [0; 3], spatial_shape, xyz, batch, n };
        clock.mark(dev, "input_conv".into())?;
        let y = self.unet.forward(dev, &self.blas, x, level, clock)?;
        let mut h = alloc::<f16>(dev, n * self.m, "head input")?;
        let f = dev.function("layers", "bn_relu_rows")?;
        let (n32, m32, k32) = (n as u32, self.m as u32, self.classes as u32);
        let total = elements(n, self.m, "head")?;
        // SAFETY: matches layers.cu; y and h hold n * m halves.
        unsafe {
            dev.stream
                .launch_builder(&f)
                .arg(&y).arg(&n32).arg(&m32).arg(&self.output_bn.scale).arg(&self.output_bn.shift).arg(&mut h)
                .launch(grid_1d(total, THREADS))
        }
        .map_err(cuda_err("bn_relu_rows"))?;
        drop(y);
        let mut logits = self.linear.gemm(dev, &self.blas, &h, n)?;
        let f = dev.function("layers", "add_bias_f32")?;
        let total = elements(n, self.classes, "head")?;
        // SAFETY: matches layers.cu; logits hold n * classes floats.
        unsafe {
            dev.stream.launch_builder(&f).arg(&mut logits).arg(&n32).arg(&k32).arg(&self.linear.bias[0]).launch(grid_1d(total, THREADS))
        }
        .map_err(cuda_err("add_bias_f32"))?;
        clock.mark(dev, "head".into())?;
        Ok(logits)
    }
}
