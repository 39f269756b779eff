//! The CUDA network in the model's `precision` ([`Precision`]): FP16, BF16, FP32, or `auto`.
//!
//! `auto` runs FP16 (tensor cores, 11 significant bits) until the range guard
//! ([`crate::device::range_guard`]) flags a frame. That frame is then computed again in FP32, whose range
//! and precision are the CPU path's, and the result published is the FP32 one; the model stays on
//! FP32 from then on (sticky for this model instance: a checkpoint that left FP16's range once
//! will again). The switch is logged once and counted ([`PrecisionStatus`]). Both networks are
//! uploaded, and the FP32 kernels loaded, when the model is: the switching frame pays one more
//! forward, not an NVRTC compile or an upload in the middle of a drive; the price is the weights'
//! device memory three times over (FP16 and FP32).
//!
//! Why FP32 and not BF16 for the fallback: BF16 keeps FP32's range but only 8 significant bits.
//! On weights that overflow FP16 (FP32 activations of 1.3e6: tests/sphereformer/precision_gpu.rs)
//! the BF16 network agrees with the CPU on 98.9 % of points, and the same
//! CPU forward with only its layer outputs and weights rounded to BF16 agrees on 98.9 % too: the
//! loss is BF16's rounding itself, not the kernels. FP32 storage (no tensor cores) agrees on all
//! but the near-ties. `bf16` stays a setting of its own: the same speed as FP16 and its range,
//! at BF16's precision.

use crate::device::cuda::CudaDevice;
use crate::device::kernels::STORAGE_MODULES;
use crate::device::storage::{Precision, Storage};
use crate::models::sphereformer::network::cuda::CudaSphereFormer;
use crate::models::sphereformer::network::SphereFormer;
use crate::Error;
use half::{bf16, f16};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Where a model's precision stands (for diagnostics and reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrecisionStatus {
    /// The setting.
    pub precision: Precision,
    /// What the next frame is computed in.
    pub storage: Storage,
    /// Frames computed again in FP32 after the FP16 pass was flagged (`auto`).
    pub recomputed_frames: u64,
}

/// The uploaded network(s) of one model on one device.
pub struct PrecisionNets {
    precision: Precision,
    fp16: Option<CudaSphereFormer<f16>>,
    bf16: Option<CudaSphereFormer<bf16>>,
    fp32: Option<CudaSphereFormer<f32>>,
    /// `auto` only: the switch to the fallback happened.
    switched: AtomicBool,
    recomputed: AtomicU64,
}

impl PrecisionNets {
    /// Uploads `net` for `precision`: one network, or FP16 and FP32 (`auto`, FP32 kernels loaded
    /// now).
    pub fn upload(dev: &CudaDevice, net: &SphereFormer, precision: Precision) -> Result<Self, Error> {
        let wants = |s: Storage| precision.initial_storage() == s || (precision == Precision::Auto && s == Precision::FALLBACK);
        let fp16 = if wants(Storage::Fp16) { Some(CudaSphereFormer::<f16>::upload(dev, net)?) } else { None };
        let bf16 = if wants(Storage::Bf16) { Some(CudaSphereFormer::<bf16>::upload(dev, net)?) } else { None };
        let fp32 = if wants(Storage::Fp32) { Some(CudaSphereFormer::<f32>::upload(dev, net)?) } else { None };
        if precision == Precision::Auto {
            for m in STORAGE_MODULES {
                dev.module_in(Precision::FALLBACK, m)?;
            }
        }
        Ok(Self { precision, fp16, bf16, fp32, switched: AtomicBool::new(false), recomputed: AtomicU64::new(0) })
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The storage the next frame is computed in.
    pub fn storage(&self) -> Storage {
        match self.precision {
            Precision::Auto if self.switched.load(Ordering::Acquire) => Precision::FALLBACK,
            p => p.initial_storage(),
        }
    }

    pub fn status(&self) -> PrecisionStatus {
        PrecisionStatus { precision: self.precision, storage: self.storage(), recomputed_frames: self.recomputed.load(Ordering::Relaxed) }
    }

    /// The storage a frame computed in `storage` and flagged (`flagged`) is to be computed again
    /// in: `auto`'s fallback (FP32) for an FP16 frame. Then the model switches (the first switch
    /// returns `first = true`, to be logged) and the frame is counted.
    pub fn recompute(&self, storage: Storage, flagged: bool) -> Option<(Storage, bool)> {
        if self.precision != Precision::Auto || storage != Storage::Fp16 || !flagged {
            return None;
        }
        let first = !self.switched.swap(true, Ordering::AcqRel);
        self.recomputed.fetch_add(1, Ordering::Relaxed);
        Some((Precision::FALLBACK, first))
    }

    /// The FP16 network (present for `fp16` and `auto`).
    pub fn fp16(&self) -> Result<&CudaSphereFormer<f16>, Error> {
        self.fp16.as_ref().ok_or_else(|| self.missing(Storage::Fp16))
    }

    /// The BF16 network (present for `bf16`).
    pub fn bf16(&self) -> Result<&CudaSphereFormer<bf16>, Error> {
        self.bf16.as_ref().ok_or_else(|| self.missing(Storage::Bf16))
    }

    /// The FP32 network (present for `fp32` and `auto`).
    pub fn fp32(&self) -> Result<&CudaSphereFormer<f32>, Error> {
        self.fp32.as_ref().ok_or_else(|| self.missing(Storage::Fp32))
    }

    fn missing(&self, s: Storage) -> Error {
        Error::Cuda(format!("precision {}: no {} network uploaded", self.precision, s.name().to_uppercase()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(precision: Precision) -> PrecisionNets {
        PrecisionNets { precision, fp16: None, bf16: None, fp32: None, switched: AtomicBool::new(false), recomputed: AtomicU64::new(0) }
    }

    #[test]
    fn auto_switches_once_on_a_flagged_fp16_frame_and_stays() {
        let a = nets(Precision::Auto);
        assert_eq!(a.storage(), Storage::Fp16);
        assert_eq!(a.recompute(Storage::Fp16, false), None, "a clean frame is published as is");
        assert_eq!(a.storage(), Storage::Fp16);
        assert_eq!(a.recompute(Storage::Fp16, true), Some((Storage::Fp32, true)), "the first flagged frame switches to FP32 (logged)");
        assert_eq!(a.storage(), Storage::Fp32, "sticky");
        assert_eq!(a.recompute(Storage::Fp32, true), None, "a flagged FP32 frame is reported, not recomputed");
        // a concurrent frame still in FP16 when the switch happened: recomputed, not logged again
        assert_eq!(a.recompute(Storage::Fp16, true), Some((Storage::Fp32, false)));
        assert_eq!(a.status(), PrecisionStatus { precision: Precision::Auto, storage: Storage::Fp32, recomputed_frames: 2 });
    }

    #[test]
    fn fixed_precisions_never_switch() {
        for p in [Precision::Fp16, Precision::Bf16, Precision::Fp32] {
            let n = nets(p);
            assert_eq!(n.recompute(n.storage(), true), None, "{p}");
            assert_eq!(n.storage(), p.initial_storage());
            assert_eq!(n.status().recomputed_frames, 0);
        }
        assert!(nets(Precision::Fp16).bf16().is_err());
        assert!(nets(Precision::Bf16).fp16().is_err());
        let e = nets(Precision::Fp16).fp32().err().unwrap().to_string();
        assert!(e.contains("precision fp16") && e.contains("no FP32 network"), "{e}");
    }
}
