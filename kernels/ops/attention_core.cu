// Window attention kernels (see src/attention/cuda.rs): the per-query kernel for small windows
// and, for the contextual RPE on large windows, the window-tiled kernel.
//
// Compiled with FMA contraction on: this is arithmetic-bound code. The one step that must round
// as PyTorch's op-by-op float32 does, the radial exponential split (its bin edges), is written
// with __fmul_rn / __fadd_rn, which are never contracted.

#define LN2_F 0.693147180559945309417f

// floor(log(x) / ln 2) rounded as PyTorch computes it (logf, then a float multiply), for x >= 1.
// Away from powers of two that is the exponent of x: with x's mantissa m in [2^-11, 2 - 2^-11),
// log2(x) sits at least 3.5e-4 from an integer, and the computed quotient is within 3e-5 of it
// (logf is within 1 ulp, plus two roundings). Within 2^-11 of a power of two the rounding may
// decide, so those x (one in a thousand) take the logf path itself.
// FAST = false: always the logf path (kept for the GPU test that compares the two).
template <bool FAST>
__device__ __forceinline__ float floor_log2_torch(float x) {
    const int bits = __float_as_int(x);
    const int mant = bits & 0x7fffff;
    if (!FAST || mant < 0x1000 || mant > 0x7ff000 || bits >= 0x7f800000) return floorf(__fmul_rn(logf(x), 1.0f / LN2_F));
    return (float)((bits >> 23) - 127);
}

// SphereFormer's exponential_split for one pair, op by op (see src/attention/rpe.rs).
template <bool FAST = true>
__device__ __forceinline__ int exponential_split(float d, float a) {
    const float ad = fabsf(d);
    const float flag = d >= 0.0f ? 1.0f : 0.0f;
    const float x = __fmul_rn(__fadd_rn(ad, (float)(2.0 * (double)a)), 1.0f / a);  // >= 2 (rounded)
    float idx = __fadd_rn(__fmul_rn(2.0f, floor_log2_torch<FAST>(x)), -2.0f);
    // idx is an even integer: its floor division by 2 is exact, and 2^half a power of two (what
    // torch.div(rounding_mode='floor') and exp2 give for it, without their general-case cost)
    const float half = __fmul_rn(idx, 0.5f);
    const float pow2 = __int_as_float((127 + max(-126, min(127, (int)half))) << 23);
    const float edge = __fmul_rn(__fadd_rn(__fmul_rn(3.0f, pow2), -2.0f), a);
    if (edge <= ad) idx += 1.0f;
    idx = __fadd_rn(__fmul_rn(idx, 2.0f * flag - 1.0f), flag - 1.0f);  // small integers: exact
    return (int)idx;
}

// exponential_split of n distances as the kernels compute it (out[2i]) and on the logf path
// alone (out[2i + 1]), for the GPU test.
extern "C" __global__ void attn_exponential_split(const float* __restrict__ d, u32 n, float a, int* __restrict__ out) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[2 * i] = exponential_split<true>(d[i], a);
    out[2 * i + 1] = exponential_split<false>(d[i], a);
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
    // packed-qkv whole-window kernel (attn_bias2d_win_tc_packed_d*): q, k and v are one buffer,
    // k and v at these element offsets of each row; q is multiplied by q_scale as it is staged;
    // the qkv values read are guarded under range layer in_layer. 0 / 1.0 / 0 otherwise.
    u32 k_off, v_off;
    float q_scale;
    u32 in_layer;
};

// Buffers of one call. quant: contextual = packed quantized positions, bias2d = (row << 16 | col).
// pos: contextual with split = positions [n, 3] (the radius is column 2). tq/tk/tv: contextual =
// [rows, 3, heads_b, D] f32; bias2d: tq = [heads_b, (2h-1)(2w-1)]. Unused ones may be any buffer.
// partial: the tiled kernel's per-split results when A.key_splits > 1 (see attn_tiled_merge).
// range_flags (may be NULL), range_layer: the FP16 range guard (prelude.cuh) of the stored output.
#define ATTN_PARAMS                                                                                 \
    const store_t *__restrict__ q, const store_t *__restrict__ k, const store_t *__restrict__ v,       \
        store_t *__restrict__ out, const u32 *__restrict__ order, const u32 *__restrict__ win_of,    \
        const u32 *__restrict__ offsets, const u32 *__restrict__ quant, const float *__restrict__ pos, \
        const float *__restrict__ tq, const float *__restrict__ tk, const float *__restrict__ tv,   \
        float *__restrict__ partial, const u32 *__restrict__ items, AttnParams A,                   \
        u32 *__restrict__ range_flags, u32 range_layer
#define ATTN_ARGS q, k, v, out, order, win_of, offsets, quant, pos, tq, tk, tv, partial, items, A, range_flags, range_layer

// Row p[0..D) as floats, by 16-byte loads (8 FP16/BF16 values or 4 FP32 ones each).
template <int D>
__device__ __forceinline__ void load_row(const store_t* p, float* r) {
    constexpr int PER_LOAD = 16 / sizeof(store_t);
    const uint4* p4 = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int c = 0; c < D / PER_LOAD; ++c) {
        const uint4 u = __ldg(p4 + c);
        const store2_t* h = reinterpret_cast<const store2_t*>(&u);
#pragma unroll
        for (int e = 0; e < PER_LOAD / 2; ++e) {
            const float2 f = store2_to_float2(h[e]);
            r[c * PER_LOAD + 2 * e] = f.x;
            r[c * PER_LOAD + 2 * e + 1] = f.y;
        }
    }
}

__device__ __forceinline__ int unpack10(u32 p, int a) { return (int)((p >> (10 * a)) & 1023u); }

// QUERY_LANES consecutive lanes per (sorted query position, head), each walking every
// QUERY_LANES-th key of the window with its own online softmax (FP32 accumulation, RPE table rows
// read per pair: the tables are small and stay in L1); the lanes' partial results are merged by
// shuffles at the end. Used for the small windows (most cubic ones): below `tiled_min` voxels.
// Several lanes per query give the GPU 4x the independent key walks, each 4x shorter: these
// windows are latency-bound (a dependent chain of loads per key), not throughput-bound.
#define QUERY_LANES 4
template <int D, int MODE>
__device__ void attention_impl(ATTN_PARAMS) {
    const u32 x = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 p = x / QUERY_LANES, sub = x % QUERY_LANES;
    if (p >= A.n) return;  // the query's lanes leave together
    const u32 hb = blockIdx.y;
    const u32 h = A.head0 + hb;
    const u32 i = order[p];
    const u32 w = win_of[p];
    const u32 s = offsets[w], e = offsets[w + 1];
    if (e - s >= A.tiled_min) return;  // attention_tiled_impl's window (all the query's lanes)
    const u32 lanes = ((1u << QUERY_LANES) - 1u) << (threadIdx.x & 31u & ~(QUERY_LANES - 1u));

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

    for (u32 jp = s + sub; jp < e; jp += QUERY_LANES) {
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
    // merge the lanes: common maximum, rescaled sums (a lane without keys has l = 0, m = -inf)
    float mq = m;
#pragma unroll
    for (u32 d = 1; d < QUERY_LANES; d <<= 1) mq = fmaxf(mq, __shfl_xor_sync(lanes, mq, d));
    const float scale = l > 0.0f ? __expf(m - mq) : 0.0f;
    l *= scale;
#pragma unroll
    for (u32 d = 1; d < QUERY_LANES; d <<= 1) l += __shfl_xor_sync(lanes, l, d);
#pragma unroll
    for (int c = 0; c < D; ++c) {
        acc[c] *= scale;
#pragma unroll
        for (u32 d = 1; d < QUERY_LANES; d <<= 1) acc[c] += __shfl_xor_sync(lanes, acc[c], d);
    }
    // each lane writes its quarter of the row
    const float inv = 1.0f / l;
    store2_t* o = reinterpret_cast<store2_t*>(out + (u64)i * A.out_ld + h * D);
    u32 bits = 0;
#pragma unroll
    for (int c = 0; c < D; c += 2) {
        if ((c / 2) % QUERY_LANES == (int)sub) {
            const float y0 = acc[c] * inv, y1 = acc[c + 1] * inv;
            bits |= store_range_bits(y0) | store_range_bits(y1);
            o[c / 2] = store2_from_floats(y0, y1);
        }
    }
    range_flag(range_flags, range_layer, bits);
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

// ---- Window-tiled kernel on tensor cores (contextual RPE, large windows) --------------------
//
// A block = 4 warps = TQ queries (16 a warp) of one window chunk and one head; it walks the
// window's keys in tiles of TK staged in shared memory (K row-major, V transposed, both stored
// as store_t: FP16, or BF16 in the BF16 build, storage.cuh).
// Per tile and warp, on tensor cores (mma.sync m16n8k16, FP32 accumulation):
//   S = Q K^T; O += P V; for each unsplit axis a, Hist_a += P x onehot(key bin on a), the
//   probabilities summed per key-coordinate bin (bins 0..=L, HIST_TILES * 8 columns);
//   and once per tile for the whole block, k_j . tk[e] for every key j and table entry
//   e = (row, axis), with the f32 table split into store_t high and low halves (two MMAs: close
//   to f32 accuracy for FP16, 16 significant bits for BF16, more than the stored keys have).
// The RPE logit terms need, per pair, only shared-memory lookups:
//   q_i . tq[row(i, j, a), a]: for an unsplit axis the row is clamp(qa_i - qa_j + L - 1), a
//     function of the key's quantized coordinate qa_j in 0..=L, so each query precomputes QB =
//     L + 1 values per axis; for the radial split axis the row is any of the table's rows, so it
//     precomputes all of them;
//   k_j . tk[row, a]: looked up in the tile's table above.
// The value table enters once per query at the end: sum over bins of (probability mass in the
// bin) * tv[row of the bin]. The radial split axis' bin depends on the pair, so its histogram is
// kept in shared memory, in fixed point, and updated with integer atomics.
// P enters the MMAs rounded to store_t and the row sum uses the same rounded values, so the output
// is an exact convex combination of (v + tv) rows with weights off by at most 2^-11 relative
// (FP16; 2^-8 in the BF16 build).
// Online softmax with a lazy maximum: accumulators are rescaled only when a logit exceeds the
// reference maximum by more than RESCALE_SLACK (e^8 stays far inside FP16's range for P), which
// keeps rescales rare; acc / l is the same quantity for any reference. The split-axis kernel
// rescales on every new maximum instead (SPLIT_RESCALE_SLACK), so that P <= 1 bounds its
// fixed-point radial histogram.
#define TQ 64
#define TK 32
#define TILED_THREADS 128
#define HIST_TILES 4
#define RESCALE_SLACK 8.0f
#define SPLIT_RESCALE_SLACK 0.0f

#if STORE_TENSOR_CORES  // the FP32 build (storage.cuh) has the per-query kernels only

template <int D>
__device__ __forceinline__ float dot_table_row(const float* qi, const float* row) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < D / 4; ++c) {
        const float4 x = r4[c];
        s += qi[4 * c] * x.x + qi[4 * c + 1] * x.y + qi[4 * c + 2] * x.z + qi[4 * c + 3] * x.w;
    }
    return s;
}

template <int D>
__device__ __forceinline__ void add_table_row(float* acc, float wgt, const float* row) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
#pragma unroll
    for (int c = 0; c < D / 4; ++c) {
        const float4 x = r4[c];
        acc[4 * c] += wgt * x.x;
        acc[4 * c + 1] += wgt * x.y;
        acc[4 * c + 2] += wgt * x.z;
        acc[4 * c + 3] += wgt * x.w;
    }
}

__device__ __forceinline__ int clamp_row(int r, int hi) { return r < 0 ? 0 : (r > hi ? hi : r); }

// Shared-memory strides (floats), odd so that rows of consecutive lanes fall in different banks.
__device__ __forceinline__ int odd_stride(int n) { return n | 1; }

__device__ __forceinline__ u32 half2_bits(store2_t h) { return *reinterpret_cast<u32*>(&h); }
__device__ __forceinline__ u32 shared_u32(const store_t* p) { return *reinterpret_cast<const u32*>(p); }

// f32 pair -> FP16 high halves and the FP16 rounding of what they leave (hi + lo ~ x to ~2^-22).
__device__ __forceinline__ void split_hi_lo(float2 x, u32& hi, u32& lo) {
    const store2_t h = store2_from_floats(x.x, x.y);
    const float2 back = store2_to_float2(h);
    hi = half2_bits(h);
    lo = half2_bits(store2_from_floats(x.x - back.x, x.y - back.y));
}

// 1.0 (as stored: FP16 or BF16) in the low / high half when the key's bin is this lane's
// histogram column.
__device__ __forceinline__ u32 onehot_pair(int bin_lo, int bin_hi, int col) {
    return (bin_lo == col ? STORE_ONE_BITS : 0u) | (bin_hi == col ? STORE_ONE_BITS << 16 : 0u);
}

// Shared-memory layout of the tiled kernel, in floats then halves (mirrored by
// tiled_smem_bytes in src/attention/cuda.rs): tab [E][D] (this head's table: tq while the
// per-query values are computed, tk as FP16 high and low halves during the tiles, tv at the
// end), qt [TQ][QS], h2 [TQ][RS]
// (split only), kt [KT_LEN] (the tile's k . tk, [TK][KS]; after the last tile, per-warp scratch
// of [16][D + 2]), kq [TK], kr [TK], then from a 16-byte boundary the keys [TK][D + 8] and
// values [D][TK + 8].
struct TiledLayout {
    int QB, S, QS, E, KS, RS, TAB, KT_LEN, HALF_AT;
    __device__ TiledLayout(int L, int rows, bool split, int d) {
        QB = L + 1;
        S = (split ? 2 : 3) * QB + (split ? rows : 0);
        QS = odd_stride(S);
        E = 3 * rows;
        KS = odd_stride(E);
        RS = odd_stride(rows);
        TAB = E * d;
        KT_LEN = max(TK * KS, TQ * (d + 2));
        HALF_AT = (TAB + TQ * QS + (split ? TQ * RS : 0) + KT_LEN + 2 * TK + 3) & ~3;
    }
};

// Copies this head's rows of a [E, heads_b, D] table into tab [E][D] (float4 per thread).
template <int D>
__device__ __forceinline__ void stage_table(float* tab, const float* table, int E, u32 heads_b, u32 hb) {
    for (int x = threadIdx.x; x < E * (D / 4); x += TILED_THREADS) {
        const int e = x / (D / 4), c4 = x % (D / 4);
        reinterpret_cast<float4*>(tab)[x] = __ldg(reinterpret_cast<const float4*>(table + ((u64)e * heads_b + hb) * D) + c4);
    }
}

// Copies this head's rows of a [E, heads_b, D] f32 table into FP16 high halves [E][D] and the
// halves of what they leave [E][D] (hi + lo ~ the f32 value to ~2^-22), the B operand of the
// tile's k . tk MMAs.
template <int D>
__device__ __forceinline__ void stage_table_hi_lo(store_t* tab, const float* table, int E, u32 heads_b, u32 hb) {
    for (int x = threadIdx.x; x < E * (D / 2); x += TILED_THREADS) {
        const int e = x / (D / 2), c2 = x % (D / 2);
        u32 hi, lo;
        split_hi_lo(__ldg(reinterpret_cast<const float2*>(table + ((u64)e * heads_b + hb) * D) + c2), hi, lo);
        reinterpret_cast<u32*>(tab)[x] = hi;
        reinterpret_cast<u32*>(tab + E * D)[x] = lo;
    }
}

// Adds one query row's probabilities (this lane's two keys) to its radial-row histogram (split
// axis), in fixed point: p * scale rounded to an integer. Shared-memory integer atomics are one
// instruction each; float ones are compare-and-swap loops, which cost a quarter of the kernel's
// time when this was a float histogram.
__device__ __forceinline__ void radial_hist_add(u32* row, int b0, int b1, float p0, float p1, float scale) {
    atomicAdd(row + b0, __float2uint_rn(p0 * scale));
    atomicAdd(row + b1, __float2uint_rn(p1 * scale));
}

// The radial histogram's fixed-point scale for a block that walks at most `span` keys: 2^k with
// span * max(P) * 2^k < 2^32 (max(P) = 1, see SPLIT_RESCALE_SLACK), at most 2^24, where every
// FP16 P is an integer. A span of 686 keys (the largest real spherical window) gives 2^22, so each
// add rounds by at most 2^-23 against a row sum of at least 1.
__device__ __forceinline__ float radial_hist_scale(u32 span) {
    const int bits = 32 - __clz((int)max(span, 1u));  // span < 2^bits
    const int k = min(24, 32 - bits);
    return __int_as_float((127 + k) << 23);
}

template <int D, bool SPLIT>
__device__ void attention_tiled_impl(ATTN_PARAMS) {
    extern __shared__ float smem[];
    constexpr int UNSPLIT = SPLIT ? 2 : 3;
    constexpr int KPAD = D + 8;   // halves per staged key row (bank-conflict-free fragment loads)
    constexpr int VPAD = TK + 8;  // halves per staged value column
    // blockIdx.x = a work item: (window, query chunk) of a tiled window (attn_tiled_items);
    // blockIdx.y = key split: a split walks its own slice of the keys (whole tiles) and leaves an
    // unnormalised partial result for attn_tiled_merge; blockIdx.z = head of the call.
    if (blockIdx.x >= items[0]) return;
    const u32 w = items[1 + blockIdx.x];
    const u32 s = offsets[w], e = offsets[w + 1];
    const u32 q0 = s + items[1 + A.items_cap + blockIdx.x] * TQ;
    const u32 span = ((e - s + A.key_splits - 1) / A.key_splits + TK - 1) / TK * TK;
    const u32 kb = min(e, s + blockIdx.y * span), ke = min(e, kb + span);
    const u32 hb = blockIdx.z;
    const u32 h = A.head0 + hb;
    const int L = A.grid_length, rows = A.rows, hi = rows - 1;
    const float hist_scale = radial_hist_scale(span), inv_hist_scale = 1.0f / hist_scale;
    const TiledLayout Y(L, rows, SPLIT, D);
    const int QB = Y.QB, QS = Y.QS, KS = Y.KS, RS = Y.RS, E = Y.E;
    float* tab = smem;                                  // [E][D] this head's tq, tk or tv
    float* qt = tab + Y.TAB;                            // [TQ][QS] q . tq per bin
    u32* h2 = reinterpret_cast<u32*>(qt + TQ * QS);     // [TQ][RS] radial-row histogram (split), fixed point
    float* kt = qt + TQ * QS + (SPLIT ? TQ * RS : 0);   // [TK][KS] k . tk per (row, axis)
    u32* kq = reinterpret_cast<u32*>(kt + Y.KT_LEN);    // [TK] packed quantized positions
    float* kr = reinterpret_cast<float*>(kq + TK);      // [TK] radii (split axis)
    store_t* ks = reinterpret_cast<store_t*>(smem + Y.HALF_AT);  // [TK][KPAD] keys
    store_t* vt = ks + TK * KPAD;                              // [D][VPAD] values, transposed

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

    // q . tq per bin for every query of the chunk (two threads a query), radial histogram zeroed
    stage_table<D>(tab, tq, E, A.heads_b, hb);
    __syncthreads();
    {
        const int ql = tid % TQ, part = tid / TQ;
        float qf[D];
        int qa[3] = {0, 0, 0};
        if (q0 + ql < e) {
            const u32 i = order[q0 + ql];
            load_row<D>(q + (u64)i * A.ld + h * D, qf);
            const u32 p = quant[i];
#pragma unroll
            for (int a = 0; a < 3; ++a) qa[a] = unpack10(p, a);
        } else {
#pragma unroll
            for (int c = 0; c < D; ++c) qf[c] = 0.0f;
        }
        float* my = qt + ql * QS;
        for (int en = part; en < Y.S; en += TILED_THREADS / TQ) {
            int a, r;
            if (en < UNSPLIT * QB) {
                a = en / QB;
                r = clamp_row(qa[a] - en % QB + L - 1, hi);
            } else {
                a = 2;
                r = en - UNSPLIT * QB;
            }
            my[en] = dot_table_row<D>(qf, tab + (r * 3 + a) * D);
        }
        if (SPLIT)
            for (int r = part; r < rows; r += TILED_THREADS / TQ) h2[ql * RS + r] = 0u;
    }

    // this lane's two query rows (g and g + 8 of the warp's 16) and their Q fragments
    const int rl0 = warp * 16 + g, rl1 = rl0 + 8;
    const bool warp_active = q0 + warp * 16 < e;
    int qa0[3] = {0, 0, 0}, qa1[3] = {0, 0, 0};
    float rad0 = 0.0f, rad1 = 0.0f;
    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) qf[kk][0] = qf[kk][1] = qf[kk][2] = qf[kk][3] = 0u;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int rl = r ? rl1 : rl0;
        if (q0 + rl >= e) continue;
        const u32 i = order[q0 + rl];
        const u32* qrow = reinterpret_cast<const u32*>(q + (u64)i * A.ld + h * D);
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            qf[kk][r] = __ldg(qrow + kk * 8 + t);
            qf[kk][2 + r] = __ldg(qrow + kk * 8 + 4 + t);
        }
        const u32 p = quant[i];
#pragma unroll
        for (int a = 0; a < 3; ++a) (r ? qa1 : qa0)[a] = unpack10(p, a);
        if (SPLIT) (r ? rad1 : rad0) = pos[(u64)i * 3 + 2];
    }
    const float* qtr0 = qt + rl0 * QS;
    const float* qtr1 = qt + rl1 * QS;

    float o[D / 8][4], hist[UNSPLIT][HIST_TILES][4];
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
#pragma unroll
    for (int a = 0; a < UNSPLIT; ++a)
#pragma unroll
        for (int bn = 0; bn < HIST_TILES; ++bn) hist[a][bn][0] = hist[a][bn][1] = hist[a][bn][2] = hist[a][bn][3] = 0.0f;
    const float NEG_INF = -__int_as_float(0x7f800000);
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;
    __syncthreads();  // tq no longer read
    stage_table_hi_lo<D>(reinterpret_cast<store_t*>(tab), tk, E, A.heads_b, hb);

    // The next tile's keys, values and positions are loaded into registers while this tile is
    // computed (one 16-byte chunk of K and of V per thread: TK * D / 8 <= TILED_THREADS), and
    // written to shared memory after the tile's last read.
    static_assert(TK * (D / 8) <= TILED_THREADS, "one K/V chunk per thread");
    const int sjj = tid / (D / 8), sc8 = tid % (D / 8);
    uint4 uk, uv;
    u32 pq;
    float pr;
    auto fetch = [&](u32 k0) {
        const u32 nk = min((u32)TK, ke - k0);
        uk = make_uint4(0u, 0u, 0u, 0u);
        uv = uk;
        pq = 0u;
        pr = 0.0f;
        // zeros past the window's end, so that masked pairs (p = 0) multiply zeros, not stale values
        if (tid < TK * (D / 8) && sjj < (int)nk) {
            const u32 j = order[k0 + sjj];
            uk = __ldg(reinterpret_cast<const uint4*>(k + (u64)j * A.ld + h * D) + sc8);
            uv = __ldg(reinterpret_cast<const uint4*>(v + (u64)j * A.ld + h * D) + sc8);
        }
        if (tid < (int)nk) {
            const u32 j = order[k0 + tid];
            pq = quant[j];
            if (SPLIT) pr = pos[(u64)j * 3 + 2];
        }
    };
    if (kb < ke) fetch(kb);

    for (u32 k0 = kb; k0 < ke; k0 += TK) {
        const u32 nk = min((u32)TK, ke - k0);
        __syncthreads();  // the previous tile is no longer read (and, first time round, tk staged)
        // stage the tile: keys row-major, values transposed
        if (tid < TK * (D / 8)) {
            *reinterpret_cast<uint4*>(ks + sjj * KPAD + sc8 * 8) = uk;
            const store_t* hv = reinterpret_cast<const store_t*>(&uv);
#pragma unroll
            for (int c = 0; c < 8; ++c) vt[(sc8 * 8 + c) * VPAD + sjj] = hv[c];
        }
        if (tid < TK) {
            kq[tid] = pq;
            kr[tid] = pr;
        }
        __syncthreads();
        if (k0 + TK < ke) fetch(k0 + TK);
        // k . tk for every (key, table entry): warp w takes the entry tiles w, w + 4, ...
        {
            u32 af[TK / 16][D / 16][4];
#pragma unroll
            for (int mt = 0; mt < TK / 16; ++mt)
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const store_t* r0 = ks + (mt * 16 + g) * KPAD + kk * 16 + 2 * t;
                    af[mt][kk][0] = shared_u32(r0);
                    af[mt][kk][1] = shared_u32(r0 + 8 * KPAD);
                    af[mt][kk][2] = shared_u32(r0 + 8);
                    af[mt][kk][3] = shared_u32(r0 + 8 * KPAD + 8);
                }
            for (int nt = warp; nt * 8 < E; nt += TILED_THREADS / 32) {
                const int en = nt * 8 + g;  // the table entry this lane's B fragment holds
                u32 bh[D / 16][2], bl[D / 16][2];
                const store_t* th = reinterpret_cast<const store_t*>(tab);
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk) {
                    const int at = min(en, E - 1) * D + kk * 16 + 2 * t;  // rows past E: any row, never stored
                    bh[kk][0] = shared_u32(th + at);
                    bh[kk][1] = shared_u32(th + at + 8);
                    bl[kk][0] = shared_u32(th + E * D + at);
                    bl[kk][1] = shared_u32(th + E * D + at + 8);
                }
                const int col = nt * 8 + 2 * t;
#pragma unroll
                for (int mt = 0; mt < TK / 16; ++mt) {
                    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                    for (int kk = 0; kk < D / 16; ++kk) {
                        mma_16816(c, af[mt][kk], bh[kk]);
                        mma_16816(c, af[mt][kk], bl[kk]);
                    }
                    float* r0 = kt + (mt * 16 + g) * KS + col;
                    if (col < E) {
                        r0[0] = c[0];
                        r0[8 * KS] = c[2];
                    }
                    if (col + 1 < E) {
                        r0[1] = c[1];
                        r0[8 * KS + 1] = c[3];
                    }
                }
            }
        }
        __syncthreads();
        if (!warp_active) continue;

        // S = Q K^T plus the RPE terms; keys past the window's end masked
        float sc[TK / 8][4];
        int r2s[TK / 8][4];
#pragma unroll
        for (int nt = 0; nt < TK / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const store_t* kr0 = ks + (nt * 8 + g) * KPAD + kk * 16 + 2 * t;
                const u32 b[2] = {shared_u32(kr0), shared_u32(kr0 + 8)};
                mma_16816(sc[nt], qf[kk], b);
            }
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                // keys past the window's end (last tile) read the zeroed staging slots: valid
                // rows, a finite logit, masked below (branch-free: every other tile is full)
                const int jj = nt * 8 + 2 * t + (c & 1);
                const int* qa = c < 2 ? qa0 : qa1;
                const float* qtr = c < 2 ? qtr0 : qtr1;
                const u32 pj = kq[jj];
                const int b0 = unpack10(pj, 0), b1 = unpack10(pj, 1);
                const int r0 = clamp_row(qa[0] - b0 + L - 1, hi), r1 = clamp_row(qa[1] - b1 + L - 1, hi);
                int r2, bin2;
                if (SPLIT) {
                    r2 = clamp_row(exponential_split((c < 2 ? rad0 : rad1) - kr[jj], A.a) + 24, hi);
                    bin2 = 2 * QB + r2;
                    r2s[nt][c] = r2;
                } else {
                    const int b2 = unpack10(pj, 2);
                    r2 = clamp_row(qa[2] - b2 + L - 1, hi);
                    bin2 = 2 * QB + b2;
                }
                const float* ktj = kt + jj * KS;
                const float logit = sc[nt][c] + (qtr[b0] + qtr[QB + b1] + qtr[bin2]) + (ktj[r0 * 3] + ktj[r1 * 3 + 1] + ktj[r2 * 3 + 2]);
                sc[nt][c] = jj < (int)nk ? logit : NEG_INF;
            }
        }
        // the rows' tile maxima (a row's 4 lanes share it) and the lazy rescale
        float mx0 = NEG_INF, mx1 = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < TK / 8; ++nt) {
            mx0 = fmaxf(mx0, fmaxf(sc[nt][0], sc[nt][1]));
            mx1 = fmaxf(mx1, fmaxf(sc[nt][2], sc[nt][3]));
        }
#pragma unroll
        for (int x = 1; x <= 2; x <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(FULL_MASK, mx0, x));
            mx1 = fmaxf(mx1, __shfl_xor_sync(FULL_MASK, mx1, x));
        }
        const float slack = SPLIT ? SPLIT_RESCALE_SLACK : RESCALE_SLACK;
        const bool up0 = mx0 > m0 + slack, up1 = mx1 > m1 + slack;  // also the first tile
        if (__any_sync(FULL_MASK, up0 || up1)) {
            const float s0 = up0 ? __expf(m0 - mx0) : 1.0f, s1 = up1 ? __expf(m1 - mx1) : 1.0f;
            l0 *= s0;
            l1 *= s1;
#pragma unroll
            for (int dn = 0; dn < D / 8; ++dn) {
                o[dn][0] *= s0; o[dn][1] *= s0; o[dn][2] *= s1; o[dn][3] *= s1;
            }
#pragma unroll
            for (int a = 0; a < UNSPLIT; ++a)
#pragma unroll
                for (int bn = 0; bn < HIST_TILES; ++bn) {
                    hist[a][bn][0] *= s0; hist[a][bn][1] *= s0; hist[a][bn][2] *= s1; hist[a][bn][3] *= s1;
                }
            if (SPLIT) {
                __syncwarp();
                if (up0)
                    for (int r = t; r < rows; r += 4) h2[rl0 * RS + r] = __float2uint_rn((float)h2[rl0 * RS + r] * s0);
                if (up1)
                    for (int r = t; r < rows; r += 4) h2[rl1 * RS + r] = __float2uint_rn((float)h2[rl1 * RS + r] * s1);
                __syncwarp();
            }
            if (up0) m0 = mx0;
            if (up1) m1 = mx1;
        }
        // P (store_t, as the MMAs take it), row sums and the radial histogram from the same values
        u32 pf[TK / 16][4];
#pragma unroll
        for (int nt = 0; nt < TK / 8; ++nt) {
            const store2_t p01 = store2_from_floats(__expf(sc[nt][0] - m0), __expf(sc[nt][1] - m0));
            const store2_t p23 = store2_from_floats(__expf(sc[nt][2] - m1), __expf(sc[nt][3] - m1));
            const float2 f01 = store2_to_float2(p01), f23 = store2_to_float2(p23);
            l0 += f01.x + f01.y;
            l1 += f23.x + f23.y;
            if (SPLIT) {  // masked keys add p = 0
                radial_hist_add(h2 + rl0 * RS, r2s[nt][0], r2s[nt][1], f01.x, f01.y, hist_scale);
                radial_hist_add(h2 + rl1 * RS, r2s[nt][2], r2s[nt][3], f23.x, f23.y, hist_scale);
            }
            pf[nt / 2][(nt & 1) * 2] = half2_bits(p01);
            pf[nt / 2][(nt & 1) * 2 + 1] = half2_bits(p23);
        }
        // O += P V
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn)
#pragma unroll
            for (int kk = 0; kk < TK / 16; ++kk) {
                const store_t* v0 = vt + (dn * 8 + g) * VPAD + kk * 16 + 2 * t;
                const u32 b[2] = {shared_u32(v0), shared_u32(v0 + 8)};
                mma_16816(o[dn], pf[kk], b);
            }
        // Hist_a += P x onehot(bin on axis a) for the unsplit axes
#pragma unroll
        for (int kk = 0; kk < TK / 16; ++kk) {
            const int j0 = kk * 16 + 2 * t;
            const u32 p00 = kq[j0], p01 = kq[j0 + 1], p10 = kq[j0 + 8], p11 = kq[j0 + 9];
#pragma unroll
            for (int a = 0; a < UNSPLIT; ++a) {
                const int c00 = unpack10(p00, a), c01 = unpack10(p01, a), c10 = unpack10(p10, a), c11 = unpack10(p11, a);
#pragma unroll
                for (int bn = 0; bn < HIST_TILES; ++bn) {
                    const int col = bn * 8 + g;
                    const u32 b[2] = {onehot_pair(c00, c01, col), onehot_pair(c10, c11, col)};
                    mma_16816(hist[a][bn], pf[kk], b);
                }
            }
        }
    }
    __syncthreads();  // every warp is done with the last tile: kt becomes scratch, tab gets tv
    stage_table<D>(tab, tv, E, A.heads_b, hb);
    __syncthreads();
    if (!warp_active) return;
#pragma unroll
    for (int x = 1; x <= 2; x <<= 1) {
        l0 += __shfl_xor_sync(FULL_MASK, l0, x);
        l1 += __shfl_xor_sync(FULL_MASK, l1, x);
    }
    // the histograms into the warp's own q . tq rows (no longer read), O, m and l into scratch
    float* scr = kt + warp * 16 * (D + 2);  // [16][D + 2]
#pragma unroll
    for (int a = 0; a < UNSPLIT; ++a)
#pragma unroll
        for (int bn = 0; bn < HIST_TILES; ++bn)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int b = bn * 8 + 2 * t + (c & 1);
                if (b < QB) qt[(c < 2 ? rl0 : rl1) * QS + a * QB + b] = hist[a][bn][c];
            }
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn)
#pragma unroll
        for (int c = 0; c < 4; ++c) scr[(c < 2 ? g : g + 8) * (D + 2) + dn * 8 + 2 * t + (c & 1)] = o[dn][c];
    if (t == 0) {
        scr[g * (D + 2) + D] = m0;
        scr[g * (D + 2) + D + 1] = l0;
        scr[(g + 8) * (D + 2) + D] = m1;
        scr[(g + 8) * (D + 2) + D + 1] = l1;
    }
    __syncwarp();
    // one lane per (query row, half of the head): the value table, once
    const int row = lane >> 1, d0 = (lane & 1) * (D / 2);
    const int rl = warp * 16 + row;
    if (q0 + rl >= e) return;
    const u32 i = order[q0 + rl];
    const u32 p = quant[i];
    float acc[D / 2];
#pragma unroll
    for (int c = 0; c < D / 2; ++c) acc[c] = scr[row * (D + 2) + d0 + c];
    const float* hrow = qt + rl * QS;
    for (int a = 0; a < UNSPLIT; ++a) {
        const int qa = unpack10(p, a);
        for (int b = 0; b < QB; ++b) {
            const float wgt = hrow[a * QB + b];
            if (wgt == 0.0f) continue;
            const int r = clamp_row(qa - b + L - 1, hi);
            add_table_row<D / 2>(acc, wgt, tab + (r * 3 + a) * D + d0);
        }
    }
    if (SPLIT) {
        for (int r = 0; r < rows; ++r) {
            const u32 fixed = h2[rl * RS + r];
            if (fixed == 0u) continue;
            const float wgt = (float)fixed * inv_hist_scale;
            add_table_row<D / 2>(acc, wgt, tab + (r * 3 + 2) * D + d0);
        }
    }
    const float m = scr[row * (D + 2) + D], l = scr[row * (D + 2) + D + 1];
    if (A.key_splits > 1) {
        // [split][sorted position][head of the call][D + 2]: acc, reference maximum, sum
        float* pr = partial + (((u64)blockIdx.y * A.n + q0 + rl) * A.heads_b + hb) * (D + 2);
#pragma unroll
        for (int c = 0; c < D / 2; ++c) pr[d0 + c] = acc[c];
        if (d0 == 0) {
            pr[D] = m;
            pr[D + 1] = l;
        }
        return;
    }
    const float inv = 1.0f / l;
    store2_t* o2 = reinterpret_cast<store2_t*>(out + (u64)i * A.out_ld + h * D + d0);
    u32 bits = 0;
#pragma unroll
    for (int c = 0; c < D / 2; c += 2) {
        const float y0 = acc[c] * inv, y1 = acc[c + 1] * inv;
        bits |= store_range_bits(y0) | store_range_bits(y1);
        o2[c / 2] = store2_from_floats(y0, y1);
    }
    range_flag(range_flags, range_layer, bits);
}

#endif  // STORE_TENSOR_CORES

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
                                            AttnParams A, u32 d, store_t* __restrict__ out,
                                            u32* __restrict__ range_flags, u32 range_layer) {
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
    store_t* o = out + (u64)order[p] * A.out_ld + (A.head0 + hb) * d;
    u32 bits = 0;
    for (u32 c = 0; c < d; ++c) {
        const float y = acc[c] * inv;
        bits |= store_range_bits(y);
        o[c] = store_from_float(y);
    }
    range_flag(range_flags, range_layer, bits);
}

#if STORE_TENSOR_CORES
// MIN_BLOCKS per SM caps the registers (65536 / (128 * MIN_BLOCKS)): 3 blocks, 168 registers,
// no spills (4 blocks would fit the shared memory of cubic windows at head_dim 16, but the
// 128-register cap spills in the tile loop).
#define ATTN_TILED_KERNEL(D, SPLIT, MIN_BLOCKS, NAME)                                              \
    extern "C" __global__ void __launch_bounds__(TILED_THREADS, MIN_BLOCKS) NAME(ATTN_PARAMS) { \
        attention_tiled_impl<D, SPLIT>(ATTN_ARGS);                                                 \
    }

ATTN_TILED_KERNEL(16, false, 3, attn_ctx_tiled_d16)
ATTN_TILED_KERNEL(32, false, 3, attn_ctx_tiled_d32)
ATTN_TILED_KERNEL(16, true, 3, attn_ctx_tiled_split_d16)
ATTN_TILED_KERNEL(32, true, 3, attn_ctx_tiled_split_d32)
#endif  // STORE_TENSOR_CORES

// ---- Whole-window kernel for 2-D windows (Swin: at most 49 tokens a window) -----------------
// One block per (window, head): the window's K and V rows (as f32), its tokens' packed (row, col)
// and the head's bias table are staged in shared memory once; then one thread per query walks
// every key of the window from shared memory (the threads of a warp read the same key row: a
// broadcast) with the online softmax of attention_impl, and writes its whole output row. The
// per-query kernel instead has 4 lanes per query each load their keys' rows from global memory
// (through L1), once per query: 49 times per key. Launched for MODE_BIAS2D when every window has
// at most WIN_MAX_TOKENS tokens and the table at most WIN_MAX_TABLE entries (src/attention/cuda.rs,
// `CudaBias2d::whole_window`); blockDim.x must be WIN_MAX_TOKENS. Storage-generic (store_t,
// storage.cuh) like the rest of this file, so it builds in every storage build.
#define WIN_MAX_TOKENS 64
#define WIN_MAX_TABLE 256

// What both whole-window kernels stage first, before their first barrier: head hb's bias table
// (tl entries) in tab, and the window's token ids and packed (row, col) in ids / rcs, zero past
// its nw tokens up to WIN_MAX_TOKENS. Returns nw.
__device__ __forceinline__ u32 stage_bias2d_window(const u32* __restrict__ order, const u32* __restrict__ offsets,
                                                   const u32* __restrict__ quant, const float* __restrict__ table, u32 w,
                                                   u32 hb, int tl, float* tab, u32* ids, u32* rcs) {
    const u32 s = offsets[w], e = offsets[w + 1];
    const u32 nw = min(e - s, (u32)WIN_MAX_TOKENS);  // == e - s: the host checks n_max
    for (int t = threadIdx.x; t < tl; t += blockDim.x) tab[t] = table[(u64)hb * tl + t];
    for (u32 t = threadIdx.x; t < WIN_MAX_TOKENS; t += blockDim.x) {
        const u32 j = t < nw ? order[s + t] : 0u;
        ids[t] = j;
        rcs[t] = t < nw ? quant[j] : 0u;
    }
    return nw;
}

// The relative position bias of query pi and key pj (packed (row << 16) | col) from the staged
// table: the offsets clamped to the table, the index capped at its last entry.
__device__ __forceinline__ float bias2d_term(const float* tab, u32 pi, u32 pj, const AttnParams& A, int tw, int tl) {
    const int hmax = 2 * A.win_h - 2, wmax = 2 * A.win_w - 2;
    int dr = (int)(pi >> 16) - (int)(pj >> 16) + A.win_h - 1;
    int dc = (int)(pi & 0xffffu) - (int)(pj & 0xffffu) + A.win_w - 1;
    dr = dr < 0 ? 0 : (dr > hmax ? hmax : dr);
    dc = dc < 0 ? 0 : (dc > wmax ? wmax : dc);
    return tab[min(dr * tw + dc, tl - 1)];
}

template <int D>
__device__ void attention_bias2d_win_impl(ATTN_PARAMS) {
    __shared__ __align__(16) float ks[WIN_MAX_TOKENS * D];
    __shared__ __align__(16) float vs[WIN_MAX_TOKENS * D];
    __shared__ u32 rcs[WIN_MAX_TOKENS];
    __shared__ u32 ids[WIN_MAX_TOKENS];
    __shared__ float tab[WIN_MAX_TABLE];
    const u32 hb = blockIdx.y;
    const u32 h = A.head0 + hb;
    const int tw = 2 * A.win_w - 1;
    const int tl = min((2 * A.win_h - 1) * tw, WIN_MAX_TABLE);  // the host checks the table size
    const u32 nw = stage_bias2d_window(order, offsets, quant, tq, blockIdx.x, hb, tl, tab, ids, rcs);
    __syncthreads();
    // K and V rows, 8 stored values (16 bytes) a step
    constexpr u32 PER_ROW = D / 8;
    for (u32 c = threadIdx.x; c < nw * PER_ROW; c += blockDim.x) {
        const u32 t = c / PER_ROW, part = c % PER_ROW;
        const u32 j = ids[t];
        const uint4 uk = __ldg(reinterpret_cast<const uint4*>(k + (u64)j * A.ld + h * D) + part);
        const uint4 uv = __ldg(reinterpret_cast<const uint4*>(v + (u64)j * A.ld + h * D) + part);
        const store2_t* hk = reinterpret_cast<const store2_t*>(&uk);
        const store2_t* hv = reinterpret_cast<const store2_t*>(&uv);
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const float2 fk = store2_to_float2(hk[x]), fv = store2_to_float2(hv[x]);
            ks[t * D + part * 8 + 2 * x] = fk.x;
            ks[t * D + part * 8 + 2 * x + 1] = fk.y;
            vs[t * D + part * 8 + 2 * x] = fv.x;
            vs[t * D + part * 8 + 2 * x + 1] = fv.y;
        }
    }
    __syncthreads();
    const u32 t = threadIdx.x;
    if (t >= nw) return;
    const u32 i = ids[t];
    float qi[D], acc[D];
    load_row<D>(q + (u64)i * A.ld + h * D, qi);
#pragma unroll
    for (int c = 0; c < D; ++c) acc[c] = 0.0f;
    float m = -__int_as_float(0x7f800000), l = 0.0f;  // -inf
    const u32 pi = rcs[t];
    for (u32 jj = 0; jj < nw; ++jj) {
        const float4* kr = reinterpret_cast<const float4*>(ks + jj * D);
        float logit = 0.0f;
#pragma unroll
        for (int c = 0; c < D / 4; ++c) {
            const float4 x = kr[c];
            logit += qi[4 * c] * x.x + qi[4 * c + 1] * x.y + qi[4 * c + 2] * x.z + qi[4 * c + 3] * x.w;
        }
        logit += bias2d_term(tab, pi, rcs[jj], A, tw, tl);
        if (logit > m) {
            const float scale = __expf(m - logit);  // 0 on the first key (m = -inf)
            l *= scale;
#pragma unroll
            for (int c = 0; c < D; ++c) acc[c] *= scale;
            m = logit;
        }
        const float pw = __expf(logit - m);
        l += pw;
        const float4* vr = reinterpret_cast<const float4*>(vs + jj * D);
#pragma unroll
        for (int c = 0; c < D / 4; ++c) {
            const float4 x = vr[c];
            acc[4 * c] += pw * x.x;
            acc[4 * c + 1] += pw * x.y;
            acc[4 * c + 2] += pw * x.z;
            acc[4 * c + 3] += pw * x.w;
        }
    }
    const float inv = 1.0f / l;
    store2_t* o = reinterpret_cast<store2_t*>(out + (u64)i * A.out_ld + h * D);
    u32 bits = 0;
#pragma unroll
    for (int c = 0; c < D; c += 2) {
        const float y0 = acc[c] * inv, y1 = acc[c + 1] * inv;
        bits |= store_range_bits(y0) | store_range_bits(y1);
        o[c / 2] = store2_from_floats(y0, y1);
    }
    range_flag(range_flags, range_layer, bits);
}

#define ATTN_WIN_KERNEL(D, NAME) \
    extern "C" __global__ void __launch_bounds__(WIN_MAX_TOKENS) NAME(ATTN_PARAMS) { attention_bias2d_win_impl<D>(ATTN_ARGS); }

ATTN_WIN_KERNEL(16, attn_bias2d_win_d16)
ATTN_WIN_KERNEL(32, attn_bias2d_win_d32)
ATTN_WIN_KERNEL(64, attn_bias2d_win_d64)

// ---- Whole-window kernel for 2-D windows on tensor cores (Swin, FP16 / BF16 builds) ----------
// The same job and launch checks as attention_bias2d_win_impl, with both matmuls on tensor cores
// (mma.sync m16n8k16, FP32 accumulation). A block = 4 warps = one (window, head), the window's
// tokens padded to WIN_MAX_TOKENS rows: warp w owns query rows 16w .. 16w + 15. Q and K rows
// (stored values, zero rows past the window's nw tokens) and V transposed are staged in shared
// memory; each warp computes its 16 × 64 logits S = Q K^T, adds the bias (keys past nw get -inf),
// takes the row maxima across the 4 lanes that share a row, and forms P = exp(S - max) rounded to
// the stored type. The C fragments of S are the A fragments of O = P V (lane layouts of
// mma_16816), so P never leaves registers. The row sum uses the rounded P, so the output is an
// exact convex combination of V rows with weights off by at most 2^-11 relative (FP16; 2^-8 in
// BF16), as in the tiled kernel. The per-thread kernel above keeps every product in FP32: ~7
// times the instructions per (query, key) pair.
#if STORE_TENSOR_CORES
#define WIN_TC_THREADS 128
// The guard's bits for a value read back from storage that a GEMM stored: at or beyond the stored
// type's range exactly when it is the largest stored value or inf (the conversion rounds to one of
// them): saturated; NaN: non-finite (swin.cu's fp16_stored_range_bits, storage-generic).
__device__ __forceinline__ u32 stored_range_bits(float v) {
    const float a = fabsf(v);
    return a < STORE_MAX ? 0u : (a == a ? RANGE_SATURATED : RANGE_NONFINITE);  // NaN: a != a
}

// Eight stored values' guard bits (as read back).
__device__ __forceinline__ u32 stored_range_bits8(uint4 u) {
    const store2_t* h = reinterpret_cast<const store2_t*>(&u);
    u32 bits = 0;
#pragma unroll
    for (int x = 0; x < 4; ++x) {
        const float2 f = store2_to_float2(h[x]);
        bits |= stored_range_bits(f.x) | stored_range_bits(f.y);
    }
    return bits;
}

// Eight stored q values times the q scale, rounded back (swin.cu's swin_qkv_split_h, value for
// value), with the guard bits of the products.
__device__ __forceinline__ uint4 scale8(uint4 u, float scale, u32& bits) {
    store2_t* h = reinterpret_cast<store2_t*>(&u);
#pragma unroll
    for (int x = 0; x < 4; ++x) {
        const float2 f = store2_to_float2(h[x]);
        const float a = f.x * scale, b = f.y * scale;
        bits |= store_range_bits(a) | store_range_bits(b);
        h[x] = store2_from_floats(a, b);
    }
    return u;
}

// PACKED: q, k and v are one qkv Linear's output [rows, 3C] (A.k_off, A.v_off, A.q_scale,
// A.in_layer): the split kernel's work done while staging, with the same values and guard bits.
template <int D, bool PACKED>
__device__ void attention_bias2d_win_tc_impl(ATTN_PARAMS) {
    constexpr int KP = D + 8;                // halves per staged q / k row (conflict-free fragments)
    constexpr int VP = WIN_MAX_TOKENS + 8;   // halves per staged value column
    constexpr int NT = WIN_MAX_TOKENS / 8;   // key tiles of S
    constexpr u32 PER_ROW = D / 8;           // 16-byte loads a row
    __shared__ __align__(16) store_t qs[WIN_MAX_TOKENS * KP];
    __shared__ __align__(16) store_t ks[WIN_MAX_TOKENS * KP];
    __shared__ __align__(16) store_t vt[D * VP];
    __shared__ u32 rcs[WIN_MAX_TOKENS];
    __shared__ u32 ids[WIN_MAX_TOKENS];
    __shared__ float tab[WIN_MAX_TABLE];
    const u32 hb = blockIdx.y;
    const u32 h = A.head0 + hb;
    const int tw = 2 * A.win_w - 1;
    const int tl = min((2 * A.win_h - 1) * tw, WIN_MAX_TABLE);  // the host checks the table size
    const u32 nw = stage_bias2d_window(order, offsets, quant, tq, blockIdx.x, hb, tl, tab, ids, rcs);
    __syncthreads();
    u32 in_bits = 0;
    for (u32 c = threadIdx.x; c < WIN_MAX_TOKENS * PER_ROW; c += blockDim.x) {
        const u32 t = c / PER_ROW, part = c % PER_ROW;
        uint4 uq = make_uint4(0, 0, 0, 0), uk = uq, uv = uq;
        if (t < nw) {
            const u64 row = (u64)ids[t] * A.ld + h * D;
            uq = __ldg(reinterpret_cast<const uint4*>(q + row) + part);
            uk = __ldg(reinterpret_cast<const uint4*>(k + A.k_off + row) + part);
            uv = __ldg(reinterpret_cast<const uint4*>(v + A.v_off + row) + part);
            if (PACKED) {
                in_bits |= stored_range_bits8(uq) | stored_range_bits8(uk) | stored_range_bits8(uv);
                uq = scale8(uq, A.q_scale, in_bits);
            }
        }
        *reinterpret_cast<uint4*>(qs + t * KP + part * 8) = uq;
        *reinterpret_cast<uint4*>(ks + t * KP + part * 8) = uk;
        const store_t* hv = reinterpret_cast<const store_t*>(&uv);
#pragma unroll
        for (int x = 0; x < 8; ++x) vt[(part * 8 + x) * VP + t] = hv[x];
    }
    if (PACKED) range_flag(range_flags, A.in_layer, in_bits);
    __syncthreads();
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const u32 r0 = warp * 16;
    if (r0 >= nw) return;  // no query rows of this window here (no barrier follows)
    const u32 g = lane / 4, tq4 = lane % 4;
    // S = Q K^T over the key tiles that hold a key of the window
    float sc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        u32 a[4];
        a[0] = shared_u32(qs + (r0 + g) * KP + kk * 16 + 2 * tq4);
        a[1] = shared_u32(qs + (r0 + g + 8) * KP + kk * 16 + 2 * tq4);
        a[2] = shared_u32(qs + (r0 + g) * KP + kk * 16 + 8 + 2 * tq4);
        a[3] = shared_u32(qs + (r0 + g + 8) * KP + kk * 16 + 8 + 2 * tq4);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            if ((u32)nt * 8 >= nw) continue;
            u32 b[2];
            b[0] = shared_u32(ks + (nt * 8 + g) * KP + kk * 16 + 2 * tq4);
            b[1] = shared_u32(ks + (nt * 8 + g) * KP + kk * 16 + 8 + 2 * tq4);
            mma_16816(sc[nt], a, b);
        }
    }
    // bias, mask, row maxima (rows g and g + 8 of the warp's 16)
    const u32 pi0 = rcs[r0 + g], pi1 = rcs[r0 + g + 8];
    float m0 = -__int_as_float(0x7f800000), m1 = m0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const u32 key = nt * 8 + 2 * tq4 + (x & 1);
            if (key >= nw) {
                sc[nt][x] = -__int_as_float(0x7f800000);
                continue;
            }
            sc[nt][x] += bias2d_term(tab, x < 2 ? pi0 : pi1, rcs[key], A, tw, tl);
        }
        m0 = fmaxf(m0, fmaxf(sc[nt][0], sc[nt][1]));
        m1 = fmaxf(m1, fmaxf(sc[nt][2], sc[nt][3]));
    }
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 1));
    m0 = fmaxf(m0, __shfl_xor_sync(0xffffffffu, m0, 2));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 1));
    m1 = fmaxf(m1, __shfl_xor_sync(0xffffffffu, m1, 2));
    // P rounded to the stored type, packed as the A fragments of P V; the row sums of the same
    // rounded values. Key 0 is always in the window, so each maximum is finite.
    u32 pf[NT][2];
    float l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const store2_t p01 = store2_from_floats(__expf(sc[nt][0] - m0), __expf(sc[nt][1] - m0));
        const store2_t p23 = store2_from_floats(__expf(sc[nt][2] - m1), __expf(sc[nt][3] - m1));
        const float2 f01 = store2_to_float2(p01), f23 = store2_to_float2(p23);
        l0 += f01.x + f01.y;
        l1 += f23.x + f23.y;
        pf[nt][0] = half2_bits(p01);
        pf[nt][1] = half2_bits(p23);
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    // O = P V: 16 keys a step (two key tiles of S), D / 8 channel tiles
    float o[D / 8][4];
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < WIN_MAX_TOKENS / 16; ++kk) {
        if ((u32)kk * 16 >= nw) continue;
        const u32 a[4] = {pf[2 * kk][0], pf[2 * kk][1], pf[2 * kk + 1][0], pf[2 * kk + 1][1]};
#pragma unroll
        for (int dn = 0; dn < D / 8; ++dn) {
            u32 b[2];
            b[0] = shared_u32(vt + (dn * 8 + g) * VP + kk * 16 + 2 * tq4);
            b[1] = shared_u32(vt + (dn * 8 + g) * VP + kk * 16 + 8 + 2 * tq4);
            mma_16816(o[dn], a, b);
        }
    }
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    const u32 row0 = r0 + g, row1 = r0 + g + 8;
    u32 bits = 0;
#pragma unroll
    for (int dn = 0; dn < D / 8; ++dn) {
        const u32 c = dn * 8 + 2 * tq4;
        if (row0 < nw) {
            const float y0 = o[dn][0] * inv0, y1 = o[dn][1] * inv0;
            bits |= store_range_bits(y0) | store_range_bits(y1);
            *reinterpret_cast<store2_t*>(out + (u64)ids[row0] * A.out_ld + h * D + c) = store2_from_floats(y0, y1);
        }
        if (row1 < nw) {
            const float y0 = o[dn][2] * inv1, y1 = o[dn][3] * inv1;
            bits |= store_range_bits(y0) | store_range_bits(y1);
            *reinterpret_cast<store2_t*>(out + (u64)ids[row1] * A.out_ld + h * D + c) = store2_from_floats(y0, y1);
        }
    }
    range_flag(range_flags, range_layer, bits);
}

#define ATTN_WIN_TC_KERNEL(D, PACKED, NAME)                                                    \
    extern "C" __global__ void __launch_bounds__(WIN_TC_THREADS) NAME(ATTN_PARAMS) {           \
        attention_bias2d_win_tc_impl<D, PACKED>(ATTN_ARGS);                                     \
    }

ATTN_WIN_TC_KERNEL(16, false, attn_bias2d_win_tc_d16)
ATTN_WIN_TC_KERNEL(32, false, attn_bias2d_win_tc_d32)
ATTN_WIN_TC_KERNEL(64, false, attn_bias2d_win_tc_d64)
ATTN_WIN_TC_KERNEL(16, true, attn_bias2d_win_tc_packed_d16)
ATTN_WIN_TC_KERNEL(32, true, attn_bias2d_win_tc_packed_d32)
ATTN_WIN_TC_KERNEL(64, true, attn_bias2d_win_tc_packed_d64)
#endif  // STORE_TENSOR_CORES
