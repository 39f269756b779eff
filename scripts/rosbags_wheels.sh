#!/usr/bin/env bash
# Packs the `rosbags` package (the third-party rosbag2 writer the test fixtures are made with) and
# the packages it needs that the GPU host's image lacks (numpy is there) into
# .parity-wheels/rosbags-wheels.tar (git-ignored, ~6 MB), so the GPU host can write the long
# replay bag itself (tests/fixtures/make_sample_bag.py --long N; ~100 MB, too big to carry).
#
#   scripts/rosbags_wheels.sh        # download (cached), pack; idempotent
#
# On the GPU host (Python 3.12, no network):
#   tar xf .parity-wheels/rosbags-wheels.tar -C /tmp/rbw &&
#   python3 -m pip install -q --no-index --no-deps --target /tmp/rb /tmp/rbw/*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${PARITY_WHEEL_CACHE:-$HOME/.cache/sptr/parity-wheels}/rosbags
DEST=.parity-wheels/rosbags-wheels.tar
# rosbags 0.11.9 (the version the committed fixtures were made with) and its Requires-Dist
# closure for CPython 3.12 on x86_64 Linux, minus numpy (on the image).
PKGS=(rosbags==0.11.9 apsw==3.54.1.0 backports-zstd==1.8.0 lz4==4.4.5 ruamel.yaml==0.19.1 typing-extensions==4.16.0)
mkdir -p "$CACHE" .parity-wheels
for spec in "${PKGS[@]}"; do
    stem=$(echo "${spec%%==*}" | tr '.-' '__')
    if ! ls "$CACHE/${stem}-${spec##*==}-"*.whl > /dev/null 2>&1; then
        echo "downloading $spec"
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            -d "$CACHE" "$spec"
    fi
done
files=()
for spec in "${PKGS[@]}"; do
    stem=$(echo "${spec%%==*}" | tr '.-' '__')
    f=$(ls "$CACHE/${stem}-${spec##*==}-"*.whl | head -1)
    files+=("$(basename "$f")")
done
tar -cf "$DEST.tmp" -C "$CACHE" "${files[@]}" && mv "$DEST.tmp" "$DEST"
du -h "$DEST"
