//! The camera encoder on CUDA against the CPU reference: the wide LayerNorm kernels, a reduced
//! encoder on odd image sizes (every padding path: patch embedding, window grid, patch merging),
//! and the full BEVFusion configuration (Swin-T + GeneralizedLSSFPN, random weights) on the six
//! nuScenes camera images preprocessed to 256 × 704: ‖out − ref‖ / ‖ref‖ ≤ 2e-3 per stage and at the neck, no NaN.
//! Skipped without a GPU; SPTR_REQUIRE_GPU=1 makes a missing GPU a failure.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{gpu, rel_err, Rng};
use half::f16;
use sptr::models::bevfusion::camera::encoder::{random_weights, CameraEncoder, CameraEncoderConfig, EncoderOutput};
use sptr::models::bevfusion::camera::encoder_cuda::CudaCameraEncoder;
use sptr::ops::attention::cuda::Bias2dKernel;
use sptr::cli::camera_features::preprocess_files;
use sptr::ops::rowwise::cuda::GpuLayerNorm;
use sptr::ops::rowwise::cpu::LayerNorm;

fn check(case: &str, got: &[f32], want: &[f32], tol: f64) {
    assert_eq!(got.len(), want.len(), "{case}: sizes differ");
    assert!(got.iter().all(|x| x.is_finite()), "{case}: non-finite output");
    let err = rel_err(got, want);
    eprintln!("{case}: rel err {err:.2e}");
    assert!(err <= tol, "{case}: rel err {err} > {tol}");
}

fn compare(case: &str, got: &EncoderOutput, want: &EncoderOutput) {
    for (k, (g, w)) in got.stages.iter().zip(&want.stages).enumerate() {
        assert_eq!((g.n, g.h, g.w, g.c), (w.n, w.h, w.w, w.c), "{case} stage output {k}: shape");
        check(&format!("{case} stage output {k} [{} x {} x {}]", g.h, g.w, g.c), &g.data, &w.data, 2e-3);
    }
    for (k, (g, w)) in got.neck.iter().zip(&want.neck).enumerate() {
        assert_eq!((g.n, g.h, g.w, g.c), (w.n, w.h, w.w, w.c), "{case} neck output {k}: shape");
        check(&format!("{case} neck output {k} [{} x {} x {}]", g.h, g.w, g.c), &g.data, &w.data, 2e-3);
    }
    assert_eq!((got.stages.len(), got.neck.len()), (want.stages.len(), want.neck.len()));
}

/// Runs `forward` on each of the backbone's six paths (fused / unfused GEMMs × tensor-core,
/// FP32 whole-window or per-query attention), compares each with `want`, checks that the fused
/// path's tensor-core attention on the packed qkv output has the bits of the split one, and
/// restores the default path.
fn every_path(dev: &sptr::device::cuda::CudaDevice, enc: &mut CudaCameraEncoder, case: &str, forward: impl Fn(&CudaCameraEncoder) -> EncoderOutput, want: &EncoderOutput) {
    let (f0, k0) = (enc.backbone.is_fused(), enc.backbone.attention_kernel());
    for fused in [true, false] {
        for kernel in [Bias2dKernel::TensorCores, Bias2dKernel::WholeWindow, Bias2dKernel::PerQuery] {
            enc.set_swin_fused(dev, fused).expect("switch GEMM path");
            enc.set_swin_attention_kernel(kernel);
            let got = forward(enc);
            let name = format!("{case} ({} GEMMs, {} attention)", if fused { "fused" } else { "unfused" }, kernel.name());
            compare(&name, &got, want);
            if fused && kernel == Bias2dKernel::TensorCores {
                enc.backbone.set_packed_qkv(false);
                let split = forward(enc);
                enc.backbone.set_packed_qkv(true);
                for (k, (a, b)) in got.stages.iter().zip(&split.stages).enumerate() {
                    let same = a.data.iter().zip(&b.data).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same && a.data.len() == b.data.len(), "{name}: stage {k} differs between the packed and the split qkv");
                }
            }
        }
    }
    enc.set_swin_fused(dev, f0).expect("switch back");
    enc.set_swin_attention_kernel(k0);
}

/// The fused path's cuBLASLt Linear (FP16 out, bias in the epilogue, optional residual through
/// C) against an f64 reference on the same FP16 inputs, at Swin-T's shapes and odd row counts.
/// Tolerance: one FP16 rounding of the output (2⁻¹¹ relative) plus FP32 accumulation over at
/// most 1536 terms (≪ that): relative L2 ≤ 1e-3, and each value within 2⁻¹⁰·|y| + 1e-3.
#[test]
fn lt_linear_matches_cpu() {
    use sptr::ops::rowwise::lt::LtGemm;
    let Some(dev) = gpu("lt_linear_matches_cpu") else { return };
    let lt = LtGemm::new(&dev).expect("cuBLASLt");
    let mut rng = Rng(77);
    let h = |v: f32| f16::from_f32(v).to_f32();
    for (n, fin, fout, residual) in [(333usize, 96usize, 288usize, false), (1001, 96, 96, true), (77, 384, 1536, false), (5, 1536, 384, true), (1, 48, 96, false)] {
        let x: Vec<f32> = (0..n * fin).map(|_| h(rng.sym())).collect();
        let w: Vec<f32> = (0..fout * fin).map(|_| h(rng.sym() * 0.1)).collect();
        let b: Vec<f32> = (0..fout).map(|_| h(rng.sym())).collect();
        let r: Vec<f32> = (0..n * fout).map(|_| h(rng.sym() * 2.0)).collect();
        let mut want = vec![0f32; n * fout];
        for i in 0..n {
            for o in 0..fout {
                let mut acc = b[o] as f64 + if residual { r[i * fout + o] as f64 } else { 0.0 };
                for k in 0..fin {
                    acc += x[i * fin + k] as f64 * w[o * fin + k] as f64;
                }
                want[i * fout + o] = acc as f32;
            }
        }
        let up = |v: &[f32]| dev.stream.clone_htod(&v.iter().map(|&a| f16::from_f32(a)).collect::<Vec<_>>()).expect("htod");
        let (xd, wd, bd, rd) = (up(&x), up(&w), up(&b), up(&r));
        let y = lt.linear(&dev, &wd, &bd, fin, fout, &xd, n, residual.then_some(&rd)).expect("linear");
        let got: Vec<f32> = dev.stream.clone_dtoh(&y).expect("dtoh").iter().map(|v| v.to_f32()).collect();
        let case = format!("cuBLASLt linear [{n} x {fin}] -> {fout}, residual {residual}");
        check(&case, &got, &want, 1e-3);
        for (i, (&g, &t)) in got.iter().zip(&want).enumerate() {
            assert!((g - t).abs() <= t.abs() / 1024.0 + 1e-3, "{case}: value {i}: {g} vs {t}");
        }
    }
    // An operand shorter than the shape says is an error, not an out-of-bounds read.
    let small = dev.stream.alloc_zeros::<f16>(8).expect("alloc");
    assert!(lt.linear(&dev, &small, &small, 96, 96, &small, 4, None).is_err());
}

/// LayerNorm rows of 96 … 1536 channels (the narrow and the wide kernel) against the CPU.
#[test]
fn layer_norm_kernels_match_cpu_up_to_1536_channels() {
    let Some(dev) = gpu("layer_norm_kernels_match_cpu_up_to_1536_channels") else { return };
    let mut rng = Rng(3);
    for c in [96usize, 512, 513, 768, 1536] {
        let rows = 333;
        let x: Vec<f32> = (0..rows * c).map(|_| f16::from_f32(rng.sym() * 3.0 + 0.5).to_f32()).collect();
        let g: Vec<f32> = (0..c).map(|_| 1.0 + 0.1 * rng.sym()).collect();
        let b: Vec<f32> = (0..c).map(|_| 0.1 * rng.sym()).collect();
        let ln = LayerNorm::new(g, b).expect("ln");
        let want = ln.forward(&x).expect("cpu");
        let gl = GpuLayerNorm::upload(&dev, &ln).expect("upload");
        let xd = dev.stream.clone_htod(&x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>()).expect("htod");
        let out = gl.forward(&dev, &xd, rows).expect("gpu");
        let got: Vec<f32> = dev.stream.clone_dtoh(&out).expect("dtoh").iter().map(|v| v.to_f32()).collect();
        check(&format!("layer norm C{c}"), &got, &want, 1e-3);
    }
    let too_wide = LayerNorm::new(vec![1.0; 1537], vec![0.0; 1537]).expect("ln");
    assert!(GpuLayerNorm::upload(&dev, &too_wide).is_err(), "more than 1536 channels is an error, not a wrong result");
}

/// Smooth, image-like normalized RGB, NHWC, rounded to FP16 as the GPU preprocessing delivers it
/// (deterministic).
fn synthetic_images(n: usize, h: usize, w: usize) -> Vec<f32> {
    let mut x = vec![0f32; n * 3 * h * w];
    for b in 0..n {
        for c in 0..3 {
            for y in 0..h {
                for xx in 0..w {
                    let (fy, fx) = (y as f32 / h as f32, xx as f32 / w as f32);
                    x[((b * h + y) * w + xx) * 3 + c] =
                        f16::from_f32((9.0 * fx + 2.0 * c as f32 + b as f32).sin() * (5.0 * fy).cos() + if fy > 0.55 { 0.9 } else { -0.4 }).to_f32();
                }
            }
        }
    }
    x
}

/// A reduced encoder (head_dim 32 everywhere) on 70 × 130 images: the patch embedding pads
/// 70 → 72 and 130 → 132, the grids 18 × 33, 9 × 17, 5 × 9, 3 × 5 pad to multiples of 7, and
/// every merge pads odd sides.
#[test]
fn reduced_encoder_on_odd_sizes_matches_cpu() {
    let Some(dev) = gpu("reduced_encoder_on_odd_sizes_matches_cpu") else { return };
    let yaml = "
model:
  encoders:
    camera:
      backbone: {type: SwinTransformer, embed_dims: 32, depths: [2, 2, 2, 2], num_heads: [1, 2, 4, 8], window_size: 7, out_indices: [1, 2, 3]}
      neck: {type: GeneralizedLSSFPN, in_channels: [64, 128, 256], out_channels: 64, num_outs: 3, upsample_cfg: {mode: bilinear, align_corners: false}}
";
    let cfg = CameraEncoderConfig::parse(yaml, "reduced.yaml").expect("config");
    let enc = CameraEncoder::from_weights(&cfg, random_weights(&cfg, 12).expect("w")).expect("encoder");
    let (n, h, w) = (2, 70, 130);
    let x = synthetic_images(n, h, w);
    let want = enc.forward_cpu(&x, n, h, w).expect("cpu");
    let mut gpu_enc = CudaCameraEncoder::upload(&dev, &enc).expect("upload");
    let plan = gpu_enc.plan(&dev, n, h, w).expect("plan");
    // Every backbone path (swin_cuda: cuBLASLt FP16 GEMMs with fused bias or cuBLAS FP32 +
    // epilogues; whole-window or per-query attention kernel) against the same CPU reference.
    every_path(&dev, &mut gpu_enc, "reduced 70x130", |e| e.forward_host(&dev, &plan, &x).expect("gpu"), &want);
    let got = gpu_enc.forward_host(&dev, &plan, &x).expect("gpu");
    compare("reduced 70x130", &got, &want);
    // the plan is reused: a second frame gives the same result
    let again = gpu_enc.forward_host(&dev, &plan, &x).expect("gpu");
    assert_eq!(again.neck[0].data, got.neck[0].data, "deterministic");

    // the timed forward: same result, every stage boundary named
    let xd = dev.stream.clone_htod(&x.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>()).expect("htod");
    let mut clock = sptr::device::clock::GpuClock::start(&dev).expect("clock");
    let timed = gpu_enc.forward_timed(&dev, &plan, &xd, &mut clock).expect("timed").download(&dev).expect("download");
    let mut t = sptr::models::sphereformer::network::StageTimes::default();
    clock.finish(&mut t).expect("times");
    let names: Vec<&str> = t.stages.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["patch_embed", "stage0", "merge0", "stage1", "merge1", "stage2", "merge2", "stage3", "neck"]);
    assert_eq!(timed.neck[1].data, got.neck[1].data);

    // bad inputs
    assert!(gpu_enc.forward_host(&dev, &plan, &x[1..]).is_err(), "short input");
    assert!(gpu_enc.plan(&dev, 0, h, w).is_err(), "no images");
    let cpu_only = CameraEncoderConfig::parse(&yaml.replace("embed_dims: 32", "embed_dims: 24").replace("[64, 128, 256]", "[48, 96, 192]"), "r.yaml").expect("config");
    let e = CameraEncoder::from_weights(&cpu_only, random_weights(&cpu_only, 1).expect("w")).expect("encoder");
    match CudaCameraEncoder::upload(&dev, &e) {
        Err(err) => assert!(err.to_string().contains("head_dim 24"), "{err}"),
        Ok(_) => panic!("head_dim 24 has no CUDA attention kernel: upload must fail"),
    }
}

/// The full configuration (Swin-T: embed 96, depths 2-2-6-2, heads 3-6-12-24; the neck 448/1152
/// → 256) on the six nuScenes camera images, decoded and preprocessed to 256 × 704 (rounded to
/// FP16 for both sides, as the GPU preprocessing delivers them).
#[test]
fn full_encoder_matches_cpu_on_six_images() {
    let Some(dev) = gpu("full_encoder_matches_cpu_on_six_images") else { return };
    let model = common::root().join("config/models/bevfusion_seg_camera.yaml");
    let cfg = CameraEncoderConfig::load(&model).expect("config");
    let enc = CameraEncoder::from_weights(&cfg, random_weights(&cfg, 2026).expect("w")).expect("encoder");
    let mut jpgs: Vec<_> = std::fs::read_dir(common::data("nuscenes"))
        .expect("tests/data/nuscenes")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().contains("__CAM_") && p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    jpgs.sort();
    assert_eq!(jpgs.len(), 6, "six camera JPEGs in tests/data/nuscenes");
    let (x, n, h, w) = preprocess_files(&jpgs, &model).expect("preprocess");
    assert_eq!((n, h, w), (6, 256, 704));
    let x: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
    let t = std::time::Instant::now();
    let want = enc.forward_cpu(&x, n, h, w).expect("cpu");
    eprintln!("CPU reference: {:.1} s", t.elapsed().as_secs_f64());
    let mut gpu_enc = CudaCameraEncoder::upload(&dev, &enc).expect("upload");
    let plan = gpu_enc.plan(&dev, n, h, w).expect("plan");
    let got = gpu_enc.forward_host(&dev, &plan, &x).expect("gpu");
    assert_eq!((got.neck[0].h, got.neck[0].w, got.neck[0].c), (32, 88, 256), "the view transform's input");
    compare("full 6x256x704 (default path)", &got, &want);
    // Every backbone path (swin_cuda module docs) meets the same bound.
    every_path(&dev, &mut gpu_enc, "full 6x256x704", |e| e.forward_host(&dev, &plan, &x).expect("gpu"), &want);
}
