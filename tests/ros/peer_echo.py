#!/usr/bin/env python3
"""rclpy peer for tests/ros_smoke.rs: a real ROS 2 node on the other side of DDS.

Subscribes to a sensor_msgs/PointCloud2 on --in, reads x, y, z, intensity with numpy from the
message's own field table (any order, offsets, datatypes, endianness), and publishes on --out a
cloud in a different layout, little endian, point_step 24:

    intensity float32 @0   (input intensity * 2)
    ring      uint16  @4   (point index % 32)
    z         float32 @8   (input z + 1)
    y         float32 @12
    x         float32 @16
    idx       uint32  @20  (point index; a field the Rust decoder does not know)

The header is echoed with "_echo" appended to frame_id. The peer exits when its stdin closes
(the test process went away), after --lifetime seconds, or on SIGINT/SIGTERM.
"""

import argparse
import array
import signal
import sys
import threading
import time

import numpy as np
import rclpy
from rclpy.node import Node
from sensor_msgs.msg import PointCloud2, PointField

# sensor_msgs/PointField datatype -> numpy type code
NP = {
    PointField.INT8: "i1",
    PointField.UINT8: "u1",
    PointField.INT16: "i2",
    PointField.UINT16: "u2",
    PointField.INT32: "i4",
    PointField.UINT32: "u4",
    PointField.FLOAT32: "f4",
    PointField.FLOAT64: "f8",
}

OUT_DTYPE = np.dtype(
    {
        "names": ["intensity", "ring", "z", "y", "x", "idx"],
        "formats": ["<f4", "<u2", "<f4", "<f4", "<f4", "<u4"],
        "offsets": [0, 4, 8, 12, 16, 20],
        "itemsize": 24,
    }
)
OUT_FIELDS = [
    ("intensity", 0, PointField.FLOAT32),
    ("ring", 4, PointField.UINT16),
    ("z", 8, PointField.FLOAT32),
    ("y", 12, PointField.FLOAT32),
    ("x", 16, PointField.FLOAT32),
    ("idx", 20, PointField.UINT32),
]


def read_points(msg):
    """The input's x, y, z, intensity as float32 arrays, from its field table."""
    if msg.height * msg.width == 0:
        return {k: np.zeros(0, np.float32) for k in ("x", "y", "z", "intensity")}
    endian = ">" if msg.is_bigendian else "<"
    by_name = {f.name: f for f in msg.fields}
    names, formats, offsets = [], [], []
    for name in ("x", "y", "z", "intensity"):
        f = by_name.get(name)
        if f is None:
            raise ValueError(f"input cloud has no '{name}' field (fields: {sorted(by_name)})")
        if f.datatype not in NP:
            raise ValueError(f"field '{name}' has unknown datatype {f.datatype}")
        names.append(name)
        formats.append(endian + NP[f.datatype])
        offsets.append(f.offset)
    dt = np.dtype({"names": names, "formats": formats, "offsets": offsets, "itemsize": msg.point_step})
    raw = np.frombuffer(bytes(msg.data), dtype=np.uint8)
    rows = raw[: msg.height * msg.row_step].reshape(msg.height, msg.row_step)
    pts = rows[:, : msg.width * msg.point_step].copy().view(dt).reshape(-1)
    return {name: pts[name].astype(np.float32) for name in names}


def transform(msg):
    p = read_points(msg)
    n = p["x"].shape[0]
    out = np.zeros(n, dtype=OUT_DTYPE)
    out["intensity"] = p["intensity"] * np.float32(2.0)
    out["ring"] = (np.arange(n) % 32).astype(np.uint16)
    out["z"] = p["z"] + np.float32(1.0)
    out["y"] = p["y"]
    out["x"] = p["x"]
    out["idx"] = np.arange(n, dtype=np.uint32)

    reply = PointCloud2()
    reply.header = msg.header
    reply.header.frame_id = msg.header.frame_id + "_echo"
    reply.height = 1
    reply.width = n
    reply.fields = [PointField(name=a, offset=o, datatype=d, count=1) for a, o, d in OUT_FIELDS]
    reply.is_bigendian = False
    reply.point_step = OUT_DTYPE.itemsize
    reply.row_step = OUT_DTYPE.itemsize * n
    reply.data = array.array("B", out.tobytes())
    reply.is_dense = bool(np.isfinite(out["x"]).all() and np.isfinite(out["y"]).all() and np.isfinite(out["z"]).all())
    return reply


class Echo(Node):
    def __init__(self, name, topic_in, topic_out):
        super().__init__(name)
        self.pub = self.create_publisher(PointCloud2, topic_out, 10)
        self.sub = self.create_subscription(PointCloud2, topic_in, self.on_cloud, 10)
        self.count = 0

    def on_cloud(self, msg):
        try:
            reply = transform(msg)
        except Exception as e:  # a malformed input is the test's failure to report, loudly
            print(f"peer_echo: cannot read the input cloud: {e}", file=sys.stderr, flush=True)
            sys.exit(3)
        self.pub.publish(reply)
        self.count += 1
        if self.count == 1:
            print(f"peer_echo: first cloud: {reply.width} points echoed", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--in", dest="topic_in", required=True)
    ap.add_argument("--out", dest="topic_out", required=True)
    ap.add_argument("--name", default="sptr_peer_echo")
    ap.add_argument("--lifetime", type=float, default=120.0, help="exit after this many seconds")
    args = ap.parse_args()

    stop = threading.Event()

    def watch_stdin():
        try:
            sys.stdin.buffer.read()
        except Exception:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    rclpy.init(args=None)
    node = Echo(args.name, args.topic_in, args.topic_out)
    print(f"peer_echo: ready, {args.topic_in} -> {args.topic_out}", flush=True)
    deadline = time.monotonic() + args.lifetime
    try:
        while rclpy.ok() and not stop.is_set() and time.monotonic() < deadline:
            rclpy.spin_once(node, timeout_sec=0.1)
    except KeyboardInterrupt:
        pass
    finally:
        print(f"peer_echo: exiting after {node.count} clouds", flush=True)
        node.destroy_node()
        if rclpy.ok():
            rclpy.shutdown()


if __name__ == "__main__":
    main()
