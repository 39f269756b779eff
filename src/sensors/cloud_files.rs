//! Cloud files: KITTI and nuScenes `.bin`, plain float32 x, y, z `.bin`, and PCD (ASCII and
//! binary), read into [`Points`] for `sptr segment`, the benches and the tests.

use crate::{Error, Points};
use std::path::Path;

/// Cloud file layouts `sptr segment` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloudFormat {
    KittiBin,
    NuScenesBin,
    /// float32 × 3 (x, y, z; intensity taken as zero), e.g. the shared dense benchmark cloud.
    XyzBin,
    Pcd,
}

impl CloudFormat {
    /// From the file name: `.pcd` → PCD, `.pcd.bin` (nuScenes' naming) → nuScenes, other `.bin` →
    /// KITTI. `None` when the name says nothing.
    pub fn from_path(path: &Path) -> Option<Self> {
        let name = path.file_name()?.to_string_lossy().to_ascii_lowercase();
        if name.ends_with(".pcd.bin") {
            Some(CloudFormat::NuScenesBin)
        } else if name.ends_with(".pcd") {
            Some(CloudFormat::Pcd)
        } else if name.ends_with(".bin") {
            Some(CloudFormat::KittiBin)
        } else {
            None
        }
    }
}

/// Reads a cloud file in the given format.
pub fn read_cloud(path: &Path, format: CloudFormat) -> Result<Points, Error> {
    match format {
        CloudFormat::KittiBin => Points::read_bin(path, 4),
        CloudFormat::NuScenesBin => Points::read_bin(path, 5),
        CloudFormat::XyzBin => Points::read_bin(path, 3),
        CloudFormat::Pcd => {
            let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("reading {}: {e}", path.display())))?;
            parse_pcd(&bytes).map_err(|e| Error::InvalidInput(format!("{}: {e}", path.display())))
        }
    }
}

/// One PCD field: name, byte size, type letter (F, I, U), count.
#[derive(Debug, Clone)]
struct PcdField {
    name: String,
    size: usize,
    kind: char,
    count: usize,
}

#[derive(Debug, Default)]
struct PcdHeader {
    fields: Vec<PcdField>,
    points: usize,
    data: String,
}

fn parse_list<T: std::str::FromStr>(key: &str, v: &[&str]) -> Result<Vec<T>, String> {
    v.iter().map(|s| s.parse::<T>().map_err(|_| format!("PCD {key}: `{s}` is not valid"))).collect()
}

/// Parses the header; returns it and the byte offset of the data.
fn pcd_header(bytes: &[u8]) -> Result<(PcdHeader, usize), String> {
    let (mut names, mut sizes, mut types, mut counts) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut width, mut height, mut points) = (None, None, None);
    let mut pos = 0;
    let mut data = None;
    while data.is_none() {
        let end = bytes[pos..].iter().position(|&b| b == b'\n').map(|e| pos + e).ok_or("PCD header ends before DATA")?;
        let line = std::str::from_utf8(&bytes[pos..end]).map_err(|_| "PCD header is not text")?.trim();
        pos = end + 1;
        let mut it = line.split_whitespace();
        let Some(key) = it.next() else { continue };
        let rest: Vec<&str> = it.collect();
        match key.to_ascii_uppercase().as_str() {
            k if k.starts_with('#') => {}
            "FIELDS" => names = rest.iter().map(|s| s.to_string()).collect(),
            "SIZE" => sizes = parse_list::<usize>("SIZE", &rest)?,
            "TYPE" => types = rest.iter().map(|s| s.chars().next().unwrap_or('?').to_ascii_uppercase()).collect(),
            "COUNT" => counts = parse_list::<usize>("COUNT", &rest)?,
            "WIDTH" => width = parse_list::<usize>("WIDTH", &rest)?.first().copied(),
            "HEIGHT" => height = parse_list::<usize>("HEIGHT", &rest)?.first().copied(),
            "POINTS" => points = parse_list::<usize>("POINTS", &rest)?.first().copied(),
            "DATA" => data = Some(rest.first().map(|s| s.to_ascii_lowercase()).unwrap_or_default()),
            _ => {} // VERSION, VIEWPOINT
        }
    }
    if counts.is_empty() {
        counts = vec![1; names.len()];
    }
    if names.is_empty() || sizes.len() != names.len() || types.len() != names.len() || counts.len() != names.len() {
        return Err(format!(
            "PCD header: FIELDS ({}), SIZE ({}), TYPE ({}) and COUNT ({}) must have one entry per field",
            names.len(),
            sizes.len(),
            types.len(),
            counts.len()
        ));
    }
    // A field of no bytes or no elements has no value to read (the PCD format has count >= 1).
    if let Some(i) = (0..names.len()).find(|&i| sizes[i] == 0 || counts[i] == 0) {
        return Err(format!("PCD field `{}` has SIZE {} and COUNT {}: both must be at least 1", names[i], sizes[i], counts[i]));
    }
    let points = match (points, width, height) {
        (Some(p), _, _) => p,
        (None, Some(w), Some(h)) => w.checked_mul(h).ok_or("PCD WIDTH x HEIGHT overflows")?,
        _ => return Err("PCD header has neither POINTS nor WIDTH and HEIGHT".into()),
    };
    let fields = (0..names.len())
        .map(|i| PcdField { name: names[i].to_ascii_lowercase(), size: sizes[i], kind: types[i], count: counts[i] })
        .collect();
    Ok((PcdHeader { fields, points, data: data.unwrap_or_default() }, pos))
}

/// Decodes one binary value as f32.
fn pcd_value(b: &[u8], kind: char) -> Option<f32> {
    Some(match (kind, b.len()) {
        ('F', 4) => f32::from_le_bytes(b.try_into().ok()?),
        ('F', 8) => f64::from_le_bytes(b.try_into().ok()?) as f32,
        ('U', 1) => b[0] as f32,
        ('I', 1) => b[0] as i8 as f32,
        ('U', 2) => u16::from_le_bytes(b.try_into().ok()?) as f32,
        ('I', 2) => i16::from_le_bytes(b.try_into().ok()?) as f32,
        ('U', 4) => u32::from_le_bytes(b.try_into().ok()?) as f32,
        ('I', 4) => i32::from_le_bytes(b.try_into().ok()?) as f32,
        ('U', 8) => u64::from_le_bytes(b.try_into().ok()?) as f32,
        ('I', 8) => i64::from_le_bytes(b.try_into().ok()?) as f32,
        _ => return None,
    })
}

/// Parses a PCD file (ASCII or binary data).
pub fn parse_pcd(bytes: &[u8]) -> Result<Points, String> {
    let (h, start) = pcd_header(bytes)?;
    let find = |names: &[&str]| h.fields.iter().position(|f| names.contains(&f.name.as_str()));
    let (Some(ix), Some(iy), Some(iz)) = (find(&["x"]), find(&["y"]), find(&["z"])) else {
        return Err("PCD needs fields x, y and z".into());
    };
    let ii = find(&["intensity", "i"]);
    let wanted: Vec<usize> = [Some(ix), Some(iy), Some(iz), ii].into_iter().flatten().collect();
    for &f in &wanted {
        let fd = &h.fields[f];
        // Values are 1, 2, 4 or 8 bytes; test the type on a zero value of that size.
        if fd.size > 8 || pcd_value(&[0u8; 8][..fd.size], fd.kind).is_none() {
            return Err(format!("PCD field `{}`: TYPE {} SIZE {} is not supported", fd.name, fd.kind, fd.size));
        }
    }
    let cols = match h.data.as_str() {
        "ascii" => pcd_ascii(&bytes[start..], &h, &wanted)?,
        "binary" => pcd_binary(&bytes[start..], &h, &wanted)?,
        other => return Err(format!("PCD DATA `{other}` is not supported (use ascii or binary)")),
    };
    let n = h.points;
    let has_intensity = ii.is_some();
    let mut it = cols.into_iter();
    let (x, y, z) = (it.next().unwrap_or_default(), it.next().unwrap_or_default(), it.next().unwrap_or_default());
    let intensity = if has_intensity { it.next().unwrap_or_default() } else { vec![0.0; n] };
    Ok(Points { x, y, z, intensity, has_intensity, ring: None, time: None })
}

/// Columns (first element of each wanted field) from ASCII rows.
fn pcd_ascii(data: &[u8], h: &PcdHeader, wanted: &[usize]) -> Result<Vec<Vec<f32>>, String> {
    let text = std::str::from_utf8(data).map_err(|_| "PCD ascii data is not text")?;
    // Token index of each field's first element.
    let mut first = Vec::with_capacity(h.fields.len());
    let mut acc = 0;
    for f in &h.fields {
        first.push(acc);
        acc += f.count;
    }
    // Capacity from the data, not the header: a header's POINTS must not reserve memory the rows
    // do not back (every ASCII row takes at least two bytes).
    let mut cols = vec![Vec::with_capacity(h.points.min(data.len() / 2)); wanted.len()];
    let mut rows = text.lines().filter(|l| !l.trim().is_empty());
    for r in 0..h.points {
        let line = rows.next().ok_or_else(|| format!("PCD ascii data has {r} rows, header says {}", h.points))?;
        let tok: Vec<&str> = line.split_whitespace().collect();
        if tok.len() < acc {
            return Err(format!("PCD ascii row {r} has {} values, expected {acc}", tok.len()));
        }
        for (c, &f) in wanted.iter().enumerate() {
            let s = tok[first[f]];
            let v = s.parse::<f32>().map_err(|_| format!("PCD ascii row {r}: `{s}` is not a number"))?;
            cols[c].push(v);
        }
    }
    Ok(cols)
}

/// Columns from binary (row-major, little-endian, packed) data.
fn pcd_binary(data: &[u8], h: &PcdHeader, wanted: &[usize]) -> Result<Vec<Vec<f32>>, String> {
    let mut offset = Vec::with_capacity(h.fields.len());
    let mut step = 0usize;
    for f in &h.fields {
        offset.push(step);
        step = f.size.checked_mul(f.count).and_then(|b| step.checked_add(b)).ok_or("PCD row size overflows")?;
    }
    let need = step.checked_mul(h.points).ok_or("PCD data size overflows")?;
    if data.len() < need {
        return Err(format!("PCD binary data has {} bytes, {} points of {step} bytes need {need}", data.len(), h.points));
    }
    let mut cols = vec![Vec::with_capacity(h.points); wanted.len()];
    for r in 0..h.points {
        let row = &data[r * step..(r + 1) * step];
        for (c, &f) in wanted.iter().enumerate() {
            let fd = &h.fields[f];
            let v = pcd_value(&row[offset[f]..offset[f] + fd.size], fd.kind).unwrap_or(f32::NAN);
            cols[c].push(v);
        }
    }
    Ok(cols)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_and_binary_pcd() {
        let ascii = b"# .PCD v0.7\nVERSION 0.7\nFIELDS x y z intensity\nSIZE 4 4 4 4\nTYPE F F F F\nCOUNT 1 1 1 1\n\
WIDTH 2\nHEIGHT 1\nVIEWPOINT 0 0 0 1 0 0 0\nPOINTS 2\nDATA ascii\n1 2 3 0.5\n-1 -2 -3 7\n";
        let p = parse_pcd(ascii).unwrap();
        assert_eq!((p.x.clone(), p.z.clone(), p.intensity.clone()), (vec![1.0, -1.0], vec![3.0, -3.0], vec![0.5, 7.0]));
        let mut bin = b"FIELDS x y z rgb\nSIZE 4 4 4 4\nTYPE F F F U\nPOINTS 2\nDATA binary\n".to_vec();
        for v in [1.0f32, 2.0, 3.0] {
            bin.extend(v.to_le_bytes());
        }
        bin.extend(7u32.to_le_bytes());
        for v in [4.0f32, 5.0, 6.0] {
            bin.extend(v.to_le_bytes());
        }
        bin.extend(7u32.to_le_bytes());
        let p = parse_pcd(&bin).unwrap();
        assert_eq!(p.y, vec![2.0, 5.0]);
        assert!(!p.has_intensity && p.intensity == vec![0.0, 0.0]);
        assert!(parse_pcd(&bin[..bin.len() - 1]).is_err(), "truncated binary data");
        assert!(parse_pcd(b"FIELDS x y\nSIZE 4 4\nTYPE F F\nPOINTS 0\nDATA ascii\n").is_err(), "no z");
        assert!(parse_pcd(b"FIELDS x y z\nSIZE 4 4 4\nTYPE F F F\nPOINTS 1\nDATA binary_compressed\n").is_err());
    }
}
