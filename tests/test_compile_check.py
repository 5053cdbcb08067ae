"""Every kernel instantiation compiles for sm_90 (Hopper) with CuPy's options and no spills; no GPU needed.
The tensor-core prefill (wmma) is among them: it needs sm_70 or newer, which sm_90 is.

nvcc is the CI path; NVRTC (the library cupy.RawModule compiles with) is checked too wherever libnvrtc is found
(set MINITRANSFORMER_NVRTC to its path to point at one, e.g. from the nvidia-cuda-nvrtc wheel).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from minitransformer.kernels.attention import DECODE_EXPRESSIONS, DECODE_SIMPLE_EXPRESSIONS, PREFILL_EXPRESSIONS
from minitransformer.kernels.compile_check import parse_ptxas, run_compile_check
from minitransformer.kernels.prefill_wmma import WMMA_EXPRESSIONS
from minitransformer.kernels.quant import GEMV_EXPRESSIONS
from minitransformer.kernels.toolchain import find_compiler

ALL_KERNELS = sorted(PREFILL_EXPRESSIONS + WMMA_EXPRESSIONS + DECODE_EXPRESSIONS + DECODE_SIMPLE_EXPRESSIONS
                     + GEMV_EXPRESSIONS)   # both decode files hold the merge kernel: it is listed twice


def _check(compiler: str) -> None:
    reports, errors = run_compile_check("sm_90", compiler)
    assert errors == []
    assert sorted(r.name for r in reports) == ALL_KERNELS
    for r in reports:
        assert 0 < r.registers <= 255 and not r.spills
        assert r.static_smem + r.dynamic_smem <= 48 * 1024


@pytest.mark.skipif(find_compiler("nvcc") is None, reason="nvcc not found (PATH, $CUDA_PATH, $CUDA_HOME, "
                    "/usr/local/cuda)")
def test_every_kernel_compiles_for_sm90_with_nvcc():
    _check("nvcc")


@pytest.mark.skipif(find_compiler("nvrtc") is None, reason="libnvrtc not found ($MINITRANSFORMER_NVRTC, the CUDA "
                    "toolkit's lib64, NVIDIA's pip wheels)")
def test_every_kernel_compiles_for_sm90_with_nvrtc_as_cupy_does():
    _check("nvrtc")


@pytest.mark.skipif(find_compiler("auto") is None, reason="neither nvcc nor libnvrtc is installed")
def test_command_line_prints_the_table_and_exits_zero():
    proc = subprocess.run([sys.executable, "-m", "minitransformer.kernels.compile_check"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "flash_prefill<__half, 128>" in proc.stdout and "paged_decode_merge<float, 64>" in proc.stdout
    assert "flash_prefill_wmma<128>" in proc.stdout                   # tensor cores: sm_70+, here sm_90
    assert f"{len(ALL_KERNELS)} kernels compiled, 0 problem(s)" in proc.stdout


def test_ptxas_log_parsing_sees_spills():
    """The check can fail: a log with spills is parsed as spills (ptxas's wording in CUDA 12 and 13)."""
    log = """ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_90'
ptxas info    : Function properties for _Z3fooPf
ptxas         .     64 bytes stack frame, 12 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 1024 bytes smem, 400 bytes cmem[0]
"""
    stats = parse_ptxas(log)["_Z3fooPf"]
    assert stats == {"registers": 255, "spill_stores": 12, "spill_loads": 8, "stack_frame": 64, "static_smem": 1024}
