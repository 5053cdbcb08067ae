"""The tensor-core flash prefill (flash_prefill_wmma.cu) against the array reference, on the CPU runner (mma.h) and,
when there is one, on a GPU: the same shapes as the CUDA-core kernel's tests, float16 only.

Tolerance, float16 inputs: the reference is layers.attention on the same float16 q, k, v widened to float32. The
kernel's products of float16 numbers are exact in float32 and summed in float32, as the CUDA-core kernel's are; what
is new is that each probability p (in [0, 1]) is rounded to float16 before P V, a relative error of at most 2^-11
(2^-25 absolute below float16's smallest normal, 2^-14). The output row sum_j p_j v_j / l therefore moves by at most
max|v| * (2^-11 + Tk * 2^-25), and rounding the output to float16 adds half an ulp, 2^-11 relative. So:
    |out - reference| <= 2^-11 |reference| + max|v| (2^-11 + Tk 2^-25) + 1e-5   (1e-5: float32 sums, as elsewhere)
lse uses the float32 scores and the float32 sum of unrounded p: within 1e-5, as the CUDA-core kernel's.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minitransformer.core.errors import InputError
from minitransformer.kernels import flash_prefill
from minitransformer.kernels.cpu_runner import DEFAULT_ORDER, CpuModule
from minitransformer.kernels.loader import KERNEL_DIR, build_module, read_source
from minitransformer.kernels.prefill_wmma import WMMA_EXPRESSIONS, WMMA_FILE
from test_kernels import PREFILL_CASES, device, prefill_reference, to_device, to_host  # noqa: F401 (fixture)

F32_TOL = dict(rtol=1e-5, atol=1e-5)


def assert_close_f16(out, reference, v):
    """The bound of the module docstring, element by element."""
    Tk = v.shape[2]
    atol = float(np.abs(v.astype(np.float32)).max()) * (2.0**-11 + Tk * 2.0**-25) + 1e-5
    np.testing.assert_allclose(out.astype(np.float32), reference, rtol=2.0**-11, atol=atol)


def inputs(B, H, K, Tq, Tk, d, seed):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float16)
                 for shape in ((B, H, Tq, d), (B, K, Tk, d), (B, K, Tk, d)))


@pytest.mark.parametrize("B,H,K,Tq,Tk,d", PREFILL_CASES + [(1, 9, 3, 1, 1000, 64), (1, 3, 1, 130, 1000, 128)])
def test_wmma_prefill_float16(device, B, H, K, Tq, Tk, d):  # noqa: F811 (device: test_kernels' fixture, imported)
    q, k, v = inputs(B, H, K, Tq, Tk, d, seed=Tq * 1000 + Tk)
    out, lse = flash_prefill(*(to_device(a, device) for a in (q, k, v)), return_lse=True, variant="wmma")
    ref_out, ref_lse = prefill_reference(q, k, v)
    assert out.dtype == np.float16 and out.shape == (B, H, Tq, d) and lse.shape == (B, H, Tq)
    assert_close_f16(to_host(out), ref_out, v)
    np.testing.assert_allclose(to_host(lse), ref_lse, **F32_TOL)


@settings(max_examples=6, deadline=None)
@given(B=st.integers(1, 2), K=st.integers(1, 3), G=st.integers(1, 3), Tq=st.integers(1, 80),
       extra=st.integers(0, 60), d=st.sampled_from([64, 128]), seed=st.integers(0, 2**16))
def test_wmma_prefill_random_shapes(B, K, G, Tq, extra, d, seed):
    q, k, v = inputs(B, K * G, K, Tq, Tq + extra, d, seed)
    out, lse = flash_prefill(q, k, v, return_lse=True, variant="wmma")
    ref_out, ref_lse = prefill_reference(q, k, v)
    assert_close_f16(out, ref_out, v)
    np.testing.assert_allclose(lse, ref_lse, **F32_TOL)


def test_wmma_needs_float16_and_a_known_variant():
    q, k, v = inputs(1, 2, 1, 3, 3, 64, seed=0)
    with pytest.raises(InputError, match="float16"):
        flash_prefill(*(a.astype(np.float32) for a in (q, k, v)), variant="wmma")
    with pytest.raises(InputError, match="variant 'tensor'"):
        flash_prefill(q, k, v, variant="tensor")
    offset = np.empty(q.size + 1, np.float16)[1:].reshape(q.shape)       # 2 bytes off a 16-byte boundary
    offset[...] = q
    with pytest.raises(InputError, match="multiple of 16 bytes"):
        flash_prefill(offset, k, v, variant="wmma")


# ---- the kernel's source, edited: what each guard and each barrier is for ------------------------------------------

CASE = (1, 4, 2, 70, 100, 64)    # 2 query blocks (64 + 6 rows), 4 key tiles, G = 2: every path of the kernel runs


def run_edited(source: str, order: str = DEFAULT_ORDER, seed: int = 0):
    module = CpuModule(source, name_expressions=WMMA_EXPRESSIONS[:1], order=order, seed=seed, source_name=WMMA_FILE)
    q, k, v = inputs(*CASE, seed=4)
    return flash_prefill(q, k, v, module=module, variant="wmma"), prefill_reference(q, k, v)[0], v


def is_right(out, reference, v) -> bool:
    try:
        assert_close_f16(out, reference, v)
        return True
    except AssertionError:
        return False


def test_all_masked_tile_guard_is_needed():
    """Tq=20 of Tk=40: rows 0..11 (positions 20..31) meet key tile 32..63 first, with every key in their future."""
    q, k, v = inputs(1, 2, 1, 20, 40, 64, seed=3)
    guard = "(m_new == neg_inf()) ? 0.0f : m_new"
    source = read_source(WMMA_FILE)
    assert source.count(guard) == 1
    module = build_module(source.replace(guard, "m_new"), WMMA_EXPRESSIONS[:1], "cpu", WMMA_FILE)
    unguarded = flash_prefill(q, k, v, module=module, variant="wmma").astype(np.float32)
    guarded = flash_prefill(q, k, v, variant="wmma").astype(np.float32)
    assert np.isfinite(guarded).all() and np.isnan(unguarded[0, :, :12]).all()
    np.testing.assert_array_equal(unguarded[0, :, 12:], guarded[0, :, 12:])


def test_wrong_fragment_layout_of_k_is_caught():
    """K^T must be read column-major; read row-major, the warp multiplies Q by a tile of K itself."""
    source = read_source(WMMA_FILE)
    right = "using FragKt = wmma::fragment<wmma::matrix_b, WMMA_TILE, WMMA_TILE, WMMA_TILE, __half, wmma::col_major>;"
    assert source.count(right) == 1
    out, reference, v = run_edited(source.replace(right, right.replace("col_major", "row_major")))
    assert not is_right(out, reference, v)


SYNC = re.compile(r"__sync(?:threads|warp)\(\)\s*;")
SCHEDULES = [("forward", 0), ("reverse", 0), ("shuffle", 0), ("shuffle", 1)]


def sync_spans(text: str) -> list[tuple[int, int]]:
    code = re.sub(r"//[^\n]*", lambda m: " " * len(m.group()), text)    # a barrier named in a comment is no barrier
    return [m.span() for m in SYNC.finditer(code)]


def sync_cases():
    own = (KERNEL_DIR / WMMA_FILE).read_text()
    for n, (start, end) in enumerate(sync_spans(own)):
        yield pytest.param(n, id=f"{own[start:end - 3]}:{own.count(chr(10), 0, start) + 1}")


def test_shipped_kernel_is_right_under_every_order():
    source = read_source(WMMA_FILE)
    assert len(sync_spans(source)) == 7                  # 3 __syncthreads, 4 __syncwarp: a new one is tested below
    for order, seed in SCHEDULES:
        assert is_right(*run_edited(source, order, seed)), (order, seed)


@pytest.mark.parametrize("n", list(sync_cases()))
def test_each_barrier_is_needed(n):
    """Delete one __syncthreads / __syncwarp: the result must be wrong under the default order (and so some order)."""
    source = read_source(WMMA_FILE)
    start, end = sync_spans(source)[n]
    edited = source[:start] + "/* barrier removed */" + source[end:]
    assert not is_right(*run_edited(edited)), f"barrier {n} removed and the default order does not notice"
