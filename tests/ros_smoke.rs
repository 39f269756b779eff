//! ROS 2 smoke test: an r2r node and a real rclpy peer (`tests/ros/peer_echo.py`) exchange
//! PointCloud2 over DDS.
//!
//! The r2r side publishes an XYZI cloud made by `sptr::msgs::cloud::encode_points`; the peer reads it
//! with numpy from the field table and answers with a transformed cloud in another layout
//! (z + 1, intensity × 2, a ring field, an unknown `idx` field, fields reordered); the r2r side
//! decodes that with `sptr::msgs::cloud::decode` and checks every point.
//!
//! Needs a ROS 2 environment: `source scripts/ros_env.sh` (PyPI venv, `SPTR_ROS_VENV`), or a
//! sourced `/opt/ros/<distro>` whose `python3` has rclpy. Run: `scripts/test_ros.sh`, or
//! `cargo test --features ros --test ros_smoke`.
#![cfg(feature = "ros")]

mod common;

use std::fs::File;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{FutureExt, StreamExt};
use r2r::sensor_msgs::msg::PointCloud2;
use r2r::std_msgs::msg::Header;
use sptr::msgs::cloud;
use sptr::msgs::cloud::Layout;
use sptr::Points;

const N: usize = 300;
const TIMEOUT: Duration = Duration::from_secs(30);
const REPUBLISH: Duration = Duration::from_millis(100);

/// The peer process; closing its stdin asks it to exit, and dropping this makes sure it does,
/// also when the test panics.
struct Peer {
    child: Child,
    log: PathBuf,
}

impl Peer {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(no log: {e})"))
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn python() -> (PathBuf, &'static str) {
    match std::env::var_os("SPTR_ROS_VENV").filter(|v| !v.is_empty()) {
        Some(v) => (
            PathBuf::from(v).join("bin").join("python"),
            "the SPTR_ROS_VENV venv",
        ),
        None => (
            PathBuf::from("python3"),
            "the sourced ROS 2 install (no SPTR_ROS_VENV)",
        ),
    }
}

fn test_points() -> Points {
    // Values exact in f32, so the peer's float32 arithmetic is checked bit for bit.
    let x: Vec<f32> = (0..N).map(|i| i as f32 * 0.125 - 20.0).collect();
    let y: Vec<f32> = (0..N).map(|i| 7.5 - (i % 50) as f32 * 0.25).collect();
    let z: Vec<f32> = (0..N).map(|i| (i % 13) as f32 * 0.0625 - 1.5).collect();
    let intensity: Vec<f32> = (0..N).map(|i| (i % 256) as f32).collect();
    Points {
        x,
        y,
        z,
        intensity,
        has_intensity: true,
        ring: None,
        time: None,
    }
}

#[test]
fn pointcloud2_round_trip_through_rclpy_peer() {
    // Names no parallel run shares (same ROS_DOMAIN_ID or not).
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let tag = format!("{}_{}", std::process::id(), nanos);
    let topic_out = format!("/sptr_smoke_{tag}/cloud");
    let topic_back = format!("/sptr_smoke_{tag}/echo");
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));

    // Before any ROS context exists, in this process and (inherited) in the peer. The only test
    // in this binary, so no other thread reads the environment meanwhile.
    if std::env::var_os("ROS_LOG_DIR").is_none() {
        std::env::set_var("ROS_LOG_DIR", tmp.join("ros-log"));
    }
    if std::env::var_os("ROS_AUTOMATIC_DISCOVERY_RANGE").is_none() {
        std::env::set_var("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST");
    }

    // --- the rclpy peer ---
    let (py, py_from) = python();
    let script = common::root().join("tests/ros/peer_echo.py");
    let log = tmp.join(format!("peer_echo_{tag}.log"));
    let log_file = File::create(&log).expect("create the peer's log file");
    let child = Command::new(&py)
        .arg(&script)
        .args([
            "--in",
            &topic_out,
            "--out",
            &topic_back,
            "--name",
            &format!("sptr_peer_{tag}"),
        ])
        .stdin(Stdio::piped())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start the rclpy peer {} with {} from {py_from}: {e}\n\
                 (feature `ros` expects a ROS 2 environment: `source scripts/ros_env.sh`)",
                script.display(),
                py.display()
            )
        });
    let mut peer = Peer { child, log };

    // --- the r2r node ---
    let ctx = r2r::Context::create().expect("r2r context");
    let mut node = r2r::Node::create(ctx, &format!("sptr_smoke_{tag}"), "").expect("r2r node");
    let publisher = node
        .create_publisher::<PointCloud2>(&topic_out, r2r::QosProfile::default())
        .expect("publisher");
    let mut replies = node
        .subscribe::<PointCloud2>(&topic_back, r2r::QosProfile::default())
        .expect("subscription");

    let sent_points = test_points();
    let buf = cloud::encode_points(&sent_points, Layout::XyzI32).expect("encode_points");
    let mut header = Header {
        frame_id: "sptr_smoke".into(),
        ..Default::default()
    };
    header.stamp.sec = 1_700_000_000;
    header.stamp.nanosec = 123_456_789;
    let msg = sptr::ros::to_msg(buf, header);

    // Discovery takes a moment and the first messages may go nowhere: publish every 100 ms
    // until the answer comes.
    let start = Instant::now();
    let mut last_publish: Option<Instant> = None;
    let mut published = 0u32;
    let reply = loop {
        if let Some(status) = peer.child.try_wait().expect("try_wait on the peer") {
            panic!(
                "the rclpy peer ({} from {py_from}) exited early ({status}); its output:\n{}",
                py.display(),
                peer.log_text()
            );
        }
        if start.elapsed() > TIMEOUT {
            panic!(
                "no reply on {topic_back} within {TIMEOUT:?} after publishing {published} clouds \
                 on {topic_out} (DDS discovery failed? ROS_DOMAIN_ID={:?}, \
                 ROS_AUTOMATIC_DISCOVERY_RANGE={:?}); the peer's output:\n{}",
                std::env::var("ROS_DOMAIN_ID").ok(),
                std::env::var("ROS_AUTOMATIC_DISCOVERY_RANGE").ok(),
                peer.log_text()
            );
        }
        if last_publish.map_or(true, |t| t.elapsed() >= REPUBLISH) {
            publisher.publish(&msg).expect("publish");
            published += 1;
            last_publish = Some(Instant::now());
        }
        node.spin_once(Duration::from_millis(20));
        match replies.next().now_or_never() {
            Some(Some(m)) => break m,
            Some(None) => panic!("the r2r subscription stream ended"),
            None => {}
        }
    };
    eprintln!(
        "ros_smoke: reply after {:?} and {published} publications",
        start.elapsed()
    );

    // --- the reply, as the peer built it ---
    assert_eq!(reply.header.frame_id, "sptr_smoke_echo");
    assert_eq!(
        (reply.header.stamp.sec, reply.header.stamp.nanosec),
        (1_700_000_000, 123_456_789)
    );
    let names: Vec<&str> = reply.fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["intensity", "ring", "z", "y", "x", "idx"]);
    assert_eq!(
        (reply.height, reply.width, reply.point_step),
        (1, N as u32, 24)
    );

    // --- decoded with the codec ---
    let (got, report) = sptr::ros::decode(&reply).expect("decode the peer's cloud");
    assert_eq!(
        (report.total, report.kept, report.dropped_non_finite),
        (N, N, 0)
    );
    assert!(got.has_intensity);
    assert!(got.time.is_none());
    let ring = got
        .ring
        .as_ref()
        .expect("the peer's ring field decodes into Points::ring");
    let idx_field = reply.fields.iter().find(|f| f.name == "idx").unwrap();
    assert_eq!(ring.len(), N);
    for (i, &r) in ring.iter().enumerate() {
        let s = &sent_points;
        let ctx = |what: &str| format!("point {i}: {what}");
        assert_eq!(got.x[i].to_bits(), s.x[i].to_bits(), "{}", ctx("x"));
        assert_eq!(got.y[i].to_bits(), s.y[i].to_bits(), "{}", ctx("y"));
        assert_eq!(
            got.z[i].to_bits(),
            (s.z[i] + 1.0).to_bits(),
            "{}",
            ctx("z + 1")
        );
        assert_eq!(
            got.intensity[i].to_bits(),
            (s.intensity[i] * 2.0).to_bits(),
            "{}",
            ctx("intensity × 2")
        );
        assert_eq!(r, (i % 32) as u16, "{}", ctx("ring"));
        // The field the codec ignores, read by hand: the peer kept the point order.
        let at = i * reply.point_step as usize + idx_field.offset as usize;
        let idx = u32::from_le_bytes(reply.data[at..at + 4].try_into().unwrap());
        assert_eq!(idx, i as u32, "{}", ctx("idx"));
    }

    // The peer exits cleanly when its stdin closes.
    drop(peer.child.stdin.take());
    let until = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = peer.child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > until {
            break None;
        }
        node.spin_once(Duration::from_millis(20));
    };
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("the peer exited with {s}; its output:\n{}", peer.log_text()),
        None => panic!("the peer did not exit within 10 s of its stdin closing"),
    }
}
