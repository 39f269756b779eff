#!/usr/bin/env bash
# sptr for aarch64 (Jetson Orin and Thor, Arm servers), built and tested on this x86-64 machine.
#
#   scripts/aarch64.sh            # CI: cross build of the library and `sptr` (the CUDA 12 build,
#                                 # JetPack 6's), the library's unit tests under qemu-user, and
#                                 # `sptr info` / `sptr voxelize` under qemu on the sample cloud
#   SPTR_AARCH64_FEATURES=cuda scripts/aarch64.sh
#                                 # the CUDA 13 build instead (Jetson Thor)
#
# Installs what it needs when missing: rustup's aarch64-unknown-linux-gnu target, Debian's
# gcc-aarch64-linux-gnu (the linker and the C compiler of the crates that build C: SQLite, zstd)
# and qemu-user. Builds go to ${CARGO_TARGET_DIR:-target}/aarch64-unknown-linux-gnu.
#
# The node (feature `ros`) is not built here: ROS 2's PyPI wheels exist for x86-64 only, so on an
# Orin the node is built on the device with colcon against its ROS 2 install (docs/platforms.md).
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
FEATURES=${SPTR_AARCH64_FEATURES:-cuda12}
SYSROOT=/usr/aarch64-linux-gnu
start=$(date +%s)
say() { echo "aarch64.sh: $* ($(( $(date +%s) - start )) s)" >&2; }

if ! command -v aarch64-linux-gnu-gcc > /dev/null || ! command -v qemu-aarch64 > /dev/null; then
    say "installing gcc-aarch64-linux-gnu and qemu-user (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user > /dev/null
fi
if ! rustup target list --installed | grep -qx "$TARGET"; then
    say "adding the rustup target $TARGET"
    rustup target add "$TARGET"
fi

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export AR_aarch64_unknown_linux_gnu=aarch64-linux-gnu-ar
# cargo runs the test binaries through qemu, with the target's C library from the cross sysroot
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L $SYSROOT"
export QEMU_LD_PREFIX=$SYSROOT
# The x86-64 CUDA libraries of scripts/cuda_env.sh are no use to an aarch64 process: without them
# the library's tests take their no-NVRTC paths (NVRTC compiles for aarch64 only on the device)
unset LD_LIBRARY_PATH SPTR_REQUIRE_NVRTC

say "cargo build --target $TARGET --features $FEATURES --lib --bin sptr"
cargo build --target "$TARGET" --features "$FEATURES" --lib --bin sptr
exe="${CARGO_TARGET_DIR:-target}/$TARGET/debug/sptr"
file "$exe" >&2 || true

# Two tests are about the host rather than the code, and qemu-user answers them for itself:
# - host_probe's page-fault counters: qemu's /proc/self/stat reports no faults of the guest;
# - the staged-binary test runs a copy of its own executable as a child process, which the kernel
#   cannot start without qemu registered for aarch64 binaries (binfmt_misc).
say "the library's unit tests under qemu-aarch64 (--features $FEATURES), two host-bound ones skipped"
log=$(mktemp)
if ! cargo test --target "$TARGET" --features "$FEATURES" --lib -- \
    --skip bench::host_probe::tests::counters_of_this_process_grow_with_its_work \
    --skip tests::a_staged_test_binary_finds_its_tree > "$log" 2>&1; then
    cat "$log" >&2
    exit 1
fi
grep -E "^test result" "$log" >&2
rm -f "$log"

say "sptr info and sptr voxelize under qemu-aarch64"
qemu-aarch64 -L "$SYSROOT" "$exe" info
cloud=$(ls tests/data/nuscenes/*.pcd.bin | head -1)
out=$(qemu-aarch64 -L "$SYSROOT" "$exe" voxelize "$cloud" --stride 5 --model config/models/sphereformer_nuscenes.yaml --device cpu)
echo "$out"
# the same voxels as on x86-64 (tests/ros_node.rs: NUSCENES_VOXELS)
grep -q "17856" <<< "$out" || { echo "aarch64.sh: sptr voxelize under qemu did not give the sample's 17856 voxels" >&2; exit 1; }
say "done"
