#!/usr/bin/env python3
"""PyTorch reference of BEVFusion's LSS geometry and bev_pool, for tests/bevfusion_lss/parity.rs.

Written for this project from a reading of mit-han-lab/bevfusion at db75150
(mmdet3d/models/vtransforms/base.py: gen_dx_bx, create_frustum, get_geometry, bev_pool;
mmdet3d/ops/bev_pool/bev_pool.py: ranks, argsort, QuickCumsum) and of the data pipeline's test-time
ImageAug3D (resize, crop -> img_aug_matrix). Runs on the GPU host (torch, numpy, PyYAML):

    python3 tests/parity/lss_ref.py --out DIR [--calib tests/data/nuscenes/calib.json]
        [--model config/models/bevfusion_seg_camera.yaml] [--seed 20261124] [--iters 50]

Cases: `seg` (the model YAML's vtransform: 6 x 118 x 32 x 88, C 80, 256 x 256 at 0.4 m) and `det`
(x/y bounds [-54, 54, 0.3]: 360 x 360), both with the nuScenes sample calibration (cam2img, and
camera2lidar = inv(lidar2cam)), 1600 x 900 images.

What is computed per case:
  - frustum as create_frustum (torch, CPU, float32): written as the checkpoint parameter would be;
  - get_geometry transcribed from base.py, once in float32 (upstream's precision) and once in
    float64 from the same float32 inputs (K, camera2lidar, img_aug_matrix are float32 in
    upstream's pipeline). sptr computes the geometry in float64 (src/bev/lss/geometry.rs), so the
    float64 cells are the reference; the float32 ones are counted against them (`cells_f32_differ`);
  - cells = ((geom - (bx - dx / 2)) / dx).long(), kept = 0 <= cell < nx, rank = (x * ny + y) * nz + z
    (bev_pool's rank with B = 1): per point (B, N, D, H, W order) the cell or -1; the intervals
    (cell, length) of the sorted ranks;
  - random inputs (seeded): depth = softmax over D of N(0, 1.5^2) logits, features uniform +-1, both
    rounded to float16 (what sptr's pool reads); x = depth (x) features per point, as get_cam_feats;
  - pooled: float64 scatter-add of x over the kept points (the reference), and bev_pool's own path in
    float32 (argsort + QuickCumsum: cumsum, interval ends, differences), whose error against the
    float64 one is reported;
  - timings (CUDA events, median): the float32 QuickCumsum bev_pool from x (`torch_quickcumsum_ms`,
    intervals recomputed each call as upstream), the whole upstream path from depth, features and
    calibration (get_geometry + outer product + bev_pool, `torch_upstream_path_ms`, with its peak
    extra memory), and scatter-add with the cells precomputed once per calibration
    (`index_add_` of depth[kept] * features[kept] into the map, float32 and float16:
    `torch_scatter_add_ms`, `torch_scatter_add_fp16_ms`): the PyTorch reference beside sptr's pool.

Files per case under DIR/<case>/ (raw little endian):
  frustum.f32 [D, fH, fW, 3]      depth.f32 [N, D, fH, fW]      feats.f32 [N, C, fH, fW]
  cells.i32 [N * D * fH * fW]     intervals.i32 [n, 2] (cell, length)
  pooled.f32 [nx, ny, nz * C] (float64 reference, channels last: channel z * C + c)
and DIR/ref.json (sizes, grid dx / bx / nx, counts, errors, timings, versions).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_timing import event_times_ms, peak_extra_bytes  # noqa: E402

CAMERAS = ["CAM_FRONT", "CAM_FRONT_RIGHT", "CAM_FRONT_LEFT", "CAM_BACK", "CAM_BACK_LEFT", "CAM_BACK_RIGHT"]


def load_cfg(path):
    import yaml

    with open(path) as f:
        y = yaml.safe_load(f)
    vt = y["model"]["encoders"]["camera"]["vtransform"]
    return {
        "image_size": vt["image_size"],
        "feature_size": vt["feature_size"],
        "xbound": vt["xbound"],
        "ybound": vt["ybound"],
        "zbound": vt["zbound"],
        "dbound": vt["dbound"],
        "C": vt["out_channels"],
        "resize": float(np.mean(y["augment2d"]["resize"][1])),
        "bot_pct": float(np.mean(y["bot_pct_lim"])),
    }


def gen_dx_bx(xbound, ybound, zbound):
    import torch

    rows = [xbound, ybound, zbound]
    dx = torch.Tensor([r[2] for r in rows])
    bx = torch.Tensor([r[0] + r[2] / 2.0 for r in rows])
    nx = torch.LongTensor([(r[1] - r[0]) / r[2] for r in rows])
    return dx, bx, nx


def create_frustum(cfg):
    import torch

    ih, iw = cfg["image_size"]
    fh, fw = cfg["feature_size"]
    ds = torch.arange(*cfg["dbound"], dtype=torch.float).view(-1, 1, 1).expand(-1, fh, fw)
    d = ds.shape[0]
    xs = torch.linspace(0, iw - 1, fw, dtype=torch.float).view(1, 1, fw).expand(d, fh, fw)
    ys = torch.linspace(0, ih - 1, fh, dtype=torch.float).view(1, fh, 1).expand(d, fh, fw)
    return torch.stack((xs, ys, ds), -1)


def img_aug(cfg, w, h):
    """ImageAug3D at test time: (post_rot 3x3, post_tran 3) as float32, like img_aug_matrix."""
    import torch

    fh, fw = cfg["image_size"]
    resize = cfg["resize"]
    new_w, new_h = int(w * resize), int(h * resize)
    crop_h = int((1 - cfg["bot_pct"]) * new_h) - fh
    crop_w = int(max(0, new_w - fw) / 2)
    rot = torch.eye(2) * resize
    tran = -torch.Tensor([crop_w, crop_h])
    m = torch.eye(4)
    m[:2, :2] = rot
    m[:2, 3] = tran
    return m[:3, :3].contiguous(), m[:3, 3].contiguous()


def calibration(path):
    with open(path) as f:
        cams = json.load(f)["cameras"]
    k = np.stack([np.array(cams[c]["cam2img"], dtype=np.float64) for c in CAMERAS]).astype(np.float32)
    c2l = np.stack([np.linalg.inv(np.array(cams[c]["lidar2cam"], dtype=np.float64)) for c in CAMERAS]).astype(np.float32)
    return k, c2l


def get_geometry(frustum, rots, trans, intrins, post_rots, post_trans):
    """base.py get_geometry (B x N x D x H x W x 3), in the dtype of the arguments."""
    import torch

    B, N, _ = trans.shape
    points = frustum - post_trans.view(B, N, 1, 1, 1, 3)
    points = torch.inverse(post_rots).view(B, N, 1, 1, 1, 3, 3).matmul(points.unsqueeze(-1))
    points = torch.cat((points[:, :, :, :, :, :2] * points[:, :, :, :, :, 2:3], points[:, :, :, :, :, 2:3]), 5)
    combine = rots.matmul(torch.inverse(intrins))
    points = combine.view(B, N, 1, 1, 1, 3, 3).matmul(points).squeeze(-1)
    points += trans.view(B, N, 1, 1, 1, 3)
    return points


def cells_of(geom, dx, bx, nx):
    """bev_pool's indices: per point the rank (x * ny + y) * nz + z with B = 1, or -1 outside."""
    import torch

    lower = (bx - dx / 2.0).to(geom.dtype)  # float32 arithmetic as upstream, then widened
    g = ((geom - lower) / dx.to(geom.dtype)).long().view(-1, 3)
    kept = (g[:, 0] >= 0) & (g[:, 0] < nx[0]) & (g[:, 1] >= 0) & (g[:, 1] < nx[1]) & (g[:, 2] >= 0) & (g[:, 2] < nx[2])
    rank = (g[:, 0] * nx[1] + g[:, 1]) * nx[2] + g[:, 2]
    return torch.where(kept, rank, torch.full_like(rank, -1)), kept


def quick_cumsum_pool(x, geom_feats, nx):
    """bev_pool with QuickCumsum (float32): x [Nprime, C], geom_feats [Nprime, 4] (x, y, z, b)."""
    import torch

    B = 1
    D, H, W = int(nx[2]), int(nx[0]), int(nx[1])
    ranks = geom_feats[:, 0] * (W * D * B) + geom_feats[:, 1] * (D * B) + geom_feats[:, 2] * B + geom_feats[:, 3]
    idx = ranks.argsort()
    x, geom_feats, ranks = x[idx], geom_feats[idx], ranks[idx]
    x = x.cumsum(0)
    kept = torch.ones(x.shape[0], device=x.device, dtype=torch.bool)
    kept[:-1] = ranks[1:] != ranks[:-1]
    x, geom_feats = x[kept], geom_feats[kept]
    x = torch.cat((x[:1], x[1:] - x[:-1]))
    out = torch.zeros((B, D, H, W, x.shape[1]), dtype=x.dtype, device=x.device)
    out[geom_feats[:, 3], geom_feats[:, 2], geom_feats[:, 0], geom_feats[:, 1]] = x
    out = out.permute(0, 4, 1, 2, 3)
    return torch.cat(out.unbind(dim=2), 1)  # (B, C * Z, X, Y)


def upstream_bev_pool(x_ndhwc, geom, dx, bx, nx):
    """base.py bev_pool from x (N, D, H, W, C) and geometry (B, N, D, H, W, 3), float32."""
    import torch

    c = x_ndhwc.shape[-1]
    x = x_ndhwc.reshape(-1, c)
    g = ((geom - (bx - dx / 2.0)) / dx).long().view(-1, 3)
    g = torch.cat((g, torch.zeros((g.shape[0], 1), dtype=torch.long, device=g.device)), 1)
    kept = (g[:, 0] >= 0) & (g[:, 0] < nx[0]) & (g[:, 1] >= 0) & (g[:, 1] < nx[1]) & (g[:, 2] >= 0) & (g[:, 2] < nx[2])
    return quick_cumsum_pool(x[kept], g[kept], nx)


def run_case(name, cfg, calib, out_dir, seed, iters, dev):
    import torch

    d_out = os.path.join(out_dir, name)
    os.makedirs(d_out, exist_ok=True)
    dx, bx, nx = gen_dx_bx(cfg["xbound"], cfg["ybound"], cfg["zbound"])
    frustum = create_frustum(cfg)
    D, fh, fw, _ = frustum.shape
    C = cfg["C"]
    k, c2l = calibration(calib)
    N = k.shape[0]
    pr, pt = img_aug(cfg, 1600, 900)
    intrins = torch.from_numpy(k).view(1, N, 3, 3)
    rots = torch.from_numpy(c2l[:, :3, :3].copy()).view(1, N, 3, 3)
    trans = torch.from_numpy(c2l[:, :3, 3].copy()).view(1, N, 3)
    post_rots = pr.view(1, 1, 3, 3).expand(1, N, 3, 3).contiguous()
    post_trans = pt.view(1, 1, 3).expand(1, N, 3).contiguous()
    args32 = [t.to(dev) for t in (frustum, rots, trans, intrins, post_rots, post_trans)]
    args64 = [t.double() for t in args32]
    dx, bx, nx = dx.to(dev), bx.to(dev), nx.to(dev)
    geom64 = get_geometry(*args64)
    geom32 = get_geometry(*args32)
    cells64, kept64 = cells_of(geom64, dx, bx, nx)
    cells32, _ = cells_of(geom32, dx, bx, nx)
    ranks = cells64[kept64]
    uniq, counts = torch.unique(ranks, sorted=True, return_counts=True)

    # random inputs, float16-rounded
    gen = torch.Generator(device="cpu").manual_seed(seed)
    logits = torch.randn((N, D, fh, fw), generator=gen) * 1.5
    depth = logits.softmax(dim=1).half().float().to(dev)
    feats = (torch.rand((N, C, fh, fw), generator=gen) * 2 - 1).half().float().to(dev)
    # get_cam_feats: x = depth.unsqueeze(1) * feats.unsqueeze(2) -> (N, C, D, H, W) -> (N, D, H, W, C)
    x = (depth.unsqueeze(1) * feats.unsqueeze(2)).permute(0, 2, 3, 4, 1).contiguous()

    # float64 scatter-add reference, channels last [nx, ny, nz * C]
    cells_n = int(nx[0] * nx[1] * nx[2])
    x64 = x.double().view(-1, C)[kept64]
    ref = torch.zeros((cells_n, C), dtype=torch.float64, device=dev).index_add_(0, ranks, x64)
    ref_map = ref.view(int(nx[0]), int(nx[1]), int(nx[2]) * C)
    # upstream's float32 QuickCumsum path, from the float32 geometry, for its error only
    up = upstream_bev_pool(x, geom32, dx, bx, nx)[0]  # (C * Z, X, Y)
    up_cl = up.permute(1, 2, 0).double()
    rel_up = float(((up_cl - ref_map).norm() / ref_map.norm()).item())

    # timings
    x_flat = x.view(-1, C)
    g32 = ((geom32 - (bx - dx / 2.0)) / dx).long().view(-1, 3)
    g32 = torch.cat((g32, torch.zeros((g32.shape[0], 1), dtype=torch.long, device=dev)), 1)
    kept32 = (g32[:, 0] >= 0) & (g32[:, 0] < nx[0]) & (g32[:, 1] >= 0) & (g32[:, 1] < nx[1]) & (g32[:, 2] >= 0) & (g32[:, 2] < nx[2])
    xk, gk = x_flat[kept32], g32[kept32]
    t_cumsum = event_times_ms(lambda: quick_cumsum_pool(xk, gk, nx), 3, iters)

    def upstream_path():
        geom = get_geometry(*args32)
        xx = (depth.unsqueeze(1) * feats.unsqueeze(2)).permute(0, 2, 3, 4, 1)
        return upstream_bev_pool(xx, geom, dx, bx, nx)

    t_path = event_times_ms(upstream_path, 3, iters)
    path_bytes = peak_extra_bytes(upstream_path)
    # scatter-add with the cells precomputed once per calibration (what a PyTorch user would
    # write for a fixed calibration): depth index and feature index per kept point
    pidx = torch.arange(N * D * fh * fw, device=dev)[kept64]
    w_ = pidx % fw
    h_ = (pidx // fw) % fh
    d_ = (pidx // (fw * fh)) % D
    n_ = pidx // (fw * fh * D)
    depth_flat = depth.reshape(-1)  # (N, D, H, W)
    feats_nhwc = feats.permute(0, 2, 3, 1).reshape(-1, C)
    didx = ((n_ * D + d_) * fh + h_) * fw + w_
    fidx = (n_ * fh + h_) * fw + w_

    def scatter(dt):
        dflat, fn = depth_flat.to(dt), feats_nhwc.to(dt)

        def f():
            out = torch.zeros((cells_n, C), dtype=dt, device=dev)
            return out.index_add_(0, ranks, dflat[didx, None] * fn[fidx])

        return f

    t_sc32 = event_times_ms(scatter(torch.float32), 3, iters)
    t_sc16 = event_times_ms(scatter(torch.float16), 3, iters)

    def write(fname, t, dtype):
        t.detach().cpu().numpy().astype(dtype).tofile(os.path.join(d_out, fname))

    write("frustum.f32", frustum, np.float32)
    write("depth.f32", depth, np.float32)
    write("feats.f32", feats, np.float32)
    write("cells.i32", cells64, np.int32)
    write("intervals.i32", torch.stack((uniq, counts), 1), np.int32)
    write("pooled.f32", ref_map, np.float32)
    med = lambda ts: float(np.median(ts))  # noqa: E731
    info = {
        "case": name,
        "cameras": N,
        "depth_bins": int(D),
        "feature": [int(fh), int(fw)],
        "channels": C,
        "dx": dx.tolist(),
        "bx": bx.tolist(),
        "nx": nx.tolist(),
        "points": int(cells64.numel()),
        "kept": int(kept64.sum().item()),
        "intervals": int(uniq.numel()),
        "cells_f32_differ": int((cells32 != cells64).sum().item()),
        "quickcumsum_f32_rel_err_vs_f64": rel_up,
        "torch_quickcumsum_ms": med(t_cumsum),
        "torch_upstream_path_ms": med(t_path),
        "torch_upstream_path_peak_bytes": path_bytes,
        "torch_scatter_add_ms": med(t_sc32),
        "torch_scatter_add_fp16_ms": med(t_sc16),
    }
    print(json.dumps(info), flush=True)
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="config/models/bevfusion_seg_camera.yaml")
    ap.add_argument("--calib", default="tests/data/nuscenes/calib.json")
    ap.add_argument("--seed", type=int, default=20261124)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    seg = load_cfg(args.model)
    det = dict(seg, xbound=[-54.0, 54.0, 0.3], ybound=[-54.0, 54.0, 0.3])
    os.makedirs(args.out, exist_ok=True)
    cases = [run_case("seg", seg, args.calib, args.out, args.seed, args.iters, dev), run_case("det", det, args.calib, args.out, args.seed + 1, args.iters, dev)]
    meta = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
        "calib": args.calib,
        "model": args.model,
        "seed": args.seed,
        "cases": cases,
    }
    with open(os.path.join(args.out, "ref.json"), "w") as f:
        json.dump(meta, f, indent=1)


if __name__ == "__main__":
    main()
