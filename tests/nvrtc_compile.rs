//! Every kernel compiles with NVRTC for every GPU a vehicle carries that this NVRTC knows:
//! Ampere (sm_86), Jetson Orin (sm_87), Ada (sm_89), Hopper (sm_90), Blackwell (sm_100, sm_120);
//! the modules that store activations in all three storage builds (FP16, BF16, FP32). A GPU this
//! NVRTC does not know is refused with an error naming it, before any compile. CI runs it
//! twice: the CUDA 13 build with NVRTC 13.0, and the CUDA 12 build (`--features cuda12`) with
//! NVRTC 12.6 (JetPack 6's; `SPTR_EXPECT_NVRTC=12.6` makes sure that is the one loaded). Needs libnvrtc (the PyPI wheels on CI, see
//! scripts/cuda_env.sh), no GPU. Without NVRTC the tests skip, unless SPTR_REQUIRE_NVRTC=1
//! (README's test command sets it).
#![cfg(feature = "cuda-core")]

mod common;

use sptr::device::kernels;
use sptr::device::nvrtc::{self, Arch, KernelPaths, Origin};
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

/// The GPUs of vehicles and fleets (see docs/platforms.md), oldest first.
const VEHICLE_ARCHS: [&str; 6] = ["sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_120"];

/// Which of [`VEHICLE_ARCHS`] an NVRTC release must know: 12.6 ends at sm_90, 12.8 added the
/// Blackwell GPUs, 13.0 keeps all six.
fn must_know(version: (i32, i32), arch: Arch) -> bool {
    arch.major < 10 || version >= (12, 8)
}

#[test]
fn the_nvrtc_loaded_is_the_one_expected() {
    let Ok(want) = std::env::var("SPTR_EXPECT_NVRTC") else {
        eprintln!("SKIPPED the_nvrtc_loaded_is_the_one_expected: SPTR_EXPECT_NVRTC not set");
        return;
    };
    assert!(nvrtc_here("the_nvrtc_loaded_is_the_one_expected"), "SPTR_EXPECT_NVRTC={want} but no libnvrtc");
    let (major, minor) = nvrtc::nvrtc_version().unwrap();
    assert_eq!(format!("{major}.{minor}"), want, "LD_LIBRARY_PATH loads another NVRTC than the one this run is for");
}

/// Every kernel module, in each of its storage builds, for `arch` when this NVRTC knows it (a
/// CUBIN, no warning, the storage builds differing); else refused with a message, and this
/// NVRTC must be one that is allowed not to know it. Returns whether it compiled.
fn every_kernel_for(arch: &str) -> bool {
    let test = format!("every_kernel_compiles_for_{arch}");
    if !nvrtc_here(&test) {
        return false;
    }
    assert!(!kernels::ALL.is_empty());
    let version = nvrtc::nvrtc_version().unwrap();
    let known = nvrtc::supported_archs().unwrap();
    let arch: Arch = arch.parse().unwrap();
    if !known.contains(&arch) {
        assert!(!must_know(version, arch), "NVRTC {version:?} must know {} (it lists {known:?})", arch.sm());
        // refused with a message naming the GPU and the NVRTC, for every module
        let v = format!("NVRTC {}.{}", version.0, version.1);
        for k in kernels::ALL {
            let e = nvrtc::compile(k, arch).err().unwrap_or_else(|| panic!("{} compiled for {}, which {v} does not list", k.name, arch.sm())).to_string();
            assert!(e.contains(&v) && e.contains(&format!("cannot compile for {}", arch.sm())) && e.contains("newer than this NVRTC"), "{e}");
        }
        eprintln!("{v}: {} refused, as it should be", arch.sm());
        return false;
    }
    let mut builds = 0;
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
    assert_eq!(builds, kernels::ALL.len() + 2 * kernels::STORAGE_MODULES.len());
    eprintln!("NVRTC {}.{}: every kernel compiled for {}", version.0, version.1, arch.sm());
    true
}

// One test per GPU, so that the compiles run on every core.
#[test]
fn every_kernel_compiles_for_sm_86() {
    every_kernel_for("sm_86");
}
#[test]
fn every_kernel_compiles_for_sm_87() {
    every_kernel_for("sm_87");
}
#[test]
fn every_kernel_compiles_for_sm_89() {
    every_kernel_for("sm_89");
}
#[test]
fn every_kernel_compiles_for_sm_90() {
    every_kernel_for("sm_90");
}
#[test]
fn every_kernel_compiles_for_sm_100() {
    every_kernel_for("sm_100");
}
#[test]
fn every_kernel_compiles_for_sm_120() {
    every_kernel_for("sm_120");
}

/// Each GPU of [`VEHICLE_ARCHS`] has its test above, and any NVRTC the project supports knows at
/// least the four before Blackwell.
#[test]
fn the_vehicle_gpus_are_each_tested() {
    let src = include_str!("nvrtc_compile.rs");
    for arch in VEHICLE_ARCHS {
        assert!(src.contains(&format!("fn every_kernel_compiles_for_{arch}()")), "no compile test for {arch}");
    }
    if !nvrtc_here("the_vehicle_gpus_are_each_tested") {
        return;
    }
    let known = nvrtc::supported_archs().unwrap();
    let version = nvrtc::nvrtc_version().unwrap();
    let knows: Vec<&str> = VEHICLE_ARCHS.iter().copied().filter(|a| known.contains(&a.parse().unwrap())).collect();
    assert!(knows.len() >= 4, "NVRTC {version:?} knows only {knows:?} of the vehicle GPUs");
}

/// A GPU older than this NVRTC supports, and one newer than any, are refused naming the GPU,
/// the NVRTC and what it knows.
#[test]
fn unknown_gpus_are_refused_with_what_this_nvrtc_knows() {
    if !nvrtc_here("unknown_gpus_are_refused_with_what_this_nvrtc_knows") {
        return;
    }
    let known = nvrtc::supported_archs().unwrap();
    assert!(!known.is_empty() && known.windows(2).all(|w| (w[0].major, w[0].minor) < (w[1].major, w[1].minor)), "{known:?}");
    let k = kernels::find("scan_sort").unwrap();
    let future = Arch { major: 99, minor: 0 };
    let e = nvrtc::compile(k, future).err().expect("sm_990 is refused").to_string();
    assert!(e.contains("cannot compile for sm_990") && e.contains("newer than this NVRTC") && e.contains(&known.last().unwrap().sm()), "{e}");
    let ancient = Arch { major: 2, minor: 0 };
    let e = nvrtc::compile(k, ancient).err().expect("sm_20 is refused").to_string();
    assert!(e.contains("cannot compile for sm_20") && e.contains("no longer compiles"), "{e}");
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
/// Under `SPTR_KERNEL_PATHS=portable` 9.0 is compiled as plain sm_90, exactly like an sm_8x GPU:
/// no wgmma kernel may be built or picked then.
#[test]
fn wgmma_kernels_exist_exactly_on_sm90() {
    if !nvrtc_here("wgmma_kernels_exist_exactly_on_sm90") {
        return;
    }
    let k = kernels::find("sparse_conv").unwrap();
    let has = |cubin: &[u8], name: &str| cubin.windows(name.len()).any(|w| w == name.as_bytes());
    let native = nvrtc::kernel_paths().expect("SPTR_KERNEL_PATHS") == KernelPaths::Native;
    for (arch, want) in [("sm_90", native), ("sm_87", false), ("sm_86", false)] {
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
    assert_eq!("sm_90".parse::<Arch>().unwrap().target(), if native { "sm_90a" } else { "sm_90" });
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

/// `sptr kernels` fills the kernel cache that a GPU process reads: every module it lists is
/// compiled into `SPTR_KERNEL_CACHE` once, then found there (`cached`), at the path the device
/// itself looks up.
#[test]
fn sptr_kernels_fills_the_kernel_cache() {
    if !nvrtc_here("sptr_kernels_fills_the_kernel_cache") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sptr-kernels-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let run = || {
        let out = std::process::Command::new(common::sptr_exe())
            .current_dir(common::root())
            .env("SPTR_KERNEL_CACHE", &dir)
            .args(["kernels", "--arch", "sm_87"])
            .output()
            .expect("run sptr kernels");
        assert!(out.status.success(), "sptr kernels failed:\n{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let first = run();
    assert!(first.contains(&dir.display().to_string()), "names the cache: {first}");
    let rows: Vec<&str> = first.lines().filter(|l| l.contains("sm_87")).collect();
    assert!(rows.len() >= kernels::ALL.len(), "one row per module: {first}");
    assert!(rows.iter().all(|l| l.contains("compiled")), "an empty cache compiles everything: {first}");
    let second = run();
    let rows2: Vec<&str> = second.lines().filter(|l| l.contains("sm_87")).collect();
    assert_eq!(rows2.len(), rows.len());
    assert!(rows2.iter().all(|l| l.contains("cached")), "the second run finds every module: {second}");
    // the files have the names a process on an sm_87 GPU looks up (in its SPTR_KERNEL_CACHE)
    let v = nvrtc::nvrtc_version().unwrap();
    let sm87: Arch = "sm_87".parse().unwrap();
    for k in kernels::ALL {
        let name = nvrtc::cache_path(k, sm87, v).file_name().unwrap().to_owned();
        assert!(dir.join(&name).is_file(), "{} not cached as {name:?}", k.name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
