// Dense per-row layers of the network on CUDA (see src/model/sphereformer_cuda.rs): LayerNorm,
// the epilogue of a Linear whose GEMM (cuBLAS, FP16 in, FP32 out) ran before it, BatchNorm + ReLU,
// channel concatenation, the down level's voxel positions, and the head's arg-max.
//
// Activations are rows `[n, c]` of store_t (FP16, or BF16 in the module's BF16 build: storage.cuh);
// every reduction and every epilogue is FP32. Compiled with
// FMA contraction on (nothing here must round op by op like PyTorch; `downsample_xyz` only adds
// and divides, which contraction cannot change).
//
// Every kernel that stores activations takes `range_flags` (may be NULL) and `range_layer`:
// the range guard of prelude.cuh / storage.cuh over the values it stores. concat_rows copies
// values another guarded kernel stored, so it has none; pad_channels_f16 guards the network's
// input features (FP16 in both builds: the voxelization stores them), add_bias_f32 flags
// non-finite FP32 logits.
// A value is guarded before a ReLU or GELU: those would turn a NaN or -inf into 0 and hide it.

// nn.LayerNorm over the c channels of each row (biased variance, eps inside the square root).
// One warp per row; c <= 32 * PER_LANE: layer_norm_rows up to 512 channels (LN_MAX_PER_LANE),
// layer_norm_rows_wide up to 1536 (LN_WIDE_PER_LANE: Swin's 4 x 384 features before a patch
// merging's reduction) with three times the registers.
#define LN_MAX_PER_LANE 16
#define LN_WIDE_PER_LANE 48
template <int PER_LANE>
__device__ __forceinline__ void layer_norm_row(const store_t* __restrict__ x, u32 n, u32 c, const float* __restrict__ gamma,
                                               const float* __restrict__ beta, float eps, store_t* __restrict__ out,
                                               u32* __restrict__ range_flags, u32 range_layer) {
    const u32 row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const u32 lane = threadIdx.x & 31u;
    if (row >= n) return;
    const store_t* xr = x + (u64)row * c;
    float v[PER_LANE];
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const u32 j = lane + 32u * t;
        v[t] = j < c ? store_to_float(xr[j]) : 0.0f;
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
    store_t* orow = out + (u64)row * c;
    u32 bits = 0;
#pragma unroll
    for (int t = 0; t < PER_LANE; ++t) {
        const u32 j = lane + 32u * t;
        if (j < c) {
            const float y = (v[t] - mean) * inv * gamma[j] + beta[j];
            bits |= store_range_bits(y);
            orow[j] = store_from_float(y);
        }
    }
    range_flag(range_flags, range_layer, bits);
}

extern "C" __global__ void layer_norm_rows(const store_t* __restrict__ x, u32 n, u32 c, const float* __restrict__ gamma,
                                           const float* __restrict__ beta, float eps, store_t* __restrict__ out,
                                           u32* __restrict__ range_flags, u32 range_layer) {
    layer_norm_row<LN_MAX_PER_LANE>(x, n, c, gamma, beta, eps, out, range_flags, range_layer);
}

extern "C" __global__ void layer_norm_rows_wide(const store_t* __restrict__ x, u32 n, u32 c, const float* __restrict__ gamma,
                                                const float* __restrict__ beta, float eps, store_t* __restrict__ out,
                                                u32* __restrict__ range_flags, u32 range_layer) {
    layer_norm_row<LN_WIDE_PER_LANE>(x, n, c, gamma, beta, eps, out, range_flags, range_layer);
}

// GELU as nn.GELU() computes it (the erf form).
__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752440f)); }

// out[r, j] = act((acc[r, col0 + j] + bias[j]) * scale) (+ residual[r, j]), j < c, stored as store_t.
// acc: FP32 GEMM output with `acc_ld` floats a row; act: 0 none, 1 GELU; residual may be NULL.
extern "C" __global__ void linear_epilogue(const float* __restrict__ acc, u32 acc_ld, u32 col0, u32 n, u32 c,
                                           const float* __restrict__ bias, float scale, u32 act,
                                           const store_t* __restrict__ residual, store_t* __restrict__ out,
                                           u32* __restrict__ range_flags, u32 range_layer) {
    // the host checks n * c < 2^32: 32-bit index arithmetic (a 64-bit division costs several
    // times more), 64-bit addresses
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (u64)n * c) return;
    const u32 idx = (u32)gid;  // < 2^32: the host checks the element count
    const u32 r = idx / c, j = idx % c;
    float y = (acc[(u64)r * acc_ld + col0 + j] + bias[j]) * scale;
    // the Linear's own output (upstream stores it before the GELU) and what is stored
    u32 bits = store_range_bits(y);
    if (act == 1) y = gelu_erf(y);
    if (residual) y += store_to_float(residual[idx]);
    range_flag(range_flags, range_layer, bits | store_range_bits(y));
    out[idx] = store_from_float(y);
}

// linear_epilogue four consecutive values of a row a thread (c, acc_ld and col0 multiples of 4:
// 16-byte accumulator loads, 2-value stores), each value computed as there.
extern "C" __global__ void linear_epilogue4(const float* __restrict__ acc, u32 acc_ld, u32 col0, u32 n, u32 c,
                                            const float* __restrict__ bias, float scale, u32 act,
                                            const store_t* __restrict__ residual, store_t* __restrict__ out,
                                            u32* __restrict__ range_flags, u32 range_layer) {
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid * 4u >= (u64)n * c) return;
    const u32 idx = (u32)gid * 4u;  // < 2^32: the host checks the element count
    const u32 r = idx / c, j = idx % c;
    const float4 a = *reinterpret_cast<const float4*>(acc + (u64)r * acc_ld + col0 + j);
    float y[4] = {(a.x + bias[j]) * scale, (a.y + bias[j + 1]) * scale, (a.z + bias[j + 2]) * scale, (a.w + bias[j + 3]) * scale};
    u32 bits = store_range_bits(y[0]) | store_range_bits(y[1]) | store_range_bits(y[2]) | store_range_bits(y[3]);
    if (act == 1)
        for (int e = 0; e < 4; ++e) y[e] = gelu_erf(y[e]);
    if (residual) {
        const store2_t* r2 = reinterpret_cast<const store2_t*>(residual + idx);
        const float2 p = store2_to_float2(r2[0]), q = store2_to_float2(r2[1]);
        y[0] += p.x;
        y[1] += p.y;
        y[2] += q.x;
        y[3] += q.y;
    }
    range_flag(range_flags, range_layer, bits | store_range_bits(y[0]) | store_range_bits(y[1]) | store_range_bits(y[2]) | store_range_bits(y[3]));
    store2_t* o2 = reinterpret_cast<store2_t*>(out + idx);
    o2[0] = store2_from_floats(y[0], y[1]);
    o2[1] = store2_from_floats(y[2], y[3]);
}

// The q, k and v of a packed qkv Linear in one pass, as three linear_epilogue calls would give
// them: acc [n, 3c] FP32 (the GEMM output without bias), q = (acc[:, 0:c] + bias_q) * q_scale,
// k = acc[:, c:2c] + bias_k, v = acc[:, 2c:3c] + bias_v, each stored [n, c]. Four consecutive
// values a thread (one 16-byte load, two 2-value stores): the host checks c % 4 == 0 and
// n * 3c / 4 < 2^32.
extern "C" __global__ void qkv_epilogue(const float* __restrict__ acc, u32 n, u32 c, const float* __restrict__ bias_q,
                                        const float* __restrict__ bias_k, const float* __restrict__ bias_v,
                                        float q_scale, store_t* __restrict__ q, store_t* __restrict__ k,
                                        store_t* __restrict__ v, u32* __restrict__ range_flags, u32 range_layer) {
    const u32 quads = 3u * c / 4u;
    const u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (gid >= (u64)n * quads) return;
    const u32 idx = (u32)gid;
    const u32 r = idx / quads, col = (idx % quads) * 4u;  // col < 3c, a multiple of 4
    const u32 part = col / c, j = col - part * c;
    const float* bias = part == 0u ? bias_q : part == 1u ? bias_k : bias_v;
    const float scale = part == 0u ? q_scale : 1.0f;
    store_t* out = part == 0u ? q : part == 1u ? k : v;
    const float4 a = *reinterpret_cast<const float4*>(acc + (u64)r * 3u * c + col);
    const float y0 = (a.x + bias[j]) * scale, y1 = (a.y + bias[j + 1]) * scale;
    const float y2 = (a.z + bias[j + 2]) * scale, y3 = (a.w + bias[j + 3]) * scale;
    range_flag(range_flags, range_layer, store_range_bits(y0) | store_range_bits(y1) | store_range_bits(y2) | store_range_bits(y3));
    store2_t* o2 = reinterpret_cast<store2_t*>(out + (u64)r * c + j);
    o2[0] = store2_from_floats(y0, y1);
    o2[1] = store2_from_floats(y2, y3);
}

// Folded inference BatchNorm followed by ReLU: out = max(x * scale + shift, 0) per channel.
extern "C" __global__ void bn_relu_rows(const store_t* __restrict__ x, u32 n, u32 c, const float* __restrict__ scale,
                                        const float* __restrict__ shift, store_t* __restrict__ out,
                                        u32* __restrict__ range_flags, u32 range_layer) {
    const u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)n * c) return;
    const u32 j = (u32)(idx % c);
    // the affine map before the ReLU: fmaxf would turn a NaN into 0 and hide it
    const float y = store_to_float(x[idx]) * scale[j] + shift[j];
    range_flag(range_flags, range_layer, store_range_bits(y));
    out[idx] = store_from_float(fmaxf(y, 0.0f));
}

// Row-wise [a | b]: out[r] = (a[r, 0..ca], b[r, 0..cb]).
extern "C" __global__ void concat_rows(const store_t* __restrict__ a, u32 ca, const store_t* __restrict__ b, u32 cb, u32 n,
                                       store_t* __restrict__ out) {
    const u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u32 c = ca + cb;
    if (idx >= (u64)n * c) return;
    const u64 r = idx / c;
    const u32 j = (u32)(idx % c);
    out[idx] = j < ca ? a[r * ca + j] : b[r * cb + (j - ca)];
}

// The next level's voxel positions (upstream get_downsample_info): per output of a strided map,
// the float32 mean of its inputs' xyz, summed offset by offset in offset order as the CPU
// reference does; its batch index is the output coordinate's.
extern "C" __global__ void downsample_xyz(const i32* __restrict__ nbr, u32 m, u32 kv, const float* __restrict__ xyz,
                                          const i32* __restrict__ out_coords, float* __restrict__ out_xyz,
                                          i32* __restrict__ out_batch) {
    const u32 o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= m) return;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
    u32 count = 0;
    for (u32 k = 0; k < kv; ++k) {
        const i32 i = nbr[(u64)o * kv + k];
        if (i < 0) continue;
        s0 = __fadd_rn(s0, xyz[(u64)i * 3]);
        s1 = __fadd_rn(s1, xyz[(u64)i * 3 + 1]);
        s2 = __fadd_rn(s2, xyz[(u64)i * 3 + 2]);
        ++count;
    }
    const float cnt = (float)(count > 0 ? count : 1);
    out_xyz[(u64)o * 3] = __fdiv_rn(s0, cnt);
    out_xyz[(u64)o * 3 + 1] = __fdiv_rn(s1, cnt);
    out_xyz[(u64)o * 3 + 2] = __fdiv_rn(s2, cnt);
    out_batch[o] = out_coords[(u64)o * 4];
}

// The head's logits in place: logits[r, j] += bias[j] (FP32 GEMM output). FP32 has the range:
// only NaN and inf are flagged.
extern "C" __global__ void add_bias_f32(float* __restrict__ logits, u32 n, u32 c, const float* __restrict__ bias,
                                        u32* __restrict__ range_flags, u32 range_layer) {
    const u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)n * c) return;
    const float y = logits[idx] + bias[idx % c];
    range_flag(range_flags, range_layer, fabsf(y) <= 3.402823466e38f ? 0u : RANGE_NONFINITE);
    logits[idx] = y;
}

// [n, c] -> [n, c_pad] (c_pad >= c), the extra channels zero: a narrow input widened for the
// tensor-core conv (its padded weights are zero), converted to the storage type. The input is
// FP16 in both builds (the voxelization stores it), so it is guarded against FP16's range: a value
// the FP16 conversion before it saturated (an intensity of 65,520 or more) is inf here.
extern "C" __global__ void pad_channels_f16(const __half* __restrict__ x, u32 n, u32 c, u32 c_pad,
                                            store_t* __restrict__ out, u32* __restrict__ range_flags, u32 range_layer) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)n * c_pad) return;
    const u32 row = (u32)(i / c_pad), col = (u32)(i % c_pad);
#if defined(SPTR_STORAGE_BF16) || defined(SPTR_STORAGE_F32)
    const float f = col < c ? __half2float(x[(u64)row * c + col]) : 0.f;
    range_flag(range_flags, range_layer, fp16_range_bits(f));
    out[i] = store_from_float(f);  // exact for 0 and inf; FP16's 11 bits rounded to BF16's 8 (FP32: exact)
#else
    const __half v = col < c ? x[(u64)row * c + col] : __float2half_rn(0.f);
    range_flag(range_flags, range_layer, fp16_range_bits(__half2float(v)));
    out[i] = v;
#endif
}
