"""Decode-only steps replayed from CUDA graphs, one graph per padded batch size (vLLM's CUDA graph capture).

At batch 1 a decode step of the 135M model is ~30 layers x ~15 small kernels: each does microseconds of GPU work
but costs several microseconds of Python and launch overhead, so the GPU mostly waits for the host. A CUDA graph
records the step's launches once and replays them with one call (cuda_graph.py). A graph has fixed shapes and
fixed addresses, so the engine's decode step is rewritten over *static buffers*:

    token_ids (G,)  positions (G,)  slots (G,)  seq_lens (G,)  block_tables (G, max_blocks)    G = capture size

- Batch sizes are padded up to a capture size (1, 2, 4, 8, 16, ... max_num_seqs, as vLLM's
  cudagraph_capture_sizes), one graph each, captured the first time a step of that size runs.
- Padding rows decode token 0 at position 0 into a *scratch block* the block manager never hands out (the pool has
  one block more than the manager knows), attend to that one key, and their logits are dropped.
- Every block table is max_blocks = ceil(max_model_len / block_size) wide, the width of the longest sequence
  allowed: the decode kernel's grid covers it and partitions past a sequence's length exit at once; the array
  path masks keys past each query's position.
- Nothing in the step reads back to the host or depends on a per-step Python value: lengths and tables are
  device arrays written before each replay.

Steps with a prefill chunk (prompt tokens of any length) run plainly, as vLLM runs them.
On the CPU there is nothing to capture: `replay()` calls the same static-buffer step, so the tests check on any
machine that padding, the scratch block and the buckets change no token (tests/test_graph_runner.py); the capture
itself runs in scripts/gpu_check.py on a GPU. If a capture fails, the reason is logged and steps run plainly.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

from ..core.backend import INDEX_DTYPE, check_memory
from .paged_cache import PagedStep

log = logging.getLogger("minitransformer.graphs")

CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The padded batch sizes that get a graph: the powers of two below max_num_seqs, and max_num_seqs itself."""
    return tuple(s for s in CAPTURE_SIZES if s < max_num_seqs) + (max_num_seqs,)


def graphs_refusal(model) -> str | None:
    """Why this model's decode steps cannot be replayed from CUDA graphs (DecodeGraphs), or None when they can.

    Tensor parallelism (model.comm set: rank 0's parallel.driver.DriverTransformer) sends every step to the workers
    as a message before the forward, which a replayed graph would skip. A sliding layer (Gemma 3) gathers the pool
    with array operations (core.attention.SlidingWindowAttention), which a capture on the GPU would freeze; on
    the CPU the graphed step runs uncaptured, so it is allowed there.
    """
    if getattr(model, "comm", None) is not None:
        return ("cuda_graphs cannot run under tensor parallelism: a replayed graph would skip the step message the "
                "other ranks wait for; use cuda_graphs=False")
    if model.config.sliding_layers and model.device == "gpu":
        return ("CUDA graphs do not capture sliding-window layers (Gemma 3's local layers gather the pool with "
                "array operations); run this model with cuda_graphs=False")
    return None


class ReplayableStep(Protocol):
    """What DecodeGraphs needs of a step: its static inputs, and replay() (EagerStep here, cuda_graph.GraphedStep)."""
    inputs: tuple

    def replay(self) -> Any: ...


class EagerStep:
    """The CPU stand-in for cuda_graph.GraphedStep: the same static inputs, replay() runs fn on them again."""

    def __init__(self, fn, *static_inputs):
        self.fn, self.inputs = fn, static_inputs

    def replay(self):
        return self.fn(*self.inputs)


class DecodeGraphs:
    """Runs decode-only engine steps through one static-buffer step per capture size (see the module docstring).

    model, cache: the engine's; scratch_block: a pool block outside the block manager; max_blocks: table width.
    `replays` counts steps served per capture size; `disabled` holds the reason when capture failed.
    """

    def __init__(self, model, cache, max_num_seqs: int, max_blocks: int, scratch_block: int, capture: bool):
        self.model, self.cache = model, cache
        self.sizes = capture_sizes(max_num_seqs)
        self.max_blocks, self.scratch_block = max_blocks, scratch_block
        # Every size's static buffers (built on first use), checked together now: a graph cannot grow its buffers
        # later. Per row: token id, position, slot (int64), seq_len (int32) and a max_blocks-wide table (int32).
        check_memory(sum(self.sizes) * (3 * 8 + 4 + 4 * max_blocks),
                     f"CUDA graph buffers for batches up to {max_num_seqs} with {max_blocks}-block tables", model.xp,
                     "lower max_num_seqs or max_model_len, or cuda_graphs=False")
        self.capture = capture
        self.steps: dict[int, ReplayableStep] = {}   # capture size -> GraphedStep (GPU) or EagerStep (CPU)
        self.replays = {size: 0 for size in self.sizes}
        self.rope_tables: dict[int, tuple] = {}      # capture size -> the RoPE table its graph reads
        self.disabled: str | None = None

    @property
    def use_kernel(self) -> bool:
        """Whether the step reads the pool in place through paged_decode (else it gathers full-width tables)."""
        return self.model.attention.reads_pool(self.cache.codec)

    def can_run(self, inputs) -> bool:
        """A decode-only step (every row one token of its own sequence) that a graph can serve."""
        return (self.disabled is None and inputs.num_decodes > 0 and not inputs.chunks
                and inputs.num_decodes <= self.sizes[-1])

    def run(self, inputs):
        """Copy the step into the static buffers of its capture size, replay, return logits (num_decodes, V)."""
        D = inputs.num_decodes
        size = next(s for s in self.sizes if s >= D)
        step = self.steps.get(size) or self._build(size)
        if step is None:
            return None
        token_ids, positions, slots, seq_lens, tables = step.inputs
        bs = self.cache.block_size
        token_ids[:D], positions[:D], slots[:D] = inputs.token_ids, inputs.positions, inputs.slots
        seq_lens[:D] = inputs.positions + 1                                 # the new token's key included
        tables[:D, :inputs.decode_tables.shape[1]] = inputs.decode_tables  # past a table's end: unread / masked
        token_ids[D:], positions[D:], slots[D:], seq_lens[D:] = 0, 0, self.scratch_block * bs, 1
        tables[D:] = self.scratch_block
        self.replays[size] += 1
        logits = step.replay()            # (G, V); on the GPU the graph's own output, overwritten by the next replay
        if inputs.logits_rows == list(range(D)):
            return logits[:D]                                               # (D, V): the padding rows dropped
        return logits[self.model.xp.asarray(np.asarray(inputs.logits_rows, dtype=INDEX_DTYPE))]  # a 1-token chunk
                                                                            # that ends no prompt samples nothing

    def _build(self, size: int):
        """The static buffers of one capture size and its step, captured as a graph on the GPU."""
        xp = self.model.xp
        buffers = (xp.zeros(size, dtype=INDEX_DTYPE), xp.zeros(size, dtype=INDEX_DTYPE),
                   xp.full(size, self.scratch_block * self.cache.block_size, dtype=INDEX_DTYPE),
                   xp.ones(size, dtype=np.int32),
                   xp.full((size, self.max_blocks), self.scratch_block, dtype=np.int32))
        rows = xp.arange(size, dtype=INDEX_DTYPE)                           # every row samples
        # A captured graph reads the RoPE table at the address it had then: keep that table alive even if the model
        # later grows a longer one (rope.py).
        self.rope_tables[size] = (self.model.rope_cos, self.model.rope_sin)
        step: ReplayableStep
        if not self.capture:
            step = EagerStep(lambda *b: self._forward(rows, *b), *buffers)
        else:
            from .cuda_graph import GraphedStep
            try:
                step = GraphedStep(lambda *b: self._forward(rows, *b), *buffers)
            except Exception as exc:  # a capture rule broken somewhere in the forward: say so, run plainly
                self.disabled = (f"CUDA graph capture of a {size}-sequence decode step failed: "
                                 f"{type(exc).__name__}: {exc}")
                log.warning("%s; decode steps run without graphs", self.disabled)
                return None
        self.steps[size] = step
        return step

    def _forward(self, rows, token_ids, positions, slots, seq_lens, tables):
        """One decode step over static buffers: the engine's forward, attention by seq_lens and full-width tables."""
        step = PagedStep(self.cache, slots, token_ids.shape[0], positions, seq_lens, tables)
        return self.model.forward(token_ids[None], positions[None], step, logits_rows=rows)     # (G, V)
