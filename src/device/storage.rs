//! Activation storage: FP16, BF16 or FP32, and the `precision` setting that chooses between them.
//!
//! The CUDA path stores activations and weights in 2-byte floats on tensor cores and accumulates
//! in FP32. FP16 (the default) has 11 significant bits but a largest finite value of 65,504: a
//! checkpoint whose activations grow past it overflows (the range guard,
//! [`crate::device::range_guard`], reports it). BF16 has FP32's exponent range (largest finite value
//! 3.39e38) with 8 significant bits, on the same tensor-core instructions at the same rate. FP32
//! storage is the wide fallback (precision `auto` after an overflow, and `fp32`): FP32's range and
//! precision without tensor cores (the FP32-unit convs, the per-query attention, FP32 cuBLAS).
//!
//! One kernel source serves all three: the modules that store activations
//! ([`crate::device::kernels::STORAGE_MODULES`]) are written against `store_t` and its
//! conversions (`kernels/device/storage.cuh`), and NVRTC compiles them again with `-DSPTR_STORAGE_BF16`
//! and `-DSPTR_STORAGE_F32` for the twins (without a define the compiled FP16 code is what it was
//! before storage.cuh existed; the FP32 build leaves out the tensor-core kernels). On the host a
//! buffer's Rust element type says what it holds: `CudaSlice<half::f16>`,
//! `CudaSlice<half::bf16>` or `CudaSlice<f32>`; functions over activations are generic over
//! [`Store`] (implemented by the three), which picks the kernel build, the conversions on upload
//! and download and cuBLAS's data type. A buffer of one format can never reach a kernel of
//! another.

use crate::Error;

/// The format a kernel build (and a device buffer) stores activations in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Storage {
    Fp16,
    Bf16,
    /// The wide fallback: FP32's range and precision, no tensor cores (`conv_direct`, the
    /// per-query attention kernels, FP32 cuBLAS).
    Fp32,
}

impl Storage {
    pub const ALL: [Storage; 3] = [Storage::Fp16, Storage::Bf16, Storage::Fp32];

    /// `fp16`, `bf16` or `fp32`.
    pub fn name(self) -> &'static str {
        match self {
            Storage::Fp16 => "fp16",
            Storage::Bf16 => "bf16",
            Storage::Fp32 => "fp32",
        }
    }

    /// Whether this format's kernel build has the tensor-core kernels (FP32's has not).
    pub fn tensor_cores(self) -> bool {
        self != Storage::Fp32
    }

    /// The preprocessor define that selects this format in `kernels/device/storage.cuh` (none: FP16).
    pub fn define(self) -> Option<&'static str> {
        match self {
            Storage::Fp16 => None,
            Storage::Bf16 => Some("SPTR_STORAGE_BF16"),
            Storage::Fp32 => Some("SPTR_STORAGE_F32"),
        }
    }

    /// The largest finite value this format stores: the range guard's saturation limit.
    pub fn max_finite(self) -> f32 {
        match self {
            Storage::Fp16 => 65504.0,
            Storage::Bf16 => half::bf16::MAX.to_f32(),
            Storage::Fp32 => f32::MAX,
        }
    }
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The `precision` setting (model YAML key, node parameter, `--precision`): how a CUDA model
/// stores its activations. CPU models compute in f32 and ignore it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// FP16 storage: the most precise 2-byte format; a frame that leaves its range is reported by
    /// the range guard and not published as good.
    #[default]
    Fp16,
    /// BF16 storage: FP32's range, 3 fewer significant bits than FP16, the same speed.
    Bf16,
    /// FP32 storage: the CPU path's range and precision, without tensor cores (slower).
    Fp32,
    /// FP16 until the range guard flags a frame; then that frame is computed again in FP32 and
    /// the model stays on FP32 (sticky for the model instance, logged once, counted).
    Auto,
}

impl Precision {
    pub const ALL: [Precision; 4] = [Precision::Fp16, Precision::Bf16, Precision::Fp32, Precision::Auto];

    /// What `auto` moves to after an FP16 frame was flagged.
    pub const FALLBACK: Storage = Storage::Fp32;

    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Fp32 => "fp32",
            Precision::Auto => "auto",
        }
    }

    /// The storage a model with this setting starts in.
    pub fn initial_storage(self) -> Storage {
        match self {
            Precision::Bf16 => Storage::Bf16,
            Precision::Fp32 => Storage::Fp32,
            Precision::Fp16 | Precision::Auto => Storage::Fp16,
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| Error::InvalidInput(format!("unknown precision `{s}`: use fp16, bf16, fp32 or auto")))
    }
}

/// An element type of device activations and weights: `half::f16` or `half::bf16` (2 bytes,
/// tensor cores), or `f32` (the wide fallback, no tensor cores).
#[cfg(feature = "cuda-core")]
pub trait Store:
    cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits + Copy + Default + std::fmt::Debug + Send + Sync + Unpin + 'static
{
    /// The kernel build that reads and writes this type.
    const STORAGE: Storage;
    /// Round to nearest even, as the kernels' `store_from_float`.
    fn from_f32(v: f32) -> Self;
    fn to_f32(self) -> f32;
    /// cuBLAS's name for the type.
    fn blas_type() -> cudarc::cublas::sys::cudaDataType_t;
}

#[cfg(feature = "cuda-core")]
impl Store for half::f16 {
    const STORAGE: Storage = Storage::Fp16;
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    fn blas_type() -> cudarc::cublas::sys::cudaDataType_t {
        cudarc::cublas::sys::cudaDataType_t::CUDA_R_16F
    }
}

#[cfg(feature = "cuda-core")]
impl Store for half::bf16 {
    const STORAGE: Storage = Storage::Bf16;
    fn from_f32(v: f32) -> Self {
        half::bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    fn blas_type() -> cudarc::cublas::sys::cudaDataType_t {
        cudarc::cublas::sys::cudaDataType_t::CUDA_R_16BF
    }
}

#[cfg(feature = "cuda-core")]
impl Store for f32 {
    const STORAGE: Storage = Storage::Fp32;
    fn from_f32(v: f32) -> Self {
        v
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn blas_type() -> cudarc::cublas::sys::cudaDataType_t {
        cudarc::cublas::sys::cudaDataType_t::CUDA_R_32F
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_names_round_trip_and_bad_names_are_errors() {
        for p in Precision::ALL {
            assert_eq!(p.name().parse::<Precision>().unwrap(), p);
            let yaml: Precision = serde_yaml::from_str(p.name()).unwrap();
            assert_eq!(yaml, p);
        }
        let e = "tf32".parse::<Precision>().unwrap_err().to_string();
        assert!(e.contains("tf32") && e.contains("fp16, bf16, fp32 or auto"), "{e}");
        assert_eq!(Precision::default(), Precision::Fp16);
        assert_eq!(Precision::Auto.initial_storage(), Storage::Fp16);
        assert_eq!(Precision::Bf16.initial_storage(), Storage::Bf16);
    }

    #[test]
    fn saturation_limits_are_the_formats_largest_finite_values() {
        assert_eq!(Storage::Fp16.max_finite(), half::f16::MAX.to_f32());
        // kernels/device/storage.cuh's STORE_MAX for BF16, 3.38953139e38f, is this value
        assert_eq!(Storage::Bf16.max_finite(), 3.389_531_4e38);
        assert_eq!(Storage::Bf16.max_finite().to_bits(), 0x7f7f_0000);
        assert_eq!(Storage::Fp16.define(), None);
        assert_eq!(Storage::Bf16.define(), Some("SPTR_STORAGE_BF16"));
        assert_eq!(Storage::Fp32.define(), Some("SPTR_STORAGE_F32"));
        assert_eq!(Storage::Fp32.max_finite(), f32::MAX);
        assert!(Storage::Fp16.tensor_cores() && Storage::Bf16.tensor_cores() && !Storage::Fp32.tensor_cores());
        assert_eq!(Precision::Fp32.initial_storage(), Storage::Fp32);
        assert_eq!(Precision::FALLBACK, Storage::Fp32);
    }
}
