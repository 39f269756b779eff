//! The CUDA libraries this build opens at run time, found the way it will open them, with their
//! versions checked against the CUDA major the build binds.
//!
//! A build binds one CUDA major's API (`--features cuda`: 13, `--features cuda12`: 12.6; see
//! [`BUILD_MAJOR`]). cudarc opens each library with `dlopen`, trying a list of names in order
//! (`libX.so`, then `libX.so.<major>`, then older majors), so a machine with another CUDA first
//! on the library path hands a CUDA 13 build a CUDA 12 library, or the reverse; calls through
//! the wrong API table then fail inside a launch, or a missing library panics inside cudarc.
//! [`probe`] opens what cudarc would open (the same names, the same order, so the same file),
//! asks it for its version, and [`require`] turns a missing or mismatched library into an error
//! that names what was found, where, and what this build needs, before any of it is used.
//!
//! What "fits" means per library:
//! - the driver (`libcuda.so.1`): it supports at least CUDA `BUILD_MAJOR`.0 (the driver API is
//!   backward compatible; the kernels are CUBINs for the exact GPU, so no PTX needs a newer one);
//! - cuBLAS, cuBLASLt, nvJPEG: their major is `BUILD_MAJOR` (their APIs change between majors);
//! - NVRTC: major 12 or 13, whichever the build binds (the calls sptr makes are the same in both:
//!   a CUDA 13 build ran every GPU test with NVRTC 12.6's kernels), and not newer than the
//!   driver, which cannot load a CUBIN of a newer CUDA major ([`check_nvrtc_against_driver`]);
//! - cuDNN: major 9 (the API sptr calls), built for CUDA `BUILD_MAJOR` (its `cudart` version).

use crate::Error;
use std::ffi::{c_int, c_void, CStr};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The CUDA major this build binds (set by build.rs from the `cuda` / `cuda12` feature).
pub const BUILD_MAJOR: u32 = match env!("SPTR_CUDA_MAJOR").as_bytes() {
    b"12" => 12,
    _ => 13,
};

/// The CUDA API version the build's bindings are generated from, for messages (`"13.0"`).
pub const BUILD_API: &str = if BUILD_MAJOR == 12 { "12.6" } else { "13.0" };

/// The feature that builds for the other major, for messages.
const OTHER_BUILD: &str = if BUILD_MAJOR == 12 { "--features cuda (CUDA 13)" } else { "--features cuda12 (CUDA 12.6)" };

/// A library sptr opens at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Driver,
    Nvrtc,
    Cublas,
    CublasLt,
    Cudnn,
    Nvjpeg,
}

impl Lib {
    pub const ALL: [Lib; 6] = [Lib::Driver, Lib::Nvrtc, Lib::Cublas, Lib::CublasLt, Lib::Cudnn, Lib::Nvjpeg];

    /// The name users know it by.
    pub fn label(self) -> &'static str {
        match self {
            Lib::Driver => "driver",
            Lib::Nvrtc => "NVRTC",
            Lib::Cublas => "cuBLAS",
            Lib::CublasLt => "cuBLASLt",
            Lib::Cudnn => "cuDNN",
            Lib::Nvjpeg => "nvJPEG",
        }
    }

    /// What uses it, for `sptr info` and the errors.
    pub fn used_for(self) -> &'static str {
        match self {
            Lib::Driver | Lib::Nvrtc => "every GPU path",
            Lib::Cublas | Lib::CublasLt | Lib::Cudnn => "the BEVFusion map models",
            Lib::Nvjpeg => "JPEG decoding on the GPU (the map models' camera input)",
        }
    }

    /// The file names tried, in the order the code that uses the library tries them.
    pub fn candidates(self) -> Vec<String> {
        match self {
            // cudarc's own list for its `culib()`, so that the probe opens the same file
            Lib::Driver => cudarc::get_lib_name_candidates("cuda"),
            Lib::Nvrtc => cudarc::get_lib_name_candidates("nvrtc"),
            Lib::Cublas => cudarc::get_lib_name_candidates("cublas"),
            Lib::CublasLt => cudarc::get_lib_name_candidates("cublasLt"),
            Lib::Cudnn => cudarc::get_lib_name_candidates("cudnn"),
            // sensors::image::nvjpeg opens it itself: this build's major, then the plain name
            Lib::Nvjpeg => vec![format!("libnvjpeg.so.{BUILD_MAJOR}"), "libnvjpeg.so".to_string()],
        }
    }

    /// How to get a library that fits, for the errors.
    fn install_hint(self) -> String {
        let m = BUILD_MAJOR;
        match self {
            Lib::Driver => format!(
                "install an NVIDIA driver for CUDA {m} or newer ({}), or use a build for the driver's CUDA ({OTHER_BUILD})",
                if m == 12 { "525 or newer; JetPack 6 on Jetson" } else { "580 or newer" }
            ),
            Lib::Nvrtc => format!("put CUDA {m}'s NVRTC first on LD_LIBRARY_PATH (the CUDA {m} toolkit, or the PyPI wheel nvidia-cuda-nvrtc{})", pypi_suffix()),
            Lib::Cublas | Lib::CublasLt => format!("put CUDA {m}'s cuBLAS first on LD_LIBRARY_PATH (the CUDA {m} toolkit, or the PyPI wheel nvidia-cublas{})", pypi_suffix()),
            Lib::Cudnn => format!("put cuDNN 9 for CUDA {m} first on LD_LIBRARY_PATH (PyPI: nvidia-cudnn-cu{m})"),
            Lib::Nvjpeg => format!("put CUDA {m}'s nvJPEG first on LD_LIBRARY_PATH (the CUDA {m} toolkit, or the PyPI wheel nvidia-nvjpeg{})", pypi_suffix()),
        }
    }
}

fn pypi_suffix() -> &'static str {
    if BUILD_MAJOR == 12 {
        "-cu12"
    } else {
        " (13.x)"
    }
}

/// A library as found: where, which version, and which CUDA major it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub lib: Lib,
    /// The name that opened it (one of [`Lib::candidates`]).
    pub name: String,
    /// Its file, as the dynamic loader resolved it.
    pub path: PathBuf,
    /// Its version as it reports it (`"13.0.1"`; the driver: the CUDA version it supports).
    pub version: String,
    /// The CUDA major it belongs to (the driver: the newest it supports).
    pub cuda_major: u32,
    /// Why it does not fit this build, if it does not.
    pub mismatch: Option<String>,
}

impl Found {
    /// One line for `sptr info`.
    pub fn describe(&self) -> String {
        let verdict = match &self.mismatch {
            None => "fits".to_string(),
            Some(why) => format!("DOES NOT FIT: {why}"),
        };
        format!("{:<9} {} {} ({verdict})", self.lib.label(), self.version, self.path.display())
    }
}

/// Opens `lib` as the code that uses it would, and reads its version; touches no GPU.
/// `Err` when no candidate opens (the message lists them) or the version query fails. Read once
/// per process (the loader's search path is fixed at start), so every later check is a lookup.
pub fn probe(lib: Lib) -> Result<Found, String> {
    static FOUND: [OnceLock<Result<Found, String>>; Lib::ALL.len()] = [const { OnceLock::new() }; Lib::ALL.len()];
    // `Lib::ALL` lists the variants in declaration order, so a variant's number is its slot
    FOUND[lib as usize].get_or_init(|| probe_now(lib)).clone()
}

fn probe_now(lib: Lib) -> Result<Found, String> {
    let names = lib.candidates();
    let mut opened = None;
    for name in &names {
        // SAFETY: loading NVIDIA's library runs its initialisers, which only set up its own state;
        // cudarc and nvJPEG's loader open the same file by the same name later.
        if let Ok(l) = unsafe { libloading::Library::new(name) } {
            opened = Some((name.clone(), l));
            break;
        }
    }
    let Some((name, handle)) = opened else {
        // the Linux names alone (cudarc's list also holds Windows-style `lib<x>64_<v>.so` ones)
        let mut linux: Vec<&str> = names.iter().map(String::as_str).filter(|n| !n.contains("64")).collect();
        linux.dedup();
        return Err(format!("not found (tried {})", linux.join(", ")));
    };
    let (version, cuda_major, symbol) = read_version(lib, &handle)?;
    let path = file_of(symbol).unwrap_or_else(|| PathBuf::from(&name));
    let mismatch = judge(lib, &version, cuda_major);
    Ok(Found { lib, name, path, version, cuda_major, mismatch })
}

/// Why a library of this version does not fit this build (`None`: it fits).
fn judge(lib: Lib, version: &str, cuda_major: u32) -> Option<String> {
    let m = BUILD_MAJOR;
    match lib {
        Lib::Driver if cuda_major < m => Some(format!("the driver supports CUDA up to {version}; this build (CUDA {BUILD_API} API) needs CUDA {m}.0 or newer")),
        Lib::Driver => None,
        Lib::Cudnn if !version.starts_with("9.") => Some(format!("cuDNN {version}; sptr calls the cuDNN 9 API")),
        Lib::Nvrtc if !(12..=13).contains(&cuda_major) => Some(format!("NVRTC {version}; sptr calls the NVRTC API of CUDA 12 and 13")),
        Lib::Nvrtc => None,
        _ if cuda_major != m => Some(format!("it belongs to CUDA {cuda_major}; this build binds CUDA {BUILD_API}")),
        _ => None,
    }
}

/// The version of an opened library, the CUDA major it belongs to, and the address of a symbol
/// of it (to find its file).
fn read_version(lib: Lib, handle: &libloading::Library) -> Result<(String, u32, *const c_void), String> {
    type GetInt = unsafe extern "C" fn(*mut c_int) -> c_int;
    type GetTwo = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
    type GetProperty = unsafe extern "C" fn(c_int, *mut c_int) -> c_int;
    type GetSize = unsafe extern "C" fn() -> usize;
    fn sym<T: Copy>(handle: &libloading::Library, name: &str) -> Result<T, String> {
        // SAFETY: the caller names the symbol's C signature as T.
        unsafe { handle.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|e| format!("its {name} cannot be found ({e}): not a usable library"))
    }
    let failed = |what: &str, status: c_int| format!("{what} returned status {status}");
    // (major, minor, patch) from a library's getProperty(MAJOR=0, MINOR=1, PATCH=2)
    let properties = |name: &str| -> Result<(String, u32, *const c_void), String> {
        let get: GetProperty = sym(handle, name)?;
        let mut v = [0 as c_int; 3];
        for (p, out) in v.iter_mut().enumerate() {
            // SAFETY: plain query into a local int.
            let s = unsafe { get(p as c_int, out) };
            if s != 0 {
                return Err(failed(name, s));
            }
        }
        Ok((format!("{}.{}.{}", v[0], v[1], v[2]), v[0].max(0) as u32, get as *const c_void))
    };
    match lib {
        Lib::Driver => {
            let get: GetInt = sym(handle, "cuDriverGetVersion")?;
            let mut v: c_int = 0;
            // SAFETY: plain query into a local int; allowed before cuInit.
            let s = unsafe { get(&mut v) };
            if s != 0 {
                return Err(failed("cuDriverGetVersion", s));
            }
            let (major, minor) = (v / 1000, (v % 1000) / 10);
            Ok((format!("{major}.{minor}"), major.max(0) as u32, get as *const c_void))
        }
        Lib::Nvrtc => {
            let get: GetTwo = sym(handle, "nvrtcVersion")?;
            let (mut major, mut minor) = (0, 0);
            // SAFETY: two valid out-pointers.
            let s = unsafe { get(&mut major, &mut minor) };
            if s != 0 {
                return Err(failed("nvrtcVersion", s));
            }
            Ok((format!("{major}.{minor}"), major.max(0) as u32, get as *const c_void))
        }
        Lib::Cublas => properties("cublasGetProperty"),
        Lib::CublasLt => properties("cublasLtGetProperty"),
        Lib::Nvjpeg => properties("nvjpegGetProperty"),
        Lib::Cudnn => {
            let version: GetSize = sym(handle, "cudnnGetVersion")?;
            let cudart: GetSize = sym(handle, "cudnnGetCudartVersion")?;
            // SAFETY: plain queries without arguments.
            let (v, rt) = unsafe { (version(), cudart()) };
            // cuDNN 9 numbers itself major*10000 + minor*100 + patch; cudart as major*1000 + minor*10
            let text = format!("{}.{}.{} for CUDA {}.{}", v / 10000, (v % 10000) / 100, v % 100, rt / 1000, (rt % 1000) / 10);
            Ok((text, (rt / 1000) as u32, version as *const c_void))
        }
    }
}

/// The file a loaded symbol lives in, as the dynamic loader resolved it.
fn file_of(symbol: *const c_void) -> Option<PathBuf> {
    // SAFETY: dladdr only reads the loader's tables; `info` is written by it.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    if unsafe { libc::dladdr(symbol, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr returned a NUL-terminated string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(name.to_string_lossy().into_owned()))
}

/// An error unless the driver can load what this NVRTC makes: a CUBIN of CUDA major N needs a
/// driver for CUDA N or newer.
pub fn check_nvrtc_against_driver(nvrtc: &Found, driver: &Found) -> Result<(), Error> {
    if nvrtc.cuda_major <= driver.cuda_major {
        return Ok(());
    }
    Err(Error::Cuda(format!(
        "NVRTC {} at {} makes kernels for CUDA {}, which the driver (CUDA {}) cannot load: put an NVRTC of CUDA {} first on LD_LIBRARY_PATH, or update the driver",
        nvrtc.version,
        nvrtc.path.display(),
        nvrtc.cuda_major,
        driver.version,
        driver.cuda_major
    )))
}

/// Every library in `libs`, each found and fitting this build; otherwise one error naming,
/// for each that is missing or does not fit, what was found (where, which version), what this
/// build needs and how to get it.
pub fn require(libs: &[Lib]) -> Result<Vec<Found>, Error> {
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for &lib in libs {
        match probe(lib) {
            Ok(f) if f.mismatch.is_none() => found.push(f),
            Ok(f) => problems.push(format!(
                "{} {} at {} does not fit: {}; {}",
                lib.label(),
                f.version,
                f.path.display(),
                f.mismatch.as_deref().unwrap_or_default(),
                lib.install_hint()
            )),
            Err(why) => problems.push(format!("{} (needed for {}): {why}; {}", lib.label(), lib.used_for(), lib.install_hint())),
        }
    }
    if problems.is_empty() {
        Ok(found)
    } else {
        Err(Error::Cuda(format!("this build binds CUDA {BUILD_API} and cannot use the CUDA libraries here: {}", problems.join(". "))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_fits_when_it_supports_the_build_major_or_newer() {
        assert_eq!(judge(Lib::Driver, "13.0", BUILD_MAJOR), None);
        assert_eq!(judge(Lib::Driver, "13.2", BUILD_MAJOR + 1), None);
        let old = judge(Lib::Driver, "11.8", BUILD_MAJOR - 1).expect("an older driver does not fit");
        assert!(old.contains(&format!("needs CUDA {BUILD_MAJOR}.0 or newer")), "{old}");
    }

    #[test]
    fn libraries_fit_only_their_own_major() {
        for lib in [Lib::Cublas, Lib::CublasLt, Lib::Nvjpeg] {
            assert_eq!(judge(lib, "x", BUILD_MAJOR), None, "{lib:?}");
            for other in [BUILD_MAJOR - 1, BUILD_MAJOR + 1] {
                let why = judge(lib, "x", other).unwrap_or_else(|| panic!("{lib:?} of CUDA {other} must not fit"));
                assert!(why.contains(&format!("belongs to CUDA {other}")) && why.contains(BUILD_API), "{why}");
            }
        }
    }

    #[test]
    fn nvrtc_of_either_major_fits_unless_the_driver_is_older() {
        assert_eq!(judge(Lib::Nvrtc, "12.6", 12), None);
        assert_eq!(judge(Lib::Nvrtc, "13.0", 13), None);
        assert!(judge(Lib::Nvrtc, "11.8", 11).is_some_and(|w| w.contains("CUDA 12 and 13")));
        let found = |lib, major: u32| Found {
            lib,
            name: String::new(),
            path: PathBuf::from("/x"),
            version: format!("{major}.0"),
            cuda_major: major,
            mismatch: None,
        };
        assert!(check_nvrtc_against_driver(&found(Lib::Nvrtc, 12), &found(Lib::Driver, 13)).is_ok());
        assert!(check_nvrtc_against_driver(&found(Lib::Nvrtc, 13), &found(Lib::Driver, 13)).is_ok());
        let e = check_nvrtc_against_driver(&found(Lib::Nvrtc, 13), &found(Lib::Driver, 12)).unwrap_err().to_string();
        assert!(e.contains("NVRTC 13.0 at /x") && e.contains("driver (CUDA 12.0) cannot load"), "{e}");
    }

    #[test]
    fn cudnn_must_be_nine_and_built_for_the_build_major() {
        assert_eq!(judge(Lib::Cudnn, "9.10.2 for CUDA 13.0", BUILD_MAJOR), None);
        assert!(judge(Lib::Cudnn, "8.9.7 for CUDA 13.0", BUILD_MAJOR).is_some_and(|w| w.contains("cuDNN 9 API")));
        assert!(judge(Lib::Cudnn, "9.10.2 for CUDA 11.8", 11).is_some_and(|w| w.contains("belongs to CUDA 11")));
    }

    #[test]
    fn each_library_has_its_own_probe_slot() {
        for (i, lib) in Lib::ALL.iter().enumerate() {
            assert_eq!(*lib as usize, i, "{lib:?}");
        }
    }

    #[test]
    fn the_probe_tries_cudarcs_names_and_nvjpeg_of_the_build_major_first() {
        assert_eq!(Lib::Nvrtc.candidates(), cudarc::get_lib_name_candidates("nvrtc"));
        assert_eq!(Lib::Nvjpeg.candidates()[0], format!("libnvjpeg.so.{BUILD_MAJOR}"));
    }
}
