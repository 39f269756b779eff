//! The LSS view transform on CUDA against the CPU reference: geometry tables identical entry for
//! entry (seg and detection grids, nuScenes calibration), the pool (tensor-core and slice kernels)
//! within rel 1e-3 on FP16 inputs and each value within its rounding bound, the same bits on
//! repeated runs, a masked camera adding nothing, the same with the long cells cut into chunks of
//! any size (the pool's plan), not cut at all, and other span budgets, the whole
//! transform (depthnet, softmax, pool, downsample) on random weights, and the geometry cache.
//! Skips without a GPU unless SPTR_REQUIRE_GPU=1.
#![cfg(feature = "cuda-core")]

use crate::common::{fp16, gpu, rel_err, Rng};
use cudarc::cublas::CudaBlas;
use half::f16;
use crate::lss_common::*;
use sptr::models::bevfusion::lss::cuda::{build_geometry_cuda, pool_cuda, pool_cuda_planned, upload_frustum, CudaLssTransform, CudaPoolPlan};
use sptr::models::bevfusion::lss::pool_plan::{PoolOrder, PoolPlan, DEFAULT_BAND_POINTS, DEFAULT_CHUNK_POINTS, DEFAULT_SPAN_POINTS, WHOLE_CELL};
use sptr::models::bevfusion::lss::transform::random_tensors;
use sptr::models::bevfusion::lss::{pool, CameraMask, LssConfig, LssGeometry, LssParams, LssTransform, PREFIX};
use sptr::ops::dense::cuda::CudaFeatureMap;
use sptr::ops::dense::FeatureMap;
use sptr::device::cuda::CudaDevice;
use sptr::nn::Weights;

fn upload_f16(dev: &CudaDevice, v: &[f32]) -> cudarc::driver::CudaSlice<f16> {
    let h: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    dev.stream.clone_htod(&h).unwrap()
}

fn check_geometry(dev: &CudaDevice, name: &str, cfg: &LssConfig, calib: &sptr::sensors::calib::camera::Calibration) {
    let params = LssParams::from_config(cfg);
    let cpu = LssGeometry::build(&params, calib).unwrap();
    let frustum = upload_frustum(dev, &params).unwrap();
    let t = std::time::Instant::now();
    let g = build_geometry_cuda(dev, &params, &frustum, calib).unwrap();
    dev.synchronize().unwrap();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let got = g.download(dev).unwrap();
    eprintln!("{name}: {} points, {} kept, {} intervals; cuda {ms:.3} ms (first build, incl. kernel load)", g.points, cpu.kept(), cpu.intervals().len());
    assert_eq!(got.cell_start.len(), cpu.cell_start.len(), "{name}");
    if let Some(c) = (0..cpu.cell_start.len()).find(|&c| got.cell_start[c] != cpu.cell_start[c]) {
        panic!("{name}: cell offsets differ first at cell {c}: cuda {} cpu {}", got.cell_start[c], cpu.cell_start[c]);
    }
    if let Some(i) = (0..cpu.order.len()).find(|&i| got.order[i] != cpu.order[i]) {
        panic!("{name}: point order differs first at {i}: cuda {} cpu {}", got.order[i], cpu.order[i]);
    }
    assert_eq!(got, cpu, "{name}");
    // the pool's plan: the one the CPU makes from the same cell offsets, in the default banded
    // order (its rules are tested in pool_plan.rs)
    assert_eq!(g.host_cell_start, cpu.cell_start, "{name}: the host copy of the offsets");
    let want = PoolPlan::build_ordered(&cpu.cell_start, DEFAULT_CHUNK_POINTS, PoolOrder::banded(&g.grid, DEFAULT_BAND_POINTS)).unwrap();
    assert!(g.plan.host == want, "{name}: the geometry's pool plan is not the CPU's banded plan");
}

#[test]
fn cuda_geometry_identical_to_cpu() {
    let Some(dev) = gpu("cuda_geometry_identical_to_cpu") else { return };
    let calib = nuscenes_calib();
    check_geometry(&dev, "seg geometry", &seg_config(), &calib);
    check_geometry(&dev, "det geometry", &det_config(), &calib);
    check_geometry(&dev, "small geometry", &small_config(), &calib);
    // another calibration: every camera moved and turned a little
    let mut moved = calib.clone();
    for (i, c) in moved.cameras.iter_mut().enumerate() {
        let (s, co) = (0.01 * i as f64).sin_cos();
        let t = c.camera_to_lidar;
        for (col, (a, b)) in t[0].iter().zip(&t[1]).enumerate() {
            c.camera_to_lidar[0][col] = co * a - s * b;
            c.camera_to_lidar[1][col] = s * a + co * b;
        }
        c.camera_to_lidar[2][3] += 0.05 * i as f64;
    }
    check_geometry(&dev, "seg geometry, moved cameras", &seg_config(), &moved);
}

/// Every pooled value against the CPU's FP32 sum `want` of the same FP16 inputs: within the FP16
/// rounding of the output (2^-11 of the value) plus the two FP32 summations' error, which scales
/// with the sum of the terms' magnitudes (`abs_sum`, the cell's Σ |depth · context| a channel).
/// Unlike a norm over the whole map, one wrong cell fails it.
fn assert_each_value_close(what: &str, got: &[f32], want: &[f32], abs_sum: &[f32]) {
    for (i, ((g, w), a)) in got.iter().zip(want).zip(abs_sum).enumerate() {
        let tol = 5e-4 * w.abs() + 1e-4 * a + 1e-7;
        assert!((g - w).abs() <= tol, "{what}: value {i} (cell {}, channel {}): {g} against the CPU's {w} (|terms| {a})", i / 80, i % 80);
    }
}

#[test]
fn cuda_pool_matches_cpu_is_deterministic_and_masks() {
    let Some(dev) = gpu("cuda_pool_matches_cpu_is_deterministic_and_masks") else { return };
    // the default plans run the slice kernel; at C = 80 (seg and det) the same plans and others
    // also run the tensor-core kernel (`with_span_points`)
    for (name, cfg) in [("seg", seg_config()), ("det", det_config()), ("small", small_config())] {
        let params = LssParams::from_config(&cfg);
        let calib = nuscenes_calib();
        let cpu_geom = LssGeometry::build(&params, &calib).unwrap();
        let frustum = upload_frustum(&dev, &params).unwrap();
        let geom = build_geometry_cuda(&dev, &params, &frustum, &calib).unwrap();
        let (d, c) = (cpu_geom.depth_bins, cfg.channels());
        assert!(!geom.plan.has_spans(), "{name}: the default plan runs the slice kernel");
        let pixels = cpu_geom.cameras * cpu_geom.pixels_per_camera();
        let (depth, context) = random_lifted(11, pixels, d, c);
        let (gd, gc) = (upload_f16(&dev, &depth), upload_f16(&dev, &context));
        let want = pool(&cpu_geom, &depth, &context, c, CameraMask::ALL).unwrap();
        let abs_depth: Vec<f32> = depth.iter().map(|v| v.abs()).collect();
        let abs_context: Vec<f32> = context.iter().map(|v| v.abs()).collect();
        let abs_sum = pool(&cpu_geom, &abs_depth, &abs_context, c, CameraMask::ALL).unwrap().data;
        let got = pool_cuda(&dev, &geom, &gd, &gc, c, CameraMask::ALL).unwrap().download(&dev).unwrap();
        assert_eq!((got.h, got.w, got.c), (want.h, want.w, want.c));
        let e = rel_err(&got.data, &want.data);
        eprintln!("{name} pool: rel err {e:.2e} vs CPU");
        // the inputs are the same FP16 values; what differs is the FP32 summation order and the
        // FP16 rounding of the output (<= 2^-11 relative)
        assert!(e <= 1e-3, "{name}: rel err {e}");
        let close = |what: &str, m: &FeatureMap| {
            if c == 80 {
                assert_each_value_close(&format!("{name}, {what}"), &m.data, &want.data, &abs_sum);
            }
        };
        close("default plan", &got);
        // empty cells are zero
        for cell in 0..cpu_geom.grid.cells() {
            if cpu_geom.cell_start[cell] == cpu_geom.cell_start[cell + 1] {
                assert!(got.data[cell * c..(cell + 1) * c].iter().all(|v| *v == 0.0), "{name}: empty cell {cell}");
            }
        }
        // the same bits every run
        let bits = |m: &FeatureMap| m.data.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
        for _ in 0..3 {
            let again = pool_cuda(&dev, &geom, &gd, &gc, c, CameraMask::ALL).unwrap().download(&dev).unwrap();
            assert_eq!(bits(&again), bits(&got), "{name}: pool output changed between runs");
        }
        // a masked camera adds nothing: bit for bit a camera with zero depth and zero context
        // (and on the slice kernel, zero depth alone)
        let per_cam = cpu_geom.pixels_per_camera() * d;
        let per_cam_ctx = cpu_geom.pixels_per_camera() * c;
        let zero_camera = |cam: usize| {
            let mut zd = depth.clone();
            zd[cam * per_cam..(cam + 1) * per_cam].iter_mut().for_each(|v| *v = 0.0);
            let mut zc = context.clone();
            zc[cam * per_cam_ctx..(cam + 1) * per_cam_ctx].iter_mut().for_each(|v| *v = 0.0);
            (upload_f16(&dev, &zd), upload_f16(&dev, &zc))
        };
        for cam in [0usize, 4] {
            let (zd, zc) = zero_camera(cam);
            let masked = pool_cuda(&dev, &geom, &gd, &gc, c, CameraMask::ALL.without(cam)).unwrap().download(&dev).unwrap();
            let zero = pool_cuda(&dev, &geom, &zd, &zc, c, CameraMask::ALL).unwrap().download(&dev).unwrap();
            assert_eq!(bits(&masked), bits(&zero), "{name}: camera {cam} masked != zero depth and context");
            assert_ne!(bits(&masked), bits(&got), "{name}: camera {cam} contributes");
            let cpu_masked = pool(&cpu_geom, &depth, &context, c, CameraMask::ALL.without(cam)).unwrap();
            assert!(rel_err(&masked.data, &cpu_masked.data) <= 1e-3);
        }
        // the plan cuts the long cells (so the two-pass path runs here)
        let longest_cell = cpu_geom.cell_start.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        if name != "small" {
            assert!(longest_cell > DEFAULT_CHUNK_POINTS, "{name}: no cell over {DEFAULT_CHUNK_POINTS} points, so no cut to test");
        }
        assert_eq!(geom.plan.host.merges.is_empty(), longest_cell <= DEFAULT_CHUNK_POINTS, "{name}: the plan cuts exactly the long cells");
        let (zd0, zc0) = zero_camera(0);
        let slices = |p: PoolPlan| CudaPoolPlan::from_host(&dev, &geom, p.with_span_points(None)).unwrap();
        let run = |plan: &CudaPoolPlan, mask: CameraMask, dep: &cudarc::driver::CudaSlice<f16>, ctx: &cudarc::driver::CudaSlice<f16>| {
            pool_cuda_planned(&dev, &geom, plan, dep, ctx, c, mask, None).unwrap().download(&dev).unwrap()
        };
        // a plan on either kernel: the CPU's sums, the same bits on every run, camera 0 masked as
        // zero depth and context
        let check_variant = |what: &str, plan: &CudaPoolPlan| -> FeatureMap {
            let out = run(plan, CameraMask::ALL, &gd, &gc);
            let e = rel_err(&out.data, &want.data);
            assert!(e <= 1e-3, "{name}, {what}: rel err {e}");
            close(what, &out);
            assert_eq!(bits(&run(plan, CameraMask::ALL, &gd, &gc)), bits(&out), "{name}, {what}: changed between runs");
            assert_eq!(bits(&run(plan, CameraMask::ALL.without(0), &gd, &gc)), bits(&run(plan, CameraMask::ALL, &zd0, &zc0)), "{name}, {what}: mask");
            eprintln!("{name} pool, {what}: {} items, {} spans, {} cut cells, rel err {e:.2e}", plan.host.items.len(), plan.host.spans.len(), plan.host.merges.len());
            out
        };
        // the slice kernel: masked equals zero depth alone; any cut gives the CPU's sums; a cell
        // the plan keeps whole has the bits of the uncut pool, and the launch order (banded or
        // longest first) never changes a bit
        let default_slices = slices(geom.plan.host.clone());
        let default_slices_out = check_variant("default plan, slice kernel", &default_slices);
        let mut zd = depth.clone();
        zd[..per_cam].iter_mut().for_each(|v| *v = 0.0);
        let zd_only = upload_f16(&dev, &zd);
        assert_eq!(bits(&run(&default_slices, CameraMask::ALL.without(0), &gd, &gc)), bits(&run(&default_slices, CameraMask::ALL, &zd_only, &gc)), "{name}: slice kernel mask");
        let uncut_out = run(&slices(PoolPlan::build(&geom.host_cell_start, u32::MAX).unwrap()), CameraMask::ALL, &gd, &gc);
        for item in geom.plan.host.items.iter().filter(|i| i.slot == WHOLE_CELL) {
            let r = item.cell as usize * c..(item.cell as usize + 1) * c;
            let cell_bits = |m: &FeatureMap| m.data[r.clone()].iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
            assert_eq!(cell_bits(&default_slices_out), cell_bits(&uncut_out), "{name}: whole cell {}", item.cell);
        }
        for chunk in [u32::MAX, 33, 8, 1] {
            check_variant(&format!("chunk {chunk}, slice kernel"), &slices(PoolPlan::build(&geom.host_cell_start, chunk).unwrap()));
        }
        assert_eq!(geom.plan.host.order, PoolOrder::banded(&geom.grid, DEFAULT_BAND_POINTS), "{name}: the default plan is banded");
        let longest_out = run(&slices(PoolPlan::build(&geom.host_cell_start, DEFAULT_CHUNK_POINTS).unwrap()), CameraMask::ALL, &gd, &gc);
        assert_eq!(bits(&default_slices_out), bits(&longest_out), "{name}: the banded plan's bits differ from longest first");
        for (chunk, band) in [(DEFAULT_CHUNK_POINTS, 8), (DEFAULT_CHUNK_POINTS, 1), (33, 32)] {
            let banded = PoolPlan::build_ordered(&geom.host_cell_start, chunk, PoolOrder::banded(&geom.grid, band)).unwrap();
            let longest = PoolPlan::build(&geom.host_cell_start, chunk).unwrap();
            assert_ne!(banded.items, longest.items, "{name}: band {band} keeps the longest-first order");
            let out = check_variant(&format!("chunk {chunk}, band {band}, slice kernel"), &slices(banded));
            assert_eq!(bits(&out), bits(&run(&slices(longest), CameraMask::ALL, &gd, &gc)), "{name}: chunk {chunk}, band {band}: bits differ from longest first");
        }
        // the tensor-core kernel on the default plan and other cuts, orders and span budgets (a
        // span of one item of a whole 1,000-point cell, of sixteen 1-point items, of one point)
        if c == 80 {
            let spans = |p: PoolPlan| {
                let plan = CudaPoolPlan::from_host(&dev, &geom, p.with_span_points(Some(DEFAULT_SPAN_POINTS))).unwrap();
                assert!(plan.has_spans(), "{name}: a plan with spans");
                plan
            };
            check_variant("default plan, tensor cores", &spans(geom.plan.host.clone()));
            for chunk in [u32::MAX, 33, 8, 1] {
                check_variant(&format!("chunk {chunk}, tensor cores"), &spans(PoolPlan::build(&geom.host_cell_start, chunk).unwrap()));
            }
            for (chunk, band) in [(DEFAULT_CHUNK_POINTS, 1), (33, 32)] {
                let p = PoolPlan::build_ordered(&geom.host_cell_start, chunk, PoolOrder::banded(&geom.grid, band)).unwrap();
                check_variant(&format!("chunk {chunk}, band {band}, tensor cores"), &spans(p));
            }
            for span_points in [1, 16, 512] {
                let p = geom.plan.host.clone().with_span_points(Some(span_points));
                check_variant(&format!("spans of {span_points} points"), &CudaPoolPlan::from_host(&dev, &geom, p).unwrap());
            }
        }
        // timing for the log (the benchmark is `sptr bench bevpool`)
        let ms = dev.time_median_ms(3, 20, || pool_cuda(&dev, &geom, &gd, &gc, c, CameraMask::ALL).map(|_| ())).unwrap();
        eprintln!("{name} pool: cuda {ms:.4} ms ({} kept points, {} cells)", cpu_geom.kept(), cpu_geom.grid.cells());
        // bad sizes
        assert!(pool_cuda(&dev, &geom, &gd, &gc, 12, CameraMask::ALL).is_err());
        assert!(pool_cuda(&dev, &geom, &upload_f16(&dev, &depth[..10]), &gc, c, CameraMask::ALL).is_err());
    }
}

fn fp16_round(v: &mut [f32]) {
    v.iter_mut().for_each(|x| *x = fp16(*x));
}

/// Random seg-config weights, with the conv weights the GPU sees (FP16, after BN folding) given
/// to the CPU too.
fn transform(cfg: &LssConfig, seed: u64) -> LssTransform {
    let w = Weights::from_tensors("random", random_tensors(cfg, PREFIX, seed)).unwrap();
    let mut t = LssTransform::from_weights_exact(cfg, w, PREFIX).unwrap();
    fp16_round(&mut t.depthnet.weight);
    for k in &mut t.downsample {
        fp16_round(&mut k.weight);
    }
    t
}

fn random_features(seed: u64, n: usize, h: usize, w: usize, c: usize) -> FeatureMap {
    let mut s = Rng(seed);
    FeatureMap::new(n, h, w, c, (0..n * h * w * c).map(|_| fp16(s.sym())).collect()).unwrap()
}

#[test]
fn cuda_transform_matches_cpu_and_caches_geometry() {
    let Some(dev) = gpu("cuda_transform_matches_cpu_and_caches_geometry") else { return };
    let blas = CudaBlas::new(dev.stream.clone()).unwrap();
    let cfg = seg_config();
    let t = transform(&cfg, 5);
    let calib = nuscenes_calib();
    let geom = LssGeometry::build(&t.params, &calib).unwrap();
    let x = random_features(9, 6, 32, 88, 256);
    let gx = CudaFeatureMap::upload(&dev, &x).unwrap();
    let mut gt = CudaLssTransform::upload(&dev, &t).unwrap();

    // the lift and the pool of the GPU's own lift
    gt.ensure_geometry(&dev, &calib).unwrap();
    let lifted = gt.lift(&dev, &blas, &gx).unwrap();
    let cpu_lifted = t.lift(&x).unwrap();
    let down = |s: &cudarc::driver::CudaSlice<f16>| -> Vec<f32> { dev.stream.clone_dtoh(s).unwrap().iter().map(|v| v.to_f32()).collect() };
    let ed = rel_err(&down(&lifted.depth), &cpu_lifted.depth);
    let ec = rel_err(&down(&lifted.context), &cpu_lifted.context);
    eprintln!("lift: depth rel err {ed:.2e}, context rel err {ec:.2e}");
    // FP16 GEMM inputs are the CPU's (rounded above); FP32 accumulation order and FP16 outputs
    assert!(ed <= 1e-3 && ec <= 1e-3);
    let gpu_bev = pool_cuda(&dev, gt.geometry().unwrap(), &lifted.depth, &lifted.context, 80, CameraMask::ALL).unwrap().download(&dev).unwrap();
    let cpu_bev = pool(&geom, &cpu_lifted.depth, &cpu_lifted.context, 80, CameraMask::ALL).unwrap();
    let ep = rel_err(&gpu_bev.data, &cpu_bev.data);
    eprintln!("lift + pool: rel err {ep:.2e}");
    assert!(ep <= 1e-3, "lift + pool rel err {ep}");

    // the whole transform
    let want = t.forward(&geom, &x, CameraMask::ALL).unwrap();
    let got = gt.forward(&dev, &blas, &calib, &gx, CameraMask::ALL).unwrap().download(&dev).unwrap();
    assert_eq!((got.n, got.h, got.w, got.c), (1, 128, 128, 80));
    let e = rel_err(&got.data, &want.data);
    eprintln!("view transform (depthnet, softmax, pool, 3 convs): rel err {e:.2e}");
    // six FP16 roundings of intermediate tensors (depth, context, pooled map, three conv
    // outputs), each ~2.8e-4 rms relative, add in quadrature to ~7e-4
    assert!(e <= 2e-3, "view transform rel err {e}");
    assert!(got.data.iter().all(|v| v.is_finite()));
    let ms = dev.time_median_ms(2, 10, || gt.forward(&dev, &blas, &calib, &gx, CameraMask::ALL).map(|_| ())).unwrap();
    eprintln!("view transform: cuda {ms:.3} ms (geometry cached)");

    // the geometry is built once per calibration
    assert_eq!(gt.builds(), 1);
    let mut moved = calib.clone();
    moved.cameras[0].camera_to_lidar[1][3] += 1.0;
    let other = gt.forward(&dev, &blas, &moved, &gx, CameraMask::ALL).unwrap().download(&dev).unwrap();
    assert_eq!(gt.builds(), 2);
    assert_ne!(other.data, got.data, "moving CAM_FRONT by 1 m changes the map");
    let back = gt.forward(&dev, &blas, &calib, &gx, CameraMask::ALL).unwrap().download(&dev).unwrap();
    assert_eq!(gt.builds(), 3);
    assert_eq!(back.data, got.data, "the same calibration gives the same bits");
    gt.forward(&dev, &blas, &calib, &gx, CameraMask::ALL).unwrap();
    assert_eq!(gt.builds(), 3);

    // bad inputs: a camera count or a feature size the calibration / YAML do not give
    let five = CudaFeatureMap::upload(&dev, &random_features(1, 5, 32, 88, 256)).unwrap();
    let e = gt.forward(&dev, &blas, &calib, &five, CameraMask::ALL).err().unwrap().to_string();
    assert!(e.contains("5 camera feature maps"), "{e}");
    let big = CudaFeatureMap::upload(&dev, &random_features(1, 6, 16, 44, 256)).unwrap();
    let e = gt.forward(&dev, &blas, &calib, &big, CameraMask::ALL).err().unwrap().to_string();
    assert!(e.contains("feature_size 32x88"), "{e}");
    let mut bad = calib.clone();
    bad.cameras[1].intrinsics[1][1] = 0.0;
    assert!(gt.forward(&dev, &blas, &bad, &gx, CameraMask::ALL).is_err());
    // the failed build kept the last geometry
    assert_eq!(gt.builds(), 3);
    gt.forward(&dev, &blas, &calib, &gx, CameraMask::ALL).unwrap();
    assert_eq!(gt.builds(), 3);
}
