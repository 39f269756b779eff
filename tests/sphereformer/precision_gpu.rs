//! Precisions `bf16`, `fp32` and `auto` on the GPU: BF16 storage keeps FP32's range on
//! the same tensor cores at 8 significant bits; FP32 storage (no tensor cores) keeps the CPU
//! path's range and precision and is `auto`'s fallback. Skips without a GPU unless
//! SPTR_REQUIRE_GPU=1.
//!
//! - Kernels: every sparse conv kernel's BF16 build (direct, 64/32-row implicit GEMMs, pipelined,
//!   each tiled shape, the warpgroup-MMA ones on compute capability 9.0; unsplit and split over
//!   offsets; with the pre-activation, residual and post-activation) against the f32 CPU conv of
//!   the same BF16-rounded inputs and weights, and the FP32 build's kernels (direct, FP32-unit
//!   tiles) likewise (the tensor-core algorithms refused in FP32); the BF16 guard's limit (outputs of 70,400, which
//!   FP16 flags, are in range; NaN is flagged). The window attention's BF16 build (per-query and
//!   tiled kernels, the key-split merge, both window kinds) and its FP32 build (per-query kernels)
//!   against its FP16 build on the same inputs (exactly representable in all three).
//! - The network, full nuScenes configuration on the nuScenes sweep, with overflowing weights
//!   (activations of 1.3e6): `fp32` is never flagged and agrees with the CPU (f32) on >= 99.5 %
//!   of points; `auto` flags its first FP16 frame, computes it again in FP32 (same bar), stays on
//!   FP32 and is counted. `bf16` is never flagged; its agreement is bounded by BF16's own rounding
//!   (the CPU forward with its weights and layer outputs rounded to BF16 agrees on 98.9 %), so
//!   its bar is 98.5 %. With in-range weights: `auto` is the FP16 path exactly (same labels,
//!   never flagged), `bf16` and `fp32` are never flagged.
//!
//! Tolerances: BF16 keeps 8 significant bits (relative rounding at most 2^-9 = 2.0e-3, about
//! 1.1e-3 RMS, 8x FP16's). A conv output is rounded once on the way out (plus once on the way in
//! for a pre-activated input): 5e-3 against f32 is 2.5x the worst single rounding. The attention
//! outputs differ from FP16's by their own rounding and P's (2^-9 against 2^-12): 1e-2. FP32
//! conv against the f32 CPU conv: only the summation order differs (27 x 128 terms, ~1e-6
//! relative): 1e-5. FP32 attention against FP16: FP16's output and P rounding (2^-12): 2e-3.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{gpu, nuscenes_sweep, rel_err, sphereformer_yaml, Rng};
use cudarc::driver::CudaSlice;
use half::{bf16, f16};
use crate::overflow_weights::overflowing_weights;
use sptr::ops::attention::cuda::{window_attention_cuda_guarded, CudaContextual, CudaSphereWindows, CudaTerm, QkvView};
use sptr::ops::attention::{HeadSlice, SphereLevel};
use sptr::device::Device;
use sptr::models::sphereformer::config::{ModelConfig, ModelYaml};
use sptr::device::cuda::CudaDevice;
use sptr::device::range::RangeFlags;
use sptr::device::storage::{Precision, Storage, Store};
use sptr::nn::random::NamedTensors;
use sptr::device::range_guard::{LayerNames, RANGE_NON_FINITE};
use sptr::nn::weights::Weights;
use sptr::models::sphereformer::segmenter::{Segmentation, Segmenter};
use sptr::ops::sparse_conv::cpu::{conv_with, ConvOptions, PreActivation, WeightLayout};
use sptr::ops::sparse_conv::cuda::{conv_cuda_guarded, ConvAlgo, ConvRange, CudaConvWeights, CudaPreActivation, TILED_MIN_OUTPUTS, TILED_VARIANTS, WGMMA_VARIANTS};
use sptr::ops::sparse_conv::kernel_map::submanifold;
use sptr::ops::sparse_conv::kernel_map_cuda::{submanifold_cuda, CudaSites};
use sptr::ops::sparse_conv::tensor::SparseTensor;
use sptr::ops::voxelize::cpu::voxelize_cpu;
use sptr::Points;

fn round_bf16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
}

fn up<S: Store>(dev: &CudaDevice, v: &[f32]) -> CudaSlice<S> {
    dev.stream.clone_htod(&v.iter().map(|&x| S::from_f32(x)).collect::<Vec<S>>()).unwrap()
}

fn down<S: Store>(dev: &CudaDevice, v: &CudaSlice<S>, len: usize) -> Vec<f32> {
    dev.stream.clone_dtoh(v).unwrap().into_iter().take(len).map(S::to_f32).collect()
}

/// Real voxels: the nuScenes sweep at 0.05 m (the SemanticKITTI preprocessing).
fn real_tensor(c: usize, rng: &mut Rng) -> SparseTensor {
    let mut p = ModelConfig::load(&common::root().join("config/models/sphereformer_semantickitti.yaml")).unwrap().voxel_params();
    p.voxel_size = [0.05; 3];
    let v = voxelize_cpu(&[&nuscenes_sweep()], &p).unwrap();
    let mut shape = [8; 3];
    for co in &v.coords {
        for a in 0..3 {
            shape[a] = shape[a].max(co[a + 1] + 1);
        }
    }
    let feats = round_bf16(&(0..v.coords.len() * c).map(|_| rng.uniform(-1.0, 1.0)).collect::<Vec<_>>());
    SparseTensor::new(v.coords, feats, c, shape).unwrap()
}

/// Every conv kernel's BF16 build against the f32 CPU conv of the same (BF16-rounded) values.
#[test]
fn bf16_conv_kernels_match_the_cpu() {
    let Some(dev) = gpu("bf16_conv_kernels_match_the_cpu") else { return };
    let mut rng = Rng(2201);
    for (cin, cout) in [(64usize, 64usize), (64, 128), (32, 96)] {
        let t = real_tensor(cin, &mut rng);
        let cpu_map = submanifold(&t, [3; 3], [1; 3]).unwrap();
        let map = submanifold_cuda(&dev, &t, CudaSites::upload(&dev, &t).unwrap(), [3; 3], [1; 3]).unwrap();
        let (kv, m) = (27usize, cpu_map.out_count());
        let bound = (1.0 / (kv * cin) as f32).sqrt() * 2.0;
        let w = round_bf16(&(0..kv * cin * cout).map(|_| rng.uniform(-bound, bound)).collect::<Vec<_>>());
        let bias: Vec<f32> = (0..cout).map(|_| rng.uniform(-0.5, 0.5)).collect();
        let scale: Vec<f32> = (0..cin).map(|_| rng.uniform(0.5, 1.5)).collect();
        let shift: Vec<f32> = (0..cin).map(|_| rng.uniform(-0.3, 0.3)).collect();
        let post_scale: Vec<f32> = (0..cout).map(|_| rng.uniform(0.5, 1.5)).collect();
        let post_shift: Vec<f32> = (0..cout).map(|_| rng.uniform(-0.3, 0.3)).collect();
        let residual = round_bf16(&(0..m * cout).map(|_| rng.uniform(-1.0, 1.0)).collect::<Vec<_>>());
        let opts = ConvOptions {
            bias: Some(&bias),
            pre: Some(PreActivation { scale: &scale, shift: &shift, relu: true }),
            residual: Some(&residual[..]),
        };
        let raw = conv_with(&t, &cpu_map, &w, WeightLayout::Rsck, cin, cout, &opts).unwrap();
        let want: Vec<f32> = raw.iter().enumerate().map(|(i, &v)| (v * post_scale[i % cout] + post_shift[i % cout]).max(0.0)).collect();
        let s = &dev.stream;
        let x = up::<bf16>(&dev, t.feats());
        let res = up::<bf16>(&dev, &residual);
        let weights = CudaConvWeights::<bf16>::upload_store(&dev, &w, WeightLayout::Rsck, kv, cin, cout, Some(&bias)).unwrap();
        let (ds, dsh, dps, dpsh) = (s.clone_htod(&scale).unwrap(), s.clone_htod(&shift).unwrap(), s.clone_htod(&post_scale).unwrap(), s.clone_htod(&post_shift).unwrap());
        let pre = CudaPreActivation { scale: &ds, shift: &dsh, relu: true };
        let post = CudaPreActivation { scale: &dps, shift: &dpsh, relu: true };
        let mut algos = vec![(ConvAlgo::Direct, None), (ConvAlgo::FmaTiled, None)];
        for splits in [Some(1), Some(3)] {
            for a in [ConvAlgo::ImplicitGemm, ConvAlgo::ImplicitGemm32, ConvAlgo::ImplicitGemmPipe, ConvAlgo::ImplicitGemmPipe32] {
                algos.push((a, splits));
            }
            algos.extend(TILED_VARIANTS.iter().map(|v| (v.algo(), splits)));
            if weights.wgmma_ready() {
                algos.extend(WGMMA_VARIANTS.iter().filter(|v| cout % v.cols as usize == 0).map(|v| (v.algo(), splits)));
            }
        }
        assert_eq!(weights.wgmma_ready(), dev.arch.has_wgmma() && cin % 64 == 0 && cout % 64 == 0);
        let mut names = LayerNames::new();
        let (pre_id, out_id) = (names.add("pre"), names.add("out"));
        for (algo, splits) in algos {
            let case = format!("BF16 subm k3 {cin}->{cout}, {algo:?} offset splits {splits:?}");
            let flags = RangeFlags::new(&dev, &names).unwrap();
            let range = ConvRange { conv: Some(flags.slot(out_id).unwrap()), pre: Some(flags.slot(pre_id).unwrap()) };
            let y = conv_cuda_guarded(&dev, &x, &map, &weights, Some(&pre), Some(&res), algo, splits, Some(&post), range).unwrap();
            let got = down(&dev, &y, want.len());
            assert!(got.iter().all(|v| v.is_finite()), "{case}: non-finite output");
            let e = rel_err(&got, &want);
            eprintln!("{case}: rel err {e:.2e} ({m} outputs)");
            assert!(e <= 5e-3, "{case}: rel err {e:.3e} > 5e-3");
            assert_eq!(flags.read_now(&dev).unwrap(), vec![0, 0], "{case}: in range");
        }
        // FP32 storage: the FP32-unit kernels, the same values (exact in f32), only the
        // summation order differs from the CPU's
        let x32 = up::<f32>(&dev, t.feats());
        let res32 = up::<f32>(&dev, &residual);
        let w32 = CudaConvWeights::<f32>::upload_store(&dev, &w, WeightLayout::Rsck, kv, cin, cout, Some(&bias)).unwrap();
        assert!(!w32.wgmma_ready(), "FP32 weights get no warpgroup-MMA layout");
        // FP32: the FP32-unit kernels, tiled on large maps
        assert_eq!(ConvAlgo::best_for_weights(&w32, 1000), ConvAlgo::Direct);
        assert_eq!(ConvAlgo::best_for_weights(&w32, TILED_MIN_OUTPUTS), ConvAlgo::FmaTiled);
        for algo in [ConvAlgo::Direct, ConvAlgo::FmaTiled] {
            let flags = RangeFlags::new(&dev, &names).unwrap();
            let range = ConvRange { conv: Some(flags.slot(out_id).unwrap()), pre: Some(flags.slot(pre_id).unwrap()) };
            let y = conv_cuda_guarded(&dev, &x32, &map, &w32, Some(&pre), Some(&res32), algo, None, Some(&post), range).unwrap();
            let e = rel_err(&down(&dev, &y, want.len()), &want);
            eprintln!("FP32 subm k3 {cin}->{cout}, {algo:?}: rel err {e:.2e}");
            assert!(e <= 1e-5, "FP32 {algo:?} conv {cin}->{cout}: rel err {e:.3e} > 1e-5");
            assert_eq!(flags.read_now(&dev).unwrap(), vec![0, 0], "FP32 {algo:?} conv: in range");
        }
        let refused = conv_cuda_guarded(&dev, &x32, &map, &w32, None, None, ConvAlgo::ImplicitGemmPipe32, None, None, ConvRange::default());
        let e = refused.err().expect("FP32 has no tensor-core conv").to_string();
        assert!(e.contains("fp32") && e.contains("FmaTiled"), "{e}");
    }
}

/// BF16's guard limit is BF16's: an output of 70,400 (FP16 flags it) is in range; NaN is flagged.
#[test]
fn bf16_guard_flags_non_finite_values_not_fp16_overflows() {
    let Some(dev) = gpu("bf16_guard_flags_non_finite_values_not_fp16_overflows") else { return };
    let mut rng = Rng(2202);
    let (cin, cout) = (64usize, 64usize);
    let t = real_tensor(cin, &mut rng);
    let map = submanifold_cuda(&dev, &t, CudaSites::upload(&dev, &t).unwrap(), [3; 3], [1; 3]).unwrap();
    let n = t.len();
    let big = CudaConvWeights::<bf16>::upload_store(&dev, &vec![1100.0; 27 * cin * cout], WeightLayout::Rsck, 27, cin, cout, None).unwrap();
    let ones = up::<bf16>(&dev, &vec![1.0; n * cin]);
    let mut nan = vec![0.5f32; n * cin];
    nan[cin * (n / 2)] = f32::NAN;
    let nan = up::<bf16>(&dev, &nan);
    let mut names = LayerNames::new();
    let out_id = names.add("out");
    for algo in [ConvAlgo::Direct, ConvAlgo::ImplicitGemm32, ConvAlgo::ImplicitGemmPipe, ConvAlgo::best_for_weights(&big, map.out_count)] {
        let run = |x: &CudaSlice<bf16>| {
            let flags = RangeFlags::new(&dev, &names).unwrap();
            let range = ConvRange { conv: Some(flags.slot(out_id).unwrap()), pre: None };
            let y = conv_cuda_guarded(&dev, x, &map, &big, None, None, algo, None, None, range).unwrap();
            (flags.read_now(&dev).unwrap()[0], down(&dev, &y, map.out_count * cout))
        };
        let (f, y) = run(&ones);
        assert_eq!(f, 0, "{algo:?}: outputs of >= 70,400 are in BF16's range");
        assert!(y.iter().all(|v| v.is_finite() && *v >= 70_000.0), "{algo:?}: every output has its own site: >= 1100 * 64");
        assert!(run(&nan).0 & RANGE_NON_FINITE != 0, "{algo:?}: a NaN input");
    }
}

/// The window attention's BF16 build against its FP16 build, on inputs both represent exactly.
#[test]
fn bf16_attention_matches_the_fp16_kernels() {
    let Some(dev) = gpu("bf16_attention_matches_the_fp16_kernels") else { return };
    let cfg = ModelConfig::load(&common::root().join("config/models/sphereformer_nuscenes.yaml")).unwrap();
    let v = voxelize_cpu(&[&nuscenes_sweep()], &cfg.voxel_params()).unwrap();
    let n = v.xyz.len();
    let s = &dev.stream;
    let xyz_d = s.clone_htod(&v.xyz.iter().flatten().copied().collect::<Vec<_>>()).unwrap();
    let batch_d = s.clone_htod(&v.coords.iter().map(|c| c[0]).collect::<Vec<_>>()).unwrap();
    let level = SphereLevel::from_model(&cfg.yaml, 1).unwrap();
    let w = CudaSphereWindows::build(&dev, &xyz_d, &batch_d, n, &level).unwrap();
    let mut rng = Rng(2203);
    let (heads, d) = (2usize, 16usize);
    let row = heads * d;
    // BF16-rounded magnitudes in [0.1, 1] x scale, either sign: exactly representable in FP16
    // too (8 significant bits, far from FP16's subnormals)
    let rand = |rng: &mut Rng, len: usize, scale: f32| {
        let v: Vec<f32> = (0..len)
            .map(|_| {
                let mag = (0.1 + 0.9 * rng.unit()) as f32 * scale;
                if rng.sym() < 0.0 { -mag } else { mag }
            })
            .collect();
        round_bf16(&v)
    };
    let (q, k, val) = (rand(&mut rng, n * row, 0.25), rand(&mut rng, n * row, 1.0), rand(&mut rng, n * row, 1.0));
    let mut names = LayerNames::new();
    let out_id = names.add("attn");
    let all = HeadSlice::all(heads, d);
    fn run<S: Store>(
        dev: &CudaDevice,
        names: &LayerNames,
        id: sptr::device::range_guard::LayerId,
        (q, k, v): (&[f32], &[f32], &[f32]),
        row: usize,
        all: HeadSlice,
        part: &sptr::ops::attention::cuda::CudaPartition,
        term: CudaTerm,
        (tiled_min, splits): (usize, Option<usize>),
    ) -> (Vec<f32>, u32) {
        let (qd, kd, vd) = (up::<S>(dev, q), up::<S>(dev, k), up::<S>(dev, v));
        let mut out = dev.stream.alloc_zeros::<S>(q.len()).unwrap();
        let flags = RangeFlags::new(dev, names).unwrap();
        let qkv = QkvView { q: &qd, k: &kd, v: &vd, ld: row };
        window_attention_cuda_guarded(dev, qkv, all, part, term, &mut out, row, tiled_min, splits, Some(flags.slot(id).unwrap())).unwrap();
        (down(dev, &out, q.len()), flags.read_now(dev).unwrap()[0])
    }
    for (kind, part, geometry, positions, quant) in [
        ("cubic", &w.cubic, w.cubic_rpe, &xyz_d, &w.cubic_quant),
        ("spherical", &w.sphere, w.sphere_rpe, &w.sphere_pos, &w.sphere_quant),
    ] {
        let rows = geometry.table_rows();
        let table = |rng: &mut Rng| s.clone_htod(&(0..rows * 3 * heads * d).map(|_| rng.sym() * 0.3).collect::<Vec<f32>>()).unwrap();
        let (tq, tk, tv) = (table(&mut rng), table(&mut rng), table(&mut rng));
        let term = CudaTerm::Contextual(CudaContextual { geometry, quant, positions, tables: [&tq, &tk, &tv] });
        for how in [(usize::MAX, None), (1, Some(1)), (1, Some(4))] {
            let case = format!("{kind} windows, tiled from {}, key splits {:?}", how.0, how.1);
            let (y16, f16_flags) = run::<f16>(&dev, &names, out_id, (&q, &k, &val), row, all, part, term, how);
            let (yb, bf_flags) = run::<bf16>(&dev, &names, out_id, (&q, &k, &val), row, all, part, term, how);
            // FP32 has the per-query kernels only: the tiled request falls back to them
            let (y32, f32_flags) = run::<f32>(&dev, &names, out_id, (&q, &k, &val), row, all, part, term, how);
            assert_eq!((f16_flags, bf_flags, f32_flags), (0, 0, 0), "{case}: in range");
            let e32 = rel_err(&y32, &y16);
            eprintln!("FP32 attention, {case}: rel err vs FP16 {e32:.2e}");
            assert!(e32 <= 2e-3, "{case}: FP32 vs FP16 rel err {e32:.3e} > 2e-3");
            assert!(yb.iter().all(|v| v.is_finite()), "{case}: non-finite BF16 output");
            let e = rel_err(&yb, &y16);
            eprintln!("BF16 attention, {case}: rel err vs FP16 {e:.2e}");
            assert!(e <= 1e-2, "{case}: BF16 vs FP16 rel err {e:.3e} > 1e-2");
        }
    }
}

fn segmenter(y: &ModelYaml, tensors: NamedTensors, precision: Precision) -> Segmenter {
    let mut y = y.clone();
    y.precision = precision;
    let w = Weights::from_tensors("test weights", tensors).unwrap();
    Segmenter::on_device(y, w, Device::Cuda).unwrap()
}

fn agreement(a: &Segmentation, b: &Segmentation) -> f64 {
    assert_eq!(a.labels.len(), b.labels.len());
    a.labels.iter().zip(&b.labels).filter(|(x, y)| x == y).count() as f64 / a.labels.len() as f64
}

/// Overflowing weights: `fp32` holds them (never flagged, >= 99.5 % of points as the CPU);
/// `auto` flags its first FP16 frame, publishes that frame's FP32 recomputation (same bar), stays
/// on FP32 and counts it. `bf16` holds their range (never flagged) at BF16's precision: the CPU
/// forward with its weights and layer outputs rounded to BF16 agrees with the exact one on
/// 98.9 % of points (pipeline::precision), so BF16 cannot reach 99.5 % here whatever its kernels;
/// its bar is 98.5 %, below the rounding's own loss by the GPU's extra roundings (P, qkv).
#[test]
fn fp32_and_auto_agree_with_the_cpu_on_overflowing_weights() {
    if gpu("fp32_and_auto_agree_with_the_cpu_on_overflowing_weights").is_none() {
        return;
    }
    let y = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let pts = nuscenes_sweep();
    let w = || overflowing_weights(&y, 22);
    let cpu = Segmenter::new(y.clone(), Weights::from_tensors("test weights", w()).unwrap()).unwrap().segment(&[&pts]).unwrap();
    assert!(cpu.range.is_clean() && cpu.storage.is_none(), "f32 holds these activations: {}", cpu.range.summary(5));
    let fp16 = segmenter(&y, w(), Precision::Fp16).segment(&[&pts]).unwrap();
    assert!(!fp16.range.is_clean(), "FP16 must leave its range on these weights");
    assert_eq!((fp16.storage, fp16.recomputed_from.as_ref()), (Some(Storage::Fp16), None));

    let bf = segmenter(&y, w(), Precision::Bf16).segment(&[&pts]).unwrap();
    assert!(bf.range.is_clean(), "BF16 holds activations of 1.3e6: {}", bf.range.summary(5));
    assert_eq!((bf.storage, bf.recomputed_from.as_ref()), (Some(Storage::Bf16), None));
    let a_bf = agreement(&bf, &cpu);

    let wide = segmenter(&y, w(), Precision::Fp32).segment(&[&pts]).unwrap();
    assert!(wide.range.is_clean(), "FP32 holds activations of 1.3e6: {}", wide.range.summary(5));
    assert_eq!((wide.storage, wide.recomputed_from.as_ref()), (Some(Storage::Fp32), None));
    let a_fp32 = agreement(&wide, &cpu);

    let auto = segmenter(&y, w(), Precision::Auto);
    assert_eq!(auto.precision_status().map(|s| s.storage), Some(Storage::Fp16), "auto starts in FP16");
    let first = auto.segment(&[&pts]).unwrap();
    let from = first.recomputed_from.as_ref().expect("auto recomputes the flagged FP16 frame");
    assert_eq!(from, &fp16.range, "the FP16 pass's report, as precision fp16 gives it");
    assert!(first.range.is_clean() && first.storage == Some(Storage::Fp32), "{}", first.range.summary(5));
    assert!(first.times.stages.iter().any(|(n, _)| n.starts_with("recompute.")), "the recomputation's stages are reported");
    let a_first = agreement(&first, &cpu);
    let second = auto.segment(&[&pts]).unwrap();
    assert_eq!((second.storage, second.recomputed_from.as_ref()), (Some(Storage::Fp32), None), "sticky: FP32 directly");
    let status = auto.precision_status().unwrap();
    assert_eq!((status.precision, status.storage, status.recomputed_frames), (Precision::Auto, Storage::Fp32, 1));
    let a_second = agreement(&second, &cpu);
    eprintln!(
        "overflowing weights vs CPU: fp16 {:.2} %, bf16 {:.3} %, fp32 {:.3} %, auto first frame {:.3} %, auto second frame {:.3} % \
         (auto = fp32 on {:.4} % of points); FP16 flagged {}",
        100.0 * agreement(&fp16, &cpu),
        100.0 * a_bf,
        100.0 * a_fp32,
        100.0 * a_first,
        100.0 * a_second,
        100.0 * agreement(&second, &wide),
        fp16.range.summary(3)
    );
    for (case, a) in [("fp32", a_fp32), ("auto, first frame", a_first), ("auto, second frame", a_second)] {
        assert!(a >= 0.995, "{case}: agrees with the CPU on {:.3} % < 99.5 % of points", 100.0 * a);
    }
    assert!(a_bf >= 0.985, "bf16: agrees with the CPU on {:.3} % < 98.5 % of points", 100.0 * a_bf);
}

/// In-range weights: `auto` is the FP16 path (same labels, never flagged, nothing recomputed),
/// `bf16` and `fp32` are never flagged (the configurations of the no-false-alarm test of
/// tests/fp16_range/gpu.rs).
#[test]
fn in_range_weights_stay_fp16_under_auto_and_are_never_flagged() {
    if gpu("in_range_weights_stay_fp16_under_auto_and_are_never_flagged").is_none() {
        return;
    }
    let nus = nuscenes_sweep();
    let kitti = Points::read_bin(&common::data("semantickitti/000000.bin"), 4).unwrap();
    let n = sphereformer_yaml("sphereformer_nuscenes.yaml");
    let k = sphereformer_yaml("sphereformer_semantickitti.yaml");
    for (case, y, seed, pts) in [("nuscenes full config", &n, 5, &nus), ("semantickitti full config", &k, 7, &kitti)] {
        let t = || sptr::models::sphereformer::random::random_tensors(y, seed).unwrap();
        let fp16 = segmenter(y, t(), Precision::Fp16).segment(&[pts]).unwrap();
        let auto = segmenter(y, t(), Precision::Auto);
        let a = auto.segment(&[pts]).unwrap();
        let bf = segmenter(y, t(), Precision::Bf16).segment(&[pts]).unwrap();
        let wide = segmenter(y, t(), Precision::Fp32).segment(&[pts]).unwrap();
        assert!(fp16.range.is_clean() && a.range.is_clean() && bf.range.is_clean() && wide.range.is_clean(), "{case}: no false alarm");
        assert_eq!((a.storage, a.recomputed_from.as_ref()), (Some(Storage::Fp16), None), "{case}: auto stays on FP16");
        assert_eq!(a.labels, fp16.labels, "{case}: auto in range is the FP16 path");
        assert_eq!(auto.precision_status().unwrap().recomputed_frames, 0);
        eprintln!(
            "{case}: bf16 agrees with fp16 on {:.3} % of points, fp32 on {:.3} %",
            100.0 * agreement(&bf, &fp16),
            100.0 * agreement(&wide, &fp16)
        );
    }
}
