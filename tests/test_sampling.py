"""The sampling stage against hand-made logits, a float64 reference, a chi-square test and batching invariance."""

import dataclasses
import math
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minitransformer.core import sampling
from minitransformer.core.errors import InputError
from minitransformer.core.sampling import (
    SamplingParams,
    apply_penalties,
    compute_logprobs,
    filtered_probs,
    make_generator,
    sample,
)


def row(*values):
    """One (1, V) float32 row of logits."""
    return np.array([values], dtype=np.float32)


def from_probs(*probs):
    """Logits whose softmax is `probs` (float32)."""
    return np.log(np.array([probs], dtype=np.float64)).astype(np.float32)


def kept(logits, **params):
    """The token ids filtered_probs leaves with nonzero probability, for a one-row batch."""
    probs = filtered_probs(logits, [SamplingParams(**params)])[0]
    return set(np.flatnonzero(probs).tolist())


def softmax64(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


class FixedUniform:
    """Stands in for a generator: hands out given uniforms and counts the calls."""

    def __init__(self, *values):
        self.values, self.calls = list(values), 0

    def random(self):
        self.calls += 1
        return self.values.pop(0)


# --- temperature and greedy ------------------------------------------------------------------------------------

def test_temperature_zero_takes_argmax_with_lowest_id_on_ties_and_draws_nothing():
    generator = make_generator(0)
    state = generator.bit_generator.state
    for temperature in (0.0, 1e-6):
        tokens = sample(row(1.0, 3.0, 3.0, 2.0), [SamplingParams(temperature=temperature)], [generator], [[]], [[]])
        assert tokens.tolist() == [1] and tokens.dtype == np.int64
    assert generator.bit_generator.state == state              # greedy rows take no random numbers
    assert sample(row(5.0, 3.0), [SamplingParams(temperature=0)], [None], [[]], [[]]).tolist() == [0]
    probs = filtered_probs(row(1.0, 3.0, 3.0, 2.0), [SamplingParams(temperature=0)])
    np.testing.assert_array_equal(probs, [[0, 1, 0, 0]])    # the point mass sample() takes
    assert SamplingParams(temperature=1e-6).greedy and not SamplingParams(temperature=1e-5).greedy


def test_greedy_takes_the_argmax_of_the_penalised_logits():
    logits = row(2.0, 1.9, 0.0)
    assert sample(logits, [SamplingParams(temperature=0)], [None], [[]], [[0]]).tolist() == [0]
    # token 0 was already generated: 2.0 / 1.2 = 1.67 < 1.9
    params = SamplingParams(temperature=0, repetition_penalty=1.2)
    assert sample(logits, [params], [None], [[]], [[0]]).tolist() == [1]


def test_temperature_divides_the_logits_and_stays_float32():
    logits = row(1.0, 2.0, 0.5, -1.0)
    for temperature in (0.5, 2.0, np.float64(0.7), 3):        # a NumPy float64 must not promote to float64
        probs = filtered_probs(logits, [SamplingParams(temperature=temperature)])
        assert probs.dtype == np.float32
        np.testing.assert_allclose(probs[0], softmax64(logits[0].astype(np.float64) / float(temperature)),
                                   rtol=1e-6, atol=1e-7)
    assert type(SamplingParams(temperature=np.float64(0.7)).temperature) is float
    penalised = apply_penalties(logits, [SamplingParams(repetition_penalty=np.float64(1.3),
                                                        frequency_penalty=np.float64(0.5))], [[0]], [[1, 2]])
    assert penalised.dtype == np.float32


# --- top_k, top_p, min_p on their own --------------------------------------------------------------------------

@pytest.mark.parametrize("top_k, expected", [
    (1, {0}), (2, {0, 1, 2}), (3, {0, 1, 2}), (4, {0, 1, 2, 3}), (5, {0, 1, 2, 3, 4}), (100, {0, 1, 2, 3, 4}),
    (0, {0, 1, 2, 3, 4}), (-1, {0, 1, 2, 3, 4}),
])
def test_top_k_keeps_every_token_tied_with_the_kth(top_k, expected):
    logits = row(3.0, 2.0, 2.0, 1.0, 0.0)                       # tokens 1 and 2 tie for 2nd place
    assert kept(logits, top_k=top_k) == expected
    probs = filtered_probs(logits, [SamplingParams(top_k=top_k)])[0]
    ids = sorted(expected)
    np.testing.assert_allclose(probs[ids], softmax64(logits[0, ids]), rtol=1e-6)   # renormalised over the kept


@pytest.mark.parametrize("top_p, expected", [
    (1e-9, {0}),              # the most probable token always stays
    (0.49, {0}),              # 0.5 alone reaches 0.49
    (0.51, {0, 1}),           # mass before token 1 is 0.5 < 0.51: token 1 crosses the boundary and is kept
    (0.79, {0, 1}),
    (0.81, {0, 1, 2}),
    (1.0, {0, 1, 2}),
])
def test_top_p_keeps_the_smallest_set_reaching_top_p(top_p, expected):
    assert kept(from_probs(0.5, 0.3, 0.2), top_p=top_p) == expected


def test_top_p_keeps_every_token_tied_with_the_boundary_token():
    logits = from_probs(0.5, 0.25, 0.125, 0.125)               # tokens 2 and 3 tie
    assert kept(logits, top_p=0.74) == {0, 1}                  # mass before token 2 is 0.75: not needed
    # 0.75 < 0.76: token 2 is needed; token 3 ties with it and is kept too (a smallest set would stop at 3 tokens)
    assert kept(logits, top_p=0.76) == {0, 1, 2, 3}
    # same when the tie's members are numbered apart, and when the tie is the most probable pair
    assert kept(from_probs(0.125, 0.5, 0.25, 0.125), top_p=0.76) == {0, 1, 2, 3}
    assert kept(from_probs(0.4, 0.2, 0.4), top_p=0.1) == {0, 2}
    probs = filtered_probs(logits, [SamplingParams(top_p=0.76)])[0]
    np.testing.assert_allclose(probs, [0.5, 0.25, 0.125, 0.125], rtol=1e-6)


@pytest.mark.parametrize("min_p, expected", [
    (0.0, {0, 1, 2, 3}), (0.09, {0, 1, 2, 3}), (0.2, {0, 1, 2}), (0.31, {0, 1}), (0.61, {0}), (1.0, {0}),
])
def test_min_p_keeps_tokens_at_least_min_p_times_the_top_probability(min_p, expected):
    assert kept(from_probs(0.5, 0.3, 0.15, 0.05), min_p=min_p) == expected   # ratios 1, .6, .3, .1


# --- penalties -------------------------------------------------------------------------------------------------

PROMPT, OUTPUT = [0, 0], [1, 1, 2]                 # token 0 only in the prompt; token 1 twice, token 2 once in output


@pytest.mark.parametrize("params, expected", [
    (dict(repetition_penalty=2.0), [1.0, 1.0, -2.0, 1.0]),               # prompt and output tokens, > 0 divided
    (dict(repetition_penalty=0.5), [4.0, 4.0, -0.5, 1.0]),               # r < 1 encourages repeats
    (dict(frequency_penalty=0.5), [2.0, 1.0, -1.5, 1.0]),                # output only, times the count
    (dict(presence_penalty=0.5), [2.0, 1.5, -1.5, 1.0]),                 # output only, once per token
    (dict(presence_penalty=-0.5), [2.0, 2.5, -0.5, 1.0]),
    (dict(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.5), [1.0, -0.5, -3.0, 1.0]),
])
def test_penalties(params, expected):
    logits = row(2.0, 2.0, -1.0, 1.0)
    out = apply_penalties(logits, [SamplingParams(**params)], [PROMPT], [OUTPUT])
    np.testing.assert_allclose(out, [expected], rtol=1e-6)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(logits, row(2.0, 2.0, -1.0, 1.0))       # a new array; the input is untouched


def test_penalties_are_per_row_and_leave_neutral_rows_bit_for_bit():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((3, 50)).astype(np.float32)
    params = [SamplingParams(), SamplingParams(repetition_penalty=1.5, frequency_penalty=0.3), SamplingParams()]
    prompts, outputs = [[1, 2], [3, 4], [5]], [[6, 6], [7, 7, 8], [9]]
    out = apply_penalties(logits, params, prompts, outputs)
    np.testing.assert_array_equal(out[[0, 2]], logits[[0, 2]])
    expected = logits[1].astype(np.float64)
    for t in (3, 4, 7, 8):
        expected[t] = expected[t] / 1.5 if expected[t] > 0 else expected[t] * 1.5
    expected[7] -= 0.6
    expected[8] -= 0.3
    np.testing.assert_allclose(out[1], expected, rtol=1e-6)
    alone = apply_penalties(logits[1:2], params[1:2], prompts[1:2], outputs[1:2])
    np.testing.assert_array_equal(alone[0], out[1])


def test_suppressed_minus_inf_logits_stay_unreachable():
    """generate.py masks EOS with -inf during min_tokens: penalties must not turn it into NaN or a finite value."""
    logits = row(1.0, -np.inf, 0.5, 0.2)
    params = SamplingParams(repetition_penalty=1.3, frequency_penalty=-2, presence_penalty=-2, top_k=3)
    out = apply_penalties(logits, [params], [[1]], [[1, 1]])
    assert out[0, 1] == -np.inf
    probs = filtered_probs(out, [params])[0]
    assert probs[1] == 0 and np.isclose(probs.sum(), 1)
    generators = [make_generator(s) for s in range(200)]
    tokens = sample(np.repeat(logits, 200, axis=0), [params] * 200, generators, [[1]] * 200, [[1, 1]] * 200)
    assert 1 not in tokens.tolist() and set(tokens.tolist()) == {0, 2, 3}


# --- the order of the filters ----------------------------------------------------------------------------------

def test_top_k_then_top_p_on_the_renormalised_rest():
    logits = from_probs(0.4, 0.3, 0.2, 0.1)
    # top_k=2 leaves {0.4, 0.3} -> renormalised {0.571, 0.429}: 0.571 already reaches 0.5, so only token 0 stays.
    # The other order (top_p on the full distribution first) would keep {0, 1}, since 0.4 < 0.5.
    assert kept(logits, top_k=2, top_p=0.5) == {0}
    assert kept(logits, top_p=0.5) == {0, 1}


def test_min_p_before_top_p():
    logits = from_probs(0.5, 0.3, 0.15, 0.05)
    # min_p=0.2 removes 0.05 -> {0.526, 0.316, 0.158}: mass before token 2 is 0.842 >= 0.82, so it goes.
    # top_p first would see 0.8 < 0.82 and keep token 2 (which min_p then keeps too).
    assert kept(logits, min_p=0.2, top_p=0.82) == {0, 1}
    assert kept(logits, top_p=0.82) == {0, 1, 2}


def test_temperature_before_min_p_and_top_p():
    logits = from_probs(0.5, 0.3, 0.15, 0.05)
    assert kept(logits, min_p=0.35) == {0, 1}                        # ratios 1, .6, .3, .1
    assert kept(logits, min_p=0.35, temperature=2.0) == {0, 1, 2}   # flattened: ratios 1, .77, .55, .32
    logits = from_probs(0.5, 0.3, 0.2)
    assert kept(logits, top_p=0.6) == {0, 1}
    assert kept(logits, top_p=0.6, temperature=0.5) == {0}          # sharpened: 0.66 alone reaches 0.6


def test_penalties_before_top_k():
    logits = row(3.0, 2.0, 1.0)
    params = SamplingParams(top_k=1, frequency_penalty=2.0)
    probs = filtered_probs(apply_penalties(logits, [params], [[]], [[0]]), [params])
    np.testing.assert_array_equal(probs, [[0, 1, 0]])                # 3 - 2 = 1 < 2: token 1 is now the top
    assert sample(logits, [params], [make_generator(0)], [[]], [[0]]).tolist() == [1]


# --- the draw --------------------------------------------------------------------------------------------------

def test_draw_is_the_inverse_cdf_in_token_id_order():
    logits = from_probs(0.25, 1e-30, 0.25, 0.5)                      # token 1 underflows to probability 0
    cases = [(0.0, 0), (0.2499, 0), (0.2501, 2), (0.4999, 2), (0.5001, 3), (1 - 1e-12, 3)]
    generator = FixedUniform(*[u for u, _ in cases])
    for u, expected in cases:
        assert sample(logits, [SamplingParams()], [generator], [[]], [[]]).tolist() == [expected], u
    assert generator.calls == len(cases)                              # exactly one uniform per sampled row
    # u = 0 must skip a leading token of probability 0 (its CDF interval is empty)
    assert sample(row(-np.inf, 0.0, 0.0), [SamplingParams()], [FixedUniform(0.0)], [[]], [[]]).tolist() == [1]
    # a uniform that rounds up to 1.0 in float32 lands on the last token that has mass, never past it
    assert sample(row(0.0, 0.0, -np.inf), [SamplingParams()], [FixedUniform(1 - 1e-10)], [[]], [[]]).tolist() == [1]


def reference_distribution(logits, params):
    """float64, one row, written plainly: temperature, min_p, top_k (ties kept), top_p (ties kept), renormalise."""
    x = np.asarray(logits, dtype=np.float64) / params.temperature
    probs = softmax64(x)
    keep = probs >= params.min_p * probs.max()
    if params.top_k > 0:
        kth = sorted(x[keep], reverse=True)[min(params.top_k, keep.sum()) - 1]
        keep &= x >= kth
    if params.top_p < 1:
        renormalised = np.where(keep, probs, 0) / probs[keep].sum()
        mass_before, top_p_keep = 0.0, np.zeros_like(keep)
        for value in sorted(set(x[keep]), reverse=True):                # one tie group at a time
            if mass_before >= params.top_p:
                break
            top_p_keep |= keep & (x == value)
            mass_before += renormalised[keep & (x == value)].sum()
        keep = top_p_keep
    return np.where(keep, probs, 0) / probs[keep].sum()


def test_20000_seeded_draws_follow_the_filtered_distribution():
    logits = row(1.0, 2.5, 0.2, 2.2, -1.0, 1.8, 2.9, 0.9)
    # every filter bites: min_p removes tokens 2 and 4, top_k=5 then token 7, top_p=0.95 then token 0
    params = SamplingParams(temperature=0.8, min_p=0.05, top_k=5, top_p=0.95, seed=1234)
    expected = reference_distribution(logits[0], params)
    assert set(np.flatnonzero(expected).tolist()) == {1, 3, 5, 6}
    np.testing.assert_allclose(filtered_probs(logits, [params])[0], expected, rtol=1e-5, atol=1e-7)

    n = 20_000
    generator = make_generator(params.seed)
    tokens = sample(np.repeat(logits, n, axis=0), [params] * n, [generator] * n, [[]] * n, [[]] * n)
    counts = np.bincount(tokens, minlength=8)
    assert counts[expected == 0].sum() == 0                           # filtered tokens are never drawn
    support = expected > 0
    chi2 = (((counts - n * expected) ** 2)[support] / (n * expected[support])).sum()
    # 4 outcomes -> 3 degrees of freedom; the chi-square critical value at p = 0.001 for 3 d.o.f. is 16.266
    # (standard tables; scipy.stats.chi2.ppf(0.999, 3)). A biased sampler (e.g. unrenormalised, or off by one
    # token in the CDF) lands in the hundreds.
    assert chi2 < 16.266, (chi2, counts, n * expected)
    # the same seed gives the same draws
    again = sample(np.repeat(logits, n, axis=0), [params] * n, [make_generator(params.seed)] * n, [[]] * n, [[]] * n)
    np.testing.assert_array_equal(tokens, again)


# --- a seeded request does not depend on its batch -------------------------------------------------------------

def test_seeded_request_gives_the_same_tokens_alone_and_batched():
    V, steps = 300, 40
    rng = np.random.default_rng(7)
    step_logits = (rng.standard_normal((steps, 5, V)) * 2).astype(np.float32)   # row 2 is our request everywhere
    target = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, min_p=0.01, repetition_penalty=1.1,
                            presence_penalty=0.3, frequency_penalty=0.2, seed=42)
    others = [SamplingParams(temperature=0), SamplingParams(temperature=1.3, seed=1),
              SamplingParams(temperature=0.7, top_p=0.8, seed=2), SamplingParams(temperature=1.0, min_p=0.2)]
    # alone, the target's top_k lets the filters sort only its top 40 logits; batched, the top_p-only neighbour
    # makes them sort whole rows: the target's tokens must not notice

    everyone = others[:2] + [target] + others[2:]
    all_prompts = [list(range(b, b + 10)) for b in range(5)]

    def run(batched: bool):
        params = everyone if batched else [target]
        generators = [make_generator(p.seed) for p in params]
        prompts = all_prompts if batched else all_prompts[2:3]
        outputs = [[] for _ in params]
        for step in range(steps):
            logits = step_logits[step] if batched else step_logits[step, 2:3]
            tokens = sample(logits, params, generators, prompts, outputs)
            for out, token in zip(outputs, tokens.tolist()):
                out.append(token)
        return outputs

    alone, batched = run(False)[0], run(True)
    assert batched[2] == alone
    assert len(set(alone)) > 10                                         # really sampled, not stuck on one token
    assert batched[0] == step_logits[:, 0].argmax(-1).tolist()          # the greedy neighbour (no penalties)
    again = run(True)
    assert again[:4] == batched[:4]                  # every seeded (and the greedy) row is reproducible
    assert again[4] != batched[4]                    # the last row has no seed: a fresh stream each run


def test_filtered_probs_of_a_row_do_not_depend_on_its_neighbours():
    """Alone, a top_k row sorts only its top k logits; next to a top_p-only row, whole rows are sorted."""
    rng = np.random.default_rng(11)
    cases = [(50, 0.9, 0.0), (200, 0.5, 0.01), (7, 1.0, 0.0), (1000, 0.99, 0.001), (0, 1.0, 0.0), (0, 1.0, 0.05)]
    logits = (rng.standard_normal((len(cases), 5000)) * 3).astype(np.float32)
    params = [SamplingParams(temperature=0.8, top_k=k, top_p=p, min_p=m) for k, p, m in cases]
    batches = [(logits, params),                                            # top_k everywhere: sort the top 1000
               (np.concatenate([logits, logits[:1]]), params + [SamplingParams(top_p=0.9)])]   # + a top_p-only row
    for batch_logits, batch_params in batches:
        batched = filtered_probs(batch_logits, batch_params)
        for b, p in enumerate(params):
            np.testing.assert_array_equal(filtered_probs(logits[b:b + 1], [p])[0], batched[b])
            assert 0 < np.count_nonzero(batched[b]) <= (p.top_k or 5000)
        assert np.count_nonzero(batched[4]) == 5000                       # no filter: every token stays


@pytest.mark.parametrize("prefix", [1, 3, 64, 1024, 10_000])
def test_sorting_a_prefix_changes_nothing(monkeypatch, prefix):
    """top_p sorts only the TOP_P_PREFIX largest logits when they suffice, else the whole row: same answer."""
    rng = np.random.default_rng(5)
    V = 3000
    logits = np.stack([rng.standard_normal(V) * 4,                    # peaked: a short prefix reaches top_p
                       rng.standard_normal(V) * 0.1,                  # flat: most prefixes fall short
                       rng.integers(-3, 4, V),                         # few values: ties across any prefix end
                       rng.standard_normal(V) * 2]).astype(np.float32)
    params = [SamplingParams(top_p=0.9), SamplingParams(top_p=0.5, temperature=1.5),
              SamplingParams(top_p=0.3, min_p=0.01), SamplingParams(top_p=0.95, top_k=20)]
    expected = filtered_probs(logits, params)                          # default prefix (1024)
    monkeypatch.setattr(sampling, "TOP_P_PREFIX", prefix)
    np.testing.assert_array_equal(filtered_probs(logits, params), expected)
    for b in range(4):
        np.testing.assert_array_equal(filtered_probs(logits[b:b + 1], params[b:b + 1])[0], expected[b])
    # row 2: the ~430 tokens tied at logit 3 hold ~65% of the mass, so top_p=0.3 keeps exactly that tie group,
    # however far it runs past the sorted prefix
    np.testing.assert_array_equal(np.flatnonzero(expected[2]), np.flatnonzero(logits[2] == 3))


def test_each_sampled_row_takes_exactly_one_uniform_per_step():
    generators = [make_generator(5), make_generator(6)]
    params = [SamplingParams(temperature=0.5, top_k=3), SamplingParams(temperature=0)]
    logits = np.zeros((2, 10), dtype=np.float32)
    for _ in range(3):
        sample(logits, params, generators, [[], []], [[], []])
    reference = make_generator(5)
    reference.random(size=3)
    assert generators[0].random() == reference.random()
    assert generators[1].random() == make_generator(6).random()        # the greedy row's stream is untouched


# --- SamplingParams validation ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(max_tokens=0), "max_tokens must be at least 1, got 0"),
    (dict(max_tokens=2.5), "max_tokens must be an integer, got 2.5"),
    (dict(max_tokens="8"), "max_tokens must be an integer, got '8'"),
    (dict(max_tokens=True), "max_tokens must be an integer, got True"),
    (dict(min_tokens=-1), "min_tokens must be >= 0, got -1"),
    (dict(min_tokens=5, max_tokens=3), "min_tokens (5) must not exceed max_tokens (3)"),
    (dict(temperature=-1.0), "temperature must be >= 0, got -1.0"),
    (dict(temperature=float("nan")), "temperature must be >= 0, got nan"),
    (dict(temperature=float("inf")), "temperature must be finite, got inf"),
    (dict(temperature="hot"), "temperature must be a number, got 'hot'"),
    (dict(top_p=0), "top_p must be in (0, 1], got 0"),
    (dict(top_p=1.5), "top_p must be in (0, 1], got 1.5"),
    (dict(top_p=-0.1), "top_p must be in (0, 1], got -0.1"),
    (dict(top_k=-2), "top_k must be -1, 0 or >= 1, got -2"),
    (dict(top_k=2.0), "top_k must be an integer, got 2.0"),
    (dict(min_p=-0.1), "min_p must be in [0, 1], got -0.1"),
    (dict(min_p=1.01), "min_p must be in [0, 1], got 1.01"),
    (dict(repetition_penalty=0), "repetition_penalty must be > 0, got 0"),
    (dict(repetition_penalty=-1.0), "repetition_penalty must be > 0, got -1.0"),
    (dict(presence_penalty=2.5), "presence_penalty must be in [-2, 2], got 2.5"),
    (dict(presence_penalty=-3), "presence_penalty must be in [-2, 2], got -3"),
    (dict(frequency_penalty=2.01), "frequency_penalty must be in [-2, 2], got 2.01"),
    (dict(frequency_penalty=-2.5), "frequency_penalty must be in [-2, 2], got -2.5"),
    (dict(seed=-1), "seed must be a non-negative integer, got -1"),
    (dict(seed=1.5), "seed must be an integer, got 1.5"),
    (dict(stop=""), "a stop string must not be empty"),
    (dict(stop=["ok", ""]), "a stop string must not be empty"),
    (dict(stop=[3]), "stop must be a string or a list of strings, got [3]"),
    (dict(stop=None), "stop must be a string or a list of strings, got None"),
    (dict(stop_token_ids=[-1]), "stop_token_ids must be non-negative integers (token ids), got -1"),
    (dict(stop_token_ids=["2"]), "stop_token_ids must be non-negative integers (token ids), got '2'"),
    (dict(ignore_eos="yes"), "ignore_eos must be True or False, got 'yes'"),
    (dict(include_stop_str_in_output=1), "include_stop_str_in_output must be True or False, got 1"),
    (dict(logprobs=-1), "logprobs must be an integer in [0, 20], got -1"),
    (dict(logprobs=21), "logprobs must be an integer in [0, 20], got 21"),
    (dict(logprobs=2.0), "logprobs must be an integer in [0, 20], got 2.0"),
])
def test_invalid_parameters_raise_one_clear_line(kwargs, message):
    with pytest.raises(InputError, match="^" + re.escape(message) + "$"):
        SamplingParams(**kwargs)


def test_valid_parameters_are_normalised():
    p = SamplingParams(max_tokens=np.int64(8), stop="###", stop_token_ids=[2, np.int64(5)], top_k=-1, temperature=1,
                       seed=np.int64(3), logprobs=np.int32(2), top_p=1, min_p=1, presence_penalty=-2)
    assert p.stop == ("###",) and p.stop_token_ids == (2, 5) and p.top_k == -1
    assert type(p.max_tokens) is int and type(p.seed) is int and type(p.logprobs) is int
    assert type(p.temperature) is float and type(p.top_p) is float and not p.greedy
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")
    assert SamplingParams(stop_token_ids=7).stop_token_ids == (7,)
    assert SamplingParams(min_tokens=3, max_tokens=3).min_tokens == 3
    assert SamplingParams(temperature=0).greedy and SamplingParams().max_tokens == 16
    with pytest.raises(AttributeError):
        p.temperature = 0.5                                              # frozen


# --- logprobs --------------------------------------------------------------------------------------------------

def test_compute_logprobs_matches_float64_log_softmax():
    rng = np.random.default_rng(3)
    logits = (rng.integers(-2000, 2000, size=(3, 1000)) / 100).astype(np.float32)   # a 0.01 grid: many ties
    tokens = np.array([5, 17, 999])
    result = compute_logprobs(logits, tokens, 7)
    for b in range(3):
        x = logits[b].astype(np.float64)
        reference = x - x.max() - np.log(np.exp(x - x.max()).sum())
        order = np.lexsort((np.arange(1000), -reference))[:7]            # most probable first, ties by lower id
        assert result[b]["token_id"] == tokens[b]
        assert result[b]["logprob"] == pytest.approx(reference[tokens[b]], abs=1e-5)
        assert [i for i, _ in result[b]["top"]] == order.tolist()
        np.testing.assert_allclose([v for _, v in result[b]["top"]], reference[order], atol=1e-5)
        assert all(type(i) is int and type(v) is float for i, v in result[b]["top"])


def test_compute_logprobs_ties_k_zero_and_k_above_vocab():
    logits = row(1.0, 3.0, 3.0, 2.0)
    top = compute_logprobs(logits, [3], 3)[0]["top"]
    assert [i for i, _ in top] == [1, 2, 3] and top[0][1] == top[1][1]
    assert compute_logprobs(logits, [0], 0) == [{"token_id": 0, "logprob": pytest.approx(math.log(softmax64(
        logits[0])[0]), abs=1e-6), "top": []}]
    assert [i for i, _ in compute_logprobs(logits, np.array([1]), 10)[0]["top"]] == [1, 2, 3, 0]


# --- properties ------------------------------------------------------------------------------------------------

logit_rows = st.integers(2, 40).flatmap(lambda V: st.lists(
    st.one_of(st.integers(-8, 8).map(lambda i: i / 2), st.floats(-20, 20, width=32)), min_size=V, max_size=V))
sampling_params = st.builds(
    SamplingParams, temperature=st.sampled_from([0.0, 0.3, 1.0, 1.7]), top_k=st.integers(-1, 45),
    top_p=st.sampled_from([1.0, 0.95, 0.7, 0.3, 0.01]), min_p=st.sampled_from([0.0, 0.05, 0.3, 1.0]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(logit_rows, sampling_params), min_size=1, max_size=3))
def test_filtered_probs_properties(rows):
    V = min(len(values) for values, _ in rows)
    logits = np.array([values[:V] for values, _ in rows], dtype=np.float32)
    params = [p for _, p in rows]
    probs = filtered_probs(logits, params)
    assert probs.dtype == np.float32 and np.all(probs >= 0)
    np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-5)
    for b, p in enumerate(params):
        x = logits[b]
        assert probs[b, np.argmax(x)] > 0                                # the lowest-id argmax is always kept
        np.testing.assert_array_equal(probs[b], filtered_probs(logits[b:b + 1], [p])[0])   # independent of the batch
        if p.greedy:
            continue
        if p.top_k > 0:
            kth = np.sort(x)[::-1][min(p.top_k, V) - 1]
            assert np.all(probs[b][x < kth] == 0)                          # never keeps what top_k removed
        kept_ids = probs[b] > 0
        assert np.all(probs[b][kept_ids] > 0)
        for value in np.unique(x[kept_ids]):
            assert np.all(kept_ids[x == value])                          # ties are kept or dropped together
        before = softmax64(x.astype(np.float64) / p.temperature)
        assert np.all(before[kept_ids] >= p.min_p * before.max() * (1 - 1e-4) - 1e-7)   # min_p held
        if p.top_p < 1:       # top_p over what min_p and top_k left: reaches top_p, and only its last tie group
            q = filtered_probs(logits[b:b + 1], [dataclasses.replace(p, top_p=1.0)])[0].astype(np.float64)
            assert q[kept_ids].sum() >= p.top_p - 1e-5
            last_group = kept_ids & (x == x[kept_ids].min())
            assert q[kept_ids & ~last_group].sum() < p.top_p + 1e-5   # ...is needed to get there
