"""Exercise 05: causal attention with grouped KV heads (GQA).

Each query looks at the keys it may see, weighs them by softmax(q . k / sqrt(d)), and returns the weighted sum of
their values. Two rules decide what it may see and with which keys:

- causal: a token attends to itself and to the tokens before it, never after. The mask is by position, not by
  index: key j is visible to query t when k_positions[b, j] <= q_positions[b, t]. That way one function serves a
  whole prompt (T = S), a chunk continuing the cache (T < S) and one decode step (T = 1).
- grouped-query attention: SmolLM2 has 9 query heads but only 3 KV heads (the KV cache stores 3). Query heads are
  split into 3 groups of G = 9 / 3 = 3 neighbours: query head h reads KV head h // G (heads 0-2 read KV head 0,
  heads 3-5 KV head 1, heads 6-8 KV head 2).

    out[b, h, t] = sum_j softmax_j(q[b, h, t] . k[b, h // G, j] / sqrt(d), masked) * v[b, h // G, j]

Shapes: q (B, 9, T, 64), k and v (B, 3, S, 64) float32, q_positions (B, T), k_positions (B, S) integers.
Returns (B, 9, T, 64).

Pitfalls: the mask's <= (a token sees its own key); the 1/sqrt(d) = 1/8 scale; the head mapping (np.repeat, not
np.tile); the softmax over the keys (the last axis of the scores), with the masked scores at -inf before it; the
result stays float32 (divide by math.sqrt(64), a Python float: np.sqrt(64) is a float64 scalar, which NumPy 2 lets
promote the whole array, and then every layer after yours).

Check it: `minitransformer learn check attention`. Stuck: `minitransformer learn hint attention`.
"""

import math  # noqa: F401  (you will want them)

import numpy as np  # noqa: F401


def attention(q, k, v, q_positions, k_positions):
    raise NotImplementedError("write attention")
