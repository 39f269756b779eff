//! Configuration of BEVFusion's BEV half (mit-han-lab/bevfusion at db75150): the fuser
//! (`model.fuser`), the BEV decoder (`model.decoder.{backbone, neck}`) and the map head
//! (`model.heads.map`) of a model YAML. Keys mirror the upstream config (the constructor
//! arguments of `ConvFuser`, `SECOND`, `SECONDFPN`, `GeneralizedResNet`, `LSSFPN`,
//! `BEVSegmentationHead`); values are validated against what upstream builds and what sptr
//! implements, each error naming the key.

use crate::models::bevfusion::camera::encoder::LayerCfg;
use crate::error::ConfigError;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use std::path::Path;

/// mmcv `BN` / PyTorch `BatchNorm2d` default epsilon.
const BN_EPS_DEFAULT: f64 = 1e-5;

fn value_err(file: &str, key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Value { file: file.to_string(), key: key.to_string(), reason: reason.into() }
}

// ---------------------------------------------------------------------------------------------
// YAML mirrors
// ---------------------------------------------------------------------------------------------

/// `model.fuser` (`ConvFuser`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FuserYaml {
    #[serde(rename = "type")]
    pub kind: String,
    pub in_channels: Vec<usize>,
    pub out_channels: usize,
}

fn d_second_out() -> Vec<usize> {
    vec![128, 128, 256]
}
fn d_second_nums() -> Vec<usize> {
    vec![3, 5, 5]
}
fn d_second_strides() -> Vec<usize> {
    vec![2, 2, 2]
}
fn d_bn_1e3() -> LayerCfg {
    LayerCfg { kind: "BN".into(), eps: Some(1e-3), requires_grad: None, inplace: None, momentum: Some(0.01) }
}
fn d_conv_no_bias() -> ConvCfg {
    ConvCfg { kind: "Conv2d".into(), bias: Some(false) }
}
fn d_deconv_no_bias() -> ConvCfg {
    ConvCfg { kind: "deconv".into(), bias: Some(false) }
}
fn d_128() -> usize {
    128
}
fn d_fpn_in() -> Vec<usize> {
    vec![128, 128, 256]
}
fn d_fpn_out() -> Vec<usize> {
    vec![256, 256, 256]
}
fn d_fpn_strides() -> Vec<f64> {
    vec![1.0, 2.0, 4.0]
}
fn d_one() -> usize {
    1
}

/// An mmcv `conv_cfg` / `upsample_cfg`: type and `bias` (absent: the layer's default, true).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConvCfg {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub bias: Option<bool>,
}

/// `model.decoder.backbone` of type `SECOND` (upstream defaults for absent keys).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecondYaml {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "d_128")]
    pub in_channels: usize,
    #[serde(default = "d_second_out")]
    pub out_channels: Vec<usize>,
    #[serde(default = "d_second_nums")]
    pub layer_nums: Vec<usize>,
    #[serde(default = "d_second_strides")]
    pub layer_strides: Vec<usize>,
    #[serde(default = "d_bn_1e3")]
    pub norm_cfg: LayerCfg,
    #[serde(default = "d_conv_no_bias")]
    pub conv_cfg: ConvCfg,
    #[serde(default)]
    pub init_cfg: Option<serde_yaml::Value>,
    #[serde(default)]
    pub pretrained: Option<serde_yaml::Value>,
}

/// `model.decoder.neck` of type `SECONDFPN`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecondFpnYaml {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default = "d_fpn_in")]
    pub in_channels: Vec<usize>,
    #[serde(default = "d_fpn_out")]
    pub out_channels: Vec<usize>,
    #[serde(default = "d_fpn_strides")]
    pub upsample_strides: Vec<f64>,
    #[serde(default = "d_bn_1e3")]
    pub norm_cfg: LayerCfg,
    #[serde(default = "d_deconv_no_bias")]
    pub upsample_cfg: ConvCfg,
    #[serde(default = "d_conv_no_bias")]
    pub conv_cfg: ConvCfg,
    #[serde(default)]
    pub use_conv_for_no_stride: bool,
    #[serde(default)]
    pub init_cfg: Option<serde_yaml::Value>,
}

/// `model.decoder.backbone` of type `GeneralizedResNet`: `blocks` are `[num_blocks, channels,
/// stride]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResNetYaml {
    #[serde(rename = "type")]
    pub kind: String,
    pub in_channels: usize,
    pub blocks: Vec<[usize; 3]>,
}

/// `model.decoder.neck` of type `LSSFPN`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LssFpnYaml {
    #[serde(rename = "type")]
    pub kind: String,
    pub in_indices: [i64; 2],
    pub in_channels: [usize; 2],
    pub out_channels: usize,
    #[serde(default = "d_one")]
    pub scale_factor: usize,
}

/// `grid_transform` of the map head (`BEVGridTransform`): `[min, max, step]` per axis, x then y.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridTransformYaml {
    pub input_scope: [[f64; 3]; 2],
    pub output_scope: [[f64; 3]; 2],
    #[serde(default)]
    pub prescale_factor: Option<f64>,
}

/// `model.heads.map` (`BEVSegmentationHead`). `loss` is training-only (accepted, unused).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SegHeadYaml {
    #[serde(rename = "type")]
    pub kind: String,
    pub in_channels: usize,
    pub grid_transform: GridTransformYaml,
    pub classes: Vec<String>,
    #[serde(default)]
    pub loss: Option<String>,
}

// ---------------------------------------------------------------------------------------------
// Validated configuration
// ---------------------------------------------------------------------------------------------

/// `ConvFuser`: `cat(inputs, dim=1)` (camera first) → conv3×3 (no bias) → BN → ReLU.
#[derive(Debug, Clone, PartialEq)]
pub struct FuserConfig {
    /// Channels of each input, in concatenation order (BEVFusion: camera 80, LiDAR 256).
    pub in_channels: Vec<usize>,
    pub out_channels: usize,
}

/// `SECOND`: per stage a conv3×3 with the stage's stride then `layer_nums[i]` conv3×3, each
/// followed by BN (eps `bn_eps`) and ReLU; every stage's output is a decoder output.
#[derive(Debug, Clone, PartialEq)]
pub struct SecondConfig {
    pub in_channels: usize,
    pub out_channels: Vec<usize>,
    pub layer_nums: Vec<usize>,
    pub layer_strides: Vec<usize>,
    pub bn_eps: f64,
    pub conv_bias: bool,
}

/// How one SECONDFPN branch changes its input's resolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FpnBranch {
    /// `ConvTranspose2d(kernel = stride = s)` (`deconv`); s = 1 without `use_conv_for_no_stride`.
    Deconv(usize),
    /// `Conv2d(kernel = stride = s)` (s = 1 with `use_conv_for_no_stride`).
    Conv(usize),
}

/// `SECONDFPN`: per input a branch (deconv or conv) → BN → ReLU, then the branches'
/// outputs concatenated in order.
#[derive(Debug, Clone, PartialEq)]
pub struct SecondFpnConfig {
    pub in_channels: Vec<usize>,
    pub out_channels: Vec<usize>,
    pub branches: Vec<FpnBranch>,
    pub bn_eps: f64,
    pub deconv_bias: bool,
    pub conv_bias: bool,
}

/// `GeneralizedResNet`: one `make_res_layer(BasicBlock, ...)` per `[num_blocks, channels,
/// stride]`, each layer's output a decoder output.
#[derive(Debug, Clone, PartialEq)]
pub struct ResNetConfig {
    pub in_channels: usize,
    pub blocks: Vec<[usize; 3]>,
}

/// `LSSFPN`: `x1 = outputs[in_indices[0]]` upsampled (bilinear, align_corners=True) to the size
/// of `x2 = outputs[in_indices[1]]`, `cat([x1, x2])`, conv1×1-BN-ReLU, conv3×3-BN-ReLU, then
/// (scale_factor > 1) upsample by `scale_factor` (align_corners=True) and conv3×3-BN-ReLU.
#[derive(Debug, Clone, PartialEq)]
pub struct LssFpnConfig {
    /// Indices into the backbone's outputs, resolved (negative ones counted from the end).
    pub in_indices: [usize; 2],
    pub in_channels: [usize; 2],
    pub out_channels: usize,
    pub scale_factor: usize,
}

/// The BEV decoder (`model.decoder`).
#[derive(Debug, Clone, PartialEq)]
pub enum DecoderConfig {
    /// The fusion model's `SECOND` + `SECONDFPN`.
    Second { backbone: SecondConfig, neck: SecondFpnConfig },
    /// The camera-only model's `GeneralizedResNet` + `LSSFPN`.
    ResNet { backbone: ResNetConfig, neck: LssFpnConfig },
}

impl DecoderConfig {
    /// Channels the decoder takes.
    pub fn in_channels(&self) -> usize {
        match self {
            DecoderConfig::Second { backbone, .. } => backbone.in_channels,
            DecoderConfig::ResNet { backbone, .. } => backbone.in_channels,
        }
    }
    /// Channels the decoder gives (the head's input).
    pub fn out_channels(&self) -> usize {
        match self {
            DecoderConfig::Second { neck, .. } => neck.out_channels.iter().sum(),
            DecoderConfig::ResNet { neck, .. } => neck.out_channels,
        }
    }
}

/// `BEVSegmentationHead` with its `BEVGridTransform`.
#[derive(Debug, Clone, PartialEq)]
pub struct SegHeadConfig {
    pub in_channels: usize,
    /// `[min, max, step]`, x then y.
    pub input_scope: [[f64; 3]; 2],
    pub output_scope: [[f64; 3]; 2],
    pub classes: Vec<String>,
}

impl SegHeadConfig {
    /// Output cells along x and y: `len(torch.arange(min + step / 2, max, step))`.
    pub fn output_size(&self) -> [usize; 2] {
        let n = |s: [f64; 3]| arange_len(s[0] + s[2] / 2.0, s[1], s[2]);
        [n(self.output_scope[0]), n(self.output_scope[1])]
    }
}

/// `len(torch.arange(start, end, step))`: `ceil((end − start) / step)` in double.
pub(crate) fn arange_len(start: f64, end: f64, step: f64) -> usize {
    let v = ((end - start) / step).ceil();
    if v.is_finite() && v > 0.0 {
        v as usize
    } else {
        0
    }
}

/// The BEV half of a BEVFusion model YAML.
#[derive(Debug, Clone, PartialEq)]
pub struct BevConfig {
    /// None for a single-sensor model (`fuser: null`).
    pub fuser: Option<FuserConfig>,
    pub decoder: DecoderConfig,
    pub head: SegHeadConfig,
}

// the path from the YAML root to the sections; other keys are other parts'
#[derive(Deserialize)]
struct RootYaml {
    model: Option<ModelSection>,
}
#[derive(Deserialize)]
struct ModelSection {
    #[serde(default)]
    fuser: Option<serde_yaml::Value>,
    decoder: Option<DecoderSection>,
    heads: Option<HeadsSection>,
}
#[derive(Deserialize)]
struct DecoderSection {
    backbone: Option<serde_yaml::Value>,
    neck: Option<serde_yaml::Value>,
}
#[derive(Deserialize)]
struct HeadsSection {
    map: Option<serde_yaml::Value>,
}

/// A section as `T`, serde's message (naming the bad key) prefixed with the section's key.
fn section<T: DeserializeOwned>(v: serde_yaml::Value, file: &str, key: &str) -> Result<T, ConfigError> {
    serde_yaml::from_value(v).map_err(|e| ConfigError::Parse { file: file.to_string(), reason: format!("{key}: {e}") })
}

/// The `type` of a section.
fn kind_of(v: &serde_yaml::Value, file: &str, key: &str) -> Result<String, ConfigError> {
    v.get("type")
        .and_then(|t| t.as_str())
        .map(str::to_string)
        .ok_or_else(|| value_err(file, &format!("{key}.type"), "is missing (a string naming the module)"))
}

const FUSER_KEY: &str = "model.fuser";
const BACKBONE_KEY: &str = "model.decoder.backbone";
const NECK_KEY: &str = "model.decoder.neck";
const HEAD_KEY: &str = "model.heads.map";

impl BevConfig {
    /// Reads `model.fuser`, `model.decoder` and `model.heads.map` of a model YAML.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read { file: file.clone(), reason: e.to_string() })?;
        Self::parse(&text, &file)
    }

    /// Parses YAML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        let root: RootYaml =
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse { file: file.to_string(), reason: e.to_string() })?;
        let missing = |key: &str| value_err(file, key, "is missing (the BEV decoder reads it)");
        let model = root.model.ok_or_else(|| missing("model"))?;
        let fuser = match model.fuser {
            None | Some(serde_yaml::Value::Null) => None,
            Some(v) => Some(validate_fuser(&section(v, file, FUSER_KEY)?, file)?),
        };
        let dec = model.decoder.ok_or_else(|| missing("model.decoder"))?;
        let backbone = dec.backbone.ok_or_else(|| missing(BACKBONE_KEY))?;
        let neck = dec.neck.ok_or_else(|| missing(NECK_KEY))?;
        let decoder = match kind_of(&backbone, file, BACKBONE_KEY)?.as_str() {
            "SECOND" => {
                let b = validate_second(&section(backbone, file, BACKBONE_KEY)?, file)?;
                let kind = kind_of(&neck, file, NECK_KEY)?;
                if kind != "SECONDFPN" {
                    return Err(value_err(file, &format!("{NECK_KEY}.type"), format!("must be `SECONDFPN` after SECOND, got `{kind}`")));
                }
                let n = validate_second_fpn(&section(neck, file, NECK_KEY)?, &b, file)?;
                DecoderConfig::Second { backbone: b, neck: n }
            }
            "GeneralizedResNet" => {
                let b = validate_resnet(&section(backbone, file, BACKBONE_KEY)?, file)?;
                let kind = kind_of(&neck, file, NECK_KEY)?;
                if kind != "LSSFPN" {
                    return Err(value_err(file, &format!("{NECK_KEY}.type"), format!("must be `LSSFPN` after GeneralizedResNet, got `{kind}`")));
                }
                let n = validate_lss_fpn(&section(neck, file, NECK_KEY)?, &b, file)?;
                DecoderConfig::ResNet { backbone: b, neck: n }
            }
            other => {
                return Err(value_err(
                    file,
                    &format!("{BACKBONE_KEY}.type"),
                    format!("`{other}` is not supported (SECOND or GeneralizedResNet)"),
                ))
            }
        };
        let head = model.heads.and_then(|h| h.map).ok_or_else(|| missing(HEAD_KEY))?;
        let head = validate_head(&section(head, file, HEAD_KEY)?, file)?;
        if let Some(f) = &fuser {
            if f.out_channels != decoder.in_channels() {
                return Err(value_err(
                    file,
                    &format!("{BACKBONE_KEY}.in_channels"),
                    format!("is {} but the fuser gives {} channels", decoder.in_channels(), f.out_channels),
                ));
            }
        }
        if head.in_channels != decoder.out_channels() {
            return Err(value_err(
                file,
                &format!("{HEAD_KEY}.in_channels"),
                format!("is {} but the decoder gives {} channels", head.in_channels, decoder.out_channels()),
            ));
        }
        Ok(Self { fuser, decoder, head })
    }
}

fn check_bn(n: &LayerCfg, file: &str, key: &str) -> Result<f64, ConfigError> {
    if n.kind != "BN" && n.kind != "BN2d" {
        return Err(value_err(file, &format!("{key}.type"), format!("`{}` is not supported (BN or BN2d)", n.kind)));
    }
    let eps = n.eps.unwrap_or(BN_EPS_DEFAULT);
    if !(eps.is_finite() && eps > 0.0) {
        return Err(value_err(file, &format!("{key}.eps"), format!("must be a positive number, got {eps}")));
    }
    Ok(eps)
}

fn check_conv(c: &ConvCfg, file: &str, key: &str) -> Result<bool, ConfigError> {
    if c.kind != "Conv2d" && c.kind != "Conv" {
        return Err(value_err(file, &format!("{key}.type"), format!("`{}` is not supported (Conv2d)", c.kind)));
    }
    Ok(c.bias.unwrap_or(true))
}

fn validate_fuser(y: &FuserYaml, file: &str) -> Result<FuserConfig, ConfigError> {
    if y.kind != "ConvFuser" {
        return Err(value_err(file, &format!("{FUSER_KEY}.type"), format!("must be `ConvFuser`, got `{}`", y.kind)));
    }
    if y.in_channels.is_empty() || y.in_channels.contains(&0) || y.out_channels == 0 {
        return Err(value_err(
            file,
            &format!("{FUSER_KEY}.in_channels"),
            format!("needs non-zero channels, got {:?} -> {}", y.in_channels, y.out_channels),
        ));
    }
    Ok(FuserConfig { in_channels: y.in_channels.clone(), out_channels: y.out_channels })
}

fn validate_second(y: &SecondYaml, file: &str) -> Result<SecondConfig, ConfigError> {
    let key = |k: &str| format!("{BACKBONE_KEY}.{k}");
    let n = y.layer_nums.len();
    if n == 0 || y.out_channels.len() != n || y.layer_strides.len() != n {
        return Err(value_err(
            file,
            &key("layer_nums"),
            format!(
                "out_channels {:?}, layer_nums {:?} and layer_strides {:?} need one entry per stage (upstream asserts it)",
                y.out_channels, y.layer_nums, y.layer_strides
            ),
        ));
    }
    if y.in_channels == 0 || y.out_channels.contains(&0) || y.layer_strides.contains(&0) {
        return Err(value_err(file, &key("out_channels"), "channels and strides must be at least 1"));
    }
    Ok(SecondConfig {
        in_channels: y.in_channels,
        out_channels: y.out_channels.clone(),
        layer_nums: y.layer_nums.clone(),
        layer_strides: y.layer_strides.clone(),
        bn_eps: check_bn(&y.norm_cfg, file, &key("norm_cfg"))?,
        conv_bias: check_conv(&y.conv_cfg, file, &key("conv_cfg"))?,
    })
}

fn validate_second_fpn(y: &SecondFpnYaml, b: &SecondConfig, file: &str) -> Result<SecondFpnConfig, ConfigError> {
    let key = |k: &str| format!("{NECK_KEY}.{k}");
    let n = y.in_channels.len();
    if n == 0 || y.out_channels.len() != n || y.upsample_strides.len() != n {
        return Err(value_err(
            file,
            &key("in_channels"),
            format!(
                "in_channels {:?}, out_channels {:?} and upsample_strides {:?} need one entry per branch",
                y.in_channels, y.out_channels, y.upsample_strides
            ),
        ));
    }
    if y.in_channels != b.out_channels {
        return Err(value_err(
            file,
            &key("in_channels"),
            format!("is {:?} but SECOND gives {:?}", y.in_channels, b.out_channels),
        ));
    }
    if y.out_channels.contains(&0) {
        return Err(value_err(file, &key("out_channels"), "must all be at least 1"));
    }
    if y.upsample_cfg.kind != "deconv" {
        return Err(value_err(file, &key("upsample_cfg.type"), format!("`{}` is not supported (deconv)", y.upsample_cfg.kind)));
    }
    let mut branches = Vec::with_capacity(n);
    for &s in &y.upsample_strides {
        let int = s.round();
        if !(s.is_finite() && s >= 1.0 && s == int && int <= 64.0) {
            // upstream turns a stride below 1 into a strided conv; no BEVFusion config uses one
            return Err(value_err(file, &key("upsample_strides"), format!("{s} is not supported (integers 1 to 64)")));
        }
        let s = int as usize;
        branches.push(if s == 1 && y.use_conv_for_no_stride { FpnBranch::Conv(1) } else { FpnBranch::Deconv(s) });
    }
    // the branches are concatenated: their outputs must have one size
    let mut stride = 1usize;
    let mut scales = Vec::with_capacity(n);
    for (i, &s) in b.layer_strides.iter().enumerate() {
        stride *= s;
        let up = match branches[i] {
            FpnBranch::Deconv(u) | FpnBranch::Conv(u) => u,
        };
        scales.push((stride, up));
    }
    if scales.iter().any(|&(d, u)| d * scales[0].1 != u * scales[0].0) {
        return Err(value_err(
            file,
            &key("upsample_strides"),
            format!(
                "{:?} do not bring SECOND's stages (strides {:?}) to one resolution; the outputs are concatenated",
                y.upsample_strides, b.layer_strides
            ),
        ));
    }
    Ok(SecondFpnConfig {
        in_channels: y.in_channels.clone(),
        out_channels: y.out_channels.clone(),
        branches,
        bn_eps: check_bn(&y.norm_cfg, file, &key("norm_cfg"))?,
        deconv_bias: y.upsample_cfg.bias.unwrap_or(true),
        conv_bias: check_conv(&y.conv_cfg, file, &key("conv_cfg"))?,
    })
}

fn validate_resnet(y: &ResNetYaml, file: &str) -> Result<ResNetConfig, ConfigError> {
    if y.in_channels == 0 || y.blocks.is_empty() || y.blocks.iter().any(|b| b.contains(&0)) {
        return Err(value_err(
            file,
            &format!("{BACKBONE_KEY}.blocks"),
            format!("needs in_channels > 0 and [num_blocks, channels, stride] entries of at least 1, got {} / {:?}", y.in_channels, y.blocks),
        ));
    }
    Ok(ResNetConfig { in_channels: y.in_channels, blocks: y.blocks.clone() })
}

fn validate_lss_fpn(y: &LssFpnYaml, b: &ResNetConfig, file: &str) -> Result<LssFpnConfig, ConfigError> {
    let key = |k: &str| format!("{NECK_KEY}.{k}");
    let outs = b.blocks.len() as i64;
    let mut idx = [0usize; 2];
    for (j, &i) in y.in_indices.iter().enumerate() {
        let r = if i < 0 { outs + i } else { i };
        if !(0..outs).contains(&r) {
            return Err(value_err(file, &key("in_indices"), format!("{i} is not an output of the {outs} backbone layers")));
        }
        idx[j] = r as usize;
        let c = b.blocks[r as usize][1];
        if c != y.in_channels[j] {
            return Err(value_err(
                file,
                &key("in_channels"),
                format!("entry {j} is {} but backbone output {i} has {c} channels", y.in_channels[j]),
            ));
        }
    }
    if y.out_channels == 0 || y.scale_factor == 0 {
        return Err(value_err(file, &key("out_channels"), "out_channels and scale_factor must be at least 1"));
    }
    Ok(LssFpnConfig { in_indices: idx, in_channels: y.in_channels, out_channels: y.out_channels, scale_factor: y.scale_factor })
}

fn validate_head(y: &SegHeadYaml, file: &str) -> Result<SegHeadConfig, ConfigError> {
    let key = |k: &str| format!("{HEAD_KEY}.{k}");
    if y.kind != "BEVSegmentationHead" {
        return Err(value_err(file, &key("type"), format!("must be `BEVSegmentationHead`, got `{}`", y.kind)));
    }
    if y.in_channels == 0 || y.classes.is_empty() {
        return Err(value_err(file, &key("classes"), "needs in_channels > 0 and at least one class"));
    }
    if let Some(p) = y.grid_transform.prescale_factor {
        if p != 1.0 {
            return Err(value_err(file, &key("grid_transform.prescale_factor"), format!("{p} is not supported (1)")));
        }
    }
    let g = &y.grid_transform;
    for (name, scope) in [("input_scope", &g.input_scope), ("output_scope", &g.output_scope)] {
        for s in scope {
            if !(s.iter().all(|v| v.is_finite()) && s[1] > s[0] && s[2] > 0.0) {
                return Err(value_err(file, &key(&format!("grid_transform.{name}")), format!("{s:?} must be [min, max, step] with max > min, step > 0")));
            }
        }
    }
    let head = SegHeadConfig {
        in_channels: y.in_channels,
        input_scope: g.input_scope,
        output_scope: g.output_scope,
        classes: y.classes.clone(),
    };
    let [ox, oy] = head.output_size();
    if ox == 0 || oy == 0 || ox > 1 << 14 || oy > 1 << 14 {
        return Err(value_err(file, &key("grid_transform.output_scope"), format!("gives a {ox} x {oy} grid (1 to 16384 per axis)")));
    }
    Ok(head)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_yaml(name: &str) -> BevConfig {
        let p = crate::repo_root().join("config/models").join(name);
        BevConfig::load(&p).unwrap()
    }

    #[test]
    fn reads_both_model_yamls() {
        let f = repo_yaml("bevfusion_seg_fusion.yaml");
        assert_eq!(f.fuser, Some(FuserConfig { in_channels: vec![80, 256], out_channels: 256 }));
        match &f.decoder {
            DecoderConfig::Second { backbone, neck } => {
                assert_eq!(backbone.out_channels, vec![128, 256]);
                assert_eq!(backbone.layer_nums, vec![5, 5]);
                assert_eq!(backbone.layer_strides, vec![1, 2]);
                assert_eq!(backbone.bn_eps, 1e-3);
                assert!(!backbone.conv_bias);
                assert_eq!(neck.branches, vec![FpnBranch::Conv(1), FpnBranch::Deconv(2)]);
                assert_eq!(neck.bn_eps, 1e-3);
                assert!(!neck.deconv_bias && !neck.conv_bias);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(f.decoder.out_channels(), 512);
        assert_eq!(f.head.in_channels, 512);
        assert_eq!(f.head.output_size(), [200, 200]);
        assert_eq!(f.head.classes.len(), 6);

        let c = repo_yaml("bevfusion_seg_camera.yaml");
        assert_eq!(c.fuser, None);
        match &c.decoder {
            DecoderConfig::ResNet { backbone, neck } => {
                assert_eq!(backbone.in_channels, 80);
                assert_eq!(backbone.blocks, vec![[2, 160, 2], [2, 320, 2], [2, 640, 1]]);
                assert_eq!(neck.in_indices, [2, 0]);
                assert_eq!(neck.in_channels, [640, 160]);
                assert_eq!((neck.out_channels, neck.scale_factor), (256, 2));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.head.in_channels, 256);
    }

    const FUSION: &str = include_str!("../../../config/models/bevfusion_seg_fusion.yaml");
    const CAMERA: &str = include_str!("../../../config/models/bevfusion_seg_camera.yaml");

    fn err_of(text: &str) -> String {
        BevConfig::parse(text, "t.yaml").unwrap_err().to_string()
    }

    #[test]
    fn bad_values_name_their_key() {
        let cases: &[(&str, &str, &str, &str)] = &[
            (FUSION, "type: ConvFuser", "type: AddFuser", "model.fuser.type"),
            (FUSION, "out_channels: 256\n  decoder", "out_channels: 128\n  decoder", "model.decoder.backbone.in_channels"),
            (FUSION, "layer_nums: [5, 5]", "layer_nums: [5]", "layer_nums"),
            (FUSION, "upsample_strides: [1, 2]", "upsample_strides: [1, 4]", "upsample_strides"),
            (FUSION, "upsample_strides: [1, 2]", "upsample_strides: [0.5, 2]", "upsample_strides"),
            (FUSION, "in_channels: [128, 256]", "in_channels: [128, 128]", "model.decoder.neck.in_channels"),
            (FUSION, "eps: 1.0e-3", "eps: -1.0", "model.decoder.backbone.norm_cfg.eps"),
            (FUSION, "type: SECONDFPN", "type: LSSFPN", "model.decoder.neck.type"),
            (FUSION, "in_channels: 512", "in_channels: 256", "model.heads.map.in_channels"),
            (CAMERA, "in_indices: [-1, 0]", "in_indices: [-4, 0]", "in_indices"),
            (CAMERA, "in_channels: [640, 160]", "in_channels: [320, 160]", "model.decoder.neck.in_channels"),
            (CAMERA, "type: GeneralizedResNet", "type: ResNet", "model.decoder.backbone.type"),
            (CAMERA, "type: BEVSegmentationHead", "type: Other", "model.heads.map.type"),
            (CAMERA, "output_scope: [[-50, 50, 0.5]", "output_scope: [[50, -50, 0.5]", "output_scope"),
            (CAMERA, "scale_factor: 2", "scale_factor: 2\n      extra: 1", "extra"),
        ];
        for (base, from, to, want) in cases {
            assert!(base.contains(from), "{from}");
            let e = err_of(&base.replacen(from, to, 1));
            assert!(e.contains(want), "{from} -> {to}: `{e}` lacks `{want}`");
        }
        assert!(err_of("model: {}").contains("model.decoder"));
        assert!(err_of("arch: x").contains("`model`"));
        assert!(BevConfig::load(Path::new("/nonexistent/m.yaml")).is_err());
    }
}
