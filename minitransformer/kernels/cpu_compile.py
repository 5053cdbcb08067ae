"""Compile a kernel source for the CPU runner: the translation unit g++ sees, the cached g++ call, the symbol table.

Why a file of its own: this is the part of the emulator that turns `.cu` text into a shared library (rewriting
`extern __shared__`, wrapping the source with cuda_cpu/*.h under `#line`, caching the .so by a hash of everything
that affects it) and then reads back what the launch needs from the library's symbols (function addresses, the
function-local statics that are our __shared__ arrays). cpu_runner.py loads the library and launches from it.
KernelError lives here because compiling is where it is first raised; cpu_runner imports it for its launch checks.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
import threading
from collections.abc import Sequence
from pathlib import Path

from ..core.errors import MiniTransformerError
from ..models import cache_dir

HEADER_DIR = Path(__file__).parent / "cuda_cpu"
CXX = os.environ.get("CXX", "g++")
# -fvisibility=hidden and -fno-gnu-unique: each library keeps its own runtime globals and template statics, even
# when two libraries instantiate the same kernel. -U_FORTIFY_SOURCE: fortified longjmp refuses to switch stacks.
# -fstack-clash-protection: a big local array touches the guard page below a fiber's stack instead of jumping it.
CXX_FLAGS = ["-O2", "-std=c++17", "-fPIC", "-shared", "-fvisibility=hidden", "-fno-gnu-unique", "-pthread",
             "-U_FORTIFY_SOURCE", "-fstack-clash-protection", "-w"]


class KernelError(MiniTransformerError):
    """A kernel failed to compile, was launched wrongly, or broke CUDA's rules while running (names file:line)."""


# ---- compiling -----------------------------------------------------------------------------------------------------

_ALIGN = r"(?:__align__|alignas)\s*\(\s*\d+\s*\)"
_EXTERN_SHARED = re.compile(rf"extern\s+__shared__\s+((?:{_ALIGN}\s*|[\w:<>]+\s+)*?[\w:<>]+)\s+(\w+)\s*\[\s*\]\s*;")
EXTERN_C_KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s+)?(\w+)\s*\(')


def _rewrite_extern_shared(code: str, source_name: str) -> str:
    """`extern __shared__ float smem[];` -> a pointer to the dynamic shared buffer, on the same line (so `#line`
    numbers still match). Every such array starts at the same address, as in CUDA."""
    def pointer(m: re.Match) -> str:
        ctype = re.sub(_ALIGN, "", m.group(1)).strip()     # the buffer is 128-byte aligned already
        return f"{ctype}* const {m.group(2)} = reinterpret_cast<{ctype}*>(::cudacpu::dynamic_shared_base());"
    code = _EXTERN_SHARED.sub(pointer, code)
    for number, line in enumerate(code.splitlines(), 1):
        if re.search(r"extern\s+__shared__", line.split("//")[0]):
            raise KernelError(f"{source_name}:{number}: write dynamic shared memory as `extern __shared__ T name[];` "
                              "on one line (the form the CPU runner rewrites)")
    return code


def translation_unit(code: str, names: Sequence[str], source_name: str) -> str:
    """The file g++ compiles: header, kernel source under #line, then the launcher table and the C entry points."""
    entries = "".join(f"    ::cudacpu::entry(&{name}),\n" for name in names) or "    {},\n"   # no empty arrays
    quoted = source_name.replace("\\", "/").replace('"', "'")
    return (f'#include "cuda_cpu.h"\n#line 1 "{quoted}"\n{_rewrite_extern_shared(code, source_name)}\n'
            f'#include "cuda_cpu_launch.h"\n#line 1 "<cpu_runner launchers>"\n'
            f"static const ::cudacpu::Entry cudacpu_entries[] = {{\n{entries}}};\n"
            '#define EXPORT extern "C" __attribute__((visibility("default")))\n'
            f"EXPORT int cudacpu_count() {{ return {len(names)}; }}\n"
            "EXPORT void* cudacpu_kernel_address(int i) { return cudacpu_entries[i].kernel; }\n"
            "EXPORT int cudacpu_describe(int i, ::cudacpu::ParamInfo* out, int max) {\n"
            "    return cudacpu_entries[i].describe(out, max); }\n"
            "EXPORT int cudacpu_launch(int i, const ::cudacpu::LaunchConfig* c, void** args) {\n"
            "    return ::cudacpu::launch(*c, cudacpu_entries[i].thunk, cudacpu_entries[i].kernel, args); }\n")


@functools.cache
def _compiler_id() -> str:
    try:
        return subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout.split("\n")[0]
    except (OSError, subprocess.CalledProcessError) as exc:
        raise KernelError(f"the CPU runner needs a C++17 compiler ({CXX}) and could not run it: {exc}") from None


def compile_library(source: str, options: Sequence[str], stem: str) -> Path:
    """Compile to a cached shared library keyed by everything that affects the result; return its path."""
    headers = "".join(p.read_text() for p in sorted(HEADER_DIR.glob("*.h")))
    key = hashlib.sha256("\0".join([source, headers, " ".join(options), " ".join(CXX_FLAGS), _compiler_id()])
                         .encode()).hexdigest()[:20]
    directory = cache_dir() / "kernels"
    library = directory / f"{stem}-{key}.so"
    if library.is_file():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    cpp = directory / f"{stem}-{key}.cpp"               # kept next to the library: a reader can open what ran
    cpp.write_text(source)
    partial = directory / f"{stem}-{key}.{os.getpid()}.{threading.get_ident()}.tmp"
    result = subprocess.run([CXX, *CXX_FLAGS, f"-I{HEADER_DIR}", *options, str(cpp), "-o", str(partial)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        errors = [line for line in result.stderr.splitlines() if "error" in line] or result.stderr.splitlines()
        raise KernelError(f"g++ could not compile the kernel: {' | '.join(errors[:5])}")
    os.replace(partial, library)                        # atomic: a concurrent test run sees all or nothing
    return library


def library_symbols(library: Path) -> tuple[dict[int, list[str]], list[tuple[str, int, int]]]:
    """From the library's symbol table: {address: function names}, and the function-local statics in .bss as
    (name, address, bytes) -- our __shared__ arrays, since CUDA never initialises those (addresses are link-time)."""
    out = subprocess.run(["nm", "-f", "sysv", "-S", "--defined-only", str(library)], capture_output=True, text=True)
    functions: dict[int, list[str]] = {}
    statics: list[tuple[str, int, int]] = []
    for line in out.stdout.splitlines():
        cols = [c.strip() for c in line.split("|")]     # name | value | class | type | size | line | section
        if len(cols) < 7:
            continue
        if cols[3] == "FUNC":
            functions.setdefault(int(cols[1], 16), []).append(cols[0])
        elif cols[0].startswith("_ZZ") and cols[6] == ".bss" and cols[4] and not cols[0].startswith(_NOT_SHARED):
            statics.append((cols[0], int(cols[1], 16), int(cols[4], 16)))
    return functions, statics


_NOT_SHARED = ("_ZZN7cudacpu", "_ZZNSt", "_ZZNKSt", "_ZZN9__gnu_cxx")   # the runtime's and the C++ library's statics


def local_prefix(symbol: str) -> str:
    """The prefix of the mangled names of `symbol`'s local statics: `_Z3fooPf` -> `_ZZ3fooPfE` (then `4tile`), and
    for an extern "C" `foo`, `_ZZ3fooE`."""
    return "_ZZ" + symbol[2:] + "E" if symbol.startswith("_Z") else f"_ZZ{len(symbol)}{symbol}E"
