//! The host buffers that uploads are written into, reused frame after frame: an ordinary one and
//! a page-locked one.
//!
//! An upload from ordinary (pageable) host memory makes the driver copy the bytes into a
//! page-locked buffer of its own before the GPU can read them, while the host thread waits; the
//! caller's buffer was itself just written (a frame's points repacked into one array). Written
//! straight into a page-locked buffer, the bytes are copied once, and the GPU reads them while
//! the host goes on enqueuing work. The ordinary buffer is kept too, so that neither path
//! allocates and zeroes a new array every frame.
//!
//! The page-locked buffer is reused: before it is written again, the host waits for the previous
//! upload's copy to have read it (an event recorded after that copy). cudarc's own tracking of
//! pinned buffers does not do this here, because the device turns its event tracking off
//! (`CudaDevice::new`). The ordinary buffer needs no wait: the driver has taken its bytes when
//! the copy call returns.

use crate::device::driver_error::cuda_err;
use crate::Error;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtrMut, PinnedHostSlice};
use std::sync::Arc;

/// Smallest capacity allocated, in f32 values (1 MiB): a nuScenes sweep's points fit.
const MIN_CAPACITY: usize = 1 << 18;

/// The page-locked buffer and the event recorded after the last copy out of it, and the
/// ordinary buffer.
pub struct UploadStaging {
    buf: Option<PinnedHostSlice<f32>>,
    copied: Option<CudaEvent>,
    pageable: Vec<f32>,
}

impl UploadStaging {
    pub fn new() -> Self {
        UploadStaging { buf: None, copied: None, pageable: Vec::new() }
    }

    /// Capacity of the page-locked buffer in f32 values (0 before its first upload).
    pub fn capacity(&self) -> usize {
        self.buf.as_ref().map_or(0, |b| b.len())
    }

    /// `len` f32 values that `fill` writes (every one of them) into the ordinary buffer, copied to
    /// new device memory on `stream` (at least one value long, as [`UploadStaging::upload_pinned`]).
    pub fn upload_pageable(&mut self, stream: &Arc<CudaStream>, len: usize, what: &str, fill: impl FnOnce(&mut [f32])) -> Result<CudaSlice<f32>, Error> {
        // grows with zeros only where it grows; `fill` overwrites the first `len` values
        self.pageable.resize(len.max(1), 0.0);
        fill(&mut self.pageable[..len]);
        stream.clone_htod(&self.pageable).map_err(cuda_err(format!("uploading {what}")))
    }

    /// Waits until the last copy out of the buffer has read it.
    fn wait_copied(&self) -> Result<(), Error> {
        match &self.copied {
            Some(ev) => ev.synchronize().map_err(cuda_err("waiting for the last staged upload")),
            None => Ok(()),
        }
    }

    /// `len` f32 values that `fill` writes (every one of them) into the page-locked buffer, copied
    /// to new device memory on `stream` (at least one value long; past `len` unset). The copy
    /// runs after the call returns; the buffer grows (to a power of two) when `len` exceeds it.
    pub fn upload_pinned(
        &mut self,
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        len: usize,
        what: &str,
        fill: impl FnOnce(&mut [f32]),
    ) -> Result<CudaSlice<f32>, Error> {
        self.wait_copied()?;
        if self.capacity() < len {
            let cap = len.max(MIN_CAPACITY).checked_next_power_of_two().ok_or_else(|| Error::InvalidInput(format!("staging {what}: {len} values")))?;
            // the old buffer is idle (waited for above) when it is freed here
            self.buf = None;
            // SAFETY: the values are written by `fill` before anything reads them.
            self.buf = Some(unsafe { ctx.alloc_pinned::<f32>(cap) }.map_err(cuda_err(format!("allocating {cap} page-locked values to stage {what}")))?);
        }
        let buf = self.buf.as_mut().ok_or_else(|| Error::Cuda(format!("staging {what}: no buffer")))?;
        // as_mut_slice's own wait is on an event that is never recorded (see the module doc)
        let host = &mut buf.as_mut_slice().map_err(cuda_err(format!("staging {what}")))?[..len];
        fill(host);
        // SAFETY: the copy writes all `len` values of the new buffer.
        let mut dev = unsafe { stream.alloc::<f32>(len.max(1)) }.map_err(cuda_err(format!("allocating {what}")))?;
        if len > 0 {
            let (ptr, _guard) = dev.device_ptr_mut(stream);
            // SAFETY: `host` is page-locked and stays allocated and unwritten until the event
            // recorded below has passed (wait_copied); `ptr` holds `len` values.
            unsafe { cudarc::driver::result::memcpy_htod_async(ptr, host, stream.cu_stream()) }.map_err(cuda_err(format!("uploading {what}")))?;
        }
        match &self.copied {
            Some(ev) => ev.record(stream).map_err(cuda_err("recording the staged upload"))?,
            None => self.copied = Some(stream.record_event(None).map_err(cuda_err("recording the staged upload"))?),
        }
        Ok(dev)
    }
}

impl Default for UploadStaging {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for UploadStaging {
    fn drop(&mut self) {
        // The buffer must not be freed while a copy may still read it. A drop has no caller to
        // report a failed wait to; it fails only on a context that is already broken, whose
        // next call reports it.
        let _ = self.wait_copied();
    }
}
