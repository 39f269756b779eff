//! The `perception_node` binary against a real rclpy peer (`tests/ros/node_peer.py`) over DDS.
//!
//! Each test starts the built node as a subprocess with `--ros-args --params-file <temp params,
//! device cpu, the nuScenes model> -r __ns:=/<unique namespace>`, runs one peer scenario, checks
//! the node is still running, then sends SIGINT and checks it exits with status 0 within 1 s.
//! Other tests start the node with invalid parameters and check it refuses to start with a
//! message naming the parameter.
//!
//! Needs a ROS 2 environment (`source scripts/ros_env.sh`); run with `scripts/test_ros.sh`.
#![cfg(feature = "ros")]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Voxels of the nuScenes sample with the nuScenes model (what `sptr voxelize` prints).
const NUSCENES_VOXELS: u32 = 17856;
const PEER_TIMEOUT: Duration = Duration::from_secs(90);
const PEER_STEP_TIMEOUT_S: &str = "25";

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

fn nuscenes_bin() -> PathBuf {
    let dir = manifest().join("tests/data/nuscenes");
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "bin"))
        .unwrap_or_else(|| panic!("no .bin cloud in {}", dir.display()))
}

/// A name no parallel test or run shares.
fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "sptr_node_{tag}_{}_{}_{}",
        std::process::id(),
        nanos,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A params file like config/perception.yaml with `device` and an absolute nuScenes model path;
/// `edit` rewrites its text.
fn params_file(name: &str, device: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(manifest().join("config/perception.yaml"))
        .expect("read config/perception.yaml");
    let model = manifest().join("config/models/sphereformer_nuscenes.yaml");
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        if t.starts_with("device:") {
            out.push_str(&format!("{indent}device: {device}\n"));
        } else if t.starts_with("config:") {
            out.push_str(&format!("{indent}config: {}\n", model.display()));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    let path = tmp().join(format!("{name}.yaml"));
    std::fs::write(&path, edit(out)).expect("write the params file");
    path
}

fn ros_env(cmd: &mut Command) -> &mut Command {
    if std::env::var_os("ROS_LOG_DIR").is_none() {
        cmd.env("ROS_LOG_DIR", tmp().join("ros-log"));
    }
    if std::env::var_os("ROS_AUTOMATIC_DISCOVERY_RANGE").is_none() {
        cmd.env("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST");
    }
    cmd
}

/// A child process with its output in a log file; killed on drop.
struct Proc {
    child: Child,
    log: PathBuf,
    what: String,
}

impl Proc {
    fn spawn(mut cmd: Command, log: PathBuf, what: &str) -> Proc {
        let f = File::create(&log).expect("create a log file");
        let child = ros_env(&mut cmd)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e}"));
        Proc {
            child,
            log,
            what: what.to_string(),
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|e| format!("(no log of {}: {e})", self.what))
    }

    fn wait_for(&mut self, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return Some(s);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Removes the test's temp files (params, logs) when the test passes; keeps them otherwise.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "ros_node: logs and params kept under {} ({}*)",
                tmp().display(),
                self.0
            );
            return;
        }
        if let Ok(dir) = std::fs::read_dir(tmp()) {
            for e in dir.filter_map(|e| e.ok()) {
                if e.file_name().to_string_lossy().starts_with(&self.0) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

fn node_cmd(params: &Path, ns: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_perception_node"));
    cmd.args(["--ros-args", "--params-file"])
        .arg(params)
        .args(["-r", &format!("__ns:=/{ns}")])
        .args(extra);
    cmd
}

fn python() -> PathBuf {
    match std::env::var_os("SPTR_ROS_VENV").filter(|v| !v.is_empty()) {
        Some(v) => PathBuf::from(v).join("bin").join("python"),
        None => PathBuf::from("python3"),
    }
}

fn signal(p: &Proc, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &p.child.id().to_string()])
        .status()
        .unwrap_or_else(|e| panic!("run kill -{sig}: {e}"))
        .success();
    assert!(ok, "kill -{sig} {} failed", p.child.id());
}

/// Starts the node, runs the peer's `scenario`, checks the node survived it and stops on
/// SIGINT within a second with status 0. Returns the peer's output.
fn run_scenario(scenario: &str, node_extra: &[&str], peer_extra: &[&str]) -> String {
    let ns = unique(scenario);
    let params = params_file(&ns, "cpu", |t| t);
    run_node_and_peer(
        scenario,
        &ns,
        node_cmd(&params, &ns, node_extra),
        peer_extra,
    )
}

fn run_node_and_peer(scenario: &str, ns: &str, node_cmd: Command, peer_extra: &[&str]) -> String {
    let _cleanup = Cleanup(ns.to_string());
    let mut node = Proc::spawn(
        node_cmd,
        tmp().join(format!("{ns}_node.log")),
        "perception_node",
    );

    let mut peer_cmd = Command::new(python());
    peer_cmd
        .arg(manifest().join("tests/ros/node_peer.py"))
        .args(["--ns", &format!("/{ns}"), "--scenario", scenario])
        .arg("--cloud")
        .arg(nuscenes_bin())
        .args([
            "--expect-voxels",
            &NUSCENES_VOXELS.to_string(),
            "--timeout",
            PEER_STEP_TIMEOUT_S,
        ])
        .args(peer_extra);
    let mut peer = Proc::spawn(
        peer_cmd,
        tmp().join(format!("{ns}_peer.log")),
        "the rclpy peer",
    );

    let status = peer.wait_for(PEER_TIMEOUT);
    let (peer_log, node_log) = (peer.log.clone(), node.log.clone());
    let report = move |why: &str| -> String {
        let read =
            |p: &Path| std::fs::read_to_string(p).unwrap_or_else(|e| format!("(no log: {e})"));
        format!(
            "{why}\n--- peer output:\n{}\n--- node output:\n{}",
            read(&peer_log),
            read(&node_log)
        )
    };
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!(
            "{}",
            report(&format!("scenario `{scenario}`: the peer failed ({s})"))
        ),
        None => panic!(
            "{}",
            report(&format!(
                "scenario `{scenario}`: the peer did not finish within {PEER_TIMEOUT:?}"
            ))
        ),
    }
    if let Some(s) = node.child.try_wait().unwrap() {
        panic!(
            "{}",
            report(&format!(
                "the node exited during scenario `{scenario}` ({s})"
            ))
        );
    }

    // SIGINT (SIGTERM for the launch-style test, as launch escalates): exits within a second,
    // status 0.
    let sig = if ns.contains("_launch_") {
        "TERM"
    } else {
        "INT"
    };
    let t = Instant::now();
    signal(&node, sig);
    match node.wait_for(Duration::from_secs(1)) {
        Some(s) if s.success() => {}
        Some(s) => panic!(
            "{}",
            report(&format!("the node exited with {s} on SIG{sig}, expected 0"))
        ),
        None => panic!(
            "{}",
            report(&format!("the node did not exit within 1 s of SIG{sig}"))
        ),
    }
    eprintln!(
        "ros_node {scenario}: node stopped {:?} after SIG{sig}",
        t.elapsed()
    );
    let out = peer.log_text();
    eprintln!("--- peer:\n{out}--- node:\n{}", node.log_text());
    out
}

#[test]
fn valid_cloud_gives_the_voxel_count_and_timings() {
    let out = run_scenario(
        "valid",
        &["-p", "budget.processing_ms:=60000.0"],
        &["--expect-level", "0"],
    );
    assert!(
        out.contains(&format!("RESULT voxels={NUSCENES_VOXELS}")),
        "peer output:\n{out}"
    );
    assert!(out.contains("RESULT processing_ms="), "peer output:\n{out}");
}

/// A model whose `voxelization.max_voxels` (1000) is below the cloud's 17856 voxels: the frame is
/// processed with 1000 voxels and counted in diagnostics.
#[test]
fn voxel_cap_is_applied_and_counted() {
    let ns = unique("voxcap");
    let model_src = manifest().join("config/models/sphereformer_nuscenes.yaml");
    let model = tmp().join(format!("{ns}_sphereformer_nuscenes.yaml"));
    let text = std::fs::read_to_string(&model_src).unwrap();
    assert!(
        text.contains("max_voxels: 400000"),
        "the nuScenes model YAML changed: update this test"
    );
    std::fs::write(
        &model,
        text.replace("max_voxels: 400000", "max_voxels: 1000"),
    )
    .unwrap();
    let m = model.display().to_string();
    let params = params_file(&ns, "cpu", |t| {
        t.replace(&model_src.display().to_string(), &m)
    });
    // (argparse keeps the last --expect-voxels)
    let out = run_node_and_peer(
        "valid",
        &ns,
        node_cmd(&params, &ns, &[]),
        &["--expect-voxels", "1000"],
    );
    assert!(out.contains("RESULT voxels=1000"), "peer output:\n{out}");
    assert!(out.contains("over_voxel_cap=1"), "peer output:\n{out}");
}

/// Budget overrides (`-p`) take effect: a frame over `budget.processing_ms` gives WARN, and
/// ERROR once over budget for `budget.error_after_s` (0 here: at once).
#[test]
fn over_budget_gives_warn_then_error() {
    let out = run_scenario(
        "valid",
        &[
            "-p",
            "budget.processing_ms:=0.001",
            "-p",
            "budget.error_after_s:=1000.0",
        ],
        &["--expect-level", "1"],
    );
    assert!(out.contains("RESULT diag_level=1"), "peer output:\n{out}");
    let out = run_scenario(
        "valid",
        &[
            "-p",
            "budget.processing_ms:=0.001",
            "-p",
            "budget.error_after_s:=0.0",
        ],
        &["--expect-level", "2"],
    );
    assert!(out.contains("RESULT diag_level=2"), "peer output:\n{out}");
}

#[test]
fn malformed_clouds_are_rejected_counted_and_the_node_keeps_processing() {
    let out = run_scenario("malformed", &[], &[]);
    for case in [
        "truncated",
        "point_step_0",
        "missing_z",
        "nan_only",
        "empty",
        "too_many_points",
    ] {
        assert!(
            out.contains(&format!("RESULT {case}:")),
            "no result for `{case}`; peer output:\n{out}"
        );
    }
}

#[test]
fn burst_skips_frames_and_counts_add_up() {
    let out = run_scenario("burst", &[], &[]);
    assert!(out.contains("RESULT received="), "peer output:\n{out}");
}

/// The node started as `launch/perception.launch.py` starts it (launch_ros): the params file,
/// then a `/**:` params file of the launch arguments (dotted names), node name and namespace
/// remaps, and the input topic remapped.
#[test]
fn launch_style_arguments_and_input_remap() {
    let ns = unique("launch");
    // model.config relative to the params file (a copy of the model next to it): it must be
    // resolved against the file that sets it, not the later `/**:` file (in another directory)
    // nor the working directory.
    let model_src = manifest().join("config/models/sphereformer_nuscenes.yaml");
    let model_name = format!("{ns}_sphereformer_nuscenes.yaml");
    std::fs::copy(&model_src, tmp().join(&model_name)).expect("copy the model YAML");
    let params = params_file(&ns, "cuda", |t| {
        t.replace(&model_src.display().to_string(), &model_name)
    });
    let overrides_dir = tmp().join(format!("{ns}_launch"));
    std::fs::create_dir_all(&overrides_dir).unwrap();
    let overrides = overrides_dir.join("launch_params.yaml");
    std::fs::write(
        &overrides,
        "/**:\n  ros__parameters:\n    device: cpu\n    model.weights: ''\n    use_sim_time: false\n",
    )
    .unwrap();
    let input = format!("/{ns}/lidar/points");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_perception_node"));
    cmd.args([
        "--ros-args",
        "-r",
        "__node:=sptr",
        "-r",
        &format!("__ns:=/{ns}"),
        "--params-file",
    ])
    .arg(&params)
    .arg("--params-file")
    .arg(&overrides)
    .args(["-r", &format!("~/input/points:={input}")]);
    let out = run_node_and_peer("valid", &ns, cmd, &["--input", &input]);
    let _ = std::fs::remove_dir_all(&overrides_dir);
    assert!(
        out.contains(&format!("RESULT voxels={NUSCENES_VOXELS}")),
        "peer output:\n{out}"
    );
}

/// Starts the node expecting it to refuse; returns its output.
fn refused(tag: &str, ns: &str, cmd: Command, expect_in_message: &[&str]) -> String {
    let _cleanup = Cleanup(ns.to_string());
    let mut node = Proc::spawn(cmd, tmp().join(format!("{ns}_node.log")), "perception_node");
    let status = node.wait_for(Duration::from_secs(20));
    let out = node.log_text();
    match status {
        Some(s) => assert!(
            !s.success(),
            "{tag}: the node exited with {s}, expected a failure; output:\n{out}"
        ),
        None => panic!("{tag}: the node did not exit within 20 s; output:\n{out}"),
    }
    for m in expect_in_message {
        assert!(
            out.contains(m),
            "{tag}: the message does not name `{m}`; output:\n{out}"
        );
    }
    out
}

#[test]
fn invalid_params_file_fails_naming_the_parameter() {
    let ns = unique("badfile");
    let params = params_file(&ns, "cpu", |t| {
        t.replace("resolution: 0.4", "resolution: 0")
    });
    let p = params.display().to_string();
    refused(
        "bad params file",
        &ns,
        node_cmd(&params, &ns, &[]),
        &["bev.resolution", &p],
    );
}

#[test]
fn invalid_override_fails_naming_the_parameter() {
    let ns = unique("badoverride");
    let params = params_file(&ns, "cpu", |t| t);
    refused(
        "bad -p override",
        &ns,
        node_cmd(&params, &ns, &["-p", "budget.processing_ms:=-1.0"]),
        &["budget.processing_ms"],
    );
}

#[test]
fn malformed_yaml_fails_before_ros_starts() {
    let ns = unique("badyaml");
    let params = params_file(&ns, "cpu", |t| {
        t.replace("resolution: 0.4", "resolution: [0.4")
    });
    refused(
        "malformed YAML",
        &ns,
        node_cmd(&params, &ns, &[]),
        &[&params.display().to_string()],
    );
}

/// This test build has no GPU path unless built with `cuda`; either way `-p device:=cuda` must
/// take effect (on a machine without a GPU it must be refused with a clear message).
#[test]
fn device_override_takes_effect() {
    if cfg!(feature = "cuda") && Path::new("/dev/nvidia0").exists() {
        eprintln!("skipped: a GPU is present, device cuda would start");
        return;
    }
    let ns = unique("cudaoverride");
    let params = params_file(&ns, "cpu", |t| t);
    refused(
        "-p device:=cuda",
        &ns,
        node_cmd(&params, &ns, &["-p", "device:=cuda"]),
        &["device", "cuda"],
    );
}
