#!/usr/bin/env bash
# README's main job: build the `sptr` CLI (with CUDA support; it builds and runs without CUDA
# too), then replay the committed sample bag (the nuScenes LiDAR sweep and cameras) through the
# SphereFormer pipeline, on the GPU when there is one, else on the CPU, and write the report
# (replay_out/: output bag, report.json/.md, plots, BEV PNG). No trained weights ship with the
# repository: deterministic random weights (--random-weights 0) give real timings and
# meaningless labels; pass --weights W.safetensors (after --) for a real checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPTR_CACHE="${SPTR_CACHE:-$HOME/.cache/sptr}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SPTR_CACHE/target}"
if [ -e /dev/nvidia0 ] || command -v nvidia-smi >/dev/null 2>&1; then
    # shellcheck source=scripts/cuda_env.sh
    source scripts/cuda_env.sh   # NVRTC for the GPU path (system CUDA if present)
fi
cargo build --release --features cuda --bin sptr
echo "run_sample.sh: the sptr CLI is $CARGO_TARGET_DIR/release/sptr (README: export PATH=$CARGO_TARGET_DIR/release:\$PATH)" >&2
weights=(--random-weights 0)
for a in "$@"; do [ "$a" = --weights ] && weights=(); done
"$CARGO_TARGET_DIR/release/sptr" replay tests/data/bags/nuscenes_sample \
    --model config/models/sphereformer_nuscenes.yaml --params config/perception_nuscenes.yaml "${weights[@]}" \
    --device auto --out replay_out --bev-png-frames 0 "$@"
