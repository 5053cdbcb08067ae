"""Exercise 11: the paged KV cache's slot mapping (serving/block_manager.py's BlockManager.slot_mapping)."""

from __future__ import annotations

import contextlib
import functools
import random
from collections import OrderedDict
from types import SimpleNamespace

import numpy as np

from ..core.sampling_params import SamplingParams
from ..serving.block_manager import BlockManager
from .track import CheckFailed, Exercise, compare, plugged, real_model, same_tokens

BLOCK_SIZE = 4                    # small blocks: a 20-token request spans several, so its table has several entries
NUM_BLOCKS = 64
ENGINE_SLOT_MAPPING = BlockManager.slot_mapping     # taken before any check plugs its adapter in
PROMPTS = ("The capital of France is", "Once upon a time", "def fib(n):", "The best way to learn is")
MAX_TOKENS = 6


def engine_slot_mapping(block_table, start, end, block_size):
    """The engine's own answer with the exercise's signature: a BlockManager holding this one table."""
    manager = BlockManager(max(block_table, default=0) + 1, block_size, enable_prefix_caching=False)
    manager.block_tables["seq"] = list(block_table)
    return ENGINE_SLOT_MAPPING(manager, SimpleNamespace(request_id="seq"), start, end)


def _logical(block_table, start, end, block_size):
    return [p // block_size * block_size + p % block_size for p in range(start, end)]


def _from_one(block_table, start, end, block_size):
    return [block_table[(p + 1) // block_size] * block_size + (p + 1) % block_size for p in range(start, end)]


def _end_included(block_table, start, end, block_size):
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end + 1)]


MISTAKES = (
    ("the logical block index p // block_size is used as the slot's block: it must go through the table, "
     "block_table[p // block_size], the physical block that sequence owns", _logical),
    ("off by one at a block boundary: positions start at 0, so position p is in logical block p // block_size at "
     "offset p % block_size (position block_size is the first slot of block 1, not the last of block 0)", _from_one),
    ("off by one at the end: the range is [start, end), end - start slots, end not included", _end_included),
)


def _stage1(slot_mapping) -> None:
    rng = np.random.default_rng(10)
    for block_size, start, end in ((4, 0, 13), (16, 0, 40), (16, 15, 17), (4, 7, 8), (16, 32, 33), (8, 5, 5)):
        table = [int(b) for b in rng.permutation(64)[:-(-(end + 1) // block_size) + 1]]     # scattered blocks
        inputs = (table, start, end, block_size)
        compare(f"slot_mapping(block_table={table}, start={start}, end={end}, block_size={block_size})",
                slot_mapping(*inputs), engine_slot_mapping(*inputs), inputs, MISTAKES, atol=0, rtol=0,
                axes=("position - start",))


def _serve(slot_mapping=None) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The engine serving PROMPTS at once from a pool whose free list is shuffled: (tokens, the widest block table
    seen) per request. slot_mapping None: the engine's own."""
    from ..serving.engine import Engine
    engine = Engine(real_model(), max_num_seqs=len(PROMPTS), num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE,
                    enable_prefix_caching=False)
    order = list(range(NUM_BLOCKS))
    random.Random(10).shuffle(order)                     # blocks handed out in a scattered order
    engine.block_manager.free_queue = OrderedDict((b, None) for b in order)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params, request_id=f"request {i}") for i, p in enumerate(PROMPTS)]
    tables: dict[str, list[int]] = {}
    tokens: dict[str, list[int]] = {}
    adapter = None if slot_mapping is None else \
        (lambda manager, seq, start, end: list(slot_mapping(manager.block_tables[seq.request_id], start, end,
                                                            manager.block_size)))
    with plugged(BlockManager, "slot_mapping", adapter) if adapter else contextlib.nullcontext():
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.result is not None:
                    tokens[out.request_id] = list(out.result.token_ids)
            for rid, table in engine.block_manager.block_tables.items():
                if len(table) > len(tables.get(rid, [])):
                    tables[rid] = list(table)
    return {i: tokens[i] for i in ids}, {i: tables[i] for i in ids}


@functools.cache
def _reference_run():
    return _serve()


def check(slot_mapping) -> list[str]:
    _stage1(slot_mapping)
    expected, _ = _reference_run()
    got, tables = _serve(slot_mapping)
    decode = real_model().tokenizer.decode
    for (rid, want), prompt in zip(expected.items(), PROMPTS):
        same_tokens(f"the engine with your slot_mapping, request {prompt!r}", got[rid], want, decode)
        if len(got[rid]) != MAX_TOKENS:
            raise CheckFailed(f"request {prompt!r} did not produce its {MAX_TOKENS} tokens")
    shown = "; ".join(f"{p!r} -> blocks {t}" for p, t in zip(PROMPTS, tables.values()))
    return [f"your slot_mapping placed every token of {len(PROMPTS)} requests served at once from a shuffled pool "
            f"of {NUM_BLOCKS} blocks of {BLOCK_SIZE} tokens ({shown})",
            f"each request's {MAX_TOKENS} greedy tokens equal the reference engine's, token for token"]


EXERCISE = Exercise(
    number=11, name="paged_slots", title="Paged KV cache: the slot mapping", function="slot_mapping",
    solution="minitransformer/serving/block_manager.py: BlockManager.slot_mapping (called by serving/"
             "model_runner.py's prepare for every scheduled token)",
    question="How does PagedAttention store a sequence's KV cache without reserving its whole context, and how "
             "does a token find its slot?",
    lesson="lessons/09_paged_attention.py (blocks, tables, fragmentation)",
    hints=(
        "Split the position: p // block_size is which of the sequence's blocks (logical), p % block_size the "
        "offset inside it.",
        "The logical block is an index into block_table; the value there is the physical block in the pool.",
        "slot = block_table[p // block_size] * block_size + p % block_size, for p in range(start, end).",
    ),
    check=check, reference=engine_slot_mapping, mistakes=MISTAKES,
)
