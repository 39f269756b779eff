#!/usr/bin/env bash
# The GPU tests with every kernel compiled by NVRTC 12.6 (JetPack 6's release) instead of the
# host's NVRTC 13, and SphereFormer's forward timed with each in alternating rounds.
#
#   scripts/gpu_nvrtc12.sh pack             # here: NVRTC 12.6 and the CUDA 12.6 headers from the
#                                           # PyPI wheels (SPTR_CUDA_MAJOR=12 scripts/cuda_env.sh)
#                                           # into nvrtc12.tar.xz (~17 MB, git-ignored)
#   scripts/gpu_nvrtc12.sh run OUT [TEST...]
#                                           # on the GPU host, from the repo root with gpu-stage/
#                                           # (scripts/gpu_suite.sh build) and nvrtc12.tar.xz
#                                           # beside it: the staged test binaries TEST (default:
#                                           # all of gpu-stage/tests.txt) with SPTR_REQUIRE_GPU=1,
#                                           # then the A/B; summary in OUT/nvrtc12.txt
#                                           # (SPTR_NVRTC12_TESTS_ONLY=1: the tests alone, e.g.
#                                           # beside other test runs, where a timing means nothing)
#
# cudarc opens `libnvrtc.so` before `libnvrtc.so.13`, so a directory holding `libnvrtc.so` ->
# 12.6's library, first on LD_LIBRARY_PATH, makes every process load 12.6; `sptr info` in the
# summary shows which NVRTC each half ran with. Each half has its own kernel cache.
set -euo pipefail
cd "$(dirname "$0")/.."

pack() {
    local lines base
    lines=$(SPTR_CUDA_MAJOR=12 bash scripts/cuda_env.sh --print)
    base=$(echo "$lines" | sed -n 's|^export LD_LIBRARY_PATH=\(.*\)/cuda_nvrtc/lib$|\1|p')
    [ -n "$base" ] || { echo "gpu_nvrtc12.sh: no NVRTC 12.6 venv ($lines)" >&2; exit 1; }
    local tmp
    tmp=$(mktemp -d)
    mkdir -p "$tmp/nvrtc12/lib"
    cp "$base/cuda_nvrtc/lib/libnvrtc.so.12" "$base"/cuda_nvrtc/lib/libnvrtc-builtins.so.12.* "$tmp/nvrtc12/lib/"
    ln -s libnvrtc.so.12 "$tmp/nvrtc12/lib/libnvrtc.so"
    cp -r "$base/cuda_runtime/include" "$tmp/nvrtc12/include"
    tar -C "$tmp" -cf - nvrtc12 | xz -T2 -6 > nvrtc12.tar.xz
    rm -rf "$tmp"
    ls -la nvrtc12.tar.xz
}

run() {
    local out=${1:?usage: gpu_nvrtc12.sh run OUT [TEST...]}
    shift
    mkdir -p "$out/logs"
    local dir=/tmp/sptr-nvrtc12
    [ -d "$dir/nvrtc12" ] || { mkdir -p "$dir" && tar -xJf nvrtc12.tar.xz -C "$dir"; }
    local cuda_lib="${CUDA_HOME:-/usr/local/cuda}/lib64"
    export SPTR_REQUIRE_GPU=1 SPTR_REQUIRE_NVRTC=1 SPTR_ROOT="$PWD" SPTR_EXE="$PWD/gpu-stage/bin/sptr"
    # the environment of each half: NVRTC 12.6 (its headers first) or the host's NVRTC 13
    local env12=(env "LD_LIBRARY_PATH=$dir/nvrtc12/lib:$cuda_lib" "SPTR_CUDA_INCLUDE=$dir/nvrtc12/include" SPTR_KERNEL_CACHE=/tmp/sptr-kernels-12)
    local env13=(env "LD_LIBRARY_PATH=$cuda_lib" SPTR_KERNEL_CACHE=/tmp/sptr-kernels-13)
    in_half() { # 12|13 COMMAND...
        if [ "$1" = 12 ]; then "${env12[@]}" "${@:2}"; else "${env13[@]}" "${@:2}"; fi
    }
    local summary="$out/nvrtc12.txt" failed=0
    {
        echo "== NVRTC 12.6 half"
        "${env12[@]}" gpu-stage/bin/sptr info 2>&1 | grep -E "NVRTC|GPU"
        echo "== NVRTC 13 half"
        "${env13[@]}" gpu-stage/bin/sptr info 2>&1 | grep -E "NVRTC|GPU"
    } | tee "$summary"
    local info12
    info12=$("${env12[@]}" gpu-stage/bin/sptr info 2>&1 || true)
    if ! grep -Eq "^ +NVRTC +12\.6 " <<< "$info12"; then
        echo "gpu_nvrtc12.sh: the NVRTC 12.6 half did not load NVRTC 12.6" | tee -a "$summary"
        return 1
    fi
    local tests=("$@")
    [ ${#tests[@]} -gt 0 ] || mapfile -t tests < gpu-stage/tests.txt
    for t in "${tests[@]}"; do
        [ -n "$t" ] || continue
        t=test-${t#test-}
        if "${env12[@]}" "gpu-stage/bin/$t" --test-threads=1 > "$out/logs/$t.log" 2>&1; then
            echo "PASS (NVRTC 12.6) $t $(grep -E '^test result' "$out/logs/$t.log" | tail -1)" | tee -a "$summary"
        else
            failed=1
            echo "FAIL (NVRTC 12.6) $t (log: $out/logs/$t.log)" | tee -a "$summary"
            grep -E "panicked|FAILED" "$out/logs/$t.log" | head -10 | tee -a "$summary" || true
        fi
    done
    if [ "${SPTR_NVRTC12_TESTS_ONLY:-0}" = 1 ]; then
        [ "$failed" = 0 ] && echo "NVRTC 12.6 GPU TESTS: ALL PASSED" | tee -a "$summary" || echo "NVRTC 12.6 GPU TESTS: FAILURES" | tee -a "$summary"
        return "$failed"
    fi
    # SphereFormer's FP16 forward on the nuScenes sweep with each NVRTC's kernels, 3 alternating rounds
    local nus
    nus=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
    for r in 1 2 3; do
        for half in 13 12; do
            local line
            line=$(in_half "$half" gpu-stage/bin/sptr bench model "$nus" --model config/models/sphereformer_nuscenes.yaml \
                --case nuscenes --iters 20 2>> "$out/logs/bench.log" | tail -n 1) || { failed=1; continue; }
            echo "{\"nvrtc\": \"$half\", \"round\": $r, \"line\": $line}" >> "$out/nvrtc12_bench.jsonl"
        done
    done
    [ "$failed" = 0 ] && echo "NVRTC 12.6 GPU TESTS: ALL PASSED" | tee -a "$summary" || echo "NVRTC 12.6 GPU TESTS: FAILURES" | tee -a "$summary"
    return "$failed"
}

case "${1:-}" in
    pack) pack ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 pack | run OUT [TEST...]" >&2; exit 2 ;;
esac
