//! The FP16 range guard on the GPU: every kernel that stores FP16 activations flags a
//! value out of FP16's range under its layer, and a forward reports the layers by name.
//! Skips without a GPU unless SPTR_REQUIRE_GPU=1.
//!
//! - Kernels: every sparse conv kernel (direct, 64/32-row implicit GEMMs, pipelined, each tiled
//!   shape, the warpgroup-MMA ones on compute capability 9.0), unsplit and split over offsets
//!   (the split reduction stores), with a saturating output, a saturating pre-activation, a
//!   saturating post-activation, a NaN input, a NaN and saturated negatives that a fused ReLU
//!   zeroes, and in range (no flag, and the same bits as the unguarded launch); the window attention (per-query and tiled kernels, the key-split merge,
//!   contextual RPE on both window kinds, no RPE) with a saturating value table and a NaN value.
//! - The network, full nuScenes configuration on the nuScenes sweep: with weights drawn to leave
//!   FP16's range (conv/linear N(0, 0.05), BN/LN weights U(0.5, 1.5), biases and running means
//!   N(0, 0.1), running variances U(0.5, 2); RPE tables N(0, 0.02), upstream's init scale) the
//!   FP16 forward flags the frame and names layers, while the CPU (f32) forward is in range; one
//!   tensor of in-range weights scaled at a time, the first flagged layer is that tensor's layer
//!   (the input features, a conv epilogue, a BN pass, LayerNorm, the qkv and fc1 epilogues, the
//!   attention output, the head's BN, a 256-channel conv of the deepest level); the existing
//!   in-range random weights are never flagged (the configurations of tests/sphereformer/gpu.rs).
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{gpu, nuscenes_sweep, sphereformer_yaml, Rng};
use crate::overflow_weights::overflowing_weights;
use half::f16;
use sptr::ops::attention::cuda::{window_attention_cuda_guarded, window_attention_cuda_split, CudaContextual, CudaSphereWindows, CudaTerm, QkvView};
use sptr::ops::attention::{HeadSlice, SphereLevel};
use sptr::device::Device;
use sptr::models::sphereformer::config::{ModelConfig, ModelYaml};
use sptr::device::cuda::CudaDevice;
use sptr::device::range::RangeFlags;
use sptr::models::sphereformer::random::{random_tensors, random_weights};
use sptr::nn::random::NamedTensors;
use sptr::device::range_guard::{LayerNames, RANGE_NON_FINITE, RANGE_SATURATED};
use sptr::nn::weights::Weights;
use sptr::models::sphereformer::segmenter::{Segmentation, Segmenter};
use sptr::ops::sparse_conv::cpu::WeightLayout;
use sptr::ops::sparse_conv::cuda::{conv_cuda_guarded, conv_cuda_split, ConvAlgo, ConvRange, CudaConvWeights, CudaPreActivation, TILED_VARIANTS, WGMMA_VARIANTS};
use sptr::ops::sparse_conv::kernel_map_cuda::{submanifold_cuda_sites, CudaKernelMap, CudaSites};
use sptr::ops::voxelize::cpu::voxelize_cpu;
use sptr::Points;

fn up16(dev: &CudaDevice, v: &[f32]) -> cudarc::driver::CudaSlice<f16> {
    dev.stream.clone_htod(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>()).unwrap()
}

fn bits16(dev: &CudaDevice, v: &cudarc::driver::CudaSlice<f16>) -> Vec<u16> {
    dev.stream.clone_dtoh(v).unwrap().into_iter().map(|h| h.to_bits()).collect()
}

/// Two guarded layers, `pre` (id 0) and `out` (id 1), for kernel tests.
fn two_layers() -> (LayerNames, sptr::device::range_guard::LayerId, sptr::device::range_guard::LayerId) {
    let mut n = LayerNames::new();
    let pre = n.add("pre");
    let out = n.add("out");
    (n, pre, out)
}

/// A 3x3x3 submanifold map over `n` random sites of a 40^3 grid.
fn conv_map(dev: &CudaDevice, rng: &mut Rng, n: usize) -> CudaKernelMap {
    let mut set = std::collections::BTreeSet::new();
    while set.len() < n {
        set.insert([0, rng.below(40) as i32, rng.below(40) as i32, rng.below(40) as i32]);
    }
    let coords: Vec<[i32; 4]> = set.into_iter().collect();
    let sites = CudaSites::upload_sites(dev, &coords, [0; 3], [40; 3]).unwrap();
    submanifold_cuda_sites(dev, sites, [3; 3], [1; 3]).unwrap()
}

/// Every conv kernel with the offset splits to try (the FP32-unit kernels have none).
fn conv_algos(w: &CudaConvWeights) -> Vec<(ConvAlgo, Option<usize>)> {
    let mut v = vec![(ConvAlgo::Direct, None), (ConvAlgo::FmaTiled, None)];
    for splits in [Some(1), Some(3)] {
        for a in [ConvAlgo::ImplicitGemm, ConvAlgo::ImplicitGemm32, ConvAlgo::ImplicitGemmPipe, ConvAlgo::ImplicitGemmPipe32] {
            v.push((a, splits));
        }
        v.extend(TILED_VARIANTS.iter().map(|t| (t.algo(), splits)));
        if w.wgmma_ready() {
            v.extend(WGMMA_VARIANTS.iter().filter(|t| w.cout.is_multiple_of(t.cols as usize)).map(|t| (t.algo(), splits)));
        }
    }
    v
}

/// The kernels that gather into FP32 (shared memory or registers): a pre-activation is never
/// stored in FP16 there.
fn fp32_gather(a: ConvAlgo) -> bool {
    matches!(a, ConvAlgo::Direct | ConvAlgo::FmaTiled)
}

fn pipelined(a: ConvAlgo) -> bool {
    matches!(a, ConvAlgo::ImplicitGemmPipe | ConvAlgo::ImplicitGemmPipe32 | ConvAlgo::ImplicitGemmTiled { .. } | ConvAlgo::Wgmma { .. })
}

/// Every conv kernel flags what it stores out of range, under the right layer, and nothing
/// in range; guarding changes no output bit.
#[test]
fn every_conv_kernel_flags_values_out_of_fp16_range() {
    let Some(dev) = gpu("every_conv_kernel_flags_values_out_of_fp16_range") else { return };
    let mut rng = Rng(22);
    let (cin, cout, kv) = (64usize, 128usize, 27usize);
    let map = conv_map(&dev, &mut rng, 6000);
    let (m_in, m_out) = (map.in_count, map.out_count);
    let (names, pre_id, out_id) = two_layers();
    let s = &dev.stream;
    let bound = (1.0 / (kv * cin) as f32).sqrt() * 2.0;
    let w_small: Vec<f32> = (0..kv * cin * cout).map(|_| rng.uniform(-bound, bound)).collect();
    let small = CudaConvWeights::upload(&dev, &w_small, WeightLayout::Rsck, kv, cin, cout, None).unwrap();
    // every output >= 1100 * 64 = 70,400 on an all-ones input (each site is its own neighbour)
    let big = CudaConvWeights::upload(&dev, &vec![1100.0; kv * cin * cout], WeightLayout::Rsck, kv, cin, cout, None).unwrap();
    // every output <= -70,400 on an all-ones input
    let neg = CudaConvWeights::upload(&dev, &vec![-1100.0; kv * cin * cout], WeightLayout::Rsck, kv, cin, cout, None).unwrap();
    // outputs of at most 1e-4 * 1e5 * 64 * 27 = 17,280 after a 1e5 pre-scale
    let tiny = CudaConvWeights::upload(&dev, &vec![1e-4; kv * cin * cout], WeightLayout::Rsck, kv, cin, cout, None).unwrap();
    let x_rand: Vec<f32> = (0..m_in * cin).map(|_| rng.uniform(-1.0, 1.0)).collect();
    let x = up16(&dev, &x_rand);
    let ones = up16(&dev, &vec![1.0; m_in * cin]);
    let mut x_nan = x_rand.clone();
    x_nan[cin * (m_in / 2) + 3] = f32::NAN;
    let x_nan = up16(&dev, &x_nan);
    let up = |v: Vec<f32>| s.clone_htod(&v).unwrap();
    let (unit_s, zero_s) = (up(vec![1.0; cin.max(cout)]), up(vec![0.0; cin.max(cout)]));
    let (huge_s, huge_post) = (up(vec![1e5; cin]), up(vec![1e8; cout]));
    let bn = CudaPreActivation { scale: &unit_s, shift: &zero_s, relu: true };
    let bn_huge = CudaPreActivation { scale: &huge_s, shift: &zero_s, relu: true };
    let post_huge = CudaPreActivation { scale: &huge_post, shift: &zero_s, relu: true };
    let algos = conv_algos(&small);
    assert_eq!(small.wgmma_ready(), dev.arch.has_wgmma());
    let mut cases = 0;
    for &(algo, splits) in &algos {
        let case = format!("{algo:?} offset splits {splits:?}");
        // flags of (pre, out) after one guarded conv
        let run = |x: &cudarc::driver::CudaSlice<f16>, w: &CudaConvWeights, pre: Option<&CudaPreActivation>, post: Option<&CudaPreActivation>| {
            let flags = RangeFlags::new(&dev, &names).unwrap();
            let range = ConvRange { conv: Some(flags.slot(out_id).unwrap()), pre: Some(flags.slot(pre_id).unwrap()) };
            let y = conv_cuda_guarded(&dev, x, &map, w, pre, None, algo, splits, post, range).unwrap();
            let f = flags.read_now(&dev).unwrap();
            (f[0], f[1], y)
        };
        // in range: nothing flagged, and the output is the unguarded launch's, bit for bit
        let (p, o, y) = run(&x, &small, Some(&bn), None);
        assert_eq!((p, o), (0, 0), "{case}: in range");
        let plain = conv_cuda_split(&dev, &x, &map, &small, Some(&bn), None, algo, splits, None).unwrap();
        assert_eq!(bits16(&dev, &y)[..m_out * cout], bits16(&dev, &plain)[..m_out * cout], "{case}: guarding changed the output");
        // the output saturates (finite in FP32): its layer, and only the saturation bit
        let (p, o, _) = run(&ones, &big, None, None);
        assert_eq!((p, o), (0, RANGE_SATURATED), "{case}: saturating output");
        // the pre-activation saturates: the pipelined kernels' own pass flags it (and the conv
        // then reads inf); the 64/32-row implicit GEMMs convert it to FP16 on the gather (under
        // the conv's layer); the direct kernel keeps it in FP32 (nothing stored out of range)
        let (p, o, _) = run(&ones, &tiny, Some(&bn_huge), None);
        if pipelined(algo) {
            assert_eq!(p, RANGE_SATURATED, "{case}: saturating pre-activation pass");
            assert!(o & RANGE_NON_FINITE != 0, "{case}: the conv of an inf input: {o}");
        } else if fp32_gather(algo) {
            assert_eq!((p, o), (0, 0), "{case}: FP32 pre-activation, outputs below 17,280");
        } else {
            assert_eq!(p, 0, "{case}: no pre-activation pass");
            assert!(o & RANGE_SATURATED != 0, "{case}: saturating pre-activation on the gather: {o}");
        }
        // the post-activation (next layer's BN in the epilogue, the split reduction, or the
        // direct kernel's separate pass) saturates: the conv's layer
        let (p, o, _) = run(&ones, &tiny, None, Some(&post_huge));
        assert_eq!((p, o), (0, RANGE_SATURATED), "{case}: saturating post-activation");
        // a NaN input: non-finite outputs
        let (p, o, _) = run(&x_nan, &small, None, None);
        assert_eq!(p, 0, "{case}");
        assert!(o & RANGE_NON_FINITE != 0, "{case}: NaN input: {o}");
        // the guard reads before a fused ReLU, which would zero a NaN or a saturated negative
        // value: a NaN through the post-activation, outputs <= -70,400 zeroed by it
        let (p, o, _) = run(&x_nan, &small, None, Some(&bn));
        assert!(p == 0 && o & RANGE_NON_FINITE != 0, "{case}: NaN before the epilogue's ReLU: {p} {o}");
        let (p, o, y) = run(&ones, &neg, None, Some(&bn));
        if algo == ConvAlgo::Direct {
            // its raw output is stored first (-inf in FP16), then activated by a pass of its own
            assert!(p == 0 && o & RANGE_SATURATED != 0, "{case}: saturated negative outputs: {p} {o}");
        } else {
            assert_eq!((p, o), (0, RANGE_SATURATED), "{case}: saturated negative outputs before the epilogue's ReLU");
        }
        assert!(bits16(&dev, &y).iter().all(|&b| b == 0), "{case}: the ReLU zeroed them");
        // ... and through the pre-activation: its own pass (pipelined) or the gather (64/32-row
        // implicit GEMMs) flags it; the direct kernel's FP32 gather zeroes it unseen (its input
        // is guarded where it is produced)
        let (p, o, _) = run(&x_nan, &small, Some(&bn), None);
        if pipelined(algo) {
            assert!(p & RANGE_NON_FINITE != 0, "{case}: NaN into the pre-activation pass: {p} {o}");
        } else if fp32_gather(algo) {
            assert_eq!((p, o), (0, 0), "{case}: FP32 gather");
        } else {
            assert!(p == 0 && o & RANGE_NON_FINITE != 0, "{case}: NaN on the gather: {p} {o}");
        }
        cases += 1;
    }
    eprintln!("conv range guard: {cases} kernel/split cases, {m_out} outputs, Cin {cin} Cout {cout}");
}

/// SphereFormer's voxel positions of the nuScenes sweep and the level-1 windows.
fn nuscenes_level1(dev: &CudaDevice) -> (usize, cudarc::driver::CudaSlice<f32>, CudaSphereWindows) {
    let cfg = ModelConfig::load(&common::root().join("config/models/sphereformer_nuscenes.yaml")).unwrap();
    let v = voxelize_cpu(&[&nuscenes_sweep()], &cfg.voxel_params()).unwrap();
    let batch: Vec<i32> = v.coords.iter().map(|c| c[0]).collect();
    let n = v.xyz.len();
    let xyz_d = dev.stream.clone_htod(&v.xyz.iter().flatten().copied().collect::<Vec<_>>()).unwrap();
    let batch_d = dev.stream.clone_htod(&batch).unwrap();
    let level = SphereLevel::from_model(&cfg.yaml, 1).unwrap();
    let w = CudaSphereWindows::build(dev, &xyz_d, &batch_d, n, &level).unwrap();
    (n, xyz_d, w)
}

/// The attention kernels flag their output: a value table that pushes it past 65,504, a NaN
/// value; per-query and tiled kernels, the key-split merge, both window kinds.
#[test]
fn attention_kernels_flag_outputs_out_of_fp16_range() {
    let Some(dev) = gpu("attention_kernels_flag_outputs_out_of_fp16_range") else { return };
    let (n, xyz_d, w) = nuscenes_level1(&dev);
    let (names, _, out_id) = two_layers();
    let s = &dev.stream;
    let mut rng = Rng(23);
    let (heads, d) = (2usize, 16usize);
    let row = heads * d;
    let rand = |rng: &mut Rng, len: usize, scale: f32| (0..len).map(|_| rng.sym() * scale).collect::<Vec<f32>>();
    let (q, k, v) = (rand(&mut rng, n * row, 0.25), rand(&mut rng, n * row, 1.0), rand(&mut rng, n * row, 1.0));
    let (qd, kd, vd) = (up16(&dev, &q), up16(&dev, &k), up16(&dev, &v));
    let mut v_nan = v.clone();
    v_nan[row * (n / 3)] = f32::NAN;
    let vd_nan = up16(&dev, &v_nan);
    let all = HeadSlice::all(heads, d);
    for (kind, part, geometry, positions, quant) in [
        ("cubic", &w.cubic, w.cubic_rpe, &xyz_d, &w.cubic_quant),
        ("spherical", &w.sphere, w.sphere_rpe, &w.sphere_pos, &w.sphere_quant),
    ] {
        let rows = geometry.table_rows();
        let tq = s.clone_htod(&rand(&mut rng, rows * 3 * heads * d, 0.3)).unwrap();
        let tk = s.clone_htod(&rand(&mut rng, rows * 3 * heads * d, 0.3)).unwrap();
        let tv = s.clone_htod(&rand(&mut rng, rows * 3 * heads * d, 0.3)).unwrap();
        // |v + tv| of three rows >= 3 * 1e5 - 2: every output far past 65,504
        let tv_huge = s.clone_htod(&vec![1e5f32; rows * 3 * heads * d]).unwrap();
        let ctx = |tv| CudaTerm::Contextual(CudaContextual { geometry, quant, positions, tables: [&tq, &tk, tv] });
        // per-query kernel only; tiled kernel for every window (unsplit, and split over keys)
        for (tiled_min, splits) in [(usize::MAX, None), (1, Some(1)), (1, Some(4))] {
            let case = format!("{kind} windows, tiled from {tiled_min}, key splits {splits:?}");
            let run = |v: &cudarc::driver::CudaSlice<f16>, term: CudaTerm| {
                let flags = RangeFlags::new(&dev, &names).unwrap();
                let mut out = s.alloc_zeros::<f16>(n * row).unwrap();
                let qkv = QkvView { q: &qd, k: &kd, v, ld: row };
                window_attention_cuda_guarded(&dev, qkv, all, part, term, &mut out, row, tiled_min, splits, Some(flags.slot(out_id).unwrap())).unwrap();
                (flags.read_now(&dev).unwrap()[1], out)
            };
            let (f, out) = run(&vd, ctx(&tv));
            assert_eq!(f, 0, "{case}: in range");
            let mut plain = s.alloc_zeros::<f16>(n * row).unwrap();
            let qkv = QkvView { q: &qd, k: &kd, v: &vd, ld: row };
            window_attention_cuda_split(&dev, qkv, all, part, ctx(&tv), &mut plain, row, tiled_min, splits).unwrap();
            assert_eq!(bits16(&dev, &out), bits16(&dev, &plain), "{case}: guarding changed the output");
            assert_eq!(run(&vd, ctx(&tv_huge)).0, RANGE_SATURATED, "{case}: saturating value table");
            assert!(run(&vd_nan, ctx(&tv)).0 & RANGE_NON_FINITE != 0, "{case}: NaN value");
            eprintln!("attention range guard: {case} ok");
        }
        // no RPE (the per-query kernel's plain mode, as a Swin-style caller without tables)
        let (f, _) = {
            let flags = RangeFlags::new(&dev, &names).unwrap();
            let mut out = s.alloc_zeros::<f16>(n * row).unwrap();
            let qkv = QkvView { q: &qd, k: &kd, v: &vd_nan, ld: row };
            window_attention_cuda_guarded(&dev, qkv, all, part, CudaTerm::None, &mut out, row, usize::MAX, None, Some(flags.slot(out_id).unwrap())).unwrap();
            (flags.read_now(&dev).unwrap()[1], out)
        };
        assert!(f & RANGE_NON_FINITE != 0, "{kind} windows without RPE: NaN value");
    }
}

fn segment(y: &ModelYaml, tensors: NamedTensors, device: Device, pts: &Points) -> Segmentation {
    let w = Weights::from_tensors("test weights", tensors).unwrap();
    Segmenter::on_device(y.clone(), w, device).unwrap().segment(&[pts]).unwrap()
}

/// Overflowing weights: FP16 leaves the range (the frame is flagged, layers named in execution
/// order), f32 does not.
#[test]
fn overflowing_weights_are_flagged_in_fp16_and_not_in_f32() {
    if gpu("overflowing_weights_are_flagged_in_fp16_and_not_in_f32").is_none() {
        return;
    }
    let y = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let pts = nuscenes_sweep();
    let cuda = segment(&y, overflowing_weights(&y, 22), Device::Cuda, &pts);
    let r = &cuda.range;
    eprintln!("overflowing weights, CUDA FP16: {}", r.summary(12));
    assert!(!r.is_clean(), "the FP16 forward must flag the frame");
    assert!(r.layers.iter().all(|l| !l.name.is_empty() && !l.name.starts_with("layer #")), "{}", r.summary(100));
    let first = r.first().unwrap();
    assert!(first.saturated, "where the range is left a finite value saturates: {first}");
    let cpu = segment(&y, overflowing_weights(&y, 22), Device::Cpu, &pts);
    assert!(cpu.range.is_clean(), "f32 holds these activations: {}", cpu.range.summary(5));
    let agree = cpu.labels.iter().zip(&cuda.labels).filter(|(a, b)| a == b).count() as f64 / cpu.labels.len() as f64;
    eprintln!("overflowing weights: FP16 labels agree with f32 on {:.2} % of points (the guard's reason to exist)", 100.0 * agree);
}

/// One tensor of in-range random weights scaled, or the input's intensity raised: the first
/// flagged layer is where that tensor (or the input) acts.
#[test]
fn the_first_flagged_layer_is_the_one_that_left_the_range() {
    if gpu("the_first_flagged_layer_is_the_one_that_left_the_range").is_none() {
        return;
    }
    let y = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let pts = nuscenes_sweep();
    let base = random_tensors(&y, 5).unwrap();
    let scaled = |tensor: &str, by: f32| {
        let mut t = base.clone();
        let e = t.iter_mut().find(|(n, _, _)| n == tensor).unwrap_or_else(|| panic!("no tensor {tensor}"));
        e.2.iter_mut().for_each(|v| *v *= by);
        t
    };
    let clean = segment(&y, base.clone(), Device::Cuda, &pts);
    assert!(clean.range.is_clean(), "{}", clean.range.summary(5));
    // intensities of 1e5: the FP16 input features are inf
    let mut hot = pts.clone();
    hot.intensity.iter_mut().for_each(|v| *v = 1e5);
    let r = segment(&y, base.clone(), Device::Cuda, &hot).range;
    assert_eq!(r.first().map(|l| l.name.as_str()), Some("input"), "{}", r.summary(5));
    for (tensor, by, layer) in [
        ("input_conv.0.weight", 1e4, "input_conv.0"),
        ("unet.blocks.block0.conv_branch.0.weight", 1e6, "unet.blocks.block0.conv_branch.0"),
        ("unet.transformer_block.norm1.weight", 1e6, "unet.transformer_block.norm1"),
        ("unet.transformer_block.attn.qkv.weight", 1e5, "unet.transformer_block.attn.qkv"),
        ("unet.transformer_block.attn.relative_pos_value_table", 1e7, "unet.transformer_block.attn"),
        ("unet.transformer_block.mlp.fc1.weight", 1e5, "unet.transformer_block.mlp.fc1"),
        ("unet.u.u.u.u.blocks.block0.conv_branch.2.weight", 1e6, "unet.u.u.u.u.blocks.block0.conv_branch.2"),
        ("output_layer.0.weight", 1e6, "output_layer.0"),
    ] {
        let r = segment(&y, scaled(tensor, by), Device::Cuda, &pts).range;
        eprintln!("{tensor} x {by:e}: {}", r.summary(3));
        assert_eq!(r.first().map(|l| l.name.as_str()), Some(layer), "{tensor} x {by:e}: {}", r.summary(10));
        assert!(r.layers[0].saturated, "{tensor}: {}", r.layers[0]);
    }
}

/// No false alarms: the in-range random weights of tests/sphereformer/gpu.rs's cases are never
/// flagged.
#[test]
fn in_range_weights_are_never_flagged() {
    if gpu("in_range_weights_are_never_flagged").is_none() {
        return;
    }
    let nus = nuscenes_sweep();
    let kitti = Points::read_bin(&common::data("semantickitti/000000.bin"), 4).unwrap();
    let n = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let k = sphereformer_yaml("sphereformer_semantickitti.yaml");
    let mut conv_only = n.clone();
    conv_only.sphere_layers.clear();
    let mut vgg = k.clone();
    vgg.block_residual = false;
    vgg.layers.truncate(3);
    vgg.sphere_layers.retain(|&l| l <= 3);
    for (case, y, seed, pts) in [
        ("nuscenes full config", &n, 5, &nus),
        ("nuscenes sweep, semantickitti config", &k, 4, &nus),
        ("nuscenes conv only", &conv_only, 6, &nus),
        ("semantickitti full config", &k, 7, &kitti),
        ("semantickitti vgg blocks", &vgg, 8, &kitti),
    ] {
        let w = random_weights(y, seed).unwrap();
        let r = Segmenter::on_device(y.clone(), w, Device::Cuda).unwrap().segment(&[pts]).unwrap();
        assert!(r.range.is_clean(), "{case}: {}", r.range.summary(10));
        eprintln!("{case}: in range, {} voxels", r.voxels);
    }
}
