// The BEV decoder's and map head's dense ops on CUDA (see src/dense/cuda_ops.rs and
// src/dense/cudnn.rs): the scatter that finishes a kernel = stride transposed convolution, conv
// epilogues with a residual, grid sampling, and the head's sigmoid to class-major FP32 maps.
//
// FP16 storage, FP32 arithmetic. Compiled without FMA contraction: grid_sample's source
// coordinates and weights must round op by op as the CPU reference (PyTorch's order) does.
#include <cuda_fp16.h>

// A ConvTranspose2d with kernel = stride = k and no padding is a GEMM of the input pixels by the
// weight reordered to [(ky, kx, co), ci]: acc[p, (ky * k + kx) * cout + co] for input pixel
// p = (b * h + iy) * w + ix. This writes it to out[b, iy * k + ky, ix * k + kx, co] with the bias
// (a folded BatchNorm's shift) and the activation (0 none, 1 ReLU), as FP16.
extern "C" __global__ void deconv_scatter(const float* __restrict__ acc, u32 n, u32 h, u32 w, u32 k, u32 cout,
                                          const float* __restrict__ bias, u32 relu, __half* __restrict__ out) {
    const u32 oh = h * k, ow = w * k;
    const u64 total = (u64)n * oh * ow * cout;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u32 co = (u32)(i % cout);
        const u64 opix = i / cout;
        const u32 ox = (u32)(opix % ow);
        const u64 rest = opix / ow;
        const u32 oy = (u32)(rest % oh);
        const u64 b = rest / oh;
        const u32 iy = oy / k, ky = oy % k, ix = ox / k, kx = ox % k;
        const u64 p = (b * h + iy) * w + ix;
        float y = acc[(p * k * k + (u64)(ky * k + kx)) * cout + co] + bias[co];
        if (relu) y = fmaxf(y, 0.0f);
        out[i] = __float2half_rn(y);
    }
}

// out[m, j] = act(acc[m, j] + bias[j] + res[m, j]) as FP16: a BasicBlock's second conv (BN
// folded) plus its identity, then ReLU (act 1) or not (0).
extern "C" __global__ void conv_epilogue_residual(const float* __restrict__ acc, u32 m, u32 cout, const float* __restrict__ bias,
                                                  const __half* __restrict__ res, u32 relu, __half* __restrict__ out) {
    const u64 total = (u64)m * cout;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        float y = acc[i] + bias[i % cout] + __half2float(res[i]);
        if (relu) y = fmaxf(y, 0.0f);
        out[i] = __float2half_rn(y);
    }
}

// In place on an FP16 conv output without bias (cuDNN's): y = act(y + bias[j] (+ res)), with
// has_res 0 or 1 (res is not read when 0).
extern "C" __global__ void bias_act_f16(__half* __restrict__ y, u32 m, u32 cout, const float* __restrict__ bias,
                                        const __half* __restrict__ res, u32 has_res, u32 relu) {
    const u64 total = (u64)m * cout;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        float v = __half2float(y[i]) + bias[i % cout];
        if (has_res) v += __half2float(res[i]);
        if (relu) v = fmaxf(v, 0.0f);
        y[i] = __float2half_rn(v);
    }
}

// bias_act_f16 for cout a multiple of 8 and m * cout < 2^32: 8 channels a thread (16-byte
// loads and stores, 32-bit indices), the same operations per value.
extern "C" __global__ void bias_act_f16_v8(__half* __restrict__ y, u32 m, u32 cout, const float* __restrict__ bias,
                                           const __half* __restrict__ res, u32 has_res, u32 relu) {
    const u32 c8 = cout / 8;
    const u32 total = m * c8;
    uint4* y8 = reinterpret_cast<uint4*>(y);
    const uint4* r8 = reinterpret_cast<const uint4*>(res);
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 j0 = (i % c8) * 8;
        uint4 v = y8[i];
        uint4 r = has_res ? r8[i] : make_uint4(0, 0, 0, 0);
        __half* h = reinterpret_cast<__half*>(&v);
        const __half* rh = reinterpret_cast<const __half*>(&r);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            float f = __half2float(h[k]) + bias[j0 + k];
            if (has_res) f += __half2float(rh[k]);
            if (relu) f = fmaxf(f, 0.0f);
            h[k] = __float2half_rn(f);
        }
        y8[i] = v;
    }
}

// PyTorch's grid_sampler_unnormalize (+ clip_coordinates for border padding).
__device__ __forceinline__ float grid_unnormalize(float g, u32 size, u32 align_corners, u32 border) {
    const float s = (float)size;
    float c = align_corners ? (g + 1.0f) / 2.0f * (s - 1.0f) : ((g + 1.0f) * s - 1.0f) / 2.0f;
    if (border && !isnan(c)) c = fminf(fmaxf(c, 0.0f), s - 1.0f);
    return c;
}

// The four bilinear corners of grid point q (nw, ne, sw, se): their cells, their weights exactly
// as GridSampler.cuh forms them, and whether each lies inside the h x w map. NaN or huge
// coordinates put every corner outside.
struct GridCorners {
    int xs[4], ys[4];
    float ws[4];
    bool inside[4];
};

__device__ __forceinline__ GridCorners grid_corners(const float* __restrict__ grid, u64 q, u32 h, u32 w, u32 align_corners, u32 border) {
    const float ix = grid_unnormalize(grid[2 * q], w, align_corners, border);
    const float iy = grid_unnormalize(grid[2 * q + 1], h, align_corners, border);
    const float fx = floorf(ix), fy = floorf(iy);
    GridCorners g;
    g.ws[0] = ((fx + 1.0f) - ix) * ((fy + 1.0f) - iy);
    g.ws[1] = (ix - fx) * ((fy + 1.0f) - iy);
    g.ws[2] = ((fx + 1.0f) - ix) * (iy - fy);
    g.ws[3] = (ix - fx) * (iy - fy);
    // the comparisons are false for NaN; the int conversion happens only for coordinates in range
    const bool near = fx > -2.0f && fx < (float)w + 1.0f && fy > -2.0f && fy < (float)h + 1.0f;
    const int x0 = near ? (int)fx : -2, y0 = near ? (int)fy : -2;
    for (int t = 0; t < 4; ++t) {
        g.xs[t] = x0 + (t & 1);
        g.ys[t] = y0 + (t >> 1);
        g.inside[t] = g.xs[t] >= 0 && g.xs[t] < (int)w && g.ys[t] >= 0 && g.ys[t] < (int)h;
    }
    return g;
}

// F.grid_sample(x, grid, mode='bilinear') on NHWC FP16: out[b, oy, ox, ch] from x[b, h, w, ch]
// with grid[(oy * ow + ox) * 2 + {0: x, 1: y}] (one grid for the batch). Corners outside the map
// contribute nothing (zero padding; border padding clamps the coordinate first).
extern "C" __global__ void grid_sample_nhwc(const __half* __restrict__ x, u32 n, u32 h, u32 w, u32 c,
                                            const float* __restrict__ grid, u32 oh, u32 ow, u32 border,
                                            u32 align_corners, __half* __restrict__ out) {
    const u64 total = (u64)n * oh * ow * c;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u32 ch = (u32)(i % c);
        const u64 opix = i / c;
        const u64 q = opix % ((u64)oh * ow);
        const u64 b = opix / ((u64)oh * ow);
        const GridCorners g = grid_corners(grid, q, h, w, align_corners, border);
        float acc = 0.0f;
        for (int t = 0; t < 4; ++t) {
            if (g.inside[t]) acc += __half2float(x[((b * h + (u64)g.ys[t]) * w + (u64)g.xs[t]) * c + ch]) * g.ws[t];
        }
        out[i] = __float2half_rn(acc);
    }
}

// grid_sample_nhwc for c a multiple of 8 and input and output under 2^32 values: 8 channels a
// thread (the corner weights once for them, 16-byte loads and stores), each value summed over
// the corners in the scalar kernel's order.
extern "C" __global__ void grid_sample_nhwc_v8(const __half* __restrict__ x, u32 n, u32 h, u32 w, u32 c,
                                               const float* __restrict__ grid, u32 oh, u32 ow, u32 border,
                                               u32 align_corners, __half* __restrict__ out) {
    const u32 c8 = c / 8;
    const u32 plane = oh * ow;
    const u32 total = n * plane * c8;
    const uint4* x8 = reinterpret_cast<const uint4*>(x);
    uint4* out8 = reinterpret_cast<uint4*>(out);
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const u32 ch8 = i % c8;
        const u32 opix = i / c8;
        const u32 q = opix % plane;
        const u32 b = opix / plane;
        const GridCorners g = grid_corners(grid, q, h, w, align_corners, border);
        float acc[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) acc[k] = 0.0f;
        for (int t = 0; t < 4; ++t) {
            if (g.inside[t]) {
                const uint4 v = x8[((b * h + (u32)g.ys[t]) * w + (u32)g.xs[t]) * c8 + ch8];
                const __half* hv = reinterpret_cast<const __half*>(&v);
#pragma unroll
                for (int k = 0; k < 8; ++k) acc[k] += __half2float(hv[k]) * g.ws[t];
            }
        }
        uint4 o;
        __half* ho = reinterpret_cast<__half*>(&o);
#pragma unroll
        for (int k = 0; k < 8; ++k) ho[k] = __float2half_rn(acc[k]);
        out8[i] = o;
    }
}

// The head's last step: acc[(b * pixels + p) * k + j] (FP32 logits without bias, NHWC) to
// out[(b * k + j) * pixels + p] = sigmoid(acc + bias[j]), FP32, class-major. One thread per
// output value, so the writes are coalesced.
extern "C" __global__ void sigmoid_class_major(const float* __restrict__ acc, u32 n, u32 pixels, u32 k,
                                               const float* __restrict__ bias, float* __restrict__ out) {
    const u64 total = (u64)n * pixels * k;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 p = i % pixels;
        const u64 rest = i / pixels;
        const u32 j = (u32)(rest % k);
        const u64 b = rest / k;
        const float v = acc[(b * pixels + p) * k + j] + bias[j];
        out[i] = 1.0f / (1.0f + expf(-v));
    }
}
