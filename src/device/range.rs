//! The device side of the FP16 range guard (what it is and how a network adopts it:
//! [`crate::device::range_guard`]): the per-forward flag buffer ([`RangeFlags`]), the slot a launch
//! passes to its kernel ([`RangeSlot`]: `u32* range_flags, u32 range_layer`), and the readback
//! into a reused pinned host buffer behind the frame's work ([`RangeReadback`]), read once the
//! frame's outputs are on the host, so the guard adds no synchronisation.

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::range_guard::{LayerId, LayerNames, RangeReport};
use crate::Error;
use cudarc::driver::{CudaSlice, LaunchArgs, PinnedHostSlice, PushKernelArg};
use std::sync::Mutex;

/// One forward's flag words on the device: `u32` per guarded layer, zeroed when created (on the
/// stream, before the forward's kernels).
pub struct RangeFlags {
    buf: CudaSlice<u32>,
    layers: usize,
}

impl RangeFlags {
    /// Flags for every layer of `names`.
    pub fn new(dev: &CudaDevice, names: &LayerNames) -> Result<Self, Error> {
        let layers = names.len();
        let buf = dev.stream.alloc_zeros::<u32>(layers.max(1)).map_err(cuda_err("allocating the FP16 range flags"))?;
        Ok(Self { buf, layers })
    }

    /// The slot of layer `id` (an id of the `names` these flags were made for).
    pub fn slot(&self, id: LayerId) -> Result<RangeSlot<'_>, Error> {
        if id.index() as usize >= self.layers {
            return Err(Error::InvalidInput(format!(
                "FP16 range guard: layer id {} but the flags hold {} layers",
                id.index(),
                self.layers
            )));
        }
        Ok(RangeSlot { flags: &self.buf, layer: id.index() })
    }

    pub fn layers(&self) -> usize {
        self.layers
    }

    /// The flags read back now (synchronises the stream: for tests; a forward uses
    /// [`RangeReadback`]).
    pub fn read_now(&self, dev: &CudaDevice) -> Result<Vec<u32>, Error> {
        let mut v = dev.stream.clone_dtoh(&self.buf).map_err(cuda_err("reading the FP16 range flags"))?;
        v.truncate(self.layers);
        Ok(v)
    }
}

/// Where one launch reports values out of FP16's range: its layer's word in a forward's flags.
#[derive(Clone, Copy)]
pub struct RangeSlot<'a> {
    flags: &'a CudaSlice<u32>,
    layer: u32,
}

/// The range arguments of an unguarded launch: NULL flags (the kernel still compares, and
/// reports nowhere) and layer 0.
static NO_FLAGS: u64 = 0;
static NO_LAYER: u32 = 0;

impl<'a> RangeSlot<'a> {
    /// Pushes a kernel's two range arguments, `u32* range_flags, u32 range_layer`: the slot's,
    /// or NULL and 0 for `None`.
    pub fn push(slot: Option<&'a RangeSlot<'a>>, b: &mut LaunchArgs<'a>) {
        match slot {
            Some(s) => {
                b.arg(s.flags).arg(&s.layer);
            }
            None => {
                b.arg(&NO_FLAGS).arg(&NO_LAYER);
            }
        }
    }

    /// [`RangeSlot::push`] for a launch through [`crate::device::cluster_launch::KernelArgs`].
    pub fn push_raw(slot: Option<&RangeSlot<'_>>, dev: &crate::device::cuda::CudaDevice, b: &mut crate::device::cluster_launch::KernelArgs) {
        match slot {
            Some(s) => b.buf(dev, s.flags).u32(s.layer),
            None => b.null().u32(NO_LAYER),
        };
    }

    /// Whether both slots report into the same flags buffer.
    pub fn shares_flags(&self, other: &RangeSlot<'_>) -> bool {
        std::ptr::eq(self.flags, other.flags)
    }

    pub fn layer(&self) -> u32 {
        self.layer
    }
}

/// The readback of a model's forwards: a pinned host buffer, reused from frame to frame (taken
/// while a frame is in flight; a concurrent forward allocates its own).
pub struct RangeReadback {
    pinned: Mutex<Option<PinnedHostSlice<u32>>>,
}

impl Default for RangeReadback {
    fn default() -> Self {
        Self::new()
    }
}

impl RangeReadback {
    pub fn new() -> Self {
        Self { pinned: Mutex::new(None) }
    }

    /// Enqueues the copy of `flags` to the host behind the work enqueued so far; read it with
    /// [`PendingRange::finish`] once the frame's outputs are back (the stream has then passed
    /// the copy).
    pub fn enqueue(&self, dev: &CudaDevice, flags: RangeFlags) -> Result<PendingRange<'_>, Error> {
        let kept = self.pinned.lock().map_err(|_| Error::Cuda("FP16 range readback lock poisoned".into()))?.take();
        let mut host = match kept {
            Some(h) if h.len() >= flags.buf.len() => h,
            _ => {
                // SAFETY: page-locked host memory of `len` u32 (0 flags: cached, not
                // write-combined, since the host reads it); every value read is first written by
                // the copy below.
                unsafe { dev.ctx.alloc_pinned_with_flags::<u32>(flags.buf.len(), 0) }
                    .map_err(cuda_err("allocating pinned memory for the FP16 range flags"))?
            }
        };
        dev.stream
            .memcpy_dtoh(&flags.buf, &mut host)
            .map_err(cuda_err("copying the FP16 range flags to the host"))?;
        Ok(PendingRange { owner: self, host: Some(host), flags })
    }
}

/// A forward's flags on their way to the host.
pub struct PendingRange<'a> {
    owner: &'a RangeReadback,
    host: Option<PinnedHostSlice<u32>>,
    /// Kept until read: the copy reads it.
    flags: RangeFlags,
}

impl PendingRange<'_> {
    /// The forward's report (waits for the copy: call it after the frame's outputs are read, by
    /// when the copy, enqueued before them, is done). The pinned buffer goes back for the next
    /// frame.
    pub fn finish(mut self, names: &LayerNames) -> Result<RangeReport, Error> {
        let host = self.host.take().ok_or_else(|| Error::Cuda("FP16 range readback already finished".into()))?;
        let report = {
            let words = host.as_slice().map_err(cuda_err("reading the FP16 range flags"))?;
            names.report(&words[..self.flags.layers.min(words.len())])
        };
        if let Ok(mut slot) = self.owner.pinned.lock() {
            *slot = Some(host);
        }
        Ok(report)
    }
}
