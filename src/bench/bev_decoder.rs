//! `sptr bench bev-decoder`: the CUDA fuser, BEV decoder and map head of each BEVFusion seg
//! model (random weights, random BEV maps of the full size) on both dense-conv backends — cuDNN
//! and im2col + cuBLAS — side by side, as JSON lines: per part the median, p90 and minimum GPU
//! time (CUDA events) over repeated runs. A backend that cannot load (cuDNN missing) gives one
//! line saying so instead of numbers.

use crate::models::bevfusion::config::BevConfig;
use crate::models::bevfusion::bev_stack::{part_gflop, random_weights, BevStack};
use crate::models::bevfusion::bev_stack_cuda::CudaBevStack;
use crate::bench::camera_encoder::event_times;
use crate::ops::dense::conv_engine::ConvBackend;
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::ops::dense::FeatureMap;
use crate::device::cuda::CudaDevice;
use crate::nn::random::SplitMix;
use crate::Error;
use cudarc::cublas::CudaBlas;
use std::path::PathBuf;

/// What `sptr bench bev-decoder` runs.
#[derive(Debug, Clone)]
pub struct BevDecoderBenchArgs {
    /// Model YAMLs (each read for `model.fuser`, `model.decoder`, `model.heads.map`).
    pub models: Vec<PathBuf>,
    pub seed: u64,
    /// Untimed runs of each part first (at least one: cuDNN plans its algorithms on first use).
    pub warmup: usize,
    pub iters: usize,
    /// Side of the square input BEV (128 for BEVFusion's seg models).
    pub bev: usize,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[allow(clippy::too_many_arguments)]
fn row(gpu: &str, model: &str, backend: &str, cudnn: Option<usize>, part: &str, ts: &[f64], gflop: f64) -> String {
    let cudnn = cudnn.map_or("null".to_string(), |v| v.to_string());
    let median = quantile(ts, 0.5);
    format!(
        "{{\"bench\": \"bev_decoder\", \"gpu\": \"{gpu}\", \"model\": \"{model}\", \"backend\": \"{backend}\", \"cudnn_version\": {cudnn}, \"part\": \"{part}\", \"median_ms\": {median:.4}, \"p90_ms\": {:.4}, \"min_ms\": {:.4}, \"iters\": {}, \"gflop\": {gflop:.2}, \"tflops_achieved\": {:.1}}}",
        quantile(ts, 0.9),
        ts[0],
        ts.len(),
        gflop / median // GFLOP per ms = TFLOP/s
    )
}

/// JSON lines for every model × backend × part (fuser, decoder, head, all).
pub fn run_bench(a: &BevDecoderBenchArgs) -> Result<Vec<String>, Error> {
    let dev = CudaDevice::new(0)?;
    let blas = CudaBlas::new(dev.stream.clone()).map_err(|e| Error::Cuda(format!("cuBLAS: {e:?}")))?;
    let warmup = a.warmup.max(1);
    let mut lines = Vec::new();
    for path in &a.models {
        let cfg = BevConfig::load(path)?;
        let model = path.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned());
        let stack = BevStack::from_weights(&cfg, random_weights(&cfg, a.seed)?)?;
        let mut rng = SplitMix(a.seed + 1);
        let chans: Vec<usize> = match &cfg.fuser {
            Some(f) => f.in_channels.clone(),
            None => vec![cfg.decoder.in_channels()],
        };
        let inputs = chans
            .iter()
            .map(|&c| {
                let v = (0..a.bev * a.bev * c).map(|_| rng.uniform(-1.0, 1.0)).collect();
                CudaFeatureMap::upload(&dev, &FeatureMap::new(1, a.bev, a.bev, c, v)?)
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let refs: Vec<&CudaFeatureMap> = inputs.iter().collect();
        for backend in [ConvBackend::Cudnn, ConvBackend::Im2col] {
            // a backend that fails (a cuDNN error) gives a line saying so; the other still runs
            match bench_backend(&dev, &blas, &stack, &refs, &model, backend, warmup, a.iters, part_gflop(&stack, a.bev)) {
                Ok(mut l) => lines.append(&mut l),
                Err(e) => lines.push(format!(
                    "{{\"bench\": \"bev_decoder\", \"gpu\": \"{}\", \"model\": \"{model}\", \"backend\": \"{}\", \"error\": {:?}}}",
                    dev.name,
                    backend.name(),
                    e.to_string()
                )),
            }
        }
    }
    Ok(lines)
}

/// The lines of one model on one backend.
#[allow(clippy::too_many_arguments)]
fn bench_backend(
    dev: &CudaDevice,
    blas: &CudaBlas,
    stack: &BevStack,
    refs: &[&CudaFeatureMap],
    model: &str,
    backend: ConvBackend,
    warmup: usize,
    iters: usize,
    gflop: [f64; 3],
) -> Result<Vec<String>, Error> {
    let g = CudaBevStack::upload(dev, stack, backend)?;
    if g.backend() != backend {
        return Ok(vec![format!(
            "{{\"bench\": \"bev_decoder\", \"gpu\": \"{}\", \"model\": \"{model}\", \"backend\": \"{}\", \"skipped\": \"cuDNN could not be loaded (see the log line on stderr)\"}}",
            dev.name,
            backend.name()
        )]);
    }
    let cudnn = g.decoder.cudnn_version();
    let name = backend.name();
    let mut lines = Vec::new();
    // each part on fixed inputs: the previous part's output, computed once
    let stages = g.forward(dev, blas, refs)?;
    let decoder_in = stages.fused.as_ref().unwrap_or(refs[0]);
    if let Some(f) = &g.fuser {
        let ts = event_times(dev, warmup, iters, || f.forward(dev, blas, refs).map(drop))?;
        lines.push(row(&dev.name, model, name, cudnn, "fuser", &ts, gflop[0]));
    }
    let ts = event_times(dev, warmup, iters, || g.decoder.forward(dev, blas, decoder_in).map(drop))?;
    lines.push(row(&dev.name, model, name, cudnn, "decoder", &ts, gflop[1]));
    let ts = event_times(dev, warmup, iters, || g.head.forward(dev, blas, &stages.decoded).map(drop))?;
    lines.push(row(&dev.name, model, name, cudnn, "head", &ts, gflop[2]));
    let ts = event_times(dev, warmup, iters, || g.forward(dev, blas, refs).map(drop))?;
    lines.push(row(&dev.name, model, name, cudnn, "all", &ts, gflop.iter().sum()));
    Ok(lines)
}
