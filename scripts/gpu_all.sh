#!/usr/bin/env bash
# The whole GPU run in one command, on the GPU host, from the repo root with gpu-stage(.tar.xz) and
# .parity-wheels/ beside it: every GPU test and benchmark (scripts/gpu_suite.sh run), then parity
# and speed against the upstream libraries (scripts/gpu_parity.sh: spconv, sptr attention,
# SphereFormer end to end). Full logs go to WORK_DIR; OUT_DIR gets a few summary files (the device
# tool brings back at most eight):
#   summary.txt   the suite's pass/fail lines, GPU error figures and every benchmark JSON line
#   parity.jsonl  one JSON line per parity case (ours vs upstream, errors, times, memory)
#   failures.txt  failing tests' panics and the tails of failing harness logs
# and with the part `longbag`, the long replay on CUDA and the CPU (scripts/gpu_long_bag.sh:
# long_bag.txt, long_report_cuda.json, long_report_cpu.json).
#
#   scripts/gpu_all.sh OUT_DIR [WORK_DIR] [PARTS...]   (parity parts: spconv attention model camera;
#                                                       default: attention model; plus longbag)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_all.sh OUT_DIR [WORK_DIR] [parts...]}
work=${2:-/tmp/sptr-gpu-all}
shift $(( $# >= 2 ? 2 : 1 ))
parts=${*:-attention model}
long=0
parity=""
for p in $parts; do
    if [ "$p" = longbag ]; then long=1; else parity="$parity $p"; fi
done
mkdir -p "$out" "$work"
rc=0
scripts/gpu_suite.sh run "$work/suite" > "$work/suite.log" 2>&1 || rc=1
cp "$work/suite/summary.txt" "$out/summary.txt" 2>/dev/null
if [ "$long" = 1 ]; then
    scripts/gpu_long_bag.sh "$out" 200 "$work/long" > "$work/long.log" 2>&1 || rc=1
fi
if [ -n "$parity" ]; then
    # shellcheck disable=SC2086
    scripts/gpu_parity.sh "$work/parity" $parity > "$work/parity.log" 2>&1 || rc=1
fi
cat "$work"/parity/*.jsonl > "$out/parity.jsonl" 2>/dev/null
{
    grep -hE "panicked|FAILED|^error|Error" "$work"/suite/test-*.log 2>/dev/null | head -60
    for f in "$work"/parity/*.log; do
        echo "== $f"
        tail -n 25 "$f"
    done
} > "$out/failures.txt" 2>&1
echo "gpu_all: exit $rc" | tee -a "$out/summary.txt"
exit $rc
