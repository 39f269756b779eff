// BEVFusion's LiDAR branch: hard voxelization (the function of src/sparse/hard_voxelize.rs, exactly)
// and the sparse-to-BEV flattening of SparseEncoder's output (src/model/lidar_encoder.rs).
//
// Voxelization, with a stable radix sort between the steps (src/sparse/hard_voxelize_cuda.rs):
//   hv_keys      point -> cell key (float32 like upstream; NaN/Inf and out-of-range -> `empty`)
//   sort (key, point) stably -> points grouped by cell, in point order inside a cell
//   hv_heads     run heads; the count of valid (non-empty) keys
//   scan         run ids
//   hv_runs      per run: its start and first point
//   sort (first point, run) -> runs in upstream's voxel order (order of first appearance)
//   hv_voxels    per voxel: the first max_points points' mean (summed in point order), coords
// No FMA contraction (fmad off) and IEEE division: the keys and means round as the CPU's do.
#include <cuda_fp16.h>

#define POINT_COLUMNS 5

struct HvGrid {
    float voxel[3];
    float min[3];
    i32 grid[3];
    u32 n;           // points
    u32 fp16;        // round every column through FP16 first
    u32 max_points;  // per voxel
    u32 max_voxels;
    float max[3];
    u32 filter;      // PointsRangeFilter first: min < p < max, strict
};

// The point's columns as the voxelizer reads them; false when one is NaN, Inf or beyond FP16's
// largest finite value 65504 (checked before the FP16 rounding, as the CPU's read_point does).
__device__ __forceinline__ bool hv_read(const float* __restrict__ pts, u32 i, u32 fp16, float q[POINT_COLUMNS]) {
    bool ok = true;
#pragma unroll
    for (int c = 0; c < POINT_COLUMNS; ++c) {
        float v = pts[(u64)i * POINT_COLUMNS + c];
        if (!isfinite(v) || fabsf(v) > 65504.0f) ok = false;
        if (fp16) v = __half2float(__float2half_rn(v));
        q[c] = v;
    }
    return ok;
}

// keys[i] = (x * Gy + y) * Gz + z of point i, or `empty`; vals[i] = i. stats[0] += non-finite,
// stats[1] += out of range.
extern "C" __global__ void hv_keys(const float* __restrict__ pts, HvGrid G, u64 empty, u64* __restrict__ keys,
                                   u32* __restrict__ vals, u32* __restrict__ stats) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= G.n) return;
    float q[POINT_COLUMNS];
    u64 key = empty;
    if (!hv_read(pts, i, G.fp16, q)) {
        atomicAdd(&stats[0], 1u);
    } else {
        bool in = true;
        if (G.filter) {
#pragma unroll
            for (int a = 0; a < 3; ++a)
                if (!(q[a] > G.min[a] && q[a] < G.max[a])) in = false;
        }
        i32 c[3];
#pragma unroll
        for (int a = 0; a < 3; ++a) {
            const float f = floorf((q[a] - G.min[a]) / G.voxel[a]);
            if (!(f >= 0.0f && f < (float)G.grid[a])) in = false;
            c[a] = in ? (i32)f : 0;
        }
        if (in)
            key = ((u64)c[0] * (u64)G.grid[1] + (u64)c[1]) * (u64)G.grid[2] + (u64)c[2];
        else
            atomicAdd(&stats[1], 1u);
    }
    keys[i] = key;
    vals[i] = i;
}

// heads[j] = 1 where sorted key j starts a run of equal valid keys; *valid = the number of valid
// keys (they sort before every `empty`).
extern "C" __global__ void hv_heads(const u64* __restrict__ keys, u32 n, u64 empty, u32* __restrict__ heads, u32* __restrict__ valid) {
    const u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n) return;
    const u64 k = keys[j];
    heads[j] = (k != empty && (j == 0 || k != keys[j - 1])) ? 1u : 0u;
    if (k != empty && (j + 1 == n || keys[j + 1] == empty)) *valid = j + 1;
}

// Per run r (= excl[j] at head j): its start j, and the sort key (its first point) for the voxel
// order; runs[r] = r.
extern "C" __global__ void hv_runs(const u32* __restrict__ heads, const u32* __restrict__ excl, const u32* __restrict__ vals, u32 n,
                                   u32* __restrict__ run_start, u64* __restrict__ first, u32* __restrict__ runs) {
    const u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n || !heads[j]) return;
    const u32 r = excl[j];
    run_start[r] = j;
    first[r] = (u64)vals[j];  // the run's smallest point index: the sort was stable
    runs[r] = r;
}

// Voxel v (< total runs) = run order[v]. Kept voxels (v < max_voxels) get coords [0, x, y, z], the
// mean of their first max_points points (f32 and FP16 padded to `cpad` columns with zeros) and the
// count; stats[2] += points over max_points, stats[3] += points of capped voxels.
extern "C" __global__ void hv_voxels(const float* __restrict__ pts, HvGrid G, const u64* __restrict__ keys,
                                     const u32* __restrict__ vals, const u32* __restrict__ run_start,
                                     const u32* __restrict__ order, u32 runs, const u32* __restrict__ valid, u32 cpad,
                                     i32* __restrict__ coords, float* __restrict__ feats32, __half* __restrict__ feats16,
                                     u32* __restrict__ counts, u32* __restrict__ stats) {
    const u32 v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= runs) return;
    const u32 r = order[v];
    const u32 start = run_start[r];
    const u32 end = r + 1 < runs ? run_start[r + 1] : *valid;
    const u32 len = end - start;
    if (v >= G.max_voxels) {
        atomicAdd(&stats[3], len);
        return;
    }
    const u32 cnt = len < G.max_points ? len : G.max_points;
    if (len > cnt) atomicAdd(&stats[2], len - cnt);
    float sum[POINT_COLUMNS];
#pragma unroll
    for (int c = 0; c < POINT_COLUMNS; ++c) sum[c] = 0.0f;
    for (u32 t = 0; t < cnt; ++t) {
        float q[POINT_COLUMNS];
        hv_read(pts, vals[start + t], G.fp16, q);
#pragma unroll
        for (int c = 0; c < POINT_COLUMNS; ++c) sum[c] = sum[c] + q[c];
    }
    const float nf = (float)cnt;
    for (u32 c = 0; c < cpad; ++c) {
        const float m = c < POINT_COLUMNS ? sum[c] / nf : 0.0f;
        if (c < POINT_COLUMNS) feats32[(u64)v * POINT_COLUMNS + c] = m;
        feats16[(u64)v * cpad + c] = __float2half_rn(m);
    }
    const u64 key = keys[start];
    const u64 gz = (u64)G.grid[2], gy = (u64)G.grid[1];
    coords[(u64)v * 4 + 0] = 0;
    coords[(u64)v * 4 + 1] = (i32)(key / (gz * gy));
    coords[(u64)v * 4 + 2] = (i32)((key / gz) % gy);
    coords[(u64)v * 4 + 3] = (i32)(key % gz);
    counts[v] = cnt;
}

// SparseEncoder's `out.dense()` + permute(0, 1, 4, 2, 3) + view: feats [m, C] at coords [b, x, y, z]
// (origin 0, inside X x Y x Z) into the zeroed NHWC map [1, X, Y, C * Z], channel c * Z + z.
extern "C" __global__ void sparse_to_bev(const __half* __restrict__ feats, const i32* __restrict__ coords, u32 m, u32 C, i32 X,
                                         i32 Y, i32 Z, __half* __restrict__ out) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)m * C) return;
    const u32 row = (u32)(t / C), c = (u32)(t % C);
    const i32 x = coords[(u64)row * 4 + 1], y = coords[(u64)row * 4 + 2], z = coords[(u64)row * 4 + 3];
    if (coords[(u64)row * 4] != 0 || x < 0 || x >= X || y < 0 || y >= Y || z < 0 || z >= Z) return;
    out[(((u64)x * Y + y) * C + c) * Z + z] = feats[t];
}
