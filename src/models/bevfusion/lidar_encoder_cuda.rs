//! The LiDAR encoder on CUDA: hard voxelization (`ops::voxelize::hard_cuda`), the
//! SparseEncoder's convs on the sparse-conv engine (FP16 features and weights, FP32
//! accumulation; BatchNorm folded at load, bias + residual + ReLU in the conv's epilogue) and the
//! flattening to the NHWC BEV map `[1, X, Y, C · Z]` (kernel `sparse_to_bev` in
//! `kernels/models/bevfusion/lidar_encoder.cu`). Same function as [`LidarEncoder`](crate::models::bevfusion::lidar_encoder::LidarEncoder).
//!
//! Kernel maps: one submanifold 3×3×3 map per stage (upstream's `subm1` and the basic blocks'
//! convs, whose pairs are the same), one strided map per down conv and for `conv_out`.

use crate::models::bevfusion::lidar_encoder::{no_voxels, EncoderLayer, FoldedConv, LidarEncoder, LidarEncoderConfig, CONV_OUT};
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::ops::sparse_conv::cpu::WeightLayout;
use crate::ops::sparse_conv::cuda::{conv_cuda_guarded, ConvAlgo, ConvRange, CudaConvWeights, CudaPreActivation};
use crate::ops::voxelize::hard::{HardVoxelStats, POINT_COLUMNS};
use crate::ops::voxelize::hard_cuda::{hard_voxelize_cuda, hard_voxelize_cuda_device, CudaHardVoxels};
use crate::ops::sparse_conv::kernel_map::ConvGeometry;
use crate::ops::sparse_conv::kernel_map_cuda::{strided_cuda_sites, submanifold_cuda_sites, CudaKernelMap, CudaSites};
use crate::Error;
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use half::f16;

/// Voxel features are padded to this many channels (zeros past the 5 point columns, zero weights)
/// so `conv_input` can take the tensor-core kernels, which need Cin a multiple of 8.
pub const INPUT_CHANNELS_PADDED: usize = 8;

enum CudaLayer {
    Block { conv1: CudaConvWeights, conv2: CudaConvWeights },
    Down { geometry: ConvGeometry, conv: CudaConvWeights },
}

/// A stage's sparse output downloaded (for per-stage checks): `[b, x, y, z]` and `[n, c]` f32.
#[derive(Debug, Clone)]
pub struct HostStage {
    pub name: String,
    pub coords: Vec<[i32; 4]>,
    pub feats: Vec<f32>,
    pub channels: usize,
}

/// The encoder's weights on the GPU.
pub struct CudaLidarEncoder {
    cfg: LidarEncoderConfig,
    conv_input: CudaConvWeights,
    stages: Vec<Vec<CudaLayer>>,
    conv_out: CudaConvWeights,
    /// ReLU as the epilogue's post-activation: scale 1, shift 0, as wide as the widest layer.
    ones: CudaSlice<f32>,
    zeros: CudaSlice<f32>,
}

fn upload_conv(dev: &CudaDevice, c: &FoldedConv) -> Result<CudaConvWeights, Error> {
    CudaConvWeights::upload(dev, &c.weight, WeightLayout::Rsck, c.kv(), c.cin, c.cout, Some(&c.bias))
}

impl CudaLidarEncoder {
    /// Uploads a loaded encoder's folded weights.
    pub fn upload(dev: &CudaDevice, enc: &LidarEncoder) -> Result<Self, Error> {
        let ci = &enc.conv_input;
        let conv_input = CudaConvWeights::upload_padded(dev, &ci.weight, WeightLayout::Rsck, ci.kv(), ci.cin, ci.cout, INPUT_CHANNELS_PADDED, Some(&ci.bias))?;
        let mut widest = ci.cout.max(enc.conv_out.cout);
        let mut stages = Vec::with_capacity(enc.stages.len());
        for layers in &enc.stages {
            let mut v = Vec::with_capacity(layers.len());
            for l in layers {
                v.push(match l {
                    EncoderLayer::Block { conv1, conv2 } => {
                        widest = widest.max(conv1.cout).max(conv2.cout);
                        CudaLayer::Block { conv1: upload_conv(dev, conv1)?, conv2: upload_conv(dev, conv2)? }
                    }
                    EncoderLayer::Down { geometry, conv } => {
                        widest = widest.max(conv.cout);
                        CudaLayer::Down { geometry: *geometry, conv: upload_conv(dev, conv)? }
                    }
                });
            }
            stages.push(v);
        }
        let s = &dev.stream;
        Ok(Self {
            cfg: enc.cfg.clone(),
            conv_input,
            stages,
            conv_out: upload_conv(dev, &enc.conv_out)?,
            ones: s.clone_htod(&vec![1f32; widest]).map_err(cuda_err("uploading ReLU scales"))?,
            zeros: s.alloc_zeros::<f32>(widest).map_err(cuda_err("allocating ReLU shifts"))?,
        })
    }

    pub fn config(&self) -> &LidarEncoderConfig {
        &self.cfg
    }

    /// Host points `(x, y, z, intensity, time lag)` → BEV map `[1, X, Y, C · Z]` (FP16) and stats.
    /// A cloud with no voxel is an error.
    pub fn forward(&self, dev: &CudaDevice, points: &[[f32; POINT_COLUMNS]]) -> Result<(CudaFeatureMap, HardVoxelStats), Error> {
        let v = hard_voxelize_cuda(dev, points, &self.cfg.voxelize, INPUT_CHANNELS_PADDED)?;
        let stats = v.stats;
        let (bev, _) = self.forward_voxels(dev, v, false)?;
        Ok((bev, stats))
    }

    /// [`CudaLidarEncoder::forward`] of `n` points already on the GPU (`n * 5` floats).
    pub fn forward_device(&self, dev: &CudaDevice, points: &CudaSlice<f32>, n: usize) -> Result<(CudaFeatureMap, HardVoxelStats), Error> {
        let v = hard_voxelize_cuda_device(dev, points, n, &self.cfg.voxelize, INPUT_CHANNELS_PADDED)?;
        let stats = v.stats;
        let (bev, _) = self.forward_voxels(dev, v, false)?;
        Ok((bev, stats))
    }

    /// Voxelization alone, with this encoder's parameters and feature width.
    pub fn voxelize(&self, dev: &CudaDevice, points: &[[f32; POINT_COLUMNS]]) -> Result<CudaHardVoxels, Error> {
        hard_voxelize_cuda(dev, points, &self.cfg.voxelize, INPUT_CHANNELS_PADDED)
    }

    /// The encoder on voxels (features `INPUT_CHANNELS_PADDED` wide); with `keep_stages`, the
    /// outputs of conv_input, every stage and conv_out downloaded (names as the CPU path's).
    pub fn forward_voxels(&self, dev: &CudaDevice, v: CudaHardVoxels, keep_stages: bool) -> Result<(CudaFeatureMap, Vec<HostStage>), Error> {
        if v.len == 0 {
            return Err(no_voxels(&v.stats));
        }
        if v.channels != INPUT_CHANNELS_PADDED {
            return Err(Error::InvalidInput(format!("LiDAR encoder: voxel features are {} wide, expected {INPUT_CHANNELS_PADDED}", v.channels)));
        }
        let b = &self.cfg.backbone;
        let relu = CudaPreActivation { scale: &self.ones, shift: &self.zeros, relu: true };
        let conv = |x: &CudaSlice<f16>, map: &CudaKernelMap, w: &CudaConvWeights, residual: Option<&CudaSlice<f16>>| {
            let algo = ConvAlgo::best_for_weights(w, map.out_count);
            conv_cuda_guarded(dev, x, map, w, None, residual, algo, None, Some(&relu), ConvRange::default())
        };
        let mut stages = Vec::new();
        let mut keep = |name: &str, sites: &CudaSites, x: &CudaSlice<f16>, c: usize| -> Result<(), Error> {
            if keep_stages {
                let coords = sites.coords_to_host(dev)?;
                let n = coords.len() * c;
                let feats = if n == 0 { vec![] } else { dev.stream.clone_dtoh(&x.slice(..n)).map_err(cuda_err("reading a stage"))? };
                stages.push(HostStage { name: name.into(), coords, feats: feats.iter().map(|h| h.to_f32()).collect(), channels: c });
            }
            Ok(())
        };
        let mut shape = b.sparse_shape;
        let sites = CudaSites::from_device(dev, v.coords, v.len, [0; 3], shape, 1)?;
        let mut subm = submanifold_cuda_sites(dev, sites, [3; 3], [1; 3])?;
        let mut x = conv(&v.feats, &subm, &self.conv_input, None)?;
        keep("conv_input", &subm.out, &x, self.conv_input.cout)?;
        let mut c = self.conv_input.cout;
        for (i, layers) in self.stages.iter().enumerate() {
            for layer in layers {
                match layer {
                    CudaLayer::Block { conv1, conv2 } => {
                        let h = conv(&x, &subm, conv1, None)?;
                        x = conv(&h, &subm, conv2, Some(&x))?;
                        c = conv2.cout;
                    }
                    CudaLayer::Down { geometry, conv: w } => {
                        let (map, out_shape, _) = strided_cuda_sites(dev, &subm.out, [0; 3], shape, *geometry)?;
                        x = conv(&x, &map, w, None)?;
                        c = w.cout;
                        shape = out_shape;
                        let CudaKernelMap { out, .. } = map;
                        subm = submanifold_cuda_sites(dev, out, [3; 3], [1; 3])?;
                    }
                }
            }
            keep(&format!("encoder_layer{}", i + 1), &subm.out, &x, c)?;
        }
        let (map, out_shape, _) = strided_cuda_sites(dev, &subm.out, [0; 3], shape, CONV_OUT)?;
        let x = conv(&x, &map, &self.conv_out, None)?;
        let cout = self.conv_out.cout;
        keep("conv_out", &map.out, &x, cout)?;
        let (bx, by, bz) = (out_shape[0] as usize, out_shape[1] as usize, out_shape[2] as usize);
        let mut bev = CudaFeatureMap::zeros(dev, 1, bx, by, cout * bz)?;
        let total = map.out_count as u64 * cout as u64;
        if total > 0 {
            let f = dev.function("lidar_encoder", "sparse_to_bev")?;
            let blocks = u32::try_from(total.div_ceil(256)).map_err(|_| Error::InvalidInput(format!("LiDAR BEV: {total} values")))?;
            let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
            let (m32, c32) = (map.out_count as u32, cout as u32);
            // SAFETY: matches lidar_encoder.cu; x holds m * C halves, the coordinates m * 4, the
            // map X * Y * C * Z (the kernel skips coordinates outside it).
            unsafe {
                dev.stream
                    .launch_builder(&f)
                    .arg(&x).arg(&map.out.coords).arg(&m32).arg(&c32).arg(&out_shape[0]).arg(&out_shape[1]).arg(&out_shape[2]).arg(&mut bev.data)
                    .launch(cfg)
                    .map_err(cuda_err("sparse_to_bev"))?;
            }
        }
        Ok((bev, stages))
    }
}
