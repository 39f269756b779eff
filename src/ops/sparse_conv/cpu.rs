//! CPU reference sparse convolution (f32, rayon): `SubMConv3d`, `SparseConv3d`,
//! `SparseInverseConv3d` over a [`KernelMap`].
//!
//! Function computed, for output row `j` and output channel `co`:
//! `out[j, co] = bias[co] + sum_k sum_{(i, j) in pairs[k]} sum_ci W[k][co][ci] * x'[i, ci]
//!               (+ residual[j, co])`
//! where `x' = relu(x * scale + shift)` when a pre-activation is given, else `x`.
//!
//! Weight layout: spconv 2.x keeps every conv weight (subm, strided and inverse) as KRSC =
//! `[Cout, Kx, Ky, Kz, Cin]` (`spconv/pytorch/conv.py:136-138`, with `ALL_WEIGHT_IS_KRSC = True`
//! at `spconv/constants.py:42`), where Cout/Cin are the module's own `out_channels`/`in_channels`
//! (for an inverse conv too: the coarse input has `in_channels`). The `(Kx, Ky, Kz)` axes flatten
//! to the kernel offset index `k` in the same order as the kernel map (`spconv/pytorch/ops.py:891`
//! reshapes to `[Cout, kv, Cin]`; the slice for offset `k` is `W[:, k, :]`, applied as
//! `x @ W[:, k, :]^T`, `ops.py:970-973`). spconv can also load a state dict saved as RSKC or RSCK
//! (env `SPCONV_SAVED_WEIGHT_LAYOUT`, `conv.py:648-683`); both are accepted here too.
//!
//! spconv 1x1x1 quirk (spconv 2.3.8, upstream issue traveller59/spconv#450): a layer with kernel
//! volume 1 that is submanifold or has stride 1 everywhere (`conv1x1`, `conv.py:95-103`) skips the
//! kernel map and computes `x @ weight.view(Cin, Cout)` (`conv.py:225-234`, `FILTER_HWIO = False`
//! at `conv.py:42`): the stored `[Cout, 1, 1, 1, Cin]` buffer is REINTERPRETED as row-major
//! `[Cin, Cout]`, not transposed. Checkpoints trained with spconv carry that meaning, so to
//! compute spconv's function use [`spconv_weight_layout`], which returns `Rsck` (= `[Cin, Cout]`
//! for volume 1) for such layers and `Krsc` otherwise.
//!
//! Order of work: the pairs are regrouped per output row (offsets in map order, then pairs in
//! list order) and rows run in parallel, so each output sums its terms in a fixed order: results
//! are bit-identical from run to run and independent of the thread count. This is the
//! gather -> GEMM -> scatter-add dataflow done output-stationary, with no atomics.

use crate::ops::sparse_conv::kernel_map::{KernelMap, MapKind};
use crate::ops::sparse_conv::tensor::SparseTensor;
use crate::Error;
use rayon::prelude::*;
use std::borrow::Cow;

/// How a conv weight is laid out in memory (all row-major).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightLayout {
    /// `[Cout, Kx, Ky, Kz, Cin]`: spconv 2.x `state_dict` layout.
    #[default]
    Krsc,
    /// `[Kx, Ky, Kz, Cout, Cin]`.
    Rskc,
    /// `[Kx, Ky, Kz, Cin, Cout]`.
    Rsck,
}

/// The layout in which spconv 2.3.8 reads a `state_dict` weight for a layer over `map`:
/// `Rsck` for its `conv1x1` layers (kernel volume 1 and submanifold or stride 1, see the module
/// docs), `Krsc` for every other layer.
pub fn spconv_weight_layout(map: &KernelMap) -> WeightLayout {
    spconv_layout(map.kernel_volume(), map.kind == MapKind::Submanifold || map.geometry.stride == [1, 1, 1])
}

/// [`spconv_weight_layout`] from the layer's kernel volume and whether it is submanifold or of
/// stride 1 (for callers that know the layer before its map exists, e.g. at weight load).
pub fn spconv_layout(kernel_volume: usize, submanifold_or_stride1: bool) -> WeightLayout {
    if kernel_volume == 1 && submanifold_or_stride1 {
        WeightLayout::Rsck
    } else {
        WeightLayout::Krsc
    }
}

/// Per-input-channel affine map then optional ReLU, applied to the gathered input (inference
/// BatchNorm of a pre-activation block: `scale = gamma / sqrt(var + eps)`,
/// `shift = beta - mean * scale`).
#[derive(Debug, Clone, Copy)]
pub struct PreActivation<'a> {
    pub scale: &'a [f32],
    pub shift: &'a [f32],
    pub relu: bool,
}

/// Folds inference BatchNorm parameters into `(scale, shift)`.
pub fn fold_batch_norm(
    gamma: &[f32],
    beta: &[f32],
    mean: &[f32],
    var: &[f32],
    eps: f32,
) -> Result<(Vec<f32>, Vec<f32>), Error> {
    let c = gamma.len();
    if beta.len() != c || mean.len() != c || var.len() != c {
        return Err(Error::InvalidInput(format!(
            "batch norm: gamma {}, beta {}, mean {}, var {} differ in length",
            c,
            beta.len(),
            mean.len(),
            var.len()
        )));
    }
    let scale: Vec<f32> = (0..c).map(|i| gamma[i] / (var[i] + eps).sqrt()).collect();
    let shift = (0..c).map(|i| beta[i] - mean[i] * scale[i]).collect();
    Ok((scale, shift))
}

/// Optional parts of a conv call.
#[derive(Debug, Clone, Copy, Default)]
pub struct ConvOptions<'a> {
    /// `[Cout]`.
    pub bias: Option<&'a [f32]>,
    /// Applied to the input features as they are gathered.
    pub pre: Option<PreActivation<'a>>,
    /// `[N_out, Cout]`, added to the output (after the bias).
    pub residual: Option<&'a [f32]>,
}

/// Weight as `[K][Cin][Cout]` (`Rsck`) for row-vector times matrix products: borrowed when it
/// already is, so a model that repacks its weights once at load ([`to_rsck`]) copies nothing per call.
pub(crate) fn repack(
    weight: &[f32],
    layout: WeightLayout,
    kv: usize,
    cin: usize,
    cout: usize,
) -> Result<Cow<'_, [f32]>, Error> {
    let expected = kv
        .checked_mul(cin)
        .and_then(|v| v.checked_mul(cout))
        .ok_or_else(|| Error::InvalidInput("conv weight size overflows".into()))?;
    if weight.len() != expected {
        return Err(Error::InvalidInput(format!(
            "conv weight has {} values, expected {} (kernel volume {kv} x Cin {cin} x Cout {cout}, \
             layout {:?})",
            weight.len(),
            expected,
            layout
        )));
    }
    if layout == WeightLayout::Rsck {
        return Ok(Cow::Borrowed(weight));
    }
    let mut w = vec![0.0f32; expected];
    for k in 0..kv {
        for ci in 0..cin {
            for co in 0..cout {
                let src = match layout {
                    WeightLayout::Krsc => (co * kv + k) * cin + ci,
                    WeightLayout::Rskc => (k * cout + co) * cin + ci,
                    WeightLayout::Rsck => (k * cin + ci) * cout + co,
                };
                w[(k * cin + ci) * cout + co] = weight[src];
            }
        }
    }
    Ok(Cow::Owned(w))
}

/// `weight` (in `layout`) repacked to `Rsck`, the layout [`conv_with`] reads without copying.
pub fn to_rsck(weight: &[f32], layout: WeightLayout, kv: usize, cin: usize, cout: usize) -> Result<Vec<f32>, Error> {
    Ok(repack(weight, layout, kv, cin, cout)?.into_owned())
}

/// Sparse convolution over `map` (any kind). Returns the output features `[map.out_count(), cout]`.
pub fn conv(
    input: &SparseTensor,
    map: &KernelMap,
    weight: &[f32],
    layout: WeightLayout,
    bias: Option<&[f32]>,
    cin: usize,
    cout: usize,
) -> Result<Vec<f32>, Error> {
    conv_with(
        input,
        map,
        weight,
        layout,
        cin,
        cout,
        &ConvOptions {
            bias,
            ..Default::default()
        },
    )
}

/// [`conv`] with the fusions: pre-activation on the gather and a residual add on the output.
pub fn conv_with(
    input: &SparseTensor,
    map: &KernelMap,
    weight: &[f32],
    layout: WeightLayout,
    cin: usize,
    cout: usize,
    opts: &ConvOptions<'_>,
) -> Result<Vec<f32>, Error> {
    if cin == 0 || cout == 0 {
        return Err(Error::InvalidInput(format!(
            "conv: Cin {cin} and Cout {cout} must be > 0"
        )));
    }
    if input.channels() != cin {
        return Err(Error::InvalidInput(format!(
            "conv: input has {} channels, layer expects {cin}",
            input.channels()
        )));
    }
    if input.len() != map.in_count() || input.coords() != map.in_coords.as_slice() {
        return Err(Error::InvalidInput(format!(
            "conv: input tensor ({} sites) is not the tensor the kernel map was built on ({} sites)",
            input.len(),
            map.in_count()
        )));
    }
    let kv = map.kernel_volume();
    let w = repack(weight, layout, kv, cin, cout)?;
    if let Some(b) = opts.bias {
        if b.len() != cout {
            return Err(Error::InvalidInput(format!(
                "conv: bias has {} values, Cout {cout}",
                b.len()
            )));
        }
    }
    let n_out = map.out_count();
    if let Some(r) = opts.residual {
        if r.len() != n_out * cout {
            return Err(Error::InvalidInput(format!(
                "conv: residual has {} values, expected {} x {cout}",
                r.len(),
                n_out
            )));
        }
    }
    // Pre-activation: elementwise per input row, so applying it once per input row equals
    // applying it on every gather.
    let act_storage;
    let x: &[f32] = match opts.pre {
        None => input.feats(),
        Some(p) => {
            if p.scale.len() != cin || p.shift.len() != cin {
                return Err(Error::InvalidInput(format!(
                    "conv: pre-activation scale/shift have {}/{} values, Cin {cin}",
                    p.scale.len(),
                    p.shift.len()
                )));
            }
            let mut v = input.feats().to_vec();
            v.par_chunks_mut(cin).for_each(|row| {
                for (c, val) in row.iter_mut().enumerate() {
                    let y = *val * p.scale[c] + p.shift[c];
                    *val = if p.relu { y.max(0.0) } else { y };
                }
            });
            act_storage = v;
            &act_storage
        }
    };
    // Regroup pairs per output row (CSR), offsets in order.
    let mut counts = vec![0usize; n_out + 1];
    for list in &map.pairs {
        for &(i, o) in list {
            if i as usize >= input.len() || o as usize >= n_out {
                return Err(Error::InvalidInput(format!(
                    "conv: kernel map pair ({i}, {o}) out of range ({} in, {n_out} out)",
                    input.len()
                )));
            }
            counts[o as usize + 1] += 1;
        }
    }
    for j in 0..n_out {
        counts[j + 1] += counts[j];
    }
    let mut fill = counts.clone();
    let mut entries = vec![(0u32, 0u32); counts[n_out]];
    for (k, list) in map.pairs.iter().enumerate() {
        for &(i, o) in list {
            let slot = &mut fill[o as usize];
            entries[*slot] = (k as u32, i);
            *slot += 1;
        }
    }
    let mut out = vec![0.0f32; n_out * cout];
    out.par_chunks_mut(cout).enumerate().for_each(|(j, row)| {
        if let Some(b) = opts.bias {
            row.copy_from_slice(b);
        }
        for &(k, i) in &entries[counts[j]..counts[j + 1]] {
            let xi = &x[i as usize * cin..(i as usize + 1) * cin];
            let wk = &w[k as usize * cin * cout..(k as usize + 1) * cin * cout];
            for (ci, &xv) in xi.iter().enumerate() {
                let wrow = &wk[ci * cout..(ci + 1) * cout];
                for (acc, &wv) in row.iter_mut().zip(wrow) {
                    *acc += xv * wv;
                }
            }
        }
        if let Some(r) = opts.residual {
            for (acc, &rv) in row.iter_mut().zip(&r[j * cout..(j + 1) * cout]) {
                *acc += rv;
            }
        }
    });
    Ok(out)
}

/// [`conv_with`] returning the output tensor at the map's output sites.
pub fn conv_tensor(
    input: &SparseTensor,
    map: &KernelMap,
    weight: &[f32],
    layout: WeightLayout,
    cout: usize,
    opts: &ConvOptions<'_>,
) -> Result<SparseTensor, Error> {
    let feats = conv_with(input, map, weight, layout, input.channels(), cout, opts)?;
    map.output_tensor(feats, cout)
}
