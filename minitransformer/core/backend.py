"""The array module: NumPy on the CPU, CuPy on an NVIDIA GPU — the one place that knows which.

Every other file does its math through `xp`, the module this file hands out, so the same lines of model code run on
both devices (`xp.exp`, `xp.matmul`, ...). Rules that keep that promise:
- no NumPy-only calls inside the model (no `np.` on activations; `to_host` is the only way back to NumPy);
- float32 everywhere (`DTYPE`). NumPy 2 promotes float32 arrays to float64 through float64 *scalars*
  (`1 / np.sqrt(64)` is a float64), so scale factors are plain Python floats (otherwise the whole forward silently
  runs in float64, several times slower);
- weights may be *stored* otherwise (quantize/: int8, int4, float16), but activations stay float32;
- every large reservation (KV caches, the RoPE table, CUDA graph buffers) asks `check_memory` first, so a request
  for more than the machine has is one clear line, not minutes of paging followed by a MemoryError.
"""

from __future__ import annotations

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
    """Bytes a new array on xp's device can still take, and what sets that number (None: nothing known). On a GPU:
    the device's free memory plus what CuPy's pool holds free for reuse. On the CPU: the smallest of MemAvailable
    (what the kernel can hand out without swapping), the headroom under the address-space limit (RLIMIT_AS,
    `ulimit -v`: an array past it fails however much RAM is free) and the cgroup's limit (a container's share)."""
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
