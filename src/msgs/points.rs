//! Structure-of-arrays point clouds: what the codec decodes into and what voxelization reads.

/// A decoded point cloud, one `Vec` per attribute, all of the same length.
///
/// `intensity` is zero-filled when the source has no intensity field (`has_intensity` says so);
/// `ring` and `time` are present only when the source carries them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Points {
    pub x: Vec<f32>,
    pub y: Vec<f32>,
    pub z: Vec<f32>,
    pub intensity: Vec<f32>,
    pub has_intensity: bool,
    pub ring: Option<Vec<u16>>,
    /// Per-point time offset in seconds relative to the message stamp, when the source has one.
    pub time: Option<Vec<f32>>,
}

/// Most float32 columns per point [`Points::from_interleaved`] and [`Points::read_bin`] take
/// (far above any sensor format; keeps `4 * stride` bytes per row from overflowing).
pub const MAX_STRIDE: usize = 1024;

/// A stride (float32 columns per point) must hold x, y, z and stay below [`MAX_STRIDE`].
fn check_stride(stride: usize) -> Result<(), crate::Error> {
    if (3..=MAX_STRIDE).contains(&stride) {
        return Ok(());
    }
    Err(crate::Error::InvalidInput(format!(
        "a stride of {stride} float32 columns per point: need 3 (x, y, z) to {MAX_STRIDE}, e.g. 4 for KITTI, 5 for nuScenes"
    )))
}

impl Points {
    pub fn len(&self) -> usize {
        self.x.len()
    }

    pub fn is_empty(&self) -> bool {
        self.x.is_empty()
    }

    /// Points from an interleaved float32 buffer of `stride` columns (x, y, z, intensity, ...),
    /// the layout of KITTI (`stride` 4) and nuScenes (`stride` 5) `.bin` files.
    pub fn from_interleaved(values: &[f32], stride: usize) -> Result<Points, crate::Error> {
        check_stride(stride)?;
        if values.len() % stride != 0 {
            return Err(crate::Error::InvalidInput(format!(
                "interleaved point buffer of {} floats is not a multiple of {stride} columns",
                values.len()
            )));
        }
        let n = values.len() / stride;
        let col = |c: usize| -> Vec<f32> { (0..n).map(|i| values[i * stride + c]).collect() };
        let has_intensity = stride >= 4;
        Ok(Points {
            x: col(0),
            y: col(1),
            z: col(2),
            intensity: if has_intensity { col(3) } else { vec![0.0; n] },
            has_intensity,
            ring: None,
            time: None,
        })
    }

    /// Reads a KITTI/nuScenes style `.bin` file of little-endian float32 rows of `stride` columns.
    pub fn read_bin(path: &std::path::Path, stride: usize) -> Result<Points, crate::Error> {
        check_stride(stride)?;
        let bytes = std::fs::read(path)
            .map_err(|e| crate::Error::Io(format!("reading {}: {e}", path.display())))?;
        Points::parse_bin(&bytes, stride, &path.display().to_string())
    }

    /// Parses the bytes of a `.bin` cloud (little-endian float32 rows of `stride` columns);
    /// `source` names them in errors.
    pub fn parse_bin(bytes: &[u8], stride: usize, source: &str) -> Result<Points, crate::Error> {
        check_stride(stride)?;
        if bytes.len() % (4 * stride) != 0 {
            return Err(crate::Error::InvalidInput(format!(
                "{source}: {} bytes is not a whole number of {stride}-float rows; wrong --stride?",
                bytes.len()
            )));
        }
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Points::from_interleaved(&values, stride)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_small_and_huge_strides_are_errors() {
        let dir = std::env::temp_dir().join(format!("sptr-points-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("cloud.bin");
        std::fs::write(&file, [0u8; 60]).unwrap();
        for stride in [0, 1, 2, MAX_STRIDE + 1, usize::MAX / 4 + 1, usize::MAX] {
            let e = Points::read_bin(&file, stride).unwrap_err().to_string();
            assert!(e.contains(&format!("stride of {stride}")), "{e}");
            let e = Points::from_interleaved(&[0.0; 12], stride).unwrap_err().to_string();
            assert!(e.contains(&format!("stride of {stride}")), "{e}");
        }
        assert_eq!(Points::read_bin(&file, 3).unwrap().len(), 5);
        assert_eq!(Points::from_interleaved(&[0.0; 12], 4).unwrap().len(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
