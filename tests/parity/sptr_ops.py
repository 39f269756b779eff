"""SphereFormer's window attention, upstream semantics, on the CUDA ops of PyPI `sptr` 1.1.1.

Used by sptr_parity.py (attention parity and speed) and importable by other reference scripts.
What is reproduced (see /work/shared/UPSTREAM_NOTES.md, "Deeper levels and windows"):

  * windows: per point, trunc((p - start) / w) per axis in float32 plus the batch index, linearised
    like torch_cluster's `grid` (start = minimum over all points, or the unshifted minimum when the
    window is shifted; end = maximum), then `torch.unique(sorted=True)` and a sort by window;
    all (query, key) pairs of a window come from sptr's `precompute_all_cuda` op;
  * RPE index per pair: floor(((p - min) % w) / quant) differences + L - 1, in float32; for the
    spherical branch the radial axis is replaced by the exponential split (+ 24) and all three
    axes are clamped to [0, 2L - 1] (SphereFormer's bundled sptr, which calls the split function
    with 4 arguments; PyPI sptr 1.1.1 passes a 5th and clamps an int8 tensor: not used here);
  * logit = q . (k + sum_axis tq[idx, axis]) + k . sum_axis tk[idx, axis], softmax per query over
    its window (torch_scatter's segment_csr / gather_csr replaced by torch.segment_reduce and
    repeat_interleave), out = sum p * (v + sum_axis tv[idx, axis]);
  * half the heads (H // 2) on cubic windows of xyz, the rest on spherical windows of
    cart2sphere(xyz) (theta deg, beta deg, r).

sptr 1.1.1 differs from SphereFormer's bundled copy in ways that do not change the function:
index_0 / index_1 stay int32, the RPE index is passed as int8 (its kernels read `char`), and it has
FP16 kernels (accumulating in FP16). torch_scatter / torch_cluster / torch_geometric are not needed:
the package's extension (`sptr_cuda*.so`) and its `functional.py` are loaded directly, without
running `sptr/__init__.py` (which imports torch_scatter and torch_geometric).

backend: "sptr" runs sptr's CUDA ops; "torch" is an independent plain-torch implementation of the
same math (gathers per pair, chunked), used as a cross-check and on machines without sptr or CUDA.
"""
import glob
import importlib.machinery
import importlib.util
import math
import os
import sys
import types

import numpy as np
import torch

__all__ = [
    "cart2sphere", "window_partition", "window_attention", "sphere_attention", "rpe_index",
    "radial_split_index", "scatter_softmax_csr", "partition_stats", "window_counts", "load_sptr",
    "sptr_available", "RPE_INDEX_DTYPE",
]

# sptr 1.1.1's RPE kernels read the index as `const char*` ([M, 3] / [3, M] int8).
RPE_INDEX_DTYPE = torch.int8
_PKG = "_sptr_pypi"  # private package name: the real `sptr` package is never imported
_SPTR = None
_SPTR_ERR = None


def load_sptr():
    """(functional module, extension module, package dir) of the installed sptr, loaded without
    sptr/__init__.py. Raises ImportError when sptr or its extension is absent."""
    global _SPTR, _SPTR_ERR
    if _SPTR is not None:
        return _SPTR
    spec = importlib.util.find_spec("sptr")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("sptr is not installed (no package `sptr` on sys.path)")
    pkg_dir = list(spec.submodule_search_locations)[0]
    sos = sorted(glob.glob(os.path.join(pkg_dir, "sptr_cuda*.so")))
    if not sos:
        raise ImportError(f"no sptr_cuda*.so in {pkg_dir}: the CUDA extension was not built")
    pkg = types.ModuleType(_PKG)
    pkg.__path__ = [pkg_dir]
    pkg.__file__ = os.path.join(pkg_dir, "__init__.py")
    sys.modules[_PKG] = pkg
    name = f"{_PKG}.sptr_cuda"
    loader = importlib.machinery.ExtensionFileLoader(name, sos[0])
    espec = importlib.util.spec_from_file_location(name, sos[0], loader=loader)
    ext = importlib.util.module_from_spec(espec)
    espec.loader.exec_module(ext)
    sys.modules[name] = ext
    pkg.sptr_cuda = ext
    fname = f"{_PKG}.functional"
    fspec = importlib.util.spec_from_file_location(fname, os.path.join(pkg_dir, "functional.py"))
    fmod = importlib.util.module_from_spec(fspec)
    sys.modules[fname] = fmod
    fspec.loader.exec_module(fmod)
    for op in ("attention_step1", "attention_step2", "dot_prod_with_idx_all", "attention_step2_with_rel_pos_value"):
        if not hasattr(fmod, op):
            raise ImportError(f"sptr at {pkg_dir} has no functional.{op}")
    if not hasattr(ext, "precompute_all_cuda"):
        raise ImportError(f"sptr extension {sos[0]} has no precompute_all_cuda")
    _SPTR = (fmod, ext, pkg_dir)
    return _SPTR


def sptr_available():
    global _SPTR_ERR
    try:
        load_sptr()
        return True
    except Exception as e:  # noqa: BLE001 (report why)
        _SPTR_ERR = f"{type(e).__name__}: {e}"
        return False


def sptr_error():
    return _SPTR_ERR


def _use_sptr(backend, device):
    if backend == "torch":
        return False
    if backend == "sptr":
        load_sptr()
        return True
    return device.type == "cuda" and sptr_available()


def _f32(vals):
    """A 3-vector as upstream turns it into a tensor: numpy array -> float32 (torch `.float()`)."""
    a = np.asarray(vals)
    if a.ndim == 0:
        a = np.array([a, a, a])
    return a.astype(np.float32)


# ------------------------------------------------------------------------------------------------
# positions


def cart2sphere(xyz):
    """[N, 3] float32 x, y, z -> (theta deg in [0, 360], beta deg from +z, r), float32 throughout,
    in SphereFormer's operation order: (atan2(y, x) + pi) * 180 / pi, atan2(hypot_xy, z) * 180 / pi."""
    x, y, z = xyz[:, 0], xyz[:, 1], xyz[:, 2]
    xx, yy, zz = x ** 2, y ** 2, z ** 2
    theta = (torch.atan2(y, x) + math.pi) * 180 / math.pi
    beta = torch.atan2(torch.sqrt(xx + yy), z) * 180 / math.pi
    r = torch.sqrt(xx + yy + zz)
    return torch.stack([theta, beta, r], -1)


# ------------------------------------------------------------------------------------------------
# windows


def _grid_ids(pos, batch, size, start=None):
    """torch_cluster grid over [pos, batch] (float32): sum_d trunc((p_d - start_d) / size_d) * k_d with
    k_d the running product of trunc((end_d - start_d) / size_d) + 1; batch is axis 3 with size 1."""
    p = torch.cat([pos, batch.view(-1, 1).to(pos.dtype)], dim=-1)
    size = torch.cat([size, size.new_ones(1)])
    if start is None:
        start = p.min(0)[0]
    else:
        start = torch.cat([start, start.new_zeros(1)])
    end = p.max(0)[0]
    ids = torch.zeros(p.shape[0], dtype=torch.long, device=p.device)
    k = torch.ones((), dtype=torch.long, device=p.device)
    for d in range(p.shape[1]):
        ids += ((p[:, d] - start[d]) / size[d]).to(torch.long) * k
        k = k * (((end[d] - start[d]) / size[d]).to(torch.long) + 1)
    return ids


def _precompute_torch(N, n, n_max, counts):
    """Plain-torch equivalent of sptr's precompute_all (same layout): window w of count c starting at s
    (in window order) owns pairs sq[w] + t*c + j for query s + t and key s + j."""
    dev = counts.device
    counts = counts.long()
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    sq = torch.cat([counts.new_zeros(1), (counts ** 2).cumsum(0)])
    per_q = counts.repeat_interleave(counts)  # window size of each (sorted) voxel
    t = torch.arange(N, device=dev) - offsets[:-1].repeat_interleave(counts)
    index_0_offsets = torch.cat([counts.new_zeros(1), per_q.cumsum(0)])
    index_1_offsets = sq[:-1].repeat_interleave(counts) + t
    M = int(sq[-1])
    index_0 = torch.arange(N, device=dev).repeat_interleave(per_q)
    win_start = offsets[:-1].repeat_interleave(counts).repeat_interleave(per_q)
    j = torch.arange(M, device=dev) - index_0_offsets[:-1].repeat_interleave(per_q)
    index_1 = win_start + j
    i32 = torch.int32
    return index_0_offsets.to(i32), index_1_offsets.to(i32), index_0.to(i32), index_1.to(i32)


def _precompute_sptr(N, n, n_max, counts):
    """sptr 1.1.1's PrecomputeAll.forward, with plain `torch.zeros` allocations."""
    _, ext, _ = load_sptr()
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(-1)], 0)
    sq_offsets = torch.cat([counts.new_zeros(1), (counts ** 2).cumsum(-1)], 0)
    M = sq_offsets[-1].item()
    dev = counts.device
    index_0_offsets = torch.zeros(N + 1, dtype=torch.int32, device=dev)
    index_0_offsets[-1] = M
    index_1_offsets = torch.zeros(N, dtype=torch.int32, device=dev)
    index_0 = torch.zeros(M, dtype=torch.int32, device=dev)
    index_1 = torch.zeros(M, dtype=torch.int32, device=dev)
    ext.precompute_all_cuda(N, n, n_max, counts.int(), offsets.int(), sq_offsets.int(),
                            index_0_offsets, index_1_offsets, index_0, index_1)
    return index_0_offsets, index_1_offsets, index_0, index_1


def window_partition(pos, batch, window, shift=False, backend=None):
    """sptr's get_indices_params: (index_0, index_0_offsets, n_max, index_1, index_1_offsets, sort_idx).

    pos [N, 3] float32, batch [N] (long or float), window: 3 values (used as float32).
    index_0 / index_1 (int32, [M]) are the query / key of each pair in window order (positions in
    the sorted order), index_0_offsets (int32, [N + 1]) the CSR offsets of each query's pairs,
    index_1_offsets (int32, [N]) sptr's key offsets, sort_idx (long, [N]) the sorting permutation."""
    size = torch.from_numpy(_f32(window)).to(pos.device)
    if shift:
        ids = _grid_ids(pos + 1 / 2 * size, batch, size, start=pos.min(0)[0])
    else:
        ids = _grid_ids(pos, batch, size, start=None)
    _, cluster, counts = torch.unique(ids, sorted=True, return_inverse=True, return_counts=True)
    n_max = counts.max().item()
    cluster, sort_idx = cluster.sort()
    n, N = counts.shape[0], cluster.shape[0]
    if _use_sptr(backend, pos.device):
        i0_off, i1_off, i0, i1 = _precompute_sptr(N, n, n_max, counts)
    else:
        i0_off, i1_off, i0, i1 = _precompute_torch(N, n, n_max, counts)
    return i0, i0_off, n_max, i1, i1_off, sort_idx


def window_counts(partition):
    """Per voxel (input order) the number of voxels in its window, int32 [N]."""
    i0, i0_off, _, _, _, sort_idx = partition
    n_sorted = (i0_off[1:] - i0_off[:-1]).to(torch.int32)
    out = torch.empty_like(n_sorted)
    out[sort_idx] = n_sorted
    return out


def partition_stats(partition):
    """{"windows", "n_max", "pairs" (= sum of n^2)} of a partition."""
    i0, i0_off, n_max, i1, _, _ = partition
    first_key = i1[i0_off[:-1].long()].long()  # = first voxel of each query's window
    q = torch.arange(first_key.shape[0], device=first_key.device)
    return {"windows": int((first_key == q).sum().item()), "n_max": int(n_max), "pairs": int(i0.shape[0])}


# ------------------------------------------------------------------------------------------------
# relative-position index


def radial_split_index(r, index_0, index_1, a):
    """Exponential split of the radial difference r[q] - r[k] (float32), + 24, as a long tensor:
    bins [0, a) -> 0, [a, 2a) -> 1, [2a, 4a) -> 2, [4a, 6a) -> 3, [6a, 10a) -> 4, ... and mirrored
    (-1 for [-a, 0), ...). Float32 arithmetic in SphereFormer's order (a a Python float)."""
    d = r[index_0.long()] - r[index_1.long()]
    mag = d.abs()
    nonneg = (d >= 0).float()
    b = 2 * torch.floor(torch.log((mag + 2 * a) / a) / np.log(2)) - 2
    b = b + ((3 * (2 ** (b // 2)) - 2) * a <= mag).float()
    b = b * (2 * nonneg - 1) + (nonneg - 1)
    return b.long() + 24


def rpe_index(pos_sorted, index_0, index_1, window, quant, L, shift=False, radial_split_a=None):
    """[M, 3] float32 table rows per pair (integers), SphereFormer's bundled sptr arithmetic.
    pos_sorted: positions in window order (pos[sort_idx])."""
    dev = pos_sorted.device
    w = torch.from_numpy(_f32(window)).to(dev)
    qz = torch.from_numpy(_f32(quant)).to(dev)
    shift_size = 1 / 2 * w if shift else 0.0
    cell = (pos_sorted - pos_sorted.min(0)[0] + shift_size) % w
    cell = torch.div(cell, qz, rounding_mode="floor")
    rel = cell[index_0.long()] - cell[index_1.long()] + L - 1
    if radial_split_a is not None:
        rel = rel.clone()
        rel[:, 2] = radial_split_index(pos_sorted[:, 2], index_0, index_1, radial_split_a).to(rel.dtype)
        rel = torch.clamp(rel, 0, 2 * L - 1)
    return rel


# ------------------------------------------------------------------------------------------------
# softmax (torch_scatter stand-ins)


def segment_csr(src, indptr, reduce):
    return torch.segment_reduce(src, reduce, offsets=indptr, axis=0, unsafe=True)


def gather_csr(src, indptr, total):
    return torch.repeat_interleave(src, indptr[1:] - indptr[:-1], dim=0, output_size=total)


def scatter_softmax_csr(src, indptr):
    """Softmax of src [M, H] over the CSR segments indptr [N + 1] (long), as sptr's scatter_softmax_csr."""
    M = src.shape[0]
    mx = gather_csr(segment_csr(src, indptr, "max"), indptr, M)
    e = (src - mx).exp_()
    s = gather_csr(segment_csr(e, indptr, "sum"), indptr, M)
    return e.div(s)


# ------------------------------------------------------------------------------------------------
# attention


def _table_sum(table, rel):
    """sum over the 3 axes of table[rel[:, a], a] -> [m, H, D]."""
    r = rel.long()
    return table[r[:, 0], 0] + table[r[:, 1], 1] + table[r[:, 2], 2]


def _attention_torch(qs, ks, vs, i0, i0_off, i1, rel, tables, chunk=1 << 22):
    """Plain-torch attention over the pairs (window order). float32 or float16 in, same out."""
    N, H, D = qs.shape
    M = i0.shape[0]
    logits = torch.empty((M, H), dtype=qs.dtype, device=qs.device)
    for s in range(0, M, chunk):
        e = min(M, s + chunk)
        a, b = i0[s:e].long(), i1[s:e].long()
        qa, kb = qs[a], ks[b]
        if tables is None:
            logits[s:e] = (qa * kb).sum(-1)
        else:
            tq, tk, _ = tables
            rr = rel[s:e]
            logits[s:e] = (qa * (kb + _table_sum(tq, rr))).sum(-1) + (kb * _table_sum(tk, rr)).sum(-1)
    p = scatter_softmax_csr(logits, i0_off.long())
    out = torch.zeros((N, H, D), dtype=torch.float32, device=qs.device)
    for s in range(0, M, chunk):
        e = min(M, s + chunk)
        a, b = i0[s:e].long(), i1[s:e].long()
        val = vs[b]
        if tables is not None:
            val = val + _table_sum(tables[2], rel[s:e])
        out.index_add_(0, a, (p[s:e, :, None] * val).float())
    return out.to(qs.dtype)


def window_attention(q, k, v, pos, partition, window, quant, L, tables=None, radial_split_a=None,
                     shift=False, backend=None):
    """One branch of SphereFormer's attention: q (already scaled by head_dim^-0.5), k, v [N, H, D] in
    input order; pos [N, 3] float32 (xyz, or cart2sphere(xyz) for the spherical branch); partition
    from window_partition(pos, ...); tables None (no RPE: attention_step1/2) or (tq, tk, tv) with
    [T, 3, H, D] (T = 2L - 1 cubic, 2L spherical). Runs in q's dtype. Returns [N, H, D]."""
    i0, i0_off, n_max, i1, i1_off, sort_idx = partition
    dt = q.dtype
    qs, ks, vs = q[sort_idx].contiguous(), k[sort_idx].to(dt).contiguous(), v[sort_idx].to(dt).contiguous()
    rel = None
    if tables is not None:
        rel = rpe_index(pos[sort_idx], i0, i1, window, quant, L, shift, radial_split_a)
        tables = tuple(t.to(device=q.device, dtype=dt).contiguous() for t in tables)
    if _use_sptr(backend, q.device):
        F, _, _ = load_sptr()
        if tables is not None:
            rel8 = rel.to(RPE_INDEX_DTYPE).contiguous()
            tq, tk, tv = tables
            attn = F.dot_prod_with_idx_all(qs, i0, i0_off, ks, i1, i1_off, tq, tk, rel8, n_max)
            attn = scatter_softmax_csr(attn, i0_off.long())
            x = F.attention_step2_with_rel_pos_value(attn, vs, i0, i0_off, n_max, i1, i1_off, tv, rel8)
        else:
            attn = F.attention_step1(qs, ks, i0, i0_off, i1, i1_off, n_max)
            attn = scatter_softmax_csr(attn, i0_off.long())
            x = F.attention_step2(attn, vs, i0, i0_off, i1, i1_off, n_max)
    else:
        x = _attention_torch(qs, ks, vs, i0, i0_off, i1, rel, tables)
    out = torch.empty_like(x)
    out[sort_idx] = x
    return out


def level_params(level):
    """Normalised copy of a level dict (keys window, quant, L, window_sphere, quant_sphere, L_sphere, a,
    shift; optional indice_key)."""
    return {
        "window": _f32(level["window"]), "quant": _f32(level["quant"]), "L": int(level["L"]),
        "window_sphere": _f32(level["window_sphere"]), "quant_sphere": _f32(level["quant_sphere"]),
        "L_sphere": int(level["L_sphere"]), "a": float(level["a"]), "shift": bool(level.get("shift", False)),
        "indice_key": level.get("indice_key", "sphereformer"),
    }


def sphere_partitions(xyz, batch, level, backend=None):
    lv = level_params(level)
    sph = cart2sphere(xyz)
    return (window_partition(xyz, batch, lv["window"], lv["shift"], backend),
            window_partition(sph, batch, lv["window_sphere"], lv["shift"], backend))


def sphere_attention(q, k, v, xyz, batch, level, tables_cubic, tables_sphere, cache=None, backend=None):
    """SparseMultiheadSASphereConcat's attention core (no qkv / proj Linears): heads [:H//2] on cubic
    windows of xyz, the rest on spherical windows of cart2sphere(xyz); outputs concatenated by head.
    `cache` (a dict) keeps both partitions under level["indice_key"] (default "sphereformer") and a
    later call with the same dict reuses them, like upstream's indice_dict (cart2sphere is still
    recomputed, as upstream does). tables_*: (tq, tk, tv) or None (no RPE)."""
    lv = level_params(level)
    H = q.shape[1]
    hc = H // 2
    sph = cart2sphere(xyz)
    key = lv["indice_key"]
    if cache is not None and key in cache:
        part_c, part_s = cache[key]
    else:
        part_c = window_partition(xyz, batch, lv["window"], lv["shift"], backend)
        part_s = window_partition(sph, batch, lv["window_sphere"], lv["shift"], backend)
        if cache is not None:
            cache[key] = (part_c, part_s)
    o1 = window_attention(q[:, :hc].contiguous(), k[:, :hc].contiguous(), v[:, :hc].contiguous(), xyz, part_c,
                          lv["window"], lv["quant"], lv["L"], tables_cubic, None, lv["shift"], backend)
    o2 = window_attention(q[:, hc:].contiguous(), k[:, hc:].contiguous(), v[:, hc:].contiguous(), sph, part_s,
                          lv["window_sphere"], lv["quant_sphere"], lv["L_sphere"], tables_sphere, lv["a"],
                          lv["shift"], backend)
    return torch.cat([o1, o2], 1)
