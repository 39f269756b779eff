//! The CUDA network in the model's `precision` ([`Precision`]): FP16, BF16, or `auto`.
//!
//! `auto` runs FP16 (the more precise format) until the range guard ([`crate::model::range`])
//! flags a frame. That frame is then computed again in BF16, whose range is FP32's, and the
//! result published is the BF16 one; the model stays on BF16 from then on (sticky for this model
//! instance: a checkpoint that left FP16's range once will again). The switch is logged once and
//! counted ([`PrecisionStatus`]). Both networks are uploaded, and the BF16 kernels loaded, when
//! the model is: the switching frame pays one more forward, not an NVRTC compile or an upload in
//! the middle of a drive; the price is the weights' device memory twice (FP16 and BF16).

use crate::device::cuda::CudaDevice;
use crate::device::kernels::STORAGE_MODULES;
use crate::device::storage::{Precision, Storage};
use crate::model::sphereformer::cuda::CudaSphereFormer;
use crate::model::sphereformer::SphereFormer;
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
    /// Frames computed again in BF16 after the FP16 pass was flagged (`auto`).
    pub recomputed_frames: u64,
}

/// The uploaded network(s) of one model on one device.
pub struct PrecisionNets {
    precision: Precision,
    fp16: Option<CudaSphereFormer<f16>>,
    bf16: Option<CudaSphereFormer<bf16>>,
    /// `auto` only: the switch to BF16 happened.
    on_bf16: AtomicBool,
    recomputed: AtomicU64,
}

impl PrecisionNets {
    /// Uploads `net` for `precision`: FP16, BF16, or both (`auto`, BF16 kernels loaded now).
    pub fn upload(dev: &CudaDevice, net: &SphereFormer, precision: Precision) -> Result<Self, Error> {
        let fp16 = match precision {
            Precision::Fp16 | Precision::Auto => Some(CudaSphereFormer::<f16>::upload(dev, net)?),
            Precision::Bf16 => None,
        };
        let bf16 = match precision {
            Precision::Bf16 | Precision::Auto => Some(CudaSphereFormer::<bf16>::upload(dev, net)?),
            Precision::Fp16 => None,
        };
        if precision == Precision::Auto {
            for m in STORAGE_MODULES {
                dev.module_in(Storage::Bf16, m)?;
            }
        }
        Ok(Self { precision, fp16, bf16, on_bf16: AtomicBool::new(false), recomputed: AtomicU64::new(0) })
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The storage the next frame is computed in.
    pub fn storage(&self) -> Storage {
        match self.precision {
            Precision::Fp16 => Storage::Fp16,
            Precision::Bf16 => Storage::Bf16,
            Precision::Auto if self.on_bf16.load(Ordering::Acquire) => Storage::Bf16,
            Precision::Auto => Storage::Fp16,
        }
    }

    pub fn status(&self) -> PrecisionStatus {
        PrecisionStatus { precision: self.precision, storage: self.storage(), recomputed_frames: self.recomputed.load(Ordering::Relaxed) }
    }

    /// Whether a frame computed in `storage` and flagged (`flagged`) is to be computed again in
    /// BF16: `auto` on an FP16 frame. Then the model switches to BF16 (the first switch returns
    /// `first = true`, to be logged) and the frame is counted.
    pub fn recompute(&self, storage: Storage, flagged: bool) -> Option<bool> {
        if self.precision != Precision::Auto || storage != Storage::Fp16 || !flagged {
            return None;
        }
        let first = !self.on_bf16.swap(true, Ordering::AcqRel);
        self.recomputed.fetch_add(1, Ordering::Relaxed);
        Some(first)
    }

    /// The FP16 network (present for `fp16` and `auto`).
    pub fn fp16(&self) -> Result<&CudaSphereFormer<f16>, Error> {
        self.fp16.as_ref().ok_or_else(|| Error::Cuda(format!("precision {}: no FP16 network uploaded", self.precision)))
    }

    /// The BF16 network (present for `bf16` and `auto`).
    pub fn bf16(&self) -> Result<&CudaSphereFormer<bf16>, Error> {
        self.bf16.as_ref().ok_or_else(|| Error::Cuda(format!("precision {}: no BF16 network uploaded", self.precision)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(precision: Precision) -> PrecisionNets {
        PrecisionNets { precision, fp16: None, bf16: None, on_bf16: AtomicBool::new(false), recomputed: AtomicU64::new(0) }
    }

    #[test]
    fn auto_switches_once_on_a_flagged_fp16_frame_and_stays() {
        let a = nets(Precision::Auto);
        assert_eq!(a.storage(), Storage::Fp16);
        assert_eq!(a.recompute(Storage::Fp16, false), None, "a clean frame is published as is");
        assert_eq!(a.storage(), Storage::Fp16);
        assert_eq!(a.recompute(Storage::Fp16, true), Some(true), "the first flagged frame switches (logged)");
        assert_eq!(a.storage(), Storage::Bf16, "sticky");
        assert_eq!(a.recompute(Storage::Bf16, true), None, "a flagged BF16 frame is reported, not recomputed");
        // a concurrent frame still in FP16 when the switch happened: recomputed, not logged again
        assert_eq!(a.recompute(Storage::Fp16, true), Some(false));
        assert_eq!(a.status(), PrecisionStatus { precision: Precision::Auto, storage: Storage::Bf16, recomputed_frames: 2 });
    }

    #[test]
    fn fixed_precisions_never_switch() {
        for p in [Precision::Fp16, Precision::Bf16] {
            let n = nets(p);
            assert_eq!(n.recompute(n.storage(), true), None, "{p}");
            assert_eq!(n.storage(), p.initial_storage());
            assert_eq!(n.status().recomputed_frames, 0);
        }
        assert!(nets(Precision::Fp16).bf16().is_err());
        assert!(nets(Precision::Bf16).fp16().is_err());
    }
}
