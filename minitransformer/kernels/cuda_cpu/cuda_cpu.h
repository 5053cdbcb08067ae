// What a CUDA kernel sees when the CPU runner compiles it with g++: the keywords, the built-in variables, barriers,
// warp collectives, atomics and math intrinsics, each mapped onto the scheduler in cuda_cpu_scheduler.h.
//
// cpu_compile.py includes this file first, then the kernel source under `#line` directives (so g++ errors name the
// .cu file and line), then the launchers. `#include <cuda_fp16.h>` in a kernel finds the stub next to this file.
#pragma once
#include <cmath>
#include <math.h>
#include "cuda_cpu_scheduler.h"

#define __CUDACPU__ 1                                       // a kernel may test it; __CUDACC__ stays undefined

// ---- keywords ----------------------------------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __noinline__ __attribute__((noinline))
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __grid_constant__
#define __constant__ static
// A function-local static is one object shared by every emulated thread of the block: exactly shared memory.
// cpu_compile.py finds these objects in the compiled library, and cpu_runner.py poisons them before each block and
// adds up each kernel's static shared memory. `extern __shared__ T name[];` is rewritten by cpu_compile.py into a
// pointer to the dynamic shared buffer (the same address for every such name, as in CUDA).
#define __shared__ static

// ---- built-in variables: per emulated thread (threadIdx) or per block ----------------------------------------------
#define threadIdx (::cudacpu::cur->tid)
#define blockIdx (::cudacpu::g.blockIdx)
#define blockDim (::cudacpu::g.blockDim)
#define gridDim (::cudacpu::g.gridDim)
static const int warpSize = 32;

namespace cudacpu {
inline void* dynamic_shared_base() { return dynamic_shared; }

// ---- barriers ------------------------------------------------------------------------------------------------------
inline int syncthreads(const char* file, int line, int pred) {
    cur->state = AT_BARRIER;
    cur->file = file;
    cur->line = line;
    cur->pred = pred;
    block_here();
    return int(cur->result);                               // how many threads passed a nonzero predicate
}

// ---- warp collectives ----------------------------------------------------------------------------------------------
inline uint64_t warp_collective(int op, unsigned mask, uint64_t value, int arg, int width, int pred,
                                const char* file, int line) {
    if (width <= 0 || width > 32 || (width & (width - 1))) {
        fail("%s:%d: %s width %d is not a power of two in [1, 32]", file, line, warp_op_names[op], width);
        block_here();
    }
    cur->state = AT_WARP;
    cur->op = op;
    cur->mask = mask;
    cur->value = value;
    cur->arg = arg;
    cur->width = width;
    cur->pred = pred;
    cur->file = file;
    cur->line = line;
    block_here();
    return cur->result;
}

template <class T> T shuffle(int op, unsigned mask, T var, int arg, int width, const char* file, int line) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle: a value of at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof(T));
    bits = warp_collective(op, mask, bits, arg, width, 0, file, line);
    T out;
    memcpy(&out, &bits, sizeof(T));
    return out;
}

inline unsigned active_mask() {
    return alive_lanes(cur->lin / WARP);
}
}  // namespace cudacpu

#define __syncthreads() ::cudacpu::syncthreads(__FILE__, __LINE__, 1)
#define __syncthreads_count(p) ::cudacpu::syncthreads(__FILE__, __LINE__, (p) != 0)
#define __syncthreads_and(p) \
    (::cudacpu::syncthreads(__FILE__, __LINE__, (p) != 0) == int(blockDim.x * blockDim.y * blockDim.z))
#define __syncthreads_or(p) (::cudacpu::syncthreads(__FILE__, __LINE__, (p) != 0) > 0)

// The optional width argument of CUDA's shuffles is the macro's fourth argument: __VA_OPT__ is C++20, so a default
// is supplied through a helper taking (mask, var, arg, width = 32).
#define CUDACPU_SHFL(op, ...) ::cudacpu::shuffle_args(op, __FILE__, __LINE__, __VA_ARGS__)
namespace cudacpu {
template <class T> T shuffle_args(int op, const char* file, int line, unsigned mask, T var, int arg, int width = 32) {
    return shuffle<T>(op, mask, var, arg, width, file, line);
}
}  // namespace cudacpu
#define __shfl_sync(...) CUDACPU_SHFL(::cudacpu::SHFL_IDX, __VA_ARGS__)
#define __shfl_up_sync(...) CUDACPU_SHFL(::cudacpu::SHFL_UP, __VA_ARGS__)
#define __shfl_down_sync(...) CUDACPU_SHFL(::cudacpu::SHFL_DOWN, __VA_ARGS__)
#define __shfl_xor_sync(...) CUDACPU_SHFL(::cudacpu::SHFL_XOR, __VA_ARGS__)
#define CUDACPU_VOTE(mask, p) \
    ::cudacpu::warp_collective(::cudacpu::BALLOT, (mask), 0, 0, 32, (p) != 0, __FILE__, __LINE__)
#define __syncwarp(...) ((void)::cudacpu::warp_collective(::cudacpu::SYNCWARP, ::cudacpu::syncwarp_mask(__VA_ARGS__), \
                                                        0, 0, 32, 0, __FILE__, __LINE__))
#define __ballot_sync(mask, p) unsigned(CUDACPU_VOTE(mask, p))
#define __any_sync(mask, p) (__ballot_sync(mask, p) != 0u)
#define __all_sync(mask, p) ::cudacpu::all_of(CUDACPU_VOTE(mask, p))
#define __activemask() ::cudacpu::active_mask()
namespace cudacpu {
inline unsigned syncwarp_mask(unsigned mask = 0xffffffffu) { return mask; }
inline int all_of(uint64_t r) { return unsigned(r) == unsigned(r >> 32); }   // ballot == the lanes that took part
}  // namespace cudacpu

// __trap(): the GPU aborts the kernel; here the launch raises KernelError naming the thread.
#define __trap() ::cudacpu::trap(__FILE__, __LINE__)
namespace cudacpu {
inline void trap(const char* file, int line) {
    fail("%s:%d: __trap() in thread (%u,%u,%u) of block (%u,%u,%u)", file, line, cur->tid.x, cur->tid.y, cur->tid.z,
         blockIdx.x, blockIdx.y, blockIdx.z);
    for (;;) block_here();                                  // never resumed: the scheduler stops on the failure
}
}  // namespace cudacpu

// ---- memory ordering: nothing to do, threads never run at the same time --------------------------------------------
inline void __threadfence() {}
inline void __threadfence_block() {}
template <class T> inline T __ldg(const T* p) { return *p; }

// ---- atomics: plain read-modify-write is atomic here (one emulated thread runs at a time) -------------------------
#define CUDACPU_ATOMIC(name, T, expr) \
    inline T name(T* address, T val) { T old = *address; *address = (expr); return old; }
CUDACPU_ATOMIC(atomicAdd, int, old + val)
CUDACPU_ATOMIC(atomicAdd, unsigned, old + val)
CUDACPU_ATOMIC(atomicAdd, unsigned long long, old + val)
CUDACPU_ATOMIC(atomicAdd, float, old + val)
CUDACPU_ATOMIC(atomicAdd, double, old + val)
CUDACPU_ATOMIC(atomicSub, int, old - val)
CUDACPU_ATOMIC(atomicSub, unsigned, old - val)
CUDACPU_ATOMIC(atomicMax, int, old > val ? old : val)
CUDACPU_ATOMIC(atomicMax, unsigned, old > val ? old : val)
CUDACPU_ATOMIC(atomicMax, long long, old > val ? old : val)
CUDACPU_ATOMIC(atomicMax, unsigned long long, old > val ? old : val)
CUDACPU_ATOMIC(atomicMin, int, old < val ? old : val)
CUDACPU_ATOMIC(atomicMin, unsigned, old < val ? old : val)
CUDACPU_ATOMIC(atomicMin, long long, old < val ? old : val)
CUDACPU_ATOMIC(atomicMin, unsigned long long, old < val ? old : val)
CUDACPU_ATOMIC(atomicExch, int, val)
CUDACPU_ATOMIC(atomicExch, unsigned, val)
CUDACPU_ATOMIC(atomicExch, unsigned long long, val)
CUDACPU_ATOMIC(atomicExch, float, val)
CUDACPU_ATOMIC(atomicAnd, int, old & val)
CUDACPU_ATOMIC(atomicAnd, unsigned, old & val)
CUDACPU_ATOMIC(atomicOr, int, old | val)
CUDACPU_ATOMIC(atomicOr, unsigned, old | val)
#undef CUDACPU_ATOMIC
#define CUDACPU_CAS(T) \
    inline T atomicCAS(T* address, T compare, T val) { \
        T old = *address; \
        if (old == compare) *address = val; \
        return old; \
    }
CUDACPU_CAS(int)
CUDACPU_CAS(unsigned)
CUDACPU_CAS(unsigned long long)
#undef CUDACPU_CAS

// ---- math: CUDA's fast intrinsics are the accurate functions here ------------------------------------------------
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanhf(float x) { return tanhf(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __frsqrt_rn(float x) { return 1.0f / sqrtf(x); }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline int __float2int_rn(float x) { return int(nearbyintf(x)); }
inline int __float2int_rz(float x) { return int(x); }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
#define CUDACPU_MINMAX(T) \
    inline T min(T a, T b) { return a < b ? a : b; } \
    inline T max(T a, T b) { return a > b ? a : b; }
CUDACPU_MINMAX(int)
CUDACPU_MINMAX(unsigned)
CUDACPU_MINMAX(long)
CUDACPU_MINMAX(unsigned long)
CUDACPU_MINMAX(long long)
CUDACPU_MINMAX(unsigned long long)
CUDACPU_MINMAX(float)
CUDACPU_MINMAX(double)
#undef CUDACPU_MINMAX

// ---- vector types (the ones kernels use for wide loads) -------------------------------------------------------------
struct __align__(8) float2 { float x, y; };
struct __align__(16) float4 { float x, y, z, w; };
struct __align__(8) int2 { int x, y; };
struct __align__(16) int4 { int x, y, z, w; };
struct __align__(8) uint2 { unsigned x, y; };
struct __align__(16) uint4 { unsigned x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
