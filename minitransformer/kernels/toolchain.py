"""Where the CUDA compilers are on this machine: nvcc, NVRTC (the library CuPy compiles with) and the CUDA headers,
from the environment, the toolkit's usual folders or NVIDIA's pip wheels. compile_check.py and sass_report.py use
them; nothing here needs a GPU.
"""

from __future__ import annotations

import ctypes.util
import os
import shutil
from pathlib import Path


def cuda_roots() -> list[Path]:
    roots = [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    return [Path(r) for r in roots if r and Path(r).is_dir()]


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_PATH / $CUDA_HOME / /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in cuda_roots():
        if (root / "bin" / "nvcc").is_file():
            return str(root / "bin" / "nvcc")
    return None


def nvidia_wheel_dirs() -> list[Path]:
    """The folders of NVIDIA's pip wheels (nvidia/cu13/lib, nvidia/cuda_nvrtc/lib, ...), where CuPy finds NVRTC."""
    try:
        import nvidia
    except ImportError:
        return []
    return [Path(p) for p in getattr(nvidia, "__path__", [])]


def find_nvrtc() -> Path | None:
    """libnvrtc: $MINITRANSFORMER_NVRTC, the CUDA toolkit, NVIDIA's pip wheels, or the system's library path."""
    if os.environ.get("MINITRANSFORMER_NVRTC"):
        return Path(os.environ["MINITRANSFORMER_NVRTC"])
    candidates = [p for root in cuda_roots() for sub in ("lib64", "lib") for p in (root / sub).glob("libnvrtc.so*")]
    candidates += [p for base in nvidia_wheel_dirs() for p in base.glob("*/lib/libnvrtc.so*")]
    candidates = [p for p in candidates if "builtins" not in p.name and ".alt." not in p.name]
    if candidates:
        return sorted(candidates)[-1]
    found = ctypes.util.find_library("nvrtc")
    return Path(found) if found else None


def find_cuda_include() -> Path | None:
    """The folder holding cuda_fp16.h, which CuPy passes to NVRTC as -I (the toolkit's or a wheel's include/)."""
    folders = [root / "include" for root in cuda_roots()]
    folders += [p.parent for base in nvidia_wheel_dirs() for p in base.glob("*/include/cuda_fp16.h")]
    return next((f for f in folders if (f / "cuda_fp16.h").is_file()), None)


def find_compiler(choice: str = "auto") -> tuple[str, str] | None:
    """("nvcc", path) or ("nvrtc", path) for `choice`, or None when it is not installed."""
    if choice in ("auto", "nvcc") and (nvcc := find_nvcc()):
        return "nvcc", nvcc
    if choice in ("auto", "nvrtc") and (nvrtc := find_nvrtc()):
        return "nvrtc", str(nvrtc)
    return None
