#!/usr/bin/env bash
# ROS 2 tests: sets up / reuses the ROS 2 environment (scripts/ros_env.sh), builds the node and
# the tests, builds and installs the package with colcon (colcon-ros-cargo), then runs the
# r2r <-> rclpy smoke test and the perception_node tests (tests/ros_node.rs) against an rclpy
# peer. Extra arguments go to the final `cargo test` (e.g. `-- --nocapture`). Honors
# CARGO_TARGET_DIR and every other cargo variable from the environment.
#
# Release profile: the node runs SphereFormer on the CPU here, ~20x slower in a debug build.
#
# colcon: the workspace is $SPTR_CACHE/colcon-ws (kept between runs); its build directory for
# the package is a link to the cargo target directory, so `colcon build` reuses what the step
# before built and only installs (lib/sptr/perception_node, share/sptr/{launch,config}).
# SPTR_SKIP_COLCON=1 skips it (the colcon test then reports itself skipped).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$(pwd)"

# shellcheck source=scripts/ros_env.sh
source scripts/ros_env.sh

export SPTR_CACHE="${SPTR_CACHE:-$HOME/.cache/sptr}"
target="${CARGO_TARGET_DIR:-$repo/target}"
# The node as README builds it: `ros,cuda` (its device parameter defaults to cuda; the CUDA
# support is loaded at run time, so this builds and runs on the CPU without CUDA). colcon gets
# them as two `--features` flags: cargo-ament-build (0.1.11) reads `--features ros,cuda` as one
# feature named "ros,cuda" when it picks the binaries to install, and leaves out perception_node
# (required-features = ["ros"]).
features=ros,cuda
tests=(--release --features "$features" --test ros_smoke --test ros_node)

echo "test_ros.sh: cargo test ${tests[*]} --no-run (target dir: $target)" >&2
cargo test "${tests[@]}" --no-run

if [[ "${SPTR_SKIP_COLCON:-0}" != 1 ]]; then
    colcon_bin="$(bash scripts/ros_env.sh --colcon)"
    ws="$SPTR_CACHE/colcon-ws"
    mkdir -p "$ws/build"
    mkdir -p "$target"
    # The package's build directory (colcon-ros-cargo passes it as --target-dir) is the target dir.
    if [[ "$(readlink "$ws/build/sptr" 2>/dev/null || true)" != "$target" ]]; then
        rm -rf "$ws/build/sptr"
        ln -s "$target" "$ws/build/sptr"
    fi
    rm -rf "$ws/install"
    echo "test_ros.sh: colcon build in $ws (install: $ws/install)" >&2
    start=$(date +%s)
    # colcon-ros-cargo writes .cargo/config.toml into its working directory: the workspace.
    (cd "$ws" && PATH="$colcon_bin:$PATH" colcon --log-base "$ws/log" build \
        --base-paths "$repo" --build-base "$ws/build" --install-base "$ws/install" \
        --event-handlers console_direct- \
        --cargo-args --release --features ros --features cuda) >&2
    echo "test_ros.sh: colcon build took $(( $(date +%s) - start )) s" >&2
    export SPTR_COLCON_INSTALL="$ws/install" SPTR_REQUIRE_COLCON=1
fi

echo "test_ros.sh: cargo test --release --features $features --lib ros:: budget:: (the node's unit tests)" >&2
cargo test --release --features "$features" --lib -- ros:: budget::

# One test at a time: each starts a node and a peer that use both cores (the camera tests run the
# fusion model on the CPU), and two side by side starve each other's DDS threads.
echo "test_ros.sh: RUST_TEST_THREADS=${RUST_TEST_THREADS:-1} cargo test ${tests[*]} $*" >&2
RUST_TEST_THREADS="${RUST_TEST_THREADS:-1}" cargo test "${tests[@]}" "$@"
