"""Every __syncthreads of the attention kernels is needed, and the CPU runner shows it.

For each barrier of flash_prefill.cu, both paged decode kernels (paged_decode.cu, built for bandwidth, and
paged_decode_simple.cu, its teaching baseline) and dequant_gemv.cu, the kernel is rebuilt from its source with that one
barrier deleted and run under several resume orders of the CPU runner; the result must be wrong (NaN, or off the
reference by more than 1e-3) under at least one of them -- and under the runner's default order, which is the one
tests/test_kernels.py uses. The shipped kernels must be right under every order.

Why several orders: the runner runs the stretch of code between two sync points of one thread without
interruption, so a missing barrier shows only when some thread runs on the wrong side of another's write. The barrier
at the top of flash_prefill's tile loop guards a write-after-read (warps still reading the old k/v tile while others
overwrite it with the next one): threads resumed 0, 1, ... (forward) happen to finish reading before the threads
that overwrite what they read, so forward alone misses it; reverse and shuffled orders catch it.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from minitransformer.core.layers import attention
from minitransformer.kernels import flash_prefill, paged_decode
from minitransformer.kernels.attention import DECODE_FILE, DECODE_SIMPLE_FILE, PREFILL_FILE
from minitransformer.kernels.cpu_runner import DEFAULT_ORDER, CpuModule
from minitransformer.kernels.loader import KERNEL_DIR, read_source
from minitransformer.kernels.quant import GEMV_EXPRESSIONS, GEMV_FILE, dequant_gemv
from minitransformer.quantize import QuantizedLinear

SCHEDULES = [("forward", 0), ("reverse", 0), ("shuffle", 0), ("shuffle", 1)]   # (order, seed)
DEFAULT_SCHEDULE = (DEFAULT_ORDER, 0)
BARRIER = re.compile(r"__syncthreads\(\)\s*;")
EXPRESSIONS = {PREFILL_FILE: ("flash_prefill<float, 64>",),
               DECODE_FILE: ("paged_decode_partition<float, 64>", "paged_decode_merge<float, 64>"),
               DECODE_SIMPLE_FILE: ("paged_decode_simple_partition<float, 64>", "paged_decode_merge<float, 64>"),
               GEMV_FILE: GEMV_EXPRESSIONS}
EXPECTED_BARRIERS = {PREFILL_FILE: 2, DECODE_FILE: 4, DECODE_SIMPLE_FILE: 3,   # a new barrier is added here, and tested
                     GEMV_FILE: 4}
FILES = tuple(EXPECTED_BARRIERS)


def _code_only(text: str) -> str:
    """Comments blanked to spaces (same length, same lines), so a barrier named in a comment is not counted."""
    return re.sub(r"//[^\n]*|/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group()), text, flags=re.S)


def barrier_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in BARRIER.finditer(_code_only(text))]


def barrier_cases():
    for filename in FILES:
        own = (KERNEL_DIR / filename).read_text()
        for n, (start, _) in enumerate(barrier_spans(own)):
            yield pytest.param(filename, n, id=f"{filename}:{own.count(chr(10), 0, start) + 1}")


def without_barrier(source: str, n: int) -> str:
    start, end = barrier_spans(source)[n]
    return source[:start] + "/* barrier removed */" + source[end:]


# ---- inputs and independent references (layers.attention) ----------------------------------------------------------

def prefill_case():
    """Tq = 40 queries (3 query tiles) at the end of Tk = 70 keys (3 key tiles: the tile loop turns), G = 2."""
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 4, 40, 64)).astype(np.float32)             # (B, H, Tq, d)
    k, v = (rng.standard_normal((1, 2, 70, 64)).astype(np.float32) for _ in range(2))   # (B, K, Tk, d)
    reference = attention(q, k, v, np.arange(30, 70)[None], np.arange(70)[None])        # (B, H, Tq, d)
    return (lambda module: flash_prefill(q, k, v, module=module)), reference


def decode_case(variant: str):
    """Three sequences (5, 40, 100 tokens) in a shuffled pool of 16-token blocks; partitions of 32 tokens, G = 5.

    Five heads over four warps (two for the simple kernel): some warp takes one head more in the softmax and leaves
    it later than the others, which is what the barrier after the softmax guards (with G = 4 every warp would do the
    same number of shuffles, and the runner would keep them in step).
    """
    rng = np.random.default_rng(12)
    lens, block_size, K, d = [5, 40, 100], 16, 2, 64
    counts = [-(-n // block_size) for n in lens]
    pool = rng.permutation(sum(counts) + 2)                                 # 2 blocks nobody owns
    k_cache, v_cache = (rng.standard_normal((pool.size, block_size, K, d)).astype(np.float32) for _ in range(2))
    tables = np.zeros((len(lens), max(counts)), np.int32)                   # (B, max_blocks)
    offsets = np.cumsum([0] + counts)
    for b, count in enumerate(counts):
        tables[b, :count] = pool[offsets[b]:offsets[b + 1]]
    q = rng.standard_normal((len(lens), 10, d)).astype(np.float32)         # (B, H, d)
    seq_lens = np.array(lens, np.int32)
    reference = []
    for b, n in enumerate(lens):
        k = k_cache[tables[b, :counts[b]]].reshape(-1, K, d)[:n].transpose(1, 0, 2)[None]   # (1, K, n, d)
        v = v_cache[tables[b, :counts[b]]].reshape(-1, K, d)[:n].transpose(1, 0, 2)[None]
        reference.append(attention(q[b][None, :, None], k, v, np.array([[n - 1]]), np.arange(n)[None])[0, :, 0])
    run = lambda module: paged_decode(q, k_cache, v_cache, tables, seq_lens, partition_size=32, module=module,
                                      variant=variant)
    return run, np.stack(reference)                                         # (B, H, d)


def gemv_case():
    """x (3, 2112) through an int8 and an int4 matrix of 20 rows: x is staged in three chunks, so both barriers of
    each kernel matter (after staging a chunk, and before the next chunk overwrites it). Scaled to max |y| = 1."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((3, 2112)).astype(np.float32)
    matrices = [QuantizedLinear.from_float(rng.normal(0, 0.1, (20, 2112)).astype(np.float32), scheme)
                for scheme in ("int8", "int4")]
    reference = np.concatenate([x.astype(np.float64) @ m.dequantize().T.astype(np.float64) for m in matrices], 1)
    top = np.abs(reference).max()
    return (lambda module: np.concatenate([dequant_gemv(x, m, module) for m in matrices], 1) / top), reference / top


CASES = {PREFILL_FILE: prefill_case, DECODE_FILE: lambda: decode_case("bandwidth"),
         DECODE_SIMPLE_FILE: lambda: decode_case("simple"), GEMV_FILE: gemv_case}


def errors_by_schedule(filename: str, source: str) -> dict[tuple[str, int], float]:
    """Max |kernel - reference| under each schedule (NaN if the output holds a NaN)."""
    module = CpuModule(source, name_expressions=EXPRESSIONS[filename], source_name=filename)
    run, reference = CASES[filename]()
    errors = {}
    for order, seed in SCHEDULES:
        module.order, module.seed = order, seed                 # the default of every kernel it hands out
        out = run(module)
        errors[(order, seed)] = float("nan") if np.isnan(out).any() else float(np.abs(out - reference).max())
    return errors


# ---- tests -----------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("filename", FILES)
def test_barriers_are_found_in_code_not_comments(filename):
    own, pasted = (KERNEL_DIR / filename).read_text(), read_source(filename)
    assert len(barrier_spans(own)) == len(barrier_spans(pasted)) == EXPECTED_BARRIERS[filename]


@pytest.mark.parametrize("filename", FILES)
def test_shipped_kernels_are_right_under_every_order(filename):
    errors = errors_by_schedule(filename, read_source(filename))
    assert all(e < 1e-5 for e in errors.values()), errors      # NaN fails too


@pytest.mark.parametrize("filename,n", list(barrier_cases()))
def test_each_barrier_is_needed(filename, n):
    errors = errors_by_schedule(filename, without_barrier(read_source(filename), n))
    wrong = {schedule: not e <= 1e-3 for schedule, e in errors.items()}   # NaN is wrong
    assert any(wrong.values()), f"barrier {n} of {filename} removed and no order notices: {errors}"
    assert wrong[DEFAULT_SCHEDULE], f"the default order misses barrier {n} of {filename}: {errors}"
