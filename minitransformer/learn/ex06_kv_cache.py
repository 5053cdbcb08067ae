"""Exercise 06: the KV cache's append and attend, the protocol model.forward calls on every layer of every pass.

The learner's class takes the engine KVCache's own constructor (config, max_len, batch), so the reference is
core/kv_cache.py's KVCache itself; stage 2 plugs the class into the loop through a runner factory
(core.generate.stream(runner=...)), the seam the no-cache and speculative runners use too.
"""

from __future__ import annotations

import functools

import numpy as np

from ..core.attention import ArrayAttention
from ..core.generate import CachedRunner
from ..core.kv_cache import KVCache
from .track import CheckFailed, Exercise, compare, greedy_ids, random_inputs, real_model, reference_ids, same_tokens

B, H, K, D = 2, 9, 3, 64                     # two sequences; SmolLM2's query heads, KV heads, head_dim
LAYERS, MAX_LEN = 2, 32                      # stage 1 runs two layers of each pass (of the config's 30)
PASSES = (5, 1, 1, 1)                        # a prompt of 5 tokens, then three decode steps
PROMPT, TOKENS = "The capital of France is", 12


# ------------------------------------------------------------------------- deliberately wrong caches

class _Cache:
    """The learner's storage (exercises/05_kv_cache.py's __init__), for the wrong variants below."""

    def __init__(self, config, max_len, batch=1):
        shape = (config.n_layers, batch, max_len, config.n_kv_heads, config.head_dim)
        self.k, self.v = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.max_len, self.batch, self.length = max_len, batch, 0

    def _store(self, layer, start, k_new, v_new):
        T = k_new.shape[2]
        self.k[layer, :, start:start + T] = k_new.transpose(0, 2, 1, 3)
        self.v[layer, :, start:start + T] = v_new.transpose(0, 2, 1, 3)

    def _attend_to(self, layer, end, q, positions, attention):
        k, v = self.k[layer, :, :end].transpose(0, 2, 1, 3), self.v[layer, :, :end].transpose(0, 2, 1, 3)
        return attention.causal(q, k, v, positions, np.broadcast_to(np.arange(end), (q.shape[0], end)))

    def advance(self, T):
        self.length += T


class _AttendsBeforeAppending(_Cache):
    def attend(self, layer, q, k_new, v_new, positions, attention):
        out = self._attend_to(layer, self.length, q, positions, attention)
        self._store(layer, self.length, k_new, v_new)
        return out


class _AdvancesInAttend(_Cache):
    def attend(self, layer, q, k_new, v_new, positions, attention):
        self._store(layer, self.length, k_new, v_new)
        out = self._attend_to(layer, self.length + k_new.shape[2], q, positions, attention)
        self.length += k_new.shape[2]
        return out

    def advance(self, T):
        pass


class _WritesAtZero(_Cache):
    def attend(self, layer, q, k_new, v_new, positions, attention):
        self._store(layer, 0, k_new, v_new)
        return self._attend_to(layer, self.length + k_new.shape[2], q, positions, attention)


MISTAKES = (
    ("attend reads the cache before this pass's keys are stored: a token cannot see itself (and a prompt sees "
     "nothing). Store k_new, v_new first, then attend to [0, length + T)", _AttendsBeforeAppending),
    ("length moves on inside attend, once per layer, so each layer writes further along and positions drift; "
     "attend stores at [length, length + T) without changing length, and advance(T) moves it once per pass",
     _AdvancesInAttend),
    ("every pass writes at slot 0, over the first tokens' keys; write at slots [length, length + T)", _WritesAtZero),
)


# ------------------------------------------------------------------------------------------ the check

def _passes() -> list[list[tuple[np.ndarray, ...]]]:
    """For each pass, each layer's q (B, H, T, d), k_new and v_new (B, K, T, d)."""
    return [[tuple(random_inputs(10 * p + layer, (B, H, T, D), (B, K, T, D), (B, K, T, D)))
             for layer in range(LAYERS)] for p, T in enumerate(PASSES)]


def _run(cache_class, passes) -> tuple[np.ndarray, int]:
    """Every attend's output, (LAYERS, B, H, tokens, d) with the passes' tokens in order, and the final length."""
    cache = cache_class(real_model().config, MAX_LEN, B)
    attention, start = ArrayAttention(), 0
    outputs: list[list[np.ndarray]] = [[] for _ in range(LAYERS)]   # per layer, each pass's (B, H, T, d)
    for layers_inputs in passes:
        T = layers_inputs[0][0].shape[2]
        positions = np.broadcast_to(np.arange(start, start + T), (B, T))      # (B, T): what prefill/decode pass
        for layer, (q, k_new, v_new) in enumerate(layers_inputs):
            outputs[layer].append(np.asarray(cache.attend(layer, q, k_new, v_new, positions, attention)))
        cache.advance(T)
        start += T
    return np.stack([np.concatenate(o, axis=2) for o in outputs]), cache.length


def _outputs_of(cache_class):
    return lambda passes: _run(cache_class, passes)[0]


def _raising_mistake(exc: Exception, passes) -> str:
    """The label of the mistake that raises the same exception as the learner's cache did, else ''."""
    for label, wrong in MISTAKES:
        try:
            _run(wrong, passes)
        except Exception as theirs:
            if type(theirs) is type(exc) and str(theirs) == str(exc):
                return label
    return ""


class _Runner(CachedRunner):
    """CachedRunner with the learner's cache class instead of the engine's KVCache."""

    def __init__(self, model, request, storage: str = "f32", *, cache_class, runners: list):
        self.model, self.prompt_ids = model, request.prompt_token_ids
        self.cache = cache_class(model.config, len(self.prompt_ids) + request.params.max_tokens)
        runners.append(self)

    @property
    def kv_bytes(self) -> int:
        return int(self.cache.k.nbytes + self.cache.v.nbytes)

    def release(self) -> None:
        """The learner's cache has nothing to free; its arrays go with it."""


def check(cache_class) -> list[str]:
    passes = _passes()
    expected, _ = _run(KVCache, passes)
    try:
        got, length = _run(cache_class, passes)
    except CheckFailed:
        raise
    except Exception as exc:
        label = _raising_mistake(exc, passes)
        if not label:
            raise
        raise CheckFailed(f"your KVCache raised {type(exc).__name__}: {exc}, on a prompt of 5 tokens. "
                          f"Likely mistake: {label}") from None
    mistakes = [(label, _outputs_of(wrong)) for label, wrong in MISTAKES]
    compare("the attend outputs of 2 layers over a prompt of 5 tokens then 3 decode steps (B = 2)", got, expected,
            (passes,), mistakes, axes=("layer", "batch", "head", "token", "i"))
    if length != sum(PASSES):
        raise CheckFailed(f"after a pass of 5 tokens and 3 of one, your cache's length is {length}, not "
                          f"{sum(PASSES)}: advance(T) adds T once per pass")
    runners: list = []
    factory = functools.partial(_Runner, cache_class=cache_class, runners=runners)
    got_ids = greedy_ids(PROMPT, TOKENS, runner=factory)
    tokenizer = real_model().tokenizer
    same_tokens("the real model with your KVCache", got_ids, list(reference_ids(PROMPT, TOKENS)), tokenizer.decode)
    prompt_tokens = len(runners[0].prompt_ids)
    return [f"your KVCache served the real model's loop: a prefill of the {prompt_tokens}-token prompt, then "
            f"{TOKENS - 1} decode steps each attending to the cache in 30 layers, gave "
            f"'{PROMPT}{tokenizer.decode(got_ids)}', the reference's {TOKENS} tokens, token for token; it held "
            f"{runners[0].cache.length} tokens at the end (the last new token is sampled, never fed back)"]


EXERCISE = Exercise(
    number=6, name="kv_cache", title="The KV cache (append, then attend)", function="KVCache",
    solution="minitransformer/core/kv_cache.py: KVCache.attend and KVCache.advance (model.forward calls them)",
    question="What does the KV cache store, how much memory does it take per token, and why does decode read it "
             "instead of recomputing?",
    lesson="lessons/03_kv_cache_growth.py; lessons/04_cache_vs_no_cache.py",
    hints=(
        "attend: T = k_new.shape[2]; store k_new.transpose(0, 2, 1, 3) (B, T, 3, 64) into self.k[layer, :, "
        "self.length:self.length + T], the same for v.",
        "Then S = self.length + T; k = self.k[layer, :, :S].transpose(0, 2, 1, 3) is (B, 3, S, 64); key_positions "
        "= np.broadcast_to(np.arange(S), (self.batch, S)).",
        "return attention.causal(q, k, v, positions, key_positions). advance(T): self.length += T, nothing else.",
    ),
    check=check, reference=KVCache, mistakes=MISTAKES,
)
