//! The fuser and the BEV decoders on CUDA: `fuser.rs` and `bev_decoder.rs` with FP16 maps, FP32
//! accumulation, BatchNorm folded. Dense convs run on the [`ConvEngine`] chosen at upload
//! (cuDNN or im2col + cuBLAS); SECONDFPN's deconv is a cuBLAS GEMM + scatter either way; the
//! BasicBlock's residual add and ReLU ride in its second conv's epilogue.
//!
//! Each part owns its engine (and so its cuDNN handle): a part may move to another thread
//! (`Send`), but is used from one thread at a time (not `Sync`).

use crate::models::bevfusion::config::FuserConfig;
use crate::models::bevfusion::decoder::{BasicBlock, BevDecoder, FpnUp, ResNetDecoder, SecondDecoder};
use crate::models::bevfusion::fuser::{check_inputs, BevFuser};
use crate::ops::dense::conv_engine::{ConvBackend, ConvEngine, GpuConv};
use crate::ops::dense::cuda::{bilinear_resize_cuda, concat_channels_cuda, CudaFeatureMap};
use crate::ops::dense::cuda_ops::CudaConvTranspose2d;
use crate::ops::dense::Activation;
use crate::device::cuda::CudaDevice;
use crate::Error;
use cudarc::cublas::CudaBlas;

/// [`BevFuser`] on the device.
pub struct CudaBevFuser {
    config: FuserConfig,
    engine: ConvEngine,
    conv: GpuConv,
}

impl CudaBevFuser {
    pub fn upload(dev: &CudaDevice, cpu: &BevFuser, backend: ConvBackend) -> Result<Self, Error> {
        let engine = ConvEngine::new(dev, backend);
        let conv = GpuConv::upload(dev, &engine, &cpu.conv)?;
        Ok(Self { config: cpu.config.clone(), engine, conv })
    }

    /// The backend in use (cuDNN may have fallen back to im2col).
    pub fn backend(&self) -> ConvBackend {
        self.engine.backend()
    }

    /// Fuses the sensors' BEV maps, in the config's order (camera first).
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, inputs: &[&CudaFeatureMap]) -> Result<CudaFeatureMap, Error> {
        check_inputs(&self.config, inputs.iter().map(|m| (m.n, m.h, m.w, m.c)))?;
        let mut cat: Option<CudaFeatureMap> = None;
        for m in &inputs[1..] {
            let c = concat_channels_cuda(dev, cat.as_ref().unwrap_or(inputs[0]), m)?;
            cat = Some(c);
        }
        let x = cat.as_ref().unwrap_or(inputs[0]);
        self.conv.forward(dev, blas, &self.engine, x, Activation::Relu, None)
    }
}

enum GpuUp {
    Conv(GpuConv),
    Deconv(CudaConvTranspose2d),
}

struct GpuSecond {
    in_channels: usize,
    stages: Vec<Vec<GpuConv>>,
    deblocks: Vec<GpuUp>,
}

struct GpuBlock {
    conv1: GpuConv,
    conv2: GpuConv,
    downsample: Option<GpuConv>,
}

struct GpuResNet {
    in_channels: usize,
    layers: Vec<Vec<GpuBlock>>,
    in_indices: [usize; 2],
    scale_factor: usize,
    fuse: [GpuConv; 2],
    upsample: Option<GpuConv>,
}

#[allow(clippy::large_enum_variant)]
enum GpuDecoder {
    Second(GpuSecond),
    ResNet(GpuResNet),
}

/// [`BevDecoder`] on the device.
pub struct CudaBevDecoder {
    engine: ConvEngine,
    net: GpuDecoder,
}

fn up_second(dev: &CudaDevice, e: &ConvEngine, d: &SecondDecoder) -> Result<GpuSecond, Error> {
    let stages = d.stages.iter().map(|s| s.iter().map(|c| GpuConv::upload(dev, e, c)).collect::<Result<Vec<_>, _>>()).collect::<Result<Vec<_>, _>>()?;
    let deblocks = d
        .deblocks
        .iter()
        .map(|b| {
            Ok(match b {
                FpnUp::Conv(c) => GpuUp::Conv(GpuConv::upload(dev, e, c)?),
                FpnUp::Deconv(t) => GpuUp::Deconv(CudaConvTranspose2d::upload(dev, t)?),
            })
        })
        .collect::<Result<Vec<_>, Error>>()?;
    Ok(GpuSecond { in_channels: d.backbone.in_channels, stages, deblocks })
}

fn up_block(dev: &CudaDevice, e: &ConvEngine, b: &BasicBlock) -> Result<GpuBlock, Error> {
    Ok(GpuBlock {
        conv1: GpuConv::upload(dev, e, &b.conv1)?,
        conv2: GpuConv::upload(dev, e, &b.conv2)?,
        downsample: b.downsample.as_ref().map(|d| GpuConv::upload(dev, e, d)).transpose()?,
    })
}

fn up_resnet(dev: &CudaDevice, e: &ConvEngine, d: &ResNetDecoder) -> Result<GpuResNet, Error> {
    let layers = d.layers.iter().map(|l| l.iter().map(|b| up_block(dev, e, b)).collect::<Result<Vec<_>, _>>()).collect::<Result<Vec<_>, _>>()?;
    Ok(GpuResNet {
        in_channels: d.backbone.in_channels,
        layers,
        in_indices: d.neck.in_indices,
        scale_factor: d.neck.scale_factor,
        fuse: [GpuConv::upload(dev, e, &d.fuse[0])?, GpuConv::upload(dev, e, &d.fuse[1])?],
        upsample: d.upsample.as_ref().map(|c| GpuConv::upload(dev, e, c)).transpose()?,
    })
}

fn check(x: &CudaFeatureMap, c: usize, what: &str) -> Result<(), Error> {
    if x.c != c || x.n == 0 || x.h == 0 || x.w == 0 {
        return Err(Error::InvalidInput(format!("{what}: input [n {}, {} x {}, c {}], expected {c} channels, non-empty", x.n, x.h, x.w, x.c)));
    }
    Ok(())
}

impl CudaBevDecoder {
    pub fn upload(dev: &CudaDevice, cpu: &BevDecoder, backend: ConvBackend) -> Result<Self, Error> {
        let engine = ConvEngine::new(dev, backend);
        let net = match cpu {
            BevDecoder::Second(d) => GpuDecoder::Second(up_second(dev, &engine, d)?),
            BevDecoder::ResNet(d) => GpuDecoder::ResNet(up_resnet(dev, &engine, d)?),
        };
        Ok(Self { engine, net })
    }

    /// The backend in use (cuDNN may have fallen back to im2col).
    pub fn backend(&self) -> ConvBackend {
        self.engine.backend()
    }

    /// The loaded cuDNN version when the decoder runs on cuDNN.
    pub fn cudnn_version(&self) -> Option<usize> {
        self.engine.cudnn_version()
    }

    /// Backbone then neck, as [`BevDecoder::forward`].
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap) -> Result<CudaFeatureMap, Error> {
        let e = &self.engine;
        match &self.net {
            GpuDecoder::Second(d) => {
                check(x, d.in_channels, "SECOND")?;
                let mut outs: Vec<CudaFeatureMap> = Vec::with_capacity(d.stages.len());
                for convs in &d.stages {
                    let mut y = convs[0].forward(dev, blas, e, outs.last().unwrap_or(x), Activation::Relu, None)?;
                    for c in &convs[1..] {
                        y = c.forward(dev, blas, e, &y, Activation::Relu, None)?;
                    }
                    outs.push(y);
                }
                let mut cat: Option<CudaFeatureMap> = None;
                for (b, s) in d.deblocks.iter().zip(&outs) {
                    let y = match b {
                        GpuUp::Conv(c) => c.forward(dev, blas, e, s, Activation::Relu, None)?,
                        GpuUp::Deconv(t) => t.forward(dev, blas, s, Activation::Relu)?,
                    };
                    cat = Some(match cat {
                        None => y,
                        Some(c) => concat_channels_cuda(dev, &c, &y)?,
                    });
                }
                cat.ok_or_else(|| Error::InvalidInput("SECONDFPN: no branches".into()))
            }
            GpuDecoder::ResNet(d) => {
                check(x, d.in_channels, "GeneralizedResNet")?;
                let mut outs: Vec<CudaFeatureMap> = Vec::with_capacity(d.layers.len());
                for blocks in &d.layers {
                    let mut y: Option<CudaFeatureMap> = None;
                    for b in blocks {
                        let input = y.as_ref().or(outs.last()).unwrap_or(x);
                        let h = b.conv1.forward(dev, blas, e, input, Activation::Relu, None)?;
                        let id = match &b.downsample {
                            Some(ds) => Some(ds.forward(dev, blas, e, input, Activation::None, None)?),
                            None => None,
                        };
                        let out = b.conv2.forward(dev, blas, e, &h, Activation::Relu, Some(id.as_ref().unwrap_or(input)))?;
                        y = Some(out);
                    }
                    outs.push(y.ok_or_else(|| Error::InvalidInput("GeneralizedResNet: a layer without blocks".into()))?);
                }
                let [i1, i2] = d.in_indices;
                let (x1, x2) = match (outs.get(i1), outs.get(i2)) {
                    (Some(a), Some(b)) => (a, b),
                    _ => return Err(Error::InvalidInput(format!("LSSFPN: {} inputs, indices {:?}", outs.len(), d.in_indices))),
                };
                let up = bilinear_resize_cuda(dev, x1, x2.h, x2.w, true)?;
                let cat = concat_channels_cuda(dev, &up, x2)?;
                drop(up);
                let y = d.fuse[0].forward(dev, blas, e, &cat, Activation::Relu, None)?;
                drop(cat);
                let y = d.fuse[1].forward(dev, blas, e, &y, Activation::Relu, None)?;
                match &d.upsample {
                    None => Ok(y),
                    Some(c) => {
                        let s = d.scale_factor;
                        let up = bilinear_resize_cuda(dev, &y, y.h * s, y.w * s, true)?;
                        c.forward(dev, blas, e, &up, Activation::Relu, None)
                    }
                }
            }
        }
    }
}
