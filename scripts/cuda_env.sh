#!/usr/bin/env bash
# NVRTC + CUDA headers from PyPI wheels, for compiling kernels on a machine without CUDA
# (CI, laptops). Pinned to the 13.0 series: the GPU hosts' driver is CUDA 13.0 and a newer
# NVRTC emits PTX that driver cannot load. SPTR_CUDA_MAJOR=12 gives NVRTC 12.6 instead (Jetson
# Orin's JetPack 6 release) in a venv of its own, for the compile test of every kernel with it.
#
#   source scripts/cuda_env.sh          # creates/reuses the venv, exports SPTR_CUDA_INCLUDE and LD_LIBRARY_PATH
#   scripts/cuda_env.sh --print         # prints the export lines
#   SPTR_CUDA_MAJOR=12 source scripts/cuda_env.sh
#                                       # NVRTC 12.6: LD_LIBRARY_PATH is set to its library
#                                       # alone (cudarc takes a libnvrtc.so.13 anywhere on the
#                                       # path before a .so.12), the CUDA 12.6 headers
#
# Idempotent and cached outside the clone: ${SPTR_CACHE:-$HOME/.cache/sptr}/cuda-venv (and
# cuda12-venv). On a machine with a CUDA toolkit (CUDA_HOME or /usr/local/cuda with
# include/cuda_fp16.h) the toolkit is used instead and nothing is installed (13 only).

# A venv under the cache holding the wheels PKG...: VENV_NAME, STAMP (the pinned version: a new
# pin makes a new venv), WHAT (for the message).
_sptr_cuda_venv() (
    set -euo pipefail
    local cache="${SPTR_CACHE:-$HOME/.cache/sptr}"
    local venv="$cache/$1" stamp="$cache/$1/.sptr-cuda-$2" what=$3
    shift 3
    if [ -f "$stamp" ]; then
        exit 0
    fi
    echo "[cuda_env] creating $venv ($what)" >&2
    mkdir -p "$cache"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" >&2
    touch "$stamp"
)

_sptr_cuda12_setup() {
    _sptr_cuda_venv cuda12-venv 12.6.85 "NVRTC 12.6 + CUDA 12.6 runtime headers, ~85 MB" \
        nvidia-cuda-nvrtc-cu12==12.6.85 nvidia-cuda-runtime-cu12==12.6.77
}

_sptr_cuda12_exports() {
    local venv="${SPTR_CACHE:-$HOME/.cache/sptr}/cuda12-venv"
    local base
    base=$(ls -d "$venv"/lib/python3*/site-packages/nvidia 2>/dev/null | head -1)
    if [ -z "$base" ] || [ ! -f "$base/cuda_nvrtc/lib/libnvrtc.so.12" ]; then
        echo "echo '[cuda_env] NVRTC 12.6 wheels not found under $venv' >&2; false"
        return 1
    fi
    echo "export SPTR_CUDA_INCLUDE=$base/cuda_runtime/include"
    echo "export LD_LIBRARY_PATH=$base/cuda_nvrtc/lib"
}

_sptr_cuda_setup() {
    _sptr_cuda_venv cuda-venv 13.0.88 "NVRTC 13.0 + CUDA runtime headers, ~225 MB" \
        nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
}

_sptr_cuda_exports() {
    local cache="${SPTR_CACHE:-$HOME/.cache/sptr}"
    local system_cuda="${CUDA_HOME:-/usr/local/cuda}"
    if [ -f "$system_cuda/include/cuda_fp16.h" ]; then
        echo "export SPTR_CUDA_INCLUDE=$system_cuda/include"
        return 0
    fi
    local venv="$cache/cuda-venv"
    local base
    base=$(ls -d "$venv"/lib/python3*/site-packages/nvidia/cu13 2>/dev/null | head -1)
    if [ -z "$base" ]; then
        echo "echo '[cuda_env] NVRTC wheels not found under $venv' >&2; false"
        return 1
    fi
    echo "export SPTR_CUDA_INCLUDE=$base/include"
    echo "export LD_LIBRARY_PATH=$base/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
}

_sptr_cuda_main() {
    if [ "${SPTR_CUDA_MAJOR:-13}" = 12 ]; then
        _sptr_cuda12_setup || return 1
        _sptr_cuda12_exports
        return
    fi
    local system_cuda="${CUDA_HOME:-/usr/local/cuda}"
    if [ ! -f "$system_cuda/include/cuda_fp16.h" ]; then
        _sptr_cuda_setup || return 1
    fi
    _sptr_cuda_exports
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    # executed
    _sptr_cuda_main || exit 1
else
    # sourced: apply the exports to the caller's shell
    _sptr_cuda_lines=$(_sptr_cuda_main) && eval "$_sptr_cuda_lines"
    unset _sptr_cuda_lines
fi
