// The Swin backbone's per-token steps on CUDA (src/camera/swin_cuda.rs): patch im2col, LayerNorm
// into the window-padded grid, the qkv split, the cropped residual epilogue after proj, and the
// patch merging gather. Around them: cuBLAS GEMMs (FP16 in, FP32 out), layers.cu's LayerNorm and
// Linear epilogue, and attention_core.cu's window attention.
//
// Tokens are FP16 rows `[n, h, w, c]` (NHWC); every sum and every epilogue is FP32. One thread per
// output element unless noted. The host checks that every launch's element count fits in u32, so
// index arithmetic is 32-bit (a 64-bit division costs several times a 32-bit one) and only
// addresses are widened.
//
// The kernels that compute and store FP16 activations (ln_pad, qkv split, crop residual, and the
// fused path's FP16-input qkv split / crop residual / GELU and its scan) take
// `range_flags` (may be NULL) and `range_layer`: the FP16 range guard of prelude.cuh over the
// values they store. im2col and the merge gather copy values guarded where they were stored.
#include <cuda_fp16.h>

// PatchEmbed's conv as im2col: normalized images NHWC FP16 [n, h, w, cin] (the camera
// preprocessing's output) -> rows [n * ho * wo, cin * p * p], each the patch's values in
// (channel, row, col) order (the conv weight's [E, cin, p, p] order), zero past the image
// (AdaptivePadding 'corner' pads right and bottom).
extern "C" __global__ void swin_patch_im2col(const __half* __restrict__ img, u32 n, u32 cin, u32 h, u32 w, u32 p, u32 ho,
                                             u32 wo, __half* __restrict__ cols) {
    const u32 pp = p * p;
    const u32 k = cin * pp;
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (u64)n * ho * wo * k) return;
    const u32 idx = (u32)gid;  // < 2^32: the host checks the element count
    const u32 t = idx / k, f = idx % k;
    const u32 ci = f / pp, di = (f % pp) / p, dj = f % p;
    const u32 j = t % wo, i = (t / wo) % ho, b = t / (wo * ho);
    const u32 y = i * p + di, x = j * p + dj;
    cols[idx] = (y < h && x < w) ? img[(((u64)b * h + y) * w + x) * cin + ci] : __float2half_rn(0.0f);
}

// norm1 + the window padding: row (b, r, q) of the padded grid [n, hp, wp] gets LayerNorm(x[b, r, q])
// when r < h and q < w, zeros elsewhere (Swin pads the normed tokens, so padded tokens carry only
// the qkv bias). One warp per padded row; c <= 32 * PER_LANE.
template <int PER_LANE>
__device__ __forceinline__ void ln_pad_row(const __half* __restrict__ x, u32 n, u32 h, u32 w, u32 hp, u32 wp, u32 c,
                                           const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                                           __half* __restrict__ out, u32* __restrict__ range_flags, u32 range_layer) {
    const u64 row = (u64)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const u32 lane = threadIdx.x & 31u;
    if (row >= (u64)n * hp * wp) return;
    const u32 q = (u32)(row % wp);
    const u32 r = (u32)((row / wp) % hp);
    const u64 b = row / ((u64)wp * hp);
    __half* orow = out + row * c;
    if (r >= h || q >= w) {
        for (u32 j = lane; j < c; j += 32) orow[j] = __float2half_rn(0.0f);
        return;
    }
    const __half* xr = x + ((b * h + r) * w + q) * c;
    float v[PER_LANE];
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const u32 j = lane + 32u * t;
        v[t] = j < c ? __half2float(xr[j]) : 0.0f;
        sum += v[t];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
    const float mean = sum / (float)c;
    float var = 0.0f;
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const u32 j = lane + 32u * t;
        const float d = j < c ? v[t] - mean : 0.0f;
        var += d * d;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) var += __shfl_xor_sync(FULL_MASK, var, o);
    const float inv = rsqrtf(var / (float)c + eps);
    u32 bits = 0;
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const u32 j = lane + 32u * t;
        if (j < c) {
            const float y = (v[t] - mean) * inv * gamma[j] + beta[j];
            bits |= fp16_range_bits(y);
            orow[j] = __float2half_rn(y);
        }
    }
    range_flag(range_flags, range_layer, bits);
}

// c <= 256
extern "C" __global__ void swin_ln_pad(const __half* __restrict__ x, u32 n, u32 h, u32 w, u32 hp, u32 wp, u32 c,
                                       const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                                       __half* __restrict__ out, u32* __restrict__ range_flags, u32 range_layer) {
    ln_pad_row<8>(x, n, h, w, hp, wp, c, gamma, beta, eps, out, range_flags, range_layer);
}

// c <= 768
extern "C" __global__ void swin_ln_pad_wide(const __half* __restrict__ x, u32 n, u32 h, u32 w, u32 hp, u32 wp, u32 c,
                                            const float* __restrict__ gamma, const float* __restrict__ beta, float eps,
                                            __half* __restrict__ out, u32* __restrict__ range_flags, u32 range_layer) {
    ln_pad_row<24>(x, n, h, w, hp, wp, c, gamma, beta, eps, out, range_flags, range_layer);
}

// The qkv Linear's epilogue: acc [rows, 3c] (FP32 GEMM output) + bias [3c] split into
// q = (acc + b) * scale, k = acc + b, v = acc + b, each FP16 [rows, c] (upstream's reshape
// (B, N, 3, heads, head_dim): q, k, v are consecutive column ranges).
extern "C" __global__ void swin_qkv_split(const float* __restrict__ acc, u32 rows, u32 c, const float* __restrict__ bias,
                                          float scale, __half* __restrict__ q, __half* __restrict__ k,
                                          __half* __restrict__ v, u32* __restrict__ range_flags, u32 range_layer) {
    const u32 c3 = 3u * c;
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (u64)rows * c3) return;
    const u32 idx = (u32)gid;  // < 2^32: the host checks the element count
    const u32 r = idx / c3, j = idx % c3;
    const u32 part = j / c, col = j % c;
    float y = acc[idx] + bias[j];
    if (part == 0) y *= scale;
    __half* dst = part == 0 ? q : (part == 1 ? k : v);
    range_flag(range_flags, range_layer, fp16_range_bits(y));
    dst[(u64)r * c + col] = __float2half_rn(y);
}

// proj's epilogue on the padded grid's GEMM output, cropped: for each of the n * h * w tokens,
// out[t] = acc[its padded row] + bias + residual[t] (the block's first residual).
extern "C" __global__ void swin_crop_residual(const float* __restrict__ acc, u32 n, u32 h, u32 w, u32 hp, u32 wp, u32 c,
                                              const float* __restrict__ bias, const __half* __restrict__ residual,
                                              __half* __restrict__ out, u32* __restrict__ range_flags, u32 range_layer) {
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (u64)n * h * w * c) return;
    const u32 idx = (u32)gid;  // < 2^32: the host checks the element count
    const u32 t = idx / c, j = idx % c;
    const u32 q = t % w, r = (t / w) % h, b = t / (w * h);
    const u64 pr = ((u64)b * hp + r) * wp + q;
    const float y = acc[pr * c + j] + bias[j] + __half2float(residual[idx]);
    range_flag(range_flags, range_layer, fp16_range_bits(y));
    out[idx] = __float2half_rn(y);
}

// PatchMerging's nn.Unfold(kernel 2, stride 2) of [n, h, w, c] tokens zero-padded right and
// bottom to even size: out[(b, i, j)][ch * 4 + dh * 2 + dw] = x[b, 2i + dh, 2j + dw, ch].
extern "C" __global__ void swin_merge_gather(const __half* __restrict__ x, u32 n, u32 h, u32 w, u32 c, u32 ho, u32 wo,
                                             __half* __restrict__ out) {
    const u32 c4 = 4u * c;
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (u64)n * ho * wo * c4) return;
    const u32 idx = (u32)gid;  // < 2^32: the host checks the element count
    const u32 t = idx / c4, f = idx % c4;
    const u32 ch = f >> 2, dh = (f >> 1) & 1u, dw = f & 1u;
    const u32 j = t % wo, i = (t / wo) % ho, b = t / (wo * ho);
    const u32 y = 2u * i + dh, xx = 2u * j + dw;
    out[idx] = (y < h && xx < w) ? x[(((u64)b * h + y) * w + xx) * c + ch] : __float2half_rn(0.0f);
}

// ---- The fused-GEMM path (src/camera/swin_cuda.rs with cuBLASLt): the GEMMs write FP16 with the
// bias already added (src/model/gpu_lt.rs), so these read FP16, eight values a thread with
// 16-byte loads and stores (every block's channel count is a multiple of 8: the host checks it
// at upload), each value through the same operations as one value a thread would be. ----
//
// FP16 range guard on this path: the GEMM's FP16 output is an activation stored by cuBLASLt, which
// cannot flag it, so the kernel that reads it next flags what it reads (fp16_stored_range_bits)
// as well as what it stores itself (fp16_range_bits); a GEMM output that no kernel here reads
// (patch embedding, fc2 + residual, patch merging) is scanned by swin_range_scan_h when the
// forward is guarded. Same trailing `range_flags` (may be NULL), `range_layer` as above.

// The guard's bits for a value read back from FP16 that a GEMM stored: its FP32 result was at or
// beyond FP16's range exactly when the stored value is +-65504 or +-inf (the conversion rounds to
// one of them), which the FP32-input path flags as RANGE_SATURATED before its own rounding, so
// both count as saturated here; NaN is RANGE_NONFINITE.
__device__ __forceinline__ u32 fp16_stored_range_bits(float v) {
    const float a = fabsf(v);
    return a < 65504.0f ? 0u : (a == a ? RANGE_SATURATED : RANGE_NONFINITE);  // NaN: a != a
}
__device__ __forceinline__ u32 fp16_stored_range_bits2(float2 f) { return fp16_stored_range_bits(f.x) | fp16_stored_range_bits(f.y); }

// GELU as nn.GELU() computes it (the erf form), as layers.cu's gelu_erf.
__device__ __forceinline__ float swin_gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }

// Eight FP16 values as four pairs, for 16-byte loads and stores.
union Half8 {
    uint4 u;
    __half2 h[4];
};

// qkv split of the FP16 GEMM output y [rows, 3c] (bias added): q = y[:, :c] * scale, k, v copied.
// One thread per eight values; `octs` = rows * 3c / 8.
extern "C" __global__ void swin_qkv_split_h(const uint4* __restrict__ y, u32 octs, u32 c, float scale,
                                            uint4* __restrict__ q, uint4* __restrict__ k, uint4* __restrict__ v,
                                            u32* __restrict__ range_flags, u32 range_layer) {
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= octs) return;
    const u32 p = (u32)gid;
    const u32 oc = c >> 3, oc3 = 3u * oc;
    const u32 r = p / oc3, j = p % oc3;
    const u32 part = j / oc, col = j % oc;
    Half8 val;
    val.u = y[p];
    u32 bits = 0;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const float2 f = __half22float2(val.h[t]);
        bits |= fp16_stored_range_bits2(f);
        if (part == 0) {
            const float a = f.x * scale, b = f.y * scale;
            bits |= fp16_range_bits(a) | fp16_range_bits(b);
            val.h[t] = __floats2half2_rn(a, b);
        }
    }
    range_flag(range_flags, range_layer, bits);
    uint4* dst = part == 0 ? q : (part == 1 ? k : v);
    dst[(u64)r * oc + col] = val.u;
}

// proj's output on the padded grid (FP16, bias added), cropped, plus the block's residual:
// out[t] = y[its padded row] + residual[t], eight channels a thread; `octs` = n * h * w * c / 8.
extern "C" __global__ void swin_crop_residual_h(const uint4* __restrict__ y, u32 octs, u32 h, u32 w, u32 hp, u32 wp, u32 c,
                                                const uint4* __restrict__ residual, uint4* __restrict__ out,
                                                u32* __restrict__ range_flags, u32 range_layer) {
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= octs) return;
    const u32 p = (u32)gid;
    const u32 oc = c >> 3;
    const u32 t = p / oc, j = p % oc;
    const u32 qx = t % w, r = (t / w) % h, b = t / (w * h);
    const u64 pr = ((u64)b * hp + r) * wp + qx;
    Half8 a8, s8, o8;
    a8.u = y[pr * oc + j];
    s8.u = residual[p];
    u32 bits = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 a = __half22float2(a8.h[k]);
        const float2 s = __half22float2(s8.h[k]);
        const float o0 = a.x + s.x, o1 = a.y + s.y;
        bits |= fp16_stored_range_bits2(a) | fp16_range_bits(o0) | fp16_range_bits(o1);
        o8.h[k] = __floats2half2_rn(o0, o1);
    }
    range_flag(range_flags, range_layer, bits);
    out[p] = o8.u;
}

// Exact GELU in place on `octs` groups of eight FP16 values (fc1's output, bias added). The guard
// sees fc1's output as read (a huge negative value leaves GELU as -0, yet it was out of range when
// stored) and the GELU's.
extern "C" __global__ void swin_gelu_h(uint4* __restrict__ x, u32 octs, u32* __restrict__ range_flags, u32 range_layer) {
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= octs) return;
    Half8 v;
    v.u = x[gid];
    u32 bits = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 f = __half22float2(v.h[k]);
        const float g0 = swin_gelu_erf(f.x), g1 = swin_gelu_erf(f.y);
        bits |= fp16_stored_range_bits2(f) | fp16_range_bits(g0) | fp16_range_bits(g1);
        v.h[k] = __floats2half2_rn(g0, g1);
    }
    range_flag(range_flags, range_layer, bits);
    x[gid] = v.u;
}

// The guard alone over `pairs` pairs of FP16 values a GEMM stored (the fused path's outputs that
// no kernel above reads: patch embedding, fc2 + residual, patch merging); launched only when the
// forward is guarded. Reads, never writes.
extern "C" __global__ void swin_range_scan_h(const __half2* __restrict__ x, u32 pairs, u32* __restrict__ range_flags, u32 range_layer) {
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= pairs) return;
    range_flag(range_flags, range_layer, fp16_stored_range_bits2(__half22float2(x[gid])));
}
