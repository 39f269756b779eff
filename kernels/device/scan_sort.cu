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

// Exclusive scan of a tile's values into `out`, each plus `offset` (thread t holds v, the
// values at positions base .. base + SCAN_ITEMS - 1); returns the tile's sum. Every thread of the
// block must call it.
__device__ __forceinline__ u32 scan_write_tile(const u32 (&v)[SCAN_ITEMS], u32* out, u32 n, u32 base, u32 offset, u32* warp_sums) {
    u32 s = 0;
#pragma unroll
    for (u32 i = 0; i < SCAN_ITEMS; ++i) s += v[i];
    u32 total;
    u32 run = block_exclusive_scan(s, warp_sums, total) + offset;
#pragma unroll
    for (u32 i = 0; i < SCAN_ITEMS; ++i) {
        if (base + i < n) out[base + i] = run;
        run += v[i];
    }
    return total;
}

// Exclusive scan of tile `tile` of `in` into `out`, each value plus `offset`; returns the tile's
// sum. Every thread of the block must call it. `out` may alias `in`.
__device__ __forceinline__ u32 scan_one_tile(const u32* in, u32* out, u32 n, u32 tile, u32 offset) {
    __shared__ u32 warp_sums[33];
    const u32 base = tile * SCAN_TILE + threadIdx.x * SCAN_ITEMS;
    u32 v[SCAN_ITEMS];
#pragma unroll
    for (u32 i = 0; i < SCAN_ITEMS; ++i) v[i] = (base + i < n) ? in[base + i] : 0u;
    return scan_write_tile(v, out, n, base, offset, warp_sums);
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

// The whole scan in one block when the input spans a few tiles (the run heads of a level's
// windows, a down map's candidates): the tiles one after another, each offset by the sum of
// those before it, the next tile's values loaded before the current one is scanned. One launch
// instead of the three passes, whose two extra launches cost the host more than this block's
// serial walk costs the GPU at these sizes. sums as scan_single_tile's. `out` may alias `in`
// (a tile is stored after the next one is loaded).
extern "C" __global__ void __launch_bounds__(SCAN_THREADS)
scan_serial_tiles(const u32* in, u32* out, u32* __restrict__ sums, u32 n, u32 ntiles) {
    __shared__ u32 warp_sums[33];
    u32 next[SCAN_ITEMS];
    u32 base = threadIdx.x * SCAN_ITEMS;
#pragma unroll
    for (u32 i = 0; i < SCAN_ITEMS; ++i) next[i] = (base + i < n) ? in[base + i] : 0u;
    u32 carry = 0;
    for (u32 tile = 0; tile < ntiles; ++tile, base += SCAN_TILE) {
        u32 v[SCAN_ITEMS];
#pragma unroll
        for (u32 i = 0; i < SCAN_ITEMS; ++i) v[i] = next[i];
        const u32 ahead = base + SCAN_TILE;
#pragma unroll
        for (u32 i = 0; i < SCAN_ITEMS; ++i) next[i] = (tile + 1 < ntiles && ahead + i < n) ? in[ahead + i] : 0u;
        carry += scan_write_tile(v, out, n, base, carry, warp_sums);
    }
    if (threadIdx.x == 0) {
        sums[0] = 0u;
        sums[1] = carry;
    }
}

// ---- radix sort: 8-bit digits, 256 threads per block, RADIX_ROUNDS items per thread per tile.
#define RADIX_THREADS 256
#define RADIX_ROUNDS 8
#define RADIX_TILE (RADIX_THREADS * RADIX_ROUNDS)
#define RADIX_BINS 256

// Stable rank of this lane's digit among its warp's items so far, taken in (round, lane) order:
// the digit's running count at counts[digit * stride] (this warp's table) plus the lanes below it
// with the same digit; the round's first lane of each digit advances the count. Every lane of the
// warp calls it; a digit >= RADIX_BINS (an item past the end) is neither counted nor meant to be
// stored. Used by the one-sweep passes and the one-block sort.
__device__ __forceinline__ u32 warp_rank_digit(u32 digit, u32* counts, u32 stride) {
    const u32 lane = threadIdx.x & 31u;
    const u32 peers = __match_any_sync(FULL_MASK, digit);
    const u32 leader = __ffs(peers) - 1u;
    u32 before = 0u;
    if (digit < RADIX_BINS && lane == leader) {
        before = counts[digit * stride];
        counts[digit * stride] = before + __popc(peers);
    }
    before = __shfl_sync(FULL_MASK, before, leader);
    __syncwarp();
    return before + __popc(peers & ((1u << lane) - 1u));
}

// Multi-pass sorts ("one sweep" per pass): one launch counts every pass's digits over all keys
// (radix_digit_counts), then one launch per pass ranks and scatters a tile of RADIX_TILE pairs per
// block (radix_onesweep). A tile finds the items of its digits in earlier tiles by decoupled
// look-back over per-(tile, digit) status words, so a pass needs no separate histogram and scan
// launches and no host round trip.
#define RADIX_MAX_PASSES 8
#define RADIX_COUNTS (RADIX_MAX_PASSES * RADIX_BINS + RADIX_MAX_PASSES)

// counts[pass * 256 + digit] += number of keys with that digit in that pass (pass p = bits
// [8p, 8p + 8)), for passes < `passes`. `counts` must be zeroed; it holds RADIX_COUNTS words:
// the digit counts of up to RADIX_MAX_PASSES passes, then one tile counter per pass
// (radix_onesweep).
extern "C" __global__ void __launch_bounds__(RADIX_THREADS)
radix_digit_counts(const u64* __restrict__ keys, u32 n, u32 passes, u32* __restrict__ counts) {
    __shared__ u32 local[RADIX_MAX_PASSES][RADIX_BINS];
    for (u32 p = 0; p < passes; ++p) local[p][threadIdx.x] = 0;
    __syncthreads();
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const u64 key = keys[i];
        for (u32 p = 0; p < passes; ++p) atomicAdd(&local[p][(u32)(key >> (8 * p)) & 0xffu], 1u);
    }
    __syncthreads();
    for (u32 p = 0; p < passes; ++p) {
        const u32 c = local[p][threadIdx.x];
        if (c) atomicAdd(&counts[p * RADIX_BINS + threadIdx.x], c);
    }
}

// A status word of the look-back: high half = (pass + 1) << 2 | kind, low half = a count of a
// digit's items. kind AGGREGATE: the tile's own count; kind INCLUSIVE: the count in this and every
// earlier tile. A word of an earlier pass (or zero) means "not published yet". The words are
// reused across passes without clearing, which the pass number in the high half makes safe.
#define STATUS_AGGREGATE 1u
#define STATUS_INCLUSIVE 2u

__device__ __forceinline__ u64 status_word(u32 pass, u32 kind, u32 count) {
    return ((u64)(((pass + 1u) << 2) | kind) << 32) | count;
}

// One stable pass over bits [8 * pass, 8 * pass + 8): keys_in/vals_in -> keys_out/vals_out.
// Tiles are taken in launch order through the pass's tile counter (after the digit counts in
// `counts`, zeroed), so a block only waits on
// tiles that are already running. Within a tile, warp w owns items [w * 256, (w + 1) * 256) in
// rounds of 32: (warp, round, lane) order is input order, so ranks by it are stable. The tile is
// put in order in shared memory first, so each digit's run is written out contiguously.
// 4 blocks an SM (64 registers): shared memory would allow 6.
extern "C" __global__ void __launch_bounds__(RADIX_THREADS, 4)
radix_onesweep(const u64* __restrict__ keys_in, const u32* __restrict__ vals_in,
               u64* __restrict__ keys_out, u32* __restrict__ vals_out, u32 n, u32 pass,
               u32* counts, u64* status) {
    constexpr u32 WARPS = RADIX_THREADS / 32, WARP_ITEMS = RADIX_ROUNDS * 32;
    __shared__ u32 warp_counts[WARPS][RADIX_BINS];  // per warp: counts, then first rank in the tile
    __shared__ u32 tile_start[RADIX_BINS];          // digit's first position within the sorted tile
    __shared__ u32 out_start[RADIX_BINS];           // digit's first output position of this tile
    __shared__ u32 warp_sums[2][33];                // one per block scan below
    __shared__ u64 tile_keys[RADIX_TILE];
    __shared__ u32 tile_vals[RADIX_TILE];
    __shared__ u32 tile_id;
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 shift = 8u * pass;
    if (tid == 0) tile_id = atomicAdd(&counts[RADIX_MAX_PASSES * RADIX_BINS + pass], 1u);
#pragma unroll
    for (u32 w = 0; w < WARPS; ++w) warp_counts[w][tid] = 0;
    __syncthreads();
    const u32 tile = tile_id;
    const u32 base = tile * RADIX_TILE + warp * WARP_ITEMS + lane;

    // rank every item among its digit's items of this warp, in order
    u64 key[RADIX_ROUNDS];
    u32 val[RADIX_ROUNDS], digit[RADIX_ROUNDS], rank[RADIX_ROUNDS];
#pragma unroll
    for (u32 r = 0; r < RADIX_ROUNDS; ++r) {
        const u32 i = base + r * 32;
        const bool valid = i < n;
        key[r] = valid ? keys_in[i] : 0ull;
        val[r] = valid ? vals_in[i] : 0u;
        // items past the end get digit 256: they match no real digit and are never stored
        digit[r] = valid ? ((u32)(key[r] >> shift) & 0xffu) : RADIX_BINS;
    }
#pragma unroll
    for (u32 r = 0; r < RADIX_ROUNDS; ++r) rank[r] = warp_rank_digit(digit[r], warp_counts[warp], 1u);
    __syncthreads();

    // thread = digit: the warps' counts become first ranks, the tile's count is published
    const u32 d = tid;
    u32 tile_count = 0;
#pragma unroll
    for (u32 w = 0; w < WARPS; ++w) {
        const u32 c = warp_counts[w][d];
        warp_counts[w][d] = tile_count;
        tile_count += c;
    }
    volatile u64* st = status;
    const u64 slot = (u64)tile * RADIX_BINS + d;
    st[slot] = status_word(pass, tile == 0 ? STATUS_INCLUSIVE : STATUS_AGGREGATE, tile_count);
    // the digit's items in earlier tiles: walk back until a tile that knows its inclusive count
    u32 earlier = 0;
    for (u32 j = tile; j > 0;) {
        const u64 w = st[(u64)(j - 1) * RADIX_BINS + d];
        const u32 tag = (u32)(w >> 32);
        if ((tag >> 2) != pass + 1u) continue;  // not published yet: read again
        earlier += (u32)w;
        if ((tag & 3u) == STATUS_INCLUSIVE) break;
        --j;
    }
    if (tile > 0) st[slot] = status_word(pass, STATUS_INCLUSIVE, earlier + tile_count);
    // the digit's first output position: items with smaller digits, then earlier tiles
    u32 total;
    const u32 smaller = block_exclusive_scan(counts[pass * RADIX_BINS + d], warp_sums[0], total);
    out_start[d] = smaller + earlier;
    tile_start[d] = block_exclusive_scan(tile_count, warp_sums[1], total);
    __syncthreads();

    // the tile in sorted order in shared memory, then out: consecutive threads write a digit's
    // consecutive positions
#pragma unroll
    for (u32 r = 0; r < RADIX_ROUNDS; ++r) {
        const u32 dg = digit[r];
        if (dg < RADIX_BINS) {
            const u32 at = tile_start[dg] + warp_counts[warp][dg] + rank[r];
            tile_keys[at] = key[r];
            tile_vals[at] = val[r];
        }
    }
    __syncthreads();
    const u32 in_tile = min((u32)RADIX_TILE, n - tile * RADIX_TILE);
    for (u32 at = tid; at < in_tile; at += RADIX_THREADS) {
        const u64 k = tile_keys[at];
        const u32 dg = (u32)(k >> shift) & 0xffu;
        const u32 dest = out_start[dg] + (at - tile_start[dg]);
        keys_out[dest] = k;
        vals_out[dest] = tile_vals[at];
    }
}

// vals[i] = i, the identity permutation that sorting turns into the sorting permutation.
extern "C" __global__ void iota_u32(u32* __restrict__ vals, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) vals[i] = i;
}

// ---- small sorts in one launch: one block sorts n <= SMALL_SORT_CAP pairs, every 8-bit pass in
// shared memory. Same digits in the same order as radix_onesweep, so the same (stable) result. Warp w owns positions [w * SMALL_SORT_WARP_ITEMS, (w + 1) * ...) and takes
// them in rounds of 32 (round r, lane l: position w * 256 + r * 32 + l), so (warp, round, lane)
// order is input order and ranks by it are stable. Items stay in registers across a pass;
// shared memory holds, per warp, 256 digit counts (then offsets) and 256 exchange words:
// 2 KB a warp, 64 KB for 32 warps (dynamic shared memory, blockDim.x / 32 warps).
#define SMALL_SORT_THREADS 1024
#define SMALL_SORT_ITEMS 8
#define SMALL_SORT_WARP_ITEMS (32 * SMALL_SORT_ITEMS)
#define SMALL_SORT_CAP (SMALL_SORT_THREADS * SMALL_SORT_ITEMS)

// Moves one 32-bit word of every item to its destination: word[r] of position `base + r * 32`
// goes to position dest[r]; afterwards word[r] holds the word that landed on `base + r * 32`.
__device__ __forceinline__ void small_sort_exchange(u32* xbuf, u32 (&word)[SMALL_SORT_ITEMS],
                                                    const u32 (&dest)[SMALL_SORT_ITEMS], u32 base, u32 n) {
#pragma unroll
    for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r)
        if (base + r * 32 < n) xbuf[dest[r]] = word[r];
    __syncthreads();
#pragma unroll
    for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r)
        if (base + r * 32 < n) word[r] = xbuf[base + r * 32];
    __syncthreads();
}

// Sorts keys[0..n), vals[0..n) in place by the low `bits` bits of the key (bits <= 64, keys
// below 2^bits as radix_sort_pairs requires; the passes are the multi-pass path's: 8 bits each
// from bit 0 while below `bits`). blockDim.x = 32 * ceil(n / SMALL_SORT_WARP_ITEMS) <= 1024;
// dynamic shared memory: blockDim.x / 32 * 2 * RADIX_BINS words.
extern "C" __global__ void __launch_bounds__(SMALL_SORT_THREADS)
radix_sort_small(u64* __restrict__ keys, u32* __restrict__ vals, u32 n, u32 bits) {
    extern __shared__ u32 small_sort_smem[];
    __shared__ u32 warp_sums[33];
    const u32 nwarps = blockDim.x >> 5;
    // hist[digit * nwarps + warp]: digit-major, so one block scan gives every (digit, warp) the
    // first position of its items.
    u32* hist = small_sort_smem;
    u32* xbuf = small_sort_smem + nwarps * RADIX_BINS;
    const u32 lane = threadIdx.x & 31u;
    const u32 warp = threadIdx.x >> 5;
    const u32 base = warp * SMALL_SORT_WARP_ITEMS + lane;
    u64 key[SMALL_SORT_ITEMS];
    u32 val[SMALL_SORT_ITEMS], dest[SMALL_SORT_ITEMS], word[SMALL_SORT_ITEMS];
#pragma unroll
    for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r) {
        const u32 i = base + r * 32;
        key[r] = i < n ? keys[i] : 0ull;
        val[r] = i < n ? vals[i] : 0u;
    }
    for (u32 shift = 0; shift < bits; shift += 8) {
        // This warp's counts (only this warp touches them until the scan).
        for (u32 d = lane; d < RADIX_BINS; d += 32) hist[d * nwarps + warp] = 0u;
        __syncwarp();
        // Rank of each item among the warp's earlier items with the same digit.
#pragma unroll
        for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r) {
            const bool valid = base + r * 32 < n;
            // Out-of-range lanes get digit 256 so they never match a real digit.
            const u32 digit = valid ? ((u32)(key[r] >> shift) & 0xffu) : RADIX_BINS;
            dest[r] = warp_rank_digit(digit, hist + warp, nwarps);
        }
        __syncthreads();
        // Exclusive scan of the counts in (digit, warp) order: each thread takes 8 consecutive
        // entries (the block has 32 * nwarps threads, the table 256 * nwarps entries).
        {
            u32 c[8];
            u32 s = 0u;
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                c[j] = hist[threadIdx.x * 8 + j];
                s += c[j];
            }
            u32 total;
            u32 run = block_exclusive_scan(s, warp_sums, total);
#pragma unroll
            for (u32 j = 0; j < 8; ++j) {
                hist[threadIdx.x * 8 + j] = run;
                run += c[j];
            }
        }
        __syncthreads();
#pragma unroll
        for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r)
            if (base + r * 32 < n) dest[r] += hist[((u32)(key[r] >> shift) & 0xffu) * nwarps + warp];
        if (shift + 8 >= bits) {
            // Last pass: straight to global memory (every thread read its inputs before the
            // first barrier above, so writing in place is safe).
#pragma unroll
            for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r) {
                if (base + r * 32 < n) {
                    keys[dest[r]] = key[r];
                    vals[dest[r]] = val[r];
                }
            }
            return;
        }
        // Exchange through shared memory, a 32-bit word at a time: key low, key high, value.
#pragma unroll
        for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r) word[r] = (u32)key[r];
        small_sort_exchange(xbuf, word, dest, base, n);
        u32 lo[SMALL_SORT_ITEMS];
#pragma unroll
        for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r) {
            lo[r] = word[r];
            word[r] = (u32)(key[r] >> 32);
        }
        small_sort_exchange(xbuf, word, dest, base, n);
#pragma unroll
        for (u32 r = 0; r < SMALL_SORT_ITEMS; ++r) key[r] = ((u64)word[r] << 32) | lo[r];
        small_sort_exchange(xbuf, val, dest, base, n);
    }
}
