"""One driver, several workers, as vLLM runs tensor parallelism: rank 0 owns the loop, every rank runs the forward.

Rank 0 runs generate()/stream() exactly as one process does (tokenize, sample, stop checks, detokenize happen there
only). Its model is a DriverTransformer: before each forward it broadcasts a StepMessage (the token ids and
positions, and which KV cache they go through), then runs its own shard's forward. The workers sit in
`serve_worker`: receive a message, run the same forward on their shard, repeat. Inside the forward the two
all-reduces per layer keep the ranks in step, and after the last one every rank has the full hidden state, from
which rank 0 alone computes logits (the lm_head is replicated: parallel/plan.py). Workers ask for no logits rows.

Each rank's KV cache holds only its KV heads. The workers mirror the driver's caches by key: a cache first named
in a message is allocated with the same size, one the driver has released is dropped, and one whose length went
back (speculative decoding's rollback) is truncated to match.

The serving engine's paged step goes the same way (serving/engine.py runs on a DriverTransformer unchanged): its
PagedStep is sent as a PagedStepSpec (the slot of each token, the decode rows' positions, lengths, block tables and
length groups, each prefill chunk's table), and each worker rebuilds the PagedStep over a PagedKVCache of its own,
allocated on first sight with the driver's pool's block count and block size but only its own KV heads. The block
ids come from the driver's BlockManager and index every rank's pool alike, so each rank's block b holds its heads'
keys of the same tokens: prefix caching (a block reused), preemption (blocks freed, the prompt computed again) and
aborts (blocks freed, no forward at all) need nothing from the workers beyond the forwards they are sent.
"""

from __future__ import annotations

import itertools
import sys
import traceback
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..core.backend import INDEX_DTYPE, to_host
from ..core.errors import InputError
from ..core.kv_cache import KVCache
from ..core.model import Transformer
from ..serving.paged_cache import PagedKVCache, PagedStep
from .communicator import Communicator, MpiCommunicator
from .launch import watch_supervisor


@dataclass(frozen=True)
class CacheSpec:
    """A contiguous KV cache as the workers must mirror it: the driver's cache's key and size, and its length now."""
    key: int                 # id() of the driver's KVCache (kept alive by the driver until reported released)
    max_len: int
    batch: int
    storage: str             # kv_storage codec: "f32" or "int8"
    length: int              # tokens stored before this forward


@dataclass(frozen=True)
class PoolSpec:
    """The engine's paged KV pool as the workers must mirror it: same blocks, each rank's own KV heads."""
    key: int                 # the driver's number for this pool (DriverTransformer._pool_key)
    num_blocks: int
    block_size: int
    storage: str             # kv_storage codec: "f32" or "int8"


@dataclass
class PagedStepSpec:
    """One engine step's PagedStep (serving/paged_cache.py) on the host, for a worker to rebuild over its own pool.
    N tokens laid end to end, D of them decode rows (serving/model_runner.py)."""
    pool: PoolSpec
    slots: np.ndarray             # (N,) the pool slot each token's keys go to: block id * block_size + offset
    num_decodes: int              # D
    decode_positions: np.ndarray  # (D,)
    seq_lens: np.ndarray          # (D,) keys each decode row reads
    decode_tables: np.ndarray     # (D, nb) block tables, padded
    chunks: list[tuple[int, int, np.ndarray, np.ndarray, int]]   # per prefill chunk: first row, length,
                                                                  # positions (1, n), table (1, nb), keys it reads
    decode_groups: list[tuple[int, int, int]] | None   # decode rows of similar length (paged_cache.length_groups)


@dataclass
class StepMessage:
    """What the workers need for one forward, broadcast by rank 0 (pickled; a few hundred bytes at decode, a block
    table per sequence more for an engine step)."""
    kind: str                              # "forward", or "stop": leave the loop
    token_ids: np.ndarray | None = None    # (B, T) int64
    positions: np.ndarray | None = None    # (B, T) int64
    cache: CacheSpec | PagedStepSpec | None = None   # the KV cache this forward reads and fills; None: no cache
    layers: int | None = None              # the forward's `layers` (the self-drafter's first L layers)
    released: list[int] = field(default_factory=list)    # keys of caches the driver has released since
    released_pools: list[int] = field(default_factory=list)   # keys of paged pools the driver has dropped since


class DriverTransformer(Transformer):
    """Rank 0's model: the same weights and forward, after broadcasting each forward's StepMessage."""

    def __init__(self, model: Transformer, comm: Communicator):
        vars(self).update(vars(model))       # the same arrays, config, tokenizer and comm (None in a world of 1)
        self.group = comm                    # where the step messages go
        self._announced: dict[int, KVCache] = {}       # key -> the driver's caches the workers hold a mirror of
        # The engine's pools, numbered as first seen (a number, not id(): a new pool may reuse a dropped one's
        # address), held weakly so that an engine that is gone takes its pool's mirrors with it.
        self._pool_keys: weakref.WeakKeyDictionary[PagedKVCache, int] = weakref.WeakKeyDictionary()
        self._pools_mirrored: set[int] = set()
        self._next_pool_key = itertools.count()

    def forward(self, token_ids, positions, cache=None, layers=None, logits_rows=None, last_only=False):
        spec = self._cache_spec(cache)
        self.group.broadcast(StepMessage("forward", _host_ids(token_ids), _host_ids(positions), spec, layers,
                                        self._released(), self._released_pools()))
        return super().forward(token_ids, positions, cache, layers, logits_rows, last_only)

    def _cache_spec(self, cache) -> CacheSpec | PagedStepSpec | None:
        if cache is None:
            return None
        if isinstance(cache, PagedStep):
            return self._paged_spec(cache)
        if not isinstance(cache, KVCache):
            raise InputError(f"tensor parallelism sends a KVCache or a PagedStep to the workers, not a "
                             f"{type(cache).__name__}")
        self._announced[id(cache)] = cache
        return CacheSpec(id(cache), cache.max_len, cache.batch, cache.storage, cache.length)

    def _paged_spec(self, step: PagedStep) -> PagedStepSpec:
        pool = step.cache
        key = self._pool_keys.get(pool)
        if key is None:
            key = self._pool_keys[pool] = next(self._next_pool_key)
            self._pools_mirrored.add(key)
        chunks = [(row, n, _host_ids(positions), _host_ids(table), num_keys)
                  for row, n, positions, table, num_keys in step.chunks]
        return PagedStepSpec(PoolSpec(key, pool.num_blocks, pool.block_size, pool.storage), _host_ids(step.slots),
                             step.num_decodes, _host_ids(step.decode_positions), _host_ids(step.seq_lens),
                             _host_ids(step.decode_tables), chunks, step.decode_groups)

    def _released_pools(self) -> list[int]:
        gone = sorted(self._pools_mirrored - set(self._pool_keys.values()))
        self._pools_mirrored.difference_update(gone)
        return gone

    def _released(self) -> list[int]:
        gone = [key for key, cache in self._announced.items() if cache.store is None]
        for key in gone:
            del self._announced[key]
        return gone


def _host_ids(values) -> np.ndarray:
    return np.asarray(to_host(values) if hasattr(values, "device") else values, dtype=INDEX_DTYPE)


NO_LOGITS_ROWS = np.empty(0, dtype=INDEX_DTYPE)      # workers compute no logits: rank 0 samples


def serve_worker(model: Transformer, comm: Communicator) -> int:
    """A worker's loop: run each forward rank 0 announces, on this rank's shard, until told to stop.
    Returns how many forwards it ran."""
    caches: dict[int, KVCache] = {}
    pools: dict[int, PagedKVCache] = {}
    steps = 0
    while True:
        step: StepMessage = comm.broadcast(None)
        if step.kind == "stop":
            return steps
        for key in step.released:
            caches.pop(key).release()
        for key in step.released_pools:
            del pools[key]
        cache: KVCache | PagedStep | None = None
        if isinstance(step.cache, PagedStepSpec):
            cache = _paged_step(pools, step.cache, model)
        elif step.cache is not None:
            cache = _mirror(caches, step.cache, model)
        rows = model.xp.asarray(NO_LOGITS_ROWS)
        model.forward(step.token_ids, step.positions, cache, layers=step.layers, logits_rows=rows)
        steps += 1


def _mirror(caches: dict[int, KVCache], spec: CacheSpec, model: Transformer) -> KVCache:
    """This worker's copy of the driver's cache `spec`: allocated on first sight, truncated when the driver's
    went back."""
    cache = caches.get(spec.key)
    if cache is None:
        cache = caches[spec.key] = KVCache(model.config, spec.max_len, spec.batch, xp=model.xp,
                                           storage=spec.storage)
    if cache.length != spec.length:
        cache.truncate(spec.length)
    return cache


def _paged_step(pools: dict[int, PagedKVCache], spec: PagedStepSpec, model: Transformer) -> PagedStep:
    """The driver's engine step over this worker's own pool (allocated on first sight: the driver's block count and
    block size, this rank's KV heads), with the step's arrays on this rank's device."""
    p = spec.pool
    pool = pools.get(p.key)
    if pool is None:
        pool = pools[p.key] = PagedKVCache(model.config, p.num_blocks, p.block_size, xp=model.xp, storage=p.storage)
    xp = model.xp
    chunks = [(row, n, xp.asarray(positions), xp.asarray(table), num_keys)
              for row, n, positions, table, num_keys in spec.chunks]
    return PagedStep(pool, xp.asarray(spec.slots), spec.num_decodes, xp.asarray(spec.decode_positions),
                     xp.asarray(spec.seq_lens), xp.asarray(spec.decode_tables), chunks, spec.decode_groups)


@contextmanager
def tensor_parallel_rank(load, communicator=MpiCommunicator) -> Iterator[DriverTransformer | None]:
    """Inside a rank process started by launch.py: load this rank's shard with `load(comm)`; on rank 0 yield the
    DriverTransformer (the workers are told to stop on the way out, whatever happened, a failed load included),
    on a worker run its loop and yield None. communicator() makes the rank's Communicator (MPI, or NCCL on GPUs).

    A worker that fails aborts the whole MPI job (MPI_Abort), so rank 0 is never left waiting in a collective for a
    rank that is gone; the launcher then reports the failure.
    """
    comm = communicator()
    watch_supervisor()
    if comm.rank != 0:
        try:
            serve_worker(load(comm), comm)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            comm.abort()
        yield None
        return
    try:
        yield DriverTransformer(load(comm), comm)
    finally:
        comm.broadcast(StepMessage("stop"))
