#!/usr/bin/env python3
"""PyTorch + spconv 2.x reference of BEVFusion's LiDAR branch (hard voxelization + SparseEncoder).

Written for this project from a reading of mit-han-lab/bevfusion at db75150
(mmdet3d/ops/voxel/voxelize.py + src/voxelization_*.{cpp,cu} with deterministic=True,
mmdet3d/models/fusion_models/bevfusion.py `voxelize` with voxelize_reduce, and
mmdet3d/models/backbones/sparse_encoder.py + mmdet3d/ops/sparse_block.py): same module tree, state_dict
names, indice keys and output flattening. Upstream vendors spconv 1.x (weights [k0, k1, k2, Cin, Cout]);
this reference runs spconv 2.x (weights [Cout, k0, k1, k2, Cin]), whose conv arithmetic is the same
(out * stride = in + padding - offset, offsets flattened last axis fastest), so weights are permuted on
the way in and out. Runs on the GPU host (spconv from .parity-wheels, see README.md).

    python3 tests/parity/lidar_encoder_ref.py --model config/models/bevfusion_seg_fusion.yaml \
        --random-weights W.safetensors --seed S
    python3 tests/parity/lidar_encoder_ref.py --model M.yaml --weights W.safetensors \
        --cloud tests/data/nuscenes/X.pcd.bin --sweeps 10 --out DIR [--bench --iters 20]
    python3 tests/parity/lidar_encoder_ref.py --model M.yaml --voxels-only --cloud X.pcd.bin --out DIR
        (numpy only: the cloud and its voxels, for the CPU check of
        tests/bevfusion_lidar_encoder/parity.rs)

Inputs: the nuScenes sweep (float32 x 5: x, y, z, intensity, ring); the key frame's column 4 (time lag)
is set to 0 as upstream's LoadPointsFromMultiSweeps does, and `--sweeps K` appends K - 1 copies rotated by
0.6 k degrees about z, shifted -0.4 k m along x, with lag 0.05 k s (a stand-in for K aggregated sweeps).

Outputs (DIR): points.bin (the cloud, float32 x 5), voxel_coords.npy [M, 4] (b, x, y, z as float32),
voxel_feats.npy [M, 5], stage_<name>_coords.npy / stage_<name>_feats.npy for conv_input,
encoder_layer1..4, conv_out (spconv's output order), bev.npy (N, C*D, H, W) = (1, 256, 128, 128) FP32,
bev_fp16.npy (the whole encoder in FP16, as upstream's mixed-precision evaluation runs it), ref.json
(voxel stats, encoder timings: CUDA events, median). The voxelization here is numpy, written from
upstream's algorithm (first-appearance voxel order, first max_num_points points, max_voxels cap, float32
cell arithmetic, then BEVFusion.voxelize's sum over the point slots / count).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------------
# config

def load_cfg(path):
    import yaml

    with open(path) as f:
        doc = yaml.safe_load(f)
    lidar = doc["model"]["encoders"]["lidar"]
    v, b = lidar["voxelize"], lidar["backbone"]
    mv = v["max_voxels"]
    return {
        "voxel_size": [float(x) for x in v["voxel_size"]],
        "range": [float(x) for x in v["point_cloud_range"]],
        "max_points": int(v["max_num_points"]),
        "max_voxels": int(mv[1] if isinstance(mv, list) else mv),
        # the test pipeline's PointsRangeFilter (strict, float32) before the model; sptr's key
        "range_filter": bool(v.get("range_filter", True)),
        "in_channels": int(b["in_channels"]),
        "sparse_shape": [int(x) for x in b["sparse_shape"]],
        "base_channels": int(b.get("base_channels", 16)),
        "output_channels": int(b.get("output_channels", 128)),
        "encoder_channels": [list(map(int, s)) for s in b["encoder_channels"]],
        "encoder_paddings": b["encoder_paddings"],
        "block_type": b.get("block_type", "conv_module"),
    }


# ----------------------------------------------------------------------------------------------------
# safetensors (numpy + json, no package needed)

def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        if info["dtype"] != "F32":
            raise ValueError(f"{name}: dtype {info['dtype']} (F32 expected)")
        out[name] = np.frombuffer(raw[8 + hlen + s:8 + hlen + e], dtype="<f4").reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


PREFIX = "encoders.lidar.backbone."


# ----------------------------------------------------------------------------------------------------
# SparseEncoder (basicblock) on spconv 2.x

def build_encoder(cfg):
    import torch
    from torch import nn
    import spconv.pytorch as spconv

    def bn(c):
        return nn.BatchNorm1d(c, eps=1e-3, momentum=0.01)

    def pad3(p):
        return list(p) if isinstance(p, (list, tuple)) else [p, p, p]

    class BasicBlock(spconv.SparseModule):
        # mmdet's BasicBlock with SubMConv3d (no indice_key) and BN1d; forward of SparseBasicBlock
        def __init__(self, c):
            super().__init__()
            self.conv1 = spconv.SubMConv3d(c, c, 3, stride=1, padding=1, bias=False)
            self.bn1 = bn(c)
            self.conv2 = spconv.SubMConv3d(c, c, 3, stride=1, padding=1, bias=False)
            self.bn2 = bn(c)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            identity = x.features
            out = self.conv1(x)
            out = out.replace_feature(self.relu(self.bn1(out.features)))
            out = self.conv2(out)
            out = out.replace_feature(self.relu(self.bn2(out.features) + identity))
            return out

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            c = cfg["base_channels"]
            self.conv_input = spconv.SparseSequential(
                spconv.SubMConv3d(cfg["in_channels"], c, 3, padding=1, bias=False, indice_key="subm1"), bn(c), nn.ReLU(inplace=True))
            self.encoder_layers = spconv.SparseSequential()
            stages = cfg["encoder_channels"]
            for i, blocks in enumerate(stages):
                layers = []
                for j, out in enumerate(blocks):
                    if j == len(blocks) - 1 and i != len(stages) - 1:
                        p = pad3(cfg["encoder_paddings"][i][j])
                        layers.append(spconv.SparseSequential(
                            spconv.SparseConv3d(c, out, 3, stride=2, padding=p, bias=False, indice_key=f"spconv{i + 1}"),
                            bn(out), nn.ReLU(inplace=True)))
                    else:
                        assert out == c, "basic block channel mismatch"
                        layers.append(BasicBlock(out))
                    c = out
                self.encoder_layers.add_module(f"encoder_layer{i + 1}", spconv.SparseSequential(*layers))
            self.conv_out = spconv.SparseSequential(
                spconv.SparseConv3d(c, cfg["output_channels"], (1, 1, 3), stride=(1, 1, 2), padding=0, bias=False,
                                    indice_key="spconv_down2"),
                bn(cfg["output_channels"]), nn.ReLU(inplace=True))

        def forward(self, feats, coords, stages=None):
            x = spconv.SparseConvTensor(feats, coords, cfg["sparse_shape"], 1)
            x = self.conv_input(x)
            if stages is not None:
                stages.append(("conv_input", x))
            for name, layer in self.encoder_layers.named_children():
                x = layer(x)
                if stages is not None:
                    stages.append((name, x))
            x = self.conv_out(x)
            if stages is not None:
                stages.append(("conv_out", x))
            d = x.dense()
            n, c, h, w, dd = d.shape
            return d.permute(0, 1, 4, 2, 3).contiguous().view(n, c * dd, h, w)

    return Encoder()


def is_conv_weight(name, arr):
    return name.endswith(".weight") and arr.ndim == 5


def random_state(model, seed):
    """Upstream names, spconv 1.x layout [k0, k1, k2, Cin, Cout]; BN statistics not the identity."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            continue
        shape = tuple(t.shape)
        if len(shape) == 5:  # spconv 2.x [Cout, k0, k1, k2, Cin]
            cout, k0, k1, k2, cin = shape
            b = math.sqrt(3.0 / (k0 * k1 * k2 * cin))
            arr = rng.uniform(-b, b, size=(k0, k1, k2, cin, cout))
        elif name.endswith("running_var"):
            arr = rng.uniform(0.5, 1.5, size=shape)
        elif name.endswith(".weight"):
            arr = rng.uniform(0.9, 1.1, size=shape)
        else:
            arr = rng.uniform(-0.1, 0.1, size=shape)
        out[PREFIX + name] = arr.astype(np.float32)
    return out


def load_state(model, path):
    import torch

    st = read_safetensors(path)
    sd = {}
    for name, t in model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            sd[name] = t
            continue
        arr = st[PREFIX + name]
        if len(t.shape) == 5:
            arr = np.transpose(arr, (4, 0, 1, 2, 3))  # [k0, k1, k2, Cin, Cout] -> [Cout, k0, k1, k2, Cin]
        assert tuple(arr.shape) == tuple(t.shape), (name, arr.shape, t.shape)
        sd[name] = torch.from_numpy(np.ascontiguousarray(arr))
    model.load_state_dict(sd, strict=True)


# ----------------------------------------------------------------------------------------------------
# hard voxelization (upstream's deterministic semantics) + voxelize_reduce

def make_cloud(path, sweeps):
    raw = np.fromfile(path, dtype="<f4").reshape(-1, 5).copy()
    raw[:, 4] = 0.0  # key frame time lag
    out = [raw]
    for k in range(1, sweeps):
        a = math.radians(0.6 * k)
        s, c = np.float32(math.sin(a)), np.float32(math.cos(a))
        q = raw.copy()
        q[:, 0] = c * raw[:, 0] - s * raw[:, 1] + np.float32(-0.4 * k)
        q[:, 1] = s * raw[:, 0] + c * raw[:, 1]
        q[:, 4] = np.float32(0.05 * k)
        out.append(q)
    return np.concatenate(out).astype(np.float32)


def hard_voxelize(pts, cfg):
    """PointsRangeFilter, then upstream's deterministic hard voxelization + voxelize_reduce (numpy, float32).

    -> feats [M, 5] (mean of the kept points), coords [M, 4] (0, x, y, z) int32, stats."""
    f32 = np.float32
    vs = np.array(cfg["voxel_size"], dtype=f32)
    lo = np.array(cfg["range"][:3], dtype=f32)
    hi = np.array(cfg["range"][3:], dtype=f32)
    grid = np.round((hi - lo) / vs)  # float32 arithmetic, as the C++ code
    with np.errstate(invalid="ignore", over="ignore"):
        c = np.floor((pts[:, :3] - lo) / vs)
        finite = (np.abs(pts) <= 65504.0).all(1)  # sptr drops NaN/Inf and values beyond FP16's range
        valid = finite & (c >= 0).all(1) & (c < grid).all(1)
        if cfg["range_filter"]:  # mmdet3d's in_range_3d with a float32 range
            valid &= ((pts[:, :3] > lo) & (pts[:, :3] < hi)).all(1)
    gi = grid.astype(np.int64)
    ci = np.where(valid[:, None], c, 0).astype(np.int64)
    key = (ci[:, 0] * gi[1] + ci[:, 1]) * gi[2] + ci[:, 2]
    idx = np.nonzero(valid)[0]  # valid points in point order
    uniq, first, inv = np.unique(key[idx], return_index=True, return_inverse=True)
    m = uniq.size
    order = np.argsort(first, kind="stable")  # voxels in order of their first point
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    vid = rank[inv.reshape(-1)]
    perm = np.argsort(vid, kind="stable")  # each voxel's points stay in point order
    sv = vid[perm]
    starts = np.searchsorted(sv, np.arange(m))
    slot = np.arange(sv.size) - starts[sv]
    mk = min(m, cfg["max_voxels"])
    keep = (sv < mk) & (slot < cfg["max_points"])
    voxels = np.zeros((mk, cfg["max_points"], 5), dtype=f32)
    voxels[sv[keep], slot[keep]] = pts[idx[perm[keep]]]
    per_voxel = np.bincount(vid, minlength=m)  # indexed by voxel number
    counts = np.minimum(per_voxel[:mk], cfg["max_points"])
    vk = uniq[order[:mk]]
    coords = np.stack([np.zeros_like(vk), vk // (gi[1] * gi[2]), (vk // gi[2]) % gi[1], vk % gi[2]], 1).astype(np.int32)
    feats = voxels.sum(axis=1, dtype=f32) / counts.astype(f32)[:, None]  # BEVFusion.voxelize, voxelize_reduce
    stats = {
        "points_in": int(pts.shape[0]),
        "non_finite": int((~finite).sum()),
        "out_of_range": int((finite & ~valid).sum()),
        "voxels_total": int(m),
        "voxels_kept": int(mk),
        "points_capped": int(per_voxel[mk:].sum()),
        "points_over_max": int(np.maximum(per_voxel[:mk] - cfg["max_points"], 0).sum()),
    }
    return feats.astype(f32), coords, stats


# ----------------------------------------------------------------------------------------------------

def write_voxels(cfg, args):
    os.makedirs(args.out, exist_ok=True)
    pts = make_cloud(args.cloud, args.sweeps)
    pts.tofile(os.path.join(args.out, "points.bin"))
    feats, coords, stats = hard_voxelize(pts, cfg)
    print("voxelization:", stats)
    np.save(os.path.join(args.out, "voxel_coords.npy"), coords.astype(np.float32))
    np.save(os.path.join(args.out, "voxel_feats.npy"), feats)
    with open(os.path.join(args.out, "ref.json"), "w") as f:
        json.dump({"stats": stats, "sweeps": args.sweeps, "points": int(pts.shape[0])}, f, indent=1)
    return pts, feats, coords, stats


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--random-weights", metavar="OUT.safetensors")
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--weights")
    ap.add_argument("--cloud")
    ap.add_argument("--sweeps", type=int, default=10)
    ap.add_argument("--out")
    ap.add_argument("--voxels-only", action="store_true", help="write the cloud and its voxels (numpy only), exit")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    cfg = load_cfg(args.model)
    assert cfg["block_type"] == "basicblock", cfg["block_type"]

    if args.voxels_only:
        if not (args.cloud and args.out):
            ap.error("--voxels-only needs --cloud and --out")
        write_voxels(cfg, args)
        return

    import torch

    model = build_encoder(cfg)
    if args.random_weights:
        st = random_state(model, args.seed)
        write_safetensors(args.random_weights, st)
        print(f"wrote {len(st)} tensors to {args.random_weights}")
        return
    if not (args.weights and args.cloud and args.out):
        ap.error("--weights, --cloud and --out are needed (or --random-weights)")
    dev = torch.device("cuda")
    load_state(model, args.weights)
    model = model.to(dev).eval()
    pts, feats_np, coords_np, stats = write_voxels(cfg, args)
    save = lambda name, t: np.save(os.path.join(args.out, name), t.detach().float().cpu().numpy().astype(np.float32))

    with torch.no_grad():
        feats = torch.from_numpy(feats_np).to(dev)
        coords = torch.from_numpy(coords_np).to(dev)
        stages = []
        bev = model(feats, coords, stages)
        for name, x in stages:
            save(f"stage_{name}_coords.npy", x.indices)
            save(f"stage_{name}_feats.npy", x.features)
            print(f"{name}: {x.indices.shape[0]} sites x {x.features.shape[1]} channels, spatial {x.spatial_shape}")
        save("bev.npy", bev)
        print("bev", tuple(bev.shape), "nonzero", int((bev != 0).sum()))
        ref = {"stats": stats, "bev_shape": list(bev.shape), "sweeps": args.sweeps, "points": int(pts.shape[0])}
        try:
            m16 = build_encoder(cfg)
            load_state(m16, args.weights)
            m16 = m16.to(dev).eval().half()
            bev16 = m16(feats.half(), coords)
            save("bev_fp16.npy", bev16)
            e = float(torch.linalg.vector_norm(bev16.float() - bev) / torch.linalg.vector_norm(bev))
            ref["fp16_rel_err_vs_fp32"] = e
            print(f"FP16 encoder vs FP32: rel {e:.3e}")
        except Exception as ex:  # spconv may lack an FP16 algorithm for a shape; the FP32 reference stands
            print("FP16 run failed:", repr(ex))
            m16 = None
        if args.bench:
            from cuda_timing import event_times_ms

            ref["encoder_fp32_ms"] = float(np.median(event_times_ms(lambda: model(feats, coords), args.warmup, args.iters)))
            if m16 is not None:
                f16 = feats.half()
                ref["encoder_fp16_ms"] = float(np.median(event_times_ms(lambda: m16(f16, coords), args.warmup, args.iters)))
            print("bench:", {k: v for k, v in ref.items() if k.endswith("_ms")})
    with open(os.path.join(args.out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)


if __name__ == "__main__":
    main()
