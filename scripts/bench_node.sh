#!/usr/bin/env bash
# Node benchmark (not a test): perception_node on the CPU path against an rclpy peer over DDS,
# one nuScenes frame at a time; receipt -> publication latency (the node's ~/debug/latency_ms)
# and the peer's round trip, p50/p90/p99 over FRAMES frames (default 200), as JSON on stdout
# and in $SPTR_BENCH_OUT (default ${TMPDIR:-/tmp}/sptr_bench_node.json).
#
#   scripts/bench_node.sh [FRAMES]                       the narrowed test model (under 1 s a frame)
#   SPTR_BENCH_MODEL=full scripts/bench_node.sh 200      the nuScenes model (~16 s a frame on 2 cores)
#
# The pipeline alone, without ROS (e.g. on a GPU host): sptr bench pipeline CLOUD --device cuda.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=scripts/ros_env.sh
source scripts/ros_env.sh
export SPTR_BENCH_FRAMES="${1:-${SPTR_BENCH_FRAMES:-200}}"
export SPTR_BENCH_OUT="${SPTR_BENCH_OUT:-${TMPDIR:-/tmp}/sptr_bench_node.json}"
cargo test --release --features ros,cuda --test ros_node bench_node_receipt_to_publication -- \
    --ignored --exact --nocapture 2>&1 | grep -E '^\{"bench"|^test |FAIL|panicked' >&2
cat "$SPTR_BENCH_OUT"
