//! nvJPEG, loaded at run time: JPEG bytes on the host → RGB8 interleaved in device memory.
//!
//! Like the rest of CUDA here the library is opened with `dlopen` (libloading), never linked: a
//! machine without it builds and runs, and the camera input falls back to zune-jpeg and says so
//! (`ops::image_preprocess::cuda`). The declarations below are written from NVIDIA's nvJPEG
//! documentation (`nvjpeg.h`): every enum is a C `int`, `nvjpegImage_t` is four channel pointers
//! followed by four `size_t` pitches, handles are opaque pointers, `cudaStream_t` is the driver's
//! `CUstream`.
//!
//! Backends, tried in order when the decoder is created:
//! 1. `NVJPEG_BACKEND_HARDWARE`: the A100 / H100 JPEG engines. Baseline single-scan JPEGs are
//!    decoded in one batched call (`nvjpegDecodeBatched`); a JPEG the engine refuses
//!    (`nvjpegDecodeBatchedSupported`) is reported as unsupported and the caller decodes it on
//!    the CPU.
//! 2. `NVJPEG_BACKEND_DEFAULT`, then `NVJPEG_BACKEND_GPU_HYBRID`: one `nvjpegDecode` per image,
//!    each image with its own decoder state. The documentation promises GPU-assisted Huffman
//!    decoding (GPU_HYBRID) only through the decoupled API or batches of more than 50 images, so
//!    for six single-image calls the library's own choice comes first; GPU_HYBRID is the last
//!    resort.
//!
//! Each backend is first asked for interpolated chroma upsampling
//! (`NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION`, what libjpeg and zune-jpeg do); a library that
//! refuses the flag is used without it, and [`NvjpegDecoder::interpolated_chroma`] says which.

use crate::device::cuda::{cuda_err, CudaDevice};
use crate::device::libraries::{self, Lib};
use crate::Error;
use std::ffi::{c_int, c_uint, c_void};

type Status = c_int;
type Handle = *mut c_void;
type State = *mut c_void;
type JpegStream = *mut c_void;
type CuStream = cudarc::driver::sys::CUstream;

const STATUS_SUCCESS: Status = 0;
const STATUS_NOT_INITIALIZED: Status = 1;
const STATUS_INVALID_PARAMETER: Status = 2;
const STATUS_BAD_JPEG: Status = 3;
const STATUS_JPEG_NOT_SUPPORTED: Status = 4;
const STATUS_ALLOCATOR_FAILURE: Status = 5;
const STATUS_EXECUTION_FAILED: Status = 6;
const STATUS_ARCH_MISMATCH: Status = 7;
const STATUS_INTERNAL_ERROR: Status = 8;
const STATUS_IMPLEMENTATION_NOT_SUPPORTED: Status = 9;
const STATUS_INCOMPLETE_BITSTREAM: Status = 10;

const BACKEND_DEFAULT: c_int = 0;
const BACKEND_GPU_HYBRID: c_int = 2;
const BACKEND_HARDWARE: c_int = 3;

const OUTPUT_RGBI: c_int = 5;
const FLAGS_UPSAMPLING_WITH_INTERPOLATION: c_uint = 32;

/// `libraryPropertyType`: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL.
const PROPERTIES: [c_int; 3] = [0, 1, 2];

/// `nvjpegImage_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct NvjpegImage {
    channel: [*mut u8; 4],
    pitch: [usize; 4],
}


fn status_name(s: Status) -> &'static str {
    match s {
        STATUS_SUCCESS => "NVJPEG_STATUS_SUCCESS",
        STATUS_NOT_INITIALIZED => "NVJPEG_STATUS_NOT_INITIALIZED",
        STATUS_INVALID_PARAMETER => "NVJPEG_STATUS_INVALID_PARAMETER",
        STATUS_BAD_JPEG => "NVJPEG_STATUS_BAD_JPEG",
        STATUS_JPEG_NOT_SUPPORTED => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        STATUS_ALLOCATOR_FAILURE => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        STATUS_EXECUTION_FAILED => "NVJPEG_STATUS_EXECUTION_FAILED",
        STATUS_ARCH_MISMATCH => "NVJPEG_STATUS_ARCH_MISMATCH",
        STATUS_INTERNAL_ERROR => "NVJPEG_STATUS_INTERNAL_ERROR",
        STATUS_IMPLEMENTATION_NOT_SUPPORTED => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        STATUS_INCOMPLETE_BITSTREAM => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
        _ => "unknown nvJPEG status",
    }
}

fn nv_err(what: &str, s: Status) -> Error {
    Error::Cuda(format!("nvJPEG {what}: {} ({s})", status_name(s)))
}

/// The entry points used, copied out of the library (valid while `Library` is loaded).
#[derive(Clone, Copy)]
struct Api {
    create_ex: unsafe extern "C" fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    state_create: unsafe extern "C" fn(Handle, *mut State) -> Status,
    state_destroy: unsafe extern "C" fn(State) -> Status,
    decode: unsafe extern "C" fn(Handle, State, *const u8, usize, c_int, *mut NvjpegImage, CuStream) -> Status,
    batched_initialize: unsafe extern "C" fn(Handle, State, c_int, c_int, c_int) -> Status,
    batched: unsafe extern "C" fn(Handle, State, *const *const u8, *const usize, *mut NvjpegImage, CuStream) -> Status,
    stream_create: unsafe extern "C" fn(Handle, *mut JpegStream) -> Status,
    stream_destroy: unsafe extern "C" fn(JpegStream) -> Status,
    stream_parse_header: unsafe extern "C" fn(Handle, *const u8, usize, JpegStream) -> Status,
    batched_supported: unsafe extern "C" fn(Handle, JpegStream, *mut c_int) -> Status,
    get_property: unsafe extern "C" fn(c_int, *mut c_int) -> Status,
}

/// Which nvJPEG backend a decoder runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The JPEG engines, batched decode.
    Hardware,
    /// GPU-assisted Huffman decoding, one call per image.
    GpuHybrid,
    /// The library's own choice, one call per image.
    Default,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Hardware => "hardware",
            Backend::GpuHybrid => "gpu_hybrid",
            Backend::Default => "default",
        }
    }
    fn code(self) -> c_int {
        match self {
            Backend::Hardware => BACKEND_HARDWARE,
            Backend::GpuHybrid => BACKEND_GPU_HYBRID,
            Backend::Default => BACKEND_DEFAULT,
        }
    }
}

/// What happened to one image of a [`NvjpegDecoder::decode`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageOutcome {
    /// Decode enqueued on the stream; the output is valid once the stream reaches this point.
    Decoded,
    /// nvJPEG does not decode this JPEG (the reason): decode it on the CPU.
    Unsupported(String),
    /// nvJPEG says the data is corrupt (the status); the caller decides (the camera input lets
    /// zune-jpeg judge, as on the CPU path).
    Corrupt(String),
}

/// One image for [`NvjpegDecoder::decode`]: its bytes, and where its RGB8 interleaved pixels go
/// (a device pointer to `pitch * height` bytes, `pitch >= width * 3`).
pub struct DecodeTarget<'a> {
    pub jpeg: &'a [u8],
    pub dst: u64,
    pub pitch: usize,
}

/// An nvJPEG handle with its decoder states.
pub struct NvjpegDecoder {
    api: Api,
    handle: Handle,
    backend: Backend,
    interpolated: bool,
    version: [c_int; 3],
    /// The batched state (hardware), or one state per image (the other backends).
    states: Vec<State>,
    /// Header parser for `nvjpegDecodeBatchedSupported` (hardware only).
    parser: JpegStream,
    /// Batch size the batched state was initialized for.
    batch_ready: Option<usize>,
    /// Last, so it is unloaded after the handles above are destroyed (`Drop`).
    _lib: libloading::Library,
}

// SAFETY: the nvJPEG library handle is thread safe (nvJPEG docs, "Opaque Library Handle"); the
// states and the parser are only used through `&mut self`, so from one thread at a time.
unsafe impl Send for NvjpegDecoder {}

impl NvjpegDecoder {
    /// Opens the library and creates a handle on the best backend that works (module docs).
    /// Errors say why nvJPEG cannot be used (library missing, no backend initialised).
    pub fn new(dev: &CudaDevice) -> Result<NvjpegDecoder, Error> {
        let (lib, api, version) = open_library()?;
        // nvJPEG calls the CUDA runtime, which uses the context current on this thread: the
        // primary context cudarc created.
        dev.ctx.bind_to_thread().map_err(cuda_err("binding the CUDA context for nvJPEG"))?;
        let mut refusals = Vec::new();
        for backend in [Backend::Hardware, Backend::Default, Backend::GpuHybrid] {
            for interpolated in [true, false] {
                let flags = if interpolated { FLAGS_UPSAMPLING_WITH_INTERPOLATION } else { 0 };
                let mut handle: Handle = std::ptr::null_mut();
                // SAFETY: null allocators select cudaMalloc / cudaHostAlloc; `handle` is written
                // on success only.
                let s = unsafe { (api.create_ex)(backend.code(), std::ptr::null_mut(), std::ptr::null_mut(), flags, &mut handle) };
                if s != STATUS_SUCCESS || handle.is_null() {
                    refusals.push(format!("{} flags {flags}: {}", backend.name(), status_name(s)));
                    continue;
                }
                match setup_backend(&api, handle, backend) {
                    Ok((parser, states)) => {
                        return Ok(NvjpegDecoder { api, handle, backend, interpolated, version, states, parser, batch_ready: None, _lib: lib });
                    }
                    Err(e) => {
                        refusals.push(format!("{} flags {flags}: {e}", backend.name()));
                        // SAFETY: the handle was created above and nothing else refers to it.
                        unsafe { (api.destroy)(handle) };
                    }
                }
            }
        }
        Err(Error::Cuda(format!("nvJPEG {} loaded, but no backend could be created: {}", fmt_version(version), refusals.join("; "))))
    }

    fn new_state(&self) -> Result<State, Error> {
        new_state(&self.api, self.handle)
    }

    /// Destroys states, parser and handle (idempotent).
    fn release(&mut self) {
        // SAFETY: each pointer was created by this library's matching create call and is
        // destroyed once (nulled / cleared right after).
        unsafe {
            for st in self.states.drain(..) {
                (self.api.state_destroy)(st);
            }
            if !self.parser.is_null() {
                (self.api.stream_destroy)(self.parser);
                self.parser = std::ptr::null_mut();
            }
            if !self.handle.is_null() {
                (self.api.destroy)(self.handle);
                self.handle = std::ptr::null_mut();
            }
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Whether chroma is upsampled with interpolation (as libjpeg / zune-jpeg do) or replicated.
    pub fn interpolated_chroma(&self) -> bool {
        self.interpolated
    }

    /// `"13.0.1 hardware, interpolated chroma"`.
    pub fn describe(&self) -> String {
        format!(
            "nvJPEG {} {}, {} chroma",
            fmt_version(self.version),
            self.backend.name(),
            if self.interpolated { "interpolated" } else { "replicated" }
        )
    }

    /// Enqueues the decode of every target on the device's stream, RGB8 interleaved. Returns one
    /// outcome per target; a target that is not [`ImageOutcome::Decoded`] has had nothing
    /// written to its destination, and the caller decodes it another way or reports it.
    ///
    /// The JPEG bytes must stay unchanged until the stream has passed this point (the hardware
    /// backend may read them asynchronously): the caller keeps them in a buffer it only rewrites
    /// after an event recorded after this call has completed.
    pub fn decode(&mut self, dev: &CudaDevice, targets: &[DecodeTarget<'_>]) -> Result<Vec<ImageOutcome>, Error> {
        dev.ctx.bind_to_thread().map_err(cuda_err("binding the CUDA context for nvJPEG"))?;
        let stream = dev.stream.cu_stream();
        match self.backend {
            Backend::Hardware => self.decode_hardware(stream, targets),
            Backend::GpuHybrid | Backend::Default => self.decode_each(stream, targets),
        }
    }

    fn decode_hardware(&mut self, stream: CuStream, targets: &[DecodeTarget<'_>]) -> Result<Vec<ImageOutcome>, Error> {
        let mut out = vec![ImageOutcome::Decoded; targets.len()];
        let mut batch = Vec::with_capacity(targets.len());
        for (i, t) in targets.iter().enumerate() {
            // SAFETY: `t.jpeg` is a live slice of the given length; the parser is ours.
            let s = unsafe { (self.api.stream_parse_header)(self.handle, t.jpeg.as_ptr(), t.jpeg.len(), self.parser) };
            match s {
                STATUS_SUCCESS => {}
                STATUS_BAD_JPEG | STATUS_INCOMPLETE_BITSTREAM => {
                    out[i] = ImageOutcome::Corrupt(status_name(s).into());
                    continue;
                }
                _ => {
                    out[i] = ImageOutcome::Unsupported(format!("header parse: {}", status_name(s)));
                    continue;
                }
            }
            let mut unsupported: c_int = -1;
            // SAFETY: parser holds the header just parsed; `unsupported` is a local int.
            let s = unsafe { (self.api.batched_supported)(self.handle, self.parser, &mut unsupported) };
            if s != STATUS_SUCCESS {
                out[i] = ImageOutcome::Unsupported(format!("support query: {}", status_name(s)));
            } else if unsupported != 0 {
                // nvjpegDecodeBatchedSupported writes 0 for "supported".
                out[i] = ImageOutcome::Unsupported(format!("the JPEG engine refuses it (code {unsupported})"));
            } else {
                batch.push(i);
            }
        }
        if batch.is_empty() {
            return Ok(out);
        }
        let state = *self.states.first().ok_or_else(|| Error::Cuda("nvJPEG hardware state missing".into()))?;
        let n = c_int::try_from(batch.len()).map_err(|_| Error::InvalidInput("too many JPEGs in one batch".into()))?;
        if self.batch_ready != Some(batch.len()) {
            self.batch_ready = None;
            // SAFETY: live handle and state; one CPU thread.
            let s = unsafe { (self.api.batched_initialize)(self.handle, state, n, 1, OUTPUT_RGBI) };
            if s != STATUS_SUCCESS {
                return Err(nv_err("batched initialize", s));
            }
            self.batch_ready = Some(batch.len());
        }
        let data: Vec<*const u8> = batch.iter().map(|&i| targets[i].jpeg.as_ptr()).collect();
        let lens: Vec<usize> = batch.iter().map(|&i| targets[i].jpeg.len()).collect();
        let mut images: Vec<NvjpegImage> = batch.iter().map(|&i| image_for(&targets[i])).collect();
        // SAFETY: `data`/`lens` describe live host slices, `images` point at device buffers of
        // pitch * height bytes (the caller's contract), all arrays hold `n` entries.
        let s = unsafe { (self.api.batched)(self.handle, state, data.as_ptr(), lens.as_ptr(), images.as_mut_ptr(), stream) };
        match s {
            STATUS_SUCCESS => Ok(out),
            STATUS_BAD_JPEG | STATUS_INCOMPLETE_BITSTREAM | STATUS_JPEG_NOT_SUPPORTED | STATUS_IMPLEMENTATION_NOT_SUPPORTED => {
                // The batch failed as a whole, without saying which image: the state must be
                // initialised again, and the caller decodes these images on the CPU, where a
                // corrupt one is named.
                self.batch_ready = None;
                for &i in &batch {
                    out[i] = ImageOutcome::Unsupported(format!("batched decode failed: {}", status_name(s)));
                }
                Ok(out)
            }
            _ => {
                self.batch_ready = None;
                Err(nv_err("batched decode", s))
            }
        }
    }

    fn decode_each(&mut self, stream: CuStream, targets: &[DecodeTarget<'_>]) -> Result<Vec<ImageOutcome>, Error> {
        while self.states.len() < targets.len() {
            let st = self.new_state()?;
            self.states.push(st);
        }
        let mut out = Vec::with_capacity(targets.len());
        for (t, &state) in targets.iter().zip(&self.states) {
            let mut img = image_for(t);
            // SAFETY: live handle and state (one per image, so no decode reuses a state another
            // still has in flight), `t.jpeg` a live slice, `img` points at pitch * height bytes.
            let s = unsafe { (self.api.decode)(self.handle, state, t.jpeg.as_ptr(), t.jpeg.len(), OUTPUT_RGBI, &mut img, stream) };
            out.push(match s {
                STATUS_SUCCESS => ImageOutcome::Decoded,
                STATUS_BAD_JPEG | STATUS_INCOMPLETE_BITSTREAM => ImageOutcome::Corrupt(status_name(s).into()),
                STATUS_JPEG_NOT_SUPPORTED | STATUS_IMPLEMENTATION_NOT_SUPPORTED | STATUS_INVALID_PARAMETER => {
                    ImageOutcome::Unsupported(status_name(s).into())
                }
                _ => return Err(nv_err("decode", s)),
            });
        }
        Ok(out)
    }
}

/// A decoder state on `handle`.
fn new_state(api: &Api, handle: Handle) -> Result<State, Error> {
    let mut st: State = std::ptr::null_mut();
    // SAFETY: live handle; `st` written on success.
    let s = unsafe { (api.state_create)(handle, &mut st) };
    if s != STATUS_SUCCESS {
        return Err(nv_err("state create", s));
    }
    Ok(st)
}

/// What a backend needs beside its handle: for hardware the header parser and the batched
/// state (per-image states of the other backends are made on first use). On failure nothing
/// created here is left behind.
fn setup_backend(api: &Api, handle: Handle, backend: Backend) -> Result<(JpegStream, Vec<State>), Error> {
    if backend != Backend::Hardware {
        return Ok((std::ptr::null_mut(), Vec::new()));
    }
    let mut parser: JpegStream = std::ptr::null_mut();
    // SAFETY: live handle; `parser` written on success.
    let s = unsafe { (api.stream_create)(handle, &mut parser) };
    if s != STATUS_SUCCESS {
        return Err(nv_err("jpeg stream create", s));
    }
    match new_state(api, handle) {
        Ok(st) => Ok((parser, vec![st])),
        Err(e) => {
            // SAFETY: created just above, referenced nowhere else.
            unsafe { (api.stream_destroy)(parser) };
            Err(e)
        }
    }
}

fn image_for(t: &DecodeTarget<'_>) -> NvjpegImage {
    NvjpegImage { channel: [t.dst as *mut u8, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()], pitch: [t.pitch, 0, 0, 0] }
}

fn fmt_version(v: [c_int; 3]) -> String {
    format!("{}.{}.{}", v[0], v[1], v[2])
}

impl Drop for NvjpegDecoder {
    fn drop(&mut self) {
        self.release();
    }
}

/// Opens the nvJPEG library the probe found and checked (this build's CUDA major; the error of a
/// missing one lists every name tried) and reads its version.
fn open_library() -> Result<(libloading::Library, Api, [c_int; 3]), Error> {
    let found = libraries::require(&[Lib::Nvjpeg])?;
    let name = &found[0].name;
    // SAFETY: loading NVIDIA's library runs its initialisers, which only set up its own state.
    let lib = unsafe { libloading::Library::new(name) }.map_err(|e| Error::Cuda(format!("nvJPEG ({name}): {e}")))?;
    let api = load_api(&lib)?;
    let mut version = [0; 3];
    for (v, p) in version.iter_mut().zip(PROPERTIES) {
        // SAFETY: plain query into a local int.
        let s = unsafe { (api.get_property)(p, v) };
        if s != STATUS_SUCCESS {
            return Err(nv_err("version query", s));
        }
    }
    Ok((lib, api, version))
}

/// The nvJPEG library's version if it loads here (`"13.0.1"`), or why not; touches no GPU.
pub fn library_version() -> Result<String, Error> {
    open_library().map(|(_, _, v)| fmt_version(v))
}

fn load_api(lib: &libloading::Library) -> Result<Api, Error> {
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the symbol's type is the nvjpeg.h prototype written in `Api`; the pointer is
            // only used while `lib` stays loaded (NvjpegDecoder keeps both).
            let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                .map_err(|e| Error::Cuda(format!("nvJPEG library lacks {}: {e}", $name)))?;
            *s
        }};
    }
    Ok(Api {
        create_ex: sym!("nvjpegCreateEx"),
        destroy: sym!("nvjpegDestroy"),
        state_create: sym!("nvjpegJpegStateCreate"),
        state_destroy: sym!("nvjpegJpegStateDestroy"),
        decode: sym!("nvjpegDecode"),
        batched_initialize: sym!("nvjpegDecodeBatchedInitialize"),
        batched: sym!("nvjpegDecodeBatched"),
        stream_create: sym!("nvjpegJpegStreamCreate"),
        stream_destroy: sym!("nvjpegJpegStreamDestroy"),
        stream_parse_header: sym!("nvjpegJpegStreamParseHeader"),
        batched_supported: sym!("nvjpegDecodeBatchedSupported"),
        get_property: sym!("nvjpegGetProperty"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_struct_has_nvjpeg_h_layout() {
        // 4 channel pointers then 4 size_t pitches, no padding.
        assert_eq!(std::mem::size_of::<NvjpegImage>(), 8 * std::mem::size_of::<usize>());
        let img = NvjpegImage { channel: [std::ptr::null_mut(); 4], pitch: [0; 4] };
        let base = &img as *const _ as usize;
        assert_eq!(&img.pitch as *const _ as usize - base, 4 * std::mem::size_of::<*mut u8>());
    }

    #[test]
    fn a_missing_library_is_an_error_naming_what_was_tried() {
        // Where nvJPEG is installed this is its version; elsewhere (CI) an error that lists the
        // names tried, never a panic.
        match library_version() {
            Ok(v) => assert!(v.split('.').count() == 3, "{v}"),
            Err(e) => {
                let m = e.to_string();
                let first = format!("libnvjpeg.so.{}", libraries::BUILD_MAJOR);
                assert!(m.contains("nvJPEG (needed for JPEG decoding on the GPU") && m.contains(&first), "{m}");
            }
        }
    }

    #[test]
    fn every_status_has_its_name() {
        for s in 0..=10 {
            assert!(status_name(s).starts_with("NVJPEG_STATUS_"), "{s}");
        }
        assert_eq!(status_name(42), "unknown nvJPEG status");
        assert!(nv_err("decode", STATUS_BAD_JPEG).to_string().contains("NVJPEG_STATUS_BAD_JPEG"));
    }
}
