//! CUDA voxelization (kernels in `kernels/ops/voxelize.cu`), the same function as `voxelize_cpu`.
//!
//! Algorithm, one pass each: per-sample minimum (origin `scan_min`) -> integer coordinates and
//! their bounds -> mixed-radix keys over the occupied box -> stable radix sort of (key, point)
//! over just the bits the keys need -> run heads -> exclusive scan = voxel ids -> point->voxel
//! map and run starts -> one thread per voxel sums its points in input order. The points go up
//! in one copy; the host reads back two small things (counts and bounds in one buffer, the voxel
//! count), and a third (the capped point count) only when the voxel cap drops voxels.

use crate::ops::voxelize::cpu::{KeyPrecision, OutOfRange, VoxelOrigin};
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::{bits_for, exclusive_scan_u32, grid_1d, radix_sort_pairs};
use crate::ops::voxelize::cpu::{check_batch, key_radices, sample_offsets, VoxelParams, VoxelStats, Voxels, FEATURE_CHANNELS};
use crate::{Error, Points};
use cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use half::f16;

/// Mirror of `struct VoxParams` in voxelize.cu (same field order; 96 bytes, 8-aligned).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct VoxParamsC {
    voxel: [f64; 3],
    lo: [f64; 3],
    hi: [f64; 3],
    has_range: u32,
    clip: u32,
    origin: u32,
    use_f64: u32,
    batch: u32,
    n: u32,
}
// SAFETY: plain-old-data, layout identical to the C struct.
unsafe impl DeviceRepr for VoxParamsC {}

const THREADS: u32 = 256;
/// `vox_reduce`'s block size: its shared memory holds a big voxel's staged addends for each warp
/// of a block this size (`THREADS_REDUCE` in voxelize.cu; a larger block fails to launch).
const REDUCE_THREADS: u32 = 256;

/// Voxels on the GPU. Buffers hold at least one element (CUDA cannot allocate zero bytes);
/// `len` is the number of voxels.
pub struct CudaVoxels {
    /// `[b, x, y, z]` per voxel, `len * 4`.
    pub coords: CudaSlice<i32>,
    /// Mean features, FP16, `len * FEATURE_CHANNELS`.
    pub feats: CudaSlice<f16>,
    /// Mean voxel-space positions, metres, `len * 3`.
    pub xyz: CudaSlice<f32>,
    /// Mean of `float32(position - sample origin)`, metres, `len * 3`: SphereFormer's
    /// `coord_norm` mean (`models::sphereformer::preprocess`), summed in input order in float32.
    pub xyz_norm: CudaSlice<f32>,
    pub counts: CudaSlice<u32>,
    /// Per input point: its voxel or -1; `stats.points_in` entries.
    pub point_to_voxel: CudaSlice<i32>,
    pub len: usize,
    pub stats: VoxelStats,
}

impl CudaVoxels {
    /// Copies everything back (features widened to f32).
    pub fn to_host(&self, dev: &CudaDevice) -> Result<Voxels, Error> {
        let s = &dev.stream;
        let m = self.len;
        let n = self.stats.points_in;
        let rd = cuda_err;
        let coords = if m > 0 { s.clone_dtoh(&self.coords.slice(..m * 4)).map_err(rd("reading coords"))? } else { vec![] };
        let feats = if m > 0 { s.clone_dtoh(&self.feats.slice(..m * FEATURE_CHANNELS)).map_err(rd("reading feats"))? } else { vec![] };
        let xyz = if m > 0 { s.clone_dtoh(&self.xyz.slice(..m * 3)).map_err(rd("reading xyz"))? } else { vec![] };
        let counts = if m > 0 { s.clone_dtoh(&self.counts.slice(..m)).map_err(rd("reading counts"))? } else { vec![] };
        let point_to_voxel = if n > 0 { s.clone_dtoh(&self.point_to_voxel.slice(..n)).map_err(rd("reading point map"))? } else { vec![] };
        Ok(Voxels {
            coords: coords.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect(),
            feats: feats.iter().map(|h| h.to_f32()).collect(),
            xyz: xyz.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect(),
            counts,
            point_to_voxel,
            stats: self.stats,
        })
    }
}

fn params_c(p: &VoxelParams, batch: usize, n: usize) -> VoxParamsC {
    let (lo, hi) = match &p.range {
        Some(r) => (r[0], r[1]),
        None => ([0.0; 3], [0.0; 3]),
    };
    VoxParamsC {
        voxel: p.voxel_size,
        lo,
        hi,
        has_range: p.range.is_some() as u32,
        clip: (p.out_of_range == OutOfRange::Clip) as u32,
        origin: match p.origin {
            VoxelOrigin::ScanMin => 0,
            VoxelOrigin::RangeMin => 1,
            VoxelOrigin::Zero => 2,
        },
        use_f64: (p.precision == KeyPrecision::F64) as u32,
        batch: batch as u32,
        n: n as u32,
    }
}

/// The points of `batch` as the kernels read them, into `host` (4 × the points): x, y, z, then
/// intensity, each column with the samples one after another. The kernels test x, y, z for
/// finiteness; a point whose intensity is NaN/Inf must get no voxel either (as on the CPU): it
/// goes up with x = NaN, so every kernel skips it and it is counted non-finite.
fn pack_points(batch: &[&Points], host: &mut [f32]) {
    let n = host.len() / 4;
    let (xs, rest) = host.split_at_mut(n);
    let (ys, rest) = rest.split_at_mut(n);
    let (zs, is) = rest.split_at_mut(n);
    let mut at = 0;
    for p in batch {
        let m = p.x.len();
        for ((dst, &x), &i) in xs[at..at + m].iter_mut().zip(&p.x).zip(&p.intensity) {
            *dst = if i.is_finite() { x } else { f32::NAN };
        }
        ys[at..at + m].copy_from_slice(&p.y);
        zs[at..at + m].copy_from_slice(&p.z);
        is[at..at + m].copy_from_slice(&p.intensity);
        at += m;
    }
}

/// CUDA voxelization of a batch of samples; same result as `voxelize_cpu` (features in FP16).
pub fn voxelize_cuda(dev: &CudaDevice, batch: &[&Points], params: &VoxelParams) -> Result<CudaVoxels, Error> {
    let n = check_batch(batch, params)?;
    let s = &dev.stream;
    let e = |what: &'static str| cuda_err(what);
    let offsets: Vec<u32> = sample_offsets(batch).into_iter().map(|o| o as u32).collect();
    let nb = batch.len();
    let mut stats = VoxelStats { points_in: n, ..Default::default() };
    // Outputs with nothing to write (no point or no voxel): zeroed, every point unassigned.
    let alloc_out = |m: usize, n: usize, stats: VoxelStats| -> Result<CudaVoxels, Error> {
        Ok(CudaVoxels {
            coords: s.alloc_zeros(m.max(1) * 4).map_err(e("allocating voxel coords"))?,
            feats: s.alloc_zeros(m.max(1) * FEATURE_CHANNELS).map_err(e("allocating voxel features"))?,
            xyz: s.alloc_zeros(m.max(1) * 3).map_err(e("allocating voxel xyz"))?,
            xyz_norm: s.alloc_zeros(m.max(1) * 3).map_err(e("allocating voxel xyz_norm"))?,
            counts: s.alloc_zeros(m.max(1)).map_err(e("allocating voxel counts"))?,
            point_to_voxel: s.clone_htod(&vec![-1i32; n.max(1)]).map_err(e("allocating point map"))?,
            len: 0,
            stats,
        })
    };
    if n == 0 {
        return alloc_out(0, 0, stats);
    }

    // Upload the points in one copy, samples concatenated (`pack_points`).
    let points = dev.upload_f32_with(4 * n, "the points", |host| pack_points(batch, host))?;
    let (x, y, z, inten) = (points.slice(..n), points.slice(n..2 * n), points.slice(2 * n..3 * n), points.slice(3 * n..4 * n));
    let d_offsets = s.clone_htod(&offsets).map_err(e("uploading sample offsets"))?;
    let pc = params_c(params, nb, n);
    let n32 = n as u32;
    let grid = grid_1d(n32, THREADS);

    // Origins (per-sample minimum), coordinates, bounds, counts.
    let mut mins = s.clone_htod(&vec![u64::MAX; nb * 3]).map_err(e("allocating minima"))?;
    // SAFETY: vox_point_coords writes every point's x (INVALID_COORD where the point has no
    // voxel) and y, z where it has one, the only ones read.
    let mut coords = unsafe { dev.alloc_uninit::<i32>(n * 3, "point coords") }?;
    // The coordinate bounds (min x, y, z, max x, y, z), then the counters (valid, non-finite,
    // out of range, out of grid): one upload of their initial values and one read.
    let mut bounds_counters = s
        .clone_htod(&[i32::MAX, i32::MAX, i32::MAX, i32::MIN, i32::MIN, i32::MIN, 0, 0, 0, 0])
        .map_err(e("allocating bounds and counters"))?;
    let f_min = dev.function("voxelize", "vox_scan_min")?;
    let f_coords = dev.function("voxelize", "vox_point_coords")?;
    {
        let (mut bounds, mut counter_words) = bounds_counters.split_at_mut(6);
        // SAFETY: four i32 words hold four u32 counters.
        let mut counters = unsafe { counter_words.transmute_mut::<u32>(4) }.ok_or_else(|| Error::Cuda("voxelize: the counters do not fit their buffer".into()))?;
        // SAFETY: argument lists match voxelize.cu; every buffer has the length the kernel indexes.
        unsafe {
            if params.origin == VoxelOrigin::ScanMin {
                s.launch_builder(&f_min).arg(&x).arg(&y).arg(&z).arg(&d_offsets).arg(&pc).arg(&mut mins).launch(grid).map_err(e("vox_scan_min"))?;
            }
            s.launch_builder(&f_coords)
                .arg(&x).arg(&y).arg(&z).arg(&d_offsets).arg(&pc).arg(&mins)
                .arg(&mut coords).arg(&mut bounds).arg(&mut counters)
                .launch(grid)
                .map_err(e("vox_point_coords"))?;
        }
    }
    let h = s.clone_dtoh(&bounds_counters).map_err(e("reading bounds and counters"))?;
    let bounds = bounds_counters.slice(..6);
    let (h_bounds, h_counters) = h.split_at(6);
    let n_valid = h_counters[0] as u32 as usize;
    stats.non_finite = h_counters[1] as u32 as usize;
    stats.out_of_range = h_counters[2] as u32 as usize;
    stats.out_of_grid = h_counters[3] as u32 as usize;
    if n_valid == 0 {
        return alloc_out(0, n, stats);
    }
    let hb: [i32; 6] = [h_bounds[0], h_bounds[1], h_bounds[2], h_bounds[3], h_bounds[4], h_bounds[5]];
    let (dx, dy, dz, invalid_key) = key_radices(hb, nb)?;

    // Keys, sort, voxel ids.
    // Not zeroed: vox_keys writes every key and value, vox_heads every flag, the scan every
    // prefix, each for all n points before anything reads them.
    // SAFETY: as said; n > 0 here.
    let mut keys = unsafe { dev.alloc_uninit::<u64>(n, "keys") }?;
    // SAFETY: as above.
    let mut vals = unsafe { dev.alloc_uninit::<u32>(n, "permutation") }?;
    let f_keys = dev.function("voxelize", "vox_keys")?;
    let nb32 = nb as u32;
    // SAFETY: as above.
    unsafe {
        s.launch_builder(&f_keys)
            .arg(&coords).arg(&d_offsets).arg(&nb32).arg(&n32).arg(&bounds)
            .arg(&dx).arg(&dy).arg(&dz).arg(&invalid_key)
            .arg(&mut keys).arg(&mut vals)
            .launch(grid)
            .map_err(e("vox_keys"))?;
    }
    radix_sort_pairs(dev, &mut keys, &mut vals, n, bits_for(invalid_key))?;
    // SAFETY: as above.
    let mut flags = unsafe { dev.alloc_uninit::<u32>(n, "run heads") }?;
    // SAFETY: as above.
    let mut excl = unsafe { dev.alloc_uninit::<u32>(n, "voxel ids") }?;
    let f_heads = dev.function("voxelize", "vox_heads")?;
    let nv32 = n_valid as u32;
    // SAFETY: as above.
    unsafe {
        s.launch_builder(&f_heads).arg(&keys).arg(&nv32).arg(&n32).arg(&mut flags).launch(grid).map_err(e("vox_heads"))?;
    }
    let m_total = exclusive_scan_u32(dev, &flags, &mut excl, n)? as usize;
    let m = m_total.min(params.max_voxels);
    // Not zeroed: vox_assign writes every voxel's start and the end (m_total + 1 entries) and
    // every point's voxel (vals is a permutation of all n points); vox_reduce every row of the m
    // kept voxels.
    // SAFETY: as said.
    let mut voxel_start = unsafe { dev.alloc_uninit::<u32>(m_total + 1, "voxel starts") }?;
    // SAFETY: as above.
    let mut out = unsafe {
        CudaVoxels {
            coords: dev.alloc_uninit(m * 4, "voxel coords")?,
            feats: dev.alloc_uninit(m * FEATURE_CHANNELS, "voxel features")?,
            xyz: dev.alloc_uninit(m * 3, "voxel xyz")?,
            xyz_norm: dev.alloc_uninit(m * 3, "voxel xyz_norm")?,
            counts: dev.alloc_uninit(m, "voxel counts")?,
            point_to_voxel: dev.alloc_uninit(n, "point map")?,
            len: 0,
            stats,
        }
    };
    let f_assign = dev.function("voxelize", "vox_assign")?;
    let max32 = params.max_voxels as u32;
    // SAFETY: as above.
    unsafe {
        s.launch_builder(&f_assign)
            .arg(&vals).arg(&flags).arg(&excl).arg(&n32).arg(&nv32).arg(&max32)
            .arg(&mut voxel_start).arg(&mut out.point_to_voxel)
            .launch(grid)
            .map_err(e("vox_assign"))?;
    }
    // Where the voxel cap keeps every voxel (the usual case) it keeps every valid point
    // (vox_assign's end is n_valid), and nothing needs reading back.
    let kept_end = if m == m_total { n_valid } else { s.clone_dtoh(&voxel_start.slice(m..m + 1)).map_err(e("reading cap position"))?[0] as usize };
    stats.voxels_total = m_total;
    stats.voxels_kept = m;
    stats.points_capped = n_valid - kept_end;

    // Each valid sorted point's addends, then each kept voxel's sums over its run of them.
    // SAFETY: vox_addends writes every row below n_valid, the only rows vox_reduce reads.
    let mut addends = unsafe { dev.alloc_uninit::<f32>(n_valid * 10, "point addends") }?;
    let f_addends = dev.function("voxelize", "vox_addends")?;
    // SAFETY: as above; addends holds n_valid rows of 10, each written by its thread.
    unsafe {
        s.launch_builder(&f_addends)
            .arg(&x).arg(&y).arg(&z).arg(&inten).arg(&d_offsets).arg(&pc)
            .arg(&vals).arg(&nv32).arg(&mins)
            .arg(&mut addends)
            .launch(grid_1d(nv32, THREADS))
            .map_err(e("vox_addends"))?;
    }
    let f_reduce = dev.function("voxelize", "vox_reduce")?;
    let m32 = m as u32;
    // SAFETY: as above; outputs hold m rows; a kept voxel's points lie below n_valid.
    unsafe {
        s.launch_builder(&f_reduce)
            .arg(&addends).arg(&keys).arg(&voxel_start).arg(&m32).arg(&bounds)
            .arg(&dx).arg(&dy).arg(&dz)
            .arg(&mut out.coords).arg(&mut out.feats).arg(&mut out.xyz).arg(&mut out.xyz_norm).arg(&mut out.counts)
            .launch(grid_1d(m32, REDUCE_THREADS))
            .map_err(e("vox_reduce"))?;
    }
    out.len = m;
    out.stats = stats;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_pack_as_columns_with_the_samples_in_order() {
        let cloud = |x: Vec<f32>, y: Vec<f32>, z: Vec<f32>, intensity: Vec<f32>| Points { x, y, z, intensity, has_intensity: true, ..Default::default() };
        let a = cloud(vec![1.0, 2.0], vec![3.0, 4.0], vec![5.0, 6.0], vec![7.0, f32::INFINITY]);
        let b = cloud(vec![10.0], vec![11.0], vec![12.0], vec![f32::NAN]);
        let c = Points::default();
        let mut host = vec![-1.0f32; 12];
        pack_points(&[&a, &c, &b], &mut host);
        let want = [1.0, f32::NAN, f32::NAN, 3.0, 4.0, 11.0, 5.0, 6.0, 12.0, 7.0, f32::INFINITY, f32::NAN];
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        assert_eq!(bits(&host), bits(&want), "x (NaN where the intensity is not finite), y, z, intensity");
    }
}
