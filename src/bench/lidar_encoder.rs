//! `sptr bench lidar-encoder`: per iteration, host points → voxels on the GPU (upload included)
//! and voxels → BEV map, each closed by a stream synchronize and timed on the host clock; one
//! JSON line with the medians and 90th percentiles (nearest rank, ms to 0.001), the voxel counts
//! and one frame's peak device memory.

use serde::Serialize;

use crate::bench::json::{line, Fixed};
use crate::bench::percentiles::Percentiles;
use crate::device::cuda::CudaDevice;
use crate::models::bevfusion::lidar_encoder::cuda::CudaLidarEncoder;
use crate::ops::voxelize::hard::{HardVoxelStats, POINT_COLUMNS};
use crate::Error;

/// The JSON line, keys in this order.
#[derive(Serialize)]
struct LidarEncoderRow {
    bench: &'static str,
    points: usize,
    voxels: usize,
    voxels_total: usize,
    max_voxels: usize,
    iters: usize,
    voxelize_ms: Fixed<3>,
    voxelize_p90_ms: Fixed<3>,
    encoder_ms: Fixed<3>,
    encoder_p90_ms: Fixed<3>,
    total_ms: Fixed<3>,
    total_p90_ms: Fixed<3>,
    peak_device_bytes: usize,
}

/// Median and 90th percentile of `v` (ms; `NaN`, `null` in the JSON, when empty).
fn median_p90(v: &[f64]) -> (Fixed<3>, Fixed<3>) {
    let p = Percentiles::of(v);
    (Fixed(p.as_ref().map_or(f64::NAN, |p| p.p50)), Fixed(p.as_ref().map_or(f64::NAN, |p| p.p90)))
}

/// Runs the bench (module docs); the JSON line.
pub fn bench(dev: &CudaDevice, enc: &CudaLidarEncoder, points: &[[f32; POINT_COLUMNS]], warmup: usize, iters: usize) -> Result<String, Error> {
    let (mut vox, mut encode, mut total) = (Vec::new(), Vec::new(), Vec::new());
    let mut stats = HardVoxelStats::default();
    for i in 0..warmup + iters.max(1) {
        let t0 = std::time::Instant::now();
        let v = enc.voxelize(dev, points)?;
        dev.synchronize()?;
        let t1 = std::time::Instant::now();
        stats = v.stats;
        let (bev, _) = enc.forward_voxels(dev, v, false)?;
        dev.synchronize()?;
        let t2 = std::time::Instant::now();
        drop(bev);
        if i >= warmup {
            vox.push((t1 - t0).as_secs_f64() * 1e3);
            encode.push((t2 - t1).as_secs_f64() * 1e3);
            total.push((t2 - t0).as_secs_f64() * 1e3);
        }
    }
    // peak: the pool emptied, one more frame, the drop in free memory (the pool keeps what the
    // frame freed, so the drop is the frame's high-water mark; see CudaDevice::trim_pool)
    dev.trim_pool()?;
    let before = crate::device::cuda::free_device_bytes()?;
    let (bev, _) = enc.forward(dev, points)?;
    dev.synchronize()?;
    let peak = before.saturating_sub(crate::device::cuda::free_device_bytes()?);
    drop(bev);
    let (voxelize_ms, voxelize_p90_ms) = median_p90(&vox);
    let (encoder_ms, encoder_p90_ms) = median_p90(&encode);
    let (total_ms, total_p90_ms) = median_p90(&total);
    Ok(line(&LidarEncoderRow {
        bench: "lidar_encoder",
        points: points.len(),
        voxels: stats.voxels_kept,
        voxels_total: stats.voxels_total,
        max_voxels: enc.config().voxelize.max_voxels,
        iters: iters.max(1),
        voxelize_ms,
        voxelize_p90_ms,
        encoder_ms,
        encoder_p90_ms,
        total_ms,
        total_p90_ms,
        peak_device_bytes: peak,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line parses back with its keys in the order it has always had them.
    #[test]
    fn the_row_is_json_with_its_keys_in_order() {
        let (voxelize_ms, voxelize_p90_ms) = median_p90(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        let (encoder_ms, encoder_p90_ms) = median_p90(&[2.00049]);
        let (total_ms, total_p90_ms) = median_p90(&[]);
        let row = LidarEncoderRow {
            bench: "lidar_encoder",
            points: 1000,
            voxels: 900,
            voxels_total: 950,
            max_voxels: 900,
            iters: 10,
            voxelize_ms,
            voxelize_p90_ms,
            encoder_ms,
            encoder_p90_ms,
            total_ms,
            total_p90_ms,
            peak_device_bytes: 1 << 20,
        };
        let keys = [
            "bench", "points", "voxels", "voxels_total", "max_voxels", "iters", "voxelize_ms", "voxelize_p90_ms", "encoder_ms",
            "encoder_p90_ms", "total_ms", "total_p90_ms", "peak_device_bytes",
        ];
        let v = crate::bench::json::parse_row(&line(&row), &keys);
        assert_eq!((v["voxelize_ms"].as_f64(), v["voxelize_p90_ms"].as_f64()), (Some(5.0), Some(9.0)), "nearest rank");
        assert_eq!(v["encoder_ms"].as_f64(), Some(2.0));
        assert!(v["total_ms"].is_null(), "no samples: null");
    }
}
