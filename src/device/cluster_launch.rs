//! Kernel launches whose blocks may form thread-block clusters (compute capability 9.0 and
//! later: the blocks of a cluster run at once on neighbouring SMs and read each other's shared
//! memory). cudarc's launch builder has no cluster shape, so [`KernelArgs`] gathers the
//! arguments itself and launches through `cuLaunchKernelEx`.
//!
//! The device runs with cudarc's event tracking off ([`crate::device::cuda`]), so taking a
//! buffer's device address here records and waits for nothing, as cudarc's builder would not.

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::Error;
use cudarc::driver::sys;
use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig};
use std::ffi::c_void;

/// A kernel's arguments in order, each held in an 8-byte slot (the driver copies each
/// parameter's own size from its slot's start, so a `u32` sits in the low bytes).
#[derive(Default)]
pub struct KernelArgs {
    slots: Vec<u64>,
}

impl KernelArgs {
    pub fn new() -> KernelArgs {
        KernelArgs { slots: Vec::with_capacity(32) }
    }

    /// A `u32` parameter.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.slots.push(v as u64);
        self
    }

    /// A pointer parameter that is NULL.
    pub fn null(&mut self) -> &mut Self {
        self.slots.push(0);
        self
    }

    /// A pointer parameter: the buffer's device address (the kernel only reads it).
    pub fn buf<T>(&mut self, dev: &CudaDevice, b: &CudaSlice<T>) -> &mut Self {
        let (ptr, _record) = b.device_ptr(&dev.stream);
        self.slots.push(ptr);
        self
    }

    /// A pointer parameter the kernel writes through.
    pub fn buf_mut<T>(&mut self, dev: &CudaDevice, b: &mut CudaSlice<T>) -> &mut Self {
        let (ptr, _record) = b.device_ptr_mut(&dev.stream);
        self.slots.push(ptr);
        self
    }

    /// A pointer parameter that may be absent (NULL).
    pub fn opt_buf<T>(&mut self, dev: &CudaDevice, b: Option<&CudaSlice<T>>) -> &mut Self {
        match b {
            Some(b) => self.buf(dev, b),
            None => self.null(),
        }
    }

    /// Launches `f` on the device's stream with these arguments; `cluster`: the blocks of each
    /// cluster along x, y and z (the grid must be a multiple of it; `None` or all ones: no
    /// clusters, as an ordinary launch).
    ///
    /// # Safety
    /// The arguments must be the kernel's parameters in number, order and type, and every
    /// buffer must be as large as the kernel reads and writes.
    pub unsafe fn launch(&self, dev: &CudaDevice, f: &CudaFunction, cfg: LaunchConfig, cluster: Option<(u32, u32, u32)>) -> Result<(), Error> {
        dev.ctx.bind_to_thread().map_err(cuda_err("binding the CUDA context"))?;
        let mut params: Vec<*mut c_void> = self.slots.iter().map(|s| s as *const u64 as *mut c_void).collect();
        let mut attrs: Vec<sys::CUlaunchAttribute> = Vec::new();
        if let Some((x, y, z)) = cluster.filter(|&c| c != (1, 1, 1)) {
            // SAFETY: an all-zero attribute is a valid value to fill in (plain C data).
            let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            a.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z };
            attrs.push(a);
        }
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: dev.stream.cu_stream(),
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        };
        // SAFETY: `config`, `params` and the slots they point into outlive the call, which copies
        // the parameters; their agreement with the kernel is the caller's promise.
        unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(cuda_err("launching a kernel"))
    }
}
