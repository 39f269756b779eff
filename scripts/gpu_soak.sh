#!/usr/bin/env bash
# The node's frame under faults, on the GPU host, from the repo root with gpu-stage/ beside it
# (scripts/gpu_suite.sh build): `sptr bench pipeline --cameras` (the full SphereFormer nuScenes and
# BEVFusion fusion models, random weights) paced at RATE Hz with a fault every EVERY seconds
# (src/pipeline_faults.rs), and beside it the host alone (`sptr bench host`), so a tail can be
# told from a noisy host. JSON lines into OUT_DIR:
#
#   scripts/gpu_soak.sh OUT_DIR [SECONDS=480] [RATE=20] [EVERY=5]    the soak with faults
#   SPTR_SOAK_FAULTS=0 scripts/gpu_soak.sh OUT_DIR 60                the same without faults
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_soak.sh OUT_DIR [SECONDS] [RATE] [EVERY]}
secs=${2:-480}
rate=${3:-20}
every=${4:-5}
STAGE=gpu-stage
[ -d "$STAGE" ] || [ ! -f "$STAGE.tar.xz" ] || tar -xJf "$STAGE.tar.xz"
mkdir -p "$out"
export SPTR_ROOT="$PWD" SPTR_KERNEL_CACHE="${SPTR_KERNEL_CACHE:-/tmp/sptr-kernels}"
export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nus=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
faults=()
tag=clean
if [ "${SPTR_SOAK_FAULTS:-1}" != 0 ]; then
    faults=(--faults-every-s "$every")
    tag=faults
fi
"$STAGE/bin/sptr" bench host --duration-s 20 > "$out/host_before_$tag.json"
"$STAGE/bin/sptr" bench pipeline "$nus" --cameras --params config/perception_nuscenes_cameras.yaml \
    --camera-weights random:0 --device cuda --rate-hz "$rate" --duration-s "$secs" "${faults[@]}" \
    > "$out/soak_$tag.json" 2> "$out/soak_$tag.log"
python3 - "$out/soak_$tag.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
lat = d["latency"]
print(f"frames {d['frames']} over period {d['frames_over_period']}; latency p50 {lat['p50_ms']:.2f} p99 {lat['p99_ms']:.2f} max {lat['max_ms']:.2f} ms")
print("host rss MB", d["host_rss_mb"])
print("device used MB", d["device_used_mb"])
if d.get("faults"):
    print("faults", json.dumps(d["faults"]))
PY
