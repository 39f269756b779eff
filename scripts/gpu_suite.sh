#!/usr/bin/env bash
# The GPU runner: build here, run there.
#
#   scripts/gpu_suite.sh build            # on the dev machine (no GPU needed): builds the release
#                                         # GPU test and bench binaries (--no-default-features
#                                         # --features cuda, no r2r) into gpu-stage/
#   scripts/gpu_suite.sh run OUT_DIR      # on the GPU host, from the repo root with gpu-stage/
#                                         # beside it: runs every test binary with
#                                         # SPTR_REQUIRE_GPU=1 and the benchmarks; logs in OUT_DIR
#                                         # (SPTR_SUITE_TESTS_ONLY=1: the tests alone;
#                                         # SPTR_SUITE_BENCH_ONLY=1: the benchmarks and replays alone,
#                                         # e.g. after the tests ran beside other GPU work)
#
# gpu-stage/ is git-ignored and self-contained (binaries, a manifest, the benchmark cloud), so it
# can be shipped to a GPU host as it is (e.g. carried by the device tool, or rsync'ed); build also
# packs it as gpu-stage.tar.xz, which `run` unpacks when gpu-stage/ is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=gpu-stage

build() {
    rm -rf "$STAGE" && mkdir -p "$STAGE/bin"
    local json
    json=$(cargo test --release --no-default-features --features cuda --no-run --message-format=json 2>/dev/null)
    echo "$json" | python3 -c '
import json, sys, shutil, os
stage = sys.argv[1]
names = []
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"][0]
        name = m["target"]["name"] + ("-lib" if kind == "lib" else "")
        shutil.copy2(m["executable"], os.path.join(stage, "bin", "test-" + name))
        os.system("strip --strip-debug " + os.path.join(stage, "bin", "test-" + name))
        names.append("test-" + name)
open(os.path.join(stage, "tests.txt"), "w").write("\n".join(sorted(names)) + "\n")
print("staged tests:", " ".join(sorted(names)))
' "$STAGE"
    cargo build --release --no-default-features --features cuda --bin sptr
    cp "${CARGO_TARGET_DIR:-target}/release/sptr" "$STAGE/bin/sptr" && strip --strip-debug "$STAGE/bin/sptr"
    local dense=../shared/data/dense-cloud/benchmark-pc.bin
    if [ -f "$dense" ]; then
        cp "$dense" "$STAGE/benchmark-pc.bin"
    fi
    git rev-parse --short HEAD > "$STAGE/commit.txt" 2>/dev/null || true
    check_stage_paths
    # One compressed file to ship (the device tool carries at most 64 MiB, parity wheels included).
    tar -cf - "$STAGE" | xz -T2 -6 > "$STAGE.tar.xz"
    du -sh "$STAGE" "$STAGE.tar.xz"
}

# The staged binaries run where the tree is unpacked at another path: they must find fixtures
# and configs at run time through sptr::repo_root ($SPTR_ROOT, which `run` sets, else the tree
# they sit in), the one reader of CARGO_MANIFEST_DIR (its last fallback, the bare directory); no
# path under this build's tree (tests/..., config/..., kernels/...) may be compiled into them.
check_stage_paths() {
    local root=$PWD b found
    found=$(grep -rl CARGO_MANIFEST_DIR src tests | grep -vx src/lib.rs || true)
    if [ -n "$found" ]; then
        echo "gpu_suite.sh: only sptr::repo_root may read CARGO_MANIFEST_DIR; also in:" $found >&2
        exit 1
    fi
    found=$(for b in "$STAGE"/bin/*; do
        strings -a "$b" | grep -F -e "$root/tests/" -e "$root/config/" -e "$root/kernels/" \
            | sed "s|^|$(basename "$b"): |" || true
    done)
    if [ -n "$found" ]; then
        echo "gpu_suite.sh: staged binaries hold paths under $root (use sptr::repo_root / tests/common root()):" >&2
        echo "$found" | head -20 >&2
        exit 1
    fi
    echo "staged binaries: no path under $root"
}

run() {
    local out=${1:?usage: gpu_suite.sh run OUT_DIR}
    mkdir -p "$out"
    [ -d "$STAGE" ] || [ ! -f "$STAGE.tar.xz" ] || tar -xJf "$STAGE.tar.xz"
    # The GPU host has CUDA 13's libnvjpeg: the nvJPEG test must not skip there.
    # SPTR_ROOT: the unpacked tree (this script's repository root), where the tests and the CLI
    # read fixtures and configs; SPTR_EXE: the staged CLI the tests run.
    export SPTR_REQUIRE_GPU=1 SPTR_REQUIRE_NVRTC=1 SPTR_REQUIRE_NVJPEG=1 SPTR_ROOT="$PWD" SPTR_EXE="$PWD/$STAGE/bin/sptr"
    export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export SPTR_KERNEL_CACHE="${SPTR_KERNEL_CACHE:-/tmp/sptr-kernels}"
    local summary="$out/summary.txt" failed=0
    {
        echo "commit $(cat "$STAGE/commit.txt" 2>/dev/null || echo unknown)"
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
        "$STAGE/bin/sptr" info 2>&1 || true
    } | tee "$summary"
    while read -r t; do
        [ -n "$t" ] || continue
        [ "${SPTR_SUITE_BENCH_ONLY:-0}" = 1 ] && break
        if "$STAGE/bin/$t" --test-threads=1 --nocapture > "$out/$t.log" 2>&1; then
            echo "PASS $t $(grep -E '^test result' "$out/$t.log" | tail -1)" | tee -a "$summary"
        else
            failed=1
            echo "FAIL $t (log: $out/$t.log)" | tee -a "$summary"
            { grep -E "panicked|FAILED|error" "$out/$t.log" | head -20 | tee -a "$summary"; } || true
        fi
    done < "$STAGE/tests.txt"
    # Per-case GPU numbers printed by the tests (errors vs CPU, timings).
    grep -hE "rel err|cuda [0-9.]+ ms|nvjpeg_vs_zune" "$out"/test-*.log | tee -a "$summary" > /dev/null || true
    # SPTR_SUITE_TESTS_ONLY=1: the tests alone (the benchmarks take several minutes more)
    if [ "${SPTR_SUITE_TESTS_ONLY:-0}" = 1 ]; then
        [ "$failed" = 0 ] && echo "GPU TESTS: ALL PASSED" | tee -a "$summary" || echo "GPU TESTS: FAILURES" | tee -a "$summary"
        return "$failed"
    fi
    local cloud="$STAGE/benchmark-pc.bin"
    [ -f "$cloud" ] || cloud=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
    local stride=3
    case "$cloud" in *.pcd.bin) stride=5 ;; esac
    "$STAGE/bin/sptr" bench voxelize "$cloud" --stride "$stride" --voxel-size 0.05 --batch2 --iters 50 \
        > "$out/bench_voxelize_dense.json" 2>> "$out/bench.log" || failed=1
    local nus=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
    "$STAGE/bin/sptr" bench voxelize "$nus" --stride 5 --model config/models/sphereformer_nuscenes.yaml --iters 50 \
        > "$out/bench_voxelize_nuscenes.json" 2>> "$out/bench.log" || failed=1
    "$STAGE/bin/sptr" bench spconv "$cloud" --stride "$stride" --voxel-size 0.05 --batch2 --iters 50 \
        > "$out/bench_spconv_dense.jsonl" 2>> "$out/bench.log" || failed=1
    "$STAGE/bin/sptr" bench spconv "$nus" --stride 5 --voxel-size 0.05 --iters 50 \
        > "$out/bench_spconv_nuscenes.jsonl" 2>> "$out/bench.log" || failed=1
    "$STAGE/bin/sptr" bench attention "$cloud" --stride "$stride" --voxel-size 0.05 --batch2 --iters 30 \
        > "$out/bench_attention_dense.jsonl" 2>> "$out/bench.log" || failed=1
    "$STAGE/bin/sptr" bench attention "$nus" --stride 5 --model config/models/sphereformer_nuscenes.yaml --iters 30 \
        > "$out/bench_attention_nuscenes.jsonl" 2>> "$out/bench.log" || failed=1
    # SphereFormer end to end (random weights): the dense cloud with the SemanticKITTI model, the
    # nuScenes sample with its own
    "$STAGE/bin/sptr" bench model "$cloud" --format xyz --model config/models/sphereformer_semantickitti.yaml \
        --case dense --iters 20 > "$out/bench_model_dense.jsonl" 2>> "$out/bench.log" || failed=1
    "$STAGE/bin/sptr" bench model "$nus" --model config/models/sphereformer_nuscenes.yaml \
        --case nuscenes --iters 20 > "$out/bench_model_nuscenes.jsonl" 2>> "$out/bench.log" || failed=1
    # Precision: fp16 / bf16 / fp32 / auto side by side, models loaded together and
    # timed in turn, three rounds (random in-range weights: auto runs the FP16 path; after a
    # switch it runs the FP32 one, so fp32's line is its cost then)
    "$STAGE/bin/sptr" bench model "$nus" --model config/models/sphereformer_nuscenes.yaml --case nuscenes \
        --precision fp16,bf16,fp32,auto --rounds 3 --iters 20 > "$out/bench_model_precision_nuscenes.jsonl" 2>> "$out/bench.log" || failed=1
    "$STAGE/bin/sptr" bench model "$cloud" --format xyz --model config/models/sphereformer_semantickitti.yaml --case dense \
        --precision fp16,bf16,fp32,auto --rounds 3 --iters 20 > "$out/bench_model_precision_dense.jsonl" 2>> "$out/bench.log" || failed=1
    # A/B (the precision modes must leave the FP16 speed unchanged): when the stage holds
    # sptr-before (the CLI built at an older commit by hand: a worktree at that commit, `cargo
    # build --release --no-default-features --features cuda --bin sptr`, the binary copied in), the
    # SphereFormer FP16 forward of both in alternating rounds, same run
    if [ -x "$STAGE/bin/sptr-before" ]; then
        for r in 1 2 3; do
            for b in sptr-before sptr; do
                for c in "nuscenes $nus config/models/sphereformer_nuscenes.yaml nuscenes" \
                         "dense $cloud config/models/sphereformer_semantickitti.yaml xyz"; do
                    set -- $c
                    "$STAGE/bin/$b" bench model "$2" --format "$4" --model "$3" --case "$1" --iters 20 2>> "$out/bench.log" \
                        | sed "s/^/{\"ab\": \"$b\", \"round\": $r, \"line\": /; s/\$/}/" >> "$out/bench_model_ab.jsonl" || failed=1
                done
            done
        done
    fi
    # Lift-splat view transform: geometry build and bev_pool, seg and detection geometries
    "$STAGE/bin/sptr" bench bevpool --iters 100 > "$out/bench_bevpool.jsonl" 2>> "$out/bench.log" || failed=1
    # Camera input per frame: decode of the six nuScenes JPEGs, upload, resize + normalize;
    # zune-jpeg on the host and nvJPEG on the device side by side, 3 alternating rounds
    "$STAGE/bin/sptr" bench camera-input tests/data/nuscenes/*.jpg --model config/models/bevfusion_seg_camera.yaml \
        --iters 50 > "$out/bench_camera_input.json" 2>> "$out/bench.log" || failed=1
    # BEVFusion's camera encoder (random weights, 6 x 256 x 704): Swin-T alone and Swin-T + neck,
    # FLOPs and the tensor-core floor
    "$STAGE/bin/sptr" bench camera --iters 50 > "$out/bench_camera.jsonl" 2>> "$out/bench.log" || failed=1
    # BEVFusion's LiDAR branch: ten synthetic sweeps of the nuScenes cloud (346,880 points),
    # hard voxelization from host points and the SparseEncoder to the 128 x 128 x 256 BEV map
    "$STAGE/bin/sptr" bench lidar-encoder "$nus" --iters 50 > "$out/bench_lidar_encoder.json" 2>> "$out/bench.log" || failed=1
    # BEVFusion BEV map segmentation end to end (random weights): the six nuScenes JPEGs
    # (+ the sweep for fusion) on the host -> masks on the host, per-stage medians, peak memory
    for m in fusion camera; do
        "$STAGE/bin/sptr" bench bevseg --model config/models/bevfusion_seg_$m.yaml --iters 50 \
            > "$out/bench_bevseg_$m.json" 2>> "$out/bench.log" || failed=1
    done
    # ... and the fusion model on a nuScenes-sized aggregated cloud (ten synthetic sweeps, ~350k points)
    "$STAGE/bin/sptr" bench bevseg --model config/models/bevfusion_seg_fusion.yaml --sweeps 10 --iters 50 \
        > "$out/bench_bevseg_fusion_10sweeps.json" 2>> "$out/bench.log" || failed=1
    # BEVFusion's fuser, BEV decoders and map head (random weights, 128 x 128 BEV): cuDNN vs
    # im2col + cuBLAS per part, both seg models
    "$STAGE/bin/sptr" bench bev-decoder --iters 50 > "$out/bench_bev_decoder.jsonl" 2>> "$out/bench.log" || failed=1
    # The node's per-frame work without ROS (the pipeline latency), 200 frames, full model
    # (SemanticKITTI: the default params file's obstacle classes are its class ids)
    "$STAGE/bin/sptr" bench pipeline "$nus" --model config/models/sphereformer_semantickitti.yaml --device cuda \
        --frames 200 > "$out/bench_pipeline_nuscenes.json" 2>> "$out/bench.log" || failed=1
    # ... and with the six cameras and the fused BEV map (target: p99 <= 30 ms, no frame over
    # its 100 ms period, flat host and device memory), paced at 10 Hz for 60 s
    "$STAGE/bin/sptr" bench pipeline "$nus" --cameras --params config/perception_nuscenes_cameras.yaml \
        --camera-weights random:0 --device cuda --rate-hz 10 --duration-s 60 \
        > "$out/bench_pipeline_cameras.json" 2>> "$out/bench.log" || failed=1
    # ... and the five-camera 1920 x 1080 rig (tests/data/rig5: its own camera names, intrinsics
    # and extrinsics, calibrated from its file) through the full fusion map model, unpaced
    "$STAGE/bin/sptr" bench pipeline "$nus" --cameras --params tests/data/rig5/perception_rig5.yaml \
        --bag tests/data/bags/rig5_1920x1080 --camera-weights random:0 --device cuda --frames 100 \
        > "$out/bench_pipeline_rig5.json" 2>> "$out/bench.log" || failed=1
    # Replay the sample bag on the GPU and on the CPU: the same labels (>= 99.5 %), report latency
    for dev in cuda cpu; do
        "$STAGE/bin/sptr" replay tests/data/bags/nuscenes_sample --model config/models/sphereformer_nuscenes.yaml \
            --params config/perception_nuscenes.yaml --random-weights 0 --device "$dev" --out "$out/replay_$dev" > "$out/replay_$dev.log" 2>&1 || failed=1
    done
    "$STAGE/bin/sptr" eval agreement "$out/replay_cuda" "$out/replay_cpu" --min 0.995 > "$out/replay_agreement.log" 2>&1 || failed=1
    # ... and with the six cameras through the full BEVFusion fusion map model: the same
    # labels and the same BEV map bits on >= 99.9 % of cells x classes
    for dev in cuda cpu; do
        "$STAGE/bin/sptr" replay tests/data/bags/nuscenes_sample --model config/models/sphereformer_nuscenes.yaml \
            --params config/perception_nuscenes_cameras.yaml --random-weights 0 --camera-weights random:0 \
            --device "$dev" --out "$out/replay_cameras_$dev" > "$out/replay_cameras_$dev.log" 2>&1 || failed=1
    done
    "$STAGE/bin/sptr" eval agreement "$out/replay_cameras_cuda" "$out/replay_cameras_cpu" --min 0.995 --min-map 0.999 \
        >> "$out/replay_agreement.log" 2>&1 || failed=1
    grep -hE "latency|throughput|frames" "$out"/replay_*.log | tee -a "$summary" > /dev/null || true
    tee -a "$summary" < "$out/replay_agreement.log" > /dev/null
    cat "$out"/bench_*.json "$out"/bench_*.jsonl | tee -a "$summary"
    [ "$failed" = 0 ] && echo "GPU SUITE: ALL PASSED" | tee -a "$summary" || echo "GPU SUITE: FAILURES" | tee -a "$summary"
    return "$failed"
}

case "${1:-}" in
    build) build ;;
    run) shift; run "$@" ;;
    *) echo "usage: $0 build | run OUT_DIR" >&2; exit 2 ;;
esac
