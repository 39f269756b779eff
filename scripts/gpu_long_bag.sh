#!/usr/bin/env bash
# The long replay on a GPU host: writes a bag of the nuScenes sweep repeated N times (frame k
# rotated by k * 360/N degrees about z; tests/fixtures/make_sample_bag.py --long, with the
# third-party `rosbags` writer), replays it on CUDA and on the CPU with the same random weights,
# checks that the labels agree (>= 99.5 %) and keeps both reports.
#
#   scripts/gpu_long_bag.sh OUT_DIR [FRAMES=200] [WORK_DIR=/tmp/sptr-long]
#
# Needs gpu-stage/ (scripts/gpu_suite.sh build) and .parity-wheels/rosbags-wheels.tar
# (scripts/rosbags_wheels.sh) unless `rosbags` is importable. Writes to OUT_DIR:
#   long_bag.txt                   what ran, the agreement line and both reports' latency lines
#   long_report_cuda.json / _cpu.json   the replay reports (per-stage latency, throughput)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_long_bag.sh OUT_DIR [FRAMES] [WORK_DIR]}
frames=${2:-200}
work=${3:-/tmp/sptr-long}
mkdir -p "$out" "$work"
[ -d gpu-stage ] || tar -xJf gpu-stage.tar.xz
export SPTR_KERNEL_CACHE="${SPTR_KERNEL_CACHE:-/tmp/sptr-kernels}"
export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log="$out/long_bag.txt"
rc=0
if ! python3 -c 'import rosbags' 2> /dev/null; then
    mkdir -p "$work/wheels" && tar -xf .parity-wheels/rosbags-wheels.tar -C "$work/wheels" &&
        python3 -m pip install -q --no-index --no-deps --target "$work/site" "$work"/wheels/*.whl > "$work/pip.log" 2>&1 ||
        { echo "gpu_long_bag: cannot install rosbags (see $work/pip.log)" | tee -a "$log"; exit 1; }
    export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
fi
bag="$work/nuscenes_long_$frames"
t0=$(date +%s)
python3 tests/fixtures/make_sample_bag.py --long "$frames" "$bag" > "$work/make_bag.log" 2>&1 ||
    { echo "gpu_long_bag: making the bag failed:"; tail -5 "$work/make_bag.log"; } | tee -a "$log"
echo "bag: $frames frames, $(du -sh "$bag" | cut -f1), written in $(( $(date +%s) - t0 )) s" | tee -a "$log"
gpu-stage/bin/sptr bag info "$bag" >> "$log" 2>&1 || rc=1
for dev in cuda cpu; do
    t0=$(date +%s)
    gpu-stage/bin/sptr replay "$bag" --model config/models/sphereformer_nuscenes.yaml --params config/perception_nuscenes.yaml --random-weights 0 \
        --device "$dev" --out "$work/replay_$dev" > "$work/replay_$dev.log" 2>&1
    r=$?
    [ "$r" = 0 ] || rc=1
    echo "replay $dev: exit $r, $(( $(date +%s) - t0 )) s wall" | tee -a "$log"
    tail -n 15 "$work/replay_$dev.log" >> "$log"
    cp "$work/replay_$dev/report.json" "$out/long_report_$dev.json" 2> /dev/null || rc=1
done
gpu-stage/bin/sptr eval agreement "$work/replay_cuda" "$work/replay_cpu" --min 0.995 >> "$log" 2>&1 || rc=1
echo "gpu_long_bag: exit $rc" | tee -a "$log"
exit $rc
