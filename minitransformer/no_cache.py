"""The baseline with no KV cache: every step runs the whole sequence (prompt + everything generated) again.

It is correct — each step's last-position logits are what a cached decode computes (tests/test_model.py checks the
model's cache hook against recomputation) — but step n costs a forward over n tokens, so generating N tokens does
O(N^2) token-passes where a KV cache needs O(N). Until the cached loop exists, `minitransformer generate` uses this.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


def greedy_tokens_no_cache(model, prompt_ids: list[int], max_tokens: int,
                           stop_ids: tuple[int, ...] | None = None) -> Iterator[int]:
    """Yield up to `max_tokens` greedy tokens, recomputing the full sequence each step; stops after a stop id
    (default: the tokenizer's EOS), which is yielded. Ties go to the lowest token id (argmax's first maximum)."""
    if stop_ids is None:
        stop_ids = (model.tokenizer.eos_id,)
    ids = list(prompt_ids)
    for _ in range(max_tokens):
        positions = np.arange(len(ids))[None]                                  # (1, n)
        logits = model.forward(np.asarray(ids)[None], positions, last_only=True)   # (1, V): only the last row
        token = int(model.xp.argmax(logits[0]))
        yield token
        if token in stop_ids:
            return
        ids.append(token)
