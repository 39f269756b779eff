//! The `sptr` binary's command line: every numeric argument of every subcommand is checked, so
//! a zero, negative, huge or NaN value is a clear error (non-zero exit, the argument named, no
//! panic), never a crash further down.

mod common;

use std::process::{Command, Output};

fn sptr(args: &[&str]) -> Output {
    Command::new(common::sptr_exe())
        .current_dir(common::root())
        .args(args)
        .output()
        .expect("run sptr")
}

fn nuscenes_bin() -> String {
    let dir = common::data("nuscenes");
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().ends_with(".pcd.bin"))
        .expect("the nuScenes sweep")
        .display()
        .to_string()
}

/// `args` fails cleanly: non-zero status, no panic, and stderr names every string of `expect`.
fn refused(args: &[&str], expect: &[&str]) {
    let out = sptr(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sptr {args:?} succeeded:\n{err}");
    assert!(out.status.code().is_some(), "sptr {args:?} died from a signal:\n{err}");
    assert!(!err.contains("panicked"), "sptr {args:?} panicked:\n{err}");
    for e in expect {
        assert!(err.contains(e), "sptr {args:?}: the error does not say `{e}`:\n{err}");
    }
}

#[test]
fn every_numeric_argument_is_checked() {
    let cloud = nuscenes_bin();
    let c = cloud.as_str();
    let huge = "18446744073709551615";
    let over = "99999999999999999999999";
    // (subcommand and its other arguments, the numeric argument, bad values)
    let cases: &[(&[&str], &str, &[&str])] = &[
        (&["voxelize", c], "--stride", &["0", "1", "2", "65", huge, over, "-1", "x", "5.5"]),
        (&["bench", "voxelize", c], "--stride", &["0", huge, "-3"]),
        (&["bench", "voxelize", c], "--iters", &["0", huge, over, "-1"]),
        (&["bench", "voxelize", c], "--voxel-size", &["0", "-0.05", "nan", "NaN", "inf", "-inf", "1e308", "1e-9", "x"]),
        (&["bench", "spconv", c], "--stride", &["0", huge]),
        (&["bench", "spconv", c], "--voxel-size", &["0", "nan", "inf", "-1"]),
        (&["bench", "spconv", c], "--iters", &["0", huge]),
        (&["bench", "attention", c], "--stride", &["0", huge]),
        (&["bench", "attention", c], "--voxel-size", &["0", "nan", "-inf"]),
        (&["bench", "attention", c], "--level", &["0", "65", huge, "-1"]),
        (&["bench", "attention", c], "--iters", &["0", huge]),
        (&["bench", "model", c], "--iters", &["0", huge, "-2"]),
        (&["bench", "model", c], "--seed", &["-1", over, "x"]),
        (&["bench", "pipeline", c], "--frames", &["0", huge, "1000001", "-5"]),
        (&["bench", "pipeline", c], "--warmup", &["10001", huge, "-1"]),
        (&["eval", "agreement", "a", "b"], "--min", &["nan", "inf", "-0.1", "1.5", "x"]),
        (&["replay", "bag", "--model", "m.yaml"], "--random-weights", &["-1", over]),
        (&["replay", "bag", "--model", "m.yaml", "--random-weights", "0"], "--ignore", &["-1", huge]),
        (&["replay", "bag", "--model", "m.yaml", "--random-weights", "0"], "--shard", &["0/0", "1/1", "3/2", "-1/2", "0/-2", "0/4294967296", "x"]),
        (&["replay", "bag", "--model", "m.yaml", "--random-weights", "0"], "--bev-png-frames", &["-1", over, "1,x"]),
    ];
    for (cmd, arg, values) in cases {
        for v in *values {
            // `--arg=value` so a leading '-' reaches the value parser
            let a = format!("{arg}={v}");
            let mut args = cmd.to_vec();
            args.push(&a);
            refused(&args, &[arg]);
        }
    }
}

/// A level the model does not have (within the parser's range) is refused from the model YAML,
/// before any GPU is needed.
#[test]
fn attention_level_beyond_the_models_levels_is_refused() {
    let cloud = nuscenes_bin();
    refused(
        &["bench", "attention", &cloud, "--level", "6", "--model", "config/models/sphereformer_semantickitti.yaml"],
        &["levels 1 to 5", "not 6"],
    );
}

/// The values the commands document still work (zero warm-up, the smallest stride).
#[test]
fn valid_numbers_still_run() {
    let cloud = nuscenes_bin();
    let out = sptr(&["voxelize", &cloud, "--stride", "5", "--device", "cpu"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("points            34688"), "{text}");
    let out = sptr(&["bench", "voxelize", &cloud, "--stride", "5", "--iters", "1", "--voxel-size", "0.1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // stride 3 reads the nuScenes file as x, y, z rows: 34,688 x 5 floats is not a multiple
    // of 3, a clear error from the library
    refused(&["voxelize", &cloud, "--stride", "3", "--device", "cpu"], &["wrong --stride?"]);
}

/// A temporary directory of this test process.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sptr-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The nuScenes model narrowed (m 16, three levels, one block) in `dir`: the same voxelization,
/// a fast network for a debug build.
fn small_nuscenes_model(dir: &std::path::Path) -> String {
    let text = std::fs::read_to_string(common::root().join("config/models/sphereformer_nuscenes.yaml")).unwrap();
    let small = text
        .replace("\nm: 32\n", "\nm: 16\n")
        .replace("block_reps: 2", "block_reps: 1")
        .replace("layers: [32, 64, 128, 256, 256]", "layers: [16, 32, 48]")
        .replace("sphere_layers: [1, 2, 3, 4, 5]", "sphere_layers: [1, 2]");
    assert_ne!(small, text, "the nuScenes model YAML changed: update this test");
    let path = dir.join("small_nuscenes.yaml");
    std::fs::write(&path, small).unwrap();
    path.display().to_string()
}

fn ok(args: &[&str]) -> String {
    let out = sptr(args);
    assert!(out.status.success(), "sptr {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `sptr random-weights` writes weights a fresh machine can try every entry point with: the same
/// model and seed give the same bytes, another seed other bytes; the file loads for its model and
/// `segment --weights FILE` labels exactly as `segment --random-weights SEED`.
#[test]
fn random_weights_are_deterministic_and_load() {
    let dir = temp_dir("random-weights");
    let model = small_nuscenes_model(&dir);
    let file = |name: &str| dir.join(name).display().to_string();
    let (a, b, c) = (file("a.safetensors"), file("b.safetensors"), file("c.safetensors"));
    let text = ok(&["random-weights", "--model", &model, "--seed", "3", "--out", &a]);
    assert!(text.contains("seed 3") && text.contains(&a), "{text}");
    ok(&["random-weights", "--model", &model, "--seed", "3", "--out", &b]);
    ok(&["random-weights", "--model", &model, "--seed", "4", "--out", &c]);
    let read = |p: &str| std::fs::read(p).unwrap();
    assert_eq!(read(&a), read(&b), "same model and seed, different bytes");
    assert_ne!(read(&a), read(&c), "another seed, the same bytes");
    // the file fits its model (every tensor present, none unexpected or mis-shaped)
    let cfg = sptr::config::ModelConfig::load(std::path::Path::new(&model)).unwrap().yaml;
    let w = sptr::model::Weights::from_file(std::path::Path::new(&a)).expect("the written file loads");
    sptr::pipeline::Segmenter::new(cfg, w).expect("the weights fit the model YAML");
    // and not another model (the full nuScenes model): a clear error listing the tensors
    let out = sptr(&["segment", &nuscenes_bin(), "--model", "config/models/sphereformer_nuscenes.yaml", "--weights", &a, "--device", "cpu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("panicked") && err.contains("mis-shaped"), "{err}");

    let cloud = nuscenes_bin();
    let (la, lb) = (file("a.label"), file("b.label"));
    let text = ok(&["segment", &cloud, "--model", &model, "--weights", &a, "--device", "cpu", "--out", &la]);
    assert!(text.contains("34688 points, 17856 voxels"), "{text}");
    ok(&["segment", &cloud, "--model", &model, "--random-weights", "3", "--device", "cpu", "--out", &lb]);
    assert_eq!(read(&la), read(&lb), "--weights FILE and --random-weights SEED label differently");
    assert_eq!(read(&la).len(), 34688 * 4);
    // one of the two is needed, not both
    refused(&["segment", &cloud, "--model", &model], &["--weights"]);
    refused(&["segment", &cloud, "--model", &model, "--weights", &a, "--random-weights", "3"], &["--random-weights"]);
    refused(&["random-weights", "--model", &model, "--out", &dir.join("no/such/dir/w.safetensors").display().to_string()], &["no/such/dir"]);
    let _ = std::fs::remove_dir_all(&dir);
}
