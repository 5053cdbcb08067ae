"""Exercise 13: speculative verification of one row (speculative/acceptance.py's accept_or_resample)."""

from __future__ import annotations

import functools

import numpy as np

from ..core.generate import generate
from ..core.sampling import draw_from
from ..core.sampling_params import SamplingParams
from ..speculative import acceptance, runner
from .track import CheckFailed, Exercise, compare, greedy_ids, likely_mistake, plugged, real_model, same_tokens

VOCAB = 12                   # a small vocabulary for stage 1, so frequencies are measurable
TRIALS = 3000
BOUND = 0.03                 # |frequency - p| per token over TRIALS draws (about 4 standard deviations at p = 0.5)
PROMPT = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3,"     # repeats: the n-gram drafter has guesses
MAX_TOKENS, K = 10, 4
ENGINE_ACCEPT = acceptance.accept_or_resample


def _reversed(p, q, draft, generator):
    p_d = 1.0 if q is None else float(q[draft])
    if generator.random() * float(p[draft]) < p_d:          # accepts with probability q/p
        return draft
    residual = np.maximum(p - q, 0.0) if q is not None else np.where(np.arange(len(p)) == draft, 0.0, p)
    return draw_from(residual if residual.sum() > 0 else p, generator)


def _resample_from_p(p, q, draft, generator):
    q_d = 1.0 if q is None else float(q[draft])
    if generator.random() * q_d < float(p[draft]):
        return draft
    return draw_from(p, generator)


def _keep_rejected(p, q, draft, generator):
    generator.random()
    return draft


MISTAKES = (
    ("a rejected draft is kept: when the test fails the token is the target's own (greedy: its argmax, the "
     "correction), and the pass ends there", _keep_rejected),
    ("p and q are swapped in the test: keep the draft with probability min(1, p[draft] / q[draft]), the target's "
     "probability over the drafter's", _reversed),
    ("after a rejection the token is drawn from p: it must come from max(p - q, 0) renormalised (with q None, p "
     "without the draft), or the draft's accepted mass is counted twice", _resample_from_p),
)


def _trials(accept, p, q, seed: int) -> np.ndarray:
    """TRIALS rows with the same p and q: drafts drawn from q (or the argmax of q's absence), tokens (TRIALS,)."""
    drafts = np.random.default_rng(seed + 1).choice(len(p), TRIALS, p=q if q is not None else None)
    generator = np.random.default_rng(seed)
    return np.array([int(accept(p, q, int(d), generator)) for d in drafts])


def _stage1(accept) -> None:
    rng = np.random.default_rng(12)
    for name, q in (("a sampled draft (q a distribution)", "dense"), ("an n-gram draft (q None)", None)):
        p = rng.dirichlet(np.ones(VOCAB)).astype(np.float32)                  # (V,)
        q_row = rng.dirichlet(np.ones(VOCAB)).astype(np.float32) if q else None
        got, expected = _trials(accept, p, q_row, 5), _trials(ENGINE_ACCEPT, p, q_row, 5)
        if np.array_equal(got, expected):
            continue
        what = f"{TRIALS} rows of {name}, V={VOCAB}, one seeded generator"
        named = likely_mistake(got, (p, q_row, 5), [(label, functools.partial(_trials, w)) for label, w in MISTAKES],
                               0, 0)
        frequencies = np.bincount(got, minlength=VOCAB)[:VOCAB] / TRIALS
        if named:
            first = int(np.argmax(got != expected))
            raise CheckFailed(f"{what}: row {first} gave token {got[first]}, the engine's {expected[first]}{named}")
        compare(f"{what}: how often each token came out, against p (it must be p whatever q is)", frequencies, p,
                atol=BOUND, rtol=0, axes=("token",))
        raise CheckFailed(f"{what}: your tokens have p's distribution but differ from the engine's from row "
                          f"{int(np.argmax(got != expected))} on: use the generator as the engine does, one "
                          f"generator.random() for the test and draw_from(residual, generator) for the redraw, so a "
                          f"seeded request gives the same tokens")
    onehot = np.zeros(VOCAB, dtype=np.float32)
    onehot[7] = 1.0                                               # greedy: the target's argmax is 7
    for draft in (7, 3):
        token = accept(onehot, None, draft, np.random.default_rng(0))
        compare(f"greedy (p one-hot at token 7, q None), draft {draft}: the token", int(token), 7,
                (onehot, None, draft, np.random.default_rng(0)), MISTAKES, atol=0, rtol=0)


def _speculative(params: SamplingParams):
    return generate(real_model(), PROMPT, params, runner=runner.speculative_runner("ngram", K))


@functools.cache
def _reference_sampled():
    return list(_speculative(_sampled()).token_ids)


def _sampled() -> SamplingParams:
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=12, ignore_eos=True)


def check(accept_or_resample) -> list[str]:
    _stage1(accept_or_resample)
    calls = [0]

    def counted(*args):
        calls[0] += 1
        return accept_or_resample(*args)

    decode = real_model().tokenizer.decode
    with plugged(runner, "accept_or_resample", counted):
        sampled = _speculative(_sampled())
        greedy = _speculative(SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    same_tokens("speculative sampling (n-gram drafts, temperature 1, seed 12) with your accept_or_resample",
                sampled.token_ids, _reference_sampled(), decode)
    same_tokens("greedy speculative decoding (n-gram drafts) against the plain model's greedy tokens",
                greedy.token_ids, greedy_ids(PROMPT, MAX_TOKENS), decode)
    s, g = sampled.speculative, greedy.speculative
    rate = lambda stats: f"{stats['accepted_tokens']} of {stats['draft_tokens']} drafts accepted" + \
        (f" ({stats['acceptance_rate']:.0%})" if stats["draft_tokens"] else "")
    return [f"stage 1: greedy rows and {TRIALS} sampled rows (q a distribution, and q None) equal the engine's, "
            f"token for token",
            f"sampled ({MAX_TOKENS} tokens, n-gram drafts, k={K}): your function decided {calls[0]} rows, {rate(s)}, "
            f"{s['target_passes']} target passes; the same tokens as the engine's own: {decode(sampled.token_ids)!r}",
            f"greedy: {rate(g)}, {g['target_passes']} target passes for {MAX_TOKENS} tokens, token for token the plain "
            f"model's greedy output (greedy rows keep a draft iff it is the argmax)"]


EXERCISE = Exercise(
    number=13, name="speculative", title="Speculative decoding: accept or resample", function="accept_or_resample",
    solution="minitransformer/speculative/acceptance.py: accept_or_resample (called by speculative/runner.py's "
             "SpeculativeRunner.sample_next for each drafted row)",
    question="How does speculative decoding keep the target model's output distribution exactly, and why is it "
             "faster?",
    lesson="lessons/12_speculative_decoding.py (acceptance rate, tokens per target pass, the speed-up measured)",
    hints=(
        "q None means a one-hot at the draft: q[draft] = 1, and max(p - q, 0) is p with the draft's entry zeroed.",
        "Accept when generator.random() * q[draft] < p[draft]; return the draft then.",
        "Otherwise residual = max(p - q, 0) (np.maximum); if residual.sum() is 0 use p; return "
        "draw_from(residual, generator).",
    ),
    check=check, reference=acceptance.accept_or_resample, mistakes=MISTAKES,
)
