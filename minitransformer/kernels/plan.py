"""What every attention kernel's Python side shares: the compiled head dims and dtypes, the input checks, and
AttentionPlan, a kernel's checked launches kept for replay (attention.py and prefill_wmma.py build them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.errors import InputError

HEAD_DIMS = (64, 128)                                   # the head_dim template instantiations
DTYPES = (np.dtype(np.float32), np.dtype(np.float16))   # float and __half storage; the math is float32


@dataclass
class AttentionPlan:
    """Checked launches and the arrays they write: `run()` replays them (benchmarks time it without the checks)."""
    launches: list
    out: object
    lse: object
    partials: tuple = ()      # paged decode: (part_out, part_max, part_sum), kernel 1's per-partition results

    def run(self):
        for launch in self.launches:
            launch()
        return self.out, self.lse


def check_array_storage(name: str, array, dtype=None) -> None:
    if array.dtype not in DTYPES:
        raise InputError(f"{name} has dtype {array.dtype}; the kernels take float32 or float16")
    if dtype is not None and array.dtype != dtype:
        raise InputError(f"{name} has dtype {array.dtype} but q has {dtype}: all inputs share one dtype")


def check_head_dim(d: int) -> None:
    if d not in HEAD_DIMS:
        raise InputError(f"head_dim {d} is not compiled; the kernels are instantiated for {HEAD_DIMS}")


def check_heads(H: int, K: int, max_group: int | None = None) -> int:
    if K < 1 or H % K:
        raise InputError(f"{H} query heads cannot be grouped over {K} KV heads (H must be a multiple of K)")
    if max_group is not None and H // K > max_group:
        raise InputError(f"{H // K} query heads per KV head; the decode kernel handles at most {max_group}")
    return H // K


def check_prefill_inputs(q, k, v) -> tuple[int, int, int, int, int, int]:
    """Raise InputError unless q (B, H, Tq, d), k, v (B, K, Tk, d) fit the prefill kernels; return the sizes."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise InputError(f"flash_prefill takes q (B, H, Tq, d) and k, v (B, K, Tk, d); got {q.ndim}-D, {k.ndim}-D, "
                         f"{v.ndim}-D arrays")
    B, H, Tq, d = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != d:
        raise InputError(f"k {k.shape} and v {v.shape} must both be (B={B}, K, Tk, d={d})")
    K, Tk = k.shape[1], k.shape[2]
    check_heads(H, K)
    check_head_dim(d)
    if not 1 <= Tq <= Tk:
        raise InputError(f"flash_prefill needs 1 <= Tq <= Tk (queries are the last Tq of Tk positions); "
                         f"got Tq={Tq}, Tk={Tk}")
    check_array_storage("q", q)
    check_array_storage("k", k, q.dtype)
    check_array_storage("v", v, q.dtype)
    return B, H, Tq, d, K, Tk


def check_aligned16(**arrays) -> None:
    """The bandwidth kernel reads 16 bytes per load, which must start at a multiple of 16 (a row of d = 64 or 128
    elements always does; an array that starts off that grid, e.g. a view at an odd offset, does not)."""
    for name, array in arrays.items():
        address = array.ctypes.data if isinstance(array, np.ndarray) else array.data.ptr
        if address % 16:
            raise InputError(f"{name} starts at an address that is not a multiple of 16 bytes: pass a copy "
                             "(xp.ascontiguousarray of a fresh array)")
