"""Build the .cu kernels once and launch them with checked arguments, on a GPU (CuPy) or on the CPU (the runner).

One launch path serves both devices: `get_module(filename, backend)` returns a `cupy.RawModule` for CuPy arrays or a
`cpu_runner.CpuModule` for NumPy arrays (the runner compiles the same source with g++ and mirrors RawModule's API),
and `Kernel.__call__` checks the arguments before handing them to either. The checks exist because a raw launch
trusts its arguments completely: a strided view, a float64 array or a Python int (passed as 64 bits where the
kernel reads an `int`) does not fail, it silently computes garbage or reads out of bounds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..core.errors import InputError

KERNEL_DIR = Path(__file__).resolve().parent

# The compile options, shared with compile_check.py so CI checks what runs. CuPy's compile path
# (cupy._core.core.compile_with_cache -> assemble_cupy_compiler_options, then
# cupy.cuda.compiler._compile_with_cache_cuda) adds a default C++ standard only when the options name none, appends
# -ftz=true, its include directories and the current device's -arch. We name the standard ourselves so the GPU,
# the compile check and the CPU runner all read the source as the same C++ dialect.
COMPILE_OPTIONS = ("-std=c++17",)
CUPY_ADDED_OPTIONS = ("-ftz=true",)        # what CuPy appends; compile_check.py passes it to nvcc explicitly

# CUDA spelling of the storage types the kernels are instantiated for.
CUDA_TYPE_NAMES = {np.dtype(np.float32): "float", np.dtype(np.float16): "__half"}

MAX_SHARED_BYTES = 48 * 1024              # dynamic shared memory a launch gets without cudaFuncSetAttribute

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')


def read_source(filename: str) -> str:
    """The source text of a kernel file with every local `#include "x.cuh"` pasted in (once each, like #pragma once).

    CuPy's kernel cache keys on the source text alone: an included header it never reads would let an edited
    header reuse a stale binary. System headers (`#include <cuda_fp16.h>`) are left for the compiler.
    """
    seen: set[str] = set()

    def expand(name: str) -> list[str]:
        path = KERNEL_DIR / name
        if not path.is_file():
            raise FileNotFoundError(f"kernel source {path} not found")
        if name in seen:
            return []
        seen.add(name)
        lines = [f"// ---- begin {name} ----"]
        for line in path.read_text().splitlines():
            match = _INCLUDE.match(line)
            if match:
                lines += expand(match.group(1))
            elif line.strip() != "#pragma once":
                lines.append(line)
        return lines + [f"// ---- end {name} ----"]

    return "\n".join(expand(filename)) + "\n"


@cache
def source_constant(filename: str, name: str) -> int:
    """`constexpr int NAME = value;` of a kernel file: the Python side reads its launch sizes from the source."""
    match = re.search(rf"constexpr\s+int\s+{name}\s*=\s*(\d+)\s*;", read_source(filename))
    if match is None:
        raise KeyError(f"{filename} defines no constexpr int {name}")
    return int(match.group(1))


def backend_of(array) -> str:
    """"cpu" for a NumPy array (the CPU runner), "cupy" for a CuPy array."""
    if isinstance(array, np.ndarray):
        return "cpu"
    if type(array).__module__.startswith("cupy"):
        return "cupy"
    raise InputError(f"kernel inputs must be NumPy or CuPy arrays, got {type(array).__name__}")


def build_module(source: str, name_expressions: tuple[str, ...], backend: str, source_name: str = "kernel.cu"):
    """Compile `source` into a module exposing `get_function(name_expression)`; not cached (see get_module)."""
    if backend == "cupy":
        import cupy
        return cupy.RawModule(code=source, options=COMPILE_OPTIONS, name_expressions=name_expressions)
    if backend == "cpu":
        from .cpu_runner import CpuModule
        # The runner compiles as C++17 already and takes only -D / -I options (defines and include paths).
        options = tuple(o for o in COMPILE_OPTIONS if o.startswith(("-D", "-I")))
        return CpuModule(source, name_expressions=name_expressions, options=options, source_name=source_name)
    raise InputError(f"unknown kernel backend {backend!r}; choose 'cupy' or 'cpu'")


@cache
def get_module(filename: str, name_expressions: tuple[str, ...], backend: str):
    """The module of a kernel file with all the listed template instantiations, built once per process."""
    return build_module(read_source(filename), name_expressions, backend, filename)


@dataclass(frozen=True)
class Param:
    """One kernel parameter: a pointer to a C-contiguous array of `dtype`, or a scalar of `dtype` (int32/float32)."""
    name: str
    dtype: np.dtype
    pointer: bool = True


def array_param(name: str, dtype) -> Param:
    return Param(name, np.dtype(dtype), True)


def scalar_param(name: str, dtype) -> Param:
    return Param(name, np.dtype(dtype), False)


def check_args(kernel_name: str, params: tuple[Param, ...], args: tuple, backend: str) -> None:
    """Raise InputError unless every argument matches its declared parameter (kind, dtype, contiguity, device)."""
    if len(args) != len(params):
        raise InputError(f"{kernel_name}: expected {len(params)} arguments "
                         f"({', '.join(p.name for p in params)}), got {len(args)}")
    for param, arg in zip(params, args):
        where = f"{kernel_name} argument {param.name!r}"
        if param.pointer:
            if isinstance(arg, np.generic) or not hasattr(arg, "flags"):
                raise InputError(f"{where} must be an array of {param.dtype}, got {type(arg).__name__}")
            if backend_of(arg) != backend:
                raise InputError(f"{where} is a {type(arg).__module__.split('.')[0]} array but the kernel runs on "
                                 f"the {backend} backend: keep all arrays on one device")
            if arg.dtype != param.dtype:
                raise InputError(f"{where} has dtype {arg.dtype}; the kernel reads {param.dtype}")
            if not arg.flags.c_contiguous:
                raise InputError(f"{where} is not C-contiguous (strides {arg.strides}); "
                                 "pass a contiguous copy (xp.ascontiguousarray)")
        else:
            if not isinstance(arg, np.generic):
                raise InputError(f"{where} must be a NumPy scalar np.{param.dtype} (a Python "
                                 f"{type(arg).__name__} has no fixed width), got {arg!r}")
            if arg.dtype != param.dtype:
                raise InputError(f"{where} must be np.{param.dtype}, got np.{arg.dtype}")


def _dims(value, what: str, kernel_name: str) -> tuple[int, int, int]:
    dims = tuple(value) if isinstance(value, tuple) else (value,)
    if not 1 <= len(dims) <= 3 or any(int(d) < 1 for d in dims):
        raise InputError(f"{kernel_name}: {what} must be 1 to 3 positive sizes, got {value!r}")
    x, y, z = [int(d) for d in dims] + [1] * (3 - len(dims))
    return x, y, z


@dataclass
class Kernel:
    """A compiled kernel plus its declared parameters: calling it checks, then launches like cupy.RawKernel."""
    function: Callable[..., Any]      # the backend's launchable kernel (CuPy RawKernel or the CPU runner's)
    name: str
    params: tuple[Param, ...]
    backend: str

    def check(self, grid, block, args: tuple, shared_mem: int = 0) -> tuple[tuple, tuple]:
        """Raise InputError for a bad launch; return grid and block as 3-tuples."""
        check_args(self.name, self.params, args, self.backend)
        grid, block = _dims(grid, "grid", self.name), _dims(block, "block", self.name)
        if block[0] * block[1] * block[2] > 1024:
            raise InputError(f"{self.name}: block {block} has more than 1024 threads")
        if not 0 <= shared_mem <= MAX_SHARED_BYTES:
            raise InputError(f"{self.name}: {shared_mem} bytes of dynamic shared memory; the limit is "
                             f"{MAX_SHARED_BYTES} without an opt-in")
        return grid, block

    def __call__(self, grid, block, args: tuple, shared_mem: int = 0) -> None:
        grid, block = self.check(grid, block, args, shared_mem)
        self.function(grid, block, args, shared_mem=int(shared_mem))

    def prepare(self, grid, block, args: tuple, shared_mem: int = 0) -> Launch:
        """Check once now; the returned Launch replays the raw launch with no checks (for timing loops)."""
        grid, block = self.check(grid, block, args, shared_mem)
        return Launch(self.function, grid, block, args, int(shared_mem))


@dataclass
class Launch:
    """One checked kernel launch, ready to be replayed: what a CUDA graph would capture."""
    function: Callable[..., Any]      # the backend's launchable kernel (CuPy RawKernel or the CPU runner's)
    grid: tuple
    block: tuple
    args: tuple
    shared_mem: int

    def __call__(self) -> None:
        self.function(self.grid, self.block, self.args, shared_mem=self.shared_mem)


def get_kernel(filename: str, name_expression: str, params: tuple[Param, ...], backend: str,
               all_expressions: tuple[str, ...] | None = None, module=None) -> Kernel:
    """The kernel `name_expression` (e.g. "flash_prefill<float, 64>") of a kernel file, ready to launch.

    `all_expressions` are the instantiations compiled together into the file's one module (default: just this one);
    `module` replaces the cached module, e.g. one built from an edited source in a lesson or a test.
    """
    if module is None:
        module = get_module(filename, tuple(all_expressions or (name_expression,)), backend)
    return Kernel(module.get_function(name_expression), name_expression, params, backend)
