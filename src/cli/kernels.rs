//! `sptr kernels`: every CUDA kernel compiled with NVRTC for the given architectures.

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
    println!("NVRTC {}.{}", v.0, v.1);
    for a in &a.arch {
        let arch: nvrtc::Arch = a.parse()?;
        for k in ALL {
            for storage in Storage::ALL {
                if storage != Storage::Fp16 && !has_storage_twin(k.name) {
                    continue;
                }
                let t = std::time::Instant::now();
                let c = nvrtc::compile_storage(k, arch, storage)?;
                let name = format!("{} ({storage})", k.name);
                println!("{name:<24} {:<7} {:>8} bytes  {:>6.0} ms", arch.target(), c.cubin.len(), t.elapsed().as_secs_f64() * 1e3);
                if !c.log.is_empty() {
                    println!("{}", c.log);
                }
            }
        }
    }
    Ok(())
}
#[cfg(not(feature = "cuda-core"))]
pub fn command(_: KernelsArgs) -> Result<()> {
    anyhow::bail!("this build has no CUDA support: rebuild with `--features cuda`")
}
