"""The baseline with no KV cache: every step runs the whole sequence (prompt + everything generated) again.

It gives the same tokens as the cached loop (tests/test_generate.py checks it on the real model) — each step's
last-position logits are exactly what a cached decode computes — but step n costs a forward pass over n tokens, so
generating N tokens after a P-token prompt does about N*P + N^2/2 token-passes where the cache needs P + N.
Lesson 04_cache_vs_no_cache times both; `minitransformer generate --no-cache` and
`generate(..., runner=RecomputeRunner)` run it through core's loop (core/generate.py), every other stage unchanged:
it plugs in as the loop's runner (core.generate.Runner), in place of core's CachedRunner.
"""

from __future__ import annotations

from .core.errors import InputError


class RecomputeRunner:
    """Stands where core's CachedRunner stands (core.generate.Runner), but keeps token ids instead of keys and
    values. The class is itself the factory stream(runner=) takes: RecomputeRunner(model, request, kv_cache)."""

    def __init__(self, model, request, storage: str = "f32"):
        if storage != "f32":
            raise InputError(f"kv_cache={storage!r} chooses how the KV cache is stored; the recompute runner "
                             "(--no-cache) keeps no cache")
        self.model = model
        self.ids = list(request.prompt_token_ids)        # the whole sequence so far

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
        return state.sample(logits)              # plain sampling (core.request.RequestState)

    kv_tokens = 0                                # nothing is cached
    kv_bytes = 0

    def release(self) -> None:
        pass

    def report(self) -> None:
        return None
