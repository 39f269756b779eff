//! `sptr bench camera`: the CUDA camera encoder's latency (Swin-T alone, Swin-T + neck) beside its
//! FLOP count and the tensor-core floor, as JSON lines; the backbone's paths (`swin_cuda`) side
//! by side in the same run: the default (fused GEMMs, whole-window attention: `swin_t`,
//! `stages`), the per-query attention kernel (`*_perquery_attn`) and both older steps (unfused
//! GEMMs and per-query attention: `*_unfused_gemm_perquery_attn`). Also used by the camera
//! parity test to time ours in the same run as the PyTorch references.

use crate::models::bevfusion::camera::encoder::CameraEncoderConfig;
use crate::models::bevfusion::camera::encoder_cuda::CudaCameraEncoder;
use crate::models::bevfusion::camera::swin_cuda::SwinPlan;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::Error;
use cudarc::driver::CudaSlice;
use half::f16;

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

    pub fn json(&self, gpu: &str) -> String {
        format!(
            "{{\"bench\": \"camera_encoder\", \"case\": \"{}\", \"gpu\": \"{gpu}\", \"n\": {}, \"h\": {}, \"w\": {}, \"median_ms\": {:.4}, \"p90_ms\": {:.4}, \"iters\": {}, \"gflop\": {:.2}, \"tflops_achieved\": {:.1}, \"tc_peak_tflops\": {H100_SXM_FP16_TFLOPS}, \"tc_floor_ms\": {:.4}}}",
            self.case,
            self.n,
            self.h,
            self.w,
            self.median_ms,
            self.p90_ms,
            self.iters,
            self.gflop,
            self.gflop / self.median_ms, // GFLOP per ms = TFLOP/s
            self.floor_ms()
        )
    }
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

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
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
    let row = |case, ts: &[f64], gflop: f64| EncoderTiming {
        case,
        n: plan.n,
        h: plan.h,
        w: plan.w,
        median_ms: quantile(ts, 0.5),
        p90_ms: quantile(ts, 0.9),
        iters: ts.len(),
        gflop,
    };
    Ok(vec![row("swin_t", &swin, flops.backbone / 1e9), row("swin_t+fpn", &full, (flops.backbone + flops.neck) / 1e9)])
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
    let mut lines = vec![format!(
        "{{\"bench\": \"camera_encoder\", \"case\": \"plan\", \"gpu\": \"{}\", \"n\": {n}, \"h\": {h}, \"w\": {w}, \"host_ms\": {plan_ms:.3}, \"note\": \"window partitions of every stage, built once per image size\"}}",
        dev.name
    )];
    // The backbone's paths in the same run (swin_cuda module docs): the default (fused GEMMs,
    // whole-window attention) first, then the per-query attention kernel alone, then both old
    // steps (unfused GEMMs and per-query attention). Each with its per-stage breakdown.
    let (fused0, whole0) = (gpu.backbone.is_fused(), gpu.backbone.is_whole_window_attention());
    let mut variants = vec![(fused0, whole0)];
    for v in [(true, true), (true, false), (false, false)] {
        if !variants.contains(&v) {
            variants.push(v);
        }
    }
    for (fused, whole) in variants {
        gpu.set_swin_fused(&dev, fused)?;
        gpu.set_swin_whole_window_attention(whole);
        let (swin, full, stages) = variant_names(fused, whole);
        for mut row in bench_encoder(&dev, &cfg, &gpu, &plan, &x, a.warmup, a.iters)? {
            row.case = if row.case == "swin_t" { swin } else { full };
            lines.push(row.json(&dev.name));
        }
        let line = stage_breakdown(&dev, &gpu, &plan, &x, a.iters).map(|l| l.replacen("\"case\": \"stages\"", &format!("\"case\": \"{stages}\""), 1));
        lines.push(line.unwrap_or_else(|e| format!("{{\"bench\": \"camera_encoder\", \"case\": \"{stages}\", \"error\": {:?}}}", e.to_string())));
    }
    gpu.set_swin_fused(&dev, fused0)?;
    gpu.set_swin_whole_window_attention(whole0);
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
        Err(e) => lines.push(format!("{{\"bench\": \"camera_encoder\", \"case\": \"swin_t_graph\", \"graph_error\": {:?}}}", e.to_string())),
    }
    Ok(lines)
}

/// Row names of a backbone path: (Swin-T, Swin-T + neck, stage breakdown). The default path
/// (fused GEMMs, whole-window attention) has the names without a suffix.
fn variant_names(fused: bool, whole_window: bool) -> (&'static str, &'static str, &'static str) {
    match (fused, whole_window) {
        (true, true) => ("swin_t", "swin_t+fpn", "stages"),
        (true, false) => ("swin_t_perquery_attn", "swin_t+fpn_perquery_attn", "stages_perquery_attn"),
        (false, false) => ("swin_t_unfused_gemm_perquery_attn", "swin_t+fpn_unfused_gemm_perquery_attn", "stages_unfused_gemm_perquery_attn"),
        (false, true) => ("swin_t_unfused_gemm", "swin_t+fpn_unfused_gemm", "stages_unfused_gemm"),
    }
}

/// Median GPU time of each stage of the encoder (`patch_embed`, `stage{i}` with its output norm,
/// `merge{i}`, `neck`) over `iters` frames, as a JSON line: where the time goes.
pub fn stage_breakdown(dev: &CudaDevice, enc: &CudaCameraEncoder, plan: &SwinPlan, images: &CudaSlice<f16>, iters: usize) -> Result<String, Error> {
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
    let fields: Vec<String> = per
        .into_iter()
        .map(|(name, mut v)| {
            v.sort_by(f64::total_cmp);
            format!("\"{name}\": {:.4}", quantile(&v, 0.5))
        })
        .collect();
    Ok(format!(
        "{{\"bench\": \"camera_encoder\", \"case\": \"stages\", \"gpu\": \"{}\", \"n\": {}, \"h\": {}, \"w\": {}, \"median_ms\": {{{}}}}}",
        dev.name,
        plan.n,
        plan.h,
        plan.w,
        fields.join(", ")
    ))
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
            Ok(ts) => EncoderTiming { case, n: plan.n, h: plan.h, w: plan.w, median_ms: quantile(&ts, 0.5), p90_ms: quantile(&ts, 0.9), iters: ts.len(), gflop }.json(&dev.name),
            Err(e) => format!(
                "{{\"bench\": \"camera_encoder\", \"case\": \"{case}\", \"gpu\": \"{}\", \"graph_error\": {:?}}}",
                dev.name,
                e
            ),
        };
        lines.push(line);
    }
    lines
}
