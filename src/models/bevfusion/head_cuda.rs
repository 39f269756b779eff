//! The map head on CUDA: `bev_head.rs`'s BEVSegmentationHead with the grid uploaded once,
//! `grid_sample` in FP16 (FP32 weights and sums), the two conv3×3-BN-ReLU on the chosen
//! [`ConvEngine`], and the class logits as an FP32 GEMM whose epilogue adds the bias, applies
//! the sigmoid and writes the class-major FP32 maps.

use crate::models::bevfusion::head::{BevMaps, BevSegHead};
use crate::ops::dense::conv_engine::{ConvBackend, ConvEngine, GpuConv};
use crate::ops::dense::cuda::{CudaConv2d, CudaFeatureMap};
use crate::ops::dense::cuda_ops::{grid_sample_cuda, sigmoid_class_major_cuda};
use crate::ops::dense::{Activation, GridPadding};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::Error;
use cudarc::cublas::CudaBlas;
use cudarc::driver::CudaSlice;

/// Probability maps on the device: FP32 `[n][classes][x][y]` (as [`BevMaps`]).
pub struct CudaBevMaps {
    pub n: usize,
    pub classes: usize,
    pub x: usize,
    pub y: usize,
    pub data: CudaSlice<f32>,
}

impl CudaBevMaps {
    /// Copies the maps to the host (synchronises the stream).
    pub fn download(&self, dev: &CudaDevice) -> Result<BevMaps, Error> {
        let len = self.n * self.classes * self.x * self.y;
        let v = dev.stream.clone_dtoh(&self.data.slice(0..len.max(1))).map_err(cuda_err("downloading the probability maps"))?;
        Ok(BevMaps { n: self.n, classes: self.classes, x: self.x, y: self.y, data: v[..len].to_vec() })
    }
}

/// [`BevSegHead`] on the device.
pub struct CudaBevSegHead {
    engine: ConvEngine,
    in_channels: usize,
    out_x: usize,
    out_y: usize,
    grid: CudaSlice<f32>,
    convs: [GpuConv; 2],
    logits: CudaConv2d,
}

impl CudaBevSegHead {
    pub fn upload(dev: &CudaDevice, cpu: &BevSegHead, backend: ConvBackend) -> Result<Self, Error> {
        let engine = ConvEngine::new(dev, backend);
        let convs = [GpuConv::upload(dev, &engine, &cpu.convs[0])?, GpuConv::upload(dev, &engine, &cpu.convs[1])?];
        Ok(Self {
            in_channels: cpu.config.in_channels,
            out_x: cpu.out_x,
            out_y: cpu.out_y,
            grid: dev.stream.clone_htod(&cpu.grid).map_err(cuda_err("uploading the head's grid"))?,
            convs,
            // a 1×1 conv to a handful of classes: a GEMM whose FP32 output the sigmoid reads
            logits: CudaConv2d::upload(dev, &cpu.logits)?,
            engine,
        })
    }

    /// The backend in use (cuDNN may have fallen back to im2col).
    pub fn backend(&self) -> ConvBackend {
        self.engine.backend()
    }

    /// `BEVGridTransform` alone (for parity).
    pub fn transform(&self, dev: &CudaDevice, x: &CudaFeatureMap) -> Result<CudaFeatureMap, Error> {
        if x.c != self.in_channels || x.n == 0 || x.h == 0 || x.w == 0 {
            return Err(Error::InvalidInput(format!(
                "map head: input [n {}, {} x {}, c {}], expected {} channels and a non-empty map",
                x.n, x.h, x.w, x.c, self.in_channels
            )));
        }
        grid_sample_cuda(dev, x, &self.grid, self.out_x, self.out_y, GridPadding::Zeros, false)
    }

    /// Probability maps of the decoder's map, as [`BevSegHead::forward`].
    pub fn forward(&self, dev: &CudaDevice, blas: &CudaBlas, x: &CudaFeatureMap) -> Result<CudaBevMaps, Error> {
        let g = self.transform(dev, x)?;
        let y = self.convs[0].forward(dev, blas, &self.engine, &g, Activation::Relu, None)?;
        drop(g);
        let y = self.convs[1].forward(dev, blas, &self.engine, &y, Activation::Relu, None)?;
        let (acc, oh, ow) = self.logits.forward_acc(dev, blas, &y)?;
        let data = sigmoid_class_major_cuda(dev, &acc, y.n, oh * ow, self.logits.bias())?;
        Ok(CudaBevMaps { n: y.n, classes: self.logits.cout, x: oh, y: ow, data })
    }
}
