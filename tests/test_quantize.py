"""Quantization (minitransformer/quantize/) and its quality measures (quality.py).

References are independent of the code under test: round-trip bounds from the definition (error <= scale / 2 plus
float32 rounding of the arithmetic itself), bytes from the formats written out here by hand, a quantized model
against a float32 Transformer built from the dequantized matrices, perplexity from log-softmax written here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from minitransformer import KVCache, Transformer, estimate_kv_bytes
from minitransformer.core.errors import InputError
from minitransformer.core.kv_storage import CODECS
from minitransformer.core.model import LayerWeights
from minitransformer.core.prefill import prefill
from minitransformer.lab.quality import Scores, greedy, score_corpus, score_greedy, stdlib_corpus
from minitransformer.no_cache import RecomputeRunner
from minitransformer.quantize import (
    GROUP,
    QuantizedLinear,
    dequantize_int4,
    dequantize_int8,
    expected_weight_bytes,
    quantize_int4,
    quantize_int8,
    quantize_model,
    unpack_int4,
)

quantize_kv, dequantize_kv = CODECS["int8"].encode, CODECS["int8"].decode    # the int8 KV codec (kv_storage.py)

EPS32 = 2.0 ** -23


def weights(seed: int, rows: int, cols: int, outliers: bool = True) -> np.ndarray:
    """Gaussian weights with a few large outliers and one all-zero row (the cases that break naive scales)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.05, (rows, cols)).astype(np.float32)
    if outliers:
        w[rng.integers(0, rows, 5), rng.integers(0, cols, 5)] = rng.normal(0, 3, 5)
    w[0] = 0.0
    return w


# ------------------------------------------------------------------------------------------------ round trips

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 12), groups=st.integers(1, 6), offset=st.floats(-8, 8))
@example(seed=0, rows=1, groups=1, offset=1.401298464324817e-45)         # subnormal row: no scale can represent it
def test_int8_round_trip_error_is_at_most_half_a_step(seed, rows, groups, offset):
    w = weights(seed, rows, groups * GROUP) + np.float32(offset)
    q, scale = quantize_int8(w)
    assert q.dtype == np.int8 and scale.dtype == np.float32 and q.shape == w.shape and scale.shape == (rows,)
    assert np.abs(q).max() <= 127
    error = np.abs(w - dequantize_int8(q, scale))
    # |w/s - q| <= 1/2 exactly; float32 division and product add <= 127 * 2 ulp-relative: s/2 * (1 + 2^-15).
    assert (error <= scale[:, None] / 2 * (1 + 2.0 ** -15)).all()
    # The largest weight of each row uses the full range, wherever a float32 scale max/127 exists: a row of
    # subnormal weights (hypothesis found offset 1.4e-45 on the all-zero row) has none and quantizes to zeros.
    scalable = np.abs(w).max(axis=1) / np.float32(127) > 0
    assert (np.abs(q[scalable]).max(axis=1) == 127).all()


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 12), groups=st.integers(1, 6), offset=st.floats(-8, 8))
def test_int4_round_trip_error_is_at_most_half_a_step_per_group(seed, rows, groups, offset):
    w = weights(seed, rows, groups * GROUP) + np.float32(offset)
    packed, scale, low = quantize_int4(w)
    assert packed.dtype == np.uint8 and packed.shape == (rows, groups * GROUP // 2)
    assert scale.dtype == low.dtype == np.float16 and scale.shape == low.shape == (rows, groups)
    deq = dequantize_int4(packed, scale, low).reshape(rows, groups, GROUP)
    error = np.abs(w.reshape(rows, groups, GROUP) - deq)
    s, m = scale.astype(np.float32)[..., None], low.astype(np.float32)[..., None]
    # Exact arithmetic gives <= s/2; float32 rounding of (w - m) / s and of q * s + m adds a few ulp of |w| + |m|.
    bound = s / 2 + 4 * EPS32 * (np.abs(w.reshape(rows, groups, GROUP)) + np.abs(m) + 15 * s)
    assert (error <= bound).all()
    # The group's minimum is at or below its smallest weight and the top level reaches its largest one.
    groups_w = w.reshape(rows, groups, GROUP)
    assert (m[..., 0] <= groups_w.min(axis=2)).all()
    top = groups_w.max(axis=2)
    assert (m[..., 0] + 15 * s[..., 0] >= top - 4 * EPS32 * (np.abs(top) + np.abs(m[..., 0]))).all()


def test_int4_packs_two_values_per_byte_low_nibble_first():
    """Our packing: byte k holds value 2k (low nibble) and 2k + 1 (high); ggml's Q4_1 instead pairs j with j + 16."""
    levels = np.array([list(range(16)) + list(range(15, -1, -1))], dtype=np.float32)       # min 0, step 1
    packed, scale, low = quantize_int4(levels)
    assert float(scale[0, 0]) == 1.0 and float(low[0, 0]) == 0.0
    assert packed[0].tolist() == [0 | 1 << 4, 2 | 3 << 4, 4 | 5 << 4, 6 | 7 << 4, 8 | 9 << 4, 10 | 11 << 4,
                                  12 | 13 << 4, 14 | 15 << 4, 15 | 14 << 4, 13 | 12 << 4, 11 | 10 << 4, 9 | 8 << 4,
                                  7 | 6 << 4, 5 | 4 << 4, 3 | 2 << 4, 1 | 0 << 4]
    assert unpack_int4(packed)[0].tolist() == levels[0].astype(int).tolist()


def test_int4_refuses_rows_that_are_not_whole_groups():
    with pytest.raises(InputError, match="multiple of 32"):
        quantize_int4(np.zeros((2, 48), np.float32))


# --------------------------------------------------------------------------------------- the quantized matrix

@pytest.mark.parametrize("scheme", ["int8", "int4"])
@pytest.mark.parametrize("block_bytes", [1, 3 * 4 * 96, 1 << 20])   # one row per block, uneven blocks, one block
@pytest.mark.parametrize("n", [1, 5, 12])                           # decode sizes (int4: group dots) and a prompt
def test_matmul_by_row_blocks_equals_the_dequantized_matrix(scheme, block_bytes, n):
    w = weights(1, 37, 96)                                                                   # (out, in)
    lin = QuantizedLinear.from_float(w, scheme, block_bytes=block_bytes)
    x = np.random.default_rng(2).normal(size=(n, 96)).astype(np.float32)
    y = x @ lin                                                                              # via __rmatmul__
    reference = x.astype(np.float64) @ lin.dequantize().T.astype(np.float64)
    assert y.dtype == np.float32 and y.shape == (n, 37) and lin.shape == (96, 37)
    np.testing.assert_allclose(y, reference, rtol=1e-5, atol=1e-5)
    ids = np.array([3, 0, 36, 3])
    np.testing.assert_array_equal(lin[ids], lin.dequantize()[ids])                          # embedding lookup


def test_matmul_checks_the_shape():
    lin = QuantizedLinear.from_float(weights(0, 8, 64), "int8")
    with pytest.raises(InputError, match=r"\(N, 64\)"):
        np.zeros((2, 32), np.float32) @ lin


# ----------------------------------------------------------------------------------------- a quantized model

def independent_weight_bytes(c, scheme: str, embedding: str) -> int:
    """The formats' bytes written out again: int8 = 1 B per weight + a float32 per row; int4 = 1/2 B per weight
    + float16 scale and minimum per 32 weights."""
    def matrix(out, inp, s):
        return {"int8": out * inp + 4 * out, "int4": out * inp // 2 + 4 * out * inp // 32, "f32": 4 * out * inp}[s]
    qkv = c.n_heads * c.head_dim + 2 * c.n_kv_heads * c.head_dim
    layer = (matrix(qkv, c.d_model, scheme) + matrix(c.d_model, c.n_heads * c.head_dim, scheme)
             + matrix(2 * c.ffn_dim, c.d_model, scheme) + matrix(c.d_model, c.ffn_dim, scheme) + 8 * c.d_model)
    return c.n_layers * layer + matrix(c.vocab_size, c.d_model, embedding) + 4 * c.d_model


@pytest.mark.parametrize("scheme,embedding", [("int8", "int8"), ("int4", "int8"), ("int4", None), ("int8", "f32")])
def test_weight_memory_equals_the_computed_one(tiny_model, scheme, embedding):
    q = quantize_model(tiny_model, scheme, embedding=embedding)
    expected = independent_weight_bytes(tiny_model.config, scheme, embedding or scheme)
    assert q.weight_bytes == expected == expected_weight_bytes(tiny_model.config, scheme, embedding)
    assert tiny_model.weight_bytes == independent_weight_bytes(tiny_model.config, "f32", "f32")


def dequantized_twin(q: Transformer) -> Transformer:
    """A plain float32 Transformer holding the quantized model's dequantized matrices (the reference path)."""
    def f(w):
        return np.ascontiguousarray(w.dequantize().T)                                      # (in, out)
    layers = [LayerWeights(layer.attn_norm, f(layer.w_qkv), f(layer.wo), layer.ffn_norm, f(layer.w_gate_up),
                           f(layer.w_down)) for layer in q.layers]
    table = q.embedding.dequantize()
    return Transformer(q.config, q.tokenizer, table, layers, q.final_norm, table.T, np, "cpu")


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_model_equals_float_model_of_its_dequantized_weights(tiny_model, scheme):
    q = quantize_model(tiny_model, scheme, block_bytes=2048)
    ids = np.array([[5, 70, 3, 9, 120, 44]])
    pos = np.arange(6)[None]
    logits = q.forward(ids, pos)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, dequantized_twin(q).forward(ids, pos), rtol=1e-4, atol=1e-4)
    assert not np.allclose(logits, tiny_model.forward(ids, pos), atol=1e-6)   # really quantized ...
    assert q.layers[0].attn_norm is tiny_model.layers[0].attn_norm             # ... with the norms shared
    assert quantize_model(tiny_model, "f32") is tiny_model


# ---------------------------------------------------------------------------------------------- int8 KV cache

def test_kv_quantization_bound_per_token_and_head():
    x = np.random.default_rng(3).normal(size=(2, 3, 7, 16)).astype(np.float32) * 4           # (B, K, T, d)
    x[0, 1, 2] = 0.0
    q, scale = quantize_kv(x)
    assert q.dtype == np.int8 and scale.shape == (2, 3, 7)
    error = np.abs(x - dequantize_kv(q, scale))
    assert (error <= scale[..., None] / 2 * (1 + 2.0 ** -15)).all()
    assert np.array_equal(dequantize_kv(q, scale)[0, 1, 2], np.zeros(16))


def test_int8_cache_protocol_and_bytes(tiny_model):
    from minitransformer.core.attention import ArrayAttention
    from minitransformer.core.layers import causal_attention
    c = tiny_model.config
    cache = KVCache(c, max_len=12, batch=2, storage="int8")
    rng = np.random.default_rng(4)
    k1, v1 = (rng.normal(size=(2, c.n_kv_heads, 5, c.head_dim)).astype(np.float32) for _ in range(2))
    q = rng.normal(size=(2, c.n_heads, 5, c.head_dim)).astype(np.float32)
    positions = np.broadcast_to(np.arange(5), (2, 5))
    for layer in range(c.n_layers):
        out = cache.attend(layer, q, k1, v1, positions, ArrayAttention())
    cache.advance(5)
    k, v = (a.transpose(0, 2, 1, 3) for a in cache.store.get(0, (slice(None), slice(0, cache.length))))   # as attend
    assert cache.length == 5 and k.shape == (2, c.n_kv_heads, 5, c.head_dim) and k.dtype == np.float32
    kq, ks = quantize_kv(k1)
    np.testing.assert_array_equal(k, dequantize_kv(kq, ks))                   # attention sees what is stored
    np.testing.assert_array_equal(out, causal_attention(q, k, v, positions, positions))
    per_token_head = 2 * c.n_layers * 2 * c.n_kv_heads * (c.head_dim + 4)      # K and V, layers, batch 2
    assert cache.bytes_used == 5 * per_token_head == estimate_kv_bytes(c, 5, 2, storage="int8")
    assert cache.bytes_reserved == 12 * per_token_head
    f32 = KVCache(c, max_len=12, batch=2)
    assert f32.bytes_reserved / cache.bytes_reserved == 4 * c.head_dim / (c.head_dim + 4)
    with pytest.raises(InputError, match="full"):
        zeros = np.zeros((2, c.n_kv_heads, 8, c.head_dim), np.float32)
        cache.attend(0, np.zeros((2, c.n_heads, 8, c.head_dim), np.float32), zeros, zeros, None, ArrayAttention())
    cache.release()
    assert cache.bytes_reserved == 0


def test_int8_cache_decodes_like_its_own_prefill(tiny_model):
    """Prefill + 3 decode steps through an int8 KVCache give the logits of one prefill over all tokens through it:
    each step's keys are quantized once, when stored, whichever way they arrive."""
    ids = [5, 70, 3, 9, 120, 44, 7]
    cache = KVCache(tiny_model.config, len(ids), storage="int8")
    prefill(tiny_model, ids[:4], cache)
    stepped = [tiny_model.forward(np.array([[t]]), np.array([[cache.length]]), cache, last_only=True)
               for t in ids[4:]]
    whole = prefill(tiny_model, ids, KVCache(tiny_model.config, len(ids), storage="int8"), all_logits=True)[0]
    np.testing.assert_allclose(np.concatenate(stepped), whole[4:], rtol=1e-4, atol=1e-4)
    f32 = prefill(tiny_model, ids, KVCache(tiny_model.config, len(ids)), all_logits=True)[0]
    assert 0 < np.abs(whole - f32).max() < 0.01 * np.abs(f32).max()      # quantized, and within 1% of the scale



def test_generate_runs_on_the_int8_cache(tiny_model):
    """generate(kv_cache="int8") stores the request's keys in an int8 KVCache: its bytes are the int8 estimate, its
    tokens those of the same loop run directly on an int8 KVCache, and bad names or --no-cache are refused."""
    from minitransformer import SamplingParams, generate
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ids = [5, 70, 3, 9]
    out = generate(tiny_model, ids, params, kv_cache="int8")
    assert out.kv_cache_bytes == estimate_kv_bytes(tiny_model.config, out.kv_cache_tokens, storage="int8")
    cache = KVCache(tiny_model.config, len(ids) + 6, storage="int8")
    logits, expected = prefill(tiny_model, ids, cache), []
    for _ in range(6):
        expected.append(int(np.argmax(logits[0])))
        logits = tiny_model.forward(np.array([[expected[-1]]]), np.array([[cache.length]]), cache,
                                    last_only=True)
    assert out.token_ids == expected
    with pytest.raises(InputError, match="kv_cache must be one of f32, int8"):
        generate(tiny_model, ids, params, kv_cache="int4")
    with pytest.raises(InputError, match="keeps no cache"):
        generate(tiny_model, ids, params, kv_cache="int8", runner=RecomputeRunner)

# ------------------------------------------------------------------------------------------------- quality

def test_corpus_is_the_stdlib_docstrings_in_a_fixed_order():
    text = stdlib_corpus()
    assert 200_000 < len(text) < 600_000 and text == stdlib_corpus()
    assert text.startswith(__import__("abc").__doc__.strip()[:40])


def test_scores_against_an_independent_perplexity(tiny_model):
    ids = tiny_model.tokenizer.encode("the quick brown fox jumps over the lazy dog; " * 3)[:50]
    q = quantize_model(tiny_model, "int4")
    scores = score_corpus({"f32": (tiny_model, "f32"), "same": (tiny_model, "f32"), "int4": (q, "f32")}, ids, 20)
    nll, n = 0.0, 0
    for start in range(0, len(ids) - 1, 20):
        chunk = ids[start:start + 20]
        logits = tiny_model.forward(np.array([chunk]), np.arange(len(chunk))[None])[0].astype(np.float64)
        logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - \
            logits.max(1, keepdims=True)
        nll -= sum(logp[i, chunk[i + 1]] for i in range(len(chunk) - 1))
        n += len(chunk) - 1
    f32, same, int4 = scores["f32"], scores["same"], scores["int4"]
    assert f32.positions == n == len(ids) - math.ceil(len(ids) / 20)
    assert f32.perplexity == pytest.approx(math.exp(nll / n), rel=1e-9)
    assert same.perplexity == pytest.approx(f32.perplexity, rel=1e-5) and same.mean_kl < 1e-9
    assert f32.mean_kl == 0 and f32.top1_agreement == 1.0
    assert int4.mean_kl > 0 and int4.perplexity != f32.perplexity        # (small: the tiny model is Q4_1 already)


def test_greedy_agreement_and_decode_speed(tiny_model):
    prompts = [[5, 70, 3], [9, 120]]
    q = quantize_model(tiny_model, "int8")
    scores = {name: Scores() for name in ("f32", "again", "int8")}
    score_greedy({"f32": (tiny_model, "f32"), "again": (tiny_model, "f32"), "int8": (q, "int8")}, scores,
                 prompts, n=10)
    assert scores["f32"].greedy_agreement == scores["again"].greedy_agreement == 1.0
    assert scores["f32"].greedy_same == [10, 10] and scores["f32"].decode_tokens == 18
    own = [greedy(q, p, 10, "int8")[0] for p in prompts]
    ref = [greedy(tiny_model, p, 10)[0] for p in prompts]
    prefix = [next((j for j in range(10) if a[j] != b[j]), 10) for a, b in zip(own, ref)]
    assert scores["int8"].greedy_same == prefix
    assert scores["int8"].decode_tokens_per_s > 0
