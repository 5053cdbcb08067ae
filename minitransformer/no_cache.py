"""The baseline with no KV cache: every step runs the whole sequence (prompt + everything generated) again.

It gives the same tokens as the cached loop (tests/test_generate.py checks it on the real model) — each step's
last-position logits are exactly what a cached decode computes — but step n costs a forward pass over n tokens, so
generating N tokens after a P-token prompt does about N*P + N^2/2 token-passes where the cache needs P + N.
Lesson 04_cache_vs_no_cache times both; `minitransformer generate --no-cache` and `generate(..., use_cache=False)`
run it through the same loop (generate.py) with every other stage unchanged.
"""

from __future__ import annotations


class RecomputeRunner:
    """Stands where generate.py's CachedRunner stands (generate.Runner), but keeps token ids instead of keys and
    values."""

    def __init__(self, model, prompt_ids: list[int]):
        self.model = model
        self.ids = list(prompt_ids)              # the whole sequence so far

    def first_logits(self):
        return self._last_logits()               # (1, V)

    def next_logits(self, token: int):
        self.ids.append(token)
        return self._last_logits()               # (1, V): a forward over all len(ids) tokens, every step

    def _last_logits(self):
        xp = self.model.xp
        n = len(self.ids)
        return self.model.forward(xp.asarray(self.ids)[None], xp.arange(n)[None], last_only=True)

    def sample_next(self, logits, state) -> int:
        return state.sample(logits)              # plain sampling (request.RequestState)

    kv_tokens = 0                                # nothing is cached
    kv_bytes = 0

    def release(self) -> None:
        pass

    def report(self) -> None:
        return None
