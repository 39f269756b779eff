//! `sptr bench attention`: SphereFormer stage attention on real voxels, JSON rows.
//!
//! Cases per channel count (C = 32 / 2 heads and C = 64 / 4 heads, head_dim 16, the level's
//! SphereFormer windows):
//! - `cubic_core_rpe`: the cubic heads' attention with contextual RPE, partition and quantized
//!   positions prebuilt (what sptr's `dot_prod_with_idx_all` + softmax +
//!   `attention_step2_with_rel_pos_value` do for those heads);
//! - `sphere_core_rpe`: the same for the spherical heads (`_per_query`: without the tiled
//!   kernel; `_tiled32` / `_tiled128`: the tiled kernel from windows of 32 / 128 voxels instead of
//!   the default 64; `_keys_whole`: the tiled kernel without splitting a window's keys over
//!   several blocks, which the default does when there are too few blocks to fill the GPU);
//! - `cubic_core_plain`: the cubic heads without RPE;
//! - `stage`: the whole attention core from q, k, v, xyz and batch on the device: cart2sphere,
//!   both partitions, both RPE quantizations, both branches (the qkv and proj Linears excluded);
//! - `stage_windows_cached`: the same with the level's windows already built (every block of a
//!   level after the first).
//!
//! Memory: `extra_mb` is the stage's peak device memory: the pool is trimmed before it and keeps
//! what the stage frees, so the drop in free device memory is its high-water mark.

use crate::ops::attention::cpu::HeadSlice;
use crate::ops::attention::cuda::{sphere_attention_cuda, window_attention_cuda, window_attention_cuda_split, CudaContextual, CudaSphereTables, CudaSphereWindows, CudaTerm, QkvView, TILED_MIN_WINDOW};
use crate::ops::attention::sphere::{cubic_heads, SphereLevel, SPHEREFORMER_HEAD_DIM};
use crate::device::cuda::{cuda_err, free_device_bytes, CudaDevice};
use crate::bench::json::{fixed, fixed_opt, line, Tagged};
use crate::bench::spconv::values;
use crate::Error;
use cudarc::driver::CudaSlice;
use half::f16;
use serde::Serialize;

/// One timed case. As JSON: `{"bench":"attention", ...}`, the fields in this order, `ms` to
/// 0.0001 and `extra_mb` to 0.1.
#[derive(Debug, Clone, Serialize)]
pub struct AttnBenchRow {
    pub case: String,
    pub n: usize,
    pub channels: usize,
    pub heads: usize,
    pub windows_cubic: usize,
    pub n_max_cubic: usize,
    pub pairs_cubic: u64,
    pub windows_sphere: usize,
    pub n_max_sphere: usize,
    pub pairs_sphere: u64,
    /// Median, CUDA events.
    #[serde(serialize_with = "fixed::<4, _>")]
    pub ms: f64,
    /// Extra device memory of the case (stage cases only).
    #[serde(serialize_with = "fixed_opt::<1, _>")]
    pub extra_mb: Option<f64>,
}

impl AttnBenchRow {
    pub fn json(&self) -> String {
        line(&Tagged { bench: "attention", row: self })
    }
}

/// Extra device memory of one whole-stage call (windows built, both branches run): the memory
/// pool is trimmed first and keeps what the call frees, so the drop in free device memory is the
/// call's peak (windows, quantized and spherical positions, the output, the radix sort's scratch).
#[allow(clippy::too_many_arguments)]
pub fn stage_extra_bytes(
    dev: &CudaDevice,
    qkv: QkvView,
    heads: usize,
    head_dim: usize,
    xyz: &CudaSlice<f32>,
    batch: &CudaSlice<i32>,
    n: usize,
    level: &SphereLevel,
    tables: &CudaSphereTables,
) -> Result<usize, Error> {
    dev.trim_pool()?;
    let before = free_device_bytes()?;
    {
        let windows = CudaSphereWindows::build(dev, xyz, batch, n, level)?;
        let mut out = dev.stream.alloc_zeros::<f16>((n * heads * head_dim).max(1)).map_err(cuda_err("allocating output"))?;
        sphere_attention_cuda(dev, qkv, heads, head_dim, xyz, &windows, tables, &mut out)?;
        dev.synchronize()?;
    }
    Ok(before.saturating_sub(free_device_bytes()?))
}

/// Runs the workload on voxel positions `xyz` (metres) and batch indices.
pub fn bench_attention(
    dev: &CudaDevice,
    name: &str,
    xyz: &[[f32; 3]],
    batch: &[i32],
    level: &SphereLevel,
    iters: usize,
) -> Result<Vec<AttnBenchRow>, Error> {
    let n = xyz.len();
    let s = &dev.stream;
    let flat: Vec<f32> = xyz.iter().flatten().copied().collect();
    let xyz_d = s.clone_htod(&flat).map_err(cuda_err("uploading positions"))?;
    let batch_d = s.clone_htod(batch).map_err(cuda_err("uploading batch"))?;
    let windows = CudaSphereWindows::build(dev, &xyz_d, &batch_d, n, level)?;
    let cubic = windows.cubic.to_host(dev)?;
    let sphere = windows.sphere.to_host(dev)?;
    let d = SPHEREFORMER_HEAD_DIM;
    let mut rows = Vec::new();
    for channels in [32usize, 64] {
        let heads = channels / d;
        let (hc, hs) = (cubic_heads(heads), heads - cubic_heads(heads));
        let row = |case: &str, ms: f64, extra_mb: Option<f64>| AttnBenchRow {
            case: format!("{name}/{case}"),
            n,
            channels,
            heads,
            windows_cubic: cubic.windows(),
            n_max_cubic: cubic.n_max(),
            pairs_cubic: cubic.pair_count(),
            windows_sphere: sphere.windows(),
            n_max_sphere: sphere.n_max(),
            pairs_sphere: sphere.pair_count(),
            ms,
            extra_mb,
        };
        let up = |v: Vec<f32>| s.clone_htod(&v.into_iter().map(f16::from_f32).collect::<Vec<_>>()).map_err(cuda_err("uploading q/k/v"));
        let q = up(values(n * channels, 0.25, 1))?;
        let k = up(values(n * channels, 1.0, 2))?;
        let v = up(values(n * channels, 1.0, 3))?;
        let qkv = QkvView { q: &q, k: &k, v: &v, ld: channels };
        let table = |rows: usize, h: usize, seed| values(rows * 3 * h * d, 0.03, seed);
        let (rc, rs) = (windows.cubic_rpe.table_rows(), windows.sphere_rpe.table_rows());
        let (tc, ts) = ([table(rc, hc, 4), table(rc, hc, 5), table(rc, hc, 6)], [table(rs, hs, 7), table(rs, hs, 8), table(rs, hs, 9)]);
        let tables = CudaSphereTables::upload(dev, [&tc[0], &tc[1], &tc[2]], [&ts[0], &ts[1], &ts[2]])?;
        let mut out = s.alloc_zeros::<f16>(n * channels).map_err(cuda_err("allocating output"))?;

        let cubic_term = CudaTerm::Contextual(CudaContextual {
            geometry: windows.cubic_rpe,
            quant: &windows.cubic_quant,
            positions: &xyz_d,
            tables: [&tables.cubic[0], &tables.cubic[1], &tables.cubic[2]],
        });
        let cubic_slice = HeadSlice { heads, head_dim: d, first: 0, count: hc };
        let ms = dev.time_median_ms(3, iters, || window_attention_cuda(dev, qkv, cubic_slice, &windows.cubic, cubic_term, &mut out, channels))?;
        rows.push(row("cubic_core_rpe", ms, None));
        let ms = dev.time_median_ms(3, iters, || window_attention_cuda(dev, qkv, cubic_slice, &windows.cubic, CudaTerm::None, &mut out, channels))?;
        rows.push(row("cubic_core_plain", ms, None));
        let sphere_term = CudaTerm::Contextual(CudaContextual {
            geometry: windows.sphere_rpe,
            quant: &windows.sphere_quant,
            positions: &windows.sphere_pos,
            tables: [&tables.sphere[0], &tables.sphere[1], &tables.sphere[2]],
        });
        let sphere_slice = HeadSlice { heads, head_dim: d, first: hc, count: hs };
        let ms = dev.time_median_ms(3, iters, || window_attention_cuda(dev, qkv, sphere_slice, &windows.sphere, sphere_term, &mut out, channels))?;
        rows.push(row("sphere_core_rpe", ms, None));
        // the two kernels' split point: per-query kernel only, and the tiled one from other sizes
        // and the tiled kernel with every window's keys in one block (no key split)
        let variants = [
            ("sphere_core_rpe_per_query", usize::MAX, None),
            ("sphere_core_rpe_tiled32", 32, None),
            ("sphere_core_rpe_tiled128", 128, None),
            ("sphere_core_rpe_keys_whole", TILED_MIN_WINDOW, Some(1)),
        ];
        for (case, tiled_min, key_splits) in variants {
            let ms = dev.time_median_ms(3, iters, || {
                window_attention_cuda_split(dev, qkv, sphere_slice, &windows.sphere, sphere_term, &mut out, channels, tiled_min, key_splits)
            })?;
            rows.push(row(case, ms, None));
        }
        let ms = dev.time_median_ms(3, iters, || sphere_attention_cuda(dev, qkv, heads, d, &xyz_d, &windows, &tables, &mut out))?;
        rows.push(row("stage_windows_cached", ms, None));
        let ms = dev.time_median_ms(3, iters, || {
            let w = CudaSphereWindows::build(dev, &xyz_d, &batch_d, n, level)?;
            sphere_attention_cuda(dev, qkv, heads, d, &xyz_d, &w, &tables, &mut out)
        })?;
        let extra = stage_extra_bytes(dev, qkv, heads, d, &xyz_d, &batch_d, n, level, &tables)?;
        rows.push(row("stage", ms, Some(extra as f64 / 1e6)));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row parses back with its keys in the order the line has always had them.
    #[test]
    fn the_row_is_json_with_its_keys_in_order() {
        let row = AttnBenchRow {
            case: "nuscenes/level1/stage".into(),
            n: 1000,
            channels: 32,
            heads: 2,
            windows_cubic: 10,
            n_max_cubic: 64,
            pairs_cubic: 40000,
            windows_sphere: 12,
            n_max_sphere: 80,
            pairs_sphere: 50000,
            ms: 0.123456,
            extra_mb: Some(3.26),
        };
        let keys = [
            "bench", "case", "n", "channels", "heads", "windows_cubic", "n_max_cubic", "pairs_cubic", "windows_sphere",
            "n_max_sphere", "pairs_sphere", "ms", "extra_mb",
        ];
        let v = crate::bench::json::parse_row(&row.json(), &keys);
        assert_eq!((v["bench"].as_str(), v["ms"].as_f64(), v["extra_mb"].as_f64()), (Some("attention"), Some(0.1235), Some(3.3)));
        let v: serde_json::Value = serde_json::from_str(&AttnBenchRow { extra_mb: None, ..row }.json()).unwrap();
        assert!(v["extra_mb"].is_null());
    }
}
