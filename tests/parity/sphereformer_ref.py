#!/usr/bin/env python3
"""PyTorch + spconv reference of SphereFormer's `Semantic` network (arch unet_spherical_transformer).

Written for this project from a reading of dvlab-research/SphereFormer (model/unet_spherical_transformer.py,
model/spherical_transformer.py, train.py at 0ff1e0a): same module tree, state_dict names and shapes,
spconv modules with the same indice keys and algorithms; the windowed attention core is
`sptr_ops.sphere_attention` (tests/parity/sptr_ops.py). Runs on the GPU host (spconv 2.3.8 carried as
in README.md); `--print-names --names-only` and `--random-weights ... --names-only` need only torch.

    python3 tests/parity/sphereformer_ref.py --model config/models/sphereformer_semantickitti.yaml \
        --weights W.safetensors --inputs DIR --out DIR [--bench] [--dump-stages]
    python3 tests/parity/sphereformer_ref.py --model M.yaml --print-names [--names-only]
    python3 tests/parity/sphereformer_ref.py --model M.yaml --random-weights OUT.safetensors --seed S [--names-only]
    ... --make-inputs CLOUD.bin --cols 4 --inputs DIR [...]   (upstream val-mode voxelization of one scan first)

Network (per level k = 1..len(layers), channels C = layers[k-1], heads C // 16, half cubic, half spherical):
    input_conv   SubMConv3d(input_c, m, 3, key subm1)
    unet         level 1: blocks (block_reps ResidualBlocks, key subm<k>) -> transformer_block (if k in
                 sphere_layers) -> [conv: BN, ReLU, SparseConv3d k2 s2 (key spconv<k>, Native) -> next level
                 on (scatter-mean xyz, batch) -> deconv: BN, ReLU, SparseInverseConv3d k2 (key spconv<k>,
                 Native) -> concat(skip, up) -> blocks_tail (block0 2C->C with a 1x1x1 i_branch, block1 C->C)]
    output_layer BN(m), ReLU;  linear  Linear(m, classes)
BatchNorm1d eps 1e-4 (eval: running stats); LayerNorm eps 1e-5; GELU exact; drop_path/dropout identities.

Inputs (--inputs DIR; raw little-endian):
    coords.i32 [N,4] (b,x,y,z)   feats.f32 [N,input_c]   xyz.f32 [N,3] metres   batch.i32 [N]
    inputs.json (optional keys: n, input_c, batch_size, spatial_shape: checked against the files / rule)
    spatial_shape = per axis max(coord)+1, at least 128 (upstream's validate()).

Outputs (--out DIR):
    logits_fp32.f32, logits_fp16.f32   [N, classes] float32, in input row order
    ref.json                           sizes, level parameters, fp16-vs-fp32 errors, timings, memory, versions
    with --dump-stages: <stage>.f32 [n,C] + <stage>.coords.i32 [n,4] (FP32 run), <stage>.fp16.f32 +
    <stage>.fp16.coords.i32 (FP16 autocast run, features cast to f32), stages.json (name, level, shape,
    files, order). Level-1 rows are in input order; deeper levels are in spconv's strided-output order:
    match rows by coordinate. Stages: input_conv, l<k>.blocks, l<k>.transformer, l<k>.down, l<k>.deconv,
    l<k>.tail, output_layer, logits.

FP16: a copy of the model whose spconv weights are FP16 (module.half()); a forward pre-hook casts every
spconv conv's input features to FP16; the whole forward runs under torch.autocast("cuda", float16)
(spconv 2.3.8 in eval under autocast fails with "can't find suitable algorithm" otherwise). The attention
core runs in FP32 as upstream (.float() on q, k, v and the tables).

Timing (--bench): CUDA events around one forward call, 5 warm-up, median of 20 (--warmup/--iters), for
FP32 and for FP16 autocast; peak extra memory = max_memory_allocated() after reset_peak_memory_stats()
minus memory_allocated() before, over one forward; per-stage times from CUDA events recorded at each
stage boundary in a separate pass (segment = time since the previous boundary, median over iters).
"""
import argparse
import collections
import copy
import json
import os
import struct
import sys

import numpy as np

HEAD_DIM = 16
ATTN_BACKEND = None  # sptr_ops backend: None (sptr's CUDA ops when importable, else plain torch), "sptr", "torch"
BN_EPS = 1e-4
BN_MOMENTUM = 0.1

# ----------------------------------------------------------------------------------------------------
# Config and per-level window parameters


def load_cfg(path):
    import yaml
    with open(path) as f:
        cfg = yaml.safe_load(f)
    need = ["arch", "classes", "input_c", "m", "block_reps", "block_residual", "layers", "quant_size_scale",
            "patch_size", "window_size", "window_size_sphere", "window_size_scale", "sphere_layers", "a",
            "rel_query", "rel_key", "rel_value", "voxel_size"]
    missing = [k for k in need if k not in cfg]
    if missing:
        sys.exit(f"{path}: missing keys {missing}")
    if cfg["arch"] != "unet_spherical_transformer":
        sys.exit(f"{path}: arch {cfg['arch']!r} is not unet_spherical_transformer")
    if not (cfg["rel_query"] and cfg["rel_key"] and cfg["rel_value"]):
        sys.exit("upstream supports only rel_query = rel_key = rel_value = true")
    return cfg


def level_params(cfg):
    """Window / quantisation sizes per level, with the arithmetic (and numpy dtypes) of upstream's train.py
    and UBlock: level 1 cubic sizes are float32 arrays (patch = float32(voxel * patch_size)); the next
    level's values are products of numpy scalars and Python floats, which numpy 1.x (upstream's era)
    evaluated in float64, done here with Python floats; the spherical sizes start as an int64 array and
    its division by quant_size_scale is float64. The attention casts all of them to float32 when used."""
    vs = cfg["voxel_size"]
    patch = np.array([vs[i] * cfg["patch_size"] for i in range(3)]).astype(np.float32)
    window = patch * cfg["window_size"]
    window_sphere = np.array(cfg["window_size_sphere"])
    quant = window / cfg["quant_size_scale"]
    quant_sphere = window_sphere / cfg["quant_size_scale"]
    sc_cubic, sc_sphere = cfg["window_size_scale"]
    out = []
    for k in range(1, len(cfg["layers"]) + 1):
        w = [float(x) for x in window]
        q = [float(x) for x in quant]
        ws = [float(x) for x in window_sphere]
        qs = [float(x) for x in quant_sphere]
        L = int((w[0] + 1e-4) / q[0])
        if L != int((w[1] + 1e-4) / q[1]):
            sys.exit(f"level {k}: quant grid length differs between x and y")
        Ls = int((ws[0] + 1e-4) / qs[0])
        if Ls != int((ws[1] + 1e-4) / qs[1]):
            sys.exit(f"level {k}: spherical quant grid length differs between theta and beta")
        C = cfg["layers"][k - 1]
        H = C // HEAD_DIM
        out.append({
            "level": k, "channels": C, "heads": H, "heads_cubic": H // 2, "head_dim": C // H,
            "transformer": k in cfg["sphere_layers"],
            "window": w, "quant": q, "L": L,
            "window_sphere": ws, "quant_sphere": qs, "L_sphere": Ls,
            "a": float(cfg["a"]), "shift": False, "indice_key": f"sphereformer{k}",
        })
        window = np.array([window[0] * sc_cubic, window[1] * sc_cubic, window[2] * sc_cubic])
        quant = np.array([quant[0] * sc_cubic, quant[1] * sc_cubic, quant[2] * sc_cubic])
        window_sphere = np.array([window_sphere[0] * sc_sphere, window_sphere[1] * sc_sphere, window_sphere[2]])
        quant_sphere = np.array([quant_sphere[0] * sc_sphere, quant_sphere[1] * sc_sphere, quant_sphere[2]])
    return out


# ----------------------------------------------------------------------------------------------------
# safetensors (own reader/writer: numpy + json; the `safetensors` package is not needed)

_ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
              "U8": "u1", "BOOL": "?"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (hlen,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = collections.OrderedDict()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        s, e = info["data_offsets"]
        buf = raw[base + s:base + e]
        dt, shape = info["dtype"], info["shape"]
        if dt == "BF16":
            u = np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        elif dt in _ST_DTYPES:
            arr = np.frombuffer(buf, dtype=_ST_DTYPES[dt])
        else:
            raise ValueError(f"{path}: {name}: unsupported dtype {dt}")
        out[name] = (dt, arr.reshape(shape))
    return out


def write_safetensors(path, tensors, metadata=None):
    """tensors: ordered name -> numpy array (float32 or int64)."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, arr in tensors.items():
        if arr.dtype == np.float32:
            dt = "F32"
        elif arr.dtype == np.float16:
            dt = "F16"
        elif arr.dtype == np.int64:
            dt = "I64"
        else:
            raise ValueError(f"{name}: dtype {arr.dtype} not written")
        b = np.ascontiguousarray(arr, dtype=np.dtype(_ST_DTYPES[dt])).tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ----------------------------------------------------------------------------------------------------
# Module tree


def build_model(cfg, sp):
    """sp: a namespace with SubMConv3d, SparseConv3d, SparseInverseConv3d, SparseConvTensor, Native
    (spconv's, or the names-only stand-ins)."""
    import torch
    import torch.nn as nn

    def bn(c):
        return nn.BatchNorm1d(c, eps=BN_EPS, momentum=BN_MOMENTUM)

    feature_ops = (nn.BatchNorm1d, nn.ReLU, nn.Identity)

    class SpSeq(nn.Module):
        """Sequential over a sparse tensor: BN/ReLU/Identity act on its features, everything else on it."""

        def __init__(self, *mods):
            super().__init__()
            if len(mods) == 1 and isinstance(mods[0], collections.OrderedDict):
                for name, mod in mods[0].items():
                    self.add_module(name, mod)
            else:
                for i, mod in enumerate(mods):
                    self.add_module(str(i), mod)

        def forward(self, x):
            for mod in self._modules.values():
                if isinstance(mod, feature_ops):
                    if x.indices.shape[0] != 0:
                        x = x.replace_feature(mod(x.features))
                else:
                    x = mod(x)
            return x

    class ResidualBlock(nn.Module):
        def __init__(self, cin, cout, key):
            super().__init__()
            if cin == cout:
                self.i_branch = SpSeq(nn.Identity())
            else:
                self.i_branch = SpSeq(sp.SubMConv3d(cin, cout, kernel_size=1, bias=False))
            self.conv_branch = SpSeq(
                bn(cin), nn.ReLU(),
                sp.SubMConv3d(cin, cout, kernel_size=3, padding=1, bias=False, indice_key=key),
                bn(cout), nn.ReLU(),
                sp.SubMConv3d(cout, cout, kernel_size=3, padding=1, bias=False, indice_key=key))
            self.has_proj = cin != cout

        def forward(self, x):
            # The shortcut sees a fresh tensor (no cached maps), as upstream builds it.
            fresh = sp.SparseConvTensor(x.features, x.indices, x.spatial_shape, x.batch_size)
            y = self.conv_branch(x)
            if self.has_proj:
                short = self.i_branch(fresh).features
            else:
                short = fresh.features
            return y.replace_feature(y.features + short)

    class VGGBlock(nn.Module):
        def __init__(self, cin, cout, key):
            super().__init__()
            self.conv_layers = SpSeq(bn(cin), nn.ReLU(),
                                     sp.SubMConv3d(cin, cout, kernel_size=3, padding=1, bias=False, indice_key=key))

        def forward(self, x):
            return self.conv_layers(x)

    block_cls = ResidualBlock if cfg["block_residual"] else VGGBlock

    class Mlp(nn.Module):
        def __init__(self, dim, hidden):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(hidden, dim)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class SphereAttention(nn.Module):
        """SparseMultiheadSASphereConcat's parameters; core = sptr_ops.sphere_attention."""

        def __init__(self, dim, lp):
            super().__init__()
            H, D = lp["heads"], dim // lp["heads"]
            h1, h2 = H // 2, H - H // 2
            L, Ls = lp["L"], lp["L_sphere"]
            self.heads, self.head_dim, self.scale = H, D, D ** -0.5
            self.lp = lp
            # Registration order = upstream's state_dict order.
            self.relative_pos_query_table = nn.Parameter(torch.zeros(2 * L - 1, 3, h1, D))
            self.relative_pos_key_table = nn.Parameter(torch.zeros(2 * L - 1, 3, h1, D))
            self.relative_pos_value_table = nn.Parameter(torch.zeros(2 * L - 1, 3, h1, D))
            self.relative_pos_query_table_sphere = nn.Parameter(torch.zeros(2 * Ls, 3, h2, D))
            self.relative_pos_key_table_sphere = nn.Parameter(torch.zeros(2 * Ls, 3, h2, D))
            self.relative_pos_value_table_sphere = nn.Parameter(torch.zeros(2 * Ls, 3, h2, D))
            self.qkv = nn.Linear(dim, 3 * dim, bias=True)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x, xyz, batch):
            import sptr_ops
            N, C = x.shape
            qkv = self.qkv(x).reshape(N, 3, self.heads, self.head_dim)
            q = qkv[:, 0] * self.scale  # in the Linear's output dtype (FP16 under autocast), as upstream
            k, v = qkv[:, 1], qkv[:, 2]
            tc = (self.relative_pos_query_table.float(), self.relative_pos_key_table.float(),
                  self.relative_pos_value_table.float())
            ts = (self.relative_pos_query_table_sphere.float(), self.relative_pos_key_table_sphere.float(),
                  self.relative_pos_value_table_sphere.float())
            # A fresh cache per call: upstream makes a new SparseTrTensor (empty indice_dict) in every block.
            out = sptr_ops.sphere_attention(q.float().contiguous(), k.float().contiguous(), v.float().contiguous(),
                                            xyz.float(), batch, self.lp, tc, ts, cache={}, backend=ATTN_BACKEND)
            return self.proj(out.reshape(N, C))

    class SphereFormerBlock(nn.Module):
        def __init__(self, dim, lp):
            super().__init__()
            self.norm1 = nn.LayerNorm(dim)
            self.attn = SphereAttention(dim, lp)
            self.norm2 = nn.LayerNorm(dim)
            self.mlp = Mlp(dim, int(dim * 4.0))

        def forward(self, feats, xyz, batch):
            feats = feats + self.attn(self.norm1(feats), xyz, batch)
            return feats + self.mlp(self.norm2(feats))

    def downsample_info(xyz, batch, pairs, n_out):
        """Mean of the children's xyz and batch over the strided conv's (in, out) pairs (scatter_mean)."""
        pin, pout = pairs[0], pairs[1]
        ok = pin != -1
        pin, pout = pin[ok].long(), pout[ok].long()
        cnt = torch.zeros(n_out, dtype=xyz.dtype, device=xyz.device).index_add_(
            0, pout, torch.ones(pout.shape[0], dtype=xyz.dtype, device=xyz.device))
        cnt = cnt.clamp_min(1.0)
        xyz_n = torch.zeros(n_out, 3, dtype=xyz.dtype, device=xyz.device).index_add_(0, pout, xyz[pin])
        xyz_n = xyz_n / cnt[:, None]
        bf = batch.float()
        b_n = torch.zeros(n_out, dtype=bf.dtype, device=bf.device).index_add_(0, pout, bf[pin]) / cnt.to(bf.dtype)
        return xyz_n, b_n

    class Level(nn.Module):
        """UBlock: one U-Net level and, recursively, the ones below it."""

        def __init__(self, lps, block_reps):
            super().__init__()
            lp = lps[0]
            k, C = lp["level"], lp["channels"]
            self.k = k
            self.blocks = SpSeq(collections.OrderedDict(
                (f"block{i}", block_cls(C, C, f"subm{k}")) for i in range(block_reps)))
            self.has_transformer = lp["transformer"]
            if self.has_transformer:
                self.transformer_block = SphereFormerBlock(C, lp)
            self.has_child = len(lps) > 1
            if self.has_child:
                C2 = lps[1]["channels"]
                self.conv = SpSeq(bn(C), nn.ReLU(),
                                  sp.SparseConv3d(C, C2, kernel_size=2, stride=2, bias=False,
                                                  indice_key=f"spconv{k}", algo=sp.Native))
                self.u = Level(lps[1:], block_reps)
                self.deconv = SpSeq(bn(C2), nn.ReLU(),
                                    sp.SparseInverseConv3d(C2, C, kernel_size=2, bias=False,
                                                           indice_key=f"spconv{k}", algo=sp.Native))
                self.blocks_tail = SpSeq(collections.OrderedDict(
                    (f"block{i}", block_cls(C * (2 - i), C, f"subm{k}")) for i in range(block_reps)))

        def forward(self, x, xyz, batch, rec):
            k = self.k
            if not bool((x.indices[:, 0] == batch).all()):  # upstream asserts this (a host sync)
                raise AssertionError(f"level {k}: indices[:, 0] != batch")
            x = self.blocks(x)
            rec.tap(f"l{k}.blocks", x)
            if self.has_transformer:
                x = x.replace_feature(self.transformer_block(x.features, xyz, batch))
                rec.tap(f"l{k}.transformer", x)
            if not self.has_child:
                return x
            skip = x.features
            d = self.conv(x)
            rec.tap(f"l{k}.down", d)
            pairs = d.indice_dict[f"spconv{k}"].indice_pairs
            xyz_n, b_n = downsample_info(xyz, batch, pairs, d.indices.shape[0])
            rec.tap(f"l{k}.downsample_info")
            d = self.u(d, xyz_n, b_n.long(), rec)
            d = self.deconv(d)
            rec.tap(f"l{k}.deconv", d)
            x = x.replace_feature(torch.cat((skip, d.features), dim=1))
            x = self.blocks_tail(x)
            rec.tap(f"l{k}.tail", x)
            return x

    class Semantic(nn.Module):
        def __init__(self):
            super().__init__()
            lps = level_params(cfg)
            m = cfg["m"]
            if cfg["layers"][0] != m:
                raise ValueError("layers[0] must equal m")
            self.input_conv = SpSeq(sp.SubMConv3d(cfg["input_c"], m, kernel_size=3, padding=1, bias=False,
                                                  indice_key="subm1"))
            self.unet = Level(lps, cfg["block_reps"])
            self.output_layer = SpSeq(bn(m), nn.ReLU())
            self.linear = nn.Linear(m, cfg["classes"])
            self.level_params = lps

        def forward(self, x, xyz, batch, rec=None):
            rec = rec or _NoRecorder()
            rec.tap("start")
            x = self.input_conv(x)
            rec.tap("input_conv", x)
            x = self.unet(x, xyz, batch, rec)
            x = self.output_layer(x)
            rec.tap("output_layer", x)
            logits = self.linear(x.features)
            rec.tap("logits", (logits, x.indices, 1))
            return logits

    return Semantic()


class _NoRecorder:
    def tap(self, name, x=None):
        pass


def names_only_spconv():
    """Stand-ins holding spconv's parameter layout ([Cout, kx, ky, kz, Cin], no bias) for --names-only:
    enough for names, shapes and random weights; they cannot run."""
    import types
    import torch
    import torch.nn as nn

    class _Conv(nn.Module):
        def __init__(self, cin, cout, kernel_size, stride=1, padding=0, bias=False, indice_key=None, algo=None):
            super().__init__()
            k = kernel_size
            self.weight = nn.Parameter(torch.zeros(cout, k, k, k, cin))
            if bias:
                self.bias = nn.Parameter(torch.zeros(cout))

        def forward(self, x):
            raise RuntimeError("--names-only stand-in conv cannot run; use spconv")

    return types.SimpleNamespace(SubMConv3d=_Conv, SparseConv3d=_Conv, SparseInverseConv3d=_Conv,
                                 SparseConvTensor=None, Native="Native")


def real_spconv():
    import types
    import spconv.pytorch as spt
    from spconv.core import ConvAlgo
    return types.SimpleNamespace(SubMConv3d=spt.SubMConv3d, SparseConv3d=spt.SparseConv3d,
                                 SparseInverseConv3d=spt.SparseInverseConv3d,
                                 SparseConvTensor=spt.SparseConvTensor, Native=ConvAlgo.Native)


# ----------------------------------------------------------------------------------------------------
# Weights


def random_state(model, seed):
    """Random, non-trivial weights in the model's state_dict order (numpy generator, reproducible)."""
    import torch
    import torch.nn as nn
    rng = np.random.default_rng(seed)

    def u(shape, b):
        return rng.uniform(-b, b, size=shape).astype(np.float32)

    vals = {}
    for mname, mod in model.named_modules():
        pre = mname + "." if mname else ""
        if isinstance(mod, nn.BatchNorm1d):
            c = mod.num_features
            vals[pre + "weight"] = (1.0 + u((c,), 0.1)).astype(np.float32)
            vals[pre + "bias"] = u((c,), 0.1)
            vals[pre + "running_mean"] = u((c,), 0.1)
            vals[pre + "running_var"] = rng.uniform(0.5, 1.5, size=(c,)).astype(np.float32)
            vals[pre + "num_batches_tracked"] = np.array(int(rng.integers(1, 100000)), dtype=np.int64)
        elif isinstance(mod, nn.LayerNorm):
            c = mod.normalized_shape[0]
            vals[pre + "weight"] = (1.0 + u((c,), 0.1)).astype(np.float32)
            vals[pre + "bias"] = u((c,), 0.1)
        elif isinstance(mod, nn.Linear):
            b = 1.0 / np.sqrt(mod.in_features)
            vals[pre + "weight"] = u(tuple(mod.weight.shape), b)
            vals[pre + "bias"] = u(tuple(mod.bias.shape), b)
        else:
            for pname, p in mod.named_parameters(recurse=False):
                shp = tuple(p.shape)
                if pname.startswith("relative_pos_"):
                    vals[pre + pname] = (rng.standard_normal(shp) * 0.02).astype(np.float32)
                elif pname == "weight" and len(shp) == 5:
                    kv, cin = shp[1] * shp[2] * shp[3], shp[4]
                    vals[pre + pname] = u(shp, float(np.sqrt(3.0 / (kv * cin))))
                else:
                    raise ValueError(f"no random rule for {pre + pname} {shp}")
    sd = model.state_dict()
    out = collections.OrderedDict()
    for name, t in sd.items():
        if name not in vals:
            raise ValueError(f"no random value for {name}")
        a = vals[name]
        if tuple(a.shape) != tuple(t.shape):
            raise ValueError(f"{name}: random {a.shape} vs {tuple(t.shape)}")
        out[name] = a
    return out


def load_weights(model, path):
    """Strict load: every state_dict name present with its shape (num_batches_tracked may be absent: it
    does not enter the eval forward); no unexpected names. Exits non-zero otherwise."""
    import torch
    tensors = read_safetensors(path)
    names = list(tensors)
    if names and all(n.startswith("module.") for n in names):
        tensors = collections.OrderedDict((n[len("module."):], v) for n, v in tensors.items())
        print(f"note: stripped the 'module.' prefix from {len(names)} names", flush=True)
    sd = model.state_dict()
    missing, optional_missing, bad_shape = [], [], []
    for name, t in sd.items():
        if name not in tensors:
            (optional_missing if name.endswith("num_batches_tracked") else missing).append(name)
        elif tuple(tensors[name][1].shape) != tuple(t.shape):
            bad_shape.append(f"{name}: file {list(tensors[name][1].shape)} vs model {list(t.shape)}")
    unexpected = [n for n in tensors if n not in sd]
    for title, lst in (("missing", missing), ("unexpected", unexpected), ("mis-shaped", bad_shape)):
        for x in lst:
            print(f"weights: {title}: {x}", file=sys.stderr)
    if missing or unexpected or bad_shape:
        sys.exit(f"weights {path}: {len(missing)} missing, {len(unexpected)} unexpected, "
                 f"{len(bad_shape)} mis-shaped names")
    if optional_missing:
        print(f"note: {len(optional_missing)} num_batches_tracked buffers absent (unused in eval)", flush=True)
    new_sd = collections.OrderedDict()
    dtypes = collections.Counter()
    for name, t in sd.items():
        if name in tensors:
            dt, arr = tensors[name]
            dtypes[dt] += 1
            new_sd[name] = torch.from_numpy(np.array(arr)).to(t.dtype)
        else:
            new_sd[name] = t
    model.load_state_dict(new_sd, strict=True)
    return dict(dtypes)


# ----------------------------------------------------------------------------------------------------
# Inputs, recorder, runs


def read_inputs(d, cfg):
    meta = {}
    p = os.path.join(d, "inputs.json")
    if os.path.isfile(p):
        with open(p) as f:
            meta = json.load(f)
    coords = np.fromfile(os.path.join(d, "coords.i32"), dtype="<i4").reshape(-1, 4)
    n = coords.shape[0]
    feats = np.fromfile(os.path.join(d, "feats.f32"), dtype="<f4")
    cin = cfg["input_c"]
    if feats.size != n * cin:
        sys.exit(f"feats.f32 holds {feats.size} values, want {n}x{cin}")
    feats = feats.reshape(n, cin)
    xyz = np.fromfile(os.path.join(d, "xyz.f32"), dtype="<f4").reshape(-1, 3)
    batch = np.fromfile(os.path.join(d, "batch.i32"), dtype="<i4")
    if xyz.shape[0] != n or batch.shape[0] != n:
        sys.exit(f"row counts differ: coords {n}, xyz {xyz.shape[0]}, batch {batch.shape[0]}")
    if "n" in meta and int(meta["n"]) != n:
        sys.exit(f"inputs.json n={meta['n']} but coords.i32 has {n} rows")
    if "input_c" in meta and int(meta["input_c"]) != cin:
        sys.exit(f"inputs.json input_c={meta['input_c']} but the model wants {cin}")
    if not np.array_equal(coords[:, 0], batch):
        sys.exit("batch.i32 differs from coords[:, 0]")
    if coords[:, 1:].min() < 0:
        sys.exit("negative voxel coordinates")
    shape = [int(max(128, coords[:, a + 1].max() + 1)) for a in range(3)]
    if "spatial_shape" in meta and [int(v) for v in meta["spatial_shape"]] != shape:
        print(f"WARNING: inputs.json spatial_shape {meta['spatial_shape']} != upstream rule {shape}; using the rule",
              flush=True)
    bs = int(coords[:, 0].max()) + 1
    if "batch_size" in meta and int(meta["batch_size"]) != bs:
        print(f"WARNING: inputs.json batch_size {meta['batch_size']} != max(b)+1 = {bs}; using {max(bs, int(meta['batch_size']))}",
              flush=True)
        bs = max(bs, int(meta["batch_size"]))
    uniq = np.unique(coords, axis=0).shape[0]
    if uniq != n:
        print(f"WARNING: {n - uniq} duplicate voxel coordinates: spconv's result is then not deterministic",
              flush=True)
    return coords, feats, xyz, batch, shape, bs, meta


def make_inputs(cloud, cols, cfg, out_dir):
    """Upstream's val-mode preprocessing of one scan (util/semantic_kitti.py / nuscenes.py + data_prepare +
    voxelize(mode=1)) into the --inputs format: features = the first 4 columns (x, y, z, intensity; a zero
    intensity when the file has 3 columns), x, y, z clipped to pc_range when the model YAML has one (float64),
    minus the scan's minimum, FNV-1a hash of floor(c / voxel) sorted -> voxel ids, float32 means (sequential
    sums in point order, like torch_scatter on the CPU) of the coordinates, xyz and features, coords =
    floor(mean / voxel) in float32. Also writes inds_reconstruct.i32 (the voxel row of every point)."""
    pts = np.fromfile(cloud, dtype="<f4").reshape(-1, cols)
    cin = cfg["input_c"]
    feat = np.zeros((pts.shape[0], cin), np.float32)
    feat[:, :min(cin, cols)] = pts[:, :min(cin, cols)]
    xyz = pts[:, :3]
    if cfg.get("pc_range") is not None:
        xyz = np.clip(xyz, np.array(cfg["pc_range"])[0], np.array(cfg["pc_range"])[1])
    coord_norm = xyz - xyz.min(0)
    voxel = np.array(cfg["voxel_size"]).astype(np.float32)
    disc = np.floor(coord_norm / voxel)
    a = disc.astype(np.uint64)
    key = np.uint64(14695981039346656037) * np.ones(a.shape[0], dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(3):
            key = key * np.uint64(1099511628211)
            key = np.bitwise_xor(key, a[:, j])
    order = np.argsort(key)
    _, count = np.unique(key[order], return_counts=True)
    start = np.cumsum(np.insert(count, 0, 0)[:-1])
    mark = np.zeros(key.shape[0], np.int64)
    mark[start] = 1
    recon = np.zeros(key.shape[0], np.int64)
    recon[order] = np.cumsum(mark) - 1
    nv = count.size

    def mean(v):
        v = np.ascontiguousarray(v, dtype=np.float32)
        acc = np.zeros((nv, v.shape[1]), np.float32)
        np.add.at(acc, recon, v)
        cnt = np.zeros(nv, np.float32)
        np.add.at(cnt, recon, np.float32(1))
        return acc / np.maximum(cnt, np.float32(1))[:, None]

    cn = mean(coord_norm)
    coords_v = np.floor(cn / voxel).astype(np.int64)
    xyz_m, feat_m = mean(xyz), mean(feat)
    coords = np.concatenate([np.zeros((nv, 1), np.int64), coords_v], 1).astype(np.int32)
    os.makedirs(out_dir, exist_ok=True)
    for name, arr, dt in (("coords.i32", coords, "<i4"), ("feats.f32", feat_m, "<f4"), ("xyz.f32", xyz_m, "<f4"),
                          ("batch.i32", np.zeros(nv, np.int32), "<i4"), ("inds_reconstruct.i32", recon, "<i4")):
        np.ascontiguousarray(arr, dtype=dt).tofile(os.path.join(out_dir, name))
    shape = [int(max(128, coords[:, a_ + 1].max() + 1)) for a_ in range(3)]
    meta = {"n": int(nv), "input_c": cin, "batch_size": 1, "spatial_shape": shape, "points": int(pts.shape[0]),
            "source": os.path.abspath(cloud), "cols": cols,
            "made_by": "sphereformer_ref.py --make-inputs (upstream val-mode preprocessing)"}
    with open(os.path.join(out_dir, "inputs.json"), "w") as f:
        json.dump(meta, f, indent=1)
    dup = nv - np.unique(coords, axis=0).shape[0]
    print(f"make-inputs: {pts.shape[0]} points -> {nv} voxels, spatial shape {shape}, "
          f"{dup} duplicate coordinates -> {out_dir}", file=sys.stderr)


class Recorder:
    """Stage boundaries: CUDA events (timing) and/or host copies of the stage outputs (dumps)."""

    def __init__(self, events=False, dump=False):
        import torch
        self.torch = torch
        self.events, self.dump = events, dump
        self.marks, self.stages = [], collections.OrderedDict()

    def tap(self, name, x=None):
        if self.events:
            e = self.torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((name, e))
        if self.dump and x is not None:
            if isinstance(x, tuple):
                feats, idx, level = x
            else:
                feats, idx = x.features, x.indices
                level = int(name[1:name.index(".")]) if name.startswith("l") else 1
                if name.endswith(".down"):
                    level += 1  # the strided conv's output lives on the next level
            self.stages[name] = (level, feats.detach().float().cpu().numpy(), idx.detach().int().cpu().numpy())

    def segments(self):
        out = collections.OrderedDict()
        for (_, a), (nb, b) in zip(self.marks[:-1], self.marks[1:]):
            out[nb] = a.elapsed_time(b)
        return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="config/models/sphereformer_*.yaml")
    ap.add_argument("--weights", help=".safetensors with upstream state_dict names")
    ap.add_argument("--inputs", help="directory with coords.i32, feats.f32, xyz.f32, batch.i32, inputs.json")
    ap.add_argument("--out", help="output directory")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--dump-stages", action="store_true")
    ap.add_argument("--print-names", action="store_true", help="print every state_dict name and shape, exit")
    ap.add_argument("--names-only", action="store_true",
                    help="stand-in convs (no spconv) for --print-names / --random-weights")
    ap.add_argument("--random-weights", metavar="OUT.safetensors", help="write random weights, exit")
    ap.add_argument("--make-inputs", metavar="CLOUD.bin",
                    help="voxelize a float32 scan as upstream's val mode into --inputs DIR, then go on")
    ap.add_argument("--cols", type=int, default=4, help="float32 columns per point of --make-inputs (3, 4, 5)")
    ap.add_argument("--seed", type=int, default=20261121)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-fp16", action="store_true", help="skip the FP16 autocast run")
    ap.add_argument("--attn-backend", choices=["auto", "sptr", "torch"], default="auto",
                    help="sptr_ops.sphere_attention backend (auto: sptr's CUDA ops when importable, else torch)")
    args = ap.parse_args()

    cfg = load_cfg(args.model)
    import torch

    if args.print_names or args.random_weights:
        sp = names_only_spconv() if args.names_only else real_spconv()
        model = build_model(cfg, sp)
        if args.print_names:
            for name, t in model.state_dict().items():
                print(f"{name} {list(t.shape)}")
        if args.random_weights:
            st = random_state(model, args.seed)
            write_safetensors(args.random_weights, st,
                              {"source": "tests/parity/sphereformer_ref.py --random-weights",
                               "seed": args.seed, "model": os.path.basename(args.model)})
            print(f"wrote {len(st)} tensors to {args.random_weights}", file=sys.stderr)
        return
    if args.names_only:
        sys.exit("--names-only goes with --print-names or --random-weights")
    if args.make_inputs:
        if not args.inputs:
            sys.exit("--make-inputs needs --inputs DIR (where to write)")
        make_inputs(args.make_inputs, args.cols, cfg, args.inputs)
        if not (args.weights and args.out):
            return
    if not (args.weights and args.inputs and args.out):
        sys.exit("need --weights, --inputs and --out (or --print-names / --random-weights)")
    if not torch.cuda.is_available():
        sys.exit("sphereformer_ref.py: no CUDA device")

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import sptr_ops
    from cuda_timing import event_times_ms, peak_extra_bytes
    global ATTN_BACKEND
    ATTN_BACKEND = None if args.attn_backend == "auto" else args.attn_backend
    if args.attn_backend == "sptr":
        sptr_ops.load_sptr()
    sptr_ok = sptr_ops.sptr_available() if hasattr(sptr_ops, "sptr_available") else None
    attn_backend_used = args.attn_backend if args.attn_backend != "auto" else ("sptr" if sptr_ok else "torch")
    print(f"attention backend: {attn_backend_used}"
          + ("" if sptr_ok or sptr_ok is None else f" (sptr: {getattr(sptr_ops, '_SPTR_ERR', '?')})"), flush=True)
    import spconv
    sp = real_spconv()
    dev = torch.device("cuda")
    os.makedirs(args.out, exist_ok=True)

    model = build_model(cfg, sp)
    wdt = load_weights(model, args.weights)
    model = model.to(dev).eval()

    coords, feats, xyz, batch, shape, bs, meta = read_inputs(args.inputs, cfg)
    n = coords.shape[0]
    idx_t = torch.from_numpy(coords).to(dev)
    feat_t = torch.from_numpy(feats).to(dev)
    xyz_t = torch.from_numpy(xyz).to(dev)
    batch_t = torch.from_numpy(batch.astype(np.int64)).to(dev)
    print(f"{n} voxels, batch {bs}, spatial shape {shape}, weights {args.weights} ({wdt})", flush=True)

    def fwd(mdl, rec=None):
        x = sp.SparseConvTensor(feat_t, idx_t, shape, bs)
        return mdl(x, xyz_t, batch_t, rec)

    # FP16 copy: spconv weights in FP16, features cast to FP16 in front of every spconv conv.
    model16 = None
    if not args.no_fp16:
        model16 = copy.deepcopy(model)
        conv_types = (sp.SubMConv3d, sp.SparseConv3d, sp.SparseInverseConv3d)

        def to_half(mod, inputs):
            x = inputs[0]
            return (x.replace_feature(x.features.half()),) + tuple(inputs[1:])

        for mod in model16.modules():
            if isinstance(mod, conv_types):
                mod.half()
                mod.register_forward_pre_hook(to_half)

    def run16(rec=None):
        with torch.autocast("cuda", dtype=torch.float16):
            return fwd(model16, rec)

    def run32(rec=None):
        return fwd(model, rec)

    runs = [("fp32", run32)] + ([("fp16", run16)] if model16 is not None else [])
    report = {
        "model": os.path.basename(args.model), "weights": os.path.basename(args.weights), "weights_dtypes": wdt,
        "inputs": os.path.abspath(args.inputs), "inputs_json": meta,
        "n": n, "batch_size": bs, "spatial_shape": shape, "classes": cfg["classes"], "input_c": cfg["input_c"],
        "levels": model.level_params,
        "torch_version": torch.__version__, "spconv_version": getattr(spconv, "__version__", "unknown"),
        "cuda_version": torch.version.cuda, "device": torch.cuda.get_device_name(0),
        "attention_backend": attn_backend_used,
        "tf32": {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)},
        "fp16_mode": "autocast float16; spconv weights .half(); features cast to half before each spconv conv; "
                     "attention core in float32",
    }

    def save(name, arr, dtype):
        np.ascontiguousarray(arr, dtype=np.dtype(dtype).newbyteorder("<")).tofile(os.path.join(args.out, name))
        return name

    logits = {}
    stage_index = collections.OrderedDict()
    with torch.no_grad():
        for mode, fn in runs:
            rec = Recorder(dump=args.dump_stages)
            y = fn(rec)
            torch.cuda.synchronize()
            logits[mode] = y.float().cpu().numpy()
            if logits[mode].shape != (n, cfg["classes"]):
                sys.exit(f"{mode}: logits shape {logits[mode].shape}")
            save(f"logits_{mode}.f32", logits[mode], "f4")
            report[f"logits_{mode}"] = {"file": f"logits_{mode}.f32", "shape": [n, cfg["classes"]],
                                        "finite": bool(np.isfinite(logits[mode]).all())}
            sfx = "" if mode == "fp32" else ".fp16"
            for name, (level, f, c) in rec.stages.items():
                e = stage_index.setdefault(name, {"name": name, "level": level,
                                                  "order": "input" if level == 1 else "spconv strided output"})
                e[mode] = {"file": save(f"{name}{sfx}.f32", f, "f4"), "shape": list(f.shape),
                           "coords": save(f"{name}{sfx}.coords.i32", c, "i4"), "n": int(c.shape[0])}
            del rec

        if "fp16" in logits:
            a, b = logits["fp16"].astype(np.float64), logits["fp32"].astype(np.float64)
            report["fp16_vs_fp32"] = {
                "rel_l2": float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)),
                "max_abs": float(np.abs(a - b).max()),
                "argmax_agree": float((a.argmax(1) == b.argmax(1)).mean()),
            }
            print(f"fp16 vs fp32: {report['fp16_vs_fp32']}", flush=True)

        if args.dump_stages:
            with open(os.path.join(args.out, "stages.json"), "w") as f:
                json.dump({"stages": list(stage_index.values()),
                           "note": "features f32 [n, C] little-endian; coords i32 [n, 4] (b, x, y, z) at the "
                                   "stage's level (level-k voxel units); deeper levels: match rows by coordinate"},
                          f, indent=1)

        if args.bench:
            def med_ms(fn):
                ts = event_times_ms(fn, args.warmup, args.iters)
                return float(np.median(ts)), [float(t) for t in ts]

            def peak_extra(fn):
                return peak_extra_bytes(fn, empty_cache=True)

            def stage_ms(fn):
                for _ in range(args.warmup):
                    fn()
                torch.cuda.synchronize()
                per = collections.OrderedDict()
                for _ in range(args.iters):
                    rec = Recorder(events=True)
                    fn(rec)
                    torch.cuda.synchronize()
                    for k, v in rec.segments().items():
                        per.setdefault(k, []).append(v)
                return collections.OrderedDict((k, float(np.median(v))) for k, v in per.items())

            bench = {"warmup": args.warmup, "iters": args.iters,
                     "timing": "CUDA events around one forward call (input SparseConvTensor built inside), median"}
            for mode, fn in runs:
                ms, all_ms = med_ms(fn)
                mem = peak_extra(fn)
                st = stage_ms(fn)
                attn = sum(v for k, v in st.items() if k.endswith(".transformer"))
                bench[mode] = {"forward_ms": ms, "all_ms": all_ms, "peak_extra_bytes": mem,
                               "stage_ms": st, "transformer_ms_total": attn,
                               "stage_ms_note": "time from the previous stage boundary to this one"}
                print(f"[{mode}] forward {ms:.3f} ms (median of {args.iters}), peak extra {mem / 2**20:.1f} MiB, "
                      f"transformer blocks {attn:.3f} ms", flush=True)
                for k, v in st.items():
                    print(f"    {k:24s} {v:9.3f} ms", flush=True)
            report["bench"] = bench

    with open(os.path.join(args.out, "ref.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {args.out}/ref.json", flush=True)


if __name__ == "__main__":
    main()
