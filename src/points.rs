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
        if stride < 3 {
            return Err(crate::Error::InvalidInput(format!(
                "interleaved point buffer needs at least 3 columns (x, y, z), got {stride}"
            )));
        }
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
        let bytes = std::fs::read(path)
            .map_err(|e| crate::Error::Io(format!("reading {}: {e}", path.display())))?;
        if bytes.len() % (4 * stride) != 0 {
            return Err(crate::Error::InvalidInput(format!(
                "{}: {} bytes is not a whole number of {stride}-float rows; wrong --stride?",
                path.display(),
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
