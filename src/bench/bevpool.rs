//! `sptr bench bevpool`: the view transform's geometry build and pool on CUDA, JSON lines.
//!
//! Cases: the camera-only seg geometry of the model YAML (6 × 118 × 32 × 88, C 80, 256 × 256 at
//! 0.4 m) and the detection geometry the bev_pool anchors were measured on (x/y bounds
//! [-54, 54, 0.3]: 360 × 360, otherwise the same), both with the nuScenes sample calibration.
//! Depth and context are random FP16 (depth a softmax per pixel), as after the lift.
//!
//! Bytes the pool must move at least (each once): depth N·H·W·D·2, context N·H·W·C·2, the
//! table kept·4 + items·16 + merges·16 (point order, the plan), the split cells' FP32 partials
//! slots·C·4 written and read, the output cells·C·2. The DRAM floor is those bytes over the
//! device's DRAM bandwidth (`--dram-gbps`, H100 SXM 3350 GB/s). The inputs fit in the 50 MB L2
//! of an H100, so warm runs can beat that floor; it is a scale, not a bound.
//!
//! The L2 floor is what the kernel's loads move from L2 at the least: per kept point its context
//! row (C·2 bytes: each point reads its pixel's row again) and one 32-byte sector for its depth
//! value, plus the table, partials and output as above, over `--l2-gbps` (H100: about 5.5 TB/s
//! measured by microbenchmarks; an assumption, not a datasheet figure).
//!
//! Each case also times the pool with the long cells cut into chunks of other sizes and not cut
//! at all, launched longest first (`by_chunk`, `band` null), and launched in length bands of
//! other sizes along a Morton curve (`band` set: points a band); the plan's defaults are
//! `chunk_points` and `band`. At 80 channels the default plan also runs on the tensor-core
//! kernel with spans of several point budgets (`tensor_cores`, each as a ratio to the default).
//! All in the same call.

use crate::models::bevfusion::lss::config::{BevGrid, LssConfig};
use crate::models::bevfusion::lss::cuda::{build_geometry_cuda, pool_cuda, pool_cuda_planned, upload_frustum, CudaLssTransform, CudaPoolPlan};
use crate::models::bevfusion::lss::pool_plan::{PoolOrder, PoolPlan, DEFAULT_SPAN_POINTS};
use crate::models::bevfusion::lss::geometry::{LssGeometry, LssParams};
use crate::models::bevfusion::lss::transform::{random_tensors, softmax_into, CameraMask, LssTransform, PREFIX};
use crate::sensors::calib::camera::Calibration;
use crate::ops::dense::cuda::CudaFeatureMap;
use crate::ops::dense::FeatureMap;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::nn::random::SplitMix;
use crate::nn::Weights;
use crate::Error;
use half::f16;
use serde::Serialize;

use crate::bench::json::{line, Fixed};

/// Options of the benchmark.
#[derive(Debug, Clone)]
pub struct BevPoolBench {
    pub iters: usize,
    /// DRAM bandwidth for the floor, GB/s.
    pub dram_gbps: f64,
    /// L2 read bandwidth for the L2 floor, GB/s.
    pub l2_gbps: f64,
}

/// Chunk sizes timed beside the default (`None`: no cell cut).
const CHUNKS_TIMED: [Option<u32>; 5] = [None, Some(256), Some(128), Some(64), Some(32)];
/// (chunk, band) of the banded launch orders timed.
const BANDS_TIMED: [(u32, u32); 8] = [(128, 1), (128, 2), (128, 4), (128, 8), (128, 16), (128, 32), (64, 16), (256, 16)];

/// The detection-geometry variant of `cfg`: x and y bounds [-54, 54, 0.3].
pub fn detection_config(cfg: &LssConfig) -> LssConfig {
    let mut c = cfg.clone();
    c.vtransform.xbound = [-54.0, 54.0, 0.3];
    c.vtransform.ybound = [-54.0, 54.0, 0.3];
    c
}

fn random_lifted(seed: u64, pixels: usize, d: usize, c: usize) -> (Vec<f16>, Vec<f16>) {
    let mut rng = SplitMix(seed);
    let mut depth = Vec::with_capacity(pixels * d);
    let mut row = vec![0f32; d];
    for _ in 0..pixels {
        let logits: Vec<f32> = (0..d).map(|_| rng.uniform(-3.0, 3.0)).collect();
        softmax_into(&logits, &mut row);
        depth.extend(row.iter().map(|&v| f16::from_f32(v)));
    }
    let context = (0..pixels * c).map(|_| f16::from_f32(rng.uniform(-1.0, 1.0))).collect();
    (depth, context)
}

/// The table, partials and output bytes of a plan (both floors count them once).
fn plan_bytes(g: &LssGeometry, plan: &PoolPlan, channels: usize) -> usize {
    g.kept() * 4 + (plan.items.len() + plan.merges.len() + plan.spans.len()) * 16 + plan.slots as usize * channels * 4 * 2 + g.grid.cells() * channels * 2
}

/// The DRAM floor's bytes: the inputs once, and the plan's.
fn pool_bytes(g: &LssGeometry, plan: &PoolPlan, channels: usize) -> usize {
    let pixels = g.cameras * g.pixels_per_camera();
    pixels * g.depth_bins * 2 + pixels * channels * 2 + plan_bytes(g, plan, channels)
}

/// The L2 floor's bytes: each kept point's context row and depth sector, and the plan's.
fn l2_bytes(g: &LssGeometry, plan: &PoolPlan, channels: usize) -> usize {
    g.kept() * (channels * 2 + 32) + plan_bytes(g, plan, channels)
}

/// The JSON line of a pool case, keys in this order.
#[derive(Serialize)]
struct PoolRow<'a> {
    bench: &'static str,
    case: &'a str,
    device: &'a str,
    cameras: usize,
    depth_bins: usize,
    /// Feature map height and width.
    feature: [usize; 2],
    channels: usize,
    grid: [usize; 3],
    points: usize,
    kept: usize,
    intervals: usize,
    max_interval: u32,
    geometry_ms: Fixed<4>,
    geometry_cpu_ms: Fixed<2>,
    pool_ms: Fixed<4>,
    pool_bytes: usize,
    dram_gbps: f64,
    dram_floor_ms: Fixed<4>,
    ratio_to_floor: Fixed<2>,
    l2_bytes: usize,
    l2_gbps: f64,
    l2_floor_ms: Fixed<4>,
    ratio_to_l2_floor: Fixed<2>,
    /// The plan's chunk (points an item holds at most), the cells it cuts, its longest item.
    chunk_points: u32,
    /// The default plan's length band (null: longest first).
    band: Option<u32>,
    cut_cells: usize,
    longest_item: u32,
    by_chunk: Vec<ChunkTime>,
    /// The default plan on the tensor-core kernel (spans of up to 16 items on `mma.sync`, C 80
    /// only; empty at other widths), its spans packed to these point budgets, each time with its
    /// ratio to `pool_ms` (above 1: slower than the default).
    tensor_cores: Vec<SpanTime>,
    bar_ms: f64,
    goal_ms: f64,
}

/// The pool timed with another chunk size (`chunk_points` null: no cell cut) or launch order
/// (`band` null: longest first; else length bands of `band` points along a Morton curve).
#[derive(Serialize)]
struct ChunkTime {
    chunk_points: Option<u32>,
    band: Option<u32>,
    pool_ms: Fixed<4>,
}

/// The tensor-core pool timed with the spans packed to at most `span_points` points.
#[derive(Serialize)]
struct SpanTime {
    span_points: u32,
    pool_ms: Fixed<4>,
    over_default: Fixed<2>,
}

/// Span point budgets of the tensor-core pool timed.
const SPAN_POINTS_TIMED: [u32; 3] = [64, DEFAULT_SPAN_POINTS, 256];

/// The JSON line of the whole view transform.
#[derive(Serialize)]
struct TransformRow<'a> {
    bench: &'static str,
    case: &'static str,
    device: &'a str,
    lift_ms: Fixed<4>,
    vtransform_ms: Fixed<4>,
    note: &'static str,
}

/// One case: JSON line.
fn case(dev: &CudaDevice, name: &str, cfg: &LssConfig, calib: &Calibration, opt: &BevPoolBench) -> Result<String, Error> {
    let params = LssParams::from_config(cfg);
    let t0 = std::time::Instant::now();
    let cpu = LssGeometry::build(&params, calib)?;
    let cpu_ms = t0.elapsed().as_secs_f64() * 1e3;
    let frustum = upload_frustum(dev, &params)?;
    let iters = opt.iters.max(1);
    let geom_ms = dev.time_median_ms(2, iters.min(20), || build_geometry_cuda(dev, &params, &frustum, calib).map(|_| ()))?;
    let geom = build_geometry_cuda(dev, &params, &frustum, calib)?;
    let (d, c) = (cpu.depth_bins, cfg.channels());
    let pixels = cpu.cameras * cpu.pixels_per_camera();
    let (depth, context) = random_lifted(7, pixels, d, c);
    let gd = dev.stream.clone_htod(&depth).map_err(cuda_err("uploading depth"))?;
    let gc = dev.stream.clone_htod(&context).map_err(cuda_err("uploading context"))?;
    let pool_ms = dev.time_median_ms(5, iters, || pool_cuda(dev, &geom, &gd, &gc, c, CameraMask::ALL).map(|_| ()))?;
    let mut by_chunk = Vec::new();
    for chunk in CHUNKS_TIMED {
        let plan = CudaPoolPlan::build(dev, &geom, chunk.unwrap_or(u32::MAX))?;
        let ms = dev.time_median_ms(5, iters, || pool_cuda_planned(dev, &geom, &plan, &gd, &gc, c, CameraMask::ALL, None).map(|_| ()))?;
        by_chunk.push(ChunkTime { chunk_points: chunk, band: None, pool_ms: Fixed(ms) });
    }
    for (chunk, band) in BANDS_TIMED {
        let plan = CudaPoolPlan::build_ordered(dev, &geom, chunk, PoolOrder::banded(&geom.grid, band))?;
        let ms = dev.time_median_ms(5, iters, || pool_cuda_planned(dev, &geom, &plan, &gd, &gc, c, CameraMask::ALL, None).map(|_| ()))?;
        by_chunk.push(ChunkTime { chunk_points: Some(chunk), band: Some(band), pool_ms: Fixed(ms) });
    }
    let time_plan = |host: PoolPlan| -> Result<f64, Error> {
        let plan = CudaPoolPlan::from_host(dev, &geom, host)?;
        dev.time_median_ms(5, iters, || pool_cuda_planned(dev, &geom, &plan, &gd, &gc, c, CameraMask::ALL, None).map(|_| ()))
    };
    let mut tensor_cores = Vec::new();
    if c == 80 {
        for p in SPAN_POINTS_TIMED {
            let ms = time_plan(geom.plan.host.clone().with_span_points(Some(p)))?;
            tensor_cores.push(SpanTime { span_points: p, pool_ms: Fixed(ms), over_default: Fixed(ms / pool_ms) });
        }
    }
    let plan = &geom.plan.host;
    let bytes = pool_bytes(&cpu, plan, c);
    let floor_ms = bytes as f64 / (opt.dram_gbps * 1e9) * 1e3;
    let l2 = l2_bytes(&cpu, plan, c);
    let l2_floor_ms = l2 as f64 / (opt.l2_gbps * 1e9) * 1e3;
    let iv = cpu.intervals();
    let max_len = iv.iter().map(|i| i.len).max().unwrap_or(0);
    let BevGrid { nx, .. } = params.grid;
    Ok(line(&PoolRow {
        bench: "bevpool",
        case: name,
        device: &dev.name,
        cameras: cpu.cameras,
        depth_bins: d,
        feature: [cpu.height, cpu.width],
        channels: c,
        grid: nx,
        points: geom.points,
        kept: cpu.kept(),
        intervals: iv.len(),
        max_interval: max_len,
        geometry_ms: Fixed(geom_ms),
        geometry_cpu_ms: Fixed(cpu_ms),
        pool_ms: Fixed(pool_ms),
        pool_bytes: bytes,
        dram_gbps: opt.dram_gbps,
        dram_floor_ms: Fixed(floor_ms),
        ratio_to_floor: Fixed(pool_ms / floor_ms),
        l2_bytes: l2,
        l2_gbps: opt.l2_gbps,
        l2_floor_ms: Fixed(l2_floor_ms),
        ratio_to_l2_floor: Fixed(pool_ms / l2_floor_ms),
        chunk_points: plan.chunk_points,
        band: match plan.order {
            PoolOrder::Banded { band, .. } => Some(band),
            PoolOrder::LongestFirst => None,
        },
        cut_cells: plan.merges.len(),
        longest_item: plan.longest_item(),
        by_chunk,
        tensor_cores,
        bar_ms: 0.040,
        goal_ms: 0.020,
    }))
}

/// The whole view transform (depthnet GEMM, softmax, pool, downsample) on random weights and
/// features, geometry cached: JSON line.
fn transform_case(dev: &CudaDevice, cfg: &LssConfig, calib: &Calibration, iters: usize) -> Result<String, Error> {
    let w = Weights::from_tensors("random", random_tensors(cfg, PREFIX, 1))?;
    let t = LssTransform::from_weights_exact(cfg, w, PREFIX)?;
    let blas = cudarc::cublas::CudaBlas::new(dev.stream.clone()).map_err(|e| Error::Cuda(format!("cuBLAS: {e:?}")))?;
    let mut gt = CudaLssTransform::upload(dev, &t)?;
    let [h, wd] = cfg.feature_size();
    let n = calib.len();
    let cin = cfg.vtransform.in_channels;
    let mut rng = SplitMix(3);
    let x = FeatureMap::new(n, h, wd, cin, (0..n * h * wd * cin).map(|_| rng.uniform(-1.0, 1.0)).collect())?;
    let gx = CudaFeatureMap::upload(dev, &x)?;
    gt.ensure_geometry(dev, calib)?;
    let lift_ms = dev.time_median_ms(3, iters, || gt.lift(dev, &blas, &gx).map(|_| ()))?;
    let all_ms = dev.time_median_ms(3, iters, || gt.forward(dev, &blas, calib, &gx, CameraMask::ALL).map(|_| ()))?;
    Ok(line(&TransformRow {
        bench: "bevpool",
        case: "seg_vtransform",
        device: &dev.name,
        lift_ms: Fixed(lift_ms),
        vtransform_ms: Fixed(all_ms),
        note: "depthnet GEMM + softmax; then pool and the three downsample convs, geometry cached",
    }))
}

/// Every case, one JSON line each.
pub fn bench_bevpool(dev: &CudaDevice, seg: &LssConfig, calib: &Calibration, opt: &BevPoolBench) -> Result<Vec<String>, Error> {
    Ok(vec![
        case(dev, "seg", seg, calib, opt)?,
        case(dev, "det", &detection_config(seg), calib, opt)?,
        transform_case(dev, seg, calib, opt.iters.clamp(1, 50))?,
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::json::parse_row;

    /// Both kinds of line parse back with their keys in order.
    #[test]
    fn the_rows_are_json_with_their_keys_in_order() {
        let row = PoolRow {
            bench: "bevpool",
            case: "seg",
            device: "H100",
            cameras: 6,
            depth_bins: 118,
            feature: [32, 88],
            channels: 80,
            grid: [256, 256, 1],
            points: 1_993_728,
            kept: 1_000_000,
            intervals: 50_000,
            max_interval: 90,
            geometry_ms: Fixed(0.05),
            geometry_cpu_ms: Fixed(120.0),
            pool_ms: Fixed(0.123456),
            pool_bytes: 6_700_000,
            dram_gbps: 3350.0,
            dram_floor_ms: Fixed(0.002),
            ratio_to_floor: Fixed(61.7284),
            l2_bytes: 300_000_000,
            l2_gbps: 5500.0,
            l2_floor_ms: Fixed(0.0545),
            ratio_to_l2_floor: Fixed(2.2),
            chunk_points: 128,
            band: Some(8),
            cut_cells: 300,
            longest_item: 128,
            by_chunk: vec![
                ChunkTime { chunk_points: None, band: None, pool_ms: Fixed(0.15) },
                ChunkTime { chunk_points: Some(64), band: Some(16), pool_ms: Fixed(0.06) },
            ],
            tensor_cores: vec![SpanTime { span_points: 64, pool_ms: Fixed(0.117), over_default: Fixed(2.41) }],
            bar_ms: 0.040,
            goal_ms: 0.020,
        };
        let keys = [
            "bench", "case", "device", "cameras", "depth_bins", "feature", "channels", "grid", "points", "kept", "intervals",
            "max_interval", "geometry_ms", "geometry_cpu_ms", "pool_ms", "pool_bytes", "dram_gbps", "dram_floor_ms",
            "ratio_to_floor", "l2_bytes", "l2_gbps", "l2_floor_ms", "ratio_to_l2_floor", "chunk_points", "band", "cut_cells",
            "longest_item", "by_chunk", "tensor_cores", "bar_ms", "goal_ms",
        ];
        let v = parse_row(&line(&row), &keys);
        assert_eq!((v["pool_ms"].as_f64(), v["ratio_to_floor"].as_f64(), v["goal_ms"].as_f64()), (Some(0.1235), Some(61.73), Some(0.02)));
        assert!(v["by_chunk"][0]["chunk_points"].is_null(), "no cut: null");
        assert_eq!(v["by_chunk"][1]["chunk_points"], 64);
        assert!(v["by_chunk"][0]["band"].is_null(), "longest first: null");
        assert_eq!(v["by_chunk"][1]["band"], 16);
        assert_eq!(v["feature"][1], 88);
        assert_eq!((v["tensor_cores"][0]["span_points"].as_u64(), v["tensor_cores"][0]["over_default"].as_f64()), (Some(64), Some(2.41)));
        let t = TransformRow { bench: "bevpool", case: "seg_vtransform", device: "H100", lift_ms: Fixed(0.5), vtransform_ms: Fixed(1.0), note: "n" };
        parse_row(&line(&t), &["bench", "case", "device", "lift_ms", "vtransform_ms", "note"]);
    }
}
