//! The CUDA libraries found at start, checked against the CUDA major this build binds
//! (`--features cuda`: 13, `--features cuda12`: 12.6), on a machine without CUDA.
//!
//! Each test makes stand-in libraries with the C compiler (`cc`): a `libcuda.so` whose
//! `cuDriverGetVersion` reports an older CUDA, an NVRTC of a major sptr does not call, a cuBLAS
//! of the other major. The `sptr` binary runs with `LD_LIBRARY_PATH` pointing at them (or at
//! nothing) and must name what it found, where, and what this build needs: in `sptr info`, and
//! as the error of a command asked for the GPU (exit status 1, no panic, nothing computed).
#![cfg(feature = "cuda-core")]

mod common;

use sptr::device::libraries::{BUILD_API, BUILD_MAJOR};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fresh directory for one test's stand-in libraries.
fn lib_dir(test: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cuda_libraries_{test}_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create the library directory");
    d
}

/// Compiles the C `source` into the shared library `dir/names[0]`, with the other names as links
/// to it (the names the loader tries first, so that a system library of the same kind is never
/// reached).
fn stand_in(dir: &Path, names: &[&str], source: &str) {
    let path = dir.join(names[0]);
    let src = dir.join(format!("{}.c", names[0]));
    std::fs::write(&src, source).expect("write the C source");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&path)
        .arg(&src)
        .output()
        .expect("run cc (the C compiler makes the stand-in CUDA libraries)");
    assert!(out.status.success(), "cc failed: {}", String::from_utf8_lossy(&out.stderr));
    for n in &names[1..] {
        std::os::unix::fs::symlink(names[0], dir.join(n)).expect("link a library name");
    }
}

/// A driver reporting CUDA `major.minor`.
fn driver(dir: &Path, major: u32, minor: u32) {
    let v = major * 1000 + minor * 10;
    stand_in(dir, &["libcuda.so", "libcuda.so.1"], &format!("int cuDriverGetVersion(int *v) {{ *v = {v}; return 0; }}\n"));
}

/// `sptr ARGS` with only `dir` on the library path.
fn sptr_with_libs(dir: &Path, args: &[&str]) -> Output {
    Command::new(common::sptr_exe())
        .args(args)
        .current_dir(common::root())
        .env("LD_LIBRARY_PATH", dir)
        .env("SPTR_KERNEL_CACHE", dir.join("kernels"))
        .output()
        .expect("run sptr")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `sptr segment` on the GPU: the command must refuse at start with `expect` in its error.
fn segment_on_gpu_refuses(dir: &Path, expect: &[&str]) {
    let cloud = common::nuscenes_sweep_arg();
    let o = sptr_with_libs(dir, &["segment", &cloud, "--model", "config/models/sphereformer_nuscenes.yaml", "--random-weights", "0", "--device", "cuda"]);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "exit status; output:\n{t}");
    assert!(!t.contains("panicked"), "a panic instead of an error:\n{t}");
    for e in expect {
        assert!(t.contains(e), "expected {e:?} in:\n{t}");
    }
}

#[test]
fn a_driver_older_than_the_build_is_refused_at_start_naming_its_version_and_file() {
    let dir = lib_dir("old_driver");
    driver(&dir, BUILD_MAJOR - 1, 2);
    let file = dir.join("libcuda.so");
    let old = format!("{}.2", BUILD_MAJOR - 1);

    let info = text(&sptr_with_libs(&dir, &["info"]));
    let line = format!("driver    {old} {}", file.display());
    assert!(info.contains(&line), "expected {line:?} in sptr info:\n{info}");
    assert!(info.contains(&format!("DOES NOT FIT: the driver supports CUDA up to {old}; this build (CUDA {BUILD_API} API) needs CUDA {BUILD_MAJOR}.0 or newer")), "{info}");
    assert!(info.contains(&format!("features: cuda=CUDA {BUILD_MAJOR} (API {BUILD_API})")), "{info}");

    segment_on_gpu_refuses(
        &dir,
        &[
            &format!("this build binds CUDA {BUILD_API}"),
            &format!("driver {old} at {} does not fit", file.display()),
            &format!("install an NVIDIA driver for CUDA {BUILD_MAJOR} or newer"),
        ],
    );
}

#[test]
fn an_nvrtc_of_a_major_sptr_does_not_call_is_refused_naming_it() {
    let dir = lib_dir("old_nvrtc");
    driver(&dir, BUILD_MAJOR, 0);
    stand_in(&dir, &["libnvrtc.so", &format!("libnvrtc.so.{BUILD_MAJOR}")], "int nvrtcVersion(int *a, int *b) { *a = 11; *b = 8; return 0; }\n");
    let file = dir.join("libnvrtc.so");

    let info = text(&sptr_with_libs(&dir, &["info"]));
    assert!(info.contains(&format!("driver    {BUILD_MAJOR}.0 {} (fits)", dir.join("libcuda.so").display())), "{info}");
    assert!(info.contains(&format!("NVRTC     11.8 {} (DOES NOT FIT: NVRTC 11.8; sptr calls the NVRTC API of CUDA 12 and 13)", file.display())), "{info}");

    segment_on_gpu_refuses(&dir, &[&format!("NVRTC 11.8 at {} does not fit", file.display()), "first on LD_LIBRARY_PATH"]);
}

#[test]
fn a_cublas_of_the_other_major_is_shown_as_not_fitting() {
    let dir = lib_dir("other_cublas");
    let other = if BUILD_MAJOR == 13 { 12 } else { 13 };
    stand_in(
        &dir,
        &["libcublas.so", &format!("libcublas.so.{BUILD_MAJOR}")],
        &format!("int cublasGetProperty(int t, int *v) {{ *v = t == 0 ? {other} : t == 1 ? 9 : 1; return 0; }}\n"),
    );
    let info = text(&sptr_with_libs(&dir, &["info"]));
    let line = format!(
        "cuBLAS    {other}.9.1 {} (DOES NOT FIT: it belongs to CUDA {other}; this build binds CUDA {BUILD_API})",
        dir.join("libcublas.so").display()
    );
    assert!(info.contains(&line), "expected {line:?} in sptr info:\n{info}");
}

#[test]
fn no_cuda_library_at_all_is_an_error_naming_what_was_tried_not_a_panic() {
    let dir = lib_dir("none");
    let info = sptr_with_libs(&dir, &["info"]);
    let t = text(&info);
    assert!(info.status.success(), "sptr info must succeed without CUDA:\n{t}");
    if t.contains("driver    ") {
        // A machine with an NVIDIA driver installed (the GPU host): the system's driver is found
        // whatever the library path says; the stand-in tests above cover the refusals there.
        eprintln!("SKIPPED the no-driver case: this machine has a CUDA driver:\n{t}");
        return;
    }
    assert!(t.contains("driver    not found (tried libcuda.so, "), "{t}");
    segment_on_gpu_refuses(&dir, &["driver (needed for every GPU path): not found (tried libcuda.so", "install an NVIDIA driver"]);
}
