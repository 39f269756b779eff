#!/usr/bin/env bash
# NVRTC + CUDA headers from PyPI wheels, for compiling kernels on a machine without CUDA
# (CI, laptops). Pinned to the 13.0 series: the GPU hosts' driver is CUDA 13.0 and a newer
# NVRTC emits PTX that driver cannot load.
#
#   source scripts/cuda_env.sh          # creates/reuses the venv, exports SPTR_CUDA_INCLUDE and LD_LIBRARY_PATH
#   scripts/cuda_env.sh --print         # prints the export lines
#
# Idempotent and cached outside the clone: ${SPTR_CACHE:-$HOME/.cache/sptr}/cuda-venv.
# On a machine with a CUDA toolkit (CUDA_HOME or /usr/local/cuda with include/cuda_fp16.h) the
# toolkit is used instead and nothing is installed.

_sptr_cuda_setup() (
    set -euo pipefail
    local cache="${SPTR_CACHE:-$HOME/.cache/sptr}"
    local venv="$cache/cuda-venv"
    local stamp="$venv/.sptr-cuda-13.0.88"
    if [ -f "$stamp" ]; then
        exit 0
    fi
    echo "[cuda_env] creating $venv (NVRTC 13.0 + CUDA runtime headers, ~225 MB)" >&2
    mkdir -p "$cache"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check \
        nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 >&2
    touch "$stamp"
)

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
