//! BEVFusion's fuser, BEV decoders and map head on CUDA against the CPU reference: the new ops
//! (deconv, grid_sample, residual epilogue, sigmoid to class-major maps, cuDNN convs) on small
//! cases, then both models' full configurations (fusion: camera 80 + LiDAR 256 channels at
//! 128 × 128; camera-only: 80 channels) with random weights on both conv backends (cuDNN and
//! im2col + cuBLAS). The CPU runs the FP16-rounded weights and inputs the GPU sees, so what is
//! left is FP16 activation rounding and FP32 summation order: rel ≤ 2e-3 per stage, no NaN,
//! thresholded masks (0.5) agreeing on ≥ 99.9 % of cells.
//!
//! Skips without a GPU unless SPTR_REQUIRE_GPU=1; with it, cuDNN must load too (the GPU host has
//! cuDNN 9), otherwise the cuDNN cases report themselves skipped.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{fp16, gpu, gpu_required, random_fp16_map, rel_err, Rng};
use cudarc::cublas::CudaBlas;
use sptr::ops::dense::conv_engine::{ConvBackend, ConvEngine, GpuConv};
use sptr::ops::dense::cuda::{CudaConv2d, CudaFeatureMap};
use sptr::ops::dense::cuda_ops::{conv_residual_cuda, grid_sample_cuda, sigmoid_class_major_cuda, CudaConvTranspose2d};
use sptr::ops::dense::{batch_norm_2d_eps, grid_sample, Activation, Conv2d, ConvTranspose2d, FeatureMap, GridPadding};
use sptr::device::cuda::CudaDevice;
use sptr::models::bevfusion::config::BevConfig;
use sptr::models::bevfusion::decoder::{BevDecoder, FpnUp};
use sptr::models::bevfusion::bev_stack::{random_weights, BevStack};
use sptr::models::bevfusion::bev_stack_cuda::CudaBevStack;

fn max_abs_err(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

/// cuDNN's engine, or None (skipped) when it cannot load and SPTR_REQUIRE_GPU is not set.
fn cudnn_engine(dev: &CudaDevice, test: &str) -> Option<ConvEngine> {
    let e = ConvEngine::new(dev, ConvBackend::Cudnn);
    if e.backend() == ConvBackend::Cudnn {
        eprintln!("{test}: cuDNN {:?}", e.cudnn_version());
        return Some(e);
    }
    assert!(!gpu_required(), "{test}: SPTR_REQUIRE_GPU=1 but cuDNN did not load (see the log line above)");
    eprintln!("SKIPPED {test} (cuDNN part): cuDNN not available");
    None
}

#[test]
fn deconv_grid_sample_residual_sigmoid_match_cpu() {
    let Some(dev) = gpu("deconv_grid_sample_residual_sigmoid_match_cpu") else { return };
    let blas = CudaBlas::new(dev.stream.clone()).unwrap();
    let mut rng = Rng(31);

    // deconv, kernel = stride: SECONDFPN's (256 -> 256, k2) at a reduced size, odd sizes, k3, BN
    for (i, &(cin, cout, k, n, h, w)) in [(64usize, 48usize, 2usize, 1usize, 16usize, 12usize), (5, 7, 2, 2, 3, 5), (8, 3, 3, 1, 4, 4), (16, 16, 1, 1, 5, 3)].iter().enumerate() {
        let weight: Vec<f32> = (0..cin * cout * k * k).map(|_| fp16(rng.sym() / (cin as f32).sqrt())).collect();
        let mut d = ConvTranspose2d::new(cin, cout, k, k, [k, k], [0, 0], weight, None).unwrap();
        let g: Vec<f32> = (0..cout).map(|_| 1.0 + 0.1 * rng.sym()).collect();
        let b: Vec<f32> = (0..cout).map(|_| 0.1 * rng.sym()).collect();
        let m: Vec<f32> = (0..cout).map(|_| 0.1 * rng.sym()).collect();
        let v: Vec<f32> = (0..cout).map(|_| rng.uniform(0.5, 1.5)).collect();
        d.fold_bn(&batch_norm_2d_eps(&g, &b, &m, &v, 1e-3).unwrap()).unwrap();
        d.weight.iter_mut().for_each(|x| *x = fp16(*x));
        let x = random_fp16_map(&mut rng, n, h, w, cin);
        let gd = CudaConvTranspose2d::upload(&dev, &d).unwrap();
        let gx = CudaFeatureMap::upload(&dev, &x).unwrap();
        for act in [Activation::None, Activation::Relu] {
            let want = d.forward(&x, act).unwrap();
            let got = gd.forward(&dev, &blas, &gx, act).unwrap().download(&dev).unwrap();
            assert_eq!((got.n, got.h, got.w, got.c), (want.n, want.h, want.w, want.c), "deconv {i}");
            let e = rel_err(&got.data, &want.data);
            eprintln!("deconv case {i} ({cin}->{cout} k{k} {n}x{h}x{w}) {act:?}: rel err {e:.2e}");
            assert!(e <= 1e-3, "deconv case {i}: rel err {e}");
        }
    }
    // a deconv this path does not cover is an error
    let d = ConvTranspose2d::new(2, 2, 3, 3, [2, 2], [1, 1], vec![0.0; 36], None).unwrap();
    assert!(CudaConvTranspose2d::upload(&dev, &d).is_err());

    // grid_sample: the head's grid (128 -> 200 over ±50 m of ±51.2 m) and points outside the map,
    // both paddings, both align_corners
    let cfg = BevConfig::load(&common::root().join("config/models/bevfusion_seg_fusion.yaml")).unwrap();
    let (hx, hy, head_grid) = sptr::models::bevfusion::head::bev_grid(&cfg.head);
    // 24 channels take the 8-wide kernel, 5 the scalar one
    let maps = [random_fp16_map(&mut rng, 1, 128, 128, 24), random_fp16_map(&mut rng, 1, 128, 128, 5)];
    let x = &maps[0];
    let mut odd_grid: Vec<f32> = (0..7 * 9 * 2).map(|_| rng.uniform(-1.3, 1.3)).collect();
    odd_grid[0] = f32::NAN;
    odd_grid[5] = 1.0;
    for (name, grid, oh, ow, x) in [("head", &head_grid, hx, hy, &maps[0]), ("odd", &odd_grid, 7, 9, &maps[0]), ("head, 5 channels", &head_grid, hx, hy, &maps[1])] {
        let gg = dev.stream.clone_htod(grid).unwrap();
        let gx = CudaFeatureMap::upload(&dev, x).unwrap();
        for pad in [GridPadding::Zeros, GridPadding::Border] {
            for ac in [false, true] {
                let want = grid_sample(x, grid, oh, ow, pad, ac).unwrap();
                let got = grid_sample_cuda(&dev, &gx, &gg, oh, ow, pad, ac).unwrap().download(&dev).unwrap();
                let e = max_abs_err(&got.data, &want.data);
                // FP16 output rounding of values up to 1
                assert!(e <= 1e-3, "grid_sample {name} {pad:?} ac {ac}: max abs err {e}");
                assert!(got.data.iter().all(|v| v.is_finite()));
            }
        }
    }
    let gg = dev.stream.clone_htod(&odd_grid).unwrap();
    assert!(grid_sample_cuda(&dev, &CudaFeatureMap::upload(&dev, x).unwrap(), &gg, 7, 8, GridPadding::Zeros, false).is_err());

    // conv + residual + ReLU (a BasicBlock's second conv)
    let (cin, cout) = (32, 32);
    let weight: Vec<f32> = (0..cout * cin * 9).map(|_| fp16(rng.sym() / (9.0 * cin as f32).sqrt())).collect();
    let bias: Vec<f32> = (0..cout).map(|_| 0.1 * rng.sym()).collect();
    let conv = Conv2d::new(cin, cout, 3, 3, [1, 1], [1, 1], weight, Some(bias)).unwrap();
    let x = random_fp16_map(&mut rng, 1, 20, 18, cin);
    let r = random_fp16_map(&mut rng, 1, 20, 18, cout);
    let mut want = conv.forward(&x, Activation::None).unwrap();
    want.data.iter_mut().zip(&r.data).for_each(|(a, b)| *a = (*a + b).max(0.0));
    let (gx, gr) = (CudaFeatureMap::upload(&dev, &x).unwrap(), CudaFeatureMap::upload(&dev, &r).unwrap());
    let gc = CudaConv2d::upload(&dev, &conv).unwrap();
    let got = conv_residual_cuda(&dev, &blas, &gc, &gx, &gr, Activation::Relu).unwrap().download(&dev).unwrap();
    let e = rel_err(&got.data, &want.data);
    eprintln!("conv + residual: rel err {e:.2e}");
    assert!(e <= 1e-3, "conv + residual: rel err {e}");
    assert!(conv_residual_cuda(&dev, &blas, &gc, &gx, &CudaFeatureMap::upload(&dev, &random_fp16_map(&mut rng, 1, 20, 17, cout)).unwrap(), Activation::Relu).is_err());
    for backend in [ConvBackend::Im2col, ConvBackend::Cudnn] {
        let engine = if backend == ConvBackend::Cudnn {
            match cudnn_engine(&dev, "conv + residual on cuDNN") {
                Some(e) => e,
                None => continue,
            }
        } else {
            ConvEngine::new(&dev, backend)
        };
        let g = GpuConv::upload(&dev, &engine, &conv).unwrap();
        let got = g.forward(&dev, &blas, &engine, &gx, Activation::Relu, Some(&gr)).unwrap().download(&dev).unwrap();
        let e = rel_err(&got.data, &want.data);
        eprintln!("GpuConv {backend:?} + residual: rel err {e:.2e}");
        assert!(e <= 1.5e-3, "{backend:?}: rel err {e}");
    }

    // sigmoid to class-major FP32
    let (n, pixels, k) = (2, 35, 6);
    let logits: Vec<f32> = (0..n * pixels * k).map(|_| 4.0 * rng.sym()).collect();
    let bias: Vec<f32> = (0..k).map(|_| rng.sym()).collect();
    let ga = dev.stream.clone_htod(&logits).unwrap();
    let gb = dev.stream.clone_htod(&bias).unwrap();
    let got = dev.stream.clone_dtoh(&sigmoid_class_major_cuda(&dev, &ga, n, pixels, &gb).unwrap()).unwrap();
    for b in 0..n {
        for j in 0..k {
            for p in 0..pixels {
                let want = 1.0 / (1.0 + (-(logits[(b * pixels + p) * k + j] + bias[j])).exp());
                let g = got[(b * k + j) * pixels + p];
                assert!((g - want).abs() < 1e-6, "sigmoid b {b} class {j} pixel {p}: {g} vs {want}");
            }
        }
    }
}

#[test]
fn cudnn_convs_match_cpu() {
    let Some(dev) = gpu("cudnn_convs_match_cpu") else { return };
    let Some(engine) = cudnn_engine(&dev, "cudnn_convs_match_cpu") else { return };
    let blas = CudaBlas::new(dev.stream.clone()).unwrap();
    let mut rng = Rng(41);
    // the decoder's and head's shapes at reduced sizes (3×3 s1 / s2, 1×1 s1 / s2, the fuser's 336
    // channels) and odd ones (channels not a multiple of 8, non-square input)
    type Case = (usize, usize, usize, usize, usize, usize, usize, usize);
    let cases: &[Case] = &[
        (336, 256, 3, 1, 1, 1, 32, 32),
        (128, 256, 3, 2, 1, 1, 32, 32),
        (80, 160, 1, 2, 0, 1, 32, 32),
        (800, 256, 1, 1, 0, 1, 16, 16),
        (512, 512, 3, 1, 1, 1, 20, 20),
        (5, 7, 3, 1, 1, 2, 9, 11),
        (12, 16, 3, 2, 1, 1, 15, 10),
    ];
    for (i, &(cin, cout, k, s, p, n, h, w)) in cases.iter().enumerate() {
        let weight: Vec<f32> = (0..cout * cin * k * k).map(|_| fp16(rng.sym() / ((cin * k * k) as f32).sqrt())).collect();
        let bias = (i % 2 == 0).then(|| (0..cout).map(|_| 0.1 * rng.sym()).collect::<Vec<f32>>());
        let conv = Conv2d::new(cin, cout, k, k, [s, s], [p, p], weight, bias).unwrap();
        let x = random_fp16_map(&mut rng, n, h, w, cin);
        let g = GpuConv::upload(&dev, &engine, &conv).unwrap();
        let gx = CudaFeatureMap::upload(&dev, &x).unwrap();
        for act in [Activation::None, Activation::Relu] {
            let want = conv.forward(&x, act).unwrap();
            // twice: the second call reuses the cached plan and the measured pick (same bits)
            let mut first = None;
            for _ in 0..2 {
                let got = g.forward(&dev, &blas, &engine, &gx, act, None).unwrap().download(&dev).unwrap();
                assert_eq!((got.n, got.h, got.w, got.c), (want.n, want.h, want.w, want.c), "case {i}");
                let e = rel_err(&got.data, &want.data);
                // FP16 output rounded twice (conv, then bias/act): ≤ 1.5e-3
                assert!(e <= 1.5e-3, "case {i} {act:?}: rel err {e}");
                assert!(got.data.iter().all(|v| v.is_finite()));
                match &first {
                    None => first = Some(got.data),
                    Some(f) => assert_eq!(f, &got.data, "case {i} {act:?}: the second call differs from the first"),
                }
            }
            // each form on its own, whichever the measurement picked
            let GpuConv::Fastest(f) = &g else { panic!("a cuDNN engine uploads both forms") };
            let ctx = engine.cudnn_context().unwrap();
            let by_cudnn = f.cudnn_form().forward(&dev, ctx, &gx, act, None).unwrap().download(&dev).unwrap();
            let by_gemm = f.gemm_form().forward(&dev, &blas, &gx, act).unwrap().download(&dev).unwrap();
            let (ec, eg) = (rel_err(&by_cudnn.data, &want.data), rel_err(&by_gemm.data, &want.data));
            eprintln!(
                "cudnn case {i} ({cin}->{cout} k{k} s{s} {n}x{h}x{w}) {act:?}: cuDNN rel err {ec:.2e} (algo {:?}), im2col + cuBLAS {eg:.2e}, picked {:?}",
                f.cudnn_form().algorithm(n, h, w),
                f.picked(n, h, w)
            );
            assert!(ec <= 1.5e-3 && eg <= 1e-3, "case {i} {act:?}: cuDNN rel err {ec}, im2col {eg}");
            assert!(f.picked(n, h, w).is_some(), "case {i}: no pick recorded");
        }
    }
    let conv = Conv2d::new(4, 4, 3, 3, [1, 1], [1, 1], vec![0.0; 144], None).unwrap();
    let g = GpuConv::upload(&dev, &engine, &conv).unwrap();
    let x = CudaFeatureMap::upload(&dev, &FeatureMap::zeros(1, 4, 4, 3).unwrap()).unwrap();
    assert!(g.forward(&dev, &blas, &engine, &x, Activation::None, None).is_err());
    // a cuDNN conv on an engine without cuDNN is an error, not a crash
    let plain = ConvEngine::new(&dev, ConvBackend::Im2col);
    let x = CudaFeatureMap::upload(&dev, &FeatureMap::zeros(1, 4, 4, 4).unwrap()).unwrap();
    assert!(g.forward(&dev, &blas, &plain, &x, Activation::None, None).is_err());
}

/// Rounds every conv weight of the stack to FP16 (what the GPU stores), so that CPU and GPU
/// multiply the same numbers.
fn round_weights(stack: &mut BevStack) {
    let r = |c: &mut Conv2d| c.weight.iter_mut().for_each(|x| *x = fp16(*x));
    if let Some(f) = &mut stack.fuser {
        r(&mut f.conv);
    }
    match &mut stack.decoder {
        BevDecoder::Second(d) => {
            d.stages.iter_mut().flatten().for_each(r);
            for b in &mut d.deblocks {
                match b {
                    FpnUp::Conv(c) => r(c),
                    FpnUp::Deconv(t) => t.weight.iter_mut().for_each(|x| *x = fp16(*x)),
                }
            }
        }
        BevDecoder::ResNet(d) => {
            for b in d.layers.iter_mut().flatten() {
                r(&mut b.conv1);
                r(&mut b.conv2);
                if let Some(ds) = &mut b.downsample {
                    r(ds);
                }
            }
            d.fuse.iter_mut().for_each(r);
            if let Some(u) = &mut d.upsample {
                r(u);
            }
        }
    }
    stack.head.convs.iter_mut().for_each(r);
    r(&mut stack.head.logits);
}

fn full_model(dev: &CudaDevice, yaml: &str, seed: u64) {
    let blas = CudaBlas::new(dev.stream.clone()).unwrap();
    let cfg = BevConfig::load(&common::root().join("config/models").join(yaml)).unwrap();
    let mut stack = BevStack::from_weights(&cfg, random_weights(&cfg, seed).unwrap()).unwrap();
    round_weights(&mut stack);
    let mut rng = Rng(seed + 100);
    // the camera BEV [1, 128, 128, 80] (lss output), the LiDAR BEV [1, 128, 128, 256]
    let inputs: Vec<FeatureMap> = match &cfg.fuser {
        Some(f) => f.in_channels.iter().map(|&c| random_fp16_map(&mut rng, 1, 128, 128, c)).collect(),
        None => vec![random_fp16_map(&mut rng, 1, 128, 128, cfg.decoder.in_channels())],
    };
    let refs: Vec<&FeatureMap> = inputs.iter().collect();
    let t = std::time::Instant::now();
    let want = stack.forward(&refs).unwrap();
    eprintln!("{yaml}: CPU forward {:.1} s", t.elapsed().as_secs_f64());
    let gin: Vec<CudaFeatureMap> = inputs.iter().map(|m| CudaFeatureMap::upload(dev, m).unwrap()).collect();
    let grefs: Vec<&CudaFeatureMap> = gin.iter().collect();
    for backend in [ConvBackend::Im2col, ConvBackend::Cudnn] {
        let g = CudaBevStack::upload(dev, &stack, backend).unwrap();
        if g.backend() != backend {
            assert!(!gpu_required(), "{yaml}: SPTR_REQUIRE_GPU=1 but cuDNN did not load");
            eprintln!("SKIPPED {yaml} on {backend:?}: cuDNN not available");
            continue;
        }
        let got = g.forward(dev, &blas, &grefs).unwrap();
        if let (Some(gf), Some(wf)) = (&got.fused, &want.fused) {
            let gf = gf.download(dev).unwrap();
            let e = rel_err(&gf.data, &wf.data);
            eprintln!("{yaml} {backend:?} fused: rel err {e:.2e}");
            assert!(e <= 2e-3, "{yaml} {backend:?} fused: rel err {e}");
        }
        let gd = got.decoded.download(dev).unwrap();
        assert_eq!((gd.n, gd.h, gd.w, gd.c), (1, 128, 128, cfg.decoder.out_channels()));
        let e = rel_err(&gd.data, &want.decoded.data);
        eprintln!("{yaml} {backend:?} decoded: rel err {e:.2e}");
        assert!(e <= 2e-3, "{yaml} {backend:?} decoded: rel err {e}");
        assert!(gd.data.iter().all(|v| v.is_finite()));
        let gm = got.maps.download(dev).unwrap();
        assert_eq!((gm.n, gm.classes, gm.x, gm.y), (1, 6, 200, 200));
        assert!(gm.data.iter().all(|v| v.is_finite() && (0.0..=1.0).contains(v)));
        let e = rel_err(&gm.data, &want.maps.data);
        let agree = gm.data.iter().zip(&want.maps.data).filter(|(a, b)| (**a > 0.5) == (**b > 0.5)).count() as f64 / gm.data.len() as f64;
        let positive = want.maps.data.iter().filter(|v| **v > 0.5).count() as f64 / gm.data.len() as f64;
        eprintln!("{yaml} {backend:?} maps: rel err {e:.2e}, masks agree {:.4} % ({:.1} % positive)", agree * 100.0, positive * 100.0);
        assert!(e <= 2e-3, "{yaml} {backend:?} maps: rel err {e}");
        assert!(agree >= 0.999, "{yaml} {backend:?}: masks agree on {agree}");
        // the masks are not trivially all one value
        assert!(positive > 0.01 && positive < 0.99, "{yaml}: {positive} positive");
        // wrong inputs are errors
        let bad = CudaFeatureMap::upload(dev, &random_fp16_map(&mut rng, 1, 128, 128, 16)).unwrap();
        assert!(g.forward(dev, &blas, &[&bad]).is_err());
        assert!(g.decoder.forward(dev, &blas, &bad).is_err());
        assert!(g.head.forward(dev, &blas, &bad).is_err());
    }
}

/// The CUDA parts can move to a worker thread (each owns its cuDNN handle).
#[test]
fn cuda_parts_are_send() {
    fn send<T: Send>() {}
    send::<CudaBevStack>();
    send::<sptr::models::bevfusion::decoder_cuda::CudaBevDecoder>();
    send::<sptr::models::bevfusion::head_cuda::CudaBevSegHead>();
    send::<sptr::models::bevfusion::decoder_cuda::CudaBevFuser>();
}

#[test]
fn fusion_model_matches_cpu() {
    let Some(dev) = gpu("fusion_model_matches_cpu") else { return };
    full_model(&dev, "bevfusion_seg_fusion.yaml", 7);
}

#[test]
fn camera_model_matches_cpu() {
    let Some(dev) = gpu("camera_model_matches_cpu") else { return };
    full_model(&dev, "bevfusion_seg_camera.yaml", 8);
}
