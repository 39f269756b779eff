//! The camera encoder's configuration (mit-han-lab/bevfusion at db75150,
//! `model.encoders.camera`): the Swin-T backbone and the GeneralizedLSSFPN neck as the YAML gives
//! them, validated into what the networks are built from.

use crate::error::ConfigError;
use serde::Deserialize;
use std::path::Path;

/// Where the backbone's tensors live in a BEVFusion `state_dict`.
pub const BACKBONE_PREFIX: &str = "encoders.camera.backbone";
/// Where the neck's tensors live.
pub const NECK_PREFIX: &str = "encoders.camera.neck";

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

/// An mmcv layer config (`norm_cfg`, `act_cfg`, `conv_cfg`): its type and the keys upstream
/// configs give it. `requires_grad`, `inplace` and `momentum` only matter in training.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCfg {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub eps: Option<f64>,
    #[serde(default)]
    pub requires_grad: Option<bool>,
    #[serde(default)]
    pub inplace: Option<bool>,
    #[serde(default)]
    pub momentum: Option<f64>,
}

impl LayerCfg {
    fn of(kind: &str) -> Self {
        LayerCfg { kind: kind.into(), eps: None, requires_grad: None, inplace: None, momentum: None }
    }
}

fn d_in_channels() -> usize {
    3
}
fn d_embed() -> usize {
    96
}
fn d_patch() -> usize {
    4
}
fn d_window() -> usize {
    7
}
fn d_mlp() -> usize {
    4
}
fn d_depths() -> Vec<usize> {
    vec![2, 2, 6, 2]
}
fn d_heads() -> Vec<usize> {
    vec![3, 6, 12, 24]
}
fn d_out() -> Vec<usize> {
    vec![0, 1, 2, 3]
}
fn yes() -> bool {
    true
}

/// `model.encoders.camera.backbone`: the arguments of mmdet's `SwinTransformer`, with upstream's
/// defaults for the ones a config leaves out.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwinYaml {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "d_in_channels")]
    pub in_channels: usize,
    #[serde(default = "d_embed")]
    pub embed_dims: usize,
    #[serde(default = "d_patch")]
    pub patch_size: usize,
    #[serde(default = "d_window")]
    pub window_size: usize,
    /// Upstream multiplies it into an `nn.Linear` width, so only an integer works there.
    #[serde(default = "d_mlp")]
    pub mlp_ratio: usize,
    #[serde(default = "d_depths")]
    pub depths: Vec<usize>,
    #[serde(default = "d_heads")]
    pub num_heads: Vec<usize>,
    /// Default `[patch_size, 2, 2, ...]`.
    #[serde(default)]
    pub strides: Option<Vec<usize>>,
    #[serde(default = "d_out")]
    pub out_indices: Vec<usize>,
    #[serde(default = "yes")]
    pub qkv_bias: bool,
    #[serde(default)]
    pub qk_scale: Option<f64>,
    #[serde(default = "yes")]
    pub patch_norm: bool,
    #[serde(default)]
    pub use_abs_pos_embed: bool,
    #[serde(default)]
    pub norm_cfg: Option<LayerCfg>,
    #[serde(default)]
    pub act_cfg: Option<LayerCfg>,
    // Training-only arguments that upstream configs carry (dropout, stochastic depth, gradient
    // checkpointing, initialisation, frozen stages): accepted so an upstream config copies across,
    // and ignored (inference runs no dropout and loads every weight from the file).
    #[serde(default)]
    pub drop_rate: Option<f64>,
    #[serde(default)]
    pub attn_drop_rate: Option<f64>,
    #[serde(default)]
    pub drop_path_rate: Option<f64>,
    #[serde(default)]
    pub with_cp: Option<bool>,
    #[serde(default)]
    pub convert_weights: Option<bool>,
    #[serde(default)]
    pub frozen_stages: Option<i64>,
    #[serde(default)]
    pub pretrained: Option<serde_yaml::Value>,
    #[serde(default)]
    pub init_cfg: Option<serde_yaml::Value>,
    #[serde(default)]
    pub pretrain_img_size: Option<serde_yaml::Value>,
}

fn d_end_level() -> i64 {
    -1
}
fn d_bn() -> Option<LayerCfg> {
    Some(LayerCfg::of("BN2d"))
}
fn d_relu() -> Option<LayerCfg> {
    Some(LayerCfg::of("ReLU"))
}
fn d_upsample() -> UpsampleCfg {
    UpsampleCfg { mode: "bilinear".into(), align_corners: Some(true) }
}

/// `upsample_cfg`: the keyword arguments of the neck's `F.interpolate`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpsampleCfg {
    pub mode: String,
    /// Absent: `F.interpolate`'s default, `False`.
    #[serde(default)]
    pub align_corners: Option<bool>,
}

/// `model.encoders.camera.neck`: the arguments of BEVFusion's `GeneralizedLSSFPN`, with
/// upstream's defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FpnYaml {
    #[serde(rename = "type")]
    pub kind: String,
    pub in_channels: Vec<usize>,
    pub out_channels: usize,
    /// Upstream's forward ignores it (it returns one output per input level but the last).
    pub num_outs: usize,
    #[serde(default)]
    pub start_level: usize,
    #[serde(default = "d_end_level")]
    pub end_level: i64,
    #[serde(default)]
    pub no_norm_on_lateral: bool,
    #[serde(default)]
    pub conv_cfg: Option<LayerCfg>,
    #[serde(default = "d_bn")]
    pub norm_cfg: Option<LayerCfg>,
    #[serde(default = "d_relu")]
    pub act_cfg: Option<LayerCfg>,
    #[serde(default = "d_upsample")]
    pub upsample_cfg: UpsampleCfg,
}

/// The backbone as built (validated [`SwinYaml`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SwinConfig {
    pub in_channels: usize,
    pub embed_dims: usize,
    pub patch_size: usize,
    pub window: usize,
    pub mlp_ratio: usize,
    pub depths: Vec<usize>,
    pub heads: Vec<usize>,
    pub out_indices: Vec<usize>,
    pub qkv_bias: bool,
    /// Overrides `head_dim^-0.5` (upstream: `qk_scale or head_dim ** -0.5`, so 0 means unset).
    pub qk_scale: Option<f64>,
    pub patch_norm: bool,
    /// LayerNorm epsilon (`norm_cfg`; PyTorch's 1e-5 by default).
    pub ln_eps: f64,
}

impl SwinConfig {
    /// Channels of stage `i` (upstream `num_features[i] = embed_dims * 2^i`).
    pub fn channels(&self, stage: usize) -> usize {
        self.embed_dims << stage
    }
    pub fn stages(&self) -> usize {
        self.depths.len()
    }
    /// The backbone's output channels, one per `out_indices` entry.
    pub fn out_channels(&self) -> Vec<usize> {
        self.out_indices.iter().map(|&i| self.channels(i)).collect()
    }
    /// The q scale of stage `i`.
    pub fn scale(&self, stage: usize) -> f32 {
        let head_dim = self.channels(stage) / self.heads[stage];
        match self.qk_scale {
            Some(s) if s != 0.0 => s as f32,
            _ => (head_dim as f32).powf(-0.5),
        }
    }
    /// The spatial size of each stage for an `h × w` image: the patch embedding's
    /// `ceil(h / patch)` (corner padding), then halved, rounded up, at each merge.
    pub fn stage_sizes(&self, h: usize, w: usize) -> Vec<[usize; 2]> {
        let mut s = [h.div_ceil(self.patch_size), w.div_ceil(self.patch_size)];
        let mut out = Vec::with_capacity(self.stages());
        for _ in 0..self.stages() {
            out.push(s);
            s = [s[0].div_ceil(2), s[1].div_ceil(2)];
        }
        out
    }
}

/// The neck as built (validated [`FpnYaml`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FpnConfig {
    pub in_channels: Vec<usize>,
    pub out_channels: usize,
    /// BatchNorm epsilon after the lateral convs; None without a norm there (then they have a bias).
    pub lateral_bn_eps: Option<f64>,
    /// BatchNorm epsilon after the 3 × 3 convs; None without a norm.
    pub fpn_bn_eps: Option<f64>,
    pub relu: bool,
    pub align_corners: bool,
}

impl FpnConfig {
    /// Input channels of lateral conv `i`: its level plus the upsampled coarser level (the raw
    /// last input for the second-to-last level, a neck output of `out_channels` below it).
    pub fn lateral_in(&self, i: usize) -> usize {
        let last = self.in_channels.len() - 1;
        self.in_channels[i] + if i + 1 == last { self.in_channels[i + 1] } else { self.out_channels }
    }
    /// Number of outputs (and of lateral / fpn conv pairs).
    pub fn outputs(&self) -> usize {
        self.in_channels.len() - 1
    }
}

/// The camera encoder's configuration, from a model YAML.
#[derive(Debug, Clone, PartialEq)]
pub struct CameraEncoderConfig {
    pub backbone: SwinConfig,
    pub neck: FpnConfig,
}

const BACKBONE_KEY: &str = "model.encoders.camera.backbone";
const NECK_KEY: &str = "model.encoders.camera.neck";

fn value_err(file: &str, key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: file.to_string(), key: key.to_string(), reason: reason.into() }
}

// The path from the YAML root to the two sections; other keys are other parts' (not denied here).
#[derive(Deserialize)]
struct RootYaml {
    model: Option<ModelSection>,
}
#[derive(Deserialize)]
struct ModelSection {
    encoders: Option<EncodersSection>,
}
#[derive(Deserialize)]
struct EncodersSection {
    camera: Option<CameraSection>,
}
#[derive(Deserialize)]
struct CameraSection {
    backbone: Option<SwinYaml>,
    neck: Option<FpnYaml>,
}

impl CameraEncoderConfig {
    /// Reads `model.encoders.camera.{backbone, neck}` of a model YAML.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
        Self::parse(&text, &file)
    }

    /// Parses YAML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        // serde_yaml names the key path of a bad value (`model.encoders.camera.backbone.mlp_ratio: ...`)
        let root: RootYaml =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse { file: file.to_string(), reason: e.to_string() })?;
        let camera = root.model.and_then(|m| m.encoders).and_then(|e| e.camera);
        let (backbone, neck) = camera.map(|c| (c.backbone, c.neck)).unwrap_or((None, None));
        let missing = |key: &str| value_err(file, key, "is missing (the camera encoder reads it)");
        let backbone = backbone.ok_or_else(|| missing(BACKBONE_KEY))?;
        let neck = neck.ok_or_else(|| missing(NECK_KEY))?;
        Self::from_yaml(&backbone, &neck, file)
    }

    /// Validates the two sections against what upstream builds (and what we implement).
    pub fn from_yaml(b: &SwinYaml, n: &FpnYaml, file: &str) -> Result<Self, ConfigError> {
        let backbone = validate_swin(b, file)?;
        let neck = validate_fpn(n, file)?;
        if neck.in_channels != backbone.out_channels() {
            return Err(value_err(
                file,
                &format!("{NECK_KEY}.in_channels"),
                format!(
                    "is {:?} but the backbone's outputs (out_indices {:?}) have {:?} channels",
                    neck.in_channels,
                    backbone.out_indices,
                    backbone.out_channels()
                ),
            ));
        }
        Ok(Self { backbone, neck })
    }
}

fn validate_swin(y: &SwinYaml, file: &str) -> Result<SwinConfig, ConfigError> {
    let key = |k: &str| format!("{BACKBONE_KEY}.{k}");
    if y.kind != "SwinTransformer" {
        return Err(value_err(file, &key("type"), format!("must be `SwinTransformer`, got `{}`", y.kind)));
    }
    for (name, v) in [("in_channels", y.in_channels), ("embed_dims", y.embed_dims), ("patch_size", y.patch_size), ("window_size", y.window_size), ("mlp_ratio", y.mlp_ratio)] {
        if v == 0 {
            return Err(value_err(file, &key(name), "must be at least 1"));
        }
    }
    if y.depths.is_empty() || y.depths.len() != y.num_heads.len() {
        return Err(value_err(
            file,
            &key("num_heads"),
            format!("needs one entry per stage of `depths` {:?}, got {:?}", y.depths, y.num_heads),
        ));
    }
    if y.depths.len() > 8 {
        return Err(value_err(file, &key("depths"), format!("has {} stages; at most 8 are supported", y.depths.len())));
    }
    for (i, &h) in y.num_heads.iter().enumerate() {
        let c = y.embed_dims << i;
        if h == 0 || !c.is_multiple_of(h) {
            return Err(value_err(
                file,
                &key("num_heads"),
                format!("stage {i} has {c} channels, which {h} heads do not divide (upstream reshapes C into heads x C / heads)"),
            ));
        }
    }
    let want_strides: Vec<usize> = std::iter::once(y.patch_size).chain(std::iter::repeat_n(2, y.depths.len() - 1)).collect();
    if let Some(s) = &y.strides {
        if *s != want_strides {
            return Err(value_err(
                file,
                &key("strides"),
                format!("{s:?} is not supported: the patch embedding's stride must equal patch_size and every patch merging's be 2 ({want_strides:?})"),
            ));
        }
    }
    if y.out_indices.is_empty() || y.out_indices.windows(2).any(|w| w[1] <= w[0]) || y.out_indices.iter().any(|&i| i >= y.depths.len()) {
        return Err(value_err(
            file,
            &key("out_indices"),
            format!("must be increasing stage indices below {}, got {:?}", y.depths.len(), y.out_indices),
        ));
    }
    if y.use_abs_pos_embed {
        return Err(value_err(file, &key("use_abs_pos_embed"), "true is not supported (BEVFusion's Swin has no absolute position embedding)"));
    }
    if let Some(s) = y.qk_scale {
        if !s.is_finite() {
            return Err(value_err(file, &key("qk_scale"), format!("must be finite, got {s}")));
        }
    }
    let mut ln_eps = crate::ops::rowwise::cpu::LAYER_NORM_EPS;
    if let Some(n) = &y.norm_cfg {
        if n.kind != "LN" {
            return Err(value_err(file, &key("norm_cfg.type"), format!("`{}` is not supported; Swin uses `LN`", n.kind)));
        }
        if let Some(e) = n.eps {
            ln_eps = e;
        }
    }
    if !(ln_eps.is_finite() && ln_eps > 0.0) {
        return Err(value_err(file, &key("norm_cfg.eps"), format!("must be a positive number, got {ln_eps}")));
    }
    if let Some(a) = &y.act_cfg {
        if a.kind != "GELU" {
            return Err(value_err(file, &key("act_cfg.type"), format!("`{}` is not supported; Swin uses `GELU`", a.kind)));
        }
    }
    Ok(SwinConfig {
        in_channels: y.in_channels,
        embed_dims: y.embed_dims,
        patch_size: y.patch_size,
        window: y.window_size,
        mlp_ratio: y.mlp_ratio,
        depths: y.depths.clone(),
        heads: y.num_heads.clone(),
        out_indices: y.out_indices.clone(),
        qkv_bias: y.qkv_bias,
        qk_scale: y.qk_scale,
        patch_norm: y.patch_norm,
        ln_eps,
    })
}

fn validate_fpn(y: &FpnYaml, file: &str) -> Result<FpnConfig, ConfigError> {
    let key = |k: &str| format!("{NECK_KEY}.{k}");
    if y.kind != "GeneralizedLSSFPN" {
        return Err(value_err(file, &key("type"), format!("must be `GeneralizedLSSFPN`, got `{}`", y.kind)));
    }
    let levels = y.in_channels.len();
    if levels < 2 || y.in_channels.contains(&0) || y.out_channels == 0 {
        return Err(value_err(
            file,
            &key("in_channels"),
            format!("needs at least two levels with channels and out_channels > 0, got {:?} -> {}", y.in_channels, y.out_channels),
        ));
    }
    if y.start_level != 0 {
        // upstream's forward reads inputs[i + start_level] for every input: only 0 runs
        return Err(value_err(file, &key("start_level"), format!("must be 0 (upstream's forward fails otherwise), got {}", y.start_level)));
    }
    if y.end_level != -1 && !(y.end_level == levels as i64 - 1 && y.num_outs == levels - 1) {
        return Err(value_err(
            file,
            &key("end_level"),
            format!("must be -1 (or {} with num_outs {}): upstream's forward needs a lateral conv per level but the last", levels - 1, levels - 1),
        ));
    }
    if let Some(c) = &y.conv_cfg {
        if c.kind != "Conv2d" && c.kind != "Conv" {
            return Err(value_err(file, &key("conv_cfg.type"), format!("`{}` is not supported (plain Conv2d only)", c.kind)));
        }
    }
    let bn_eps = match &y.norm_cfg {
        None => None,
        Some(n) if n.kind == "BN2d" || n.kind == "BN" => {
            let e = n.eps.unwrap_or(1e-5);
            if !(e.is_finite() && e > 0.0) {
                return Err(value_err(file, &key("norm_cfg.eps"), format!("must be a positive number, got {e}")));
            }
            Some(e)
        }
        Some(n) => return Err(value_err(file, &key("norm_cfg.type"), format!("`{}` is not supported (BN2d or none)", n.kind))),
    };
    let relu = match &y.act_cfg {
        None => false,
        Some(a) if a.kind == "ReLU" => true,
        Some(a) => return Err(value_err(file, &key("act_cfg.type"), format!("`{}` is not supported (ReLU or none)", a.kind))),
    };
    if y.upsample_cfg.mode != "bilinear" {
        return Err(value_err(file, &key("upsample_cfg.mode"), format!("`{}` is not supported (bilinear only)", y.upsample_cfg.mode)));
    }
    Ok(FpnConfig {
        in_channels: y.in_channels.clone(),
        out_channels: y.out_channels,
        lateral_bn_eps: if y.no_norm_on_lateral { None } else { bn_eps },
        fpn_bn_eps: bn_eps,
        relu,
        align_corners: y.upsample_cfg.align_corners.unwrap_or(false),
    })
}

