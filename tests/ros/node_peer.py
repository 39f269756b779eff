#!/usr/bin/env python3
"""rclpy peer for tests/ros_node.rs: drives a running perception_node over DDS.

The node runs in namespace --ns (so its private topics are <ns>/sptr/...). Scenarios:

  valid      publish the nuScenes cloud (--cloud, float32 x 5 columns; x, y, z, intensity are
             sent) until its outputs arrive: the labeled cloud (fields, point count, frame, stamp,
             class ids and probabilities), the three BEV grids (--grid W H, --bev-frame), the
             voxel count (--expect-voxels) and the debug times; then check /diagnostics.
             --dump-labels writes the class ids and probabilities it got.
  robust     a valid cloud, then each bad or unusual cloud below, each followed by a valid cloud
             whose outputs (matched by stamp) must arrive every time:
               truncated, point_step_0, missing_z  -> rejected.malformed
               empty                                -> rejected.empty
               nan_only                             -> rejected.no_finite_points
               too_many_points (declared 4,000,001) -> rejected.too_many_points
               nan_mixed (NaN coordinates, NaN/Inf intensities)
                                                    -> processed: only the finite points come back,
                                                       diagnostics count the others
               two_million (2,000,000 points)       -> processed: 2,000,000 labeled points
               over_voxel_cap (the cloud + a shifted copy, more voxels than --voxel-cap)
                                                    -> processed with the cap: points of dropped
                                                       voxels come back with class_id 255
             /diagnostics must count each reject under its reason.
  burst      after a first valid cloud, publish 20 valid clouds 2 ms apart (again, up to 8
             bursts, while none was skipped: see scenario_burst); wait until /diagnostics
             settles and check skipped > 0 and processed + skipped + rejected == received.
  cameras    the camera branch (the node runs with the six nuScenes cameras and the sample
             calibration file): six CompressedImages (--camera-dir's JPEGs) and CameraInfos
             (calib.json's K) stamped like each cloud; every camera used; then CAM_BACK stale
             (masked, counted, WARN naming it); then a truncated JPEG, a non-image and a
             CameraInfo with zero intrinsics (logged, counted, masked; the LiDAR outputs still
             come); then all six used again. Checked on /diagnostics' camera values.
             With --calibration tf (the node has no calibration file): the six camera extrinsics
             on /tf_static instead (transient local, as tf2's static broadcaster; base_link ->
             lidar_top and base_link -> cam_* from calib.json), a first frame with every camera
             used and calibrated from TF and its BEV map topics; then a changed /tf_static
             (CAM_FRONT turned 90 degrees about base_link's z): the next frame's map differs and
             /diagnostics count the calibration change.
             With --faults: a stamp collision, a patched JPEG and a distorted CameraInfo, each
             followed by good frames whose map must be the first good frame's (camera_faults).
  rig        a rig other than nuScenes' (--rig: a JSON of its cameras, each with its JPEG, K and
             image size; the node runs with the rig's cameras and calibration file): one
             CompressedImage and CameraInfo per camera stamped like each cloud, the cloud on
             --input in frame `lidar`; every camera used and calibrated from the file, and the
             BEV map topics with the cloud's stamp.
  topics     the outputs a viewer layout shows (--topics-file: a JSON list of {"topic", "type"},
             type sensor_msgs/msg/PointCloud2, sensor_msgs/msg/Image or nav_msgs/msg/OccupancyGrid):
             one subscription per topic with its type; frames as in `cameras` (the six nuScenes
             cameras with --camera-dir, a slice of the cloud) until every topic has delivered a
             message, at most three frames. A topic the node does not publish, or publishes with
             another type (the subscription never matches), fails the step's --timeout.
  bench      publish the cloud --frames times, one at a time (the next once the previous one's
             labeled cloud is back), and print receipt-to-publication latency percentiles from
             the node's ~/debug/latency_ms, and the round trip seen by the peer, as JSON.

Every wait is bounded (--timeout seconds per step); a failure prints FAIL: <why> and exits 1.
Lines "RESULT key=value" report what was observed. Exits 0 on success.
"""

import argparse
import copy
import array
import json
import sys
import time

import numpy as np
import rclpy
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy, HistoryPolicy
from diagnostic_msgs.msg import DiagnosticArray
from nav_msgs.msg import OccupancyGrid
from sensor_msgs.msg import CameraInfo, CompressedImage, Image, PointCloud2, PointField
from std_msgs.msg import Float64, UInt32

F32 = PointField.FLOAT32
U8 = PointField.UINT8
STAGES = ("decode", "voxelize", "network", "devoxelize", "bev", "encode")
LABELED_FIELDS = [("x", 0, F32), ("y", 4, F32), ("z", 8, F32), ("intensity", 12, F32),
                  ("class_id", 16, U8), ("probability", 17, F32)]
LABELED_DTYPE = np.dtype([("x", "<f4"), ("y", "<f4"), ("z", "<f4"), ("intensity", "<f4"),
                          ("class_id", "u1"), ("probability", "<f4")])
NO_CLASS = 255

_stamp_seq = [0]


def fields_xyzi():
    return [PointField(name=n, offset=4 * i, datatype=F32, count=1) for i, n in enumerate(("x", "y", "z", "intensity"))]


def cloud(fields, point_step, width, data, height=1, row_step=None, frame="lidar_top"):
    """A PointCloud2 with a stamp no other cloud of this peer has (outputs are matched by it)."""
    m = PointCloud2()
    m.header.frame_id = frame
    t = time.time()
    _stamp_seq[0] += 1
    m.header.stamp.sec = int(t)
    m.header.stamp.nanosec = (int((t - int(t)) * 1e9) // 1000) * 1000 + _stamp_seq[0] % 1000
    m.height = height
    m.width = width
    m.fields = fields
    m.is_bigendian = False
    m.point_step = point_step
    m.row_step = point_step * width if row_step is None else row_step
    m.data = array.array("B", data)
    m.is_dense = False
    return m


# BEVFusion's nuScenes map classes, in the seg head's order (the node's ~/output/bev/map/<class>).
MAP_CLASSES = ["drivable_area", "ped_crossing", "walkway", "stop_line", "carpark_area", "divider"]


def stamp_of(msg):
    return (msg.header.stamp.sec, msg.header.stamp.nanosec)


def load_xyzi(path):
    raw = np.fromfile(path, dtype="<f4").reshape(-1, 5)
    return np.ascontiguousarray(raw[:, :4])


def xyzi_cloud(xyzi):
    return cloud(fields_xyzi(), 16, xyzi.shape[0], np.ascontiguousarray(xyzi, dtype="<f4").tobytes())


def malformed_clouds(good):
    """(name, expected reject reason, message) of the clouds the node must reject."""
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
        ("empty", "empty", cloud(fields_xyzi(), 16, 0, b"")),
        ("nan_only", "no_finite_points", cloud(fields_xyzi(), 16, 100, nan.tobytes())),
        # Declares 4,000,001 points (over the nuScenes model's max_points 4,000,000): rejected
        # from its header, before decoding.
        ("too_many_points", "too_many_points", cloud(fields_xyzi(), 16, 4_000_001, bytes(16))),
    ]


class Peer(Node):
    def __init__(self, args):
        ns = args.ns
        super().__init__("sptr_node_peer_" + ns.strip("/").replace("/", "_"))
        self.ns = ns.rstrip("/")
        self.timeout = args.timeout
        base = f"{self.ns}/sptr"
        self.base = base
        qos = QoSProfile(depth=5, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        self.input_topic = args.input or f"{base}/input/points"
        self.pub = self.create_publisher(PointCloud2, self.input_topic, qos)
        self.voxels = []
        self.proc_ms = []
        self.latency_ms = []
        self.stage = {s: [] for s in STAGES}
        self.diag = None
        self.diag_count = 0
        # Outputs by stamp: {(sec, nanosec): {"points": msg, "labels": msg, ...}}
        self.outputs = {}
        self.out_topics = {
            "points": resolve(base, args.output_points),
            "labels": resolve(base, args.bev_labels),
            "color": resolve(base, args.bev_labels_color),
            "occupancy": resolve(base, args.bev_occupancy),
        }
        out_qos = QoSProfile(depth=5, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        for key, typ in (("points", PointCloud2), ("labels", Image), ("color", Image), ("occupancy", OccupancyGrid)):
            self.create_subscription(typ, self.out_topics[key], lambda m, k=key: self.on_output(k, m), out_qos)
        self.create_subscription(UInt32, f"{base}/debug/voxels", lambda m: self.voxels.append(m.data), 100)
        self.create_subscription(Float64, f"{base}/debug/processing_time_ms", lambda m: self.proc_ms.append(m.data), 100)
        self.create_subscription(Float64, f"{base}/debug/latency_ms", lambda m: self.latency_ms.append(m.data), 1000)
        for s in self.stage:
            self.create_subscription(Float64, f"{base}/debug/stage_ms/{s}", lambda m, s=s: self.stage[s].append(m.data), 100)
        self.diag_name = f"{base}: perception"
        self.create_subscription(DiagnosticArray, "/diagnostics", self.on_diag, 10)

    def on_output(self, key, msg):
        entry = self.outputs.setdefault(stamp_of(msg), {})
        entry[key] = msg
        entry.setdefault("_t", {})[key] = time.monotonic()

    def on_diag(self, msg):
        for st in msg.status:
            if st.name == self.diag_name:
                self.diag = {kv.key: kv.value for kv in st.values}
                self.diag["_level"] = int.from_bytes(st.level, "little") if isinstance(st.level, bytes) else int(st.level)
                self.diag["_message"] = st.message
                self.diag["_stamp"] = msg.header.stamp.sec + msg.header.stamp.nanosec * 1e-9
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

    def outputs_of(self, msg, what, period=1.0):
        """Publishes `msg` (again every `period` s) until all four outputs with its stamp are in."""
        key = stamp_of(msg)
        four = ("points", "labels", "color", "occupancy")
        self.spin_until(lambda: all(k in self.outputs.get(key, {}) for k in four), f"the four outputs of {what}",
                        republish=msg, period=period)
        out = self.outputs.pop(key)
        return out

    def diag_int(self, key):
        if self.diag is None:
            return None
        return int(self.diag[key])

    def next_diag(self):
        """Waits for a /diagnostics message newer than the current one."""
        n = self.diag_count
        self.spin_until(lambda: self.diag_count > n, "a /diagnostics message of the node")
        return self.diag

    def diag_made_after(self, t):
        """Waits for a /diagnostics message the node made after wall time `t` (its header stamp;
        same machine, same clock). One made after this peer had a frame's outputs must count the
        frame: the node counts a frame before it publishes the frame's outputs, and messages on
        other topics may arrive in any order, so "the next message" would not do."""
        self.spin_until(lambda: self.diag is not None and self.diag["_stamp"] > t,
                        f"a /diagnostics message made after {t:.3f}")
        return self.diag


def resolve(base, name):
    if name.startswith("~/"):
        return f"{base}/{name[2:]}"
    if name.startswith("/"):
        return name
    return f"{base.rsplit('/', 1)[0]}/{name}"


def fail(why):
    print(f"FAIL: {why}", flush=True)
    sys.exit(1)


def check_outputs(p, args, sent, out, expect_points, what):
    """The four outputs of `sent`: layouts, sizes, frames, stamps; returns the labeled points."""
    pc = out["points"]
    got_fields = [(f.name, f.offset, f.datatype) for f in pc.fields]
    if got_fields != LABELED_FIELDS:
        fail(f"{what}: labeled cloud fields {got_fields}, expected {LABELED_FIELDS}")
    if pc.point_step != 21 or pc.height != 1 or pc.row_step != 21 * pc.width or pc.is_bigendian:
        fail(f"{what}: labeled cloud layout point_step {pc.point_step} height {pc.height} row_step {pc.row_step}")
    if pc.width != expect_points:
        fail(f"{what}: labeled cloud has {pc.width} points, expected {expect_points}")
    if pc.header.frame_id != sent.header.frame_id or stamp_of(pc) != stamp_of(sent):
        fail(f"{what}: labeled cloud header {pc.header}, expected the input's {sent.header}")
    pts = np.frombuffer(bytes(pc.data), dtype=LABELED_DTYPE, count=pc.width)
    cls = pts["class_id"]
    prob = pts["probability"]
    labeled = cls != NO_CLASS
    if not np.all(cls[labeled] < args.classes):
        fail(f"{what}: class ids {np.unique(cls)} not below {args.classes} (or {NO_CLASS})")
    if not (np.all(prob[labeled] > 0.0) and np.all(prob <= 1.0) and np.all(prob[~labeled] == 0.0)):
        fail(f"{what}: probabilities out of (0, 1] (or not 0 for class {NO_CLASS})")
    w, h = args.grid
    bev_frame = args.bev_frame or sent.header.frame_id
    for key, enc, step in (("labels", "mono8", w), ("color", "rgb8", 3 * w)):
        im = out[key]
        if (im.width, im.height, im.encoding, im.step, len(im.data)) != (w, h, enc, step, step * h):
            fail(f"{what}: BEV {key} image {im.width} x {im.height} {im.encoding} step {im.step} "
                 f"({len(im.data)} bytes), expected {w} x {h} {enc} step {step}")
        if im.header.frame_id != bev_frame or stamp_of(im) != stamp_of(sent):
            fail(f"{what}: BEV {key} header {im.header}, expected frame {bev_frame!r} and the input's stamp")
    occ = out["occupancy"]
    info = occ.info
    if (info.width, info.height, len(occ.data)) != (w, h, w * h) or abs(info.resolution - args.resolution) > 1e-6:
        fail(f"{what}: occupancy grid {info.width} x {info.height} res {info.resolution}, expected {w} x {h} res {args.resolution}")
    if occ.header.frame_id != bev_frame or stamp_of(occ) != stamp_of(sent):
        fail(f"{what}: occupancy header {occ.header}, expected frame {bev_frame!r} and the input's stamp")
    occ_v = np.array(occ.data, dtype=np.int16)
    lab_v = np.frombuffer(bytes(out["labels"].data), dtype=np.uint8)
    if not np.all((occ_v == -1) | ((occ_v >= 0) & (occ_v <= 100))):
        fail(f"{what}: occupancy values outside -1..100")
    if not np.array_equal(occ_v == -1, lab_v == 255):
        fail(f"{what}: occupancy unknown cells differ from the label image's empty cells")
    if not np.any(lab_v != 255):
        fail(f"{what}: the BEV grid has no labeled cell")
    return pts


def scenario_valid(p, args, xyzi):
    good = xyzi_cloud(xyzi)
    out = p.outputs_of(good, "the nuScenes cloud")
    outputs_in = time.time()
    pts = check_outputs(p, args, good, out, xyzi.shape[0], "nuScenes cloud")
    if not np.array_equal(pts["x"], xyzi[:, 0]) or not np.array_equal(pts["intensity"], xyzi[:, 3]):
        fail("the labeled cloud's x / intensity differ from the input's")
    p.spin_until(lambda: len(p.voxels) > 0 and len(p.proc_ms) > 0 and all(p.stage.values()),
                 "~/debug/voxels, ~/debug/processing_time_ms and the stage times")
    if args.expect_voxels is not None and p.voxels[-1] != args.expect_voxels:
        fail(f"voxel count {p.voxels[-1]}, expected {args.expect_voxels}")
    if args.dump_labels:
        with open(args.dump_labels, "wb") as f:
            f.write(np.ascontiguousarray(pts["class_id"]).tobytes())
            f.write(np.ascontiguousarray(pts["probability"], dtype="<f4").tobytes())
    labeled = int(np.sum(pts["class_id"] != NO_CLASS))
    print(f"RESULT voxels={p.voxels[-1]}", flush=True)
    print(f"RESULT points={pc_width(out)} labeled={labeled} grid={out['labels'].width}x{out['labels'].height} "
          f"bev_frame={out['labels'].header.frame_id}", flush=True)
    print("RESULT processing_ms=%.2f %s" % (p.proc_ms[-1], " ".join(f"{s}_ms={p.stage[s][-1]:.2f}" for s in STAGES)), flush=True)
    d = p.diag_made_after(outputs_in)
    for key in ("received", "processed", "skipped", "rejected", "last processing ms", "input age ms",
                "device", "model config", "weights"):
        if key not in d:
            fail(f"/diagnostics has no `{key}` value: {d}")
    if d["device"] != "cpu":
        fail(f"/diagnostics device is {d['device']!r}, expected 'cpu'")
    if int(d["processed"]) < 1:
        fail(f"/diagnostics processed {d['processed']} after a processed cloud")
    if args.expect_level is not None and d["_level"] != args.expect_level:
        fail(f"/diagnostics level {d['_level']} ({d['_message']!r}), expected {args.expect_level}: {d}")
    print(f"RESULT diag_level={d['_level']} processed={d['processed']} "
          f"over_voxel_cap={d['frames over voxel cap']} message={d['_message']!r}", flush=True)


def pc_width(out):
    return out["points"].width


def scenario_robust(p, args, xyzi):
    n = xyzi.shape[0]

    def good_again(after):
        good = xyzi_cloud(xyzi)
        out = p.outputs_of(good, f"the valid cloud after {after}")
        check_outputs(p, args, good, out, n, f"valid cloud after {after}")

    good_again("start")
    p.next_diag()
    good = xyzi_cloud(xyzi)
    for name, reason, bad in malformed_clouds(good):
        key = f"rejected.{reason}"
        before = p.diag_int(key)
        # Republished each second until counted (the node may still be busy, and a newer frame
        # replaces a waiting one).
        p.spin_until(lambda: p.diag_int(key) > before, f"/diagnostics {key} to count the {name} cloud",
                     republish=bad, period=1.0)
        good_again(name)
        print(f"RESULT {name}: {key}={p.diag_int(key)}, then the valid cloud's outputs", flush=True)

    # Processed, with fewer or more points. NaN y on every 4th point, NaN or Inf intensity (read
    # by the network) on every 7th: both dropped, the rest come back in order.
    mixed = xyzi.copy()
    mixed[::4, 1] = np.nan
    mixed[1::14, 3] = np.nan
    mixed[8::14, 3] = np.inf
    keep = np.isfinite(mixed).all(axis=1)
    finite = int(np.sum(keep))
    out = p.outputs_of(msg := xyzi_cloud(mixed), "the cloud with NaN coordinates and intensities")
    pts = check_outputs(p, args, msg, out, finite, "cloud with NaN coordinates and intensities")
    if not np.array_equal(pts["x"], mixed[keep, 0]) or not np.array_equal(pts["intensity"], mixed[keep, 3]):
        fail("the cloud with NaN coordinates and intensities: the points back are not its finite points in order")
    p.spin_until(lambda: p.diag is not None and p.diag.get("last points dropped") == str(n - finite),
                 f"/diagnostics last points dropped = {n - finite}")
    good_again("nan_mixed")
    print(f"RESULT nan_mixed: {finite} of {n} points back (last points dropped {n - finite}), "
          "then the valid cloud's outputs", flush=True)

    reps = -(-2_000_000 // n)
    big = np.ascontiguousarray(np.tile(xyzi, (reps, 1))[:2_000_000])
    out = p.outputs_of(msg := xyzi_cloud(big), "the 2,000,000-point cloud", period=3.0)
    check_outputs(p, args, msg, out, 2_000_000, "2,000,000-point cloud")
    del big, msg, out
    good_again("two_million")
    print("RESULT two_million: 2000000 labeled points back, then the valid cloud's outputs", flush=True)

    before = p.diag_int("frames over voxel cap")
    shifted = xyzi.copy()
    shifted[:, :3] += np.float32(0.05)
    over = np.concatenate([xyzi, shifted])
    out = p.outputs_of(msg := xyzi_cloud(over), "the cloud over the voxel cap")
    pts = check_outputs(p, args, msg, out, over.shape[0], "cloud over the voxel cap")
    dropped = int(np.sum(pts["class_id"] == NO_CLASS))
    if dropped == 0:
        fail("a cloud over voxelization.max_voxels came back with every point labeled")
    p.spin_until(lambda: p.diag_int("frames over voxel cap") > before, "/diagnostics to count the frame over the voxel cap")
    good_again("over_voxel_cap")
    print(f"RESULT over_voxel_cap: {dropped} of {over.shape[0]} points in dropped voxels (class_id 255), "
          f"frames over voxel cap {p.diag_int('frames over voxel cap')}, then the valid cloud's outputs", flush=True)

    d = p.next_diag()
    print(f"RESULT rejected={d['rejected']} received={d['received']} processed={d['processed']} "
          f"skipped={d['skipped']} " + " ".join(f"{k}={v}" for k, v in d.items() if k.startswith("rejected.")), flush=True)
    if int(d["rejected"]) < 6:
        fail(f"/diagnostics counts {d['rejected']} rejects, expected at least 6")


def scenario_burst(p, args, xyzi):
    good = xyzi_cloud(xyzi)
    p.outputs_of(good, "the first cloud")
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
    settled_at = [0]

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

    p.spin_until(check, "/diagnostics to settle with processed + skipped + rejected == received")
    d = p.diag
    print(f"RESULT received={d['received']} processed={d['processed']} skipped={d['skipped']} "
          f"rejected={d['rejected']}", flush=True)
    if int(d["skipped"]) <= 0:
        fail(f"a burst of 20 clouds skipped none: {d}")
    if int(d["rejected"]) != 0:
        fail(f"valid clouds were rejected: {d}")


def percentiles(v):
    v = sorted(v)
    if not v:
        return None
    rank = lambda q: v[min(len(v), max(1, int(np.ceil(q * len(v))))) - 1]  # noqa: E731
    return {"n": len(v), "mean_ms": round(float(np.mean(v)), 3), "p50_ms": round(rank(0.5), 3),
            "p90_ms": round(rank(0.9), 3), "p99_ms": round(rank(0.99), 3), "max_ms": round(v[-1], 3)}


def scenario_bench(p, args, xyzi):
    """One frame at a time: the node's receipt-to-publication latency without queueing."""
    for _ in range(args.warmup):
        p.outputs_of(xyzi_cloud(xyzi), "a warm-up cloud")
    p.latency_ms.clear()
    p.proc_ms.clear()
    round_trip = []
    for i in range(args.frames):
        msg = xyzi_cloud(xyzi)
        t0 = time.monotonic()
        out = p.outputs_of(msg, f"frame {i + 1} of the benchmark", period=60.0)
        round_trip.append((out["_t"]["points"] - t0) * 1e3)
    p.spin_until(lambda: len(p.latency_ms) >= args.frames, "the node's latency of every frame")
    result = {"bench": "node", "device": p.diag["device"] if p.diag else None, "points": int(xyzi.shape[0]),
              "frames": args.frames, "voxels": p.voxels[-1] if p.voxels else None,
              "receipt_to_publication": percentiles(p.latency_ms[-args.frames:]),
              "processing": percentiles(p.proc_ms[-args.frames:]),
              "peer_round_trip": percentiles(round_trip)}
    print("BENCH " + json.dumps(result), flush=True)


NUSCENES_CAMERAS = ("CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT")


def camera_messages(camera_dir):
    """Per nuScenes camera: its JPEG bytes and a CameraInfo (K = calib.json's cam2img, P = [K | 0])."""
    import glob
    import os
    with open(os.path.join(camera_dir, "calib.json")) as f:
        calib = json.load(f)
    out = {}
    for cam in NUSCENES_CAMERAS:
        (jpg,) = glob.glob(os.path.join(camera_dir, f"*__{cam}__*.jpg"))
        with open(jpg, "rb") as f:
            data = f.read()
        k = calib["cameras"][cam]["cam2img"]
        info = CameraInfo()
        info.header.frame_id = cam.lower()
        info.width, info.height = 1600, 900
        info.distortion_model = "plumb_bob"
        info.d = [0.0] * 5
        info.k = [float(v) for row in k for v in row]
        info.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        info.p = [float(k[0][0]), 0.0, float(k[0][2]), 0.0, 0.0, float(k[1][1]), float(k[1][2]), 0.0, 0.0, 0.0, 1.0, 0.0]
        out[cam] = (data, info)
    return out


def quaternion(r):
    """A rotation matrix (3 x 3) as a unit quaternion (x, y, z, w), Shepperd's method."""
    tr = r[0, 0] + r[1, 1] + r[2, 2]
    if tr > max(r[0, 0], r[1, 1], r[2, 2]):
        s = np.sqrt(1.0 + tr) * 2.0
        q = ((r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s, s / 4.0)
    elif r[0, 0] >= r[1, 1] and r[0, 0] >= r[2, 2]:
        s = np.sqrt(1.0 + r[0, 0] - r[1, 1] - r[2, 2]) * 2.0
        q = (s / 4.0, (r[0, 1] + r[1, 0]) / s, (r[0, 2] + r[2, 0]) / s, (r[2, 1] - r[1, 2]) / s)
    elif r[1, 1] >= r[2, 2]:
        s = np.sqrt(1.0 + r[1, 1] - r[0, 0] - r[2, 2]) * 2.0
        q = ((r[0, 1] + r[1, 0]) / s, s / 4.0, (r[1, 2] + r[2, 1]) / s, (r[0, 2] - r[2, 0]) / s)
    else:
        s = np.sqrt(1.0 + r[2, 2] - r[0, 0] - r[1, 1]) * 2.0
        q = ((r[0, 2] + r[2, 0]) / s, (r[1, 2] + r[2, 1]) / s, s / 4.0, (r[1, 0] - r[0, 1]) / s)
    return [float(v) for v in q]


def rig_tf(camera_dir, turn_front=False):
    """The nuScenes sample rig as a /tf_static message: base_link -> lidar_top (calib.json's
    lidar2ego) and base_link -> cam_<name> (lidar2ego . inverse(lidar2cam): the chain camera ->
    base_link -> lidar_top gives the frame's lidar2cam back). turn_front: CAM_FRONT turned 90
    degrees about base_link's z (a changed calibration)."""
    import os
    from geometry_msgs.msg import TransformStamped
    from tf2_msgs.msg import TFMessage
    with open(os.path.join(camera_dir, "calib.json")) as f:
        calib = json.load(f)
    l2e = np.array(calib["lidar"]["lidar2ego"], dtype=np.float64)
    edges = [("lidar_top", l2e)]
    for cam in NUSCENES_CAMERAS:
        c2e = l2e @ np.linalg.inv(np.array(calib["cameras"][cam]["lidar2cam"], dtype=np.float64))
        if turn_front and cam == "CAM_FRONT":
            rz = np.array([[0.0, -1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
            c2e = rz @ c2e
        edges.append((cam.lower(), c2e))
    msg = TFMessage()
    now = time.time()
    for child, m in edges:
        t = TransformStamped()
        t.header.stamp.sec = int(now)
        t.header.stamp.nanosec = int((now - int(now)) * 1e9)
        t.header.frame_id = "base_link"
        t.child_frame_id = child
        t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (float(v) for v in m[:3, 3])
        q = quaternion(m[:3, :3])
        t.transform.rotation.x, t.transform.rotation.y, t.transform.rotation.z, t.transform.rotation.w = q
        msg.transforms.append(t)
    return msg


def subscribe_maps(p, maps):
    """Subscribes to every BEV map topic; each message lands in maps[its stamp][topic]. Returns
    the topics (relative to ~/output/bev)."""
    map_topics = [f"map/{c}" for c in MAP_CLASSES] + ["map_bits", "map_color"]
    for t in map_topics:
        kind = OccupancyGrid if t.startswith("map/") else Image
        p.create_subscription(kind, f"{p.base}/output/bev/{t}",
                              lambda m, t=t: maps.setdefault(stamp_of(m), {}).__setitem__(t, m), 10)
    return map_topics


def scenario_cameras(p, args, xyzi):
    # 2,000 points of the cloud: the LiDAR half is not under test here, and a debug build of the
    # node runs it in seconds instead of minutes.
    xyzi = np.ascontiguousarray(xyzi[:2000])
    cams = camera_messages(args.camera_dir)
    qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
    img_pub = {c: p.create_publisher(CompressedImage, f"{p.base}/input/cameras/{c}/image/compressed", qos) for c in cams}
    info_pub = {c: p.create_publisher(CameraInfo, f"{p.base}/input/cameras/{c}/camera_info", qos) for c in cams}
    decode_ms = []
    p.create_subscription(Float64, f"{p.base}/debug/stage_ms/camera_decode", lambda m: decode_ms.append(m.data), 100)
    # the BEV map outputs, by the stamp of the cloud they answer: {stamp: {topic: msg}}
    maps = {}
    map_topics = subscribe_maps(p, maps) if args.map_cells else [f"map/{c}" for c in MAP_CLASSES] + ["map_bits", "map_color"]
    for c in cams:
        p.spin_until(lambda c=c: img_pub[c].get_subscription_count() > 0 and info_pub[c].get_subscription_count() > 0,
                     f"the node's subscriptions of {c}")
    tf_pub = None
    if args.calibration == "tf":
        from tf2_msgs.msg import TFMessage
        # as tf2's StaticTransformBroadcaster: reliable, transient local, the whole set each time
        static_qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST,
                                durability=DurabilityPolicy.TRANSIENT_LOCAL)
        tf_pub = p.create_publisher(TFMessage, args.tf_static_topic, static_qos)
        tf_pub.publish(rig_tf(args.camera_dir))
        p.spin_until(lambda: tf_pub.get_subscription_count() > 0,
                     f"the node's subscription on {args.tf_static_topic} (is tf2_msgs in the node's r2r build?)")

    sent_stamps = {}

    def frame(images, infos, what):
        """Publishes the images (name -> (bytes, format, stamp offset s)) and CameraInfos stamped
        like a new cloud, then the cloud until its LiDAR outputs are back."""
        good = xyzi_cloud(xyzi)
        sec, nsec = stamp_of(good)
        for c, (data, fmt, offset) in images.items():
            m = CompressedImage()
            if isinstance(offset, tuple):  # an absolute stamp (sec, nanosec)
                m.header.stamp.sec, m.header.stamp.nanosec = offset
            else:
                t = sec + nsec * 1e-9 + offset
                m.header.stamp.sec = int(t)
                m.header.stamp.nanosec = int(round((t - int(t)) * 1e9)) % 1_000_000_000
            sent_stamps[c] = (m.header.stamp.sec, m.header.stamp.nanosec)
            m.header.frame_id = c.lower()
            m.format = fmt
            m.data = array.array("B", data)
            img_pub[c].publish(m)
        for c, info in infos.items():
            info_pub[c].publish(info)
        end = time.monotonic() + 0.5  # let them arrive before the cloud
        while time.monotonic() < end:
            rclpy.spin_once(p, timeout_sec=0.02)
        p.outputs_of(good, what)
        return stamp_of(good)

    def expect(status, what):
        """Waits until /diagnostics reports these last-frame statuses for every camera."""
        def ok():
            d = p.diag
            return d is not None and all(d.get(f"camera {c} last frame") == s for c, s in status.items())
        p.spin_until(ok, f"/diagnostics camera statuses {status} after {what}")
        return p.diag

    all_good = {c: (data, "jpeg", -0.01) for c, (data, _) in cams.items()}
    infos = {c: info for c, (_, info) in cams.items()}
    # A warm-up frame first: best-effort samples published before the node's readers have
    # matched the peer's writers are lost (discovery is not symmetric: the peer may see the
    # node's subscriptions first), so the first frame checked must not be the first one sent.
    frame(all_good, infos, "a warm-up cloud with six cameras")
    if tf_pub is not None:
        return cameras_from_tf(p, args, tf_pub, frame, all_good, infos, maps, map_topics)
    if args.faults:
        return camera_faults(p, args, cams, frame, expect, sent_stamps, all_good, infos, maps, map_topics)
    key = frame(all_good, infos, "a cloud with six cameras")
    d = expect({c: "used" for c in cams}, "six good cameras")
    if args.map_cells:
        # every map topic for this cloud: its stamp, the model's grid, the right encodings
        check_maps(p, args, maps, map_topics, key, "the cloud")
        if int(d["bev maps published"]) < 1 or int(d["bev map errors"]) != 0:
            fail(f"the BEV map is not counted as published: {d}")
        print(f"RESULT bev_map={args.map_cells}x{args.map_cells} topics={len(map_topics)}", flush=True)
    for c in cams:
        if not d[f"camera {c} calibration"].startswith("extrinsic from file"):
            fail(f"{c}: calibration {d[f'camera {c} calibration']!r}, expected from the calibration file")
    p.spin_until(lambda: len(decode_ms) > 0, "~/debug/stage_ms/camera_decode")
    print(f"RESULT cameras_used=6 camera_decode_ms={decode_ms[-1]:.2f}", flush=True)

    stale = dict(all_good)
    stale["CAM_BACK"] = (cams["CAM_BACK"][0], "jpeg", -1.0)
    frame(stale, {}, "a cloud with CAM_BACK 1 s old")
    want = {c: "used" for c in cams}
    want["CAM_BACK"] = "stale"
    d = expect(want, "a stale CAM_BACK")
    if int(d["camera CAM_BACK masked.stale"]) < 1 or d["_level"] != 1 or "CAM_BACK (stale)" not in d["_message"]:
        fail(f"a stale CAM_BACK is not counted and reported: {d}")
    print(f"RESULT stale_message={d['_message']!r}", flush=True)

    bad = dict(all_good)
    jpeg = cams["CAM_FRONT"][0]
    bad["CAM_FRONT"] = (jpeg[: len(jpeg) // 3], "jpeg", -0.01)
    bad["CAM_FRONT_RIGHT"] = (b"BM not an image at all", "bmp", -0.01)
    zero = CameraInfo()
    zero.header.frame_id = "cam_back_left"
    zero.width, zero.height = 1600, 900
    zero.k = [0.0] * 9
    zero.r = [0.0] * 9
    zero.p = [0.0] * 12
    frame(bad, {"CAM_BACK_LEFT": zero}, "a cloud with bad camera messages")
    want = {c: "used" for c in cams}
    want["CAM_FRONT"] = "decode_error"
    want["CAM_FRONT_RIGHT"] = "decode_error"
    d = expect(want, "bad camera messages")
    if int(d["camera CAM_BACK_LEFT camera_info errors"]) < 1 or int(d["camera messages dropped"]) < 1:
        fail(f"the zero-intrinsics CameraInfo is not counted: {d}")

    frame(all_good, {}, "six good cameras again")
    d = expect({c: "used" for c in cams}, "six good cameras again")
    print(f"RESULT camera_front_used={d['camera CAM_FRONT used']} decode_errors={d['camera CAM_FRONT masked.decode_error']}", flush=True)


def camera_faults(p, args, cams, frame, expect, sent_stamps, all_good, infos, maps, map_topics):
    """--faults (the node runs with camera.max_camera_lidar_delay large, so that an image stamped
    like an earlier frame's is still in time): each bad input between good frames, the cloud the
    same every frame, so every good frame's map must be the first good frame's.
      1. CAM_FRONT's JPEG cut in half, stamped like the previous good image (a re-stamping
         driver): decode_error, not the previous picture;
      2. CAM_FRONT's JPEG cut at 60 % with an end-of-image marker appended: decode_error;
      3. CAM_FRONT_LEFT's CameraInfo with lens distortion d = [-0.4, 0.2, 0, 0, 0]: distorted,
         its message saying to feed image_rect; then an undistorted CameraInfo brings it back.
    Every frame's BEV map is published (the other cameras make it) and counted."""
    if not args.map_cells:
        fail("--faults needs --map-cells")
    used = {c: "used" for c in cams}

    def step(images, send_infos, want, what):
        n = int(p.diag["bev maps published"]) if p.diag and "bev maps published" in p.diag else 0
        key = frame(images, send_infos, what)
        out = check_maps(p, args, maps, map_topics, key, what)
        p.spin_until(lambda: p.diag is not None and int(p.diag["bev maps published"]) > n,
                     f"/diagnostics to count the BEV map of {what}")
        d = expect(want, what)
        return [bytes(out[t].data) for t in map_topics], d

    good_map, d = step(all_good, infos, used, "six good cameras")
    front, _ = cams["CAM_FRONT"]
    collide = dict(all_good)
    collide["CAM_FRONT"] = (front[: len(front) // 2], "jpeg", sent_stamps["CAM_FRONT"])
    masked = dict(used, CAM_FRONT="decode_error")
    bad_map, d = step(collide, {}, masked, "CAM_FRONT cut in half with the previous image's stamp")
    if bad_map == good_map:
        fail("the frame with CAM_FRONT masked has the good frame's map")
    after, _ = step(all_good, {}, used, "six good cameras after the stamp collision")
    if after != good_map:
        fail("the good frame after the stamp collision has another map than the first good frame")

    patched = dict(all_good)
    patched["CAM_FRONT"] = (front[: len(front) * 6 // 10] + b"\xff\xd9", "jpeg", -0.01)
    patched_map, d = step(patched, {}, masked, "CAM_FRONT cut at 60 % with an end-of-image marker appended")
    if patched_map != bad_map:
        fail("CAM_FRONT masked for a patched JPEG gives another map than CAM_FRONT masked before")
    if int(d["camera CAM_FRONT masked.decode_error"]) != 2:
        fail(f"CAM_FRONT's two bad images are not counted: {d}")
    after, _ = step(all_good, {}, used, "six good cameras after the patched JPEG")
    if after != good_map:
        fail("the good frame after the patched JPEG has another map than the first good frame")

    distorted = copy.deepcopy(infos["CAM_FRONT_LEFT"])
    distorted.d = [-0.4, 0.2, 0.0, 0.0, 0.0]
    _, d = step(all_good, {"CAM_FRONT_LEFT": distorted}, dict(used, CAM_FRONT_LEFT="distorted"),
                "CAM_FRONT_LEFT's CameraInfo with lens distortion")
    problem = d.get("camera CAM_FRONT_LEFT last problem", "")
    if "image_rect" not in problem or int(d["camera CAM_FRONT_LEFT masked.distorted"]) != 1:
        fail(f"the distorted CameraInfo is not counted and explained: {d}")
    after, d = step(all_good, {"CAM_FRONT_LEFT": infos["CAM_FRONT_LEFT"]}, used, "an undistorted CameraInfo again")
    if after != good_map:
        fail("the good frame after the distorted CameraInfo has another map than the first good frame")
    if int(d["bev map errors"]) != 0:
        fail(f"a map failed: {d}")
    print(f"RESULT camera_faults decode_errors={d['camera CAM_FRONT masked.decode_error']} "
          f"distorted={d['camera CAM_FRONT_LEFT masked.distorted']} maps={d['bev maps published']}", flush=True)


def check_maps(p, args, maps, map_topics, key, what):
    """Waits for every BEV map topic of the cloud stamped `key` and checks sizes and encodings
    (each message was filed under its own header stamp: they carry the cloud's)."""
    p.spin_until(lambda: all(t in maps.get(key, {}) for t in map_topics), f"the BEV map topics of {what}")
    n, res = args.map_cells, args.map_resolution
    for t in map_topics:
        m = maps[key][t]
        if t.startswith("map/"):
            i = m.info
            if (i.width, i.height) != (n, n) or abs(i.resolution - res) > 1e-6 or len(m.data) != n * n \
                    or any(v < 0 or v > 100 for v in m.data):
                fail(f"{t}: {i.width} x {i.height} at {i.resolution} m, {len(m.data)} cells; expected {n} x {n} at {res}, 0..100")
        else:
            enc, px = ("mono8", 1) if t == "map_bits" else ("rgb8", 3)
            if (m.encoding, m.width, m.height, m.step, len(m.data)) != (enc, n, n, n * px, n * n * px):
                fail(f"{t}: {m.encoding} {m.width} x {m.height} step {m.step}, {len(m.data)} bytes; expected {enc} {n} x {n}")
    return maps[key]


def cameras_from_tf(p, args, tf_pub, frame, all_good, infos, maps, map_topics):
    """--calibration tf: the extrinsics come from /tf_static only (the node has no calibration
    file). A frame's camera diagnostics are read once /diagnostics count its BEV map (the node
    updates the camera values and that count together, after the map is out)."""
    if not args.map_cells:
        fail("--calibration tf needs --map-cells (the BEV map is what a calibration change changes)")

    def tf_frame(send_infos, what):
        n = int(p.diag["bev maps published"]) if p.diag and "bev maps published" in p.diag else 0
        key = frame(all_good, send_infos, what)
        out = check_maps(p, args, maps, map_topics, key, what)
        p.spin_until(lambda: p.diag is not None and int(p.diag["bev maps published"]) > n,
                     f"/diagnostics to count the BEV map of {what}")
        return key, out, p.diag

    def calibrated_from_tf(d):
        return all(d.get(f"camera {c} last frame") == "used"
                   and d.get(f"camera {c} calibration", "").startswith("extrinsic from tf") for c in NUSCENES_CAMERAS)

    # The /tf_static sample is delivered on matching; should a frame still beat it, the next
    # frame has it (at most three frames). The CameraInfos go with every attempt's images, as a
    # camera driver sends them: best-effort samples published before the node's readers have
    # matched are lost (seen once in CI: the first frame's images and CameraInfos never came).
    for attempt in range(3):
        key, first, d = tf_frame(infos, f"a cloud with six cameras (attempt {attempt + 1})")
        if calibrated_from_tf(d):
            break
    else:
        fail(f"the cameras are not all used and calibrated from TF: {d}")
    if "/tf_static subscribed" not in d["camera tf"] or int(d["bev map errors"]) != 0:
        fail(f"TF or the BEV map not reported as working: {d}")
    print(f"RESULT tf_calibration cameras_used=6 bev_map={args.map_cells}x{args.map_cells} "
          f"topics={len(map_topics)} camera_tf={d['camera tf']!r}", flush=True)

    def cells_changed(a, b):
        return sum(int(np.sum(np.array(a[t].data, dtype=np.int16) != np.array(b[t].data, dtype=np.int16)))
                   for t in map_topics if t.startswith("map/"))

    # The control: the same calibration, points and images (new stamps) give the same map, so a
    # difference after the change below is the calibration's doing.
    before = int(d["camera calibration changes"])
    _, same, d = tf_frame({}, "a cloud with the same calibration")
    if int(d["camera calibration changes"]) != before or cells_changed(first, same) != 0:
        fail(f"the same inputs gave another map ({cells_changed(first, same)} cells) or a calibration change: {d}")
    print("RESULT tf_same_calibration map_cells_changed=0", flush=True)

    tf_pub.publish(rig_tf(args.camera_dir, turn_front=True))
    for attempt in range(3):
        key2, second, d = tf_frame({}, f"a cloud after the /tf_static change (attempt {attempt + 1})")
        if int(d["camera calibration changes"]) > before:
            break
    else:
        fail(f"/diagnostics do not count the /tf_static calibration change (before {before}): {d}")
    if not calibrated_from_tf(d):
        fail(f"after the change, not every camera is used and calibrated from TF: {d}")
    # Same points, same images (new stamps): only the calibration differs.
    differ = cells_changed(first, second)
    if differ == 0:
        fail("the BEV map after CAM_FRONT's /tf_static change equals the one before it")
    print(f"RESULT tf_change calibration_changes={before}->{d['camera calibration changes']} "
          f"map_cells_changed={differ}", flush=True)


def camera_publishers(p, cams):
    """A CompressedImage and a CameraInfo publisher per camera of `cams` (reliable, keep last 1),
    returned once the node's subscriptions of each have matched."""
    qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
    img_pub = {c: p.create_publisher(CompressedImage, f"{p.base}/input/cameras/{c}/image/compressed", qos) for c in cams}
    info_pub = {c: p.create_publisher(CameraInfo, f"{p.base}/input/cameras/{c}/camera_info", qos) for c in cams}
    for c in cams:
        p.spin_until(lambda c=c: img_pub[c].get_subscription_count() > 0 and info_pub[c].get_subscription_count() > 0,
                     f"the node's subscriptions of {c}")
    return img_pub, info_pub


def send_cameras_then_cloud(p, cams, pubs, good, what, frame_id=lambda c: c):
    """Every camera's JPEG stamped 10 ms before the cloud `good` and its CameraInfo ({name: (jpeg
    bytes, CameraInfo)}), half a second for them to arrive, then the cloud until its LiDAR outputs
    are back."""
    img_pub, info_pub = pubs
    sec, nsec = stamp_of(good)
    t = sec + nsec * 1e-9 - 0.01
    for c, (data, info) in cams.items():
        m = CompressedImage()
        m.header.stamp.sec = int(t)
        m.header.stamp.nanosec = int(round((t - int(t)) * 1e9)) % 1_000_000_000
        m.header.frame_id = frame_id(c)
        m.format = "jpeg"
        m.data = array.array("B", data)
        img_pub[c].publish(m)
        info_pub[c].publish(info)
    end = time.monotonic() + 0.5  # let them arrive before the cloud
    while time.monotonic() < end:
        rclpy.spin_once(p, timeout_sec=0.02)
    p.outputs_of(good, what)


def scenario_rig(p, args, xyzi):
    # a slice of the cloud, as in scenario_cameras: the LiDAR half is not under test here
    xyzi = np.ascontiguousarray(xyzi[:2000])
    with open(args.rig) as f:
        rig = json.load(f)
    cams = {}
    for c in rig["cameras"]:
        with open(c["jpeg"], "rb") as f:
            data = f.read()
        k = [float(v) for v in c["k"]]
        info = CameraInfo()
        info.header.frame_id = c["name"]
        info.width, info.height = c["width"], c["height"]
        info.distortion_model = "plumb_bob"
        info.d = [0.0] * 5
        info.k = k
        info.r = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
        info.p = [k[0], 0.0, k[2], 0.0, 0.0, k[4], k[5], 0.0, 0.0, 0.0, 1.0, 0.0]
        cams[c["name"]] = (data, info)
    maps = {}
    map_topics = subscribe_maps(p, maps)
    pubs = camera_publishers(p, cams)

    def frame(what):
        """The cameras and then the cloud (in frame `lidar`); returns the cloud's stamp."""
        good = cloud(fields_xyzi(), 16, xyzi.shape[0], xyzi.astype("<f4").tobytes(), frame="lidar")
        send_cameras_then_cloud(p, cams, pubs, good, what)
        return stamp_of(good)

    # a warm-up frame first (see scenario_cameras: samples sent before discovery settles are lost)
    frame(f"a warm-up cloud with the rig's {len(cams)} cameras")
    key = frame(f"a cloud with the rig's {len(cams)} cameras")
    p.spin_until(lambda: p.diag is not None and all(p.diag.get(f"camera {c} last frame") == "used" for c in cams),
                 f"/diagnostics reporting every camera of the rig used ({', '.join(cams)})")
    d = p.diag
    for c in cams:
        if not d[f"camera {c} calibration"].startswith("extrinsic from file"):
            fail(f"{c}: calibration {d[f'camera {c} calibration']!r}, expected from the rig's calibration file")
    check_maps(p, args, maps, map_topics, key, "the rig's cloud")
    print(f"RESULT rig cameras_used={len(cams)} bev_map={args.map_cells}x{args.map_cells} topics={len(map_topics)}", flush=True)


TOPIC_TYPES = {"sensor_msgs/msg/PointCloud2": PointCloud2, "sensor_msgs/msg/Image": Image,
               "nav_msgs/msg/OccupancyGrid": OccupancyGrid}


def scenario_topics(p, args, xyzi):
    if not args.topics_file or not args.camera_dir:
        fail("topics needs --topics-file and --camera-dir")
    with open(args.topics_file) as f:
        wanted = json.load(f)
    if not wanted:
        fail(f"{args.topics_file} lists no topics")
    got = {}
    for w in wanted:
        topic, typ = w["topic"], w["type"]
        if typ not in TOPIC_TYPES:
            fail(f"{topic}: type {typ} is none of {sorted(TOPIC_TYPES)}")
        qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, history=HistoryPolicy.KEEP_LAST)
        p.create_subscription(TOPIC_TYPES[typ], topic, lambda m, t=topic: got.setdefault(t, stamp_of(m)), qos)
    # a slice of the cloud, as in scenario_cameras: the LiDAR half is not under test here
    xyzi = np.ascontiguousarray(xyzi[:2000])
    cams = camera_messages(args.camera_dir)
    pubs = camera_publishers(p, cams)
    missing = []
    # Best-effort camera samples sent before the node's readers have matched are lost (see
    # scenario_cameras), and a frame's map goes out after its LiDAR outputs: up to three frames.
    for attempt in range(3):
        good = xyzi_cloud(xyzi)
        send_cameras_then_cloud(p, cams, pubs, good, f"frame {attempt + 1} for the layout's topics", frame_id=str.lower)
        deadline = time.monotonic() + p.timeout
        while time.monotonic() < deadline and len(got) < len(wanted):
            rclpy.spin_once(p, timeout_sec=0.05)
        missing = [w["topic"] for w in wanted if w["topic"] not in got]
        if not missing:
            break
        print(f"node_peer: after frame {attempt + 1}, nothing yet on {missing}", flush=True)
    if missing:
        fail(f"no message on {missing} (of {len(wanted)} topics) after three frames")
    for w in wanted:
        print(f"RESULT topic {w['topic']} {w['type']} stamp={got[w['topic']][0]}.{got[w['topic']][1]:09d}", flush=True)
    print(f"RESULT topics_seen={len(got)}/{len(wanted)}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", required=True)
    ap.add_argument("--scenario", required=True, choices=["valid", "robust", "burst", "bench", "cameras", "rig", "topics"])
    ap.add_argument("--cloud", required=True)
    ap.add_argument("--expect-voxels", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=20.0)
    ap.add_argument("--input", default=None, help="the node's input topic (default <ns>/sptr/input/points)")
    ap.add_argument("--output-points", default="~/output/points")
    ap.add_argument("--bev-labels", default="~/output/bev/labels")
    ap.add_argument("--bev-labels-color", default="~/output/bev/labels_color")
    ap.add_argument("--bev-occupancy", default="~/output/bev/occupancy")
    ap.add_argument("--grid", type=int, nargs=2, default=[256, 256], metavar=("W", "H"),
                    help="expected BEV grid size in cells")
    ap.add_argument("--resolution", type=float, default=0.4, help="expected BEV resolution")
    ap.add_argument("--bev-frame", default="base_link", help="expected BEV frame ('' = the cloud's)")
    ap.add_argument("--classes", type=int, default=16)
    ap.add_argument("--expect-level", type=int, default=None,
                    help="valid: the diagnostics level expected after the cloud (0 OK, 1 WARN, 2 ERROR)")
    ap.add_argument("--dump-labels", default=None,
                    help="valid: write the labeled cloud's class_id (uint8 each) then probability "
                         "(float32 each) to this file")
    ap.add_argument("--frames", type=int, default=200, help="bench: frames to time")
    ap.add_argument("--warmup", type=int, default=3, help="bench: untimed frames first")
    ap.add_argument("--camera-dir", default=None, help="cameras: the nuScenes JPEGs and calib.json")
    ap.add_argument("--map-cells", type=int, default=0,
                    help="cameras: expect the BEV map topics, this many cells a side (0: no model)")
    ap.add_argument("--map-resolution", type=float, default=0.5, help="cameras: the BEV map's cell size")
    ap.add_argument("--rig", default=None,
                    help="rig: a JSON of the cameras ({\"cameras\": [{\"name\", \"jpeg\", \"k\": 9 values, \"width\", \"height\"}]})")
    ap.add_argument("--calibration", choices=["file", "tf"], default="file",
                    help="cameras: extrinsics from the node's calibration file, or published on /tf_static")
    ap.add_argument("--faults", action="store_true",
                    help="cameras: the camera fault sequence (camera_faults) instead of the stale/bad steps")
    ap.add_argument("--topics-file", default=None,
                    help="topics: a JSON list of {\"topic\", \"type\"} that must each deliver a message")
    ap.add_argument("--tf-static-topic", default="/tf_static",
                    help="cameras: where the node reads /tf_static (the tests remap it per namespace)")
    args = ap.parse_args()

    rclpy.init(args=None)
    p = Peer(args)
    xyzi = load_xyzi(args.cloud)
    print(f"node_peer: {args.scenario} against {args.ns}/sptr, cloud of {xyzi.shape[0]} points", flush=True)
    try:
        p.wait_connected()
        {"valid": scenario_valid, "robust": scenario_robust, "burst": scenario_burst,
         "bench": scenario_bench, "cameras": scenario_cameras, "rig": scenario_rig,
         "topics": scenario_topics}[args.scenario](p, args, xyzi)
        print("node_peer: OK", flush=True)
    finally:
        p.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()


if __name__ == "__main__":
    main()
