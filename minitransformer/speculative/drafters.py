"""The drafters: `propose(context, k, ...)` -> k guesses and the distributions they were drawn from (lesson 12).

NgramDrafter (prompt lookup, no model), SelfDrafter (the target's own first L layers, writing into its cache) and
SecondModelDrafter (a smaller model of the same vocabulary with its own cache); forward_first_layers is the cut-short
forward pass the self-drafter runs.
"""

from __future__ import annotations

import numpy as np

from ..kv_cache import KVCache
from ..layers import rms_norm, swiglu
from ..sampling import _inverse_cdf
from .acceptance import processed_probs
from .config import SpeculativeConfig


class NgramDrafter:
    """Prompt lookup: the last n context tokens matched earlier in the context; the k tokens after the most recent
    match are the guess. Costs no model pass, so any accepted token is pure gain."""

    def __init__(self, config: SpeculativeConfig):
        self.ngram_max, self.ngram_min = config.ngram_max, config.ngram_min

    def propose(self, context: list[int], k: int, params, prompt_len: int, eos_id):
        for n in range(min(self.ngram_max, len(context) - 1), self.ngram_min - 1, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):          # most recent occurrence first
                if context[start:start + n] == tail:
                    return context[start + n:start + n + k], None        # None: one-hot draft distributions
        return [], None


class ModelDrafter:
    """Drafting with a model, k tokens one at a time, with the request's own SamplingParams processing (so q is
    exactly the distribution each draft was drawn from) and its own random stream. A subclass says where the
    model's cache stands (`rewind(context) -> tokens already cached`) and how to run it (`forward(ids, start)`
    -> (1, V) logits after the last of `ids`, placed at positions start, start + 1, ...)."""

    def __init__(self, seed):
        self.generator = np.random.default_rng(None if seed is None else [seed, 1])   # not the target's stream

    def propose(self, context: list[int], k: int, params, prompt_len: int, eos_id):
        prompt, outputs = context[:prompt_len], list(context[prompt_len:])
        start = self.rewind(context)
        logits = self.forward(context[start:], start)                            # (1, V)
        drafts, qs = [], []
        for i in range(k):
            q = processed_probs(logits, params, prompt, outputs, eos_id)          # (V,); one-hot when greedy
            d = int(_inverse_cdf(q[None], [self.generator.random()])[0])         # drawn from q, as sample() draws
            drafts.append(d)
            qs.append(q)
            outputs.append(d)
            if i < k - 1:
                logits = self.forward([d], len(context) + i)
        return drafts, qs


class SelfDrafter(ModelDrafter):
    """The first L layers of the target itself, writing into the target cache's first L layers past its length."""

    def __init__(self, model, layers: int, cache: KVCache, seed):
        super().__init__(seed)
        self.model, self.layers, self.cache = model, layers, cache
        self.view = _FirstLayers(cache, layers)

    def rewind(self, context):
        self.view.length = self.cache.length        # verified tokens: K/V of layers < L are already the target's
        return self.cache.length

    def forward(self, ids, start):
        return forward_first_layers(self.model, ids, start, self.view, self.layers)


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

    def forward(self, ids, start):
        xp = self.draft.xp
        self.ids.extend(ids)
        positions = xp.arange(start, start + len(ids))[None]
        return self.draft.forward(xp.asarray(ids)[None], positions, kv=self.cache, last_only=True)   # (1, V)


class _FirstLayers:
    """The self-drafter's view of the target cache: layers < L, with its own length (the model's kv protocol)."""

    def __init__(self, cache: KVCache, layers: int):
        self.cache, self.layers, self.length = cache, layers, cache.length

    def update(self, layer, k_new, v_new, positions):
        c, start, end = self.cache, self.length, self.length + k_new.shape[2]
        c.k[layer, :, :, start:end] = k_new
        c.v[layer, :, :, start:end] = v_new
        if layer == self.layers - 1:
            self.length = end
        return c.k[layer, :, :, :end], c.v[layer, :, :, :end], c.key_positions[:, :end]


def forward_first_layers(model, ids: list[int], start: int, kv, layers: int):
    """model.forward cut after `layers` layers, then the shared final norm and lm_head.   T ids -> (1, V) logits
    of the last position. The same stages as Transformer.forward, in the same order, only fewer layers."""
    xp, eps = model.xp, model.config.norm_eps
    positions = xp.arange(start, start + len(ids))[None]                  # (1, T)
    h = model.embedding[xp.asarray(ids)]                                  # (T, D)
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]       # (1, T, d/2)
    for index, layer in enumerate(model.layers[:layers]):
        h = h + model.attention_block(index, layer, rms_norm(h, layer.attn_norm, eps), positions, cos, sin, kv)
        h = h + swiglu(rms_norm(h, layer.ffn_norm, eps), layer.w_gate_up, layer.w_down)
    return rms_norm(h[-1:], model.final_norm, eps) @ model.lm_head         # (1, V)
