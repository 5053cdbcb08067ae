"""The KV storage codecs (kv_storage.CODECS): every entry of the table keeps the promises the caches, the byte formula
and the CLI rely on, so a new codec is one table entry, checked here, plus a test of its own error bound."""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer.core.attention import ArrayAttention
from minitransformer.core.backend import INT8_MAX
from minitransformer.core.errors import InputError
from minitransformer.core.kv_cache import KVCache, estimate_kv_bytes, kv_bytes_per_token
from minitransformer.core.kv_storage import CODECS, STORAGES, KVStorage, check_storage
from minitransformer.kernels.attention_backend import KernelAttention
from minitransformer.quantize import quantize_int8
from minitransformer.serving.paged_cache import PagedKVCache


def vectors(seed: int = 0, shape=(2, 3, 5, 16)):
    """Keys-like float32 vectors (B, K, T, d) with one all-zero vector."""
    x = np.random.default_rng(seed).normal(size=shape).astype(np.float32) * 3
    x[0, 1, 2] = 0.0
    return x


@pytest.mark.parametrize("name", STORAGES)
def test_every_codec_stores_reads_back_float32_and_counts_its_bytes(tiny_model, name):
    """put / get round-trips through the codec (decode(encode(x)), float32 out), an unwritten slot reads 0.0, and the
    arrays hold exactly bytes_per_vector per (token, head): the formula and the allocation agree."""
    codec = check_storage(name)
    assert codec is CODECS[name] and codec.name == name and codec.help
    store = KVStorage((2, 2, 3, 6, 16), name)                               # (layers, B, K, slots, d)
    x = vectors()
    store.put(1, (slice(None), slice(None), slice(0, 5)), x, -x)
    k, v = store.get(1, (slice(None), slice(None), slice(0, 6)))
    assert k.dtype == v.dtype == np.float32 and k.shape == (2, 3, 6, 16)
    stored = codec.encode(x)
    expected = codec.decode(*stored) if codec.scaled else codec.decode(stored)
    np.testing.assert_array_equal(k[:, :, :5], expected)
    assert not k[:, :, 5].any() and not store.get(0, (slice(None),))[0].any()
    assert store.nbytes == 2 * 2 * 2 * 3 * 6 * codec.bytes_per_vector(16)
    config = tiny_model.config
    cache = KVCache(config, max_len=7, batch=2, storage=name)
    assert cache.codec is codec and cache.bytes_reserved == estimate_kv_bytes(config, 7, 2, storage=name)
    assert estimate_kv_bytes(config, 7, 2, storage=name) == 14 * kv_bytes_per_token(config, name)
    pool = PagedKVCache(config, num_blocks=3, block_size=4, storage=name)
    assert pool.codec is codec and pool.bytes_total == 3 * pool.bytes_per_block == 12 * kv_bytes_per_token(config, name)


def test_the_table_names_f32_first_and_int8_at_a_quarter_plus_a_scale():
    assert STORAGES[0] == "f32" and set(STORAGES) >= {"f32", "int8"}
    assert CODECS["f32"].bytes_per_vector(64) == 256 and CODECS["f32"].bytes_per_vector(64, np.float16) == 128
    assert CODECS["int8"].bytes_per_vector(64) == 68 and CODECS["int8"].bytes_per_vector(64, np.float16) == 68
    assert CODECS["f32"].raw and not CODECS["int8"].raw


def test_int8_codec_is_the_weights_int8_arithmetic_per_vector():
    """One int8: the KV codec on (..., d) vectors gives what quantize_int8 gives on the same rows as (out, in)."""
    x = vectors(1)
    q, scale = CODECS["int8"].encode(x)
    wq, wscale = quantize_int8(x.reshape(-1, 16))
    np.testing.assert_array_equal(q.reshape(-1, 16), wq)
    np.testing.assert_array_equal(scale.reshape(-1), wscale)
    assert q.dtype == np.int8 and np.abs(q).max() == INT8_MAX and scale[0, 1, 2] == 1.0


def test_an_unknown_name_is_refused_with_the_tables_names():
    with pytest.raises(InputError, match="kv_cache must be one of f32, int8, got 'fp8'"):
        check_storage("fp8")


def test_the_decode_kernel_reads_only_raw_pools(tiny_model):
    pools = {name: PagedKVCache(tiny_model.config, num_blocks=2, block_size=4, storage=name) for name in STORAGES}
    assert [KernelAttention().reads_pool(pool.codec) for pool in pools.values()] == [c.raw for c in CODECS.values()]
    assert not any(ArrayAttention().reads_pool(pool.codec) for pool in pools.values())


def test_the_cli_offers_the_table(capsys):
    """--kv-cache takes every name of the table and says each codec's help line."""
    from minitransformer.cli import build_parser
    for name in STORAGES:
        assert build_parser().parse_args(["generate", "hi", "--kv-cache", name]).kv_cache == name
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--kv-cache {" + ",".join(STORAGES) + "}" in help_text
    assert all(f"{c.name}: {c.help}" in help_text for c in CODECS.values())
