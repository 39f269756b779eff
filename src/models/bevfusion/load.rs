//! Loading the plain `nn.Conv2d` / `nn.ConvTranspose2d` + `nn.BatchNorm2d` pairs of BEVFusion's
//! BEV decoder and head (modules in `nn.Sequential`s, so their names are indices), with the
//! BatchNorm folded into the conv at load.

use crate::ops::dense::{batch_norm_2d_eps, Conv2d, ConvTranspose2d};
use crate::ops::rowwise::cpu::BatchNorm;
use crate::nn::weights::{bad_weights, TensorSource};
use crate::nn::ModelError;

/// One conv's geometry: square kernel, stride, zero padding, whether it has a bias.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConvSpec {
    pub cin: usize,
    pub cout: usize,
    pub k: usize,
    pub stride: usize,
    pub pad: usize,
    pub bias: bool,
}

/// The BatchNorm `{bn}.{weight, bias, running_mean, running_var}` of `c` channels, folded.
pub(crate) fn batch_norm(src: &mut dyn TensorSource, bn: &str, c: usize, eps: f64) -> Result<BatchNorm, ModelError> {
    let g = src.tensor(&format!("{bn}.weight"), &[c])?;
    let b = src.tensor(&format!("{bn}.bias"), &[c])?;
    let m = src.tensor(&format!("{bn}.running_mean"), &[c])?;
    let v = src.tensor(&format!("{bn}.running_var"), &[c])?;
    batch_norm_2d_eps(&g, &b, &m, &v, eps as f32).map_err(|e| bad_weights(bn, e))
}

/// `{conv}.weight` `[cout, cin, k, k]` (and `{conv}.bias`), then the BatchNorm `bn` (eps) folded
/// in when given.
pub(crate) fn conv_bn(src: &mut dyn TensorSource, conv: &str, s: ConvSpec, bn: Option<(&str, f64)>) -> Result<Conv2d, ModelError> {
    let w = src.tensor(&format!("{conv}.weight"), &[s.cout, s.cin, s.k, s.k])?;
    let b = if s.bias { Some(src.tensor(&format!("{conv}.bias"), &[s.cout])?) } else { None };
    let mut c = Conv2d::new(s.cin, s.cout, s.k, s.k, [s.stride; 2], [s.pad; 2], w, b).map_err(|e| bad_weights(conv, e))?;
    if let Some((bn, eps)) = bn {
        let norm = batch_norm(src, bn, s.cout, eps)?;
        c.fold_bn(&norm).map_err(|e| bad_weights(bn, e))?;
    }
    Ok(c)
}

/// `{deconv}.weight` `[cin, cout, k, k]` (stride k, no padding; and `{deconv}.bias`), then the
/// BatchNorm `bn` folded in.
pub(crate) fn deconv_bn(
    src: &mut dyn TensorSource,
    deconv: &str,
    cin: usize,
    cout: usize,
    k: usize,
    bias: bool,
    bn: (&str, f64),
) -> Result<ConvTranspose2d, ModelError> {
    let w = src.tensor(&format!("{deconv}.weight"), &[cin, cout, k, k])?;
    let b = if bias { Some(src.tensor(&format!("{deconv}.bias"), &[cout])?) } else { None };
    let mut d = ConvTranspose2d::new(cin, cout, k, k, [k, k], [0, 0], w, b).map_err(|e| bad_weights(deconv, e))?;
    let norm = batch_norm(src, bn.0, cout, bn.1)?;
    d.fold_bn(&norm).map_err(|e| bad_weights(bn.0, e))?;
    Ok(d)
}
