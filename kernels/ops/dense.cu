// Dense NHWC feature maps on CUDA (see src/dense/cuda.rs): im2col for convolutions whose GEMM
// runs in cuBLAS, the conv epilogue (bias, ReLU, FP16 out), bilinear resizing as PyTorch's
// upsample_bilinear2d, and channel concatenation.
//
// FP16 storage, FP32 arithmetic. Compiled without FMA contraction: the bilinear source
// coordinates must round op by op as the CPU reference computes them.
#include <cuda_fp16.h>

// Sizes of one convolution (mirror of ConvShapeC in src/dense/cuda.rs).
struct ConvShape {
    u32 n, h, w, c;     // input NHWC
    u32 kh, kw;         // kernel
    u32 sh, sw;         // stride
    u32 ph, pw;         // zero padding
    u32 oh, ow;         // output size
    u32 kpad;           // im2col row length: kh * kw * c rounded up (zeros past kh * kw * c)
};

// col[m, k] for output pixel m = (b * oh + oy) * ow + ox and k = (ky * kw + kx) * c + ci: the input
// pixel the tap reads, zero where it falls in the padding or k >= kh * kw * c.
extern "C" __global__ void im2col_nhwc(const __half* __restrict__ x, ConvShape s, __half* __restrict__ col) {
    const u64 m_total = (u64)s.n * s.oh * s.ow;
    const u64 total = m_total * s.kpad;
    const u32 taps = s.kh * s.kw * s.c;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 m = i / s.kpad;
        const u32 k = (u32)(i % s.kpad);
        __half v = __float2half_rn(0.0f);
        if (k < taps) {
            const u32 ci = k % s.c;
            const u32 tap = k / s.c;
            const u32 kx = tap % s.kw, ky = tap / s.kw;
            const u32 ox = (u32)(m % s.ow);
            const u64 rest = m / s.ow;
            const u32 oy = (u32)(rest % s.oh);
            const u32 b = (u32)(rest / s.oh);
            // signed: the padding lies below 0
            const i64 iy = (i64)oy * s.sh + ky - s.ph;
            const i64 ix = (i64)ox * s.sw + kx - s.pw;
            if (iy >= 0 && iy < (i64)s.h && ix >= 0 && ix < (i64)s.w) {
                v = x[(((u64)b * s.h + (u64)iy) * s.w + (u64)ix) * s.c + ci];
            }
        }
        col[i] = v;
    }
}

// im2col_nhwc for c and kpad multiples of 8: each thread copies 8 halves (one 16-byte load and
// store; 8 consecutive k lie in one tap since c % 8 == 0), and indexes in 32 bits where the
// host checked that n * h * w * c and m * kpad / 8 fit. The scalar kernel's one thread per half
// and 64-bit divisions made it several times slower than its memory traffic.
extern "C" __global__ void im2col_nhwc_v8(const uint4* __restrict__ x, ConvShape s, uint4* __restrict__ col) {
    const u32 row8 = s.kpad / 8;
    const u32 c8 = s.c / 8;
    const u32 taps8 = s.kh * s.kw * c8;
    const u32 total = s.n * s.oh * s.ow * row8;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 m = i / row8;
        const u32 k8 = i - m * row8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (k8 < taps8) {
            const u32 tap = k8 / c8;
            const u32 ci8 = k8 - tap * c8;
            const u32 kx = tap % s.kw, ky = tap / s.kw;
            const u32 ox = m % s.ow;
            const u32 rest = m / s.ow;
            const u32 oy = rest % s.oh;
            const u32 b = rest / s.oh;
            // signed: the padding lies below 0
            const int iy = (int)(oy * s.sh + ky) - (int)s.ph;
            const int ix = (int)(ox * s.sw + kx) - (int)s.pw;
            if (iy >= 0 && iy < (int)s.h && ix >= 0 && ix < (int)s.w) {
                v = x[((b * s.h + (u32)iy) * s.w + (u32)ix) * c8 + ci8];
            }
        }
        col[i] = v;
    }
}

// out[m, j] = act(acc[m, j] + bias[j]) as FP16; act 0 none, 1 ReLU. acc is the GEMM's FP32 output
// with `cout` floats a row. range_flags (may be NULL), range_layer: the FP16 range guard
// (prelude.cuh) of the stored values, taken before the ReLU (which would zero a NaN or -inf).
extern "C" __global__ void conv_epilogue(const float* __restrict__ acc, u32 m, u32 cout, const float* __restrict__ bias,
                                         u32 relu, __half* __restrict__ out, u32* __restrict__ range_flags, u32 range_layer) {
    const u64 total = (u64)m * cout;
    u32 bits = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        float y = acc[i] + bias[i % cout];
        bits |= fp16_range_bits(y);
        if (relu) y = fmaxf(y, 0.0f);
        out[i] = __float2half_rn(y);
    }
    range_flag(range_flags, range_layer, bits);
}

// Source taps along one axis, as area_pixel_compute_source_index and upsample_bilinear2d compute
// them in float (the CPU reference's axis_taps): lower index, upper index, upper weight.
__device__ __forceinline__ void bilinear_taps(u32 o, u32 in, float scale, u32 align_corners, u32& i0, u32& i1, float& l1) {
    float src;
    if (align_corners) {
        src = scale * (float)o;
    } else {
        src = scale * ((float)o + 0.5f) - 0.5f;
        src = fmaxf(src, 0.0f);
    }
    u32 f = (u32)floorf(src);
    if (f > in - 1) f = in - 1;
    i0 = f;
    i1 = f < in - 1 ? f + 1 : f;
    l1 = fminf(fmaxf(src - (float)f, 0.0f), 1.0f);
}

// out[b, oy, ox, ch] from x[b, h, w, ch]; sy, sx are the host's f32 scales (as the CPU path's).
extern "C" __global__ void bilinear_resize_nhwc(const __half* __restrict__ x, u32 n, u32 h, u32 w, u32 c, u32 oh, u32 ow,
                                                float sy, float sx, u32 align_corners, __half* __restrict__ out) {
    const u64 total = (u64)n * oh * ow * c;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u32 ch = (u32)(i % c);
        const u64 p = i / c;
        const u32 ox = (u32)(p % ow);
        const u64 r = p / ow;
        const u32 oy = (u32)(r % oh);
        const u64 b = r / oh;
        u32 y0, y1, x0, x1;
        float ly, lx;
        bilinear_taps(oy, h, sy, align_corners, y0, y1, ly);
        bilinear_taps(ox, w, sx, align_corners, x0, x1, lx);
        const float hy = 1.0f - ly, hx = 1.0f - lx;
        const __half* base = x + b * h * w * c + ch;
        const float p00 = __half2float(base[((u64)y0 * w + x0) * c]);
        const float p01 = __half2float(base[((u64)y0 * w + x1) * c]);
        const float p10 = __half2float(base[((u64)y1 * w + x0) * c]);
        const float p11 = __half2float(base[((u64)y1 * w + x1) * c]);
        out[i] = __float2half_rn(hy * (hx * p00 + lx * p01) + ly * (hx * p10 + lx * p11));
    }
}

// out[p, :] = (a[p, :ca], b[p, :cb]) for every pixel p < pixels.
extern "C" __global__ void concat_channels_nhwc(const __half* __restrict__ a, u32 ca, const __half* __restrict__ b, u32 cb,
                                                u64 pixels, __half* __restrict__ out) {
    const u32 c = ca + cb;
    const u64 total = pixels * c;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 p = i / c;
        const u32 j = (u32)(i % c);
        out[i] = j < ca ? a[p * ca + j] : b[p * cb + (j - ca)];
    }
}
