// Window attention kernels (see src/attention/cuda.rs): the per-query kernel for small windows
// and, for the contextual RPE on large windows, the window-tiled kernel.
//
// Compiled with FMA contraction on: this is arithmetic-bound code. The one step that must round
// as PyTorch's op-by-op float32 does, the radial exponential split (its bin edges), is written
// with __fmul_rn / __fadd_rn, which are never contracted.
#include <cuda_fp16.h>

#define LN2_F 0.693147180559945309417f

// SphereFormer's exponential_split for one pair, op by op (see src/attention/rpe.rs).
__device__ __forceinline__ int exponential_split(float d, float a) {
    const float ad = fabsf(d);
    const float flag = d >= 0.0f ? 1.0f : 0.0f;
    const float t = logf(__fmul_rn(__fadd_rn(ad, (float)(2.0 * (double)a)), 1.0f / a));
    float idx = __fadd_rn(__fmul_rn(2.0f, floorf(__fmul_rn(t, 1.0f / LN2_F))), -2.0f);
    const float half = torch_div_floor(idx, 2.0f);
    const float edge = __fmul_rn(__fadd_rn(__fmul_rn(3.0f, exp2f(half)), -2.0f), a);
    if (edge <= ad) idx += 1.0f;
    idx = __fadd_rn(__fmul_rn(idx, 2.0f * flag - 1.0f), flag - 1.0f);  // small integers: exact
    return (int)idx;
}

#define MODE_PLAIN 0
#define MODE_CONTEXTUAL 1
#define MODE_BIAS2D 2

// Scalars of one attention call (mirrored by AttnParamsC in src/attention/cuda.rs).
struct AttnParams {
    u32 ld;           // elements between voxel rows of q, k, v
    u32 out_ld;       // elements between rows of out
    u32 head0;        // first head of this call in q/k/v/out rows
    u32 heads_b;      // heads of this call (the tables' head count)
    u32 n;            // voxels
    int grid_length;  // contextual: L
    int rows;         // contextual: table rows
    u32 split;        // contextual: radial exponential split on axis 2
    float a;          // its parameter
    int win_h, win_w; // bias2d: window in tokens
    u32 tiled_min;    // windows of at least this many voxels belong to the tiled kernel (ctx only)
    u32 key_splits;   // tiled kernel: blocks per (window, query chunk, head), each over a slice of
                      // the keys, writing partials that attn_tiled_merge combines (1: no split)
    u32 items_cap;    // tiled kernel: capacity of the work-item list (see attn_tiled_items)
};

// Buffers of one call. quant: contextual = packed quantized positions, bias2d = (row << 16 | col).
// pos: contextual with split = positions [n, 3] (the radius is column 2). tq/tk/tv: contextual =
// [rows, 3, heads_b, D] f32; bias2d: tq = [heads_b, (2h-1)(2w-1)]. Unused ones may be any buffer.
// partial: the tiled kernel's per-split results when A.key_splits > 1 (see attn_tiled_merge).
#define ATTN_PARAMS                                                                                 \
    const __half *__restrict__ q, const __half *__restrict__ k, const __half *__restrict__ v,       \
        __half *__restrict__ out, const u32 *__restrict__ order, const u32 *__restrict__ win_of,    \
        const u32 *__restrict__ offsets, const u32 *__restrict__ quant, const float *__restrict__ pos, \
        const float *__restrict__ tq, const float *__restrict__ tk, const float *__restrict__ tv,   \
        float *__restrict__ partial, const u32 *__restrict__ items, AttnParams A
#define ATTN_ARGS q, k, v, out, order, win_of, offsets, quant, pos, tq, tk, tv, partial, items, A

template <int D>
__device__ __forceinline__ void load_row(const __half* p, float* r) {
    const uint4* p4 = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
        const uint4 u = __ldg(p4 + c);
        const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float2 f = __half22float2(h[e]);
            r[c * 8 + 2 * e] = f.x;
            r[c * 8 + 2 * e + 1] = f.y;
        }
    }
}

__device__ __forceinline__ int unpack10(u32 p, int a) { return (int)((p >> (10 * a)) & 1023u); }

// One thread per (sorted query position, head): online softmax over the keys of its window,
// FP32 accumulation, RPE table rows read per pair (tables are small and stay in L1). Used for the
// small windows (most cubic ones): below `tiled_min` voxels.
template <int D, int MODE>
__device__ void attention_impl(ATTN_PARAMS) {
    const u32 p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= A.n) return;
    const u32 hb = blockIdx.y;
    const u32 h = A.head0 + hb;
    const u32 i = order[p];
    const u32 w = win_of[p];
    const u32 s = offsets[w], e = offsets[w + 1];
    if (e - s >= A.tiled_min) return;  // attention_tiled_impl's window

    float qi[D], acc[D];
    load_row<D>(q + (u64)i * A.ld + h * D, qi);
#pragma unroll
    for (int c = 0; c < D; ++c) acc[c] = 0.0f;
    float m = -__int_as_float(0x7f800000), l = 0.0f;  // -inf
    u32 quant_i = 0;
    float r_i = 0.0f;
    if (MODE != MODE_PLAIN) quant_i = quant[i];
    if (MODE == MODE_CONTEXTUAL && A.split) r_i = pos[(u64)i * 3 + 2];
    const int hi = A.rows - 1;

    for (u32 jp = s; jp < e; ++jp) {
        const u32 j = order[jp];
        float kj[D];
        load_row<D>(k + (u64)j * A.ld + h * D, kj);
        float logit = 0.0f;
#pragma unroll
        for (int c = 0; c < D; ++c) logit += qi[c] * kj[c];
        int idx[3] = {0, 0, 0};
        if (MODE == MODE_CONTEXTUAL) {
            const u32 quant_j = quant[j];
#pragma unroll
            for (int a = 0; a < 3; ++a) idx[a] = unpack10(quant_i, a) - unpack10(quant_j, a) + A.grid_length - 1;
            if (A.split) idx[2] = exponential_split(r_i - pos[(u64)j * 3 + 2], A.a) + 24;
#pragma unroll
            for (int a = 0; a < 3; ++a) idx[a] = idx[a] < 0 ? 0 : (idx[a] > hi ? hi : idx[a]);
            // the three table rows of each table, summed once (16-byte loads: rows are 64-byte aligned)
            float tqs[D], tks[D];
#pragma unroll
            for (int c = 0; c < D; ++c) tqs[c] = tks[c] = 0.0f;
#pragma unroll
            for (int a = 0; a < 3; ++a) {
                const float4* rq = reinterpret_cast<const float4*>(tq + ((u64)(idx[a] * 3 + a) * A.heads_b + hb) * D);
                const float4* rk = reinterpret_cast<const float4*>(tk + ((u64)(idx[a] * 3 + a) * A.heads_b + hb) * D);
#pragma unroll
                for (int c = 0; c < D / 4; ++c) {
                    const float4 x = __ldg(rq + c), y = __ldg(rk + c);
                    tqs[4 * c] += x.x; tqs[4 * c + 1] += x.y; tqs[4 * c + 2] += x.z; tqs[4 * c + 3] += x.w;
                    tks[4 * c] += y.x; tks[4 * c + 1] += y.y; tks[4 * c + 2] += y.z; tks[4 * c + 3] += y.w;
                }
            }
#pragma unroll
            for (int c = 0; c < D; ++c) logit += qi[c] * tqs[c] + kj[c] * tks[c];
        } else if (MODE == MODE_BIAS2D) {
            const u32 pj = quant[j];
            int dr = (int)(quant_i >> 16) - (int)(pj >> 16) + A.win_h - 1;
            int dc = (int)(quant_i & 0xffffu) - (int)(pj & 0xffffu) + A.win_w - 1;
            dr = dr < 0 ? 0 : (dr > 2 * A.win_h - 2 ? 2 * A.win_h - 2 : dr);
            dc = dc < 0 ? 0 : (dc > 2 * A.win_w - 2 ? 2 * A.win_w - 2 : dc);
            const int tl = (2 * A.win_h - 1) * (2 * A.win_w - 1);
            logit += __ldg(tq + (u64)hb * tl + dr * (2 * A.win_w - 1) + dc);
        }
        // online softmax: rescale what was accumulated when the running max grows
        if (logit > m) {
            const float scale = __expf(m - logit);  // 0 on the first key (m = -inf)
            l *= scale;
#pragma unroll
            for (int c = 0; c < D; ++c) acc[c] *= scale;
            m = logit;
        }
        const float pw = __expf(logit - m);
        l += pw;
        float vj[D];
        load_row<D>(v + (u64)j * A.ld + h * D, vj);
        if (MODE == MODE_CONTEXTUAL) {
#pragma unroll
            for (int a = 0; a < 3; ++a) {
                const float4* rv = reinterpret_cast<const float4*>(tv + ((u64)(idx[a] * 3 + a) * A.heads_b + hb) * D);
#pragma unroll
                for (int c = 0; c < D / 4; ++c) {
                    const float4 x = __ldg(rv + c);
                    vj[4 * c] += x.x; vj[4 * c + 1] += x.y; vj[4 * c + 2] += x.z; vj[4 * c + 3] += x.w;
                }
            }
        }
#pragma unroll
        for (int c = 0; c < D; ++c) acc[c] += pw * vj[c];
    }
    const float inv = 1.0f / l;
    __half* o = out + (u64)i * A.out_ld + h * D;
#pragma unroll
    for (int c = 0; c < D; c += 2) {
        reinterpret_cast<__half2*>(o)[c / 2] = __floats2half2_rn(acc[c] * inv, acc[c + 1] * inv);
    }
}

#define ATTN_KERNEL(D, MODE, NAME) \
    extern "C" __global__ void __launch_bounds__(128) NAME(ATTN_PARAMS) { attention_impl<D, MODE>(ATTN_ARGS); }

ATTN_KERNEL(16, MODE_PLAIN, attn_plain_d16)
ATTN_KERNEL(32, MODE_PLAIN, attn_plain_d32)
ATTN_KERNEL(64, MODE_PLAIN, attn_plain_d64)
ATTN_KERNEL(16, MODE_CONTEXTUAL, attn_ctx_d16)
ATTN_KERNEL(32, MODE_CONTEXTUAL, attn_ctx_d32)
ATTN_KERNEL(64, MODE_CONTEXTUAL, attn_ctx_d64)
ATTN_KERNEL(16, MODE_BIAS2D, attn_bias2d_d16)
ATTN_KERNEL(32, MODE_BIAS2D, attn_bias2d_d32)
ATTN_KERNEL(64, MODE_BIAS2D, attn_bias2d_d64)

// ---- Window-tiled kernel (contextual RPE, large windows) -----------------------------------
//
// A block = TQ queries of one window (one thread each) and one head; it walks the window's keys
// in tiles of TK staged in shared memory. The RPE terms are split so that nothing per pair
// touches a table row:
//   q_i . tq[row(i, j, a), a]: for an unsplit axis the row is clamp(qa_i - qa_j + L - 1), a
//     function of the key's quantized coordinate qa_j in 0..=L, so each query precomputes QB =
//     L + 2 values per axis (one spare bin); for the radial split axis the row is any of the
//     table's rows, so it precomputes all of them;
//   k_j . tk[row, a]: each tile precomputes it for every (row, axis) of its keys;
//   (v_j + tv rows) weighted by p: sum p * v_j directly, and per query a histogram of p over the
//     same bins, multiplied into the tv rows once at the end.
// Per pair that leaves q.k, p.v and six shared-memory lookups plus three histogram updates.
// Online softmax with a lazy maximum: accumulators are rescaled only when a logit exceeds the
// reference maximum by more than RESCALE_SLACK (e^8 stays far from float overflow), which keeps
// the histogram rescales rare; acc / l is the same quantity for any reference maximum.
#define TQ 64
#define TK 32
#define RESCALE_SLACK 8.0f

template <int D>
__device__ __forceinline__ float dot_table_row(const float* qi, const float* row) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < D / 4; ++c) {
        const float4 x = __ldg(r4 + c);
        s += qi[4 * c] * x.x + qi[4 * c + 1] * x.y + qi[4 * c + 2] * x.z + qi[4 * c + 3] * x.w;
    }
    return s;
}

template <int D>
__device__ __forceinline__ void add_table_row(float* acc, float wgt, const float* row) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
#pragma unroll
    for (int c = 0; c < D / 4; ++c) {
        const float4 x = __ldg(r4 + c);
        acc[4 * c] += wgt * x.x;
        acc[4 * c + 1] += wgt * x.y;
        acc[4 * c + 2] += wgt * x.z;
        acc[4 * c + 3] += wgt * x.w;
    }
}

__device__ __forceinline__ int clamp_row(int r, int hi) { return r < 0 ? 0 : (r > hi ? hi : r); }

// Shared-memory strides (floats), odd so that rows of consecutive threads fall in different banks.
__device__ __forceinline__ int odd_stride(int n) { return n | 1; }

template <int D>
__device__ void attention_tiled_impl(ATTN_PARAMS) {
    extern __shared__ float smem[];
    // blockIdx.x = a work item: (window, query chunk) of a tiled window (attn_tiled_items), so no
    // block is spent on the per-query kernel's windows; blockIdx.y = key split: a split walks its
    // own slice of the keys (whole tiles) and leaves an unnormalised partial result.
    if (blockIdx.x >= items[0]) return;
    const u32 w = items[1 + blockIdx.x];
    const u32 s = offsets[w], e = offsets[w + 1];
    const u32 split = blockIdx.y;
    const u32 q0 = s + items[1 + A.items_cap + blockIdx.x] * TQ;
    const u32 span = ((e - s + A.key_splits - 1) / A.key_splits + TK - 1) / TK * TK;
    const u32 kb = min(e, s + split * span), ke = min(e, kb + span);
    const u32 hb = blockIdx.z;
    const u32 h = A.head0 + hb;
    const int L = A.grid_length, rows = A.rows, hi = rows - 1;
    const int QB = L + 2;                                 // bins of an unsplit axis (qa in 0..=L, one spare)
    const int unsplit = A.split ? 2 : 3;
    const int S = unsplit * QB + (A.split ? rows : 0);   // per-query entries
    const int QS = odd_stride(S);
    const int E = rows * 3;                               // per-key entries: (row, axis) as in the tables
    const int KS = odd_stride(E);
    float* qt = smem;                                     // [TQ][QS] q . tq per bin
    float* hist = qt + TQ * QS;                           // [TQ][QS] sum of p per bin
    float* kt = hist + TQ * QS;                           // [TK][KS] k . tk per (row, axis)
    float* kf = kt + TK * KS;                             // [TK][D] keys of the tile
    float* vf = kf + TK * D;                              // [TK][D] values of the tile
    u32* kq = reinterpret_cast<u32*>(vf + TK * D);        // [TK] packed quantized positions
    float* kr = reinterpret_cast<float*>(kq + TK);        // [TK] radii (split axis)

    const u32 t = threadIdx.x;
    const bool active = q0 + t < e;
    float qi[D], acc[D];
    int qa[3] = {0, 0, 0};
    float r_i = 0.0f;
    u32 i = 0;
    if (active) {
        i = order[q0 + t];
        load_row<D>(q + (u64)i * A.ld + h * D, qi);
        const u32 p = quant[i];
#pragma unroll
        for (int a = 0; a < 3; ++a) qa[a] = unpack10(p, a);
        if (A.split) r_i = pos[(u64)i * 3 + 2];
    } else {
#pragma unroll
        for (int c = 0; c < D; ++c) qi[c] = 0.0f;
    }
    float* my_qt = qt + t * QS;
    float* my_hist = hist + t * QS;
    for (int a = 0; a < unsplit; ++a) {
        for (int b = 0; b < QB; ++b) {
            const int r = clamp_row(qa[a] - b + L - 1, hi);
            my_qt[a * QB + b] = dot_table_row<D>(qi, tq + ((u64)(r * 3 + a) * A.heads_b + hb) * D);
            my_hist[a * QB + b] = 0.0f;
        }
    }
    if (A.split) {
        for (int r = 0; r < rows; ++r) {
            my_qt[2 * QB + r] = dot_table_row<D>(qi, tq + ((u64)(r * 3 + 2) * A.heads_b + hb) * D);
            my_hist[2 * QB + r] = 0.0f;
        }
    }
#pragma unroll
    for (int c = 0; c < D; ++c) acc[c] = 0.0f;
    float m = -__int_as_float(0x7f800000), l = 0.0f;  // -inf
    const u32 my_key = t % TK;                         // the key whose k . tk this thread fills

    for (u32 ks = kb; ks < ke; ks += TK) {
        const u32 nk = min((u32)TK, ke - ks);
        __syncthreads();  // the previous tile is no longer read
        for (u32 x = t; x < TK * (D / 8); x += TQ) {
            const u32 jj = x / (D / 8), c8 = x % (D / 8);
            if (jj < nk) {
                const u32 j = order[ks + jj];
                const uint4 uk = __ldg(reinterpret_cast<const uint4*>(k + (u64)j * A.ld + h * D) + c8);
                const uint4 uv = __ldg(reinterpret_cast<const uint4*>(v + (u64)j * A.ld + h * D) + c8);
                const __half2* hk = reinterpret_cast<const __half2*>(&uk);
                const __half2* hv = reinterpret_cast<const __half2*>(&uv);
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const float2 fk = __half22float2(hk[c]), fv = __half22float2(hv[c]);
                    kf[jj * D + c8 * 8 + 2 * c] = fk.x;
                    kf[jj * D + c8 * 8 + 2 * c + 1] = fk.y;
                    vf[jj * D + c8 * 8 + 2 * c] = fv.x;
                    vf[jj * D + c8 * 8 + 2 * c + 1] = fv.y;
                }
            }
        }
        if (t < nk) {
            const u32 j = order[ks + t];
            kq[t] = quant[j];
            kr[t] = A.split ? pos[(u64)j * 3 + 2] : 0.0f;
        }
        // k . tk for every (row, axis): the lanes of a warp take consecutive keys and the same
        // table row (a broadcast load); the key row comes from global memory (just read, in L2).
        if (my_key < nk) {
            float kj[D];
            load_row<D>(k + (u64)order[ks + my_key] * A.ld + h * D, kj);
            for (int x = t / TK; x < E; x += TQ / TK) {
                kt[my_key * KS + x] = dot_table_row<D>(kj, tk + ((u64)x * A.heads_b + hb) * D);
            }
        }
        __syncthreads();
        if (!active) continue;
        for (u32 jj = 0; jj < nk; ++jj) {
            const float4* k4 = reinterpret_cast<const float4*>(kf + jj * D);
            float logit = 0.0f;
#pragma unroll
            for (int c = 0; c < D / 4; ++c) {
                const float4 x = k4[c];
                logit += qi[4 * c] * x.x + qi[4 * c + 1] * x.y + qi[4 * c + 2] * x.z + qi[4 * c + 3] * x.w;
            }
            const u32 pj = kq[jj];
            const int b0 = unpack10(pj, 0), b1 = unpack10(pj, 1);
            const int r0 = clamp_row(qa[0] - b0 + L - 1, hi), r1 = clamp_row(qa[1] - b1 + L - 1, hi);
            int r2, bin2;
            if (A.split) {
                r2 = clamp_row(exponential_split(r_i - kr[jj], A.a) + 24, hi);
                bin2 = 2 * QB + r2;
            } else {
                const int b2 = unpack10(pj, 2);
                r2 = clamp_row(qa[2] - b2 + L - 1, hi);
                bin2 = 2 * QB + b2;
            }
            const float* ktj = kt + jj * KS;
            logit += (my_qt[b0] + my_qt[QB + b1] + my_qt[bin2]) + (ktj[r0 * 3] + ktj[r1 * 3 + 1] + ktj[r2 * 3 + 2]);
            if (logit > m + RESCALE_SLACK) {  // also the first key (m = -inf)
                const float scale = __expf(m - logit);
                if (l != 0.0f) {
                    l *= scale;
#pragma unroll
                    for (int c = 0; c < D; ++c) acc[c] *= scale;
                    for (int x = 0; x < S; ++x) my_hist[x] *= scale;
                }
                m = logit;
            }
            const float pw = __expf(logit - m);
            l += pw;
            my_hist[b0] += pw;
            my_hist[QB + b1] += pw;
            my_hist[bin2] += pw;
            const float4* v4 = reinterpret_cast<const float4*>(vf + jj * D);
#pragma unroll
            for (int c = 0; c < D / 4; ++c) {
                const float4 x = v4[c];
                acc[4 * c] += pw * x.x;
                acc[4 * c + 1] += pw * x.y;
                acc[4 * c + 2] += pw * x.z;
                acc[4 * c + 3] += pw * x.w;
            }
        }
    }
    if (!active) return;
    // the value table, once: sum over bins of (sum of p in the bin) * tv[row of the bin]
    for (int a = 0; a < unsplit; ++a) {
        for (int b = 0; b < QB; ++b) {
            const float wgt = my_hist[a * QB + b];
            if (wgt == 0.0f) continue;
            const int r = clamp_row(qa[a] - b + L - 1, hi);
            add_table_row<D>(acc, wgt, tv + ((u64)(r * 3 + a) * A.heads_b + hb) * D);
        }
    }
    if (A.split) {
        for (int r = 0; r < rows; ++r) {
            const float wgt = my_hist[2 * QB + r];
            if (wgt == 0.0f) continue;
            add_table_row<D>(acc, wgt, tv + ((u64)(r * 3 + 2) * A.heads_b + hb) * D);
        }
    }
    if (A.key_splits > 1) {
        // [split][sorted position][head of the call][D + 2]: acc, reference maximum, sum
        float* pr = partial + (((u64)split * A.n + q0 + t) * A.heads_b + hb) * (D + 2);
#pragma unroll
        for (int c = 0; c < D; ++c) pr[c] = acc[c];
        pr[D] = m;
        pr[D + 1] = l;
        return;
    }
    const float inv = 1.0f / l;
    __half* o = out + (u64)i * A.out_ld + h * D;
#pragma unroll
    for (int c = 0; c < D; c += 2) {
        reinterpret_cast<__half2*>(o)[c / 2] = __floats2half2_rn(acc[c] * inv, acc[c + 1] * inv);
    }
}

// The tiled kernel's work list, step 1: per window, its query chunks if it is a tiled window.
extern "C" __global__ void attn_tiled_chunks(const u32* __restrict__ offsets, u32 windows, u32 tiled_min,
                                             u32* __restrict__ chunks) {
    const u32 w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w >= windows) return;
    const u32 size = offsets[w + 1] - offsets[w];
    chunks[w] = size >= tiled_min ? (size + TQ - 1) / TQ : 0u;
}

// Step 2, after an exclusive scan of the chunks (start[w]; scan_sums[ntiles] = the total):
// items = [count][window of each item (cap)][chunk of each item (cap)].
extern "C" __global__ void attn_tiled_items(const u32* __restrict__ chunks, const u32* __restrict__ start,
                                            const u32* __restrict__ scan_sums, u32 ntiles, u32 windows, u32 cap,
                                            u32* __restrict__ items) {
    const u32 w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w == 0) items[0] = scan_sums[ntiles];
    if (w >= windows) return;
    for (u32 c = 0; c < chunks[w]; ++c) {
        items[1 + start[w] + c] = w;
        items[1 + cap + start[w] + c] = c;
    }
}

// Combines the tiled kernel's key splits for every query of a tiled window: with M the largest
// reference maximum, out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M). One thread per
// (sorted position, head of the call); head_dim d <= 32.
extern "C" __global__ void attn_tiled_merge(const float* __restrict__ partial, const u32* __restrict__ order,
                                            const u32* __restrict__ win_of, const u32* __restrict__ offsets,
                                            AttnParams A, u32 d, __half* __restrict__ out) {
    const u64 x = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (u64)A.n * A.heads_b) return;
    const u32 p = (u32)(x / A.heads_b), hb = (u32)(x % A.heads_b);
    const u32 w = win_of[p];
    if (offsets[w + 1] - offsets[w] < A.tiled_min) return;  // a per-query window
    const u64 stride = (u64)A.n * A.heads_b * (d + 2);
    const float* pr = partial + ((u64)p * A.heads_b + hb) * (d + 2);
    float mx = -__int_as_float(0x7f800000);
    for (u32 sp = 0; sp < A.key_splits; ++sp) {
        const float* ps = pr + sp * stride;
        if (ps[d + 1] > 0.0f) mx = fmaxf(mx, ps[d]);
    }
    float acc[32], l = 0.0f;
    for (u32 c = 0; c < d; ++c) acc[c] = 0.0f;
    for (u32 sp = 0; sp < A.key_splits; ++sp) {
        const float* ps = pr + sp * stride;
        if (!(ps[d + 1] > 0.0f)) continue;
        const float wgt = __expf(ps[d] - mx);
        l += ps[d + 1] * wgt;
        for (u32 c = 0; c < d; ++c) acc[c] += ps[c] * wgt;
    }
    const float inv = 1.0f / l;
    __half* o = out + (u64)order[p] * A.out_ld + (A.head0 + hb) * d;
    for (u32 c = 0; c < d; ++c) o[c] = __float2half_rn(acc[c] * inv);
}

#define ATTN_TILED_KERNEL(D, NAME) \
    extern "C" __global__ void __launch_bounds__(TQ) NAME(ATTN_PARAMS) { attention_tiled_impl<D>(ATTN_ARGS); }

ATTN_TILED_KERNEL(16, attn_ctx_tiled_d16)
ATTN_TILED_KERNEL(32, attn_ctx_tiled_d32)
