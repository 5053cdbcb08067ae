"""Stage: prefill — the whole prompt through the model in one pass, filling the KV cache.

All T prompt tokens go through each layer together: every weight matrix is read once and multiplied by T rows, so
prefill does a lot of arithmetic per byte of weights read (compute-bound). Its output is the logits of the last
position, from which the first new token is sampled; the time until then is most of the time to first token (TTFT).
Lesson 02_prefill_vs_decode measures it against decode.
"""

from __future__ import annotations

from .errors import InputError
from .kv_cache import KVCache


def prefill(model, prompt_ids, cache: KVCache, all_logits: bool = False):
    """Run the prompt, append its keys/values to `cache`, and return the next token's logits.

    prompt_ids: a list of ids (one sequence) or (B, T) for a batch of same-length prompts.
    -> logits (B, V) for the last position, or (B, T, V) for every position when all_logits (prompt logprobs).
    """
    xp = model.xp
    token_ids = xp.asarray(prompt_ids)
    if token_ids.ndim == 1:
        token_ids = token_ids[None]                                        # (1, T)
    B, T = token_ids.shape
    if cache.batch != B:
        raise InputError(f"the cache holds {cache.batch} sequences but {B} prompts were given")
    start = cache.length                                                   # 0 for a fresh cache
    positions = xp.broadcast_to(xp.arange(start, start + T), (B, T))       # (B, T)
    return model.forward(token_ids, positions, cache, last_only=not all_logits)
