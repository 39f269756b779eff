#!/usr/bin/env bash
# README's test command: all set-up on a fresh machine, then every test.
#   1. the architecture check: modules import only from their own or lower layers (the ```layers
#      block of ARCHITECTURE.md), no file cycles (scripts/check_layers.py; Python, no build)
#   2. NVRTC + CUDA headers from PyPI wheels (scripts/cuda_env.sh; cached)
#   3. cargo test --features cuda: CPU unit/property tests, the NVRTC 13.0 compile test of every
#      kernel for every vehicle GPU (sm_86, sm_87, sm_89, sm_90, sm_100, sm_120), the CUDA library
#      checks (stand-in libraries of the wrong version), GPU tests (skipped without a GPU); then
#      the CUDA 12 build (--features cuda12): the library's tests, the library checks, and the
#      compile test with NVRTC 12.6 (JetPack 6's), which knows sm_86 ... sm_90 and must refuse
#      the Blackwell GPUs with a message
#      (the fuzz targets' checks replayed over their seeds, findings and fixed mutations are part
#      of it: tests/fuzz_replay.rs; coverage-guided runs are scripts/fuzz.sh)
#   4. the container image (scripts/image.sh all: hadolint, the image built with buildah, replay,
#      the node's start-up and the sharded replay in it); the aarch64 cross build and its tests
#      under qemu-user (scripts/aarch64.sh)
#   5. the ROS 2 tests: r2r <-> rclpy smoke test, the node against an rclpy peer, colcon install
#      (scripts/test_ros.sh; the ROS 2
#      venv from PyPI wheels is created and cached by scripts/ros_env.sh)
# Builds go to ${CARGO_TARGET_DIR:-$SPTR_CACHE/target} so a fresh clone reuses them.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPTR_CACHE="${SPTR_CACHE:-$HOME/.cache/sptr}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SPTR_CACHE/target}"
export SPTR_KERNEL_CACHE="${SPTR_KERNEL_CACHE:-$SPTR_CACHE/kernels}"
start=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - start )) s)"; }

step "architecture check (layers of ARCHITECTURE.md, no file cycles; the checker's self-test first)"
python3 scripts/check_layers.py --self-test 2>&1
python3 scripts/check_layers.py 2>&1

step "CUDA NVRTC environment"
# shellcheck source=scripts/cuda_env.sh
source scripts/cuda_env.sh
export SPTR_REQUIRE_NVRTC=1

step "cargo test --features cuda (CPU tests, NVRTC compile of every kernel, GPU tests if a GPU is present)"
cargo test --features cuda 2>&1

step "the CUDA 12 build (--features cuda12): the library's tests, the CUDA library checks, every kernel with NVRTC 12.6"
(
    # LD_LIBRARY_PATH holds NVRTC 12.6 alone; SPTR_EXPECT_NVRTC fails the run if another loads.
    # NVRTC 12.6 compiles for the GPUs it knows and must refuse the newer ones with a message.
    export SPTR_CUDA_MAJOR=12
    # shellcheck source=scripts/cuda_env.sh
    source scripts/cuda_env.sh
    SPTR_EXPECT_NVRTC=12.6 cargo test --features cuda12 --lib --test cuda_libraries --test nvrtc_compile 2>&1
)

step "container image: hadolint, the image built with buildah on a local Debian 12 base, replay, the node's start-up and the sharded fleet path in it"
rm -rf "$SPTR_CACHE/image-test"
scripts/image.sh all "$SPTR_CACHE/image-test" 2>&1

step "aarch64: the library and sptr cross-built (CUDA 12 build), the library's tests and sptr under qemu"
scripts/aarch64.sh 2>&1

step "ROS 2 tests (r2r <-> rclpy smoke test, the node against an rclpy peer, colcon install)"
scripts/test_ros.sh 2>&1

step "all tests passed in $(( $(date +%s) - start )) s"
