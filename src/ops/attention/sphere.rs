//! SphereFormer's attention core (`SparseMultiheadSASphereConcat` between its qkv and proj
//! Linears): the first `heads / 2` heads attend within cubic windows of the voxel positions, the
//! others within spherical windows of (theta, beta, r), both with contextual RPE.
//!
//! Window and quant sizes per U-Net level follow upstream's derivation (`train.py`, `UBlock`):
//! level 1 cubic window = float32(voxel_size · patch_size) · window_size, quant = window /
//! quant_size_scale (float32); spherical window = window_size_sphere, quant = window_size_sphere /
//! quant_size_scale (float64); each deeper level multiplies the cubic window and quant by
//! `window_size_scale[0]` and the two angular axes of the spherical ones by
//! `window_size_scale[1]` (the radius stays). `a` is the same at every level.

use crate::ops::attention::cpu::{window_attention_into, ContextualRpe, HeadSlice, PositionTerm, RpeTables};
use crate::ops::attention::partition::{window_partition, Partition};
use crate::ops::attention::rpe::{cart2sphere, RpeGeometry};
use crate::Error;

/// SphereFormer's head width (`UBlock(head_dim=16)`): heads = channels / 16.
pub const SPHEREFORMER_HEAD_DIM: usize = 16;

/// Window, quant and RPE parameters of one U-Net level's attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SphereLevel {
    pub cubic_window: [f32; 3],
    pub cubic_quant: [f32; 3],
    pub cubic_grid_length: i32,
    pub sphere_window: [f32; 3],
    pub sphere_quant: [f32; 3],
    pub sphere_grid_length: i32,
    pub a: f32,
    pub shift: bool,
}


/// Both partitions of one level and the RPE geometry of each (built once per level, reused by
/// every block of the level, like upstream's `indice_dict`).
#[derive(Debug, Clone)]
pub struct SphereWindows {
    pub cubic: Partition,
    pub sphere: Partition,
    /// (theta, beta, r) of every voxel.
    pub sphere_pos: Vec<[f32; 3]>,
    pub cubic_rpe: RpeGeometry,
    pub sphere_rpe: RpeGeometry,
}

impl SphereWindows {
    pub fn build(xyz: &[[f32; 3]], batch: &[i32], level: &SphereLevel) -> Result<Self, Error> {
        let sphere_pos = xyz.iter().map(|&p| cart2sphere(p)).collect();
        Self::from_sphere_positions(xyz, sphere_pos, batch, level)
    }

    /// [`Self::build`] with the spherical coordinates given (e.g. the GPU's, so a CPU reference
    /// partitions exactly the positions the CUDA path did: atan2 may differ in its last bit).
    pub fn from_sphere_positions(
        xyz: &[[f32; 3]],
        sphere_pos: Vec<[f32; 3]>,
        batch: &[i32],
        level: &SphereLevel,
    ) -> Result<Self, Error> {
        if sphere_pos.len() != xyz.len() {
            return Err(Error::InvalidInput(format!(
                "sphere windows: {} spherical positions for {} voxels",
                sphere_pos.len(),
                xyz.len()
            )));
        }
        let cubic = window_partition(xyz, batch, level.cubic_window, level.shift)?;
        let sphere = window_partition(&sphere_pos, batch, level.sphere_window, level.shift)?;
        let cubic_rpe = RpeGeometry::new(
            xyz,
            level.cubic_window,
            level.cubic_quant,
            level.shift,
            level.cubic_grid_length,
            None,
        )?;
        let sphere_rpe = RpeGeometry::new(
            &sphere_pos,
            level.sphere_window,
            level.sphere_quant,
            level.shift,
            level.sphere_grid_length,
            Some(level.a),
        )?;
        Ok(Self { cubic, sphere, sphere_pos, cubic_rpe, sphere_rpe })
    }
}

/// The RPE tables of both branches (`relative_pos_{query,key,value}_table` and `…_sphere`).
#[derive(Debug, Clone, Copy)]
pub struct SphereTables<'a> {
    pub cubic: RpeTables<'a>,
    pub sphere: RpeTables<'a>,
}

/// Heads of the cubic branch (upstream's `num_heads // 2`).
pub fn cubic_heads(heads: usize) -> usize {
    heads / 2
}

/// The attention core on the CPU: q (already scaled), k, v `[N, heads, head_dim]` → `[N, heads,
/// head_dim]`.
pub fn sphere_attention_cpu(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    heads: usize,
    head_dim: usize,
    xyz: &[[f32; 3]],
    windows: &SphereWindows,
    tables: SphereTables,
) -> Result<Vec<f32>, Error> {
    let mut out = vec![0f32; q.len()];
    let hc = cubic_heads(heads);
    if hc > 0 {
        let slice = HeadSlice { heads, head_dim, first: 0, count: hc };
        let rpe = ContextualRpe { geometry: windows.cubic_rpe, positions: xyz, tables: tables.cubic };
        window_attention_into(q, k, v, slice, &windows.cubic, PositionTerm::Contextual(rpe), &mut out)?;
    }
    let slice = HeadSlice { heads, head_dim, first: hc, count: heads - hc };
    let rpe = ContextualRpe {
        geometry: windows.sphere_rpe,
        positions: &windows.sphere_pos,
        tables: tables.sphere,
    };
    window_attention_into(q, k, v, slice, &windows.sphere, PositionTerm::Contextual(rpe), &mut out)?;
    Ok(out)
}
