#!/usr/bin/env python3
"""The feature-level error our JPEG decoders cause: upstream decodes the camera JPEGs with Pillow
(libjpeg-turbo), sptr with zune-jpeg on the host or nvJPEG on the device. Everything after the
decode is the same on both sides (sptr's resize equals Pillow's bit for bit), so running the
PyTorch reference of the camera encoder (bevfusion_camera_ref.py, FP32, same random weights) on
Pillow-decoded input and on our decoded inputs isolates what the decoder changes at every stage.

    python3 tests/parity/camera_decode_ref.py --model config/models/bevfusion_seg_camera.yaml \
        --weights W.safetensors --images CAM_FRONT.jpg ... \
        --ours zune=INPUT_ZUNE.npy --ours nvjpeg=INPUT_NVJPEG.npy --out DIR

Pillow's input is made here as upstream's test-time pipeline does it (LoadMultiViewImageFromFiles:
Image.open; ImageAug3D with is_train false: resize = mean(resize_lim) with Pillow's default
filter, crop box from image_size and bot_pct_lim; ImageNormalize: ToTensor + Normalize). Our
inputs are `sptr camera-features --save-input` with `--jpeg-decoder cpu` (zune-jpeg) and
`--jpeg-decoder nvjpeg`. Every input is rounded to FP16 first (what our CUDA encoder consumes),
so the decoder is the only difference.

Prints one JSON line per decoder: {"case": "decode_feature_error", "decoder", "input_rel",
"input_max_abs", "input_max_levels", "stage1".., "neck0".. (relative L2 error of that output
against the Pillow-decoded run)}; writes DIR/decode.json.
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bevfusion_camera_ref import build, load_cfg, load_weights, rel  # noqa: E402


def load_preprocess(path):
    import yaml
    with open(path) as f:
        y = yaml.safe_load(f)
    h, w = y["image_size"]
    return dict(final_dim=(h, w), resize=float(np.mean(y["augment2d"]["resize"][1])),
                bot=float(np.mean(y["bot_pct_lim"])), mean=y["image_normalize"]["mean"], std=y["image_normalize"]["std"])


def pillow_input(paths, pp):
    """Upstream's test-time decode + resize + crop + normalize, NCHW float32."""
    from PIL import Image
    out = []
    for p in paths:
        img = Image.open(p).convert("RGB")
        W, H = img.size
        fH, fW = pp["final_dim"]
        newW, newH = int(W * pp["resize"]), int(H * pp["resize"])
        crop_h = int((1 - pp["bot"]) * newH) - fH
        crop_w = int(max(0, newW - fW) / 2)
        img = img.resize((newW, newH)).crop((crop_w, crop_h, crop_w + fW, crop_h + fH))
        a = np.asarray(img, dtype=np.float32) / np.float32(255)
        a = (a - np.asarray(pp["mean"], np.float32)) / np.asarray(pp["std"], np.float32)
        out.append(a.transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--images", nargs="+", required=True, help="the JPEGs, in the order our inputs hold them")
    ap.add_argument("--ours", action="append", default=[], help="NAME=INPUT.npy (NCHW float32), repeatable")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        sys.exit("camera_decode_ref.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    os.makedirs(args.out, exist_ok=True)
    bb, nk = load_cfg(args.model)
    enc = build(bb, nk)
    load_weights(enc, args.weights)
    enc = enc.cuda().eval()
    pp = load_preprocess(args.model)
    inputs = {"pillow": pillow_input(args.images, pp)}
    for o in args.ours:
        name, _, path = o.partition("=")
        if not path:
            sys.exit(f"--ours {o}: expected NAME=INPUT.npy")
        inputs[name] = np.load(path).astype(np.float32)
        if inputs[name].shape != inputs["pillow"].shape:
            sys.exit(f"{path}: shape {inputs[name].shape}, Pillow's input is {inputs['pillow'].shape}")

    def run(x):
        # FP16-rounded input, FP32 network (the decoder is the only difference).
        t = torch.from_numpy(x).cuda().half().float()
        with torch.no_grad():
            stages = enc.backbone(t)
            neck = enc.neck(stages)
        outs = {f"stage{i}": s.float().cpu().numpy() for i, s in zip(bb["out_indices"], stages)}
        outs.update({f"neck{k}": s.float().cpu().numpy() for k, s in enumerate(neck)})
        return outs

    ref = run(inputs["pillow"])
    report = {"images": args.images, "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "decoders": {}}
    x16 = {k: v.astype(np.float16).astype(np.float32) for k, v in inputs.items()}
    for name in inputs:
        if name == "pillow":
            continue
        got = run(inputs[name])
        d = np.abs(x16[name] - x16["pillow"])
        row = {"case": "decode_feature_error", "decoder": name, "input_rel": rel(x16[name], x16["pillow"]),
               "input_max_abs": float(d.max()), "input_mean_abs": float(d.mean()),
               "input_max_levels": float((d * (np.asarray(pp["std"], np.float32) * 255)[None, :, None, None]).max())}
        row.update({k: rel(got[k], ref[k]) for k in ref})
        report["decoders"][name] = row
        print(json.dumps(row), flush=True)
    with open(os.path.join(args.out, "decode.json"), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
