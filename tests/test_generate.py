"""The loop that wires the stages: equivalences (cache == no cache), the Result contract, streaming, metrics,
seeded reproducibility next to other requests, cancel / timeout (partial output, cache released), bad input."""

import importlib
import itertools

import numpy as np
import pytest

from minitransformer import SamplingParams, generate, stream
from minitransformer.core.errors import InputError
from minitransformer.core.kv_cache import KVCache, estimate_kv_bytes
from minitransformer.no_cache import RecomputeRunner

# the module, not the function `minitransformer.core.generate` that the package exports under the same name
generate_module = importlib.import_module("minitransformer.core.generate")
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_no_cache_greedy_equals_cached_greedy_on_the_real_model(real_model, prompt):
    cached = generate(real_model, prompt, greedy(64, ignore_eos=True))
    baseline = generate(real_model, prompt, greedy(64, ignore_eos=True), runner=RecomputeRunner)
    assert len(cached.token_ids) == 64
    assert cached.token_ids == baseline.token_ids
    assert baseline.kv_cache_tokens == 0 and cached.kv_cache_tokens == len(cached.prompt_token_ids) + 63


def test_result_contract_and_streamed_deltas_add_up(real_model):
    deltas = list(stream(real_model, "The capital of France is", greedy(24)))
    result = deltas[-1].result
    assert all(d.result is None and d.finish_reason is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas) == result.text
    assert [t for d in deltas for t in d.token_ids] == result.token_ids
    assert result.text == real_model.tokenizer.decode(result.token_ids, skip_special=True)
    assert result.text.startswith(" Paris")
    assert result.usage.prompt_tokens == len(result.prompt_token_ids) == 5
    assert result.usage.completion_tokens == len(result.token_ids)
    assert result.usage.total_tokens == 5 + len(result.token_ids)
    assert result.kv_cache_bytes == estimate_kv_bytes(real_model.config, result.kv_cache_tokens)
    out = result.to_dict()
    assert set(out) == {"text", "token_ids", "finish_reason", "stop_reason", "usage", "metrics", "kv_cache"}
    assert set(out["metrics"]) == {"queue_s", "prefill_s", "ttft_s", "itl_s", "tpot_s", "decode_tokens_per_s", "e2e_s"}


def test_metrics_follow_their_definitions(tiny_model):
    result = generate(tiny_model, "the cat", greedy(12, ignore_eos=True))
    m, n = result.metrics, len(result.token_ids)
    assert n == 12 and result.finish_reason == "length" and result.stop_reason is None
    assert 0 <= m.queue_s <= m.ttft_s <= m.e2e_s
    assert 0 < m.prefill_s <= m.ttft_s
    assert len(m.itl_s) == n - 1 and min(m.itl_s) >= 0
    assert m.tpot_s == pytest.approx((m.e2e_s - m.ttft_s) / (n - 1))
    assert m.decode_tokens_per_s == pytest.approx((n - 1) / (m.e2e_s - m.ttft_s))
    summary = m.itl_summary()
    assert summary["p50"] <= summary["p90"] <= summary["p99"] <= max(m.itl_s)
    assert summary["mean"] == pytest.approx(np.mean(m.itl_s))


def test_a_seeded_request_gives_the_same_tokens_alone_and_next_to_others(real_model):
    seeded = SamplingParams(max_tokens=16, temperature=1.5, seed=1234, ignore_eos=True)
    alone = generate(real_model, "My favourite word is", seeded).token_ids
    others = [stream(real_model, "A list of fruits:", SamplingParams(max_tokens=20, temperature=1.3, ignore_eos=True)),
              stream(real_model, "My favourite word is", SamplingParams(max_tokens=12, temperature=0.7, seed=99)),
              stream(real_model, "My favourite word is", seeded)]
    interleaved = {}
    for index, delta in ((i, d) for step in itertools.zip_longest(*others) for i, d in enumerate(step) if d):
        if delta.result is not None:
            interleaved[index] = delta.result.token_ids
    assert interleaved[2] == alone
    other_seed = SamplingParams(max_tokens=16, temperature=1.5, seed=4321, ignore_eos=True)
    assert generate(real_model, "My favourite word is", other_seed).token_ids != alone


def test_stop_string_is_cut_or_kept(real_model):
    cut = generate(real_model, "The capital of France is", greedy(20, stop=["."]))
    kept = generate(real_model, "The capital of France is", greedy(20, stop=["."], include_stop_str_in_output=True))
    assert (cut.text, cut.finish_reason, cut.stop_reason) == (" Paris", "stop", ".")
    assert kept.text == " Paris." and kept.token_ids == cut.token_ids


def test_min_tokens_holds_back_eos(real_model):
    free = generate(real_model, "Hi!", greedy(40), chat=True)
    assert free.stop_reason == "eos"
    n = len(free.token_ids)
    held = generate(real_model, "Hi!", greedy(n + 8, min_tokens=n + 4), chat=True)
    assert len(held.token_ids) >= n + 4
    assert real_model.tokenizer.eos_id not in held.token_ids[:n + 4]


def test_logprobs_are_the_raw_log_softmax(tiny_model):
    result = generate(tiny_model, "the cat", SamplingParams(max_tokens=4, temperature=0.0, logprobs=3,
                                                            repetition_penalty=1.5, ignore_eos=True))
    ids = result.prompt_token_ids + result.token_ids
    logits = tiny_model.forward(np.array([ids]), np.arange(len(ids))[None])[0].astype(np.float64)   # (T, V)
    for step, entry in enumerate(result.logprobs):
        row = logits[len(result.prompt_token_ids) - 1 + step]
        log_softmax = row - np.log(np.exp(row - row.max()).sum()) - row.max()
        assert entry["token_id"] == result.token_ids[step]
        assert entry["logprob"] == pytest.approx(log_softmax[entry["token_id"]], abs=1e-4)
        assert [i for i, _ in entry["top"]] == list(np.argsort(-log_softmax, kind="stable")[:3])


class CancelAfter:
    """A cancel flag that becomes set after `n` checks (one check per generated token)."""

    def __init__(self, n):
        self.calls, self.n = 0, n

    def is_set(self):
        self.calls += 1
        return self.calls > self.n


@pytest.fixture
def caches(monkeypatch):
    """Every KVCache the loop allocates, to check it was released."""
    made = []

    class Recorded(KVCache):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)
    monkeypatch.setattr(generate_module, "KVCache", Recorded)
    return made


def test_cancel_returns_the_partial_text_and_releases_the_cache(tiny_model, caches):
    deltas = list(stream(tiny_model, "the cat", greedy(50, ignore_eos=True), cancel=CancelAfter(5)))
    result = deltas[-1].result
    assert (result.finish_reason, result.stop_reason) == ("abort", "cancelled")
    assert len(result.token_ids) == 5 - 1 + 1          # one check before prefill, then one after each token
    assert "".join(d.text for d in deltas) == result.text == tiny_model.tokenizer.decode(result.token_ids)
    assert caches and all(c.k is None for c in caches)


def test_timeout_aborts_with_its_reason(tiny_model, caches, monkeypatch):
    clock = itertools.count(start=1000.0, step=0.25)                     # every reading 0.25 s later
    monkeypatch.setattr(generate_module, "now", lambda: next(clock))
    monkeypatch.setattr("minitransformer.core.stopping.now", lambda: next(clock))
    result = generate(tiny_model, "the cat", greedy(50, ignore_eos=True), timeout=2.0)
    assert (result.finish_reason, result.stop_reason) == ("abort", "timeout")
    assert 0 < len(result.token_ids) < 50
    assert caches and all(c.k is None for c in caches)
    with pytest.raises(InputError, match="timeout must be > 0"):
        generate(tiny_model, "the cat", greedy(5), timeout=0)


def test_closing_a_stream_early_releases_the_cache(tiny_model, caches):
    deltas = stream(tiny_model, "the cat", greedy(50, ignore_eos=True))
    next(deltas)
    deltas.close()
    assert caches and caches[0].k is None


@pytest.mark.parametrize("prompt,params,message", [
    ("", greedy(5), "prompt is empty"),
    ([], greedy(5), "no tokens"),
    ([5, 99999], greedy(5), "outside the vocabulary"),
    ([5, 6], greedy(5, stop_token_ids=[3, 264]), r"stop token id 264 is outside the vocabulary \[0, 264\)"),
    ([5, 6], greedy(127), r"prompt \(2 tokens\) \+ max_tokens \(127\) = 129 exceeds the context length of 128"),
])
def test_bad_requests_fail_before_any_work(tiny_model, caches, prompt, params, message):
    with pytest.raises(InputError, match=message):
        stream(tiny_model, prompt, params)
    assert caches == []
