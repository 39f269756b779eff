#!/usr/bin/env bash
# The node benchmark over DDS on a GPU host that has no ROS 2 install: perception_node (CUDA)
# with the six nuScenes cameras and the BEVFusion fusion map model, driven by node_bench_peer
# (src/ros/bench_peer.rs) publishing the sample bag's cloud + six CompressedImages + CameraInfos
# at a fixed rate; cloud published -> last output received, dropped frames, node memory.
#
#   scripts/node_bench.sh pack            # dev machine (needs scripts/ros_env.sh's venv): builds
#                                         # the release node, peer and CLI with `ros,cuda`, stages
#                                         # them with the ROS 2 runtime libraries they load (ldd
#                                         # closure + the type support libraries rmw opens at run
#                                         # time + libpython, which the wheels' libraries link) into
#                                         # node-bench/, packed as node-bench.tar.xz (git-ignored)
#   scripts/node_bench.sh run OUT [RUNS]  # GPU host, repo root: unpacks node-bench.tar.xz if
#                                         # needed; `sptr bench host` (the host probe alone) for
#                                         # 30 s; RUNS times (default 3): a fresh node, the peer
#                                         # at 10 Hz for 60 s after 5 s of warm-up; the host probe
#                                         # alone again; JSON + logs in OUT
#
# Environment for `run`: SPTR_BENCH_DEVICE (cuda), SPTR_BENCH_RATE_HZ (10), SPTR_BENCH_DURATION_S
# (60), SPTR_BENCH_HOST_PROBE_S (30; 0: no host probe runs), SPTR_BENCH_CAMERA_MODEL
# (config/models/bevfusion_seg_fusion.yaml), SPTR_BENCH_NODE_PARAMS
# (more node parameters, space-separated `name:=value`, e.g. `camera.beside_lidar:=false`;
# written to OUT/machine.txt). Weights are random
# (`sptr random-weights`, seed 11; the map model `random:0`): timings are real, labels meaningless.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=node-bench

pack() {
    # shellcheck source=scripts/ros_env.sh
    source scripts/ros_env.sh
    cargo build --release --features ros,cuda --bin perception_node --bin node_bench_peer --bin sptr
    local target="${CARGO_TARGET_DIR:-target}/release"
    rm -rf "$STAGE" && mkdir -p "$STAGE/bin" "$STAGE/lib"
    for b in perception_node node_bench_peer sptr; do
        cp "$target/$b" "$STAGE/bin/$b" && strip --strip-debug "$STAGE/bin/$b"
    done
    # Every library of the ROS venv (rmw opens the type support libraries by name at run time, so
    # ldd does not list them all), the ROS wheels' vendored ones (ros_*.libs), and what ldd resolves
    # outside the system directories (libpython). Wheels hold copies, not links: a file whose
    # bytes were staged already becomes a link to the first copy.
    local venv="${SPTR_ROS_VENV:?ros_env.sh sets SPTR_ROS_VENV}"
    {
        ls "$venv"/lib/*.so* "$venv"/lib/python3*/site-packages/ros_*.libs/*.so* 2>/dev/null
        ldd "$STAGE/bin/perception_node" "$STAGE/bin/node_bench_peer" | awk '/=> \//{print $3}' |
            grep -vE '^/(usr/)?lib(64)?/' || true
    } | python3 -c '
import hashlib, os, shutil, sys
lib = sys.argv[1]
first = {}
for src in sys.stdin.read().split():
    name = os.path.basename(src)
    dst = os.path.join(lib, name)
    if os.path.lexists(dst):
        continue
    digest = hashlib.sha256(open(src, "rb").read()).hexdigest()
    if digest in first:
        os.symlink(first[digest], dst)
    else:
        shutil.copy2(src, dst)
        first[digest] = name
print(f"staged {len(os.listdir(lib))} libraries ({len(first)} distinct)")
' "$STAGE/lib"
    mkdir -p "$STAGE/share" && cp -r "$venv/share/ament_index" "$STAGE/share/" 2>/dev/null || true
    git rev-parse --short HEAD > "$STAGE/commit.txt" 2>/dev/null || true
    tar -cf - "$STAGE" | xz -T2 -6 > "$STAGE.tar.xz"
    du -sh "$STAGE" "$STAGE.tar.xz"
}

run() {
    local out=${1:?usage: node_bench.sh run OUT_DIR [RUNS]} runs=${2:-3}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    [ -d "$STAGE" ] || tar -xJf "$STAGE.tar.xz"
    local root=$PWD
    local bin="$root/$STAGE/bin"
    export LD_LIBRARY_PATH="$root/$STAGE/lib:${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export AMENT_PREFIX_PATH="$root/$STAGE" RMW_IMPLEMENTATION=rmw_fastrtps_cpp
    export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST ROS_LOG_DIR="$out/ros-log"
    export FASTDDS_DEFAULT_PROFILES_FILE="$root/tests/ros/fastdds_large_clouds.xml"
    export SPTR_KERNEL_CACHE="${SPTR_KERNEL_CACHE:-/tmp/sptr-kernels}"
    local device=${SPTR_BENCH_DEVICE:-cuda} rate=${SPTR_BENCH_RATE_HZ:-10} duration=${SPTR_BENCH_DURATION_S:-60}
    local camera_model="$root/${SPTR_BENCH_CAMERA_MODEL:-config/models/bevfusion_seg_fusion.yaml}"
    # Not under OUT: 130 MB that nobody needs back.
    local weights="${TMPDIR:-/tmp}/sptr_node_bench_sphereformer_random.safetensors"
    "$bin/sptr" random-weights --model config/models/sphereformer_nuscenes.yaml --seed 11 --out "$weights" > "$out/weights.log" 2>&1
    {
        echo "commit $(cat "$STAGE/commit.txt" 2>/dev/null || echo unknown)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
        nproc
        echo "node parameters: ${SPTR_BENCH_NODE_PARAMS:-(defaults)}"
    } > "$out/machine.txt"
    local extra=() p
    for p in ${SPTR_BENCH_NODE_PARAMS:-}; do extra+=(-p "$p"); done
    host_probe "$bin" "$out/host_before.json"
    local i status=0
    for i in $(seq 1 "$runs"); do
        "$bin/perception_node" --ros-args --params-file config/perception_nuscenes_cameras.yaml \
            -p "device:=$device" -p "model.weights:=$weights" \
            -p "camera.model_config:=$camera_model" -p "camera.model_weights:=random:0" "${extra[@]}" \
            > "$out/node_$i.log" 2>&1 &
        local node=$!
        if "$bin/node_bench_peer" --bag tests/data/bags/nuscenes_sample --camera-model "$camera_model" \
            --rate-hz "$rate" --duration-s "$duration" --warmup-s 5 --start-timeout-s 300 --grace-s 10 \
            --out "$out/node_bench_$i.json" > "$out/peer_$i.log" 2>&1; then
            python3 - "$out/node_bench_$i.json" <<'EOF' || true
import json, sys
j = json.load(open(sys.argv[1]))
l, f = j["latency"] or {}, j["frames"]
dev, host = j["device_used_mb"] or {}, j["host_rss_mb"] or {}
print(f"run: frames {f}, latency p50 {l.get('p50_ms')} p99 {l.get('p99_ms')} max {l.get('max_ms')} ms, "
      f"over period {j['frames_over_period']}, host RSS {host.get('first')} -> {host.get('last')} MB, "
      f"device {dev.get('first')} -> {dev.get('last')} MB")
hp = j.get("host_probe") or {}
s, o = hp.get("slow_frames") or {}, hp.get("other_frames") or {}
print(f"host probe: slow frames {s.get('frames')} (probe x{s.get('probe_ratio_p50')}), "
      f"others {o.get('frames')} (probe x{o.get('probe_ratio_p50')}); "
      f"stalls {j['host_stalls']['count']}, steal {j['steal_ms']} ms")
EOF
        else
            status=1
            echo "run $i: the peer failed (log: $out/peer_$i.log)"
            tail -5 "$out/peer_$i.log"
        fi
        kill -INT "$node" 2>/dev/null || true
        wait "$node" || true
    done
    host_probe "$bin" "$out/host_after.json"
    return $status
}

# The host probe alone (nothing of ours running): does this machine's every core slow down now
# and then? A tail that comes with such episodes is the host's (docs/node.md, the node bench).
host_probe() {
    local bin=$1 json=$2 seconds=${SPTR_BENCH_HOST_PROBE_S:-30}
    [ "$seconds" = 0 ] && return 0
    "$bin/sptr" bench host --duration-s "$seconds" > "$json" || { echo "sptr bench host failed"; return 0; }
    python3 - "$json" <<'EOF' || true
import json, sys
j = json.load(open(sys.argv[1]))
p = {k: ("-" if v is None else v) for k, v in j["probe"].items()}
print(f"host alone ({sys.argv[1].rsplit('/', 1)[-1]}): {p.get('episodes', 0)} slowdown episodes in {j['duration_s']} s "
      f"(median gap {p.get('episode_gap_s_p50', '-')} s, length {p.get('episode_ms_p50', '-')} ms), "
      f"{p.get('runs_over_10x', 0)} of {p.get('runs', 0)} probe runs over 10x, steal {j['steal_ms']} ms")
EOF
}

case "${1:-}" in
    pack) pack ;;
    run) shift; run "$@" ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
esac
