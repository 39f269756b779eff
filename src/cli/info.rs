//! `sptr info`: what this build and machine offer: the CUDA major the build binds, each CUDA
//! library as it will be opened (file, version, whether it fits), the GPU and which kernels
//! each op takes on it.

use anyhow::Result;

pub fn command() -> Result<()> {
    println!("sptr {}", env!("CARGO_PKG_VERSION"));
    println!("features: cuda={} ros={}", cuda_feature(), cfg!(feature = "ros"));
    println!("kernel modules: {}", crate::device::kernels::ALL.iter().map(|k| k.name).collect::<Vec<_>>().join(", "));
    #[cfg(feature = "cuda-core")]
    cuda_report();
    Ok(())
}

/// The CUDA the build binds, in words.
fn cuda_feature() -> String {
    #[cfg(feature = "cuda-core")]
    {
        use crate::device::libraries::{BUILD_API, BUILD_MAJOR};
        format!("CUDA {BUILD_MAJOR} (API {BUILD_API})")
    }
    #[cfg(not(feature = "cuda-core"))]
    {
        "no".to_string()
    }
}

#[cfg(feature = "cuda-core")]
fn cuda_report() {
    use crate::device::libraries::{probe, Lib, BUILD_MAJOR};
    use crate::device::{cuda, nvrtc};
    println!("CUDA libraries (this build needs CUDA {BUILD_MAJOR}'s):");
    let mut nvrtc_fits = false;
    for lib in Lib::ALL {
        match probe(lib) {
            Ok(found) => {
                nvrtc_fits |= lib == Lib::Nvrtc && found.mismatch.is_none();
                println!("  {}", found.describe())
            }
            Err(why) => println!("  {:<9} {why} (needed for {})", lib.label(), lib.used_for()),
        }
    }
    // Only an NVRTC that fits is called: another one's calls may not exist.
    if nvrtc_fits {
        if let Ok(v) = nvrtc::nvrtc_version() {
            println!("kernel cache: {} (NVRTC {}.{})", nvrtc::cache_dir().display(), v.0, v.1);
        }
        if let Ok(archs) = nvrtc::supported_archs() {
            println!("NVRTC compiles for: {}", archs.iter().map(|a| a.sm()).collect::<Vec<_>>().join(", "));
        }
    }
    match nvrtc::kernel_paths() {
        Ok(p) => println!("kernel paths: {p:?} (SPTR_KERNEL_PATHS)"),
        Err(e) => println!("kernel paths: {e}"),
    }
    match cuda::CudaDevice::new(0) {
        Ok(d) => {
            println!("GPU 0: {}, compute capability {}.{} ({})", d.name, d.arch.major, d.arch.minor, d.arch.sm());
            for (op, path) in nvrtc::op_paths(d.arch) {
                println!("  {op}: {path}");
            }
        }
        Err(e) => println!("GPU: {e}"),
    }
}
