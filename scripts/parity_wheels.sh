#!/usr/bin/env bash
# Packs spconv 2.3.8 (CUDA 12.6 build) and the Python packages it needs that the GPU host's image
# lacks into .parity-wheels/site.tar.xz (git-ignored), for tests/parity (see its README.md).
#
#   scripts/parity_wheels.sh          # download (cached), unpack, prune, pack; prints the size
#
# On the GPU host (Python 3.12, torch/numpy/pybind11/portalocker/ninja/requests/sympy present):
#   mkdir -p /tmp/site && tar xJf .parity-wheels/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site
#
# Idempotent: wheels are cached in $PARITY_WHEEL_CACHE (default ~/.cache/sptr/parity-wheels), and
# the archive is rebuilt only when the wheel set or the packing options change.
#
# Size: spconv's core_cc extension is 284 MB, 270 MB of it a CUDA fatbin holding machine code for
# sm_50 ... sm_90 (plus compute_90 PTX); cumm bundles NVRTC 12.6 (63 MB). Packed as they are
# that is ~40 MB of xz, too much beside gpu-stage/ under the device tool's 64 MiB limit. So by
# default the payloads of the fatbin's machine-code entries for other GPUs than sm_90 (H100,
# H200) are overwritten with zeros IN PLACE: headers, sizes and offsets stay, the sm_90 code and
# all PTX stay byte-identical (checked below), and the zeros compress to nothing. The CUDA driver
# loads only the entry it selects for the device, so spconv is unchanged on sm_90; on another GPU
# it would fail. PARITY_KEEP_SM="80 90" keeps more; PARITY_KEEP_SM=all packs the wheels untouched.
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${PARITY_WHEEL_CACHE:-$HOME/.cache/sptr/parity-wheels}
DEST=.parity-wheels
KEEP_SM=${PARITY_KEEP_SM:-90}
# Pinned: spconv-cu126 2.3.8 and its Requires-Dist closure minus what the GPU image already has
# (numpy, pybind11, portalocker, ninja, requests, sympy; see the device notes' package list).
PKGS=(
    spconv-cu126==2.3.8
    cumm-cu126==0.7.11
    pccm==0.4.16
    ccimport==0.4.4
    fire==0.7.1
    termcolor==3.3.0
    lark==1.3.1
)
# Names that may appear in Requires-Dist without being packed (present on the GPU image).
ON_IMAGE="numpy pybind11 portalocker ninja requests sympy torch importlib-metadata dataclasses contextvars"

mkdir -p "$CACHE" "$DEST"

wheel_of() { # NAME==VER -> cached wheel path (empty if absent)
    local name=${1%%==*} ver=${1##*==}
    local stem=${name//-/_}
    ls "$CACHE"/"${stem}"-"${ver}"-*.whl 2>/dev/null | head -1
}

for spec in "${PKGS[@]}"; do
    if [ -z "$(wheel_of "$spec")" ]; then
        echo "downloading $spec"
        python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$CACHE" "$spec"
    fi
    [ -n "$(wheel_of "$spec")" ] || { echo "parity_wheels: no wheel for $spec in $CACHE" >&2; exit 1; }
done

WHEELS=()
for spec in "${PKGS[@]}"; do WHEELS+=("$(wheel_of "$spec")"); done

# Every Requires-Dist (no extras, no markers for old Pythons) must be packed or on the image.
packed=" $(for s in "${PKGS[@]}"; do echo -n "${s%%==*} "; done)"
missing=0
for w in "${WHEELS[@]}"; do
    while read -r req; do
        [ -n "$req" ] || continue
        dep=$(echo "$req" | sed -E 's/^Requires-Dist: *([A-Za-z0-9_.-]+).*/\1/' | tr 'A-Z_.' 'a-z--')
        case "$req" in *extra*|*'python_version < "3.8"'*|*'python_version == "3.6"'*) continue ;; esac
        if [[ "$packed $ON_IMAGE " != *" $dep "* ]]; then
            echo "parity_wheels: $(basename "$w") needs '$dep', neither packed nor on the GPU image" >&2
            missing=1
        fi
    done < <(unzip -p "$w" '*.dist-info/METADATA' | grep '^Requires-Dist' || true)
done
[ "$missing" = 0 ] || exit 1

stamp=$( (for w in "${WHEELS[@]}"; do sha256sum "$w" | cut -c1-64; done; echo "keep_sm=$KEEP_SM v3") | sha256sum | cut -c1-64)
if [ -f "$DEST/site.tar.xz" ] && [ "$(cat "$DEST/stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "parity_wheels: $DEST/site.tar.xz is up to date"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/parity-site.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    for w in "${WHEELS[@]}"; do unzip -q -o "$w" -d "$work/site"; done
    find "$work/site" -name __pycache__ -type d -prune -exec rm -rf {} +
    if [ "$KEEP_SM" != all ]; then
        python3 - "$KEEP_SM" "$work"/site/spconv/core_cc*.so <<'EOF'
import hashlib, struct, sys

keep = {int(a) for a in sys.argv[1].split()}
path = sys.argv[2]
with open(path, "r+b") as f:
    data = bytearray(f.read())
    # ELF64 section headers -> .nv_fatbin
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def sh(i):
        name, typ, flags, addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size
    _, stroff, _ = sh(shstrndx)
    fat = None
    for i in range(shnum):
        name, off, size = sh(i)
        end = data.index(b"\0", stroff + name)
        if data[stroff + name:end] == b".nv_fatbin":
            fat = (off, size)
    if fat is None:
        sys.exit(f"{path}: no .nv_fatbin section")
    off, size = fat
    stats = {}
    pos, end_all, nfat = off, off + size, 0
    entries = []
    while pos + 16 <= end_all:
        magic, _ver, hsize, fsize = struct.unpack_from("<IHHQ", data, pos)
        if magic != 0xBA55ED50:
            pos += 8  # fatbins are 8-byte aligned, padding between them
            continue
        nfat += 1
        e, end = pos + hsize, pos + hsize + fsize
        while e < end:
            kind, _ev, ehs, psize = struct.unpack_from("<HHIQ", data, e)
            arch, = struct.unpack_from("<I", data, e + 28)
            entries.append((kind, arch, e + ehs, psize))
            e += ehs + psize
        if e != end:
            sys.exit(f"{path}: fatbin at {pos:#x} does not parse cleanly")
        pos = end
    def kept_hash(buf):
        h = hashlib.sha256()
        for kind, arch, p, n in entries:
            if not (kind == 2 and arch not in keep):
                h.update(buf[p:p + n])
        return h.hexdigest()
    before, length = kept_hash(data), len(data)
    zeroed = 0
    for kind, arch, p, n in entries:
        k = ("ptx" if kind == 1 else "sass") + f"_{arch}"
        stats[k] = stats.get(k, 0) + n
        if kind == 2 and arch not in keep:
            data[p:p + n] = bytes(n)
            zeroed += n
    if not any(kind == 2 and arch in keep for kind, arch, _, _ in entries):
        sys.exit(f"{path}: no machine code for sm {sorted(keep)} in the fatbin")
    f.seek(0)
    f.write(data)
with open(path, "rb") as f:
    after = f.read()
if len(after) != length or kept_hash(after) != before:
    sys.exit(f"{path}: kept fatbin entries changed while pruning")
print(f"spconv fatbin: {nfat} fatbins, {len(entries)} entries, " +
      ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in sorted(stats.items())))
print(f"zeroed {zeroed / 1e6:.1f} MB of machine code for sm not in {sorted(keep)}; "
      f"kept entries (sha256 {before[:16]}) byte-identical, file size unchanged")
EOF
    fi
    # Deterministic order; the two identical libcudart copies side by side.
    (cd "$work/site" && find . -type f | LC_ALL=C sort > "$work/files.txt" &&
        tar --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - -T "$work/files.txt") |
        xz -9e -T1 --memlimit-compress=8GiB > "$DEST/site.tar.xz.tmp"
    mv "$DEST/site.tar.xz.tmp" "$DEST/site.tar.xz"
    echo "$stamp" > "$DEST/stamp"
    printf '%s\n' "${WHEELS[@]##*/}" > "$DEST/wheels.txt"
fi

# What must be inside.
list=$(tar tJf "$DEST/site.tar.xz")
for want in 'spconv/core_cc\.cpython-312-x86_64-linux-gnu\.so$' 'spconv_cu126\.libs/libcudart' \
    'cumm/core_cc\.cpython-312-x86_64-linux-gnu\.so$' 'cumm_cu126\.libs/libnvrtc-' 'cumm_cu126\.libs/libnvrtc-builtins' \
    'spconv/pytorch/conv\.py$' 'pccm/__init__\.py$' 'ccimport/__init__\.py$' 'fire/__init__\.py$' \
    'termcolor/__init__\.py$' 'lark/__init__\.py$' 'spconv_cu126-2\.3\.8\.dist-info/METADATA$'; do
    echo "$list" | grep -qE "$want" || { echo "parity_wheels: $want missing from the archive" >&2; exit 1; }
done
bytes=$(stat -c %s "$DEST/site.tar.xz")
echo "parity_wheels: $DEST/site.tar.xz $bytes bytes ($(( bytes / 1048576 )) MiB), $(echo "$list" | grep -vc '/$') files, sm kept: $KEEP_SM"
cat "$DEST/wheels.txt"
if [ "$bytes" -gt $(( 35 * 1000 * 1000 )) ]; then
    echo "parity_wheels: WARNING: over 35 MB; with gpu-stage/ it may not fit the device tool's 64 MiB" >&2
fi
