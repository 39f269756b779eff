//! Run-time kernel compilation with NVRTC, cached on disk.
//!
//! Kernels are compiled to a CUBIN for the exact device architecture (`sm_XY`): no PTX JIT in the
//! driver at load time, and no "PTX too new for this driver" failure. The CUBIN is cached under
//! `$SPTR_KERNEL_CACHE` (default `$XDG_CACHE_HOME/sptr/kernels` or `~/.cache/sptr/kernels`) in a
//! file whose name holds a SHA-256 of the source, the options, the architecture and the NVRTC
//! version, so an edited kernel, another GPU or another NVRTC never reuses a stale binary.
//! A module of [`kernels::STORAGE_MODULES`] compiles in either [`Storage`] (the BF16 build adds
//! one define, so its options, and so its cache file, differ; the FP16 build's are unchanged).
//! This module needs libnvrtc only, not the driver: CI uses it to compile every kernel.

use crate::device::kernels::{self, KernelSource};
use crate::device::storage::Storage;
use crate::Error;
use cudarc::nvrtc::sys;
use sha2::{Digest, Sha256};
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

/// A compute capability such as 9.0 (H100) or 8.7 (Jetson Orin).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    pub fn sm(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }

    /// Whether the kernels use Hopper's warpgroup MMA (`wgmma`) here: compute capability 9.0
    /// exactly (H100, H200; not its successors, whose tensor-core instructions differ), unless
    /// this process takes the portable paths ([`kernel_paths`]).
    pub fn has_wgmma(&self) -> bool {
        (self.major, self.minor) == (9, 0) && kernel_paths() == Ok(KernelPaths::Native)
    }

    /// Whether launches may group blocks into thread-block clusters here: compute capability 9.0
    /// and later, unless this process takes the portable paths ([`kernel_paths`]), which run
    /// exactly what an sm_8x GPU (no clusters) runs.
    pub fn has_clusters(&self) -> bool {
        self.major >= 9 && kernel_paths() == Ok(KernelPaths::Native)
    }

    /// NVRTC's target: `sm_90a` on 9.0, whose architecture-specific features (`wgmma`) the sparse
    /// conv kernels use (kernels test `__CUDA_ARCH_FEAT_SM90_ALL`); `sm_XY` elsewhere. A CUBIN
    /// for either runs on exactly that compute capability, which is what the cache keys on.
    pub fn target(&self) -> String {
        if self.has_wgmma() {
            format!("{}a", self.sm())
        } else {
            self.sm()
        }
    }
}

impl std::str::FromStr for Arch {
    type Err = Error;
    /// Accepts `sm_90`, `90`, `9.0`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || Error::InvalidInput(format!("bad architecture `{s}`: write e.g. sm_90, sm_87 or 9.0"));
        let t = s.trim_start_matches("sm_").trim_start_matches("compute_");
        let (maj, min) = match t.split_once('.') {
            Some((a, b)) => (a, b),
            None if t.len() >= 2 => t.split_at(t.len() - 1),
            None => return Err(bad()),
        };
        Ok(Arch { major: maj.parse().map_err(|_| bad())?, minor: min.parse().map_err(|_| bad())? })
    }
}

/// Which kernels this process takes where a GPU offers more than every supported GPU has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPaths {
    /// The fastest the GPU has (the default): Hopper's `wgmma` kernels, compiled for `sm_90a`.
    Native,
    /// Exactly the kernels an sm_8x GPU (Ampere, Orin, Ada) runs: no `wgmma`, no `sm_90a` target,
    /// no thread-block clusters.
    /// `SPTR_KERNEL_PATHS=portable` measures those paths on an H100.
    Portable,
}

/// The kernel paths of this process, from `SPTR_KERNEL_PATHS` (`native`, the default, or
/// `portable`), read once. Any other value is an error, which [`crate::device::cuda::CudaDevice`]
/// reports when it opens the GPU.
pub fn kernel_paths() -> Result<KernelPaths, String> {
    static PATHS: std::sync::OnceLock<Result<KernelPaths, String>> = std::sync::OnceLock::new();
    PATHS.get_or_init(|| parse_kernel_paths(std::env::var("SPTR_KERNEL_PATHS").ok().as_deref())).clone()
}

fn parse_kernel_paths(value: Option<&str>) -> Result<KernelPaths, String> {
    match value.map(str::trim) {
        None | Some("") | Some("native") => Ok(KernelPaths::Native),
        Some("portable") => Ok(KernelPaths::Portable),
        Some(other) => Err(format!(
            "SPTR_KERNEL_PATHS is `{other}`: write `native` (the default: the fastest kernels of the GPU) or `portable` (the kernels an sm_8x GPU takes)"
        )),
    }
}

/// Which kernels each op family takes on `arch` in this process, for `sptr info`.
pub fn op_paths(arch: Arch) -> Vec<(&'static str, String)> {
    let conv = if arch.has_wgmma() {
        "wgmma pipelined kernels (sm_90a) where Cin and Cout are multiples of 64; mma.sync tiled kernels otherwise".to_string()
    } else {
        let why = if (arch.major, arch.minor) == (9, 0) { " (SPTR_KERNEL_PATHS=portable)" } else { "" };
        format!("mma.sync tiled kernels (tensor cores){why}")
    };
    vec![
        ("compiled for", arch.target()),
        ("sparse conv", conv),
        ("window attention", "mma.sync m16n8k16 tensor-core kernels".to_string()),
        ("Swin-T, FPN, BEV decoder", "cuBLAS / cuBLASLt GEMMs; cuDNN convolutions (im2col + cuBLAS where cuDNN has none)".to_string()),
        ("voxelize, bev_pool, label grids, image preprocessing, norms", "CUDA-core kernels".to_string()),
    ]
}

/// Whether libnvrtc can be loaded (cudarc panics on first use when it cannot).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library by name.
    unsafe { sys::is_culib_present() }
}

fn require_nvrtc() -> Result<(), Error> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err(Error::KernelCompile(
            "libnvrtc (CUDA 13) not found: install the CUDA toolkit or the PyPI wheel \
             nvidia-cuda-nvrtc==13.0.*, and put its lib directory on LD_LIBRARY_PATH \
             (scripts/cuda_env.sh does both)"
                .into(),
        ))
    }
}

/// NVRTC's version, e.g. (13, 0).
pub fn nvrtc_version() -> Result<(i32, i32), Error> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    check(r, "nvrtcVersion")?;
    Ok((major, minor))
}

fn check(r: sys::nvrtcResult, what: &str) -> Result<(), Error> {
    if r == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(Error::KernelCompile(format!("{what} failed: {r:?}")))
    }
}

/// Directories searched for the CUDA headers (`cuda_fp16.h`): `$SPTR_CUDA_INCLUDE`,
/// `$CUDA_HOME/include`, `/usr/local/cuda/include`; only those that exist.
pub fn include_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Ok(p) = std::env::var("SPTR_CUDA_INCLUDE") {
        v.push(PathBuf::from(p));
    }
    if let Ok(p) = std::env::var("CUDA_HOME") {
        v.push(Path::new(&p).join("include"));
    }
    v.push(PathBuf::from("/usr/local/cuda/include"));
    v.retain(|p| p.join("cuda_fp16.h").is_file());
    v
}

fn options(arch: Arch, fmad: bool, storage: Storage, includes: &[PathBuf]) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={}", arch.target()),
        "--std=c++17".to_string(),
        // IEEE division and (unless the module opts in) no FMA contraction: the voxel key
        // `floor((p - o) / v)` must round exactly as the CPU reference does, or CPU and GPU
        // disagree on boundary points.
        format!("--fmad={fmad}"),
        "--prec-div=true".to_string(),
        "-default-device".to_string(),
        "-lineinfo".to_string(),
    ];
    if let Some(d) = storage.define() {
        o.push(format!("-D{d}"));
    }
    for i in includes {
        o.push(format!("--include-path={}", i.display()));
    }
    o
}

/// A compiled module: CUBIN bytes and the compiler's log (warnings).
pub struct Compiled {
    pub cubin: Vec<u8>,
    pub log: String,
}

/// Compiles `k` for `arch` to a CUBIN (its FP16 build). Does not touch the cache.
pub fn compile(k: &KernelSource, arch: Arch) -> Result<Compiled, Error> {
    compile_storage(k, arch, Storage::Fp16)
}

/// An error unless `k` has a build for `storage` (every module has FP16; BF16 only those of
/// [`kernels::STORAGE_MODULES`]).
fn check_storage(k: &KernelSource, storage: Storage) -> Result<(), Error> {
    if storage == Storage::Fp16 || kernels::has_storage_twin(k.name) {
        Ok(())
    } else {
        Err(Error::KernelCompile(format!(
            "kernel module {} has no {storage} build (modules with one: {})",
            k.name,
            kernels::STORAGE_MODULES.join(", ")
        )))
    }
}

/// The architectures this NVRTC compiles for (`nvrtcGetSupportedArchs`), lowest first: each
/// release knows the GPUs up to its own (12.6 stops at sm_90; 12.8 added sm_100 and sm_120) and
/// drops old ones (13.0 starts at sm_75). Read once per process.
pub fn supported_archs() -> Result<&'static [Arch], Error> {
    static ARCHS: std::sync::OnceLock<Vec<Arch>> = std::sync::OnceLock::new();
    if let Some(a) = ARCHS.get() {
        return Ok(a);
    }
    require_nvrtc()?;
    let mut n = 0;
    // SAFETY: valid out-pointers; the array has the length NVRTC reported.
    let mut codes = unsafe {
        check(sys::nvrtcGetNumSupportedArchs(&mut n), "nvrtcGetNumSupportedArchs")?;
        let mut v = vec![0i32; n.max(0) as usize];
        check(sys::nvrtcGetSupportedArchs(v.as_mut_ptr()), "nvrtcGetSupportedArchs")?;
        v
    };
    codes.sort_unstable();
    let archs = codes.into_iter().filter(|&c| c > 0).map(|c| Arch { major: c as u32 / 10, minor: c as u32 % 10 }).collect();
    Ok(ARCHS.get_or_init(|| archs))
}

/// An error naming the NVRTC and what it knows unless it compiles for `arch`: a GPU newer (or,
/// for CUDA 13, older) than this NVRTC is refused before any compile, not mis-compiled.
pub fn check_arch(arch: Arch) -> Result<(), Error> {
    let known = supported_archs()?;
    if known.contains(&arch) {
        return Ok(());
    }
    let (major, minor) = nvrtc_version()?;
    let list: Vec<String> = known.iter().map(Arch::sm).collect();
    let newer = known.last().is_some_and(|last| (arch.major, arch.minor) > (last.major, last.minor));
    let what = if newer {
        "this GPU is newer than this NVRTC: put the NVRTC of a CUDA release that knows it first on LD_LIBRARY_PATH (sm_100 and sm_120 need CUDA 12.8 or later)"
    } else {
        "this NVRTC no longer compiles for this GPU: put an older NVRTC (CUDA 12) first on LD_LIBRARY_PATH"
    };
    Err(Error::KernelCompile(format!("NVRTC {major}.{minor} cannot compile for {} (it knows {}): {what}", arch.sm(), list.join(", "))))
}

/// [`compile`] of `k`'s build for `storage`.
pub fn compile_storage(k: &KernelSource, arch: Arch, storage: Storage) -> Result<Compiled, Error> {
    check_storage(k, storage)?;
    require_nvrtc()?;
    check_arch(arch)?;
    let includes = include_dirs();
    let src = CString::new(kernels::full_source(k))
        .map_err(|_| Error::KernelCompile(format!("{}: source contains a NUL byte", k.name)))?;
    let name = CString::new(format!("{}.cu", k.name)).map_err(|_| Error::KernelCompile("bad name".into()))?;
    let opts: Vec<CString> = options(arch, k.fmad, storage, &includes)
        .into_iter()
        .map(|o| CString::new(o).map_err(|_| Error::KernelCompile("option with NUL".into())))
        .collect::<Result<_, _>>()?;
    let opt_ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();

    let mut prog: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: all pointers are valid C strings that outlive the calls; `prog` is destroyed below.
    unsafe {
        check(
            sys::nvrtcCreateProgram(&mut prog, src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            "nvrtcCreateProgram",
        )?;
        let compiled = sys::nvrtcCompileProgram(prog, opt_ptrs.len() as i32, opt_ptrs.as_ptr());
        let log = program_log(prog);
        let result = if compiled != sys::nvrtcResult::NVRTC_SUCCESS {
            let hint = if includes.is_empty() && log.contains("cuda_fp16.h") {
                "\nhint: no CUDA headers found; set SPTR_CUDA_INCLUDE to a directory holding cuda_fp16.h"
            } else {
                ""
            };
            Err(Error::KernelCompile(format!("{}.cu ({storage}) for {} ({compiled:?}):\n{log}{hint}", k.name, arch.sm())))
        } else {
            cubin(prog).map(|cubin| Compiled { cubin, log })
        };
        let mut p = prog;
        sys::nvrtcDestroyProgram(&mut p);
        result
    }
}

unsafe fn program_log(prog: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    if sys::nvrtcGetProgramLogSize(prog, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return String::new();
    }
    let mut buf = vec![0 as std::ffi::c_char; size];
    if sys::nvrtcGetProgramLog(prog, buf.as_mut_ptr()) != sys::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    CStr::from_ptr(buf.as_ptr()).to_string_lossy().trim().to_string()
}

unsafe fn cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, Error> {
    let mut size = 0usize;
    check(sys::nvrtcGetCUBINSize(prog, &mut size), "nvrtcGetCUBINSize")?;
    let mut buf = vec![0 as std::ffi::c_char; size];
    check(sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr()), "nvrtcGetCUBIN")?;
    Ok(buf.into_iter().map(|c| c as u8).collect())
}

/// The kernel cache directory.
pub fn cache_dir() -> PathBuf {
    if let Ok(p) = std::env::var("SPTR_KERNEL_CACHE") {
        return PathBuf::from(p);
    }
    let base = std::env::var("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|_| std::env::var("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(|_| std::env::temp_dir());
    base.join("sptr").join("kernels")
}

/// The cache file for `k` (its FP16 build) on `arch` with this NVRTC.
pub fn cache_path(k: &KernelSource, arch: Arch, nvrtc: (i32, i32)) -> PathBuf {
    cache_path_storage(k, arch, nvrtc, Storage::Fp16)
}

/// The cache file for `k`'s build for `storage` on `arch` with this NVRTC.
pub fn cache_path_storage(k: &KernelSource, arch: Arch, nvrtc: (i32, i32), storage: Storage) -> PathBuf {
    let mut h = Sha256::new();
    h.update(kernels::full_source(k).as_bytes());
    for o in options(arch, k.fmad, storage, &[]) {
        h.update(o.as_bytes());
        h.update([0u8]);
    }
    h.update(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    let digest = h.finalize();
    let hex: String = digest.iter().take(12).map(|b| format!("{b:02x}")).collect();
    let suffix = if storage == Storage::Fp16 { String::new() } else { format!("-{storage}") };
    cache_dir().join(format!("{}{suffix}-{}-{hex}.cubin", k.name, arch.sm()))
}

/// Where a module came from, for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Cache,
    Compiled,
}

/// The CUBIN of `k` (its FP16 build) for `arch`: from the disk cache, or compiled and then
/// cached. A cache that cannot be written (read-only home, full disk) costs a recompile next
/// time, nothing more.
pub fn cubin_cached(k: &KernelSource, arch: Arch) -> Result<(Vec<u8>, Origin), Error> {
    cubin_cached_storage(k, arch, Storage::Fp16)
}

/// [`cubin_cached`] of `k`'s build for `storage`.
pub fn cubin_cached_storage(k: &KernelSource, arch: Arch, storage: Storage) -> Result<(Vec<u8>, Origin), Error> {
    check_storage(k, storage)?;
    let path = cache_path_storage(k, arch, nvrtc_version()?, storage);
    if let Ok(bytes) = std::fs::read(&path) {
        if !bytes.is_empty() {
            return Ok((bytes, Origin::Cache));
        }
    }
    let c = compile_storage(k, arch, storage)?;
    if let Some(dir) = path.parent() {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&tmp, &c.cubin))
            .and_then(|_| std::fs::rename(&tmp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            eprintln!("sptr: warning: could not cache kernel {} at {}: {e}", k.name, path.display());
        }
    }
    Ok((c.cubin, Origin::Compiled))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_paths_are_native_unless_portable_is_asked_and_other_words_are_refused() {
        assert_eq!(parse_kernel_paths(None), Ok(KernelPaths::Native));
        assert_eq!(parse_kernel_paths(Some("native")), Ok(KernelPaths::Native));
        assert_eq!(parse_kernel_paths(Some("portable")), Ok(KernelPaths::Portable));
        let e = parse_kernel_paths(Some("sm80")).unwrap_err();
        assert!(e.contains("`sm80`") && e.contains("native") && e.contains("portable"), "{e}");
    }

    #[test]
    fn only_compute_capability_9_0_targets_sm_90a() {
        let hopper = Arch { major: 9, minor: 0 };
        let orin = Arch { major: 8, minor: 7 };
        assert_eq!(orin.target(), "sm_87");
        assert!(!orin.has_wgmma());
        // this test process does not set SPTR_KERNEL_PATHS: the native paths
        if kernel_paths() == Ok(KernelPaths::Native) {
            assert_eq!(hopper.target(), "sm_90a");
            assert!(op_paths(hopper)[1].1.starts_with("wgmma"));
        }
        assert!(op_paths(orin)[1].1.starts_with("mma.sync"));
    }
}
