"""The building blocks against straightforward NumPy float64 formulas (tolerances: float32 rounding)."""

import numpy as np
import pytest

from minitransformer.core.layers import (
    apply_rope,
    attention,
    causal_attention,
    rms_norm,
    rope_table,
    silu,
    softmax,
    swiglu,
)

rng = np.random.default_rng(0)


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def test_rms_norm_matches_formula():
    x, w = f32(3, 7, 64), f32(64)
    expected = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * w
    out = rms_norm(x, w, 1e-5)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_rope_rotates_adjacent_pairs_and_keeps_norms():
    cos, sin = rope_table(32, 8, 10000.0)
    assert cos.dtype == np.float32 and cos.shape == (32, 4)
    x = f32(1, 2, 5, 8)
    positions = np.array([[0, 3, 7, 11, 31]])
    out = apply_rope(x, cos[positions], sin[positions])
    # adjacent pair (2i, 2i+1) as a complex number, multiplied by e^(i * pos * base^(-2i/d))
    z = x[..., 0::2].astype(np.float64) + 1j * x[..., 1::2]
    angle = positions[0][None, None, :, None] * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    rotated = z * np.exp(1j * angle)
    np.testing.assert_allclose(out[..., 0::2], rotated.real, atol=1e-5)
    np.testing.assert_allclose(out[..., 1::2], rotated.imag, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(out, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    np.testing.assert_array_equal(out[:, :, 0], x[:, :, 0])          # position 0: no rotation


def test_rope_makes_scores_depend_on_relative_position_only():
    cos, sin = rope_table(64, 16, 10000.0)
    q, k = f32(1, 1, 1, 16), f32(1, 1, 1, 16)

    def score(pq, pk):
        rq = apply_rope(q, cos[[[pq]]], sin[[[pq]]])
        rk = apply_rope(k, cos[[[pk]]], sin[[[pk]]])
        return float((rq * rk).sum())

    assert score(10, 4) == pytest.approx(score(40, 34), rel=1e-4)


def naive_attention(q, k, v, q_pos, k_pos):
    """Loop over every head and query; float64."""
    B, H, T, d = q.shape
    K = k.shape[1]
    out = np.zeros((B, H, T, d))
    for b in range(B):
        for h in range(H):
            kv = h // (H // K)
            for t in range(T):
                s = k[b, kv].astype(np.float64) @ q[b, h, t] / np.sqrt(d)
                s[k_pos[b] > q_pos[b, t]] = -np.inf
                p = np.exp(s - s.max())
                out[b, h, t] = (p / p.sum()) @ v[b, kv]
    return out


@pytest.mark.parametrize("T,S", [(5, 5), (1, 9), (3, 8)])
def test_grouped_query_causal_attention(T, S):
    B, H, K, d = 2, 6, 2, 8
    q, k, v = f32(B, H, T, d), f32(B, K, S, d), f32(B, K, S, d)
    k_pos = np.tile(np.arange(S), (B, 1))
    q_pos = k_pos[:, S - T:]                         # the newest T positions: a prompt, a decode step or a chunk
    out = attention(q, k, v, q_pos, k_pos)
    assert out.dtype == np.float32 and out.shape == (B, H, T, d)
    np.testing.assert_allclose(out, naive_attention(q, k, v, q_pos, k_pos), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("T,S,block", [(1, 40, 4), (12, 12, 4), (13, 13, 4), (7, 30, 3), (9, 20, 16)])
def test_causal_attention_in_blocks_equals_attention(T, S, block):
    """Blocks of query rows reading only the keys up to their last row == the whole masked product: a prompt
    (T == S, ragged last block), a chunk continuing a cache (T < S), a decode step (T == 1, no mask at all)."""
    B, H, K, d = 2, 6, 2, 8
    q, k, v = f32(B, H, T, d), f32(B, K, S, d), f32(B, K, S, d)
    k_pos = np.tile(np.arange(S), (B, 1)) + np.array([[0], [5]])       # row 1 starts at position 5
    q_pos = k_pos[:, S - T:]
    out = causal_attention(q, k, v, q_pos, k_pos, block=block)
    assert out.dtype == np.float32 and out.shape == (B, H, T, d)
    np.testing.assert_allclose(out, attention(q, k, v, q_pos, k_pos), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out, naive_attention(q, k, v, q_pos, k_pos), rtol=1e-4, atol=1e-5)


def test_softmax_in_place_overwrites_its_input_only_when_asked():
    x = f32(3, 7)
    original = x.copy()
    probs = softmax(x)
    np.testing.assert_array_equal(x, original)       # the default leaves its input alone
    same = softmax(x, in_place=True)
    assert same is x                                  # in place: the input array now holds the probabilities
    np.testing.assert_array_equal(same, probs)
    np.testing.assert_allclose(same.sum(-1), 1.0, rtol=1e-6)


def test_softmax_and_silu():
    x = f32(4, 10, scale=30.0)
    p = softmax(x)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-6)
    big = np.array([-1000.0, -20.0, 0.0, 20.0, 1000.0], dtype=np.float32)
    with np.errstate(all="raise"):                   # no overflow warnings for large |x|
        s = silu(big)
    with np.errstate(over="ignore"):                 # the float64 reference itself overflows at -1000
        expected = big / (1 + np.exp(-big.astype(np.float64)))
    np.testing.assert_allclose(s, expected, atol=1e-5)


def test_swiglu_matches_formula():
    x, wg, wu, wd = f32(5, 16), f32(16, 32), f32(16, 32), f32(32, 16)
    x64 = x.astype(np.float64)
    g = x64 @ wg
    expected = (g / (1 + np.exp(-g)) * (x64 @ wu)) @ wd
    np.testing.assert_allclose(swiglu(x, np.concatenate([wg, wu], axis=1), wd), expected, rtol=1e-4, atol=1e-4)
