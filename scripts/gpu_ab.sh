#!/usr/bin/env bash
# A/B benchmarks of two builds in one GPU run: gpu-stage/bin/sptr-before (the CLI of an older
# commit, built by hand: a worktree at that commit, `cargo build --release --features cuda --bin
# sptr`, the binary copied in) and gpu-stage/bin/sptr, in alternating rounds, so host noise falls
# on both alike. Rows: SphereFormer (nuScenes sweep, dense cloud), the two BEVFusion map models,
# and the node's whole frame with six cameras (`bench pipeline --cameras`).
#   scripts/gpu_ab.sh OUT_DIR [ROUNDS]
#   SPTR_AB=paths scripts/gpu_ab.sh OUT_DIR [ROUNDS]
#                     the two sides are gpu-stage/bin/sptr with SPTR_KERNEL_PATHS=native (the
#                     Hopper kernels) and =portable (exactly what an sm_8x GPU runs: Ampere, Ada,
#                     Orin), for the cost of the non-Hopper paths on the same GPU in one run
#   SPTR_AB=staging scripts/gpu_ab.sh OUT_DIR [ROUNDS]
#                     the two sides are gpu-stage/bin/sptr with SPTR_PINNED_STAGING=0 (the points
#                     uploaded from ordinary memory) and =1 (through the page-locked buffer)
#   SPTR_AB=cluster scripts/gpu_ab.sh OUT_DIR [ROUNDS]
#                     the two sides are gpu-stage/bin/sptr with SPTR_CLUSTER_REDUCE=0 (a split
#                     conv's partials summed by a second pass) and =1 (on chip, each tile's splits
#                     one thread-block cluster); only the rows with sparse convs: SphereFormer and
#                     the fusion map model
# Writes OUT_DIR/ab.jsonl (one line per run: {"ab", "round", "case", "line": <the bench's JSON>})
# and OUT_DIR/ab_summary.json (per case and build: the median of the rounds' medians, their
# spread, and after/before as a ratio), and the host probe beside them (OUT_DIR/host.json).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_ab.sh OUT_DIR [ROUNDS]}
rounds=${2:-3}
stage=gpu-stage
mkdir -p "$out"
export SPTR_ROOT="$PWD"
mode=${SPTR_AB:-builds}
case $mode in
    builds) sides=(sptr-before sptr) ;;
    paths) sides=(native portable) ;;
    staging) sides=(pageable pinned) ;;
    cluster) sides=(partials onchip) ;;
    *) echo "gpu_ab: SPTR_AB is \`$mode\`: write builds (the default), paths, staging or cluster" >&2; exit 2 ;;
esac
for b in sptr-before sptr; do
    [ "$mode" != builds ] && [ "$b" = sptr-before ] && continue
    [ -x "$stage/bin/$b" ] || { echo "gpu_ab: $stage/bin/$b is missing" >&2; exit 2; }
done
nus=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
cloud=$stage/benchmark-pc.bin
[ -f "$cloud" ] || cloud=$nus

run_case() { # side round case args...
    local b=$1 r=$2 c=$3
    shift 3
    local line run=("$stage/bin/$b")
    [ "$mode" = paths ] && run=(env "SPTR_KERNEL_PATHS=$b" "$stage/bin/sptr")
    [ "$mode" = staging ] && run=(env "SPTR_PINNED_STAGING=$([ "$b" = pinned ] && echo 1 || echo 0)" "$stage/bin/sptr")
    [ "$mode" = cluster ] && run=(env "SPTR_CLUSTER_REDUCE=$([ "$b" = onchip ] && echo 1 || echo 0)" "$stage/bin/sptr")
    if line=$("${run[@]}" "$@" 2>> "$out/ab.log" | tail -n 1); then
        printf '{"ab": "%s", "round": %d, "case": "%s", "line": %s}\n' "$b" "$r" "$c" "$line" >> "$out/ab.jsonl"
    else
        echo "gpu_ab: $b $c failed (see ab.log)" >&2
        return 1
    fi
}

failed=0
"$stage/bin/sptr" bench host > "$out/host.json" 2>> "$out/ab.log" || true
for r in $(seq 1 "$rounds"); do
    for b in "${sides[@]}"; do
        run_case "$b" "$r" sphereformer_nuscenes bench model "$nus" --model config/models/sphereformer_nuscenes.yaml \
            --case nuscenes --iters 20 || failed=1
        run_case "$b" "$r" sphereformer_dense bench model "$cloud" --format xyz \
            --model config/models/sphereformer_semantickitti.yaml --case dense --iters 20 || failed=1
        for m in camera fusion; do
            [ "$mode" = cluster ] && [ $m = camera ] && continue
            run_case "$b" "$r" "bevseg_$m" bench bevseg --model "config/models/bevfusion_seg_$m.yaml" --iters 30 || failed=1
        done
        [ "$mode" = cluster ] && continue
        run_case "$b" "$r" pipeline_cameras bench pipeline "$nus" --cameras --params config/perception_nuscenes_cameras.yaml \
            --camera-weights random:0 --device cuda --frames 100 || failed=1
    done
done
python3 scripts/ab_summary.py "$out/ab.jsonl" > "$out/ab_summary.json" || failed=1
cat "$out/ab_summary.json"
exit $failed
