//! NumPy `.npy` files of float32 (little-endian, C order): how `sptr camera-features` writes
//! feature maps for inspection and how the camera parity harness exchanges tensors with PyTorch.

use crate::Error;
use std::path::Path;

const MAGIC: &[u8] = b"\x93NUMPY";

/// The bytes of a version 1.0 `.npy` file holding `data` with `shape`.
pub fn to_bytes(shape: &[usize], data: &[f32]) -> Result<Vec<u8>, Error> {
    let numel: usize = shape.iter().product();
    if numel != data.len() {
        return Err(Error::InvalidInput(format!("npy: {} values for shape {shape:?}", data.len())));
    }
    let dims = match shape {
        [d] => format!("({d},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {dims}, }}");
    // magic (6) + version (2) + length (2) + header, padded with spaces to a multiple of 64, '\n' last
    let total = (10 + header.len() + 1).next_multiple_of(64);
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let len = u16::try_from(header.len()).map_err(|_| Error::InvalidInput(format!("npy: shape {shape:?} makes too long a header")))?;
    let mut out = Vec::with_capacity(total + 4 * data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in data {
        out.extend_from_slice(&v.to_le_bytes());
    }
    Ok(out)
}

/// Writes a float32 `.npy` file.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), Error> {
    std::fs::write(path, to_bytes(shape, data)?).map_err(|e| Error::Io(format!("{}: cannot write: {e}", path.display())))
}

/// Parses a float32 C-order `.npy` file's bytes into (shape, values); `source` names it in errors.
pub fn from_bytes(bytes: &[u8], source: &str) -> Result<(Vec<usize>, Vec<f32>), Error> {
    let bad = |why: String| Error::InvalidInput(format!("{source}: not a float32 .npy file: {why}"));
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(bad("no NUMPY magic".into()));
    }
    let (hlen, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(bad(format!("version {v}"))),
    };
    let header = bytes.get(start..start + hlen).ok_or_else(|| bad("truncated header".into()))?;
    let header = std::str::from_utf8(header).map_err(|_| bad("header is not text".into()))?;
    let compact: String = header.chars().filter(|c| !c.is_whitespace()).collect();
    if !compact.contains("'descr':'<f4'") {
        return Err(bad(format!("dtype is not little-endian float32 (header {})", header.trim())));
    }
    if !compact.contains("'fortran_order':False") {
        return Err(bad("Fortran order".into()));
    }
    let dims = compact
        .split("'shape':(")
        .nth(1)
        .and_then(|s| s.split(')').next())
        .ok_or_else(|| bad(format!("no shape in {}", header.trim())))?;
    let shape = dims
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| bad(format!("shape entry `{s}`"))))
        .collect::<Result<Vec<_>, _>>()?;
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    let body = &bytes[start + hlen..];
    if numel.checked_mul(4) != Some(body.len()) {
        return Err(bad(format!("{} data bytes for shape {shape:?}", body.len())));
    }
    Ok((shape, body.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
}

/// Reads a float32 C-order `.npy` file.
pub fn read_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>), Error> {
    let bytes = std::fs::read(path).map_err(|e| Error::Io(format!("{}: cannot read: {e}", path.display())))?;
    from_bytes(&bytes, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_header_layout() {
        for shape in [vec![5usize], vec![2, 3], vec![1, 2, 3, 4], vec![0, 3]] {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 1.0).collect();
            let b = to_bytes(&shape, &data).unwrap();
            let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
            assert_eq!((10 + hlen) % 64, 0, "data starts 64-byte aligned");
            assert_eq!(b[10 + hlen - 1], b'\n');
            assert_eq!(from_bytes(&b, "t").unwrap(), (shape.clone(), data));
        }
        // NumPy's own header for np.zeros((2, 3), np.float32)
        let mut b = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }".to_vec();
        b.resize(128 - 1, b' ');
        b.push(b'\n');
        b.extend_from_slice(&[0u8; 24]);
        assert_eq!(from_bytes(&b, "np").unwrap(), (vec![2, 3], vec![0.0; 6]));
    }

    #[test]
    fn bad_files_are_errors() {
        let good = to_bytes(&[2, 2], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        assert!(from_bytes(&good[..good.len() - 1], "t").is_err(), "truncated data");
        assert!(from_bytes(&good[..20], "t").is_err(), "truncated header");
        assert!(from_bytes(b"not a numpy file", "t").is_err());
        let f8 = String::from_utf8_lossy(&good).replace("<f4", "<f8").into_bytes();
        assert!(from_bytes(&f8, "t").unwrap_err().to_string().contains("float32"));
        let fo = String::from_utf8_lossy(&good[..128]).replace("False", "True ").into_bytes();
        assert!(from_bytes(&[fo, good[128..].to_vec()].concat(), "t").is_err(), "Fortran order");
        assert!(to_bytes(&[3], &[1.0]).is_err());
    }
}
