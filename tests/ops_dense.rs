//! CUDA dense ops (src/dense/cuda.rs) against the CPU reference: convolutions of every path
//! (1×1 direct GEMM, im2col 3×3 / strided / 4×4 patchify / odd channel counts), BatchNorm folded,
//! ReLU, bilinear resizing both ways, concatenation. Inputs and weights are rounded to FP16 before
//! the CPU runs, so the only difference left is FP16 output rounding and FP32 summation order:
//! rel ≤ 1e-3. Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

mod common;

use common::{fp16, gpu, random_fp16_map, rel_err, Rng};
use cudarc::cublas::CudaBlas;
use sptr::ops::dense::cuda::{bilinear_resize_cuda, concat_channels_cuda, CudaConv2d, CudaFeatureMap};
use sptr::ops::dense::{batch_norm_2d, bilinear_resize, concat_channels, Activation, Conv2d, FeatureMap};

#[test]
fn cuda_conv_matches_cpu() {
    let Some(dev) = gpu("cuda_conv_matches_cpu") else { return };
    let blas = CudaBlas::new(dev.stream.clone()).unwrap();
    let mut rng = Rng(21);
    // (cin, cout, k, stride, pad, n, h, w, bn): the shapes the camera branch runs (depthnet 1×1,
    // FPN 1×1 / 3×3, LSS downsample 3×3 s2, Swin patch embedding 4×4 s4 with 3 channels), the
    // decoder's 160 channels, and odd sizes (channels not a multiple of 8, non-square kernels).
    // Channels that are multiples of 8 take the 8-wide im2col, the others the scalar one.
    type Case = (usize, usize, [usize; 2], [usize; 2], [usize; 2], usize, usize, usize, bool);
    let cases: &[Case] = &[
        (256, 198, [1, 1], [1, 1], [0, 0], 6, 32, 88, false),
        (64, 48, [3, 3], [1, 1], [1, 1], 2, 20, 30, true),
        (80, 80, [3, 3], [2, 2], [1, 1], 1, 64, 64, true),
        (160, 64, [3, 3], [1, 1], [1, 1], 2, 24, 20, false),
        (16, 24, [1, 3], [2, 1], [0, 1], 1, 13, 9, true),
        (3, 96, [4, 4], [4, 4], [0, 0], 2, 64, 88, true),
        (5, 7, [1, 1], [1, 1], [0, 0], 1, 9, 11, false),
        (7, 13, [1, 3], [2, 1], [0, 1], 1, 15, 9, false),
        (12, 16, [1, 1], [2, 2], [0, 0], 1, 10, 10, true),
    ];
    for (i, &(cin, cout, k, s, p, n, h, w, bn)) in cases.iter().enumerate() {
        let fan = (cin * k[0] * k[1]) as f32;
        let weight: Vec<f32> = (0..cout * cin * k[0] * k[1]).map(|_| fp16(rng.sym() / fan.sqrt())).collect();
        let bias = (i % 2 == 0).then(|| (0..cout).map(|_| rng.sym() * 0.1).collect::<Vec<f32>>());
        let mut conv = Conv2d::new(cin, cout, k[0], k[1], s, p, weight, bias).unwrap();
        if bn {
            let g: Vec<f32> = (0..cout).map(|_| 1.0 + 0.1 * rng.sym()).collect();
            let b: Vec<f32> = (0..cout).map(|_| 0.1 * rng.sym()).collect();
            let m: Vec<f32> = (0..cout).map(|_| 0.1 * rng.sym()).collect();
            let v: Vec<f32> = (0..cout).map(|_| rng.uniform(0.5, 1.5)).collect();
            conv.fold_bn(&batch_norm_2d(&g, &b, &m, &v).unwrap()).unwrap();
            // the GPU sees FP16 weights: give the CPU the same ones
            conv.weight.iter_mut().for_each(|x| *x = fp16(*x));
        }
        let x = random_fp16_map(&mut rng, n, h, w, cin);
        let gconv = CudaConv2d::upload(&dev, &conv).unwrap();
        let gx = CudaFeatureMap::upload(&dev, &x).unwrap();
        for act in [Activation::None, Activation::Relu] {
            let want = conv.forward(&x, act).unwrap();
            let got = gconv.forward(&dev, &blas, &gx, act).unwrap().download(&dev).unwrap();
            assert_eq!((got.n, got.h, got.w, got.c), (want.n, want.h, want.w, want.c), "case {i}");
            let e = rel_err(&got.data, &want.data);
            eprintln!("conv case {i} ({cin}->{cout} k{k:?} s{s:?} p{p:?} {n}x{h}x{w}) {act:?}: rel err {e:.2e}");
            assert!(e <= 1e-3, "case {i} {act:?}: rel err {e}");
            assert!(got.data.iter().all(|v| v.is_finite()));
        }
    }
    // wrong channel count is an error, not a launch
    let conv = Conv2d::new(4, 4, 1, 1, [1, 1], [0, 0], vec![0.0; 16], None).unwrap();
    let g = CudaConv2d::upload(&dev, &conv).unwrap();
    let x = CudaFeatureMap::upload(&dev, &FeatureMap::zeros(1, 2, 2, 3).unwrap()).unwrap();
    assert!(g.forward(&dev, &blas, &x, Activation::None).is_err());
}

#[test]
fn cuda_resize_and_concat_match_cpu() {
    let Some(dev) = gpu("cuda_resize_and_concat_match_cpu") else { return };
    let mut rng = Rng(5);
    // FPN-like upsampling (size of the lateral, align_corners False), the decoder's ×2 with
    // align_corners True, a downsample and odd sizes.
    let cases = [((2, 16, 44, 256), (32, 88)), ((1, 8, 22, 40), (16, 44)), ((1, 9, 7, 3), (4, 13)), ((1, 5, 6, 8), (1, 1))];
    for ((n, h, w, c), (oh, ow)) in cases {
        let x = random_fp16_map(&mut rng, n, h, w, c);
        let gx = CudaFeatureMap::upload(&dev, &x).unwrap();
        for ac in [false, true] {
            let want = bilinear_resize(&x, oh, ow, ac);
            let got = bilinear_resize_cuda(&dev, &gx, oh, ow, ac).unwrap().download(&dev).unwrap();
            let e = rel_err(&got.data, &want.data);
            eprintln!("bilinear {h}x{w} -> {oh}x{ow} align_corners {ac}: rel err {e:.2e}");
            // FP16 output rounding only (same f32 taps)
            assert!(e <= 1e-3, "{h}x{w}->{oh}x{ow} {ac}: rel err {e}");
        }
    }
    let a = random_fp16_map(&mut rng, 2, 5, 7, 12);
    let b = random_fp16_map(&mut rng, 2, 5, 7, 5);
    let want = concat_channels(&a, &b).unwrap();
    let (ga, gb) = (CudaFeatureMap::upload(&dev, &a).unwrap(), CudaFeatureMap::upload(&dev, &b).unwrap());
    let got = concat_channels_cuda(&dev, &ga, &gb).unwrap().download(&dev).unwrap();
    // a copy: bit-identical
    assert_eq!(got, want);
    let wrong = CudaFeatureMap::upload(&dev, &random_fp16_map(&mut rng, 2, 5, 6, 1)).unwrap();
    assert!(concat_channels_cuda(&dev, &ga, &wrong).is_err());
}
