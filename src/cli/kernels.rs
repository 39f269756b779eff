//! `sptr kernels`: every CUDA kernel compiled with NVRTC for the given architectures, into the
//! kernel cache (`sptr info` names it), so that a GPU of those architectures finds them there and
//! its first frame compiles nothing. Needs libnvrtc, no GPU: a container build or a host without
//! the GPU can fill the cache of the machine that has it.

use anyhow::Result;

#[derive(clap::Args)]
pub struct KernelsArgs {
    /// GPU architectures to compile for, comma-separated (sm_XY).
    #[arg(long, value_delimiter = ',', default_value = "sm_90,sm_87,sm_86")]
    arch: Vec<String>,
}

#[cfg(feature = "cuda-core")]
pub fn command(a: KernelsArgs) -> Result<()> {
    use crate::device::kernels::{has_storage_twin, ALL};
    use crate::device::nvrtc;
    use crate::device::storage::Storage;
    let v = nvrtc::nvrtc_version()?;
    println!("NVRTC {}.{}, kernel cache {}", v.0, v.1, nvrtc::cache_dir().display());
    for a in &a.arch {
        let arch: nvrtc::Arch = a.parse()?;
        for k in ALL {
            for storage in Storage::ALL {
                if storage != Storage::Fp16 && !has_storage_twin(k.name) {
                    continue;
                }
                let t = std::time::Instant::now();
                let (cubin, origin) = nvrtc::cubin_cached_storage(k, arch, storage)?;
                let name = format!("{} ({storage})", k.name);
                let from = match origin {
                    nvrtc::Origin::Cache => "cached",
                    nvrtc::Origin::Compiled => "compiled",
                };
                println!("{name:<24} {:<7} {:>8} bytes  {from:<8} {:>6.0} ms", arch.target(), cubin.len(), t.elapsed().as_secs_f64() * 1e3);
            }
        }
    }
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
pub fn command(_: KernelsArgs) -> Result<()> {
    anyhow::bail!("this build has no CUDA support: rebuild with `--features cuda`")
}
