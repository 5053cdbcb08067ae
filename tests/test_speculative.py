"""Speculative decoding changes how fast tokens come, never which tokens (greedy) or their distribution (sampling).

References: plain greedy decoding of the same model (generate() without speculative), plain decoding's KV cache
built with prefill + decode_step, and the target distribution p itself for the chi-square test.
"""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer import InputError, SamplingParams, generate, load_model
from minitransformer.core.decode import decode_step
from minitransformer.core.generate import make_request
from minitransformer.core.kv_cache import KVCache, estimate_kv_bytes
from minitransformer.core.prefill import prefill
from minitransformer.speculative import (
    NgramDrafter,
    SpeculativeConfig,
    SpeculativeRunner,
    accept_or_resample,
    make_config,
    speculative_runner,
)
from minitransformer.speculative.runner import VerifyPass
from tiny_model import write_tiny_llama

# 32 tokens: with k=3 that is about ten verify passes per prompt, each one a rollback of the rejected drafts'
# cache rows that the next pass would read if it were wrong, so a cache or position bug shows in these tokens
GREEDY = SamplingParams(max_tokens=32, temperature=0.0)
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Colors: red, green, blue, yellow, purple, orange. Repeat the list: red, green,",
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
]
# The 0.999 quantiles of the chi-square distribution (any table): a correct sampler fails 1 run in 1000.
CHI2_999 = {3: 16.266, 4: 18.467, 5: 20.515}


# ---------------------------------------------------------------------------------------------------- greedy

@pytest.fixture(scope="module")
def plain_greedy(real_model):
    return [generate(real_model, prompt, GREEDY) for prompt in PROMPTS]


@pytest.mark.parametrize("drafter", ["ngram", "self:8"])
def test_greedy_speculative_equals_plain_greedy_on_the_real_model(real_model, plain_greedy, drafter):
    accepted = 0
    for prompt, plain in zip(PROMPTS, plain_greedy):
        out = generate(real_model, prompt, GREEDY, runner=speculative_runner(drafter, 3))
        assert out.token_ids == plain.token_ids, prompt
        assert (out.text, out.finish_reason, out.kv_cache_tokens) == (plain.text, plain.finish_reason,
                                                                      plain.kv_cache_tokens)
        stats = out.speculative
        assert stats["target_passes"] <= len(out.token_ids)
        assert stats["tokens_per_target_pass"] == len(out.token_ids) / stats["target_passes"]
        accepted += stats["accepted_tokens"]
    assert accepted > 0              # some drafts really were accepted, so rows past the first were used


def test_real_model_as_its_own_draft_accepts_everything(real_model, plain_greedy):
    out = generate(real_model, PROMPTS[2], GREEDY, runner=speculative_runner(real_model, 5))
    assert out.token_ids == plain_greedy[2].token_ids
    stats = out.speculative
    assert stats["acceptance_rate"] == 1.0                    # same model, same greedy choice
    # every pass yields its k drafts + the bonus token: ceil((n - 1) / 6) verify passes after the prefill
    n = len(out.token_ids)
    assert stats["target_passes"] == 1 + -(-(n - 1) // 6)


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory):
    """Another tiny model with the same vocabulary but other random weights: a poor drafter, many rejections."""
    return load_model(write_tiny_llama(tmp_path_factory.mktemp("draft") / "draft.gguf", seed=7))


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=40, temperature=0.0),
    SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5, min_tokens=30),
])
@pytest.mark.parametrize("drafter", ["ngram", "self:1", "model"])
def test_greedy_with_penalties_and_min_tokens_on_the_tiny_model(tiny_model, tiny_draft, params, drafter):
    spec = tiny_draft if drafter == "model" else drafter
    for prompt in ("hello world hello world hello", "abc abc abc"):
        plain = generate(tiny_model, prompt, params)
        out = generate(tiny_model, prompt, params, runner=speculative_runner(spec, 3))
        assert out.token_ids == plain.token_ids and out.text == plain.text


def test_draft_model_must_share_the_vocabulary(real_model, tiny_model):
    with pytest.raises(InputError, match="vocabulary differs"):
        generate(real_model, "hi", GREEDY, runner=speculative_runner(tiny_model))


@pytest.mark.parametrize("spec, k, message", [
    ("self:0", 4, r"L must be in \[1, 1\]"), ("self:2", 4, r"L must be in \[1, 1\]"), ("self:x", 4, "number of"),
    ("medusa", 4, "must be 'ngram'"), ("ngram", 0, r"in \[1, 16\]"), ("ngram", 17, r"in \[1, 16\]"),
    (SpeculativeConfig("model"), 4, "needs a draft model"),
])
def test_bad_settings_are_one_clear_error(tiny_model, spec, k, message):
    with pytest.raises(InputError, match=message):
        generate(tiny_model, "hi", GREEDY, runner=speculative_runner(spec, k))


# ---------------------------------------------------------------------------------------------------- stops

@pytest.mark.parametrize("where", ["stop_token", "stop_string", "max_tokens"])
def test_stops_inside_an_accepted_run_match_plain_decoding(real_model, where):
    """The model drafting for itself accepts every draft, so with k=8 each stop falls inside a run of 9."""
    base = dict(max_tokens=16, temperature=0.0)
    prompt = PROMPTS[4]                                                    # counting: " 13, 14, 15, ..."
    ids = generate(real_model, prompt, SamplingParams(**base)).token_ids
    i = next(i for i in range(10, 16) if ids[i] not in ids[:i])       # a token that first appears in pass 3
    settings = {"stop_token": dict(stop_token_ids=[ids[i]]),
                "stop_string": dict(stop=[real_model.tokenizer.decode(ids[i - 1:i + 1])]),
                "max_tokens": dict(max_tokens=13)}[where]
    params = SamplingParams(**{**base, **settings})
    plain = generate(real_model, prompt, params)
    out = generate(real_model, prompt, params, runner=speculative_runner(real_model, 8))
    assert (out.token_ids, out.text, out.finish_reason, out.stop_reason) == \
           (plain.token_ids, plain.text, plain.finish_reason, plain.stop_reason)
    assert out.finish_reason == ("length" if where == "max_tokens" else "stop") and 11 <= len(out.token_ids) <= 16
    assert out.kv_cache_tokens == plain.kv_cache_tokens
    # prefill -> token 1; pass 2 -> tokens 2-10; the stop falls in pass 3's run, whose later rows are dropped
    assert out.speculative["acceptance_rate"] == 1.0 and out.speculative["target_passes"] == 3


def test_eos_inside_an_accepted_run_matches_plain_decoding(real_model):
    params = SamplingParams(max_tokens=40, temperature=0.0)
    plain = generate(real_model, "Reply with just the word OK.", params, chat=True)
    assert plain.stop_reason == "eos" and len(plain.token_ids) < 40       # a short reply that ends with EOS
    out = generate(real_model, "Reply with just the word OK.", params, chat=True,
                   runner=speculative_runner(real_model, 8))
    assert (out.token_ids, out.text, out.stop_reason) == (plain.token_ids, plain.text, "eos")
    n = len(out.token_ids)                   # prefill: 1 token, then 9 a pass; EOS ends the last run early
    assert out.speculative["target_passes"] == 1 + -(-(n - 1) // 9) and out.speculative["acceptance_rate"] == 1.0


# ---------------------------------------------------------------------------------------------------- cache

class WrongAt:
    """A drafter that proposes the plain greedy continuation with one token changed: a rejection at a known place."""

    def __init__(self, truth: list[int], prompt_len: int, wrong_index: int):
        self.truth, self.prompt_len, self.wrong_index = truth, prompt_len, wrong_index

    def propose(self, context, k, params, prompt_len, eos_id, constraint=None):
        start = len(context) - self.prompt_len
        drafts = list(self.truth[start:start + k])
        for i in range(len(drafts)):
            if start + i == self.wrong_index:
                drafts[i] = (drafts[i] + 1) % 100
        return drafts, None


def test_after_a_rejection_the_cache_equals_plain_decoding(real_model):
    prompt = real_model.tokenizer.encode("The capital of France is")
    plain = generate(real_model, prompt, SamplingParams(max_tokens=12, temperature=0.0))
    truth = plain.token_ids
    request = make_request(real_model, prompt, SamplingParams(max_tokens=12, temperature=0.0))
    runner = SpeculativeRunner(real_model, request, SpeculativeConfig("ngram", k=4))
    runner.drafter = WrongAt(truth, len(prompt), wrong_index=3)         # drafts truth[1..4] with truth[3] wrong
    runner.first_logits()
    runner.next_logits(truth[0])                     # one verify pass over truth[0] and 4 drafts -> 5 cache slots
    assert runner.cache.length == len(prompt) + 5
    runner.next_logits(truth[1])                     # the draft there: accepted, its row is already computed
    runner.next_logits(truth[2])                     # accepted
    assert runner.stats.target_passes == 2           # the prefill and one verify pass
    runner.next_logits(truth[3])                     # the draft there was wrong: rejected -> roll back, re-verify
    assert runner.stats.target_passes == 3
    n = len(prompt) + 3                              # prompt + truth[0..2] verified before the rollback
    reference = KVCache(real_model.config, len(prompt) + 12)
    prefill(real_model, prompt, reference)
    for token in truth[:3]:
        decode_step(real_model, [token], reference)
    assert reference.length == n
    # after the new verify pass the cache holds n verified tokens, then truth[3] and its drafts past them
    np.testing.assert_allclose(runner.cache.k[:, :, :n], reference.k[:, :, :n], rtol=0, atol=2e-5)
    np.testing.assert_allclose(runner.cache.v[:, :, :n], reference.v[:, :, :n], rtol=0, atol=2e-5)
    runner.cache.truncate(n)
    assert runner.cache.shape == reference.shape and runner.cache.bytes_used == reference.bytes_used


def test_truncate_checks_its_argument(tiny_model):
    cache = KVCache(tiny_model.config, 8)
    prefill(tiny_model, [3, 4, 5], cache)
    with pytest.raises(InputError, match=r"new length must be in \[0, 3\]"):
        cache.truncate(4)
    cache.truncate(1)
    assert cache.length == 1 and cache.bytes_used == estimate_kv_bytes(tiny_model.config, 1)


# ---------------------------------------------------------------------------------------------------- sampling

def chi_square(tokens: np.ndarray, p: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over the tokens p gives mass to, and its degrees of freedom."""
    support = np.flatnonzero(p > 0)
    counts = np.bincount(tokens, minlength=len(p))
    expected = len(tokens) * p[support]
    return float(((counts[support] - expected) ** 2 / expected).sum()), len(support) - 1


# q gives mass to tokens 4 and 5, which the target never produces; p gives mass to 0, which q never drafts.
P = np.array([0.30, 0.25, 0.20, 0.15, 0.0, 0.0, 0.10], dtype=np.float32)
Q = np.array([0.0, 0.10, 0.40, 0.10, 0.25, 0.05, 0.10], dtype=np.float32)
DRAWS = 50_000


def speculative_draws(p, q, draft_of, seed: int) -> np.ndarray:
    rng_draft, rng = np.random.default_rng([seed, 1]), np.random.default_rng(seed)
    return np.array([accept_or_resample(p, q, draft_of(rng_draft), rng) for _ in range(DRAWS)])


def test_speculative_sampling_preserves_the_target_distribution():
    tokens = speculative_draws(P, Q, lambda rng: int(rng.choice(len(Q), p=Q / Q.sum())), seed=0)
    assert np.bincount(tokens, minlength=len(P))[P == 0].sum() == 0   # never a token the target rules out
    stat, df = chi_square(tokens, P)
    assert stat < CHI2_999[df], stat
    # the test can fail: keeping every draft gives q's distribution, which is far from p
    naive = np.random.default_rng(0).choice(len(Q), size=DRAWS, p=Q / Q.sum())
    assert chi_square(naive[P[naive] > 0], P)[0] > 100 * CHI2_999[df]


@pytest.mark.parametrize("draft", [2, 4])    # an n-gram draft the target likes, and one it gives probability 0
def test_one_hot_drafts_preserve_the_target_distribution(draft):
    tokens = speculative_draws(P, None, lambda rng: draft, seed=1)
    assert np.bincount(tokens, minlength=len(P))[P == 0].sum() == 0
    stat, df = chi_square(tokens, P)
    assert stat < CHI2_999[df], stat


def test_seeded_speculative_sampling_is_reproducible_and_uses_the_sampling_filters(tiny_model, tiny_draft):
    params = SamplingParams(max_tokens=30, temperature=0.8, top_k=5, seed=3)
    a = generate(tiny_model, "hello", params, runner=speculative_runner(tiny_draft, 3))
    b = generate(tiny_model, "hello", params, runner=speculative_runner(tiny_draft, 3))
    assert a.token_ids == b.token_ids and a.speculative["draft_tokens"] > 0
    # every token must be one top_k=5 keeps at its step: check against plain decoding's logits, step by step
    cache = KVCache(tiny_model.config, 64)
    logits = prefill(tiny_model, tiny_model.tokenizer.encode("hello"), cache)
    for token in a.token_ids:
        assert token in np.argsort(-logits[0])[:5]
        logits = decode_step(tiny_model, [token], cache)


# ---------------------------------------------------------------------------------------------------- pieces

def test_ngram_drafter_proposes_what_followed_the_latest_match():
    drafter = NgramDrafter(SpeculativeConfig("ngram"))
    context = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert drafter.propose(context, 3, None, 0, None) == ([7, 8, 5], None)    # the most recent [1, 2, 3]
    assert drafter.propose([4, 5, 6], 3, None, 0, None) == ([], None)          # nothing repeats: no drafts
    assert drafter.propose([5, 6, 5], 4, None, 0, None) == ([6, 5], None)      # 1-gram [5], at most what follows


def test_json_has_speculative_only_when_used(tiny_model):
    params = SamplingParams(max_tokens=5, temperature=0.0)
    assert "speculative" not in generate(tiny_model, "hi", params).to_dict()
    stats = generate(tiny_model, "hi", params, runner=speculative_runner("ngram", 2)).to_dict()["speculative"]
    assert stats["method"] == "ngram" and stats["num_speculative_tokens"] == 2
    assert set(stats) >= {"draft_tokens", "accepted_tokens", "acceptance_rate", "target_passes",
                          "tokens_per_target_pass"}


def test_make_config_names_the_drafter(tiny_model):
    assert make_config(tiny_model, "self:1", 3).name == "self:1"
    assert make_config(tiny_model, tiny_model, 3).method == "model"


def test_cli_helpers(tiny_model, tiny_model_path):
    from minitransformer.cli.options import speculative_from_cli as from_cli
    from minitransformer.speculative import describe
    assert from_cli("ngram", None) == "ngram" and from_cli(None, None) is None
    with pytest.raises(InputError, match="needs --draft-model"):
        from_cli("model", None)
    with pytest.raises(InputError, match="only with --speculative model"):
        from_cli("ngram", str(tiny_model_path))
    assert from_cli("model", str(tiny_model_path)).config.vocab_size == tiny_model.config.vocab_size
    stats = generate(tiny_model, "hi", SamplingParams(max_tokens=6, temperature=0.0),
                     runner=speculative_runner(tiny_model, 2)).speculative
    assert describe(stats) == (f"speculative model k=2: {stats['draft_tokens']}/{stats['draft_tokens']} drafts "
                               f"accepted (100%), {stats['tokens_per_target_pass']:.2f} tokens per target pass")


def test_the_verify_step_samples_from_the_processed_target_distribution(tiny_model):
    """sample_next with a draft pending: penalties, temperature and top_k shape p exactly as in plain sampling."""
    from minitransformer.core.request import RequestState
    V = tiny_model.config.vocab_size
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 2, (1, V)).astype(np.float32)                  # (1, V)
    top = [int(i) for i in np.argsort(-logits[0])[:8]]
    params = SamplingParams(max_tokens=8, temperature=0.7, top_k=5, repetition_penalty=1.3, seed=0)
    request = make_request(tiny_model, [top[0], 3], params)
    output_ids = [top[1]]                                                 # penalised: it drops in the ranking
    # the reference, by hand: repetition penalty on prompt + output, temperature, top_k (no ties here), softmax
    x = logits[0].astype(np.float64).copy()
    for t in {top[0], 3, top[1]}:
        x[t] = x[t] / 1.3 if x[t] > 0 else x[t] * 1.3
    x /= 0.7
    keep = np.argsort(-x)[:5]
    p = np.zeros(V)
    p[keep] = np.exp(x[keep] - x[keep].max()) / np.exp(x[keep] - x[keep].max()).sum()
    q = np.zeros(V, dtype=np.float32)
    q[[top[0], top[2], top[7]]] = [0.5, 0.3, 0.2]                        # top[0] and top[7] fall outside p's support
    runner = SpeculativeRunner(tiny_model, request, SpeculativeConfig("ngram", k=1))
    state = RequestState(request, tiny_model.tokenizer, tiny_model.config.context_length, lambda: (0, 0))
    state.output_ids, state.generator = output_ids, np.random.default_rng(1)
    tokens = []
    for draft in np.random.default_rng(2).choice(V, size=10_000, p=q / q.sum()):
        runner.drafts, runner.qs, runner.row = [int(draft)], [q], 0            # what a verify pass leaves
        runner.stats.passes.append(VerifyPass([int(draft)]))                     # ... and its record
        tokens.append(runner.sample_next(logits, state))
    tokens = np.array(tokens)
    assert set(tokens) <= set(keep.tolist())
    stat, df = chi_square(tokens, p)
    assert df == 4 and stat < CHI2_999[df], stat


def test_self_drafter_sharing_the_target_cache_drafts_what_the_first_layers_alone_predict(real_model):
    """Reference: a copy of the model that has only its first 8 layers, run without any cache, greedy."""
    import copy
    truncated = copy.copy(real_model)
    truncated.layers = real_model.layers[:8]
    prompt = real_model.tokenizer.encode("The capital of France is")
    request = make_request(real_model, prompt, SamplingParams(max_tokens=8, temperature=0.0))
    runner = SpeculativeRunner(real_model, request, SpeculativeConfig("self", k=3, layers=8))
    first = int(np.argmax(runner.first_logits()[0]))
    runner.next_logits(first)                         # the self-drafter drafts 3 tokens, then the verify pass
    ids = prompt + [first]
    for draft in runner.drafts:
        logits = truncated.forward(np.asarray(ids)[None], np.arange(len(ids))[None], last_only=True)   # (1, V)
        assert draft == int(np.argmax(logits[0]))
        ids.append(draft)


def test_self_drafting_accepts_as_often_on_an_int8_cache_as_on_float32(real_model):
    """The self-drafter writes its drafts' keys into the target's cache through the cache's own storage, so on an
    int8 cache it drafts from the same (dequantized) keys the target reads: acceptance as on float32, within the
    noise int8 rounding adds (a near-tie draft may flip: 0.1 = 2 of ~22 drafts). A drafter writing floats into int8
    arrays accepted none here."""
    prompt = "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
    params = SamplingParams(max_tokens=24, temperature=0.0)
    runs = {kv: generate(real_model, prompt, params, runner=speculative_runner("self:20", 3), kv_cache=kv)
            for kv in ("f32", "int8")}
    rates = {kv: r.speculative["acceptance_rate"] for kv, r in runs.items()}
    assert rates["f32"] >= 0.3, rates                          # the prompt gives the drafter something to get right
    assert abs(rates["int8"] - rates["f32"]) <= 0.1, rates
    assert runs["int8"].token_ids == generate(real_model, prompt, params, kv_cache="int8").token_ids
