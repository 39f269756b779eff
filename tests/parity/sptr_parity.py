#!/usr/bin/env python3
"""Window-attention parity and speed reference from PyPI sptr 1.1.1 (runs on the GPU host).

For every case this builds SphereFormer's attention core (sptr_ops.sphere_attention: half the heads on
cubic windows, half on spherical windows, contextual RPE on q, k and v) on sptr's CUDA ops with
fixed-seed inputs, and writes what tests/ops_attention/parity.rs needs into --out (raw
little-endian):

    manifest.json                      cases, parameters, partitions, file names, checks, timings
    <case>.xyz.f32                     [N, 3]  voxel positions (metres, float32)
    <case>.batch.i32                   [N]     batch index
    <case>.{q,k,v}.f32                 [N, H, D] (FP16 values; q already times D^-0.5)
    <case>.{tq,tk,tv}_cubic.f32        [2L-1, 3, H//2, D]      (FP16 values)
    <case>.{tq,tk,tv}_sphere.f32       [2L, 3, H - H//2, D]    (FP16 values)
    <case>.out_fp32.f32                [N, H, D] sptr ops in FP32 (what SphereFormer runs)
    <case>.out_fp16.f32                [N, H, D] sptr ops in FP16 (sptr 1.1.1 has FP16 kernels)
    <case>.out_norpe_fp32.f32          [N, H, D] both window kinds without RPE (attention_step1/2)
    <case>.wincount_{cubic,sphere}.i32 [N] number of voxels in each voxel's window

Cases (heads of 16 channels):
    dense2_c32, dense2_c64  dense benchmark cloud + a copy rotated 90 deg about z (batch 1), SemanticKITTI
                            rule at 0.05 m; stage-1 windows (0.3 m cubic, [2 deg, 2 deg, 80 m]); 2 / 4 heads
    nuscenes_c32            tests/data/nuscenes sweep, nuScenes rule at 0.1 m; windows 0.6 m, [2, 2, 120]
    random_small            ~3,000 random voxels in 2 batches: dense blobs, sparse shells and isolated
                            voxels (windows of 1), stage-1 windows
    random_small_l3         the same voxels with level-3 windows (1.2 m cubic, [4.5, 4.5, 80])

Timings (CUDA events, --warmup calls, median of --iters), FP32 and FP16:
    cubic_core   dot_prod_with_idx_all + scatter softmax + attention_step2_with_rel_pos_value for the
                 cubic heads; q, k, v already in window order, partition and RPE index precomputed
    stage        the whole sphere_attention call from q, k, v, xyz, batch (cart2sphere, both partitions,
                 RPE indices, both branches, sort/unsort gathers, concat)
    stage_cached the same with both partitions taken from the cache (a later block of the level)
Peak extra device memory (MB = 1e6 bytes): max_memory_allocated during one call minus the allocated
memory before it.

--selfcheck runs CPU checks of the stand-ins (partition, RPE index, softmax, attention against a dense
per-window computation) with torch if importable (then on CUDA with sptr too, when present), else the
numpy-only parts (voxelization, random cloud, window counts, radial split bins).
"""
import argparse
import glob
import json
import math
import os
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cuda_timing import event_times_ms, peak_extra_bytes  # noqa: E402
from spconv_parity import PC_RANGE, rotated_z  # noqa: E402  (numpy-only helpers)

SEED = 20261122
HEAD_DIM = 16
L = 24
A = 0.0125


def level_for(voxel, sphere_r, level=1, scale_cubic=2.0, scale_sphere=1.5):
    """Window parameters of a level, computed as SphereFormer does: patch = float32(voxel),
    window = patch * 6 (float32), quant = window / 24; sphere window np.array([2, 2, r]) (int64) and
    quant / 24 (float64); deeper levels scale by window_size_scale (cubic all axes, sphere angles)."""
    patch = np.array([voxel] * 3).astype(np.float32)
    window = patch * 6
    quant = window / 24
    wsph = np.array([2, 2, sphere_r])
    qsph = wsph / 24
    for _ in range(level - 1):
        window = np.array([window[i] * scale_cubic for i in range(3)])
        quant = np.array([quant[i] * scale_cubic for i in range(3)])
        wsph = np.array([wsph[0] * scale_sphere, wsph[1] * scale_sphere, wsph[2]])
        qsph = np.array([qsph[0] * scale_sphere, qsph[1] * scale_sphere, qsph[2]])
    lq = int((window[0] + 1e-4) / quant[0])
    ls = int((wsph[0] + 1e-4) / qsph[0])
    return {"window": window, "quant": quant, "L": lq, "window_sphere": wsph, "quant_sphere": qsph,
            "L_sphere": ls, "a": A, "shift": False, "indice_key": f"sphereformer{level}"}


def level_json(lv):
    f = lambda a: [float(np.float32(x)) for x in np.asarray(a).reshape(-1)]  # noqa: E731
    return {"window": f(lv["window"]), "quant": f(lv["quant"]), "L": int(lv["L"]),
            "window_sphere": f(lv["window_sphere"]), "quant_sphere": f(lv["quant_sphere"]),
            "L_sphere": int(lv["L_sphere"]), "a": float(lv["a"]), "shift": bool(lv["shift"]),
            "table_rows_cubic": 2 * int(lv["L"]) - 1, "table_rows_sphere": 2 * int(lv["L_sphere"]),
            "radial_offset": 24}


# ------------------------------------------------------------------------------------------------
# voxelization (SphereFormer val mode: every voxel the mean of its points)


def voxel_mean(coord_for_key, coord_for_mean, voxel, dtype):
    """Group points by floor((c - min(c)) / float32(voxel)) computed in `dtype` (float64 for
    SemanticKITTI, whose clip makes the array float64; float32 for nuScenes); return per-voxel float32
    means of coord_for_mean (sequential float32 sums, like torch_scatter's CPU scatter_mean), voxels
    sorted by their (x, y, z) key."""
    c = coord_for_key.astype(dtype)
    c = c - c.min(axis=0)
    vs = np.array([voxel] * 3).astype(np.float32)
    key = np.floor(c / vs).astype(np.int64)
    ext = key.max(axis=0) + 1
    lin = (key[:, 0] * ext[1] + key[:, 1]) * ext[2] + key[:, 2]
    _, inv, cnt = np.unique(lin, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    m = np.asarray(coord_for_mean, dtype=np.float32)
    s = np.zeros((len(cnt), 3), np.float32)
    np.add.at(s, inv, m)
    return (s / cnt.astype(np.float32)[:, None]).astype(np.float32)


def voxels_semantickitti(scans, voxel=0.05):
    xyz, bat = [], []
    for b, pts in enumerate(scans):
        c = np.clip(pts[:, :3].astype(np.float64), PC_RANGE[0], PC_RANGE[1])  # float64, as upstream
        v = voxel_mean(c, c.astype(np.float32), voxel, np.float64)
        xyz.append(v)
        bat.append(np.full(len(v), b, np.int32))
    return np.concatenate(xyz), np.concatenate(bat)


def voxels_nuscenes(pts, voxel=0.1):
    c = pts[:, :3].astype(np.float32)
    v = voxel_mean(c, c, voxel, np.float32)
    return v, np.zeros(len(v), np.int32)


def random_cloud(seed, n_target=3000, voxel=0.05):
    """Two batches of ~n_target/2 unique voxels each: dense blobs (many voxels per window), thin shells
    at 2-40 m, isolated voxels far apart (windows of one voxel) and a few within 1 m of the sensor."""
    rng = np.random.default_rng(seed)
    xyz, bat = [], []
    for b in range(2):
        keys = set()
        want = n_target // 2
        out = []

        def add(p):
            k = tuple(np.floor(p / voxel).astype(np.int64))
            if k not in keys:
                keys.add(k)
                out.append((np.array(k) + 0.5 + rng.uniform(-0.4, 0.4, 3)) * voxel)

        for _ in range(6):  # blobs of ~0.5 m
            c = rng.uniform([-30, -30, -2], [30, 30, 1])
            for _ in range(int(want * 0.07)):
                add(c + rng.normal(0, 0.15, 3))
        while len(out) < int(want * 0.8):  # shells
            r = rng.choice([2.0, 5.0, 12.0, 40.0]) + rng.normal(0, 0.05)
            t = rng.uniform(0, 2 * np.pi)
            z = rng.uniform(-1.5, 0.5)
            add(np.array([r * np.cos(t), r * np.sin(t), z]))
        for _ in range(20):  # near the sensor
            add(rng.uniform([-1, -1, -0.5], [1, 1, 0.5]))
        while len(out) < want:  # isolated
            add(rng.uniform([-50, -50, -3], [50, 50, 2]))
        xyz.append(np.array(out, np.float32))
        bat.append(np.full(len(out), b, np.int32))
    return np.concatenate(xyz).astype(np.float32), np.concatenate(bat)


def load_cases(root, dense, only):
    """[(name, cloud, rule, xyz, batch, heads, level)]"""
    cases = []
    want = lambda n: (not only) or n in only  # noqa: E731
    if want("random_small") or want("random_small_l3"):
        xyz, bat = random_cloud(SEED)
        if want("random_small"):
            cases.append(("random_small", "random", "random", xyz, bat, 2, level_for(0.05, 80)))
        if want("random_small_l3"):
            cases.append(("random_small_l3", "random", "random", xyz, bat, 2, level_for(0.05, 80, level=3)))
    if want("nuscenes_c32"):
        nus = sorted(glob.glob(os.path.join(root, "tests/data/nuscenes/*.pcd.bin")))
        if nus:
            pts = np.fromfile(nus[0], dtype="<f4").reshape(-1, 5)
            xyz, bat = voxels_nuscenes(pts)
            cases.append(("nuscenes_c32", "nuscenes", "nuscenes", xyz, bat, 2,
                          level_for(0.1, 120, scale_sphere=2.0)))
        else:
            print("WARNING: no tests/data/nuscenes/*.pcd.bin, nuscenes_c32 skipped", file=sys.stderr)
    if want("dense2_c32") or want("dense2_c64"):
        if dense and os.path.isfile(dense):
            pts = np.fromfile(dense, dtype="<f4").reshape(-1, 3)
            xyz, bat = voxels_semantickitti([pts, rotated_z(pts, 90.0)])
            for name, h in (("dense2_c32", 2), ("dense2_c64", 4)):
                if want(name):
                    cases.append((name, "dense2", "semantickitti", xyz, bat, h, level_for(0.05, 80)))
        else:
            print(f"note: no dense cloud at {dense!r}, dense2 cases skipped", file=sys.stderr)
    return cases


# ------------------------------------------------------------------------------------------------
# the GPU run


def run(args):
    import torch
    import sptr_ops as so

    if not torch.cuda.is_available():
        sys.exit("sptr_parity.py: no CUDA device")
    if not so.sptr_available():
        sys.exit(f"sptr_parity.py: sptr not loadable: {so.sptr_error()}")
    F, ext, pkg_dir = so.load_sptr()
    try:
        from importlib.metadata import version
        sptr_version = version("sptr")
    except Exception:  # noqa: BLE001
        sptr_version = "unknown"
    dev = torch.device("cuda")
    os.makedirs(args.out, exist_ok=True)
    dense = args.dense if args.dense is not None else os.path.join(args.root, "gpu-stage/benchmark-pc.bin")
    only = {c for c in args.cases.split(",") if c} if args.cases else set()

    def save(name, arr, dtype):
        path = os.path.join(args.out, name)
        np.ascontiguousarray(arr, dtype=np.dtype(dtype).newbyteorder("<")).tofile(path)
        return name

    def med_ms(fn):
        return float(np.median(event_times_ms(fn, args.warmup, args.iters)))

    def peak_mb(fn):
        return peak_extra_bytes(fn) / 1e6

    def rel(a, b):
        a, b = a.float(), b.float()
        return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))

    manifest = {
        "kind": "sptr_window_attention", "schema": 1,
        "sptr_version": sptr_version, "sptr_path": pkg_dir, "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda, "device": torch.cuda.get_device_name(0),
        "warmup": args.warmup, "iters": args.iters, "seed": SEED,
        "rpe_index_dtype": "int8 (sptr 1.1.1 kernels read char)",
        "softmax": "torch.segment_reduce / repeat_interleave stand-ins for torch_scatter segment_csr / gather_csr",
        "timing": "CUDA events around one call, median; see sptr_parity.py docstring",
        "units": {"time": "ms", "memory": "MB = 1e6 bytes"},
        "cases": [],
    }

    def warn(case, msg):
        print("WARNING: " + msg, flush=True)
        case.setdefault("warnings", []).append(msg)

    t0 = time.time()
    with torch.no_grad():
        for name, cloud, rule, xyz_np, bat_np, H, lv in load_cases(args.root, dense, only):
            n = len(xyz_np)
            D, hc = HEAD_DIM, H // 2
            hs = H - hc
            lvj = level_json(lv)
            gen = torch.Generator().manual_seed(SEED + zlib.crc32(name.encode()))
            u = lambda *s: (torch.rand(s, generator=gen) * 2 - 1).half()  # noqa: E731
            q = (u(n, H, D).float() * D ** -0.5).half()
            k, v = u(n, H, D), u(n, H, D)
            tn = lambda t, h: (torch.randn((t, 3, h, D), generator=gen) * 0.02).half()  # noqa: E731
            tc = tuple(tn(lvj["table_rows_cubic"], hc) for _ in range(3))
            ts = tuple(tn(lvj["table_rows_sphere"], hs) for _ in range(3))
            case = {"name": name, "cloud": cloud, "rule": rule, "n": n, "batch_size": int(bat_np.max()) + 1,
                    "heads": H, "heads_cubic": hc, "heads_sphere": hs, "head_dim": D, "channels": H * D,
                    "params": lvj, "files": {}}
            fl = case["files"]
            fl["xyz"] = save(f"{name}.xyz.f32", xyz_np, "f4")
            fl["batch"] = save(f"{name}.batch.i32", bat_np, "i4")
            for nm, t in (("q", q), ("k", k), ("v", v)):
                fl[nm] = save(f"{name}.{nm}.f32", t.float().numpy(), "f4")
            for kind, tt in (("cubic", tc), ("sphere", ts)):
                for nm, t in zip(("tq", "tk", "tv"), tt):
                    fl[f"{nm}_{kind}"] = save(f"{name}.{nm}_{kind}.f32", t.float().numpy(), "f4")

            xyz = torch.from_numpy(xyz_np).to(dev)
            batch = torch.from_numpy(bat_np).long().to(dev)
            qd32, kd32, vd32 = (t.float().to(dev) for t in (q, k, v))
            tc32 = tuple(t.float().to(dev) for t in tc)
            ts32 = tuple(t.float().to(dev) for t in ts)
            qd16, kd16, vd16 = (t.to(dev) for t in (q, k, v))
            tc16 = tuple(t.to(dev) for t in tc)
            ts16 = tuple(t.to(dev) for t in ts)

            # partitions and their checks
            part_c, part_s = so.sphere_partitions(xyz, batch, lv)
            case["partition"] = {"cubic": so.partition_stats(part_c), "sphere": so.partition_stats(part_s)}
            fl["wincount_cubic"] = save(f"{name}.wincount_cubic.i32", so.window_counts(part_c).cpu().numpy(), "i4")
            fl["wincount_sphere"] = save(f"{name}.wincount_sphere.i32", so.window_counts(part_s).cpu().numpy(), "i4")
            pt_c = so.window_partition(xyz, batch, lv["window"], False, backend="torch")
            if not all(torch.equal(a.long(), b.long()) for a, b in zip(
                    (part_c[0], part_c[1], part_c[3], part_c[4]), (pt_c[0], pt_c[1], pt_c[3], pt_c[4]))):
                warn(case, f"{name}: sptr precompute_all and the plain-torch pair layout differ")
            sph = so.cart2sphere(xyz)
            idx_c = so.rpe_index(xyz[part_c[5]], part_c[0], part_c[3], lv["window"], lv["quant"], lv["L"])
            idx_s = so.rpe_index(sph[part_s[5]], part_s[0], part_s[3], lv["window_sphere"], lv["quant_sphere"],
                                 lv["L_sphere"], radial_split_a=lv["a"])
            case["rpe_index_range"] = {"cubic": [int(idx_c.min()), int(idx_c.max())],
                                       "sphere": [int(idx_s.min()), int(idx_s.max())]}
            if int(idx_c.max()) >= lvj["table_rows_cubic"]:
                warn(case, f"{name}: cubic RPE index {int(idx_c.max())} >= table rows (upstream asserts here)")
            del idx_c, idx_s

            # outputs
            cache = {}
            out32 = so.sphere_attention(qd32, kd32, vd32, xyz, batch, lv, tc32, ts32, cache=cache)
            fl["out_fp32"] = save(f"{name}.out_fp32.f32", out32.cpu().numpy(), "f4")
            ref32 = so.sphere_attention(qd32, kd32, vd32, xyz, batch, lv, tc32, ts32, backend="torch")
            checks = {"fp32_vs_torch_ref_rel": rel(out32, ref32)}
            del ref32
            nr32 = so.sphere_attention(qd32, kd32, vd32, xyz, batch, lv, None, None, cache=cache)
            fl["out_norpe_fp32"] = save(f"{name}.out_norpe_fp32.f32", nr32.cpu().numpy(), "f4")
            nref = so.sphere_attention(qd32, kd32, vd32, xyz, batch, lv, None, None, cache=cache, backend="torch")
            checks["norpe_fp32_vs_torch_ref_rel"] = rel(nr32, nref)
            del nr32, nref
            fp16_ok = True
            try:
                out16 = so.sphere_attention(qd16, kd16, vd16, xyz, batch, lv, tc16, ts16, cache=cache)
                torch.cuda.synchronize()
                fl["out_fp16"] = save(f"{name}.out_fp16.f32", out16.float().cpu().numpy(), "f4")
                checks["fp16_vs_fp32_rel"] = rel(out16, out32)
                checks["fp16_nonfinite"] = int((~torch.isfinite(out16)).sum())
                del out16
            except Exception as e:  # noqa: BLE001
                fp16_ok = False
                fl["out_fp16"] = None
                case["fp16_error"] = f"{type(e).__name__}: {e}"
                warn(case, f"{name}: FP16 run failed ({case['fp16_error']}); out_fp16 omitted")
            checks["fp32_nonfinite"] = int((~torch.isfinite(out32)).sum())
            case["checks"] = checks
            del out32
            for key, val in checks.items():
                if key.endswith("_ref_rel") and not val < 1e-5:
                    warn(case, f"{name}: sptr vs plain-torch reference {key} = {val:.3e}")

            # timings
            tm, mem = {}, {}
            i0, i0_off, n_max, i1, i1_off, sidx = part_c
            rel8 = so.rpe_index(xyz[sidx], i0, i1, lv["window"], lv["quant"], lv["L"]).to(so.RPE_INDEX_DTYPE).contiguous()
            i0_off_l = i0_off.long()
            for prec, (qq, kk, vv, tcc, tss) in (("fp32", (qd32, kd32, vd32, tc32, ts32)),
                                                 ("fp16", (qd16, kd16, vd16, tc16, ts16))):
                if prec == "fp16" and not fp16_ok:
                    continue
                qs, ks, vs = (t[sidx, :hc].contiguous() for t in (qq, kk, vv))
                tq, tk, tv = (t.contiguous() for t in tcc)

                def core():
                    a = F.dot_prod_with_idx_all(qs, i0, i0_off, ks, i1, i1_off, tq, tk, rel8, n_max)
                    a = so.scatter_softmax_csr(a, i0_off_l)
                    return F.attention_step2_with_rel_pos_value(a, vs, i0, i0_off, n_max, i1, i1_off, tv, rel8)

                def stage():
                    return so.sphere_attention(qq, kk, vv, xyz, batch, lv, tcc, tss)

                def stage_cached():
                    return so.sphere_attention(qq, kk, vv, xyz, batch, lv, tcc, tss, cache=cache)

                tm[f"cubic_core_{prec}_ms"] = med_ms(core)
                tm[f"stage_{prec}_ms"] = med_ms(stage)
                tm[f"stage_cached_{prec}_ms"] = med_ms(stage_cached)
                mem[f"cubic_core_{prec}_peak_mb"] = peak_mb(core)
                mem[f"stage_{prec}_peak_mb"] = peak_mb(stage)
                mem[f"stage_cached_{prec}_peak_mb"] = peak_mb(stage_cached)
                del qs, ks, vs
            case["fp16_supported"] = fp16_ok
            case["timings_ms"] = tm
            case["peak_extra_mb"] = mem
            manifest["cases"].append(case)
            pc, ps = case["partition"]["cubic"], case["partition"]["sphere"]
            print(f"[{name}] n {n}, heads {H}, cubic {pc['windows']} windows n_max {pc['n_max']} pairs {pc['pairs']}, "
                  f"sphere {ps['windows']} windows n_max {ps['n_max']} pairs {ps['pairs']}; checks "
                  + ", ".join(f"{k_} {v_:.2e}" if isinstance(v_, float) else f"{k_} {v_}" for k_, v_ in checks.items())
                  + "; " + ", ".join(f"{k_} {v_:.3f}" for k_, v_ in tm.items()), flush=True)
            del part_c, part_s, cache, rel8, xyz, batch
            torch.cuda.empty_cache()

    manifest["fp16_supported"] = all(c.get("fp16_supported", False) for c in manifest["cases"])
    manifest["elapsed_s"] = time.time() - t0
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    print(f"wrote {len(manifest['cases'])} cases to {args.out}/manifest.json (sptr {sptr_version}, "
          f"torch {manifest['torch_version']}, {manifest['device']})")
    for c in manifest["cases"]:
        print(json.dumps({"case": c["name"], "n": c["n"], "heads": c["heads"], **c["timings_ms"], **c["peak_extra_mb"]}))


# ------------------------------------------------------------------------------------------------
# self-check


def radial_bin_ref(d, a):
    """Bins of the exponential split from its definition (float64, for the self-check): |d| in
    [0, a) -> 0, [a, 2a) -> 1, then lengths double every two bins; negative d mirrored to -1 - bin."""
    m, edges = abs(d), [0.0]
    while edges[-1] <= m:  # bin i has length a * 2 ** (i // 2): a, a, 2a, 2a, 4a, 4a, ...
        edges.append(edges[-1] + a * 2 ** ((len(edges) - 1) // 2))
    i = int(np.searchsorted(edges, m, side="right")) - 1
    return i if d >= 0 else -1 - i


def div_floor_f32(a, b):
    """torch.div(a, b, rounding_mode="floor") for float32 a >= 0, b > 0 (ATen's div_floor_floating):
    m = fmod(a, b), d = (a - m) / b, then floor(d), plus one where d - floor(d) > 0.5. Not floor(a / b):
    where a / b rounds up to an integer the result stays one below it."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    m = np.fmod(a, b)
    d = ((a - m) / b).astype(np.float32)
    f = np.floor(d)
    return np.where(d - f > 0.5, f + 1, f).astype(np.float32)


def selfcheck_numpy():
    ok = True
    rng = np.random.default_rng(1)
    # voxel means: every point inside its voxel's cube, counts add up
    pts = rng.uniform(-3, 3, (5000, 3)).astype(np.float32)
    v = voxel_mean(pts, pts, 0.1, np.float32)
    ok &= len(v) <= len(pts)
    xyz, bat = random_cloud(SEED)
    n1 = int((bat == 1).sum())
    print(f"numpy: random cloud {len(xyz)} voxels ({len(xyz) - n1} + {n1}), voxel means {len(v)}")
    # window counts by brute force for the cubic stage-1 window
    lv = level_for(0.05, 80)
    w = lv["window"].astype(np.float32)
    mn = xyz.min(axis=0)
    cell = ((xyz - mn) / w).astype(np.int64)
    keys = np.concatenate([bat[:, None].astype(np.int64), cell], 1)
    _, inv, cnt = np.unique(keys, axis=0, return_inverse=True, return_counts=True)
    wc = cnt[inv.reshape(-1)]
    print(f"numpy: cubic windows {len(cnt)}, max {cnt.max()}, windows of one voxel {(cnt == 1).sum()}")
    ok &= (cnt == 1).sum() > 0 and cnt.max() > 10
    # level parameters as upstream computes them
    ok &= lv["L"] == 24 and lv["L_sphere"] == 24
    print(f"numpy: stage-1 window {level_json(lv)['window']} quant {level_json(lv)['quant']} "
          f"sphere {level_json(lv)['window_sphere']} {level_json(lv)['quant_sphere']}")
    # radial split bins (float64 formula vs definition)
    a = A
    for d in [0.0, 0.5 * a, a, 1.5 * a, 2 * a, 3.9 * a, 4 * a, 6 * a, 9.99 * a, 10 * a, 14 * a, 22 * a, 30 * a,
              -0.1 * a, -a, -2.5 * a, -7 * a, 1.0, -3.0, 60.0]:
        m = abs(d)
        b = 2 * math.floor(math.log((m + 2 * a) / a) / math.log(2)) - 2
        b = b + float((3 * 2 ** (b // 2) - 2) * a <= m)
        b = b * (1 if d >= 0 else -1) + (0 if d >= 0 else -1)
        if int(b) != radial_bin_ref(d, a):
            print(f"numpy: radial split of {d / a:.2f} a: formula {int(b)}, definition {radial_bin_ref(d, a)}")
            ok = False
    return ok, (xyz, bat, wc)


def selfcheck_torch(xyz_np, bat_np, wc_np):
    import torch
    import sptr_ops as so

    ok = True
    devs = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    for dev in devs:
        backends = ["torch"] + (["sptr"] if dev.type == "cuda" and so.sptr_available() else [])
        xyz = torch.from_numpy(xyz_np).to(dev)
        batch = torch.from_numpy(bat_np).long().to(dev)
        for lvl in (1, 3):
            lv = level_for(0.05, 80, level=lvl)
            for be in backends:
                part = so.window_partition(xyz, batch, lv["window"], backend=be)
                wc = so.window_counts(part).cpu().numpy()
                if lvl == 1 and not np.array_equal(wc, wc_np):
                    print(f"torch/{dev.type}/{be}: window counts differ from numpy brute force "
                          f"({int((wc != wc_np).sum())} voxels)")
                    ok = False
                # pair layout: query q's pairs are the voxels of its window, q itself among them
                i0, i0_off, n_max, i1, i1_off, sidx = (t.cpu() if torch.is_tensor(t) else t for t in part)
                i0, i1, i0_off = i0.long(), i1.long(), i0_off.long()
                cnt = i0_off[1:] - i0_off[:-1]
                good = torch.equal(i0, torch.arange(len(cnt)).repeat_interleave(cnt))
                good &= bool((i1[i0_off[:-1]] <= torch.arange(len(cnt))).all())
                good &= int(cnt.max()) == n_max and int(i0_off[-1]) == len(i0)
                if not good:
                    print(f"torch/{dev.type}/{be}: pair layout wrong")
                    ok = False
            # RPE index: numpy float32 recomputation, cubic
            part = so.window_partition(xyz, batch, lv["window"], backend="torch")
            i0, i0_off, n_max, i1, i1_off, sidx = part
            ps = xyz[sidx]
            idx = so.rpe_index(ps, i0, i1, lv["window"], lv["quant"], lv["L"]).cpu().numpy()
            p = ps.cpu().numpy()
            w, qz = lv["window"].astype(np.float32), lv["quant"].astype(np.float32)
            cell = div_floor_f32(np.fmod(p - p.min(0), w), qz)
            ref = cell[i0.cpu().long().numpy()] - cell[i1.cpu().long().numpy()] + lv["L"] - 1
            bad = int((ref != idx).any(1).sum())
            print(f"torch/{dev.type}: level {lvl} cubic RPE index range [{idx.min():.0f}, {idx.max():.0f}], "
                  f"{bad} of {len(idx)} pairs differ from numpy")
            ok &= bad == 0
            # radial split of the torch path vs the definition
            sph = so.cart2sphere(xyz)
            part_s = so.window_partition(sph, batch, lv["window_sphere"], backend="torch")
            ss = sph[part_s[5]]
            rs = so.radial_split_index(ss[:, 2], part_s[0], part_s[3], lv["a"]).cpu().numpy() - 24
            dd = (ss[part_s[0].long(), 2] - ss[part_s[3].long(), 2]).cpu().numpy()
            pick = np.random.default_rng(0).choice(len(dd), min(2000, len(dd)), replace=False)
            bad = sum(int(rs[i]) != radial_bin_ref(float(dd[i]), lv["a"]) for i in pick)
            print(f"torch/{dev.type}: level {lvl} radial split, {bad} of {len(pick)} sampled pairs differ from the definition")
            ok &= bad <= 2  # float32 vs float64 at bin edges
            # attention: torch backend vs a dense per-window float64 computation
            gen = torch.Generator().manual_seed(5)
            H, D = 2, HEAD_DIM
            q = ((torch.rand((len(xyz_np), H, D), generator=gen) * 2 - 1) * 0.25).to(dev)
            k = (torch.rand((len(xyz_np), H, D), generator=gen) * 2 - 1).to(dev)
            v = (torch.rand((len(xyz_np), H, D), generator=gen) * 2 - 1).to(dev)
            tab = lambda t, h: (torch.randn((t, 3, h, D), generator=gen) * 0.02).to(dev)  # noqa: E731
            tc = tuple(tab(2 * lv["L"] - 1, 1) for _ in range(3))
            ts = tuple(tab(2 * lv["L_sphere"], 1) for _ in range(3))
            outs = {be: so.sphere_attention(q, k, v, xyz, batch, lv, tc, ts, backend=be) for be in backends}
            ref = dense_reference(q, k, v, xyz, batch, lv, tc, ts, so)
            for be, o in outs.items():
                err = float((o.double().cpu() - ref).norm() / ref.norm())
                print(f"torch/{dev.type}/{be}: level {lvl} sphere_attention vs dense per-window float64: rel {err:.2e}")
                ok &= err < 1e-5
            cache = {}
            o1 = so.sphere_attention(q, k, v, xyz, batch, lv, tc, ts, cache=cache, backend="torch")
            o2 = so.sphere_attention(q, k, v, xyz, batch, lv, tc, ts, cache=cache, backend="torch")
            ok &= torch.equal(o1, o2) and len(cache) == 1
    return ok


def dense_reference(q, k, v, xyz, batch, lv, tc, ts, so):
    """Per window, float64, dense softmax; windows from the same partition code (checked separately)."""
    import torch

    H = q.shape[1]
    hc = H // 2
    out = torch.zeros(q.shape, dtype=torch.float64)
    sph = so.cart2sphere(xyz)
    for pos, win, qu, LL, tabs, heads, a in ((xyz, lv["window"], lv["quant"], lv["L"], tc, slice(0, hc), None),
                                             (sph, lv["window_sphere"], lv["quant_sphere"], lv["L_sphere"], ts,
                                              slice(hc, H), lv["a"])):
        i0, i0_off, n_max, i1, i1_off, sidx = so.window_partition(pos, batch, win, backend="torch")
        rel = so.rpe_index(pos[sidx], i0, i1, win, qu, LL, radial_split_a=a).long().cpu()
        qs, ks, vs = (t[sidx][:, heads].double().cpu() for t in (q, k, v))
        tq, tk, tv = (t.double().cpu() for t in tabs)
        off = i0_off.long().cpu()
        res = torch.zeros(qs.shape, dtype=torch.float64)
        for qi in range(qs.shape[0]):
            s, e = int(off[qi]), int(off[qi + 1])
            keys = i1[s:e].long().cpu()
            r = rel[s:e]
            sq = tq[r[:, 0], 0] + tq[r[:, 1], 1] + tq[r[:, 2], 2]
            sk = tk[r[:, 0], 0] + tk[r[:, 1], 1] + tk[r[:, 2], 2]
            sv = tv[r[:, 0], 0] + tv[r[:, 1], 1] + tv[r[:, 2], 2]
            logit = (qs[qi][None] * (ks[keys] + sq)).sum(-1) + (ks[keys] * sk).sum(-1)  # [n, h]
            p = torch.softmax(logit, 0)
            res[qi] = (p[:, :, None] * (vs[keys] + sv)).sum(0)
        full = torch.empty_like(res)
        full[sidx.cpu()] = res
        out[:, heads] = full
    return out


def selfcheck():
    ok, (xyz, bat, wc) = selfcheck_numpy()
    try:
        import torch  # noqa: F401
    except ImportError:
        print("selfcheck: torch not importable here; numpy parts only " + ("passed" if ok else "FAILED"))
        return 0 if ok else 1
    ok &= selfcheck_torch(xyz, bat, wc)
    print("selfcheck " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/sptr-parity")
    ap.add_argument("--root", default=os.path.normpath(os.path.join(HERE, "../..")))
    ap.add_argument("--dense", default=None, help="dense cloud, float32 x3 (default <root>/gpu-stage/benchmark-pc.bin)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--cases", default="", help="comma-separated subset of case names")
    ap.add_argument("--selfcheck", action="store_true", help="CPU checks of the stand-ins, then exit")
    args = ap.parse_args()
    if args.selfcheck:
        sys.exit(selfcheck())
    run(args)


if __name__ == "__main__":
    main()
