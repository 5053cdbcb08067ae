"""Exercise 06: the KV cache, append then attend.

Without a cache, each new token would recompute the keys and values of every token before it. The cache stores
them: each forward pass hands every layer its new tokens' keys and values (k_new, v_new), the layer stores them
after those already there, and its queries attend to everything stored. model.forward calls two methods:

    attend(layer, q, k_new, v_new, positions, attention)   once per layer of a pass (30 for SmolLM2)
    advance(T)                                             once after the pass: T more tokens are stored

Storage (given in __init__): self.k and self.v, (layers, batch, max_len, kv_heads, head_dim) = (30, 1, max_len, 3,
64) float32, tokens before heads (the engine's layout: a token's keys for all heads are one contiguous row);
self.length = tokens stored so far per sequence. The prompt is one pass of T tokens (prefill); each new token is
one pass of T = 1 (decode), at position self.length.

attend: q (B, 9, T, 64), k_new and v_new (B, 3, T, 64) (heads before tokens: transpose them into the token-major
store), positions (B, T) the new tokens' positions. Store k_new, v_new at slots [length, length + T) of `layer`, then
return attention.causal(q, k, v, positions, key_positions) -> (B, 9, T, 64), with k and v every stored key of that
layer, (B, 3, S, 64) for S = length + T (transposed back), and key_positions (B, S) = 0 .. S - 1 per row.
`attention` is the model's (attention.py's ArrayAttention): call it, do not write attention again.

Pitfalls: append before you attend (a token attends to itself); advance only in advance(), never in attend (attend
runs once per layer: 30 advances per pass); write at slot `length`, not at 0.

Check it: `minitransformer learn check kv_cache`. Stuck: `minitransformer learn hint kv_cache`.
"""

import numpy as np


class KVCache:
    def __init__(self, config, max_len, batch=1):
        shape = (config.n_layers, batch, max_len, config.n_kv_heads, config.head_dim)
        self.k = np.zeros(shape, np.float32)     # (layers, batch, max_len, kv_heads, head_dim)
        self.v = np.zeros(shape, np.float32)
        self.max_len, self.batch = max_len, batch
        self.length = 0                          # tokens stored per sequence (in every layer)

    def attend(self, layer, q, k_new, v_new, positions, attention):
        raise NotImplementedError("write attend")

    def advance(self, T):
        raise NotImplementedError("write advance")
