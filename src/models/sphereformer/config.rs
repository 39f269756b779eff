//! SphereFormer's model configuration: the model YAMLs under `config/models/`, parsed with
//! serde_yaml into structs that deny unknown keys; every value is then range-checked, and every
//! error names the file and the key so the user knows what to fix.

use serde::Deserialize;
use std::path::{Path, PathBuf};

use crate::error::{value_err, ConfigError};
use crate::ops::attention::rpe::RpeGeometry;
use crate::ops::attention::sphere::SphereLevel;
use crate::ops::voxelize::cpu::{KeyPrecision, OutOfRange, VoxelOrigin};
use crate::Error;

/// Our voxelization settings that have no upstream key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoxelizationYaml {
    pub origin: VoxelOrigin,
    pub out_of_range: OutOfRange,
    pub key_precision: KeyPrecision,
    /// Voxels beyond this many (in key order) are dropped and counted: it bounds device memory.
    pub max_voxels: usize,
    /// Points beyond this many make the frame an error (the node drops it): bounds host memory.
    pub max_points: usize,
}

/// A model YAML: the upstream SphereFormer config keys (flattened from its DATA/TRAIN sections,
/// same names and units so numbers copy across) plus `voxelization`, `class_names`, `palette`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelYaml {
    pub arch: String,
    pub classes: usize,
    pub input_c: usize,
    pub m: usize,
    pub block_reps: usize,
    pub block_residual: bool,
    pub layers: Vec<usize>,
    pub quant_size_scale: f64,
    pub patch_size: usize,
    pub window_size: f64,
    pub window_size_sphere: [f64; 3],
    pub window_size_scale: [f64; 2],
    pub sphere_layers: Vec<usize>,
    pub a: f64,
    pub rel_query: bool,
    pub rel_key: bool,
    pub rel_value: bool,
    pub use_xyz: bool,
    pub xyz_norm: bool,
    pub voxel_size: [f64; 3],
    /// `[[xmin, ymin, zmin], [xmax, ymax, zmax]]` in metres, or null (nuScenes has none).
    pub pc_range: Option<[[f64; 3]; 2]>,
    pub voxelization: VoxelizationYaml,
    pub class_names: Vec<String>,
    /// RGB per class, for the BEV colour image and visualisation.
    pub palette: Vec<[u8; 3]>,
    /// How the CUDA network stores activations: `fp16` (default), `bf16` or `auto` (ours; see
    /// [`crate::device::storage::Precision`]). The CPU computes in f32 whatever it says.
    #[serde(default)]
    pub precision: crate::device::storage::Precision,
}

/// The validated model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub source: PathBuf,
    pub yaml: ModelYaml,
}

impl ModelConfig {
    pub fn load(path: &Path) -> Result<ModelConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
        ModelConfig::parse(&text, &file).map(|yaml| ModelConfig { source: path.to_path_buf(), yaml })
    }

    /// Parses and validates YAML text; `file` is only used in error messages.
    pub fn parse(text: &str, file: &str) -> Result<ModelYaml, ConfigError> {
        let yaml: ModelYaml = serde_yaml::from_str(text)
            .map_err(|e| ConfigError::Parse { file: file.to_string(), reason: e.to_string() })?;
        validate_model(&yaml, file)?;
        Ok(yaml)
    }

    /// The voxelization parameters this model's preprocessing uses.
    pub fn voxel_params(&self) -> crate::ops::voxelize::cpu::VoxelParams {
        self.yaml.voxel_params()
    }
}

impl ModelYaml {
    /// Voxelization parameters as upstream uses them: its `voxel_size` is a float32 array, so the
    /// key divides by `f64(f32(voxel_size))` even where the arithmetic is float64 (with the decimal
    /// 0.05, the clipped x = 51.2 face lands in voxel 2048 instead of upstream's 2047).
    pub fn voxel_params(&self) -> crate::ops::voxelize::cpu::VoxelParams {
        crate::ops::voxelize::cpu::VoxelParams {
            voxel_size: self.voxel_size.map(|v| v as f32 as f64),
            range: self.pc_range,
            out_of_range: self.voxelization.out_of_range,
            origin: self.voxelization.origin,
            precision: self.voxelization.key_precision,
            max_voxels: self.voxelization.max_voxels,
        }
    }
}

fn validate_model(y: &ModelYaml, file: &str) -> Result<(), ConfigError> {
    let positive = |key: &str, v: f64| {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(value_err(file, key, format!("must be a positive number, got {v}")))
        }
    };
    if y.arch != "unet_spherical_transformer" {
        return Err(value_err(file, "arch", format!("must be `unet_spherical_transformer`, got `{}`", y.arch)));
    }
    if !(1..=255).contains(&y.classes) {
        return Err(value_err(file, "classes", format!("must be in 1..=255 (class ids are uint8), got {}", y.classes)));
    }
    if !(3..=16).contains(&y.input_c) {
        return Err(value_err(file, "input_c", format!("must be in 3..=16, got {}", y.input_c)));
    }
    if y.m == 0 || y.block_reps == 0 || y.patch_size == 0 {
        return Err(value_err(file, "m/block_reps/patch_size", "must be at least 1"));
    }
    if y.layers.is_empty() || y.layers.iter().any(|&c| c == 0 || c % 2 != 0) {
        return Err(value_err(file, "layers", format!("must be a non-empty list of even channel counts, got {:?}", y.layers)));
    }
    positive("quant_size_scale", y.quant_size_scale)?;
    positive("window_size", y.window_size)?;
    positive("a", y.a)?;
    for (i, v) in y.window_size_sphere.iter().enumerate() {
        positive(&format!("window_size_sphere[{i}]"), *v)?;
    }
    for (i, v) in y.window_size_scale.iter().enumerate() {
        positive(&format!("window_size_scale[{i}]"), *v)?;
    }
    for (i, v) in y.voxel_size.iter().enumerate() {
        positive(&format!("voxel_size[{i}]"), *v)?;
    }
    if let Some(&bad) = y.sphere_layers.iter().find(|&&l| l == 0 || l > y.layers.len()) {
        return Err(value_err(file, "sphere_layers", format!("entries must be in 1..={} (levels of `layers`), got {bad}", y.layers.len())));
    }
    if let Some(r) = &y.pc_range {
        for axis in 0..3 {
            if !(r[0][axis].is_finite() && r[1][axis].is_finite() && r[0][axis] < r[1][axis]) {
                return Err(value_err(file, "pc_range", format!("axis {axis}: need finite min < max, got {} .. {}", r[0][axis], r[1][axis])));
            }
        }
    }
    let v = &y.voxelization;
    if y.pc_range.is_none() && (v.origin == VoxelOrigin::RangeMin || v.out_of_range == OutOfRange::Clip) {
        // Clip with no range is what nuScenes does: nothing to clip. RangeMin needs a range.
        if v.origin == VoxelOrigin::RangeMin {
            return Err(value_err(file, "voxelization.origin", "`range_min` needs `pc_range`"));
        }
    }
    if v.max_voxels == 0 || v.max_voxels >= i32::MAX as usize {
        return Err(value_err(file, "voxelization.max_voxels", format!("must be in 1..2^31-1, got {}", v.max_voxels)));
    }
    if v.max_points == 0 || v.max_points >= i32::MAX as usize {
        return Err(value_err(file, "voxelization.max_points", format!("must be in 1..2^31-1, got {}", v.max_points)));
    }
    if y.class_names.len() != y.classes {
        return Err(value_err(file, "class_names", format!("has {} names but `classes` is {}", y.class_names.len(), y.classes)));
    }
    if y.palette.len() != y.classes {
        return Err(value_err(file, "palette", format!("has {} colours but `classes` is {}", y.palette.len(), y.classes)));
    }
    Ok(())
}

/// The attention parameters of one U-Net level, from the model YAML.
impl SphereLevel {
    /// The parameters of U-Net level `level` (1 = full resolution) for a model config.
    pub fn from_model(m: &ModelYaml, level: usize) -> Result<Self, Error> {
        if level == 0 || level > m.layers.len() {
            return Err(Error::InvalidInput(format!(
                "this model has U-Net levels 1 to {} (one per entry of `layers`), not {level}",
                m.layers.len()
            )));
        }
        let steps = (level - 1) as i32;
        let mut cubic_window = [0f32; 3];
        let mut cubic_quant = [0f32; 3];
        let mut cw64 = [0f64; 3];
        let mut cq64 = [0f64; 3];
        for a in 0..3 {
            let patch = (m.voxel_size[a] * m.patch_size as f64) as f32;
            let w = patch * m.window_size as f32;
            let q = w / m.quant_size_scale as f32;
            let s = m.window_size_scale[0].powi(steps);
            cubic_window[a] = (w as f64 * s) as f32;
            cubic_quant[a] = (q as f64 * s) as f32;
            cw64[a] = w as f64 * s;
            cq64[a] = q as f64 * s;
        }
        let mut sw = [0f64; 3];
        let mut sq = [0f64; 3];
        for a in 0..3 {
            let s = if a < 2 { m.window_size_scale[1].powi(steps) } else { 1.0 };
            sw[a] = m.window_size_sphere[a] * s;
            sq[a] = m.window_size_sphere[a] / m.quant_size_scale * s;
        }
        Ok(Self {
            cubic_window,
            cubic_quant,
            cubic_grid_length: RpeGeometry::grid_length_of(cw64, cq64)?,
            sphere_window: sw.map(|x| x as f32),
            sphere_quant: sq.map(|x| x as f32),
            sphere_grid_length: RpeGeometry::grid_length_of(sw, sq)?,
            a: m.a as f32,
            shift: false,
        })
    }
}
