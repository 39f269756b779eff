//! Kernel maps (spconv's "indice pairs") for the CPU reference: for each kernel offset, the list
//! of `(input row, output row)` pairs that the offset's weight slice connects.
//!
//! Facts taken from spconv 2.3.8 (github traveller59/spconv, tag v2.3.8; facts only, no code):
//!
//! - Kernel offset index. The location iterator starts at zero and increments its LAST spatial
//!   axis fastest (`spconv/csrc/sparse/indices.py:114-127`, `operator++` loops from axis ndim-1
//!   down to 0); the same flat index is what `layout_rs.inverse` decodes (`indices.py:129-139`).
//!   With our coordinates `[b, x, y, z]` the spatial axes are (x, y, z), so offset
//!   `k = (rx * Ky + ry) * Kz + rz`, `r* in [0, K*)`. This is also the flat order of the middle
//!   axes of the weight `[Cout, Kx, Ky, Kz, Cin]` (`spconv/pytorch/ops.py:891` native and `ops.py:1539`
//!   implicit GEMM reshape the weight to `[Cout, kv, Cin]`), see `conv_cpu.rs`.
//! - Input -> output relation at offset r (`indices.py:138-155`, `nhw_to_npq`, formula at line 148):
//!   `out * stride = in + padding - r * dilation`, i.e. `in = out * stride - padding + r * dilation`
//!   (`indices.py:157-172`, `npq_to_nhw`, formula at line 166): plain cross-correlation as in PyTorch's conv3d.
//!   A strided output exists where the division is exact and `0 <= out < out_shape`
//!   (`indices.py:174-203`, `query_npq`; C++ `%` truncates, so negative numerators with a remainder
//!   are rejected too; we use the Euclidean remainder, identical for the accepted set).
//! - Output spatial shape of a strided conv: `(in + 2p - d(k-1) - 1) / s + 1` with floor
//!   division (`spconv/pytorch/ops.py:73-83`).
//! - Submanifold: odd kernel only, stride 1, padding `(k/2) * dilation` (`indices.py:1648-1653`),
//!   outputs = inputs in input order, so `out = in - (r - k/2) * dilation`, i.e.
//!   `in = out + (r - center) * dilation`. The centre offset `kv/2` pairs every site with itself;
//!   for offsets `o < kv/2` each found pair `(i, j)` is also written, swapped, at offset `kv-1-o`
//!   (`indices.py:1675-1697` CPU; `indices.py:757-804` CUDA): the map is symmetric.
//! - Strided output order: spconv's CPU generator numbers outputs in order of first discovery
//!   (offset-major, then input order, `indices.py:1711-1776`); the CUDA implicit-GEMM path with the
//!   default direct table (`spconv/constants.py:105`) numbers them in hash-table order. Neither is
//!   a sorted order, so this reference SORTS strided outputs by `[b, x, y, z]`; parity tests
//!   compare strided outputs as a set.
//! - Inverse conv (`SparseInverseConv3d`, same `indice_key`): outputs are the coupled strided
//!   conv's INPUT coordinates in their order, and the pairs are used swapped: the native path reads
//!   the input index from pair row 1 and the output index from row 0 when `inverse`
//!   (`ops.py:948-949`); the implicit-GEMM path swaps `pair_fwd`/`pair_bwd` (`conv.py:352-353`).
//!   The kernel index is the strided conv's.
//!
//! Negative coordinates: the spconv rule is applied to coordinates relative to the tensor's origin
//! (`c - origin`); for strided maps the origin must be a multiple of the stride so that the output
//! origin is `origin / stride` and, for k = s, p = 0, `out = floor(c / s)` in absolute coordinates.

use crate::ops::sparse_conv::tensor::{validate_geometry, SparseTensor};
use crate::Error;
use std::collections::HashMap;

/// Which rule built a map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapKind {
    /// `SubMConv3d`: outputs = inputs.
    Submanifold,
    /// `SparseConv3d` with spconv's output-coordinate rule.
    Strided,
    /// TorchSparse/MinkowskiEngine downsampling (kernel = stride): `out = floor(c / s)`.
    MinkowskiDown,
    /// `SparseInverseConv3d`: the swap of a `Strided` or `MinkowskiDown` map.
    Inverse,
}

/// Kernel geometry per axis (x, y, z).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeometry {
    pub kernel: [i32; 3],
    pub stride: [i32; 3],
    pub padding: [i32; 3],
    pub dilation: [i32; 3],
}

impl ConvGeometry {
    pub fn kernel_volume(&self) -> usize {
        self.kernel.iter().map(|&k| k as usize).product()
    }
}

/// A kernel map: per kernel offset (spconv's order, see the module docs), the `(in, out)` row pairs.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelMap {
    pub kind: MapKind,
    pub geometry: ConvGeometry,
    /// Coordinates of the input rows (the tensor the map was built on, or for an inverse map the
    /// coarse tensor it reads).
    pub in_coords: Vec<[i32; 4]>,
    pub in_spatial_shape: [i32; 3],
    pub in_origin: [i32; 3],
    pub in_stride: [i32; 3],
    /// Coordinates of the output rows, in output row order.
    pub out_coords: Vec<[i32; 4]>,
    pub out_spatial_shape: [i32; 3],
    pub out_origin: [i32; 3],
    /// Tensor stride of the output.
    pub out_stride: [i32; 3],
    /// `pairs[k]` = `(input row, output row)` pairs of kernel offset `k`.
    pub pairs: Vec<Vec<(u32, u32)>>,
}

impl KernelMap {
    pub fn in_count(&self) -> usize {
        self.in_coords.len()
    }
    pub fn out_count(&self) -> usize {
        self.out_coords.len()
    }
    pub fn kernel_volume(&self) -> usize {
        self.pairs.len()
    }
    /// Total number of pairs over all offsets.
    pub fn pair_count(&self) -> usize {
        self.pairs.iter().map(Vec::len).sum()
    }
    /// An empty output tensor shell (features zero, `channels` wide) at the map's output sites.
    pub fn output_tensor(&self, feats: Vec<f32>, channels: usize) -> Result<SparseTensor, Error> {
        if channels == 0 || feats.len() != self.out_coords.len() * channels {
            return Err(Error::InvalidInput(format!(
                "kernel map output: {} features for {} sites x {} channels",
                feats.len(),
                self.out_coords.len(),
                channels
            )));
        }
        Ok(SparseTensor::from_parts_unchecked(
            self.out_coords.clone(),
            feats,
            channels,
            self.out_stride,
            self.out_origin,
            self.out_spatial_shape,
        ))
    }
}

/// The kernel offsets `(rx, ry, rz)` in spconv's flat order: `k = (rx * Ky + ry) * Kz + rz`.
pub fn kernel_offsets(kernel: [i32; 3]) -> Vec<[i32; 3]> {
    let mut v = Vec::with_capacity(kernel.iter().map(|&k| k.max(0) as usize).product());
    for rx in 0..kernel[0] {
        for ry in 0..kernel[1] {
            for rz in 0..kernel[2] {
                v.push([rx, ry, rz]);
            }
        }
    }
    v
}

fn index_of(coords: &[[i32; 4]]) -> HashMap<[i32; 4], u32> {
    let mut h = HashMap::with_capacity(coords.len());
    for (i, c) in coords.iter().enumerate() {
        h.insert(*c, i as u32);
    }
    h
}

/// Downsampling maps: per-offset `(input, output coordinate)` candidates -> the output sites
/// (unique, sorted by `[b, x, y, z]`) and per-offset `(input, output row)` pairs.
fn number_outputs(raw: Vec<Vec<(u32, [i32; 4])>>) -> (Vec<[i32; 4]>, Vec<Vec<(u32, u32)>>) {
    let mut out_coords: Vec<[i32; 4]> = raw.iter().flatten().map(|&(_, q)| q).collect();
    out_coords.sort_unstable();
    out_coords.dedup();
    // Every candidate's coordinate is in `out_coords` by construction, so the search succeeds.
    let pairs = raw
        .into_iter()
        .map(|list| {
            list.into_iter()
                .filter_map(|(i, q)| out_coords.binary_search(&q).ok().map(|o| (i, o as u32)))
                .collect()
        })
        .collect();
    (out_coords, pairs)
}

fn check_positive(name: &str, v: [i32; 3]) -> Result<(), Error> {
    if v.iter().any(|&x| x < 1) {
        return Err(Error::InvalidInput(format!(
            "kernel map: {name} {:?} must be >= 1",
            v
        )));
    }
    Ok(())
}

/// Submanifold map (`SubMConv3d`, odd kernel per axis, stride 1): outputs are the input sites in
/// input order; at offset `r`, input `i` at `c + (r - center) * dilation` feeds output `j` at `c`.
pub fn submanifold(
    input: &SparseTensor,
    kernel: [i32; 3],
    dilation: [i32; 3],
) -> Result<KernelMap, Error> {
    check_positive("kernel", kernel)?;
    check_positive("dilation", dilation)?;
    if kernel.iter().any(|&k| k % 2 == 0) {
        return Err(Error::InvalidInput(format!(
            "submanifold kernel {:?} must be odd per axis",
            kernel
        )));
    }
    let coords = input.coords();
    let table = index_of(coords);
    let offsets = kernel_offsets(kernel);
    let kv = offsets.len();
    let center = kv / 2;
    let mut pairs: Vec<Vec<(u32, u32)>> = vec![Vec::new(); kv];
    pairs[center] = (0..coords.len() as u32).map(|i| (i, i)).collect();
    for (o, r) in offsets.iter().enumerate().take(center) {
        // Relative to output c: input lies at c + (r - center) * d. Seen from input i at c_i: the
        // output is at c_i - (r - center) * d (spconv's `nhw_to_npq` with p = (k/2) d, s = 1).
        let shift = [
            (r[0] - kernel[0] / 2) * dilation[0],
            (r[1] - kernel[1] / 2) * dilation[1],
            (r[2] - kernel[2] / 2) * dilation[2],
        ];
        let mut fwd = Vec::new();
        for (i, c) in coords.iter().enumerate() {
            let q = [
                c[0],
                c[1].wrapping_sub(shift[0]),
                c[2].wrapping_sub(shift[1]),
                c[3].wrapping_sub(shift[2]),
            ];
            if let Some(&j) = table.get(&q) {
                fwd.push((i as u32, j));
            }
        }
        pairs[kv - 1 - o] = fwd.iter().map(|&(i, j)| (j, i)).collect();
        pairs[o] = fwd;
    }
    Ok(KernelMap {
        kind: MapKind::Submanifold,
        geometry: ConvGeometry {
            kernel,
            stride: [1, 1, 1],
            padding: [
                kernel[0] / 2 * dilation[0],
                kernel[1] / 2 * dilation[1],
                kernel[2] / 2 * dilation[2],
            ],
            dilation,
        },
        in_coords: coords.to_vec(),
        in_spatial_shape: input.spatial_shape(),
        in_origin: input.origin(),
        in_stride: input.stride(),
        out_coords: coords.to_vec(),
        out_spatial_shape: input.spatial_shape(),
        out_origin: input.origin(),
        out_stride: input.stride(),
        pairs,
    })
}

/// spconv's output spatial shape of a strided conv: `floor((n + 2p - d(k-1) - 1) / s) + 1`.
pub fn conv_output_shape(input_shape: [i32; 3], g: &ConvGeometry) -> [i32; 3] {
    let mut out = [0; 3];
    for a in 0..3 {
        let num = input_shape[a] as i64 + 2 * g.padding[a] as i64
            - g.dilation[a] as i64 * (g.kernel[a] as i64 - 1)
            - 1;
        out[a] = (num.div_euclid(g.stride[a] as i64) + 1) as i32;
    }
    out
}

/// Strided map (`SparseConv3d`) with spconv's output-coordinate rule: output `q` (relative to the
/// output origin) exists where some input at `q * s - p + r * d` (relative to the input origin)
/// exists and `0 <= q < out_shape`. Outputs sorted by `[b, x, y, z]`; pairs per offset in input
/// order. The input origin must be a multiple of the stride (always true for origin 0).
pub fn strided(input: &SparseTensor, g: ConvGeometry) -> Result<KernelMap, Error> {
    check_positive("kernel", g.kernel)?;
    check_positive("stride", g.stride)?;
    check_positive("dilation", g.dilation)?;
    if g.padding.iter().any(|&p| p < 0) {
        return Err(Error::InvalidInput(format!(
            "kernel map: padding {:?} < 0",
            g.padding
        )));
    }
    let in_shape = input.spatial_shape();
    let origin = input.origin();
    let out_shape = conv_output_shape(in_shape, &g);
    if out_shape.iter().any(|&n| n < 1) {
        return Err(Error::InvalidInput(format!(
            "strided conv: output spatial shape {:?} from input {:?} with {:?} is empty",
            out_shape, in_shape, g
        )));
    }
    if (0..3).any(|a| origin[a].rem_euclid(g.stride[a]) != 0) {
        return Err(Error::InvalidInput(format!(
            "strided conv: origin {:?} must be a multiple of the stride {:?}",
            origin, g.stride
        )));
    }
    let out_origin = [
        origin[0] / g.stride[0],
        origin[1] / g.stride[1],
        origin[2] / g.stride[2],
    ];
    let offsets = kernel_offsets(g.kernel);
    let coords = input.coords();
    // (offset, input, output coordinate) in spconv's discovery order.
    let mut raw: Vec<Vec<(u32, [i32; 4])>> = vec![Vec::new(); offsets.len()];
    for (o, r) in offsets.iter().enumerate() {
        for (i, c) in coords.iter().enumerate() {
            let mut q = [c[0], 0, 0, 0];
            let mut ok = true;
            for a in 0..3 {
                let num = (c[a + 1] as i64 - origin[a] as i64) + g.padding[a] as i64
                    - r[a] as i64 * g.dilation[a] as i64;
                let s = g.stride[a] as i64;
                if num.rem_euclid(s) != 0 {
                    ok = false;
                    break;
                }
                let qa = num.div_euclid(s);
                if qa < 0 || qa >= out_shape[a] as i64 {
                    ok = false;
                    break;
                }
                q[a + 1] = (qa + out_origin[a] as i64) as i32;
            }
            if ok {
                raw[o].push((i as u32, q));
            }
        }
    }
    let (out_coords, pairs) = number_outputs(raw);
    let out_stride = [
        input.stride()[0].saturating_mul(g.stride[0]),
        input.stride()[1].saturating_mul(g.stride[1]),
        input.stride()[2].saturating_mul(g.stride[2]),
    ];
    validate_geometry(out_stride, out_origin, out_shape)?;
    Ok(KernelMap {
        kind: MapKind::Strided,
        geometry: g,
        in_coords: coords.to_vec(),
        in_spatial_shape: in_shape,
        in_origin: origin,
        in_stride: input.stride(),
        out_coords,
        out_spatial_shape: out_shape,
        out_origin,
        out_stride,
        pairs,
    })
}

/// TorchSparse/MinkowskiEngine downsampling with kernel = stride = `s` (padding ignored, as in
/// TorchSparse's "minkowski" mode): every input `c` feeds output `floor(c / s)` (absolute
/// coordinates, negative ones included) at offset `r = c - s * floor(c / s)`. Unlike spconv's rule
/// no site is dropped at the upper border (spconv drops the last row when an extent is odd).
/// Output origin `floor(origin / s)`, shape covering `floor((origin + n - 1) / s)`.
pub fn minkowski_down(input: &SparseTensor, stride: [i32; 3]) -> Result<KernelMap, Error> {
    check_positive("stride", stride)?;
    let g = ConvGeometry {
        kernel: stride,
        stride,
        padding: [0; 3],
        dilation: [1; 3],
    };
    let origin = input.origin();
    let shape = input.spatial_shape();
    let mut out_origin = [0; 3];
    let mut out_shape = [0; 3];
    for a in 0..3 {
        out_origin[a] = origin[a].div_euclid(stride[a]);
        let last = (origin[a] as i64 + shape[a] as i64 - 1).div_euclid(stride[a] as i64) as i32;
        out_shape[a] = last - out_origin[a] + 1;
    }
    let coords = input.coords();
    let kv = g.kernel_volume();
    let mut raw: Vec<Vec<(u32, [i32; 4])>> = vec![Vec::new(); kv];
    for (i, c) in coords.iter().enumerate() {
        let mut q = [c[0], 0, 0, 0];
        let mut r = [0; 3];
        for a in 0..3 {
            q[a + 1] = c[a + 1].div_euclid(stride[a]);
            r[a] = c[a + 1].rem_euclid(stride[a]);
        }
        let k = ((r[0] * stride[1] + r[1]) * stride[2] + r[2]) as usize;
        raw[k].push((i as u32, q));
    }
    let (out_coords, pairs) = number_outputs(raw);
    let out_stride = [
        input.stride()[0].saturating_mul(stride[0]),
        input.stride()[1].saturating_mul(stride[1]),
        input.stride()[2].saturating_mul(stride[2]),
    ];
    Ok(KernelMap {
        kind: MapKind::MinkowskiDown,
        geometry: g,
        in_coords: coords.to_vec(),
        in_spatial_shape: shape,
        in_origin: origin,
        in_stride: input.stride(),
        out_coords,
        out_spatial_shape: out_shape,
        out_origin,
        out_stride,
        pairs,
    })
}

/// The map of `SparseInverseConv3d` that undoes `down` (spconv's shared `indice_key`): inputs are
/// `down`'s outputs, outputs are `down`'s inputs in their order, every pair swapped, same kernel
/// offsets. Errors if `down` is not a strided or minkowski-down map.
pub fn inverse(down: &KernelMap) -> Result<KernelMap, Error> {
    if !matches!(down.kind, MapKind::Strided | MapKind::MinkowskiDown) {
        return Err(Error::InvalidInput(format!(
            "inverse conv needs the map of a strided conv, got {:?}",
            down.kind
        )));
    }
    Ok(KernelMap {
        kind: MapKind::Inverse,
        geometry: down.geometry,
        in_coords: down.out_coords.clone(),
        in_spatial_shape: down.out_spatial_shape,
        in_origin: down.out_origin,
        in_stride: down.out_stride,
        out_coords: down.in_coords.clone(),
        out_spatial_shape: down.in_spatial_shape,
        out_origin: down.in_origin,
        out_stride: down.in_stride,
        pairs: down
            .pairs
            .iter()
            .map(|l| l.iter().map(|&(i, o)| (o, i)).collect())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_order_last_axis_fastest() {
        let o = kernel_offsets([3, 3, 3]);
        assert_eq!(o.len(), 27);
        assert_eq!(o[0], [0, 0, 0]);
        assert_eq!(o[1], [0, 0, 1]);
        assert_eq!(o[3], [0, 1, 0]);
        assert_eq!(o[9], [1, 0, 0]);
        assert_eq!(o[13], [1, 1, 1]);
    }

    #[test]
    fn subm_relation() {
        // Two sites one apart on x: input at x+1 reaches output at x through r = center + 1 on x.
        let t = SparseTensor::new(vec![[0, 1, 1, 1], [0, 2, 1, 1]], vec![0.0; 2], 1, [4, 4, 4])
            .unwrap();
        let m = submanifold(&t, [3, 3, 3], [1, 1, 1]).unwrap();
        assert_eq!(m.pairs[13], vec![(0, 0), (1, 1)]);
        // offset (2,1,1) = 22: in = out + (1,0,0) -> (in 1, out 0)
        assert_eq!(m.pairs[22], vec![(1, 0)]);
        assert_eq!(m.pairs[4], vec![(0, 1)]);
        assert_eq!(m.pair_count(), 4);
    }

    #[test]
    fn output_shape_rule() {
        let g = ConvGeometry {
            kernel: [3; 3],
            stride: [2; 3],
            padding: [1; 3],
            dilation: [1; 3],
        };
        assert_eq!(conv_output_shape([8, 7, 6], &g), [4, 4, 3]);
        let g2 = ConvGeometry {
            kernel: [2; 3],
            stride: [2; 3],
            padding: [0; 3],
            dilation: [1; 3],
        };
        assert_eq!(conv_output_shape([8, 7, 6], &g2), [4, 3, 3]);
    }
}
