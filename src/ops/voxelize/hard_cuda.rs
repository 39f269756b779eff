//! Hard voxelization on CUDA (kernels in `kernels/models/bevfusion/lidar_encoder.cu`): the same function as
//! [`hard_voxelize_cpu`](crate::ops::voxelize::hard::hard_voxelize_cpu), exactly (coordinates, order,
//! counts, float32 means, stats).
//!
//! Steps: cell keys → stable radix sort of (key, point) → run heads → scan (run ids; the run count
//! is read back) → run starts and first points → radix sort of runs by first point (upstream's
//! voxel order) → one thread per voxel sums its first `max_num_points` points in point order.
//! Two values come back to the host: the run count and, at the end, the four drop counters.

use crate::ops::voxelize::hard::{HardVoxelParams, HardVoxelStats, HardVoxels, POINT_COLUMNS};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::{bits_for, exclusive_scan_u32, grid_1d, radix_sort_pairs};
use crate::Error;
use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use half::f16;

/// Mirror of `struct HvGrid` in lidar_encoder.cu.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct HvGridC {
    voxel: [f32; 3],
    min: [f32; 3],
    grid: [i32; 3],
    n: u32,
    fp16: u32,
    max_points: u32,
    max_voxels: u32,
    max: [f32; 3],
    filter: u32,
}
// SAFETY: plain-old-data, same layout as the C struct (seventeen 4-byte fields).
unsafe impl DeviceRepr for HvGridC {}

const THREADS: u32 = 256;

/// Voxels on the GPU. Buffers hold at least one element; `len` voxels are valid.
pub struct CudaHardVoxels {
    /// `[b, x, y, z]` per voxel, `len * 4`.
    pub coords: CudaSlice<i32>,
    /// Means, FP16, `len * channels` (columns past the 5 point columns are zero: the conv's
    /// tensor-core kernels want a multiple of 8).
    pub feats: CudaSlice<f16>,
    pub channels: usize,
    /// Means in float32, `len * POINT_COLUMNS` (what the CPU reference computes, bit for bit).
    pub feats32: CudaSlice<f32>,
    pub counts: CudaSlice<u32>,
    pub len: usize,
    pub stats: HardVoxelStats,
}

impl CudaHardVoxels {
    /// Copies coordinates, float32 means and counts back.
    pub fn to_host(&self, dev: &CudaDevice) -> Result<HardVoxels, Error> {
        let s = &dev.stream;
        let m = self.len;
        if m == 0 {
            return Ok(HardVoxels { stats: self.stats, ..Default::default() });
        }
        let coords = s.clone_dtoh(&self.coords.slice(..m * 4)).map_err(cuda_err("reading voxel coords"))?;
        let feats = s.clone_dtoh(&self.feats32.slice(..m * POINT_COLUMNS)).map_err(cuda_err("reading voxel means"))?;
        let counts = s.clone_dtoh(&self.counts.slice(..m)).map_err(cuda_err("reading voxel counts"))?;
        Ok(HardVoxels { coords: coords.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect(), feats, counts, stats: self.stats })
    }

    /// The FP16 features back as f32 (`len * channels`).
    pub fn feats16_to_host(&self, dev: &CudaDevice) -> Result<Vec<f32>, Error> {
        if self.len == 0 {
            return Ok(vec![]);
        }
        let v = dev.stream.clone_dtoh(&self.feats.slice(..self.len * self.channels)).map_err(cuda_err("reading voxel features"))?;
        Ok(v.iter().map(|h| h.to_f32()).collect())
    }
}

/// Uploads `points` and voxelizes them; `channels` (≥ 5) is the FP16 feature width.
pub fn hard_voxelize_cuda(dev: &CudaDevice, points: &[[f32; POINT_COLUMNS]], params: &HardVoxelParams, channels: usize) -> Result<CudaHardVoxels, Error> {
    let flat: &[f32] = if points.is_empty() { &[0.0; POINT_COLUMNS] } else { points.as_flattened() };
    let d = dev.stream.clone_htod(flat).map_err(cuda_err("uploading points"))?;
    hard_voxelize_cuda_device(dev, &d, points.len(), params, channels)
}

/// Voxelizes `n` points already on the GPU (`pts`: `n * 5` floats, x, y, z, intensity, time lag).
pub fn hard_voxelize_cuda_device(dev: &CudaDevice, pts: &CudaSlice<f32>, n: usize, params: &HardVoxelParams, channels: usize) -> Result<CudaHardVoxels, Error> {
    let g = params.grid()?;
    if channels < POINT_COLUMNS {
        return Err(Error::InvalidInput(format!("hard voxelization: {channels} feature channels, need at least {POINT_COLUMNS}")));
    }
    if n >= i32::MAX as usize || pts.len() < n * POINT_COLUMNS {
        return Err(Error::InvalidInput(format!("hard voxelization: {n} points with {} floats on the GPU", pts.len())));
    }
    let s = &dev.stream;
    let e = cuda_err;
    let mut stats = HardVoxelStats { points_in: n, ..Default::default() };
    let empty_out = |stats: HardVoxelStats| -> Result<CudaHardVoxels, Error> {
        Ok(CudaHardVoxels {
            coords: s.alloc_zeros(4).map_err(e("allocating voxel coords"))?,
            feats: s.alloc_zeros(channels).map_err(e("allocating voxel features"))?,
            channels,
            feats32: s.alloc_zeros(POINT_COLUMNS).map_err(e("allocating voxel means"))?,
            counts: s.alloc_zeros(1).map_err(e("allocating voxel counts"))?,
            len: 0,
            stats,
        })
    };
    if n == 0 {
        return empty_out(stats);
    }
    let gc = HvGridC {
        voxel: g.voxel,
        min: g.min,
        grid: g.grid,
        n: n as u32,
        fp16: params.round_points_to_fp16 as u32,
        max_points: params.max_num_points as u32,
        max_voxels: params.max_voxels as u32,
        max: g.max,
        filter: params.range_filter as u32,
    };
    let empty = g.cells();
    let n32 = n as u32;
    // SAFETY (allocs below): hv_keys writes every key and value.
    let mut keys = unsafe { dev.alloc_uninit::<u64>(n, "voxel keys") }?;
    let mut vals = unsafe { dev.alloc_uninit::<u32>(n, "point order") }?;
    // non-finite, out of range, over max_points, capped
    let mut counters = s.alloc_zeros::<u32>(4).map_err(e("allocating drop counters"))?;
    let f_keys = dev.function("lidar_encoder", "hv_keys")?;
    // SAFETY: matches lidar_encoder.cu; pts holds n * 5 floats (checked), keys/vals n, counters 4.
    unsafe {
        s.launch_builder(&f_keys).arg(pts).arg(&gc).arg(&empty).arg(&mut keys).arg(&mut vals).arg(&mut counters)
            .launch(grid_1d(n32, THREADS)).map_err(e("hv_keys"))?;
    }
    radix_sort_pairs(dev, &mut keys, &mut vals, n, bits_for(empty))?;
    let mut heads = s.alloc_zeros::<u32>(n).map_err(e("allocating run heads"))?;
    let mut valid = s.alloc_zeros::<u32>(1).map_err(e("allocating the valid count"))?;
    let f_heads = dev.function("lidar_encoder", "hv_heads")?;
    // SAFETY: matches the kernel; keys/heads hold n, valid 1.
    unsafe {
        s.launch_builder(&f_heads).arg(&keys).arg(&n32).arg(&empty).arg(&mut heads).arg(&mut valid)
            .launch(grid_1d(n32, THREADS)).map_err(e("hv_heads"))?;
    }
    let mut excl = s.alloc_zeros::<u32>(n).map_err(e("allocating run ids"))?;
    let runs = exclusive_scan_u32(dev, &heads, &mut excl, n)? as usize;
    let read_counters = |c: &CudaSlice<u32>| -> Result<Vec<u32>, Error> { s.clone_dtoh(c).map_err(e("reading drop counters")) };
    if runs == 0 {
        let c = read_counters(&counters)?;
        stats.non_finite = c[0] as usize;
        stats.out_of_range = c[1] as usize;
        return empty_out(stats);
    }
    // SAFETY (allocs): hv_runs writes entry r of each for every run r < runs (one head per run).
    let mut run_start = unsafe { dev.alloc_uninit::<u32>(runs, "run starts") }?;
    let mut first = unsafe { dev.alloc_uninit::<u64>(runs, "run keys") }?;
    let mut order = unsafe { dev.alloc_uninit::<u32>(runs, "voxel order") }?;
    let f_runs = dev.function("lidar_encoder", "hv_runs")?;
    // SAFETY: matches the kernel; heads/excl/vals hold n, the outputs `runs` (excl < runs).
    unsafe {
        s.launch_builder(&f_runs).arg(&heads).arg(&excl).arg(&vals).arg(&n32).arg(&mut run_start).arg(&mut first).arg(&mut order)
            .launch(grid_1d(n32, THREADS)).map_err(e("hv_runs"))?;
    }
    radix_sort_pairs(dev, &mut first, &mut order, runs, bits_for(n as u64))?;
    let m = runs.min(params.max_voxels);
    let mut out = CudaHardVoxels {
        coords: s.alloc_zeros(m * 4).map_err(e("allocating voxel coords"))?,
        feats: s.alloc_zeros(m * channels).map_err(e("allocating voxel features"))?,
        channels,
        feats32: s.alloc_zeros(m * POINT_COLUMNS).map_err(e("allocating voxel means"))?,
        counts: s.alloc_zeros(m).map_err(e("allocating voxel counts"))?,
        len: m,
        stats,
    };
    let f_vox = dev.function("lidar_encoder", "hv_voxels")?;
    let (runs32, cpad) = (runs as u32, channels as u32);
    // SAFETY: matches the kernel; one thread per run; voxel outputs hold m = min(runs, max_voxels)
    // rows and only threads v < max_voxels write them.
    unsafe {
        s.launch_builder(&f_vox)
            .arg(pts).arg(&gc).arg(&keys).arg(&vals).arg(&run_start).arg(&order).arg(&runs32).arg(&valid).arg(&cpad)
            .arg(&mut out.coords).arg(&mut out.feats32).arg(&mut out.feats).arg(&mut out.counts).arg(&mut counters)
            .launch(grid_1d(runs32, THREADS)).map_err(e("hv_voxels"))?;
    }
    let c = read_counters(&counters)?;
    out.stats = HardVoxelStats {
        points_in: n,
        non_finite: c[0] as usize,
        out_of_range: c[1] as usize,
        points_over_max: c[2] as usize,
        points_capped: c[3] as usize,
        voxels_total: runs,
        voxels_kept: m,
    };
    Ok(out)
}
