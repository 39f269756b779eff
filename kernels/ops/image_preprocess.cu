// Camera images → the camera network's input: Pillow's bicubic resize, the crop and
// ToTensor + Normalize, fused in one kernel for all cameras (src/camera/preprocess_cuda.rs).
//
// The resize is the CPU reference's integer arithmetic (src/camera/preprocess.rs, Pillow's
// Resample.c): per output pixel, for each input row its taps read, a horizontal sum of 8-bit
// pixels times 22-bit fixed-point weights, rounded and clamped to 8 bits (Pillow's intermediate
// image), then the vertical sum of those, rounded and clamped again. The weights come from the
// host (computed there in float64 as Pillow does), so the 8-bit result equals the CPU's exactly;
// normalization is the same float32 ops (x / 255 − mean) / std with IEEE division (no FMA can form
// in it), then one rounding to FP16.
//
// Input: each camera's uploaded rows of RGB8 (rows `row0 ..` of the image, `row_bytes` apart).
// Per camera descriptor, 8 int64 words:
//   [0] byte offset of the camera's first uploaded row in `src`
//   [1] bytes per image row (width * 3)
//   [2] index of the first uploaded row in the image
//   [3] offset (int32 elements) of the horizontal taps in `tables`, [4] their ksize
//   [5] offset of the vertical taps, [6] their ksize, [7] unused
// Taps of an axis of L output indices at offset t: first[L], count[L], coeffs[L * ksize].
// count == 0 marks an output index outside the resized image: the sums stay at the rounding
// half and give 0 (PIL's crop fills outside the image with black).
//
// Every int32 sum is bounded by 255 * sum|k| + 2^21 < 2^31 (checked on the host per tap set).

#include <cuda_fp16.h>

#define PRE_PRECISION_BITS 22
#define PRE_DESC_WORDS 8

__device__ __forceinline__ i32 pre_clip8(i32 ss) {
    return min(max(ss >> PRE_PRECISION_BITS, 0), 255);
}

// Grid: (ceil(out_w / blockDim.x), ceil(out_h / blockDim.y), cameras); one thread per output
// pixel, all three channels. Output: cameras × out_h × out_w × 3, FP16 (NHWC).
extern "C" __global__ void camera_resize_normalize(
    const unsigned char* __restrict__ src,
    const i64* __restrict__ cams,
    const i32* __restrict__ tables,
    u32 out_h,
    u32 out_w,
    float m0, float m1, float m2,
    float s0, float s1, float s2,
    __half* __restrict__ out)
{
    const u32 ox = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 oy = blockIdx.y * blockDim.y + threadIdx.y;
    const u32 cam = blockIdx.z;
    if (ox >= out_w || oy >= out_h) return;

    const i64* d = cams + (u64)cam * PRE_DESC_WORDS;
    const unsigned char* img = src + d[0];
    const i64 row_bytes = d[1];
    const i64 row0 = d[2];
    const i32* ht = tables + d[3];
    const i32 kh = (i32)d[4];
    const i32* vt = tables + d[5];
    const i32 kv = (i32)d[6];

    const i32 h_first = ht[ox];
    const i32 h_count = ht[out_w + ox];
    const i32* hk = ht + 2 * (u64)out_w + (u64)ox * kh;
    const i32 v_first = vt[oy];
    const i32 v_count = vt[out_h + oy];
    const i32* vk = vt + 2 * (u64)out_h + (u64)oy * kv;

    const i32 half_unit = 1 << (PRE_PRECISION_BITS - 1);
    i32 a0 = half_unit, a1 = half_unit, a2 = half_unit;
    for (i32 j = 0; j < v_count; ++j) {
        const unsigned char* p = img + ((i64)(v_first + j) - row0) * row_bytes + (i64)h_first * 3;
        i32 h0 = half_unit, h1 = half_unit, h2 = half_unit;
        for (i32 i = 0; i < h_count; ++i) {
            const i32 k = hk[i];
            h0 += (i32)p[3 * i + 0] * k;
            h1 += (i32)p[3 * i + 1] * k;
            h2 += (i32)p[3 * i + 2] * k;
        }
        const i32 k = vk[j];
        a0 += pre_clip8(h0) * k;
        a1 += pre_clip8(h1) * k;
        a2 += pre_clip8(h2) * k;
    }
    const u64 o = (((u64)cam * out_h + oy) * out_w + ox) * 3;
    out[o + 0] = __float2half_rn(((float)pre_clip8(a0) / 255.0f - m0) / s0);
    out[o + 1] = __float2half_rn(((float)pre_clip8(a1) / 255.0f - m1) / s1);
    out[o + 2] = __float2half_rn(((float)pre_clip8(a2) / 255.0f - m2) / s2);
}
