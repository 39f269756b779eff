//! Value parsers of the numeric and named arguments: every number is range-checked when it is
//! parsed, so no value (zero, negative, huge, NaN) reaches a command; clap prints the error and
//! exits 2.

use crate::device::storage::Precision;
use crate::replay::ProgressMode;

/// An integer in `LO..=HI`.
pub fn int_in<const LO: usize, const HI: usize>(s: &str) -> Result<usize, String> {
    let v: usize = s.trim().parse().map_err(|_| format!("`{s}` is not a whole number from {LO} to {HI}"))?;
    if !(LO..=HI).contains(&v) {
        return Err(format!("{v} is out of range: use {LO} to {HI}"));
    }
    Ok(v)
}

/// A raw image size `WIDTHxHEIGHT`, each side 1 to 16384 pixels.
pub fn image_size_arg(s: &str) -> Result<(usize, usize), String> {
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(|| format!("`{s}` is not WIDTHxHEIGHT, e.g. 1600x900"))?;
    let side = |v: &str, what: &str| int_in::<1, 16384>(v).map_err(|e| format!("{what} of `{s}`: {e} (pixels)"));
    Ok((side(w, "width")?, side(h, "height")?))
}

/// float32 columns per point in a `.bin` file: at least x, y, z.
pub fn stride_arg(s: &str) -> Result<usize, String> {
    int_in::<3, 64>(s).map_err(|e| format!("{e} (float32 columns per point: 4 KITTI, 5 nuScenes, 3 x/y/z only)"))
}

/// A voxel size in metres: finite, from 1 mm to 100 m.
pub fn voxel_size_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number (metres)"))?;
    if !(v.is_finite() && (0.001..=100.0).contains(&v)) {
        return Err(format!("{v} m is not a usable voxel size: use 0.001 to 100 (metres)"));
    }
    Ok(v)
}

/// A memory bandwidth in GB/s: finite, positive, at most 1,000,000.
pub fn bandwidth_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number (GB/s)"))?;
    if !(v.is_finite() && v > 0.0 && v <= 1e6) {
        return Err(format!("{v} GB/s is not a usable bandwidth: use a positive number up to 1000000"));
    }
    Ok(v)
}

/// A publishing rate in Hz: finite, 0.1 to 1000.
pub fn rate_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number (Hz)"))?;
    if !(v.is_finite() && (0.1..=1000.0).contains(&v)) {
        return Err(format!("{v} Hz is not a usable rate: use 0.1 to 1000"));
    }
    Ok(v)
}

/// A bench duration in seconds: finite, 0.1 to 86,400.
pub fn duration_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number (seconds)"))?;
    if !(v.is_finite() && (0.1..=86_400.0).contains(&v)) {
        return Err(format!("{v} s is not a usable duration: use 0.1 to 86400"));
    }
    Ok(v)
}

/// A fraction in [0, 1].
pub fn fraction_arg(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("`{s}` is not a number"))?;
    if !(v.is_finite() && (0.0..=1.0).contains(&v)) {
        return Err(format!("{v} is not a fraction: use 0 to 1 (e.g. 0.995)"));
    }
    Ok(v)
}

/// `--precision`'s values.
pub fn precision_arg(v: &str) -> Result<Precision, String> {
    v.parse().map_err(|e: crate::Error| e.to_string())
}

/// `--progress` (`auto`, `plain`, `quiet`; clap has checked the word).
pub fn progress_mode(s: &str) -> ProgressMode {
    match s {
        "plain" => ProgressMode::Plain,
        "quiet" => ProgressMode::Quiet,
        _ => ProgressMode::Auto,
    }
}
