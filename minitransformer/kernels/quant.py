"""The dequantize-GEMV kernels as a Python function: check, size the launch, call (lesson 13, quantize/).

`dequant_gemv(x, w)` takes x (N, in) float32 and a QuantizedLinear `w`, and returns x @ w (N, out) float32, computed
by kernels/dequant_gemv.cu: on the GPU for CuPy arrays, on the CPU runner (g++, the same source) for NumPy arrays.
Rows of x go MAX_BATCH at a time into one launch's grid (y dimension), so each weight row is read once per MAX_BATCH
rows: batch 1 (decode of one sequence) gets the instantiation with one accumulator per lane.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import InputError
from .loader import Param, array_param, backend_of, get_kernel, scalar_param, source_constant

GEMV_FILE = "dequant_gemv.cu"
BATCH_SIZES = (1, 8)            # MAX_BATCH instantiations: one sequence, or up to 8 rows per weight read
INT4_GROUP = 32                 # inputs per int4 scale / minimum: the kernel's g = i / 32 (quantize/schemes.py GROUP)


def _expressions() -> tuple[str, ...]:
    rows = source_constant(GEMV_FILE, "GEMV_ROWS_PER_BLOCK")
    return tuple(f"dequant_gemv_{s}<{rows}, {b}>" for s in ("int8", "int4") for b in BATCH_SIZES)


GEMV_EXPRESSIONS = _expressions()


def dequant_gemv(x, w, module=None):
    """x (N, in) float32 @ the quantized matrix w (logically (in, out)) -> (N, out) float32 through the kernel."""
    if x.ndim != 2 or x.shape[1] != w.in_features:
        raise InputError(f"dequant_gemv needs x of shape (N, {w.in_features}), got {tuple(x.shape)}")
    if x.dtype != np.float32:
        raise InputError(f"dequant_gemv takes float32 activations, got {x.dtype}")
    multiple = 16 if w.scheme == "int8" else INT4_GROUP   # every weight row starts on a 16-byte boundary
    if w.in_features % multiple:
        raise InputError(f"{w.scheme} dequant_gemv needs in_features divisible by {multiple}, got {w.in_features}")
    backend = backend_of(x)
    xp = np if backend == "cpu" else __import__("cupy")
    x = xp.ascontiguousarray(x)
    if (x.ctypes.data if backend == "cpu" else x.data.ptr) % 16:
        x = x.copy()                                      # the kernel stages x with 16-byte loads: a fresh array
    weights_at = w.data[0].ctypes.data if backend == "cpu" else w.data[0].data.ptr
    if weights_at % 16:
        raise InputError("dequant_gemv reads weight rows with 16-byte loads: the weight array must start on a "
                         "16-byte boundary (pass a fresh contiguous copy)")
    N = x.shape[0]
    max_batch = BATCH_SIZES[0] if N == 1 else BATCH_SIZES[-1]
    rows = source_constant(GEMV_FILE, "GEMV_ROWS_PER_BLOCK")
    threads = 32 * source_constant(GEMV_FILE, "GEMV_WARPS")
    shared = 4 * max_batch * min(source_constant(GEMV_FILE, "GEMV_CHUNK"), w.in_features)   # x staged, float32
    name = f"dequant_gemv_{w.scheme}<{rows}, {max_batch}>"
    weights: tuple[Param, ...]
    if w.scheme == "int8":
        weights = (array_param("q", np.int8), array_param("scale", np.float32))
    else:
        weights = (array_param("packed", np.uint8), array_param("scale", np.float16),
                   array_param("minimum", np.float16))
    params = (array_param("x", np.float32), *weights, array_param("y", np.float32),
              scalar_param("batch", np.int32), scalar_param("in_features", np.int32),
              scalar_param("out_features", np.int32))
    kernel = get_kernel(GEMV_FILE, name, params, backend, GEMV_EXPRESSIONS, module)
    y = xp.empty((N, w.out_features), dtype=np.float32)                                  # (N, out)
    grid = (-(-w.out_features // rows), -(-N // max_batch))
    kernel(grid, (threads,), (x, *w.data, y, np.int32(N), np.int32(w.in_features), np.int32(w.out_features)),
           shared_mem=shared)
    return y
