#!/usr/bin/env bash
# README's main job: build the `sptr` CLI (with CUDA support; it builds and runs without CUDA
# too), then replay the committed sample bag (the nuScenes LiDAR sweep and cameras) through the
# SphereFormer pipeline and the six cameras through the BEVFusion camera + LiDAR BEV map model,
# on the GPU when there is one, else on the CPU, and write the report (replay_out/: output bag
# with the labeled cloud and the BEV map topics, report.json/.md with the latency table per
# stage, plots, cameras.json, bev/frame_000000.png (LiDAR labels) and bev/map_000000.png (the
# fused BEV map)). No trained weights ship with the repository: deterministic random weights
# (--random-weights 0, --camera-weights random:0) give real timings and meaningless labels and
# maps; pass --weights W.safetensors and/or --camera-weights B.safetensors (after --) for real
# checkpoints. On a CPU the map model is the reduced YAML (tests/data/bevseg/fusion_small.yaml,
# 50 x 50 cells at 2 m) so the run stays short; on a GPU the full one (200 x 200 at 0.5 m).
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
camera_weights=(--camera-weights random:0)
camera_model=(--camera-model tests/data/bevseg/fusion_small.yaml)
if [ -e /dev/nvidia0 ]; then camera_model=(); fi   # the params file's full fusion model
for a in "$@"; do
    [ "$a" = --weights ] && weights=()
    [ "$a" = --camera-weights ] && camera_weights=()
    [ "$a" = --camera-model ] && camera_model=()
done
"$CARGO_TARGET_DIR/release/sptr" replay tests/data/bags/nuscenes_sample \
    --model config/models/sphereformer_nuscenes.yaml --params config/perception_nuscenes_cameras.yaml "${weights[@]}" \
    "${camera_weights[@]}" "${camera_model[@]}" \
    --device auto --out replay_out --bev-png-frames 0 "$@"
echo "run_sample.sh: the fused BEV map is replay_out/bev/map_000000.png (topics /sptr/output/bev/map/* in replay_out/bag)" >&2
