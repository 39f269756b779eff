//! SphereFormer's contextual relative position encoding: the per-pair table index, computed from
//! positions exactly as upstream computes it in float32 (PyTorch on CUDA), quirks included.
//!
//! Upstream (SphereFormer's bundled sptr, `sparse_self_attention`) for a pair (query i, key j):
//!
//! ```text
//! quant(p)  = floor_div(remainder(p - min + shift, window), quant_size)     per axis, float32
//! index     = quant(p_i) - quant(p_j) + L - 1                              per axis
//! spherical: index[2] = exponential_split(r_i - r_j, a) + 24; index clamped to [0, 2L - 1]
//! ```
//!
//! `min` is the minimum over all positions of the call (all batches), `L` the quant grid length
//! (`int((window + 1e-4) / quant)`), tables have `2L - 1` rows (cubic) or `2L` rows (spherical).
//! The cubic index is not clamped upstream (sptr asserts it is in range); here it is clamped to the
//! table so a degenerate configuration reads a valid row instead of memory out of bounds.
//!
//! Every float operation below mirrors one PyTorch CUDA op on float32 (a tensor divided by a
//! Python scalar is a multiplication by the float32 reciprocal there), so window and table indices
//! agree with upstream even at bin edges.

use crate::Error;

/// The radial-axis index offset SphereFormer hard-codes in `exponential_split` (`+ 24`).
pub const EXPONENTIAL_SPLIT_OFFSET: i32 = 24;

/// PyTorch's `torch.remainder` on float32: `fmod`, moved into the divisor's sign.
pub fn torch_remainder(a: f32, b: f32) -> f32 {
    let m = a % b; // Rust's `%` on floats is C fmod (exact)
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        m + b
    } else {
        m
    }
}

/// PyTorch's float floor division (`torch.div(a, b, rounding_mode='floor')`), which is Python's
/// `//`: computed from `fmod`, not as `floor(a / b)`, so it can differ from the latter at edges.
pub fn torch_div_floor(a: f32, b: f32) -> f32 {
    if b == 0.0 {
        return a / b;
    }
    let m = a % b;
    let mut div = (a - m) / b;
    if m != 0.0 && ((b < 0.0) != (m < 0.0)) {
        div -= 1.0;
    }
    if div != 0.0 {
        let mut fl = div.floor();
        if div - fl > 0.5 {
            fl += 1.0;
        }
        fl
    } else {
        (0.0f32).copysign(a / b)
    }
}

/// `tensor / python_float` on CUDA: multiplication by the float32 reciprocal.
#[inline]
fn div_scalar(x: f32, s: f64) -> f32 {
    x * (1.0f32 / s as f32)
}

/// SphereFormer's `cart2sphere`: (theta, beta, r) with theta = (atan2(y, x) + π) in degrees,
/// beta = atan2(√(x² + y²), z) in degrees, r = √(x² + y² + z²), in PyTorch's op order.
pub fn cart2sphere(p: [f32; 3]) -> [f32; 3] {
    let [x, y, z] = p;
    let pi = std::f64::consts::PI;
    let theta = div_scalar((y.atan2(x) + pi as f32) * 180.0, pi);
    let xy2 = x * x + y * y;
    let beta = div_scalar(xy2.sqrt().atan2(z) * 180.0, pi);
    let r = (xy2 + z * z).sqrt();
    [theta, beta, r]
}

/// SphereFormer's `exponential_split` for one pair: the signed radial bin of `d = r_i - r_j`
/// before the `+ 24` offset. Bins: [0, a) → 0, [a, 2a) → 1, [2a, 4a) → 2, [4a, 6a) → 3,
/// [6a, 10a) → 4, …; negative `d` mirror to -1, -2, ….
pub fn exponential_split(d: f32, a: f32) -> i32 {
    let ad = d.abs();
    let flag = if d >= 0.0 { 1.0f32 } else { 0.0 };
    let a64 = a as f64;
    let t = div_scalar(ad + (2.0 * a64) as f32, a64).ln();
    let mut idx = 2.0 * div_scalar(t, std::f64::consts::LN_2).floor() - 2.0;
    let half = torch_div_floor(idx, 2.0);
    let edge = (3.0 * 2f32.powf(half) - 2.0) * a;
    if edge <= ad {
        idx += 1.0;
    }
    let idx = idx * (2.0 * flag - 1.0) + (flag - 1.0);
    idx as i32
}

/// The geometry of one contextual RPE: how positions map to table rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RpeGeometry {
    /// Minimum position over every voxel of the call (per axis).
    pub min: [f32; 3],
    /// Window size per axis (the same one the partition uses).
    pub window: [f32; 3],
    /// Quantization step per axis.
    pub quant: [f32; 3],
    /// Half-window shift (Swin-style shifted windows).
    pub shift: bool,
    /// Quant grid length `L`.
    pub grid_length: i32,
    /// `Some(a)`: spherical windows, radial axis through `exponential_split(a)`, clamped indices.
    pub radial_split: Option<f32>,
}

impl RpeGeometry {
    /// Upstream's `quant_grid_length = int((window[0] + 1e-4) / quant[0])`, checked to be the same
    /// on axis 1 as upstream asserts.
    pub fn grid_length_of(window: [f64; 3], quant: [f64; 3]) -> Result<i32, Error> {
        let l0 = ((window[0] + 1e-4) / quant[0]).trunc();
        let l1 = ((window[1] + 1e-4) / quant[1]).trunc();
        if !(1.0..=1024.0).contains(&l0) || l0 != l1 {
            return Err(Error::InvalidInput(format!(
                "RPE: window {window:?} / quant {quant:?} gives quant grid lengths {l0} and {l1}: \
                 they must be equal and in 1..=1024"
            )));
        }
        Ok(l0 as i32)
    }

    /// A geometry for `positions`, with `min` taken over them. Errors on a non-positive or
    /// non-finite window or quant, or a non-finite position.
    pub fn new(
        positions: &[[f32; 3]],
        window: [f32; 3],
        quant: [f32; 3],
        shift: bool,
        grid_length: i32,
        radial_split: Option<f32>,
    ) -> Result<Self, Error> {
        for a in 0..3 {
            if !(window[a].is_finite() && window[a] > 0.0 && quant[a].is_finite() && quant[a] > 0.0)
            {
                return Err(Error::InvalidInput(format!(
                    "RPE: window {window:?} and quant {quant:?} must be finite and > 0"
                )));
            }
        }
        if grid_length < 1 {
            return Err(Error::InvalidInput(format!(
                "RPE: quant grid length {grid_length} must be >= 1"
            )));
        }
        if let Some(a) = radial_split {
            if !(a.is_finite() && a > 0.0) {
                return Err(Error::InvalidInput(format!(
                    "RPE: exponential split parameter a = {a} must be finite and > 0"
                )));
            }
        }
        let min = min_position(positions)?;
        Ok(Self { min, window, quant, shift, grid_length, radial_split })
    }

    /// Rows of each table: `2L - 1` for cubic windows, `2L` with the radial split.
    pub fn table_rows(&self) -> usize {
        let l = self.grid_length as usize;
        if self.radial_split.is_some() {
            2 * l
        } else {
            2 * l - 1
        }
    }

    /// The quantized in-window position of one voxel (upstream's `xyz_quant`).
    pub fn quantize(&self, p: [f32; 3]) -> [i32; 3] {
        let mut out = [0i32; 3];
        for a in 0..3 {
            let mut d = p[a] - self.min[a];
            if self.shift {
                d += 0.5 * self.window[a];
            }
            out[a] = torch_div_floor(torch_remainder(d, self.window[a]), self.quant[a]) as i32;
        }
        out
    }

    /// Table rows `[axis0, axis1, axis2]` for the pair (query, key), given both quantized
    /// positions and (for the radial split) both radii `p[2]`.
    pub fn pair_index(&self, quant_q: [i32; 3], quant_k: [i32; 3], r_q: f32, r_k: f32) -> [i32; 3] {
        let l = self.grid_length;
        let mut idx = [0i32; 3];
        for a in 0..3 {
            idx[a] = quant_q[a] - quant_k[a] + l - 1;
        }
        if let Some(a) = self.radial_split {
            idx[2] = exponential_split(r_q - r_k, a) + EXPONENTIAL_SPLIT_OFFSET;
        }
        let hi = self.table_rows() as i32 - 1;
        for v in &mut idx {
            *v = (*v).clamp(0, hi);
        }
        idx
    }
}

/// Per-axis minimum of `positions`; an error names the first non-finite one. Empty input gives 0.
pub fn min_position(positions: &[[f32; 3]]) -> Result<[f32; 3], Error> {
    let mut min = [f32::INFINITY; 3];
    for (i, p) in positions.iter().enumerate() {
        for a in 0..3 {
            if !p[a].is_finite() {
                return Err(Error::InvalidInput(format!(
                    "window attention: position {i} is not finite ({p:?})"
                )));
            }
            min[a] = min[a].min(p[a]);
        }
    }
    if positions.is_empty() {
        min = [0.0; 3];
    }
    Ok(min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_division_follows_python() {
        assert_eq!(torch_div_floor(7.0, 2.0), 3.0);
        assert_eq!(torch_div_floor(-7.0, 2.0), -4.0);
        assert_eq!(torch_remainder(-1.0, 3.0), 2.0);
        // just below the window edge is the last bin, L - 1
        let w = 0.05f32 * 6.0;
        let q = w / 24.0;
        assert_eq!(torch_div_floor(w - f32::EPSILON, q), 23.0);
    }

    #[test]
    fn exponential_split_bins() {
        let a = 0.0125f32;
        let cases = [
            (0.0, 0),
            (0.5 * a, 0),
            (1.5 * a, 1),
            (3.0 * a, 2),
            (5.0 * a, 3),
            (8.0 * a, 4),
            (12.0 * a, 5),
            (-0.5 * a, -1),
            (-1.5 * a, -2),
            (-3.0 * a, -3),
        ];
        for (d, want) in cases {
            assert_eq!(exponential_split(d, a), want, "d = {d} (= {} a)", d / a);
        }
    }

    #[test]
    fn sphere_coordinates() {
        let s = cart2sphere([1.0, 0.0, 0.0]);
        assert!((s[0] - 180.0).abs() < 1e-4 && (s[1] - 90.0).abs() < 1e-4 && s[2] == 1.0);
        let s = cart2sphere([0.0, -2.0, 0.0]);
        assert!((s[0] - 90.0).abs() < 1e-4 && (s[2] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn indices_stay_in_the_table() {
        let pos = [[0.0f32, 0.0, 0.0], [0.29, 0.29, 0.29]];
        let g = RpeGeometry::new(&pos, [0.3; 3], [0.0125; 3], false, 24, None).unwrap();
        let (a, b) = (g.quantize(pos[0]), g.quantize(pos[1]));
        let i = g.pair_index(a, b, 0.0, 0.0);
        let j = g.pair_index(b, a, 0.0, 0.0);
        assert_eq!(i, [0, 0, 0]);
        assert_eq!(j, [46, 46, 46]);
        let gs = RpeGeometry::new(&pos, [2.0, 2.0, 80.0], [2.0 / 24.0, 2.0 / 24.0, 80.0 / 24.0], false, 24, Some(0.0125)).unwrap();
        assert_eq!(gs.table_rows(), 48);
        let far = gs.pair_index([0; 3], [0; 3], 79.0, 0.0);
        assert_eq!(far[2], 47, "a far radius clamps to the last row");
        assert!(RpeGeometry::grid_length_of([0.3, 0.3, 0.3], [0.3 / 24.0; 3]).unwrap() == 24);
        assert!(RpeGeometry::grid_length_of([0.3, 0.6, 0.3], [0.0125; 3]).is_err());
    }
}
