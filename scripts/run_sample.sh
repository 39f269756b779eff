#!/usr/bin/env bash
# README's main-job command: build the `sptr` CLI (with CUDA support; it builds and runs without
# CUDA too), then voxelize the committed nuScenes sample with SphereFormer's nuScenes
# preprocessing, on the GPU when there is one, else on the CPU, and print the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPTR_CACHE="${SPTR_CACHE:-$HOME/.cache/sptr}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SPTR_CACHE/target}"
if [ -e /dev/nvidia0 ] || command -v nvidia-smi >/dev/null 2>&1; then
    # shellcheck source=scripts/cuda_env.sh
    source scripts/cuda_env.sh   # NVRTC for the GPU path (system CUDA if present)
fi
cargo build --release --features cuda --bin sptr
sweep=$(ls tests/data/nuscenes/*.pcd.bin | head -1)
"$CARGO_TARGET_DIR/release/sptr" voxelize "$sweep" --stride 5 --model config/models/sphereformer_nuscenes.yaml --device auto "$@"
