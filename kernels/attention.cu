// Sparse window attention (see src/attention/cuda.rs): window partition helpers, SphereFormer's
// contextual RPE quantization, and the fused varlen attention kernel.
//
// Float arithmetic mirrors PyTorch's CUDA float32 ops one by one (the module is compiled with
// --fmad=false, so nothing is contracted): window cells, quantized positions, spherical
// coordinates and the radial split land in the same bins as upstream's.
#include <cuda_fp16.h>

#define PI_F 3.14159265358979323846f
#define LN2_F 0.693147180559945309417f

// Order-preserving map of a float to u32 (atomicMin/atomicMax on floats).
__device__ __forceinline__ u32 order_f32(float v) {
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float unorder_f32(u32 o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// torch.remainder and torch.div(rounding_mode='floor') on float32.
__device__ __forceinline__ float torch_remainder(float a, float b) {
    float m = fmodf(a, b);
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) m += b;
    return m;
}
__device__ __forceinline__ float torch_div_floor(float a, float b) {
    if (b == 0.0f) return a / b;
    const float m = fmodf(a, b);
    float div = (a - m) / b;
    if (m != 0.0f && ((b < 0.0f) != (m < 0.0f))) div -= 1.0f;
    if (div != 0.0f) {
        float fl = floorf(div);
        if (div - fl > 0.5f) fl += 1.0f;
        return fl;
    }
    return copysignf(0.0f, a / b);
}

// SphereFormer's cart2sphere, op by op: a tensor divided by a Python scalar is a multiplication
// by the float32 reciprocal in PyTorch's CUDA kernels.
extern "C" __global__ void attn_cart2sphere(const float* __restrict__ xyz, u32 n, float* __restrict__ out) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = xyz[i * 3], y = xyz[i * 3 + 1], z = xyz[i * 3 + 2];
    const float inv_pi = 1.0f / PI_F;
    const float theta = ((atan2f(y, x) + PI_F) * 180.0f) * inv_pi;
    const float xy2 = x * x + y * y;
    const float beta = (atan2f(sqrtf(xy2), z) * 180.0f) * inv_pi;
    out[i * 3] = theta;
    out[i * 3 + 1] = beta;
    out[i * 3 + 2] = sqrtf(xy2 + z * z);
}

// Per-axis min and max of positions (ordered u32; host initialises mins to ~0 and maxs to 0) and
// the batch range. Non-finite positions raise flags[0].
extern "C" __global__ void attn_bounds(const float* __restrict__ pos, const i32* __restrict__ batch, u32 n,
                                       u32* bounds /* min x,y,z, max x,y,z, min b, max b */) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    for (int a = 0; a < 3; ++a) {
        const float p = pos[i * 3 + a];
        atomicMin(&bounds[a], order_f32(p));
        atomicMax(&bounds[3 + a], order_f32(p));
    }
    atomicMin(&bounds[6], (u32)batch[i]);
    atomicMax(&bounds[7], (u32)batch[i]);
}

struct WindowGrid {
    float window[3];
    float start[3];   // the unshifted per-axis minimum
    u64 cells[3];     // cells per axis
    u32 batch_min;
    u32 shift;
    u32 n;
};

// Mixed-radix window key of every voxel: ((b * nz + cz) * ny + cy) * nx + cx, and the identity
// permutation for the sort's values.
extern "C" __global__ void attn_window_keys(const float* __restrict__ pos, const i32* __restrict__ batch,
                                            WindowGrid G, u64* __restrict__ keys, u32* __restrict__ vals) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= G.n) return;
    u64 key = (u64)((u32)batch[i] - G.batch_min);
    for (int a = 2; a >= 0; --a) {
        float p = pos[i * 3 + a];
        if (G.shift) p = p + 0.5f * G.window[a];
        const u64 c = (u64)(long long)((p - G.start[a]) / G.window[a]);  // trunc, like .to(long)
        key = key * G.cells[a] + c;
    }
    keys[i] = key;
    vals[i] = i;
}

// After the sort: window id of every sorted position (flags then scanned by the host code) and
// the first position of every window.
extern "C" __global__ void attn_window_heads(const u64* __restrict__ keys, u32 n, u32* __restrict__ flags) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    flags[i] = (i == 0 || keys[i] != keys[i - 1]) ? 1u : 0u;
}

// win_of[p] = window of sorted position p (inclusive scan - 1); offsets[w] = first position of w;
// offsets[windows] = n.
extern "C" __global__ void attn_window_offsets(const u32* __restrict__ flags, const u32* __restrict__ excl, u32 n,
                                               u32* __restrict__ win_of, u32* __restrict__ offsets) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u32 w = excl[i] + flags[i] - 1u;
    win_of[i] = w;
    if (flags[i]) offsets[w] = i;
    if (i == n - 1) offsets[w + 1] = n;
}

struct RpeGeom {
    float min[3];
    float window[3];
    float quant[3];
    float a;          // radial split parameter (spherical) or 0
    int grid_length;  // L
    int rows;         // table rows: 2L - 1, or 2L with the radial split
    u32 shift;
    u32 split;
    u32 n;
};

// Quantized in-window position of every voxel, packed 10 bits per axis (clamped to 0..1023; the
// host rejects L > 1024).
extern "C" __global__ void attn_rpe_quantize(const float* __restrict__ pos, RpeGeom G, u32* __restrict__ quant) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= G.n) return;
    u32 packed = 0;
    for (int a = 0; a < 3; ++a) {
        float d = pos[i * 3 + a] - G.min[a];
        if (G.shift) d = d + 0.5f * G.window[a];
        float qf = torch_div_floor(torch_remainder(d, G.window[a]), G.quant[a]);
        int q = (int)qf;
        q = q < 0 ? 0 : (q > 1023 ? 1023 : q);
        packed |= ((u32)q) << (10 * a);
    }
    quant[i] = packed;
}

// SphereFormer's exponential_split for one pair, op by op (see src/attention/rpe.rs).
__device__ __forceinline__ int exponential_split(float d, float a) {
    const float ad = fabsf(d);
    const float flag = d >= 0.0f ? 1.0f : 0.0f;
    const float t = logf((ad + (float)(2.0 * (double)a)) * (1.0f / a));
    float idx = 2.0f * floorf(t * (1.0f / LN2_F)) - 2.0f;
    const float half = torch_div_floor(idx, 2.0f);
    const float edge = (3.0f * exp2f(half) - 2.0f) * a;
    if (edge <= ad) idx += 1.0f;
    idx = idx * (2.0f * flag - 1.0f) + (flag - 1.0f);
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
};

// Buffers of one call. quant: contextual = packed quantized positions, bias2d = (row << 16 | col).
// pos: contextual with split = positions [n, 3] (the radius is column 2). tq/tk/tv: contextual =
// [rows, 3, heads_b, D] f32; bias2d: tq = [heads_b, (2h-1)(2w-1)]. Unused ones may be any buffer.
#define ATTN_PARAMS                                                                                 \
    const __half *__restrict__ q, const __half *__restrict__ k, const __half *__restrict__ v,       \
        __half *__restrict__ out, const u32 *__restrict__ order, const u32 *__restrict__ win_of,    \
        const u32 *__restrict__ offsets, const u32 *__restrict__ quant, const float *__restrict__ pos, \
        const float *__restrict__ tq, const float *__restrict__ tk, const float *__restrict__ tv, AttnParams A
#define ATTN_ARGS q, k, v, out, order, win_of, offsets, quant, pos, tq, tk, tv, A

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
// FP32 accumulation, RPE table rows read per pair (tables are small and stay in L1).
template <int D, int MODE>
__device__ void attention_impl(ATTN_PARAMS) {
    const u32 p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= A.n) return;
    const u32 hb = blockIdx.y;
    const u32 h = A.head0 + hb;
    const u32 i = order[p];
    const u32 w = win_of[p];
    const u32 s = offsets[w], e = offsets[w + 1];

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
