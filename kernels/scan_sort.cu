// Device-wide exclusive scan of u32 and a stable LSD radix sort of (u64 key, u32 value) pairs.
// Host side: src/device/primitives.rs, which also documents the launch shapes.

#define SCAN_THREADS 1024
#define SCAN_ITEMS 4
#define SCAN_TILE (SCAN_THREADS * SCAN_ITEMS)

// Pass 1: the sum of each tile of SCAN_TILE inputs.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_tile_sums(const u32* __restrict__ in, u32* __restrict__ tile_sums, u32 n) {
    __shared__ u32 warp_sums[33];
    const u32 base = blockIdx.x * SCAN_TILE + threadIdx.x * SCAN_ITEMS;
    u32 s = 0;
#pragma unroll
    for (u32 i = 0; i < SCAN_ITEMS; ++i) s += (base + i < n) ? in[base + i] : 0u;
    u32 total;
    block_exclusive_scan(s, warp_sums, total);
    if (threadIdx.x == 0) tile_sums[blockIdx.x] = total;
}

// Pass 2 (one block): exclusive scan of the tile sums in place; sums[ntiles] gets the total.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_tile_offsets(u32* __restrict__ sums, u32 ntiles) {
    __shared__ u32 warp_sums[33];
    u32 carry = 0;
    for (u32 start = 0; start < ntiles; start += SCAN_THREADS) {
        const u32 i = start + threadIdx.x;
        const u32 v = i < ntiles ? sums[i] : 0u;
        u32 total;
        const u32 ex = block_exclusive_scan(v, warp_sums, total);
        if (i < ntiles) sums[i] = carry + ex;
        carry += total;
    }
    if (threadIdx.x == 0) sums[ntiles] = carry;
}

// Exclusive scan of tile `tile` of `in` into `out`, each value plus `offset`; returns the tile's
// sum. Every thread of the block must call it. `out` may alias `in`.
__device__ __forceinline__ u32 scan_one_tile(const u32* in, u32* out, u32 n, u32 tile, u32 offset) {
    __shared__ u32 warp_sums[33];
    const u32 base = tile * SCAN_TILE + threadIdx.x * SCAN_ITEMS;
    u32 v[SCAN_ITEMS];
    u32 s = 0;
#pragma unroll
    for (u32 i = 0; i < SCAN_ITEMS; ++i) {
        v[i] = (base + i < n) ? in[base + i] : 0u;
        s += v[i];
    }
    u32 total;
    u32 run = block_exclusive_scan(s, warp_sums, total) + offset;
#pragma unroll
    for (u32 i = 0; i < SCAN_ITEMS; ++i) {
        if (base + i < n) out[base + i] = run;
        run += v[i];
    }
    return total;
}

// Pass 3: exclusive scan within each tile plus the tile's offset. `out` may alias `in`.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_tiles(const u32* in, u32* out, const u32* __restrict__ tile_offsets, u32 n) {
    scan_one_tile(in, out, n, blockIdx.x, tile_offsets[blockIdx.x]);
}

// The whole scan in one launch when the input fits one tile (radix histograms of small sorts,
// run heads of small levels): sums[0] = 0 and sums[1] = the total, as the three passes leave them.
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_single_tile(const u32* in, u32* out, u32* __restrict__ sums, u32 n) {
    const u32 total = scan_one_tile(in, out, n, 0, 0u);
    if (threadIdx.x == 0) {
        sums[0] = 0u;
        sums[1] = total;
    }
}

// ---- radix sort: 8-bit digits, 256 threads per block, RADIX_ROUNDS items per thread per tile.
#define RADIX_THREADS 256
#define RADIX_ROUNDS 8
#define RADIX_TILE (RADIX_THREADS * RADIX_ROUNDS)
#define RADIX_BINS 256

// Digit counts of each tile, digit-major: hist[digit * ntiles + tile], so one exclusive scan of
// `hist` gives every (digit, tile) its first output position.
extern "C" __global__ void __launch_bounds__(RADIX_THREADS)
radix_histogram(const u64* __restrict__ keys, u32 n, u32 shift, u32* __restrict__ hist, u32 ntiles) {
    __shared__ u32 counts[RADIX_BINS];
    counts[threadIdx.x] = 0;
    __syncthreads();
    const u32 base = blockIdx.x * RADIX_TILE;
    for (u32 r = 0; r < RADIX_ROUNDS; ++r) {
        const u32 i = base + r * RADIX_THREADS + threadIdx.x;
        if (i < n) atomicAdd(&counts[(u32)(keys[i] >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    hist[threadIdx.x * ntiles + blockIdx.x] = counts[threadIdx.x];
}

// Stable scatter of one digit pass. Items of a tile are taken in rounds of 256 in input order;
// within a round, warps in order, lanes in order: so equal digits keep their input order.
extern "C" __global__ void __launch_bounds__(RADIX_THREADS)
radix_scatter(const u64* __restrict__ keys_in, const u32* __restrict__ vals_in,
              u64* __restrict__ keys_out, u32* __restrict__ vals_out,
              u32 n, u32 shift, const u32* __restrict__ offsets, u32 ntiles) {
    __shared__ u32 digit_base[RADIX_BINS];
    __shared__ u32 warp_counts[RADIX_THREADS / 32][RADIX_BINS];
    const u32 lane = threadIdx.x & 31u;
    const u32 warp = threadIdx.x >> 5;
    digit_base[threadIdx.x] = offsets[threadIdx.x * ntiles + blockIdx.x];
    for (u32 w = 0; w < RADIX_THREADS / 32; ++w) warp_counts[w][threadIdx.x] = 0;
    __syncthreads();
    const u32 lanes_below = (1u << lane) - 1u;
    const u32 base = blockIdx.x * RADIX_TILE;
    for (u32 r = 0; r < RADIX_ROUNDS; ++r) {
        const u32 i = base + r * RADIX_THREADS + threadIdx.x;
        const bool valid = i < n;
        u64 key = valid ? keys_in[i] : 0ull;
        // Out-of-range lanes get digit 256 so they never match a real digit.
        const u32 digit = valid ? ((u32)(key >> shift) & 0xffu) : RADIX_BINS;
        const u32 peers = __match_any_sync(FULL_MASK, digit);
        const u32 rank = __popc(peers & lanes_below);
        const bool leader = rank == 0;
        if (valid && leader) warp_counts[warp][digit] = __popc(peers);
        __syncthreads();
        u32 dest = 0;
        if (valid) {
            dest = digit_base[digit] + rank;
            for (u32 w = 0; w < warp; ++w) dest += warp_counts[w][digit];
        }
        __syncthreads();
        if (valid) {
            keys_out[dest] = key;
            vals_out[dest] = vals_in[i];
            if (leader) {
                atomicAdd(&digit_base[digit], __popc(peers));
                warp_counts[warp][digit] = 0;
            }
        }
        __syncthreads();
    }
}

// vals[i] = i, the identity permutation that sorting turns into the sorting permutation.
extern "C" __global__ void iota_u32(u32* __restrict__ vals, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) vals[i] = i;
}
