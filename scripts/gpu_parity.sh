#!/usr/bin/env bash
# Parity against the upstream libraries on the GPU host (see tests/parity/README.md).
#
#   scripts/gpu_parity.sh OUT_DIR [spconv] [attention] [model] [lss] [camera] [lidarenc] [bevdecoder] [bevseg] [camdecode]
#                                                                  # default: all of them
#
# Runs from the repo root with gpu-stage/ (scripts/gpu_suite.sh build) and .parity-wheels/
# (scripts/parity_wheels.sh for spconv, scripts/parity_sptr.sh for sptr) beside it. spconv comes
# as packed wheels; sptr 1.1.1 (a PyPI sdist) is built there with the host's PyTorch
# (TORCH_CUDA_ARCH_LIST=9.0, a minute or two). Each Python harness writes a reference directory,
# then the parity module of the matching Rust test target (gpu-stage/bin/test-<target> parity::,
# e.g. test-ops_sparse_conv: the libtest name filter runs that module's tests alone) checks and
# times ours beside it.
# Logs and JSON lines land in OUT_DIR; the exit status is non-zero if anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: gpu_parity.sh OUT_DIR [spconv] [attention] [model] [lss] [camera] [lidarenc] [bevdecoder] [bevseg] [camdecode]}
shift
what=${*:-spconv attention model lss camera lidarenc bevdecoder bevseg camdecode}
[ -d gpu-stage ] || [ ! -f gpu-stage.tar.xz ] || tar -xJf gpu-stage.tar.xz
mkdir -p "$out"
export PYTHONUNBUFFERED=1 SPTR_ROOT=$PWD SPTR_KERNEL_CACHE=${SPTR_KERNEL_CACHE:-/tmp/sptr-kernels}
export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
rc=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/parity_gpu.txt" 2>&1
for w in $what; do
    case $w in
    spconv)
        python3 -c 'import tarfile; tarfile.open(".parity-wheels/site.tar.xz").extractall("/tmp/site")' || { rc=1; continue; }
        PYTHONPATH=/tmp/site python3 tests/parity/spconv_parity.py --out /tmp/parity > "$out/spconv_py.log" 2>&1 || rc=1
        SPTR_PARITY_DIR=/tmp/parity gpu-stage/bin/test-ops_sparse_conv parity:: --test-threads=1 --nocapture > "$out/spconv_rust.log" 2>&1 || rc=1
        # -o: the first case prints on the line of the test name (libtest), so not at a line start
        grep -o '{"case".*' "$out/spconv_rust.log" > "$out/spconv_parity.jsonl"
        ;;
    attention)
        if [ ! -d /tmp/sptr-site/sptr ] && ! ls /tmp/sptr-site/sptr* > /dev/null 2>&1; then
            MAX_JOBS=16 TORCH_CUDA_ARCH_LIST=9.0 python3 -m pip install -q --no-build-isolation --no-deps --no-index \
                --target /tmp/sptr-site .parity-wheels/sptr-1.1.1-src.tar.gz > "$out/sptr_build.log" 2>&1 \
                || { tail -n 60 "$out/sptr_build.log"; rc=1; continue; }
        fi
        PYTHONPATH=/tmp/sptr-site python3 tests/parity/sptr_parity.py --out /tmp/sptr-parity > "$out/sptr_py.log" 2>&1 || rc=1
        cp /tmp/sptr-parity/manifest.json "$out/sptr_manifest.json" 2>/dev/null
        SPTR_ATTN_PARITY_DIR=/tmp/sptr-parity gpu-stage/bin/test-ops_attention parity:: --test-threads=1 --nocapture \
            > "$out/attention_rust.log" 2>&1 || rc=1
        grep -o '{"case".*' "$out/attention_rust.log" > "$out/attention_parity.jsonl"
        ;;
    model)
        # SphereFormer end to end: upstream's network in PyTorch (spconv; sptr's ops when built by the
        # attention part, else the harness's plain-torch attention) from random weights and upstream's
        # own preprocessing, then ours from the same weights and inputs (tests/sphereformer/parity.rs).
        [ -d /tmp/site/spconv ] || python3 -c 'import tarfile; tarfile.open(".parity-wheels/site.tar.xz").extractall("/tmp/site")' \
            || { rc=1; continue; }
        pp=/tmp/site; [ -d /tmp/sptr-site ] && pp=/tmp/site:/tmp/sptr-site
        nus=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
        rm -rf /tmp/model-parity
        # both run on our preprocessing's voxels (upstream's own has duplicate coordinates that spconv
        # resolves nondeterministically); upstream's voxels are kept to compare the preprocessing
        for spec in "nuscenes config/models/sphereformer_nuscenes.yaml $nus 5 nuscenes" \
                    "dense config/models/sphereformer_semantickitti.yaml gpu-stage/benchmark-pc.bin 3 xyz"; do
            set -- $spec
            d=/tmp/model-parity/$1
            [ -f "$3" ] || { echo "model parity: $3 missing, case $1 skipped" >> "$out/model_py.log"; continue; }
            mkdir -p "$d"
            printf '{"model": "%s", "cloud": "%s", "cols": %s}\n' "$2" "$3" "$4" > "$d/case.json"
            {
                PYTHONPATH=$pp python3 tests/parity/sphereformer_ref.py --model "$2" --random-weights "$d/weights.safetensors" --seed 20261121 &&
                PYTHONPATH=$pp python3 tests/parity/sphereformer_ref.py --model "$2" --make-inputs "$3" --cols "$4" --inputs "$d/upstream_inputs" &&
                gpu-stage/bin/sptr prepare "$3" --format "$5" --model "$2" --out "$d/inputs" &&
                PYTHONPATH=$pp python3 tests/parity/sphereformer_ref.py --model "$2" --weights "$d/weights.safetensors" \
                    --inputs "$d/inputs" --out "$d/ref" --bench --iters 20
            } >> "$out/model_py.log" 2>&1 || rc=1
        done
        SPTR_MODEL_PARITY_DIR=/tmp/model-parity gpu-stage/bin/test-sphereformer parity:: --test-threads=1 --nocapture \
            > "$out/model_rust.log" 2>&1 || rc=1
        grep -o '{"case".*' "$out/model_rust.log" > "$out/model_parity.jsonl"
        ;;
    lss)
        # Lift-splat geometry + bev_pool: upstream's get_geometry and bev_pool in plain
        # PyTorch (tests/parity/lss_ref.py, nothing to install), then ours from the same
        # calibration and FP16 inputs (tests/bevfusion_lss/parity.rs): identical cells and intervals,
        # pooled rel <= 1e-3, our pool's time beside PyTorch's scatter-add and upstream's path
        rm -rf /tmp/lss-parity
        python3 tests/parity/lss_ref.py --out /tmp/lss-parity --iters 50 > "$out/lss_py.log" 2>&1 || rc=1
        cp /tmp/lss-parity/ref.json "$out/lss_ref.json" 2>/dev/null
        SPTR_LSS_PARITY_DIR=/tmp/lss-parity gpu-stage/bin/test-bevfusion_lss parity:: --test-threads=1 --nocapture \
            > "$out/lss_rust.log" 2>&1 || rc=1
        grep -o '{"case".*' "$out/lss_rust.log" > "$out/lss_parity.jsonl"
        ;;
    camera)
        # BEVFusion's camera encoder (Swin-T + GeneralizedLSSFPN): the six nuScenes images through our
        # preprocessing and random weights (sptr camera-features writes both), the PyTorch reference of
        # the upstream modules on them (timm's Swin-T timed beside it), then ours compared per stage
        # and timed in the same run (tests/bevfusion_camera_encoder/parity.rs). Needs torch; timm for its timing.
        d=/tmp/camera-parity
        m=config/models/bevfusion_seg_camera.yaml
        rm -rf "$d" && mkdir -p "$d" && echo "$m" > "$d/model.txt"
        {
            gpu-stage/bin/sptr camera-features tests/data/nuscenes/*__CAM_*.jpg --model "$m" --random-weights 2026 \
                --save-weights "$d/weights.safetensors" --save-input "$d/input.npy" --stages --device cuda --out "$d/ours" &&
            python3 tests/parity/bevfusion_camera_ref.py --model "$m" --weights "$d/weights.safetensors" \
                --input "$d/input.npy" --out "$d/ref" --bench --timm
        } > "$out/camera_py.log" 2>&1 || rc=1
        SPTR_CAMERA_PARITY_DIR=$d gpu-stage/bin/test-bevfusion_camera_encoder parity:: --test-threads=1 --nocapture \
            > "$out/camera_rust.log" 2>&1 || rc=1
        grep -o '{"case".*\|{"bench".*' "$out/camera_rust.log" > "$out/camera_parity.jsonl"
        ;;
    lidarenc)
        # BEVFusion's LiDAR branch: hard voxelization + SparseEncoder written from upstream on
        # spconv 2.x (tests/parity/lidar_encoder_ref.py) with random weights it saves in the released
        # checkpoints' spconv 1.x layout, on ten synthetic sweeps of the nuScenes cloud; then ours from
        # the same weights and points, per stage and timed (tests/bevfusion_lidar_encoder/parity.rs)
        [ -d /tmp/site/spconv ] || python3 -c 'import tarfile; tarfile.open(".parity-wheels/site.tar.xz").extractall("/tmp/site")' \
            || { rc=1; continue; }
        d=/tmp/lidarenc-parity
        m=config/models/bevfusion_seg_fusion.yaml
        nus=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
        rm -rf "$d" && mkdir -p "$d"
        {
            PYTHONPATH=/tmp/site python3 tests/parity/lidar_encoder_ref.py --model "$m" --random-weights "$d/weights.safetensors" --seed 20261124 &&
            PYTHONPATH=/tmp/site python3 tests/parity/lidar_encoder_ref.py --model "$m" --weights "$d/weights.safetensors" \
                --cloud "$nus" --sweeps 10 --out "$d/ref" --bench --iters 20
        } > "$out/lidarenc_py.log" 2>&1 || rc=1
        cp "$d/ref/ref.json" "$out/lidarenc_ref.json" 2>/dev/null
        SPTR_LIDAR_PARITY_DIR=$d gpu-stage/bin/test-bevfusion_lidar_encoder parity:: --test-threads=1 --nocapture \
            > "$out/lidarenc_rust.log" 2>&1 || rc=1
        grep -o '{"case".*\|{"bench".*' "$out/lidarenc_rust.log" > "$out/lidarenc_parity.jsonl"
        ;;
    bevseg)
        # BEVFusion BEV map segmentation end to end, both models: ours on CUDA from the six
        # nuScenes JPEGs (+ the sweep) with random weights, every stage dumped (sptr bevseg
        # --dump-stages writes the weights and the preprocessed images too), then the PyTorch reference
        # of the upstream model on the same images, points and weights (tests/parity/
        # bevfusion_seg_ref.py: torch, spconv from the packed wheels for the LiDAR encoder): per-stage
        # rel errors vs its FP32, mask agreement at 0.5, its FP32 / FP16-autocast eager time; then
        # our bench for the ratio (bench_bevseg_*.json)
        [ -d /tmp/site/spconv ] || python3 -c 'import tarfile; tarfile.open(".parity-wheels/site.tar.xz").extractall("/tmp/site")' \
            || { rc=1; continue; }
        nus=tests/data/nuscenes/$(ls tests/data/nuscenes | grep pcd.bin | head -1)
        imgs=""
        for c in CAM_FRONT CAM_FRONT_RIGHT CAM_FRONT_LEFT CAM_BACK CAM_BACK_LEFT CAM_BACK_RIGHT; do
            imgs="$imgs $c=$(ls tests/data/nuscenes/*__${c}__*.jpg)"
        done
        for m in camera fusion; do
            d=/tmp/bevseg-parity/$m
            rm -rf "$d" && mkdir -p "$d"
            cloud=""; [ $m = fusion ] && cloud="--cloud $nus"
            {
                gpu-stage/bin/sptr bevseg --model config/models/bevfusion_seg_$m.yaml --calib tests/data/nuscenes/calib.json \
                    --images $imgs $cloud --random-weights 2026 --save-weights "$d/weights.safetensors" \
                    --device cuda --dump-stages --out "$d/ours" &&
                PYTHONPATH=/tmp/site python3 tests/parity/bevfusion_seg_ref.py --model config/models/bevfusion_seg_$m.yaml \
                    --weights "$d/weights.safetensors" --ours "$d/ours" $cloud --out "$d/ref" --bench --iters 20
            } >> "$out/bevseg_py.log" 2>&1 || rc=1
            cp "$d/ref/ref.json" "$out/bevseg_${m}_ref.json" 2>/dev/null
            gpu-stage/bin/sptr bench bevseg --model config/models/bevfusion_seg_$m.yaml --iters 50 \
                > "$out/bench_bevseg_$m.json" 2>> "$out/bevseg_py.log" || rc=1
        done
        grep -o '{"case".*' "$out/bevseg_py.log" > "$out/bevseg_parity.jsonl"
        ;;
    bevdecoder)
        # BEVFusion's fuser, BEV decoders and map head: the PyTorch reference of the
        # upstream modules (tests/parity/bev_decoder_ref.py, torch + numpy + PyYAML) writes random
        # weights with the upstream names, FP16-exact BEV inputs and each stage's float32 output;
        # ours loads those weights through the checked loader and is compared per module and end
        # to end, on cuDNN and on im2col + cuBLAS (tests/bevfusion_decoder/parity.rs)
        rm -rf /tmp/bev-decoder-parity
        python3 tests/parity/bev_decoder_ref.py --out /tmp/bev-decoder-parity --bench --iters 50 \
            > "$out/bevdecoder_py.log" 2>&1 || rc=1
        SPTR_BEV_DECODER_PARITY_DIR=/tmp/bev-decoder-parity gpu-stage/bin/test-bevfusion_decoder parity:: --test-threads=1 --nocapture \
            > "$out/bevdecoder_rust.log" 2>&1 || rc=1
        grep -o '{"case".*' "$out/bevdecoder_rust.log" > "$out/bevdecoder_parity.jsonl"
        ;;
    camdecode)
        # The feature-level error our JPEG decoders cause against upstream's Pillow decode: the
        # six nuScenes JPEGs preprocessed by us with zune-jpeg and with nvJPEG (camera-features
        # --save-input), and by Pillow as upstream does; the PyTorch reference (FP32, random
        # weights) on each; rel. error per stage against the Pillow run (camera_decode_ref.py).
        # Needs torch and Pillow.
        d=/tmp/camdecode
        m=config/models/bevfusion_seg_camera.yaml
        imgs=(tests/data/nuscenes/*__CAM_*.jpg)
        rm -rf "$d" && mkdir -p "$d"
        {
            gpu-stage/bin/sptr camera-features "${imgs[@]}" --model "$m" --random-weights 2026 \
                --save-weights "$d/weights.safetensors" --save-input "$d/input_zune.npy" --device cuda --out "$d/ours_zune" &&
            gpu-stage/bin/sptr camera-features "${imgs[@]}" --model "$m" --random-weights 2026 --jpeg-decoder nvjpeg \
                --save-input "$d/input_nvjpeg.npy" --device cuda --out "$d/ours_nvjpeg" &&
            python3 tests/parity/camera_decode_ref.py --model "$m" --weights "$d/weights.safetensors" \
                --images "${imgs[@]}" --ours zune="$d/input_zune.npy" --ours nvjpeg="$d/input_nvjpeg.npy" --out "$d/ref"
        } > "$out/camdecode.log" 2>&1 || rc=1
        grep -o '{"case".*' "$out/camdecode.log" > "$out/camdecode.jsonl"
        ;;
    *) echo "gpu_parity: unknown part $w" >&2; rc=2 ;;
    esac
done
tail -n 5 "$out"/*.log
exit $rc
