#!/usr/bin/env bash
# ROS 2 tests: sets up / reuses the ROS 2 environment (scripts/ros_env.sh), then runs the r2r ⇄
# rclpy smoke test. Extra arguments go to `cargo test` (e.g. `-- --nocapture`). Honors
# CARGO_TARGET_DIR and every other cargo variable from the environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/ros_env.sh
source scripts/ros_env.sh

echo "test_ros.sh: cargo test --features ros --test ros_smoke --test ros_node $* (target dir: ${CARGO_TARGET_DIR:-target})" >&2
cargo test --features ros --test ros_smoke --test ros_node "$@"
