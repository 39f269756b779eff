//! BEV grids as PNG images for people: the colour grid turned so that it reads like a map.

use crate::bev::label_grid::{BevGrids, NO_DATA};

/// The colour grid as a viewer expects a bird's-eye view: +x (forward) up, +y (left) to the
/// left; cells without points dark grey. Returns width, height, RGB bytes.
pub fn bev_view(g: &BevGrids) -> (u32, u32, Vec<u8>) {
    let (w, h) = (g.width, g.height);
    // Image rows run along x (top = largest x), columns along y (left = largest y).
    let mut rgb = vec![0u8; w * h * 3];
    for r in 0..w {
        for c in 0..h {
            let (ix, iy) = (w - 1 - r, h - 1 - c);
            let cell = iy * w + ix;
            let px = (r * h + c) * 3;
            if g.labels[cell] == NO_DATA {
                rgb[px..px + 3].copy_from_slice(&[40, 40, 40]);
            } else {
                rgb[px..px + 3].copy_from_slice(&g.rgb[cell * 3..cell * 3 + 3]);
            }
        }
    }
    (h as u32, w as u32, rgb)
}
