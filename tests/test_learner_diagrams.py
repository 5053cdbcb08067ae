"""The learner's diagrams show the run's own numbers: one query against the cache (viz_attention) is the model's own
step, and the requests that fit (viz_capacity) follow from a real cache's bytes and the loaded weights."""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer import KVCache, viz_attention as va, viz_capacity as vcap
from minitransformer.backend import to_host
from minitransformer.decode import decode_step
from minitransformer.kv_cache import estimate_kv_bytes
from minitransformer.prefill import prefill
from test_figures import png_size


def test_query_vs_cache_is_the_models_own_decode_step(real_model, tmp_path):
    path = tmp_path / "query_vs_cache.png"
    data = va.draw_query_vs_cache(real_model, path)
    assert min(png_size(path)) > 300
    config, prompt_ids = real_model.config, real_model.tokenizer.encode(va.KV_PROMPT)

    # The keys and values drawn are what a plain KVCache holds after prefilling the prompt and the step's token.
    cache = KVCache(config, len(prompt_ids) + 1, xp=real_model.xp)
    logits = to_host(prefill(real_model, prompt_ids, cache))
    assert data["new_token"] == int(np.argmax(logits[0]))
    decode_step(real_model, [data["new_token"]], cache)
    assert len(data["probs"]) == cache.length == len(prompt_ids) + 1
    keys = to_host(cache.k[data["layer"], 0, data["kv_head"], :cache.length])
    values = to_host(cache.v[data["layer"], 0, data["kv_head"], :cache.length])
    np.testing.assert_allclose(data["k"], keys, atol=1e-5)
    np.testing.assert_allclose(data["v"], values, atol=1e-5)

    # The picture's arithmetic is attention's: softmax(q.k / sqrt(d)) @ V, equal to the model's output for the head.
    assert data["kv_head"] == data["head"] // config.group_size
    scores = data["k"] @ data["q"] / np.sqrt(config.head_dim)
    np.testing.assert_allclose(data["scores"], scores, rtol=1e-6)
    assert data["probs"].sum() == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(data["weighted"], data["model_out"], atol=1e-5)
    # The head drawn is its layer's one with the least weight on the first token.
    assert data["probs"][0] == pytest.approx(min(data["first_token_weights"]), abs=1e-3)
    assert len(data["first_token_weights"]) == config.n_heads


def test_users_that_fit_follow_from_the_cache_and_the_weights(real_model, tmp_path):
    path = tmp_path / "users_that_fit.png"
    ours, big = vcap.draw_users_that_fit(real_model, path)
    assert min(png_size(path)) > 300

    # This model: a real cache's bytes per token, the loaded weights, this machine's memory.
    assert ours.kv_bytes_per_token == estimate_kv_bytes(real_model.config, 1)
    assert ours.weight_bytes == real_model.weight_bytes
    assert ours.memory == vcap.memory_bytes()
    assert max(ours.contexts) <= real_model.config.context_length
    for context in ours.contexts:
        fit = ours.users(context)
        assert fit * context * ours.kv_bytes_per_token <= ours.left < (fit + 1) * context * ours.kv_bytes_per_token

    # The 8B shape: Llama 3.1 8B's published parameter count, its KV cache at 2 bytes per value.
    assert vcap.parameter_count(vcap.LLAMA_3_1_8B) == 8_030_261_248
    assert big.weight_bytes == 2 * 8_030_261_248
    c = vcap.LLAMA_3_1_8B
    assert big.kv_bytes_per_token == 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2 == 131_072
    assert big.users(8192) == int((0.9 * 141e9 - 2 * 8_030_261_248) // (131_072 * 8192)) == 103


def test_parameter_count_matches_the_weights_the_model_loaded(real_model):
    """The same count for the model on disk: its float32 weights are 4 bytes per parameter."""
    assert vcap.parameter_count(real_model.config) * 4 == real_model.weight_bytes


def test_request_timeline_is_the_requests_own_timestamps(real_model, tmp_path):
    from minitransformer import viz_timeline as vt

    path = tmp_path / "request_timeline.png"
    data = vt.draw_request_timeline(real_model, path)
    assert min(png_size(path)) > 300
    a, b = data["a"], data["b"]
    assert len(a["tokens"]) == vt.A_TOKENS and len(b["tokens"]) == vt.TIMELINE_PARAMS_B.max_tokens
    # The metrics' definitions, from the drawn timestamps (ms after A arrived).
    assert a["ttft"] == pytest.approx(a["tokens"][0] - a["arrival"], abs=1e-6)
    assert a["e2e"] == pytest.approx(a["finished"] - a["arrival"], abs=1e-6)
    np.testing.assert_allclose(a["itl"], np.diff(a["tokens"]), atol=1e-6)
    assert a["tpot"] == pytest.approx((a["e2e"] - a["ttft"]) / (vt.A_TOKENS - 1), abs=1e-6)
    # The order of the run: queue, then prefill, then tokens; B arrives after A's B_AFTER-th token.
    for life in (a, b):
        assert life["arrival"] <= life["scheduled"] < life["tokens"][0] <= life["tokens"][-1] <= life["finished"]
    assert a["tokens"][vt.B_AFTER - 1] < b["arrival"] < a["tokens"][vt.B_AFTER]
    # The annotation's claim is checked, not assumed: B was scheduled inside the gap drawn red.
    slow = data["slowest_gap"]
    assert data["b_prefill_in_slowest_gap"] == (a["tokens"][slow] < b["scheduled"] < a["tokens"][slow + 1])
    assert a["itl"][slow] == max(a["itl"])


def test_batching_sweep_is_timed_steps_and_the_h200_roofline(real_model, tmp_path):
    from minitransformer import viz_batching as vb
    from minitransformer.bench.machine import H200

    sweep = vb.measure_batch_sweep(real_model, batches=(1, 2), context=16, repeats=2)
    assert sweep.batches == (1, 2) and len(sweep.step_s) == len(sweep.slowest_s) == 2
    assert all(0 < fast <= slow for fast, slow in zip(sweep.step_s, sweep.slowest_s))
    assert sweep.tokens_per_s == [1 / sweep.step_s[0], 2 / sweep.step_s[1]]
    assert sweep.h200_step_s == [H200.seconds(H200.cost(real_model.config, 1, 16, batch=b)) for b in (1, 2)]
    path = tmp_path / "batching_sweep.png"
    vb.draw_batching_sweep(real_model, sweep, "test run", path)
    assert min(png_size(path)) > 300


def test_batching_stops_paying_where_no_later_doubling_gains():
    from minitransformer.viz_batching import stops_paying

    assert stops_paying((1, 2, 4, 8), [10, 19, 30, 33]) == 4          # 30 -> 33 is x1.1, the last doubling
    assert stops_paying((1, 2, 4, 8, 16), [10, 19, 30, 33, 34]) == 4  # from 4 on, no doubling pays
    assert stops_paying((1, 2, 4, 8), [10, 19, 30, 40]) is None        # the last doubling still gained x1.33
    assert stops_paying((1, 2, 4, 8), [10, 8, 20, 40]) is None         # a dip at 2 is not the end of batching
    assert stops_paying((1, 2), [10, 11]) == 1
    assert stops_paying((1, 4), [10, 11]) is None                      # no doubling in the sweep: nothing to say
    assert stops_paying((1, 2, 8, 16), [10, 19, 40, 42]) == 8          # only doublings count
