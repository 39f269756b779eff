//! `sptr bench bev-decoder`: the CUDA fuser, BEV decoder and map head of each BEVFusion seg
//! model (random weights, random BEV maps of the full size) on both dense-conv backends — cuDNN
//! and im2col + cuBLAS — side by side, as JSON lines: per part the median, p90 (nearest rank) and minimum GPU
//! time (CUDA events) over repeated runs. A backend that cannot load (cuDNN missing) gives one
//! line saying so instead of numbers.

use crate::models::bevfusion::config::BevConfig;
use crate::models::bevfusion::bev_stack::{part_gflop, random_weights, BevStack};
use crate::models::bevfusion::bev_stack_cuda::CudaBevStack;
use crate::bench::camera_encoder::event_times;
use crate::bench::json::{line, Fixed};
use crate::bench::percentiles::Percentiles;
use crate::ops::dense::conv_engine::ConvBackend;
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::ops::dense::FeatureMap;
use crate::device::cuda::CudaDevice;
use crate::nn::random::SplitMix;
use crate::Error;
use cudarc::cublas::CudaBlas;
use serde::Serialize;
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

/// What every line names: the bench, the GPU, the model and the backend.
#[derive(Serialize)]
struct Head<'a> {
    bench: &'static str,
    gpu: &'a str,
    model: &'a str,
    backend: &'a str,
}

impl<'a> Head<'a> {
    fn new(gpu: &'a str, model: &'a str, backend: &'a str) -> Head<'a> {
        Head { bench: "bev_decoder", gpu, model, backend }
    }
}

/// A timed part: median, p90 (nearest rank) and minimum GPU ms.
#[derive(Serialize)]
struct PartRow<'a> {
    #[serde(flatten)]
    head: Head<'a>,
    cudnn_version: Option<usize>,
    part: &'a str,
    median_ms: Fixed<4>,
    p90_ms: Fixed<4>,
    min_ms: Fixed<4>,
    iters: usize,
    gflop: Fixed<2>,
    tflops_achieved: Fixed<1>,
}

/// A backend that gave no times: the error, or why it was skipped.
#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum Untimed {
    Error(String),
    Skipped(&'static str),
}

#[derive(Serialize)]
struct UntimedRow<'a> {
    #[serde(flatten)]
    head: Head<'a>,
    #[serde(flatten)]
    why: Untimed,
}

#[allow(clippy::too_many_arguments)]
fn row(gpu: &str, model: &str, backend: &str, cudnn: Option<usize>, part: &str, ts: &[f64], gflop: f64) -> String {
    let p = Percentiles::of(ts);
    let median = p.as_ref().map_or(f64::NAN, |p| p.p50);
    line(&PartRow {
        head: Head::new(gpu, model, backend),
        cudnn_version: cudnn,
        part,
        median_ms: Fixed(median),
        p90_ms: Fixed(p.as_ref().map_or(f64::NAN, |p| p.p90)),
        min_ms: Fixed(ts.iter().copied().fold(f64::INFINITY, f64::min)),
        iters: ts.len(),
        gflop: Fixed(gflop),
        tflops_achieved: Fixed(gflop / median), // GFLOP per ms = TFLOP/s
    })
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
                Err(e) => lines.push(line(&UntimedRow { head: Head::new(&dev.name, &model, backend.name()), why: Untimed::Error(e.to_string()) })),
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
        let why = Untimed::Skipped("cuDNN could not be loaded (see the log line on stderr)");
        return Ok(vec![line(&UntimedRow { head: Head::new(&dev.name, model, backend.name()), why })]);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::json::parse_row;

    /// Each kind of line parses back with its keys in the order the lines have always had them.
    #[test]
    fn the_rows_are_json_with_their_keys_in_order() {
        let head = ["bench", "gpu", "model", "backend"];
        let text = row("H100", "bevfusion_seg_fusion", "cudnn", Some(90100), "decoder", &[1.0, 2.0, 3.0, 4.0], 12.3456);
        let keys = [&head[..], &["cudnn_version", "part", "median_ms", "p90_ms", "min_ms", "iters", "gflop", "tflops_achieved"]].concat();
        let v = parse_row(&text, &keys);
        assert_eq!((v["bench"].as_str(), v["cudnn_version"].as_u64(), v["iters"].as_u64()), (Some("bev_decoder"), Some(90100), Some(4)));
        assert_eq!((v["median_ms"].as_f64(), v["p90_ms"].as_f64(), v["min_ms"].as_f64()), (Some(2.0), Some(4.0), Some(1.0)));
        assert_eq!((v["gflop"].as_f64(), v["tflops_achieved"].as_f64()), (Some(12.35), Some(6.2)));
        let v = parse_row(&row("H100", "m", "im2col", None, "all", &[1.0], 1.0), &keys);
        assert!(v["cudnn_version"].is_null());
        let text = line(&UntimedRow { head: Head::new("H100", "m", "cudnn"), why: Untimed::Error("no \"cudnn\"".into()) });
        let v = parse_row(&text, &[&head[..], &["error"]].concat());
        assert_eq!(v["error"], "no \"cudnn\"");
        let text = line(&UntimedRow { head: Head::new("H100", "m", "cudnn"), why: Untimed::Skipped("cuDNN could not be loaded") });
        parse_row(&text, &[&head[..], &["skipped"]].concat());
    }
}
