//! `SparseTensor`: the CPU (f32) sparse tensor that sparse convolutions read and write.
//!
//! Coordinates are batch first, `[b, x, y, z]` int32 (TorchSparse v2.1 order). Every site lies in
//! the tensor's spatial range `[origin, origin + spatial_shape)` per axis; the origin may be
//! negative (negative coordinates are allowed). With origin 0 the range is exactly spconv's
//! `spatial_shape` convention (coordinates in `[0, shape)`). Features are row-major `[N, C]`.
//! The tensor stride is the product of the strides of the convolutions that produced it
//! (1 for voxelizer output): it records the scale, it does not scale the coordinates
//! (a stride-`s` conv maps coordinates into a grid `s` times coarser).

use crate::Error;
use std::collections::HashMap;

/// A sparse tensor on the CPU: unique coordinates `[b, x, y, z]` and f32 features `[N, C]`.
#[derive(Debug, Clone, PartialEq)]
pub struct SparseTensor {
    coords: Vec<[i32; 4]>,
    feats: Vec<f32>,
    channels: usize,
    stride: [i32; 3],
    origin: [i32; 3],
    spatial_shape: [i32; 3],
}

impl SparseTensor {
    /// A tensor with tensor stride 1 and origin 0: every coordinate in `[0, spatial_shape)`.
    pub fn new(
        coords: Vec<[i32; 4]>,
        feats: Vec<f32>,
        channels: usize,
        spatial_shape: [i32; 3],
    ) -> Result<Self, Error> {
        Self::with_geometry(coords, feats, channels, [1, 1, 1], [0, 0, 0], spatial_shape)
    }

    /// A tensor with every field given. Errors on: zero channels, `feats.len() != N * channels`,
    /// a non-positive stride or spatial extent, a negative batch index, a coordinate outside
    /// `[origin, origin + spatial_shape)`, a duplicate coordinate, more than `u32::MAX` sites.
    pub fn with_geometry(
        coords: Vec<[i32; 4]>,
        feats: Vec<f32>,
        channels: usize,
        stride: [i32; 3],
        origin: [i32; 3],
        spatial_shape: [i32; 3],
    ) -> Result<Self, Error> {
        validate_geometry(stride, origin, spatial_shape)?;
        if channels == 0 {
            return Err(Error::InvalidInput(
                "sparse tensor: channels must be > 0".into(),
            ));
        }
        let expected = coords
            .len()
            .checked_mul(channels)
            .ok_or_else(|| Error::InvalidInput("sparse tensor: N * channels overflows".into()))?;
        if feats.len() != expected {
            return Err(Error::InvalidInput(format!(
                "sparse tensor: {} features for {} sites x {} channels (expected {})",
                feats.len(),
                coords.len(),
                channels,
                expected
            )));
        }
        if coords.len() > u32::MAX as usize {
            return Err(Error::InvalidInput(format!(
                "sparse tensor: {} sites exceed the u32 index range",
                coords.len()
            )));
        }
        validate_sites(&coords, origin, spatial_shape)?;
        Ok(Self {
            coords,
            feats,
            channels,
            stride,
            origin,
            spatial_shape,
        })
    }

    /// The same sites and geometry with new features `[N, channels]`.
    pub fn with_feats(&self, feats: Vec<f32>, channels: usize) -> Result<Self, Error> {
        if channels == 0 || feats.len() != self.coords.len() * channels {
            return Err(Error::InvalidInput(format!(
                "sparse tensor: {} features for {} sites x {} channels",
                feats.len(),
                self.coords.len(),
                channels
            )));
        }
        Ok(Self {
            coords: self.coords.clone(),
            feats,
            channels,
            ..*self
        })
    }

    /// Builds a tensor from parts already known to be valid (kernel-map outputs).
    pub(crate) fn from_parts_unchecked(
        coords: Vec<[i32; 4]>,
        feats: Vec<f32>,
        channels: usize,
        stride: [i32; 3],
        origin: [i32; 3],
        spatial_shape: [i32; 3],
    ) -> Self {
        Self {
            coords,
            feats,
            channels,
            stride,
            origin,
            spatial_shape,
        }
    }

    pub fn len(&self) -> usize {
        self.coords.len()
    }
    pub fn is_empty(&self) -> bool {
        self.coords.is_empty()
    }
    pub fn coords(&self) -> &[[i32; 4]] {
        &self.coords
    }
    pub fn feats(&self) -> &[f32] {
        &self.feats
    }
    pub fn feats_mut(&mut self) -> &mut [f32] {
        &mut self.feats
    }
    pub fn into_feats(self) -> Vec<f32> {
        self.feats
    }
    pub fn channels(&self) -> usize {
        self.channels
    }
    pub fn stride(&self) -> [i32; 3] {
        self.stride
    }
    pub fn origin(&self) -> [i32; 3] {
        self.origin
    }
    pub fn spatial_shape(&self) -> [i32; 3] {
        self.spatial_shape
    }
    /// Feature row `i` (`channels` values). Panics if `i >= len()` (an index the caller owns).
    pub fn row(&self, i: usize) -> &[f32] {
        &self.feats[i * self.channels..(i + 1) * self.channels]
    }
    /// Number of batches: `1 + max(b)`, 0 when empty.
    pub fn batch_size(&self) -> usize {
        self.coords
            .iter()
            .map(|c| c[0] as usize + 1)
            .max()
            .unwrap_or(0)
    }
}

pub(crate) fn validate_geometry(
    stride: [i32; 3],
    origin: [i32; 3],
    spatial_shape: [i32; 3],
) -> Result<(), Error> {
    for a in 0..3 {
        if stride[a] < 1 {
            return Err(Error::InvalidInput(format!(
                "sparse tensor: tensor stride {:?} must be >= 1",
                stride
            )));
        }
        if spatial_shape[a] < 1 {
            return Err(Error::InvalidInput(format!(
                "sparse tensor: spatial shape {:?} must be >= 1 per axis",
                spatial_shape
            )));
        }
        if origin[a] as i64 + spatial_shape[a] as i64 > i32::MAX as i64 {
            return Err(Error::InvalidInput(format!(
                "sparse tensor: origin {:?} + shape {:?} overflows i32",
                origin, spatial_shape
            )));
        }
    }
    Ok(())
}

/// The site checks of [`SparseTensor::with_geometry`] on coordinates alone (no copies): batch
/// indices ≥ 0, every coordinate inside `[origin, origin + spatial_shape)`, no duplicates. For
/// paths that keep the sites elsewhere (the CUDA network uploads them straight to the device).
pub fn validate_sites(coords: &[[i32; 4]], origin: [i32; 3], spatial_shape: [i32; 3]) -> Result<(), Error> {
    let mut seen: HashMap<[i32; 4], usize> = HashMap::with_capacity(coords.len());
    for (i, c) in coords.iter().enumerate() {
        if c[0] < 0 {
            return Err(Error::InvalidInput(format!(
                "sparse tensor: site {i} has negative batch index {}",
                c[0]
            )));
        }
        for a in 0..3 {
            let lo = origin[a] as i64;
            let hi = lo + spatial_shape[a] as i64;
            let v = c[a + 1] as i64;
            if v < lo || v >= hi {
                return Err(Error::InvalidInput(format!(
                    "sparse tensor: site {i} coordinate {:?} outside the spatial range \
                     origin {:?} shape {:?}",
                    c, origin, spatial_shape
                )));
            }
        }
        if let Some(j) = seen.insert(*c, i) {
            return Err(Error::InvalidInput(format!(
                "sparse tensor: duplicate coordinate {:?} at sites {j} and {i}",
                c
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates() {
        let ok = SparseTensor::new(vec![[0, 1, 2, 3], [1, 1, 2, 3]], vec![0.0; 4], 2, [4, 4, 4]);
        assert!(ok.is_ok());
        assert_eq!(ok.unwrap().batch_size(), 2);
        // duplicate
        assert!(
            SparseTensor::new(vec![[0, 1, 2, 3], [0, 1, 2, 3]], vec![0.0; 4], 2, [4, 4, 4])
                .is_err()
        );
        // bad feature length
        assert!(SparseTensor::new(vec![[0, 1, 2, 3]], vec![0.0; 3], 2, [4, 4, 4]).is_err());
        // out of range
        assert!(SparseTensor::new(vec![[0, 4, 2, 3]], vec![0.0; 2], 2, [4, 4, 4]).is_err());
        assert!(SparseTensor::new(vec![[0, -1, 2, 3]], vec![0.0; 2], 2, [4, 4, 4]).is_err());
        // negative coordinates with an origin
        assert!(SparseTensor::with_geometry(
            vec![[0, -1, -4, 3]],
            vec![0.0; 2],
            2,
            [1, 1, 1],
            [-4, -4, -4],
            [8, 8, 8]
        )
        .is_ok());
        // negative batch
        assert!(SparseTensor::new(vec![[-1, 0, 0, 0]], vec![0.0; 2], 2, [4, 4, 4]).is_err());
        // empty is fine
        assert!(SparseTensor::new(vec![], vec![], 3, [4, 4, 4]).is_ok());
    }
}
