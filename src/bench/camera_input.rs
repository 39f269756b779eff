//! `sptr bench camera-input`: the camera input stage per frame — JPEG decode (all cameras in
//! parallel), upload, resize + crop + normalize — as one JSON object.
//!
//! Reported (milliseconds, median (nearest rank) of `iters` after `warmup`):
//! - `decode_single_ms`: each image decoded alone on one thread;
//! - `decode_parallel_ms`: all images decoded at once on the rayon pool (`rayon_threads`);
//! - `cpu_preprocess_ms`: the CPU reference preprocessing of the decoded images (parallel);
//! - `gpu_checks_single_ms` / `gpu_checks_parallel_ms`: the host checks every JPEG passes before
//!   nvJPEG is given it (headers, stray markers, every scan walked to its last MCU), each image
//!   alone and all at once;
//! - with CUDA, `cuda.frame_ms`: JPEG bytes on the host to the FP16 network input on the GPU
//!   (decode into pinned memory, upload, kernel, synchronised) — the bar is 8 ms for six
//!   1600 × 900 images, the goal 3 ms; `cuda.decoded_frame_ms`: the same from decoded images
//!   (copy into pinned memory instead of decoding there); `cuda.upload_ms` and `cuda.kernel_ms`
//!   (CUDA events) and `cuda.upload_mb` (bytes uploaded); `cuda.decoders`: the frame with each
//!   JPEG decoder side by side (zune-jpeg on the host, nvJPEG on the device), medians of
//!   alternating rounds, and how many images each decoded on the GPU / CPU.

use crate::bench::percentiles::Percentiles;
use crate::sensors::image::compressed::decode_jpeg;
use crate::sensors::image::encodings::{DecodeLimits, RgbImage};
use crate::sensors::image::jpeg_markers::check_before_gpu;
use crate::ops::image_preprocess::cpu::{preprocess_cpu, ImagePreprocess};
use crate::Error;
use rayon::prelude::*;
use serde_json::{json, Value};
use std::time::Instant;

/// Median wall time of `f` in milliseconds over `iters` runs after `warmup` runs.
fn time_ms(warmup: usize, iters: usize, mut f: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
    for _ in 0..warmup {
        f()?;
    }
    let mut t = Vec::with_capacity(iters.max(1));
    for _ in 0..iters.max(1) {
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    Ok(Percentiles::median(&t))
}

/// Times the CPU part of the camera input stage on `jpegs` (one frame = all of them).
pub fn camera_input_bench(jpegs: &[Vec<u8>], cfg: &ImagePreprocess, limits: &DecodeLimits, warmup: usize, iters: usize) -> Result<Value, Error> {
    if jpegs.is_empty() {
        return Err(Error::InvalidInput("camera-input bench needs at least one JPEG".into()));
    }
    let decode_all = || -> Result<Vec<RgbImage>, Error> {
        jpegs.par_iter().map(|j| decode_jpeg(j, limits).map_err(Error::from)).collect()
    };
    let images = decode_all()?;
    let sizes: Vec<[usize; 2]> = images.iter().map(|i| [i.width, i.height]).collect();
    let mut single = Vec::with_capacity(jpegs.len());
    for j in jpegs {
        single.push(time_ms(warmup, iters, || decode_jpeg(j, limits).map(|_| ()).map_err(Error::from))?);
    }
    let parallel = time_ms(warmup, iters, || decode_all().map(|_| ()))?;
    let check = |j: &Vec<u8>| check_before_gpu(j, limits).map(|_| ()).map_err(Error::from);
    let mut checks_single = Vec::with_capacity(jpegs.len());
    for j in jpegs {
        checks_single.push(time_ms(warmup, iters, || check(j))?);
    }
    let checks_parallel = time_ms(warmup, iters, || jpegs.par_iter().try_for_each(check))?;
    let refs: Vec<&RgbImage> = images.iter().collect();
    let cpu_pre = time_ms(warmup.min(1), iters.min(5), || preprocess_cpu(&refs, cfg).map(|_| ()).map_err(Error::from))?;
    Ok(json!({
        "bench": "camera-input",
        "images": jpegs.len(),
        "sizes": sizes,
        "out": [cfg.out_h, cfg.out_w],
        "rayon_threads": rayon::current_num_threads(),
        "iters": iters,
        "decoder": "zune-jpeg",
        "decode_single_ms": single,
        "decode_parallel_ms": parallel,
        "cpu_preprocess_ms": cpu_pre,
        "gpu_checks_single_ms": checks_single,
        "gpu_checks_parallel_ms": checks_parallel,
        "bar_ms": 8.0,
        "goal_ms": 3.0,
    }))
}

/// Times the CUDA camera input stage on `jpegs` (the `cuda` object of the bench's JSON), with
/// each JPEG decoder `decoders` names side by side: zune-jpeg on the host (`cpu`) and nvJPEG on
/// the device (`nvjpeg`; with `auto`, whichever loads). The frame is timed in `rounds` rounds
/// that alternate the decoders (so drifting clocks hit both alike), each the median of `iters`
/// frames; reported per decoder: every round's median and their median.
#[cfg(feature = "cuda-core")]
#[allow(clippy::too_many_arguments)]
pub fn camera_input_bench_cuda(
    dev: &crate::device::cuda::CudaDevice,
    jpegs: &[Vec<u8>],
    cfg: &ImagePreprocess,
    limits: &DecodeLimits,
    warmup: usize,
    iters: usize,
    decoders: &[crate::sensors::image::compressed::JpegDecoderChoice],
    rounds: usize,
) -> Result<Value, Error> {
    use crate::sensors::image::compressed::JpegDecoderChoice;
    use crate::ops::image_preprocess::cuda::CameraPreprocessCuda;
    let decoded: Vec<RgbImage> = jpegs.par_iter().map(|j| decode_jpeg(j, limits).map_err(Error::from)).collect::<Result<_, _>>()?;
    let images: Vec<&RgbImage> = decoded.iter().collect();
    let slices: Vec<&[u8]> = jpegs.iter().map(|j| j.as_slice()).collect();
    let mut pres = Vec::new();
    let mut unavailable = Vec::new();
    for &d in decoders {
        let pre = CameraPreprocessCuda::with_decoder(dev, cfg.clone(), d);
        match (d, pre) {
            (_, Ok(p)) => pres.push((d, p)),
            // `nvjpeg` where it cannot load: reported, the other decoders still run.
            (JpegDecoderChoice::Nvjpeg, Err(e)) => unavailable.push(json!({"decoder": "nvjpeg", "error": e.to_string()})),
            (_, Err(e)) => return Err(e),
        }
    }
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); pres.len()];
    for _ in 0..rounds.max(1) {
        for (k, (_, pre)) in pres.iter_mut().enumerate() {
            runs[k].push(time_ms(warmup, iters, || {
                pre.run_jpeg(dev, &slices, limits)?;
                dev.synchronize()
            })?);
        }
    }
    let mut per_decoder = Vec::new();
    for ((choice, pre), r) in pres.iter().zip(&runs) {
        let st = pre.jpeg_stats();
        per_decoder.push(json!({
            "choice": choice.to_string(),
            "decoder": pre.jpeg_decoder(),
            "nvjpeg": pre.uses_nvjpeg(),
            "frame_ms": Percentiles::median(r),
            "frame_ms_rounds": r,
            "gpu_decoded": st.gpu.len(),
            "cpu_decoded": if pre.uses_nvjpeg() { st.cpu_fallback.len() } else { jpegs.len() },
            "cpu_fallback_reasons": st.cpu_fallback.iter().map(|(i, w)| format!("camera {i}: {w}")).collect::<Vec<_>>(),
            "bar_ms": 8.0,
            "goal_ms": 3.0,
        }));
    }
    let mut pre = CameraPreprocessCuda::new(cfg.clone());
    let decoded_ms = time_ms(warmup, iters, || {
        pre.run(dev, &images)?;
        dev.synchronize()
    })?;
    // The last call staged the decoded images: time upload and kernel alone on them.
    let upload = dev.time_median_ms(warmup, iters, || pre.upload(dev))?;
    let kernel = dev.time_median_ms(warmup, iters, || pre.launch(dev).map(|_| ()))?;
    let upload_mb = pre.upload_bytes() as f64 / 1e6;
    // `frame_ms`: the zune-jpeg frame as reported before the decoders were compared.
    let zune = per_decoder.iter().find(|d| d["nvjpeg"] == json!(false)).map(|d| d["frame_ms"].clone()).unwrap_or(Value::Null);
    Ok(json!({
        "device": dev.name,
        "frame_ms": zune,
        "decoders": per_decoder,
        "unavailable": unavailable,
        "rounds": rounds.max(1),
        "decoded_frame_ms": decoded_ms,
        "upload_ms": upload,
        "kernel_ms": kernel,
        "upload_mb": upload_mb,
    }))
}
