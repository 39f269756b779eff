#!/usr/bin/env python3
"""Parity and speed reference from spconv 2.3.x (runs on the GPU host).

For every cloud (the nuScenes sweep under tests/data/nuscenes, and the dense benchmark cloud plus a
copy rotated 90 degrees about z as batch 1 when gpu-stage/benchmark-pc.bin exists) this builds
spconv modules with fixed-seed weights, runs them in FP16 (module.half(), half features; no
autocast: spconv 2.3.8 under autocast fails with "can't find suitable algorithm"), and writes what
tests/ops_sparse_conv/parity.rs needs into --out:

    manifest.json           clouds, cases, shapes, file names, kernel/stride/padding, timings (ms)
    <cloud>.coords.bin      int32 [N, 4]  ([b, x, y, z], the order every input row uses)
    <case>.feats.bin        f16   [n_in, cin]   input features (in the order of in_coords)
    <case>.weight.bin       f32   spconv's stored layout from state_dict: [Cout, kx, ky, kz, Cin]
    <case>.out.bin          f16   [n_out, cout] spconv's output features
    <case>.out_coords.bin   int32 [n_out, 4]    spconv's output coordinates, in spconv's order
    <case>.in_coords.bin    int32 [n_in, 4]     (inverse cases only: the strided output it reads)

All files are raw little-endian. Cases per cloud:
    subm3_c{32,64,128,256}      SubMConv3d k3, C -> C, bias=False
    down2_{32_64,64_128,128_256} SparseConv3d k2 s2 p0, bias=False, indice_key "down<cin>"
    inv2_{64_32,128_64,256_128}  SparseInverseConv3d k2 with the same indice_key (back to cin)

Timings: CUDA events around one module call, `--warmup` calls first, median of `--iters`.
  built:  the kernel map is built inside the call (a fresh SparseConvTensor each call, empty
          indice_dict).
  cached: the map is taken from the tensor's indice_dict. spconv stores a new map in the OUTPUT
          tensor's indice_dict (conv.py copies the input's dict), so the cached timing calls the
          same module on `first_output.replace_feature(feats)`: same indices, map present.
          Only submanifold maps can be reused by a forward conv (spconv asserts "only support reuse
          subm indices"); a strided conv always builds its map (timed as built), and an inverse
          conv always reads its strided partner's map (timed as cached).

Voxels: SemanticKITTI preprocessing at 0.05 m (sptr's semantickitti config with voxel 0.05):
clip x, y, z to pc_range [[-51.2,-51.2,-4],[51.2,51.2,2.4]] in float64, subtract the per-scan
minimum, floor(c / 0.05); unique voxels sorted by (x, y, z); batches concatenated; spatial shape
per axis = max + 1, at least 128.
"""
import argparse
import glob
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_timing import event_times_ms  # noqa: E402

PC_RANGE = np.array([[-51.2, -51.2, -4.0], [51.2, 51.2, 2.4]], dtype=np.float64)
VOXEL = 0.05
SEED = 20261121


def voxel_keys(xyz: np.ndarray) -> np.ndarray:
    """Unique voxel keys [M, 3] int32 of one scan, sorted by (x, y, z)."""
    c = np.clip(xyz.astype(np.float64), PC_RANGE[0], PC_RANGE[1])
    c = c - c.min(axis=0)
    key = np.floor(c / VOXEL).astype(np.int64)
    key = np.unique(key, axis=0)  # lexicographic row order
    return key.astype(np.int32)


def batch_coords(scans):
    parts = []
    for b, xyz in enumerate(scans):
        k = voxel_keys(xyz)
        parts.append(np.concatenate([np.full((len(k), 1), b, np.int32), k], axis=1))
    coords = np.ascontiguousarray(np.concatenate(parts, axis=0), dtype=np.int32)
    shape = [int(max(128, coords[:, a + 1].max() + 1)) for a in range(3)]
    return coords, shape


def rotated_z(xyz: np.ndarray, deg: float) -> np.ndarray:
    """float32 rotation about z, as tests/common::rotated_z does it."""
    r = np.float32(deg) * np.float32(np.pi / 180.0)
    s, c = np.float32(np.sin(r)), np.float32(np.cos(r))
    x, y = xyz[:, 0].astype(np.float32), xyz[:, 1].astype(np.float32)
    out = xyz.astype(np.float32).copy()
    out[:, 0] = c * x - s * y
    out[:, 1] = s * x + c * y
    return out


def load_clouds(root: str, dense: str):
    clouds = []
    nus = sorted(glob.glob(os.path.join(root, "tests/data/nuscenes/*.pcd.bin")))
    if nus:
        pts = np.fromfile(nus[0], dtype="<f4").reshape(-1, 5)[:, :3]
        clouds.append(("nuscenes", [pts]))
    else:
        print("WARNING: no tests/data/nuscenes/*.pcd.bin", file=sys.stderr)
    if dense and os.path.isfile(dense):
        pts = np.fromfile(dense, dtype="<f4").reshape(-1, 3)
        clouds.append(("dense2", [pts, rotated_z(pts, 90.0)]))
    else:
        print(f"note: no dense cloud at {dense!r}, dense2 cases skipped", file=sys.stderr)
    return clouds


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/parity")
    ap.add_argument("--root", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../..")))
    ap.add_argument("--dense", default=None, help="dense cloud, float32 x3 (default <root>/gpu-stage/benchmark-pc.bin)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--channels", default="32,64,128,256")
    args = ap.parse_args()
    dense = args.dense if args.dense is not None else os.path.join(args.root, "gpu-stage/benchmark-pc.bin")

    import torch
    import spconv
    import spconv.pytorch as spconv_pt

    if not torch.cuda.is_available():
        sys.exit("spconv_parity.py: no CUDA device")
    dev = torch.device("cuda")
    os.makedirs(args.out, exist_ok=True)
    chans = [int(c) for c in args.channels.split(",") if c]

    def med_ms(fn):
        return float(np.median(event_times_ms(fn, args.warmup, args.iters)))

    def save(name, arr, dtype):
        path = os.path.join(args.out, name)
        np.ascontiguousarray(arr, dtype=np.dtype(dtype).newbyteorder("<")).tofile(path)
        return name

    def init_weight(conv, kv, cin, gen):
        # Unit-gain uniform init from a fixed generator, then FP16 (the stored values are exactly
        # FP16-representable, so the f32 export is what spconv computed with).
        b = float(np.sqrt(3.0 / (kv * cin)))
        with torch.no_grad():
            w = (torch.rand(conv.weight.shape, generator=gen, dtype=torch.float32) * 2 - 1) * b
            conv.weight.copy_(w)
        conv.half().to(dev).eval()
        sd = conv.state_dict()
        w = sd["weight"].detach().float().cpu().numpy()
        return w

    def rel(a, b):
        a, b = a.float(), b.float()
        return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))

    def check(ok, msg):
        if not ok:
            print("WARNING: " + msg, flush=True)
            manifest.setdefault("warnings", []).append(msg)

    def by_coords(want, have, feats):
        """Rows of `feats` (at coordinates `have`) in the order of `want`; None if the sets differ."""
        if want.shape != have.shape:
            check(False, f"two spconv calls gave {len(want)} and {len(have)} strided outputs")
            return None
        ow, oh = np.lexsort(want.T[::-1]), np.lexsort(have.T[::-1])
        if not np.array_equal(want[ow], have[oh]):
            check(False, "two spconv calls gave different strided output coordinate sets")
            return None
        out = np.empty_like(feats)
        out[ow] = feats[oh]
        return out

    def rand_feats(n, c, gen):
        return (torch.rand((n, c), generator=gen, dtype=torch.float32) * 2 - 1).half().to(dev)

    manifest = {
        "spconv_version": getattr(spconv, "__version__", "unknown"),
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "warmup": args.warmup,
        "iters": args.iters,
        "timing": "CUDA events around one module call, median; see spconv_parity.py docstring",
        "clouds": [],
        "cases": [],
    }
    gen = torch.Generator().manual_seed(SEED)
    t_start = time.time()
    with torch.no_grad():
        for cname, scans in load_clouds(args.root, dense):
            coords, shape = batch_coords(scans)
            n, bs = len(coords), len(scans)
            cfile = save(f"{cname}.coords.bin", coords, "i4")
            manifest["clouds"].append({"name": cname, "coords": cfile, "n": n, "batch_size": bs, "spatial_shape": shape})
            print(f"[{cname}] {n} voxels, batch {bs}, spatial shape {shape}", flush=True)
            idx = torch.from_numpy(coords).to(dev)

            def tensor(f):
                return spconv_pt.SparseConvTensor(f, idx, shape, bs)

            # Submanifold k3.
            for c in chans:
                name = f"{cname}.subm3_c{c}"
                conv = spconv_pt.SubMConv3d(c, c, 3, bias=False, indice_key=f"subm3_{cname}_{c}")
                w = init_weight(conv, 27, c, gen)
                x = rand_feats(n, c, gen)
                y_def = conv(tensor(x))  # spconv's default accumulation (auto rule)
                check(torch.equal(y_def.indices, idx), f"{name}: subm output indices differ from the input's")
                t_built = med_ms(lambda: conv(tensor(x)))
                xc = y_def.replace_feature(x)  # carries the map under the indice_key
                t_cached = med_ms(lambda: conv(xc))
                conv.fp32_accum = True  # the reference: FP32 accumulation, as sptr does
                y = conv(xc)
                t_cached32 = med_ms(lambda: conv(xc))
                conv.fp32_accum = None
                manifest["cases"].append({
                    "name": name, "cloud": cname, "kind": "subm",
                    "kernel": [3, 3, 3], "stride": [1, 1, 1], "padding": [1, 1, 1], "dilation": [1, 1, 1],
                    "cin": c, "cout": c, "n_in": n, "n_out": int(y.indices.shape[0]),
                    "feats": save(f"{name}.feats.bin", x.cpu().numpy(), "f2"),
                    "weight": save(f"{name}.weight.bin", w, "f4"), "weight_shape": list(w.shape),
                    "out": save(f"{name}.out.bin", y.features.cpu().numpy(), "f2"),
                    "out_default": save(f"{name}.out_default.bin", y_def.features.cpu().numpy(), "f2"),
                    "default_vs_fp32acc_rel": rel(y_def.features, y.features),
                    "out_coords": save(f"{name}.out_coords.bin", y.indices.cpu().numpy(), "i4"),
                    "out_spatial_shape": [int(v) for v in y.spatial_shape],
                    "timings_ms": {"built": t_built, "cached": t_cached, "cached_fp32acc": t_cached32},
                })
                print(f"  {name}: built {t_built:.3f} ms, cached {t_cached:.3f} ms (fp32 accum {t_cached32:.3f}), "
                      f"default vs fp32-accum rel {manifest['cases'][-1]['default_vs_fp32acc_rel']:.2e}", flush=True)

            # Strided k2 s2 and the inverse conv that undoes it (same indice_key).
            for cin, cout in [(32, 64), (64, 128), (128, 256)]:
                if cin not in chans and cout not in chans:
                    continue
                key = f"down2_{cname}_{cin}"
                down = spconv_pt.SparseConv3d(cin, cout, 2, stride=2, padding=0, bias=False, indice_key=key)
                inv = spconv_pt.SparseInverseConv3d(cout, cin, 2, indice_key=key, bias=False)
                wd = init_weight(down, 8, cin, gen)
                wi = init_weight(inv, 8, cout, gen)
                x = rand_feats(n, cin, gen)
                name = f"{cname}.down2_{cin}_{cout}"
                y_def = down(tensor(x))  # default accumulation; its map is built in the call
                t_down = med_ms(lambda: down(tensor(x)))
                down.fp32_accum = True
                y = down(tensor(x))  # reference (a new map: spconv's output order may differ)
                t_down32 = med_ms(lambda: down(tensor(x)))
                down.fp32_accum = None
                m = int(y.indices.shape[0])
                yo = y.indices.cpu().numpy()
                yd = by_coords(yo, y_def.indices.cpu().numpy(), y_def.features.cpu().numpy())
                manifest["cases"].append({
                    "name": name, "cloud": cname, "kind": "strided",
                    "kernel": [2, 2, 2], "stride": [2, 2, 2], "padding": [0, 0, 0], "dilation": [1, 1, 1],
                    "cin": cin, "cout": cout, "n_in": n, "n_out": m,
                    "feats": save(f"{name}.feats.bin", x.cpu().numpy(), "f2"),
                    "weight": save(f"{name}.weight.bin", wd, "f4"), "weight_shape": list(wd.shape),
                    "out": save(f"{name}.out.bin", y.features.cpu().numpy(), "f2"),
                    "out_default": save(f"{name}.out_default.bin", yd, "f2") if yd is not None else None,
                    "default_vs_fp32acc_rel": rel(torch.from_numpy(yd), y.features.cpu()) if yd is not None else None,
                    "out_coords": save(f"{name}.out_coords.bin", yo, "i4"),
                    "out_spatial_shape": [int(v) for v in y.spatial_shape],
                    "timings_ms": {"built": t_down, "built_fp32acc": t_down32},
                })
                print(f"  {name}: {n} -> {m} sites, built {t_down:.3f} ms (fp32 accum {t_down32:.3f}), default vs "
                      f"fp32-accum rel {manifest['cases'][-1]['default_vs_fp32acc_rel']}", flush=True)
                # Inverse: reads y's sites (spconv's order) with fresh features, writes x's sites.
                yf = rand_feats(m, cout, gen)
                yr = y.replace_feature(yf)
                z_def = inv(yr)
                t_inv = med_ms(lambda: inv(yr))
                inv.fp32_accum = True
                z = inv(yr)
                t_inv32 = med_ms(lambda: inv(yr))
                inv.fp32_accum = None
                iname = f"{cname}.inv2_{cout}_{cin}"
                check(torch.equal(z.indices, idx), f"{iname}: inverse output indices differ from the strided input's")
                manifest["cases"].append({
                    "name": iname, "cloud": cname, "kind": "inverse", "down": name,
                    "kernel": [2, 2, 2], "stride": [2, 2, 2], "padding": [0, 0, 0], "dilation": [1, 1, 1],
                    "cin": cout, "cout": cin, "n_in": m, "n_out": int(z.indices.shape[0]),
                    "in_coords": save(f"{iname}.in_coords.bin", yo, "i4"),
                    "feats": save(f"{iname}.feats.bin", yf.cpu().numpy(), "f2"),
                    "weight": save(f"{iname}.weight.bin", wi, "f4"), "weight_shape": list(wi.shape),
                    "out": save(f"{iname}.out.bin", z.features.cpu().numpy(), "f2"),
                    "out_default": save(f"{iname}.out_default.bin", z_def.features.cpu().numpy(), "f2"),
                    "default_vs_fp32acc_rel": rel(z_def.features, z.features),
                    "out_coords": save(f"{iname}.out_coords.bin", z.indices.cpu().numpy(), "i4"),
                    "out_spatial_shape": [int(v) for v in z.spatial_shape],
                    "timings_ms": {"cached": t_inv, "cached_fp32acc": t_inv32},
                })
                print(f"  {iname}: {m} -> {n} sites, cached map {t_inv:.3f} ms (fp32 accum {t_inv32:.3f}), "
                      f"default vs fp32-accum rel {manifest['cases'][-1]['default_vs_fp32acc_rel']:.2e}", flush=True)
                del y, y_def, yr, z, z_def, x, yf
                torch.cuda.empty_cache()

    manifest["elapsed_s"] = time.time() - t_start
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(manifest['cases'])} cases to {args.out}/manifest.json "
          f"(spconv {manifest['spconv_version']}, torch {manifest['torch_version']}, {manifest['device']})")
    for c in manifest["cases"]:
        print(json.dumps({"case": c["name"], "n": c["n_in"], "spconv_ms": c["timings_ms"]}))


if __name__ == "__main__":
    main()
