#!/usr/bin/env python3
"""PyTorch reference of BEVFusion's camera encoder: mmdet 2.20's SwinTransformer + GeneralizedLSSFPN.

Written for this project from a reading of mmdet v2.20 (mmdet/models/backbones/swin.py and the
PatchEmbed / PatchMerging / AdaptivePadding / FFN of mmdet's utils.transformer and mmcv 1.4's
cnn/bricks/transformer.py) and of mit-han-lab/bevfusion at db75150
(mmdet3d/models/necks/generalized_lss.py): same module tree, state_dict names and shapes, same
arithmetic (window padding after norm1, roll by -shift, the -100 region mask built on the padded
size, relative position bias, nn.Unfold patch merging, ConvModule = conv (no bias) + BN + ReLU,
bilinear upsampling with the config's align_corners). Only torch and numpy are needed; timm is
used for the side-by-side timing when installed.

    python3 tests/parity/bevfusion_camera_ref.py --model config/models/bevfusion_seg_camera.yaml \
        --weights W.safetensors --input INPUT.npy --out DIR [--bench] [--timm]
    python3 tests/parity/bevfusion_camera_ref.py --model M.yaml --print-names

Input: INPUT.npy, float32 NCHW [n, 3, h, w], the normalized images (`sptr camera-features
--save-input` writes it from our preprocessing, so both sides see the same tensor).

Outputs (--out DIR), NCHW float32 .npy:
    stage{i}.npy     backbone output i (after norm{i}) for i in out_indices, FP32 run
    neck{k}.npy      neck output k (k = 0 is the stride-8 map the view transform reads), FP32 run
    *_fp16.npy       the same from an FP16 run as BEVFusion evaluates: mmcv 1.4's wrap_fp16_model
                     on PyTorch >= 1.6 only sets fp16_enabled, and BEVFusion.forward's @auto_fp16
                     casts the images to FP16 and runs under torch autocast (FP16 matmuls and convs;
                     softmax, LayerNorm, BatchNorm in FP32)
    ref.json         shapes, FP16-vs-FP32 errors, timings, versions

Timing (--bench): CUDA events around one call, 10 warm-up, median of 50 (--warmup / --iters):
this reference in FP16 autocast (backbone alone, backbone + neck), and with --timm, timm's Swin-T
(swin_tiny_patch4_window7_224, random init, img_size = the input's) in FP16 eager and replayed
as a CUDA graph, on the same [n, 3, h, w] batch.
"""
import argparse
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sphereformer_ref import read_safetensors  # noqa: E402  (numpy-only safetensors reader)

BACKBONE = "encoders.camera.backbone."
NECK = "encoders.camera.neck."


def load_cfg(path):
    import yaml
    with open(path) as f:
        root = yaml.safe_load(f)
    cam = root["model"]["encoders"]["camera"]
    b, n = dict(cam["backbone"]), dict(cam["neck"])
    if b.get("type") != "SwinTransformer" or n.get("type") != "GeneralizedLSSFPN":
        sys.exit(f"{path}: backbone/neck types {b.get('type')}/{n.get('type')} are not SwinTransformer/GeneralizedLSSFPN")
    bb = dict(embed_dims=b.get("embed_dims", 96), depths=b.get("depths", [2, 2, 6, 2]),
              num_heads=b.get("num_heads", [3, 6, 12, 24]), window_size=b.get("window_size", 7),
              mlp_ratio=b.get("mlp_ratio", 4), qkv_bias=b.get("qkv_bias", True), qk_scale=b.get("qk_scale"),
              patch_norm=b.get("patch_norm", True), out_indices=b.get("out_indices", [0, 1, 2, 3]),
              patch_size=b.get("patch_size", 4), in_channels=b.get("in_channels", 3))
    up = n.get("upsample_cfg", {"mode": "bilinear", "align_corners": True})
    nk = dict(in_channels=n["in_channels"], out_channels=n["out_channels"],
              align_corners=bool(up.get("align_corners", False)), mode=up.get("mode", "bilinear"))
    return bb, nk


def build(bb, nk):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class WindowMSA(nn.Module):
        def __init__(self, dims, heads, m, qkv_bias, qk_scale):
            super().__init__()
            self.m, self.heads = m, heads
            self.scale = qk_scale or (dims // heads) ** -0.5
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * m - 1) ** 2, heads))
            # index[a][b] = (r_a - r_b + m - 1) * (2m - 1) + (c_a - c_b + m - 1), tokens row-major
            r = torch.arange(m).repeat_interleave(m)
            c = torch.arange(m).repeat(m)
            idx = (r[:, None] - r[None, :] + m - 1) * (2 * m - 1) + (c[:, None] - c[None, :] + m - 1)
            self.register_buffer("relative_position_index", idx)
            self.qkv = nn.Linear(dims, 3 * dims, bias=qkv_bias)
            self.proj = nn.Linear(dims, dims)

        def forward(self, x, mask=None):
            B, N, C = x.shape
            qkv = self.qkv(x).reshape(B, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
            attn = q @ k.transpose(-2, -1)
            bias = self.relative_position_bias_table[self.relative_position_index.reshape(-1)]
            attn = attn + bias.reshape(N, N, -1).permute(2, 0, 1).unsqueeze(0)
            if mask is not None:
                nw = mask.shape[0]
                attn = attn.view(B // nw, nw, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
                attn = attn.view(-1, self.heads, N, N)
            attn = attn.softmax(dim=-1)
            return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))

    class ShiftWindowMSA(nn.Module):
        def __init__(self, dims, heads, m, shift, qkv_bias, qk_scale):
            super().__init__()
            self.m, self.shift = m, shift
            self.w_msa = WindowMSA(dims, heads, m, qkv_bias, qk_scale)

        def partition(self, x):  # (B, H, W, C) -> (B * nW, m * m, C)
            B, H, W, C = x.shape
            m = self.m
            return x.view(B, H // m, m, W // m, m, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, m * m, C)

        def merge(self, w, B, H, W):
            m = self.m
            return w.view(B, H // m, W // m, m, m, -1).permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, -1)

        def forward(self, x, hw):
            B, L, C = x.shape
            H, W = hw
            m, s = self.m, self.shift
            x = x.view(B, H, W, C)
            pad_r, pad_b = (m - W % m) % m, (m - H % m) % m
            x = F.pad(x, (0, 0, 0, pad_r, 0, pad_b))  # zeros right and bottom, after norm1
            Hp, Wp = x.shape[1], x.shape[2]
            mask = None
            if s > 0:
                x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
                region = torch.zeros((1, Hp, Wp, 1), device=x.device)
                cnt = 0
                for hs in (slice(0, -m), slice(-m, -s), slice(-s, None)):
                    for ws in (slice(0, -m), slice(-m, -s), slice(-s, None)):
                        region[:, hs, ws, :] = cnt
                        cnt += 1
                rw = self.partition(region).squeeze(-1)
                mask = rw.unsqueeze(1) - rw.unsqueeze(2)
                mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0).to(x.dtype)
            y = self.merge(self.w_msa(self.partition(x), mask), B, Hp, Wp)
            if s > 0:
                y = torch.roll(y, shifts=(s, s), dims=(1, 2))
            return y[:, :H, :W, :].reshape(B, H * W, C)

    class FFN(nn.Module):  # mmcv FFN(num_fcs=2): layers = [Seq(Linear, GELU, Dropout), Linear, Dropout]
        def __init__(self, dims, hidden):
            super().__init__()
            self.layers = nn.Sequential(nn.Sequential(nn.Linear(dims, hidden), nn.GELU(), nn.Dropout(0.0)),
                                        nn.Linear(hidden, dims), nn.Dropout(0.0))

        def forward(self, x, identity):
            return identity + self.layers(x)

    class SwinBlock(nn.Module):
        def __init__(self, dims, heads, hidden, m, shift, qkv_bias, qk_scale):
            super().__init__()
            self.norm1 = nn.LayerNorm(dims)
            self.attn = ShiftWindowMSA(dims, heads, m, m // 2 if shift else 0, qkv_bias, qk_scale)
            self.norm2 = nn.LayerNorm(dims)
            self.ffn = FFN(dims, hidden)

        def forward(self, x, hw):
            x = x + self.attn(self.norm1(x), hw)
            return self.ffn(self.norm2(x), x)

    def corner_pad(x, stride):  # AdaptivePadding('corner') with kernel == stride
        H, W = x.shape[-2:]
        ph, pw = (math.ceil(H / stride) * stride - H), (math.ceil(W / stride) * stride - W)
        return F.pad(x, [0, pw, 0, ph]) if ph > 0 or pw > 0 else x

    class PatchEmbed(nn.Module):
        def __init__(self, cin, dims, p, norm):
            super().__init__()
            self.p = p
            self.projection = nn.Conv2d(cin, dims, p, stride=p)
            self.norm = nn.LayerNorm(dims) if norm else None

        def forward(self, x):
            x = self.projection(corner_pad(x, self.p))
            hw = (x.shape[2], x.shape[3])
            x = x.flatten(2).transpose(1, 2)
            return (self.norm(x) if self.norm is not None else x), hw

    class PatchMerging(nn.Module):
        def __init__(self, cin, cout, norm):
            super().__init__()
            self.sampler = nn.Unfold(kernel_size=2, stride=2)
            self.norm = nn.LayerNorm(4 * cin) if norm else None
            self.reduction = nn.Linear(4 * cin, cout, bias=False)

        def forward(self, x, hw):
            B, L, C = x.shape
            H, W = hw
            x = corner_pad(x.view(B, H, W, C).permute(0, 3, 1, 2), 2)
            H, W = x.shape[-2:]
            x = self.sampler(x).transpose(1, 2)  # features c * 4 + (dh * 2 + dw)
            x = self.norm(x) if self.norm is not None else x
            return self.reduction(x), (H // 2, W // 2)

    class Stage(nn.Module):
        def __init__(self, dims, heads, depth, cfg, down):
            super().__init__()
            self.blocks = nn.ModuleList(
                SwinBlock(dims, heads, cfg["mlp_ratio"] * dims, cfg["window_size"], j % 2 == 1, cfg["qkv_bias"],
                          cfg["qk_scale"]) for j in range(depth))
            self.downsample = PatchMerging(dims, 2 * dims, cfg["patch_norm"]) if down else None

    class SwinTransformer(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            e = cfg["embed_dims"]
            self.out_indices = cfg["out_indices"]
            self.patch_embed = PatchEmbed(cfg["in_channels"], e, cfg["patch_size"], cfg["patch_norm"])
            n = len(cfg["depths"])
            self.stages = nn.ModuleList(
                Stage(e << i, cfg["num_heads"][i], cfg["depths"][i], cfg, i + 1 < n) for i in range(n))
            for i in self.out_indices:
                self.add_module(f"norm{i}", nn.LayerNorm(e << i))

        def forward(self, x):
            x, hw = self.patch_embed(x)
            outs = []
            for i, st in enumerate(self.stages):
                for b in st.blocks:
                    x = b(x, hw)
                if i in self.out_indices:
                    y = getattr(self, f"norm{i}")(x)
                    outs.append(y.view(-1, hw[0], hw[1], y.shape[-1]).permute(0, 3, 1, 2).contiguous())
                if st.downsample is not None:
                    x, hw = st.downsample(x, hw)
            return outs

    class ConvModule(nn.Module):
        def __init__(self, cin, cout, k):
            super().__init__()
            self.conv = nn.Conv2d(cin, cout, k, padding=k // 2, bias=False)
            self.bn = nn.BatchNorm2d(cout)

        def forward(self, x):
            return F.relu(self.bn(self.conv(x)))

    class GeneralizedLSSFPN(nn.Module):
        def __init__(self, cfg):
            super().__init__()
            cin, out = cfg["in_channels"], cfg["out_channels"]
            last = len(cin) - 1
            self.align_corners, self.mode = cfg["align_corners"], cfg["mode"]
            self.lateral_convs = nn.ModuleList(
                ConvModule(cin[i] + (cin[i + 1] if i == last - 1 else out), out, 1) for i in range(last))
            self.fpn_convs = nn.ModuleList(ConvModule(out, out, 3) for _ in range(last))

        def forward(self, inputs):
            lat = list(inputs)
            for i in range(len(lat) - 2, -1, -1):
                up = F.interpolate(lat[i + 1], size=lat[i].shape[2:], mode=self.mode, align_corners=self.align_corners)
                lat[i] = self.fpn_convs[i](self.lateral_convs[i](torch.cat([lat[i], up], dim=1)))
            return lat[:-1]

    class Encoder(nn.Module):  # holds the two under BEVFusion's names
        def __init__(self):
            super().__init__()
            self.backbone = SwinTransformer(bb)
            self.neck = GeneralizedLSSFPN(nk)

    return Encoder()


def load_weights(enc, path):
    import torch
    st = read_safetensors(path)
    sd = enc.state_dict()
    params = {k for k in sd if not k.endswith("num_batches_tracked") and not k.endswith("relative_position_index")}
    got = {}
    for name, (dt, arr) in st.items():
        key = name[len("module."):] if name.startswith("module.") else name
        for pre, sub in ((BACKBONE, "backbone."), (NECK, "neck.")):
            if key.startswith(pre):
                key = sub + key[len(pre):]
        got[key] = arr
    missing = sorted(params - set(got))
    unexpected = sorted(k for k in got if k not in sd)
    bad = [k for k in params & set(got) if tuple(got[k].shape) != tuple(sd[k].shape)]
    if missing or unexpected or bad:
        sys.exit(f"{path}: missing {missing[:5]} ({len(missing)}), unexpected {unexpected[:5]} ({len(unexpected)}), "
                 f"mis-shaped {bad[:5]}")
    for k in got:
        if k.endswith("relative_position_index") and not np.array_equal(got[k], sd[k].numpy()):
            sys.exit(f"{path}: {k} differs from this window's index")
    with torch.no_grad():
        for k in params:
            sd[k].copy_(torch.from_numpy(np.ascontiguousarray(got[k], dtype=np.float32)))
    return sorted({dt for dt, _ in st.values()})


def rel(a, b):
    a, b = a.astype(np.float64), b.astype(np.float64)
    d = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / d) if d > 0 else float(np.linalg.norm(a - b))


def median(ts):
    return float(np.median(ts)) if ts else None


def timm_timings(x16, warmup, iters, out):
    """timm's Swin-T in FP16 on the same batch: eager and as a CUDA graph."""
    import torch
    from cuda_timing import event_times_ms
    try:
        import timm
    except ImportError as e:
        out["timm_error"] = f"timm not importable: {e}"
        return
    out["timm_version"] = timm.__version__
    h, w = x16.shape[2], x16.shape[3]
    model = None
    errors = []
    for kwargs in (dict(features_only=True, out_indices=(1, 2, 3)), dict(num_classes=0)):
        try:
            model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, img_size=(h, w), **kwargs)
            model = model.cuda().half().eval()
            with torch.no_grad():
                model(x16)
            out["timm_model"] = f"swin_tiny_patch4_window7_224 img_size=({h}, {w}) {kwargs}"
            break
        except Exception as e:  # noqa: BLE001 (report which construction the installed timm takes)
            errors.append(f"{kwargs}: {type(e).__name__}: {e}")
            model = None
    if model is None:
        out["timm_error"] = "; ".join(errors)
        return
    if kwargs.get("num_classes") == 0:
        fwd = model.forward_features
    else:
        fwd = model
    with torch.no_grad():
        out["timm_fp16_eager_ms"] = median(event_times_ms(lambda: fwd(x16), warmup, iters))
        static = x16.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                fwd(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fwd(static)
        out["timm_fp16_graph_ms"] = median(event_times_ms(g.replay, warmup, iters))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="config/models/bevfusion_seg_camera.yaml")
    ap.add_argument("--weights", help=".safetensors with BEVFusion's encoders.camera.* names")
    ap.add_argument("--input", help="normalized images, float32 NCHW .npy")
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--print-names", action="store_true", help="print every state_dict name and shape, exit")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--timm", action="store_true", help="time timm's Swin-T beside (with --bench)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()

    bb, nk = load_cfg(args.model)
    import torch
    enc = build(bb, nk)
    if args.print_names:
        for k, v in enc.state_dict().items():
            pre = BACKBONE if k.startswith("backbone.") else NECK
            print(f"{pre}{k.split('.', 1)[1]} {list(v.shape)}")
        return
    if not (args.weights and args.input and args.out):
        sys.exit("need --weights, --input and --out (or --print-names)")
    if not torch.cuda.is_available():
        sys.exit("bevfusion_camera_ref.py: no CUDA device")
    from cuda_timing import event_times_ms
    os.makedirs(args.out, exist_ok=True)
    dtypes = load_weights(enc, args.weights)
    enc = enc.cuda().eval()
    x = torch.from_numpy(np.load(args.input).astype(np.float32)).cuda()
    print(f"input {tuple(x.shape)}, weights {args.weights} ({dtypes})", flush=True)
    ref = {"input_shape": list(x.shape), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
           "weights_dtypes": dtypes, "outputs": {}}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    x16 = x.half()

    def run16(with_neck):
        with torch.autocast("cuda", dtype=torch.float16):
            s = enc.backbone(x16)
            return (s, enc.neck(s)) if with_neck else s

    with torch.no_grad():
        stages = enc.backbone(x)
        neck = enc.neck(stages)
        stages16, neck16 = run16(True)
    for name, a, b in [(f"stage{i}", s, s16) for i, s, s16 in zip(bb["out_indices"], stages, stages16)] + \
                      [(f"neck{k}", s, s16) for k, (s, s16) in enumerate(zip(neck, neck16))]:
        a32, b32 = a.float().cpu().numpy(), b.float().cpu().numpy()
        np.save(os.path.join(args.out, f"{name}.npy"), a32)
        np.save(os.path.join(args.out, f"{name}_fp16.npy"), b32)
        ref["outputs"][name] = {"shape": list(a32.shape), "fp16_vs_fp32_rel_err": rel(b32, a32),
                                "finite_fp16": bool(np.isfinite(b32).all())}
        print(f"{name} {list(a32.shape)}: FP16 (BEVFusion's evaluation) vs FP32 rel err {ref['outputs'][name]['fp16_vs_fp32_rel_err']:.2e}",
              flush=True)
    if args.bench:
        with torch.no_grad():
            ref["upstream_fp16_backbone_ms"] = median(event_times_ms(lambda: run16(False), args.warmup, args.iters))
            ref["upstream_fp16_encoder_ms"] = median(event_times_ms(lambda: run16(True), args.warmup, args.iters))
        if args.timm:
            timm_timings(x16, args.warmup, args.iters, ref)
        print(json.dumps({k: v for k, v in ref.items() if k.endswith("_ms") or k.startswith("timm")}), flush=True)
    with open(os.path.join(args.out, "ref.json"), "w") as f:
        json.dump(ref, f, indent=1)


if __name__ == "__main__":
    main()
