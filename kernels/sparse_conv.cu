// Sparse convolution over a neighbour table, FP16 storage, FP32 accumulation. This is the
// correct-first direct kernel (one block per output row, one thread per output channel); the
// tensor-core implicit-GEMM kernel replaces it as the default later and is tested against it.
// Host side: src/sparse/conv_cuda.rs.
#include <cuda_fp16.h>

#define CONV_MAX_CIN 512

// out[o, co] = bias[co] + residual[o, co] + sum_k sum_ci W[k, ci, co] * act(x[nbr[o, k], ci]),
// act(v) = relu?(v * scale[ci] + shift[ci]) when `pre` is set. W is repacked [K][Cin][Cout].
extern "C" __global__ void conv_direct(const __half* __restrict__ x, const i32* __restrict__ nbr, u32 m, u32 kv,
                                       const __half* __restrict__ w, u32 cin, u32 cout,
                                       const float* __restrict__ bias, const float* __restrict__ pre_scale,
                                       const float* __restrict__ pre_shift, u32 pre, u32 relu,
                                       const __half* __restrict__ residual, __half* __restrict__ out) {
    __shared__ float row[CONV_MAX_CIN];
    const u32 o = blockIdx.x;
    const u32 co = blockIdx.y * blockDim.x + threadIdx.x;
    if (o >= m) return;
    float acc = 0.f;
    for (u32 k = 0; k < kv; ++k) {
        const i32 i = nbr[(u64)o * kv + k];  // same for the whole block: no divergence
        if (i < 0) continue;
        __syncthreads();
        for (u32 c = threadIdx.x; c < cin; c += blockDim.x) {
            float v = __half2float(x[(u64)i * cin + c]);
            if (pre) {
                v = v * pre_scale[c] + pre_shift[c];
                if (relu) v = fmaxf(v, 0.f);
            }
            row[c] = v;
        }
        __syncthreads();
        if (co < cout) {
            const __half* wk = w + (u64)k * cin * cout + co;
            for (u32 c = 0; c < cin; ++c) acc += row[c] * __half2float(wk[(u64)c * cout]);
        }
    }
    if (co >= cout) return;
    if (bias) acc += bias[co];
    if (residual) acc += __half2float(residual[(u64)o * cout + co]);
    out[(u64)o * cout + co] = __float2half_rn(acc);
}
