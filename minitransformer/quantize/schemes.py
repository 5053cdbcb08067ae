"""The weight formats of quantize/: int8 per output channel, int4 in groups of 32 and plain float16 storage,
quantize / dequantize / unpack.

Pure functions over (out, in) arrays, GGUF's layout; the package docstring (quantize/__init__.py) gives each format's
definition and error bound, lesson 13 measures what they cost in quality. linear.py builds the matrix on them;
the int8 arithmetic itself is backend.quantize_int8_rows, which kv_storage.py's int8 codec calls too.
"""

from __future__ import annotations

import numpy as np

from ..core.backend import DTYPE, array_module, dequantize_int8_rows, quantize_int8_rows
from ..core.errors import InputError

SCHEMES = ("f32", "int8", "int4", "f16")
GROUP = 32                      # int4: inputs per group (one scale and one minimum each)
INT4_LEVELS = 15                # 0..15
FLOAT16_MAX = 65504.0           # the largest finite float16: anything beyond rounds to inf


# ------------------------------------------------------------------------------------------------- int8 weights

def quantize_int8(w):
    """w (out, in) float32 -> q (out, in) int8, scale (out,) float32, with w[o] ~ q[o] * scale[o]: one symmetric
    scale per output channel (backend.quantize_int8_rows, the arithmetic the int8 KV cache uses per vector)."""
    return quantize_int8_rows(w.astype(DTYPE, copy=False))


def dequantize_int8(q, scale):
    """q (out, in) int8, scale (out,) -> (out, in) float32."""
    return dequantize_int8_rows(q, scale)


# ------------------------------------------------------------------------------------------------- int4 weights

def _float16_down(x):
    """The largest float16 <= x (x float32): the rounded minimum must not rise above the group's smallest value."""
    xp = array_module(x)
    h = x.astype(np.float16)
    return xp.where(h.astype(DTYPE) > x, xp.nextafter(h, np.float16(-np.inf)), h)


def _float16_up(x):
    """The smallest float16 >= x: the rounded scale must still reach the group's largest value."""
    xp = array_module(x)
    h = x.astype(np.float16)
    return xp.where(h.astype(DTYPE) < x, xp.nextafter(h, np.float16(np.inf)), h)


def quantize_int4(w):
    """w (out, in) float32, in a multiple of 32 -> packed (out, in/2) uint8, scale and minimum (out, in/32) float16.

    Value i of row o is q = round((w - min) / scale) in [0, 15]; byte k holds q[2k] (low nibble) and q[2k+1] (high).
    """
    xp = array_module(w)
    rows, cols = w.shape
    if cols % GROUP:
        raise InputError(f"int4 needs the input size to be a multiple of {GROUP} (the group size); got {cols}")
    groups = w.astype(DTYPE, copy=False).reshape(rows, cols // GROUP, GROUP)        # (out, in/32, 32)
    low = _float16_down(groups.min(axis=2))                                          # (out, in/32) float16
    span = groups.max(axis=2) - low.astype(DTYPE)
    scale = _float16_up(span / float(INT4_LEVELS))
    scale = xp.where(scale > 0, scale, np.float16(1.0)).astype(np.float16)           # a constant group
    levels = xp.rint((groups - low.astype(DTYPE)[..., None]) / scale.astype(DTYPE)[..., None])
    q = xp.clip(levels, 0, INT4_LEVELS).astype(np.uint8).reshape(rows, cols)        # (out, in)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)                                          # (out, in/2)
    return packed.astype(np.uint8), scale, low


def unpack_int4(packed):
    """packed (out, in/2) uint8 -> the 4-bit levels (out, in) uint8."""
    xp = array_module(packed)
    q = xp.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    q[:, 0::2] = packed & 0x0F
    q[:, 1::2] = packed >> 4
    return q


# Byte b -> its two levels as float32 (low nibble, high nibble): one table lookup unpacks and converts a byte, where
# masking, shifting and converting would be three passes over the array.
_NIBBLES = np.stack([np.arange(256) & 0x0F, np.arange(256) >> 4], axis=-1).astype(DTYPE)     # (256, 2)


def dequantize_int4(packed, scale, low):
    """packed (out, in/2), scale and min (out, in/32) float16 -> (out, in) float32."""
    xp = array_module(packed)
    rows = packed.shape[0]
    table = _NIBBLES if xp is np else xp.asarray(_NIBBLES)
    q = xp.take(table, packed, axis=0).reshape(rows, -1, GROUP)                     # (out, in/32, 32) levels
    q *= scale.astype(DTYPE)[..., None]
    q += low.astype(DTYPE)[..., None]
    return q.reshape(rows, -1)


# ---------------------------------------------------------------------------------------------- float16 weights

def quantize_float16(w):
    """w (out, in) float32 -> (out, in) float16, each weight rounded to the nearest float16 (relative error
    <= 2^-11 for normal values). A weight beyond float16's range is an error: it would silently become inf."""
    largest = float(array_module(w).abs(w).max()) if w.size else 0.0        # checked before the cast overflows
    if largest > FLOAT16_MAX:
        raise InputError(f"float16 cannot store these weights: the largest |w| is {largest:g}, above float16's "
                         f"maximum {FLOAT16_MAX:g}; use f32")
    return w.astype(np.float16)


def dequantize_float16(w16):
    """(out, in) float16 -> (out, in) float32 (exact: every float16 is a float32)."""
    return w16.astype(DTYPE)


def matmul_float16(a, b):
    """a (M, K) float16 @ b (K, N) float16 -> (M, N) float16, accumulated in float32: float16 weight storage.

    On CuPy this is plain `a @ b`: a 2-D matmul goes through cupy/_core/_routines_linalg.pyx `dot` ->
    `tensordot_core` -> `tensordot_core_v11`, which calls cublasGemmEx with A, B and C as CUDA_R_16F and compute type
    CUBLAS_COMPUTE_32F (CuPy's default for float16; even its COMPUTE_TYPE_FP16 setting maps to 32F there), algorithm
    CUBLAS_GEMM_DEFAULT_TENSOR_OP from compute capability 7.0: tensor cores multiply the halves, sums are float32,
    and the float32 result is rounded to float16 once when C is written.
    NumPy has no half-precision BLAS (its float16 matmul is a generic loop, far slower than a BLAS for many rows),
    so here the same arithmetic is emulated through the float32 BLAS: a product of two float16 values (11-bit
    significands) needs at most 22 bits and is exact in float32 (24 bits); the sums are float32, as on the GPU (in
    another order, so the two agree to float32 rounding before the final rounding); the result is rounded to float16
    once. The float32 copies of a and b cost memory and time on the CPU: this path is there to check the GPU's
    arithmetic anywhere, not to be fast.
    """
    if isinstance(a, np.ndarray):
        return (a.astype(DTYPE) @ b.astype(DTYPE)).astype(np.float16)      # (M, N)
    return a @ b                                                            # (M, N): cublasGemmEx, see above
