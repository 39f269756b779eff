//! PNG plots of a report, drawn with `plotters` into an RGB buffer and written with `png`:
//! the confusion matrix (row-normalized), per-class IoU bars and a histogram of end-to-end
//! latency. Plus [`write_rgb_png`], which replay also uses for BEV images.
//!
//! Text needs a font and a machine may have none installed, so a subset of DejaVu Sans
//! (printable ASCII and a few symbols; free license in `src/eval/fonts/LICENSE`) is compiled
//! in and registered with plotters' `ab_glyph` renderer. Characters outside it draw as blanks.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::report::Report;
use super::EvalError;

static FONT: &[u8] = include_bytes!("fonts/DejaVuSans-subset.ttf");
const FAMILY: &str = "sans-serif";

/// Registers the bundled font once; the error (a corrupt font) is kept for every caller.
fn font() -> Result<(), EvalError> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
            .map_err(|_| "the bundled plot font does not load".to_string())
    })
    .clone()
    .map_err(EvalError::Invalid)
}

/// Writes `rgb` (`width × height` pixels, 3 bytes each, row-major from the top) as an 8-bit
/// RGB PNG.
pub fn write_rgb_png(path: &Path, width: u32, height: u32, rgb: &[u8]) -> Result<(), EvalError> {
    let err = |reason: String| EvalError::File {
        path: path.to_path_buf(),
        reason,
    };
    if rgb.len() as u64 != width as u64 * height as u64 * 3 {
        return Err(err(format!(
            "{} bytes for a {width} x {height} RGB image",
            rgb.len()
        )));
    }
    let file = std::fs::File::create(path).map_err(|e| err(e.to_string()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| err(format!("PNG: {e}")))?;
    w.write_image_data(rgb)
        .map_err(|e| err(format!("PNG: {e}")))?;
    w.finish().map_err(|e| err(format!("PNG: {e}")))
}

/// Draws into a fresh white `w × h` buffer with `draw` and writes it to `path`.
fn render(
    path: &Path,
    w: u32,
    h: u32,
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>) -> Result<(), String>,
) -> Result<(), EvalError> {
    render_onto(path, w, h, vec![255u8; w as usize * h as usize * 3], draw)
}

/// [`render`] onto `buf` (`w × h` RGB, e.g. an image already copied in) instead of white.
pub(crate) fn render_onto(
    path: &Path,
    w: u32,
    h: u32,
    mut buf: Vec<u8>,
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>) -> Result<(), String>,
) -> Result<(), EvalError> {
    font()?;
    if buf.len() as u64 != w as u64 * h as u64 * 3 {
        return Err(EvalError::File {
            path: path.to_path_buf(),
            reason: format!("{} bytes for a {w} x {h} RGB image", buf.len()),
        });
    }
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        draw(&root).map_err(|reason| EvalError::File {
            path: path.to_path_buf(),
            reason: format!("drawing the plot: {reason}"),
        })?;
        root.present().map_err(|e| EvalError::File {
            path: path.to_path_buf(),
            reason: format!("drawing the plot: {e}"),
        })?;
    }
    write_rgb_png(path, w, h, &buf)
}

fn s<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Colour of a fraction in [0, 1]: white to dark blue, on a square-root scale so that small
/// confusions stay visible.
fn heat(v: f64) -> RGBColor {
    let v = v.clamp(0.0, 1.0).sqrt();
    let mix = |a: f64, b: f64| (a + (b - a) * v).round() as u8;
    RGBColor(mix(255.0, 8.0), mix(255.0, 48.0), mix(255.0, 107.0))
}

/// Fractions marked on the confusion matrix's colour scale (square-root scale, as [`heat`]).
const SCALE_TICKS: [f64; 6] = [0.0, 0.01, 0.05, 0.25, 0.5, 1.0];

/// The confusion matrix, each row divided by its ground-truth count (unpredicted points
/// included), ground truth down, prediction across, class names on both axes; a colour scale of
/// the fraction on the right.
pub fn confusion_png(report: &Report, path: &Path) -> Result<(), EvalError> {
    let Some(m) = &report.metrics else {
        return Err(EvalError::Invalid(
            "no metrics: the replay had no ground truth".into(),
        ));
    };
    let k = m.confusion.len() as i32;
    let names: Vec<String> = m.classes.iter().map(|c| c.name.clone()).collect();
    let cells_px = (32 * k.max(1) as u32).min(1200);
    // label areas: 160 px of (rotated) names below and to the left; the scale on the right
    let (label_px, scale_px, caption_px) = (160u32, 110u32, 50u32);
    let (w, h) = (label_px + cells_px + 24 + scale_px, caption_px + cells_px + label_px + 12);
    render(path, w, h, |root| {
        root.fill(&WHITE).map_err(s)?;
        let (left, right) = root.split_horizontally(w - scale_px);
        // A segmented i32 range `a..b` has the segments a..=b: `0..k - 1` gives the k classes.
        let mut chart = ChartBuilder::on(&left)
            .caption("Confusion matrix (each row divided by its ground-truth points)", (FAMILY, 18))
            .margin(12)
            .x_label_area_size(label_px)
            .y_label_area_size(label_px)
            .build_cartesian_2d((0..k - 1).into_segmented(), (0..k - 1).into_segmented())
            .map_err(s)?;
        let name = |i: i32| names.get(i as usize).cloned().unwrap_or_default();
        let y_name = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => name(k - 1 - i),
            _ => String::new(),
        };
        // The predicted names are drawn below (turned, reading downwards from their tick):
        // plotters centres a turned axis label on its tick, half of it inside the chart.
        let no_name = |_: &SegmentValue<i32>| String::new();
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(k as usize)
            .y_labels(k as usize)
            .x_label_formatter(&no_name)
            .y_label_formatter(&y_name)
            .y_label_style((FAMILY, 12))
            .x_desc("predicted class")
            .y_desc("ground-truth class")
            .axis_desc_style((FAMILY, 14))
            .draw()
            .map_err(s)?;
        let mut cells = Vec::new();
        for g in 0..k {
            let row = m
                .confusion
                .get(g as usize)
                .map_or(&[][..], |r| r.as_slice());
            let row_total: u64 =
                row.iter().sum::<u64>() + m.unpredicted.get(g as usize).copied().unwrap_or(0);
            for p in 0..k {
                let v = row.get(p as usize).copied().unwrap_or(0);
                let frac = if row_total > 0 {
                    v as f64 / row_total as f64
                } else {
                    0.0
                };
                let y = k - 1 - g;
                cells.push(Rectangle::new(
                    [
                        (SegmentValue::Exact(p), SegmentValue::Exact(y)),
                        (SegmentValue::Exact(p + 1), SegmentValue::Exact(y + 1)),
                    ],
                    heat(frac).filled(),
                ));
            }
        }
        chart.draw_series(cells).map_err(s)?;
        let turned = TextStyle::from((FAMILY, 12).into_font())
            .transform(FontTransform::Rotate90)
            .pos(Pos::new(HPos::Left, VPos::Center));
        for p in 0..k {
            let (x, y) = chart.backend_coord(&(SegmentValue::CenterOf(p), SegmentValue::Exact(0)));
            left.draw(&Text::new(name(p), (x, y + 8), turned.clone())).map_err(s)?;
        }
        colour_scale(&right, caption_px as i32 + 12, cells_px as i32)
    })
}

/// The colour scale of [`heat`] as a vertical bar `height` px tall from `top`: fraction 1 at the
/// top, 0 at the bottom, ticks at [`SCALE_TICKS`] (square-root spacing, as the colours).
fn colour_scale(area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>, top: i32, height: i32) -> Result<(), String> {
    let (x0, x1) = (10, 34);
    let height = height.max(20);
    for py in 0..height {
        let v = 1.0 - py as f64 / (height - 1) as f64; // position on the sqrt scale
        area.draw(&Rectangle::new([(x0, top + py), (x1, top + py + 1)], heat(v * v).filled())).map_err(s)?;
    }
    // the frame just outside the bar, so the bar shows both ends of the scale
    area.draw(&Rectangle::new([(x0 - 1, top - 1), (x1 + 1, top + height + 1)], BLACK.stroke_width(1))).map_err(s)?;
    let style = TextStyle::from((FAMILY, 12).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for f in SCALE_TICKS {
        let y = top + ((1.0 - f.sqrt()) * (height - 1) as f64).round() as i32;
        area.draw(&PathElement::new(vec![(x1 + 1, y), (x1 + 6, y)], BLACK)).map_err(s)?;
        let label = if f >= 0.1 || f == 0.0 { format!("{:.0} %", 100.0 * f) } else { format!("{} %", 100.0 * f) };
        area.draw(&Text::new(label, (x1 + 8, y), style.clone())).map_err(s)?;
    }
    area.draw(&Text::new("of the row", (x0 - 4, top + height + 8), (FAMILY, 12))).map_err(s)?;
    Ok(())
}

/// Per-class IoU as horizontal bars (classes without an IoU have no bar), mIoU in the title.
pub fn iou_png(report: &Report, path: &Path) -> Result<(), EvalError> {
    let Some(m) = &report.metrics else {
        return Err(EvalError::Invalid(
            "no metrics: the replay had no ground truth".into(),
        ));
    };
    let k = m.classes.len() as i32;
    let h = (120 + 24 * k.max(1) as u32).min(1400);
    let title = format!(
        "Per-class IoU (mIoU {})",
        m.miou
            .map_or("-".to_string(), |v| format!("{:.1} %", 100.0 * v))
    );
    render(path, 800, h, |root| {
        root.fill(&WHITE).map_err(s)?;
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FAMILY, 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(150)
            .build_cartesian_2d(0f64..100f64, (0..k - 1).into_segmented())
            .map_err(s)?;
        let name = |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => m
                .classes
                .get((k - 1 - i) as usize)
                .map(|c| c.name.clone())
                .unwrap_or_default(),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(k as usize)
            .y_label_formatter(&name)
            .x_desc("IoU (%)")
            .label_style((FAMILY, 12))
            .draw()
            .map_err(s)?;
        let bars = m.classes.iter().enumerate().filter_map(|(i, c)| {
            let y = k - 1 - i as i32;
            let v = c.iou? * 100.0;
            Some(Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(y)),
                    (v, SegmentValue::Exact(y + 1)),
                ],
                RGBColor(31, 119, 180).filled(),
            ))
        });
        chart.draw_series(bars).map_err(s)?;
        Ok(())
    })
}

/// Histogram of per-frame latencies (ms), p50/p99 in the title.
pub fn latency_png(samples_ms: &[f64], title: &str, path: &Path) -> Result<(), EvalError> {
    if samples_ms.is_empty() {
        return Err(EvalError::Invalid("no latency samples to plot".into()));
    }
    let lo = samples_ms.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = samples_ms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let bins = samples_ms.len().clamp(1, 40);
    // At least 1 % of the largest value a bin, so one sample (or equal ones) draws a bar
    // on a readable axis rather than a micro-range.
    let width = ((hi - lo) / bins as f64).max(hi.abs() * 0.01).max(1e-3);
    let mut counts = vec![0u32; bins];
    for &v in samples_ms {
        let b = (((v - lo) / width) as usize).min(bins - 1);
        counts[b] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(1) as f64 * 1.1;
    let (x0, x1) = (lo - width * 0.5, lo + width * (bins as f64 + 0.5));
    render(path, 800, 480, |root| {
        root.fill(&WHITE).map_err(s)?;
        let mut chart = ChartBuilder::on(root)
            .caption(title, (FAMILY, 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(x0..x1, 0f64..top.max(1.0))
            .map_err(s)?;
        chart
            .configure_mesh()
            .x_desc("ms")
            .y_desc("frames")
            .y_label_formatter(&|v| {
                if v.fract() == 0.0 {
                    format!("{v:.0}")
                } else {
                    String::new()
                }
            })
            .label_style((FAMILY, 12))
            .draw()
            .map_err(s)?;
        let bars = counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| {
                let a = lo + width * i as f64;
                Rectangle::new(
                    [(a, 0.0), (a + width * 0.9, c as f64)],
                    RGBColor(214, 39, 40).filled(),
                )
            });
        chart.draw_series(bars).map_err(s)?;
        Ok(())
    })
}
