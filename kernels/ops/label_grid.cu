// Labeled points -> BEV grids (class per cell, colour, occupancy). Host side and semantics:
// src/bev/label_grid.rs (CPU reference) and src/bev/label_grid_cuda.rs.
// Votes are integers (weight = 1 + round(p * 65535)) so the sums do not depend on the order
// the atomics land in: CPU and GPU give identical grids.

struct BevGridParams {
    float xmin, ymin, resolution;
    u32 width, height, classes;
};

#define BEV_NO_DATA 255u

// Cell of (x, y), or -1 when outside the grid. Same float arithmetic as the CPU reference.
__device__ __forceinline__ long long bev_cell(const BevGridParams& G, float x, float y) {
    if (!(isfinite(x) && isfinite(y))) return -1;
    const float fx = floorf((x - G.xmin) / G.resolution);
    const float fy = floorf((y - G.ymin) / G.resolution);
    if (!(fx >= 0.f && fy >= 0.f && fx < (float)G.width && fy < (float)G.height)) return -1;
    return (long long)fy * G.width + (long long)fx;
}

// votes[cell * classes + class] += 1 + round(clamp(p, 0, 1) * 65535).
extern "C" __global__ void bev_vote(const float* __restrict__ x, const float* __restrict__ y,
                                    const unsigned char* __restrict__ class_id, const float* __restrict__ prob,
                                    u32 n, BevGridParams G, u64* __restrict__ votes) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u32 c = class_id[i];
    if (c >= G.classes) return;
    const long long cell = bev_cell(G, x[i], y[i]);
    if (cell < 0) return;
    float p = prob[i];
    p = isnan(p) ? 0.f : fminf(fmaxf(p, 0.f), 1.f);
    const u64 w = 1ull + (u64)__float2uint_rn(p * 65535.f);
    atomicAdd(&votes[(u64)cell * G.classes + c], w);
}

// Per cell: the class with the most votes (ties: lowest id), its palette colour, and the
// occupancy = round(100 * obstacle votes / all votes); empty cells: 255, black, -1 (unknown).
extern "C" __global__ void bev_finalize(const u64* __restrict__ votes, BevGridParams G,
                                        const u32* __restrict__ obstacle_bits, const unsigned char* __restrict__ palette,
                                        unsigned char* __restrict__ labels, unsigned char* __restrict__ rgb,
                                        signed char* __restrict__ occupancy) {
    const u32 cell = blockIdx.x * blockDim.x + threadIdx.x;
    if (cell >= G.width * G.height) return;
    const u64* v = votes + (u64)cell * G.classes;
    u64 best = 0, total = 0, obstacle = 0;
    u32 best_c = BEV_NO_DATA;
    for (u32 c = 0; c < G.classes; ++c) {
        const u64 w = v[c];
        total += w;
        if ((obstacle_bits[c >> 5] >> (c & 31u)) & 1u) obstacle += w;
        if (w > best) { best = w; best_c = c; }
    }
    labels[cell] = (unsigned char)best_c;
    if (best_c == BEV_NO_DATA) {
        rgb[cell * 3 + 0] = rgb[cell * 3 + 1] = rgb[cell * 3 + 2] = 0;
        occupancy[cell] = -1;
    } else {
        for (int k = 0; k < 3; ++k) rgb[cell * 3 + k] = palette[best_c * 3 + k];
        // Integer rounding of 100 * obstacle / total, half up.
        occupancy[cell] = (signed char)((200ull * obstacle + total) / (2ull * total));
    }
}
