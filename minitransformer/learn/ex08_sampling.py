"""Exercise 08: the sampling filters for one row: temperature, min_p, top_k, top_p, in the engine's order."""

from __future__ import annotations

import functools

import numpy as np

from ..core import sampling
from ..core.kv_cache import KVCache
from ..core.prefill import prefill
from ..core.sampling_params import SamplingParams
from .track import CheckFailed, Exercise, compare, plugged, random_inputs, real_model

V = 1000                                       # stage 1's vocabulary (the real one, 49152, runs in stage 2)
ENGINE_FILTERED_PROBS = sampling.filtered_probs   # the engine's own, kept: stage 2 plugs yours in its place


def filtered_probs_reference(logits, temperature, top_k, top_p, min_p):
    """core.sampling.filtered_probs on one row, the settings given as a SamplingParams.   (V,) -> (V,)."""
    params = SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p), min_p=float(min_p))
    return ENGINE_FILTERED_PROBS(np.asarray(logits, dtype=np.float32)[None], [params])[0]


# ------------------------------------------------------------------------------- the classic mistakes, on purpose

def _softmax(x):
    with np.errstate(invalid="ignore", divide="ignore"):       # a row with nothing kept is NaN, as a learner's is
        e = np.exp(x - x.max())
        return e / e.sum()


def _pipeline(logits, temperature, top_k, top_p, min_p, strict_top_p=False, top_p_first=False, min_p_absolute=False,
              temperature_last=False):
    """The filters with one thing (or none) done wrong."""
    if temperature < 1e-5:
        return np.eye(len(logits), dtype=np.float32)[int(np.argmax(logits))]
    scaled = logits if temperature_last else logits / temperature             # (V,)
    keep = np.ones(len(logits), dtype=bool)
    if min_p > 0:
        probs = _softmax(scaled)
        keep &= probs >= min_p * (1.0 if min_p_absolute else probs.max())

    def by_top_k(keep):
        if top_k > 0:
            masked = np.where(keep, scaled, -np.inf)
            keep = keep & (masked >= np.sort(masked)[::-1][min(top_k, len(logits)) - 1])
        return keep

    def by_top_p(keep):
        if top_p < 1:
            probs = _softmax(np.where(keep, scaled, -np.inf))
            order = np.argsort(-probs)
            cumulative = np.cumsum(probs[order])
            kept = cumulative < top_p if strict_top_p else cumulative - probs[order] < top_p
            keep = keep & np.isin(np.arange(len(logits)), order[kept])
        return keep

    keep = by_top_k(by_top_p(keep)) if top_p_first else by_top_p(by_top_k(keep))
    final = logits / temperature if temperature_last else scaled
    return _softmax(np.where(keep, final, -np.inf)).astype(np.float32)


MISTAKES = (
    ("top_p drops the token that crosses top_p (keeps only cumulative < top_p); the right set keeps every token "
     "whose preceding mass is < top_p, so the one that reaches top_p stays", functools.partial(_pipeline,
                                                                                         strict_top_p=True)),
    ("top_k is applied after top_p; the engine (as vLLM) applies top_k first and top_p over what top_k kept, "
     "renormalised", functools.partial(_pipeline, top_p_first=True)),
    ("min_p is compared with the absolute probability (p >= min_p); it is relative to the most likely token: "
     "p >= min_p x max(p)", functools.partial(_pipeline, min_p_absolute=True)),
    ("temperature is applied after the filters; it comes first, so min_p and top_p see the tempered distribution",
     functools.partial(_pipeline, temperature_last=True)),
)

CASES = (                                      # (temperature, top_k, top_p, min_p), what each one exercises
    ((1.0, 0, 1.0, 0.0), "no filter: a softmax"),
    ((0.7, 0, 0.9, 0.0), "temperature 0.7, top_p 0.9"),
    ((1.0, 0, 1.0, 0.1), "min_p 0.1"),
    ((1.0, 5, 0.8, 0.0), "top_k 5 and top_p 0.8"),
    ((0.5, -1, 1.0, 0.05), "temperature 0.5, min_p 0.05 (top_k -1: off)"),
    ((0.0, 0, 1.0, 0.0), "temperature 0: greedy"),
    ((1.3, 40, 0.95, 0.02), "temperature 1.3, top_k 40, top_p 0.95, min_p 0.02"),
)

PROMPT = "Once upon a time, there was a"
STAGE2 = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.02, seed=0)
DRAWS = 800


@functools.cache
def _next_logits(prompt: str):
    """The real model's logits (V,) of the token after `prompt`."""
    model = real_model()
    ids = model.tokenizer.encode(prompt)
    return np.asarray(prefill(model, ids, KVCache(model.config, len(ids))))[0]


def check(filtered_probs) -> list[str]:
    (logits,) = random_inputs(7, (V,), scale=2.0)                                   # (V,)
    for settings, what in CASES:
        compare(f"filtered_probs with {what} on random logits ({V},)", filtered_probs(logits, *settings),
                filtered_probs_reference(logits, *settings), (logits, *settings), MISTAKES, atol=1e-6, rtol=1e-4,
                axes=("token",))

    # stage 2: the engine's sampler draws DRAWS tokens from the real model's next-token logits with your filters
    logits = _next_logits(PROMPT)                                                   # (49152,)
    p = STAGE2
    expected = ENGINE_FILTERED_PROBS(logits[None], [p])[0]                        # (V,) the engine's own

    def rows(batch, params):                                                        # (S, V) -> (S, V), row by row
        return np.stack([filtered_probs(row, q.temperature, q.top_k, q.top_p, q.min_p) for row, q in
                         zip(batch, params)])

    generator = sampling.make_generator(p.seed)
    drawn = []
    with plugged(sampling, "filtered_probs", rows):
        for start in range(0, DRAWS, 100):
            n = min(100, DRAWS - start)
            batch = np.repeat(logits[None], n, axis=0)                              # (n, V)
            drawn += list(sampling.sample(batch, [p] * n, [generator] * n, [[]] * n, [[]] * n))
    counts = np.bincount(drawn, minlength=len(expected)) / DRAWS                    # (V,) frequencies
    decode = real_model().tokenizer.decode
    outside = [int(t) for t in np.unique(drawn) if expected[t] == 0]
    if outside:
        raise CheckFailed(f"the engine's sampler, with your filters, drew {decode([outside[0]])!r} (id {outside[0]}) "
                          f"after {PROMPT!r}: the engine's filters remove it (settings {_settings(p)})")
    support = expected > 0
    tv = 0.5 * float(np.abs(counts - expected).sum())
    # E[TV] <= 0.5 sum sqrt(p (1 - p) / N) (each frequency's standard deviation); 3x that is a generous bound
    bound = 3 * 0.5 * float(np.sqrt(expected[support] * (1 - expected[support]) / DRAWS).sum())
    if not tv < bound:
        raise CheckFailed(f"{DRAWS} draws after {PROMPT!r} with your filters ({_settings(p)}): total variation "
                          f"distance {tv:.3f} from the engine's distribution, above the bound {bound:.3f}")
    top = np.argsort(-expected)[:3]
    shown = ", ".join(f"{decode([int(t)])!r} {counts[t]:.2f} (engine {expected[t]:.2f})" for t in top)
    return [f"stage 1: your filtered_probs equals the engine's on {len(CASES)} settings over random logits ({V},)",
            f"stage 2: the engine's sampler drew {DRAWS} tokens (seed {p.seed}) after {PROMPT!r} from the real model's "
            f"49152 logits through your filters ({_settings(p)}, {int(support.sum())} tokens left): {shown}; total "
            f"variation distance {tv:.3f} < {bound:.3f} (3 x 0.5 sum sqrt(p(1-p)/N), N = {DRAWS})"]


def _settings(p: SamplingParams) -> str:
    return f"temperature {p.temperature}, top_k {p.top_k}, top_p {p.top_p}, min_p {p.min_p}"


EXERCISE = Exercise(
    number=8, name="sampling", title="Sampling: temperature, min_p, top_k, top_p",
    function="filtered_probs",
    solution="minitransformer/core/sampling.py: filtered_probs and _top_k_top_p_mask (the order is written in the "
             "module docstring; SamplingParams in core/sampling_params.py says what 0, -1 and 1.0 mean)",
    question="What do temperature, top-k, top-p and min-p each do to the next-token distribution, in which order "
             "does an engine apply them, and why does the order matter?",
    lesson="lessons/05_sampling.py (the candidate set and entropy each setting leaves)",
    hints=(
        "Order: divide by temperature first (temperature < 1e-5 means greedy: a one-hot at the argmax), then min_p, "
        "then top_k, then top_p; a removed token's logit becomes -inf, and one softmax at the end renormalises.",
        "min_p: softmax of the tempered logits; keep p >= min_p * p.max(). top_k (0 or -1: off): keep logits >= the "
        "k-th largest of what is left.",
        "top_p (1.0: off): softmax of what is left, sort descending, and keep a token while the mass BEFORE it is "
        "< top_p: cumsum(p) - p < top_p. The first token always stays.",
    ),
    check=check, reference=filtered_probs_reference, mistakes=MISTAKES,
)
