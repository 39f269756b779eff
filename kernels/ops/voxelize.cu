// Voxelization: points (structure of arrays, several samples concatenated) -> voxels with
// batch-first coordinates, sorted by packed key. Host side and the algorithm: src/sparse/voxelize_cuda.rs.
// The arithmetic mirrors the CPU reference in src/sparse/voxelize.rs operation for operation
// (compiled with --fmad=false and IEEE division) so both give identical coordinates.
#include <cuda_fp16.h>

struct VoxParams {
    double voxel[3];
    double lo[3];
    double hi[3];
    u32 has_range;
    u32 clip;       // 1: clamp onto the range box, 0: drop points outside it
    u32 origin;     // 0: per-sample min, 1: range min, 2: zero
    u32 use_f64;    // key arithmetic in double (1) or float (0)
    u32 batch;      // samples
    u32 n;          // points, all samples
};

#define COUNT_VALID 0
#define COUNT_NON_FINITE 1
#define COUNT_OUT_OF_RANGE 2
#define COUNT_OUT_OF_GRID 3
#define INVALID_COORD (-2147483647 - 1)
#define GRID_LIMIT 1073741824.0

// Sample of point i: offsets has batch + 1 entries, offsets[b] <= i < offsets[b + 1].
__device__ __forceinline__ u32 sample_of(const u32* offsets, u32 batch, u32 i) {
    u32 lo = 0, hi = batch;  // invariant: offsets[lo] <= i < offsets[hi]
    while (hi - lo > 1) {
        u32 mid = (lo + hi) >> 1;
        if (offsets[mid] <= i) lo = mid; else hi = mid;
    }
    return lo;
}

// Doubles ordered as unsigned integers, so atomicMin on u64 computes a floating-point min.
__device__ __forceinline__ u64 order_f64(double v) {
    u64 b = (u64)__double_as_longlong(v);
    return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}
__device__ __forceinline__ double unorder_f64(u64 o) {
    u64 b = (o >> 63) ? (o & 0x7fffffffffffffffull) : ~o;
    return __longlong_as_double((long long)b);
}

// The coordinate used for voxels on one axis, in precision R: clipped onto the range if asked.
// Returns false when the point is dropped for being outside the range.
template <typename R>
__device__ __forceinline__ bool voxel_space(const VoxParams& P, int axis, float p, R& c) {
    c = (R)p;
    if (P.has_range) {
        const R lo = (R)P.lo[axis], hi = (R)P.hi[axis];
        if (P.clip) {
            c = fmin(fmax(c, lo), hi);
        } else if (!(c >= lo && c < hi)) {
            return false;
        }
    }
    return true;
}

__device__ __forceinline__ bool finite3(float x, float y, float z) {
    return isfinite(x) && isfinite(y) && isfinite(z);
}

template <typename R>
__device__ void scan_min_impl(const float* x, const float* y, const float* z, const u32* offsets,
                              VoxParams P, u64* mins) {
    // Every thread of the warp takes part (no early return): the warp reduces first, so a dense
    // cloud does not send 200k atomics to the same three addresses.
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 NONE = 0xffffffffu;
    u64 o[3] = {~0ull, ~0ull, ~0ull};  // ordered doubles: all ones is above every value
    u32 b = NONE;
    if (i < P.n) {
        const float p[3] = {x[i], y[i], z[i]};
        if (finite3(p[0], p[1], p[2])) {
            R c[3];
            bool kept = true;
            for (int a = 0; a < 3; ++a) kept = kept && voxel_space<R>(P, a, p[a], c[a]);
            if (kept) {
                b = sample_of(offsets, P.batch, i);
                for (int a = 0; a < 3; ++a) o[a] = order_f64((double)c[a]);
            }
        }
    }
    const u32 b0 = __reduce_min_sync(FULL_MASK, b);
    if (__all_sync(FULL_MASK, b == b0 || b == NONE)) {
        // one sample in the warp (or none): a warp minimum, one atomic per axis
        for (int a = 0; a < 3; ++a) {
            u64 m = o[a];
            for (int d = 16; d >= 1; d >>= 1) {
                const u64 other = __shfl_xor_sync(FULL_MASK, m, d);
                m = other < m ? other : m;
            }
            if ((threadIdx.x & 31u) == 0 && b0 != NONE) atomicMin(&mins[b0 * 3 + a], m);
        }
    } else if (b != NONE) {
        for (int a = 0; a < 3; ++a) atomicMin(&mins[b * 3 + a], o[a]);
    }
}

// Per-sample minimum of the voxel-space coordinates (origin `scan_min`). mins: batch * 3,
// initialised to all ones by the host.
extern "C" __global__ void vox_scan_min(const float* __restrict__ x, const float* __restrict__ y,
                                        const float* __restrict__ z, const u32* __restrict__ offsets,
                                        VoxParams P, u64* mins) {
    if (P.use_f64) scan_min_impl<double>(x, y, z, offsets, P, mins);
    else scan_min_impl<float>(x, y, z, offsets, P, mins);
}

// Sample b's origin on axis a: its scan minimum, the range's low corner, or zero.
template <typename R>
__device__ __forceinline__ R sample_origin(const VoxParams& P, const u64* mins, u32 b, int a) {
    if (P.origin == 0) return (R)unorder_f64(mins[b * 3 + a]);
    if (P.origin == 1) return (R)P.lo[a];
    return (R)0;
}

template <typename R>
__device__ void coords_impl(const float* x, const float* y, const float* z, const u32* offsets,
                            VoxParams P, const u64* mins, i32* coords, i32* bounds, u32* counters) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= P.n) return;
    coords[i * 3 + 0] = INVALID_COORD;
    const float p[3] = {x[i], y[i], z[i]};
    if (!finite3(p[0], p[1], p[2])) {
        atomicAdd(&counters[COUNT_NON_FINITE], 1u);
        return;
    }
    const u32 b = sample_of(offsets, P.batch, i);
    i32 q[3];
    for (int a = 0; a < 3; ++a) {
        R c;
        if (!voxel_space<R>(P, a, p[a], c)) {
            atomicAdd(&counters[COUNT_OUT_OF_RANGE], 1u);
            return;
        }
        const R f = floor((c - sample_origin<R>(P, mins, b, a)) / (R)P.voxel[a]);
        if (!(f >= (R)-GRID_LIMIT && f <= (R)GRID_LIMIT)) {
            atomicAdd(&counters[COUNT_OUT_OF_GRID], 1u);
            return;
        }
        q[a] = (i32)f;
    }
    for (int a = 0; a < 3; ++a) {
        coords[i * 3 + a] = q[a];
        atomicMin(&bounds[a], q[a]);
        atomicMax(&bounds[3 + a], q[a]);
    }
    atomicAdd(&counters[COUNT_VALID], 1u);
}

// Integer voxel coordinates of every point (INVALID_COORD in x when it has none), the
// coordinate bounds over valid points (bounds: min xyz, max xyz; host-initialised) and counts.
extern "C" __global__ void vox_point_coords(const float* __restrict__ x, const float* __restrict__ y,
                                            const float* __restrict__ z, const u32* __restrict__ offsets,
                                            VoxParams P, const u64* __restrict__ mins,
                                            i32* __restrict__ coords, i32* bounds, u32* counters) {
    if (P.use_f64) coords_impl<double>(x, y, z, offsets, P, mins, coords, bounds, counters);
    else coords_impl<float>(x, y, z, offsets, P, mins, coords, bounds, counters);
}

// Mixed-radix key (b, x - min_x, y - min_y, z - min_z) with radices (dx, dy, dz): the key order
// is the lexicographic order of [b, x, y, z]. Points without a voxel get `invalid_key`, above
// every valid key, so they sort to the end. vals gets the identity permutation.
extern "C" __global__ void vox_keys(const i32* __restrict__ coords, const u32* __restrict__ offsets,
                                    u32 batch, u32 n, const i32* __restrict__ bounds,
                                    u64 dx, u64 dy, u64 dz, u64 invalid_key,
                                    u64* __restrict__ keys, u32* __restrict__ vals) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    vals[i] = i;
    const i32 cx = coords[i * 3 + 0];
    if (cx == INVALID_COORD) {
        keys[i] = invalid_key;
        return;
    }
    const u64 b = sample_of(offsets, batch, i);
    const u64 rx = (u64)(i64)(cx - bounds[0]);
    const u64 ry = (u64)(i64)(coords[i * 3 + 1] - bounds[1]);
    const u64 rz = (u64)(i64)(coords[i * 3 + 2] - bounds[2]);
    keys[i] = ((b * dx + rx) * dy + ry) * dz + rz;
}

// flags[i] = 1 where sorted position i starts a new voxel.
extern "C" __global__ void vox_heads(const u64* __restrict__ keys, u32 n_valid, u32 n, u32* __restrict__ flags) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    flags[i] = (i < n_valid && (i == 0 || keys[i] != keys[i - 1])) ? 1u : 0u;
}

// Voxel id of each sorted point (exclusive scan of heads + head - 1); first sorted position of
// each voxel; point -> voxel map in input order (-1: no voxel, or voxel past the cap).
extern "C" __global__ void vox_assign(const u32* __restrict__ vals, const u32* __restrict__ flags,
                                      const u32* __restrict__ excl, u32 n, u32 n_valid, u32 max_voxels,
                                      u32* __restrict__ voxel_start, i32* __restrict__ point_to_voxel) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (i >= n_valid) {
        point_to_voxel[vals[i]] = -1;
        return;
    }
    const u32 vid = excl[i] + flags[i] - 1u;
    if (flags[i]) voxel_start[vid] = i;
    if (i == n_valid - 1) voxel_start[vid + 1] = n_valid;
    point_to_voxel[vals[i]] = vid < max_voxels ? (i32)vid : -1;
}

// Voxels with more points than this are summed by their whole warp (see vox_reduce).
#define BIG_VOXEL 32
// vox_reduce's block size (the host launches it with this many threads; a warp's staged
// addends are a row of `staged`).
#define THREADS_REDUCE 256
// Points of a big voxel staged at a time (a multiple of 16, so a warp's copy is whole rows:
// BIG_STEP * 10 floats, 40 per lane; 40 KB of shared memory a block).
#define BIG_STEP 128

// The ten values one point adds to its voxel's sums: raw x, y, z, intensity; the clipped
// position in the key precision, as float; and that position minus the sample origin, as float.
template <typename R>
__device__ __forceinline__ void addends_of(const float raw[4], const VoxParams& P, const R o[3], float add[10]) {
    for (int c = 0; c < 4; ++c) add[c] = raw[c];
    for (int a = 0; a < 3; ++a) {
        R c;
        voxel_space<R>(P, a, raw[a], c);
        add[4 + a] = (float)c;
        add[7 + a] = (float)(c - o[a]);
    }
}

// The sample of sorted key k and the voxel's coordinates relative to the bounds' minimum.
__device__ __forceinline__ u64 split_key(u64 k, u64 dx, u64 dy, u64 dz, u64& rx, u64& ry, u64& rz) {
    rz = k % dz; k /= dz;
    ry = k % dy; k /= dy;
    rx = k % dx;
    return k / dx;
}

template <typename R>
__device__ void addends_impl(const float* x, const float* y, const float* z, const float* intensity, const u32* offsets,
                             VoxParams P, const u32* vals, u32 n_valid, const u64* mins, float* addends) {
    const u32 j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= n_valid) return;
    const u32 p = vals[j];
    const u32 b = sample_of(offsets, P.batch, p);
    R o[3];
    for (int a = 0; a < 3; ++a) o[a] = sample_origin<R>(P, mins, b, a);
    const float raw[4] = {x[p], y[p], z[p], intensity[p]};
    float add[10];
    addends_of<R>(raw, P, o, add);
#pragma unroll
    for (int q = 0; q < 10; ++q) addends[(u64)j * 10 + q] = add[q];
}

// One thread per valid sorted point j: the ten values it adds to its voxel's sums
// (addends_of), at addends[j * 10 ..]. Computed here, all points at once, so that vox_reduce
// reads each voxel's addends as one contiguous run instead of a chain of dependent loads
// (sorted position -> point -> coordinates) per point.
extern "C" __global__ void vox_addends(const float* __restrict__ x, const float* __restrict__ y,
                                       const float* __restrict__ z, const float* __restrict__ intensity,
                                       const u32* __restrict__ offsets, VoxParams P, const u32* __restrict__ vals,
                                       u32 n_valid, const u64* __restrict__ mins, float* __restrict__ addends) {
    if (P.use_f64) addends_impl<double>(x, y, z, intensity, offsets, P, vals, n_valid, mins, addends);
    else addends_impl<float>(x, y, z, intensity, offsets, P, vals, n_valid, mins, addends);
}

// One thread per kept voxel (a warp for a big one): coordinates [b, x, y, z], mean features (x, y,
// z, intensity as given, FP16), mean voxel-space position (metres, f32), mean of float32(position -
// sample origin) (SphereFormer's coord_norm; each point's difference taken in the key precision)
// and point count, from vox_addends' rows. Sums run in input order, as the CPU reference's.
extern "C" __global__ void __launch_bounds__(THREADS_REDUCE) vox_reduce(const float* __restrict__ addends,
                                      const u64* __restrict__ keys, const u32* __restrict__ voxel_start, u32 m,
                                      const i32* __restrict__ bounds, u64 dx, u64 dy, u64 dz,
                                      i32* __restrict__ out_coords, __half* __restrict__ out_feats,
                                      float* __restrict__ out_xyz, float* __restrict__ out_xyz_norm,
                                      u32* __restrict__ out_counts) {
    // Every lane stays to the end: a big voxel is summed by its whole warp.
    const u32 v = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 lane = threadIdx.x & 31u;
    const bool valid = v < m;
    u32 s = 0, e = 0;
    if (valid) {
        s = voxel_start[v];
        e = voxel_start[v + 1];
    }
    // sums[0..4): raw features, [4..7): positions, [7..10): positions minus the origin; each
    // summed in input order (sorted order within a voxel: the sort is stable), as the CPU does
    float sums[10] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    const bool big = valid && e - s > BIG_VOXEL;
    if (valid && !big) {
        for (u32 j = s; j < e; ++j) {
#pragma unroll
            for (int q = 0; q < 10; ++q) sums[q] += addends[(u64)j * 10 + q];
        }
    }
    // Big voxels (points clipped onto the range's faces, or a sensor's returns off the vehicle,
    // pile up in thousands): one at a time, the warp copies BIG_STEP points' addends (one
    // contiguous run) to shared memory, the next BIG_STEP already loading; lane q < 10 then adds
    // quantity q's addends in input order, so the float additions are the one-thread loop's.
    // The step is long enough that the adds, not the load latency, set its time. (Shuffling each
    // addend to every lane instead cost ~100 cycles a point: 250 us for the nuScenes sweep.)
    __shared__ float staged[THREADS_REDUCE / 32][BIG_STEP * 10];
    float* mine = staged[threadIdx.x >> 5];
    for (u32 bigs = __ballot_sync(FULL_MASK, big); bigs; bigs &= bigs - 1) {
        const int leader = __ffs(bigs) - 1;
        const u32 bs = __shfl_sync(FULL_MASK, s, leader), be = __shfl_sync(FULL_MASK, e, leader);
        float acc = 0.f;  // lane q < 10: quantity q's sum
        const u64 last = (u64)be * 10;
        constexpr int PER_LANE = BIG_STEP * 10 / 32;
        float next[PER_LANE];
#pragma unroll
        for (int r = 0; r < PER_LANE; ++r) {
            const u64 i = (u64)bs * 10 + r * 32 + lane;
            next[r] = i < last ? addends[i] : 0.f;
        }
        for (u32 base = bs; base < be; base += BIG_STEP) {
#pragma unroll
            for (int r = 0; r < PER_LANE; ++r) mine[r * 32 + lane] = next[r];
#pragma unroll
            for (int r = 0; r < PER_LANE; ++r) {
                const u64 i = (u64)(base + BIG_STEP) * 10 + r * 32 + lane;
                next[r] = i < last ? addends[i] : 0.f;
            }
            __syncwarp();
            const u32 cnt = min((u32)BIG_STEP, be - base);
            if (lane < 10) {
                if (cnt == BIG_STEP) {
#pragma unroll 32
                    for (u32 i = 0; i < BIG_STEP; ++i) acc += mine[i * 10 + lane];
                } else {
                    for (u32 i = 0; i < cnt; ++i) acc += mine[i * 10 + lane];
                }
            }
            __syncwarp();  // the staged addends are read before the next step overwrites them
        }
#pragma unroll
        for (int q = 0; q < 10; ++q) {
            const float x = __shfl_sync(FULL_MASK, acc, q);
            if ((int)lane == leader) sums[q] = x;
        }
    }
    if (!valid) return;
    u64 rx, ry, rz;
    const u64 b = split_key(keys[s], dx, dy, dz, rx, ry, rz);
    const float cnt = (float)(e - s);
    for (int c = 0; c < 4; ++c) out_feats[v * 4 + c] = __float2half_rn(sums[c] / cnt);
    for (int a = 0; a < 3; ++a) out_xyz[v * 3 + a] = sums[4 + a] / cnt;
    for (int a = 0; a < 3; ++a) out_xyz_norm[v * 3 + a] = sums[7 + a] / cnt;
    out_counts[v] = e - s;
    out_coords[v * 4 + 0] = (i32)b;
    out_coords[v * 4 + 1] = (i32)((i64)rx + bounds[0]);
    out_coords[v * 4 + 2] = (i32)((i64)ry + bounds[1]);
    out_coords[v * 4 + 3] = (i32)((i64)rz + bounds[2]);
}
