"""Run the unchanged CUDA kernel sources on the CPU: g++ plus a small header, launched like CuPy's RawKernel.

Why: the attention kernels must be proven correct on machines without a GPU (our CI, a learner's laptop). The same
`.cu` text that CuPy compiles for the GPU is compiled here by g++ with `cuda_cpu/cuda_cpu.h`, which supplies the
built-ins (threadIdx, __syncthreads, warp shuffles, shared memory, atomics, half types; the wmma tile products in
cuda_cpu/mma.h). Blocks run one after another; the threads of a block run as fibers (or OS threads) that switch
only at barriers and warp collectives, so:
- a divergent __syncthreads, threads exiting while others wait, a shuffle some lane never reaches, or a shuffle
  reading a lane that has returned raise KernelError with the .cu file and line;
- shared memory is poisoned (all bytes 0xFF: NaN) before every block, and after each barrier and each round of
  warp collectives the runnable threads resume in a chosen order: `order="forward"` (0, 1, ...), "reverse", or
  "shuffle" (a fresh permutation every round, from `seed`; the default). A missing __syncthreads shows up only
  when the order actually runs a reader on the wrong side of a writer: a read that runs before the block's first
  write there sees the poison (NaN for floats, -1 for ints); a read that runs after another thread already
  overwrote the data (write-after-read) sees the new data, plain wrong numbers. Forward order hides the
  write-after-read of flash_prefill.cu's tile loop (its readers happen to run before its writers); reverse and
  shuffle show it. Not a race detector, then: each order is one schedule a GPU could also run, and a kernel is
  trusted after several. tests/test_kernel_barriers.py deletes each barrier of the attention kernels in turn and
  checks that some order, and the default one, notices.

    module = CpuModule(source, name_expressions=["flash_prefill<float, 64>"])   # order="shuffle", seed=0
    kernel = module.get_function("flash_prefill<float, 64>")
    kernel((blocks_x, heads), (128,), (q, k, v, out, np.int32(n)), shared_mem=bytes)   # same call as cupy.RawKernel
    kernel.order, kernel.seed = "reverse", 0                                            # per kernel, before a launch

Lesson 11 and notebook 06 run the real kernels this way; tests/test_cpu_runner.py shows what it catches.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

# ---- compiling: cpu_compile.py (the translation unit, the cached g++ call, the symbol table) -------------------------
from .cpu_compile import EXTERN_C_KERNEL, KernelError, compile_library, library_symbols, local_prefix, translation_unit

MODES = ("fibers", "threads")
ORDERS = ("forward", "reverse", "shuffle")  # the order runnable threads resume in after each barrier / collective
DEFAULT_ORDER = "shuffle"
DEFAULT_SHARED_LIMIT = 48 * 1024          # bytes per block, static + dynamic, without opting in (as on every GPU)
MAX_SHARED_OPT_IN = 227 * 1024            # sm_90's largest opt-in shared memory per block
MAX_THREADS_PER_BLOCK = 1024
DEFAULT_STACK = 256 * 1024                # bytes per emulated thread: its registers (locals) live there
_LAUNCH_LOCK = threading.Lock()           # one launch at a time: a library's scheduler and shared memory are global


# ---- the ctypes mirrors of cuda_cpu_scheduler.h / cuda_cpu_launch.h ------------------------------------------------

class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3), ("dynamic_shared", ctypes.c_uint64),
                ("stack_size", ctypes.c_uint64), ("mode", ctypes.c_int32), ("n_poison", ctypes.c_int32),
                ("poison", ctypes.POINTER(ctypes.c_uint64)), ("error", ctypes.c_char_p), ("error_len", ctypes.c_int32),
                ("order", ctypes.c_int32), ("seed", ctypes.c_uint64)]


class _ParamInfo(ctypes.Structure):
    _fields_ = [("is_pointer", ctypes.c_int32), ("is_const", ctypes.c_int32), ("kind", ctypes.c_int32),
                ("size", ctypes.c_int32)]


KIND_NAMES = {0: "struct", 1: "int", 2: "unsigned", 3: "float", 4: "__half", 5: "__nv_bfloat16", 6: "bytes", 7: "bool"}


def _dtype_kind(dtype: np.dtype) -> int:
    if dtype == np.float16:
        return 4
    if dtype.name == "bfloat16":
        return 5
    if dtype == np.bool_:
        return 7
    return {"i": 1, "u": 2, "f": 3}.get(dtype.kind, 0)


def _compatible(param: _ParamInfo, dtype: np.dtype) -> bool:
    """May a value / array of `dtype` be passed for this parameter (or its pointee)?"""
    if param.is_pointer and param.kind == 6:
        return True                                      # void* / char*: any bytes
    kind = _dtype_kind(dtype)
    if param.kind in (4, 5) and dtype == np.uint16:
        return True                                      # raw 16-bit patterns of a half / bfloat16
    if param.kind == 0 and dtype.kind == "V":
        return dtype.itemsize == param.size              # a struct by value: a NumPy structured scalar of its size
    if dtype.itemsize != param.size:
        return False
    return kind == param.kind or {kind, param.kind} == {1, 2}   # int <-> unsigned of one size: same bits


def _describe_param(param: _ParamInfo) -> str:
    base = KIND_NAMES[param.kind] + ("" if param.kind in (4, 5, 6, 7) else f"{8 * param.size}")
    return ("const " if param.is_const else "") + base + ("*" if param.is_pointer else "")


def _check_order(order: str, seed, where: str) -> None:
    if order not in ORDERS:
        raise KernelError(f"{where}: order must be one of {', '.join(ORDERS)}, got {order!r}")
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= seed < 2**64:
        raise KernelError(f"{where}: seed must be an int in [0, 2^64), got {seed!r}")


def _dims(value, what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and d >= 1 for d in dims):
        raise KernelError(f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {value!r}")
    return tuple(int(d) for d in dims) + (1,) * (3 - len(dims))


# ---- the public classes ------------------------------------------------------------------------------------------

class CpuModule:
    """The CPU twin of cupy.RawModule: compile `code` once (cached on disk), hand out kernels by name.

    `order` and `seed`: the resume order of the kernels it hands out (see the module docstring); each kernel copies
    them, so setting `module.order` changes the kernels got afterwards and `kernel.order` changes one kernel."""

    def __init__(self, code: str, *, name_expressions: Sequence[str] = (), options: Sequence[str] = (),
                 mode: str = "fibers", order: str = DEFAULT_ORDER, seed: int = 0, source_name: str = "<kernel>.cu"):
        if mode not in MODES:
            raise KernelError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        _check_order(order, seed, "CpuModule")
        for option in options:
            if not option.startswith(("-D", "-I")):
                raise KernelError(f"option {option!r} is not passed to g++: the CPU runner takes only -D and -I")
        self.code, self.options, self.mode, self.source_name = code, tuple(options), mode, source_name
        self.order, self.seed = order, seed          # each kernel's default resume order (settable per kernel)
        uncommented = re.sub(r"//[^\n]*|/\*.*?\*/", "", code, flags=re.S)   # a kernel in a comment is no kernel
        names = list(dict.fromkeys([*name_expressions, *EXTERN_C_KERNEL.findall(uncommented)]))
        self._build(names)

    def _build(self, names: list[str]) -> None:
        stem = re.sub(r"\W", "_", Path(self.source_name).stem) or "kernel"
        source = translation_unit(self.code, names, self.source_name)
        self.library_path = compile_library(source, self.options, stem)
        lib = ctypes.CDLL(str(self.library_path))
        lib.cudacpu_kernel_address.restype = ctypes.c_void_p
        lib.cudacpu_kernel_address.argtypes = [ctypes.c_int]
        lib.cudacpu_describe.argtypes = [ctypes.c_int, ctypes.POINTER(_ParamInfo), ctypes.c_int]
        lib.cudacpu_launch.argtypes = [ctypes.c_int, ctypes.POINTER(_LaunchConfig), ctypes.POINTER(ctypes.c_void_p)]
        self._lib, self._names = lib, names
        self._functions, statics = library_symbols(self.library_path)
        # Load address: an exported function's address minus its link-time address in the symbol table.
        link_address = next(a for a, syms in self._functions.items() if "cudacpu_launch" in syms)
        self._base = ctypes.cast(lib.cudacpu_launch, ctypes.c_void_p).value - link_address
        self._statics = [(name, self._base + address, size) for name, address, size in statics]

    def get_function(self, name: str) -> CpuKernel:
        """A kernel by its extern "C" name or a name expression ("flash_prefill<float, 64>"), as CuPy's."""
        if name not in self._names:                      # a name not given up front: rebuild with it (cached)
            try:
                self._build([*self._names, name])
            except KernelError as exc:
                if "<cpu_runner launchers>" not in str(exc):
                    raise
                raise KernelError(f"{self.source_name} has no kernel {name!r} (an extern \"C\" __global__ name or "
                                  f"a name expression such as \"kernel<float, 64>\"); {exc}") from None
        return CpuKernel(self, self._names.index(name), name)

    def _static_shared_bytes(self, index: int) -> int:
        """Bytes of static __shared__ arrays declared in kernel `index` itself (found through its symbol)."""
        offset = self._lib.cudacpu_kernel_address(index) - self._base
        prefixes = tuple(local_prefix(symbol) for symbol in self._functions.get(offset, []))
        return sum(size for name, _, size in self._statics if prefixes and name.startswith(prefixes))


class CpuKernel:
    """The CPU twin of cupy.RawKernel: `kernel(grid, block, args, shared_mem=0)` runs the whole grid, in place."""

    def __init__(self, module: CpuModule, index: int, name: str):
        self.module, self.index, self.name = module, index, name
        params = (_ParamInfo * 64)()
        count = module._lib.cudacpu_describe(index, params, 64)
        self.params = list(params[:count])
        self.shared_size_bytes = module._static_shared_bytes(index)       # static, as CuPy's attribute
        self.max_dynamic_shared_size_bytes = DEFAULT_SHARED_LIMIT - self.shared_size_bytes   # settable, as CuPy's
        self.mode = module.mode
        self.order, self.seed = module.order, module.seed
        self.stack_size = DEFAULT_STACK

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        grid3, block3 = _dims(grid, "grid"), _dims(block, "block")
        self._check_launch(grid3, block3, int(shared_mem))
        holders, pointers = self._marshal(tuple(args))
        statics = self.module._statics                   # poison all of them: cheaper than asking which are whose
        poison = (ctypes.c_uint64 * max(1, 2 * len(statics)))(*[v for _, a, n in statics for v in (a, n)])
        error = ctypes.create_string_buffer(1024)
        config = _LaunchConfig((ctypes.c_uint32 * 3)(*grid3), (ctypes.c_uint32 * 3)(*block3), int(shared_mem),
                               self.stack_size, MODES.index(self.mode), len(statics), poison,
                               ctypes.cast(error, ctypes.c_char_p), len(error), ORDERS.index(self.order), self.seed)
        with _LAUNCH_LOCK:
            status = self.module._lib.cudacpu_launch(self.index, ctypes.byref(config), pointers)
        del holders                                      # kept alive until the launch returned
        if status != 0:
            raise KernelError(f"{self.name}: {error.value.decode(errors='replace')}")

    def _check_launch(self, grid3, block3, shared_mem: int) -> None:
        if self.mode not in MODES:
            raise KernelError(f"{self.name}: mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        _check_order(self.order, self.seed, self.name)
        if not 16 * 1024 <= self.stack_size <= 64 * 1024 * 1024:
            raise KernelError(f"{self.name}: stack_size={self.stack_size} bytes; use 16 KiB to 64 MiB")
        threads = block3[0] * block3[1] * block3[2]
        if threads > MAX_THREADS_PER_BLOCK or block3[2] > 64:
            raise KernelError(f"{self.name}: block {block3} has {threads} threads; the limit is "
                              f"{MAX_THREADS_PER_BLOCK} per block (and 64 in z)")
        if grid3[0] >= 2**31 or grid3[1] > 65535 or grid3[2] > 65535:
            raise KernelError(f"{self.name}: grid {grid3} is over CUDA's limits (2^31-1, 65535, 65535)")
        if shared_mem < 0:
            raise KernelError(f"{self.name}: shared_mem={shared_mem} is negative")
        if self.shared_size_bytes > DEFAULT_SHARED_LIMIT:
            raise KernelError(f"{self.name}: {self.shared_size_bytes} bytes of static shared memory; the limit is "
                              f"{DEFAULT_SHARED_LIMIT} (more must be dynamic, extern __shared__, with opt-in)")
        total = self.shared_size_bytes + shared_mem
        limit = max(DEFAULT_SHARED_LIMIT, min(MAX_SHARED_OPT_IN, self.shared_size_bytes
                                              + self.max_dynamic_shared_size_bytes))
        if shared_mem > self.max_dynamic_shared_size_bytes or total > limit:
            raise KernelError(f"{self.name}: {self.shared_size_bytes} bytes of static and {shared_mem} of dynamic "
                              f"shared memory exceed the limit ({self.max_dynamic_shared_size_bytes} dynamic, "
                              f"{limit} in all; set max_dynamic_shared_size_bytes to opt in, up to "
                              f"{MAX_SHARED_OPT_IN})")

    def _marshal(self, args: tuple):
        """Check every argument against the kernel's parameter types; build CUDA's kernelParams array."""
        if len(args) != len(self.params):
            raise KernelError(f"{self.name} takes {len(self.params)} arguments, got {len(args)}")
        holders, pointers = [], (ctypes.c_void_p * max(1, len(args)))()
        for i, (arg, param) in enumerate(zip(args, self.params)):
            where = f"{self.name} argument {i} ({_describe_param(param)})"
            if isinstance(arg, (bool, int, float)) and not isinstance(arg, np.generic):  # np.float64 is a float
                raise KernelError(f"{where} is a Python {type(arg).__name__}: pass a NumPy scalar such as "
                                  f"np.int32({arg!r}) (CuPy would pass a Python int as 64 bits, a float as double)")
            if isinstance(arg, np.ndarray):
                if not param.is_pointer:
                    raise KernelError(f"{where} is a value, got an array")
                if not arg.flags.c_contiguous:
                    raise KernelError(f"{where}: the array is not C-contiguous (strides {arg.strides}); "
                                      "pass np.ascontiguousarray(...)")
                if not _compatible(param, arg.dtype):
                    raise KernelError(f"{where}: got an array of {arg.dtype}")
                if not arg.flags.writeable and not param.is_const:
                    raise KernelError(f"{where}: the array is read-only but the kernel may write through it")
                holder = ctypes.c_void_p(arg.ctypes.data)
            elif isinstance(arg, np.generic) and not isinstance(arg, np.ndarray):
                if param.is_pointer:
                    raise KernelError(f"{where} is a pointer, got a scalar {arg.dtype}")
                if not _compatible(param, arg.dtype):
                    raise KernelError(f"{where}: got a {arg.dtype} scalar")
                holder = ctypes.c_uint64(0)             # 8-byte aligned storage for the value's bytes
                ctypes.memmove(ctypes.addressof(holder), arg.tobytes(), arg.dtype.itemsize)
            else:
                raise KernelError(f"{where}: cannot pass a {type(arg).__name__}; pass NumPy arrays and scalars")
            holders.append(holder)
            pointers[i] = ctypes.addressof(holder)
        return holders, pointers
