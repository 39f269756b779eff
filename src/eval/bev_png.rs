//! BEV grids as PNG images for people: the colour grid turned so that it reads like a map,
//! enlarged to at least [`MIN_GRID_PX`] pixels, with a legend (each class's colour and name,
//! how many cells it has, and the colour of cells without points) and a line saying which way is
//! forward and how large a cell is.

use std::path::Path;

use plotters::prelude::*;

use crate::ops::label_grid::cpu::{BevGrids, NO_DATA};
use crate::eval::plots::render_onto;
use crate::eval::EvalError;

/// Colour of cells without points.
pub const EMPTY_RGB: [u8; 3] = [40, 40, 40];
/// A small grid is drawn with square blocks of pixels so that its longer side is at least this.
pub const MIN_GRID_PX: usize = 512;

const FAMILY: &str = "sans-serif";
const MARGIN: usize = 10;
const CAPTION_PX: usize = 40;
const LEGEND_PX: usize = 260;
const ROW_PX: usize = 18;

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
                rgb[px..px + 3].copy_from_slice(&EMPTY_RGB);
            } else {
                rgb[px..px + 3].copy_from_slice(&g.rgb[cell * 3..cell * 3 + 3]);
            }
        }
    }
    (h as u32, w as u32, rgb)
}

/// What the legend says: class names and palette (the model YAML's), the cell size, a title.
pub struct BevLegend<'a> {
    pub class_names: &'a [String],
    pub palette: &'a [[u8; 3]],
    pub resolution: f64,
    pub title: String,
}

/// Pixels per grid cell, so that the longer side reaches [`MIN_GRID_PX`].
pub fn cell_px(g: &BevGrids) -> usize {
    let longer = g.width.max(g.height).max(1);
    MIN_GRID_PX.div_ceil(longer).max(1)
}

/// Writes the BEV PNG: the grid as [`bev_view`] lays it out (enlarged by [`cell_px`]), the
/// title and orientation above it, the legend to its right.
pub fn write_bev_png(path: &Path, g: &BevGrids, legend: &BevLegend) -> Result<(), EvalError> {
    let (vw, vh, view) = bev_view(g);
    let (vw, vh) = (vw as usize, vh as usize);
    let s = cell_px(g);
    let (gw, gh) = (vw * s, vh * s);
    let rows = legend.class_names.len() + 2;
    let w = MARGIN + gw + MARGIN + LEGEND_PX;
    let h = CAPTION_PX + gh.max(rows * ROW_PX + ROW_PX) + MARGIN;
    let mut buf = vec![255u8; w * h * 3];
    for y in 0..gh {
        for x in 0..gw {
            let src = ((y / s) * vw + x / s) * 3;
            let dst = ((CAPTION_PX + y) * w + MARGIN + x) * 3;
            buf[dst..dst + 3].copy_from_slice(&view[src..src + 3]);
        }
    }
    let mut cells = vec![0usize; legend.class_names.len()];
    let mut empty = 0usize;
    for &l in &g.labels {
        match cells.get_mut(l as usize) {
            Some(c) if l != NO_DATA => *c += 1,
            _ => empty += 1,
        }
    }
    render_onto(path, w as u32, h as u32, buf, |root| {
        let text = |t: &str, x: usize, y: usize, size: u32| {
            root.draw(&Text::new(t.to_string(), (x as i32, y as i32), (FAMILY, size)))
                .map_err(|e| e.to_string())
        };
        text(&legend.title, MARGIN, 4, 16)?;
        text(
            &format!(
                "up: +x (forward), left: +y; 1 cell = {} m, {} x {} cells",
                legend.resolution, g.width, g.height
            ),
            MARGIN,
            22,
            12,
        )?;
        let lx = MARGIN + gw + MARGIN;
        text("class (cells)", lx, CAPTION_PX, 13)?;
        let swatch = |rgb: [u8; 3], y: usize| {
            let (x0, y0) = (lx as i32, y as i32 + 2);
            root.draw(&Rectangle::new([(x0, y0), (x0 + 14, y0 + 12)], RGBColor(rgb[0], rgb[1], rgb[2]).filled()))
                .and_then(|_| root.draw(&Rectangle::new([(x0, y0), (x0 + 14, y0 + 12)], BLACK.stroke_width(1))))
                .map_err(|e| e.to_string())
        };
        for (i, name) in legend.class_names.iter().enumerate() {
            let y = CAPTION_PX + ROW_PX * (i + 1);
            let rgb = legend.palette.get(i).copied().unwrap_or([0, 0, 0]);
            swatch(rgb, y)?;
            text(&format!("{i} {name} ({})", cells[i]), lx + 20, y + 2, 12)?;
        }
        let y = CAPTION_PX + ROW_PX * (legend.class_names.len() + 1);
        swatch(EMPTY_RGB, y)?;
        text(&format!("no points ({empty})"), lx + 20, y + 2, 12)?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_png(path: &Path) -> (usize, usize, Vec<u8>) {
        let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut r = dec.read_info().unwrap();
        let mut buf = vec![0u8; r.output_buffer_size().unwrap()];
        let info = r.next_frame(&mut buf).unwrap();
        assert_eq!(info.color_type, png::ColorType::Rgb);
        buf.truncate(info.buffer_size());
        (info.width as usize, info.height as usize, buf)
    }

    /// The PNG has the grid (enlarged, turned like a map) and a legend with every class's
    /// colour swatch, plus the colour of empty cells.
    #[test]
    fn bev_png_has_the_grid_and_a_legend() {
        // 4 cells along x, 3 along y; classes 0..3 with distinct colours
        let palette = [[200, 10, 10], [10, 200, 10], [10, 10, 200]];
        let names: Vec<String> = ["car", "road", "vegetation"].iter().map(|s| s.to_string()).collect();
        let (w, h) = (4usize, 3usize);
        let mut labels = vec![NO_DATA; w * h];
        labels[0] = 0; // ix 0, iy 0: the bottom right of the view
        labels[w * h - 1] = 2; // ix 3, iy 2: the top left
        let mut rgb = vec![0u8; w * h * 3];
        for (i, &l) in labels.iter().enumerate() {
            if l != NO_DATA {
                rgb[i * 3..i * 3 + 3].copy_from_slice(&palette[l as usize]);
            }
        }
        let g = BevGrids { width: w, height: h, labels, rgb, occupancy: vec![-1; w * h] };
        let legend = BevLegend { class_names: &names, palette: &palette, resolution: 0.5, title: "t".into() };
        let path = std::env::temp_dir().join(format!("sptr-bev-png-{}.png", std::process::id()));
        write_bev_png(&path, &g, &legend).unwrap();
        let (pw, ph, px) = read_png(&path);
        let _ = std::fs::remove_file(&path);
        let s = cell_px(&g);
        assert_eq!(s, 128, "a 4 x 3 grid is drawn 128 px a cell");
        let (gw, gh) = (h * s, w * s); // the view is turned: columns along y, rows along x
        assert_eq!((pw, ph), (MARGIN + gw + MARGIN + LEGEND_PX, CAPTION_PX + gh + MARGIN));
        let at = |x: usize, y: usize| -> [u8; 3] { px[(y * pw + x) * 3..(y * pw + x) * 3 + 3].try_into().unwrap() };
        // top left of the view: +x largest, +y largest = cell (3, 2), class 2
        assert_eq!(at(MARGIN + s / 2, CAPTION_PX + s / 2), palette[2]);
        // bottom right: cell (0, 0), class 0
        assert_eq!(at(MARGIN + gw - s / 2, CAPTION_PX + gh - s / 2), palette[0]);
        assert_eq!(at(MARGIN + gw / 2, CAPTION_PX + gh / 2), EMPTY_RGB);
        // the legend: a swatch per class in its colour, then the empty colour
        let lx = MARGIN + gw + MARGIN + 7;
        for (i, c) in palette.iter().enumerate() {
            assert_eq!(at(lx, CAPTION_PX + ROW_PX * (i + 1) + 8), *c, "swatch of class {i}");
        }
        assert_eq!(at(lx, CAPTION_PX + ROW_PX * (names.len() + 1) + 8), EMPTY_RGB);
        // and text beside each swatch (dark pixels where the names are)
        for i in 0..names.len() + 1 {
            let y0 = CAPTION_PX + ROW_PX * (i + 1);
            let dark = (lx + 20..lx + 120).flat_map(|x| (y0..y0 + ROW_PX).map(move |y| (x, y))).filter(|&(x, y)| at(x, y)[0] < 128).count();
            assert!(dark > 20, "no text beside swatch {i}");
        }
    }
}
