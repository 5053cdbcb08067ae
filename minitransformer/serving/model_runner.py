"""One engine step on the model: the scheduled tokens of all sequences in one forward pass (vLLM's ModelRunner).

The step's tokens are laid end to end, (N,), one-token rows first, then each prefill chunk:

    [ d0 d1 d2 ... | p0 p0 p0 p0 p0 | p1 p1 p1 ]        N = decodes + chunk lengths <= max_num_batched_tokens

A one-token row is batched with the decodes whatever it is: every decode (Sequence.is_decode, the one definition)
is one, and a prompt's last single token needs the same one-query attention. Every matmul (QKV, output projection,
feed-forward) runs once over all N rows, so the weights are read from memory once per step however many sequences
share it: that is where batching's speed comes from (decode alone is bound by reading the weights). Only attention is
per sequence: the one-token rows, shortest first, as padded batches of similar length (paged_cache.length_groups),
each row with its own block table, and each prefill chunk on its own (its queries attend to its cached prefix and to
each other, causally). Only the rows that end a sequence's pending tokens go through the final norm and lm_head: a
partial prefill chunk samples nothing.

ModelRunner owns what the forward runs on: the paged KV pool and, on a GPU, the CUDA graphs its decode-only steps
replay (graph_runner.py), as vLLM's GPUModelRunner owns the KV cache tensors and captures the graphs. The engine
asks it for a step's logits and never sees a graph.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.backend import INDEX_DTYPE
from ..core.errors import InputError
from ..core.kv_storage import check_storage
from .graph_runner import DecodeGraphs, graphs_refusal
from .paged_cache import PagedKVCache, PagedStep, length_groups


@dataclass
class StepInputs:
    """The flat inputs of one forward and how its rows split into sequences."""
    token_ids: Any             # (N,)
    positions: Any             # (N,)
    slots: Any                 # (N,) cache slot of each token
    num_decodes: int           # rows [0, num_decodes) are decodes, one per sequence
    decode_positions: Any      # (num_decodes,)
    decode_tables: Any         # (num_decodes, max blocks) padded block tables
    decode_groups: list        # [(first row, end row, blocks)]: decode rows of similar length (length_groups)
    chunks: list               # per prefill chunk: (first row, length, positions (1, n), block table (1, nb))
                               # and keys it reads (its last position + 1)
    logits_rows: list[int]     # rows whose logits are sampled
    sampled: list              # the sequences those rows belong to, in the same order


def prepare(scheduled, block_manager, xp) -> StepInputs:
    """Build the flat arrays from the scheduler's [(sequence, number of tokens to compute)] (host work, small)."""
    # decodes shortest first, so rows of similar length sit together and are gathered in groups (length_groups)
    decodes = sorted(((s, n) for s, n in scheduled if n == 1), key=lambda sn: sn[0].num_computed_tokens)
    chunks = [(s, n) for s, n in scheduled if n > 1]
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    logits_rows: list[int] = []
    sampled: list = []
    chunk_meta: list[tuple[int, int, int]] = []     # per chunk: (first row, length, start)
    for seq, n in decodes + chunks:
        start = seq.num_computed_tokens
        if n > 1:
            chunk_meta.append((len(ids), n, start))
        ids += seq.token_ids(start, start + n)
        positions += range(start, start + n)
        slots += block_manager.slot_mapping(seq, start, start + n)
        if start + n == seq.num_tokens:             # this chunk reaches the end: its last row predicts a token
            logits_rows.append(len(ids) - 1)
            sampled.append(seq)
    as_index = lambda values: xp.asarray(np.asarray(values, dtype=INDEX_DTYPE))
    tables = [block_manager.block_tables[s.request_id] for s, _ in decodes]
    width = max((len(t) for t in tables), default=0)
    padded = np.zeros((len(tables), width), dtype=INDEX_DTYPE)                    # (num_decodes, width)
    for row, table in enumerate(tables):
        padded[row, :len(table)] = table
    bs = block_manager.block_size
    chunk_list = []
    for (row, n, start), (seq, _) in zip(chunk_meta, chunks):
        table = block_manager.block_tables[seq.request_id][:-(-(start + n) // bs)]
        chunk_list.append((row, n, as_index(np.arange(start, start + n)[None]), as_index([table]), start + n))
    decode_positions = [s.num_computed_tokens for s, _ in decodes]
    groups = length_groups([p + 1 for p in decode_positions], bs)              # seq_lens: the new token's key too
    return StepInputs(as_index(ids), as_index(positions), as_index(slots), len(decodes),
                      as_index(decode_positions), as_index(padded), groups, chunk_list, logits_rows, sampled)


def execute(model, cache, inputs: StepInputs):
    """One forward over the step's tokens -> logits (R, V) of the rows in inputs.logits_rows."""
    xp = model.xp
    step = PagedStep(cache, inputs.slots, inputs.num_decodes, inputs.decode_positions,
                     inputs.decode_positions + 1, inputs.decode_tables, inputs.chunks,    # seq_lens: the new token too
                     inputs.decode_groups)
    rows = xp.asarray(np.asarray(inputs.logits_rows, dtype=INDEX_DTYPE))                 # (R,)
    return model.forward(inputs.token_ids[None], inputs.positions[None], step, logits_rows=rows)


class ModelRunner:
    """The model with its KV pool of num_blocks x block_size tokens stored as `storage`, and its decode graphs.

    cuda_graphs: replay decode-only steps from CUDA graphs, one per padded batch size, whose padding rows write into
    one scratch block past the block manager's (graph_runner.py). None: on a GPU when paged_decode reads the pool
    (the array path would gather max_model_len keys per sequence and layer in every graphed step); True on the CPU
    runs the same static-buffer step without capture, which is how its equivalence is tested.
    """

    def __init__(self, model, num_blocks: int, block_size: int, storage: str, max_decodes: int, longest: int,
                 cuda_graphs: bool | None = None):
        refusal = graphs_refusal(model)
        if cuda_graphs and refusal:
            raise InputError(refusal)
        reads_pool = model.attention.reads_pool(check_storage(storage))
        self.cuda_graphs = (model.device == "gpu" and reads_pool and refusal is None) if cuda_graphs is None \
            else bool(cuda_graphs)
        self.model = model
        # the pool first: its memory check refuses an impossible num_blocks before anything else is built
        self.cache = PagedKVCache(model.config, num_blocks + self.cuda_graphs, block_size, xp=model.xp,
                                  storage=storage)
        self.graphs = None
        if self.cuda_graphs:
            self.graphs = DecodeGraphs(model, self.cache, max_decodes, -(-longest // block_size),
                                       scratch_block=num_blocks, capture=model.device == "gpu")

    def execute(self, inputs: StepInputs):
        """The step's logits (R, V): replayed from a graph when one serves it, else one forward."""
        if self.graphs is not None and self.graphs.can_run(inputs):
            logits = self.graphs.run(inputs)                                   # (R, V), or None: no graph
            if logits is not None:
                return logits
        return execute(self.model, self.cache, inputs)


# glibc's mallopt() parameters (malloc.h): allocations below M_MMAP_THRESHOLD come from the heap, and freed heap memory
# goes back to the OS only past M_TRIM_THRESHOLD bytes of free space at its top.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEEP_BELOW = 256 * 2**20        # arrays up to this size are carved from memory the process keeps
TRIM_ABOVE = 1 * 2**30          # and up to this much freed memory is kept for the next step


@functools.cache                # a process-wide setting: made once, whichever Engine comes first
def keep_freed_memory() -> bool:
    """Ask the C allocator to keep the memory of freed arrays instead of returning it to the OS; True if it could.

    Why: a forward pass allocates the same large temporaries every step (a (512, 3072) FFN activation is 6 MiB) and
    frees them at its end. glibc returns freed memory to the OS -- at once for blocks it gave out with mmap, and when
    the free space at a heap's top passes a threshold -- so the next step gets fresh pages, and touching each 4 KiB
    page for the first time is a page fault plus the kernel zeroing it. In the main thread glibc's adaptive threshold
    soon stops doing that; in a thread's own arena, where the HTTP server runs the engine (server/engine_loop.py),
    it kept doing it: 450,000-600,000 page faults per 32-request round of `bench serve`'s workload against a few
    hundred for the same Engine in the main thread, and the CPU time of the round ~1.5x. Fixed thresholds end it (a
    few faults per round). It is a process-wide setting, like the CUDA caching allocator's, made by whoever owns the
    process's engine (the Engine). A no-op off glibc and on the GPU's memory (CuPy has its own pool).
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, KEEP_BELOW)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_ABOVE))
    except (OSError, AttributeError):
        return False
