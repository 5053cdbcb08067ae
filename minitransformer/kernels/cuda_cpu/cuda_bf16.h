// cuda_bf16.h for the CPU runner: __nv_bfloat16 as 2-byte storage (the top half of a float32), rounded to nearest
// even on the way in, as CUDA's __float2bfloat16 does.
#pragma once
#include "cuda_fp16.h"

namespace cudacpu {
inline uint16_t float_to_bf16_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;    // NaN: the canonical NaN
    return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16); // round to nearest even on the 16 dropped bits
}
inline float bf16_bits_to_float(uint16_t b) {
    const uint32_t x = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
}  // namespace cudacpu

struct __nv_bfloat16 {
    uint16_t __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(cudacpu::float_to_bf16_bits(f)) {}
    operator float() const { return cudacpu::bf16_bits_to_float(__x); }
};
typedef __nv_bfloat16 nv_bfloat16;
struct __nv_bfloat162 { __nv_bfloat16 x, y; };

template <> struct cudacpu::half_kind<__nv_bfloat16> { static constexpr int value = 5; };

inline float __bfloat162float(__nv_bfloat16 b) { return cudacpu::bf16_bits_to_float(b.__x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
