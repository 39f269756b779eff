#!/usr/bin/env bash
# Fetches PyPI sptr 1.1.1 (an sdist: the CUDA ops of lh9171338/SparseTransformer) for the window-
# attention parity harness (tests/parity/sptr_parity.py, see tests/parity/README.md) and packs a
# buildable source archive into .parity-wheels/ (git-ignored):
#
#   scripts/parity_sptr.sh     # -> .parity-wheels/sptr-1.1.1.tar.gz        (the sdist, untouched)
#                              #    .parity-wheels/sptr-1.1.1-src.tar.gz    (sdist + the 4 headers)
#
# The sdist on PyPI lacks its C++/CUDA headers (no MANIFEST.in: sptr/src/cuda_utils.h and the three
# *_kernel.h are not in it), so it cannot build as published. This script writes those four headers
# itself (write_headers below; our own text, nothing is fetched for them): they declare only what the
# sdist's .cpp/.cu files use, derived from those files: the launcher functions with the signatures the
# .cu files define and the .cpp files call, the tensor-level entry points pointops_api.cpp binds, and
# two helpers, float2type<T>() and opt_n_threads(), plus the __half +, *, += the kernels need under
# PyTorch's -D__CUDA_NO_HALF_OPERATORS__. The archive lives in the git-ignored .parity-wheels/.
# A `#include <THC/...>` line (gone from PyTorch) would be dropped; 1.1.1 has it commented out already.
#
# Getting the sdist: `pip download` of an sdist runs its metadata step, whose setup.py imports
# torch.utils.cpp_extension and needs `wheel`. This machine has neither torch nor (maybe) wheel, so the
# download runs with a throwaway stand-in `torch` package (two no-op names) and the `wheel` wheel on
# PYTHONPATH, without build isolation. The metadata is not used; the tarball is checked by sha256.
#
# On the GPU host nothing else is needed: setuptools, wheel, ninja, numpy and torch are in its image
# (device notes' package list); torch_scatter / torch_geometric / torch_cluster / timm are not used
# (tests/parity/sptr_ops.py loads sptr's extension and functional.py directly).
#
# Build there (about 1-3 minutes; tests/parity/README.md has the whole device command):
#   MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 python3 -m pip install -q --no-build-isolation --no-deps \
#       --no-index --target /tmp/sptr-site .parity-wheels/sptr-1.1.1-src.tar.gz
#   export PYTHONPATH=/tmp/sptr-site${PYTHONPATH:+:$PYTHONPATH}
#
# Idempotent: downloads are cached in $PARITY_WHEEL_CACHE (default ~/.cache/sptr/parity-wheels) and the
# archive is rebuilt only when its inputs change.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${PARITY_WHEEL_CACHE:-$HOME/.cache/sptr/parity-wheels}
DEST=.parity-wheels
VER=1.1.1
SDIST=sptr-$VER.tar.gz
SDIST_SHA=f6f8cc85082fb0ac4464c35ce616806a076305313d70ad30ad27e674b71813d6
WHEEL_SPEC=wheel==0.45.1
# the headers the sdist lacks (paths in the sdist), written by write_headers below
HEADERS=(
    sptr/src/cuda_utils.h
    sptr/src/attention/attention_cuda_kernel.h
    sptr/src/precompute/precompute_cuda_kernel.h
    sptr/src/rpe/relative_pos_encoding_cuda_kernel.h
)

mkdir -p "$CACHE" "$DEST"
work=$(mktemp -d "${TMPDIR:-/tmp}/parity-sptr.XXXXXX")
trap 'rm -rf "$work"' EXIT
sha() { sha256sum "$1" | cut -c1-64; }

# 1. the sdist
if [ ! -f "$CACHE/$SDIST" ] || [ "$(sha "$CACHE/$SDIST")" != "$SDIST_SHA" ]; then
    rm -f "$CACHE/$SDIST"
    wheel_whl=$(ls "$CACHE"/wheel-*-py3-none-any.whl 2>/dev/null | head -1 || true)
    if [ -z "$wheel_whl" ]; then
        echo "downloading $WHEEL_SPEC (for the sdist's metadata step here)"
        python3 -m pip download -q --no-deps --only-binary=:all: -d "$CACHE" "$WHEEL_SPEC"
        wheel_whl=$(ls "$CACHE"/wheel-*-py3-none-any.whl | head -1)
    fi
    mkdir -p "$work/stub/torch/utils"
    : > "$work/stub/torch/__init__.py"
    : > "$work/stub/torch/utils/__init__.py"
    cat > "$work/stub/torch/utils/cpp_extension.py" <<'EOF'
# Stand-in for the metadata step of `pip download` only: nothing is compiled here.
from setuptools import Extension
from setuptools.command.build_ext import build_ext as BuildExtension


def CUDAExtension(name, sources, *args, **kwargs):
    return Extension(name, sources=[])
EOF
    echo "downloading sptr==$VER (sdist)"
    PYTHONPATH="$work/stub:$wheel_whl" python3 -m pip download -q --no-deps --no-binary :all: \
        --no-build-isolation -d "$work/dl" "sptr==$VER"
    mv "$work/dl/$SDIST" "$CACHE/$SDIST"
fi
[ "$(sha "$CACHE/$SDIST")" = "$SDIST_SHA" ] || { echo "parity_sptr: $SDIST sha256 mismatch" >&2; exit 1; }

# 2. the headers the sdist lacks. Our own text, not upstream's: each declares just what the sdist's
# .cpp/.cu files use (read off their definitions and calls). The helpers only shape launches:
# opt_n_threads() feeds block sizes that the .cu launchers round up to a power of two and clamp to
# 1024 themselves, and every kernel launched with it loops over its work with a blockDim.x stride.
write_headers() {  # $1: a directory standing for the sdist's top level
    local top=$1
    mkdir -p "$top/sptr/src/attention" "$top/sptr/src/precompute" "$top/sptr/src/rpe"

    cat > "$top/sptr/src/cuda_utils.h" <<'EOF'
// Written by scripts/parity_sptr.sh (not part of the sptr sdist): helpers for the .cu files.
#ifndef SPTR_PARITY_CUDA_UTILS_H
#define SPTR_PARITY_CUDA_UTILS_H

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#ifdef ENABLE_BF16
#include <cuda_bf16.h>
#endif

// Most threads opt_n_threads() hands out (the CUDA limit per block).
#define SPTR_PARITY_MAX_THREADS 1024u

// Largest power of two <= n, at least 1 and at most SPTR_PARITY_MAX_THREADS. The launchers double it
// when it falls short of n and clamp the result to 1024, so a block gets a power of two from 2 to 1024.
inline unsigned int opt_n_threads(unsigned int n) {
    unsigned int t = 1;
    while (t < SPTR_PARITY_MAX_THREADS && 2 * t <= n) t *= 2;
    return t;
}

#ifdef __CUDACC__
// float -> element type, for the kernels' zero initialisers.
template <typename T> __device__ __forceinline__ T float2type(float x);
template <> __device__ __forceinline__ float float2type<float>(float x) { return x; }
template <> __device__ __forceinline__ __half float2type<__half>(float x) { return __float2half(x); }
#ifdef ENABLE_BF16
template <> __device__ __forceinline__ __nv_bfloat16 float2type<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
#endif

// PyTorch builds extensions with -D__CUDA_NO_HALF_OPERATORS__, which hides cuda_fp16's __half
// operators; the kernels use +, * and += on their element type, so provide those (same intrinsics).
#ifdef __CUDA_NO_HALF_OPERATORS__
__device__ __forceinline__ __half operator+(const __half &a, const __half &b) { return __hadd(a, b); }
__device__ __forceinline__ __half operator*(const __half &a, const __half &b) { return __hmul(a, b); }
__device__ __forceinline__ __half &operator+=(__half &a, const __half &b) { a = __hadd(a, b); return a; }
#endif
#if defined(ENABLE_BF16) && defined(__CUDA_NO_BFLOAT16_OPERATORS__)
__device__ __forceinline__ __nv_bfloat16 operator+(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hadd(a, b); }
__device__ __forceinline__ __nv_bfloat16 operator*(const __nv_bfloat16 &a, const __nv_bfloat16 &b) { return __hmul(a, b); }
__device__ __forceinline__ __nv_bfloat16 &operator+=(__nv_bfloat16 &a, const __nv_bfloat16 &b) { a = __hadd(a, b); return a; }
#endif
#endif  // __CUDACC__

#endif  // SPTR_PARITY_CUDA_UTILS_H
EOF

    cat > "$top/sptr/src/attention/attention_cuda_kernel.h" <<'EOF'
// Written by scripts/parity_sptr.sh (not part of the sptr sdist): attention_cuda{.cpp,_kernel.cu}.
#ifndef SPTR_PARITY_ATTENTION_CUDA_KERNEL_H
#define SPTR_PARITY_ATTENTION_CUDA_KERNEL_H

#include <cuda_fp16.h>
#ifdef ENABLE_BF16
#include <cuda_bf16.h>
#endif

#ifndef __CUDACC__
#include <ATen/ATen.h>
// attention_cuda.cpp, bound in pointops_api.cpp
void attention_step1_forward_cuda(int N_q, int N_k, int M, int h, int hdim, unsigned int n_max,
    at::Tensor q, at::Tensor k, at::Tensor index0, at::Tensor index1, at::Tensor attn);
void attention_step1_backward_cuda(int N, int M, int h, int hdim, unsigned int n_max,
    at::Tensor grad_out, at::Tensor index0, at::Tensor index0_offsets, at::Tensor index1,
    at::Tensor index1_offsets, at::Tensor q, at::Tensor k, at::Tensor grad_q, at::Tensor grad_k);
void attention_step2_forward_cuda(int N, int M, int h, int hdim, int n_max,
    at::Tensor attn, at::Tensor v, at::Tensor index0_offsets, at::Tensor index1, at::Tensor output);
void attention_step2_backward_cuda(int N, int M, int h, int hdim, int n_max,
    at::Tensor grad_out, at::Tensor index0, at::Tensor index0_offsets, at::Tensor index1,
    at::Tensor index1_offsets, at::Tensor attn, at::Tensor v, at::Tensor grad_attn, at::Tensor grad_v);
#endif

// attention_cuda_kernel.cu: one launcher per element type T, named with its suffix
#define SPTR_PARITY_ATTENTION_LAUNCHERS(T, SFX)                                                        \
    void attention_step1_forward_cuda_launcher_##SFX(int N_q, int N_k, int M, int h, int hdim,        \
        unsigned int n_max, const T *q, const T *k, const int *index0, const int *index1, T *attn);    \
    void attention_step1_backward_cuda_launcher_##SFX(int N, int M, int h, int hdim,                  \
        unsigned int n_max, const T *grad_out, const int *index0, const int *index0_offsets,            \
        const int *index1, const int *index1_offsets, const T *q, const T *k, T *grad_q, T *grad_k);   \
    void attention_step2_forward_cuda_launcher_##SFX(int N, int M, int h, int hdim, int n_max,        \
        const T *attn, const T *v, const int *index0_offsets, const int *index1, T *output);          \
    void attention_step2_backward_cuda_launcher_##SFX(int N, int M, int h, int hdim, int n_max,       \
        const T *grad_out, const int *index0, const int *index0_offsets, const int *index1,           \
        const int *index1_offsets, const T *attn, const T *v, T *grad_attn, T *grad_v);

SPTR_PARITY_ATTENTION_LAUNCHERS(float, fp32)
SPTR_PARITY_ATTENTION_LAUNCHERS(__half, fp16)
#ifdef ENABLE_BF16
SPTR_PARITY_ATTENTION_LAUNCHERS(__nv_bfloat16, bf16)
#endif
#undef SPTR_PARITY_ATTENTION_LAUNCHERS

#endif  // SPTR_PARITY_ATTENTION_CUDA_KERNEL_H
EOF

    cat > "$top/sptr/src/precompute/precompute_cuda_kernel.h" <<'EOF'
// Written by scripts/parity_sptr.sh (not part of the sptr sdist): precompute{.cpp,_cuda_kernel.cu}.
#ifndef SPTR_PARITY_PRECOMPUTE_CUDA_KERNEL_H
#define SPTR_PARITY_PRECOMPUTE_CUDA_KERNEL_H

#ifndef __CUDACC__
#include <ATen/ATen.h>
// precompute.cpp, bound in pointops_api.cpp
void precompute_all_cuda(int N, int n, unsigned int n_max, at::Tensor counts, at::Tensor offsets,
    at::Tensor sq_offsets, at::Tensor index_0_offsets, at::Tensor index_1_offsets, at::Tensor index_0,
    at::Tensor index_1);
#endif

// precompute_cuda_kernel.cu
void precompute_all_cuda_launcher(int N, int n, unsigned int n_max, const int *counts, const int *offsets,
    const int *sq_offsets, int *index_0_offsets, int *index_1_offsets, int *index_0, int *index_1);

#endif  // SPTR_PARITY_PRECOMPUTE_CUDA_KERNEL_H
EOF

    cat > "$top/sptr/src/rpe/relative_pos_encoding_cuda_kernel.h" <<'EOF'
// Written by scripts/parity_sptr.sh (not part of the sptr sdist): relative_pos_encoding_cuda{.cpp,_kernel.cu}.
#ifndef SPTR_PARITY_RELATIVE_POS_ENCODING_CUDA_KERNEL_H
#define SPTR_PARITY_RELATIVE_POS_ENCODING_CUDA_KERNEL_H

#include <cuda_fp16.h>
#ifdef ENABLE_BF16
#include <cuda_bf16.h>
#endif

#ifndef __CUDACC__
#include <ATen/ATen.h>
// relative_pos_encoding_cuda.cpp, bound in pointops_api.cpp
void dot_prod_with_idx_forward_cuda(int N, int M, int h, int hdim, int n_max, int L, at::Tensor q,
    at::Tensor index_q, at::Tensor index_q_offsets, at::Tensor k, at::Tensor index_k, at::Tensor table_q,
    at::Tensor table_k, at::Tensor rel_idx, at::Tensor output);
void dot_prod_with_idx_backward_cuda(int N, int M, int h, int hdim, int n_max, int L, at::Tensor grad_out,
    at::Tensor q, at::Tensor index_q_offsets, at::Tensor k, at::Tensor index_k_offsets, at::Tensor index_k,
    at::Tensor table_q, at::Tensor table_k, at::Tensor rel_idx, at::Tensor grad_q, at::Tensor grad_k,
    at::Tensor grad_table_q, at::Tensor grad_table_k);
void dot_prod_with_idx_all_forward_cuda(int N, int M, int h, int hdim, int n_max, int L, at::Tensor q,
    at::Tensor index_q, at::Tensor index_q_offsets, at::Tensor k, at::Tensor index_k, at::Tensor table_q,
    at::Tensor table_k, at::Tensor rel_idx, at::Tensor output);
void dot_prod_with_idx_all_backward_cuda(int N, int M, int h, int hdim, int n_max, int L, at::Tensor grad_out,
    at::Tensor q, at::Tensor index_q_offsets, at::Tensor k, at::Tensor index_k_offsets, at::Tensor index_k,
    at::Tensor table_q, at::Tensor table_k, at::Tensor rel_idx, at::Tensor grad_q, at::Tensor grad_k,
    at::Tensor grad_table_q, at::Tensor grad_table_k);
void attention_step2_with_rel_pos_value_forward_cuda(int N, int M, int h, int hdim, int n_max,
    at::Tensor attn, at::Tensor v, at::Tensor index0_offsets, at::Tensor index1, at::Tensor table,
    at::Tensor rel_idx, at::Tensor output);
void attention_step2_with_rel_pos_value_backward_cuda(int N, int M, int h, int hdim, int L, int n_max,
    at::Tensor grad_out, at::Tensor index0, at::Tensor index0_offsets, at::Tensor index1,
    at::Tensor index1_offsets, at::Tensor attn, at::Tensor v, at::Tensor table, at::Tensor rel_idx,
    at::Tensor grad_attn, at::Tensor grad_v, at::Tensor grad_table);
#endif

// relative_pos_encoding_cuda_kernel.cu: one launcher per element type T, named with its suffix;
// rel_idx is read as char (3 per pair)
#define SPTR_PARITY_RPE_LAUNCHERS(T, SFX)                                                               \
    void dot_prod_with_idx_forward_cuda_launcher_##SFX(int N, int M, int h, int hdim, int n_max, int L, \
        const T *q, const int *index_q, const int *index_q_offsets, const T *k, const int *index_k,     \
        const T *table_q, const T *table_k, const char *rel_idx, T *output);                            \
    void dot_prod_with_idx_backward_cuda_launcher_##SFX(int N, int M, int h, int hdim, int n_max, int L,\
        const T *grad_out, const T *q, const int *index_q_offsets, const T *k,                          \
        const int *index_k_offsets, const int *index_k, const T *table_q, const T *table_k,             \
        const char *rel_idx, T *grad_q, T *grad_k, T *grad_table_q, T *grad_table_k);                   \
    void dot_prod_with_idx_all_forward_cuda_launcher_##SFX(int N, int M, int h, int hdim, int n_max,    \
        int L, const T *q, const int *index_q, const int *index_q_offsets, const T *k,                  \
        const int *index_k, const T *table_q, const T *table_k, const char *rel_idx, T *output);        \
    void dot_prod_with_idx_all_backward_cuda_launcher_##SFX(int N, int M, int h, int hdim, int n_max,   \
        int L, const T *grad_out, const T *q, const int *index_q_offsets, const T *k,                   \
        const int *index_k_offsets, const int *index_k, const T *table_q, const T *table_k,             \
        const char *rel_idx, T *grad_q, T *grad_k, T *grad_table_q, T *grad_table_k);                   \
    void attention_step2_with_rel_pos_value_forward_cuda_launcher_##SFX(int N, int M, int h, int hdim,  \
        int n_max, const T *attn, const T *v, const int *index0_offsets, const int *index1,             \
        const T *table, const char *rel_idx, T *output);                                                \
    void attention_step2_with_rel_pos_value_backward_cuda_launcher_##SFX(int N, int M, int h, int hdim, \
        int L, int n_max, const T *grad_out, const int *index0, const int *index0_offsets,              \
        const int *index1, const int *index1_offsets, const T *attn, const T *v, const T *table,        \
        const char *rel_idx, T *grad_attn, T *grad_v, T *grad_table);

SPTR_PARITY_RPE_LAUNCHERS(float, fp32)
SPTR_PARITY_RPE_LAUNCHERS(__half, fp16)
#ifdef ENABLE_BF16
SPTR_PARITY_RPE_LAUNCHERS(__nv_bfloat16, bf16)
#endif
#undef SPTR_PARITY_RPE_LAUNCHERS

#endif  // SPTR_PARITY_RELATIVE_POS_ENCODING_CUDA_KERNEL_H
EOF
}
write_headers "$work/hdr"
for path in "${HEADERS[@]}"; do [ -s "$work/hdr/$path" ] || { echo "parity_sptr: $path not written" >&2; exit 1; }; done
# An earlier version of this script cached other header copies here; they are not used any more.
rm -rf "$CACHE/sptr-$VER-headers"

# 3. the buildable archive
stamp=$( (echo "$SDIST_SHA"; cd "$work/hdr" && cat "${HEADERS[@]}"; echo v2) | sha256sum | cut -c1-64)
cp -f "$CACHE/$SDIST" "$DEST/$SDIST"
if [ -f "$DEST/sptr-$VER-src.tar.gz" ] && [ "$(cat "$DEST/sptr.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "parity_sptr: $DEST/sptr-$VER-src.tar.gz is up to date"
else
    mkdir -p "$work/src"
    tar xzf "$CACHE/$SDIST" -C "$work/src"
    top="$work/src/sptr-$VER"
    for path in "${HEADERS[@]}"; do
        [ ! -e "$top/$path" ] || { echo "parity_sptr: $path is in the sdist already: check the sdist" >&2; exit 1; }
        cp "$work/hdr/$path" "$top/$path"
    done
    # PyTorch 2.x has no THC: drop any live include of it (1.1.1 has it commented out).
    { grep -rlE '^[[:space:]]*#include[[:space:]]*<THC/' "$top/sptr/src" || true; } | while read -r f; do
        sed -i -E '/^[[:space:]]*#include[[:space:]]*<THC\//d' "$f"; echo "dropped a THC include from ${f#"$top/"}"
    done
    (cd "$work/src" && find "sptr-$VER" -type f | LC_ALL=C sort > "$work/files.txt" &&
        tar --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - -T "$work/files.txt") | gzip -9n > "$DEST/sptr-$VER-src.tar.gz.tmp"
    mv "$DEST/sptr-$VER-src.tar.gz.tmp" "$DEST/sptr-$VER-src.tar.gz"
    echo "$stamp" > "$DEST/sptr.stamp"
fi

# What must be inside.
list=$(tar tzf "$DEST/sptr-$VER-src.tar.gz")
for want in setup.py sptr/functional.py sptr/src/pointops_api.cpp sptr/src/cuda_utils.h \
    sptr/src/attention/attention_cuda_kernel.cu sptr/src/attention/attention_cuda_kernel.h \
    sptr/src/precompute/precompute_cuda_kernel.h sptr/src/rpe/relative_pos_encoding_cuda_kernel.cu \
    sptr/src/rpe/relative_pos_encoding_cuda_kernel.h; do
    echo "$list" | grep -qx "sptr-$VER/$want" || { echo "parity_sptr: $want missing from the archive" >&2; exit 1; }
done
echo "parity_sptr: $DEST/sptr-$VER-src.tar.gz $(stat -c %s "$DEST/sptr-$VER-src.tar.gz") bytes ($(echo "$list" | wc -l) files)"
