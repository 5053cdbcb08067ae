"""Exercise 05: causal grouped-query attention, the one place where tokens read each other."""

from __future__ import annotations

import functools
import math

import numpy as np

from ..core import attention as attention_module, layers
from .track import (
    CheckFailed,
    Exercise,
    compare,
    greedy_ids,
    plugged,
    random_inputs,
    real_model,
    reference_ids,
    same_tokens,
)

H, K, D = 9, 3, 64                           # SmolLM2: query heads, KV heads, head_dim
PROMPT, TOKENS = "The capital of France is", 12


def _attend(q, k, v, q_positions, k_positions, *, scale: bool = True, tile: bool = False,
            hidden=lambda key, query: key > query, axis: int = -1, shift: bool = True):
    """Masked attention with one of its parts chosen (each deliberately wrong variant below changes one)."""
    heads_per_kv = q.shape[1] // k.shape[1]
    kv_head = np.arange(q.shape[1]) % k.shape[1] if tile else np.arange(q.shape[1]) // heads_per_kv   # (H,)
    k, v = k[:, kv_head], v[:, kv_head]                                     # (B, H, S, d) each
    scores = q @ k.transpose(0, 1, 3, 2)                                    # (B, H, T, S)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    masked = hidden(k_positions[:, None, :], q_positions[:, :, None])       # (B, T, S)
    scores = np.where(masked[:, None], -np.inf, scores)
    with np.errstate(invalid="ignore", over="ignore"):          # an all-masked row, or exp overflowing: as theirs
        weights = np.exp(scores - scores.max(axis=axis, keepdims=True) if shift else scores)
        weights = weights / weights.sum(axis=axis, keepdims=True)
    return weights @ v                                                      # (B, H, T, d)


MISTAKES = (
    ("the causal mask is off by one: a query cannot see its own key; key j is visible when k_pos <= q_pos",
     functools.partial(_attend, hidden=lambda key, query: key >= query)),
    ("the causal mask is off by one: a query also sees the next key; key j is visible when k_pos <= q_pos, "
     "not k_pos <= q_pos + 1", functools.partial(_attend, hidden=lambda key, query: key > query + 1)),
    ("the scores are not scaled by 1/sqrt(head_dim) = 1/8: softmax(q . k / sqrt(d))",
     functools.partial(_attend, scale=False)),
    ("the query heads are mapped to KV heads as h % 3 (np.tile); GQA groups neighbours: query head h reads KV "
     "head h // 3 (np.repeat)", functools.partial(_attend, tile=True)),
    ("the softmax runs over the queries (axis -2); each query's weights over the keys (the last axis) sum to 1",
     functools.partial(_attend, axis=-2)),
    ("the softmax does not subtract each row's largest score before exp: a score above 88 overflows float32 to inf "
     "and inf / inf is NaN; exp(s - max) gives the same weights without overflowing", functools.partial(_attend,
                                                                                                       shift=False)),
)


def check(attention) -> list[str]:
    # A chunk continuing a cache: 6 queries at positions 4..9 against 10 keys at 0..9; then a prompt, T = S = 5.
    q, k, v = random_inputs(4, (2, H, 6, D), (2, K, 10, D), (2, K, 10, D))
    cases = [("a chunk of 6 queries (positions 4..9) against 10 keys", q, k, v, 4),
             ("a prompt of 5 tokens (T = S)", q[:, :, :5], k[:, :, :5], v[:, :, :5], 0),
             ("the chunk with large scores (q x 40, scores up to ~150, as an outlier head's)", q * 40, k, v, 4)]
    for what, q, k, v, start in cases:
        T, S = q.shape[2], k.shape[2]
        q_positions = np.broadcast_to(np.arange(start, start + T), (2, T))     # (B, T)
        k_positions = np.broadcast_to(np.arange(S), (2, S))                    # (B, S)
        inputs = (q, k, v, q_positions, k_positions)
        out = attention(*inputs)                                               # (B, H, T, d)
        compare(f"attention on {what}, q (2, 9, {T}, 64), k and v (2, 3, {S}, 64)", out,
                layers.attention(*inputs), inputs, MISTAKES, axes=("batch", "head", "token", "i"),
                float32=True)
    calls = 0

    def adapter(q, k, v, q_positions, k_positions, block=layers.QUERY_BLOCK, window=0):
        """What ArrayAttention (and so every cache) calls: causal_attention's signature, answered by yours."""
        nonlocal calls
        if window:
            raise CheckFailed("a sliding-window layer reached your attention; this exercise runs SmolLM2, which "
                              "has none")
        calls += 1
        return attention(q, k, v, q_positions, k_positions)

    with plugged(attention_module, "causal_attention", adapter):
        got = greedy_ids(PROMPT, TOKENS)
    tokenizer = real_model().tokenizer
    same_tokens("the real model with your attention", got, list(reference_ids(PROMPT, TOKENS)), tokenizer.decode)
    if calls == 0:
        raise CheckFailed("the real model never called your attention: its attention is "
                          f"{real_model().attention.name!r}, not the arrays this exercise plugs into")
    return [f"your attention ran inside the real model {calls} times (30 layers x {calls // 30} forward passes: "
            f"the prompt's tokens attending to each other, then each new token to the KV cache) and gave "
            f"'{PROMPT}{tokenizer.decode(got)}', the reference's {TOKENS} tokens, token for token"]


EXERCISE = Exercise(
    number=5, name="attention", title="Causal grouped-query attention", function="attention",
    solution="minitransformer/core/layers.py: attention and attention_probs (causal_attention computes the same "
             "by blocks of queries; core/attention.py's ArrayAttention calls it for every cache)",
    question="Walk through causal self-attention with grouped KV heads: the shapes, the mask, the scale, and what "
             "GQA saves in the KV cache.",
    lesson="lessons/17_model_shape.py (MQA, GQA and MHA: the KV cache bytes per token); "
           "lessons/02_prefill_vs_decode.py",
    hints=(
        "Give every query head its KV head: np.repeat(k, 3, axis=1) makes k (B, 9, S, 64) with heads 0-2 reading "
        "KV head 0 (np.tile would give h % 3).",
        "scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(64): (B, 9, T, S). A Python float keeps float32; "
        "np.sqrt(64) is a float64 scalar and would make the result float64.",
        "Hidden keys: k_positions[:, None, :] > q_positions[:, :, None], (B, T, S); set their scores to -np.inf "
        "(np.where with the mask[:, None] broadcast over heads).",
        "Softmax over the last axis (subtract the row max first), then weights @ v -> (B, 9, T, 64).",
    ),
    check=check, reference=layers.attention, mistakes=MISTAKES,
)
