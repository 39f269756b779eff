// Shared by every kernel module (prepended by src/device/kernels.rs; NVRTC has no file includes).
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#define FULL_MASK 0xffffffffu

// Exclusive prefix sum of `v` over the block; `total` gets the block's sum.
// `warp_sums` must hold 33 entries (one per warp plus the total). Every thread of the block must call it.
__device__ __forceinline__ u32 block_exclusive_scan(u32 v, u32* warp_sums, u32& total) {
    const u32 lane = threadIdx.x & 31u;
    const u32 warp = threadIdx.x >> 5;
    const u32 nwarps = blockDim.x >> 5;
    u32 incl = v;
#pragma unroll
    for (u32 d = 1; d < 32; d <<= 1) {
        u32 t = __shfl_up_sync(FULL_MASK, incl, d);
        if (lane >= d) incl += t;
    }
    if (lane == 31) warp_sums[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        u32 s = lane < nwarps ? warp_sums[lane] : 0u;
        u32 si = s;
#pragma unroll
        for (u32 d = 1; d < 32; d <<= 1) {
            u32 t = __shfl_up_sync(FULL_MASK, si, d);
            if (lane >= d) si += t;
        }
        if (lane < nwarps) warp_sums[lane] = si - s;  // exclusive warp offsets
        if (lane == nwarps - 1) warp_sums[32] = si;   // block total
    }
    __syncthreads();
    u32 result = warp_sums[warp] + incl - v;
    total = warp_sums[32];
    __syncthreads();  // warp_sums may be reused by the caller right after
    return result;
}

// torch.remainder and torch.div(rounding_mode='floor') on float32 (PyTorch's CUDA formulas; no
// multiply-add in them, so FMA contraction cannot change their results).
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

// ---- FP16 range guard (src/model/range.rs). A kernel that stores FP16 activations ORs
// fp16_range_bits over the FP32 values it converts and stores, then calls range_flag once per
// thread: flags[layer] |= those bits. RANGE_SATURATED: |v| >= 65504, the largest FP16 value (v
// rounds to it or to inf); RANGE_NONFINITE: v is NaN or inf already. Bits as in range.rs.
#define RANGE_SATURATED 1u
#define RANGE_NONFINITE 2u
__device__ __forceinline__ u32 fp16_range_bits(float v) {
    const float a = fabsf(v);  // NaN fails both compares
    return a < 65504.0f ? 0u : (a <= 3.402823466e38f ? RANGE_SATURATED : RANGE_NONFINITE);
}
// Nothing happens unless bits != 0 (a frame in range: a not-taken branch, no atomic) and flags is
// set (NULL: the caller does not guard this launch). Then the converged lanes that got here with
// bits set OR theirs together and one of them does the atomicOr: safe after divergent exits and
// inside divergent branches (__activemask names exactly the lanes that take part).
__device__ __forceinline__ void range_flag(u32* flags, u32 layer, u32 bits) {
    if (bits == 0u || flags == nullptr) return;
    const u32 lanes = __activemask();
    const u32 all = __reduce_or_sync(lanes, bits);
    u32 lane;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane));
    if (lane == (u32)(__ffs((int)lanes) - 1)) atomicOr(flags + layer, all);
}
