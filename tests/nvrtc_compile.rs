//! Every kernel compiles with NVRTC for Hopper (sm_90), Jetson Orin (sm_87) and Ampere (sm_86),
//! the modules that store activations in all three storage builds (FP16, BF16, FP32).
//! Needs libnvrtc (the PyPI wheel on CI, see scripts/cuda_env.sh), no GPU. Without NVRTC the
//! tests skip, unless SPTR_REQUIRE_NVRTC=1 (README's test command sets it).
#![cfg(feature = "cuda")]

use sptr::device::kernels;
use sptr::device::nvrtc::{self, Arch, Origin};
use sptr::device::storage::Storage;

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
    let mut builds = 0;
    for arch in ["sm_90", "sm_87", "sm_86"] {
        let arch: Arch = arch.parse().unwrap();
        for k in kernels::ALL {
            let mut cubins = Vec::new();
            for storage in Storage::ALL {
                if storage != Storage::Fp16 && !kernels::has_storage_twin(k.name) {
                    continue;
                }
                let c = nvrtc::compile_storage(k, arch, storage).unwrap_or_else(|e| panic!("{} ({storage}) for {}: {e}", k.name, arch.sm()));
                // A CUBIN is an ELF file.
                assert_eq!(&c.cubin[..4], b"\x7fELF", "{} ({storage}) for {}: not an ELF cubin", k.name, arch.sm());
                assert!(!c.log.contains("warning"), "{} ({storage}) for {}: compiler warnings:\n{}", k.name, arch.sm(), c.log);
                cubins.push(c.cubin);
                builds += 1;
            }
            if cubins.len() == 3 {
                assert_ne!(cubins[0], cubins[1], "{} for {}: the BF16 build must differ from the FP16 one", k.name, arch.sm());
                assert_ne!(cubins[0], cubins[2], "{} for {}: the FP32 build must differ from the FP16 one", k.name, arch.sm());
            }
        }
    }
    assert_eq!(builds, 3 * (kernels::ALL.len() + 2 * kernels::STORAGE_MODULES.len()));
}

/// The storage twins: every listed module exists, FP16-only modules refuse a BF16 build with an
/// error naming them, and the BF16 build has its own cache file (the FP16 one keeps its key).
#[test]
fn storage_twins_are_listed_refused_elsewhere_and_cached_apart() {
    for m in kernels::STORAGE_MODULES {
        assert!(kernels::find(m).is_some(), "STORAGE_MODULES names {m}, which is not a kernel module");
        assert!(kernels::full_source(kernels::find(m).unwrap()).contains("typedef __nv_bfloat16 store_t;"));
    }
    for m in ["sparse_conv", "attention_core", "layers"] {
        assert!(kernels::has_storage_twin(m), "SphereFormer's {m} needs a BF16 build");
    }
    let scan = kernels::find("scan_sort").unwrap();
    assert!(!kernels::full_source(scan).contains("store_t"), "modules without a twin get no storage header");
    if !nvrtc_here("storage_twins_are_listed_refused_elsewhere_and_cached_apart") {
        return;
    }
    let sm90: Arch = "sm_90".parse().unwrap();
    let e = nvrtc::compile_storage(scan, sm90, Storage::Bf16).err().expect("scan_sort has no BF16 build").to_string();
    assert!(e.contains("scan_sort") && e.contains("bf16") && e.contains("sparse_conv"), "{e}");
    let k = kernels::find("layers").unwrap();
    let v = nvrtc::nvrtc_version().unwrap();
    assert_eq!(nvrtc::cache_path(k, sm90, v), nvrtc::cache_path_storage(k, sm90, v, Storage::Fp16));
    assert_ne!(nvrtc::cache_path(k, sm90, v), nvrtc::cache_path_storage(k, sm90, v, Storage::Bf16));
    assert!(nvrtc::cache_path_storage(k, sm90, v, Storage::Bf16).to_string_lossy().contains("layers-bf16-sm_90-"));
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
        for storage in Storage::ALL {
            let c = nvrtc::compile_storage(k, arch, storage).unwrap();
            // FP32 storage has no tensor-core kernels at all (storage.cuh: STORE_TENSOR_CORES)
            let tc = storage.tensor_cores();
            for name in ["conv_wgmma_m128_n64", "conv_wgmma_m128_n128"] {
                assert_eq!(has(&c.cubin, name), want && tc, "{name} in sparse_conv ({storage}) for {}", arch.target());
            }
            assert_eq!(has(&c.cubin, "conv_tiled_m128_n128_k64"), tc, "the tiled kernels are built everywhere but in FP32 ({storage})");
            assert!(has(&c.cubin, "conv_direct"), "the direct kernel is built everywhere ({storage})");
        }
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
