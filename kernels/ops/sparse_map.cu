// Kernel maps on the GPU: an open-addressing hash of packed coordinates, and neighbour tables
// nbr[out * K + k] = input row feeding output `out` through kernel offset k, or -1.
// Semantics (spconv 2.3.8) and the CPU reference: src/sparse/kernel_map.rs; host side:
// src/sparse/kernel_map_cuda.rs.

#define EMPTY_KEY 0xffffffffffffffffull
#define COORD_BIAS 32768

// [b, x, y, z] -> 64 bits: b in the top 16, then x, y, z biased by 2^15 into 16 bits each.
// Unsigned order of keys = lexicographic order of [b, x, y, z]. Returns EMPTY_KEY when a
// coordinate does not fit (such a site cannot be in the table: the host checks the inputs).
__device__ __forceinline__ u64 pack_coord(i32 b, i32 x, i32 y, i32 z) {
    if (b < 0 || b >= 65535 || x < -COORD_BIAS || x >= COORD_BIAS || y < -COORD_BIAS || y >= COORD_BIAS ||
        z < -COORD_BIAS || z >= COORD_BIAS)
        return EMPTY_KEY;
    return ((u64)b << 48) | ((u64)(x + COORD_BIAS) << 32) | ((u64)(y + COORD_BIAS) << 16) | (u64)(z + COORD_BIAS);
}

__device__ __forceinline__ u32 hash_slot(u64 k, u32 mask) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return (u32)k & mask;
}

extern "C" __global__ void hash_insert(const i32* __restrict__ coords, u32 n, u64* keys, i32* vals, u32 mask) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u64 key = pack_coord(coords[i * 4], coords[i * 4 + 1], coords[i * 4 + 2], coords[i * 4 + 3]);
    if (key == EMPTY_KEY) return;
    u32 slot = hash_slot(key, mask);
    while (true) {
        const u64 prev = atomicCAS(&keys[slot], EMPTY_KEY, key);
        if (prev == EMPTY_KEY || prev == key) {
            vals[slot] = (i32)i;
            return;
        }
        slot = (slot + 1) & mask;
    }
}

__device__ __forceinline__ i32 hash_find(const u64* keys, const i32* vals, u32 mask, u64 key) {
    if (key == EMPTY_KEY) return -1;
    u32 slot = hash_slot(key, mask);
    while (true) {
        const u64 k = keys[slot];
        if (k == key) return vals[slot];
        if (k == EMPTY_KEY) return -1;
        slot = (slot + 1) & mask;
    }
}

// Geometry of one conv, per axis.
struct MapGeom {
    i32 kernel[3], stride[3], padding[3], dilation[3];
    i32 in_origin[3], out_origin[3], out_shape[3];
    u32 kv;
};

// Where each of 64 bit positions goes: a neighbour mask's bits (bit k: offset k) to its sort key's
// and back (src/sparse/kernel_map_cuda.rs: MaskKey). Passed by value as __grid_constant__, so a
// lookup by a computed index reads the parameter bank instead of a local copy of the table.
struct BitMap64 {
    unsigned char to[64];
};

// The table copied to shared memory, for lookups whose index differs across a warp's lanes (the
// constant cache serialises those; measured, the copy made no difference to these kernels' time).
// Every thread of the block calls it (block of >= 64 threads); it ends with a barrier.
__device__ __forceinline__ const unsigned char* bit_map_shared(const BitMap64& p) {
    __shared__ unsigned char to[64];
    if (threadIdx.x < 64) to[threadIdx.x] = p.to[threadIdx.x];
    __syncthreads();
    return to;
}

__device__ __forceinline__ u64 permute_bits_of(u64 v, const unsigned char* to) {
    u64 r = 0;
    for (; v; v &= v - 1ull) r |= 1ull << to[__ffsll((long long)v) - 1];
    return r;
}

__device__ __forceinline__ void offset_of(const MapGeom& G, u32 k, i32 r[3]) {
    r[2] = k % G.kernel[2];
    r[1] = (k / G.kernel[2]) % G.kernel[1];
    r[0] = k / (G.kernel[2] * G.kernel[1]);
}

// Submanifold: input at c + (r - center) * d feeds output c. A submanifold map is symmetric:
// output o reads input j through offset k exactly when j reads o through the opposite offset
// kv - 1 - k (kernels are odd and centred, inputs are the outputs), and the centre offset reads
// the site itself. So one thread per (output, offset up to the centre) looks its neighbour up
// and writes both entries: half the hash lookups. `nbr` must hold -1 everywhere beforehand (the
// entries whose partner does not exist are not written).
// With `masks` non-NULL (kernel volume <= 64; masks zeroed, `order` of n entries) it also ORs
// the sort key of each output's neighbour bitmask (offset k's bit at key_bit.to[k]) into
// masks[o] and sets order[o] = o: the unsorted input of the map's mask order (what nbr_masks
// computes from a finished table, without reading it back).
extern "C" __global__ void submanifold_nbr(const i32* __restrict__ coords, u32 n, MapGeom G,
                                           const u64* __restrict__ keys, const i32* __restrict__ vals, u32 mask,
                                           i32* __restrict__ nbr, const __grid_constant__ BitMap64 key_bit,
                                           u64* __restrict__ masks, u32* __restrict__ order) {
    const unsigned char* to_key = bit_map_shared(key_bit);
    const u32 centre = G.kv / 2, per = centre + 1;  // threads an output: offsets 0..=centre
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = t < (u64)n * per;  // no early return: the whole warp takes part in the ballot
    const u32 o = live ? (u32)(t / per) : 0u, k = live ? (u32)(t % per) : 0u;
    i32 j = -1;
    if (live && k == centre) {
        j = (i32)o;
        nbr[(u64)o * G.kv + k] = j;
        if (masks) order[o] = o;
    } else if (live) {
        i32 r[3];
        offset_of(G, k, r);
        i32 c[3];
        for (int a = 0; a < 3; ++a) c[a] = coords[o * 4 + 1 + a] + (r[a] - G.kernel[a] / 2) * G.dilation[a];
        j = hash_find(keys, vals, mask, pack_coord(coords[o * 4], c[0], c[1], c[2]));
        nbr[(u64)o * G.kv + k] = j;
        if (j >= 0) {
            nbr[(u64)j * G.kv + (G.kv - 1 - k)] = (i32)o;
            if (masks) atomicOr(reinterpret_cast<unsigned long long*>(&masks[j]), 1ull << to_key[G.kv - 1 - k]);
        }
    }
    if (!masks) return;
    // An output's threads are consecutive, so within a warp they are a run of lanes (an output
    // spans at most two warps: two atomics). Each lane contributes its offset's key bit and the
    // run ORs them together in one reduction (not a loop over the run's bits in its first lane);
    // the warp's idle tail lanes reduce among themselves.
    const u32 lane = threadIdx.x & 31u, idle = ~__ballot_sync(FULL_MASK, live);
    const u32 first = live && lane >= k ? lane - k : 0u, last = min(31u, lane + (per - 1u - k));
    const u32 group = live ? (0xffffffffu >> (31u - last)) & (0xffffffffu << first) : idle;
    const u64 bit = live && j >= 0 ? 1ull << to_key[k] : 0ull;
    const u32 lo = __reduce_or_sync(group, (u32)bit), hi = __reduce_or_sync(group, (u32)(bit >> 32));
    if (live && lane == first && (lo | hi)) atomicOr(reinterpret_cast<unsigned long long*>(&masks[o]), ((u64)hi << 32) | lo);
}

// Strided: input i through offset k proposes output q = (rel + p - r*d) / s (relative to the
// output origin) when exact and inside the output shape.
__device__ __forceinline__ bool strided_target(const i32* __restrict__ coords, u32 i, u32 k, const MapGeom& G, i32 q[3]) {
    i32 r[3];
    offset_of(G, k, r);
    for (int a = 0; a < 3; ++a) {
        const i32 num = coords[i * 4 + 1 + a] - G.in_origin[a] + G.padding[a] - r[a] * G.dilation[a];
        if (num < 0 || num % G.stride[a] != 0) return false;
        q[a] = num / G.stride[a];
        if (q[a] >= G.out_shape[a]) return false;
    }
    return true;
}

// cand[i * K + k] = the packed absolute coordinate (pack_coord) of input i's output through
// offset k, or EMPTY_KEY.
extern "C" __global__ void strided_candidates(const i32* __restrict__ coords, u32 n, MapGeom G, u64* __restrict__ cand) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)n * G.kv) return;
    const u32 i = (u32)(t / G.kv), k = (u32)(t % G.kv);
    i32 q[3];
    u64 key = EMPTY_KEY;
    if (strided_target(coords, i, k, G, q))
        key = pack_coord(coords[i * 4], q[0] + G.out_origin[0], q[1] + G.out_origin[1], q[2] + G.out_origin[2]);
    cand[t] = key;
}

// The same candidates as compact keys: [b, q0, q1, q2] in the mixed radix (batches, out_shape),
// ((b * S0 + q0) * S1 + q1) * S2 + q2, and `empty` = batches * S0 * S1 * S2 (the host checks it
// is below 2^63) where there is no output or b is outside [0, batches). Unsigned order = the order
// of [b, x, y, z], as with pack_coord, in fewer bits.
extern "C" __global__ void strided_candidates_compact(const i32* __restrict__ coords, u32 n, MapGeom G, u32 batches, u64 empty,
                                                      u64* __restrict__ cand) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)n * G.kv) return;
    const u32 i = (u32)(t / G.kv), k = (u32)(t % G.kv);
    const i32 b = coords[i * 4];
    i32 q[3];
    u64 key = empty;
    if (b >= 0 && (u32)b < batches && strided_target(coords, i, k, G, q))
        key = (((u64)b * (u64)G.out_shape[0] + (u64)q[0]) * (u64)G.out_shape[1] + (u64)q[1]) * (u64)G.out_shape[2] + (u64)q[2];
    cand[t] = key;
}

// The candidates where an input reaches at most one output (kernel = stride and dilation 1 on
// every axis: the outputs' cells tile the grid): cand[i] = input i's output through the one
// offset that reaches it exactly, or the empty key. The same non-empty keys as the n * K
// candidates above (the other offsets give none) in n entries, so the sort takes n pairs, not
// n * K. `_tiling` as strided_candidates, `_compact_tiling` as strided_candidates_compact.
extern "C" __global__ void strided_candidates_tiling(const i32* __restrict__ coords, u32 n, MapGeom G, u64* __restrict__ cand) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    i32 q[3];
    u64 key = EMPTY_KEY;
    for (u32 k = 0; k < G.kv; ++k)
        if (strided_target(coords, i, k, G, q)) {
            key = pack_coord(coords[i * 4], q[0] + G.out_origin[0], q[1] + G.out_origin[1], q[2] + G.out_origin[2]);
            break;
        }
    cand[i] = key;
}

extern "C" __global__ void strided_candidates_compact_tiling(const i32* __restrict__ coords, u32 n, MapGeom G, u32 batches, u64 empty,
                                                             u64* __restrict__ cand) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const i32 b = coords[i * 4];
    i32 q[3];
    u64 key = empty;
    if (b >= 0 && (u32)b < batches)
        for (u32 k = 0; k < G.kv; ++k)
            if (strided_target(coords, i, k, G, q)) {
                key = (((u64)b * (u64)G.out_shape[0] + (u64)q[0]) * (u64)G.out_shape[1] + (u64)q[1]) * (u64)G.out_shape[2] + (u64)q[2];
                break;
            }
    cand[i] = key;
}

// heads[i] = 1 where sorted candidate i starts a new output site (`empty`: no output).
extern "C" __global__ void unique_heads(const u64* __restrict__ keys, u32 n, u64 empty, u32* __restrict__ heads) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    heads[i] = (keys[i] != empty && (i == 0 || keys[i] != keys[i - 1])) ? 1u : 0u;
}

// Output coordinates of the unique sorted keys (pack_coord's packing).
extern "C" __global__ void unique_coords(const u64* __restrict__ keys, const u32* __restrict__ heads,
                                         const u32* __restrict__ excl, u32 n, i32* __restrict__ out) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !heads[i]) return;
    const u64 key = keys[i];
    const u32 o = excl[i];
    out[o * 4 + 0] = (i32)(key >> 48);
    out[o * 4 + 1] = (i32)((key >> 32) & 0xffff) - COORD_BIAS;
    out[o * 4 + 2] = (i32)((key >> 16) & 0xffff) - COORD_BIAS;
    out[o * 4 + 3] = (i32)(key & 0xffff) - COORD_BIAS;
}

// Output coordinates of the unique sorted compact keys (strided_candidates_compact's radix).
extern "C" __global__ void unique_coords_compact(const u64* __restrict__ keys, const u32* __restrict__ heads,
                                                 const u32* __restrict__ excl, u32 n, MapGeom G, i32* __restrict__ out) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n || !heads[i]) return;
    u64 key = keys[i];
    const u32 o = excl[i];
    i32 q[3];
    for (int a = 2; a >= 0; --a) {
        const u64 s = (u64)G.out_shape[a];
        q[a] = (i32)(key % s);
        key /= s;
    }
    out[o * 4 + 0] = (i32)key;
    out[o * 4 + 1] = q[0] + G.out_origin[0];
    out[o * 4 + 2] = q[1] + G.out_origin[1];
    out[o * 4 + 3] = q[2] + G.out_origin[2];
}

// Strided neighbour table: output q (relative to its origin) reads input q*s - p + r*d.
extern "C" __global__ void strided_nbr(const i32* __restrict__ out_coords, u32 m, MapGeom G,
                                       const u64* __restrict__ keys, const i32* __restrict__ vals, u32 mask,
                                       i32* __restrict__ nbr) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)m * G.kv) return;
    const u32 o = (u32)(t / G.kv), k = (u32)(t % G.kv);
    i32 r[3], c[3];
    offset_of(G, k, r);
    for (int a = 0; a < 3; ++a) {
        const i32 q = out_coords[o * 4 + 1 + a] - G.out_origin[a];
        c[a] = q * G.stride[a] - G.padding[a] + r[a] * G.dilation[a] + G.in_origin[a];
    }
    nbr[t] = hash_find(keys, vals, mask, pack_coord(out_coords[o * 4], c[0], c[1], c[2]));
}

// Inverse of a strided table: inv[i * K + k] = o where nbr[o * K + k] == i (at most one o per
// (i, k): the output is determined by the input and the offset). inv must be preset to -1.
extern "C" __global__ void invert_nbr(const i32* __restrict__ nbr, u32 m, u32 kv, i32* __restrict__ inv) {
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (u64)m * kv) return;
    const i32 i = nbr[t];
    if (i >= 0) inv[(u64)i * kv + (t % kv)] = (i32)(t / kv);
}

// p[0..n) = v, four values a thread (one 16-byte store; p is an allocation's start, so aligned):
// launch ceil(n / 4) threads.
extern "C" __global__ void fill_i32(i32* __restrict__ p, u64 n, i32 v) {
    const u64 i = 4 * ((u64)blockIdx.x * blockDim.x + threadIdx.x);
    if (i + 4 <= n) {
        *reinterpret_cast<int4*>(p + i) = make_int4(v, v, v, v);
    } else {
        for (u64 e = i; e < n; ++e) p[e] = v;
    }
}
extern "C" __global__ void fill_u64(u64* __restrict__ p, u64 n, u64 v) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] = v;
}

// The sort key of every output's neighbour bitmask (offset k's bit at key_bit.to[k] when it has
// an input), with the output index as value. Sorting outputs by it groups rows that use the same
// offsets, so a conv tile's rows share their active offsets (kv <= 64).
extern "C" __global__ void nbr_masks(const i32* __restrict__ nbr, u32 m, u32 kv, const __grid_constant__ BitMap64 key_bit,
                                     u64* __restrict__ keys, u32* __restrict__ vals) {
    const u32 o = blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= m) return;
    u64 key = 0;
    for (u32 k = 0; k < kv; ++k)
        if (nbr[(u64)o * kv + k] >= 0) key |= 1ull << key_bit.to[k];
    keys[o] = key;
    vals[o] = o;
}

// v[i] with bit b moved to bit p.to[b], in place (sorted sort keys back to neighbour masks).
extern "C" __global__ void permute_bits(u64* __restrict__ v, u32 n, const __grid_constant__ BitMap64 p) {
    const unsigned char* to = bit_map_shared(p);
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) v[i] = permute_bits_of(v[i], to);
}
