"""The drafters: `propose(context, k, ...)` -> k guesses and the distributions they were drawn from (lesson 12).

NgramDrafter (prompt lookup, no model), SelfDrafter (the target's own first L layers, writing into its cache: the
model's forward with layers=L) and SecondModelDrafter (a smaller model of the same vocabulary with its own cache).
`Drafter` is what the runner needs of any of them; `make_drafter` picks one for a SpeculativeConfig.

With structured output every drafter guesses inside the constraint (structured.Constraint), since a guess that
breaks it is certain to be rejected and only wastes a verify row: the n-gram guess is cut at the first token the
constraint refuses (valid_prefix), a model drafter draws each guess under the mask of a fork of the matcher advanced
through the guesses before it. q is then the masked distribution, the one the guess was really drawn from, so
speculative sampling still yields exactly plain constrained sampling's distribution.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

import numpy as np

from ..core.errors import InputError
from ..core.kv_cache import KVCache
from ..core.sampling import draw_from
from ..structured import Constraint
from .acceptance import processed_probs
from .config import SpeculativeConfig


class Drafter(Protocol):
    """What SpeculativeRunner asks of a drafter. propose: up to k guesses after `context` (prompt_len of its tokens
    are the prompt) and, per guess, the distribution q (V,) it was drawn from under `params`, or None when every
    guess is a certainty (one-hot q, as n-gram lookup's); every guess inside `constraint` (the request's structured
    output matcher, standing at the end of context; None: unconstrained), which it never advances.
    release: give back what it holds (a cache of its own)."""

    def propose(self, context: list[int], k: int, params, prompt_len: int, eos_id,
                constraint: Constraint | None = None) -> tuple[list[int], list | None]: ...

    def release(self) -> None: ...


def make_drafter(model, config: SpeculativeConfig, cache: KVCache, max_len: int, seed) -> Drafter:
    """The drafter config.method names; cache is the target's (SelfDrafter writes into it), max_len the request's
    prompt + max_tokens, seed the request's (a model drafter draws from a stream of its own derived from it)."""
    if config.method == "ngram":
        return NgramDrafter(config)
    if config.method == "self":
        return SelfDrafter(model, config.layers, cache, seed)
    draft = config.draft
    assert draft is not None, "make_config gives every 'model' config its draft model"
    if max_len > draft.config.context_length:
        raise InputError(f"prompt + max_tokens = {max_len} exceeds the draft model's context length of "
                         f"{draft.config.context_length} tokens")
    return SecondModelDrafter(draft, max_len, seed)


class NgramDrafter:
    """Prompt lookup: the last n context tokens matched earlier in the context; the k tokens after the most recent
    match are the guess. Costs no model pass, so any accepted token is pure gain."""

    def __init__(self, config: SpeculativeConfig):
        self.ngram_max, self.ngram_min = config.ngram_max, config.ngram_min

    def propose(self, context: list[int], k: int, params, prompt_len: int, eos_id,
                constraint: Constraint | None = None):
        drafts = self.lookup(context, k)
        if constraint is not None:
            drafts = drafts[:constraint.valid_prefix(drafts)]           # a guess past it could only be rejected
        return drafts, None                                              # None: one-hot draft distributions

    def lookup(self, context: list[int], k: int) -> list[int]:
        """The k tokens after the most recent earlier occurrence of the context's last n tokens (longest n first)."""
        for n in range(min(self.ngram_max, len(context) - 1), self.ngram_min - 1, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):          # most recent occurrence first
                if context[start:start + n] == tail:
                    return context[start + n:start + n + k]
        return []

    def release(self) -> None:
        pass                                        # it holds nothing


class ModelDrafter(ABC):
    """Drafting with a model, k tokens one at a time, with the request's own SamplingParams processing (so q is
    exactly the distribution each draft was drawn from) and its own random stream. A subclass says where the
    model's cache stands (`rewind(context) -> tokens already cached`) and how to run it (`forward(ids, start)`
    -> (1, V) logits after the last of `ids`, placed at positions start, start + 1, ...)."""

    def __init__(self, seed):
        self.generator = np.random.default_rng(None if seed is None else [seed, 1])   # not the target's stream

    def propose(self, context: list[int], k: int, params, prompt_len: int, eos_id,
                constraint: Constraint | None = None):
        prompt, outputs = context[:prompt_len], list(context[prompt_len:])
        ahead = None if constraint is None else constraint.fork()               # the matcher, advanced by guesses
        start = self.rewind(context)
        logits = self.forward(context[start:], start)                            # (1, V)
        drafts, qs = [], []
        for i in range(k):
            q = processed_probs(logits, params, prompt, outputs, eos_id, ahead)   # (V,); one-hot when greedy
            d = draw_from(q, self.generator)                                     # drawn from q, as sample() draws
            drafts.append(d)
            qs.append(q)
            outputs.append(d)
            if ahead is not None:
                ahead.accept(d)
                if ahead.complete:           # nothing but EOS could follow: the request stops at this token
                    break
            if i < k - 1:
                logits = self.forward([d], len(context) + i)
        return drafts, qs

    @abstractmethod
    def rewind(self, context: list[int]) -> int:
        """Make the model's cache hold a prefix of `context` (at least one token left to feed); its length."""

    @abstractmethod
    def forward(self, ids: list[int], start: int):
        """(1, V) logits after the last of `ids`, placed at positions start, start + 1, ..."""


class SelfDrafter(ModelDrafter):
    """The first L layers of the target itself, writing into the target cache's first L layers past its length.

    Its keys and values for layers < L are exactly the target's, so it needs no cache of its own: it writes its
    drafts' K/V past the verified length (in whatever storage the cache has), and gives the length back when done;
    the verify pass then overwrites those slots in every layer.
    """

    def __init__(self, model, layers: int, cache: KVCache, seed):
        super().__init__(seed)
        self.model, self.layers, self.cache = model, layers, cache

    def propose(self, context: list[int], k: int, params, prompt_len: int, eos_id,
                constraint: Constraint | None = None):
        verified = self.cache.length
        try:
            return super().propose(context, k, params, prompt_len, eos_id, constraint)
        finally:
            self.cache.truncate(verified)           # the cache as it was: only verified tokens count

    def rewind(self, context):
        return self.cache.length                    # verified tokens: K/V of layers < L are already the target's

    def release(self) -> None:
        pass                                        # the cache is the target's: the runner releases it

    def forward(self, ids, start):
        xp = self.model.xp
        positions = xp.arange(start, start + len(ids))[None]                            # (1, T)
        return self.model.forward(xp.asarray(ids)[None], positions, self.cache, layers=self.layers,
                                  last_only=True)                                        # (1, V)


class SecondModelDrafter(ModelDrafter):
    """A separate, smaller model of the same vocabulary, with its own KV cache."""

    def __init__(self, draft, max_len: int, seed):
        super().__init__(seed)
        self.draft = draft
        self.cache = KVCache(draft.config, max_len, xp=draft.xp)
        self.ids: list[int] = []                    # the tokens whose K/V self.cache holds

    def rewind(self, context):
        """Keep the longest cached prefix that is still the context (at least one token left to feed)."""
        keep = 0
        limit = min(len(self.ids), len(context) - 1)
        while keep < limit and self.ids[keep] == context[keep]:
            keep += 1
        self.cache.truncate(keep)
        self.ids = self.ids[:keep]
        return keep

    def release(self) -> None:
        self.cache.release()

    def forward(self, ids, start):
        xp = self.draft.xp
        self.ids.extend(ids)
        positions = xp.arange(start, start + len(ids))[None]
        return self.draft.forward(xp.asarray(ids)[None], positions, self.cache, last_only=True)   # (1, V)
