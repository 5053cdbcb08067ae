"""Compile every kernel instantiation for a real GPU target and report what the hardware would have to give it.

    python -m minitransformer.kernels.compile_check [--arch sm_90] [--compiler auto|nvcc|nvrtc]

Runs in CI, where there is no GPU. Each .cu file, with its includes inlined by the loader exactly as CuPy receives
it, is compiled to a cubin for sm_90 (Hopper: H100 / H200) with the options CuPy uses, and ptxas's verbose report
gives, per kernel, its registers per thread, spills to local memory, stack frame and static shared memory. The table
adds the dynamic shared memory our launches ask for. Exit code 1 on any compile error or any spill (a spill means
the kernel ran out of registers and keeps values in slow local memory), 2 when no compiler is found.

Two compilers, one source:
- nvcc (`-arch=sm_90 -cubin -Xptxas -v`): nvcc has no name expressions, so the check appends a line taking the
  address of each template instantiation, which makes nvcc emit the same kernels;
- NVRTC, the library CuPy's RawModule itself compiles with (loaded through ctypes; no GPU needed): the very same
  name expressions, `-Xptxas=-v`, and the include directory CuPy adds for <cuda_fp16.h>.
`--compiler auto` (the default) uses nvcc when it is installed, else NVRTC.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .attention import (
    DECODE_EXPRESSIONS,
    DECODE_FILE,
    DECODE_SIMPLE_EXPRESSIONS,
    DECODE_SIMPLE_FILE,
    HEAD_DIMS,
    PREFILL_EXPRESSIONS,
    PREFILL_FILE,
    decode_shared_bytes,
    prefill_shared_bytes,
)
from .loader import COMPILE_OPTIONS, CUPY_ADDED_OPTIONS, read_source, source_constant
from .prefill_wmma import WMMA_EXPRESSIONS, WMMA_FILE, wmma_shared_bytes
from .quant import GEMV_EXPRESSIONS, GEMV_FILE
from .toolchain import find_compiler, find_cuda_include

# The wmma kernel needs sm_70+ (tensor cores); DEFAULT_ARCH has them.
KERNEL_FILES = {PREFILL_FILE: PREFILL_EXPRESSIONS, WMMA_FILE: WMMA_EXPRESSIONS, DECODE_FILE: DECODE_EXPRESSIONS,
                DECODE_SIMPLE_FILE: DECODE_SIMPLE_EXPRESSIONS, GEMV_FILE: GEMV_EXPRESSIONS}
DEFAULT_ARCH = "sm_90"
COMPILERS = ("auto", "nvcc", "nvrtc")


@dataclass
class KernelReport:
    """What ptxas reported for one kernel instantiation."""
    file: str
    name: str                  # the name expression, e.g. "flash_prefill<float, 64>"
    registers: int
    spill_stores: int          # bytes
    spill_loads: int           # bytes
    stack_frame: int           # bytes
    static_smem: int           # bytes of __shared__ arrays declared in the source
    dynamic_smem: int          # bytes our launch asks for (worst case of the supported shapes)

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


# --------------------------------------------------------------------------------------- ptxas's report ---

_ENTRY = re.compile(r"Compiling entry function '(\S+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    """Mangled kernel name -> {registers, spill_stores, spill_loads, stack_frame, static_smem} from a -Xptxas -v log."""
    kernels: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        if match := _ENTRY.search(line):
            current = kernels.setdefault(match.group(1), {"registers": 0, "spill_stores": 0, "spill_loads": 0,
                                                          "stack_frame": 0, "static_smem": 0})
        elif current is not None and (match := _FRAME.search(line)):
            current["stack_frame"], current["spill_stores"], current["spill_loads"] = map(int, match.groups())
        elif current is not None and (match := _USED.search(line)):
            current["registers"] = int(match.group(1))
            if smem := _SMEM.search(line):
                current["static_smem"] = int(smem.group(1))
    return kernels


def launch_smem(name: str) -> int:
    """The most dynamic shared memory attention.py asks for this kernel (decode: G = max group, partition 512)."""
    head_dim = re.search(r"(\d+)>$", name)
    if head_dim is None:
        raise ValueError(f"{name}: the kernel's name does not end in its head size (<..., D>)")
    d = int(head_dim.group(1))
    if name.startswith("flash_prefill_wmma"):
        return wmma_shared_bytes(d)
    if name.startswith("flash_prefill"):
        return prefill_shared_bytes(d)
    if name.startswith("paged_decode_partition"):
        return decode_shared_bytes(source_constant(DECODE_FILE, "DECODE_MAX_GROUP"), d, 512, 16)
    if name.startswith("paged_decode_simple_partition"):
        return decode_shared_bytes(source_constant(DECODE_SIMPLE_FILE, "DECODE_MAX_GROUP"), d, 512, 16, "simple")
    return 0


# ------------------------------------------------------------------------------------------------- nvcc ---

def instantiation_source(filename: str, expressions: tuple[str, ...]) -> str:
    """The source as the loader builds it, plus one address-of line per template instantiation (for nvcc)."""
    lines = [read_source(filename), "// ---- compile_check: instantiate what RawModule's name_expressions would ----"]
    lines += [f"[[maybe_unused]] static void* const compile_check_{i} = (void*)&{expr};"
              for i, expr in enumerate(expressions)]
    return "\n".join(lines) + "\n"


def nvcc_command(nvcc: str, source: Path, arch: str) -> list[str]:
    """nvcc for one cubin, with the options CuPy passes (ours plus the -ftz=true CuPy appends) and ptxas verbose."""
    return [nvcc, f"-arch={arch}", "-cubin", "-Xptxas", "-v", *COMPILE_OPTIONS, *CUPY_ADDED_OPTIONS,
            "-o", str(source.with_suffix(".cubin")), str(source)]


def demangle(names: list[str]) -> dict[str, str]:
    """Mangled -> "kernel<args>" through cu++filt or c++filt (names stay mangled when neither is installed)."""
    tool = shutil.which("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return {m: re.sub(r"\s+", " ", r.removeprefix("void ").split("(")[0]) for m, r in zip(names, out)}


def compile_with_nvcc(nvcc: str, filename: str, expressions: tuple[str, ...], arch: str
                      ) -> tuple[dict[str, dict[str, int]], str, bool]:
    """(expression -> ptxas stats, log, success) for one file."""
    with tempfile.TemporaryDirectory(prefix="mt_compile_check_") as tmp:
        source = Path(tmp) / filename
        source.write_text(instantiation_source(filename, expressions))
        proc = subprocess.run(nvcc_command(nvcc, source, arch), capture_output=True, text=True, cwd=tmp)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        return {}, log, False
    parsed = parse_ptxas(log)
    readable = {re.sub(r"\s+", "", name): stats for name, stats in
                zip(demangle(list(parsed)).values(), parsed.values())}
    return {e: readable[re.sub(r"\s+", "", e)] for e in expressions if re.sub(r"\s+", "", e) in readable}, log, True


# ------------------------------------------------------------------------------------------------ NVRTC ---

def _load_nvrtc(path: str):
    """libnvrtc through ctypes. Its builtins library sits beside it and is opened by name, so load that first."""
    for builtins in sorted(Path(path).parent.glob("libnvrtc-builtins.so*")):
        if ".alt." not in builtins.name:
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def compile_with_nvrtc(nvrtc: str, filename: str, expressions: tuple[str, ...], arch: str
                       ) -> tuple[dict[str, dict[str, int]], str, bool]:
    """(expression -> ptxas stats, log, success) for one file, compiled as cupy.RawModule would compile it."""
    lib = _load_nvrtc(nvrtc)
    include = find_cuda_include()
    options = [f"-arch={arch}", *COMPILE_OPTIONS, *CUPY_ADDED_OPTIONS, "-Xptxas=-v"]
    options += [f"-I{include}"] if include else []
    program = ctypes.c_void_p()
    source = read_source(filename).encode()
    if lib.nvrtcCreateProgram(ctypes.byref(program), source, filename.encode(), 0, None, None) != 0:
        return {}, "nvrtcCreateProgram failed", False
    try:
        for expr in expressions:
            lib.nvrtcAddNameExpression(program, expr.encode())
        encoded = [o.encode() for o in options]
        status = lib.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        buffer = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, buffer)
        log = f"nvrtc {' '.join(options)}\n" + buffer.value.decode(errors="replace")
        if status != 0:
            return {}, log + "\n" + lib.nvrtcGetErrorString(status).decode(), False
        parsed = parse_ptxas(log)
        stats = {}
        for expr in expressions:
            lowered = ctypes.c_char_p()
            if lib.nvrtcGetLoweredName(program, expr.encode(), ctypes.byref(lowered)) == 0 and \
                    lowered.value is not None and lowered.value.decode() in parsed:
                stats[expr] = parsed[lowered.value.decode()]
        return stats, log, True
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


# ------------------------------------------------------------------------------------------------ driver ---

def run_compile_check(arch: str = DEFAULT_ARCH, compiler: str = "auto") -> tuple[list[KernelReport], list[str]]:
    """Compile every kernel file; returns the per-kernel reports and a list of problems (empty when clean)."""
    found = find_compiler(compiler)
    if found is None:
        return [], [f"no compiler for --compiler {compiler}: nvcc (PATH, $CUDA_PATH, $CUDA_HOME, /usr/local/cuda) "
                    "or libnvrtc ($MINITRANSFORMER_NVRTC, the CUDA toolkit, NVIDIA's pip wheels)"]
    kind, path = found
    compile_one = compile_with_nvcc if kind == "nvcc" else compile_with_nvrtc
    # nvcc runs as a process per file, so the files compile side by side, one per core (results in file order);
    # NVRTC runs inside this process through ctypes, one file at a time
    workers = (os.cpu_count() or 1) if kind == "nvcc" else 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        compiled = list(pool.map(lambda item: compile_one(path, item[0], item[1], arch), KERNEL_FILES.items()))
    reports, errors = [], []
    for (filename, expressions), (stats, log, ok) in zip(KERNEL_FILES.items(), compiled):
        if not ok:
            errors.append(f"{filename}: {kind} failed:\n{log.strip()}")
            continue
        missing = [e for e in expressions if e not in stats]
        if missing:
            errors.append(f"{filename}: ptxas reported nothing for {missing}")
        reports += [KernelReport(filename, e, dynamic_smem=launch_smem(e), **stats[e]) for e in expressions
                    if e in stats]
    errors += [f"{r.name}: spills {r.spill_stores} bytes stored / {r.spill_loads} loaded to local memory"
               for r in reports if r.spills]
    return reports, errors


def format_table(reports: list[KernelReport], arch: str, compiler: str) -> str:
    header = ("kernel", "regs", "spill st/ld B", "stack B", "static smem B", "dynamic smem B")
    rows = [(r.name, str(r.registers), f"{r.spill_stores}/{r.spill_loads}", str(r.stack_frame),
             str(r.static_smem), str(r.dynamic_smem)) for r in reports]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [f"compile check for {arch} with {compiler} ({' '.join(COMPILE_OPTIONS + CUPY_ADDED_OPTIONS)}); "
             f"head dims {HEAD_DIMS}; dynamic smem = the most our launches ask for"]
    for i, row in enumerate([header, *rows]):
        lines.append("  ".join(cell.ljust(w) if j == 0 else cell.rjust(w)
                               for j, (cell, w) in enumerate(zip(row, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minitransformer.kernels.compile_check",
                                     description="Compile every CUDA kernel for a GPU target; fail on errors or "
                                                 "spills.")
    parser.add_argument("--arch", default=DEFAULT_ARCH, help="GPU target (default sm_90: H100 / H200)")
    parser.add_argument("--compiler", choices=COMPILERS, default="auto",
                        help="nvcc, NVRTC (what CuPy uses), or auto: nvcc if installed, else NVRTC")
    args = parser.parse_args(argv)
    found = find_compiler(args.compiler)
    if found is None:
        print(f"compile check: no compiler for --compiler {args.compiler} (nvcc or libnvrtc)", file=sys.stderr)
        return 2
    reports, errors = run_compile_check(args.arch, args.compiler)
    if reports:
        print(format_table(reports, args.arch, found[0]))
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    print(f"{len(reports)} kernels compiled, {len(errors)} problem(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
