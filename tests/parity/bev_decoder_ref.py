#!/usr/bin/env python3
"""PyTorch reference of BEVFusion's fuser, BEV decoders and map head, for
tests/bevfusion_decoder/parity.rs.

Written for this project from a reading of mit-han-lab/bevfusion at db75150
(mmdet3d/models/fusers/conv.py ConvFuser; backbones/second.py SECOND; necks/second.py SECONDFPN;
backbones/resnet.py GeneralizedResNet over mmcv.cnn.resnet's BasicBlock / make_res_layer;
necks/lss.py LSSFPN; heads/segm/vanilla.py BEVGridTransform + BEVSegmentationHead;
fusion_models/bevfusion.py for the module names `fuser`, `decoder.{backbone, neck}`,
`heads.map`) and of mmcv's build_conv_layer / build_norm_layer / build_upsample_layer
(Conv2d, BatchNorm2d with the config's eps, ConvTranspose2d). Runs on the GPU host (torch,
numpy, PyYAML; CPU if there is no GPU):

    python3 tests/parity/bev_decoder_ref.py --out DIR [--seed 20261124] [--bench --iters 50]

Cases: `fusion` (config/models/bevfusion_seg_fusion.yaml: ConvFuser [80, 256] -> 256, SECOND +
SECONDFPN -> 512, head) and `camera` (bevfusion_seg_camera.yaml: GeneralizedResNet + LSSFPN ->
256, head), each on random BEV maps of 128 x 128 (camera 80 channels, LiDAR 256), rounded to
float16 (what sptr uploads), with random weights (seeded; conv weights uniform +-sqrt(3 / fan_in),
BatchNorm statistics and affine parameters away from the identity so that a wrong eps or fold
shows).

Per case, DIR/<case>/: model.txt (the YAML), weights.safetensors (F32, upstream state_dict names,
num_batches_tracked included as upstream saves it), inputs camera.npy / lidar.npy (NCHW
float32), and the float32 reference of each stage: fused.npy (fusion only), decoded.npy, maps.npy
(sigmoid probabilities, [1, 6, 200, 200]). TF32 is off, so the reference is true float32.
With --bench, DIR/<case>/bench.json holds PyTorch eager timings (CUDA events, median ms) of each
part in float32 and in float16 autocast (upstream's fp16 evaluation), and the autocast run's
maps error against the float32 ones, end to end (`torch_fp16_maps_rel_err`), for scale.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_timing import event_times_ms  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = {"fusion": "config/models/bevfusion_seg_fusion.yaml", "camera": "config/models/bevfusion_seg_camera.yaml"}


def build(model_cfg):
    import torch
    from torch import nn
    from torch.nn import functional as F

    def bn_eps(norm_cfg, default):
        if norm_cfg is None:
            return default
        return float(norm_cfg.get("eps", default))

    class ConvFuser(nn.Sequential):
        def __init__(self, in_channels, out_channels):
            super().__init__(
                nn.Conv2d(sum(in_channels), out_channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(True),
            )

        def forward(self, inputs):
            return super().forward(torch.cat(inputs, dim=1))

    class SECOND(nn.Module):
        def __init__(self, in_channels, out_channels, layer_nums, layer_strides, norm_cfg=None, conv_cfg=None, **_):
            super().__init__()
            eps = bn_eps(norm_cfg, 1e-3)
            bias = bool((conv_cfg or {}).get("bias", False))
            in_filters = [in_channels, *out_channels[:-1]]
            blocks = []
            for i, n in enumerate(layer_nums):
                layers = [
                    nn.Conv2d(in_filters[i], out_channels[i], 3, stride=layer_strides[i], padding=1, bias=bias),
                    nn.BatchNorm2d(out_channels[i], eps=eps),
                    nn.ReLU(inplace=True),
                ]
                for _ in range(n):
                    layers += [
                        nn.Conv2d(out_channels[i], out_channels[i], 3, padding=1, bias=bias),
                        nn.BatchNorm2d(out_channels[i], eps=eps),
                        nn.ReLU(inplace=True),
                    ]
                blocks.append(nn.Sequential(*layers))
            self.blocks = nn.ModuleList(blocks)

        def forward(self, x):
            outs = []
            for b in self.blocks:
                x = b(x)
                outs.append(x)
            return tuple(outs)

    class SECONDFPN(nn.Module):
        def __init__(self, in_channels, out_channels, upsample_strides, norm_cfg=None, upsample_cfg=None,
                     conv_cfg=None, use_conv_for_no_stride=False, **_):
            super().__init__()
            eps = bn_eps(norm_cfg, 1e-3)
            up_bias = bool((upsample_cfg or {}).get("bias", False))
            conv_bias = bool((conv_cfg or {}).get("bias", False))
            deblocks = []
            for i, out in enumerate(out_channels):
                s = upsample_strides[i]
                if s > 1 or (s == 1 and not use_conv_for_no_stride):
                    up = nn.ConvTranspose2d(in_channels[i], out, kernel_size=int(s), stride=int(s), bias=up_bias)
                else:
                    k = int(np.round(1 / s))
                    up = nn.Conv2d(in_channels[i], out, kernel_size=k, stride=k, bias=conv_bias)
                deblocks.append(nn.Sequential(up, nn.BatchNorm2d(out, eps=eps), nn.ReLU(inplace=True)))
            self.deblocks = nn.ModuleList(deblocks)

        def forward(self, x):
            ups = [d(x[i]) for i, d in enumerate(self.deblocks)]
            return [torch.cat(ups, dim=1) if len(ups) > 1 else ups[0]]

    class BasicBlock(nn.Module):
        # torchvision-style (mmcv.cnn.resnet): conv1 carries the stride; BatchNorm2d eps 1e-5
        def __init__(self, inplanes, planes, stride=1, downsample=None):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.downsample = downsample

        def forward(self, x):
            residual = x
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            if self.downsample is not None:
                residual = self.downsample(x)
            return self.relu(out + residual)

    class GeneralizedResNet(nn.ModuleList):
        def __init__(self, in_channels, blocks):
            super().__init__()
            for num, out, stride in blocks:
                down = None
                if stride != 1 or in_channels != out:
                    down = nn.Sequential(nn.Conv2d(in_channels, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))
                layers = [BasicBlock(in_channels, out, stride, down)]
                layers += [BasicBlock(out, out, 1) for _ in range(1, num)]
                self.append(nn.Sequential(*layers))
                in_channels = out

        def forward(self, x):
            outs = []
            for m in self:
                x = m(x)
                outs.append(x)
            return outs

    class LSSFPN(nn.Module):
        def __init__(self, in_indices, in_channels, out_channels, scale_factor=1):
            super().__init__()
            self.in_indices, self.scale_factor = in_indices, scale_factor
            self.fuse = nn.Sequential(
                nn.Conv2d(in_channels[0] + in_channels[1], out_channels, 1, bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(True),
                nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(out_channels),
                nn.ReLU(True),
            )
            if scale_factor > 1:
                self.upsample = nn.Sequential(
                    nn.Upsample(scale_factor=scale_factor, mode="bilinear", align_corners=True),
                    nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
                    nn.BatchNorm2d(out_channels),
                    nn.ReLU(True),
                )

        def forward(self, x):
            x1, x2 = x[self.in_indices[0]], x[self.in_indices[1]]
            x1 = F.interpolate(x1, size=x2.shape[-2:], mode="bilinear", align_corners=True)
            x = self.fuse(torch.cat([x1, x2], dim=1))
            if self.scale_factor > 1:
                x = self.upsample(x)
            return x

    class BEVGridTransform(nn.Module):
        def __init__(self, input_scope, output_scope, prescale_factor=1):
            super().__init__()
            self.input_scope, self.output_scope = input_scope, output_scope
            assert prescale_factor == 1

        def forward(self, x):
            coords = []
            for (imin, imax, _), (omin, omax, ostep) in zip(self.input_scope, self.output_scope):
                v = torch.arange(omin + ostep / 2, omax, ostep)
                v = (v - imin) / (imax - imin) * 2 - 1
                coords.append(v.to(x.device))
            u, v = torch.meshgrid(coords, indexing="ij")
            grid = torch.stack([v, u], dim=-1)
            grid = torch.stack([grid] * x.shape[0], dim=0)
            return F.grid_sample(x, grid, mode="bilinear", align_corners=False)

    class BEVSegmentationHead(nn.Module):
        def __init__(self, in_channels, grid_transform, classes, **_):
            super().__init__()
            self.transform = BEVGridTransform(**grid_transform)
            self.classifier = nn.Sequential(
                nn.Conv2d(in_channels, in_channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(in_channels),
                nn.ReLU(True),
                nn.Conv2d(in_channels, in_channels, 3, padding=1, bias=False),
                nn.BatchNorm2d(in_channels),
                nn.ReLU(True),
                nn.Conv2d(in_channels, len(classes), 1),
            )

        def forward(self, x):
            if isinstance(x, (list, tuple)):
                x = x[0]
            return torch.sigmoid(self.classifier(self.transform(x)))

    def args_of(section):
        return {k: v for k, v in section.items() if k != "type"}

    class Model(nn.Module):
        def __init__(self, m):
            super().__init__()
            f = m.get("fuser")
            self.fuser = ConvFuser(**args_of(f)) if f else None
            b, n = m["decoder"]["backbone"], m["decoder"]["neck"]
            backbone = {"SECOND": SECOND, "GeneralizedResNet": GeneralizedResNet}[b["type"]](**args_of(b))
            neck = {"SECONDFPN": SECONDFPN, "LSSFPN": LSSFPN}[n["type"]](**args_of(n))
            self.decoder = nn.ModuleDict({"backbone": backbone, "neck": neck})
            self.heads = nn.ModuleDict({"map": BEVSegmentationHead(**args_of(m["heads"]["map"]))})

        def fuse(self, inputs):
            return self.fuser(inputs) if self.fuser is not None else inputs[0]

        def decode(self, x):
            y = self.decoder["neck"](self.decoder["backbone"](x))
            return y[0] if isinstance(y, (list, tuple)) else y

        def head(self, x):
            return self.heads["map"](x)

    return Model(model_cfg)


def randomize(model, seed):
    """Conv weights uniform +-sqrt(3 / fan_in) (a deconv's fan-in: its input channels), conv biases
    +-0.1, BatchNorm weight 1 +- 0.1, bias +-0.1, running_mean +-0.1, running_var [0.5, 1.5]."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def uni(t, lo, hi):
        t.copy_(torch.rand(t.shape, generator=g, dtype=torch.float64).mul(hi - lo).add(lo).to(t.dtype))

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.ConvTranspose2d):
                b = (3.0 / m.weight.shape[0]) ** 0.5
                uni(m.weight, -b, b)
            elif isinstance(m, torch.nn.Conv2d):
                b = (3.0 / (m.weight.shape[1] * m.weight.shape[2] * m.weight.shape[3])) ** 0.5
                uni(m.weight, -b, b)
                if m.bias is not None:
                    uni(m.bias, -0.1, 0.1)
            elif isinstance(m, torch.nn.BatchNorm2d):
                uni(m.weight, 0.9, 1.1)
                uni(m.bias, -0.1, 0.1)
                uni(m.running_mean, -0.1, 0.1)
                uni(m.running_var, 0.5, 1.5)


def save_safetensors(path, tensors):
    """A safetensors file of float32 tensors (and int64 counters), written by hand (no package)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        a = t.detach().cpu().numpy()
        dtype = {"float32": "F32", "int64": "I64"}[str(a.dtype)]
        b = np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=20261124)
    ap.add_argument("--bev", type=int, default=128)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()

    import torch
    import yaml

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for case, yml in CASES.items():
        d = os.path.join(a.out, case)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(ROOT, yml)) as f:
            cfg = yaml.safe_load(f)["model"]
        model = build(cfg).eval()
        randomize(model, a.seed)
        save_safetensors(os.path.join(d, "weights.safetensors"), model.state_dict())
        with open(os.path.join(d, "model.txt"), "w") as f:
            f.write(yml + "\n")
        g = torch.Generator().manual_seed(a.seed + 1)
        chans = cfg["fuser"]["in_channels"] if cfg.get("fuser") else [cfg["decoder"]["backbone"]["in_channels"]]
        names = ["camera", "lidar"][: len(chans)]
        inputs = []
        for name, c in zip(names, chans):
            x = (torch.rand((1, c, a.bev, a.bev), generator=g) * 2 - 1).half().float()
            np.save(os.path.join(d, f"{name}.npy"), x.numpy())
            inputs.append(x.to(dev))
        model = model.to(dev)
        with torch.no_grad():
            fused = model.fuse(inputs)
            decoded = model.decode(fused)
            maps = model.head(decoded)
        if model.fuser is not None:
            np.save(os.path.join(d, "fused.npy"), fused.float().cpu().numpy())
        np.save(os.path.join(d, "decoded.npy"), decoded.float().cpu().numpy())
        np.save(os.path.join(d, "maps.npy"), maps.float().cpu().numpy())
        print(f"{case}: decoded {tuple(decoded.shape)}, maps {tuple(maps.shape)}, "
              f"{float((maps > 0.5).float().mean()) * 100:.1f} % positive", flush=True)
        if a.bench and dev.type == "cuda":
            res = {"case": case, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
            m, xs = model, inputs
            for prec in ["fp32", "fp16"]:
                # fp16: CUDA autocast, as upstream's evaluation (mmcv's auto_fp16 on torch >= 1.6;
                # grid_sample then promotes to float32, the convs run in float16)
                with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=prec == "fp16"):
                    f_ = m.fuse(xs)
                    d_ = m.decode(f_)
                    parts = {"decoder": lambda: m.decode(f_), "head": lambda: m.head(d_),
                             "all": lambda: m.head(m.decode(m.fuse(xs)))}
                    if m.fuser is not None:
                        parts["fuser"] = lambda: m.fuse(xs)
                    for part, fn in parts.items():
                        ts = sorted(event_times_ms(fn, 5, a.iters))
                        res[f"torch_{prec}_{part}_ms"] = ts[len(ts) // 2]
                    if prec == "fp16":
                        mp = m.head(d_).float()
                        res["torch_fp16_maps_rel_err"] = float((mp - maps).norm() / maps.norm())
            with open(os.path.join(d, "bench.json"), "w") as f:
                json.dump(res, f, indent=1)
            print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
