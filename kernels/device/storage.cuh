// ---- Activation storage (prepended after prelude.cuh to the modules that store activations,
// see src/device/kernels.rs STORAGE_MODULES). The same kernel text builds twice: FP16 storage by
// default, BF16 storage when compiled with -DSPTR_STORAGE_BF16, FP32 storage with -DSPTR_STORAGE_F32
// (src/device/storage.rs). Either
// way every reduction and epilogue is FP32; only what is stored, and what the tensor cores take,
// changes. BF16 keeps FP32's exponent (largest finite value 3.39e38, against FP16's 65,504) with
// 8 significant bits instead of 11, on the same tensor-core instructions at the same rate.
//
// FP32 storage is the wide fallback (precision `auto` after an overflow, and `fp32`): FP32's range
// and precision, without tensor cores. Its build leaves out every tensor-core kernel
// (STORE_TENSOR_CORES is 0; the host never picks one for FP32 buffers).
//
// store_t / store2_t: one / two stored values (2 bytes each for FP16 and BF16, so every layout,
// stride and 16-byte vector of the FP16 path holds as is; 4 bytes for FP32); store_to_float, store_from_float (round to nearest even),
// store2_to_float2, store2_from_floats, store_bits: the conversions; STORE_MMA: the PTX operand
// type of mma.sync / wgmma; STORE_ONE_BITS: 1.0 as stored; STORE_MAX: the largest finite stored
// value, the range guard's saturation limit (store_range_bits).
#include <cuda_fp16.h>
#if defined(SPTR_STORAGE_F32)
typedef float store_t;
typedef float2 store2_t;
#define STORE_TENSOR_CORES 0
#define STORE_MAX 3.402823466e38f
__device__ __forceinline__ float store_to_float(store_t h) { return h; }
__device__ __forceinline__ store_t store_from_float(float f) { return f; }
__device__ __forceinline__ float2 store2_to_float2(store2_t h) { return h; }
__device__ __forceinline__ store2_t store2_from_floats(float a, float b) { return make_float2(a, b); }
#elif defined(SPTR_STORAGE_BF16)
#include <cuda_bf16.h>
typedef __nv_bfloat16 store_t;
typedef __nv_bfloat162 store2_t;
#define STORE_TENSOR_CORES 1
#define STORE_MMA "bf16"
#define STORE_ONE_BITS 0x3F80u
#define STORE_MAX 3.38953139e38f
__device__ __forceinline__ float store_to_float(store_t h) { return __bfloat162float(h); }
__device__ __forceinline__ store_t store_from_float(float f) { return __float2bfloat16_rn(f); }
__device__ __forceinline__ float2 store2_to_float2(store2_t h) { return __bfloat1622float2(h); }
__device__ __forceinline__ store2_t store2_from_floats(float a, float b) { return __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ unsigned short store_bits(store_t h) { return __bfloat16_as_ushort(h); }
#else
typedef __half store_t;
typedef __half2 store2_t;
#define STORE_TENSOR_CORES 1
#define STORE_MMA "f16"
#define STORE_ONE_BITS 0x3C00u
#define STORE_MAX 65504.0f
__device__ __forceinline__ float store_to_float(store_t h) { return __half2float(h); }
__device__ __forceinline__ store_t store_from_float(float f) { return __float2half_rn(f); }
__device__ __forceinline__ float2 store2_to_float2(store2_t h) { return __half22float2(h); }
__device__ __forceinline__ store2_t store2_from_floats(float a, float b) { return __floats2half2_rn(a, b); }
__device__ __forceinline__ unsigned short store_bits(store_t h) { return __half_as_ushort(h); }
#endif

// The range guard's bits (prelude.cuh) for a value about to be stored: RANGE_SATURATED when
// |v| >= STORE_MAX (it rounds to the largest stored value or to inf; for FP16 exactly
// fp16_range_bits), RANGE_NONFINITE when v is NaN or inf already.
__device__ __forceinline__ u32 store_range_bits(float v) {
    const float a = fabsf(v);  // NaN fails both compares
    return a < STORE_MAX ? 0u : (a <= 3.402823466e38f ? RANGE_SATURATED : RANGE_NONFINITE);
}

// One tensor-core step, c += a x b: mma.sync m16n8k16, FP16 x FP16 (BF16 x BF16) -> FP32 (sm_80
// and later; both input types have the same fragment layouts). Fragments as PTX defines them,
// with g = lane / 4, t = lane % 4: a = A rows (g, g + 8) x cols (2t, 2t + 1) and (2t + 8, 2t + 9);
// b = B rows (2t, 2t + 1) and (2t + 8, 2t + 9) x col g; c = rows (g, g + 8) x cols (2t, 2t + 1).
#if STORE_TENSOR_CORES
__device__ __forceinline__ void mma_16816(float c[4], const u32 a[4], const u32 b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32." STORE_MMA "." STORE_MMA ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif  // STORE_TENSOR_CORES
