//! The CUDA backend's handle: context, stream, and the kernel modules loaded so far.
//!
//! `CudaDevice::new` checks for the driver before touching it (cudarc panics when libcuda is
//! absent) and turns every failure into an error that says what is missing.

use crate::device::kernels;
use crate::device::libraries::{self, Lib};
use crate::device::nvrtc::{self, Arch, Origin};
use crate::device::storage::Storage;
pub use crate::device::driver_error::cuda_err;
use crate::device::staging::UploadStaging;
use crate::Error;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtrMut};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Whether a CUDA driver library can be loaded on this machine.
pub fn driver_available() -> bool {
    // SAFETY: only tries to dlopen libcuda by name.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

pub struct CudaDevice {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub arch: Arch,
    pub name: String,
    /// Loaded modules by (name, storage build; see [`crate::device::storage`]); shared with the
    /// device's forks, since a module belongs to the context, not to a stream.
    modules: Shared<(&'static str, Storage), Arc<CudaModule>>,
    /// Kernel handles by (module, function, storage): looked up in the driver once, not per launch.
    functions: Shared<(&'static str, &'static str, Storage), CudaFunction>,
    /// Dynamic shared memory each kernel has been allowed beyond the default 48 KB (bytes).
    shared_allowed: Shared<(&'static str, &'static str, Storage), usize>,
    /// The byte [`CudaDevice::alloc_uninit`] fills its buffers with, if any (a check: see there).
    poison_uninit: Option<u8>,
    /// Whether [`CudaDevice::upload_f32_with`] goes through `staging`.
    pinned_staging: bool,
    /// Whether convs split over kernel offsets sum the splits on chip ([`CudaDevice::cluster_reduce`]).
    cluster_reduce: bool,
    /// This device's upload buffers (its own: a fork's uploads run on another stream).
    staging: Mutex<UploadStaging>,
}

/// The environment variable that turns on [`CudaDevice::alloc_uninit`]'s poison fill for every
/// device a process opens: the fill byte in hex (`ff`: NaN floats and −1 integers; `7f`: large
/// finite FP32 values, FP16 NaNs and large positive integers).
pub const POISON_UNINIT_ENV: &str = "SPTR_POISON_UNINIT";

/// The environment variable that chooses how the frame's points are uploaded
/// ([`CudaDevice::set_pinned_staging`]): `1` or unset through the page-locked staging buffer,
/// `0` from ordinary memory (for comparing the two).
pub const PINNED_STAGING_ENV: &str = "SPTR_PINNED_STAGING";

/// The environment variable that chooses how a conv split over kernel offsets adds its splits
/// ([`CudaDevice::set_cluster_reduce`]): `1` or unset on chip, the splits of a tile launched as
/// one thread-block cluster (compute capability 9.0 and later), `0` through FP32 partials in
/// device memory and a second pass (for comparing the two).
pub const CLUSTER_REDUCE_ENV: &str = "SPTR_CLUSTER_REDUCE";

/// A switch that is on unless its environment variable says `0`: `1`, empty or unset mean on;
/// anything else is an error naming the variable and what `1` turns on (`on_means`).
fn switch_from_env(var: &str, on_means: &str) -> Result<bool, Error> {
    match std::env::var(var).as_deref().map(str::trim) {
        Err(_) | Ok("1") | Ok("") => Ok(true),
        Ok("0") => Ok(false),
        Ok(v) => Err(Error::InvalidInput(format!("{var}={v:?}: give 1 ({on_means}) or 0, or unset it"))),
    }
}

/// The poison fill byte [`POISON_UNINIT_ENV`] asks for (None when unset).
fn poison_from_env() -> Result<Option<u8>, Error> {
    match std::env::var(POISON_UNINIT_ENV) {
        Err(_) => Ok(None),
        Ok(v) => u8::from_str_radix(v.trim(), 16)
            .map(Some)
            .map_err(|_| Error::InvalidInput(format!("{POISON_UNINIT_ENV}={v:?}: give the fill byte in hex, e.g. ff or 7f, or unset it"))),
    }
}

/// A cache shared by a device and its forks.
type Shared<K, V> = Arc<Mutex<HashMap<K, V>>>;

/// Buffers are stream-ordered allocations from the device's default memory pool. By default the
/// pool returns freed memory to the driver at every synchronisation, so each frame would map its
/// transient buffers again; keeping it (a release threshold of "never") makes repeated frames
/// reuse them, as PyTorch's caching allocator does, and makes the pool's size the high-water mark
/// of the device memory the work needed.
fn keep_freed_memory_in_pool(ctx: &CudaContext) -> Result<(), Error> {
    use cudarc::driver::sys;
    let pool = default_pool(ctx)?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: a plain driver call on the device's pool; `threshold` outlives the call.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold) as *mut u64 as *mut std::ffi::c_void,
        )
        .result()
        .map_err(cuda_err("configuring the memory pool"))?;
    }
    Ok(())
}

fn default_pool(ctx: &CudaContext) -> Result<cudarc::driver::sys::CUmemoryPool, Error> {
    let mut pool: cudarc::driver::sys::CUmemoryPool = std::ptr::null_mut();
    ctx.bind_to_thread().map_err(cuda_err("binding the CUDA context"))?;
    // SAFETY: a plain driver query on a live context's device.
    unsafe { cudarc::driver::sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .map_err(cuda_err("reading the memory pool"))?;
    Ok(pool)
}

/// Free device memory in bytes (the whole device, every process).
pub fn free_device_bytes() -> Result<usize, Error> {
    cudarc::driver::result::mem_get_info().map(|(free, _)| free).map_err(cuda_err("reading free device memory"))
}

impl CudaDevice {
    /// Waits for the stream, then gives the pool's unused memory back to the driver: after it,
    /// the drop in [`free_device_bytes`] across some work is that work's peak device memory.
    pub fn trim_pool(&self) -> Result<(), Error> {
        self.synchronize()?;
        let pool = default_pool(&self.ctx)?;
        // SAFETY: a plain driver call on the device's pool, nothing in flight.
        unsafe { cudarc::driver::sys::cuMemPoolTrimTo(pool, 0) }.result().map_err(cuda_err("trimming the memory pool"))
    }

    /// Opens GPU `ordinal` with a stream of its own (non-blocking): work on two devices opened
    /// in one process (the node's LiDAR path and its BEV map model) overlaps on the GPU, where
    /// the legacy default stream would serialise them, and the stream can be captured into a
    /// CUDA graph (capture is refused on the legacy stream: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
    /// Errors (never panics) when there is no driver, no GPU or no NVRTC, or when the driver or
    /// NVRTC does not fit this build's CUDA major ([`libraries`]).
    pub fn new(ordinal: usize) -> Result<CudaDevice, Error> {
        Self::open(ordinal, false)
    }

    /// Like [`CudaDevice::new`], its stream of the greatest priority the GPU has: when this
    /// device's work and a default-priority device's are both ready, the GPU's block scheduler
    /// starts this one's first (running blocks are not preempted). The LiDAR path takes it, so
    /// that its labels come out near their time alone while the BEV map model fills the gaps.
    pub fn new_high_priority(ordinal: usize) -> Result<CudaDevice, Error> {
        Self::open(ordinal, true)
    }

    fn open(ordinal: usize, high_priority: bool) -> Result<CudaDevice, Error> {
        // The driver and NVRTC this build binds, checked before cudarc opens them: a missing one
        // or one of another CUDA major is an error naming it, never a panic or a failed launch.
        if let [driver, nvrtc] = libraries::require(&[Lib::Driver, Lib::Nvrtc])?.as_slice() {
            libraries::check_nvrtc_against_driver(nvrtc, driver)?;
        }
        nvrtc::kernel_paths().map_err(Error::Cuda)?;
        let count = CudaContext::device_count().map_err(cuda_err("counting GPUs"))?;
        if count <= 0 || ordinal >= count as usize {
            return Err(Error::Cuda(format!("GPU {ordinal} requested but the driver sees {count} GPU(s)")));
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating the CUDA context"))?;
        // One stream per pipeline branch, synchronised explicitly: cudarc's per-buffer event
        // tracking would only add overhead.
        // SAFETY: no buffers exist yet on this context.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability().map_err(cuda_err("reading the compute capability"))?;
        let name = ctx.name().map_err(cuda_err("reading the device name"))?;
        let arch = Arch { major: major as u32, minor: minor as u32 };
        // A GPU this NVRTC cannot compile for is refused here, at start, not at its first kernel.
        nvrtc::check_arch(arch).map_err(|e| Error::Cuda(format!("GPU {ordinal} ({name}, {}) cannot be used: {e}", arch.sm())))?;
        let stream = if high_priority {
            // (least, greatest): lower numbers are higher priorities, 0 is the default
            let (_, greatest) = cudarc::driver::result::stream::get_priority_range().map_err(cuda_err("reading the stream priorities"))?;
            ctx.new_stream_with_priority(greatest)
        } else {
            ctx.new_stream()
        }
        .map_err(cuda_err("creating a stream"))?;
        keep_freed_memory_in_pool(&ctx)?;
        Ok(CudaDevice {
            ctx,
            stream,
            arch,
            name,
            modules: Arc::default(),
            functions: Arc::default(),
            shared_allowed: Arc::default(),
            poison_uninit: poison_from_env()?,
            pinned_staging: switch_from_env(PINNED_STAGING_ENV, "stage uploads in page-locked memory")?,
            cluster_reduce: switch_from_env(CLUSTER_REDUCE_ENV, "sum a conv's offset splits on chip")?,
            staging: Default::default(),
        })
    }

    /// The same GPU, context and loaded kernels with a stream of its own (default priority), for a branch of work that may run beside this device's.
    ///
    /// The two streams are ordered only where the caller says so (event tracking is off): work
    /// on the fork must not read a buffer this device writes, or the reverse, without an event
    /// wait ([`CudaDevice::wait_for`]) in between; a buffer is freed in the order of the stream
    /// that allocated it, so one read by the other stream must outlive that read (a host
    /// synchronisation of the reading stream is enough).
    pub fn fork(&self) -> Result<CudaDevice, Error> {
        let stream = self.stream.fork().map_err(cuda_err("creating a second stream"))?;
        Ok(CudaDevice {
            ctx: self.ctx.clone(),
            stream,
            arch: self.arch,
            name: self.name.clone(),
            modules: self.modules.clone(),
            functions: self.functions.clone(),
            shared_allowed: self.shared_allowed.clone(),
            poison_uninit: self.poison_uninit,
            pinned_staging: self.pinned_staging,
            cluster_reduce: self.cluster_reduce,
            staging: Default::default(),
        })
    }

    /// Makes the work enqueued on this device from now on wait for everything enqueued on
    /// `other` so far (an event, no host wait).
    pub fn wait_for(&self, other: &CudaDevice) -> Result<(), Error> {
        let ev = other.stream.record_event(None).map_err(cuda_err("recording an event"))?;
        self.stream.wait(&ev).map_err(cuda_err("waiting for an event"))
    }

    /// The loaded module `name` (its FP16 build; compiled by NVRTC or taken from the disk cache
    /// on first use).
    pub fn module(&self, name: &'static str) -> Result<Arc<CudaModule>, Error> {
        self.module_in(Storage::Fp16, name)
    }

    /// [`CudaDevice::module`] of the build for `storage` (BF16: modules of
    /// [`kernels::STORAGE_MODULES`] only).
    pub fn module_in(&self, storage: Storage, name: &'static str) -> Result<Arc<CudaModule>, Error> {
        let mut map = self.modules.lock().map_err(|_| Error::Cuda("module cache lock poisoned".into()))?;
        if let Some(m) = map.get(&(name, storage)) {
            return Ok(m.clone());
        }
        let src = kernels::find(name).ok_or_else(|| Error::KernelCompile(format!("no kernel module `{name}`")))?;
        let (cubin, origin) = nvrtc::cubin_cached_storage(src, self.arch, storage)?;
        if std::env::var_os("SPTR_VERBOSE").is_some() {
            let how = if origin == Origin::Cache { "from cache" } else { "compiled" };
            eprintln!("sptr: kernel module {name} ({storage}) for {} {how}", self.arch.sm());
        }
        let m = self
            .ctx
            .load_module(cudarc::nvrtc::Ptx::from_binary(cubin))
            .map_err(cuda_err(format!("loading kernel module {name} ({storage})")))?;
        map.insert((name, storage), m.clone());
        Ok(m)
    }

    /// Function `func` of module `module` (its FP16 build; cached after the first call).
    pub fn function(&self, module: &'static str, func: &'static str) -> Result<CudaFunction, Error> {
        self.function_in(Storage::Fp16, module, func)
    }

    /// [`CudaDevice::function`] from the module's build for `storage`.
    pub fn function_in(&self, storage: Storage, module: &'static str, func: &'static str) -> Result<CudaFunction, Error> {
        let key = (module, func, storage);
        {
            let map = self.functions.lock().map_err(|_| Error::Cuda("function cache lock poisoned".into()))?;
            if let Some(f) = map.get(&key) {
                return Ok(f.clone());
            }
        }
        let f = self
            .module_in(storage, module)?
            .load_function(func)
            .map_err(|e| Error::Cuda(format!("kernel {module}::{func} ({storage}): {e:?}")))?;
        let mut map = self.functions.lock().map_err(|_| Error::Cuda("function cache lock poisoned".into()))?;
        map.insert(key, f.clone());
        Ok(f)
    }

    /// [`CudaDevice::function`], allowed `bytes` of dynamic shared memory per block. When its
    /// static plus dynamic shared memory exceeds the default 48 KB a kernel must opt in; the
    /// attribute is set once per kernel (and again only for a larger size), not at every launch.
    pub fn function_with_shared(&self, module: &'static str, func: &'static str, bytes: usize) -> Result<CudaFunction, Error> {
        self.function_with_shared_in(Storage::Fp16, module, func, bytes)
    }

    /// [`CudaDevice::function_with_shared`] from the module's build for `storage`.
    pub fn function_with_shared_in(&self, storage: Storage, module: &'static str, func: &'static str, bytes: usize) -> Result<CudaFunction, Error> {
        let f = self.function_in(storage, module, func)?;
        let mut allowed = self.shared_allowed.lock().map_err(|_| Error::Cuda("shared memory cache lock poisoned".into()))?;
        let have = allowed.entry((module, func, storage)).or_insert(0);
        if *have >= bytes {
            return Ok(f);
        }
        let fixed = f.shared_size_bytes().map_err(|e| Error::Cuda(format!("kernel {module}::{func}: reading its static shared memory: {e:?}")))?;
        if fixed.max(0) as usize + bytes > 48 * 1024 {
            let b = i32::try_from(bytes).map_err(|_| Error::InvalidInput(format!("kernel {module}::{func}: {bytes} bytes of shared memory")))?;
            f.set_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, b)
                .map_err(|e| Error::Cuda(format!("kernel {module}::{func}: allowing {bytes} bytes of shared memory: {e:?}")))?;
        }
        *have = bytes;
        Ok(f)
    }

    pub fn synchronize(&self) -> Result<(), Error> {
        self.stream.synchronize().map_err(cuda_err("synchronizing the stream"))
    }

    /// Device memory for `len` elements (at least one) that the work enqueued next writes
    /// entirely before anything reads it, from the stream's pool and not zeroed: a memset costs
    /// the host about as much as a kernel launch, and a frame allocates a few hundred buffers.
    ///
    /// With a poison fill ([`CudaDevice::set_poison_uninit`], or [`POISON_UNINIT_ENV`]) every
    /// such buffer is first filled with that byte, so that work reading an element before writing
    /// it gives a different result than without the fill, and the GPU tests that compare the two
    /// catch it.
    ///
    /// # Safety
    /// The caller must write every element before anything reads it.
    pub unsafe fn alloc_uninit<T: cudarc::driver::DeviceRepr>(&self, len: usize, what: &str) -> Result<CudaSlice<T>, Error> {
        // SAFETY: forwarded to the caller.
        let mut buf = unsafe { self.stream.alloc::<T>(len.max(1)) }.map_err(|e| Error::Cuda(format!("allocating {what}: {e:?}")))?;
        if let Some(byte) = self.poison_uninit {
            let bytes = buf.len() * std::mem::size_of::<T>();
            let (ptr, _guard) = buf.device_ptr_mut(&self.stream);
            // SAFETY: `ptr` addresses the buffer's `bytes` bytes, enqueued on its own stream.
            unsafe { cudarc::driver::result::memset_d8_async(ptr, byte, bytes, self.stream.cu_stream()) }
                .map_err(|e| Error::Cuda(format!("poison-filling {what}: {e:?}")))?;
        }
        Ok(buf)
    }

    /// Sets the poison fill byte of [`CudaDevice::alloc_uninit`] for this device, or turns the
    /// fill off (None); its forks made afterwards inherit it.
    pub fn set_poison_uninit(&mut self, byte: Option<u8>) {
        self.poison_uninit = byte;
    }

    /// `len` f32 values that `fill` writes (every one of them), uploaded to new device memory
    /// from one of this device's reused host buffers ([`crate::device::staging`]): the
    /// page-locked one unless [`CudaDevice::set_pinned_staging`] or [`PINNED_STAGING_ENV`] turned
    /// it off, else the ordinary one. The values on the device are the same either way.
    pub fn upload_f32_with(&self, len: usize, what: &str, fill: impl FnOnce(&mut [f32])) -> Result<CudaSlice<f32>, Error> {
        let mut staging = self.staging.lock().map_err(|_| Error::Cuda("upload buffer lock poisoned".into()))?;
        if self.pinned_staging {
            staging.upload_pinned(&self.ctx, &self.stream, len, what, fill)
        } else {
            staging.upload_pageable(&self.stream, len, what, fill)
        }
    }

    /// Sends [`CudaDevice::upload_f32_with`]'s uploads through the page-locked staging buffer
    /// (the default: the dense cloud's voxelization 1.35 times as fast on an H100, `sptr bench
    /// voxelize`), or from ordinary memory; its forks made afterwards inherit it.
    pub fn set_pinned_staging(&mut self, on: bool) {
        self.pinned_staging = on;
    }

    /// Whether a conv split over kernel offsets sums its splits on chip: asked for
    /// ([`CudaDevice::set_cluster_reduce`], [`CLUSTER_REDUCE_ENV`]) and a GPU with thread-block
    /// clusters (compute capability 9.0 and later, native kernel paths: [`Arch::has_clusters`]).
    pub fn cluster_reduce(&self) -> bool {
        self.cluster_reduce && self.arch.has_clusters()
    }

    /// Sums the offset splits of a conv's tiles on chip (the default: the splits of a tile
    /// launched as one thread-block cluster, each adding its share from the others' shared
    /// memory; the same bits as the second pass over FP32 partials in device memory, which
    /// `false` chooses, and on the nuScenes sweep's SphereFormer frame 4-5 % faster on an
    /// H100); its forks made afterwards inherit it. Ignored where the GPU has no clusters
    /// ([`Arch::has_clusters`]).
    pub fn set_cluster_reduce(&mut self, on: bool) {
        self.cluster_reduce = on;
    }
}

impl CudaDevice {
    /// Median time of `iters` runs of `f` (after `warmup` runs), measured with CUDA events
    /// around each run on this device's stream, in milliseconds. `f` may allocate and launch;
    /// host work inside it counts only as far as it delays the launches.
    pub fn time_median_ms(&self, warmup: usize, iters: usize, mut f: impl FnMut() -> Result<(), Error>) -> Result<f64, Error> {
        use cudarc::driver::sys::CUevent_flags;
        for _ in 0..warmup {
            f()?;
        }
        self.synchronize()?;
        let start = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err("creating a timing event"))?;
        let stop = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(cuda_err("creating a timing event"))?;
        let mut times = Vec::with_capacity(iters.max(1));
        for _ in 0..iters.max(1) {
            start.record(&self.stream).map_err(cuda_err("recording an event"))?;
            f()?;
            stop.record(&self.stream).map_err(cuda_err("recording an event"))?;
            stop.synchronize().map_err(cuda_err("waiting for an event"))?;
            times.push(start.elapsed_ms(&stop).map_err(cuda_err("reading an event time"))? as f64);
        }
        times.sort_by(|a, b| a.total_cmp(b));
        Ok(crate::device::percentile::percentile(&times, 50.0).unwrap_or(f64::NAN))
    }
}
