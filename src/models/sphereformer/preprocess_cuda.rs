//! SphereFormer's inference preprocessing on the GPU: the same function as
//! [`prepare_inputs`](crate::models::sphereformer::preprocess::prepare_inputs) (module docs there), without the points' voxels ever
//! reaching the host, and the way back from voxel logits to point labels.
//!
//! Steps: `voxelize_cuda` (keys, mean features, mean positions and the mean `coord_norm`, each
//! summed in point order as on the CPU) → per voxel the recomputed coordinate
//! `floor(mean_norm / f32(voxel_size))` (`net_recompute_coords`) → the duplicate rule, one pass
//! = a stable sort of the packed coordinates and a revert of every moved voxel in a collision,
//! repeated until a pass moves nothing → the spatial shape. The host reads back the bounds once
//! and one counter per duplicate pass (one pass on clouds without collisions).

use crate::models::sphereformer::preprocess::{NetworkInputs, MIN_SPATIAL_SHAPE};
use crate::models::sphereformer::config::ModelYaml;
use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::primitives::{bits_for, grid_1d, radix_sort_pairs};
use crate::ops::voxelize::cpu::{key_radices, VoxelStats, FEATURE_CHANNELS};
use crate::ops::voxelize::cuda::{voxelize_cuda, CudaVoxels};
use crate::{Error, Points};
use cudarc::driver::{CudaSlice, PushKernelArg};
use half::f16;

const THREADS: u32 = 256;
/// The duplicate rule needs at most one pass per voxel that moves (each pass moves at least one
/// voxel onto its key for good); a bound far above any real cloud guards a kernel bug.
const MAX_DUPLICATE_PASSES: usize = 64;

/// [`NetworkInputs`] on the GPU. Buffers hold at least one element; `len` voxels.
pub struct CudaNetworkInputs {
    /// `[b, x, y, z]` per voxel (`len * 4`): unique, non-negative, inside `spatial_shape`.
    pub coords: CudaSlice<i32>,
    /// Mean x, y, z, intensity, FP16 (`len * 4`).
    pub feats: CudaSlice<f16>,
    /// The model's voxel positions (`len * 3`; the mean `coord_norm` when `xyz_norm`).
    pub xyz: CudaSlice<f32>,
    /// Sample index per voxel.
    pub batch: CudaSlice<i32>,
    /// The way back from voxels to points; outlives the rest (the network consumes it).
    pub point_map: CudaPointMap,
    pub len: usize,
    pub batch_size: usize,
    pub spatial_shape: [i32; 3],
    pub stats: VoxelStats,
    pub coord_fixups: usize,
}

/// Every input point's voxel on the GPU.
pub struct CudaPointMap {
    /// Per input point its voxel or -1 (`points` entries, at least one allocated).
    pub point_to_voxel: CudaSlice<i32>,
    pub voxels: usize,
    pub points: usize,
}

impl CudaNetworkInputs {
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Everything copied back, as [`prepare_inputs`](crate::models::sphereformer::preprocess::prepare_inputs) returns it (features
    /// widened from FP16).
    pub fn to_host(&self, dev: &CudaDevice) -> Result<NetworkInputs, Error> {
        let s = &dev.stream;
        let (m, n) = (self.len, self.point_map.points);
        let rd = |what: &'static str| cuda_err(format!("reading network inputs: {what}"));
        let read_i32 = |b: &CudaSlice<i32>, len: usize, what| -> Result<Vec<i32>, Error> {
            if len == 0 { Ok(vec![]) } else { s.clone_dtoh(&b.slice(..len)).map_err(rd(what)) }
        };
        let coords = read_i32(&self.coords, m * 4, "coords")?;
        let feats: Vec<f16> = if m == 0 { vec![] } else { s.clone_dtoh(&self.feats.slice(..m * FEATURE_CHANNELS)).map_err(rd("feats"))? };
        let xyz: Vec<f32> = if m == 0 { vec![] } else { s.clone_dtoh(&self.xyz.slice(..m * 3)).map_err(rd("xyz"))? };
        Ok(NetworkInputs {
            coords: coords.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect(),
            feats: feats.iter().map(|h| h.to_f32()).collect(),
            xyz: xyz.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect(),
            batch: read_i32(&self.batch, m, "batch")?,
            spatial_shape: self.spatial_shape,
            point_to_voxel: read_i32(&self.point_map.point_to_voxel, n, "point map")?,
            stats: self.stats,
            coord_fixups: self.coord_fixups,
        })
    }
}

/// Points of a batch → network inputs on the GPU, the same as [`prepare_inputs`](crate::models::sphereformer::preprocess::prepare_inputs)
/// (features rounded to FP16, which is what the network consumes).
pub fn prepare_inputs_cuda(dev: &CudaDevice, clouds: &[&Points], cfg: &ModelYaml) -> Result<CudaNetworkInputs, Error> {
    crate::models::sphereformer::preprocess::check_input_channels(cfg)?;
    let params = cfg.voxel_params();
    let vox = voxelize_cuda(dev, clouds, &params)?;
    let s = &dev.stream;
    let e = |what: &'static str| cuda_err(what);
    let m = vox.len;
    if m == 0 {
        let coords = s.alloc_zeros::<i32>(4).map_err(e("allocating network coords"))?;
        let batch = s.alloc_zeros::<i32>(1).map_err(e("allocating batch indices"))?;
        return Ok(assemble(vox, cfg, clouds.len(), coords, batch, [MIN_SPATIAL_SHAPE; 3], 0));
    }
    // SAFETY: net_recompute_coords writes all m rows of both.
    let mut coords = unsafe { dev.alloc_uninit::<i32>(m * 4, "network coords") }?;
    // SAFETY: as above.
    let mut batch = unsafe { dev.alloc_uninit::<i32>(m, "batch indices") }?;
    let m32 = m as u32;
    let vs = params.voxel_size.map(|v| v as f32);
    let init = [i32::MAX, i32::MAX, i32::MAX, i32::MIN, i32::MIN, i32::MIN];
    let mut bounds = s.clone_htod(&[init, init].concat()).map_err(e("allocating coordinate bounds"))?;
    let f = dev.function("net_inputs", "net_recompute_coords")?;
    // SAFETY: matches net_inputs.cu; xyz_norm and coords hold m rows, bounds 12 entries.
    unsafe {
        s.launch_builder(&f)
            .arg(&vox.xyz_norm).arg(&vox.coords).arg(&m32)
            .arg(&vs[0]).arg(&vs[1]).arg(&vs[2])
            .arg(&mut coords).arg(&mut batch).arg(&mut bounds)
            .launch(grid_1d(m32, THREADS))
            .map_err(e("net_recompute_coords"))?;
    }
    let b = s.clone_dtoh(&bounds).map_err(e("reading coordinate bounds"))?;
    if let Some(a) = (0..3).find(|&a| b[a] < 0) {
        return Err(Error::InvalidInput(format!(
            "voxel coordinate {} on axis {a} is negative: SphereFormer's input needs voxelization.origin \
             `scan_min` or `range_min` (with out_of_range `drop` or `clip`)",
            b[a]
        )));
    }
    let fixups = resolve_duplicates_cuda(dev, &mut coords, &vox.coords, m, clouds.len(), [b[6], b[7], b[8], b[9], b[10], b[11]])?;
    let max = if fixups == 0 { [b[3], b[4], b[5]] } else { coord_max(dev, &coords, m)? };
    let spatial_shape = max.map(|v| v.saturating_add(1).max(MIN_SPATIAL_SHAPE));
    Ok(assemble(vox, cfg, clouds.len(), coords, batch, spatial_shape, fixups))
}

/// The inputs from the voxels and the network coordinates.
fn assemble(
    vox: CudaVoxels,
    cfg: &ModelYaml,
    batch_size: usize,
    coords: CudaSlice<i32>,
    batch: CudaSlice<i32>,
    spatial_shape: [i32; 3],
    coord_fixups: usize,
) -> CudaNetworkInputs {
    CudaNetworkInputs {
        coords,
        feats: vox.feats,
        xyz: if cfg.xyz_norm { vox.xyz_norm } else { vox.xyz },
        batch,
        point_map: CudaPointMap { point_to_voxel: vox.point_to_voxel, voxels: vox.len, points: vox.stats.points_in },
        len: vox.len,
        batch_size,
        spatial_shape,
        stats: vox.stats,
        coord_fixups,
    }
}

/// The duplicate rule of `preprocess::resolve_duplicates` on the GPU; returns the voxels moved.
fn resolve_duplicates_cuda(
    dev: &CudaDevice,
    coords: &mut CudaSlice<i32>,
    key_coords: &CudaSlice<i32>,
    m: usize,
    samples: usize,
    bounds: [i32; 6],
) -> Result<usize, Error> {
    let s = &dev.stream;
    let e = |what: &'static str| cuda_err(what);
    let (dx, dy, dz, top) = key_radices(bounds, samples)?;
    let bits = bits_for(top);
    let m32 = m as u32;
    let grid = grid_1d(m32, THREADS);
    // SAFETY: net_pack_keys writes all m keys and values and clears the counter in each pass.
    let mut keys = unsafe { dev.alloc_uninit::<u64>(m, "duplicate-pass keys") }?;
    // SAFETY: as above.
    let mut vals = unsafe { dev.alloc_uninit::<u32>(m, "duplicate-pass values") }?;
    // SAFETY: as above.
    let mut moved = unsafe { dev.alloc_uninit::<u32>(1, "duplicate counter") }?;
    let f_pack = dev.function("net_inputs", "net_pack_keys")?;
    let f_revert = dev.function("net_inputs", "net_revert_duplicates")?;
    let mut total = 0usize;
    for _ in 0..MAX_DUPLICATE_PASSES {
        // SAFETY: matches net_inputs.cu; keys/vals hold m entries, coords m rows.
        unsafe {
            s.launch_builder(&f_pack)
                .arg(&*coords).arg(&m32).arg(&bounds[0]).arg(&bounds[1]).arg(&bounds[2])
                .arg(&dx).arg(&dy).arg(&dz).arg(&mut keys).arg(&mut vals).arg(&mut moved)
                .launch(grid)
                .map_err(e("net_pack_keys"))?;
        }
        radix_sort_pairs(dev, &mut keys, &mut vals, m, bits)?;
        // SAFETY: as above.
        unsafe {
            s.launch_builder(&f_revert)
                .arg(&keys).arg(&vals).arg(&m32).arg(key_coords).arg(&mut *coords).arg(&mut moved)
                .launch(grid)
                .map_err(e("net_revert_duplicates"))?;
        }
        let n = s.clone_dtoh(&moved).map_err(e("reading duplicate counter"))?[0] as usize;
        if n == 0 {
            return Ok(total);
        }
        total += n;
    }
    Err(Error::Cuda(format!(
        "duplicate coordinates still present after {MAX_DUPLICATE_PASSES} passes ({total} voxels moved): this is a bug, please report it"
    )))
}

/// Per-axis maximum of `m` coordinates `[b, x, y, z]`.
fn coord_max(dev: &CudaDevice, coords: &CudaSlice<i32>, m: usize) -> Result<[i32; 3], Error> {
    let s = &dev.stream;
    let mut ext = s
        .clone_htod(&[i32::MAX, i32::MAX, i32::MAX, i32::MIN, i32::MIN, i32::MIN])
        .map_err(cuda_err("allocating coordinate extent"))?;
    let f = dev.function("net_inputs", "net_coord_extent")?;
    let m32 = m as u32;
    // SAFETY: matches net_inputs.cu; coords hold m rows, ext 6 entries.
    unsafe {
        s.launch_builder(&f).arg(coords).arg(&m32).arg(&mut ext).launch(grid_1d(m32, THREADS)).map_err(cuda_err("net_coord_extent"))?;
    }
    let h = s.clone_dtoh(&ext).map_err(cuda_err("reading coordinate extent"))?;
    Ok([h[3], h[4], h[5]])
}

/// Voxel logits `[len, classes]` on the GPU → every point's class (arg-max, first on ties) and
/// softmax probability, as `models::sphereformer::segmenter::argmax_softmax` + the CPU devoxelize; points without a
/// voxel get `unlabeled` and 0. Only the per-point results are copied back.
pub fn labels_to_points_cuda(
    dev: &CudaDevice,
    logits: &CudaSlice<f32>,
    map: &CudaPointMap,
    classes: usize,
    unlabeled: u32,
) -> Result<(Vec<u32>, Vec<f32>), Error> {
    let s = &dev.stream;
    let e = |what: &'static str| cuda_err(what);
    let (m, n) = (map.voxels, map.points);
    if n == 0 {
        return Ok((vec![], vec![]));
    }
    if logits.len() < m * classes {
        return Err(Error::InvalidInput(format!("{} logits for {m} voxels of {classes} classes", logits.len())));
    }
    // Not zeroed: net_argmax_softmax writes all m voxels' entries, net_devoxelize all n points'
    // (reading only voxels below m).
    // SAFETY: as said.
    let mut voxel_label = unsafe { dev.alloc_uninit::<u32>(m, "voxel labels") }?;
    // SAFETY: as above.
    let mut voxel_prob = unsafe { dev.alloc_uninit::<f32>(m, "voxel probabilities") }?;
    // SAFETY: as above.
    let mut labels = unsafe { dev.alloc_uninit::<u32>(n, "point labels") }?;
    // SAFETY: as above.
    let mut probs = unsafe { dev.alloc_uninit::<f32>(n, "point probabilities") }?;
    let f_arg = dev.function("net_inputs", "net_argmax_softmax")?;
    let f_dev = dev.function("net_inputs", "net_devoxelize")?;
    let (m32, n32, k32) = (m as u32, n as u32, classes as u32);
    // SAFETY: matches net_inputs.cu; logits hold m * classes floats, the outputs m and n entries,
    // point_to_voxel n entries, each -1 or below m.
    unsafe {
        if m > 0 {
            s.launch_builder(&f_arg)
                .arg(logits).arg(&m32).arg(&k32).arg(&mut voxel_label).arg(&mut voxel_prob)
                .launch(grid_1d(m32, THREADS))
                .map_err(e("net_argmax_softmax"))?;
        }
        s.launch_builder(&f_dev)
            .arg(&map.point_to_voxel).arg(&n32).arg(&voxel_label).arg(&voxel_prob).arg(&unlabeled)
            .arg(&mut labels).arg(&mut probs)
            .launch(grid_1d(n32, THREADS))
            .map_err(e("net_devoxelize"))?;
    }
    let labels = s.clone_dtoh(&labels).map_err(e("reading point labels"))?;
    let probs = s.clone_dtoh(&probs).map_err(e("reading point probabilities"))?;
    Ok((labels, probs))
}
