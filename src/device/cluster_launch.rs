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

/// The most parameters a kernel launched through [`KernelArgs`] takes (the sparse convs take 24).
pub const MAX_KERNEL_ARGS: usize = 32;

/// A kernel's arguments in order, each held in an 8-byte slot (the driver copies each
/// parameter's own size from its slot's start, so a `u32` sits in the low bytes). Kept on the
/// stack: a launch allocates nothing.
pub struct KernelArgs {
    slots: [u64; MAX_KERNEL_ARGS],
    /// Arguments pushed, counting any past [`MAX_KERNEL_ARGS`] (the launch then refuses).
    len: usize,
}

impl Default for KernelArgs {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelArgs {
    pub fn new() -> KernelArgs {
        KernelArgs { slots: [0; MAX_KERNEL_ARGS], len: 0 }
    }

    fn push(&mut self, v: u64) -> &mut Self {
        if let Some(slot) = self.slots.get_mut(self.len) {
            *slot = v;
        }
        self.len += 1;
        self
    }

    /// A `u32` parameter.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.push(v as u64)
    }

    /// A pointer parameter that is NULL.
    pub fn null(&mut self) -> &mut Self {
        self.push(0)
    }

    /// A pointer parameter: the buffer's device address (the kernel only reads it).
    pub fn buf<T>(&mut self, dev: &CudaDevice, b: &CudaSlice<T>) -> &mut Self {
        let (ptr, _record) = b.device_ptr(&dev.stream);
        self.push(ptr)
    }

    /// A pointer parameter the kernel writes through.
    pub fn buf_mut<T>(&mut self, dev: &CudaDevice, b: &mut CudaSlice<T>) -> &mut Self {
        let (ptr, _record) = b.device_ptr_mut(&dev.stream);
        self.push(ptr)
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
    /// clusters, as an ordinary launch). `what` names the kernel in an error.
    ///
    /// # Safety
    /// The arguments must be the kernel's parameters in number, order and type, and every
    /// buffer must be as large as the kernel reads and writes.
    pub unsafe fn launch(&self, dev: &CudaDevice, f: &CudaFunction, cfg: LaunchConfig, cluster: Option<(u32, u32, u32)>, what: &str) -> Result<(), Error> {
        if self.len > MAX_KERNEL_ARGS {
            return Err(Error::Cuda(format!("{what}: {} kernel arguments, more than the {MAX_KERNEL_ARGS} a launch holds", self.len)));
        }
        dev.ctx.bind_to_thread().map_err(cuda_err(format!("{what}: binding the CUDA context")))?;
        let mut params = [std::ptr::null_mut::<c_void>(); MAX_KERNEL_ARGS];
        for (p, s) in params.iter_mut().zip(&self.slots[..self.len]) {
            *p = s as *const u64 as *mut c_void;
        }
        // SAFETY: an all-zero attribute is a valid value to fill in (plain C data).
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        let clustered = match cluster.filter(|&c| c != (1, 1, 1)) {
            Some((x, y, z)) => {
                attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
                attr.value.clusterDim = sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x, y, z };
                true
            }
            None => false,
        };
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: dev.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: clustered as u32,
        };
        // SAFETY: `config`, `attr`, `params` and the slots they point into outlive the call,
        // which copies the parameters; their agreement with the kernel is the caller's promise.
        unsafe { sys::cuLaunchKernelEx(&config, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(cuda_err(what))
    }
}
