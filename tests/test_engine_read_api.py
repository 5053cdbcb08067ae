"""The engine's read API (serving/outputs.py), all that the server, the CLI and the figures read: each step's Delta
carries its tokens' logprob entries, snapshot() agrees with the block manager and the scheduler it copies, the step
log stays bounded, and recent_steps() is a copy."""

from __future__ import annotations

import pytest

from minitransformer import SamplingParams, generate, stream
from minitransformer.serving import BlockState, Engine, engine as engine_module


def test_each_delta_carries_the_logprobs_of_its_tokens(tiny_model):
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
    engine = Engine(tiny_model, max_num_seqs=2)
    ids = [engine.add_request(p, params) for p in ("the cat", "a dog ran")]
    deltas = {rid: [] for rid in ids}
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas[out.request_id].append(out.delta)
    for rid in ids:
        got, result = deltas[rid], deltas[rid][-1].result
        assert all(len(d.logprobs) == len(d.token_ids) for d in got)
        assert [e for d in got for e in d.logprobs] == result.logprobs
        assert [e["token_id"] for d in got for e in d.logprobs] == result.token_ids
    streamed = list(stream(tiny_model, "the cat", params))                       # generate's loop: the same type
    assert [e for d in streamed for e in d.logprobs] == generate(tiny_model, "the cat", params).logprobs
    assert all(d.logprobs is None for d in stream(tiny_model, "the cat", SamplingParams(max_tokens=3)))


def test_snapshot_copies_the_queues_the_blocks_and_the_tables(tiny_model):
    engine = Engine(tiny_model, max_num_seqs=2, num_blocks=16, block_size=4)
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.add_request("the cat sat on the mat", params, request_id="a")
    engine.step()                                                    # "a"'s full blocks are cached now
    engine.add_request("the cat sat on the rug", params, request_id="b")
    engine.add_request("a dog", params, request_id="c")
    engine.step()
    snap, bm, scheduler = engine.snapshot(), engine.block_manager, engine.scheduler
    assert [s.request_id for s in snap.running] == [s.request_id for s in scheduler.running] == ["a", "b"]
    assert [s.request_id for s in snap.waiting] == [s.request_id for s in scheduler.waiting] == ["c"]
    assert {s.request_id: list(s.block_table) for s in snap.running} == {r: bm.block_tables[r] for r in "ab"}
    assert snap.waiting[0].block_table == () and snap.waiting[0].status == "waiting"
    for view in snap.running:
        seq = engine.sequences[view.request_id]
        assert (view.num_tokens, view.num_computed_tokens, view.status) == (seq.num_tokens, seq.num_computed_tokens,
                                                                             "running")
    assert list(snap.ref_counts) == bm.ref_counts and len(snap.blocks) == snap.config.num_blocks == 16
    for refs, state in zip(snap.ref_counts, snap.blocks):
        expected = {BlockState.SHARED} if refs > 1 else {BlockState.USED} if refs == 1 else {BlockState.FREE,
                                                                                             BlockState.CACHED}
        assert state in expected
    assert BlockState.SHARED in snap.blocks                          # "b" found "a"'s first blocks in the cache
    assert snap.step == engine.num_steps == 2 and snap.stats == engine.stats and snap.finished == ()
    engine.run()
    after = engine.snapshot()
    assert after.running == after.waiting == () and BlockState.USED not in after.blocks
    assert [s.request_id for s in after.finished] == ["c", "b", "a"]                      # the latest first
    assert {s.finish_reason for s in after.finished} == {"length"}
    assert snap.running[0].num_output_tokens < after.finished[-1].num_output_tokens      # the old snapshot stayed


def test_the_step_log_is_bounded_and_recent_steps_is_a_copy(tiny_model, monkeypatch):
    monkeypatch.setattr(engine_module, "STEP_LOG_SIZE", 3)
    engine = Engine(tiny_model, max_num_seqs=1)
    engine.add_request("the cat", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    engine.run()
    assert engine.num_steps == 8 and [r.step for r in engine.step_log] == [5, 6, 7]
    recent = engine.recent_steps(2)
    assert [r.step for r in recent] == [6, 7] and engine.recent_steps(0) == []
    recent.clear()
    assert len(engine.step_log) == 3


@pytest.mark.parametrize("ids", [[], ["x", "y"]])
def test_unfinished_request_ids_in_the_order_added(tiny_model, ids):
    engine = Engine(tiny_model, max_num_seqs=1)
    for rid in ids:
        engine.add_request("the cat", SamplingParams(max_tokens=2), request_id=rid)
    assert engine.unfinished_request_ids() == ids
