//! BEVFusion's LiDAR branch (mit-han-lab/bevfusion at db75150, `model.encoders.lidar`): hard
//! voxelization ([`crate::ops::voxelize::hard`]), `SparseEncoder`
//! (`mmdet3d/models/backbones/sparse_encoder.py`) and its flattening to a BEV map, on the CPU.
//! The CUDA twin is [`cuda::CudaLidarEncoder`].
//!
//! Module tree (upstream names under `encoders.lidar.backbone.`; every conv without bias,
//! post-activation conv → BN1d(eps 1e-3, `norm_cfg`'s default) → ReLU):
//!
//! ```text
//! conv_input.{0,1}                       SubMConv3d(in, 16, 3) + BN + ReLU       map subm1
//! encoder_layers.encoder_layer{i+1}.{j}  per entry j of encoder_channels[i]:
//!     SparseBasicBlock (conv1, bn1, conv2, bn2): relu(bn2(conv2(relu(bn1(conv1 x)))) + x),
//!         both SubMConv3d 3 (padding 1) on the stage's sites;
//!     the last entry of every stage but the last: SparseConv3d(k 3, stride 2,
//!         padding encoder_paddings[i][j]) + BN + ReLU  (`.{j}.0`, `.{j}.1`)
//! conv_out.{0,1}                         SparseConv3d(k (1, 1, 3), stride (1, 1, 2), pad 0) + BN + ReLU
//! ```
//!
//! Axes: the sparse tensor's spatial axes are (x, y, z) with `sparse_shape [1024, 1024, 41]`, so
//! paddings `[1, 1, 0]` and `conv_out`'s anisotropic kernel apply to (x, y, z). Output shapes for
//! the nuScenes config: 1024² × 41 → 512² × 21 → 256² × 11 → 128² × 5 → (conv_out) 128² × 2.
//! Then `out.dense()` is `(N, C, X, Y, Z)`, `permute(0, 1, 4, 2, 3)` + `view(N, C·Z, X, Y)`: BEV
//! channel `c · Z + z`, H = LiDAR x cell, W = y cell — returned NHWC as `[1, X, Y, C·Z]`.
//!
//! Weights: the released checkpoints were trained with the spconv 1.x that bevfusion vendors in
//! `mmdet3d/ops/spconv` (`SparseConvolution.weight = Parameter(torch.Tensor(*kernel_size,
//! in_channels, out_channels))`), so conv weights are `[k0, k1, k2, Cin, Cout]` (`Rsck` here),
//! not spconv 2.x's `[Cout, k0, k1, k2, Cin]`. BatchNorm is folded into the conv weight and a bias
//! at load (`w · γ/√(σ²+ε)`, `β − μ · γ/√(σ²+ε)`), so each layer is `relu(conv(x) + b [+ x])`.

use crate::nn::random::{NamedTensors, SplitMix};
use crate::nn::weights::{bad_weights, SpecRecorder, TensorSource as Source, WeightSpec, Weights};
use crate::nn::ModelError;
use crate::error::ConfigError;
use crate::ops::dense::FeatureMap;
use crate::ops::sparse_conv::cpu::{conv_with, fold_batch_norm, ConvOptions, WeightLayout};
use crate::ops::voxelize::hard::{hard_voxelize_cpu, HardVoxelParams, HardVoxelStats, HardVoxels, POINT_COLUMNS};
use crate::ops::sparse_conv::kernel_map::{conv_output_shape, strided, submanifold, ConvGeometry, KernelMap};
use crate::ops::sparse_conv::tensor::SparseTensor;
use crate::Error;
use serde::Deserialize;
use std::path::Path;

#[cfg(feature = "cuda-core")]
#[path = "lidar_encoder_cuda.rs"]
pub mod cuda;

/// The `state_dict` prefix of the backbone inside a BEVFusion checkpoint.
pub const PREFIX: &str = "encoders.lidar.backbone.";

/// SparseEncoder's BatchNorm1d epsilon (`norm_cfg=dict(type="BN1d", eps=1e-3, momentum=0.01)`).
pub const BN_EPS: f32 = 1e-3;

/// `encoder_paddings` entries: one number for every axis or `[x, y, z]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Padding {
    All(i32),
    Axes([i32; 3]),
}

impl Padding {
    pub fn axes(self) -> [i32; 3] {
        match self {
            Padding::All(p) => [p; 3],
            Padding::Axes(p) => p,
        }
    }
}

/// `model.encoders.lidar.voxelize` (upstream `Voxelization` keys) plus sptr's FP16 option.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoxelizeYaml {
    pub max_num_points: usize,
    pub point_cloud_range: [f64; 6],
    pub voxel_size: [f64; 3],
    /// `[train, test]` or one number for both.
    pub max_voxels: MaxVoxels,
    /// sptr's: round the points through FP16 first, as upstream's FP16 evaluation does
    /// (see `ops::voxelize::hard`). Default false.
    #[serde(default)]
    pub round_points_to_fp16: bool,
    /// sptr's: apply upstream's test-pipeline `PointsRangeFilter` (strict `min < p < max` with this
    /// range) first. Default true: the model then sees the points upstream's model sees.
    #[serde(default = "yes")]
    pub range_filter: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum MaxVoxels {
    One(usize),
    TrainTest([usize; 2]),
}

/// `model.encoders.lidar.backbone` (upstream `SparseEncoder` keys).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SparseEncoderYaml {
    #[serde(rename = "type")]
    pub kind: String,
    pub in_channels: usize,
    /// `[x, y, z]` extent of the input sparse tensor.
    pub sparse_shape: [i32; 3],
    #[serde(default = "default_base")]
    pub base_channels: usize,
    #[serde(default = "default_out")]
    pub output_channels: usize,
    #[serde(default = "default_order")]
    pub order: Vec<String>,
    pub encoder_channels: Vec<Vec<usize>>,
    pub encoder_paddings: Vec<Vec<Padding>>,
    #[serde(default = "default_block")]
    pub block_type: String,
}

fn default_base() -> usize {
    16
}
fn default_out() -> usize {
    128
}
fn default_order() -> Vec<String> {
    vec!["conv".into(), "norm".into(), "act".into()]
}
fn default_block() -> String {
    "conv_module".into()
}

/// The LiDAR branch's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct LidarEncoderConfig {
    pub voxelize: HardVoxelParams,
    pub backbone: SparseEncoderYaml,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LidarYaml {
    voxelize: VoxelizeYaml,
    backbone: SparseEncoderYaml,
    /// `BEVFusion.voxelize_reduce` (default true: mean of the points); false is not supported.
    #[serde(default = "yes")]
    voxelize_reduce: bool,
}

fn yes() -> bool {
    true
}

fn value_err(file: &str, key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: file.to_string(), key: key.to_string(), reason: reason.into() }
}

impl LidarEncoderConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
        Self::parse(&text, &file)
    }

    /// Reads `model.encoders.lidar` from a model YAML's text and validates it.
    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        let doc: serde_yaml::Value = serde_yaml::from_str(text).map_err(|e| ConfigError::Parse { file: file.into(), reason: e.to_string() })?;
        let node = doc
            .get("model")
            .and_then(|m| m.get("encoders"))
            .and_then(|e| e.get("lidar"))
            .filter(|l| !l.is_null())
            .ok_or_else(|| value_err(file, "model.encoders.lidar", "is missing (a camera-only model has no LiDAR branch)"))?;
        let y: LidarYaml = serde_yaml::from_value(node.clone())
            .map_err(|e| ConfigError::Parse { file: file.into(), reason: format!("model.encoders.lidar: {e}") })?;
        if !y.voxelize_reduce {
            return Err(value_err(file, "model.encoders.lidar.voxelize_reduce", "false (the padded point tensor as features) is not supported"));
        }
        let v = y.voxelize;
        let voxelize = HardVoxelParams {
            voxel_size: v.voxel_size,
            point_cloud_range: v.point_cloud_range,
            max_num_points: v.max_num_points,
            max_voxels: match v.max_voxels {
                MaxVoxels::One(n) => n,
                MaxVoxels::TrainTest([_, test]) => test,
            },
            round_points_to_fp16: v.round_points_to_fp16,
            range_filter: v.range_filter,
        };
        let cfg = Self { voxelize, backbone: y.backbone };
        cfg.validate().map_err(|(key, reason)| value_err(file, &format!("model.encoders.lidar.{key}"), reason))?;
        Ok(cfg)
    }

    /// Checks what upstream asserts or would fail on, and that the voxel grid fits the sparse
    /// shape. Returns the offending key and why.
    pub fn validate(&self) -> Result<(), (String, String)> {
        let b = &self.backbone;
        let err = |k: &str, r: String| Err((k.to_string(), r));
        let grid = match self.voxelize.grid() {
            Ok(g) => g,
            Err(e) => return err("voxelize", e.to_string()),
        };
        if b.kind != "SparseEncoder" {
            return err("backbone.type", format!("must be `SparseEncoder`, got `{}`", b.kind));
        }
        if b.in_channels != POINT_COLUMNS {
            return err("backbone.in_channels", format!("must be {POINT_COLUMNS} (x, y, z, intensity, time lag), got {}", b.in_channels));
        }
        if b.block_type != "basicblock" {
            return err("backbone.block_type", format!("only `basicblock` (the BEVFusion configs') is supported, got `{}`", b.block_type));
        }
        if b.order != ["conv", "norm", "act"] {
            return err("backbone.order", format!("only [conv, norm, act] is supported, got {:?}", b.order));
        }
        if b.base_channels == 0 || b.output_channels == 0 {
            return err("backbone.base_channels/output_channels", "must be positive".into());
        }
        if b.encoder_channels.is_empty() || b.encoder_channels.iter().any(|s| s.is_empty() || s.contains(&0)) {
            return err("backbone.encoder_channels", "needs at least one stage, each with positive channel counts".into());
        }
        if b.encoder_paddings.len() != b.encoder_channels.len()
            || b.encoder_paddings.iter().zip(&b.encoder_channels).any(|(p, c)| p.len() < c.len())
        {
            return err("backbone.encoder_paddings", "needs an entry for every entry of encoder_channels".into());
        }
        for (a, (&g, &s)) in grid.grid.iter().zip(&b.sparse_shape).enumerate() {
            if g > s {
                return err("backbone.sparse_shape", format!("axis {a}: {s} is smaller than the voxel grid's {g} cells"));
            }
        }
        // the blocks' residual adds need equal channels; upstream's SparseBasicBlock(C, C) takes
        // the previous layer's output, so the previous width must equal C
        let mut c = b.base_channels;
        for (i, stage) in b.encoder_channels.iter().enumerate() {
            for (j, &out) in stage.iter().enumerate() {
                if is_down(b, i, j) {
                    c = out;
                } else if out != c {
                    return err(
                        &format!("backbone.encoder_channels[{i}][{j}]"),
                        format!("a basic block of {out} channels follows a layer of {c} (upstream's residual add would fail)"),
                    );
                }
            }
        }
        match self.shapes() {
            Ok(_) => Ok(()),
            Err(e) => err("backbone", e.to_string()),
        }
    }

    /// Spatial shapes after conv_input / each stage / conv_out.
    pub fn shapes(&self) -> Result<Vec<[i32; 3]>, Error> {
        let b = &self.backbone;
        let mut s = b.sparse_shape;
        let mut v = vec![s];
        for (i, stage) in b.encoder_channels.iter().enumerate() {
            for j in 0..stage.len() {
                if is_down(b, i, j) {
                    s = conv_output_shape(s, &down_geometry(b, i, j));
                }
            }
            v.push(s);
        }
        s = conv_output_shape(s, &CONV_OUT);
        v.push(s);
        if s.iter().any(|&n| n < 1) {
            return Err(Error::InvalidInput(format!("sparse_shape {:?} shrinks to an empty output {s:?}", b.sparse_shape)));
        }
        Ok(v)
    }

    /// BEV map size `[X, Y, C · Z]`.
    pub fn bev_shape(&self) -> Result<[usize; 3], Error> {
        let s = *self.shapes()?.last().ok_or_else(|| Error::InvalidInput("no shapes".into()))?;
        Ok([s[0] as usize, s[1] as usize, self.backbone.output_channels * s[2] as usize])
    }
}

/// `conv_out`: kernel (1, 1, 3), stride (1, 1, 2), padding 0.
pub const CONV_OUT: ConvGeometry = ConvGeometry { kernel: [1, 1, 3], stride: [1, 1, 2], padding: [0, 0, 0], dilation: [1, 1, 1] };

/// Whether layer `j` of stage `i` is the strided conv (`basicblock`: the last of every stage but
/// the last).
pub fn is_down(b: &SparseEncoderYaml, i: usize, j: usize) -> bool {
    j + 1 == b.encoder_channels[i].len() && i + 1 != b.encoder_channels.len()
}

/// The strided conv of stage `i`, layer `j`: kernel 3, stride 2, `encoder_paddings[i][j]`.
pub fn down_geometry(b: &SparseEncoderYaml, i: usize, j: usize) -> ConvGeometry {
    ConvGeometry { kernel: [3; 3], stride: [2; 3], padding: b.encoder_paddings[i][j].axes(), dilation: [1; 3] }
}

/// A conv with its BatchNorm folded in: weight `Rsck` `[kv, Cin, Cout]`, bias `[Cout]`.
#[derive(Debug, Clone)]
pub struct FoldedConv {
    pub kernel: [i32; 3],
    pub cin: usize,
    pub cout: usize,
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

impl FoldedConv {
    pub fn kv(&self) -> usize {
        self.kernel.iter().map(|&k| k as usize).product()
    }
}

/// One layer of the encoder.
#[derive(Debug, Clone)]
pub enum EncoderLayer {
    /// `SparseBasicBlock` on the stage's submanifold map.
    Block { conv1: FoldedConv, conv2: FoldedConv },
    /// Strided `SparseConv3d` + BN + ReLU.
    Down { geometry: ConvGeometry, conv: FoldedConv },
}

/// The LiDAR encoder with folded weights.
#[derive(Debug, Clone)]
pub struct LidarEncoder {
    pub cfg: LidarEncoderConfig,
    pub conv_input: FoldedConv,
    /// `stages[i][j]` = `encoder_layer{i+1}.{j}`.
    pub stages: Vec<Vec<EncoderLayer>>,
    pub conv_out: FoldedConv,
}

/// Loads `{prefix}.weight` `[k0, k1, k2, Cin, Cout]` and the BN `{bn}.*`, folds them.
fn folded(src: &mut dyn Source, conv: &str, bn: &str, kernel: [i32; 3], cin: usize, cout: usize) -> Result<FoldedConv, ModelError> {
    let k = kernel.map(|v| v as usize);
    let name = format!("{conv}.weight");
    let mut w = src.tensor(&name, &[k[0], k[1], k[2], cin, cout])?;
    let g = src.tensor(&format!("{bn}.weight"), &[cout])?;
    let b = src.tensor(&format!("{bn}.bias"), &[cout])?;
    let m = src.tensor(&format!("{bn}.running_mean"), &[cout])?;
    let v = src.tensor(&format!("{bn}.running_var"), &[cout])?;
    let (scale, shift) = fold_batch_norm(&g, &b, &m, &v, BN_EPS).map_err(|e| bad_weights(bn, e))?;
    for row in w.chunks_exact_mut(cout) {
        for (x, s) in row.iter_mut().zip(&scale) {
            *x *= s;
        }
    }
    if let Some((i, _)) = w.iter().chain(&shift).enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(ModelError::Config(format!("{conv} with {bn} folded: value {i} is not finite (a BatchNorm variance below -eps?)")));
    }
    Ok(FoldedConv { kernel, cin, cout, weight: w, bias: shift })
}

fn build(cfg: &LidarEncoderConfig, src: &mut dyn Source) -> Result<LidarEncoder, ModelError> {
    let b = &cfg.backbone;
    let p = |s: &str| format!("{PREFIX}{s}");
    let conv_input = folded(src, &p("conv_input.0"), &p("conv_input.1"), [3; 3], b.in_channels, b.base_channels)?;
    let mut c = b.base_channels;
    let mut stages = Vec::with_capacity(b.encoder_channels.len());
    for (i, chans) in b.encoder_channels.iter().enumerate() {
        let mut layers = Vec::with_capacity(chans.len());
        for (j, &out) in chans.iter().enumerate() {
            let l = p(&format!("encoder_layers.encoder_layer{}.{j}", i + 1));
            if is_down(b, i, j) {
                let conv = folded(src, &format!("{l}.0"), &format!("{l}.1"), [3; 3], c, out)?;
                layers.push(EncoderLayer::Down { geometry: down_geometry(b, i, j), conv });
            } else {
                let conv1 = folded(src, &format!("{l}.conv1"), &format!("{l}.bn1"), [3; 3], c, out)?;
                let conv2 = folded(src, &format!("{l}.conv2"), &format!("{l}.bn2"), [3; 3], out, out)?;
                layers.push(EncoderLayer::Block { conv1, conv2 });
            }
            c = out;
        }
        stages.push(layers);
    }
    let conv_out = folded(src, &p("conv_out.0"), &p("conv_out.1"), CONV_OUT.kernel, c, b.output_channels)?;
    Ok(LidarEncoder { cfg: cfg.clone(), conv_input, stages, conv_out })
}

/// Every tensor of the backbone's `state_dict` (`num_batches_tracked` excepted), in order.
pub fn weight_specs(cfg: &LidarEncoderConfig) -> Result<Vec<WeightSpec>, ModelError> {
    let mut rec = SpecRecorder::default();
    build(cfg, &mut rec)?;
    Ok(rec.0)
}

/// Deterministic random weights with upstream names (splitmix64 in `state_dict` order): conv
/// weights uniform ±√(3 / (kv · Cin)) (unit output variance), BN weight 1 ± 0.1, bias ± 0.1,
/// running_mean ± 0.1, running_var in [0.5, 1.5] (not the identity, so a wrong fold shows).
pub fn random_tensors(cfg: &LidarEncoderConfig, seed: u64) -> Result<NamedTensors, ModelError> {
    let specs = weight_specs(cfg)?;
    let mut rng = SplitMix(seed);
    Ok(specs
        .into_iter()
        .map(|s| {
            let (lo, hi) = if s.shape.len() == 5 {
                let b = (3.0 / (s.shape[0] * s.shape[1] * s.shape[2] * s.shape[3]).max(1) as f64).sqrt();
                (-b, b)
            } else if s.name.ends_with("running_var") {
                (0.5, 1.5)
            } else if s.name.ends_with(".weight") {
                (0.9, 1.1)
            } else {
                (-0.1, 0.1)
            };
            let data = (0..s.numel()).map(|_| rng.uniform(lo, hi)).collect();
            (s.name, s.shape, data)
        })
        .collect())
}

/// [`random_tensors`] as a [`Weights`] store.
pub fn random_weights(cfg: &LidarEncoderConfig, seed: u64) -> Result<Weights, ModelError> {
    Weights::from_tensors(&format!("random LiDAR encoder weights (seed {seed})"), random_tensors(cfg, seed)?)
}

/// One stage's sparse output (for per-stage parity checks).
#[derive(Debug, Clone)]
pub struct StageOutput {
    pub name: String,
    pub tensor: SparseTensor,
}

fn relu_in_place(v: &mut [f32]) {
    for x in v {
        *x = x.max(0.0);
    }
}

/// `relu(conv(x) + b [+ residual])` at the map's outputs.
fn apply(x: &SparseTensor, map: &KernelMap, c: &FoldedConv, residual: Option<&[f32]>) -> Result<SparseTensor, Error> {
    let opts = ConvOptions { bias: Some(&c.bias), pre: None, residual };
    let mut f = conv_with(x, map, &c.weight, WeightLayout::Rsck, c.cin, c.cout, &opts)?;
    relu_in_place(&mut f);
    map.output_tensor(f, c.cout)
}

/// `out.dense()` + permute + view: `[1, X, Y, C · Z]` with channel `c · Z + z`.
pub fn to_bev(t: &SparseTensor) -> Result<FeatureMap, Error> {
    let s = t.spatial_shape();
    let (x, y, z) = (s[0] as usize, s[1] as usize, s[2] as usize);
    let c = t.channels();
    let mut map = FeatureMap::zeros(1, x, y, c * z)?;
    let o = t.origin();
    for (row, q) in t.coords().iter().enumerate() {
        if q[0] != 0 {
            return Err(Error::InvalidInput(format!("LiDAR BEV: batch index {} (one cloud a call)", q[0])));
        }
        let (qx, qy, qz) = ((q[1] - o[0]) as usize, (q[2] - o[1]) as usize, (q[3] - o[2]) as usize);
        let base = (qx * y + qy) * c * z;
        for (ch, &v) in t.feats()[row * c..(row + 1) * c].iter().enumerate() {
            map.data[base + ch * z + qz] = v;
        }
    }
    Ok(map)
}

/// The error for a cloud that gives no voxel.
pub(crate) fn no_voxels(stats: &HardVoxelStats) -> Error {
    Error::InvalidInput(format!(
        "LiDAR encoder: no voxel from {} points ({} with NaN/Inf, {} outside point_cloud_range); \
         check the cloud and its frame",
        stats.points_in, stats.non_finite, stats.out_of_range
    ))
}

impl LidarEncoder {
    /// Builds the encoder from weights with upstream names (`encoders.lidar.backbone.*`; other
    /// model parts in the same file are left to their loaders: only this prefix is checked).
    pub fn load(cfg: &LidarEncoderConfig, weights: &Weights) -> Result<Self, ModelError> {
        let specs = weight_specs(cfg)?;
        // check only our prefix: a whole BEVFusion checkpoint holds the other modules too
        let mut mine = weights.select(|n| n.starts_with(PREFIX));
        mine.check(&specs)?;
        build(cfg, &mut mine)
    }

    /// Hard voxelization with this encoder's parameters.
    pub fn voxelize(&self, points: &[[f32; POINT_COLUMNS]]) -> Result<HardVoxels, Error> {
        hard_voxelize_cpu(points, &self.cfg.voxelize)
    }

    /// Points `(x, y, z, intensity, time lag)` → BEV map `[1, X, Y, C · Z]` and voxel stats.
    /// A cloud with no voxel (empty, all non-finite or all outside the range) is an error.
    pub fn forward(&self, points: &[[f32; POINT_COLUMNS]]) -> Result<(FeatureMap, HardVoxelStats), Error> {
        let v = self.voxelize(points)?;
        let (bev, _) = self.forward_voxels(&v, false)?;
        Ok((bev, v.stats))
    }

    /// The encoder on voxels; with `keep_stages`, the sparse output of conv_input, every stage
    /// and conv_out too.
    pub fn forward_voxels(&self, v: &HardVoxels, keep_stages: bool) -> Result<(FeatureMap, Vec<StageOutput>), Error> {
        if v.is_empty() {
            return Err(no_voxels(&v.stats));
        }
        let b = &self.cfg.backbone;
        let mut stages = Vec::new();
        let mut keep = |name: &str, t: &SparseTensor| {
            if keep_stages {
                stages.push(StageOutput { name: name.to_string(), tensor: t.clone() });
            }
        };
        let input = SparseTensor::new(v.coords.clone(), v.feats.clone(), POINT_COLUMNS, b.sparse_shape)?;
        let mut subm = submanifold(&input, [3; 3], [1; 3])?;
        let mut x = apply(&input, &subm, &self.conv_input, None)?;
        keep("conv_input", &x);
        for (i, layers) in self.stages.iter().enumerate() {
            for layer in layers {
                match layer {
                    EncoderLayer::Block { conv1, conv2 } => {
                        let h = apply(&x, &subm, conv1, None)?;
                        x = apply(&h, &subm, conv2, Some(x.feats()))?;
                    }
                    EncoderLayer::Down { geometry, conv } => {
                        let map = strided(&x, *geometry)?;
                        x = apply(&x, &map, conv, None)?;
                        subm = submanifold(&x, [3; 3], [1; 3])?;
                    }
                }
            }
            keep(&format!("encoder_layer{}", i + 1), &x);
        }
        let map = strided(&x, CONV_OUT)?;
        x = apply(&x, &map, &self.conv_out, None)?;
        keep("conv_out", &x);
        Ok((to_bev(&x)?, stages))
    }
}
