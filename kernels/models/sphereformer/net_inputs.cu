// SphereFormer's network inputs from voxels, and its outputs back to points, on the GPU.
// Host side and the rules: src/model/preprocess_cuda.rs; CPU reference: src/model/preprocess.rs
// and pipeline.rs (argmax_softmax, devoxelize). Compiled without FMA contraction: the
// recomputed coordinate is one IEEE float32 division and a floor, as on the CPU.

// Per kept voxel v: the network coordinate [b, floor(mean_norm / voxel_size)] (float32, as
// upstream recomputes it from the float32 mean), its batch index, and bounds (host-initialised,
// 12 entries): min xyz and max xyz of the recomputed coordinates (the negative check, the
// spatial shape when no duplicate moves), then min xyz and max xyz over the recomputed
// coordinates and the keys together (the duplicate pass packs either).
extern "C" __global__ void net_recompute_coords(const float* __restrict__ xyz_norm, const i32* __restrict__ key_coords,
                                                u32 m, float vs0, float vs1, float vs2,
                                                i32* __restrict__ coords, i32* __restrict__ batch, i32* bounds) {
    const u32 v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= m) return;
    const float vs[3] = {vs0, vs1, vs2};
    coords[v * 4] = key_coords[v * 4];
    batch[v] = key_coords[v * 4];
    for (int a = 0; a < 3; ++a) {
        // floorf then a saturating conversion, as Rust's `(mean / vs).floor() as i32`
        // (NaN cannot occur: the mean of finite positions).
        const i32 c = __float2int_rz(floorf(__fdiv_rn(xyz_norm[v * 3 + a], vs[a])));
        coords[v * 4 + 1 + a] = c;
        const i32 k = key_coords[v * 4 + 1 + a];
        atomicMin(&bounds[a], c);
        atomicMax(&bounds[3 + a], c);
        atomicMin(&bounds[6 + a], min(c, k));
        atomicMax(&bounds[9 + a], max(c, k));
    }
}

// Mixed-radix key of coords[v] over lo (min xyz; same order as [b, x, y, z]); vals = identity;
// moved (the duplicate pass's counter) = 0.
extern "C" __global__ void net_pack_keys(const i32* __restrict__ coords, u32 m, i32 lo_x, i32 lo_y, i32 lo_z,
                                         u64 dx, u64 dy, u64 dz, u64* __restrict__ keys, u32* __restrict__ vals,
                                         u32* __restrict__ moved) {
    const u32 v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v == 0) *moved = 0u;  // the pass's counter (net_revert_duplicates runs after the sort)
    if (v >= m) return;
    vals[v] = v;
    const u64 b = (u64)coords[v * 4];
    const u64 rx = (u64)((i64)coords[v * 4 + 1] - lo_x);
    const u64 ry = (u64)((i64)coords[v * 4 + 2] - lo_y);
    const u64 rz = (u64)((i64)coords[v * 4 + 3] - lo_z);
    keys[v] = ((b * dx + rx) * dy + ry) * dz + rz;
}

// One pass of the duplicate rule (src/model/preprocess.rs, resolve_duplicates): every voxel that
// shares its coordinate with another (equal neighbours in key order) and whose coordinate is not
// its key goes back to the key; moved counts them. Each thread writes only its own voxel.
extern "C" __global__ void net_revert_duplicates(const u64* __restrict__ keys, const u32* __restrict__ vals, u32 m,
                                                 const i32* __restrict__ key_coords, i32* __restrict__ coords,
                                                 u32* moved) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) return;
    const bool dup = (i > 0 && keys[i - 1] == keys[i]) || (i + 1 < m && keys[i + 1] == keys[i]);
    if (!dup) return;
    const u32 v = vals[i];
    bool differs = false;
    for (int a = 1; a < 4; ++a) differs |= coords[v * 4 + a] != key_coords[v * 4 + a];
    if (!differs) return;
    for (int a = 1; a < 4; ++a) coords[v * 4 + a] = key_coords[v * 4 + a];
    atomicAdd(moved, 1u);
}

// Per-axis minimum and maximum of the final coordinates (after duplicates moved): ext = min xyz,
// max xyz, host-initialised.
extern "C" __global__ void net_coord_extent(const i32* __restrict__ coords, u32 m, i32* ext) {
    const u32 v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= m) return;
    for (int a = 0; a < 3; ++a) {
        atomicMin(&ext[a], coords[v * 4 + 1 + a]);
        atomicMax(&ext[3 + a], coords[v * 4 + 1 + a]);
    }
}

// Per row of [n, classes] logits: the arg-max (first on ties, as torch.max) and its softmax
// probability 1 / sum(exp(l - l_max)) in double, as pipeline.rs's argmax_softmax.
extern "C" __global__ void net_argmax_softmax(const float* __restrict__ logits, u32 n, u32 classes,
                                              u32* __restrict__ label, float* __restrict__ prob) {
    const u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const float* row = logits + (u64)r * classes;
    u32 best = 0;
    for (u32 c = 1; c < classes; ++c)
        if (row[c] > row[best]) best = c;
    const double mx = (double)row[best];
    double denom = 0.0;
    for (u32 c = 0; c < classes; ++c) denom += exp((double)row[c] - mx);
    label[r] = best;
    prob[r] = (float)(1.0 / denom);
}

// Every point takes its voxel's label and probability; points without a voxel get `unlabeled`, 0.
extern "C" __global__ void net_devoxelize(const i32* __restrict__ point_to_voxel, u32 n_points,
                                          const u32* __restrict__ voxel_label, const float* __restrict__ voxel_prob,
                                          u32 unlabeled, u32* __restrict__ labels, float* __restrict__ probs) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_points) return;
    const i32 v = point_to_voxel[i];
    labels[i] = v >= 0 ? voxel_label[v] : unlabeled;
    probs[i] = v >= 0 ? voxel_prob[v] : 0.f;
}
