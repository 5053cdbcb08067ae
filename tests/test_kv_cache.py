"""The contiguous KV cache: bytes accounting equals the estimator, and prefill + decode through it computes exactly
what a forward over the whole sequence computes."""

import numpy as np
import pytest

from minitransformer.core.decode import decode_step
from minitransformer.core.errors import InputError
from minitransformer.core.kv_cache import KVCache, estimate_kv_bytes
from minitransformer.core.prefill import prefill


@pytest.mark.parametrize("tokens,batch,dtype", [(1, 1, np.float32), (17, 1, np.float32), (100, 2, np.float32),
                                                (64, 4, np.float16), (128, 3, np.float64)])
def test_estimator_equals_measured_bytes(tiny_model, real_model, tokens, batch, dtype):
    for config in (tiny_model.config, real_model.config):
        cache = KVCache(config, max_len=tokens, batch=batch, dtype=dtype)
        expected = estimate_kv_bytes(config, tokens, batch, dtype)
        assert cache.bytes_reserved == expected == cache.k.nbytes + cache.v.nbytes
        cache.length = tokens                                  # as if filled
        assert cache.bytes_used == expected


def test_bytes_used_grows_by_one_token_per_decode_step(tiny_model):
    config = tiny_model.config
    cache = KVCache(config, max_len=20)
    prefill(tiny_model, [5, 6, 7], cache)
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 4
    assert cache.length == 3 and cache.bytes_used == 3 * per_token
    decode_step(tiny_model, [8], cache)
    assert cache.length == 4 and cache.bytes_used == 4 * per_token
    filled = cache.k[:, :, :cache.length]                   # the measured part of the array
    assert 2 * filled.nbytes == cache.bytes_used
    assert cache.shape == (config.n_layers, 1, 4, config.n_kv_heads, config.head_dim)
    assert not np.any(cache.k[:, :, 4:])                    # nothing written past the length


def test_prefill_then_decode_equals_the_full_forward(tiny_model):
    ids = [3, 40, 41, 200, 7, 9, 100, 33]
    full = tiny_model.forward(np.array([ids]), np.arange(len(ids))[None])            # (1, T, V)
    cache = KVCache(tiny_model.config, max_len=len(ids))
    logits = prefill(tiny_model, ids[:5], cache, all_logits=True)                     # (1, 5, V)
    np.testing.assert_allclose(logits[0], full[0, :5], rtol=1e-5, atol=1e-5)
    for t in range(5, len(ids)):
        step = decode_step(tiny_model, [ids[t]], cache)                                # (1, V)
        np.testing.assert_allclose(step[0], full[0, t], rtol=1e-5, atol=1e-5)
    assert cache.length == len(ids)


def test_a_batch_of_same_length_prompts_matches_each_alone(tiny_model):
    prompts = np.array([[3, 4, 5, 6], [10, 200, 30, 4]])
    cache = KVCache(tiny_model.config, max_len=6, batch=2)
    together = [prefill(tiny_model, prompts, cache)]
    together.append(decode_step(tiny_model, [7, 8], cache))                           # (2, V)
    for row in range(2):
        alone = KVCache(tiny_model.config, max_len=6)
        first = prefill(tiny_model, prompts[row], alone)
        second = decode_step(tiny_model, [[7, 8][row]], alone)
        np.testing.assert_allclose(together[0][row], first[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(together[1][row], second[0], rtol=1e-5, atol=1e-5)


def test_full_and_released_caches_refuse_work(tiny_model):
    cache = KVCache(tiny_model.config, max_len=3)
    prefill(tiny_model, [1, 2, 3], cache)
    with pytest.raises(InputError, match="KV cache is full: 3 tokens stored \\+ 1 new > 3 reserved"):
        decode_step(tiny_model, [4], cache)
    cache.release()
    assert cache.bytes_reserved == 0 and cache.k is None
    with pytest.raises(InputError, match="released"):
        decode_step(tiny_model, [4], cache)
    with pytest.raises(InputError, match="context window"):
        KVCache(tiny_model.config, max_len=tiny_model.config.context_length + 1)
