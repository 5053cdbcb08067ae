"""The CPU runner's warp matrix functions (cuda_cpu/mma.h): products against NumPy, and the bugs it must catch.

Tolerance of the products: float16 x float16 is exact in float32, so c + a 16-term dot product differs from the
exact (float64) value only by the float32 roundings of its 16 additions: at most 16 * 2^-24 * (|c| + sum |a_ik b_kj|)
(the textbook bound for recursive summation; Higham, "Accuracy and Stability of Numerical Algorithms", ch. 4).
"""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer.kernels.cpu_runner import ORDERS, CpuModule, KernelError
from test_cpu_runner import MODES, PLANTED, line_of, planted


def assert_product(actual, a, b, c=0.0, what=""):
    """actual == a @ b + c within the float32 summation bound above (a, b float16; c float32)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = 16 * 2.0**-24 * (np.abs(a64) @ np.abs(b64) + np.abs(c))
    error = np.abs(actual - (a64 @ b64 + c))
    assert (error <= bound).all(), f"{what}: error {error.max():.2e} above the bound {bound[error > bound].min():.2e}"

LAYOUTS = r"""
#include <cuda_fp16.h>
#include <mma.h>
using namespace nvcuda;

// d = a b + c for every pair of operand layouts; c is read and d written in the accumulator layout LC.
template <class LA, class LB, int LC>
__global__ void layouts(const __half* a, const __half* b, const float* c, float* d) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    const wmma::layout_t lc = LC ? wmma::mem_col_major : wmma::mem_row_major;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(fc, c, 16, lc);
    wmma::mma_sync(fc, fa, fb, fc);
    for (int i = 0; i < fc.num_elements; ++i) fc.x[i] *= 2.0f;          // element-wise: the same for every element
    wmma::store_matrix_sync(d, fc, 16, lc);
}
"""
CASES = [(col_a, col_b, col_c) for col_a in (0, 1) for col_b in (0, 1) for col_c in (0, 1)]   # 1: column-major


def expression(col_a: int, col_b: int, col_c: int) -> str:
    name = lambda col: "wmma::col_major" if col else "wmma::row_major"
    return f"layouts<{name(col_a)}, {name(col_b)}, {col_c}>"


def aligned(shape, dtype, values=None):
    """A C-contiguous array whose data starts on a 32-byte boundary (load/store_matrix_sync require it)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = np.zeros(n * dtype.itemsize + 32, np.uint8)
    start = -raw.ctypes.data % 32
    array = raw[start:start + n * dtype.itemsize].view(dtype).reshape(shape)
    if values is not None:
        array[...] = values
    return array


def operands(seed=0):
    rng = np.random.default_rng(seed)
    a, b = (aligned((16, 16), np.float16, rng.standard_normal((16, 16))) for _ in range(2))
    return a, b, aligned((16, 16), np.float32)


@pytest.mark.parametrize("mode", MODES)
def test_every_layout_matches_numpy(mode):
    module = CpuModule(LAYOUTS, name_expressions=[expression(*case) for case in CASES], mode=mode,
                       source_name="layouts.cu")
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((16, 16)).astype(np.float16) for _ in range(2))
    c = rng.standard_normal((16, 16)).astype(np.float32)
    for col_a, col_b, col_c in CASES:
        # Memory holds each matrix as its layout says: a column-major matrix is its transpose stored row-major.
        a_mem = aligned((16, 16), np.float16, a.T if col_a else a)
        b_mem = aligned((16, 16), np.float16, b.T if col_b else b)
        c_mem, d_mem = aligned((16, 16), np.float32, c.T if col_c else c), aligned((16, 16), np.float32)
        module.get_function(expression(col_a, col_b, col_c))((1,), (32,), (a_mem, b_mem, c_mem, d_mem))
        d = (d_mem.T if col_c else d_mem) / 2                 # the kernel doubles its result: exact
        assert_product(d, a, b, c, expression(col_a, col_b, col_c))


@pytest.mark.parametrize("mode", MODES)
def test_fixed_twins_are_right(mode):
    module = planted("wmma_bugs.cu", mode)
    a, b, c = operands()
    for name in ("abt", "staged", "stored"):
        c[...] = 0
        module.get_function(name)((1,), (32,), (a, b, c))
        assert_product(c, a, b.T, what=name)


def test_wrong_fragment_layout_gives_a_times_b():
    a, b, c = operands()
    planted("wmma_bugs.cu").get_function("abt_wrong_layout")((1,), (32,), (a, b, c))
    assert_product(c, a, b, what="a b")
    assert np.abs(c - a.astype(np.float64) @ b.astype(np.float64).T).max() > 1.0      # far from a b^T


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("name", ["staged_missing_syncwarp", "stored_missing_syncwarp"])
def test_missing_syncwarp_around_a_fragment_gives_nan(name, order):
    """wmma's rendezvous orders execution, not memory: lanes' shared-memory data needs a __syncwarp."""
    a, b, c = operands()
    planted("wmma_bugs.cu", order=order).get_function(name)((1,), (32,), (a, b, c))
    assert np.isnan(c).any()


def test_divergent_mma_names_file_and_line():
    a, b, c = operands()
    with pytest.raises(KernelError, match="wmma::mma_sync .* is not reached by lane 16") as caught:
        planted("wmma_bugs.cu").get_function("divergent_mma")((1,), (32,), (a, b, c))
    assert f"wmma_bugs.cu:{line_of('wmma_bugs.cu', 'BUG: divergent')}" in str(caught.value)


def test_misaligned_fragment_pointer_is_refused():
    a, b, c = operands()
    with pytest.raises(KernelError, match="32-byte aligned") as caught:
        planted("wmma_bugs.cu").get_function("misaligned_load")((1,), (32,), (a, b, c))
    assert f"wmma_bugs.cu:{line_of('wmma_bugs.cu', 'BUG: not 32-byte aligned')}" in str(caught.value)


def test_a_partial_warp_is_refused():
    a, b, c = operands()
    with pytest.raises(KernelError, match="needs whole warps"):
        planted("wmma_bugs.cu").get_function("abt")((1,), (16,), (a, b, c))
    assert (PLANTED / "wmma_bugs.cu").is_file()
