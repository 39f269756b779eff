//! Parity of the LSS geometry and pool against the PyTorch reference written by
//! `tests/parity/lss_ref.py` (upstream's get_geometry + bev_pool transcribed; see its header), on
//! the nuScenes calibration and random depth / features, and our pool's time beside PyTorch's.
//!
//! Set `SPTR_LSS_PARITY_DIR` to the script's `--out` directory; unset, the test reports SKIPPED
//! and passes (also under SPTR_REQUIRE_GPU=1: the reference needs PyTorch on the GPU host).
//!
//! Per case (`seg`, `det`): the grid (dx, bx, nx) equals ours; the reference frustum (upstream's
//! create_frustum, as a checkpoint holds it) is within 1e-3 of ours and is the one used, as a
//! checkpoint's would be; every point's BEV cell (CPU and CUDA tables) is the reference's, so the
//! kept-point count and the intervals (cell, length) are identical; the CUDA pool of the same FP16
//! depth and features is within rel 1e-3 of the float64 scatter-add. One JSON line per case:
//! `{"case", "kept", "intervals", "rel_err", "sptr_pool_ms", "torch_scatter_add_ms",
//! "torch_scatter_add_fp16_ms", "torch_quickcumsum_ms", "torch_upstream_path_ms", ...}`.
#![cfg(feature = "cuda-core")]

use crate::common::{read_f32_le, read_i32_le};
use half::f16;
use crate::lss_common::*;
use serde::Deserialize;
use sptr::models::bevfusion::lss::cuda::{build_geometry_cuda, pool_cuda, upload_frustum};
use sptr::models::bevfusion::lss::geometry::{depth_index, point_cells};
use sptr::models::bevfusion::lss::{CameraMask, LssConfig, LssGeometry, LssParams};
use sptr::device::cuda::CudaDevice;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize)]
struct Ref {
    torch: String,
    device: String,
    cases: Vec<Case>,
}

#[derive(Debug, Deserialize)]
struct Case {
    case: String,
    cameras: usize,
    depth_bins: usize,
    feature: [usize; 2],
    channels: usize,
    dx: [f32; 3],
    bx: [f32; 3],
    nx: [usize; 3],
    points: usize,
    kept: usize,
    intervals: usize,
    cells_f32_differ: usize,
    quickcumsum_f32_rel_err_vs_f64: f64,
    torch_quickcumsum_ms: f64,
    torch_upstream_path_ms: f64,
    torch_upstream_path_peak_bytes: u64,
    torch_scatter_add_ms: f64,
    torch_scatter_add_fp16_ms: f64,
}

fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn run_case(dev: &CudaDevice, dir: &Path, c: &Case, cfg: &LssConfig) {
    let d = dir.join(&c.case);
    let mut params = LssParams::from_config(cfg);
    assert_eq!((params.grid.dx, params.grid.bx, params.grid.nx), (c.dx, c.bx, c.nx), "{}: grid", c.case);
    assert_eq!(
        (params.frustum.depth_bins, [params.frustum.height, params.frustum.width], cfg.channels()),
        (c.depth_bins, c.feature, c.channels),
        "{}: sizes",
        c.case
    );
    let frustum = read_f32_le(&d.join("frustum.f32"));
    assert_eq!(frustum.len(), params.frustum.data.len());
    let (max_diff, differ) = frustum.iter().zip(&params.frustum.data).fold((0f32, 0usize), |(m, n), (a, b)| ((a - b).abs().max(m), n + (a != b) as usize));
    eprintln!("{}: reference frustum vs ours: {differ} entries differ, max {max_diff:e}", c.case);
    assert!(max_diff <= 1e-3, "{}: frustum differs by {max_diff}", c.case);
    params.frustum.data = frustum;

    // every point's cell
    let calib = nuscenes_calib();
    let cams = params.cameras(&calib).unwrap();
    let ours = point_cells(&params, &cams);
    let want = read_i32_le(&d.join("cells.i32"));
    assert_eq!((ours.len(), want.len()), (c.points, c.points), "{}: point count", c.case);
    let mismatched: Vec<usize> = (0..want.len()).filter(|&i| ours[i].map_or(-1, |v| v as i32) != want[i]).collect();
    if let Some(&i) = mismatched.first() {
        panic!("{}: {} points in another cell than the reference; first: point {i}, ours {:?}, reference {}", c.case, mismatched.len(), ours[i], want[i]);
    }
    let cpu = LssGeometry::from_point_cells(&params, cams.len(), &ours);
    assert_eq!(cpu.kept(), c.kept, "{}: kept points", c.case);
    // intervals (cell, length) as bev_pool's sorted ranks give them
    let iv: Vec<i32> = cpu.intervals().iter().flat_map(|i| [i.cell as i32, i.len as i32]).collect();
    assert_eq!(iv.len() / 2, c.intervals);
    assert_eq!(iv, read_i32_le(&d.join("intervals.i32")), "{}: intervals", c.case);
    // the CUDA table is the CPU one
    let gfr = upload_frustum(dev, &params).unwrap();
    let geom = build_geometry_cuda(dev, &params, &gfr, &calib).unwrap();
    assert!(geom.download(dev).unwrap() == cpu, "{}: CUDA geometry differs from CPU", c.case);

    // inputs: depth [N, D, H, W] -> ours [N, H, W, D]; feats [N, C, H, W] -> [N, H, W, C]
    let (n, dn, [h, w], ch) = (c.cameras, c.depth_bins, c.feature, c.channels);
    let depth_ndhw = read_f32_le(&d.join("depth.f32"));
    let feats_nchw = read_f32_le(&d.join("feats.f32"));
    let mut depth = vec![0f32; n * dn * h * w];
    for i in 0..depth.len() {
        depth[depth_index(i, dn, h, w)] = depth_ndhw[i];
    }
    let context = sptr::ops::dense::FeatureMap::from_nchw(n, ch, h, w, &feats_nchw).unwrap().data;
    let up = |v: &[f32]| dev.stream.clone_htod(&v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<f16>>()).unwrap();
    let (gd, gc) = (up(&depth), up(&context));
    let got = pool_cuda(dev, &geom, &gd, &gc, ch, CameraMask::ALL).unwrap().download(dev).unwrap();
    let want_pool = read_f32_le(&d.join("pooled.f32"));
    let e = rel_err(&got.data, &want_pool);
    assert!(got.data.iter().all(|v| v.is_finite()));
    assert!(e <= 1e-3, "{}: pooled rel err {e}", c.case);
    let cpu_pool = sptr::models::bevfusion::lss::pool(&cpu, &depth, &context, ch, CameraMask::ALL).unwrap();
    let e_cpu = rel_err(&cpu_pool.data, &want_pool);
    let ms = dev.time_median_ms(5, 100, || pool_cuda(dev, &geom, &gd, &gc, ch, CameraMask::ALL).map(|_| ())).unwrap();
    let geom_ms = dev.time_median_ms(2, 20, || build_geometry_cuda(dev, &params, &gfr, &calib).map(|_| ())).unwrap();
    println!(
        "{{\"case\":\"{}\",\"kept\":{},\"intervals\":{},\"cells_identical\":true,\"cells_f32_upstream_differ\":{},\"rel_err\":{e:.3e},\
         \"cpu_rel_err\":{e_cpu:.3e},\"torch_quickcumsum_f32_rel_err\":{:.3e},\"sptr_pool_ms\":{ms:.4},\"sptr_geometry_ms\":{geom_ms:.4},\
         \"torch_scatter_add_ms\":{:.4},\"torch_scatter_add_fp16_ms\":{:.4},\"torch_quickcumsum_ms\":{:.4},\"torch_upstream_path_ms\":{:.4},\
         \"torch_upstream_path_peak_mb\":{:.1},\"speedup_vs_scatter_add\":{:.2}}}",
        c.case,
        c.kept,
        c.intervals,
        c.cells_f32_differ,
        c.quickcumsum_f32_rel_err_vs_f64,
        c.torch_scatter_add_ms,
        c.torch_scatter_add_fp16_ms,
        c.torch_quickcumsum_ms,
        c.torch_upstream_path_ms,
        c.torch_upstream_path_peak_bytes as f64 / 1e6,
        c.torch_scatter_add_ms / ms
    );
}

#[test]
fn lss_parity_with_pytorch_reference() {
    let Some(dir) = std::env::var_os("SPTR_LSS_PARITY_DIR").map(PathBuf::from) else {
        eprintln!("SKIPPED lss_parity_with_pytorch_reference: SPTR_LSS_PARITY_DIR is not set (tests/parity/lss_ref.py writes it)");
        return;
    };
    let dev = CudaDevice::new(0).expect("SPTR_LSS_PARITY_DIR is set: a GPU is needed");
    let text = std::fs::read_to_string(dir.join("ref.json")).expect("ref.json");
    let r: Ref = serde_json::from_str(&text).expect("ref.json parses");
    eprintln!("reference: torch {} on {}; ours on {}", r.torch, r.device, dev.name);
    assert_eq!(r.cases.len(), 2);
    for c in &r.cases {
        let cfg = match c.case.as_str() {
            "seg" => seg_config(),
            "det" => det_config(),
            other => panic!("unknown case {other}"),
        };
        run_case(&dev, &dir, c, &cfg);
    }
}
