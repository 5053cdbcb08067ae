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
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from ..backend import INDEX_DTYPE, to_host
from ..errors import InputError
from ..kv_cache import KVCache
from ..model import Transformer
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


@dataclass
class StepMessage:
    """What the workers need for one forward, broadcast by rank 0 (pickled; a few hundred bytes at decode).

    A paged engine step would add its block tables (B, blocks per sequence) and slot mapping (B*T,) here: every
    rank holds its own pool of the same block count, so the driver's block ids index every rank's pool.
    """
    kind: str                              # "forward", or "stop": leave the loop
    token_ids: np.ndarray | None = None    # (B, T) int64
    positions: np.ndarray | None = None    # (B, T) int64
    cache: CacheSpec | None = None         # the KV cache this forward reads and fills; None: no cache
    layers: int | None = None              # the forward's `layers` (the self-drafter's first L layers)
    released: list[int] = field(default_factory=list)    # keys of caches the driver has released since


class DriverTransformer(Transformer):
    """Rank 0's model: the same weights and forward, after broadcasting each forward's StepMessage."""

    def __init__(self, model: Transformer, comm: Communicator):
        vars(self).update(vars(model))       # the same arrays, config, tokenizer and comm (None in a world of 1)
        self.group = comm                    # where the step messages go
        self._announced: dict[int, KVCache] = {}       # key -> the driver's caches the workers hold a mirror of

    def forward(self, token_ids, positions, cache=None, layers=None, logits_rows=None, last_only=False):
        self.group.broadcast(StepMessage("forward", _host_ids(token_ids), _host_ids(positions),
                                        self._cache_spec(cache), layers, self._released()))
        return super().forward(token_ids, positions, cache, layers, logits_rows, last_only)

    def _cache_spec(self, cache) -> CacheSpec | None:
        if cache is None:
            return None
        if not isinstance(cache, KVCache):
            raise InputError(f"tensor parallelism runs the contiguous KV cache (generate) so far; a "
                             f"{type(cache).__name__} (the serving engine's) is not sent to the workers yet")
        self._announced[id(cache)] = cache
        return CacheSpec(id(cache), cache.max_len, cache.batch, cache.storage, cache.length)

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
    steps = 0
    while True:
        step: StepMessage = comm.broadcast(None)
        if step.kind == "stop":
            return steps
        for key in step.released:
            caches.pop(key).release()
        cache = None if step.cache is None else _mirror(caches, step.cache, model)
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
