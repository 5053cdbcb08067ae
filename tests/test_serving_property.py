"""Property test of the engine (hypothesis): random arrivals, prompt and output lengths, shared prefixes,
cancellations, policies, token budgets and tiny block pools, on the tiny model. After every step the block
manager's invariants hold (reference counts >= 0 and equal to the tables, free list exact) and so do the token
budget and max_num_seqs; at the end every request has finished with a reason, every block is free, and each
request's tokens are exactly those it produces alone (a cancelled one: a prefix of them), preempted or not."""

from hypothesis import given, settings, strategies as st

from minitransformer import SamplingParams, generate
from minitransformer.serving import Engine
from minitransformer.serving.scheduler import POLICIES

_alone_cache = {}


def alone(model, prompt, params):
    key = (tuple(prompt), params)
    if key not in _alone_cache:
        _alone_cache[key] = generate(model, prompt, params).token_ids
    return _alone_cache[key]


@st.composite
def workloads(draw):
    block_size = draw(st.sampled_from([2, 4, 8]))
    shared = draw(st.lists(st.integers(3, 260), min_size=8, max_size=8))
    requests = []
    for _ in range(draw(st.integers(2, 8))):
        max_tokens = draw(st.integers(1, 10))
        length = draw(st.integers(1, 30))
        # some prompts share a prefix; some are exactly a shared run of whole blocks (a 100% prefix-cache hit)
        shared_len = draw(st.sampled_from([0, min(8, length), draw(st.integers(0, min(8, length)))]))
        if draw(st.booleans()):
            length = shared_len = draw(st.sampled_from([block_size, 8]))
        prompt = shared[:shared_len] + draw(st.lists(st.integers(3, 260), min_size=length - shared_len,
                                                     max_size=length - shared_len))
        seeded = draw(st.booleans())        # sampled at temperature 5: the tiny model is near one-hot below that
        params = SamplingParams(max_tokens=max_tokens, temperature=5.0 if seeded else 0.0,
                                seed=draw(st.integers(0, 99)) if seeded else None, ignore_eos=draw(st.booleans()))
        requests.append(dict(prompt=prompt, params=params, arrival=draw(st.integers(0, 8)),
                             cancel=draw(st.integers(0, 30)) if draw(st.integers(0, 3)) == 0 else None,
                             priority=draw(st.integers(0, 3))))
    # a tiny pool: the largest request fits alone (add_request would refuse it otherwise), little more
    largest = max(-(-(len(r["prompt"]) + r["params"].max_tokens) // block_size) for r in requests)
    num_blocks = largest + draw(st.sampled_from([0, 1, 2, 4]))
    engine = dict(block_size=block_size, num_blocks=num_blocks, max_num_seqs=draw(st.sampled_from([4, 6, 3, 2, 1])),
                  max_num_batched_tokens=draw(st.sampled_from([16, 32, 8, 3, 1])),
                  policy=draw(st.sampled_from(POLICIES)), enable_prefix_caching=draw(st.booleans()),
                  aging_steps=draw(st.integers(1, 8)))
    return engine, requests


@settings(max_examples=60, deadline=None)
@given(workloads())
def test_random_workloads_keep_every_invariant(tiny_model, workload):
    config, requests = workload
    engine = Engine(tiny_model, **config)
    bm = engine.block_manager
    ids, results = {}, {}
    step = 0
    while len(ids) < len(requests) or engine.has_unfinished_requests():
        for i, r in enumerate(requests):
            if r["arrival"] == step:
                ids[i] = engine.add_request(r["prompt"], r["params"], priority=r["priority"])
            if r["cancel"] == step and i in ids:
                engine.abort(ids[i])
        for out in engine.step():
            assert out.request_id not in results
            if out.finished:
                results[out.request_id] = out.result
        bm.check()
        record = engine.step_log[-1]
        assert record.num_batched_tokens <= config["max_num_batched_tokens"]
        assert len(record.request_ids) <= config["max_num_seqs"] and record.num_running <= config["max_num_seqs"]
        for seq in engine.scheduler.running:             # a running sequence's table covers what it computed
            assert len(seq.block_table) * bm.block_size >= seq.num_computed_tokens
        step += 1
        assert step < 1000, "the engine stopped making progress"
    assert bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts) and not bm.block_tables
    assert set(results) == set(ids.values())
    for i, rid in ids.items():
        result, r = results[rid], requests[i]
        reference = alone(tiny_model, r["prompt"], r["params"])
        assert result.finish_reason in ("stop", "length", "abort")
        if result.finish_reason == "abort":
            assert result.stop_reason == "cancelled" and reference[:len(result.token_ids)] == result.token_ids
        else:
            assert result.token_ids == reference
