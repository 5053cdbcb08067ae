"""Stage: decode — one new token per sequence, attending to the KV cache.

Only the newest token goes through the model: its K and V are appended to the cache and its query attends to all
stored keys. Each step reads every weight once to do arithmetic for a single row per sequence, so decode is bound by
memory bandwidth, not by arithmetic: at a short context the time per token is about (weight bytes + cache bytes) /
bandwidth. It is not flat in the context length: every stored position adds its keys and values to read and its
scores to compute and softmax, per head, and on the CPU the step time grows far faster than the cache's bytes alone
would say (figure itl_vs_context_length). Lessons 02_prefill_vs_decode and 04_cache_vs_no_cache measure both.
"""

from __future__ import annotations

from .kv_cache import KVCache


def decode_step(model, token_ids, cache: KVCache):
    """token_ids (B,): the last sampled token of each sequence -> logits (B, V) of the token after it."""
    xp = model.xp
    tokens = xp.asarray(token_ids).reshape(-1, 1)                         # (B, 1)
    positions = xp.full(tokens.shape, cache.length)                       # (B, 1): the next free slot
    return model.forward(tokens, positions, cache, last_only=True)
