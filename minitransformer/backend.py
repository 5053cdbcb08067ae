"""The array module: NumPy on the CPU, CuPy on an NVIDIA GPU — the one place that knows which.

Every other file does its math through `xp`, the module this file hands out, so the same lines of model code run on
both devices (`xp.exp`, `xp.matmul`, ...). Rules that keep that promise:
- no NumPy-only calls inside the model (no `np.` on activations; `to_host` is the only way back to NumPy);
- float32 everywhere (`DTYPE`). NumPy 2 promotes float32 arrays to float64 through float64 *scalars*
  (`1 / np.sqrt(64)` is a float64), so scale factors are plain Python floats — see DESIGN.md "float32 pitfall";
- weights may be *stored* as float16 (quantize/ scheme "f16"): `matmul_float16` multiplies them with float32
  accumulation, the same arithmetic on both devices; activations stay float32.
"""

from __future__ import annotations

import numpy as np

from .errors import DeviceError

DTYPE = np.float32          # activations, weights and logits (weights may be stored float16: matmul_float16)
INDEX_DTYPE = np.int64      # token ids and positions

DEVICES = ("cpu", "gpu")


def get_xp(device: str = "cpu"):
    """Return the array module for a device name: numpy for "cpu", cupy for "gpu" (checked to have a GPU)."""
    if device == "cpu":
        return np
    if device == "gpu":
        try:
            import cupy
        except ImportError as exc:  # cupy missing or its CUDA libraries not loadable
            raise DeviceError(f"--device gpu needs CuPy and an NVIDIA GPU; CuPy could not be imported ({exc}). "
                              "Install the 'gpu' extra on a machine with CUDA, or use --device cpu") from None
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # CUDA driver absent
            raise DeviceError(f"--device gpu: CuPy found no usable CUDA driver ({exc}); use --device cpu") from None
        if count < 1:
            raise DeviceError("--device gpu: CuPy is installed but no NVIDIA GPU was found; use --device cpu")
        return cupy
    raise DeviceError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")


def array_module(array):
    """The module (numpy or cupy) that owns `array`."""
    return np if isinstance(array, np.ndarray) else __import__("cupy").get_array_module(array)


def to_host(array) -> np.ndarray:
    """A NumPy copy of a device array (a no-op for NumPy arrays): the only way results leave the device."""
    if isinstance(array, np.ndarray):
        return array
    return array.get()


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


def synchronize(xp) -> None:
    """Wait for queued device work to finish, so a timer around it measures the work (no-op on the CPU)."""
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()
