"""The concept diagrams show the run's own numbers: block tables as the engine holds them after the same steps
replayed independently, a prefix block held by two tables, the draft-and-verify passes that add up to the speculative
run's counts and tokens (viz_concepts); the request flow's stage times inside the intervals its metrics recorded, the
KV cache's shape, bytes and keys as a replay holds them, and each product's shape as the model computes it (viz_flow,
viz_shapes). The last three run on the tiny model.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest

from minitransformer import KVCache, SamplingParams, generate
from minitransformer.core.backend import to_host
from minitransformer.core.decode import decode_step
from minitransformer.core.errors import InputError
from minitransformer.core.kv_storage import KVStorage
from minitransformer.core.prefill import prefill
from minitransformer.lab import viz, viz_concepts as vc, viz_flow as vf, viz_shapes as vs
from minitransformer.lab.machine import forward_cost
from minitransformer.serving import Engine
from test_bench_machine import record_attention_shapes
from test_figures import ROOT, png_size


def test_paged_attention_diagram_shows_the_engines_tables(real_model, tmp_path):
    path = tmp_path / "paged_attention.png"
    data = vc.draw_paged_attention(real_model, path)
    assert min(png_size(path)) > 300

    # Replay the same steps on a fresh engine, written out here rather than through run_paged_engine: first the
    # earlier traffic, three requests of 8 blocks each that fill the 24-block pool and leave.
    engine = Engine(real_model, max_num_seqs=4, num_blocks=vc.NUM_BLOCKS, block_size=vc.BLOCK_SIZE)
    for i, prompt in enumerate(vc.EARLIER_PROMPTS):
        fill = 8 * vc.BLOCK_SIZE + 1 - len(real_model.tokenizer.encode(prompt))
        engine.add_request(prompt, SamplingParams(max_tokens=fill, temperature=0.0, ignore_eos=True),
                           request_id=f"earlier {i}")
    engine.run()
    assert max(r.kv_cache_usage for r in engine.step_log) == 1.0 and not any(r.preempted for r in engine.step_log)
    assert engine.block_manager.num_free_blocks == vc.NUM_BLOCKS                # filled once, then all given back
    earlier_steps = engine.num_steps
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    engine.add_request(vc.PAGED_PROMPTS["A"], params, request_id="A")
    engine.step()
    engine.add_request(vc.PAGED_PROMPTS["B"], params, request_id="B")
    engine.add_request(vc.PAGED_PROMPTS["C"], params, request_id="C")
    for _ in range(vc.PAGED_STEPS - 1):
        engine.step()
    bm = engine.block_manager
    bm.check()
    assert data["steps"] == engine.num_steps == earlier_steps + vc.PAGED_STEPS
    assert {s["request_id"]: s["block_table"] for s in data["sequences"]} == bm.block_tables
    assert {s["request_id"]: s["num_computed_tokens"] for s in data["sequences"]} == {
        rid: seq.num_computed_tokens for rid, seq in engine.sequences.items()}
    assert data["ref_counts"] == bm.ref_counts and len(data["ref_counts"]) == vc.NUM_BLOCKS

    # A and B share their prompt's first full blocks: each such block is in both tables, with ref count 2.
    tables = bm.block_tables
    assert data["shared_blocks"] and data["prefix_cache_hits"] == len(data["shared_blocks"]) * vc.BLOCK_SIZE
    for block in data["shared_blocks"]:
        assert bm.ref_counts[block] == 2
        assert [rid for rid, table in tables.items() if block in table] == ["A", "B"]
    shared = len(data["shared_blocks"])
    assert tables["A"][:shared] == tables["B"][:shared] and sorted(tables["A"][:shared]) == data["shared_blocks"]
    assert not set(tables["C"]) & set(tables["A"] + tables["B"])
    # the point of the earlier traffic: the tables are scattered over the pool, not blocks 0, 1, 2, ...
    assert any(b != a + 1 for table in tables.values() for a, b in zip(table, table[1:]))


def test_draft_and_verify_diagram_adds_up_to_the_run(real_model, tmp_path, monkeypatch):
    """The diagram against the very run it drew (kept as run_speculative returns it rather than run a second time:
    that is the run the figure must add up to) and against plain greedy decoding of the same prompt."""
    runs = []
    speculative_run = vc.run_speculative
    monkeypatch.setattr(vc, "run_speculative", lambda model: runs.append(speculative_run(model)) or runs[-1])
    path = tmp_path / "draft_and_verify.png"
    data = vc.draw_draft_and_verify(real_model, path)
    assert min(png_size(path)) > 300
    (run,) = runs                                                             # the diagram ran it once
    plain = generate(real_model, vc.SPEC_PROMPT, vc.SPEC_PARAMS)
    passes, spec = data["passes"], run.speculative
    assert (spec["method"], spec["num_speculative_tokens"]) == ("ngram", vc.SPEC_K)     # what the title says
    assert data["token_ids"] == run.token_ids == plain.token_ids             # speculative greedy == plain greedy
    assert sum(p["accepted"] for p in passes) == spec["accepted_tokens"] == data["speculative"]["accepted_tokens"]
    assert len(passes) == spec["target_passes"]
    assert sum(len(p["drafted"][:p["accepted"] + 1]) for p in passes) == spec["draft_tokens"]   # checked drafts
    # each pass contributes its kept drafts, then the target's own token: together, the run's tokens
    rebuilt = [t for p in passes for t in p["drafted"][:p["accepted"]] + [p["target_token"]] if t is not None]
    assert rebuilt == run.token_ids
    assert any(p["accepted"] == len(p["drafted"]) == vc.SPEC_K for p in passes)   # a pass that kept all k drafts
    assert any(p["accepted"] < len(p["drafted"]) for p in passes)                 # and one that rejected a draft


# ---------------------------------------------------------------------------------------------------- request flow

def test_request_flow_diagram_shows_the_runs_own_times(tiny_model, tmp_path):
    path = tmp_path / "request_flow.png"
    prompt = "Why is the sky blue?"
    data = vf.draw_request_flow(tiny_model, path, prompt=prompt, chat=False, repeats=2)
    assert min(png_size(path)) > 300
    result, m = data["result"], data["metrics"]
    assert len(data["e2e_of_runs"]) == 2 and m.e2e_s == min(data["e2e_of_runs"])     # the fastest run is drawn
    assert result.token_ids == generate(tiny_model, prompt, vf.FLOW_PARAMS).token_ids      # timing changes nothing

    # the timeline drawn is the request's own metrics, and its parts add up to the end-to-end time
    assert data["timeline"] == {"queue": m.queue_s, "prefill + first sample": m.prefill_s,
                                "decode loop": m.token_times[-1] - m.token_times[0],
                                "finalize": m.finished_time - m.token_times[-1]}
    assert (data["e2e_s"], data["ttft_s"]) == (m.e2e_s, m.ttft_s)
    assert sum(data["timeline"].values()) == pytest.approx(m.e2e_s, rel=1e-9)

    # each stage was called as often as the loop needs it, and its time lies inside the interval that holds it
    n, stages = len(result.token_ids), data["stages"]
    assert n == vf.FLOW_PARAMS.max_tokens
    calls = {stage: s["calls"] for stage, s in stages.items()}
    assert (calls["tokenize"], calls["schedule"], calls["prefill"], calls["sample"], calls["decode"]) == (
        1, 1, 1, n, n - 1)
    assert calls["KV cache"] == 2 * tiny_model.config.n_layers * n      # a write and a read per layer and pass
    assert calls["stream"] >= n and calls["stop checks"] >= n
    seconds = {stage: s["seconds"] for stage, s in stages.items()}
    assert all(t > 0 for t in seconds.values())
    assert seconds["tokenize"] + seconds["schedule"] <= m.queue_s
    assert seconds["prefill"] <= m.prefill_s and seconds["decode"] <= data["timeline"]["decode loop"]
    assert seconds["KV cache"] <= seconds["prefill"] + seconds["decode"]
    assert data["untimed_s"] == pytest.approx(m.e2e_s - sum(t for s, t in seconds.items() if s != "KV cache"))
    assert data["untimed_s"] > 0
    assert {stage: s["files"] for stage, s in stages.items()} == {
        "tokenize": ["core/tokenizer.py"], "schedule": ["core/kv_cache.py"], "prefill": ["core/prefill.py"],
        "KV cache": ["core/kv_storage.py"], "sample": ["core/sampling.py"], "decode": ["core/decode.py"],
        "stream": ["core/detokenizer.py"], "stop checks": ["core/stopping.py"]}

    # and every wrapped function is back in place (generate.py's module, not the function the package exports)
    assert importlib.import_module("minitransformer.core.generate").prefill is prefill
    assert not hasattr(KVStorage.put, "__wrapped__")


def test_stage_timer_times_the_outer_call_once_and_restores(tiny_model):
    tok = tiny_model.tokenizer
    stages = {"tokenize": ["tokenizer:Tokenizer.encode_chat", "tokenizer:Tokenizer.encode"]}
    originals = (type(tok).encode_chat, type(tok).encode)
    with vf.StageTimer(stages) as timer:
        tok.encode_chat([{"role": "user", "content": "hi"}])           # calls encode inside: one timed call
        assert timer.calls["tokenize"] == 1
        tok.encode("hi")
    assert timer.calls["tokenize"] == 2 and timer.seconds["tokenize"] > 0
    assert (type(tok).encode_chat, type(tok).encode) == originals
    with pytest.raises(InputError):                                    # an error inside still puts them back
        with vf.StageTimer({"schedule": ["kv_cache:KVCache.__init__"]}):
            KVCache(tiny_model.config, 10**9)
    assert not hasattr(KVCache.__init__, "__wrapped__")
    with pytest.raises(AttributeError):                                # a target that does not resolve, after one
        with vf.StageTimer({"prefill": ["prefill:prefill"], "typo": ["prefill:prefil"]}):    # that did
            pass
    assert importlib.import_module("minitransformer.core.generate").prefill is prefill


# ---------------------------------------------------------------------------------------------------- KV cache

def test_kv_cache_growth_diagram_shows_the_caches_shape_bytes_and_keys(tiny_model, tmp_path):
    path = tmp_path / "kv_cache_growth.png"
    prompt = "The cat sat on"
    data = vs.draw_kv_cache_growth(tiny_model, path, prompt=prompt)
    assert min(png_size(path)) > 300
    c, layer = tiny_model.config, data["layer"]

    # replay: prefill, then greedy decode by argmax (not sampling.sample), into a cache of the same size
    ids = tiny_model.tokenizer.encode(prompt)
    cache = KVCache(c, len(ids) + max(vs.KV_SNAPSHOTS))
    logits, output = prefill(tiny_model, ids, cache), []
    shots = {shot["steps"]: shot for shot in data["snapshots"]}
    assert sorted(shots) == sorted(vs.KV_SNAPSHOTS) and data["max_len"] == cache.max_len
    for step in range(max(vs.KV_SNAPSHOTS) + 1):
        if step in shots:
            shot, length = shots[step], len(ids) + step
            assert shot["length"] == cache.length == length
            assert shot["shape"] == cache.shape == (c.n_layers, 1, length, c.n_kv_heads, c.head_dim)
            assert shot["bytes_used"] == cache.bytes_used == 2 * c.n_layers * c.n_kv_heads * length * c.head_dim * 4
            assert shot["bytes_reserved"] == cache.bytes_reserved
            expected = to_host(cache.k[layer, 0, :length].transpose(1, 0, 2))          # (K, length, d)
            np.testing.assert_allclose(shot["k"], expected, rtol=0, atol=1e-6)
        if step < max(vs.KV_SNAPSHOTS):
            output.append(int(np.argmax(to_host(logits)[0])))
            logits = decode_step(tiny_model, [output[-1]], cache)
    assert data["prompt_ids"] == ids and data["output_ids"] == output
    assert len(data["pieces"]) == data["max_len"]
    # the cache only appends: what an earlier snapshot held is still there, bit for bit
    for before, after in zip(data["snapshots"], data["snapshots"][1:]):
        assert np.array_equal(after["k"][:, :before["length"]], before["k"])


# ---------------------------------------------------------------------------------------------------- shapes

def test_prefill_vs_decode_shapes_are_the_models_products(tiny_model, tmp_path):
    path, T = tmp_path / "prefill_vs_decode_shapes.png", 16
    data = vs.draw_prefill_vs_decode_shapes(tiny_model, path, prompt_tokens=T)
    assert min(png_size(path)) > 300
    c, layer = tiny_model.config, tiny_model.layers[0]
    D, H, K, d, F, G = c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.n_heads // c.n_kv_heads
    assert data["weights"] == {"qkv": layer.w_qkv.shape, "wo": layer.wo.shape, "gate|up": layer.w_gate_up.shape,
                               "down": layer.w_down.shape}
    assert data["weights"] == {"qkv": (D, (H + 2 * K) * d), "wo": (H * d, D), "gate|up": (D, 2 * F), "down": (F, D)}

    # the attention products the model really computes (a spy on layers.attention): (B, T queries, S keys)
    cache = KVCache(c, T + 1)
    ids = list(range(5, 5 + T))
    assert record_attention_shapes(tiny_model, lambda: prefill(tiny_model, ids, cache)) == [(1, T, T)] * c.n_layers
    assert record_attention_shapes(tiny_model, lambda: decode_step(tiny_model, [7], cache)) == [
        (1, 1, T + 1)] * c.n_layers
    for phase, rows, S in (("prefill", T, T), ("decode", 1, T + 1)):
        ops = {op["name"]: op for op in data[phase]}
        assert list(ops) == ["qkv", "q k^T", "probs v", "wo", "gate|up", "down"]
        for name in ("qkv", "wo", "gate|up", "down"):
            assert (ops[name]["rows"], ops[name]["inner"], ops[name]["cols"]) == (rows, *data["weights"][name])
        assert [(ops[n]["rows"], ops[n]["inner"], ops[n]["cols"], ops[n]["count"]) for n in ("q k^T", "probs v")] == [
            (G * rows, d, S, K), (G * rows, S, d, K)]                  # per KV head, its G query heads stacked
        for op in ops.values():
            assert op["flops"] == 2 * op["rows"] * op["inner"] * op["cols"] * op["count"]
        # the same count as forward_cost: FLOPs and bytes exactly (q read by q k^T and the attention output
        # written by probs v included)
        cost = forward_cost(c, rows, S - rows)
        assert c.n_layers * sum(op["flops"] for op in ops.values()) + 2 * D * c.vocab_size == cost.flops
        others = (D * c.vocab_size + (2 * c.n_layers + 1) * D) * 4                 # lm_head and norms' weights
        kv_written, logits_io = 2 * c.n_layers * K * rows * d * 4, (D + c.vocab_size) * 4
        assert c.n_layers * sum(op["bytes"] for op in ops.values()) + others + kv_written + logits_io == cost.bytes
    assert data["decode"][0]["flops"] / data["decode"][0]["bytes"] < 0.5 < data["prefill"][0]["flops"] / (
        data["prefill"][0]["bytes"])


# ---------------------------------------------------------------------------------------------------- --only

def test_figures_only_draws_the_named_figures(tiny_model_path, tmp_path, monkeypatch):
    out = tmp_path / "figs"
    cli = subprocess.run([sys.executable, "-m", "minitransformer", "figures", "--only",
                          "prefill_vs_decode_shapes,kv_cache_growth.png", "--out", str(out), "--model",
                          str(tiny_model_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert cli.returncode == 0, cli.stderr[-3000:]
    names = ["kv_cache_growth.png", "prefill_vs_decode_shapes.png"]             # in the order figures are drawn
    assert cli.stdout.split() == [str(out / name) for name in names]
    assert sorted(p.name for p in out.iterdir()) == names
    bad = subprocess.run([sys.executable, "-m", "minitransformer", "figures", "--only", "flow.png"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert bad.returncode == 2 and "request_flow.png" in bad.stderr and "Traceback" not in bad.stderr

    # a measured figure: only its own measurement runs
    def not_needed(*args):
        raise AssertionError("measured although no chosen figure needs it")
    for name in ("measure_ttft", "measure_itl", "measure_cache_vs_no_cache", "measure_peaks"):
        monkeypatch.setattr(viz, name, not_needed)
    paths = viz.make_figures(out, quick=True, model_path=tiny_model_path, only="kv_cache_bytes")
    assert paths == [out / "kv_cache_bytes.png"] and png_size(paths[0]) == (1000, 440)       # two panels, 10 x 4.4 in
    assert viz.select_figures(None) == list(viz.FIGURES + viz.CONCEPT_FIGURES)


# ---------------------------------------------------------------------------------------------------- tensor parallel

class _Rank:
    """What load_model asks of a communicator to load one rank's shard (no collective runs here)."""
    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size


@pytest.mark.parametrize("size", [2, 4])
def test_tensor_parallel_layer_diagram_is_what_each_rank_loads(tiny_model_path, tiny_model, tmp_path, size):
    """The drawn shapes and spans are those of the arrays each rank's loader reads, and those arrays are the whole
    model's columns (w_qkv, w_gate_up) and rows (wo, w_down) at the drawn spans. The tiny model: 4 query heads,
    2 KV heads, FFN 128; at 4 ranks each KV head is replicated on 2 ranks."""
    from minitransformer import load_model
    from minitransformer.lab.viz_parallel import draw_tensor_parallel_layer
    path = tmp_path / "tp.png"
    data = draw_tensor_parallel_layer(tiny_model.config, size, path)
    assert min(png_size(path)) > 200
    whole, c = tiny_model.layers[0], tiny_model.config
    d = c.head_dim
    assert data["kv_replicas"] == max(1, size // c.n_kv_heads) and len(data["ranks"]) == size
    assert data["whole"] == {"w_qkv": whole.w_qkv.shape, "wo": whole.wo.shape, "w_gate_up": whole.w_gate_up.shape,
                             "w_down": whole.w_down.shape}
    for drawn in data["ranks"]:
        layer = load_model(tiny_model_path, comm=_Rank(drawn["rank"], size)).layers[0]
        assert drawn["shapes"] == {f: getattr(layer, f).shape for f in ("w_qkv", "wo", "w_gate_up", "w_down")}
        (q0, q1), (k0, k1), (f0, f1) = drawn["q_heads"], drawn["kv_heads"], drawn["ffn_columns"]
        np.testing.assert_array_equal(layer.wq, whole.wq[:, q0 * d:q1 * d])
        np.testing.assert_array_equal(layer.wk, whole.wk[:, k0 * d:k1 * d])
        np.testing.assert_array_equal(layer.wo, whole.wo[q0 * d:q1 * d])
        np.testing.assert_array_equal(layer.w_gate, whole.w_gate[:, f0:f1])
        np.testing.assert_array_equal(layer.w_down, whole.w_down[f0:f1])
        # GQA: every query head the rank holds reads a KV head the rank holds
        assert {q // c.group_size for q in range(q0, q1)} <= set(range(k0, k1))
    assert data["all_reduce_bytes_per_token"] == c.d_model * 4
    with pytest.raises(InputError, match="cannot split the query heads"):
        draw_tensor_parallel_layer(tiny_model.config, 3, path)
