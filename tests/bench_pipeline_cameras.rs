//! `sptr bench pipeline --cameras` (the node's camera benchmark) on the CPU: the sample bag's six
//! cameras through the node's camera branch, the reduced BEV map model (random weights) and the
//! map messages' encoding, with a narrowed LiDAR model; and its bad inputs. Timings are not
//! checked (they depend on the machine), only what the JSON reports and that every camera was
//! used.

mod common;

use std::process::{Command, Output};

fn sptr(args: &[&str]) -> Output {
    Command::new(common::sptr_exe()).current_dir(common::root()).args(args).output().expect("run sptr")
}

/// A fresh temporary directory with the narrowed nuScenes SphereFormer in it (a fast network for a
/// debug build), and the model's path.
fn small_lidar_model(name: &str) -> (std::path::PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("sptr-pipebench-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = common::small_nuscenes_model(&dir);
    (dir, model)
}

/// `args` fails cleanly (non-zero, no panic) and stderr says every string of `expect`.
fn refused(args: &[&str], expect: &[&str]) {
    let out = sptr(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "sptr {args:?} succeeded:\n{err}");
    assert!(out.status.code().is_some() && !err.contains("panicked"), "sptr {args:?} crashed:\n{err}");
    for e in expect {
        assert!(err.contains(e), "sptr {args:?}: the error does not say `{e}`:\n{err}");
    }
}

/// One warmup and one timed frame, unpaced: every camera used, the model's and the branch's stages
/// reported, the map messages of the reduced model (6 classes, 50 x 50 cells), host memory sampled;
/// the camera half beside the LiDAR path (as the node runs it) and, with `--serial`, after it.
#[test]
fn cameras_bench_reports_every_stage_and_the_map() {
    for serial in [false, true] {
        cameras_bench_run(serial);
    }
}

fn cameras_bench_run(serial: bool) {
    let (dir, model) = small_lidar_model(if serial { "serial" } else { "run" });
    let cloud = common::nuscenes_sweep_arg();
    let mut args = vec![
        "bench", "pipeline", &cloud, "--model", &model, "--params", "config/perception_nuscenes_cameras.yaml", "--cameras",
        "--camera-model", "tests/data/bevseg/fusion_small.yaml", "--camera-weights", "random:0", "--frames", "1", "--warmup", "1",
    ];
    if serial {
        args.push("--serial");
    }
    let out = sptr(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sptr {args:?} failed:\n{err}");
    let line = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{line}"));
    assert_eq!(v["bench"], "pipeline_cameras");
    assert_eq!(v["device"], "cpu");
    assert_eq!((v["frames"].as_u64(), v["warmup"].as_u64()), (Some(1), Some(1)), "{v}");
    assert!(v["pace"].is_null() && v["frames_over_period"] == 0, "unpaced: {v}");
    assert_eq!(v["latency"]["n"], 1);
    assert_eq!(v["cameras"], 6);
    assert_eq!(v["camera_status"], serde_json::json!(vec!["used"; 6]), "re-stamped images are all in sync: {v}");
    let stages = v["stage_p50_ms"].as_object().expect("stage_p50_ms");
    for k in [
        "lidar", "lidar/network", "lidar/bev", "cameras", "cameras/camera_sync", "cameras/camera_decode", "cameras/sweeps", "bev_map",
        "bev_map/backbone", "bev_map/depth+pool", "bev_map/lidar", "bev_map/head", "map_encode",
    ] {
        let ms = stages.get(k).and_then(|x| x.as_f64()).unwrap_or_else(|| panic!("no stage {k}: {v}"));
        assert!(ms >= 0.0 && ms.is_finite(), "{k}: {ms}");
    }
    // The whole frame covers its parts: the LiDAR path and the camera half's stages one after
    // the other (serial), or the longer of the two (beside each other).
    assert_eq!(v["overlap"], !serial, "{v}");
    let stage = |k: &str| stages[k].as_f64().unwrap();
    let camera_half = stage("cameras") + stage("bev_map") + stage("map_encode");
    let covered = if serial { stage("lidar") + camera_half } else { stage("lidar").max(camera_half) };
    assert!(v["latency"]["max_ms"].as_f64().unwrap() >= covered * 0.999, "{v}");
    // the tail's stages, and the slowest frame's (one frame here: it is the slowest)
    let p99 = v["stage_p99_ms"].as_object().expect("stage_p99_ms");
    assert_eq!(p99.len(), stages.len(), "{v}");
    let slowest = &v["slowest_frame"];
    assert_eq!(slowest["frame"], 0, "{v}");
    assert_eq!(slowest["ms"].as_f64(), v["latency"]["max_ms"].as_f64(), "{v}");
    assert_eq!(slowest["stages"]["lidar"].as_f64(), stages["lidar"].as_f64(), "{v}");
    // frame by frame: the total and the main stages, one value per timed frame (rounded to 0.01 ms)
    let per_frame = &v["per_frame_ms"];
    for k in ["total", "lidar", "lidar/network", "cameras", "bev_map", "map_encode"] {
        let series = per_frame[k].as_array().unwrap_or_else(|| panic!("per_frame_ms.{k}: {v}"));
        assert_eq!(series.len(), 1, "per_frame_ms.{k}: {v}");
    }
    assert!((per_frame["total"][0].as_f64().unwrap() - v["latency"]["max_ms"].as_f64().unwrap()).abs() <= 0.006, "{v}");
    let map = &v["map"];
    assert_eq!((map["classes"].as_u64(), map["width"].as_u64(), map["height"].as_u64()), (Some(6), Some(50), Some(50)), "{v}");
    // six OccupancyGrids of 2500 cells, a mono8 and an rgb8 image of 50 x 50, plus headers
    let payload = 6 * 2500 + 2500 + 3 * 2500;
    let bytes = map["cdr_bytes"].as_u64().unwrap() as usize;
    assert!(bytes > payload && bytes < payload + 4096, "map CDR bytes {bytes}: {v}");
    let rss = &v["host_rss_mb"];
    assert_eq!(rss["samples"].as_array().map(Vec::len), Some(1), "frame 0 only: {v}");
    assert!(rss["first"].as_f64().unwrap() > 1.0, "{v}");
    assert!(v["device_used_mb"].is_null(), "no device memory on the CPU: {v}");
    // whose a slow frame is (crate::host_probe): one value per timed frame; the one frame is the
    // median, not slow; a CPU frame of the fusion model takes well over a 10 ms clock tick
    let host = &v["host"];
    for k in ["probe_ratio", "minor_faults", "major_faults", "self_cpu_ms", "host_busy_ms", "steal_ms"] {
        assert_eq!(host[k].as_array().map(Vec::len), Some(1), "host.{k}: {v}");
    }
    assert_eq!((host["slow_frames"]["frames"].as_u64(), host["other_frames"]["frames"].as_u64()), (Some(0), Some(1)), "{v}");
    assert!(host["self_cpu_ms"][0].as_f64().unwrap() > 0.0, "{v}");
    // the probe ran through the frame (seconds on the CPU, its runs under a millisecond)
    assert!(host["slowdowns"]["runs"].as_u64().is_some_and(|n| n > 0), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cameras_bench_bad_inputs_are_clear_errors() {
    let cloud = common::nuscenes_sweep_arg();
    let c = cloud.as_str();
    // a params file without cameras: said before any model loads
    refused(
        &["bench", "pipeline", c, "--params", "config/perception_nuscenes.yaml", "--cameras"],
        &["--cameras", "config/perception_nuscenes.yaml", "input.cameras is empty", "perception_nuscenes_cameras.yaml"],
    );
    let cams = "config/perception_nuscenes_cameras.yaml";
    // the camera options need --cameras; pacing needs both a rate and a duration
    refused(&["bench", "pipeline", c, "--params", cams, "--rate-hz", "10", "--duration-s", "1"], &["--cameras"]);
    refused(&["bench", "pipeline", c, "--params", cams, "--camera-weights", "random:0"], &["--cameras"]);
    refused(&["bench", "pipeline", c, "--params", cams, "--serial"], &["--cameras"]);
    refused(&["bench", "pipeline", c, "--params", cams, "--cameras", "--rate-hz", "10"], &["--duration-s"]);
    refused(&["bench", "pipeline", c, "--params", cams, "--cameras", "--duration-s", "5"], &["--rate-hz"]);
    for bad in ["0", "0.01", "nan", "inf", "1e9", "x"] {
        refused(&["bench", "pipeline", c, "--params", cams, "--cameras", "--rate-hz", bad, "--duration-s", "1"], &["--rate-hz"]);
        refused(&["bench", "pipeline", c, "--params", cams, "--cameras", "--rate-hz", "10", "--duration-s", bad], &["--duration-s"]);
    }
    // faults need a paced run, and a fault must end before the next begins (a 3 s silence)
    refused(&["bench", "pipeline", c, "--params", cams, "--cameras", "--faults-every-s", "5"], &["--rate-hz"]);
    let (dir, model) = small_lidar_model("bad");
    refused(
        &[
            "bench", "pipeline", c, "--model", &model, "--params", cams, "--cameras", "--camera-model", "tests/data/bevseg/fusion_small.yaml",
            "--camera-weights", "random:0", "--rate-hz", "20", "--duration-s", "1", "--faults-every-s", "3",
        ],
        &["--faults-every-s 3", "more than 3.5 s"],
    );
    // CUDA graphs need the cameras, and a GPU: on the CPU said after the model loads
    refused(&["bench", "pipeline", c, "--params", cams, "--camera-graph"], &["--cameras"]);
    refused(
        &[
            "bench", "pipeline", c, "--model", &model, "--params", cams, "--cameras", "--camera-model", "tests/data/bevseg/fusion_small.yaml",
            "--camera-weights", "random:0", "--device", "cpu", "--camera-graph",
        ],
        &["--camera-graph", "CPU", "--device cuda"],
    );
    // bad weights value and a bag without the cameras' topics: named
    refused(
        &["bench", "pipeline", c, "--model", &model, "--params", cams, "--cameras", "--camera-model", "tests/data/bevseg/fusion_small.yaml", "--camera-weights", "random:x"],
        &["random:x", "random:0"],
    );
    let lidar_only = common::data("bags/mcap_small").display().to_string();
    refused(
        &[
            "bench", "pipeline", c, "--model", &model, "--params", cams, "--cameras", "--camera-model", "tests/data/bevseg/fusion_small.yaml",
            "--camera-weights", "random:0", "--bag", &lidar_only,
        ],
        &[&lidar_only, "no message on /sptr/input/cameras/CAM_FRONT/image/compressed"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
