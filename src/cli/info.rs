//! `sptr info`: what this build and machine offer.

use anyhow::Result;

pub fn command() -> Result<()> {
    println!("sptr {}", env!("CARGO_PKG_VERSION"));
    println!("features: cuda={} ros={}", cfg!(feature = "cuda"), cfg!(feature = "ros"));
    println!("kernel modules: {}", crate::device::kernels::ALL.iter().map(|k| k.name).collect::<Vec<_>>().join(", "));
    #[cfg(feature = "cuda")]
    {
        use crate::device::{cuda, nvrtc};
        match nvrtc::nvrtc_version() {
            Ok(v) => println!("NVRTC {}.{}; kernel cache {}", v.0, v.1, nvrtc::cache_dir().display()),
            Err(e) => println!("NVRTC: {e}"),
        }
        if let Ok(archs) = nvrtc::supported_archs() {
            println!("NVRTC compiles for: {}", archs.iter().map(|a| a.sm()).collect::<Vec<_>>().join(", "));
        }
        match cuda::CudaDevice::new(0) {
            Ok(d) => println!("GPU 0: {} ({})", d.name, d.arch.sm()),
            Err(e) => println!("GPU: {e}"),
        }
    }
    Ok(())
}
