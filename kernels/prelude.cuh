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
