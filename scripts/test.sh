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
#   4. a short fuzz pass of every decoder of outside bytes (scripts/fuzz.sh, fuzz/)
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

step "short fuzz pass (every decoder of outside bytes, a fixed number of inputs from the committed seeds)"
# scripts/fuzz.sh installs the nightly toolchain and cargo-fuzz when missing; the long runs are
# `scripts/fuzz.sh SECONDS` (docs/fuzzing.md).
SPTR_FUZZ_RUNS="${SPTR_FUZZ_RUNS:-4000}" scripts/fuzz.sh 2>&1

step "ROS 2 tests (r2r <-> rclpy smoke test, the node against an rclpy peer, colcon install)"
scripts/test_ros.sh 2>&1

step "all tests passed in $(( $(date +%s) - start )) s"
