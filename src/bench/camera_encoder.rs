//! `sptr bench camera`: the CUDA camera encoder's latency (Swin-T alone, Swin-T + neck) beside its
//! FLOP count and the tensor-core floor, as JSON lines; the backbone's paths (`swin_cuda`) side
//! by side in the same run: the default (fused GEMMs, whole-window attention: `swin_t`,
//! `stages`), the per-query attention kernel (`*_perquery_attn`) and both older steps (unfused
//! GEMMs and per-query attention: `*_unfused_gemm_perquery_attn`). Also used by the camera
//! parity test to time ours in the same run as the PyTorch references.

use crate::models::bevfusion::camera::encoder::CameraEncoderConfig;
use crate::models::bevfusion::camera::encoder_cuda::CudaCameraEncoder;
use crate::models::bevfusion::camera::swin_cuda::SwinPlan;
use crate::ops::attention::cuda::Bias2dKernel;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::Error;
use crate::bench::json::{line, Fixed, InOrder};
use crate::bench::percentiles::Percentiles;
use cudarc::driver::CudaSlice;
use half::f16;
use serde::Serialize;

/// Dense FP16 tensor-core peak of an H100 SXM (989.4 TFLOP/s without sparsity) used for the
/// floor: the time the FLOPs would take at that peak, a bound no implementation beats.
pub const H100_SXM_FP16_TFLOPS: f64 = 989.4;

/// One timed case.
#[derive(Debug, Clone)]
pub struct EncoderTiming {
    pub case: &'static str,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub median_ms: f64,
    pub p90_ms: f64,
    pub iters: usize,
    pub gflop: f64,
}

impl EncoderTiming {
    pub fn floor_ms(&self) -> f64 {
        self.gflop * 1e9 / (H100_SXM_FP16_TFLOPS * 1e12) * 1e3
    }

    /// The case's JSON line (`"bench": "camera_encoder"`), times to 0.0001 ms.
    pub fn json(&self, gpu: &str) -> String {
        line(&TimingRow {
            bench: BENCH,
            case: self.case,
            gpu,
            n: self.n,
            h: self.h,
            w: self.w,
            median_ms: Fixed(self.median_ms),
            p90_ms: Fixed(self.p90_ms),
            iters: self.iters,
            gflop: Fixed(self.gflop),
            tflops_achieved: Fixed(self.gflop / self.median_ms), // GFLOP per ms = TFLOP/s
            tc_peak_tflops: H100_SXM_FP16_TFLOPS,
            tc_floor_ms: Fixed(self.floor_ms()),
        })
    }

    /// A case timed `ts` (ms): its median and p90 (nearest rank).
    fn of(case: &'static str, plan: &SwinPlan, ts: &[f64], gflop: f64) -> EncoderTiming {
        let p = Percentiles::of(ts);
        EncoderTiming {
            case,
            n: plan.n,
            h: plan.h,
            w: plan.w,
            median_ms: p.as_ref().map_or(f64::NAN, |p| p.p50),
            p90_ms: p.as_ref().map_or(f64::NAN, |p| p.p90),
            iters: ts.len(),
            gflop,
        }
    }
}

/// The `bench` of every line.
const BENCH: &str = "camera_encoder";

/// The JSON of an [`EncoderTiming`], keys in this order.
#[derive(Serialize)]
struct TimingRow<'a> {
    bench: &'static str,
    case: &'a str,
    gpu: &'a str,
    n: usize,
    h: usize,
    w: usize,
    median_ms: Fixed<4>,
    p90_ms: Fixed<4>,
    iters: usize,
    gflop: Fixed<2>,
    tflops_achieved: Fixed<1>,
    tc_peak_tflops: f64,
    tc_floor_ms: Fixed<4>,
}

/// The plan's build time on the host.
#[derive(Serialize)]
struct PlanRow<'a> {
    bench: &'static str,
    case: &'static str,
    gpu: &'a str,
    n: usize,
    h: usize,
    w: usize,
    host_ms: Fixed<3>,
    note: &'static str,
}

/// A case that gave no times: `error` (a stage breakdown) or `graph_error` (a CUDA graph).
#[derive(Serialize)]
struct FailedRow<'a> {
    bench: &'static str,
    case: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    gpu: Option<&'a str>,
    #[serde(flatten)]
    why: Failure,
}

#[derive(Serialize)]
#[serde(rename_all = "snake_case")]
enum Failure {
    Error(String),
    GraphError(String),
}

/// The median GPU time of each stage of the encoder ([`stage_medians`]).
#[derive(Debug, Clone, Serialize)]
pub struct StageRow {
    pub bench: &'static str,
    /// `stages`, or a backbone path's name for it.
    pub case: String,
    pub gpu: String,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    /// Per stage in the order they ran, ms to 0.0001.
    pub median_ms: InOrder<String, Fixed<4>>,
}

/// GPU times (CUDA events on the stream) of `iters` calls of `f` after `warmup`, in ms, sorted.
pub fn event_times(dev: &CudaDevice, warmup: usize, iters: usize, mut f: impl FnMut() -> Result<(), Error>) -> Result<Vec<f64>, Error> {
    for _ in 0..warmup {
        f()?;
    }
    let flags = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut ts = Vec::with_capacity(iters);
    for _ in 0..iters.max(1) {
        let start = dev.stream.record_event(flags).map_err(cuda_err("recording an event"))?;
        f()?;
        let end = dev.stream.record_event(flags).map_err(cuda_err("recording an event"))?;
        ts.push(start.elapsed_ms(&end).map_err(cuda_err("reading an event"))? as f64);
    }
    ts.sort_by(f64::total_cmp);
    Ok(ts)
}

/// Times the backbone alone and backbone + neck on `images` (NHWC FP16 on the device, the plan's
/// size).
pub fn bench_encoder(
    dev: &CudaDevice,
    cfg: &CameraEncoderConfig,
    enc: &CudaCameraEncoder,
    plan: &SwinPlan,
    images: &CudaSlice<f16>,
    warmup: usize,
    iters: usize,
) -> Result<Vec<EncoderTiming>, Error> {
    let flops = cfg.flops(plan.n, plan.h, plan.w);
    let swin = event_times(dev, warmup, iters, || enc.backbone(dev, plan, images).map(drop))?;
    let full = event_times(dev, warmup, iters, || enc.forward(dev, plan, images).map(drop))?;
    Ok(vec![EncoderTiming::of("swin_t", plan, &swin, flops.backbone / 1e9), EncoderTiming::of("swin_t+fpn", plan, &full, (flops.backbone + flops.neck) / 1e9)])
}

/// Smooth, image-like normalized RGB, NHWC `[n, h, w, 3]` (deterministic): the benchmark's input
/// when no real batch is given (the encoder's time does not depend on pixel values).
pub fn synthetic_images(n: usize, h: usize, w: usize) -> Vec<f32> {
    let mut x = vec![0f32; n * h * w * 3];
    for b in 0..n {
        for y in 0..h {
            for xx in 0..w {
                let (fy, fx) = (y as f32 / h as f32, xx as f32 / w as f32);
                for c in 0..3 {
                    x[((b * h + y) * w + xx) * 3 + c] = (9.0 * fx + 2.0 * c as f32 + b as f32).sin() * (5.0 * fy).cos() + if fy > 0.55 { 0.9 } else { -0.4 };
                }
            }
        }
    }
    x
}

/// What `sptr bench camera` runs.
#[derive(Debug, Clone)]
pub struct CameraBenchArgs {
    pub model: std::path::PathBuf,
    /// Normalized NCHW `.npy` batch; None: `n` synthetic images of `h × w`.
    pub input: Option<std::path::PathBuf>,
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub seed: u64,
    pub warmup: usize,
    pub iters: usize,
}

/// `sptr bench camera`: JSON lines (plan build, Swin-T alone, Swin-T + neck).
pub fn run_bench(a: &CameraBenchArgs) -> Result<Vec<String>, Error> {
    use crate::models::bevfusion::camera::encoder::{random_weights, CameraEncoder};
    let cfg = CameraEncoderConfig::load(&a.model)?;
    let (images, n, h, w) = match &a.input {
        Some(p) => crate::ops::image_preprocess::cpu::read_input_npy(p)?,
        None => (synthetic_images(a.n, a.h, a.w), a.n, a.h, a.w),
    };
    let enc = CameraEncoder::from_weights(&cfg, random_weights(&cfg, a.seed)?)?;
    let dev = CudaDevice::new(0)?;
    let mut gpu = CudaCameraEncoder::upload(&dev, &enc)?;
    let t = std::time::Instant::now();
    let plan = gpu.plan(&dev, n, h, w)?;
    let plan_ms = t.elapsed().as_secs_f64() * 1e3;
    let h16: Vec<f16> = images.iter().map(|&v| f16::from_f32(v)).collect();
    let x = dev.stream.clone_htod(&h16).map_err(cuda_err("uploading images"))?;
    let mut lines = vec![line(&PlanRow {
        bench: BENCH,
        case: "plan",
        gpu: &dev.name,
        n,
        h,
        w,
        host_ms: Fixed(plan_ms),
        note: "window partitions of every stage, built once per image size",
    })];
    // The backbone's paths in the same run (swin_cuda module docs): the default (fused GEMMs,
    // attention on tensor cores) first, then the FP32 whole-window and the per-query attention
    // kernels alone, then both old steps (unfused GEMMs and per-query attention). Each with its
    // per-stage breakdown.
    let (fused0, kernel0) = (gpu.backbone.is_fused(), gpu.backbone.attention_kernel());
    let mut variants = vec![(fused0, kernel0)];
    for v in [(true, Bias2dKernel::TensorCores), (true, Bias2dKernel::WholeWindow), (true, Bias2dKernel::PerQuery), (false, Bias2dKernel::PerQuery)] {
        if !variants.contains(&v) {
            variants.push(v);
        }
    }
    for (fused, kernel) in variants {
        gpu.set_swin_fused(&dev, fused)?;
        gpu.set_swin_attention_kernel(kernel);
        let (swin, full, stages) = variant_names(fused, kernel);
        for mut row in bench_encoder(&dev, &cfg, &gpu, &plan, &x, a.warmup, a.iters)? {
            row.case = if row.case == "swin_t" { swin } else { full };
            lines.push(row.json(&dev.name));
        }
        lines.push(match stage_medians(&dev, &gpu, &plan, &x, a.iters) {
            Ok(row) => line(&StageRow { case: stages.to_string(), ..row }),
            Err(e) => line(&FailedRow { bench: BENCH, case: stages, gpu: None, why: Failure::Error(e.to_string()) }),
        });
    }
    gpu.set_swin_fused(&dev, fused0)?;
    gpu.set_swin_attention_kernel(kernel0);
    // last: a capture the driver refuses must not cost the numbers above
    // The CUDA graph: captured on a second device handle (its own stream), the encoder uploaded there.
    drop((gpu, x));
    let graph_lines = (|| -> Result<Vec<String>, Error> {
        let dev2 = CudaDevice::new(0)?;
        let gpu2 = CudaCameraEncoder::upload(&dev2, &enc)?;
        let plan2 = gpu2.plan(&dev2, n, h, w)?;
        let x2 = dev2.stream.clone_htod(&h16).map_err(cuda_err("uploading images"))?;
        Ok(bench_encoder_graph(&dev2, &cfg, &gpu2, &plan2, &x2, a.warmup, a.iters))
    })();
    match graph_lines {
        Ok(l) => lines.extend(l),
        Err(e) => lines.push(line(&FailedRow { bench: BENCH, case: "swin_t_graph", gpu: None, why: Failure::GraphError(e.to_string()) })),
    }
    Ok(lines)
}

/// Row names of a backbone path: (Swin-T, Swin-T + neck, stage breakdown). The default path
/// (fused GEMMs, attention on tensor cores) has the names without a suffix.
fn variant_names(fused: bool, kernel: Bias2dKernel) -> (&'static str, &'static str, &'static str) {
    use Bias2dKernel::*;
    match (fused, kernel) {
        (true, TensorCores) => ("swin_t", "swin_t+fpn", "stages"),
        (true, WholeWindow) => ("swin_t_fp32_window_attn", "swin_t+fpn_fp32_window_attn", "stages_fp32_window_attn"),
        (true, PerQuery) => ("swin_t_perquery_attn", "swin_t+fpn_perquery_attn", "stages_perquery_attn"),
        (false, TensorCores) => ("swin_t_unfused_gemm", "swin_t+fpn_unfused_gemm", "stages_unfused_gemm"),
        (false, WholeWindow) => ("swin_t_unfused_gemm_fp32_window_attn", "swin_t+fpn_unfused_gemm_fp32_window_attn", "stages_unfused_gemm_fp32_window_attn"),
        (false, PerQuery) => ("swin_t_unfused_gemm_perquery_attn", "swin_t+fpn_unfused_gemm_perquery_attn", "stages_unfused_gemm_perquery_attn"),
    }
}

/// Median GPU time of each stage of the encoder (`patch_embed`, `stage{i}` with its output norm,
/// `merge{i}`, `neck`) over `iters` frames, as a JSON line (`"case": "stages"`): where the time goes.
pub fn stage_breakdown(dev: &CudaDevice, enc: &CudaCameraEncoder, plan: &SwinPlan, images: &CudaSlice<f16>, iters: usize) -> Result<String, Error> {
    stage_medians(dev, enc, plan, images, iters).map(|row| line(&row))
}

/// The median (nearest rank) GPU time of each stage of the encoder over `iters` frames.
pub fn stage_medians(dev: &CudaDevice, enc: &CudaCameraEncoder, plan: &SwinPlan, images: &CudaSlice<f16>, iters: usize) -> Result<StageRow, Error> {
    use crate::device::clock::GpuClock;
    use crate::models::sphereformer::network::StageTimes;
    let mut per: Vec<(String, Vec<f64>)> = Vec::new();
    for _ in 0..iters.max(1) {
        let mut clock = GpuClock::start(dev)?;
        drop(enc.forward_timed(dev, plan, images, &mut clock)?);
        let mut t = StageTimes::default();
        clock.finish(&mut t)?;
        for (k, (name, d)) in t.stages.into_iter().enumerate() {
            if per.len() <= k {
                per.push((name, Vec::new()));
            }
            per[k].1.push(d.as_secs_f64() * 1e3);
        }
    }
    Ok(StageRow {
        bench: BENCH,
        case: "stages".into(),
        gpu: dev.name.clone(),
        n: plan.n,
        h: plan.h,
        w: plan.w,
        median_ms: per.into_iter().map(|(name, v)| (name, Fixed(Percentiles::median(&v)))).collect(),
    })
}

/// The encoder captured once into a CUDA graph (after the warm-up of [`bench_encoder`]) and
/// replayed: the time without host launch overheads, like timm's CUDA-graph number. Best effort:
/// a capture the driver refuses is reported in the line (`graph_error`), not an error.
pub fn bench_encoder_graph(
    dev: &CudaDevice,
    cfg: &CameraEncoderConfig,
    enc: &CudaCameraEncoder,
    plan: &SwinPlan,
    images: &CudaSlice<f16>,
    warmup: usize,
    iters: usize,
) -> Vec<String> {
    use cudarc::driver::sys;
    let flops = cfg.flops(plan.n, plan.h, plan.w);
    let mut lines = Vec::new();
    for (case, with_neck, gflop) in [("swin_t_graph", false, flops.backbone / 1e9), ("swin_t+fpn_graph", true, (flops.backbone + flops.neck) / 1e9)] {
        let s = &dev.stream;
        let captured = (|| -> Result<cudarc::driver::CudaGraph, String> {
            // warm: kernels loaded, cuBLAS workspace allocated, pool grown (none of it may happen
            // inside a capture)
            for _ in 0..2 {
                enc.forward(dev, plan, images).map_err(|e| e.to_string())?;
            }
            dev.synchronize().map_err(|e| e.to_string())?;
            s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED).map_err(|e| format!("begin capture: {e:?}"))?;
            let run = if with_neck { enc.forward(dev, plan, images).map(drop) } else { enc.backbone(dev, plan, images).map(drop) };
            // the capture always ends, so the stream is usable again whatever happened inside
            let graph = s.end_capture(sys::CUgraphInstantiate_flags(0));
            run.map_err(|e| format!("captured forward: {e}"))?;
            let graph = graph.map_err(|e| format!("end capture / instantiate: {e:?}"))?.ok_or("empty graph")?;
            graph.upload().map_err(|e| format!("graph upload: {e:?}"))?;
            Ok(graph)
        })();
        let line = match captured.and_then(|g| event_times(dev, warmup, iters, || g.launch().map_err(cuda_err("graph launch"))).map_err(|e| e.to_string())) {
            Ok(ts) => EncoderTiming::of(case, plan, &ts, gflop).json(&dev.name),
            Err(e) => line(&FailedRow { bench: BENCH, case, gpu: Some(&dev.name), why: Failure::GraphError(e) }),
        };
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::json::parse_row;

    /// Each kind of line parses back with its keys in the order the lines have always had them.
    #[test]
    fn the_rows_are_json_with_their_keys_in_order() {
        let t = EncoderTiming { case: "swin_t", n: 6, h: 256, w: 704, median_ms: 4.56789, p90_ms: 5.0, iters: 50, gflop: 123.456 };
        let keys = ["bench", "case", "gpu", "n", "h", "w", "median_ms", "p90_ms", "iters", "gflop", "tflops_achieved", "tc_peak_tflops", "tc_floor_ms"];
        let v = parse_row(&t.json("H100"), &keys);
        assert_eq!((v["bench"].as_str(), v["median_ms"].as_f64(), v["gflop"].as_f64()), (Some("camera_encoder"), Some(4.5679), Some(123.46)));
        assert_eq!((v["tflops_achieved"].as_f64(), v["tc_peak_tflops"].as_f64()), (Some(27.0), Some(989.4)));
        let plan = line(&PlanRow { bench: BENCH, case: "plan", gpu: "H100", n: 6, h: 256, w: 704, host_ms: Fixed(1.23456), note: "n" });
        let v = parse_row(&plan, &["bench", "case", "gpu", "n", "h", "w", "host_ms", "note"]);
        assert_eq!(v["host_ms"].as_f64(), Some(1.235));
        let stages = StageRow {
            bench: BENCH,
            case: "stages".into(),
            gpu: "H100".into(),
            n: 6,
            h: 256,
            w: 704,
            median_ms: [("patch_embed".to_string(), Fixed(0.1)), ("stage0".to_string(), Fixed(1.0))].into_iter().collect(),
        };
        let text = line(&stages);
        parse_row(&text, &["bench", "case", "gpu", "n", "h", "w", "median_ms"]);
        assert!(text.ends_with(r#""median_ms":{"patch_embed":0.1,"stage0":1.0}}"#), "stages in the order they ran: {text}");
        let failed = line(&FailedRow { bench: BENCH, case: "stages", gpu: None, why: Failure::Error("out of memory".into()) });
        assert_eq!(parse_row(&failed, &["bench", "case", "error"])["error"], "out of memory");
        let failed = line(&FailedRow { bench: BENCH, case: "swin_t_graph", gpu: Some("H100"), why: Failure::GraphError("capture".into()) });
        parse_row(&failed, &["bench", "case", "gpu", "graph_error"]);
    }
}
