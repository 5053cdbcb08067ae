// Planted bugs in warp matrix (wmma) code: what the CPU runner's mma.h must catch (tests/test_cpu_runner_wmma.py).
// Each buggy kernel sits next to its fixed twin. All compute c (16, 16) = a (16, 16) b^T with b stored (16, 16)
// row-major, which is how attention multiplies Q by K^T (K is stored (keys, d)).
#include <cuda_fp16.h>
#include <mma.h>

using namespace nvcuda;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major>;   // b read as b^T
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

extern "C" __global__ void abt(const __half* a, const __half* b, float* c) {
    FragA fa;
    FragBt fb;
    FragC fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

// A wrong fragment layout: b loaded row-major, so the warp computes a b, not a b^T.
extern "C" __global__ void abt_wrong_layout(const __half* a, const __half* b, float* c) {
    FragA fa;
    FragB fb;   // BUG: should be col_major (FragBt)
    FragC fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

// a staged through shared memory by the lanes, 8 elements each, then loaded by the warp. Without a __syncwarp()
// between the lanes' writes and the load, a lane that reaches the load first reads elements no lane has written
// yet: the poison the runner fills shared memory with (NaN).
extern "C" __global__ void staged(const __half* a, const __half* b, float* c) {
    __shared__ __align__(32) __half tile[256];
    for (int i = threadIdx.x; i < 256; i += 32) tile[i] = a[i];
    __syncwarp();
    FragA fa;
    FragBt fb;
    FragC fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, tile, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

extern "C" __global__ void staged_missing_syncwarp(const __half* a, const __half* b, float* c) {
    __shared__ __align__(32) __half tile[256];
    for (int i = threadIdx.x; i < 256; i += 32) tile[i] = a[i];
    // BUG: a __syncwarp() is missing here
    FragA fa;
    FragBt fb;
    FragC fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, tile, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

// The product stored to shared memory, then read back by the lanes (lane t: elements t, t + 32, ...). Each lane
// stores only its own part of the fragment; without a __syncwarp() after the store, a lane reads parts that other
// lanes have not stored yet.
extern "C" __global__ void stored(const __half* a, const __half* b, float* c) {
    __shared__ __align__(32) float tile[256];
    FragA fa;
    FragBt fb;
    FragC fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(tile, fc, 16, wmma::mem_row_major);
    __syncwarp();
    for (int i = threadIdx.x; i < 256; i += 32) c[i] = tile[i];
}

extern "C" __global__ void stored_missing_syncwarp(const __half* a, const __half* b, float* c) {
    __shared__ __align__(32) float tile[256];
    FragA fa;
    FragBt fb;
    FragC fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(tile, fc, 16, wmma::mem_row_major);
    // BUG: a __syncwarp() is missing here
    for (int i = threadIdx.x; i < 256; i += 32) c[i] = tile[i];
}

// Only half the warp multiplies: every lane of the warp must call each wmma function (KernelError, file:line).
extern "C" __global__ void divergent_mma(const __half* a, const __half* b, float* c) {
    FragA fa;
    FragBt fb;
    FragC fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    if (threadIdx.x < 16) wmma::mma_sync(fc, fa, fb, fc);   // BUG: divergent
    wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}

// A fragment pointer must be 32-byte aligned: 8 halves into an aligned tile is 16 bytes off.
extern "C" __global__ void misaligned_load(const __half* a, const __half* b, float* c) {
    __shared__ __align__(32) __half tile[264];
    for (int i = threadIdx.x; i < 264; i += 32) tile[i] = i < 256 ? a[i] : __float2half(0.0f);
    __syncwarp();
    FragA fa;
    wmma::load_matrix_sync(fa, tile + 8, 16);               // BUG: not 32-byte aligned
    c[threadIdx.x] = 0.0f;
}
