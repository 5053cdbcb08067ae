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

// ---- 16-byte loads: one instruction moves 4 floats or 8 halves (paged_decode.cu, dequant_gemv.cu) ----------------
// A warp whose 32 lanes each load 16 consecutive bytes reads 512 bytes with one instruction, the widest load a
// thread can issue; the address must be a multiple of 16 (the Python side checks the arrays' alignment).
__device__ __forceinline__ uint4 load16(const void* p) { return *reinterpret_cast<const uint4*>(p); }

// The 16 bytes as float32: 4 floats as they are, or 8 halves widened (element 2i in the low half of word i).
__device__ __forceinline__ void unpack16(uint4 raw, float (&out)[4]) {
    out[0] = __uint_as_float(raw.x); out[1] = __uint_as_float(raw.y);
    out[2] = __uint_as_float(raw.z); out[3] = __uint_as_float(raw.w);
}
__device__ __forceinline__ float half_bits(unsigned bits) {
    return __half2float(__ushort_as_half((unsigned short)bits));
}
__device__ __forceinline__ void unpack16(uint4 raw, float (&out)[8]) {
    const unsigned words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        out[2 * i] = half_bits(words[i] & 0xffffu);
        out[2 * i + 1] = half_bits(words[i] >> 16);
    }
}

// Sums over aligned groups of WIDTH lanes (WIDTH a power of two <= 32) of N values at once: every lane gets its
// group's N totals. The N shuffles of one step do not wait on each other, so the reductions overlap.
template <int WIDTH, int N> __device__ __forceinline__ void group_sum(float (&x)[N]) {
#pragma unroll
    for (int offset = WIDTH / 2; offset > 0; offset /= 2)
#pragma unroll
        for (int i = 0; i < N; ++i) x[i] += __shfl_xor_sync(FULL_MASK, x[i], offset);
}
