"""The serving engine: every request gives the tokens it gives alone via generate() (greedy and seeded, all
policies, through chunked prefill, prefix hits and preemption), the edge cases of the issue, admission control,
streaming, metrics and stats, and what the static / priority policies promise."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitransformer import SamplingParams, generate
from minitransformer.core.errors import InputError
from minitransformer.serving import Engine, SequenceStatus


def greedy(n, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def prompts_of(lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, 260, size=n)] for n in lengths]


def alone(model, prompt, params):
    return generate(model, prompt, params)


def assert_same_as_alone(model, results, requests):
    for rid, (prompt, params) in requests.items():
        ref, got = alone(model, prompt, params), results[rid]
        assert got.token_ids == ref.token_ids, rid
        assert (got.text, got.finish_reason, got.stop_reason) == (ref.text, ref.finish_reason, ref.stop_reason)
        assert (got.logprobs is None) == (ref.logprobs is None)
        for mine, theirs in zip(got.logprobs or [], ref.logprobs or []):
            assert [t[0] for t in mine["top"]] == [t[0] for t in theirs["top"]] and len(mine["top"]) == 3
            np.testing.assert_allclose([mine["logprob"]] + [t[1] for t in mine["top"]],
                                       [theirs["logprob"]] + [t[1] for t in theirs["top"]], atol=1e-4)


# ------------------------------------------------------------------------------------------- equivalence

# The tiny model's random weights make its next-token distributions nearly one-hot (the top probability is ~1 - 1e-10
# at temperature 1), so its seeded rows sample at temperature 5, where ten seeds give nine different outputs: a
# request that drew from the wrong generator, or drew twice, would show.
HOT = 5.0
MIXED = [greedy(20, ignore_eos=True), SamplingParams(max_tokens=15, temperature=HOT, seed=7, ignore_eos=True),
         SamplingParams(max_tokens=12, temperature=HOT, top_k=20, top_p=0.9, seed=3, min_tokens=4),
         greedy(9, repetition_penalty=1.3, stop=["e"]),
         SamplingParams(max_tokens=18, temperature=HOT, seed=11, presence_penalty=0.5, ignore_eos=True),
         greedy(25, min_tokens=5, frequency_penalty=0.4, logprobs=3)]


@pytest.mark.parametrize("policy", ["continuous", "static", "priority"])
def test_every_request_gives_the_tokens_it_gives_alone_on_the_tiny_model(tiny_model, policy):
    """Mixed prompt lengths, greedy and seeded sampling, a small pool (preemption) and a small token budget
    (chunked prefill next to decodes)."""
    engine = Engine(tiny_model, max_num_seqs=5, num_blocks=14, block_size=4, policy=policy,
                    max_num_batched_tokens=12)
    requests = {}
    for i, prompt in enumerate(prompts_of([1, 4, 17, 33, 8, 12, 26, 3, 40], seed=1)):
        params = MIXED[i % len(MIXED)]
        requests[engine.add_request(prompt, params, priority=i % 3)] = (prompt, params)
    results = engine.run()
    assert_same_as_alone(tiny_model, results, requests)
    assert engine.block_manager.num_free_blocks == 14
    assert max(r.num_batched_tokens for r in engine.step_log) <= 12
    if policy == "continuous":
        assert engine.stats.num_preemptions > 0                     # the pool is too small for everyone at once
        assert any(r.num_prefill_tokens and r.num_decode_tokens for r in engine.step_log)   # mixed steps



def test_int8_paged_cache_gives_the_tokens_of_the_int8_contiguous_cache(tiny_model):
    """Engine(kv_cache="int8") stores every (token, head) with the same int8 codec as KVCache(storage="int8"), so each
    request gives the tokens generate(kv_cache="int8") gives alone; the pool's bytes are the int8 formula's, and a
    block holds 4d / (d + 4) times fewer bytes than a float32 block."""
    from minitransformer import estimate_kv_bytes
    cfg = tiny_model.config
    engine = Engine(tiny_model, max_num_seqs=3, num_blocks=16, block_size=4, max_num_batched_tokens=10,
                    kv_cache="int8")
    requests = {}
    for prompt, params in zip(prompts_of([5, 13, 22], seed=4), [greedy(12, ignore_eos=True), MIXED[1], greedy(9)]):
        requests[engine.add_request(prompt, params)] = (prompt, params)
    results = engine.run()
    for rid, (prompt, params) in requests.items():
        ref = generate(tiny_model, prompt, params, kv_cache="int8")
        assert results[rid].token_ids == ref.token_ids, rid
        assert results[rid].kv_cache_bytes == estimate_kv_bytes(cfg, results[rid].kv_cache_tokens, storage="int8")
    per_block = estimate_kv_bytes(cfg, 4, storage="int8")
    assert engine.cache.bytes_total == 16 * per_block == 16 * engine.cache.bytes_per_block
    f32 = Engine(tiny_model, num_blocks=16, block_size=4)
    assert f32.cache.bytes_per_block / engine.cache.bytes_per_block == 4 * cfg.head_dim / (cfg.head_dim + 4)
    assert engine.block_manager.num_free_blocks == 16
    with pytest.raises(InputError, match="kv_cache must be one of f32, int8"):
        Engine(tiny_model, num_blocks=16, kv_cache="int4")

def test_a_handful_of_requests_on_the_real_model(real_model):
    tok = real_model.tokenizer
    prompts = ["The capital of France is", "def fibonacci(n):",
               "Once upon a time, in a small village, there lived an old clockmaker who",
               "List three colours:"]
    params = [greedy(8), SamplingParams(max_tokens=8, temperature=0.8, seed=5), greedy(6), greedy(8, stop=["\n"])]
    engine = Engine(real_model, max_num_seqs=4, num_blocks=16, max_num_batched_tokens=24)
    requests = {engine.add_request(p, sp): (p, sp) for p, sp in zip(prompts, params)}
    results = engine.run()
    assert_same_as_alone(real_model, results, requests)
    assert results[next(iter(requests))].text.startswith(" Paris")
    assert len(tok.encode(prompts[2])) > 16                         # its prefill was chunked over 24-token steps


# ------------------------------------------------------------------------------------------- edge cases

@pytest.mark.parametrize("length", [4, 8, 16])
def test_prompts_of_exactly_whole_blocks(tiny_model, length):
    engine = Engine(tiny_model, num_blocks=16, block_size=4)
    prompt = prompts_of([length], seed=length)[0]
    rid = engine.add_request(prompt, greedy(6, ignore_eos=True))
    engine.step()                                                    # the whole prompt: exactly length/4 blocks
    assert len(engine.block_manager.block_tables[rid]) == length // 4
    engine.step()                                                    # the first decode opens one more block
    assert len(engine.block_manager.block_tables[rid]) == length // 4 + 1
    result = engine.run()[rid]
    assert result.token_ids == alone(tiny_model, prompt, greedy(6, ignore_eos=True)).token_ids
    assert result.kv_cache_tokens == length + 5


def test_full_prefix_cache_hit_recomputes_only_the_last_token(tiny_model):
    engine = Engine(tiny_model, num_blocks=32, block_size=4)
    prompt = prompts_of([13], seed=4)[0]                             # 3 full blocks + 1 token
    first = engine.add_request(prompt, greedy(5, ignore_eos=True))
    engine.run()
    second = engine.add_request(prompt, greedy(5, ignore_eos=True))
    engine.step()
    record = engine.step_log[-1]
    assert record.num_prefill_tokens == 1                            # 12 tokens came from the cache
    stats = engine.stats
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (26, 12)
    results = engine.run()
    assert results[second].token_ids == alone(tiny_model, prompt, greedy(5, ignore_eos=True)).token_ids
    assert first != second and engine.block_manager.num_free_blocks == 32
    # a prompt of exactly 3 blocks reuses only 2 of them: its last token must be computed for its logits
    third = engine.add_request(prompt[:12], greedy(3, ignore_eos=True))
    engine.step()
    assert engine.step_log[-1].num_prefill_tokens == 4
    assert engine.run()[third].token_ids == alone(tiny_model, prompt[:12], greedy(3, ignore_eos=True)).token_ids


def test_preemption_then_re_prefill_gives_the_same_tokens(tiny_model):
    """Two requests that cannot both fit: the newer one is preempted, re-prefilled (prompt + its output so far)
    later, and still produces exactly its tokens, seeded sampling included."""
    engine = Engine(tiny_model, max_num_seqs=2, num_blocks=8, block_size=4, enable_prefix_caching=False)
    a_prompt, b_prompt = prompts_of([10, 9], seed=5)
    a_params, b_params = greedy(20, ignore_eos=True), SamplingParams(max_tokens=20, temperature=HOT, seed=2,
                                                                     ignore_eos=True)
    a = engine.add_request(a_prompt, a_params)
    b = engine.add_request(b_prompt, b_params)
    seen = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                seen[out.request_id] = out.result
        seq = engine.sequences.get(b)
        if seq is not None and seq.status is SequenceStatus.PREEMPTED:
            assert seq.num_computed_tokens == 0 and seq.output_ids and not seq.block_table
    assert engine.stats.num_preemptions >= 1
    preempted = [r for r in engine.step_log if r.preempted]
    assert preempted and preempted[0].preempted == [b]               # the newest request is the victim
    re_prefill = [r for r in engine.step_log if r.step > preempted[0].step and b in r.request_ids][0]
    assert re_prefill.num_prefill_tokens > 1                         # prompt + output so far, recomputed
    assert seen[a].token_ids == alone(tiny_model, a_prompt, a_params).token_ids
    assert seen[b].token_ids == alone(tiny_model, b_prompt, b_params).token_ids


def test_abort_mid_prefill_frees_the_blocks_and_leaves_the_others_untouched(tiny_model):
    engine = Engine(tiny_model, num_blocks=32, block_size=4, max_num_batched_tokens=8)
    long_prompt, short_prompt = prompts_of([40, 5], seed=6)
    victim = engine.add_request(long_prompt, greedy(8))
    other = engine.add_request(short_prompt, greedy(8, ignore_eos=True))
    engine.step()                                                    # 8 of the 40 prompt tokens
    assert engine.sequences[victim].num_computed_tokens == 8
    engine.abort(victim)
    assert victim not in engine.block_manager.block_tables
    outputs = engine.step()
    aborted = [o for o in outputs if o.request_id == victim]
    assert aborted and aborted[0].finished
    result = aborted[0].result
    assert (result.finish_reason, result.stop_reason, result.token_ids) == ("abort", "cancelled", [])
    assert engine.run()[other].token_ids == alone(tiny_model, short_prompt, greedy(8, ignore_eos=True)).token_ids
    assert engine.block_manager.num_free_blocks == 32
    engine.abort(victim)                                             # already finished: nothing happens



def test_abort_mid_decode_streams_each_token_once_and_frees_the_id(tiny_model):
    """Deltas of a request aborted between steps add up to its Result (the final Delta carries no token: the last
    one was streamed already), and its id stays taken until that final output has been delivered."""
    engine = Engine(tiny_model, num_blocks=32, block_size=4)
    rid = engine.add_request(prompts_of([6], seed=8)[0], greedy(10, ignore_eos=True), request_id="x")
    deltas = [o.delta for _ in range(3) for o in engine.step()]
    engine.abort(rid)
    with pytest.raises(InputError, match="already in use"):
        engine.add_request([5, 6], greedy(2), request_id="x")
    final = engine.step()
    assert [o.finished for o in final] == [True] and final[0].delta.token_ids == []
    deltas.append(final[0].delta)
    result = final[0].result
    assert len(result.token_ids) == 3 and result.finish_reason == "abort"
    assert [t for d in deltas for t in d.token_ids] == result.token_ids
    assert "".join(d.text for d in deltas) == result.text
    engine.add_request([5, 6], greedy(2), request_id="x")              # delivered: the id is free again
    assert engine.run()["x"].finish_reason in ("stop", "length")


def test_a_request_that_exactly_fills_the_pool_is_admitted(tiny_model):
    """The last sampled token's keys are never computed, so prompt + max_tokens - 1 slots suffice."""
    engine = Engine(tiny_model, num_blocks=4, block_size=4)              # 16 slots
    rid = engine.add_request(prompts_of([10], seed=9)[0], greedy(7, ignore_eos=True))
    assert engine.run()[rid].kv_cache_tokens == 16
    with pytest.raises(InputError, match="does not fit in the whole KV cache"):
        engine.add_request(prompts_of([10], seed=9)[0], greedy(8, ignore_eos=True))

def test_prompt_larger_than_the_pool_is_refused_at_add_request(tiny_model):
    engine = Engine(tiny_model, num_blocks=4, block_size=4)
    with pytest.raises(InputError, match=r"the prompt \(17 tokens\) does not fit in the whole KV cache") as e:
        engine.add_request(prompts_of([17])[0], greedy(1))
    assert e.value.param == "prompt"                    # the server's 400 names the field at fault
    with pytest.raises(InputError, match=r"prompt \+ max_tokens \(20 tokens\) does not fit .* = 16 tokens") as e:
        engine.add_request(prompts_of([10])[0], greedy(10))
    assert e.value.param == "max_tokens"
    assert not engine.has_unfinished_requests()


# ------------------------------------------------------------------------------------------- admission control

def test_admission_control_context_max_model_len_and_tenant_quota(tiny_model):
    engine = Engine(tiny_model, num_blocks=64, block_size=4, max_model_len=64,
                    tenant_token_quota={"free": 40})
    with pytest.raises(InputError, match="exceeds the context length of 128"):
        engine.add_request(prompts_of([100])[0], greedy(29))
    with pytest.raises(InputError, match=r"= 70 exceeds max_model_len 64") as e:
        engine.add_request(prompts_of([30])[0], greedy(40))
    assert e.value.param == "max_tokens"
    engine.add_request(prompts_of([10])[0], greedy(20), tenant="free")
    with pytest.raises(InputError, match=r"tenant 'free' would hold 45 tokens in flight .* quota of 40"):
        engine.add_request(prompts_of([5])[0], greedy(10), tenant="free")
    engine.add_request(prompts_of([5])[0], greedy(10), tenant="paid")            # no quota for that tenant
    engine.run()
    engine.add_request(prompts_of([5])[0], greedy(10), tenant="free")            # finished ones give quota back
    with pytest.raises(InputError, match="unknown policy 'fifo'"):
        Engine(tiny_model, policy="fifo")
    with pytest.raises(InputError, match="max_num_seqs must be a positive integer"):
        Engine(tiny_model, max_num_seqs=0)


# ------------------------------------------------------------------------------------------- API contract

def test_streamed_deltas_metrics_and_stats(tiny_model):
    engine = Engine(tiny_model, max_num_seqs=2, num_blocks=32, block_size=4)
    ids = [engine.add_request(p, greedy(6, ignore_eos=True), request_id=f"q{i}")
           for i, p in enumerate(prompts_of([5, 7, 6]))]
    assert ids == ["q0", "q1", "q2"]
    with pytest.raises(InputError, match="already in use"):
        engine.add_request([5], greedy(1), request_id="q0")
    assert (engine.stats.num_waiting_reqs, engine.stats.num_running_reqs) == (3, 0)
    texts, tokens, finals = {i: "" for i in ids}, {i: [] for i in ids}, {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            texts[out.request_id] += out.delta.text
            tokens[out.request_id] += out.delta.token_ids
            if out.finished:
                finals[out.request_id] = out.result
        assert engine.stats.num_running_reqs <= 2
    for rid, result in finals.items():
        assert texts[rid] == result.text and tokens[rid] == result.token_ids
        m = result.metrics
        assert 0 <= m.queue_s <= m.ttft_s <= m.e2e_s and len(m.token_times) == 6
    # q2 waited for a seat: its queue time covers at least the first request's six steps
    assert finals["q2"].metrics.queue_s >= sum(r.duration_s for r in engine.step_log[:6]) * 0.99
    stats = engine.stats
    assert stats.num_generation_tokens == 18 and stats.num_prompt_tokens == 18
    assert stats.num_steps == len(engine.step_log) and stats.kv_cache_usage == 0.0
    assert [r.num_running for r in engine.step_log][:1] == [2]


def test_chat_and_text_prompts_are_tokenized_as_generate_does(tiny_model):
    engine = Engine(tiny_model, num_blocks=64, block_size=4)
    chat = engine.add_request("the cat", greedy(5, ignore_eos=True), chat=True)
    text = engine.add_request("the cat sat", greedy(5, ignore_eos=True))
    results = engine.run()
    for rid, prompt, is_chat in ((chat, "the cat", True), (text, "the cat sat", False)):
        ref = generate(tiny_model, prompt, greedy(5, ignore_eos=True), chat=is_chat)
        assert results[rid].prompt_token_ids == ref.prompt_token_ids and results[rid].token_ids == ref.token_ids
    assert len(results[chat].prompt_token_ids) > 20                  # the template's default system prompt


def test_static_batching_admits_nobody_until_the_whole_group_has_finished(tiny_model):
    engine = Engine(tiny_model, max_num_seqs=2, num_blocks=32, block_size=4, policy="static")
    short, long_, late = (engine.add_request(p, greedy(n, ignore_eos=True))
                          for p, n in zip(prompts_of([3, 3, 3]), (2, 8, 2)))
    engine.run()
    joined = next(r.step for r in engine.step_log if late in r.request_ids)
    last_of_long = max(r.step for r in engine.step_log if long_ in r.request_ids)
    assert joined == last_of_long + 1                     # the freed seat stayed empty while the long one ran
    continuous = Engine(tiny_model, max_num_seqs=2, num_blocks=32, block_size=4, policy="continuous")
    ids = [continuous.add_request(p, greedy(n, ignore_eos=True)) for p, n in zip(prompts_of([3, 3, 3]), (2, 8, 2))]
    continuous.run()
    assert next(r.step for r in continuous.step_log if ids[2] in r.request_ids) == 2     # joins as soon as a seat frees
    assert len(continuous.step_log) < len(engine.step_log)


def test_priority_runs_urgent_first_and_aging_prevents_starvation(tiny_model):
    """One seat, a low-priority request, and a new urgent request every 3 steps (each takes 3 steps): without
    aging the low one never runs; with aging (one level per 4 steps waited) it gets in after ~20 steps."""
    def first_step_of_low(aging_steps):
        engine = Engine(tiny_model, max_num_seqs=1, num_blocks=32, block_size=4, policy="priority",
                        aging_steps=aging_steps)
        prompt, params = prompts_of([3])[0], greedy(3, ignore_eos=True)
        low = engine.add_request(prompt, params, priority=5)
        for step in range(60):
            if step % 3 == 0:
                engine.add_request(prompt, params, priority=0)
            engine.step()
        ran = [r.step for r in engine.step_log if low in r.request_ids]
        urgent_first = engine.step_log[0].request_ids != [low]
        return (ran[0] if ran else None), urgent_first

    start, urgent_first = first_step_of_low(aging_steps=4)
    assert urgent_first and start is not None and 20 <= start <= 30
    assert first_step_of_low(aging_steps=1000) == (None, True)      # starved for all 60 steps


def test_bench_serving_script_runs_and_checks_its_tokens(tiny_model_path):
    import json
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).parent.parent / "scripts" / "bench_serving.py"
    command = [sys.executable, str(script), "--model", str(tiny_model_path), "--requests", "3", "--max-tokens", "4",
               "--baseline-requests", "2", "--max-prompt-tokens", "40", "--no-llama-cpp", "--json"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    numbers = json.loads(out.stdout)
    assert numbers["engine_tokens_equal_batch1"] is True and numbers["requests"] == 3
    assert all(numbers[k] > 0
               for k in ("continuous_tok_s", "batch1_tok_s", "read_bandwidth_gb_s", "decode_step_s_median"))
    assert "llama_cpp_tok_s" not in numbers


# ------------------------------------------------------------------------------------------- memory

@pytest.mark.skipif(sys.platform != "linux", reason="glibc's allocator thresholds (model_runner.keep_freed_memory)")
def test_an_engine_in_a_thread_does_not_fault_its_memory_in_every_round(real_model_path):
    """model_runner.keep_freed_memory: rounds of an Engine run in a thread (as the server runs it). With the default
    allocator thresholds every round pays ~160,000 page faults for the memory the last one gave back (measured over
    three rounds: 249k, 163k, 163k); with the Engine's fixed thresholds the rounds after the first pay almost none
    (5k, 4, 1). Two rounds show it (the third repeated the second): the second round is the first that could reuse
    freed memory. Page faults are counted by the kernel, not timed, so a busy machine does not change them."""
    script = Path(__file__).parent / "engine_page_faults.py"

    def faults(mode: str) -> list[int]:
        done = subprocess.run([sys.executable, str(script), str(real_model_path), mode], capture_output=True,
                              text=True, timeout=600, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    kept, returned = faults("keep"), faults("return")
    assert max(kept[1:]) < 1000, kept
    assert min(returned[1:]) > 20 * max(max(kept[1:]), 100), (kept, returned)
