//! The FP16 range guard on the camera encoder's CUDA path: every Swin-T and
//! FPN launch that computes and stores an FP16 activation (LayerNorms with the window padding,
//! the qkv split, the window attention, proj + residual, the MLP epilogues, patch merging, the
//! output norms, the neck's conv epilogues) flags values out of FP16's range under its upstream
//! module path. Full BEVFusion configuration on the six nuScenes images (256 x 704). Skips
//! without a GPU unless SPTR_REQUIRE_GPU=1.
//!
//! - In range: the project's random weights and an upstream-style normal initialisation
//!   (trunc_normal std 0.02 for Linear weights and the bias table, Kaiming normal for convs,
//!   identity norms) are never flagged, and the guarded outputs equal the unguarded ones bit for
//!   bit.
//! - Large weights: one tensor scaled at a time, the first flagged layer is that tensor's layer.
//! - Both on each of Swin-T's paths: fused cuBLASLt GEMMs (FP16 out, guarded where read or by a
//!   scan) or unfused, whole-window or per-query attention.
//! - `sptr camera-features` exits 4 naming the layer (the features written), 0 in range.
//! - The LSS view transform (seg config, nuScenes calibration): the lift (depth softmax and
//!   context), the pool and the downsample convs flag under `encoders.camera.vtransform.*`;
//!   random weights are in range (and the guarded output is the unguarded one, bit for bit).
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::lss_common;
use crate::common::{fp16, gpu, Rng};
use half::f16;
use crate::overflow_weights::normal;
use sptr::models::bevfusion::camera::encoder::{random_tensors, weight_specs, CameraEncoder, CameraEncoderConfig};
use sptr::models::bevfusion::camera::encoder_cuda::CudaCameraEncoder;
use sptr::ops::attention::cuda::Bias2dKernel;
use sptr::cli::camera_features::preprocess_files;
use sptr::device::cuda::CudaDevice;
use sptr::nn::random::{save_tensors, NamedTensors};
use sptr::device::range_guard::RangeReport;
use sptr::nn::weights::Weights;
use std::path::PathBuf;

fn model_path() -> PathBuf {
    common::root().join("config/models/bevfusion_seg_camera.yaml")
}

fn jpegs() -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(common::data("nuscenes"))
        .expect("tests/data/nuscenes")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().contains("__CAM_") && p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 6, "six camera JPEGs in tests/data/nuscenes");
    v
}

/// The six images preprocessed, rounded to FP16 as the GPU preprocessing delivers them.
fn images() -> (Vec<f32>, usize, usize, usize) {
    let (x, n, h, w) = preprocess_files(&jpegs(), &model_path()).expect("preprocess");
    (x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(), n, h, w)
}

/// Swin-T's CUDA paths: (fused cuBLASLt GEMMs, attention kernel); the guard must hold on each
/// (the fused path flags the FP16 GEMM outputs in the kernels that read them, or scans them).
/// The third field: the tensor-core attention reads the qkv output packed (the split kernel's
/// guard then in the attention kernel) or after the split kernel.
const PATHS: [(bool, Bias2dKernel, bool); 6] = [
    (true, Bias2dKernel::TensorCores, true),
    (true, Bias2dKernel::TensorCores, false),
    (true, Bias2dKernel::WholeWindow, false),
    (true, Bias2dKernel::PerQuery, false),
    (false, Bias2dKernel::TensorCores, false),
    (false, Bias2dKernel::PerQuery, false),
];

/// The guarded forward's report on every path, and its outputs' neck against the unguarded
/// forward's on that path.
fn run(dev: &CudaDevice, cfg: &CameraEncoderConfig, tensors: NamedTensors, x: &(Vec<f32>, usize, usize, usize)) -> Vec<(String, RangeReport)> {
    let enc = CameraEncoder::from_weights(cfg, Weights::from_tensors("test weights", tensors).expect("weights")).expect("encoder");
    let mut gpu = CudaCameraEncoder::upload(dev, &enc).expect("upload");
    let plan = gpu.plan(dev, x.1, x.2, x.3).expect("plan");
    let mut reports = Vec::new();
    for (fused, kernel, packed) in PATHS {
        gpu.set_swin_fused(dev, fused).expect("select the GEMM path");
        gpu.set_swin_attention_kernel(kernel);
        gpu.backbone.set_packed_qkv(packed);
        let path = format!("fused {fused}, {} attention, packed qkv {packed}", kernel.name());
        let (out, range) = gpu.forward_host_checked(dev, &plan, &x.0).expect("guarded forward");
        if range.is_clean() {
            let plain = gpu.forward_host(dev, &plan, &x.0).expect("forward");
            assert_eq!(plain.neck[0].data, out.neck[0].data, "{path}: guarding changed the output");
        }
        reports.push((path, range));
    }
    reports
}

/// An upstream-style initialisation: Linear weights and the relative position bias table
/// trunc_normal(std 0.02) (mmdet's Swin init), convs Kaiming normal (fan in), LayerNorm and
/// BatchNorm weights 1, biases 0, running means 0 and variances 1.
fn normal_init(cfg: &CameraEncoderConfig, seed: u64) -> NamedTensors {
    let mut rng = Rng(seed);
    weight_specs(cfg)
        .expect("specs")
        .into_iter()
        .map(|s| {
            let name = s.name.as_str();
            let n = s.numel();
            let data: Vec<f32> = match s.shape.len() {
                4 => {
                    let std = (2.0 / (s.shape[1] * s.shape[2] * s.shape[3]) as f64).sqrt();
                    (0..n).map(|_| normal(&mut rng, std)).collect()
                }
                2 => (0..n).map(|_| normal(&mut rng, 0.02).clamp(-0.04, 0.04)).collect(),
                _ if name.ends_with("running_var") || name.ends_with(".weight") => vec![1.0; n],
                _ => vec![0.0; n],
            };
            (s.name, s.shape, data)
        })
        .collect()
}

#[test]
fn camera_encoder_in_range_weights_are_never_flagged() {
    let Some(dev) = gpu("camera_encoder_in_range_weights_are_never_flagged") else { return };
    let cfg = CameraEncoderConfig::load(&model_path()).expect("config");
    let x = images();
    for (case, t) in [("random weights, seed 2026", random_tensors(&cfg, 2026).unwrap()), ("normal init, seed 18", normal_init(&cfg, 18))] {
        for (path, r) in run(&dev, &cfg, t, &x) {
            eprintln!("camera encoder, {case}, {path}: {}", r.summary(5));
            assert!(r.is_clean(), "{case}, {path}: {}", r.summary(10));
        }
    }
    // every layer is registered, named by its module path, in execution order
    let enc = CameraEncoder::from_weights(&cfg, Weights::from_tensors("w", random_tensors(&cfg, 1).unwrap()).unwrap()).unwrap();
    let gpu = CudaCameraEncoder::upload(&dev, &enc).unwrap();
    let names = gpu.layer_names().names();
    let depths = [2usize, 2, 6, 2];
    // patch embedding 2, 7 a block, an output norm per out index (3), a patch merging 2 (3), the
    // neck's lateral and fpn convs (2 x 2)
    assert_eq!(names.len(), 2 + 7 * depths.iter().sum::<usize>() + 3 + 2 * 3 + 4, "{names:?}");
    assert_eq!(names[0], "encoders.camera.backbone.patch_embed.projection");
    assert_eq!(names[2], "encoders.camera.backbone.stages.0.blocks.0.norm1");
    assert!(names.iter().any(|n| n == "encoders.camera.backbone.stages.2.blocks.5.attn.w_msa"));
    assert!(names.iter().any(|n| n == "encoders.camera.backbone.norm3"));
    assert_eq!(names[names.len() - 4], "encoders.camera.neck.lateral_convs.1.conv");
    assert_eq!(names[names.len() - 1], "encoders.camera.neck.fpn_convs.0.conv");
}

#[test]
fn camera_encoder_large_weights_flag_their_layer_first() {
    let Some(dev) = gpu("camera_encoder_large_weights_flag_their_layer_first") else { return };
    let cfg = CameraEncoderConfig::load(&model_path()).expect("config");
    let x = images();
    let base = random_tensors(&cfg, 2026).unwrap();
    let b = "encoders.camera.backbone";
    for (tensor, by, layer) in [
        (format!("{b}.patch_embed.projection.weight"), 1e6f32, format!("{b}.patch_embed.projection")),
        (format!("{b}.stages.0.blocks.0.norm1.weight"), 1e6, format!("{b}.stages.0.blocks.0.norm1")),
        (format!("{b}.stages.1.blocks.1.attn.w_msa.qkv.weight"), 1e6, format!("{b}.stages.1.blocks.1.attn.w_msa.qkv")),
        (format!("{b}.stages.0.blocks.1.attn.w_msa.proj.weight"), 1e6, format!("{b}.stages.0.blocks.1.attn.w_msa.proj")),
        (format!("{b}.stages.2.blocks.3.ffn.layers.0.0.weight"), 1e6, format!("{b}.stages.2.blocks.3.ffn.layers.0.0")),
        (format!("{b}.stages.2.blocks.4.ffn.layers.1.weight"), 1e6, format!("{b}.stages.2.blocks.4.ffn.layers.1")),
        (format!("{b}.stages.1.downsample.reduction.weight"), 1e6, format!("{b}.stages.1.downsample.reduction")),
        ("encoders.camera.neck.lateral_convs.1.conv.weight".to_string(), 1e6, "encoders.camera.neck.lateral_convs.1.conv".to_string()),
    ] {
        let mut t = base.clone();
        let e = t.iter_mut().find(|(n, _, _)| *n == tensor).unwrap_or_else(|| panic!("no tensor {tensor}"));
        // GEMM and conv weights are uploaded in FP16: scaled past 65,504 they would already be
        // inf on the device and the layer's first output NaN (inf - inf), which the guard reports
        // as NaN/inf, not as the overflow this test is about. So the factor stops where the
        // tensor's largest value reaches 60,000: its outputs (sums over >= 48 inputs of order 1)
        // still leave the range.
        let largest = e.2.iter().fold(0f32, |m, v| m.max(v.abs()));
        let by = by.min(60_000.0 / largest);
        e.2.iter_mut().for_each(|v| *v *= by);
        for (path, r) in run(&dev, &cfg, t, &x) {
            eprintln!("{tensor} x {by:e}, {path}: {}", r.summary(3));
            assert_eq!(r.first().map(|l| l.name.as_str()), Some(layer.as_str()), "{tensor} x {by:e}, {path}: {}", r.summary(10));
            assert!(r.layers[0].saturated, "{tensor}, {path}: {}", r.layers[0]);
        }
    }
}

/// `sptr camera-features` on CUDA: exit status 4 and the flagged layers on stderr for weights
/// out of FP16's range (the feature files still written), 0 in range.
#[test]
fn camera_features_exits_4_when_the_frame_is_flagged() {
    if gpu("camera_features_exits_4_when_the_frame_is_flagged").is_none() {
        return;
    }
    let cfg = CameraEncoderConfig::load(&model_path()).expect("config");
    let dir = std::env::temp_dir().join(format!("sptr-camera-overflow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut t = random_tensors(&cfg, 2026).unwrap();
    let e = t.iter_mut().find(|(n, _, _)| n == "encoders.camera.backbone.stages.0.blocks.1.ffn.layers.1.weight").unwrap();
    e.2.iter_mut().for_each(|v| *v *= 1e6);
    let weights = dir.join("big.safetensors");
    save_tensors(&weights, &t).unwrap();
    let run = |args: &[&str], out: &str| {
        let mut cmd = std::process::Command::new(common::sptr_exe());
        cmd.arg("camera-features").args(jpegs()).arg("--model").arg(model_path()).arg("--device").arg("cuda").arg("--out").arg(dir.join(out));
        cmd.args(args).output().expect("sptr runs")
    };
    let o = run(&["--weights", weights.to_str().unwrap()], "big");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(4), "stderr: {err}");
    assert!(err.contains("encoders.camera.backbone.stages.0.blocks.1.ffn.layers.1"), "{err}");
    assert!(dir.join("big/neck0.npy").is_file(), "the features are written for inspection");
    let o = run(&["--random-weights", "1"], "ok");
    assert_eq!(o.status.code(), Some(0), "stderr: {}", String::from_utf8_lossy(&o.stderr));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The view transform's guard: in range on random weights (same output bits guarded or not); a
/// scaled depthnet flags the lift, a scaled downsample conv flags its own layer first.
#[test]
fn lss_view_transform_flags_its_layers() {
    use sptr::models::bevfusion::lss::cuda::CudaLssTransform;
    use sptr::models::bevfusion::lss::transform::random_tensors as lss_tensors;
    use sptr::models::bevfusion::lss::{CameraMask, LssTransform, PREFIX};
    use sptr::ops::dense::cuda::CudaFeatureMap;
    use sptr::ops::dense::FeatureMap;
    use sptr::device::range::RangeFlags;
    use sptr::device::range_guard::LayerNames;
    let Some(dev) = gpu("lss_view_transform_flags_its_layers") else { return };
    let blas = cudarc::cublas::CudaBlas::new(dev.stream.clone()).unwrap();
    let cfg = lss_common::seg_config();
    let calib = lss_common::nuscenes_calib();
    let mut s = Rng(9);
    let x = FeatureMap::new(6, 32, 88, 256, (0..6 * 32 * 88 * 256).map(|_| fp16(s.sym())).collect()).unwrap();
    let gx = CudaFeatureMap::upload(&dev, &x).unwrap();
    let base = lss_tensors(&cfg, PREFIX, 5);
    let run = |tensors: NamedTensors| -> (RangeReport, Vec<f32>, Vec<f32>) {
        let t = LssTransform::from_weights_exact(&cfg, Weights::from_tensors("random", tensors).unwrap(), PREFIX).unwrap();
        let mut names = LayerNames::new();
        let mut gt = CudaLssTransform::upload_named(&dev, &t, &mut names).unwrap();
        let flags = RangeFlags::new(&dev, &names).unwrap();
        let guarded = gt.forward_guarded(&dev, &blas, &calib, &gx, CameraMask::ALL, Some(&flags)).unwrap().download(&dev).unwrap();
        let report = names.report(&flags.read_now(&dev).unwrap());
        let plain = gt.forward(&dev, &blas, &calib, &gx, CameraMask::ALL).unwrap().download(&dev).unwrap();
        assert_eq!(names.names()[..3], ["encoders.camera.vtransform.depthnet", "encoders.camera.vtransform.bev_pool", "encoders.camera.vtransform.downsample.0"]);
        (report, guarded.data, plain.data)
    };
    let (r, guarded, plain) = run(base.clone());
    assert!(r.is_clean(), "random weights: {}", r.summary(5));
    assert!(guarded.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()), "guarding changed the output");
    for (tensor, layer) in [("depthnet.weight", "encoders.camera.vtransform.depthnet"), ("downsample.3.weight", "encoders.camera.vtransform.downsample.3")] {
        let mut t = base.clone();
        let name = format!("{PREFIX}{tensor}");
        let e = t.iter_mut().find(|(n, _, _)| *n == name).unwrap_or_else(|| panic!("no tensor {name}"));
        e.2.iter_mut().for_each(|v| *v *= 1e6);
        let (r, _, _) = run(t);
        eprintln!("{name} x 1e6: {}", r.summary(3));
        assert_eq!(r.first().map(|l| l.name.as_str()), Some(layer), "{name}: {}", r.summary(10));
    }
}
