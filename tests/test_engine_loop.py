"""The server's engine thread on its own (no HTTP): items in order, the same tokens as generate(), aborts and
timeouts free the blocks, a full queue refuses, and a step that raises ends its requests without ending the thread."""

from __future__ import annotations

import queue

import pytest

from minitransformer import SamplingParams, generate
from minitransformer.core.metrics import now
from minitransformer.server import EngineLoop, ServerMetrics
from minitransformer.server.errors import EngineFailed, QueueFull
from minitransformer.serving import Engine

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture
def make_loop(tiny_model):
    loops = []

    def make(engine=None, **options):
        loop = EngineLoop(engine or Engine(tiny_model, max_num_seqs=4), ServerMetrics("tiny"), **options)
        loop.start()
        loops.append(loop)
        return loop

    yield make
    for loop in loops:
        loop.stop()
        assert not loop._thread.is_alive()


def submit(loop, ids, params=GREEDY, arrival=None):
    items: queue.Queue = queue.Queue()
    request_id = loop.submit(ids, params, 0, None, now() if arrival is None else arrival, items.put).result(10)
    return request_id, items


def drain(items) -> list:
    out = []
    while not out or out[-1].result is None and out[-1].error is None:
        out.append(items.get(timeout=30))
    return out


def test_items_add_up_to_generates_result(tiny_model, make_loop):
    ids = tiny_model.tokenizer.encode("the cat sat")
    expected = generate(tiny_model, ids, GREEDY)
    _, items = submit(make_loop(), ids)
    got = drain(items)
    assert "".join(i.text for i in got) == expected.text
    assert [t for i in got for t in i.token_ids] == expected.token_ids
    assert got[-1].result.finish_reason == "length"


def test_abort_frees_the_blocks_and_reports_abort(tiny_model, make_loop):
    loop = make_loop()
    rid, items = submit(loop, tiny_model.tokenizer.encode("the dog"), SamplingParams(max_tokens=100, temperature=0.0,
                                                                                    ignore_eos=True))
    items.get(timeout=30)                                             # it runs
    loop.abort(rid)
    last = drain(items)[-1]
    assert (last.result.finish_reason, last.result.stop_reason) == ("abort", "cancelled")
    assert loop.engine.block_manager.num_free_blocks == loop.engine.block_manager.num_blocks


def test_a_request_past_its_timeout_ends_with_stop_reason_timeout(tiny_model, make_loop):
    loop = make_loop(request_timeout_s=0.5)
    rid, items = submit(loop, tiny_model.tokenizer.encode("the dog"), arrival=now() - 1.0)     # arrived 1 s ago
    result = drain(items)[-1].result
    assert (result.finish_reason, result.stop_reason) == ("abort", "timeout")
    assert loop.engine.block_manager.num_free_blocks == loop.engine.block_manager.num_blocks


def test_a_full_waiting_queue_refuses_with_queue_full(tiny_model, make_loop):
    loop = make_loop(Engine(tiny_model, max_num_seqs=1), max_waiting=1)
    long = SamplingParams(max_tokens=100, temperature=0.0, ignore_eos=True)
    ids = tiny_model.tokenizer.encode("the")
    first, first_items = submit(loop, ids, long)
    first_items.get(timeout=30)                                       # running
    second, _ = submit(loop, ids, long)                               # waiting
    with pytest.raises(QueueFull, match="--max-waiting 1"):
        submit(loop, ids, long)
    loop.abort(first)
    loop.abort(second)


class FailingEngine(Engine):
    """A real engine whose third step raises, as a bug in a step would."""

    def step(self):
        if self.num_steps == 2:
            raise ValueError("planted")
        return super().step()


def test_a_step_that_raises_ends_its_requests_and_refuses_new_ones(tiny_model, make_loop):
    loop = make_loop(FailingEngine(tiny_model, max_num_seqs=4))
    _, items = submit(loop, tiny_model.tokenizer.encode("the cat"))
    last = drain(items)[-1]
    # the exception's text (which may hold another request's data) goes to the log, not to every client
    assert last.error == "the engine failed (ValueError); the server log has the details" and loop.error == last.error
    with pytest.raises(EngineFailed, match=r"the engine failed \(ValueError\)"):
        submit(loop, tiny_model.tokenizer.encode("the cat"))
    assert loop._thread.is_alive()
    bm = loop.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks                        # the failed request's blocks were freed
