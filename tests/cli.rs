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
    let cloud = common::nuscenes_sweep_arg();
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
        (&["bench", "camera"], "--iters", &["0", huge, "-1"]),
        (&["bench", "camera"], "--batch", &["0", "65", huge]),
        (&["bench", "camera"], "--height", &["0", "8193", "-1"]),
        (&["bench", "camera"], "--width", &["0", huge, "x"]),
        (&["bench", "camera"], "--warmup", &["10001", "-1"]),
        (&["bench", "camera"], "--seed", &["-1", over]),
        (&["camera-features", "--input", "x.npy", "--out", "o"], "--random-weights", &["-1", over, "x"]),
        (&["bevseg", "--model", "m.yaml", "--calib", "c.json", "--images", "CAM_FRONT=f.jpg", "--out", "o"], "--image-size", &["0x900", "1600x0", "16385x900", "-1x900", "1600", "x", "1600x900x3", huge]),
        (&["bench", "pipeline", c], "--frames", &["0", huge, "1000001", "-5"]),
        (&["bench", "pipeline", c], "--warmup", &["10001", huge, "-1"]),
        (&["eval", "agreement", "a", "b"], "--min", &["nan", "inf", "-0.1", "1.5", "x"]),
        (&["bench", "camera-input", "a.jpg"], "--iters", &["0", huge, "-1"]),
        (&["bench", "camera-input", "a.jpg"], "--warmup", &["10001", huge, "-1"]),
        (&["bench", "bevpool"], "--iters", &["0", huge, "-1"]),
        (&["bench", "host"], "--duration-s", &["0", "-1", "nan", "inf", "86401", "x"]),
        (&["bench", "bevpool"], "--dram-gbps", &["0", "-1", "nan", "inf", "1e300", "x"]),
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
    let cloud = common::nuscenes_sweep_arg();
    refused(
        &["bench", "attention", &cloud, "--level", "6", "--model", "config/models/sphereformer_semantickitti.yaml"],
        &["levels 1 to 5", "not 6"],
    );
}

/// `sptr bench host` probes alone for the time asked and reports its runs as JSON.
#[test]
fn bench_host_reports_the_probe_alone() {
    let out = sptr(&["bench", "host", "--duration-s", "0.3"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let j: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(j["bench"], "host", "{text}");
    assert_eq!(j["duration_s"].as_f64(), Some(0.3), "{text}");
    assert!(j["steal_ms"].as_f64().is_some(), "{text}");
    // a probe thread gets runs in within 0.3 s unless the machine starves it: then `runs` is 0
    // and the other fields are absent, which the JSON says rather than inventing a median
    let runs = j["probe"]["runs"].as_u64().unwrap_or_else(|| panic!("probe.runs: {text}"));
    if runs > 0 {
        assert!(j["probe"]["probe_median_ms"].as_f64().is_some_and(|m| m > 0.0), "{text}");
        assert_eq!(j["probe"]["episodes"].as_u64(), j["probe"]["episode_list"].as_array().map(|l| l.len() as u64), "{text}");
    }
}

/// The values the commands document still work (zero warm-up, the smallest stride).
#[test]
fn valid_numbers_still_run() {
    let cloud = common::nuscenes_sweep_arg();
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

/// `--device` is one word for every command: `gpu` is `cuda`, an unknown word is refused with the
/// library's one message (status 2), and `auto` without a GPU runs on the CPU while `cuda` is
/// an error saying how to run on the CPU.
#[test]
fn device_argument_is_the_same_everywhere() {
    let cloud = common::nuscenes_sweep_arg();
    let c = cloud.as_str();
    let unknown = "tpu".parse::<sptr::device::DeviceChoice>().unwrap_err().to_string();
    let commands: &[&[&str]] = &[
        &["voxelize", c],
        &["segment", c, "--model", "m.yaml", "--random-weights", "0"],
        &["bench", "model", c],
        &["bench", "pipeline", c],
        &["replay", "bag", "--model", "m.yaml", "--random-weights", "0"],
        &["bevseg", "--model", "m.yaml", "--calib", "c.json", "--images", "CAM_FRONT=f.jpg", "--out", "o"],
        &["camera-features", "--input", "x.npy", "--out", "o"],
    ];
    for cmd in commands {
        let mut args = cmd.to_vec();
        args.push("--device=tpu");
        let out = sptr(&args);
        assert_eq!(out.status.code(), Some(2), "sptr {args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--device") && err.contains(&unknown), "sptr {args:?}:\n{err}");
    }
    if sptr::device::cuda_unavailable().is_none() {
        eprintln!("SKIPPED the no-GPU half of device_argument_is_the_same_everywhere: a GPU can be used here");
        return;
    }
    let text = ok(&["voxelize", c, "--device", "auto"]);
    assert!(text.contains("device            cpu"), "{text}");
    for word in ["cuda", "gpu"] {
        refused(&["voxelize", c, "--device", word], &["--device cuda", "--device cpu", "--device auto"]);
    }
}

/// A temporary directory of this test process.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("sptr-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
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
    let model = common::small_nuscenes_model(&dir);
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
    let cfg = sptr::models::sphereformer::config::ModelConfig::load(std::path::Path::new(&model)).unwrap().yaml;
    let w = sptr::nn::Weights::from_file(std::path::Path::new(&a)).expect("the written file loads");
    sptr::models::sphereformer::segmenter::Segmenter::new(cfg, w).expect("the weights fit the model YAML");
    // and not another model (the full nuScenes model): a clear error listing the tensors
    let out = sptr(&["segment", &common::nuscenes_sweep_arg(), "--model", "config/models/sphereformer_nuscenes.yaml", "--weights", &a, "--device", "cpu"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && !err.contains("panicked") && err.contains("mis-shaped"), "{err}");

    let cloud = common::nuscenes_sweep_arg();
    let (la, lb) = (file("a.label"), file("b.label"));
    let text = ok(&["segment", &cloud, "--model", &model, "--weights", &a, "--device", "cpu", "--out", &la]);
    assert!(text.contains("34688 points, ") && text.contains(" voxels ("), "{text}");
    ok(&["segment", &cloud, "--model", &model, "--random-weights", "3", "--device", "cpu", "--out", &lb]);
    assert_eq!(read(&la), read(&lb), "--weights FILE and --random-weights SEED label differently");
    assert_eq!(read(&la).len(), 34688 * 4);
    // one of the two is needed, not both
    refused(&["segment", &cloud, "--model", &model], &["--weights"]);
    refused(&["segment", &cloud, "--model", &model, "--weights", &a, "--random-weights", "3"], &["--random-weights"]);
    refused(&["random-weights", "--model", &model, "--out", &dir.join("no/such/dir/w.safetensors").display().to_string()], &["no/such/dir"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every argument of every subcommand has help text (`-h` shows a description beside it, not
/// only a default).
#[test]
fn every_argument_has_help_text() {
    // every subcommand, found from the help texts themselves (new ones are checked too)
    let mut commands: Vec<Vec<String>> = Vec::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(cmd) = todo.pop() {
        let mut args: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
        args.push("-h");
        let text = ok(&args);
        let subs: Vec<String> = text
            .split("\nCommands:\n")
            .nth(1)
            .map(|c| {
                c.lines()
                    .take_while(|l| l.starts_with("  "))
                    .filter_map(|l| l.split_whitespace().next())
                    .filter(|n| *n != "help")
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        for sub in subs {
            let mut c = cmd.clone();
            c.push(sub);
            todo.push(c);
        }
        if !cmd.is_empty() {
            commands.push(cmd);
        }
    }
    assert!(commands.len() >= 15, "subcommands found: {commands:?}");
    let mut bare = Vec::new();
    for cmd in &commands {
        let cmd: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
        let mut args = cmd.to_vec();
        args.push("-h");
        let text = ok(&args);
        let lines: Vec<&str> = text.lines().collect();
        let mut section = "";
        for (k, line) in lines.iter().enumerate() {
            if line.ends_with(':') && !line.starts_with(' ') {
                section = line;
                continue;
            }
            if !(section == "Arguments:" || section == "Options:") {
                continue;
            }
            // an entry: "  <NAME>  help" or "  -h, --name <V>  help", or (when some help is
            // long) the entry alone and its help on the next, further indented line
            let t = line.trim_start();
            let indent = line.len() - t.len();
            if indent > 6 || !(t.starts_with('-') || t.starts_with('<')) {
                continue;
            }
            let mut help = t.split_once("  ").map(|(_, h)| h.trim()).unwrap_or("");
            if help.is_empty() {
                if let Some(next) = lines.get(k + 1) {
                    let n = next.trim_start();
                    if next.len() - n.len() > indent && !n.starts_with('-') && !n.starts_with('<') {
                        help = n.trim();
                    }
                }
            }
            if help.is_empty() || help.starts_with('[') {
                bare.push(format!("sptr {}: {}", cmd.join(" "), t));
            }
        }
    }
    assert!(bare.is_empty(), "arguments without help text:\n{}", bare.join("\n"));
}

/// A file that is not there: the error names its path once (not "reading X: reading X").
#[test]
fn a_missing_file_is_named_once() {
    let dir = temp_dir("missing");
    let small = common::small_nuscenes_model(&dir);
    let cloud = common::nuscenes_sweep_arg();
    let m = "/nonexistent-sptr-test/missing";
    let (bin, yaml, st) = (format!("{m}.bin"), format!("{m}.yaml"), format!("{m}.safetensors"));
    let out = dir.join("out").display().to_string();
    let nus = "config/models/sphereformer_nuscenes.yaml";
    let bag = common::data("bags/nuscenes_sample").display().to_string();
    let params = "config/perception_nuscenes.yaml";
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["voxelize", &bin], &bin),
        (vec!["voxelize", &cloud, "--model", &yaml], &yaml),
        (vec!["segment", &bin, "--model", nus, "--random-weights", "1"], &bin),
        (vec!["segment", &cloud, "--model", &yaml, "--random-weights", "1"], &yaml),
        (vec!["segment", &cloud, "--model", &small, "--weights", &st], &st),
        (vec!["prepare", &bin, "--model", nus, "--out", &out], &bin),
        (vec!["random-weights", "--model", &yaml, "--out", &out], &yaml),
        (vec!["bench", "model", &bin], &bin),
        (vec!["bench", "model", &cloud, "--model", &small, "--weights", &st, "--device", "cpu"], &st),
        (vec!["bench", "voxelize", &bin], &bin),
        (vec!["bench", "pipeline", &bin], &bin),
        (vec!["bench", "pipeline", &cloud, "--params", &yaml], &yaml),
        (vec!["bag", "info", m], m),
        (vec!["replay", m, "--model", nus, "--random-weights", "1", "--params", params, "--out", &out], m),
        (vec!["replay", &bag, "--model", &yaml, "--random-weights", "1", "--params", params, "--out", &out], &yaml),
        (vec!["replay", &bag, "--model", nus, "--random-weights", "1", "--params", &yaml, "--out", &out], &yaml),
        (vec!["replay", &bag, "--model", nus, "--weights", &st, "--params", params, "--device", "cpu", "--out", &out], &st),
        (vec!["eval", "merge", m, "--out", &out], m),
        (vec!["eval", "agreement", m, &bag], m),
    ];
    for (args, path) in cases {
        let o = sptr(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && !err.contains("panicked"), "sptr {args:?}:\n{err}");
        assert_eq!(err.matches(path).count(), 1, "sptr {args:?} does not name {path} once:\n{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `eval merge` of the outputs of two different replays names both sides by their directory:
/// here both are `--shard 0/1` runs, of different bags.
#[test]
fn eval_merge_of_different_bags_names_both_shards() {
    use sptr::eval::confusion::Confusion;
    use sptr::eval::state::{EvalState, STATE_FORMAT};
    let dir = temp_dir("merge");
    let state = |bag: &str| EvalState {
        format: STATE_FORMAT,
        bag: bag.into(),
        lidar_topic: "/sptr/input/points".into(),
        model: "m.yaml".into(),
        weights: "w".into(),
        device: "cpu".into(),
        class_names: vec!["a".into(), "b".into()],
        ground_truth: None,
        shard_count: 1,
        shards: vec![0],
        frames: Vec::new(),
        frames_in_bag: 0,
        confusion: Confusion::new(2),
        processing_s: vec![1.0],
        damage: None,
    };
    let (a, b) = (dir.join("run_a"), dir.join("run_b"));
    for (d, bag) in [(&a, "drive_x"), (&b, "drive_y")] {
        std::fs::create_dir_all(d).unwrap();
        state(bag).save(&d.join("eval_state.json")).unwrap();
    }
    let (a, b) = (a.display().to_string(), b.display().to_string());
    let out = dir.join("merged").display().to_string();
    let o = sptr(&["eval", "merge", &a, &b, "--out", &out]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(&format!("shard 0/1 of {b} has bag \"drive_y\" but shard 0/1 of {a} has bag \"drive_x\"")),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A replay in which every frame is skipped (here: each of the six frames has more points than
/// the model's `max_points`) writes its report and exits non-zero, saying why.
#[test]
fn replay_with_every_frame_skipped_fails() {
    let dir = temp_dir("all-skipped");
    let text = std::fs::read_to_string(common::root().join("config/models/sphereformer_semantickitti.yaml")).unwrap();
    let capped = text.replace("max_points: 4000000", "max_points: 10");
    assert_ne!(capped, text, "the SemanticKITTI model YAML changed: update this test");
    let model = dir.join("capped.yaml");
    std::fs::write(&model, capped).unwrap();
    let out = dir.join("out");
    let bag = common::data("bags/semantickitti_labels").display().to_string();
    let o = sptr(&["replay", &bag, "--model", &model.display().to_string(), "--random-weights", "1", "--device", "cpu", "--progress", "quiet", "--out", &out.display().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("every one of the 6 LiDAR frames was skipped") && err.contains("max_points"), "{err}");
    assert!(out.join("report.md").is_file(), "the report is written");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--bev-png-frames` must name frames the replay processes: beyond the bag or outside the
/// shard is an error naming them, before anything is replayed.
#[test]
fn bev_png_frames_beyond_the_bag_or_shard_are_errors() {
    let dir = temp_dir("bev-png");
    let text = std::fs::read_to_string(common::root().join("config/models/sphereformer_semantickitti.yaml")).unwrap();
    let model = dir.join("kitti.yaml");
    std::fs::write(&model, text).unwrap();
    let model = model.display().to_string();
    let bag = common::data("bags/semantickitti_labels").display().to_string();
    let out = dir.join("out");
    let o = out.display().to_string();
    let base = ["replay", &bag, "--model", &model, "--random-weights", "1", "--device", "cpu", "--out", &o];
    let mut args = base.to_vec();
    args.extend(["--bev-png-frames", "0,5,6,40"]);
    refused(&args, &["--bev-png-frames [6, 40]", "6 LiDAR frame(s), indices 0 to 5"]);
    assert!(!out.exists(), "nothing is written");
    let mut args = base.to_vec();
    args.extend(["--shard", "1/2", "--bev-png-frames", "1,2,4"]);
    refused(&args, &["--bev-png-frames [2, 4]", "shard 1/2", "index % 2 == 1"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The main command's replay (scripts/run_sample.sh: the sample bag with
/// config/perception_nuscenes.yaml) runs clean: the params file and the bag agree on the BEV
/// grids' frame, so no "no transform is applied" warning, and the grids carry the cloud's frame.
#[test]
fn sample_bag_with_the_nuscenes_params_runs_without_a_frame_warning() {
    use sptr::msgs::cdr::{CdrMessage, Image};
    let dir = temp_dir("sample");
    let model = common::small_nuscenes_model(&dir);
    let out = dir.join("out");
    let bag = common::data("bags/nuscenes_sample").display().to_string();
    let o = sptr(&[
        "replay", &bag, "--model", &model, "--params", "config/perception_nuscenes.yaml", "--random-weights", "0",
        "--device", "cpu", "--progress", "plain", "--bev-png-frames", "0", "--out", &out.display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("no transform is applied") && !err.contains("warning"), "{err}");
    let b = sptr::bag::Bag::open(&out.join("bag")).unwrap();
    let mut n = 0;
    for m in b.messages(&["/sptr/output/bev/labels"]) {
        assert_eq!(Image::from_cdr(&m.unwrap().data).unwrap().header.frame_id, "lidar_top");
        n += 1;
    }
    assert_eq!(n, 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--precision`: fp16, bf16, fp32 or auto on segment, replay and bench model; anything else
/// is refused naming the choices; the CPU computes in f32 whatever it says (same labels). (The
/// JSON lines of `bench model --precision` are the GPU suite's: a CPU bench takes minutes here.)
#[test]
fn precision_option_is_checked_and_the_cpu_ignores_it() {
    let dir = temp_dir("precision");
    let model = common::small_nuscenes_model(&dir);
    let cloud = common::nuscenes_sweep_arg();
    for cmd in [&["segment", &cloud, "--model", &model, "--random-weights", "3"][..], &["replay", "tests/data/bags/nuscenes_sample", "--model", &model, "--random-weights", "3"], &["bench", "model", &cloud, "--model", &model]] {
        let mut args = cmd.to_vec();
        args.extend(["--device", "cpu", "--precision", "tf32"]);
        refused(&args, &["tf32", "fp16, bf16, fp32 or auto"]);
    }
    let (a, b) = (dir.join("a.label").display().to_string(), dir.join("b.label").display().to_string());
    ok(&["segment", &cloud, "--model", &model, "--random-weights", "3", "--device", "cpu", "--out", &a]);
    for p in ["bf16", "fp32"] {
        ok(&["segment", &cloud, "--model", &model, "--random-weights", "3", "--device", "cpu", "--precision", p, "--out", &b]);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap(), "the CPU path does not depend on --precision ({p})");
    }
    refused(&["bench", "model", &cloud, "--model", &model, "--precision", "fp16,bf16", "--rounds", "0"], &["--rounds"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sptr replay` with the cameras and the BEV map model (the reduced fusion YAML, random weights,
/// CPU) on the sample bag: the map PNG and topics are written, and ground-truth masks (a class
/// everywhere) are evaluated into the report and the summary line. Bad camera-model arguments are
/// refused, each naming what is wrong.
#[test]
fn replay_with_the_bev_map_model_and_ground_truth() {
    let dir = temp_dir("bevmap");
    let model = common::small_nuscenes_model(&dir);
    let out = dir.join("out").display().to_string();
    let bag = common::data("bags/nuscenes_sample").display().to_string();
    let small = common::data("bevseg/fusion_small.yaml").display().to_string();
    let gt = dir.join("gt");
    std::fs::create_dir_all(&gt).unwrap();
    let mut masks = vec![0f32; 6 * 50 * 50];
    masks[..50 * 50].fill(1.0); // drivable_area everywhere
    sptr::nn::npy::write_f32(&gt.join("000000.npy"), &[6, 50, 50], &masks).unwrap();
    let cams = "config/perception_nuscenes_cameras.yaml";
    let base = ["replay", &bag, "--model", &model, "--random-weights", "0", "--device", "cpu", "--progress", "quiet", "--out", &out];
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|s| s.to_string()).collect() };
    let gts = gt.display().to_string();
    let args = with(&["--params", cams, "--camera-model", &small, "--camera-weights", "random:0", "--bev-png-frames", "0", "--map-ground-truth", &gts]);
    let o = sptr(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("BEV map: mIoU") && err.contains("drivable_area"), "{err}");
    let outp = std::path::Path::new(&out);
    assert!(outp.join("bev/map_000000.png").is_file());
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(outp.join("report.json")).unwrap()).unwrap();
    let classes = report["bev_map"]["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 6);
    // drivable_area is everywhere: its IoU is the fraction of cells predicted at the best threshold, > 0
    // unless the random model predicts nothing; the other classes are nowhere: IoU 0
    assert!(classes[1..].iter().all(|c| c["iou"].as_f64() == Some(0.0)), "{report}");
    let b = sptr::bag::Bag::open(&outp.join("bag")).unwrap();
    assert!(b.topics().iter().any(|t| t.name == "/sptr/output/bev/map/drivable_area"));

    refused(&with(&["--params", "config/perception_nuscenes.yaml", "--camera-weights", "random:0"]).iter().map(String::as_str).collect::<Vec<_>>(), &["need the camera branch"]);
    refused(&with(&["--params", cams, "--camera-model", &small, "--camera-weights", "random:x"]).iter().map(String::as_str).collect::<Vec<_>>(), &["random:"]);
    refused(&with(&["--params", cams, "--camera-weights", "random:0", "--camera-model", &small, "--map-ground-truth", "/nonexistent-gt"]).iter().map(String::as_str).collect::<Vec<_>>(), &["/nonexistent-gt", "not a directory"]);
    refused(&with(&["--params", cams]).iter().map(String::as_str).collect::<Vec<_>>(), &["camera model weights", "--camera-weights"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A weights file with a NaN or an infinity is refused at load, naming the tensor, by both
/// `sptr segment` (SphereFormer) and `sptr bevseg` (BEVFusion seg): never a run that writes
/// NaN probabilities or plausible-looking labels.
#[test]
fn weights_with_nan_or_inf_are_refused() {
    let dir = temp_dir("non-finite");
    let model = common::small_nuscenes_model(&dir);
    let good = dir.join("good.safetensors");
    ok(&["random-weights", "--model", &model, "--seed", "2", "--out", &good.display().to_string()]);
    // a BatchNorm weight in front of a ReLU: a NaN there is mostly clipped away downstream
    let bad = dir.join("nan.safetensors");
    common::with_value(&good, &bad, "output_layer.0.weight", 3, f32::NAN);
    let out = dir.join("x.label").display().to_string();
    refused(
        &["segment", &common::nuscenes_sweep_arg(), "--model", &model, "--weights", &bad.display().to_string(), "--device", "cpu", "--out", &out],
        &["output_layer.0.weight", "1 NaN", "first at index 3", "nan.safetensors"],
    );
    assert!(!std::path::Path::new(&out).exists(), "labels were written");

    let seg = common::root().join("tests/data/bevseg/camera_small.yaml").display().to_string();
    let good = dir.join("seg.safetensors");
    ok(&["random-weights", "--model", &seg, "--seed", "2", "--out", &good.display().to_string()]);
    let bad = dir.join("seg-inf.safetensors");
    common::with_value(&good, &bad, "heads.map.classifier.6.weight", 0, f32::INFINITY);
    let calib = common::data("nuscenes/calib.json").display().to_string();
    let front = std::fs::read_dir(common::data("nuscenes"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().contains("__CAM_FRONT__"))
        .unwrap();
    let image = format!("CAM_FRONT={}", front.display());
    let map = dir.join("map").display().to_string();
    refused(
        &["bevseg", "--model", &seg, "--weights", &bad.display().to_string(), "--calib", &calib, "--images", &image, "--out", &map, "--device", "cpu"],
        &["heads.map.classifier.6.weight", "1 +inf", "seg-inf.safetensors"],
    );
    assert!(!std::path::Path::new(&map).join("bev_probabilities.npy").exists(), "a map was written");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sptr camera-features --weights` takes the camera encoder out of a whole BEVFusion seg
/// checkpoint (the other tensors ignored and counted), as from a file of the encoder alone, and
/// refuses a file without it, naming what is missing.
#[test]
fn camera_features_take_the_encoder_of_a_whole_checkpoint() {
    let dir = temp_dir("camera-features-whole");
    let seg = common::root().join("tests/data/bevseg/fusion_small.yaml").display().to_string();
    let whole = dir.join("whole.safetensors");
    ok(&["random-weights", "--model", &seg, "--seed", "4", "--out", &whole.display().to_string()]);
    // the encoder's part alone, as a conversion script would write it
    let bytes = std::fs::read(&whole).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let enc = |n: &str| n.starts_with("encoders.camera.backbone.") || n.starts_with("encoders.camera.neck.");
    let part: Vec<(String, safetensors::tensor::TensorView)> = st.iter().filter(|(n, _)| enc(n)).map(|(n, v)| (n.to_string(), v)).collect();
    let others = st.len() - part.len();
    assert!(!part.is_empty() && others > 0);
    let alone = dir.join("encoder.safetensors");
    std::fs::write(&alone, safetensors::serialize(part, None).unwrap()).unwrap();

    let front = std::fs::read_dir(common::data("nuscenes"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.to_string_lossy().contains("__CAM_FRONT__"))
        .unwrap()
        .display()
        .to_string();
    let run = |w: &std::path::Path, out: &str| {
        let out = dir.join(out).display().to_string();
        let text = ok(&["camera-features", &front, "--model", &seg, "--weights", &w.display().to_string(), "--device", "cpu", "--out", &out]);
        (text, std::fs::read(std::path::Path::new(&out).join("neck0.npy")).unwrap())
    };
    let (text, neck_whole) = run(&whole, "whole");
    assert!(text.contains(&format!("{others} other tensors ignored")), "{text}");
    assert!(text.contains("encoders.camera.vtransform.*") && text.contains("heads.*"), "{text}");
    let (text, neck_alone) = run(&alone, "alone");
    assert!(!text.contains("ignored"), "{text}");
    assert_eq!(neck_whole, neck_alone, "the same encoder tensors gave other features");

    // SphereFormer weights: no camera encoder in them
    let model = common::small_nuscenes_model(&dir);
    let sf = dir.join("sf.safetensors").display().to_string();
    ok(&["random-weights", "--model", &model, "--out", &sf]);
    refused(
        &["camera-features", &front, "--model", &seg, "--weights", &sf, "--device", "cpu", "--out", &dir.join("sf").display().to_string()],
        &["none of its", "camera encoder", "unet.*", "missing: encoders.camera.backbone.patch_embed.projection.weight"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
