//! 2-D Swin windows as a varlen partition.
//!
//! Swin attends within `M × M` windows of an image's tokens; its shifted layer rolls the image by
//! `-s` (s = M / 2), partitions the rolled image, and masks pairs of tokens that came from
//! different regions of the rolled image (the `-100` attention mask). A masked pair contributes
//! exp(-100) ≈ 4e-44 of the softmax, i.e. nothing in f32: so a shifted window with its mask is
//! exactly a set of smaller windows, one per (window, region). That is the partition built here,
//! and the varlen window-attention kernel runs it unchanged (the xformers view in the design seeds).
//!
//! Token `t = (b · H + r) · W + c`. `rc` is each token's position in the rolled image, which
//! Swin's relative position bias is indexed by; inside one region the rolled differences equal
//! the original ones, so the bias sees the same offsets either way.

use crate::ops::attention::partition::{partition_by_key, Partition};
use crate::Error;

/// Swin's region of rolled coordinate `x` along an axis of length `len` (0, 1 or 2): the slices
/// `[0, len - m)`, `[len - m, len - s)`, `[len - s, len)`; one region when not shifted.
fn region(x: i32, len: i32, m: i32, s: i32) -> i32 {
    if s == 0 || x < len - m {
        0
    } else if x < len - s {
        1
    } else {
        2
    }
}

/// The partition of a batch of `batch` images of `height × width` tokens into `window × window`
/// Swin windows shifted by `shift` (0 or `window / 2` in Swin), with each token's rolled
/// (row, col). Height and width must be multiples of the window, as Swin pads them to be.
pub fn swin_partition(
    batch: usize,
    height: i32,
    width: i32,
    window: i32,
    shift: i32,
) -> Result<(Partition, Vec<[i32; 2]>), Error> {
    if window < 1 || height < window || width < window || height % window != 0 || width % window != 0
    {
        return Err(Error::InvalidInput(format!(
            "swin windows: image {height} x {width} must be a positive multiple of window {window}"
        )));
    }
    if shift < 0 || shift >= window {
        return Err(Error::InvalidInput(format!(
            "swin windows: shift {shift} must be in 0..{window}"
        )));
    }
    let tokens = batch * (height * width) as usize;
    let mut keys = Vec::with_capacity(tokens);
    let mut rc = Vec::with_capacity(tokens);
    for b in 0..batch as i64 {
        for r in 0..height {
            for c in 0..width {
                let rr = (r - shift).rem_euclid(height);
                let cr = (c - shift).rem_euclid(width);
                let key = (
                    b,
                    rr / window,
                    cr / window,
                    region(rr, height, window, shift),
                    region(cr, width, window, shift),
                );
                keys.push(key);
                rc.push([rr, cr]);
            }
        }
    }
    Ok((partition_by_key(&keys), rc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unshifted_windows_are_full_squares() {
        let (p, _) = swin_partition(2, 14, 21, 7, 0).unwrap();
        assert_eq!(p.windows(), 2 * 2 * 3);
        assert!(p.offsets.windows(2).all(|w| w[1] - w[0] == 49));
    }

    #[test]
    fn shifted_windows_split_at_the_regions() {
        let (p, _) = swin_partition(1, 14, 14, 7, 3).unwrap();
        p.validate(196).unwrap();
        // 4 windows; the three border ones split into 2, 2 and 4 regions
        assert_eq!(p.windows(), 1 + 2 + 2 + 4);
        assert!(swin_partition(1, 10, 14, 7, 3).is_err());
        assert!(swin_partition(1, 14, 14, 7, 7).is_err());
    }
}
