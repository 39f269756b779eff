//! Every kernel compiles with NVRTC for Hopper (sm_90), Jetson Orin (sm_87) and Ampere (sm_86).
//! Needs libnvrtc (the PyPI wheel on CI, see scripts/cuda_env.sh), no GPU. Without NVRTC the
//! tests skip, unless SPTR_REQUIRE_NVRTC=1 (README's test command sets it).
#![cfg(feature = "cuda")]

use sptr::device::kernels;
use sptr::device::nvrtc::{self, Arch, Origin};

fn nvrtc_here(test: &str) -> bool {
    if nvrtc::nvrtc_available() {
        return true;
    }
    if std::env::var("SPTR_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!("{test}: SPTR_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded; source scripts/cuda_env.sh");
    }
    eprintln!("SKIPPED {test}: no libnvrtc");
    false
}

#[test]
fn every_kernel_compiles_for_sm90_sm87_sm86() {
    if !nvrtc_here("every_kernel_compiles_for_sm90_sm87_sm86") {
        return;
    }
    assert!(!kernels::ALL.is_empty());
    for arch in ["sm_90", "sm_87", "sm_86"] {
        let arch: Arch = arch.parse().unwrap();
        for k in kernels::ALL {
            let c = nvrtc::compile(k, arch).unwrap_or_else(|e| panic!("{} for {}: {e}", k.name, arch.sm()));
            // A CUBIN is an ELF file.
            assert_eq!(&c.cubin[..4], b"\x7fELF", "{} for {}: not an ELF cubin", k.name, arch.sm());
            assert!(!c.log.contains("warning"), "{} for {}: compiler warnings:\n{}", k.name, arch.sm(), c.log);
        }
    }
}

/// The Hopper warpgroup-MMA conv kernels are built for 9.0 (compiled as sm_90a) and only there:
/// the host picks them by `Arch::has_wgmma`, so a module without them elsewhere is correct.
#[test]
fn wgmma_kernels_exist_exactly_on_sm90() {
    if !nvrtc_here("wgmma_kernels_exist_exactly_on_sm90") {
        return;
    }
    let k = kernels::find("sparse_conv").unwrap();
    let has = |cubin: &[u8], name: &str| cubin.windows(name.len()).any(|w| w == name.as_bytes());
    for (arch, want) in [("sm_90", true), ("sm_87", false), ("sm_86", false)] {
        let arch: Arch = arch.parse().unwrap();
        assert_eq!(arch.has_wgmma(), want, "{}", arch.sm());
        let c = nvrtc::compile(k, arch).unwrap();
        for name in ["conv_wgmma_m128_n64", "conv_wgmma_m128_n128"] {
            assert_eq!(has(&c.cubin, name), want, "{name} in sparse_conv for {}", arch.target());
        }
        assert!(has(&c.cubin, "conv_tiled_m128_n128_k64"), "the tiled kernels are built everywhere");
    }
    assert_eq!("sm_90".parse::<Arch>().unwrap().target(), "sm_90a");
    assert_eq!("8.7".parse::<Arch>().unwrap().target(), "sm_87");
}

#[test]
fn broken_kernel_reports_the_compiler_log() {
    if !nvrtc_here("broken_kernel_reports_the_compiler_log") {
        return;
    }
    let bad = kernels::KernelSource { name: "broken", src: "extern \"C\" __global__ void f() { undefined_symbol(); }", fmad: false };
    let e = nvrtc::compile(&bad, "sm_90".parse().unwrap()).err().expect("must fail");
    let msg = e.to_string();
    assert!(msg.contains("broken.cu") && msg.contains("undefined_symbol"), "{msg}");
}

#[test]
fn disk_cache_is_keyed_and_reused() {
    if !nvrtc_here("disk_cache_is_keyed_and_reused") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sptr-kcache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // This is the only test in this binary that reads SPTR_KERNEL_CACHE.
    std::env::set_var("SPTR_KERNEL_CACHE", &dir);
    let k = kernels::find("scan_sort").unwrap();
    let sm90: Arch = "sm_90".parse().unwrap();
    let sm87: Arch = "8.7".parse().unwrap();
    let (a, o1) = nvrtc::cubin_cached(k, sm90).unwrap();
    let (b, o2) = nvrtc::cubin_cached(k, sm90).unwrap();
    assert_eq!((o1, o2), (Origin::Compiled, Origin::Cache));
    assert_eq!(a, b);
    let (_, o3) = nvrtc::cubin_cached(k, sm87).unwrap();
    assert_eq!(o3, Origin::Compiled, "another arch must not reuse the sm_90 binary");
    let v = nvrtc::nvrtc_version().unwrap();
    assert_ne!(nvrtc::cache_path(k, sm90, v), nvrtc::cache_path(k, sm87, v));
    assert_ne!(nvrtc::cache_path(k, sm90, v), nvrtc::cache_path(k, sm90, (v.0, v.1 + 1)), "NVRTC version is in the key");
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, 2);
    std::env::remove_var("SPTR_KERNEL_CACHE");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn arch_parsing() {
    assert_eq!("sm_90".parse::<Arch>().unwrap(), Arch { major: 9, minor: 0 });
    assert_eq!("87".parse::<Arch>().unwrap(), Arch { major: 8, minor: 7 });
    assert_eq!("8.6".parse::<Arch>().unwrap(), Arch { major: 8, minor: 6 });
    assert!("sm_x".parse::<Arch>().is_err());
    assert!("".parse::<Arch>().is_err());
}
