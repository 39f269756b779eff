//! `node_bench_peer`'s command line and run (see `crate::ros::bench_peer`): drives a running
//! `perception_node` over DDS at a fixed rate with a bag's cloud and camera messages and prints
//! what it measured as one JSON line (also written to `--out`).

use std::path::PathBuf;

/// Publishes a bag's cloud and camera messages to a running perception_node at a fixed rate and
/// measures cloud-in to outputs-out latency, dropped frames and the node's memory.
#[derive(clap::Parser, Debug)]
#[command(name = "node_bench_peer")]
pub struct NodeBenchPeerArgs {
    /// The bag: one PointCloud2 topic, and the cameras' CompressedImage/Image and CameraInfo
    /// topics, named as for a node in the root namespace (e.g. tests/data/bags/nuscenes_sample).
    #[arg(long)]
    bag: PathBuf,
    /// The node's namespace ("" for the root).
    #[arg(long, default_value = "")]
    namespace: String,
    /// The node's name.
    #[arg(long, default_value = "sptr")]
    node_name: String,
    /// The node's BEV map model YAML (its classes' map topics are waited for); none: the LiDAR
    /// outputs only.
    #[arg(long)]
    camera_model: Option<PathBuf>,
    /// Frames per second.
    #[arg(long, default_value_t = 10.0, value_parser = positive)]
    rate_hz: f64,
    /// Seconds of timed frames.
    #[arg(long, default_value_t = 60.0, value_parser = positive)]
    duration_s: f64,
    /// Untimed seconds after the first frame with all its outputs.
    #[arg(long, default_value_t = 5.0, value_parser = non_negative)]
    warmup_s: f64,
    /// Seconds to wait for the first frame with all its outputs (discovery, the first CUDA frame).
    #[arg(long, default_value_t = 120.0, value_parser = positive)]
    start_timeout_s: f64,
    /// Seconds to wait for the last frame's outputs.
    #[arg(long, default_value_t = 2.0, value_parser = non_negative)]
    grace_s: f64,
    /// Also write the JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

fn number(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("`{s}` is not a number: {e}"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("`{s}` is not finite"))
    }
}

fn positive(s: &str) -> Result<f64, String> {
    number(s).and_then(|v| if v > 0.0 { Ok(v) } else { Err(format!("{v} must be > 0")) })
}

fn non_negative(s: &str) -> Result<f64, String> {
    number(s).and_then(|v| if v >= 0.0 { Ok(v) } else { Err(format!("{v} must be >= 0")) })
}

/// Runs the peer; the exit status: 0 when it ran, 1 on an error (said on stderr).
pub fn command(a: NodeBenchPeerArgs) -> i32 {
    let map_classes = match &a.camera_model {
        None => Vec::new(),
        Some(p) => {
            let parsed = std::fs::read_to_string(p)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    crate::models::bevfusion::seg::parse_seg_yaml(&t, &p.display().to_string())
                        .map_err(|e| e.to_string())
                });
            match parsed {
                Ok(y) => y.classes,
                Err(e) => {
                    eprintln!("node_bench_peer: --camera-model {}: {e}", p.display());
                    return 1;
                }
            }
        }
    };
    let cfg = crate::ros::bench_peer::PeerConfig {
        bag: a.bag,
        namespace: a.namespace,
        node_name: a.node_name,
        map_classes,
        rate_hz: a.rate_hz,
        duration_s: a.duration_s,
        warmup_s: a.warmup_s,
        start_timeout_s: a.start_timeout_s,
        grace_s: a.grace_s,
    };
    match crate::ros::bench_peer::run(&cfg) {
        Ok(report) => {
            let json = report.json();
            println!("{json}");
            if let Some(out) = &a.out {
                if let Err(e) = std::fs::write(out, format!("{json}\n")) {
                    eprintln!("node_bench_peer: cannot write {}: {e}", out.display());
                    return 1;
                }
            }
            0
        }
        Err(e) => {
            eprintln!("node_bench_peer: {e}");
            1
        }
    }
}
