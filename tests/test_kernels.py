"""The CUDA attention kernels against the array reference (layers.attention), on the CPU runner and, when there is
one, on a GPU through CuPy: the same .cu source and the same launch code in both places.

float32: within 1e-5. float16 storage: the kernels compute in float32 and round the output to float16 once, so
the stated tolerance is half a float16 ulp of the output (relative 2^-11) plus 1e-5, against the reference run on
the float16 inputs widened to float32.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minitransformer.core.errors import InputError
from minitransformer.core.layers import attention
from minitransformer.kernels import flash_prefill, paged_decode
from minitransformer.kernels.attention import DECODE_EXPRESSIONS, PREFILL_EXPRESSIONS, PREFILL_FILE
from minitransformer.kernels.loader import array_param, build_module, get_kernel, read_source, scalar_param

F32_TOL = dict(rtol=1e-5, atol=1e-5)
F16_TOL = dict(rtol=2.0 ** -11, atol=1e-5)


def _gpu_or_reason():
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None, "CuPy is installed but sees no GPU"
        return cupy, None
    except Exception as exc:  # ImportError, or CUDA driver/runtime errors
        return None, f"no GPU through CuPy ({type(exc).__name__}: {exc})"


CUPY, NO_GPU_REASON = _gpu_or_reason()


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.skipif(CUPY is None, reason=str(NO_GPU_REASON)))])
def device(request):
    return request.param


def to_device(array, device):
    return CUPY.asarray(array) if device == "gpu" else array


def to_host(array):
    return array if isinstance(array, np.ndarray) else array.get()


# ---------------------------------------------------------------------------------------------- references ---

def prefill_reference(q, k, v):
    """layers.attention with the queries at the last Tq positions, in float32; plus the log-sum-exp in float64."""
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    q_pos = np.broadcast_to(np.arange(Tk - Tq, Tk), (B, Tq))
    k_pos = np.broadcast_to(np.arange(Tk), (B, Tk))
    out = attention(q32, k32, v32, q_pos, k_pos)
    G = H // k.shape[1]
    k_full = np.repeat(k32.astype(np.float64), G, axis=1)                  # (B, H, Tk, d)
    scores = q32.astype(np.float64) @ k_full.transpose(0, 1, 3, 2) / math.sqrt(d)
    scores = np.where(k_pos[:, None, None, :] <= q_pos[:, None, :, None], scores, -np.inf)
    top = scores.max(axis=-1)
    lse = top + np.log(np.exp(scores - top[..., None]).sum(axis=-1))        # (B, H, Tq)
    return out, lse


def paged_reference(q, k_cache, v_cache, block_tables, seq_lens):
    """Gather each sequence's blocks through its table, then the same layers.attention as contiguous attention."""
    B, H, d = q.shape
    _, block_size, K, _ = k_cache.shape
    outs, lses = [], []
    for b in range(B):
        n = int(seq_lens[b])
        blocks = block_tables[b, :-(-n // block_size)]
        k = k_cache[blocks].reshape(-1, K, d)[:n].transpose(1, 0, 2)[None].astype(np.float32)   # (1, K, n, d)
        v = v_cache[blocks].reshape(-1, K, d)[:n].transpose(1, 0, 2)[None].astype(np.float32)
        qb = q[b][None, :, None, :].astype(np.float32)                                           # (1, H, 1, d)
        outs.append(attention(qb, k, v, np.array([[n - 1]]), np.arange(n)[None])[0, :, 0])
        scores = np.repeat(k[0].astype(np.float64), H // K, axis=0) @ qb[0, :, 0, :, None].astype(np.float64)
        scores = scores[..., 0] / math.sqrt(d)                                                   # (H, n)
        top = scores.max(axis=-1)
        lses.append(top + np.log(np.exp(scores - top[:, None]).sum(axis=-1)))
    return np.stack(outs), np.stack(lses)


def make_paged(rng, seq_lens, H, K, d, block_size, dtype, extra_blocks=3):
    """A shuffled paged cache: each sequence's blocks scattered over the pool, poison everywhere it must not read."""
    max_blocks = max(-(-n // block_size) for n in seq_lens) + 1            # one spare column, never used
    needed = sum(-(-n // block_size) for n in seq_lens)
    num_blocks = needed + extra_blocks
    k_cache = rng.standard_normal((num_blocks, block_size, K, d)).astype(dtype)
    v_cache = rng.standard_normal((num_blocks, block_size, K, d)).astype(dtype)
    order = rng.permutation(num_blocks)                                    # shuffled physical blocks
    tables = np.full((len(seq_lens), max_blocks), 2**30, dtype=np.int32)   # unused entries: absurd ids
    used = 0
    for b, n in enumerate(seq_lens):
        count = -(-n // block_size)
        tables[b, :count] = order[used:used + count]
        last, fill = tables[b, count - 1], count * block_size - n
        if fill:                                                            # slots past seq_len in the last block
            k_cache[last, block_size - fill:] = np.float16(60000) if dtype == np.float16 else 1e30
            v_cache[last, block_size - fill:] = np.nan
        used += count
    for spare in order[used:]:                                              # blocks nobody owns
        k_cache[spare] = np.nan
        v_cache[spare] = np.nan
    q = rng.standard_normal((len(seq_lens), H, d)).astype(dtype)
    return q, k_cache, v_cache, tables, np.array(seq_lens, dtype=np.int32)


# ------------------------------------------------------------------------------------------------- prefill ---

PREFILL_CASES = [
    # (B, H, K, Tq, Tk, d)
    (1, 9, 3, 1, 1, 64),        # a single query, a single key
    (1, 9, 3, 1, 37, 64),       # Tq = 1 against a longer cache (a decode step through the prefill kernel)
    (2, 9, 3, 20, 20, 64),      # Tq not a multiple of the 16-row tile; GQA 9/3; batch 2
    (1, 9, 3, 20, 40, 128),     # Tk > Tq (a continuation chunk), head_dim 128, all-masked tiles met first
    (1, 4, 4, 33, 70, 128),     # plain multi-head (G = 1), three query tiles
    (1, 2, 1, 100, 100, 64),    # G = 2, several key tiles per row
]


@pytest.mark.parametrize("B,H,K,Tq,Tk,d", PREFILL_CASES)
def test_flash_prefill_float32(device, B, H, K, Tq, Tk, d):
    rng = np.random.default_rng(Tq * 1000 + Tk)
    q = rng.standard_normal((B, H, Tq, d)).astype(np.float32)
    k = rng.standard_normal((B, K, Tk, d)).astype(np.float32)
    v = rng.standard_normal((B, K, Tk, d)).astype(np.float32)
    out, lse = flash_prefill(*(to_device(a, device) for a in (q, k, v)), return_lse=True)
    ref_out, ref_lse = prefill_reference(q, k, v)
    assert out.dtype == np.float32 and out.shape == (B, H, Tq, d) and lse.shape == (B, H, Tq)
    np.testing.assert_allclose(to_host(out), ref_out, **F32_TOL)
    np.testing.assert_allclose(to_host(lse), ref_lse, **F32_TOL)


@settings(max_examples=8, deadline=None)
@given(B=st.integers(1, 2), K=st.integers(1, 3), G=st.integers(1, 3), Tq=st.integers(1, 40),
       extra=st.integers(0, 40), d=st.sampled_from([64, 128]), seed=st.integers(0, 2**16))
def test_flash_prefill_random_shapes(B, K, G, Tq, extra, d, seed):
    """Any chunk shape on the CPU runner: Tq queries at the end of Tq + extra keys, G query heads per KV head."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, K * G, Tq, d)).astype(np.float32)
    k, v = (rng.standard_normal((B, K, Tq + extra, d)).astype(np.float32) for _ in range(2))
    out, lse = flash_prefill(q, k, v, return_lse=True)
    ref_out, ref_lse = prefill_reference(q, k, v)
    np.testing.assert_allclose(out, ref_out, **F32_TOL)
    np.testing.assert_allclose(lse, ref_lse, **F32_TOL)


@pytest.mark.parametrize("B,H,K,Tq,Tk,d", [(1, 9, 3, 20, 40, 64), (1, 4, 2, 17, 17, 128)])
def test_flash_prefill_float16(device, B, H, K, Tq, Tk, d):
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(shape).astype(np.float16)
               for shape in ((B, H, Tq, d), (B, K, Tk, d), (B, K, Tk, d)))
    out = flash_prefill(*(to_device(a, device) for a in (q, k, v)))
    ref_out, _ = prefill_reference(q, k, v)
    assert out.dtype == np.float16
    np.testing.assert_allclose(to_host(out).astype(np.float32), ref_out, **F16_TOL)


def test_all_masked_tile_guard_is_needed():
    """Tq=20 of Tk=40: row 0 sits at position 20, and the key tile 32..39 it meets first is all in its future.

    With the guard the output is right (test above); with the guard removed from the very same source, that row's
    running max is -inf when the tile arrives and exp(-inf - -inf) turns its output into NaN.
    """
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 2, 20, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, 40, 64)).astype(np.float32)
    v = rng.standard_normal((1, 1, 40, 64)).astype(np.float32)
    guarded = flash_prefill(q, k, v)
    assert np.isfinite(guarded).all()

    source = read_source(PREFILL_FILE)
    guard = "(m_new == neg_inf()) ? 0.0f : m_new"
    assert source.count(guard) == 1
    module = build_module(source.replace(guard, "m_new"), ("flash_prefill<float, 64>",), "cpu")
    unguarded = flash_prefill(q, k, v, module=module)
    assert np.isnan(unguarded[0, :, :12]).all()       # rows at positions 20..31 meet the all-masked tile first
    np.testing.assert_allclose(unguarded[0, :, 12:], guarded[0, :, 12:], **F32_TOL)


# --------------------------------------------------------------------------------------------------- decode ---

SEQ_LENS = [1, 15, 16, 17, 100, 1000]


@pytest.fixture(params=["bandwidth", "simple"])
def variant(request):
    """Both decode kernels: paged_decode.cu (built for bandwidth, the default) and its teaching baseline."""
    return request.param


@pytest.mark.parametrize("partition_size", [16, 64, 1024, None])     # many partitions ... one; None: sized
def test_paged_decode_float32(device, variant, partition_size):
    rng = np.random.default_rng(partition_size or 0)
    arrays = make_paged(rng, SEQ_LENS, H=9, K=3, d=64, block_size=16, dtype=np.float32)
    out, lse = paged_decode(*(to_device(a, device) for a in arrays), partition_size=partition_size,
                            return_lse=True, variant=variant)
    ref_out, ref_lse = paged_reference(*arrays)
    assert out.dtype == np.float32 and out.shape == (len(SEQ_LENS), 9, 64)
    np.testing.assert_allclose(to_host(out), ref_out, **F32_TOL)
    np.testing.assert_allclose(to_host(lse), ref_lse, **F32_TOL)


def test_paged_decode_head_dim_128_gqa(device, variant):
    rng = np.random.default_rng(128)
    arrays = make_paged(rng, [17, 100, 33], H=8, K=2, d=128, block_size=16, dtype=np.float32)
    out = paged_decode(*(to_device(a, device) for a in arrays), partition_size=32, variant=variant)
    np.testing.assert_allclose(to_host(out), paged_reference(*arrays)[0], **F32_TOL)


def test_paged_decode_block_size_8(device, variant):
    rng = np.random.default_rng(8)
    arrays = make_paged(rng, [1, 7, 8, 9, 50], H=9, K=3, d=64, block_size=8, dtype=np.float32)
    out = paged_decode(*(to_device(a, device) for a in arrays), partition_size=24, variant=variant)
    np.testing.assert_allclose(to_host(out), paged_reference(*arrays)[0], **F32_TOL)


@pytest.mark.parametrize("d", [64, 128])
def test_paged_decode_float16(device, variant, d):
    rng = np.random.default_rng(16)
    arrays = make_paged(rng, [1, 17, 300], H=9, K=3, d=d, block_size=16, dtype=np.float16)
    out = paged_decode(*(to_device(a, device) for a in arrays), partition_size=64, variant=variant)
    assert out.dtype == np.float16
    np.testing.assert_allclose(to_host(out).astype(np.float32), paged_reference(*arrays)[0], **F16_TOL)


@settings(max_examples=8, deadline=None)
@given(lens=st.lists(st.integers(1, 200), min_size=1, max_size=4), block_size=st.sampled_from([8, 16]),
       blocks_per_partition=st.integers(1, 4), G=st.integers(1, 8), seed=st.integers(0, 2**16),
       variant=st.sampled_from(["bandwidth", "simple"]))
def test_paged_decode_random_shapes(lens, block_size, blocks_per_partition, G, seed, variant):
    """Any batch of lengths, block size, partition size and group size (up to the kernels' 8) on the CPU runner."""
    rng = np.random.default_rng(seed)
    arrays = make_paged(rng, lens, H=2 * G, K=2, d=64, block_size=block_size, dtype=np.float32)
    out, lse = paged_decode(*arrays, partition_size=block_size * blocks_per_partition, return_lse=True,
                            variant=variant)
    ref_out, ref_lse = paged_reference(*arrays)
    np.testing.assert_allclose(out, ref_out, **F32_TOL)
    np.testing.assert_allclose(lse, ref_lse, **F32_TOL)


def test_paged_decode_matches_prefill_kernel():
    """Two kernels, one answer: a decode step equals the last row of the prefill kernel on the same keys."""
    rng = np.random.default_rng(5)
    q, k_cache, v_cache, tables, lens = make_paged(rng, [45], H=9, K=3, d=64, block_size=16, dtype=np.float32)
    blocks = tables[0, :3]
    k = np.ascontiguousarray(k_cache[blocks].reshape(-1, 3, 64)[:45].transpose(1, 0, 2)[None])   # (1, K, 45, d)
    v = np.ascontiguousarray(v_cache[blocks].reshape(-1, 3, 64)[:45].transpose(1, 0, 2)[None])
    prefill_last = flash_prefill(np.ascontiguousarray(q[:, :, None, :]), k, v)[:, :, 0]
    for variant in ("bandwidth", "simple"):
        np.testing.assert_allclose(paged_decode(q, k_cache, v_cache, tables, lens, partition_size=16, variant=variant),
                                   prefill_last, **F32_TOL)


# ------------------------------------------------------------------------------------------ argument checks ---

def _prefill_inputs(dtype=np.float32):
    rng = np.random.default_rng(0)
    return tuple(rng.standard_normal(s).astype(dtype) for s in ((1, 2, 3, 64), (1, 1, 3, 64), (1, 1, 3, 64)))


def test_wrong_dtype_is_refused():
    q, k, v = _prefill_inputs(np.float64)
    with pytest.raises(InputError, match="float64"):
        flash_prefill(q, k, v)
    q, k, v = _prefill_inputs()
    with pytest.raises(InputError, match="float16"):
        flash_prefill(q, k.astype(np.float16), v)


def test_non_contiguous_is_refused():
    q, k, v = _prefill_inputs()
    with pytest.raises(InputError, match="C-contiguous"):
        flash_prefill(np.asfortranarray(q), k, v)


def _raw_prefill_kernel():
    params = (array_param("q", np.float32), array_param("k", np.float32), array_param("v", np.float32),
              array_param("out", np.float32), array_param("lse", np.float32), scalar_param("num_heads", np.int32),
              scalar_param("num_kv_heads", np.int32), scalar_param("q_len", np.int32),
              scalar_param("kv_len", np.int32), scalar_param("scale", np.float32))
    return get_kernel(PREFILL_FILE, "flash_prefill<float, 64>", params, "cpu", PREFILL_EXPRESSIONS)


def test_python_int_scalar_is_refused():
    q, k, v = _prefill_inputs()
    out, lse = np.empty_like(q), np.empty((1, 2, 3), np.float32)
    kernel = _raw_prefill_kernel()
    with pytest.raises(InputError, match="num_heads.*NumPy scalar"):
        kernel((1, 2, 1), (128,), (q, k, v, out, lse, 2, np.int32(1), np.int32(3), np.int32(3), np.float32(0.125)))
    with pytest.raises(InputError, match="scale.*float32"):
        kernel((1, 2, 1), (128,), (q, k, v, out, lse, np.int32(2), np.int32(1), np.int32(3), np.int32(3),
                                   np.float64(0.125)))
    with pytest.raises(InputError, match="lse.*float32"):
        kernel((1, 2, 1), (128,), (q, k, v, out, lse.astype(np.float64), np.int32(2), np.int32(1), np.int32(3),
                                   np.int32(3), np.float32(0.125)))
    with pytest.raises(InputError, match="expected 10 arguments"):
        kernel((1, 2, 1), (128,), (q, k, v))


def test_shape_errors_are_clear():
    q, k, v = _prefill_inputs()
    with pytest.raises(InputError, match="head_dim 32"):
        flash_prefill(q[..., :32].copy(), k[..., :32].copy(), v[..., :32].copy())
    with pytest.raises(InputError, match="Tq <= Tk"):
        flash_prefill(np.concatenate([q, q], axis=2), k, v)
    with pytest.raises(InputError, match="multiple of K"):
        flash_prefill(np.concatenate([q, q[:, :1]], axis=1), np.concatenate([k, k], axis=1),
                      np.concatenate([v, v], axis=1))
    rng = np.random.default_rng(1)
    arrays = make_paged(rng, [20], H=9, K=3, d=64, block_size=16, dtype=np.float32)
    with pytest.raises(InputError, match="multiple of block_size"):
        paged_decode(*arrays, partition_size=24)
    bad_lens = np.array([10_000], dtype=np.int32)
    with pytest.raises(InputError, match="seq_lens"):
        paged_decode(*arrays[:4], bad_lens)
    with pytest.raises(InputError, match="seq_lens.*int32"):
        paged_decode(*arrays[:4], arrays[4].astype(np.int64))


def test_loader_inlines_local_includes_once():
    """CuPy's cache key is the source text: the helpers of common.cuh must be in it, and only once."""
    source = read_source(PREFILL_FILE)
    assert re.search(r'^\s*#\s*include\s+"', source, re.MULTILINE) is None and "#include <cuda_fp16.h>" in source
    assert source.count("float warp_max(float x)") == 1
    assert len(PREFILL_EXPRESSIONS) == 4 and len(DECODE_EXPRESSIONS) == 8    # float/half x head_dim 64/128


def test_paged_decode_empty_sequence_gives_zeros(variant):
    """A batch slot with seq_len 0 attends to nothing: zeros and lse -inf, and its neighbours are unaffected."""
    rng = np.random.default_rng(9)
    q, k_cache, v_cache, tables, lens = make_paged(rng, [20, 5], H=9, K=3, d=64, block_size=16, dtype=np.float32)
    out, lse = paged_decode(q, k_cache, v_cache, tables, np.array([20, 0], dtype=np.int32), partition_size=16,
                            return_lse=True, variant=variant)
    assert (out[1] == 0).all() and np.isneginf(lse[1]).all()
    np.testing.assert_allclose(out[:1], paged_reference(q[:1], k_cache, v_cache, tables[:1], lens[:1])[0], **F32_TOL)
