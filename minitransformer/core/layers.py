"""The transformer's building blocks as pure functions over arrays (NumPy or CuPy, float32).

Each takes arrays and returns arrays; the shapes in and out are in the docstring. `model.py` wires them into a
decoder layer; notebook 01 calls them one by one on the real model to show the intermediate tensors.

Shape letters: B batch, T new tokens, S tokens attended to (cache + new), D d_model, H query heads,
K KV heads, G = H // K query heads per KV head, d head_dim, F FFN hidden size, V vocab.
"""

from __future__ import annotations

import math

import numpy as np

from .backend import DTYPE, array_module


def rms_norm(x, weight, eps: float):
    """RMSNorm: x / sqrt(mean(x^2) + eps) * weight.   x (..., D), weight (D,) -> (..., D)."""
    xp = array_module(x)
    # sum * (1/D) rather than .mean() (equal to within float32 rounding): mean() adds a Python-level wrapper,
    # paid 61 times per decode step. eps and 1/D are Python floats: the result stays float32.
    mean_square = (x * x).sum(axis=-1, keepdims=True) * (1.0 / x.shape[-1])   # (..., 1)
    return x / xp.sqrt(mean_square + eps) * weight


def rope_table(max_positions: int, head_dim: int, base: float, freq_factors=()):
    """cos and sin of every rotation angle, computed once at load time: two (max_positions, d/2) float32 arrays.

    Pair i of a head rotates by angle position * base^(-2i/d). The angles are computed in float64 on the host
    (position * frequency loses ~3 digits in float32 at position 8192) and stored as float32, so the forward pass
    only gathers rows: no float64 inside the model.
    freq_factors: Llama 3's d/2 numbers (ModelConfig.rope_freq_factors): pair i's angle is divided by factor i, which
    slows the low frequencies so positions past the original training context still turn less than a full circle.
    """
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)      # (d/2,)
    if len(freq_factors):
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)              # (d/2,)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (P, d/2)
    return np.cos(angles).astype(DTYPE), np.sin(angles).astype(DTYPE)


def apply_rope(x, cos, sin, pairing: str = "interleaved"):
    """Rotate each pair of dimensions by its angle.   x (B, heads, T, d); cos, sin (B, T, d/2).

    Which dimensions form pair i is the model's (ModelConfig.rope_pairing, from the architecture, as llama.cpp
    decides it): "interleaved" pairs (x[2i], x[2i+1]), "neox" pairs (x[i], x[i + d/2]) ("rotate half").
    Why llama is interleaved: llama.cpp's GGUF converter permutes the rows of its Q and K weights so that each
    rotated pair sits side by side (HF's llama checkpoints pair i with i + d/2). The wrong pairing on GGUF weights
    still answers " Paris" but its logits are off by up to 6: test logits, not words.
    """
    xp = array_module(x)
    B, n_heads, T, d = x.shape
    cos, sin = cos[:, None], sin[:, None]                        # (B, 1, T, d/2): same angle for every head
    if pairing == "neox":
        halves = x.reshape(B, n_heads, T, 2, d // 2)
        first, second = halves[..., 0, :], halves[..., 1, :]     # (B, heads, T, d/2) each
        rotated = xp.empty(halves.shape, dtype=x.dtype)          # (B, heads, T, 2, d/2)
        rotated[..., 0, :] = first * cos - second * sin
        rotated[..., 1, :] = first * sin + second * cos
        return rotated.reshape(B, n_heads, T, d)
    pairs = x.reshape(B, n_heads, T, d // 2, 2)
    even, odd = pairs[..., 0], pairs[..., 1]                     # (B, heads, T, d/2) each
    rotated = xp.empty(pairs.shape, dtype=x.dtype)               # (B, heads, T, d/2, 2): filled in place, not
    rotated[..., 0] = even * cos - odd * sin                     # built by xp.stack, which would allocate a
    rotated[..., 1] = even * sin + odd * cos                     # temporary for each half first
    return rotated.reshape(B, n_heads, T, d)


def softmax(x, axis: int = -1, in_place: bool = False):
    """Numerically stable softmax along `axis` (subtract the max; an all -inf row is not expected here).

    in_place=True overwrites x (a scratch array the caller owns): one array instead of three, so the scores of a
    long prompt pass through memory fewer times (NumPy's element-wise ops run on one core and are memory-bound).
    """
    xp = array_module(x)
    out = x if in_place else x.copy()
    out -= out.max(axis=axis, keepdims=True)
    xp.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)
    return out


def attention_probs(q, k, q_positions, k_positions, window: int = 0):
    """Causal grouped-query attention weights.

    q (B, H, T, d), k (B, K, S, d), q_positions (B, T), k_positions (B, S) -> probs (B, K, G, T, S).
    Query head h reads KV head h // G (G = H // K), so the G query heads of a group are stacked as rows of one
    matmul against their shared keys: the KV cache stores K heads, not H — the whole point of GQA (and of MQA, K = 1).
    A query at position p sees the keys at positions <= p (the causal mask, from positions, not from indices,
    so the same code serves a prompt, one decode step, or a chunk continuing a cache). Positions None: no mask,
    every key is visible (one decode query whose own key is the last, see causal_attention).
    window > 0 (a sliding layer, Gemma 3): only the keys in (p - window, p] are visible.
    """
    xp = array_module(q)
    B, H, T, d = q.shape
    K, S = k.shape[1], k.shape[2]
    G = H // K
    # The 1/sqrt(d) scale goes on q (T x d numbers) rather than on the scores (T x S): the same product, one pass
    # over a smaller array. A Python float keeps it float32 (no float64 promotion); for d = 64 it is exactly 1/8.
    q_grouped = q.reshape(B, K, G * T, d) * (1.0 / math.sqrt(d))            # rows ordered (g, t)
    scores = (q_grouped @ k.transpose(0, 1, 3, 2)).reshape(B, K, G, T, S)   # (B, K, G, T, S), a fresh array
    if q_positions is not None:
        hidden = k_positions[:, None, :] > q_positions[:, :, None]          # (B, T, S): keys in the future
        if window:
            hidden |= k_positions[:, None, :] <= q_positions[:, :, None] - window   # keys out of the window
        xp.copyto(scores, -xp.inf, where=hidden[:, None, None])             # in place, broadcast over K, G
    return softmax(scores, axis=-1, in_place=True)


def attention(q, k, v, q_positions, k_positions, window: int = 0):
    """softmax(q k^T / sqrt(d) + causal mask) v.   q (B, H, T, d), k and v (B, K, S, d) -> (B, H, T, d)."""
    B, H, T, d = q.shape
    K, S = k.shape[1], k.shape[2]
    probs = attention_probs(q, k, q_positions, k_positions, window)         # (B, K, G, T, S)
    out = probs.reshape(B, K, (H // K) * T, S) @ v                          # (B, K, G*T, d)
    return out.reshape(B, H, T, d)


QUERY_BLOCK = 64      # query rows per block in causal_attention


def causal_pairs(T: int, S: int, block: int = QUERY_BLOCK) -> int:
    """(query, key) pairs causal_attention computes for T queries that are the last T of S keys: all T x S in one
    masked product when T <= block, else each block of rows against the keys it can see (lab/machine.py's
    forward_cost counts attention's FLOPs with this)."""
    if T <= block:
        return T * S
    return sum((min(a + block, T) - a) * (S - T + min(a + block, T)) for a in range(0, T, block))


def causal_attention(q, k, v, q_positions, k_positions, block: int = QUERY_BLOCK, window: int = 0):
    """`attention` for queries that are the last T of the S keys, in order (a prompt, a prefill chunk continuing a
    cache, one decode step): the same numbers, computed `block` query rows at a time.

    Why: query row t can only see keys up to its own, S - T + t, so block [a, b) of rows reads the first S - T + b
    keys and skips the rest, which the causal mask would have zeroed: for a whole prompt that is about half the
    score matrix. And a block's scores, (B, K, G*block, <=S) floats, fit in the CPU's cache where the whole
    (B, K, G*T, S) matrix does not, so the softmax's passes stay out of DRAM (lesson 02 measures prefill speed).
    q (B, H, T, d), k and v (B, K, S, d) -> (B, H, T, d).
    window > 0 (a sliding layer): row t sees only the last `window` keys up to its own, so a block also skips the
    keys before the window of its first row, and a decode step reads only the last `window` keys.
    """
    xp = array_module(q)
    T, S = q.shape[2], k.shape[2]
    if T == 1:                                   # a decode step: its own key is the newest, all S are visible
        first = max(0, S - window) if window else 0                         # or the last `window` of them
        return attention(q, k[:, :, first:], v[:, :, first:], None, None)
    if T <= block:
        return attention(q, k, v, q_positions, k_positions, window)
    out = xp.empty_like(q)                                                  # (B, H, T, d)
    for a in range(0, T, block):
        b = min(a + block, T)
        seen = S - T + b                                                    # keys visible to rows < b
        first = max(0, S - T + a - window + 1) if window else 0             # keys before it: out of every window
        out[:, :, a:b] = attention(q[:, :, a:b], k[:, :, first:seen], v[:, :, first:seen],
                                   q_positions[:, a:b], k_positions[:, first:seen], window)
    return out


def silu(x):
    """x * sigmoid(x), written with tanh so that large negative x cannot overflow exp()."""
    xp = array_module(x)
    return x * (0.5 + 0.5 * xp.tanh(0.5 * x))


def gelu_tanh(x):
    """GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (Gemma's FFN activation,
    HF's "gelu_pytorch_tanh", llama.cpp's LLM_FFN_GELU)."""
    xp = array_module(x)
    return 0.5 * x * (1.0 + xp.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def swiglu(x, w_gate_up, w_down, activation=silu):
    """The llama feed-forward: down(silu(x @ gate) * (x @ up)), gate and up side by side in one matmul.
    Gemma's is the same with activation=gelu_tanh (GeGLU); ACTIVATION maps a config's name to the function.

    x (N, D), w_gate_up (D, 2F) = [gate | up], w_down (F, D) -> (N, D).
    """
    F = w_down.shape[0]
    gate_up = x @ w_gate_up                                                 # (N, 2F)
    return (activation(gate_up[:, :F]) * gate_up[:, F:]) @ w_down


ACTIVATION = {"silu": silu, "gelu_tanh": gelu_tanh}     # ModelConfig.activation -> the function
