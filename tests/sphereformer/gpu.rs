//! SphereFormer on CUDA against the CPU reference, from the same weights and inputs: logits
//! ‖cuda − cpu‖/‖cpu‖ ≤ 1e-2 and arg-max agreement ≥ 99.5 % of voxels, on the real nuScenes sweep
//! and the SemanticKITTI sample with the full upstream configurations, plus variants (no attention
//! levels, VGG blocks) that tell conv errors from attention errors. Skips without a GPU unless
//! SPTR_REQUIRE_GPU=1.
//!
//! Tolerance: the CUDA path keeps activations in FP16 between layers (as upstream under autocast)
//! and accumulates in FP32; each layer adds about one FP16 rounding (4.9e-4 relative) to its
//! output, and a U-Net of ~40 layers compounds that to a few 1e-3 on the logits. 1e-2 is the
//! FP16 bar; the arg-max may flip only where the top two logits are within that error.
#![cfg(feature = "cuda-core")]

use crate::common::{argmax, gpu, nuscenes_sweep, rel_err, semantickitti_sample, sphereformer_yaml};
use sptr::device::Device;
use sptr::models::sphereformer::config::ModelYaml;
use sptr::models::sphereformer::preprocess::prepare_inputs;
use sptr::models::sphereformer::random::random_weights;
use sptr::models::sphereformer::network::StageTimes;
use sptr::models::sphereformer::segmenter::{Segmenter, UNLABELED};
use sptr::Points;
use std::time::Instant;

fn both(y: &ModelYaml, seed: u64) -> (Segmenter, Segmenter) {
    let cpu = Segmenter::new(y.clone(), random_weights(y, seed).expect("weights")).expect("cpu model");
    let cuda = Segmenter::on_device(y.clone(), random_weights(y, seed).expect("weights"), Device::Cuda).expect("cuda model");
    (cpu, cuda)
}

/// Runs both backends on `pts` and checks logits and arg-max; returns the CUDA forward's time.
fn compare(case: &str, y: &ModelYaml, seed: u64, pts: &Points) -> f64 {
    let (cpu, cuda) = both(y, seed);
    let inputs = prepare_inputs(&[pts], y).expect("inputs");
    let t = Instant::now();
    let want = cpu.run_network(&inputs, &mut StageTimes::default()).expect("cpu forward");
    let cpu_ms = t.elapsed().as_secs_f64() * 1e3;
    cuda.run_network(&inputs, &mut StageTimes::default()).expect("cuda warm-up");
    let mut times = StageTimes::default();
    let t = Instant::now();
    let got = cuda.run_network(&inputs, &mut times).expect("cuda forward");
    let cuda_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(got.len(), want.len(), "{case}: logits length");
    assert!(got.iter().all(|v| v.is_finite()), "{case}: non-finite logits");
    let err = rel_err(&got, &want);
    let k = y.classes;
    let agree = got.chunks(k).zip(want.chunks(k)).filter(|(a, b)| argmax(a) == argmax(b)).count();
    let frac = agree as f64 / inputs.len() as f64;
    let stages: Vec<String> = times.stages.iter().map(|(n, d)| format!("{n} {:.2}", d.as_secs_f64() * 1e3)).collect();
    eprintln!(
        "{case}: {} voxels, logits rel err {err:.2e}, arg-max agreement {:.3}%, cpu {cpu_ms:.0} ms, cuda {cuda_ms:.2} ms [{}]",
        inputs.len(),
        frac * 100.0,
        stages.join(", ")
    );
    assert!(err <= 1e-2, "{case}: logits rel err {err} > 1e-2");
    assert!(frac >= 0.995, "{case}: arg-max agreement {frac} < 99.5%");
    cuda_ms
}

#[test]
fn cuda_logits_match_cpu_on_nuscenes() {
    if gpu("cuda_logits_match_cpu_on_nuscenes").is_none() {
        return;
    }
    let pts = nuscenes_sweep();
    let y = sphereformer_yaml("sphereformer_nuscenes.yaml");
    compare("nuscenes full config", &y, 5, &pts);
    // the nuScenes sample through the full SemanticKITTI configuration
    compare("nuscenes sweep, full semantickitti config", &sphereformer_yaml("sphereformer_semantickitti.yaml"), 4, &pts);
    // the U-Net alone (no attention levels): isolates the conv path
    let mut conv_only = y.clone();
    conv_only.sphere_layers.clear();
    compare("nuscenes conv only", &conv_only, 6, &pts);
}

#[test]
fn cuda_logits_match_cpu_on_semantickitti() {
    if gpu("cuda_logits_match_cpu_on_semantickitti").is_none() {
        return;
    }
    let pts = semantickitti_sample();
    let y = sphereformer_yaml("sphereformer_semantickitti.yaml");
    compare("semantickitti full config", &y, 7, &pts);
    let mut vgg = y.clone();
    vgg.block_residual = false;
    vgg.layers.truncate(3);
    vgg.sphere_layers.retain(|&l| l <= 3);
    compare("semantickitti vgg blocks, 3 levels", &vgg, 8, &pts);
}

#[test]
fn cuda_segmenter_labels_points_like_the_cpu() {
    if gpu("cuda_segmenter_labels_points_like_the_cpu").is_none() {
        return;
    }
    let y = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let (cpu, cuda) = both(&y, 9);
    assert_eq!(cuda.device(), Device::Cuda);
    let mut pts = nuscenes_sweep();
    // a point without a voxel (NaN) and a far but real return (the nuScenes config does not clip)
    pts.x[10] = f32::NAN;
    pts.x[11] = 250.0;
    let a = cpu.segment(&[&pts]).expect("cpu segment");
    let b = cuda.segment(&[&pts]).expect("cuda segment");
    assert_eq!(a.labels.len(), b.labels.len());
    assert_eq!(a.voxels, b.voxels);
    let unl = |s: &sptr::models::sphereformer::segmenter::Segmentation| s.labels.iter().filter(|&&l| l == UNLABELED).count();
    assert_eq!(unl(&a), unl(&b), "the same points lack a voxel");
    assert!(b.labels[10] == UNLABELED && b.labels[11] != UNLABELED);
    let agree = a.labels.iter().zip(&b.labels).filter(|(x, y)| x == y).count() as f64 / a.labels.len() as f64;
    eprintln!("cuda segment: point label agreement {:.3}%", agree * 100.0);
    assert!(agree >= 0.995, "point label agreement {agree}");
    // repeated frames give the same labels (deterministic kernels and reductions)
    let c = cuda.segment(&[&pts]).expect("cuda segment again");
    assert_eq!(b.labels, c.labels);
    // empty input and an all-NaN cloud: every point unlabeled, no error, the network not run
    let empty = Points::default();
    assert!(cuda.segment(&[&empty]).expect("empty").labels.is_empty());
    let nan = Points::from_interleaved(&[f32::NAN, 0.0, 0.0, 1.0].repeat(5), 4).expect("points");
    assert!(cuda.segment(&[&nan]).expect("all NaN").labels.iter().all(|&l| l == UNLABELED));
    // a cloud spanning more than 32,768 voxels on an axis (a 1,000 km outlier) exceeds the GPU
    // kernel maps' 16-bit coordinates: a clear error for that frame (the CPU path takes it)
    let mut wide = nuscenes_sweep();
    wide.z[11] = 1e6;
    let err = cuda.segment(&[&wide]).expect_err("wider than 16-bit coordinates");
    assert!(format!("{err}").contains("16 bits"), "{err}");
    assert!(cuda.segment(&[&pts]).is_ok(), "the next frame runs");
    // the network's own input checks: lengths that do not agree are an error, not a crash
    let mut bad = prepare_inputs(&[&pts], &y).expect("inputs");
    bad.feats.pop();
    assert!(cuda.run_network(&bad, &mut StageTimes::default()).is_err());
    let mut bad = prepare_inputs(&[&pts], &y).expect("inputs");
    bad.coords[3] = bad.coords[4];
    assert!(cuda.run_network(&bad, &mut StageTimes::default()).is_err(), "duplicate coordinates are rejected");
}

/// Device buffers allocated without zeroing are written before anything reads them: the whole
/// CUDA frame (voxelization, the network, the labels) gives the same bits when every such buffer
/// starts as 0xFF bytes (NaN floats, −1 integers) or as 0x7F bytes (large finite FP32 values,
/// FP16 NaNs, large positive integers) as without a fill. Both configurations, so the float32
/// and float64 voxel keys, the clip rule, and every attention level's window and key-split paths
/// run.
#[test]
fn frame_reads_no_unwritten_device_memory() {
    use half::f16;
    use sptr::device::clock::GpuClock;
    use sptr::device::cuda::CudaDevice;
    use sptr::models::sphereformer::network::cuda::CudaSphereFormer;
    use sptr::models::sphereformer::network::SphereFormer;
    use sptr::models::sphereformer::preprocess::cuda::{labels_to_points_cuda, prepare_inputs_cuda};
    let Some(plain) = gpu("frame_reads_no_unwritten_device_memory") else { return };
    let pts = nuscenes_sweep();
    type Frame = (Vec<f32>, Vec<u32>, Vec<f32>, sptr::device::range_guard::RangeReport);
    let frame = |dev: &CudaDevice, y: &ModelYaml, net: &SphereFormer| -> Frame {
        let gpu_net = CudaSphereFormer::<f16>::upload(dev, net).expect("upload");
        let inputs = prepare_inputs_cuda(dev, &[&pts], y).expect("inputs");
        let mut clock = GpuClock::start(dev).expect("clock");
        let (logits, map, range) = gpu_net.forward_prepared(dev, inputs, &mut clock).expect("forward");
        let host_logits = dev.stream.clone_dtoh(&logits).expect("logits");
        let (labels, probs) = labels_to_points_cuda(dev, &logits, &map, y.classes, UNLABELED).expect("labels");
        let report = range.finish(gpu_net.layer_names()).expect("range flags");
        (host_logits, labels, probs, report)
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    for (name, seed) in [("sphereformer_nuscenes.yaml", 12), ("sphereformer_semantickitti.yaml", 13)] {
        let y = sphereformer_yaml(name);
        let net = SphereFormer::from_weights(&y, random_weights(&y, seed).expect("weights")).expect("model");
        let want = frame(&plain, &y, &net);
        assert!(want.0.iter().all(|v| v.is_finite()), "{name}: non-finite logits without a fill");
        for byte in [0xff, 0x7f] {
            let mut dev = CudaDevice::new(0).expect("second device handle");
            dev.set_poison_uninit(Some(byte));
            let got = frame(&dev, &y, &net);
            assert!(bits(&got.0) == bits(&want.0), "{name}: logits differ with buffers filled with {byte:#x}");
            assert_eq!(got.1, want.1, "{name}: point labels differ with buffers filled with {byte:#x}");
            assert!(bits(&got.2) == bits(&want.2), "{name}: probabilities differ with buffers filled with {byte:#x}");
            assert_eq!(got.3, want.3, "{name}: range flags differ with buffers filled with {byte:#x}");
        }
        eprintln!("{name}: {} logits identical with and without the 0xff / 0x7f fills", want.0.len());
    }
}

/// The transformer blocks' qkv epilogue (one launch, three outputs) gives the bits of three
/// single-output epilogues and of the CPU's FP16 rounding of (acc + bias) · scale, at a width of
/// 8-value rows and at one of only 4-value groups; a width not a multiple of 4 is an error.
#[test]
fn qkv_epilogue_equals_three_epilogues() {
    use crate::common::Rng;
    use half::f16;
    use sptr::ops::rowwise::cuda::{epilogue, qkv_epilogue_guarded};
    let Some(dev) = gpu("qkv_epilogue_equals_three_epilogues") else { return };
    let mut rng = Rng(77);
    for (n, c) in [(1000usize, 64usize), (333, 36)] {
        let acc: Vec<f32> = (0..n * 3 * c).map(|_| rng.uniform(-6.0, 6.0)).collect();
        let bias: Vec<Vec<f32>> = (0..3).map(|_| (0..c).map(|_| rng.uniform(-1.0, 1.0)).collect()).collect();
        let scale = 0.25f32;
        let up = |v: &[f32]| dev.stream.clone_htod(v).expect("upload");
        let d_acc = up(&acc);
        let d_bias: Vec<_> = bias.iter().map(|b| up(b)).collect();
        let outs = qkv_epilogue_guarded::<f16>(&dev, &d_acc, n, [&d_bias[0], &d_bias[1], &d_bias[2]], scale, None).expect("qkv epilogue");
        for (part, got) in outs.iter().enumerate() {
            let s = if part == 0 { scale } else { 1.0 };
            let single = epilogue(&dev, &d_acc, 3 * c, part * c, n, &d_bias[part], s, false, None).expect("epilogue");
            let got: Vec<u16> = dev.stream.clone_dtoh(got).expect("read")[..n * c].iter().map(|h| h.to_bits()).collect();
            let single: Vec<u16> = dev.stream.clone_dtoh(&single).expect("read")[..n * c].iter().map(|h| h.to_bits()).collect();
            assert!(got == single, "n {n}, c {c}, part {part}: differs from the single-output epilogue");
            for r in 0..n {
                for j in 0..c {
                    let want = f16::from_f32((acc[r * 3 * c + part * c + j] + bias[part][j]) * s).to_bits();
                    assert_eq!(got[r * c + j], want, "n {n}, c {c}, part {part}, row {r}, column {j}");
                }
            }
        }
    }
    let odd: Vec<_> = (0..3).map(|_| dev.stream.clone_htod(&[0.0f32; 6]).expect("upload")).collect();
    let acc = dev.stream.clone_htod(&[0.0f32; 36]).expect("upload");
    let err = qkv_epilogue_guarded::<f16>(&dev, &acc, 2, [&odd[0], &odd[1], &odd[2]], 1.0, None).err().expect("c = 6 is refused");
    assert!(err.to_string().contains("multiple of 4"), "{err}");
}

/// The Linear epilogue's kernel of four values a thread (rows whose width and start are
/// multiples of 4) against its one-value kernel (an accumulator whose rows start 2 floats in):
/// the same values within one FP16 ulp (FMA contraction may differ between the two), with bias,
/// scale, GELU and a residual.
#[test]
fn linear_epilogue_four_a_thread_equals_one_a_thread() {
    use crate::common::Rng;
    use half::f16;
    use sptr::ops::rowwise::cuda::epilogue;
    let Some(dev) = gpu("linear_epilogue_four_a_thread_equals_one_a_thread") else { return };
    let mut rng = Rng(78);
    let (n, c) = (777usize, 64usize);
    let acc: Vec<f32> = (0..n * c).map(|_| rng.uniform(-5.0, 5.0)).collect();
    // the same rows, each 2 floats further in: the one-value kernel runs there
    let mut shifted = vec![0.0f32; n * (c + 2)];
    for r in 0..n {
        shifted[r * (c + 2) + 2..(r + 1) * (c + 2)].copy_from_slice(&acc[r * c..(r + 1) * c]);
    }
    let bias: Vec<f32> = (0..c).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let residual: Vec<f16> = (0..n * c).map(|_| f16::from_f32(rng.uniform(-2.0, 2.0))).collect();
    let d_acc = dev.stream.clone_htod(&acc).expect("upload");
    let d_shifted = dev.stream.clone_htod(&shifted).expect("upload");
    let d_bias = dev.stream.clone_htod(&bias).expect("upload");
    let d_res = dev.stream.clone_htod(&residual).expect("upload");
    for (gelu, res) in [(false, None), (true, None), (false, Some(&d_res)), (true, Some(&d_res))] {
        let four = epilogue(&dev, &d_acc, c, 0, n, &d_bias, 0.5, gelu, res).expect("four a thread");
        let one = epilogue(&dev, &d_shifted, c + 2, 2, n, &d_bias, 0.5, gelu, res).expect("one a thread");
        let four = dev.stream.clone_dtoh(&four).expect("read");
        let one = dev.stream.clone_dtoh(&one).expect("read");
        for i in 0..n * c {
            let (a, b) = (four[i].to_bits() as i32, one[i].to_bits() as i32);
            assert!((a - b).abs() <= 1, "gelu {gelu}, residual {}: value {i}: {} vs {}", res.is_some(), four[i], one[i]);
        }
    }
}
