"""The array module: NumPy on the CPU, CuPy on an NVIDIA GPU — the one place that knows which.

Every other file does its math through `xp`, the module this file hands out, so the same lines of model code run on
both devices (`xp.exp`, `xp.matmul`, ...). Rules that keep that promise:
- no NumPy-only calls inside the model (no `np.` on activations; `to_host` is the only way back to NumPy);
- float32 everywhere (`DTYPE`). NumPy 2 promotes float32 arrays to float64 through float64 *scalars*
  (`1 / np.sqrt(64)` is a float64), so scale factors are plain Python floats (otherwise the whole forward silently
  runs in float64, several times slower);
- weights may be *stored* as float16 (quantize/ scheme "f16"): `matmul_float16` multiplies them with float32
  accumulation, the same arithmetic on both devices; activations stay float32;
- every large reservation (KV caches, the RoPE table, CUDA graph buffers) asks `check_memory` first, so a request
  for more than the machine has is one clear line, not minutes of paging followed by a MemoryError.
"""

from __future__ import annotations

import functools
import numbers
import os

import numpy as np

from .errors import DeviceError, InputError, MemoryLimitError

DTYPE = np.float32          # activations, weights and logits (weights may be stored float16: matmul_float16)
INDEX_DTYPE = np.int64      # token ids and positions
INT8_MAX = 127              # symmetric int8 (weights and KV cache): -127..127, so -w quantizes to -q (no lone -128)

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


def quantize_int8_rows(x):
    """x (..., n) float32 -> q (..., n) int8, scale (...,) float32 with x ~ q * scale[..., None].

    Symmetric int8, one scale per row of the last axis: scale = max |x| / 127, q = round(x / scale) clipped to
    [-127, 127], so the error per element is at most scale / 2. The one int8 arithmetic of the package: int8 weights
    (a row is an output channel, quantize/schemes.py) and the int8 KV cache (a row is one (token, head) vector,
    kv_storage.py) both call it. An all-zero row gets scale 1 (any scale stores zeros exactly).
    """
    xp = array_module(x)
    scale = xp.abs(x).max(axis=-1) / float(INT8_MAX)                                # (...,)
    scale = xp.where(scale > 0, scale, 1.0).astype(DTYPE)
    q = xp.clip(xp.rint(x / scale[..., None]), -INT8_MAX, INT8_MAX).astype(np.int8)   # (..., n)
    return q, scale


def dequantize_int8_rows(q, scale):
    """q (..., n) int8, scale (...,) float32 -> (..., n) float32: the inverse of quantize_int8_rows (up to rounding)."""
    return q.astype(DTYPE) * scale[..., None]


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


# ----------------------------------------------------------------------------------------------- reservations

def is_int(value) -> bool:
    """An integer, as a setting means it: any Python or NumPy integer, but not a bool (True is not 1 token)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def check_count(name: str, value, low: int = 1) -> int:
    """A size argument (blocks, tokens, sequences) as a Python int >= low, or one InputError naming it.

    Checked before the value is multiplied into a shape or a byte count: 2.5 blocks or "16" tokens would otherwise
    fail deep inside NumPy, and a bool would silently count as 0 or 1.
    """
    accepted = "a positive integer" if low == 1 else f"an integer >= {low}"
    if not is_int(value):
        raise InputError(f"{name} must be {accepted}, got {type(value).__name__} {value!r}")
    if value < low:
        raise InputError(f"{name} must be {accepted}, got {value}")
    return int(value)


def available_memory(xp=np) -> tuple[int | None, str]:
    """Bytes a new array on xp's device can still take, and what sets that number (None: nothing known).

    On a GPU: the device's free memory plus what CuPy's pool holds free for reuse. On the CPU: the smallest of
    MemAvailable (what the kernel can hand out without swapping), the headroom under the address-space limit
    (RLIMIT_AS, `ulimit -v`: an array past it fails however much RAM is free) and the cgroup's memory limit (a
    container's share of the machine).
    """
    if xp is not np:
        free, _ = xp.cuda.runtime.memGetInfo()
        return int(free) + int(xp.get_default_memory_pool().free_bytes()), "free GPU memory"
    limits = []
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        limits.append((int(fields["MemAvailable"].split()[0]) * 1024, "MemAvailable in /proc/meminfo"))
    except (OSError, KeyError, ValueError):
        try:        # other Unixes: free physical pages
            limits.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical memory"))
        except (OSError, ValueError, AttributeError):
            pass
    import resource  # Unix only, like the rest of this function

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append((max(0, soft - _address_space_used()), "headroom under the address-space limit, ulimit -v"))
    try:
        with open("/sys/fs/cgroup/memory.max") as f, open("/sys/fs/cgroup/memory.current") as g:
            limit = f.read().strip()
            if limit != "max":
                limits.append((max(0, int(limit) - int(g.read())), "the cgroup's memory limit"))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else (None, "unknown")


def _address_space_used() -> int:
    """This process's virtual memory size in bytes (what RLIMIT_AS counts)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def check_memory(nbytes: int, what: str, xp=np, hint: str = "") -> None:
    """Refuse a reservation of `nbytes` for `what` that the device cannot hold, before any of it is allocated.

    Zero-filling more than the machine has would page for a long while and then die in a MemoryError (or take
    every other program's memory first); asking first costs a read of /proc. The MemoryLimitError names the bytes
    asked, the bytes available and where that number comes from; `hint` says which argument to lower.
    """
    available, source = available_memory(xp)
    if available is not None and nbytes > available:
        raise MemoryLimitError(f"{what}: {format_bytes(nbytes)} asked, but only {format_bytes(available)} "
                               f"available ({source})" + (f"; {hint}" if hint else ""))


def format_bytes(n: int) -> str:
    """1536 -> "1.5 KiB": binary units, one decimal, for messages."""
    if abs(n) < 1024:
        return f"{n} bytes"
    scaled = n / 1024
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        if abs(scaled) < 1024:
            return f"{scaled:.1f} {unit}"
        scaled /= 1024
    return f"{scaled:.1f} PiB"


# glibc's mallopt() parameters (malloc.h): allocations below M_MMAP_THRESHOLD come from the heap, and freed heap memory
# goes back to the OS only past M_TRIM_THRESHOLD bytes of free space at its top.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_BELOW = 256 * 2**20        # arrays up to this size are carved from memory the process keeps
TRIM_ABOVE = 1 * 2**30          # and up to this much freed memory is kept for the next step


@functools.cache                # a process-wide setting: made once, whichever Engine comes first
def keep_freed_memory() -> bool:
    """Ask the C allocator to keep the memory of freed arrays instead of returning it to the OS; True if it could.

    Why: a forward pass allocates the same large temporaries every step (a (512, 3072) FFN activation is 6 MiB) and
    frees them at its end. glibc returns freed memory to the OS -- at once for blocks it gave out with mmap, and when
    the free space at a heap's top passes a threshold -- so the next step gets fresh pages, and touching each 4 KiB
    page for the first time is a page fault plus the kernel zeroing it. In the main thread glibc's adaptive threshold
    soon stops doing that; in a thread's own arena, where the HTTP server runs the engine (server/engine_loop.py),
    it kept doing it: 450,000-600,000 page faults per 32-request round of `bench serve`'s workload against a few
    hundred for the same Engine in the main thread, and the CPU time of the round ~1.5x. Fixed thresholds end it (a
    few faults per round). It is a process-wide setting, like the CUDA caching allocator's, made by whoever owns the
    process's engine (the Engine). A no-op off glibc and on the GPU's memory (CuPy has its own pool).
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP_BELOW)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE))
    except (OSError, AttributeError):
        return False
