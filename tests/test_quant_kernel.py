"""The dequantize-GEMV CUDA kernel (kernels/dequant_gemv.cu) against the NumPy path, on the CPU runner and, when there
is one, on a GPU; and the tokens of a quantized model through both paths.

Reference: x @ W computed in float64 from the dequantized matrix; the kernel sums in float32 in another order, so
the tolerance is float32's (1e-5 relative to the output's scale), as for the attention kernels.
"""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer.core.decode import decode_step
from minitransformer.core.errors import InputError
from minitransformer.core.kv_cache import KVCache
from minitransformer.core.prefill import prefill
from minitransformer.kernels.compile_check import compile_with_nvcc
from minitransformer.kernels.quant import GEMV_EXPRESSIONS, GEMV_FILE, dequant_gemv
from minitransformer.kernels.toolchain import find_compiler
from minitransformer.quantize import QuantizedLinear, quantize_model, set_use_kernel


def _cupy():
    try:
        import cupy
        return cupy if cupy.cuda.runtime.getDeviceCount() > 0 else None
    except Exception:  # ImportError or no CUDA driver
        return None


CUPY = _cupy()


def case(scheme: str, rows: int, cols: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.1, (rows, cols)).astype(np.float32)
    w[rng.integers(0, rows, 3), rng.integers(0, cols, 3)] = 2.0                  # outliers: uneven scales
    lin = QuantizedLinear.from_float(w, scheme)
    x = rng.normal(size=(batch, cols)).astype(np.float32)
    reference = x.astype(np.float64) @ lin.dequantize().T.astype(np.float64)    # (batch, rows)
    return x, lin, reference


@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("rows,cols,batch", [(37, 96, 1), (8, 64, 3), (13, 160, 8), (6, 32, 11), (20, 2112, 2)])
def test_kernel_equals_numpy_on_the_cpu_runner(scheme, rows, cols, batch):
    """Rows not a multiple of the 16 rows per block (a warp with no row at all), batches of 1, below, at and above
    MAX_BATCH (8), and 2112 columns: x staged in three chunks of at most 1024, the last a partial one."""
    x, lin, reference = case(scheme, rows, cols, batch)
    y = dequant_gemv(x, lin)
    assert y.dtype == np.float32 and y.shape == (batch, rows)
    scale = np.abs(reference).max()
    np.testing.assert_allclose(y, reference, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(x @ lin, reference, rtol=0, atol=1e-5 * scale)   # the NumPy path, same reference


@pytest.mark.skipif(CUPY is None, reason="no GPU through CuPy")
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_kernel_equals_numpy_on_the_gpu(scheme):
    x, lin, reference = case(scheme, 960, 576, 3)
    gpu = QuantizedLinear(lin.scheme, tuple(CUPY.asarray(a) for a in lin.data), (960, 576))
    y = dequant_gemv(CUPY.asarray(x), gpu).get()
    np.testing.assert_allclose(y, reference, rtol=0, atol=1e-5 * np.abs(reference).max())


def test_kernel_checks_its_inputs():
    x, lin, _ = case("int8", 8, 64, 1)
    with pytest.raises(InputError, match="float32"):
        dequant_gemv(x.astype(np.float64), lin)
    with pytest.raises(InputError, match=r"\(N, 64\)"):
        dequant_gemv(x[:, :32], lin)
    odd = QuantizedLinear.from_float(np.ones((4, 72), np.float32), "int8")
    with pytest.raises(InputError, match="divisible by 16"):
        dequant_gemv(np.ones((1, 72), np.float32), odd)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_tokens_through_numpy_and_the_emulated_kernel_are_the_same(tiny_model, scheme):
    """Prefill (a 5-row matmul) and 4 greedy decode steps of the tiny model, every matmul through the kernel."""
    model = quantize_model(tiny_model, scheme)
    prompt = [5, 70, 3, 9, 120]

    def run(use_kernel: bool):
        set_use_kernel(model, use_kernel)
        cache = KVCache(model.config, len(prompt) + 5)
        logits = [prefill(model, prompt, cache)]
        tokens = [int(logits[-1].argmax())]
        for _ in range(4):
            logits.append(decode_step(model, [tokens[-1]], cache))
            tokens.append(int(logits[-1].argmax()))
        return tokens, np.concatenate(logits)

    numpy_tokens, numpy_logits = run(False)
    kernel_tokens, kernel_logits = run(True)
    set_use_kernel(model, False)
    assert kernel_tokens == numpy_tokens
    assert not np.array_equal(kernel_logits, numpy_logits)       # the kernel really ran (float32 sums in another order)
    np.testing.assert_allclose(kernel_logits, numpy_logits, rtol=0, atol=1e-4 * np.abs(numpy_logits).max())


@pytest.mark.skipif(find_compiler("nvcc") is None, reason="nvcc not found")
def test_kernels_compile_for_sm90_without_spills():
    found = find_compiler("nvcc")
    stats, log, ok = compile_with_nvcc(found[1], GEMV_FILE, GEMV_EXPRESSIONS, "sm_90")
    assert ok, log[-3000:]
    assert sorted(stats) == sorted(GEMV_EXPRESSIONS)
    for s in stats.values():
        assert 0 < s["registers"] <= 255 and s["spill_stores"] == s["spill_loads"] == 0 and s["static_smem"] == 0
