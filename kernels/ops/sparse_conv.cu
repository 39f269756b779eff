// Sparse convolution over a neighbour table, FP16 (or BF16: storage.cuh) storage, FP32 accumulation. This is the
// correct-first direct kernel (one block per output row, one thread per output channel); the
// tensor-core implicit-GEMM kernel replaces it as the default later and is tested against it.
// Host side: src/sparse/conv_cuda.rs.

#define CONV_MAX_CIN 512

// out[o, co] = bias[co] + residual[o, co] + sum_k sum_ci W[k, ci, co] * act(x[nbr[o, k], ci]),
// act(v) = relu?(v * scale[ci] + shift[ci]) when `pre` is set. W is repacked [K][Cin][Cout].
// Every conv kernel takes `range_flags` (may be NULL) and `range_layer`: the FP16 range guard
// (prelude.cuh) of the values it stores.
extern "C" __global__ void conv_direct(const store_t* __restrict__ x, const i32* __restrict__ nbr, u32 m, u32 kv,
                                       const store_t* __restrict__ w, u32 cin, u32 cout,
                                       const float* __restrict__ bias, const float* __restrict__ pre_scale,
                                       const float* __restrict__ pre_shift, u32 pre, u32 relu,
                                       const store_t* __restrict__ residual, store_t* __restrict__ out,
                                       u32* __restrict__ range_flags, u32 range_layer) {
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
            float v = store_to_float(x[(u64)i * cin + c]);
            if (pre) {
                v = v * pre_scale[c] + pre_shift[c];
                if (relu) v = fmaxf(v, 0.f);
            }
            row[c] = v;
        }
        __syncthreads();
        if (co < cout) {
            const store_t* wk = w + (u64)k * cin * cout + co;
            for (u32 c = 0; c < cin; ++c) acc += row[c] * store_to_float(wk[(u64)c * cout]);
        }
    }
    if (co >= cout) return;
    if (bias) acc += bias[co];
    if (residual) acc += store_to_float(residual[(u64)o * cout + co]);
    range_flag(range_flags, range_layer, store_range_bits(acc));
    out[(u64)o * cout + co] = store_from_float(acc);
}

// ---- Shared by the tiled kernels (FP32 units and tensor cores) and the split reduction.

// Tile rows -> output rows: outs[r] = output row of tile row r of a tile starting at o0 (walked in
// `order` when given), m when past the end. Threads 0 .. n_rows - 1 write it.
__device__ __forceinline__ void tile_outs(u32* outs, u32 n_rows, u32 o0, u32 m, const u32* __restrict__ order, u32 tid) {
    if (tid < n_rows) {
        const u32 p = o0 + tid;
        outs[tid] = p < m ? (order ? order[p] : p) : m;
    }
}

// The tile rows' inputs at kernel offset k (rows[r], -1 where none), after the block's previous
// use of `rows` is over; whether any tile row has one (the whole block agrees: skip the offset
// when not).
__device__ __forceinline__ bool tile_rows_at(i32* rows, const u32* outs, u32 n_rows, const i32* __restrict__ nbr, u32 m, u32 kv,
                                             u32 k, u32 tid) {
    __syncthreads();
    if (tid < n_rows) {
        const u32 o = outs[tid];
        rows[tid] = o < m ? nbr[(u64)o * kv + k] : -1;
    }
    return __syncthreads_or(tid < n_rows && rows[tid] >= 0);
}

// One output value's epilogue: + bias + residual, the next layer's BN when asked, the range guard
// (before the ReLU, which would zero a NaN or -inf) into `range_bits`, then that ReLU.
__device__ __forceinline__ float conv_epilogue(float v, u64 i, u32 n, const float* __restrict__ bias,
                                               const store_t* __restrict__ residual, const float* __restrict__ post_scale,
                                               const float* __restrict__ post_shift, u32 post_relu, u32& range_bits) {
    if (bias) v += bias[n];
    if (residual) v += store_to_float(residual[i]);
    if (post_scale) v = v * post_scale[n] + post_shift[n];
    range_bits |= store_range_bits(v);
    if (post_scale && post_relu) v = fmaxf(v, 0.f);
    return v;
}

// ---- Tiled conv on the FP32 units (no tensor cores): the FP32 build's conv, any channel count.
// A block = 256 threads = 32 output channels (threadIdx.x) x 8 row groups (threadIdx.y) over a
// tile of FMA_ROWS = 32 output rows, each thread FMA_RT = 4 of them (rows 4 ty .. 4 ty + 3) at
// one channel. For each kernel offset that some row of the tile has (the rows walked in `order`,
// sorted by neighbour mask, when given) and each Cin chunk of 32, the gathered input rows
// (pre-activated, zero without a neighbour) and the weights' 32 x 32 slice go to shared memory as
// floats; a thread then does 32 x 4 FMAs, reading each weight once for 4 rows and each input
// value once for the warp (a broadcast). conv_direct reads every weight once per output row: on
// the dense cloud's 32-channel convs that is 27 x 32 x 32 x 4 bytes = 110 KB a row, 32 times what
// this tile reads. Arguments as the implicit GEMMs' (IMPLICIT_GEMM_ARGS); one offset split only
// (`splits` and `partial` are ignored).
#define FMA_ROWS 32
#define FMA_COLS 32
#define FMA_K 32
#define FMA_RT 4
extern "C" __global__ void __launch_bounds__(256) conv_fma_tiled(
    const store_t* __restrict__ x, const i32* __restrict__ nbr, const u32* __restrict__ order, const u64* __restrict__ masks,
    u32 m, u32 kv, const store_t* __restrict__ w, u32 cin, u32 cout, const float* __restrict__ bias,
    const float* __restrict__ pre_scale, const float* __restrict__ pre_shift, u32 pre, u32 relu,
    const store_t* __restrict__ residual, store_t* __restrict__ out, u32 splits, float* __restrict__ partial,
    const float* __restrict__ post_scale, const float* __restrict__ post_shift, u32 post_relu,
    u32* __restrict__ range_flags, u32 range_layer) {
    __shared__ float xs[FMA_ROWS][FMA_K + 1];  // +1: the gather's column writes hit 32 banks
    __shared__ float ws[FMA_K][FMA_COLS];
    __shared__ i32 rows[FMA_ROWS];
    __shared__ u32 outs[FMA_ROWS];  // output row of each tile row (m when past the end)
    const u32 tx = threadIdx.x, ty = threadIdx.y, tid = ty * FMA_COLS + tx;
    const u32 o0 = blockIdx.x * FMA_ROWS, n0 = blockIdx.y * FMA_COLS, co = n0 + tx;
    float acc[FMA_RT];
#pragma unroll
    for (int j = 0; j < FMA_RT; ++j) acc[j] = 0.f;
    tile_outs(outs, FMA_ROWS, o0, m, order, tid);
    for (u32 k = 0; k < kv; ++k) {
        if (!tile_rows_at(rows, outs, FMA_ROWS, nbr, m, kv, k, tid)) continue;  // no tile row has offset k
        for (u32 c0 = 0; c0 < cin; c0 += FMA_K) {
            for (u32 idx = tid; idx < FMA_ROWS * FMA_K; idx += 256) {
                const u32 r = idx / FMA_K, c = idx % FMA_K;
                const i32 i = rows[r];
                float v = 0.f;
                if (i >= 0 && c0 + c < cin) {
                    v = store_to_float(x[(u64)i * cin + c0 + c]);
                    if (pre) {
                        v = v * pre_scale[c0 + c] + pre_shift[c0 + c];
                        if (relu) v = fmaxf(v, 0.f);
                    }
                }
                xs[r][c] = v;
            }
            for (u32 idx = tid; idx < FMA_K * FMA_COLS; idx += 256) {
                const u32 r = idx / FMA_COLS, c = idx % FMA_COLS;
                ws[r][c] = (c0 + r < cin && n0 + c < cout) ? store_to_float(w[((u64)k * cin + c0 + r) * cout + n0 + c]) : 0.f;
            }
            __syncthreads();
#pragma unroll 8
            for (int c = 0; c < FMA_K; ++c) {
                const float wv = ws[c][tx];
#pragma unroll
                for (int j = 0; j < FMA_RT; ++j) acc[j] += xs[ty * FMA_RT + j][c] * wv;
            }
            __syncthreads();  // the next chunk overwrites the tiles
        }
    }
    u32 range_bits = 0;
    if (co < cout) {
#pragma unroll
        for (int j = 0; j < FMA_RT; ++j) {
            const u32 o = outs[ty * FMA_RT + j];
            if (o >= m) continue;
            const u64 i = (u64)o * cout + co;
            out[i] = store_from_float(conv_epilogue(acc[j], i, co, bias, residual, post_scale, post_shift, post_relu, range_bits));
        }
    }
    range_flag(range_flags, range_layer, range_bits);
}

#if STORE_TENSOR_CORES  // the FP32 build (storage.cuh) has conv_direct only
// ---- Implicit GEMM on tensor cores (mma.sync m16n8k16, FP16 x FP16 or BF16 x BF16 -> FP32).
// out[BM rows, BN channels] of one block = sum over offsets k and Cin chunks of
// A (BM x BK: gathered input rows, zero where nbr = -1) x B (BK x BN: W[k][c][n]).
// 4 warps in a 2 x 2 grid, each (16 * MI) x 32 = MI x 4 mma tiles; BM = 32 * MI. A smaller BM
// (MI = 1) mixes fewer neighbour masks in a tile (fewer offsets computed for nothing), a larger
// one (MI = 2) reuses each weight tile over more rows. Needs Cin % 8 == 0 and Cout % 8 == 0
// (16-byte loads); the host falls back to conv_direct otherwise.
#define IG_BN 64
#define IG_BK 32
#define IG_APAD 8
#define IG_BPAD 8

__device__ __forceinline__ u32 pack_half2(store_t lo, store_t hi) {
    return (u32)store_bits(lo) | ((u32)store_bits(hi) << 16);
}

// One BK-deep step of a warp's (16 * MI) x 32 output tile: A fragments from rows wm.., B
// fragments from columns wn.. of the shared tiles, accumulated by mma.sync.
template <int MI>
__device__ __forceinline__ void tile_mma(const store_t (*As)[IG_BK + IG_APAD], const store_t (*Bs)[IG_BN + IG_BPAD],
                                         u32 wm, u32 wn, u32 g, u32 t, float acc[MI][4][4]) {
#pragma unroll
    for (u32 kk = 0; kk < IG_BK; kk += 16) {
        u32 a[MI][4], b[4][2];
#pragma unroll
        for (int i = 0; i < MI; ++i) {
            const u32 r = wm + i * 16 + g;
            a[i][0] = *reinterpret_cast<const u32*>(&As[r][kk + 2 * t]);
            a[i][1] = *reinterpret_cast<const u32*>(&As[r + 8][kk + 2 * t]);
            a[i][2] = *reinterpret_cast<const u32*>(&As[r][kk + 2 * t + 8]);
            a[i][3] = *reinterpret_cast<const u32*>(&As[r + 8][kk + 2 * t + 8]);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 n = wn + j * 8 + g;
            b[j][0] = pack_half2(Bs[kk + 2 * t][n], Bs[kk + 2 * t + 1][n]);
            b[j][1] = pack_half2(Bs[kk + 2 * t + 8][n], Bs[kk + 2 * t + 9][n]);
        }
#pragma unroll
        for (int i = 0; i < MI; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) mma_16816(acc[i][j], a[i], b[j]);
    }
}

// A thread-block cluster's barrier: every block of the cluster has arrived, and the shared-memory
// writes each made before arriving are visible to the others (release / acquire).
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

// 16 bytes at shared address `addr` of the cluster's block `rank` (the same offset in its shared
// memory as `addr` in this block's).
__device__ __forceinline__ float4 ld_shared_cluster_f4(u32 addr, u32 rank) {
    float4 v;
#if __CUDA_ARCH__ >= 900
    u32 remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
#else
    v = make_float4(0.f, 0.f, 0.f, 0.f);
    __trap();
#endif
    return v;
}

// The offset splits of one output tile summed on chip (compute capability 9.0 and later): the host
// launches the `splits` blocks of a tile (blockIdx.z = 0 .. splits - 1) as one thread-block
// cluster, so block z is the cluster's block of rank z. Each block puts its FP32 accumulators into
// its own shared memory (`stage`: fragment f = i * NJ + j of thread tid at float4 f * blockDim.x +
// tid, conflict-free), the cluster waits for all of them, then block z finishes fragments z, z +
// splits, ...: each thread adds the same fragment of every block in split order from 0 (the sums
// of conv_split_reduce, so the same bits), runs conv_epilogue as that pass does and stores. No
// partials in global memory and no second launch. A last barrier keeps every block's shared
// memory alive until the others have read it.
template <int MI, int NJ>
__device__ __forceinline__ void tile_store_cluster(const float acc[MI][NJ][4], float* stage, const u32* outs, u32 wm, u32 wn, u32 g,
                                                   u32 t, u32 n0, u32 m, u32 cout, const float* __restrict__ bias,
                                                   const store_t* __restrict__ residual, store_t* __restrict__ out, u32 splits,
                                                   const float* __restrict__ post_scale, const float* __restrict__ post_shift,
                                                   u32 post_relu, u32* __restrict__ range_flags, u32 range_layer) {
    const u32 tid = threadIdx.x, nt = blockDim.x;
    float4* st = reinterpret_cast<float4*>(stage);
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j) st[(i * NJ + j) * nt + tid] = make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
    cluster_sync();
    const u32 base = (u32)__cvta_generic_to_shared(stage);
    u32 range_bits = 0;
    for (u32 f = blockIdx.z; f < (u32)(MI * NJ); f += splits) {
        const u32 i = f / NJ, j = f - i * NJ;
        const u32 addr = base + (f * nt + tid) * 16u;
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
        for (u32 z = 0; z < splits; ++z) {
            const float4 p = ld_shared_cluster_f4(addr, z);
            s.x += p.x;
            s.y += p.y;
            s.z += p.z;
            s.w += p.w;
        }
        const u32 n = n0 + wn + j * 8 + 2 * t;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 o = outs[wm + i * 16 + g + 8 * h];
            if (o >= m || n >= cout) continue;
            const u64 idx = (u64)o * cout + n;
            const float y0 = conv_epilogue(h ? s.z : s.x, idx, n, bias, residual, post_scale, post_shift, post_relu, range_bits);
            const float y1 = conv_epilogue(h ? s.w : s.y, idx + 1, n + 1, bias, residual, post_scale, post_shift, post_relu, range_bits);
            *reinterpret_cast<store2_t*>(&out[idx]) = store2_from_floats(y0, y1);
        }
    }
    range_flag(range_flags, range_layer, range_bits);
    cluster_sync();
}

// Epilogue of a warp's (16 * MI) x (8 * NJ) tile: bias, residual, the next layer's BN + ReLU when
// asked (post_scale non-NULL), FP16 store, with the FP16 range guard of the stored values (taken
// before the ReLU; one range_flag per thread at the end: nothing more than two compares a value
// while in range); or
// with offset splits the raw FP32 sum into the split's partial (conv_split_reduce finishes and
// guards it), or, with `partial` NULL, the splits of the tile summed on chip by the cluster the
// host launched them as (tile_store_cluster; `stage`: MI * NJ * blockDim.x * 16 bytes of this
// block's shared memory, free once the ring is done). acc[i][j] = rows (wm + 16i + g, +8), channels
// (n0 + wn + 8j + 2t, +1), stored two at a time (Cout is a multiple of 8, so both exist); outs
// maps tile rows to output rows (m past the end).
template <int MI, int NJ>
__device__ __forceinline__ void tile_store(const float acc[MI][NJ][4], const u32* outs, u32 wm, u32 wn, u32 g, u32 t, u32 n0,
                                           u32 m, u32 cout, const float* __restrict__ bias, const store_t* __restrict__ residual,
                                           store_t* __restrict__ out, u32 splits, float* __restrict__ partial,
                                           const float* __restrict__ post_scale, const float* __restrict__ post_shift,
                                           u32 post_relu, u32* __restrict__ range_flags, u32 range_layer, float* stage) {
    // `outs` was written by other threads; a block whose loop over offsets had no step (no
    // barrier since) must not read it early. Also: every thread is done with the ring.
    __syncthreads();
    if (splits > 1 && partial == nullptr) {
        tile_store_cluster<MI, NJ>(acc, stage, outs, wm, wn, g, t, n0, m, cout, bias, residual, out, splits, post_scale,
                                   post_shift, post_relu, range_flags, range_layer);
        return;
    }
    u32 range_bits = 0;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 o = outs[wm + i * 16 + g + 8 * h];
            if (o >= m) continue;
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const u32 n = n0 + wn + j * 8 + 2 * t;
                if (n >= cout) continue;
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (splits > 1) {
                    *reinterpret_cast<float2*>(&partial[((u64)blockIdx.z * m + o) * cout + n]) = make_float2(v0, v1);
                    continue;
                }
                if (bias) {
                    v0 += bias[n];
                    v1 += bias[n + 1];
                }
                if (residual) {
                    const float2 r = store2_to_float2(*reinterpret_cast<const store2_t*>(&residual[(u64)o * cout + n]));
                    v0 += r.x;
                    v1 += r.y;
                }
                if (post_scale) {
                    v0 = v0 * post_scale[n] + post_shift[n];
                    v1 = v1 * post_scale[n + 1] + post_shift[n + 1];
                }
                // guarded before the ReLU, which would zero a NaN or -inf
                range_bits |= store_range_bits(v0) | store_range_bits(v1);
                if (post_scale && post_relu) {
                    v0 = fmaxf(v0, 0.f);
                    v1 = fmaxf(v1, 0.f);
                }
                *reinterpret_cast<store2_t*>(&out[(u64)o * cout + n]) = store2_from_floats(v0, v1);
            }
        }
    range_flag(range_flags, range_layer, range_bits);
}

// The implicit-GEMM kernels' parameters (the device functions take them as the kernels do).
#define IMPLICIT_GEMM_ARGS                                                                                   \
    const store_t *__restrict__ x, const i32 *__restrict__ nbr, const u32 *__restrict__ order,               \
        const u64 *__restrict__ masks, u32 m, u32 kv,                                                        \
        const store_t *__restrict__ w, u32 cin, u32 cout, const float *__restrict__ bias,                    \
        const float *__restrict__ pre_scale, const float *__restrict__ pre_shift, u32 pre, u32 relu,        \
        const store_t *__restrict__ residual, store_t *__restrict__ out, u32 splits, float *__restrict__ partial, \
        const float *__restrict__ post_scale, const float *__restrict__ post_shift, u32 post_relu,            \
        u32 *__restrict__ range_flags, u32 range_layer
#define IMPLICIT_GEMM_CALL                                                                                   \
    x, nbr, order, masks, m, kv, w, cin, cout, bias, pre_scale, pre_shift, pre, relu, residual, out, splits, partial, post_scale, post_shift, \
        post_relu, range_flags, range_layer

// `order` (may be NULL): tile row r of block b is output order[b * BM + r] (outputs sorted by
// neighbour mask, so rows of a tile share active offsets and more offsets are skipped). `masks`
// (NULL when `order` is): those outputs' neighbour bitmasks, in the same order. The pipelined
// kernels require both.
template <int MI>
__device__ __forceinline__ void implicit_gemm(IMPLICIT_GEMM_ARGS) {
    constexpr int BM = 32 * MI;
    __shared__ __align__(16) store_t As[BM][IG_BK + IG_APAD];
    __shared__ __align__(16) store_t Bs[IG_BK][IG_BN + IG_BPAD];
    __shared__ i32 rows[BM];
    __shared__ u32 outs[BM];  // output row of each tile row (m when past the end)
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 wm = (warp >> 1) * (16 * MI), wn = (warp & 1) * 32;
    const u32 g = lane >> 2, t = lane & 3u;
    const u32 o0 = blockIdx.x * BM, n0 = blockIdx.y * IG_BN;
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    tile_outs(outs, BM, o0, m, order, tid);
    // Split over kernel offsets (blockIdx.z of `splits`): each block sums its share of the
    // offsets into an FP32 partial; conv_split_reduce adds them in split order (deterministic).
    const u32 per = (kv + splits - 1) / splits;
    const u32 k_begin = blockIdx.z * per, k_end = min(kv, k_begin + per);
    for (u32 k = k_begin; k < k_end; ++k) {
        if (!tile_rows_at(rows, outs, BM, nbr, m, kv, k, tid)) continue;  // no tile row has offset k
        for (u32 c0 = 0; c0 < cin; c0 += IG_BK) {
            // A: BM rows x 32 halves = BM * 4 vectors of 8 halves, MI per thread.
#pragma unroll
            for (int v = 0; v < MI; ++v) {
                const u32 idx = tid + v * 128;
                const u32 r = idx >> 2, cv = (idx & 3u) * 8;
                const i32 i = rows[r];
                uint4 val = make_uint4(0, 0, 0, 0);
                if (i >= 0 && c0 + cv < cin) {
                    val = *reinterpret_cast<const uint4*>(x + (u64)i * cin + c0 + cv);
                    if (pre) {
                        // the pre-activated row is FP16 in shared memory: guarded under the conv's layer
                        store_t* h = reinterpret_cast<store_t*>(&val);
                        u32 bits = 0;
#pragma unroll
                        for (int e = 0; e < 8; ++e) {
                            float f = store_to_float(h[e]) * pre_scale[c0 + cv + e] + pre_shift[c0 + cv + e];
                            bits |= store_range_bits(f);  // before the ReLU, which zeroes NaN and -inf
                            if (relu) f = fmaxf(f, 0.f);
                            h[e] = store_from_float(f);
                        }
                        range_flag(range_flags, range_layer, bits);
                    }
                }
                *reinterpret_cast<uint4*>(&As[r][cv]) = val;
            }
            // B: 32 rows (cin) x 64 halves (cout) = 256 vectors, 2 per thread.
#pragma unroll
            for (int v = 0; v < 2; ++v) {
                const u32 idx = tid + v * 128;
                const u32 r = idx >> 3, nv = (idx & 7u) * 8;
                uint4 val = make_uint4(0, 0, 0, 0);
                if (c0 + r < cin && n0 + nv < cout)
                    val = *reinterpret_cast<const uint4*>(w + ((u64)k * cin + c0 + r) * cout + n0 + nv);
                *reinterpret_cast<uint4*>(&Bs[r][nv]) = val;
            }
            __syncthreads();
            tile_mma<MI>(As, Bs, wm, wn, g, t, acc);
            __syncthreads();
        }
    }
    tile_store<MI, 4>(acc, outs, wm, wn, g, t, n0, m, cout, bias, residual, out, splits, partial, post_scale, post_shift, post_relu, range_flags, range_layer, nullptr);
}

// ---- The same implicit GEMM with a cp.async pipeline: each (offset, Cin chunk) stage's A and B
// tiles are fetched PIPE_STAGES - 1 stages ahead into a ring of shared-memory buffers, so the
// gather's global latency overlaps the tensor-core work of earlier stages instead of stalling
// every stage. The tile's neighbour rows for all its offsets are read once up front, and the
// offsets no row uses are dropped from the stage list. Kernel volumes up to PIPE_MAX_KV. Rows go
// to shared memory untransformed: a pre-activation is applied to the whole input beforehand
// (conv_pre_activate); `pre` must be 0.
#define PIPE_STAGES 3
#define PIPE_MAX_KV 27

// 16 bytes global -> shared, asynchronously, to a shared address already converted
// (__cvta_generic_to_shared; loops convert it once instead of at every copy).
__device__ __forceinline__ void cp_async16_s(u32 smem_addr, const void* gmem, bool valid) {
    const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    cp_async16_s((u32)__cvta_generic_to_shared(smem), gmem, valid);
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Set-up shared by the pipelined kernels: the output row of each tile row (outs; m past the end),
// each offset's input row for each tile row (rows, [nk][BM], -1: none; filled for active offsets
// only), and the offsets some row of the tile has an input at, in order (act; their count is
// returned). The union of the tile's rows' `masks` (the map's neighbour bitmasks in `order`'s
// order, both required) gives the active offsets at once, and only existing neighbours are read
// from `nbr`. Every thread of the block calls it; it ends with a barrier.
// With `halves` non-NULL it also stores the union of each 16-row half-slice's masks there
// (BM / 16 entries, bits by absolute offset), for kernels whose warps skip offsets their rows
// lack.
template <int BM>
__device__ u32 tile_active_offsets(const i32* __restrict__ nbr, const u32* __restrict__ order, const u64* __restrict__ masks,
                                   u32 m, u32 kv, u32 o0, u32 k_begin, u32 nk, u32* outs, i32* rows, u32* act, u32* n_act,
                                   u64* halves = nullptr) {
    static_assert(BM % 32 == 0, "whole warps load the tile's rows");
    __shared__ u64 row_mask[BM];
    __shared__ u64 warp_union[BM / 32];
    const u32 tid = threadIdx.x, lane = tid & 31u;
    if (tid < BM) {
        const u32 p = o0 + tid;
        outs[tid] = p < m ? order[p] : m;
        const u64 rm = p < m ? masks[p] : 0ull;
        row_mask[tid] = rm;
        const u32 lo = __reduce_or_sync(FULL_MASK, (u32)rm), hi = __reduce_or_sync(FULL_MASK, (u32)(rm >> 32));
        if (lane == 0) warp_union[tid >> 5] = ((u64)hi << 32) | lo;
        if (halves) {
            u64 h = rm;
#pragma unroll
            for (u32 d = 8; d >= 1; d >>= 1) h |= __shfl_xor_sync(FULL_MASK, h, d);
            if ((lane & 15u) == 0) halves[tid >> 4] = h;
        }
    }
    __syncthreads();
    // Every thread forms the union; thread b < 64 places offset b at its rank among the set bits
    // (no serial walk over the bits by one thread while the block waits).
    u64 u = 0;
#pragma unroll
    for (int w = 0; w < BM / 32; ++w) u |= warp_union[w];
    // this launch's offsets [k_begin, k_begin + nk) as bits 0.. of `u`
    u = (u >> k_begin) & (nk >= 64 ? ~0ull : ((1ull << nk) - 1ull));
    const u32 na = (u32)__popcll(u);
    if (tid < 64 && ((u >> tid) & 1ull)) act[__popcll(u & ((1ull << tid) - 1ull))] = tid;
    if (tid == 0) *n_act = na;
    __syncthreads();
    // Item q = s * BM + r: tile row r at the s-th active offset kk = act[s], stored at
    // rows[kk * BM + r] (the table is indexed by offset). The neighbour table reads are scattered
    // (one sector each), so a thread issues TABLE_BATCH of them before storing any: their
    // latencies overlap instead of adding up.
    constexpr u32 TABLE_BATCH = 8;
    const u32 total = na * BM;
    for (u32 q0 = tid; q0 < total; q0 += TABLE_BATCH * blockDim.x) {
        i32 v[TABLE_BATCH];
#pragma unroll
        for (u32 j = 0; j < TABLE_BATCH; ++j) {
            const u32 q = q0 + j * blockDim.x, r = q % BM;
            v[j] = -1;
            if (q < total) {
                const u32 k = k_begin + act[q / BM];
                if ((row_mask[r] >> k) & 1ull) v[j] = nbr[(u64)outs[r] * kv + k];
            }
        }
#pragma unroll
        for (u32 j = 0; j < TABLE_BATCH; ++j) {
            const u32 q = q0 + j * blockDim.x;
            if (q < total) rows[act[q / BM] * BM + q % BM] = v[j];
        }
    }
    __syncthreads();
    return na;
}

struct NoHook {
    __device__ void operator()() const {}
};

// The pipelined kernels' cp.async ring over `total` stages: issue(st) starts copying stage st
// into ring buffer buf = st % S, step(st, buf) computes on it once landed; S - 1 stages stay in
// flight. landed() runs in each thread after its copies of a stage have landed, before the
// barrier after which the buffer of the stage before is rewritten (the warpgroup-MMA kernels
// finish their asynchronous MMAs on that buffer there).
template <int S, typename Issue, typename Step, typename Landed = NoHook>
__device__ __forceinline__ void cp_async_ring(u32 total, Issue issue, Step step, Landed landed = {}) {
#pragma unroll
    for (int st = 0; st < S - 1; ++st) {
        if ((u32)st < total) issue((u32)st, (u32)st);
        cp_async_commit();
    }
    u32 buf = 0, next = S - 1;  // st % S and (st + S - 1) % S, kept without division
    for (u32 st = 0; st < total; ++st) {
        cp_async_wait<S - 2>();  // this thread's copies of stage st have landed
        landed();
        __syncthreads();         // everyone's have; and every thread is done with stage st - 1
        if (st + S - 1 < total) issue(st + S - 1, next);  // into the buffer stage st - 1 used
        cp_async_commit();
        step(st, buf);
        buf = buf + 1 == S ? 0 : buf + 1;
        next = next + 1 == S ? 0 : next + 1;
    }
    cp_async_wait<0>();
}

template <int MI>
__device__ __forceinline__ void implicit_gemm_pipe(IMPLICIT_GEMM_ARGS) {
    constexpr int BM = 32 * MI;
    constexpr int S = PIPE_STAGES;
    // the ring's A and B tiles in one buffer, which the cluster epilogue reuses (tile_store)
    constexpr int A_BYTES = S * BM * (IG_BK + IG_APAD) * (int)sizeof(store_t), B_BYTES = S * IG_BK * (IG_BN + IG_BPAD) * (int)sizeof(store_t);
    static_assert(A_BYTES + B_BYTES >= MI * 4 * 128 * 16, "the ring holds the cluster epilogue's fragments");
    __shared__ __align__(16) unsigned char pipe_smem[A_BYTES + B_BYTES];
    auto As = reinterpret_cast<store_t (*)[BM][IG_BK + IG_APAD]>(pipe_smem);
    auto Bs = reinterpret_cast<store_t (*)[IG_BK][IG_BN + IG_BPAD]>(pipe_smem + A_BYTES);
    __shared__ i32 rows[PIPE_MAX_KV][BM];
    __shared__ u32 outs[BM];
    __shared__ u32 act[PIPE_MAX_KV];
    __shared__ u32 n_act;
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 wm = (warp >> 1) * (16 * MI), wn = (warp & 1) * 32;
    const u32 g = lane >> 2, t = lane & 3u;
    const u32 o0 = blockIdx.x * BM, n0 = blockIdx.y * IG_BN;
    const u32 per = (kv + splits - 1) / splits;
    const u32 k_begin = blockIdx.z * per, k_end = min(kv, k_begin + per);
    const u32 nk = k_end > k_begin ? k_end - k_begin : 0u;
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const u32 n_offsets = tile_active_offsets<BM>(nbr, order, masks, m, kv, o0, k_begin, nk, outs, &rows[0][0], act, &n_act);
    const u32 nc = (cin + IG_BK - 1) / IG_BK;
    const u32 total = n_offsets * nc;
    // Stage st = (act[st / nc], Cin chunk st % nc) into ring buffer st % S.
    auto issue = [&](u32 st, u32 buf) {
        const u32 kk = act[st / nc], c0 = (st % nc) * IG_BK, k = k_begin + kk;
#pragma unroll
        for (int v = 0; v < MI; ++v) {
            const u32 idx = tid + v * 128;
            const u32 r = idx >> 2, cv = (idx & 3u) * 8;
            const i32 i = rows[kk][r];
            const bool ok = i >= 0 && c0 + cv < cin;
            cp_async16(&As[buf][r][cv], ok ? (const void*)(x + (u64)i * cin + c0 + cv) : (const void*)x, ok);
        }
#pragma unroll
        for (int v = 0; v < 2; ++v) {
            const u32 idx = tid + v * 128;
            const u32 r = idx >> 3, nv = (idx & 7u) * 8;
            const bool ok = c0 + r < cin && n0 + nv < cout;
            cp_async16(&Bs[buf][r][nv], ok ? (const void*)(w + ((u64)k * cin + c0 + r) * cout + n0 + nv) : (const void*)w, ok);
        }
    };
    cp_async_ring<S>(total, issue, [&](u32, u32 buf) { tile_mma<MI>(As[buf], Bs[buf], wm, wn, g, t, acc); });
    tile_store<MI, 4>(acc, outs, wm, wn, g, t, n0, m, cout, bias, residual, out, splits, partial, post_scale, post_shift, post_relu, range_flags, range_layer, reinterpret_cast<float*>(pipe_smem));
}

// 64-row tiles (128 threads).
extern "C" __global__ void __launch_bounds__(128) conv_implicit_gemm(IMPLICIT_GEMM_ARGS) {
    implicit_gemm<2>(IMPLICIT_GEMM_CALL);
}
// 32-row tiles (128 threads).
extern "C" __global__ void __launch_bounds__(128) conv_implicit_gemm_m32(IMPLICIT_GEMM_ARGS) {
    implicit_gemm<1>(IMPLICIT_GEMM_CALL);
}
// The pipelined variants (kernel volume <= PIPE_MAX_KV).
extern "C" __global__ void __launch_bounds__(128) conv_implicit_gemm_pipe(IMPLICIT_GEMM_ARGS) {
    implicit_gemm_pipe<2>(IMPLICIT_GEMM_CALL);
}
extern "C" __global__ void __launch_bounds__(128) conv_implicit_gemm_pipe_m32(IMPLICIT_GEMM_ARGS) {
    implicit_gemm_pipe<1>(IMPLICIT_GEMM_CALL);
}

// ldmatrix on shared addresses already converted (__cvta_generic_to_shared): four 8 x 8 FP16
// matrices, row-major (A fragments) or transposed (B fragments of a row-major K x N tile).
__device__ __forceinline__ void ldmatrix_x4(u32 r[4], u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 r[4], u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}

// ---- Tiled kernels for large maps: BM x BN tiles (BM = 128 built), 8 warps of 32 rows x WN
// channels (BM / 32 warps along the rows), fragments by ldmatrix, the cp.async ring of the
// pipelined kernels, built to spend as few instructions as possible outside the MMAs (the 64-row
// kernels issue ~3.5 integer instructions per MMA: Nsight Compute):
//  - each thread copies fixed columns of fixed tile rows, so its gather sources are looked up
//    once per offset and advance by BK per Cin chunk; stages advance counters, no division;
//  - a warp skips a stage (no fragment loads, no MMAs) when none of its 32 rows has an input at
//    the stage's offset, and the fragment loads and MMAs of a 16-row half of them when none of
//    the half's rows has. Their rows' copies are not skipped: rows without an input are
//    zero-filled by cp.async without reading memory, and a branch per copy made the compiler
//    rebuild the copy addresses every stage (twice the instructions outside the MMAs).
#define TILED_THREADS 256

// The per-tile tables of the tiled and warpgroup-MMA kernels (filled by tile_active_offsets), in
// dynamic shared memory after a copy ring of RING bytes: byte offsets (mirrored by
// tile_tables_bytes in conv_cuda.rs), and pointers to them from the shared memory's start.
template <int BM, int RING>
struct TileTables {
    static constexpr int ROWS = RING;                         // i32 [PIPE_MAX_KV][BM]: input rows
    static constexpr int OUTS = ROWS + PIPE_MAX_KV * BM * 4;  // u32 [BM]: output rows
    static constexpr int ACT = OUTS + BM * 4;                 // u32 [PIPE_MAX_KV]: active offsets, then their count
    static constexpr int BYTES = ACT + (PIPE_MAX_KV + 1) * 4;
    i32* rows;
    u32* outs;
    u32* act;
    __device__ explicit TileTables(unsigned char* smem)
        : rows(reinterpret_cast<i32*>(smem + ROWS)), outs(reinterpret_cast<u32*>(smem + OUTS)), act(reinterpret_cast<u32*>(smem + ACT)) {}
};

// Where a side of the ring (copies or compute) is in the stage list: active offset `off`, Cin
// chunk `chunk` of nc.
struct StageCursor {
    u32 off = 0, chunk = 0;
    __device__ void advance(u32 nc) {
        if (++chunk == nc) {
            chunk = 0;
            ++off;
        }
    }
};

template <int BM_, int BN_, int BK_, int S_>
struct TiledShape {
    static constexpr int BM = BM_, BN = BN_, BK = BK_, S = S_;
    static constexpr int WARPS_M = BM / 32, WARPS_N = 8 / WARPS_M, WN = BN / WARPS_N, NJ = WN / 8;
    static constexpr int A_LD = BK + 8, B_LD = BN + 8;            // padded rows: conflict-free ldmatrix
    static constexpr int A_STAGE = BM * A_LD, B_STAGE = BK * B_LD;  // halves
    static constexpr int ACH = BK / 8, BCH = BN / 8;                 // 16-byte chunks a row
    static constexpr int A_ROWS_STEP = TILED_THREADS / ACH, A_PER_THREAD = BM / A_ROWS_STEP;
    static constexpr int B_ROWS_STEP = TILED_THREADS / BCH, B_PER_THREAD = (BK + B_ROWS_STEP - 1) / B_ROWS_STEP;
    // dynamic shared memory: the ring, then the tables (mirrored by TILED_VARIANTS in conv_cuda.rs)
    using Tables = TileTables<BM, 2 * S * (A_STAGE + B_STAGE)>;
    static_assert(2 * S * (A_STAGE + B_STAGE) >= 2 * NJ * TILED_THREADS * 16, "the ring holds the cluster epilogue's fragments");
    static_assert(WARPS_M * WARPS_N == 8 && WN % 16 == 0 && BK % 16 == 0, "8 warps of whole ldmatrix_x4 fragments");
    static_assert(TILED_THREADS % ACH == 0 && BM % A_ROWS_STEP == 0 && TILED_THREADS % BCH == 0, "fixed copy columns a thread");
};

// A compile-time u32, to pick an unrolled variant of a generic lambda.
template <u32 V>
struct Const {
    static constexpr u32 value = V;
};

template <class T>
__device__ __forceinline__ void implicit_gemm_tiled(IMPLICIT_GEMM_ARGS) {
    constexpr int BM = T::BM, BK = T::BK, NJ = T::NJ;
    extern __shared__ __align__(16) unsigned char tiled_smem[];
    __shared__ u64 halves[BM / 16];  // each 16-row half-slice's neighbour-mask union
    store_t* As = reinterpret_cast<store_t*>(tiled_smem);
    store_t* Bs = As + T::S * T::A_STAGE;
    const typename T::Tables tab(tiled_smem);
    i32* rows = tab.rows;
    u32* outs = tab.outs;
    u32* act = tab.act;
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5;
    const u32 slice = warp % T::WARPS_M, wm = slice * 32, wn = (warp / T::WARPS_M) * T::WN;
    const u32 g = lane >> 2, t = lane & 3u;
    const u32 o0 = blockIdx.x * BM, n0 = blockIdx.y * T::BN;
    const u32 per = (kv + splits - 1) / splits;
    const u32 k_begin = blockIdx.z * per, k_end = min(kv, k_begin + per);
    const u32 nk = k_end > k_begin ? k_end - k_begin : 0u;
    float acc[2][NJ][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

    const u32 n_offsets = tile_active_offsets<BM>(nbr, order, masks, m, kv, o0, k_begin, nk, outs, rows, act, act + PIPE_MAX_KV, halves);
    const u32 nc = (cin + BK - 1) / BK;

    // Copy side: this thread's A rows a_r0 + v * A_ROWS_STEP at column a_cv, B rows b_r0 + v *
    // B_ROWS_STEP at column b_nv; sources set at each new offset, advanced by BK a chunk. Shared
    // addresses are byte offsets from smem0, converted once.
    const u32 smem0 = (u32)__cvta_generic_to_shared(tiled_smem);
    constexpr u32 A_STAGE_B = 2 * T::A_STAGE, B_STAGE_B = 2 * T::B_STAGE, B_BASE = T::S * A_STAGE_B;
    const u32 a_cv = (tid % T::ACH) * 8, a_r0 = tid / T::ACH;
    const u32 b_nv = (tid % T::BCH) * 8, b_r0 = tid / T::BCH;
    const u32 a_cp = smem0 + 2 * (a_r0 * T::A_LD + a_cv), b_cp = smem0 + B_BASE + 2 * (b_r0 * T::B_LD + b_nv);
    const bool b_col_ok = n0 + b_nv < cout;
    const store_t* a_src[T::A_PER_THREAD];
    u32 a_state = 0;  // bit v: row v has an input at this offset (copy it, else zero-fill)
    const store_t* b_src = w;
    StageCursor in;
    auto issue = [&](u32 buf) {
        if (in.chunk == 0) {
            const u32 kk = act[in.off], k = k_begin + kk;
            a_state = 0;
#pragma unroll
            for (int v = 0; v < T::A_PER_THREAD; ++v) {
                const u32 r = a_r0 + v * T::A_ROWS_STEP;
                const i32 i = rows[kk * BM + r];
                a_src[v] = x + (u64)(i >= 0 ? i : 0) * cin + a_cv;
                a_state |= (u32)(i >= 0) << v;
            }
            b_src = w + ((u64)k * cin + b_r0) * cout + n0 + b_nv;
        }
        const u32 c0 = in.chunk * BK;
        const bool a_col_ok = c0 + a_cv < cin;
        const u32 a_dst = a_cp + buf * A_STAGE_B, b_dst = b_cp + buf * B_STAGE_B;
#pragma unroll
        for (int v = 0; v < T::A_PER_THREAD; ++v)
            cp_async16_s(a_dst + 2 * v * T::A_ROWS_STEP * T::A_LD, a_src[v] + c0, a_col_ok && ((a_state >> v) & 1u));
#pragma unroll
        for (int v = 0; v < T::B_PER_THREAD; ++v) {
            const u32 r = b_r0 + v * T::B_ROWS_STEP;
            if (BK % T::B_ROWS_STEP != 0 && r >= (u32)BK) break;
            const bool ok = b_col_ok && c0 + r < cin;
            cp_async16_s(b_dst + 2 * v * T::B_ROWS_STEP * T::B_LD, ok ? (const void*)(b_src + (u64)(c0 + v * T::B_ROWS_STEP) * cout) : (const void*)w, ok);
        }
        in.advance(nc);
    };
    // Compute side: the fragment loads and MMAs of a 16-row half with no input at the stage's
    // offset are skipped, so are stages where neither half has one. Fragment addresses: A rows
    // wm + (lane & 15) (+16), column 8 (lane >> 4); B row lane & 15, columns wn + 8 (lane >> 4)
    // (+16 per fragment pair).
    const u32 a_ld = smem0 + 2 * ((wm + (lane & 15u)) * T::A_LD + (lane >> 4) * 8);
    const u32 b_ld = smem0 + B_BASE + 2 * ((lane & 15u) * T::B_LD + wn + (lane >> 4) * 8);
    // one stage's MMAs for the halves in LIVE (bit i: rows wm + 16 i ..), unrolled for each
    auto compute = [&](auto live_tag, u32 buf) {
        constexpr u32 LIVE = decltype(live_tag)::value;
        const u32 a_s = a_ld + buf * A_STAGE_B, b_s = b_ld + buf * B_STAGE_B;
#pragma unroll
        for (u32 kk = 0; kk < BK; kk += 16) {
            u32 a[2][4];
#pragma unroll
            for (int i = 0; i < 2; ++i)
                if ((LIVE >> i) & 1u) ldmatrix_x4(a[i], a_s + 2 * (i * 16 * T::A_LD + kk));
#pragma unroll
            for (int jp = 0; jp < NJ / 2; ++jp) {
                u32 r[4];
                ldmatrix_x4_trans(r, b_s + 2 * (kk * T::B_LD + jp * 16));
                const u32 b0[2] = {r[0], r[1]}, b1[2] = {r[2], r[3]};
#pragma unroll
                for (int i = 0; i < 2; ++i) {
                    if (!((LIVE >> i) & 1u)) continue;
                    mma_16816(acc[i][2 * jp], a[i], b0);
                    mma_16816(acc[i][2 * jp + 1], a[i], b1);
                }
            }
        }
    };
    StageCursor cs;
    u32 live = 0;
    auto step = [&](u32 buf) {
        if (cs.chunk == 0) {
            const u32 k = k_begin + act[cs.off];
            live = (u32)((halves[2 * slice] >> k) & 1ull) | (u32)((halves[2 * slice + 1] >> k) & 1ull) << 1;
        }
        cs.advance(nc);
        // warp-uniform
        if (live == 3u) compute(Const<3>{}, buf);
        else if (live == 1u) compute(Const<1>{}, buf);
        else if (live == 2u) compute(Const<2>{}, buf);
    };
    cp_async_ring<T::S>(n_offsets * nc, [&](u32, u32 buf) { issue(buf); }, [&](u32, u32 buf) { step(buf); });
    tile_store<2, NJ>(acc, outs, wm, wn, g, t, n0, m, cout, bias, residual, out, splits, partial, post_scale, post_shift, post_relu, range_flags, range_layer, reinterpret_cast<float*>(tiled_smem));
}

// The instantiations (kernel volume <= PIPE_MAX_KV); conv_cuda.rs' TILED_VARIANTS lists them
// with their shared memory. Register caps keep 3 blocks an SM up to 64 channels, 2 at 128.
#define TILED_KERNEL(NAME, BM, BN, BK, S, MIN_BLOCKS)                                                 \
    extern "C" __global__ void __launch_bounds__(TILED_THREADS, MIN_BLOCKS) NAME(IMPLICIT_GEMM_ARGS) { \
        implicit_gemm_tiled<TiledShape<BM, BN, BK, S>>(IMPLICIT_GEMM_CALL);                            \
    }
TILED_KERNEL(conv_tiled_m128_n32_k32_s3, 128, 32, 32, 3, 4)
TILED_KERNEL(conv_tiled_m128_n32_k32, 128, 32, 32, 4, 3)
TILED_KERNEL(conv_tiled_m128_n64_k32, 128, 64, 32, 4, 3)
TILED_KERNEL(conv_tiled_m128_n64_k64, 128, 64, 64, 3, 2)
TILED_KERNEL(conv_tiled_m128_n128_k32, 128, 128, 32, 4, 2)
TILED_KERNEL(conv_tiled_m128_n128_k64, 128, 128, 64, 2, 2)
TILED_KERNEL(conv_tiled_m128_n128_k64_s3, 128, 128, 64, 3, 1)

// ---- Hopper warpgroup MMA kernels (wgmma, sm_90a only; conv_cuda.rs picks them on compute
// capability 9.0). The tiled kernels above issue ~5 instructions per HMMA (ldmatrix, address
// arithmetic, the MMAs themselves) and keep the issue slots ~40 % busy for it; a wgmma computes
// a 64 x N x 16 product from shared memory in one instruction, asynchronously, so the warps only
// copy. 128-row tiles: two warpgroups of 64 rows x BN channels; Cin chunks of 64, so a tile row
// is 128 bytes and the shared tiles use the 128-byte swizzle (16-byte chunk c of row r at chunk
// c ^ (r & 7)), which wgmma reads without bank conflicts. B is read K-major: the transposed
// weights W^T[k][Cout][Cin] (CudaConvWeights keeps them for these kernels). A warpgroup skips
// the MMAs of a stage none of its 64 rows has an input at; the copies are never skipped (rows
// without an input are zero-filled). Needs Cin % 64 == 0 and Cout % BN == 0 (no bound checks).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

// Shared-memory matrix descriptor of a K-major tile with the 128-byte swizzle: start address,
// leading byte offset 16 (unused by swizzled K-major layouts), stride 1024 bytes between 8-row
// groups, swizzle mode 1 (128 bytes). `smem_addr` must lie in a 1024-byte aligned atom (plus the
// 32-byte steps along K within a row).
__device__ __forceinline__ u64 wgmma_desc(u32 smem_addr) {
    return (u64)((smem_addr & 0x3FFFFu) >> 4) | ((u64)(16 >> 4) << 16) | ((u64)(1024 >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy, wgmma reads it through the async
// proxy: a proxy fence between them (each thread after its copies have landed, before the barrier).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// Keeps the compiler from moving accumulator accesses across a wgmma issue or wait.
template <int NJ>
__device__ __forceinline__ void wgmma_fence_acc(float (&d)[NJ][4]) {
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}

// The accumulator operands of a wgmma, d[J][4] for rows J .. J + 7 of d (4 registers each).
#define WGMMA_ACC_ROW(J) "+f"(d[J][0]), "+f"(d[J][1]), "+f"(d[J][2]), "+f"(d[J][3])
#define WGMMA_ACC_8ROWS(J)                                                                        \
    WGMMA_ACC_ROW(J), WGMMA_ACC_ROW(J + 1), WGMMA_ACC_ROW(J + 2), WGMMA_ACC_ROW(J + 3), WGMMA_ACC_ROW(J + 4), \
        WGMMA_ACC_ROW(J + 5), WGMMA_ACC_ROW(J + 6), WGMMA_ACC_ROW(J + 7)

// d (+)= A (64 x 16, descriptor a) x B (16 x 64, descriptor b): one warpgroup's m64n64k16.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[8][4], u64 a, u64 b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." STORE_MMA "." STORE_MMA " "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, 1, 1, 1, 0, 0;\n"
        : WGMMA_ACC_8ROWS(0)
        : "l"(a), "l"(b));
}

// d (+)= A (64 x 16, descriptor a) x B (16 x 128, descriptor b): one warpgroup's m64n128k16.
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[16][4], u64 a, u64 b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." STORE_MMA "." STORE_MMA " "
        "{"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, 1, 1, 1, 0, 0;\n"
        : WGMMA_ACC_8ROWS(0), WGMMA_ACC_8ROWS(8)
        : "l"(a), "l"(b));
}


template <int BN>
__device__ __forceinline__ void wgmma_m64k16(float (&d)[BN / 8][4], u64 a, u64 b);
template <>
__device__ __forceinline__ void wgmma_m64k16<64>(float (&d)[8][4], u64 a, u64 b) { wgmma_m64n64k16(d, a, b); }
template <>
__device__ __forceinline__ void wgmma_m64k16<128>(float (&d)[16][4], u64 a, u64 b) { wgmma_m64n128k16(d, a, b); }

#define WGMMA_THREADS 256
template <int BN_, int S_>
struct WgmmaShape {
    static constexpr int BM = 128, BN = BN_, BK = 64, S = S_, NJ = BN / 8;
    // dynamic shared memory from the first 1024-byte boundary: the ring, then the tables
    // (mirrored by WGMMA_VARIANTS in conv_cuda.rs, which adds 1024 bytes for that alignment)
    static constexpr int A_STAGE = BM * 128, B_STAGE = BN * 128, STAGE = A_STAGE + B_STAGE;
    using Tables = TileTables<BM, S * STAGE>;
    static constexpr int B_PER_THREAD = BN / 32;              // 16-byte copies a B stage, a thread
    static_assert(S * STAGE >= NJ * WGMMA_THREADS * 16, "the ring holds the cluster epilogue's fragments");
    static_assert(BN == 64 || BN == 128, "wgmma_m64k16 is built for 64 and 128 channels");
};

// x: [*, cin]; wt: W^T [kv][cout][cin]; the other arguments as IMPLICIT_GEMM_ARGS (pre must be 0:
// a pre-activation is applied to the input beforehand, as for the pipelined kernels).
template <class T>
__device__ __forceinline__ void implicit_gemm_wgmma(IMPLICIT_GEMM_ARGS, const store_t* __restrict__ wt) {
    constexpr int BM = T::BM, BK = T::BK, NJ = T::NJ;
    extern __shared__ __align__(16) unsigned char wgmma_smem_raw[];
    __shared__ u64 halves[BM / 16];
    const u32 raw0 = (u32)__cvta_generic_to_shared(wgmma_smem_raw);
    const u32 smem0 = (raw0 + 1023u) & ~1023u;  // swizzle atoms are 1024-byte aligned
    unsigned char* smem = wgmma_smem_raw + (smem0 - raw0);
    const typename T::Tables tab(smem);
    i32* rows = tab.rows;
    u32* outs = tab.outs;
    u32* act = tab.act;
    const u32 tid = threadIdx.x, lane = tid & 31u, warp = tid >> 5, wg = warp >> 2;
    const u32 g = lane >> 2, t = lane & 3u;
    const u32 o0 = blockIdx.x * BM, n0 = blockIdx.y * T::BN;
    const u32 per = (kv + splits - 1) / splits;
    const u32 k_begin = blockIdx.z * per, k_end = min(kv, k_begin + per);
    const u32 nk = k_end > k_begin ? k_end - k_begin : 0u;
    float acc[1][NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][j][e] = 0.f;

    const u32 n_offsets = tile_active_offsets<BM>(nbr, order, masks, m, kv, o0, k_begin, nk, outs, rows, act, act + PIPE_MAX_KV, halves);
    // this warpgroup's 64 rows' neighbour-mask union
    const u64 wg_mask = halves[4 * wg] | halves[4 * wg + 1] | halves[4 * wg + 2] | halves[4 * wg + 3];
    const u32 nc = cin / BK;

    // Copy side: this thread copies 16-byte chunk `ch` of rows r0 + 32 v (A: v < 4, B: v <
    // B_PER_THREAD); all of them have r & 7 == r0 & 7, so one swizzled column serves every copy.
    const u32 ch = tid & 7u, r0 = tid >> 3;
    const u32 swz = ((ch ^ (r0 & 7u)) << 4) + r0 * 128u;
    const u32 a_cp = smem0 + swz, b_cp = smem0 + T::A_STAGE + swz;
    const store_t* a_src[4];
    u32 a_state = 0;  // bit v: row r0 + 32 v has an input at this offset
    const store_t* b_src = wt;
    StageCursor in;
    auto issue = [&](u32 buf) {
        if (in.chunk == 0) {
            const u32 kk = act[in.off], k = k_begin + kk;
            a_state = 0;
#pragma unroll
            for (int v = 0; v < 4; ++v) {
                const i32 i = rows[kk * BM + r0 + 32 * v];
                a_src[v] = x + (u64)(i >= 0 ? i : 0) * cin + ch * 8;
                a_state |= (u32)(i >= 0) << v;
            }
            b_src = wt + ((u64)k * cout + n0 + r0) * cin + ch * 8;
        }
        const u32 c0 = in.chunk * BK;
        const u32 dst = buf * T::STAGE;
#pragma unroll
        for (int v = 0; v < 4; ++v) cp_async16_s(a_cp + dst + v * 4096u, a_src[v] + c0, (a_state >> v) & 1u);
#pragma unroll
        for (int v = 0; v < T::B_PER_THREAD; ++v) cp_async16_s(b_cp + dst + v * 4096u, b_src + (u64)v * 32 * cin + c0, true);
        in.advance(nc);
    };
    // Compute side: descriptors of this warpgroup's A rows (64 x 128 bytes from wg * 8192) and
    // of the B tile, stepped by 32 bytes (16 halves) along K and by a stage along the ring.
    const u64 a_desc0 = wgmma_desc(smem0 + wg * 8192u), b_desc0 = wgmma_desc(smem0 + T::A_STAGE);
    StageCursor cs;
    bool live = false;
    auto step = [&](u32 buf) {
        if (cs.chunk == 0) live = (wg_mask >> (k_begin + act[cs.off])) & 1ull;
        cs.advance(nc);
        if (!live) return;  // warpgroup-uniform
        const u64 st = (u64)((buf * T::STAGE) >> 4);
        wgmma_fence();
#pragma unroll
        for (u32 kk = 0; kk < BK / 16; ++kk) wgmma_m64k16<T::BN>(acc[0], a_desc0 + st + 2 * kk, b_desc0 + st + 2 * kk);
        wgmma_commit();
    };
    // Once a thread's copies of a stage have landed, before the barrier that frees stage st - 1
    // for new copies: the proxy fence, and this warpgroup's MMAs on stage st - 1 done. The MMAs
    // of stage st then run while the threads wait for stage st + 1's copies.
    auto landed = [&]() {
        fence_proxy_async();
        wgmma_wait<0>();
        wgmma_fence_acc<NJ>(acc[0]);
    };
    cp_async_ring<T::S>(n_offsets * nc, [&](u32, u32 buf) { issue(buf); }, [&](u32, u32 buf) { step(buf); }, landed);
    wgmma_wait<0>();
    wgmma_fence_acc<NJ>(acc[0]);
    tile_store<1, NJ>(acc, outs, wg * 64 + (warp & 3u) * 16, 0, g, t, n0, m, cout, bias, residual, out, splits, partial, post_scale, post_shift, post_relu, range_flags, range_layer, reinterpret_cast<float*>(smem));
}

#define WGMMA_KERNEL(NAME, BN, S, MIN_BLOCKS)                                                                            \
    extern "C" __global__ void __launch_bounds__(WGMMA_THREADS, MIN_BLOCKS) NAME(IMPLICIT_GEMM_ARGS, const store_t* __restrict__ wt) { \
        implicit_gemm_wgmma<WgmmaShape<BN, S>>(IMPLICIT_GEMM_CALL, wt);                                                \
    }
WGMMA_KERNEL(conv_wgmma_m128_n64, 64, 4, 2)
WGMMA_KERNEL(conv_wgmma_m128_n64_s2, 64, 2, 3)
WGMMA_KERNEL(conv_wgmma_m128_n128, 128, 3, 2)
#endif  // __CUDA_ARCH_FEAT_SM90_ALL

#endif  // STORE_TENSOR_CORES

// The split implicit GEMM's epilogue: out = sum over splits (in split order) + bias + residual,
// then the optional post-activation.
extern "C" __global__ void conv_split_reduce(const float* __restrict__ partial, u32 splits, u32 m, u32 cout,
                                             const float* __restrict__ bias, const store_t* __restrict__ residual,
                                             store_t* __restrict__ out, const float* __restrict__ post_scale,
                                             const float* __restrict__ post_shift, u32 post_relu,
                                             u32* __restrict__ range_flags, u32 range_layer) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    const u64 total = (u64)m * cout;
    if (i >= total) return;
    float v = 0.f;
    for (u32 z = 0; z < splits; ++z) v += partial[z * total + i];
    u32 range_bits = 0;
    v = conv_epilogue(v, i, (u32)(i % cout), bias, residual, post_scale, post_shift, post_relu, range_bits);
    range_flag(range_flags, range_layer, range_bits);
    out[i] = store_from_float(v);
}

// conv_split_reduce four consecutive values a thread (cout % 4 == 0: 16-byte partial loads, 2-value
// stores), the same sums in the same split order. The host checks m * cout < 2^32.
extern "C" __global__ void conv_split_reduce4(const float* __restrict__ partial, u32 splits, u32 m, u32 cout,
                                              const float* __restrict__ bias, const store_t* __restrict__ residual,
                                              store_t* __restrict__ out, const float* __restrict__ post_scale,
                                              const float* __restrict__ post_shift, u32 post_relu,
                                              u32* __restrict__ range_flags, u32 range_layer) {
    const u32 total = m * cout;
    const u32 i = (blockIdx.x * blockDim.x + threadIdx.x) * 4u;
    if (i >= total) return;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    for (u32 z = 0; z < splits; ++z) {
        const float4 p = *reinterpret_cast<const float4*>(partial + (u64)z * total + i);
        v.x += p.x;
        v.y += p.y;
        v.z += p.z;
        v.w += p.w;
    }
    const u32 co = i % cout;
    u32 range_bits = 0;
    const float y0 = conv_epilogue(v.x, i, co, bias, residual, post_scale, post_shift, post_relu, range_bits);
    const float y1 = conv_epilogue(v.y, i + 1, co + 1, bias, residual, post_scale, post_shift, post_relu, range_bits);
    const float y2 = conv_epilogue(v.z, i + 2, co + 2, bias, residual, post_scale, post_shift, post_relu, range_bits);
    const float y3 = conv_epilogue(v.w, i + 3, co + 3, bias, residual, post_scale, post_shift, post_relu, range_bits);
    range_flag(range_flags, range_layer, range_bits);
    store2_t* o2 = reinterpret_cast<store2_t*>(out + i);
    o2[0] = store2_from_floats(y0, y1);
    o2[1] = store2_from_floats(y2, y3);
}

// relu?(x * scale[c] + shift[c]) over a whole [n, c] input, once, for the pipelined convs (their
// cp.async gather cannot transform rows on the way): the same float steps as the gather's.
extern "C" __global__ void conv_pre_activate(const store_t* __restrict__ x, u32 n, u32 c, const float* __restrict__ scale,
                                             const float* __restrict__ shift, u32 relu, store_t* __restrict__ out,
                                             u32* __restrict__ range_flags, u32 range_layer) {
    const u64 idx = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (u64)n * c) return;
    const u32 j = (u32)(idx % c);
    float f = store_to_float(x[idx]) * scale[j] + shift[j];
    range_flag(range_flags, range_layer, store_range_bits(f));  // before the ReLU, as tile_store
    if (relu) f = fmaxf(f, 0.f);
    out[idx] = store_from_float(f);
}

// conv_pre_activate four consecutive values a thread (c % 4 == 0: 2-value loads and stores); the
// host checks n * c < 2^32.
extern "C" __global__ void conv_pre_activate4(const store_t* __restrict__ x, u32 n, u32 c, const float* __restrict__ scale,
                                              const float* __restrict__ shift, u32 relu, store_t* __restrict__ out,
                                              u32* __restrict__ range_flags, u32 range_layer) {
    const u32 i = (blockIdx.x * blockDim.x + threadIdx.x) * 4u;
    if (i >= n * c) return;
    const u32 j = i % c;
    const store2_t* x2 = reinterpret_cast<const store2_t*>(x + i);
    const float2 a = store2_to_float2(x2[0]), b = store2_to_float2(x2[1]);
    float f[4] = {a.x * scale[j] + shift[j], a.y * scale[j + 1] + shift[j + 1], b.x * scale[j + 2] + shift[j + 2],
                  b.y * scale[j + 3] + shift[j + 3]};
    range_flag(range_flags, range_layer, store_range_bits(f[0]) | store_range_bits(f[1]) | store_range_bits(f[2]) | store_range_bits(f[3]));
    if (relu)
        for (int e = 0; e < 4; ++e) f[e] = fmaxf(f[e], 0.f);
    store2_t* o2 = reinterpret_cast<store2_t*>(out + i);
    o2[0] = store2_from_floats(f[0], f[1]);
    o2[1] = store2_from_floats(f[2], f[3]);
}
