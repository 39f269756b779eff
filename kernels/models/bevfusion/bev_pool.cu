// Lift-splat on CUDA (see src/bev/lss/cuda.rs): the per-calibration geometry (a point's BEV cell,
// in float64 op for op as the CPU reference src/bev/lss/geometry.rs), the cell offsets of the
// sorted points, the depth softmax of the depthnet output, and the fused pool that sums
// depth x context per BEV cell straight from the two tensors.
//
// Compiled without FMA contraction: the geometry must round exactly as the CPU reference. The
// pool's FP32 multiply-adds are spelled __fmaf_rn (never contracted or split).
#include <cuda_fp16.h>

// Per camera, 24 doubles (CameraGeometry in geometry.rs): post_trans[3], inv_post_rot[9] (row
// major), combine[9] = R_cam2lidar * inv(K), trans[3].
#define CAM_DOUBLES 24

// The BEV grid (mirror of GridC in cuda.rs): lower corner bx - dx/2 and dx widened from float32,
// cell counts, points per camera (D * H * W), feature map size.
struct LssGrid {
    double lower[3];
    double dx[3];
    u32 nx[3];
    u32 depth_bins;
    u32 height;
    u32 width;
    u32 cells;     // nx * ny * nz: the key of a point outside the grid (sorts last)
    u32 pad;
};

// Point i = ((n * D + d) * H + h) * W + w of a frame: keys[i] = its cell (x * ny + y) * nz + z or
// grid.cells when outside, vals[i] = its depth-tensor index ((n * H + h) * W + w) * D + d. A stable
// sort by key then leaves each cell's points in ascending i.
extern "C" __global__ void lss_geometry(const float* __restrict__ frustum, const double* __restrict__ cams, LssGrid g,
                                        u32 total, u64* __restrict__ keys, u32* __restrict__ vals) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const u32 per_cam = g.depth_bins * g.height * g.width;
    const u32 n = i / per_cam;
    const u32 r = i - n * per_cam;  // (d * H + h) * W + w: the frustum entry
    const u32 w = r % g.width;
    const u32 h = (r / g.width) % g.height;
    const u32 d = r / (g.width * g.height);
    const double* c = cams + (u64)n * CAM_DOUBLES;
    const double* pt = c;
    const double* a = c + 3;
    const double* m = c + 12;
    const double* t = c + 21;
    const float* f = frustum + (u64)r * 3;
    const double p0 = (double)f[0] - pt[0], p1 = (double)f[1] - pt[1], p2 = (double)f[2] - pt[2];
    const double q0 = (a[0] * p0 + a[1] * p1) + a[2] * p2;
    const double q1 = (a[3] * p0 + a[4] * p1) + a[5] * p2;
    const double q2 = (a[6] * p0 + a[7] * p1) + a[8] * p2;
    const double r0 = q0 * q2, r1 = q1 * q2, r2 = q2;
    double s[3];
    s[0] = ((m[0] * r0 + m[1] * r1) + m[2] * r2) + t[0];
    s[1] = ((m[3] * r0 + m[4] * r1) + m[5] * r2) + t[1];
    s[2] = ((m[6] * r0 + m[7] * r1) + m[8] * r2) + t[2];
    u64 key = 0;
    bool kept = true;
#pragma unroll
    for (int k = 0; k < 3; ++k) {
        const double qk = (s[k] - g.lower[k]) / g.dx[k];
        // .long() truncates toward zero: kept when 0 <= trunc(q) < n, i.e. -1 < q < n (NaN fails)
        if (!(qk > -1.0 && qk < (double)g.nx[k])) kept = false;
        s[k] = kept ? trunc(qk) : 0.0;
    }
    if (kept) key = ((u64)(u32)s[0] * g.nx[1] + (u32)s[1]) * g.nx[2] + (u32)s[2];
    keys[i] = kept ? key : (u64)g.cells;
    vals[i] = ((n * g.height + h) * g.width + w) * g.depth_bins + d;
}

// cell_start[c] = the first position of the sorted keys[0..n) whose key is >= c, for c <= cells:
// cell c's points are [cell_start[c], cell_start[c + 1]), and cell_start[cells] is the kept count.
extern "C" __global__ void lss_cell_starts(const u64* __restrict__ keys, u32 n, u32 cells, u32* __restrict__ cell_start) {
    const u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c > cells) return;
    u32 lo = 0, hi = n;
    while (lo < hi) {
        const u32 mid = lo + (hi - lo) / 2;
        if (keys[mid] < (u64)c) lo = mid + 1; else hi = mid;
    }
    cell_start[c] = lo;
}

// Depth softmax of the depthnet output: one warp per pixel p < pixels. acc is the GEMM's FP32
// [pixels, D + C] (no bias), bias [D + C]. depth[p, :] = softmax(acc[p, :D] + bias[:D]) and
// context[p, :] = acc[p, D:] + bias[D:], both FP16. The warp's sums use a butterfly, so every
// lane holds the same max and total. range_flags (may be NULL), range_layer: the FP16 range guard
// (prelude.cuh) of both stores (a depth in [0, 1] can only be flagged as NaN).
extern "C" __global__ void lss_lift(const float* __restrict__ acc, const float* __restrict__ bias, u32 pixels, u32 D, u32 C,
                                    __half* __restrict__ depth, __half* __restrict__ context,
                                    u32* __restrict__ range_flags, u32 range_layer) {
    const u32 p = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31u;
    if (p >= pixels) return;  // warp-uniform
    const float* row = acc + (u64)p * (D + C);
    float mx = -__int_as_float(0x7f800000);  // -inf
    for (u32 j = lane; j < D; j += 32) mx = fmaxf(mx, row[j] + bias[j]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
    float sum = 0.0f;
    for (u32 j = lane; j < D; j += 32) sum += expf(row[j] + bias[j] - mx);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
    const float inv = 1.0f / sum;
    u32 bits = 0;
    __half* dp = depth + (u64)p * D;
    for (u32 j = lane; j < D; j += 32) {
        const float y = expf(row[j] + bias[j] - mx) * inv;
        bits |= fp16_range_bits(y);
        dp[j] = __float2half_rn(y);
    }
    __half* cp = context + (u64)p * C;
    for (u32 j = lane; j < C; j += 32) {
        const float y = row[D + j] + bias[D + j];
        bits |= fp16_range_bits(y);
        cp[j] = __float2half_rn(y);
    }
    range_flag(range_flags, range_layer, bits);
}

#define POOL_UNROLL 4
#define WHOLE_CELL 0xffffffffu

// Whether depth-tensor point q's camera (q / per_cam) is pooled; every camera on (the usual
// frame) costs no division.
__device__ __forceinline__ bool pool_camera_on(u32 q, u32 per_cam, u32 mask) {
    return mask == 0xffffffffu || q / per_cam >= 32u || ((mask >> (q / per_cam)) & 1u) != 0u;
}

// acc[k] += d * row[k] for the 8 FP16 channels in `raw` where `on`, FP32, never contracted or
// split (fma.rn). Predicated, not branched around: the slices of a warp end at different points,
// so a branch there diverges, and its set-up, jump and reconvergence cost a warp three to four
// instructions a point beside these sixteen. The conversions run either way (a slice past its
// end converts row 0's values and adds none of them).
__device__ __forceinline__ void pool_fma8(float acc[8], float d, uint4 raw, bool on) {
    const __half2* hv = reinterpret_cast<const __half2*>(&raw);
    float f[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 t = __half22float2(hv[k]);
        f[2 * k] = t.x;
        f[2 * k + 1] = t.y;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        if (on) acc[k] = __fmaf_rn(d, f[k], acc[k]);
    }
}

// One step of a slice: the point whose context row (in 16-byte chunks) and depth value lane
// `src` holds, and this lane's chunk of that row. The whole warp calls it (shuffles); a source
// lane past 31 reads lane src % 32, whose values the caller does not use.
__device__ __forceinline__ void pool_point(const uint4* context, u32 chunk, u32 my_row, float my_dv, u32 src, float& dv, uint4& raw) {
    const u32 row = __shfl_sync(FULL_MASK, my_row, src);
    dv = __shfl_sync(FULL_MASK, my_dv, src);
    raw = __ldg(context + (row + chunk));
}

// The 8 sums as FP16 at dst; returns their FP16 range bits (prelude.cuh).
__device__ __forceinline__ u32 pool_store8(__half* dst, const float acc[8]) {
    uint4 packed;
    __half2* hp = reinterpret_cast<__half2*>(&packed);
    u32 bits = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        bits |= fp16_range_bits(acc[2 * k]) | fp16_range_bits(acc[2 * k + 1]);
        hp[k] = __floats2half2_rn(acc[2 * k], acc[2 * k + 1]);
    }
    *reinterpret_cast<uint4*>(dst) = packed;
    return bits;
}

// The pool, pass 1, over the work items of the plan (src/models/bevfusion/lss/pool_plan.rs):
// item = (cell, begin, end, slot), the sorted points [begin, end) of one cell; items come longest
// cell first, and a cell of more than the plan's chunk of points is cut into several items.
// Lanes are (slice, chunk): chunk = 8 channels (one 16-byte load of a context row), C / 8 chunks,
// 32 / (C / 8) slices; warp w's slice s takes item w * slices + s (neighbours in the plan, so of
// about the same length) and sums its points in order in FP32. The points come a batch of
// `chunks` an item at a time: lane (s, c) loads point c of the batch (its order entry, context
// row (point q's pixel q / D, D the depth bins, as pool_div) and depth value), then each step
// hands the slice's next point to all its lanes by shuffles, four steps' context loads in flight
// at once. An item that is its whole cell (slot
// WHOLE_CELL) writes the cell's FP16 sums (an empty cell: zeros, so the output needs no memset);
// a cut item writes its FP32 sums to partial[slot] for pass 2. No atomics, a fixed order: the same
// bits every run, and a cell's sums do not depend on the plan that kept it whole. A point of a
// camera outside `mask` gets depth 0 and adds exactly nothing (fma(0, x, a) = a for finite x), so
// masking equals zeroing that camera's depth. Needs C % 8 == 0, C <= 256, pixels * C < 2^32 and
// pixels * D < 2^31. out[cell, c] with cell = (x * ny + y) * nz + z: NHWC [nx, ny, nz * C].
// range_flags (may be NULL), range_layer: the FP16 range guard (prelude.cuh) of the stored sums.

// q / D for q < 2^31 as a multiply and a shift (PoolDivisor in lss/cuda.rs: magic =
// ceil(2^(31 + l) / D), shift = 31 + l, 2^(l - 1) < D <= 2^l; exact for every such q), where
// the division instruction sequence would cost a lane about 16 instructions a batch.
__device__ __forceinline__ u32 pool_div(u32 q, u32 magic, u32 shift) {
    return (u32)(((u64)q * magic) >> shift);
}

// The body of pass 1: CHUNKS the context row's 16-byte chunks (C / 8) when known at compile time
// (a warp's divisions by it become constants), 0 for any C (the runtime `C`).
template <u32 CHUNKS>
__device__ __forceinline__ void pool_items(const __half* __restrict__ depth, const __half* __restrict__ context,
                                           const u32* __restrict__ order, const uint4* __restrict__ items, u32 n_items,
                                           u32 d_magic, u32 d_shift, u32 C, u32 per_cam, u32 mask, __half* __restrict__ out,
                                           float* __restrict__ partial, u32* __restrict__ range_flags, u32 range_layer) {
    const u32 w = (u32)(((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const u32 lane = threadIdx.x & 31u;
    const u32 chunks = CHUNKS != 0u ? CHUNKS : C >> 3;
    const u32 slices = 32u / chunks;
    if (w * slices >= n_items) return;  // warp-uniform
    const u32 slice = lane / chunks;
    const u32 chunk = lane - slice * chunks;
    // lanes past the last slice, or a slice past the last item, pool nothing (an empty item)
    const bool owner = slice < slices && w * slices + slice < n_items;
    const uint4 item = owner ? items[w * slices + slice] : make_uint4(0u, 0u, 0u, 0u);
    const u32 len = item.z - item.y;
    const u32 longest = __reduce_max_sync(FULL_MASK, len);
    const uint4* ctx = reinterpret_cast<const uint4*>(context);
    const u32 first = slice * chunks;  // the lane holding the batch's first point of this slice
    float acc[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] = 0.0f;
    for (u32 b = 0; b < longest; b += chunks) {
        // lane (s, c): point b + c of slice s's item; past its end, row 0 and depth 0 (unused)
        u32 my_row = 0;
        float my_dv = 0.0f;
        if (b + chunk < len) {
            const u32 q = order[item.y + b + chunk];
            my_row = pool_div(q, d_magic, d_shift) * chunks;
            my_dv = pool_camera_on(q, per_cam, mask) ? __half2float(depth[q]) : 0.0f;
        }
        const u32 steps = min(chunks, longest - b);  // warp-uniform
        u32 k = 0;
        for (; k + POOL_UNROLL <= steps; k += POOL_UNROLL) {
            float dv[POOL_UNROLL];
            uint4 raw[POOL_UNROLL];
#pragma unroll
            for (int u = 0; u < POOL_UNROLL; ++u) pool_point(ctx, chunk, my_row, my_dv, first + k + u, dv[u], raw[u]);
#pragma unroll
            for (int u = 0; u < POOL_UNROLL; ++u) pool_fma8(acc, dv[u], raw[u], b + k + u < len);
        }
        for (; k < steps; ++k) {
            float dv;
            uint4 raw;
            pool_point(ctx, chunk, my_row, my_dv, first + k, dv, raw);
            pool_fma8(acc, dv, raw, b + k < len);
        }
    }
    if (!owner) return;
    if (item.w != WHOLE_CELL) {
        float4* dst = reinterpret_cast<float4*>(partial + (u64)item.w * (chunks * 8u) + chunk * 8u);
        dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
        return;
    }
    range_flag(range_flags, range_layer, pool_store8(out + (u64)item.x * (chunks * 8u) + chunk * 8u, acc));
}

#define POOL_ITEMS_ARGS                                                                                           \
    const __half *__restrict__ depth, const __half *__restrict__ context, const u32 *__restrict__ order,          \
        const uint4 *__restrict__ items, u32 n_items, u32 d_magic, u32 d_shift, u32 C, u32 per_cam, u32 mask,     \
        __half *__restrict__ out, float *__restrict__ partial, u32 *__restrict__ range_flags, u32 range_layer
#define POOL_ITEMS_CALL depth, context, order, items, n_items, d_magic, d_shift, C, per_cam, mask, out, partial, range_flags, range_layer
// Any C (a multiple of 8 up to 256).
extern "C" __global__ void lss_pool_items(POOL_ITEMS_ARGS) { pool_items<0u>(POOL_ITEMS_CALL); }
// C = 80, the BEVFusion camera branch's context channels (`C` must be 80).
extern "C" __global__ void lss_pool_items_c80(POOL_ITEMS_ARGS) { pool_items<10u>(POOL_ITEMS_CALL); }

// The pool, pass 2: one warp per cut cell, merge = (cell, first slot, slots, unused): lane j
// adds channel j, j + 32, ... of the partials first, first + 1, ... in that order (FP32, a fixed
// order: the same bits every run) and writes the cell's FP16 sums; the range guard as pass 1.
extern "C" __global__ void lss_pool_merge(const float* __restrict__ partial, const uint4* __restrict__ merges, u32 n_merges,
                                          u32 C, __half* __restrict__ out, u32* __restrict__ range_flags, u32 range_layer) {
    const u32 w = (u32)(((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const u32 lane = threadIdx.x & 31u;
    if (w >= n_merges) return;  // warp-uniform
    const uint4 m = merges[w];
    u32 bits = 0;
    // MERGE_BATCH partials are loaded before any is added: the loads' latencies overlap instead
    // of one load waiting for the add before it. The adds keep slot order (the same bits).
    constexpr u32 MERGE_BATCH = 8;
    for (u32 j = lane; j < C; j += 32u) {
        const float* p = partial + (u64)m.y * C + j;
        float acc = p[0];
        for (u32 k0 = 1; k0 < m.z; k0 += MERGE_BATCH) {
            float v[MERGE_BATCH];
#pragma unroll
            for (u32 u = 0; u < MERGE_BATCH; ++u) v[u] = k0 + u < m.z ? p[(u64)(k0 + u) * C] : 0.0f;
#pragma unroll
            for (u32 u = 0; u < MERGE_BATCH; ++u)
                if (k0 + u < m.z) acc = __fadd_rn(acc, v[u]);
        }
        bits |= fp16_range_bits(acc);
        out[(u64)m.x * C + j] = __float2half_rn(acc);
    }
    range_flag(range_flags, range_layer, bits);
}

// ---- The pool on tensor cores (mma.sync, ldmatrix and cp.async: every GPU from sm_80 on), for
// plans with spans: measured beside the slice pool, not the default (docs/kernels.md). Its first
// layout, a lane copying its own point's row, took 2.4 times as long on an H100: each copy
// instruction gathered 16 bytes of 32 different rows. With the copies chunk-major (whole rows an
// instruction, row by row) and double-buffered it takes 1.43-1.51 times as long: each row still
// passes through L1 and shared memory three times, where a load of the slice pool moves it once.
// Copies laid out as (point, chunk) pairs instead, every lane busy, cost more instructions a
// batch (299 against 286) and were slower still.
//
// The pool is a sparse matrix product, out[cell, :] = sum over the cell's points of depth x the
// point's context row, and the slice pool above spends most of its instructions on it a point at
// a time (a conversion and an FMA a channel). Here a warp takes a span of the plan (up to 16
// items whose points lie one after another in the span list, pool_plan.rs) and sums them with
// m16n8k16 MMAs: K = 16 points, N = 8 channels, M = 16 rows, one item a row. A[row, k] is point
// k's depth where point k belongs to that row's item, else 0; B[k, :] is point k's context row,
// copied into shared memory by cp.async and read as fragments by ldmatrix.trans. A point costs
// the warp about nine instructions instead of about thirteen (sm_90 SASS: 286 a 32-point batch).
// Sums are FP32 in the tensor cores' order: the same bits on every run of a plan, but not those
// of the slice pool, and a cell's bits depend on where the plan puts its points among the span's
// 16-point steps.
// A non-finite context value of a kept point reaches the other items of its 16-point step
// (0 x inf is NaN); the lift's range guard flags such values. A masked camera's points and the
// steps' padding copy zeros instead of their rows (cp.async zero fill), so they add exactly nothing.
#define SPAN_ROWS 16u                // items a span holds at most (the MMA's rows)
#define SPAN_ROW_SHIFT 28u           // a span-list entry: point index | row << 28
#define SPAN_POINT_MASK 0x0fffffffu  // so point indices must be below 2^28
#define SPAN_BATCH 32u               // points a warp stages at once, one a lane
#define SPAN_WARPS 4u                // warps a block

// Builds the span list: for span s and its m-th item, the item's point-order entries tagged with
// row m, one warp a span, the items' points one after another from the span's list begin.
extern "C" __global__ void lss_pool_span_list(const u32* __restrict__ order, const uint4* __restrict__ items,
                                              const uint4* __restrict__ spans, u32 n_spans, u32* __restrict__ list) {
    const u32 w = (u32)(((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    const u32 lane = threadIdx.x & 31u;
    if (w >= n_spans) return;  // warp-uniform
    const uint4 span = spans[w];
    u32 pos = span.x;
    for (u32 m = 0; m < span.w; ++m) {
        const uint4 it = items[span.z + m];
        const u32 len = it.z - it.y;
        for (u32 k = lane; k < len; k += 32u) list[pos + k] = order[it.y + k] | (m << SPAN_ROW_SHIFT);
        pos += len;
    }
}

// 16 bytes from global to shared memory through L1 (neighbouring cells share context rows);
// `bytes` 0 writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void span_copy16(u32 smem, const void* src, u32 bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(src), "r"(bytes) : "memory");
}

// Four 8 x 8 FP16 matrices transposed: r[i] of lane t holds rows 2(t % 4) and 2(t % 4) + 1, column
// t / 4, of matrix i, whose rows lanes 8i..8i+7 address.
__device__ __forceinline__ void span_ldmatrix_t4(u32 r[4], u32 smem) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem)
                 : "memory");
}

// acc += A (16 x 16, FP16) B (16 x 8, FP16), FP32 accumulators.
__device__ __forceinline__ void span_mma(float acc[4], const u32 a[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The FP16 depth bits of a staged point where its row is `row`, else 0 (`tagged`: depth bits |
// row << 16, as each lane packs its point).
__device__ __forceinline__ u32 span_depth_in_row(u32 tagged, u32 row) {
    return (tagged >> 16) == row ? (tagged & 0xffffu) : 0u;
}

// The A fragment of points base..base+15 of the batch (lane p holds point p's tag): lane (g, t)
// = (lane / 4, lane % 4) holds rows g and g + 8 at columns 2t, 2t + 1, 2t + 8, 2t + 9, the lower
// half of each register the lower column.
__device__ __forceinline__ void span_a_fragment(u32 tagged, u32 base, u32 g, u32 t, u32 a[4]) {
    const u32 p0 = __shfl_sync(FULL_MASK, tagged, base + 2u * t);
    const u32 p1 = __shfl_sync(FULL_MASK, tagged, base + 2u * t + 1u);
    const u32 p2 = __shfl_sync(FULL_MASK, tagged, base + 2u * t + 8u);
    const u32 p3 = __shfl_sync(FULL_MASK, tagged, base + 2u * t + 9u);
    a[0] = span_depth_in_row(p0, g) | (span_depth_in_row(p1, g) << 16);
    a[1] = span_depth_in_row(p0, g + 8u) | (span_depth_in_row(p1, g + 8u) << 16);
    a[2] = span_depth_in_row(p2, g) | (span_depth_in_row(p3, g) << 16);
    a[3] = span_depth_in_row(p2, g + 8u) | (span_depth_in_row(p3, g + 8u) << 16);
}

// A point's staging source: its context row in 16-byte chunks (pixel x CHUNKS), or SPAN_NO_ROW
// for a masked camera's point and a batch's padding, whose staging row is zero-filled.
#define SPAN_NO_ROW 0xffffffffu

// Copies a batch's 32 context rows into `stage` (32 rows of STRIDE bytes) chunk-major, row by
// row: lane l copies chunk l % CHUNKS of row l / CHUNKS of each group of 32 / CHUNKS rows (three
// at C 80, two lanes idle), so one copy instruction reads whole rows (as a load of the slice pool
// does) rather than 16 bytes of 32 rows, a lane's chunk and its place in the group are fixed, and
// each copy's shared address is a constant step from the last. Lane p holds point p's source row
// (`my_src`); the copying lane takes it by shuffle.
template <u32 CHUNKS, u32 STRIDE>
__device__ __forceinline__ void span_stage_rows(u32 stage, const uint4* __restrict__ ctx, u32 my_src, u32 lane) {
    constexpr u32 GROUP = 32u / CHUNKS;  // rows a copy instruction takes
    const u32 lp = lane / CHUNKS, c = lane - lp * CHUNKS;
    const u32 dst = stage + lp * STRIDE + c * 16u;
#pragma unroll
    for (u32 i = 0; i < (32u + GROUP - 1u) / GROUP; ++i) {
        const u32 p = i * GROUP + lp;
        const u32 row = __shfl_sync(FULL_MASK, my_src, p & 31u);
        if (lp < GROUP && p < 32u) {
            const bool on = row != SPAN_NO_ROW;
            span_copy16(dst + i * GROUP * STRIDE, ctx + (on ? row + c : 0u), on ? 16u : 0u);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Pass 1 on tensor cores: warp w pools span w = (list begin, points, first item, items), 32
// points a batch, two batches in flight: while the warp multiplies batch b out of one staging
// buffer, batch b + 1's rows land in the other. Lane p decodes entry p of a batch (point index
// q, row) into its source row and its depth bits tagged with its row, the depth load's latency
// also hidden behind the batch before. Then each 16-point half of a batch (skipped when past the
// span's end) is one A fragment and CHUNKS MMAs. Staging rows are (CHUNKS | 1) x 16 bytes, an odd
// count of 16-byte units, so the 8 rows an ldmatrix phase reads fall in distinct banks. The
// epilogue as the slice pool's: an item that is its whole cell writes FP16 sums (zeros for an
// empty one), a cut item its FP32 partials for lss_pool_merge. Needs an even CHUNKS (C a
// multiple of 16) and point indices below 2^28 (the plan checks both).
template <u32 CHUNKS>
__device__ __forceinline__ void pool_spans(const __half* __restrict__ depth, const __half* __restrict__ context,
                                           const u32* __restrict__ list, const uint4* __restrict__ spans, u32 n_spans,
                                           const uint4* __restrict__ items, u32 d_magic, u32 d_shift, u32 per_cam, u32 mask,
                                           __half* __restrict__ out, float* __restrict__ partial, u32* __restrict__ range_flags,
                                           u32 range_layer) {
    constexpr u32 STRIDE = (CHUNKS | 1u) * 16u;
    constexpr u32 STAGE_BYTES = SPAN_BATCH * STRIDE;
    __shared__ __align__(16) unsigned char stage[SPAN_WARPS][2][STAGE_BYTES];
    const u32 wb = threadIdx.x >> 5;
    const u32 w = blockIdx.x * SPAN_WARPS + wb;
    const u32 lane = threadIdx.x & 31u;
    if (w >= n_spans) return;  // warp-uniform
    const uint4 span = spans[w];
    const u32 base = (u32)__cvta_generic_to_shared(stage[wb][0]);
    // ldmatrix: lanes 8i..8i+7 address matrix i's rows: points (i & 1) * 8 + lane % 8 of the
    // half, chunk i / 2 of the pair
    const u32 ld = (((lane >> 3) & 1u) * 8u + (lane & 7u)) * STRIDE + (lane >> 4) * 16u;
    const u32 g = lane >> 2, t = lane & 3u;
    const uint4* ctx = reinterpret_cast<const uint4*>(context);
    float acc[CHUNKS][4];
#pragma unroll
    for (u32 j = 0; j < CHUNKS; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    // Entry p of the batch at b (`entry`, loaded a batch earlier): its source row (staged now)
    // and its tagged depth (used when the batch is multiplied); a padding lane's row 16 matches
    // no row of the MMA.
    auto entry_at = [&](u32 b) { return b + lane < span.y ? list[span.x + b + lane] : 0u; };
    auto decode = [&](u32 b, u32 entry, u32& src, u32& tagged) {
        const bool valid = b + lane < span.y;
        const u32 q = entry & SPAN_POINT_MASK;
        const bool on = valid && pool_camera_on(q, per_cam, mask);
        src = on ? pool_div(q, d_magic, d_shift) * CHUNKS : SPAN_NO_ROW;
        const u32 dv = on ? (u32)__half_as_ushort(depth[q]) : 0u;
        tagged = dv | ((valid ? entry >> SPAN_ROW_SHIFT : SPAN_ROWS) << 16);
    };
    u32 src, tagged;
    decode(0u, entry_at(0u), src, tagged);
    span_stage_rows<CHUNKS, STRIDE>(base, ctx, src, lane);
    u32 ahead = entry_at(SPAN_BATCH);
    u32 buf = 0;
    for (u32 b = 0; b < span.y; b += SPAN_BATCH) {
        // the next batch's copies go out before this one is multiplied (an empty group past the
        // end), and the entries of the batch after it are loaded
        u32 next_tagged = 0;
        if (b + SPAN_BATCH < span.y) {  // warp-uniform
            u32 next_src;
            decode(b + SPAN_BATCH, ahead, next_src, next_tagged);
            span_stage_rows<CHUNKS, STRIDE>(base + (buf ^ 1u) * STAGE_BYTES, ctx, next_src, lane);
            ahead = entry_at(b + 2u * SPAN_BATCH);
        } else {
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // this batch's group has landed
        __syncwarp();                                               // every lane's copies of it
        const u32 rows = base + buf * STAGE_BYTES + ld;
#pragma unroll
        for (u32 h = 0; h < 2u; ++h) {
            if (b + h * 16u >= span.y) break;  // warp-uniform: the half holds no point
            u32 a[4];
            span_a_fragment(tagged, h * 16u, g, t, a);
            // every B fragment of the half first, then the MMAs: the loads overlap
            u32 bf[CHUNKS / 2u][4];
#pragma unroll
            for (u32 j = 0; j < CHUNKS / 2u; ++j) span_ldmatrix_t4(bf[j], rows + h * 16u * STRIDE + j * 32u);
#pragma unroll
            for (u32 j = 0; j < CHUNKS / 2u; ++j) {
                span_mma(acc[2u * j], a, bf[j][0], bf[j][1]);
                span_mma(acc[2u * j + 1u], a, bf[j][2], bf[j][3]);
            }
        }
        __syncwarp();  // every lane's fragments read before the buffer takes the batch after next
        tagged = next_tagged;
        buf ^= 1u;
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // an empty span's zero fills too
    // lane (g, t) holds rows g and g + 8, channels 8j + 2t and 8j + 2t + 1 of chunk j
    u32 bits = 0;
#pragma unroll
    for (u32 r = 0; r < 2u; ++r) {
        const u32 m = g + 8u * r;
        if (m >= span.w) continue;
        const uint4 it = items[span.z + m];
        if (it.w != WHOLE_CELL) {
            float* dst = partial + (u64)it.w * (CHUNKS * 8u) + 2u * t;
#pragma unroll
            for (u32 j = 0; j < CHUNKS; ++j) *reinterpret_cast<float2*>(dst + 8u * j) = make_float2(acc[j][2u * r], acc[j][2u * r + 1u]);
            continue;
        }
        __half* dst = out + (u64)it.x * (CHUNKS * 8u) + 2u * t;
#pragma unroll
        for (u32 j = 0; j < CHUNKS; ++j) {
            const float lo = acc[j][2u * r], hi = acc[j][2u * r + 1u];
            bits |= fp16_range_bits(lo) | fp16_range_bits(hi);
            *reinterpret_cast<__half2*>(dst + 8u * j) = __floats2half2_rn(lo, hi);
        }
    }
    range_flag(range_flags, range_layer, bits);
}

#define POOL_SPANS_ARGS                                                                                          \
    const __half *__restrict__ depth, const __half *__restrict__ context, const u32 *__restrict__ list,          \
        const uint4 *__restrict__ spans, u32 n_spans, const uint4 *__restrict__ items, u32 d_magic, u32 d_shift, \
        u32 per_cam, u32 mask, __half *__restrict__ out, float *__restrict__ partial, u32 *__restrict__ range_flags, \
        u32 range_layer
#define POOL_SPANS_CALL depth, context, list, spans, n_spans, items, d_magic, d_shift, per_cam, mask, out, partial, range_flags, range_layer
// C = 80, the BEVFusion camera branch's context channels (80 is compiled in).
extern "C" __global__ void __launch_bounds__(SPAN_WARPS * 32u) lss_pool_spans_c80(POOL_SPANS_ARGS) { pool_spans<10u>(POOL_SPANS_CALL); }
