// Sparse window attention, the exact part (see src/attention/cuda.rs): spherical coordinates,
// window partition helpers and SphereFormer's contextual RPE quantization. The attention kernels
// themselves are in attention_core.cu.
//
// Float arithmetic mirrors PyTorch's CUDA float32 ops one by one (the module is compiled with
// --fmad=false, so nothing is contracted): window cells, quantized positions, spherical
// coordinates and the radial split land in the same bins as upstream's.
#include <cuda_fp16.h>

#define PI_F 3.14159265358979323846f

// Order-preserving map of a float to u32 (atomicMin/atomicMax on floats).
__device__ __forceinline__ u32 order_f32(float v) {
    const u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float unorder_f32(u32 o) {
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// SphereFormer's cart2sphere of position i, op by op: a tensor divided by a Python scalar is a
// multiplication by the float32 reciprocal in PyTorch's CUDA kernels.
__device__ __forceinline__ void cart2sphere_at(const float* __restrict__ xyz, u32 i, float out[3]) {
    const float x = xyz[i * 3], y = xyz[i * 3 + 1], z = xyz[i * 3 + 2];
    const float inv_pi = 1.0f / PI_F;
    const float theta = ((atan2f(y, x) + PI_F) * 180.0f) * inv_pi;
    const float xy2 = x * x + y * y;
    const float beta = (atan2f(sqrtf(xy2), z) * 180.0f) * inv_pi;
    out[0] = theta;
    out[1] = beta;
    out[2] = sqrtf(xy2 + z * z);
}

extern "C" __global__ void attn_cart2sphere(const float* __restrict__ xyz, u32 n, float* __restrict__ out) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float s[3];
    cart2sphere_at(xyz, i, s);
    out[i * 3] = s[0];
    out[i * 3 + 1] = s[1];
    out[i * 3 + 2] = s[2];
}

// Per-axis min and max of positions (ordered u32; host initialises mins to ~0 and maxs to 0) and
// the batch range: a thread's running bounds, then reduced per warp by shuffles, per block in
// shared memory and with one global atomic per value and block (contended global atomics from
// every thread made this a 16 us kernel at 320k voxels).
struct Bounds {
    u32 lo[4] = {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu};
    u32 hi[4] = {0u, 0u, 0u, 0u};

    __device__ __forceinline__ void add(const float p[3], i32 b) {
        for (int a = 0; a < 3; ++a) {
            const u32 o = order_f32(p[a]);
            lo[a] = min(lo[a], o);
            hi[a] = max(hi[a], o);
        }
        lo[3] = min(lo[3], (u32)b);
        hi[3] = max(hi[3], (u32)b);
    }

    // Every thread of the block calls it; block_bounds: 8 words of shared memory.
    __device__ __forceinline__ void publish(u32* block_bounds, u32* bounds /* min x,y,z, max x,y,z, min b, max b */) {
        if (threadIdx.x < 8) block_bounds[threadIdx.x] = threadIdx.x < 3 || threadIdx.x == 6 ? 0xffffffffu : 0u;
        __syncthreads();
        for (int a = 0; a < 4; ++a) {
            lo[a] = __reduce_min_sync(FULL_MASK, lo[a]);
            hi[a] = __reduce_max_sync(FULL_MASK, hi[a]);
        }
        if ((threadIdx.x & 31u) == 0) {
            for (int a = 0; a < 3; ++a) {
                atomicMin(&block_bounds[a], lo[a]);
                atomicMax(&block_bounds[3 + a], hi[a]);
            }
            atomicMin(&block_bounds[6], lo[3]);
            atomicMax(&block_bounds[7], hi[3]);
        }
        __syncthreads();
        if (threadIdx.x < 8) {
            const u32 v = block_bounds[threadIdx.x];
            if (threadIdx.x < 3 || threadIdx.x == 6) atomicMin(&bounds[threadIdx.x], v);
            else atomicMax(&bounds[threadIdx.x], v);
        }
    }
};

// The bounds of one partition's positions. Grid-stride (the host caps the grid).
extern "C" __global__ void attn_bounds(const float* __restrict__ pos, const i32* __restrict__ batch, u32 n, u32* bounds) {
    __shared__ u32 block_bounds[8];
    Bounds b;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float p[3] = {pos[i * 3], pos[i * 3 + 1], pos[i * 3 + 2]};
        b.add(p, batch[i]);
    }
    b.publish(block_bounds, bounds);
}

// A SphereFormer level's first step in one pass: cart2sphere of every position into `sphere`,
// and the bounds of both partitions, the cubic one's over the positions and the spherical one's
// over their spherical coordinates (what attn_cart2sphere and two attn_bounds compute).
// Grid-stride (the host caps the grid).
extern "C" __global__ void attn_sphere_and_bounds(const float* __restrict__ xyz, const i32* __restrict__ batch, u32 n,
                                                  float* __restrict__ sphere, u32* cubic_bounds, u32* sphere_bounds) {
    __shared__ u32 block_bounds[8];
    Bounds cubic, spherical;
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float p[3] = {xyz[i * 3], xyz[i * 3 + 1], xyz[i * 3 + 2]};
        float s[3];
        cart2sphere_at(xyz, i, s);
        sphere[i * 3] = s[0];
        sphere[i * 3 + 1] = s[1];
        sphere[i * 3 + 2] = s[2];
        const i32 b = batch[i];
        cubic.add(p, b);
        spherical.add(s, b);
    }
    cubic.publish(block_bounds, cubic_bounds);
    __syncthreads();  // block_bounds is reused
    spherical.publish(block_bounds, sphere_bounds);
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

// The window count and the largest window (offsets[w + 1] - offsets[w]) into counts (host
// zeroes it): tell the attention call whether windows are large enough for the tiled kernel and
// how many query chunks its grid needs.
extern "C" __global__ void attn_window_nmax(const u32* __restrict__ offsets, const u32* __restrict__ scan_sums,
                                            u32 ntiles, u32 n, u32* counts) {
    // counts = [windows, largest window]; the window count is the scan's total, read here so
    // the host needs no round trip between the scan and this kernel. Launched over n >= windows.
    const u32 windows = scan_sums[ntiles];
    const u32 w = blockIdx.x * blockDim.x + threadIdx.x;
    if (w == 0) counts[0] = windows;
    if (w >= windows) return;
    atomicMax(&counts[1], offsets[w + 1] - offsets[w]);
}
