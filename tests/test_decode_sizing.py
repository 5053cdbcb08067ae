"""Paged decode's launch sizing (kernels/decode_sizing.py) and the bandwidth kernel at the sizes it picks.

The partition length only decides how the work is cut, never the answer: every size the sizing picks, for any SM
count, must give the array reference's output (float32 within 1e-5; float16 within half an output ulp + 1e-5, as in
test_kernels.py). The sizing itself is checked against what it promises: whole cache blocks, a grid of about
num_sms x DECODE_BLOCKS_PER_SM blocks when the context is long enough, and shared memory within the limit.
"""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer.core.errors import InputError
from minitransformer.kernels import paged_decode
from minitransformer.kernels.attention import plan_paged_decode
from minitransformer.kernels.decode_sizing import (
    DECODE_BLOCKS_PER_SM,
    DEFAULT_NUM_SMS,
    MAX_PARTITION,
    SIMPLE_PARTITION,
    choose_partition_size,
    decode_shared_bytes,
)
from minitransformer.kernels.loader import MAX_SHARED_BYTES
from test_kernels import F16_TOL, F32_TOL, make_paged, paged_reference


@pytest.mark.parametrize("batch,kv_heads,tokens", [(1, 3, 4096), (8, 3, 4096), (8, 3, 32768), (64, 8, 32768),
                                                   (1, 1, 16), (3, 2, 1000)])
@pytest.mark.parametrize("num_sms", [DEFAULT_NUM_SMS, 16])
def test_partition_sizes_fill_the_grid(batch, kv_heads, tokens, num_sms):
    size = choose_partition_size("bandwidth", batch, kv_heads, tokens, 16, 8, 128, num_sms)
    assert size % 16 == 0 and 64 <= size <= MAX_PARTITION
    assert decode_shared_bytes(8, 128, size, 16) <= MAX_SHARED_BYTES
    blocks = -(-tokens // size) * kv_heads * batch
    target = num_sms * DECODE_BLOCKS_PER_SM
    if size > 64 and size < MAX_PARTITION:        # neither bound is binding: the grid lands on the target
        assert target <= blocks < target + batch * kv_heads
    elif size == 64:                               # short context: as many blocks as one cache block per warp gives
        assert blocks <= target + batch * kv_heads
    else:                                          # long context, big batch: the grid is over the target already
        assert blocks >= target


def test_simple_variant_keeps_its_fixed_partition():
    assert choose_partition_size("simple", 1, 3, 4096, 16, 3, 64, DEFAULT_NUM_SMS) == SIMPLE_PARTITION


@pytest.mark.parametrize("dtype,tol", [(np.float32, F32_TOL), (np.float16, F16_TOL)])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("num_sms", [None, 1, 7])
def test_sized_partitions_match_the_reference(dtype, tol, d, num_sms):
    """Lengths 1 to 1000 (partial last blocks), GQA 9/3, shuffled tables, at the size chosen for num_sms SMs."""
    rng = np.random.default_rng(d + (num_sms or 0))
    arrays = make_paged(rng, [1, 15, 16, 17, 100, 1000], H=9, K=3, d=d, block_size=16, dtype=dtype)
    out, lse = paged_decode(*arrays, return_lse=True, num_sms=num_sms)
    ref_out, ref_lse = paged_reference(*arrays)
    np.testing.assert_allclose(out.astype(np.float32), ref_out, **tol)
    np.testing.assert_allclose(lse, ref_lse, **F32_TOL)


def test_fewer_sms_means_longer_partitions():
    rng = np.random.default_rng(0)
    arrays = make_paged(rng, [1000], H=9, K=3, d=64, block_size=16, dtype=np.float32)
    many = plan_paged_decode(*arrays).partials[0].shape[2]                  # partitions for 132 SMs
    few = plan_paged_decode(*arrays, num_sms=1).partials[0].shape[2]
    assert many > few >= 1


def test_unaligned_arrays_and_unknown_variants_are_refused():
    rng = np.random.default_rng(1)
    q, k_cache, v_cache, tables, lens = make_paged(rng, [20], H=9, K=3, d=64, block_size=16, dtype=np.float32)
    shifted = np.empty(k_cache.size + 1, np.float32)[1:].reshape(k_cache.shape)   # 4 bytes past a 16-byte boundary
    shifted[...] = k_cache
    with pytest.raises(InputError, match="k_cache.*multiple of 16"):
        paged_decode(q, shifted, v_cache, tables, lens)
    np.testing.assert_allclose(paged_decode(q, shifted, v_cache, tables, lens, variant="simple"),
                               paged_reference(q, k_cache, v_cache, tables, lens)[0], **F32_TOL)
    with pytest.raises(InputError, match="variant"):
        paged_decode(q, k_cache, v_cache, tables, lens, variant="fast")
