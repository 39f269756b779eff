//! Build script. Each part is a function called from `main`, and does nothing unless its feature
//! is on.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    cuda_major();
    ros_link_args();
}

/// The CUDA major the build binds (`cuda`: 13, `cuda12`: 12), exported to the code as
/// `SPTR_CUDA_MAJOR`. The two features select different cudarc API tables, which cannot live in
/// one build: asking for both, or for the shared `cuda-core` alone, stops here with what to do.
fn cuda_major() {
    let on = |f: &str| env::var_os(format!("CARGO_FEATURE_{f}")).is_some();
    let major = match (on("CUDA"), on("CUDA12"), on("CUDA_CORE")) {
        (true, true, _) => panic!(
            "features `cuda` (CUDA 13) and `cuda12` (CUDA 12.6) exclude each other: build with one of them \
             (e.g. `--features cuda12` alone, or `--features ros,cuda12` for the node)"
        ),
        (true, false, _) => "13",
        (false, true, _) => "12",
        (false, false, true) => panic!(
            "feature `cuda-core` is the part both CUDA majors share: build with `--features cuda` (CUDA 13) \
             or `--features cuda12` (CUDA 12.6) instead"
        ),
        (false, false, false) => return,
    };
    println!("cargo:rustc-env=SPTR_CUDA_MAJOR={major}");
}

/// Feature `ros` built against a ROS 2 venv made from PyPI wheels (`scripts/ros_env.sh` exports
/// `SPTR_ROS_VENV`): link args so that binaries, tests and examples find the ROS libraries at
/// run time without `LD_LIBRARY_PATH` / `LD_PRELOAD`.
///
/// - DT_RPATH rather than DT_RUNPATH (`--disable-new-dtags`): RUNPATH does not serve the
///   dependencies of dependencies, and `librcl` pulls in the rest.
/// - rpath entries: `$V/lib`, each `$V/lib/pythonX.Y/site-packages/*.libs` (the wheels' vendored
///   libraries, e.g. `ros_rcl.libs`) and libpython's directory.
/// - libpython linked as NEEDED (`--no-as-needed`): the `lib*__rosidl_generator_py.so` that
///   `librcl` loads use Python symbols without linking libpython themselves.
///
/// With a system ROS 2 (`/opt/ros/<distro>` sourced, no `SPTR_ROS_VENV`) nothing is emitted.
fn ros_link_args() {
    if env::var_os("CARGO_FEATURE_ROS").is_none() {
        return;
    }
    println!("cargo:rerun-if-env-changed=SPTR_ROS_VENV");
    let Some(venv) = env::var_os("SPTR_ROS_VENV").filter(|v| !v.is_empty()) else {
        return;
    };
    let venv = PathBuf::from(venv);
    let fail = |what: String| -> ! {
        panic!(
            "feature `ros` with SPTR_ROS_VENV={}: {what}",
            venv.display()
        )
    };
    let python = venv.join("bin").join("python");
    if !python.exists() {
        fail(format!(
            "{} not found; run scripts/ros_env.sh (or unset SPTR_ROS_VENV for a system ROS 2)",
            python.display()
        ));
    }
    let lib = venv.join("lib");
    // scripts/ros_env.sh rewrites its stamp after each (re)install, which can add a *.libs dir.
    // (Not the directories themselves: cargo would scan all of site-packages on every build.)
    for f in [venv.join(".sptr-ros-env.stamp"), venv.join("pyvenv.cfg")] {
        if f.exists() {
            println!("cargo:rerun-if-changed={}", f.display());
        }
    }

    // One query of the venv's Python: its X.Y, and libpython's directory and file name.
    let out = Command::new(&python)
        .args([
            "-c",
            "import sys, sysconfig as s; print('%d.%d' % sys.version_info[:2]); \
             print(s.get_config_var('LIBDIR')); print(s.get_config_var('LDLIBRARY'))",
        ])
        .output()
        .unwrap_or_else(|e| fail(format!("cannot run {}: {e}", python.display())));
    if !out.status.success() {
        fail(format!(
            "{} failed: {}",
            python.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines().map(str::trim);
    let (Some(py_ver), Some(py_libdir), Some(py_ldlib)) =
        (lines.next(), lines.next(), lines.next())
    else {
        fail(format!(
            "unexpected answer from {}: {text:?}",
            python.display()
        ));
    };
    let libpython = Path::new(py_libdir).join(py_ldlib);
    if !py_ldlib.contains(".so") || !libpython.exists() {
        fail(format!(
            "libpython {} is not a shared library that exists; the ROS wheels' \
             *__rosidl_generator_py libraries need a Python built with --enable-shared",
            libpython.display()
        ));
    }

    let mut rpath = vec![lib.clone()];
    let site = lib.join(format!("python{py_ver}")).join("site-packages");
    let mut vendored: Vec<PathBuf> = std::fs::read_dir(&site)
        .unwrap_or_else(|e| fail(format!("cannot list {}: {e}", site.display())))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.extension().is_some_and(|x| x == "libs"))
        .collect();
    vendored.sort();
    rpath.extend(vendored);
    rpath.push(PathBuf::from(py_libdir));

    println!("cargo:rustc-link-arg=-Wl,--disable-new-dtags");
    for dir in &rpath {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
    }
    println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-link-arg={}", libpython.display());
    println!("cargo:rustc-link-arg=-Wl,--as-needed");
}
