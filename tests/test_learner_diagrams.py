"""The learner's diagrams show the run's own numbers: one query against the cache (viz_attention) is the model's own
step, and the requests that fit (viz_capacity) follow from a real cache's bytes and the loaded weights."""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer import KVCache
from minitransformer.core.backend import to_host
from minitransformer.core.decode import decode_step
from minitransformer.core.kv_cache import estimate_kv_bytes
from minitransformer.core.prefill import prefill
from minitransformer.lab import viz_attention as va, viz_capacity as vcap
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
    keys = to_host(cache.k[data["layer"], 0, :cache.length, data["kv_head"]])
    values = to_host(cache.v[data["layer"], 0, :cache.length, data["kv_head"]])
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
    from minitransformer.lab import viz_timeline as vt

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
    from minitransformer.lab import viz_batching as vb
    from minitransformer.lab.machine import H200

    sweep = vb.measure_batch_sweep(real_model, batches=(1, 2), context=16, repeats=2)
    assert sweep.batches == (1, 2) and len(sweep.step_s) == len(sweep.slowest_s) == 2
    assert all(0 < fast <= slow for fast, slow in zip(sweep.step_s, sweep.slowest_s))
    assert sweep.tokens_per_s == [1 / sweep.step_s[0], 2 / sweep.step_s[1]]
    assert sweep.h200_step_s == [H200.seconds(H200.cost(real_model.config, 1, 16, batch=b)) for b in (1, 2)]
    path = tmp_path / "batching_sweep.png"
    vb.draw_batching_sweep(real_model, sweep, "test run", path)
    assert min(png_size(path)) > 300


def test_batching_stops_paying_where_no_later_doubling_gains():
    from minitransformer.lab.viz_batching import stops_paying

    assert stops_paying((1, 2, 4, 8), [10, 19, 30, 33]) == 4          # 30 -> 33 is x1.1, the last doubling
    assert stops_paying((1, 2, 4, 8, 16), [10, 19, 30, 33, 34]) == 4  # from 4 on, no doubling pays
    assert stops_paying((1, 2, 4, 8), [10, 19, 30, 40]) is None        # the last doubling still gained x1.33
    assert stops_paying((1, 2, 4, 8), [10, 8, 20, 40]) is None         # a dip at 2 is not the end of batching
    assert stops_paying((1, 2), [10, 11]) == 1
    assert stops_paying((1, 4), [10, 11]) is None                      # no doubling in the sweep: nothing to say
    assert stops_paying((1, 2, 8, 16), [10, 19, 40, 42]) == 8          # only doublings count


# ---------------------------------------------------------------------------------------------------- serving trade-off

def test_serving_tradeoff_points_are_the_runs_own_numbers(real_model, tmp_path):
    """Every run is lesson 14's loop on the real engine; the points drawn are its fastest runs' own throughput
    (tokens / wall time) and TTFT p99 (over its requests' TTFTs), labelled with their max_num_seqs."""
    from minitransformer.lab import viz_tradeoff as vt
    from minitransformer.lab.engine_load import arrival_offsets

    settings = vt.LoadSweep(rates=(4.0, float("inf")), slots=(1, 2), requests=3, max_tokens=3, max_prompt=24,
                            repeats=2)
    ticks = []
    data = vt.measure_tradeoff(real_model, settings, tick=lambda: ticks.append(1))
    assert len(ticks) == settings.runs == 8
    assert set(data.runs) == {(rate, m) for rate in settings.rates for m in settings.slots}
    for (rate, _slots), done in data.runs.items():
        assert len(done) == settings.repeats
        last = arrival_offsets(settings.requests, rate, settings.seed)[-1]
        for run in done:
            assert run["tokens"] == settings.requests * settings.max_tokens           # ignore_eos: every token
            assert run["tok_s"] == run["tokens"] / run["wall_s"]
            assert len(run["ttft_s"]) == settings.requests
            assert run["ttft99"] == float(np.percentile(run["ttft_s"], 99))
            assert run["wall_s"] > last                                               # the last must arrive first
            assert run["tok_s"] <= data.bound[rate]                                   # what arrives caps it
    for rate in settings.rates:                                                       # the bound, worked out here
        fastest = min(run["fastest_service"] for m in settings.slots for run in data.runs[rate, m])
        last = arrival_offsets(settings.requests, rate, settings.seed)[-1]
        assert data.bound[rate] == pytest.approx(settings.requests * settings.max_tokens / (last + fastest))

    path = tmp_path / "serving_tradeoff.png"
    drawn = vt.draw_serving_tradeoff(data, "test run", path)
    assert png_size(path) == (900, 560)
    for rate in settings.rates:
        best = [max(data.runs[rate, m], key=lambda run: run["tok_s"]) for m in settings.slots]
        assert drawn["points"][rate] == ([run["tok_s"] for run in best], [run["ttft99"] for run in best])
        assert drawn["labels"][rate] == [str(m) for m in settings.slots]
        assert drawn["bounds"][rate] == data.bound[rate]
        assert drawn["knees"][rate] == vt.knee(settings.slots, [run["tok_s"] for run in best], data.bound[rate])
    assert len(drawn["rings"]) == sum(m is not None for m in drawn["knees"].values())


def test_serving_tradeoff_takes_lesson_14s_auto_rates_from_this_machine(real_model, tmp_path):
    """The figure's rates are lesson 14's --rates auto (rates None): measured first, the light one LIGHT and the
    heavy one HEAVY times the requests/s the most slots served with every request at once, to two digits; the title
    names that yardstick. Fixed rates of 2 and 8 were past a slow machine's capacity, and its figure had no knee."""
    from minitransformer.lab import engine_load, viz_tradeoff as vt

    assert vt.LOAD_SWEEP.rates is None
    settings = vt.LoadSweep(rates=None, slots=(1, 2), requests=3, max_tokens=3, max_prompt=24, repeats=1)
    data = vt.measure_tradeoff(real_model, settings)
    assert data.served is not None
    tok_s, per_second = data.served
    assert per_second == pytest.approx(tok_s / settings.max_tokens)          # 3 tokens per request (ignore_eos)
    assert data.rates == (float(f"{engine_load.LIGHT * per_second:.2g}"),
                          float(f"{engine_load.HEAVY * per_second:.2g}"))
    assert set(data.runs) == {(rate, m) for rate in data.rates for m in settings.slots}
    assert settings.runs == len(data.runs) * settings.repeats               # the progress bar's count
    drawn = vt.draw_serving_tradeoff(data, "test run", tmp_path / "serving_tradeoff.png")
    assert f"the {per_second:.2f} requests/s that 2 slots served on this machine" in drawn["title"]


def test_the_knee_is_the_fewest_slots_at_what_arrives():
    from minitransformer.lab.viz_tradeoff import knee

    slots = (1, 2, 4, 8, 16)
    assert knee(slots, [33, 37, 40, 42, 43], bound=51.5) == 8               # 42 >= 0.8 x 51.5 = 41.2
    assert knee(slots, [33, 37, 40, 42, 43], bound=50.0) == 4               # exactly 80%: reached
    assert knee(slots, [35, 40, 45, 60, 71], bound=169.0) is None           # the engine still limits at 16
    assert knee(slots, [45, 30, 44, 46, 47], bound=50.0) == 4               # a dip below it: not yet
    assert knee(slots, [45, 46, 47, 48, 39], bound=50.0) is None            # the most slots fell below it


def planted(tok_s: dict, ttft: dict, bound: dict, spread: float = 0.9):
    """A Tradeoff with two runs per configuration: the given numbers and a slower run (tok/s x spread, TTFT /
    spread)."""
    from minitransformer.lab import viz_tradeoff as vt

    rates = tuple(tok_s)
    settings = vt.LoadSweep(rates=rates, slots=(1, 4, 16), requests=16, max_tokens=24, max_prompt=160, repeats=2)
    runs = {(rate, m): [{"tok_s": tok_s[rate][i], "ttft99": ttft[rate][i]},
                        {"tok_s": tok_s[rate][i] * spread, "ttft99": ttft[rate][i] / spread}]
            for rate in rates for i, m in enumerate(settings.slots)}
    return vt.Tradeoff(settings, runs, bound)


def test_the_figures_notes_follow_the_numbers(tmp_path):
    """A planted run: the ring and its note only where a rate reached what arrives; the TTFT cost only when every
    run of the most slots was slower to a first token than every run at the knee; a log axis only over a decade."""
    from minitransformer.lab import viz_tradeoff as vt

    data = planted({2.0: [33, 42, 43], 8.0: [35, 45, 71]}, {2.0: [4.1, 0.5, 0.9], 8.0: [8.5, 5.4, 1.27]},
                   {2.0: 50.0, 8.0: 169.0})
    drawn = vt.draw_serving_tradeoff(data, "planted", tmp_path / "a.png")
    assert drawn["knees"] == {2.0: 4, 8.0: None}
    assert drawn["rings"] == [(42, 0.5)]                                    # the fastest run at the knee
    notes = " ".join(drawn["notes"])
    assert "2 requests/s: from 4 slots on" in notes and "8 requests/s: 16 slots did not reach 80%" in notes
    assert "16 slots cost TTFT p99 against 4 (best runs 0.50 -> 0.90 s" in notes   # 0.9 > 0.5 / 0.9: runs apart
    assert drawn["log_y"]                                                   # 0.5 .. 9.4 s

    close = planted({2.0: [33, 42, 43]}, {2.0: [4.1, 0.5, 0.52]}, {2.0: 50.0})
    drawn = vt.draw_serving_tradeoff(close, "planted", tmp_path / "b.png")
    assert drawn["knees"] == {2.0: 4} and "cost TTFT p99" not in " ".join(drawn["notes"])   # within the spread
    assert not drawn["log_y"]                                               # 0.5 .. 4.6 s: under a decade

    never = planted({8.0: [35, 45, 71]}, {8.0: [8.5, 5.4, 1.27]}, {8.0: 169.0})
    drawn = vt.draw_serving_tradeoff(never, "planted", tmp_path / "c.png")
    assert drawn["rings"] == [] and drawn["knees"] == {8.0: None}


def test_serving_tradeoff_is_timed_and_refused_on_a_busy_machine(tiny_model_path, tmp_path, monkeypatch):
    import io

    from rich.console import Console

    from minitransformer.lab import viz
    from test_figures import busy_run

    assert "serving_tradeoff.png" in viz.FIGURES and "serving_tradeoff.png" in viz.TIMED
    busy = busy_run(monkeypatch, quiet=False)
    console = Console(file=io.StringIO(), width=300)
    written = viz.make_figures(tmp_path, quick=True, model_path=tiny_model_path, console=console,
                               only="serving_tradeoff")
    assert written == [] and not (tmp_path / "serving_tradeoff.png").exists()
    assert viz.refusal("serving_tradeoff.png", busy) in console.file.getvalue()
