//! SphereFormer's inference preprocessing (val mode, no augmentation): points → the network's
//! inputs, on top of [`voxelize_cpu`].
//!
//! What upstream does (`util/data_util.py::data_prepare`, `util/semantic_kitti.py`,
//! `util/nuscenes.py`, `train.py` validate; facts, see `../shared/UPSTREAM_NOTES.md`):
//!
//! 1. `c` = x, y, z clipped onto `pc_range` (SemanticKITTI; float64 because the bounds are a
//!    float64 array) or as read (nuScenes; float32). `coord_norm = c - min(c)` per scan.
//! 2. Voxel key `floor(coord_norm / voxel_size)`, where `voxel_size` is a **float32** array
//!    (`np.array(voxel_size).astype(np.float32)`), so with float64 `coord_norm` the divisor is
//!    `f64(f32(voxel_size))`, not the decimal value: 102.4 / f32(0.05) = 2047.99997 → key 2047,
//!    where 102.4 / 0.05 would give 2048. We therefore hand the voxelizer the float32-rounded
//!    voxel size (see `ModelYaml::voxel_params`).
//! 3. Per voxel (every point, mean, not train mode's random pick): `feats` = mean of raw x, y, z,
//!    intensity; `xyz` = float32 mean of float32(`c`) (of `coord_norm` when `xyz_norm`);
//!    `coords` = `floor(mean_f32(float32(coord_norm)) / f32(voxel_size))` — recomputed from the
//!    float32 mean, not the key. The voxelizer gives the first two; the mean of `coord_norm` is
//!    computed here, summing in point order as torch_scatter's `scatter_mean` does on the CPU.
//! 4. `spatial_shape` = per axis `max(coord) + 1` over the batch, at least 128.
//!
//! Duplicate coordinates: the recomputed coordinate can be one above (or below) the key, so two
//! voxels of one scan can get the same coordinate (dense clouds). Upstream's output is then not
//! deterministic (spconv keeps one of the two in its hash table, run-dependent). We resolve it
//! deterministically: every voxel in a collision whose recomputed coordinate differs from its key
//! goes back to its key (keys are unique), repeated until no two voxels share a coordinate. The
//! number of voxels moved is reported in [`NetworkInputs::coord_fixups`]; on clouds without such
//! collisions the result is exactly upstream's.

use crate::ops::voxelize::cpu::KeyPrecision;
use crate::models::sphereformer::config::ModelYaml;
use crate::ops::voxelize::cpu::{sample_origin, voxel_position, voxelize_cpu, KeyFloat, VoxelParams, VoxelStats, FEATURE_CHANNELS};
use crate::{Error, Points};
use std::collections::HashMap;

#[cfg(feature = "cuda-core")]
#[path = "preprocess_cuda.rs"]
pub mod cuda;

/// Smallest spatial extent per axis upstream gives spconv (`np.clip(max + 1, 128, None)`).
pub const MIN_SPATIAL_SHAPE: i32 = 128;

/// What [`SphereFormer::forward_cpu`](crate::models::sphereformer::network::SphereFormer::forward_cpu) takes, plus the map back
/// to the points.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkInputs {
    /// `[b, x, y, z]` per voxel, unique, non-negative.
    pub coords: Vec<[i32; 4]>,
    /// `[N, 4]`: mean x, y, z, intensity.
    pub feats: Vec<f32>,
    /// Mean (clipped) position per voxel, metres.
    pub xyz: Vec<[f32; 3]>,
    pub batch: Vec<i32>,
    pub spatial_shape: [i32; 3],
    /// For every input point (samples concatenated), its voxel or -1 (NaN/Inf, dropped as out of
    /// range, beyond the grid, or in a voxel past `max_voxels`). Upstream's `inds_reconstruct`.
    pub point_to_voxel: Vec<i32>,
    pub stats: VoxelStats,
    /// Voxels whose recomputed coordinate collided and was set back to the key (see module docs).
    pub coord_fixups: usize,
}

impl NetworkInputs {
    pub fn len(&self) -> usize {
        self.coords.len()
    }
    pub fn is_empty(&self) -> bool {
        self.coords.is_empty()
    }

    /// Writes the inputs in the raw layout the PyTorch reference reads (`--inputs DIR` of
    /// `tests/parity/sphereformer_ref.py`): `coords.i32 [N,4]`, `feats.f32 [N,C]`, `xyz.f32 [N,3]`,
    /// `batch.i32 [N]` little-endian, and `inputs.json` (n, input_c, batch_size, spatial_shape).
    pub fn write_dir(&self, dir: &std::path::Path, input_c: usize, source: &str) -> Result<(), Error> {
        let io = |what: &str, e: std::io::Error| Error::InvalidInput(format!("{}: writing {what}: {e}", dir.display()));
        std::fs::create_dir_all(dir).map_err(|e| io("the directory", e))?;
        let le_i32 = |v: &mut dyn Iterator<Item = i32>| v.flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let le_f32 = |v: &mut dyn Iterator<Item = f32>| v.flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let files: [(&str, Vec<u8>); 4] = [
            ("coords.i32", le_i32(&mut self.coords.iter().flatten().copied())),
            ("feats.f32", le_f32(&mut self.feats.iter().copied())),
            ("xyz.f32", le_f32(&mut self.xyz.iter().flatten().copied())),
            ("batch.i32", le_i32(&mut self.batch.iter().copied())),
        ];
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).map_err(|e| io(name, e))?;
        }
        #[derive(serde::Serialize)]
        struct Meta<'a> {
            n: usize,
            input_c: usize,
            batch_size: i32,
            spatial_shape: [i32; 3],
            coord_fixups: usize,
            source: &'a str,
            made_by: &'static str,
        }
        let meta = Meta {
            n: self.len(),
            input_c,
            batch_size: self.batch.iter().copied().max().map_or(0, |b| b + 1),
            spatial_shape: self.spatial_shape,
            coord_fixups: self.coord_fixups,
            source,
            made_by: "sptr prepare",
        };
        let text = serde_json::to_string(&meta).map_err(|e| Error::InvalidInput(format!("{}: inputs.json: {e}", dir.display())))?;
        std::fs::write(dir.join("inputs.json"), text + "\n").map_err(|e| io("inputs.json", e))
    }
}

/// Points of a batch → network inputs, as upstream's val-mode preprocessing.
pub fn prepare_inputs(clouds: &[&Points], cfg: &ModelYaml) -> Result<NetworkInputs, Error> {
    check_input_channels(cfg)?;
    let params = cfg.voxel_params();
    let vox = voxelize_cpu(clouds, &params)?;
    let norm_mean = match params.precision {
        KeyPrecision::F32 => mean_coord_norm::<f32>(clouds, &params, &vox.point_to_voxel, vox.len())?,
        KeyPrecision::F64 => mean_coord_norm::<f64>(clouds, &params, &vox.point_to_voxel, vox.len())?,
    };
    let vs32 = params.voxel_size.map(|v| v as f32);
    let mut coords: Vec<[i32; 4]> = vox
        .coords
        .iter()
        .zip(&norm_mean)
        .map(|(key, m)| [key[0], recompute(m[0], vs32[0]), recompute(m[1], vs32[1]), recompute(m[2], vs32[2])])
        .collect();
    if let Some(c) = coords.iter().find(|c| c[1..].iter().any(|&v| v < 0)) {
        return Err(Error::InvalidInput(format!(
            "voxel coordinate {c:?} is negative: SphereFormer's input needs voxelization.origin \
             `scan_min` or `range_min` (with out_of_range `drop` or `clip`)"
        )));
    }
    let coord_fixups = resolve_duplicates(&mut coords, &vox.coords);
    let xyz = if cfg.xyz_norm { norm_mean } else { vox.xyz.clone() };
    Ok(NetworkInputs {
        spatial_shape: spatial_shape(&coords),
        batch: coords.iter().map(|c| c[0]).collect(),
        coords,
        feats: vox.feats,
        xyz,
        point_to_voxel: vox.point_to_voxel,
        stats: vox.stats,
        coord_fixups,
    })
}

/// The voxelizer's features (x, y, z, intensity) must be what the model takes.
fn check_input_channels(cfg: &ModelYaml) -> Result<(), Error> {
    if cfg.input_c != FEATURE_CHANNELS {
        return Err(Error::InvalidInput(format!(
            "model input_c {} but the voxelizer produces {FEATURE_CHANNELS} features (x, y, z, intensity)",
            cfg.input_c
        )));
    }
    Ok(())
}

/// `floor(mean / voxel_size)` in float32 (upstream: float32 tensor / float32 tensor), as i32;
/// values beyond i32 saturate and are rejected later as out of the grid.
fn recompute(mean: f32, vs: f32) -> i32 {
    (mean / vs).floor() as i32
}

/// Per voxel, the float32 mean of `float32(c - origin)` over its points, summed in point order.
fn mean_coord_norm<R: KeyFloat>(
    clouds: &[&Points],
    params: &VoxelParams,
    point_to_voxel: &[i32],
    voxels: usize,
) -> Result<Vec<[f32; 3]>, Error> {
    let mut sum = vec![[0f32; 3]; voxels];
    let mut count = vec![0u32; voxels];
    let mut g = 0usize;
    for pts in clouds {
        let o = sample_origin::<R>(pts, params)?;
        for i in 0..pts.len() {
            let v = point_to_voxel.get(g).copied().unwrap_or(-1);
            g += 1;
            if v < 0 {
                continue;
            }
            // A point with a voxel has a valid position (the voxelizer kept it).
            let Some(c) = voxel_position::<R>(pts, i, params) else { continue };
            let v = v as usize;
            for a in 0..3 {
                sum[v][a] += (c[a] - o[a]).to_f32();
            }
            count[v] += 1;
        }
    }
    Ok(sum.iter().zip(&count).map(|(s, &n)| s.map(|x| x / n.max(1) as f32)).collect())
}

/// Makes coordinates unique (module docs): in every group of voxels sharing a coordinate, those
/// whose coordinate is not their key go back to the key; repeated until unique. Returns how many
/// voxels moved. Terminates: each pass moves at least one voxel onto its key, where it stays.
fn resolve_duplicates(coords: &mut [[i32; 4]], keys: &[[i32; 4]]) -> usize {
    let mut moved = 0;
    loop {
        let mut groups: HashMap<[i32; 4], Vec<usize>> = HashMap::new();
        for (v, c) in coords.iter().enumerate() {
            groups.entry(*c).or_default().push(v);
        }
        let mut changed = false;
        let mut dups: Vec<&Vec<usize>> = groups.values().filter(|g| g.len() > 1).collect();
        // Deterministic order (HashMap iteration is not).
        dups.sort_unstable_by_key(|g| g[0]);
        let targets: Vec<usize> = dups.iter().flat_map(|g| g.iter().copied()).filter(|&v| coords[v] != keys[v]).collect();
        for v in targets {
            coords[v] = keys[v];
            moved += 1;
            changed = true;
        }
        if !changed {
            return moved;
        }
    }
}

/// Per axis `max(coord) + 1`, at least [`MIN_SPATIAL_SHAPE`].
pub fn spatial_shape(coords: &[[i32; 4]]) -> [i32; 3] {
    let mut s = [MIN_SPATIAL_SHAPE; 3];
    for c in coords {
        for a in 0..3 {
            s[a] = s[a].max(c[a + 1].saturating_add(1));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_go_back_to_keys() {
        // Voxel 0 (key x=4) recomputed to 5 collides with voxel 1 (key 5); voxel 2 (key 3) moved
        // to 4, which is free until voxel 0 returns there.
        let keys = [[0, 4, 0, 0], [0, 5, 0, 0], [0, 3, 0, 0]];
        let mut coords = [[0, 5, 0, 0], [0, 5, 0, 0], [0, 4, 0, 0]];
        assert_eq!(resolve_duplicates(&mut coords, &keys), 2);
        assert_eq!(coords, keys);
        let mut clean = [[0, 5, 0, 0], [0, 6, 0, 0]];
        assert_eq!(resolve_duplicates(&mut clean, &[[0, 4, 0, 0], [0, 6, 0, 0]]), 0);
    }

    #[test]
    fn upstream_key_divisor_is_float32() {
        // The clipped face of SemanticKITTI: 51.2 - (-51.2) over f32(0.05) is key 2047.
        let d = 51.2f64 - (-51.2f64);
        assert_eq!((d / (0.05f32 as f64)).floor(), 2047.0);
        assert_eq!((d / 0.05).floor(), 2048.0);
        // The recomputed coordinate from the float32 mean is 2048 (upstream's known quirk).
        assert_eq!(recompute(d as f32, 0.05), 2048);
    }

    #[test]
    fn spatial_shape_rule() {
        assert_eq!(spatial_shape(&[[0, 3, 200, 127]]), [128, 201, 128]);
    }
}
