//! The camera preprocessing on the GPU (`camera::preprocess_cuda`) against the CPU reference, on
//! the six nuScenes images and on mixed sizes (black crop borders, upsampling, several sizes in
//! one batch, sizes changing between frames).
//!
//! Tolerance: none beyond FP16 storage. The resize is integer arithmetic with the same tap tables
//! on both sides (identical 8-bit pixels), the normalization the same float32 operations with
//! IEEE division (no multiply-add can contract in `(x / 255 - mean) / std`), so every GPU value
//! must equal the CPU's float32 value rounded to FP16 (round to nearest even on both sides) — the
//! FP16 rounding of the normalized values, at most 2^-10 relative (0.002 at |x| = 2.64, the
//! largest normalized value). The test asserts equal FP16 bits and prints the max abs difference
//! from the float32 reference. Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda")]

mod common;

use common::{gpu, Rng};
use half::f16;
use sptr::camera::compressed::decode_jpeg;
use sptr::camera::image::{DecodeLimits, RgbImage};
use sptr::camera::preprocess::{preprocess_cpu, ImagePreprocess};
use sptr::camera::preprocess_cuda::CameraPreprocessCuda;
use sptr::device::cuda::CudaDevice;

const CAMS: [&str; 6] = ["CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"];

fn nuscenes_jpegs() -> Vec<Vec<u8>> {
    let dir = common::data("nuscenes");
    let files: Vec<_> = std::fs::read_dir(&dir).expect("tests/data/nuscenes").filter_map(|e| e.ok().map(|e| e.path())).collect();
    CAMS.iter()
        .map(|cam| {
            let p = files
                .iter()
                .find(|p| p.to_string_lossy().contains(&format!("__{cam}__")) && p.extension().is_some_and(|e| e == "jpg"))
                .unwrap_or_else(|| panic!("{cam} JPEG"));
            std::fs::read(p).expect("read JPEG")
        })
        .collect()
}

/// GPU output equals the CPU's rounded to FP16; returns the max abs difference from float32.
fn same(case: &str, gpu_vals: &[f32], cpu: &[f32]) -> f32 {
    assert_eq!(gpu_vals.len(), cpu.len(), "{case}: sizes");
    let mut max = 0f32;
    let mut bad = 0usize;
    let mut first = None;
    for (i, (&g, &c)) in gpu_vals.iter().zip(cpu).enumerate() {
        assert!(g.is_finite(), "{case}: value {i} is {g}");
        if f16::from_f32(g).to_bits() != f16::from_f32(c).to_bits() {
            bad += 1;
            first.get_or_insert((i, g, c));
        }
        max = max.max((g - c).abs());
    }
    assert_eq!(bad, 0, "{case}: {bad} of {} values differ from the CPU's after FP16 rounding; first (index, gpu, cpu) {first:?}", cpu.len());
    eprintln!("{case}: {} values equal to the CPU's FP16; max abs diff from float32 {max:.6}", cpu.len());
    max
}

fn check(dev: &CudaDevice, pre: &mut CameraPreprocessCuda, case: &str, images: &[&RgbImage]) {
    let want = preprocess_cpu(images, pre.config()).unwrap_or_else(|e| panic!("{case}: cpu: {e}"));
    let got = pre.run(dev, images).unwrap_or_else(|e| panic!("{case}: cuda: {e}"));
    assert_eq!((got.n, got.h, got.w), (want.n, want.h, want.w), "{case}: shape");
    assert_eq!(got.augs, want.augs, "{case}: resize and crop");
    let max = same(case, &got.to_host(dev).expect("to host"), &want.data);
    assert!(max <= 2.7 / 1024.0, "{case}: FP16 rounding bound");
}

#[test]
fn gpu_preprocess_of_the_nuscenes_frame_equals_the_cpu() {
    let Some(dev) = gpu("gpu_preprocess_of_the_nuscenes_frame_equals_the_cpu") else { return };
    let cfg = ImagePreprocess::bevfusion_nuscenes();
    let limits = DecodeLimits::default();
    let jpegs = nuscenes_jpegs();
    let imgs: Vec<RgbImage> = jpegs.iter().map(|j| decode_jpeg(j, &limits).expect("decode")).collect();
    let refs: Vec<&RgbImage> = imgs.iter().collect();
    let mut pre = CameraPreprocessCuda::new(cfg.clone());
    check(&dev, &mut pre, "six nuScenes cameras (decoded on the host)", &refs);
    // Only the rows the resize reads were uploaded: 364..900 of 900 for 1600 x 900 -> 256 x 704.
    assert_eq!(pre.upload_bytes(), 6 * (900 - 364) * 1600 * 3);
    // The same frame decoded straight into the pinned staging buffer.
    let slices: Vec<&[u8]> = jpegs.iter().map(|j| j.as_slice()).collect();
    let got = pre.run_jpeg(&dev, &slices, &limits).expect("run_jpeg");
    let want = preprocess_cpu(&refs, &cfg).expect("cpu");
    same("six nuScenes cameras (JPEGs decoded into pinned memory)", &got.to_host(&dev).expect("to host"), &want.data);
    // A bad JPEG names its camera.
    let cut = &jpegs[2][..jpegs[2].len() / 2];
    let bad: Vec<&[u8]> = vec![slices[0], slices[1], cut];
    let e = pre.run_jpeg(&dev, &bad, &limits).err().expect("truncated JPEG").to_string();
    assert!(e.contains("camera 2"), "{e}");
    // And the preprocessor still works afterwards.
    check(&dev, &mut pre, "six nuScenes cameras again", &refs);
}

#[test]
fn gpu_preprocess_of_mixed_sizes_equals_the_cpu() {
    let Some(dev) = gpu("gpu_preprocess_of_mixed_sizes_equals_the_cpu") else { return };
    let mut rng = Rng(99);
    let mut random = |w: usize, h: usize| RgbImage { width: w, height: h, data: (0..w * h * 3).map(|_| rng.next() as u8).collect() };
    let a = random(1600, 900);
    let b = random(1920, 1080);
    let c = random(640, 480); // crop box above the resized image: black rows
    let d = random(1280, 720); // narrower than the crop: black columns
    let e = random(333, 177);
    let nus = ImagePreprocess::bevfusion_nuscenes();
    let mut pre = CameraPreprocessCuda::new(nus.clone());
    check(&dev, &mut pre, "1600x900, 1920x1080, 640x480, 1280x720 in one batch", &[&a, &b, &c, &d]);
    // Sizes change between frames: the plan is rebuilt; then back.
    check(&dev, &mut pre, "333x177 alone", &[&e]);
    check(&dev, &mut pre, "back to the four", &[&a, &b, &c, &d]);
    // Upsampling and a bottom crop.
    let up = ImagePreprocess { out_h: 128, out_w: 200, resize_lim: [1.5, 1.7], bot_pct_lim: [0.1, 0.2], ..nus };
    let mut pre_up = CameraPreprocessCuda::new(up);
    check(&dev, &mut pre_up, "upsampled by 1.6 with bottom crop 0.15", &[&e, &e]);
}
