#!/usr/bin/env bash
# Where a SphereFormer frame's GPU time goes, kernel by kernel: runs `sptr bench model` under
# Nsight Compute (ncu, duration metric only, clocks left alone) on the nuScenes sweep and the
# dense cloud and sums the kernels' durations per kernel name and per frame. Comparing the sum with
# the frame's wall time tells kernel time from launch, allocation and host round-trip time.
#
#   scripts/gpu_kernel_profile.sh OUT_DIR     (on the GPU host, gpu-stage/ beside it)
#
# Writes OUT_DIR/kernel_profile.txt: per case the frames profiled, the total kernel time per frame
# and the 25 kernels with the most time per frame (calls, ms per frame, mean µs per call).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_kernel_profile.sh OUT_DIR}
mkdir -p "$out"
[ -d gpu-stage ] || tar -xJf gpu-stage.tar.xz
export SPTR_KERNEL_CACHE="${SPTR_KERNEL_CACHE:-/tmp/sptr-kernels}"
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2> /dev/null | head -1)}
[ -n "$NCU" ] || { echo "gpu_kernel_profile: ncu not found" | tee "$out/kernel_profile.txt"; exit 1; }
nus=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
report="$out/kernel_profile.txt"
: > "$report"
profile() { # case cloud format model
    local csv="/tmp/ncu_$1.csv" iters=2
    # bench model runs 3 warm-up frames + iters; every frame is profiled
    "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv --log-file "$csv" \
        gpu-stage/bin/sptr bench model "$2" --format "$3" --model "$4" --device cuda --iters "$iters" --case "$1" \
        > "/tmp/ncu_$1.json" 2> "/tmp/ncu_$1.err" || { echo "$1: ncu failed"; tail -5 "/tmp/ncu_$1.err"; }
    python3 - "$csv" "$1" $(( iters + 3 )) << 'PY'
import csv, sys, collections
path, case, frames = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [r for r in csv.reader(l for l in open(path) if not l.startswith("==")) if r]
head, body = rows[0], rows[1:]
ki, mi, vi, ui = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0, "second": 1e3}
per = collections.defaultdict(lambda: [0, 0.0])
for r in body:
    if r[mi] != "gpu__time_duration.sum":
        continue
    name = r[ki].split("(")[0]
    per[name][0] += 1
    per[name][1] += float(r[vi].replace(",", "")) * scale.get(r[ui], 1e-6)
total = sum(v[1] for v in per.values()) / frames
print(f"== {case}: {frames} frames profiled, {sum(v[0] for v in per.values()) // frames} kernels and {total:.3f} ms of kernel time per frame")
for name, (calls, ms) in sorted(per.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"  {name:40s} {calls / frames:7.1f} calls  {ms / frames:8.3f} ms/frame  {ms / calls * 1e3:8.1f} us/call")
PY
}
{
    profile nuscenes "$nus" nuscenes config/models/sphereformer_nuscenes.yaml
    [ -f gpu-stage/benchmark-pc.bin ] && profile dense gpu-stage/benchmark-pc.bin xyz config/models/sphereformer_semantickitti.yaml
    cat /tmp/ncu_*.json
} >> "$report" 2>&1
cat "$report"
