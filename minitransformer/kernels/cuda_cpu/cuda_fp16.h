// cuda_fp16.h for the CPU runner: __half as 2-byte IEEE binary16 storage, converted to and from float exactly as
// CUDA does (round to nearest even). Arithmetic happens in float: __half converts implicitly, as CUDA's does.
#pragma once
#include <cstdint>
#include <cstring>

namespace cudacpu {
template <class T> struct half_kind;  // tells the launcher which 2-byte float type a kernel parameter points to

// binary32 -> binary16, round to nearest even. Layout: sign 1 | exponent 5 (bias 15) | mantissa 10.
inline uint16_t float_to_half_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return 0x7fffu;                   // NaN: CUDA returns the canonical NaN
    if (ax >= 0x477ff000u) return sign | 0x7c00u;          // >= 65520 (halfway above 65504) rounds to infinity
    if (ax < 0x38800000u) {                                 // below 2^-14: a subnormal half (units of 2^-24) or zero
        if (ax <= 0x33000000u) return sign;                // <= 2^-25: exactly halfway to 2^-24 ties to even 0
        const uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;  // value = m * 2^(e-150)
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (q & 1u))) ++q;   // may carry into the smallest normal: still right
        return sign | q;
    }
    uint32_t h = (ax >> 13) - (112u << 10);                 // rebias the exponent 127 -> 15, keep 10 mantissa bits
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h; // a carry out of the mantissa bumps the exponent: right
    return sign | h;
}

inline float half_bits_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    uint32_t x;
    if (e == 0) {                                           // zero or subnormal: m * 2^-24, exact in float
        float f = float(m) * 5.9604644775390625e-8f;
        std::memcpy(&x, &f, 4);
        x |= sign;
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);                 // infinity, or NaN with its payload
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
}  // namespace cudacpu

struct __half {
    uint16_t __x;
    __half() = default;                                     // trivial, so `__shared__ __half tile[..]` is plain storage
    __half(float f) : __x(cudacpu::float_to_half_bits(f)) {}
    operator float() const { return cudacpu::half_bits_to_float(__x); }
};
typedef __half half;
struct __half2 { __half x, y; };

template <> struct cudacpu::half_kind<__half> { static constexpr int value = 4; };

inline float __half2float(__half h) { return cudacpu::half_bits_to_float(h.__x); }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __ushort_as_half(unsigned short bits) { __half h; h.__x = bits; return h; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
