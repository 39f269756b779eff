//! sptr: LiDAR/camera perception on sparse tensors, CPU reference and CUDA FP16 backends.
//!
//! The modules are layers, lowest first (ARCHITECTURE.md; `scripts/check_layers.py` checks that
//! imports only point down): `error`, `device` (backends, NVRTC, storage types), `msgs` (ROS
//! messages without ROS, the PointCloud2 codec), `sensors` (images, calibration, cloud files),
//! `nn` (weights), `ops` (one folder per op family), `models` (SphereFormer, BEVFusion), `frame`
//! (the frame processor the node, replay and the benches share), then the shells: `eval` and
//! `bag`, `replay`, `bench`, `ros` (feature `ros`), `cli`.

pub mod bag;
pub mod bench;
pub mod cli;
pub mod device;
pub mod error;
pub mod eval;
pub mod frame;
pub mod models;
pub mod msgs;
pub mod nn;
pub mod ops;
pub mod replay;
#[cfg(feature = "ros")]
pub mod ros;
pub mod sensors;

pub use error::{Error, Result};
pub use crate::msgs::points::Points;

/// The source tree's root, where the files that ship beside the binaries rather than inside them
/// are found (test data, model and node configs): `$SPTR_ROOT` when set and not empty; else the
/// first directory above the running executable that holds `Cargo.toml` and `tests/data` or
/// `tests/fixtures` (binaries staged inside an unpacked tree, e.g. `gpu-stage/bin/` on a GPU
/// host, or cargo's `target/` inside the clone); else the crate directory at build time.
pub fn repo_root() -> std::path::PathBuf {
    let exe = std::env::current_exe().ok();
    repo_root_from(std::env::var_os("SPTR_ROOT"), exe.as_deref(), std::path::Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// [`repo_root`]'s rule on given inputs: `sptr_root` (the variable's value), the executable's
/// path and the build-time crate directory.
fn repo_root_from(
    sptr_root: Option<std::ffi::OsString>,
    exe: Option<&std::path::Path>,
    built: &std::path::Path,
) -> std::path::PathBuf {
    if let Some(root) = sptr_root.filter(|r| !r.is_empty()) {
        return root.into();
    }
    let is_root = |d: &std::path::Path| {
        d.join("Cargo.toml").is_file() && (d.join("tests/data").is_dir() || d.join("tests/fixtures").is_dir())
    };
    exe.and_then(|e| e.ancestors().skip(1).find(|d| is_root(d)))
        .unwrap_or(built)
        .to_path_buf()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// A tree as unpacked on a GPU host under `base`: `tree/` with `Cargo.toml`, `tests/data` and
    /// `gpu-stage/bin/`, its `fuzz/` with a `Cargo.toml` of its own but no test data; `fixtures/`
    /// with `Cargo.toml` and only `tests/fixtures`; `elsewhere/bin/` in no tree.
    fn layout(base: &Path) {
        let _ = std::fs::remove_dir_all(base);
        for d in ["tree/tests/data", "tree/gpu-stage/bin", "tree/fuzz/bin", "fixtures/tests/fixtures", "fixtures/bin", "elsewhere/bin"] {
            std::fs::create_dir_all(base.join(d)).unwrap();
        }
        for f in ["tree/Cargo.toml", "tree/fuzz/Cargo.toml", "fixtures/Cargo.toml"] {
            std::fs::write(base.join(f), "").unwrap();
        }
    }

    #[test]
    fn repo_root_takes_sptr_root_then_the_tree_above_the_executable_then_the_build_dir() {
        let base = std::env::temp_dir().join(format!("sptr-repo-root-{}", std::process::id()));
        layout(&base);
        let tree = base.join("tree");
        let staged = tree.join("gpu-stage/bin/test-x");
        let built = Path::new("/built/here");
        // SPTR_ROOT set: it, whatever else
        assert_eq!(repo_root_from(Some("/from/env".into()), Some(&staged), built), PathBuf::from("/from/env"));
        assert_eq!(repo_root_from(Some("/from/env".into()), None, built), PathBuf::from("/from/env"));
        // unset, or set but empty: the tree the executable is in
        assert_eq!(repo_root_from(None, Some(&staged), built), tree);
        assert_eq!(repo_root_from(Some("".into()), Some(&staged), built), tree);
        // a Cargo.toml without test data (fuzz/) is not the root; tests/fixtures alone marks one
        assert_eq!(repo_root_from(None, Some(&tree.join("fuzz/bin/x")), built), tree);
        assert_eq!(repo_root_from(None, Some(&base.join("fixtures/bin/x")), built), base.join("fixtures"));
        // an executable in no tree, or none known: the crate directory at build time
        assert_eq!(repo_root_from(None, Some(&base.join("elsewhere/bin/x")), built), built);
        assert_eq!(repo_root_from(None, None, built), built);
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// The real function in a real executable: this test binary, linked into a tree the way
    /// `scripts/gpu_suite.sh` stages it, finds that tree with `SPTR_ROOT` unset and takes
    /// `SPTR_ROOT` when set; where cargo put it, it finds a tree with the test data. (Beside the
    /// binary, not in the temp dir: the copy must be executable there.)
    #[test]
    fn a_staged_test_binary_finds_its_tree() {
        let me = std::env::current_exe().unwrap();
        let base = me.parent().unwrap().join(format!("sptr-repo-root-{}", std::process::id()));
        layout(&base);
        let staged = base.join("tree/gpu-stage/bin/test-sptr-lib");
        if std::fs::hard_link(&me, &staged).is_err() {
            std::fs::copy(&me, &staged).unwrap();
        }
        let out = base.join("probe.txt");
        let probe = |exe: &Path, sptr_root: Option<&str>| -> PathBuf {
            let _ = std::fs::remove_file(&out);
            let mut cmd = std::process::Command::new(exe);
            cmd.args(["--exact", "tests::repo_root_probe", "--test-threads=1"]).env("SPTR_ROOT_PROBE_OUT", &out);
            match sptr_root {
                Some(r) => cmd.env("SPTR_ROOT", r),
                None => cmd.env_remove("SPTR_ROOT"),
            };
            let o = cmd.output().unwrap();
            assert!(o.status.success(), "{}: {}", exe.display(), String::from_utf8_lossy(&o.stdout));
            PathBuf::from(std::fs::read_to_string(&out).unwrap())
        };
        assert_eq!(probe(&staged, None), base.join("tree"));
        assert_eq!(probe(&staged, Some("/from/env")), PathBuf::from("/from/env"));
        let here = probe(&me, None);
        assert!(here.join("Cargo.toml").is_file() && here.join("tests/data").is_dir(), "{}", here.display());
        std::fs::remove_dir_all(&base).unwrap();
    }

    /// Files are found through [`repo_root`] alone: no other source of the library or the tests
    /// reads the build-time crate directory (a path of the build machine, not where staged test
    /// binaries run).
    #[test]
    fn only_repo_root_reads_the_build_time_crate_dir() {
        let root = repo_root();
        let mut found = Vec::new();
        let mut dirs = vec![root.join("src"), root.join("tests")];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "rs") && p != root.join("src/lib.rs") {
                    if std::fs::read_to_string(&p).unwrap().contains("CARGO_MANIFEST_DIR") {
                        found.push(p);
                    }
                }
            }
        }
        assert!(found.is_empty(), "find files with sptr::repo_root (tests: common::root()): {found:?}");
    }

    /// Writes [`repo_root`] to `$SPTR_ROOT_PROBE_OUT` when that is set (the child process of the
    /// test above); nothing otherwise.
    #[test]
    fn repo_root_probe() {
        if let Some(out) = std::env::var_os("SPTR_ROOT_PROBE_OUT") {
            std::fs::write(out, repo_root().to_string_lossy().as_bytes()).unwrap();
        }
    }
}
