// common.cuh: small helpers shared by flash_prefill.cu and paged_decode.cu.
//
// The loader (loader.py) pastes this file in place of `#include "common.cuh"` before compiling: CuPy's kernel cache
// key is the source text, so an include it cannot see would let an edited header reuse a stale cached binary.
#pragma once
#include <cuda_fp16.h>

#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

// -infinity as a bit pattern (sign 1, exponent all ones, mantissa 0): the "no key seen yet" running max.
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Loads convert to float32 and stores convert back: all arithmetic runs in float32, whatever the storage type.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

// Butterfly reductions over the 32 lanes of a warp: after log2(32) = 5 exchanges every lane holds the result.
__device__ __forceinline__ float warp_max(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, offset));
    return x;
}

__device__ __forceinline__ float warp_sum(float x) {
    for (int offset = WARP_SIZE / 2; offset > 0; offset /= 2)
        x += __shfl_xor_sync(FULL_MASK, x, offset);
    return x;
}
