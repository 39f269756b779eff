//! CUDA kernel maps and sparse convolution against the CPU reference: maps exactly equal,
//! conv outputs within FP16 tolerance (‖out−ref‖/‖ref‖ ≤ 2e-3, no NaN), on random sites and on
//! real voxels of the nuScenes sweep. Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

use crate::common;
use crate::common::{gpu, rel_err, nuscenes_sweep, Rng};
use half::f16;
use sptr::models::sphereformer::config::ModelConfig;
use sptr::device::cuda::CudaDevice;
use sptr::ops::sparse_conv::cpu::{conv_with, ConvOptions, PreActivation, WeightLayout};
use sptr::ops::sparse_conv::cuda::{conv_cuda, conv_cuda_split, nonempty_splits, ConvAlgo, PIPE_MAX_KV, CudaConvWeights, CudaPreActivation, TILED_VARIANTS, WGMMA_VARIANTS};
use sptr::ops::sparse_conv::kernel_map::{inverse, strided, submanifold, ConvGeometry, KernelMap};
use sptr::ops::sparse_conv::kernel_map_cuda::{inverse_cuda, strided_cuda, submanifold_cuda, CudaKernelMap, CudaSites};
use sptr::ops::sparse_conv::tensor::SparseTensor;
use sptr::ops::voxelize::cpu::voxelize_cpu;


fn round16(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| f16::from_f32(x).to_f32()).collect()
}


/// The CPU map as a neighbour table.
fn nbr_of(map: &KernelMap) -> Vec<i32> {
    let kv = map.kernel_volume();
    let mut t = vec![-1i32; map.out_count() * kv];
    for (k, pairs) in map.pairs.iter().enumerate() {
        for &(i, o) in pairs {
            t[o as usize * kv + k] = i as i32;
        }
    }
    t
}

fn tensor_with(coords: Vec<[i32; 4]>, shape: [i32; 3], c: usize, rng: &mut Rng) -> SparseTensor {
    let feats = round16(&(0..coords.len() * c).map(|_| rng.uniform(-1.0, 1.0)).collect::<Vec<_>>());
    SparseTensor::new(coords, feats, c, shape).expect("valid tensor")
}

fn random_sites(rng: &mut Rng, n: usize, shape: [i32; 3], batches: i32) -> Vec<[i32; 4]> {
    let mut set = std::collections::BTreeSet::new();
    while set.len() < n {
        let b = (rng.next_u64() % batches as u64) as i32;
        let p = [0, 1, 2].map(|a| (rng.next_u64() % shape[a] as u64) as i32);
        set.insert([b, p[0], p[1], p[2]]);
    }
    let mut v: Vec<_> = set.into_iter().collect();
    // Not sorted: a real tensor's order is arbitrary.
    for i in (1..v.len()).rev() {
        v.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    v
}

/// Real voxels: the nuScenes sweep voxelized with the SemanticKITTI preprocessing at 0.05 m.
fn real_sites() -> (Vec<[i32; 4]>, [i32; 3]) {
    let path = common::root().join("config/models/sphereformer_semantickitti.yaml");
    let mut p = ModelConfig::load(&path).unwrap().voxel_params();
    p.voxel_size = [0.05; 3];
    let v = voxelize_cpu(&[&nuscenes_sweep()], &p).unwrap();
    let mut shape = [128; 3];
    for c in &v.coords {
        for a in 0..3 {
            shape[a] = shape[a].max(c[a + 1] + 1);
        }
    }
    // Strided convs need even origins/shapes to line up; round the shape up to a multiple of 8.
    (v.coords, shape.map(|s| (s + 7) / 8 * 8))
}

fn check_map(dev: &CudaDevice, case: &str, cpu: &KernelMap, gpu: &CudaKernelMap) {
    assert_eq!(gpu.out_count, cpu.out_count(), "{case}: output count");
    assert_eq!(gpu.out.coords_to_host(dev).unwrap(), cpu.out_coords, "{case}: output coordinates (order too)");
    assert_eq!(gpu.nbr_to_host(dev).unwrap(), nbr_of(cpu), "{case}: neighbour table");
    check_mask_order(dev, case, gpu);
}

/// A map's mask order (up to 64 offsets): the outputs in a stable sort by their neighbour
/// bitmask's sort key, each mask equal to the bits of the output's row of the neighbour table.
fn check_mask_order(dev: &CudaDevice, case: &str, gpu: &CudaKernelMap) {
    let Some(sorted) = &gpu.sorted else {
        assert!(gpu.kv > 64 || gpu.out_count == 0, "{case}: a map of {} offsets without its mask order", gpu.kv);
        return;
    };
    let nbr = gpu.nbr_to_host(dev).unwrap();
    let order = dev.stream.clone_dtoh(&sorted.order.slice(..gpu.out_count)).unwrap();
    let masks = dev.stream.clone_dtoh(&sorted.masks.slice(..gpu.out_count)).unwrap();
    let mut seen = vec![false; gpu.out_count];
    for (p, (&o, &mask)) in order.iter().zip(&masks).enumerate() {
        let o = o as usize;
        assert!(o < gpu.out_count && !seen[o], "{case}: order is not a permutation at {p}");
        seen[o] = true;
        let want = (0..gpu.kv).filter(|&k| nbr[o * gpu.kv + k] >= 0).fold(0u64, |m, k| m | 1 << k);
        assert_eq!(mask, want, "{case}: mask of output {o}");
        if p > 0 {
            let prev = (sorted.key.key(masks[p - 1]), order[p - 1]);
            assert!(prev < (sorted.key.key(mask), o as u32), "{case}: not a stable sort by mask key at {p}");
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_conv(
    dev: &CudaDevice,
    case: &str,
    t: &SparseTensor,
    cpu_map: &KernelMap,
    gpu_map: &CudaKernelMap,
    cout: usize,
    fused: bool,
    rng: &mut Rng,
) {
    let (kv, cin) = (cpu_map.kernel_volume(), t.channels());
    let bound = (1.0 / (kv * cin) as f32).sqrt() * 2.0;
    let w = round16(&(0..kv * cin * cout).map(|_| rng.uniform(-bound, bound)).collect::<Vec<_>>());
    let bias: Vec<f32> = (0..cout).map(|_| rng.uniform(-0.5, 0.5)).collect();
    let scale: Vec<f32> = (0..cin).map(|_| rng.uniform(0.5, 1.5)).collect();
    let shift: Vec<f32> = (0..cin).map(|_| rng.uniform(-0.3, 0.3)).collect();
    let residual = round16(&(0..cpu_map.out_count() * cout).map(|_| rng.uniform(-1.0, 1.0)).collect::<Vec<_>>());
    let opts = ConvOptions {
        bias: Some(&bias),
        pre: fused.then_some(PreActivation { scale: &scale, shift: &shift, relu: true }),
        residual: fused.then_some(&residual[..]),
    };
    let t0 = std::time::Instant::now();
    let cpu = conv_with(t, cpu_map, &w, WeightLayout::Krsc, cin, cout, &opts).unwrap();
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;

    let s = &dev.stream;
    let x16: Vec<f16> = t.feats().iter().map(|&v| f16::from_f32(v)).collect();
    let x = s.clone_htod(&x16).unwrap();
    let weights = CudaConvWeights::upload(dev, &w, WeightLayout::Krsc, kv, cin, cout, Some(&bias)).unwrap();
    let (dscale, dshift) = (s.clone_htod(&scale).unwrap(), s.clone_htod(&shift).unwrap());
    let dres = s.clone_htod(&residual.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>()).unwrap();
    let pre = CudaPreActivation { scale: &dscale, shift: &dshift, relu: true };
    // The implicit GEMM walks all kernel offsets in one block (1), cuts them into 2 or 4 slices
    // summed by a second pass, into as many slices as offsets (kv; a slice of one), or as it picks.
    let mut algos = vec![(ConvAlgo::Direct, None), (ConvAlgo::FmaTiled, None)];
    if ConvAlgo::best_for(cin, cout, cpu_map.out_count()) != ConvAlgo::Direct {
        for splits in [Some(1), Some(2), Some(4), Some(kv), None] {
            algos.push((ConvAlgo::ImplicitGemm, splits));
            algos.push((ConvAlgo::ImplicitGemm32, splits));
            if kv <= PIPE_MAX_KV {
                algos.push((ConvAlgo::ImplicitGemmPipe, splits));
                algos.push((ConvAlgo::ImplicitGemmPipe32, splits));
                algos.extend(TILED_VARIANTS.iter().map(|v| (v.algo(), splits)));
            }
        }
    }
    // The warpgroup-MMA kernels where the device has them (compute capability 9.0) and the
    // weights fit them (Cin, Cout multiples of 64; Cout of the tile width).
    let wgmma: Vec<ConvAlgo> = WGMMA_VARIANTS.iter().filter(|v| weights.wgmma_ready() && cout % v.cols as usize == 0).map(|v| v.algo()).collect();
    assert_eq!(weights.wgmma_ready(), dev.arch.has_wgmma() && cin % 64 == 0 && cout % 64 == 0 && kv <= PIPE_MAX_KV, "{case}: transposed weights uploaded");
    for splits in [Some(1), Some(2), Some(kv), None] {
        algos.extend(wgmma.iter().map(|&a| (a, splits)));
    }
    for (algo, splits) in algos {
        let run = || conv_cuda_split(dev, &x, gpu_map, &weights, fused.then_some(&pre), fused.then_some(&dres), algo, splits, None).unwrap();
        // Warm-up. Every output element is then compared with the CPU value; the random bias
        // makes an unwritten (zero) element show up in the error.
        run();
        dev.synchronize().unwrap();
        let mut times = Vec::new();
        let mut out = None;
        for _ in 0..5 {
            let t1 = std::time::Instant::now();
            out = Some(run());
            dev.synchronize().unwrap();
            times.push(t1.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        let out = out.unwrap();
        let got: Vec<f32> = s.clone_dtoh(&out.slice(..cpu.len().max(1))).unwrap().iter().take(cpu.len()).map(|h| h.to_f32()).collect();
        assert!(got.iter().all(|v| v.is_finite()), "{case} {algo:?} splits {splits:?}: NaN/Inf in the CUDA output");
        let e = rel_err(&got, &cpu);
        eprintln!(
            "{case}: {} -> {} sites, Cin {cin} Cout {cout}, {algo:?} offset splits {splits:?} rel err {e:.2e}, cpu {cpu_ms:.1} ms, cuda {:.3} ms (median of 5, sync'd wall)",
            t.len(),
            cpu_map.out_count(),
            times[2]
        );
        assert!(e <= 2e-3, "{case} {algo:?} splits {splits:?}: rel err {e:.3e} > 2e-3");
    }
    // The default path is the best kernel for these channels.
    let _ = conv_cuda(dev, &x, gpu_map, &weights, None, None).unwrap();
    // The next layer's BN + ReLU in the epilogue (post-activation): every kernel, unsplit, split
    // in three (conv_split_reduce applies it) and auto; against the CPU output put through it.
    let post_scale: Vec<f32> = (0..cout).map(|_| rng.uniform(0.5, 1.5)).collect();
    let post_shift: Vec<f32> = (0..cout).map(|_| rng.uniform(-0.3, 0.3)).collect();
    let want: Vec<f32> = cpu.iter().enumerate().map(|(i, &v)| (v * post_scale[i % cout] + post_shift[i % cout]).max(0.0)).collect();
    let (dps, dpsh) = (s.clone_htod(&post_scale).unwrap(), s.clone_htod(&post_shift).unwrap());
    let post = CudaPreActivation { scale: &dps, shift: &dpsh, relu: true };
    let mut posts = vec![(ConvAlgo::Direct, None), (ConvAlgo::FmaTiled, None)];
    if ConvAlgo::best_for(cin, cout, cpu_map.out_count()) != ConvAlgo::Direct {
        for splits in [Some(1), Some(3), None] {
            posts.push((ConvAlgo::ImplicitGemm32, splits));
            if kv <= PIPE_MAX_KV {
                posts.push((ConvAlgo::ImplicitGemmPipe, splits));
                posts.extend(TILED_VARIANTS.iter().map(|v| (v.algo(), splits)));
            }
            posts.extend(wgmma.iter().map(|&a| (a, splits)));
        }
    }
    for (algo, splits) in posts {
        let out = conv_cuda_split(dev, &x, gpu_map, &weights, fused.then_some(&pre), fused.then_some(&dres), algo, splits, Some(&post)).unwrap();
        let got: Vec<f32> = s.clone_dtoh(&out.slice(..want.len().max(1))).unwrap().iter().take(want.len()).map(|h| h.to_f32()).collect();
        let e = rel_err(&got, &want);
        eprintln!("{case}: {algo:?} offset splits {splits:?} with post BN+ReLU rel err {e:.2e}");
        assert!(e <= 2e-3, "{case} {algo:?} splits {splits:?} post-activation: rel err {e:.3e} > 2e-3");
    }
}

/// Every offset split a conv launches walks at least one kernel offset (a split with none left
/// its partial to a race on the tile's output rows), and the splits cover every offset once,
/// for every kernel volume and every split count asked. Needs no GPU.
#[test]
fn offset_splits_are_never_empty() {
    for kv in 1..=125usize {
        for asked in 0..=kv + 2 {
            let splits = nonempty_splits(asked, kv);
            let per = kv.div_ceil(splits);
            assert!((1..=kv).contains(&splits), "kv {kv} asked {asked}: {splits} splits");
            assert!(splits <= asked.max(1), "kv {kv} asked {asked}: {splits} splits, more than asked");
            for z in 0..splits {
                let (begin, end) = (z * per, ((z + 1) * per).min(kv));
                assert!(begin < end, "kv {kv} asked {asked}: split {z} of {splits} walks no offset");
            }
            assert!(splits * per >= kv, "kv {kv} asked {asked}: offsets left out");
        }
    }
    assert_eq!(nonempty_splits(8, 27), 7, "27 offsets in 8 asked splits: 7 of 4");
    assert_eq!(nonempty_splits(9, 27), 9);
}

#[test]
fn cuda_maps_equal_cpu_maps() {
    let Some(dev) = gpu("cuda_maps_equal_cpu_maps") else { return };
    let mut rng = Rng(11);
    let shape = [24, 20, 16];
    let t = tensor_with(random_sites(&mut rng, 1500, shape, 2), shape, 1, &mut rng);
    let (rc, rshape) = real_sites();
    let real = tensor_with(rc, rshape, 1, &mut rng);
    for (name, t) in [("random", &t), ("nuscenes voxels", &real)] {
        for (k, d) in [([1, 1, 1], [1, 1, 1]), ([3, 3, 3], [1, 1, 1]), ([5, 5, 5], [1, 1, 1]), ([3, 1, 5], [2, 1, 1])] {
            let cpu = submanifold(t, k, d).unwrap();
            let gpu = submanifold_cuda(&dev, t, CudaSites::upload(&dev, t).unwrap(), k, d).unwrap();
            check_map(&dev, &format!("{name} subm k{k:?} d{d:?}"), &cpu, &gpu);
        }
        for (k, s, p) in [([2, 2, 2], [2, 2, 2], [0, 0, 0]), ([3, 3, 3], [2, 2, 2], [1, 1, 1])] {
            let g = ConvGeometry { kernel: k, stride: s, padding: p, dilation: [1, 1, 1] };
            let cpu = strided(t, g).unwrap();
            let sites = CudaSites::upload(&dev, t).unwrap();
            let (gpu, out_shape, out_origin) = strided_cuda(&dev, t, &sites, g).unwrap();
            assert_eq!((out_shape, out_origin), (cpu.out_spatial_shape, cpu.out_origin), "{name} strided k{k:?}: output geometry");
            check_map(&dev, &format!("{name} strided k{k:?} s{s:?} p{p:?}"), &cpu, &gpu);
            let cpu_inv = inverse(&cpu).unwrap();
            let gpu_inv = inverse_cuda(&dev, &gpu, sites).unwrap();
            check_map(&dev, &format!("{name} inverse of k{k:?}"), &cpu_inv, &gpu_inv);
        }
    }
}

/// Strided maps over several batches and non-zero origins, with sites that carry their batch
/// count (upload) and without one (`CudaSites::build`: bound 65535), and on the largest grid the
/// 16-bit packing allows, where the candidates' compact key takes all 63 bits (32767 batches) or
/// does not fit and the 64-bit packing is used (32768 batches).
#[test]
fn cuda_strided_maps_compact_keys_and_fallback() {
    let Some(dev) = gpu("cuda_strided_maps_compact_keys_and_fallback") else { return };
    let mut rng = Rng(15);
    let check_strided = |case: &str, t: &SparseTensor, g: ConvGeometry, rebuilt: bool| {
        let cpu = strided(t, g).unwrap();
        let mut sites = CudaSites::upload(&dev, t).unwrap();
        if rebuilt {
            let coords = dev.stream.clone_dtod(&sites.coords).unwrap();
            sites = CudaSites::build(&dev, coords, t.len()).unwrap();
            assert_eq!(sites.batch_size(), 65535, "{case}: sites built without a batch count");
        } else {
            assert_eq!(sites.batch_size(), t.batch_size(), "{case}: uploaded sites' batch count");
        }
        let (gpu, out_shape, out_origin) = strided_cuda(&dev, t, &sites, g).unwrap();
        assert_eq!((out_shape, out_origin), (cpu.out_spatial_shape, cpu.out_origin), "{case}: output geometry");
        assert_eq!(gpu.out.batch_size(), sites.batch_size(), "{case}: outputs keep the batch bound");
        check_map(&dev, case, &cpu, &gpu);
        let gpu_inv = inverse_cuda(&dev, &gpu, sites).unwrap();
        check_map(&dev, &format!("{case} inverse"), &inverse(&cpu).unwrap(), &gpu_inv);
    };
    // Five samples, origin off zero (a multiple of every stride below); 200 sites give candidate
    // sorts inside the one-launch capacity, 2000 above it.
    let (shape, origin) = ([12, 10, 8], [-4, 6, -6]);
    for n in [200usize, 2000] {
        let coords: Vec<[i32; 4]> = random_sites(&mut rng, n, shape, 5)
            .into_iter()
            .map(|c| [c[0], c[1] + origin[0], c[2] + origin[1], c[3] + origin[2]])
            .collect();
        let feats = vec![0.0; n];
        let t = SparseTensor::with_geometry(coords, feats, 1, [1; 3], origin, shape).unwrap();
        // kernel = stride (the first, fourth and fifth) takes one candidate an input
        let geometries = [([2; 3], [2; 3], [0; 3]), ([3; 3], [2; 3], [1; 3]), ([3, 3, 3], [1, 2, 3], [1, 0, 2]), ([2; 3], [2; 3], [1; 3]), ([2, 1, 3], [2, 1, 3], [0, 0, 1])];
        for (k, s, p) in geometries {
            let g = ConvGeometry { kernel: k, stride: s, padding: p, dilation: [1; 3] };
            for rebuilt in [false, true] {
                check_strided(&format!("5 samples n={n} k{k:?} s{s:?} p{p:?} rebuilt={rebuilt}"), &t, g, rebuilt);
            }
        }
    }
    // The whole 16-bit range on every axis; sites at the corners (so outputs share inputs and
    // sit on the grid's edges) and anywhere, in three samples up to `last`.
    let (shape, origin) = ([65536; 3], [-32768; 3]);
    for last in [32766, 32767] {
        let mut set = std::collections::BTreeSet::new();
        while set.len() < 400 {
            let b = [0, 1, last][rng.below(3)];
            let p = [0, 1, 2].map(|_| match rng.below(3) {
                0 => -32768 + rng.below(5) as i32,
                1 => 32767 - rng.below(5) as i32,
                _ => -32768 + rng.below(65536) as i32,
            });
            set.insert([b, p[0], p[1], p[2]]);
        }
        let mut coords: Vec<[i32; 4]> = set.into_iter().collect();
        rng.shuffle(&mut coords);
        let feats = vec![0.0; coords.len()];
        let t = SparseTensor::with_geometry(coords, feats, 1, [1; 3], origin, shape).unwrap();
        for (k, s, p) in [([3; 3], [1; 3], [1; 3]), ([2; 3], [2; 3], [0; 3])] {
            let g = ConvGeometry { kernel: k, stride: s, padding: p, dilation: [1; 3] };
            check_strided(&format!("full grid, {} samples, k{k:?} s{s:?} p{p:?}", last + 1), &t, g, false);
        }
    }
}

#[test]
fn cuda_conv_equals_cpu_on_real_voxels() {
    let Some(dev) = gpu("cuda_conv_equals_cpu_on_real_voxels") else { return };
    let mut rng = Rng(12);
    let (coords, shape) = real_sites();
    for c in [32usize, 64, 128, 256] {
        let t = tensor_with(coords.clone(), shape, c, &mut rng);
        let cpu = submanifold(&t, [3, 3, 3], [1, 1, 1]).unwrap();
        let gpu = submanifold_cuda(&dev, &t, CudaSites::upload(&dev, &t).unwrap(), [3, 3, 3], [1, 1, 1]).unwrap();
        check_conv(&dev, &format!("subm k3 C{c}"), &t, &cpu, &gpu, c, false, &mut rng);
        if c == 64 {
            check_conv(&dev, "subm k3 C64 fused BN+ReLU+residual", &t, &cpu, &gpu, c, true, &mut rng);
        }
    }
    for (cin, cout) in [(32usize, 64usize), (64, 128), (128, 256)] {
        let t = tensor_with(coords.clone(), shape, cin, &mut rng);
        let g = ConvGeometry { kernel: [2; 3], stride: [2; 3], padding: [0; 3], dilation: [1; 3] };
        let cpu = strided(&t, g).unwrap();
        let sites = CudaSites::upload(&dev, &t).unwrap();
        let (gpu, _, _) = strided_cuda(&dev, &t, &sites, g).unwrap();
        check_conv(&dev, &format!("strided k2s2 {cin}->{cout}"), &t, &cpu, &gpu, cout, false, &mut rng);
        // The inverse conv back to `cin` channels, on the strided output.
        let down = cpu.output_tensor(round16(&(0..cpu.out_count() * cout).map(|_| rng.uniform(-1.0, 1.0)).collect::<Vec<_>>()), cout).unwrap();
        let cpu_inv = inverse(&cpu).unwrap();
        let gpu_inv = inverse_cuda(&dev, &gpu, sites).unwrap();
        check_conv(&dev, &format!("inverse k2s2 {cout}->{cin}"), &down, &cpu_inv, &gpu_inv, cin, false, &mut rng);
    }
}

#[test]
fn cuda_conv_random_sites_all_kinds() {
    let Some(dev) = gpu("cuda_conv_random_sites_all_kinds") else { return };
    let mut rng = Rng(13);
    let shape = [30, 26, 18];
    let t = tensor_with(random_sites(&mut rng, 4000, shape, 3), shape, 16, &mut rng);
    for k in [[1, 1, 1], [3, 3, 3], [5, 5, 5]] {
        let cpu = submanifold(&t, k, [1, 1, 1]).unwrap();
        let gpu = submanifold_cuda(&dev, &t, CudaSites::upload(&dev, &t).unwrap(), k, [1, 1, 1]).unwrap();
        check_conv(&dev, &format!("random subm k{k:?}"), &t, &cpu, &gpu, 24, true, &mut rng);
    }
    let g = ConvGeometry { kernel: [3; 3], stride: [2; 3], padding: [1; 3], dilation: [1; 3] };
    let cpu = strided(&t, g).unwrap();
    let (gpu, _, _) = strided_cuda(&dev, &t, &CudaSites::upload(&dev, &t).unwrap(), g).unwrap();
    check_conv(&dev, "random strided k3s2p1", &t, &cpu, &gpu, 40, false, &mut rng);
}

/// A conv split over kernel offsets gives the same bits whether each tile's splits are summed on
/// chip (launched as one thread-block cluster, compute capability 9.0 and later) or through FP32
/// partials in device memory and a second pass: every pipelined kernel, 2 to 8 splits, with
/// bias, a pre-activation pass, a residual and the next layer's BN + ReLU, and the same range
/// flags. The partials path is what the CPU comparisons above check.
#[test]
fn cuda_conv_split_sums_on_chip_equal_the_second_pass() {
    use sptr::device::range::RangeFlags;
    use sptr::device::range_guard::LayerNames;
    use sptr::ops::sparse_conv::cuda::{conv_cuda_guarded, ConvRange};
    let Some(mut dev) = gpu("cuda_conv_split_sums_on_chip_equal_the_second_pass") else { return };
    dev.set_cluster_reduce(true);
    if !dev.cluster_reduce() {
        assert!(!dev.arch.has_clusters(), "compute capability {}.{} with clusters, but no on-chip sums", dev.arch.major, dev.arch.minor);
        eprintln!(
            "SKIPPED cuda_conv_split_sums_on_chip_equal_the_second_pass: compute capability {}.{} (or the portable kernel paths) has no thread-block clusters",
            dev.arch.major, dev.arch.minor
        );
        return;
    }
    let mut rng = Rng(17);
    let (coords, shape) = real_sites();
    let mut names = LayerNames::new();
    let (pre_id, conv_id) = (names.add("pre"), names.add("conv"));
    let mut compared = 0;
    for c in [32usize, 64, 128, 256] {
        let t = tensor_with(coords.clone(), shape, c, &mut rng);
        let map = submanifold_cuda(&dev, &t, CudaSites::upload(&dev, &t).unwrap(), [3, 3, 3], [1, 1, 1]).unwrap();
        let (kv, m) = (27usize, map.out_count);
        let s = &dev.stream;
        let bound = (1.0 / (kv * c) as f32).sqrt() * 2.0;
        let w: Vec<f32> = (0..kv * c * c).map(|_| rng.uniform(-bound, bound)).collect();
        let bias: Vec<f32> = (0..c).map(|_| rng.uniform(-0.5, 0.5)).collect();
        let weights = CudaConvWeights::upload(&dev, &w, WeightLayout::Krsc, kv, c, c, Some(&bias)).unwrap();
        let x = s.clone_htod(&t.feats().iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>()).unwrap();
        let res = s.clone_htod(&(0..m * c).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0))).collect::<Vec<_>>()).unwrap();
        let up = |n: usize, lo: f32, hi: f32, rng: &mut Rng| s.clone_htod(&(0..n).map(|_| rng.uniform(lo, hi)).collect::<Vec<_>>()).unwrap();
        let (pre_scale, pre_shift) = (up(c, 0.5, 1.5, &mut rng), up(c, -0.3, 0.3, &mut rng));
        let (post_scale, post_shift) = (up(c, 0.5, 1.5, &mut rng), up(c, -0.3, 0.3, &mut rng));
        let pre = CudaPreActivation { scale: &pre_scale, shift: &pre_shift, relu: true };
        let post = CudaPreActivation { scale: &post_scale, shift: &post_shift, relu: true };
        let mut algos = vec![ConvAlgo::ImplicitGemmPipe, ConvAlgo::ImplicitGemmPipe32];
        algos.extend(TILED_VARIANTS.iter().map(|v| v.algo()));
        algos.extend(WGMMA_VARIANTS.iter().filter(|v| weights.wgmma_ready() && c % v.cols as usize == 0).map(|v| v.algo()));
        for algo in algos {
            for splits in [2usize, 3, 5, 7, 8] {
                for fused in [false, true] {
                    let mut run = |on_chip: bool| {
                        dev.set_cluster_reduce(on_chip);
                        let flags = RangeFlags::new(&dev, &names).unwrap();
                        let range = ConvRange { conv: Some(flags.slot(conv_id).unwrap()), pre: Some(flags.slot(pre_id).unwrap()) };
                        let y = conv_cuda_guarded(&dev, &x, &map, &weights, fused.then_some(&pre), fused.then_some(&res), algo, Some(splits), fused.then_some(&post), range).unwrap();
                        let bits: Vec<u16> = dev.stream.clone_dtoh(&y.slice(..m * c)).unwrap().iter().map(|h| h.to_bits()).collect();
                        (bits, flags.read_now(&dev).unwrap())
                    };
                    let (chip, chip_flags) = run(true);
                    let (second, second_flags) = run(false);
                    let case = format!("subm k3 C{c} {algo:?} {splits} splits, fused {fused}");
                    assert!(chip.iter().any(|&b| b != 0), "{case}: an all-zero output");
                    if let Some(i) = (0..chip.len()).find(|&i| chip[i] != second[i]) {
                        panic!("{case}: value {i} (row {}, channel {}) is {:#06x} on chip, {:#06x} through partials", i / c, i % c, chip[i], second[i]);
                    }
                    assert_eq!(chip_flags, second_flags, "{case}: range flags");
                    compared += 1;
                }
            }
        }
    }
    eprintln!("{compared} split convs: the same bits on chip and through partials");
    assert!(compared >= 4 * 2 * 5 * 2, "{compared} cases");
}

#[test]
fn cuda_conv_rejects_mismatches() {
    let Some(dev) = gpu("cuda_conv_rejects_mismatches") else { return };
    let mut rng = Rng(14);
    let shape = [8, 8, 8];
    let t = tensor_with(random_sites(&mut rng, 50, shape, 1), shape, 4, &mut rng);
    let gpu = submanifold_cuda(&dev, &t, CudaSites::upload(&dev, &t).unwrap(), [3; 3], [1; 3]).unwrap();
    assert!(CudaConvWeights::upload(&dev, &[0.0; 10], WeightLayout::Krsc, 27, 4, 4, None).is_err(), "wrong weight length");
    assert!(CudaConvWeights::upload(&dev, &vec![0.0; 27 * 4 * 4], WeightLayout::Krsc, 27, 4, 4, Some(&[0.0; 3])).is_err(), "wrong bias length");
    let w1 = CudaConvWeights::upload(&dev, &vec![0.0; 4 * 4], WeightLayout::Krsc, 1, 4, 4, None).unwrap();
    let x = dev.stream.alloc_zeros::<f16>(50 * 4).unwrap();
    assert!(conv_cuda(&dev, &x, &gpu, &w1, None, None).is_err(), "kernel volume mismatch");
    let w = CudaConvWeights::upload(&dev, &vec![0.0; 27 * 8 * 4], WeightLayout::Krsc, 27, 8, 4, None).unwrap();
    assert!(conv_cuda(&dev, &x, &gpu, &w, None, None).is_err(), "input too small for Cin 8");
    // A tiled kernel shape that is not built is refused with a message, not launched.
    let w8 = CudaConvWeights::upload(&dev, &vec![0.0; 27 * 8 * 8], WeightLayout::Krsc, 27, 8, 8, None).unwrap();
    let x8 = dev.stream.alloc_zeros::<f16>(50 * 8).unwrap();
    let unbuilt = ConvAlgo::ImplicitGemmTiled { rows: 96, cols: 32, depth: 32, stages: 4 };
    let err = conv_cuda_split(&dev, &x8, &gpu, &w8, None, None, unbuilt, None, None).err().expect("an unbuilt tile shape");
    assert!(err.to_string().contains("96 x 32"), "{err}");
    assert!(conv_cuda_split(&dev, &x8, &gpu, &w8, None, None, TILED_VARIANTS[0].algo(), None, None).is_ok(), "a built shape runs");
    // The warpgroup-MMA kernels: refused for weights without the transposed copy (Cin 8, or a
    // device without wgmma), for Cout not a multiple of the tile width, and for an unbuilt width.
    let err = conv_cuda_split(&dev, &x8, &gpu, &w8, None, None, WGMMA_VARIANTS[0].algo(), None, None).err().expect("Cin 8 on wgmma");
    assert!(err.to_string().contains("multiples of 64"), "{err}");
    let w64 = CudaConvWeights::upload(&dev, &vec![0.01; 27 * 64 * 64], WeightLayout::Krsc, 27, 64, 64, None).unwrap();
    assert_eq!(w64.wgmma_ready(), dev.arch.has_wgmma());
    let x64 = dev.stream.alloc_zeros::<f16>(50 * 64).unwrap();
    if dev.arch.has_wgmma() {
        let err = conv_cuda_split(&dev, &x64, &gpu, &w64, None, None, ConvAlgo::Wgmma { cols: 128, stages: 3 }, None, None).err().expect("Cout 64 on 128-wide tiles");
        assert!(err.to_string().contains("multiple of 128"), "{err}");
        let err = conv_cuda_split(&dev, &x64, &gpu, &w64, None, None, ConvAlgo::Wgmma { cols: 32, stages: 4 }, None, None).err().expect("an unbuilt width");
        assert!(err.to_string().contains("32-channel tiles"), "{err}");
        assert!(conv_cuda_split(&dev, &x64, &gpu, &w64, None, None, ConvAlgo::Wgmma { cols: 64, stages: 4 }, None, None).is_ok(), "a built width runs");
    }
}
