#!/usr/bin/env python3
"""rclpy peer for tests/ros_node.rs: drives a running perception_node over DDS.

The node runs in namespace --ns (so its private topics are <ns>/sptr/...). Scenarios:

  valid      publish the nuScenes cloud (--cloud, float32 x 5 columns; x, y, z, intensity are
             sent) until ~/debug/voxels and ~/debug/processing_time_ms arrive; check the voxel
             count is --expect-voxels.
  malformed  after a first valid cloud, publish each bad cloud (truncated data, point_step 0,
             missing z, NaN-only, empty, more points than voxelization.max_points), wait until
             /diagnostics counts its reject under the expected reason, then publish a valid
             cloud and wait for its voxel count: the node must keep processing.
  burst      after a first valid cloud, publish 20 valid clouds 2 ms apart (again, up to 8
             bursts, while none was skipped: see scenario_burst); wait until /diagnostics
             settles and check skipped > 0 and processed + skipped + rejected == received.

Every wait is bounded (--timeout seconds per step); a failure prints FAIL: <why> and exits 1.
Lines "RESULT key=value" report what was observed. Exits 0 on success.
"""

import argparse
import array
import sys
import time

import numpy as np
import rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, HistoryPolicy
from diagnostic_msgs.msg import DiagnosticArray
from sensor_msgs.msg import PointCloud2, PointField
from std_msgs.msg import Float64, UInt32

F32 = PointField.FLOAT32


def fields_xyzi():
    return [PointField(name=n, offset=4 * i, datatype=F32, count=1) for i, n in enumerate(("x", "y", "z", "intensity"))]


def cloud(fields, point_step, width, data, height=1, row_step=None, frame="lidar_top"):
    m = PointCloud2()
    m.header.frame_id = frame
    t = time.time()
    m.header.stamp.sec = int(t)
    m.header.stamp.nanosec = int((t - int(t)) * 1e9)
    m.height = height
    m.width = width
    m.fields = fields
    m.is_bigendian = False
    m.point_step = point_step
    m.row_step = point_step * width if row_step is None else row_step
    m.data = array.array("B", data)
    m.is_dense = False
    return m


def valid_cloud(path):
    raw = np.fromfile(path, dtype="<f4").reshape(-1, 5)
    xyzi = np.ascontiguousarray(raw[:, :4])
    return cloud(fields_xyzi(), 16, xyzi.shape[0], xyzi.tobytes())


def bad_clouds(good):
    """(name, expected reject reason, message)"""
    n = good.width
    data = bytes(good.data)
    nan = np.full((100, 4), np.nan, dtype="<f4")
    nan[:, 3] = 1.0
    xyi = [PointField(name="x", offset=0, datatype=F32, count=1),
           PointField(name="y", offset=4, datatype=F32, count=1),
           PointField(name="intensity", offset=8, datatype=F32, count=1)]
    return [
        ("truncated", "malformed", cloud(fields_xyzi(), 16, n, data[: len(data) // 2])),
        ("point_step_0", "malformed", cloud(fields_xyzi(), 0, n, data, row_step=16 * n)),
        ("missing_z", "malformed", cloud(xyi, 12, 100, bytes(1200))),
        ("nan_only", "no_finite_points", cloud(fields_xyzi(), 16, 100, nan.tobytes())),
        ("empty", "empty", cloud(fields_xyzi(), 16, 0, b"")),
        # Declares 4,000,001 points (over the nuScenes model's max_points 4,000,000): rejected
        # from its header, before decoding.
        ("too_many_points", "too_many_points", cloud(fields_xyzi(), 16, 4_000_001, bytes(16))),
    ]


class Peer(Node):
    def __init__(self, ns, timeout, input_topic=None):
        super().__init__("sptr_node_peer_" + ns.strip("/").replace("/", "_"))
        self.ns = ns.rstrip("/")
        self.timeout = timeout
        base = f"{self.ns}/sptr"
        qos = QoSProfile(depth=25, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        self.input_topic = input_topic or f"{base}/input/points"
        self.pub = self.create_publisher(PointCloud2, self.input_topic, qos)
        self.voxels = []
        self.proc_ms = []
        self.stage = {"decode": [], "voxelize": []}
        self.diag = None
        self.diag_count = 0
        self.create_subscription(UInt32, f"{base}/debug/voxels", lambda m: self.voxels.append(m.data), 100)
        self.create_subscription(Float64, f"{base}/debug/processing_time_ms", lambda m: self.proc_ms.append(m.data), 100)
        for s in self.stage:
            self.create_subscription(Float64, f"{base}/debug/stage_ms/{s}", lambda m, s=s: self.stage[s].append(m.data), 100)
        self.diag_name = f"{base}: perception"
        self.create_subscription(DiagnosticArray, "/diagnostics", self.on_diag, 10)

    def on_diag(self, msg):
        for st in msg.status:
            if st.name == self.diag_name:
                self.diag = {kv.key: kv.value for kv in st.values}
                self.diag["_level"] = int.from_bytes(st.level, "little") if isinstance(st.level, bytes) else int(st.level)
                self.diag["_message"] = st.message
                self.diag_count += 1

    def spin_until(self, cond, what, republish=None, period=0.25):
        deadline = time.monotonic() + self.timeout
        last = 0.0
        while time.monotonic() < deadline:
            if cond():
                return
            if republish is not None and time.monotonic() - last >= period:
                self.pub.publish(republish)
                last = time.monotonic()
            rclpy.spin_once(self, timeout_sec=0.02)
        fail(f"timed out after {self.timeout} s waiting for {what} (last diagnostics: {self.diag})")

    def wait_connected(self):
        self.spin_until(lambda: self.pub.get_subscription_count() > 0,
                        f"the node's subscription on {self.input_topic}")

    def process_valid(self, good, expect):
        """Publishes `good` until a new voxel count arrives; checks it."""
        before = len(self.voxels)
        self.spin_until(lambda: len(self.voxels) > before, "~/debug/voxels after a valid cloud", republish=good)
        got = self.voxels[-1]
        if expect is not None and got != expect:
            fail(f"voxel count {got}, expected {expect}")
        return got

    def diag_int(self, key):
        if self.diag is None:
            return None
        return int(self.diag[key])

    def next_diag(self):
        """Waits for a /diagnostics message newer than the current one."""
        n = self.diag_count
        self.spin_until(lambda: self.diag_count > n, "a /diagnostics message of the node")
        return self.diag


def fail(why):
    print(f"FAIL: {why}", flush=True)
    sys.exit(1)


def scenario_valid(p, good, expect, level=None):
    got = p.process_valid(good, expect)
    p.spin_until(lambda: len(p.proc_ms) > 0 and all(p.stage.values()), "~/debug/processing_time_ms and stage times")
    print(f"RESULT voxels={got}", flush=True)
    print(f"RESULT processing_ms={p.proc_ms[-1]:.2f} decode_ms={p.stage['decode'][-1]:.2f} "
          f"voxelize_ms={p.stage['voxelize'][-1]:.2f}", flush=True)
    d = p.next_diag()
    for key in ("received", "processed", "skipped", "rejected", "last processing ms", "input age ms",
                "device", "model config"):
        if key not in d:
            fail(f"/diagnostics has no `{key}` value: {d}")
    if d["device"] != "cpu":
        fail(f"/diagnostics device is {d['device']!r}, expected 'cpu'")
    if not d["model config"].endswith("sphereformer_nuscenes.yaml"):
        fail(f"/diagnostics model config is {d['model config']!r}")
    if int(d["processed"]) < 1:
        fail(f"/diagnostics processed {d['processed']} after a processed cloud")
    if level is not None and d["_level"] != level:
        fail(f"/diagnostics level {d['_level']} ({d['_message']!r}), expected {level}: {d}")
    print(f"RESULT diag_level={d['_level']} processed={d['processed']} "
          f"over_voxel_cap={d['frames over voxel cap']} message={d['_message']!r}", flush=True)


def scenario_malformed(p, good, expect, level=None):
    p.process_valid(good, expect)
    p.next_diag()
    for name, reason, bad in bad_clouds(good):
        key = f"rejected.{reason}"
        before = p.diag_int(key)
        # Republished each second until counted (the node may still be busy, and a newer frame
        # replaces a waiting one).
        p.spin_until(lambda: p.diag_int(key) > before, f"/diagnostics {key} to count the {name} cloud",
                     republish=bad, period=1.0)
        got = p.process_valid(good, expect)
        print(f"RESULT {name}: {key}={p.diag_int(key)}, then a valid cloud gave {got} voxels", flush=True)
    d = p.next_diag()
    print(f"RESULT rejected={d['rejected']} received={d['received']} processed={d['processed']} "
          f"skipped={d['skipped']}", flush=True)


def scenario_burst(p, good, expect, level=None):
    p.process_valid(good, expect)
    # A 555 kB cloud is larger than Fast DDS's default shared-memory segment, so it goes over
    # UDP, and a best-effort subscription loses some of a burst when the machine is loaded: a
    # burst whose clouds all got lost proves nothing, so burst again (at most 8 times) until
    # the node has skipped frames. Clouds 2 ms apart: faster than the node processes them.
    for attempt in range(8):
        for _ in range(20):
            p.pub.publish(good)
            rclpy.spin_once(p, timeout_sec=0.002)
        p.next_diag()
        d = p.next_diag()
        print(f"RESULT burst {attempt + 1}: received={d['received']} skipped={d['skipped']}", flush=True)
        if int(d["skipped"]) > 0:
            break
    # Settled: the node has processed, skipped or rejected every frame it received, in two
    # consecutive reports.
    settled = []

    def check():
        d = p.diag
        if d is None:
            return False
        done = int(d["processed"]) + int(d["skipped"]) + int(d["rejected"])
        key = (d["received"], done)
        ok = done == int(d["received"])
        if ok and settled and settled[-1] == key and p.diag_count > settled_at[0]:
            return True
        if ok and (not settled or settled[-1] != key):
            settled.append(key)
            settled_at[0] = p.diag_count
        return False

    settled_at = [0]
    p.spin_until(check, "/diagnostics to settle with processed + skipped + rejected == received")
    d = p.diag
    print(f"RESULT received={d['received']} processed={d['processed']} skipped={d['skipped']} "
          f"rejected={d['rejected']}", flush=True)
    if int(d["skipped"]) <= 0:
        fail(f"a burst of 20 clouds skipped none: {d}")
    if int(d["rejected"]) != 0:
        fail(f"valid clouds were rejected: {d}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", required=True)
    ap.add_argument("--scenario", required=True, choices=["valid", "malformed", "burst"])
    ap.add_argument("--cloud", required=True)
    ap.add_argument("--expect-voxels", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--input", default=None, help="the node's input topic (default <ns>/sptr/input/points)")
    ap.add_argument("--expect-level", type=int, default=None,
                    help="valid: the diagnostics level expected after the cloud (0 OK, 1 WARN, 2 ERROR)")
    args = ap.parse_args()

    rclpy.init(args=None)
    p = Peer(args.ns, args.timeout, args.input)
    good = valid_cloud(args.cloud)
    print(f"node_peer: {args.scenario} against {args.ns}/sptr, cloud of {good.width} points", flush=True)
    try:
        p.wait_connected()
        {"valid": scenario_valid, "malformed": scenario_malformed, "burst": scenario_burst}[args.scenario](
            p, good, args.expect_voxels, args.expect_level)
        print("node_peer: OK", flush=True)
    finally:
        p.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()


if __name__ == "__main__":
    main()
