"""Disaggregated prefill and decode: what travels between a prefill engine and a decode engine (lesson 16).

A long prompt's prefill, run in the same step as other requests' decodes, makes every one of those decodes wait for
it: their next token comes only when the whole step ends. Disaggregation runs the two phases in different engines,
usually on different GPUs (DistServe, Splitwise; vLLM's KV connectors, NVIDIA Dynamo and llm-d do it in production):

    decode engine (kv_consumer)                               prefill engine (kv_producer)
    add_request -> PrefillRequest ---------------------->     add_request; prefill (chunked, batched with other
                                                              prompts); sample the first token; copy the prompt's
                   KVTransfer <-----------------------------  keys and values out of its pool; free its blocks
    adopt: blocks from its own pool, the keys and values
    written into them, the first token appended (TTFT),
    then decode steps like any other running sequence

The names are vLLM's (KVTransferConfig's kv_role: "kv_producer" / "kv_consumer"). The engine (engine.py) does the
engine side: hand a finished prefill off, or adopt one that arrived. A KVConnector is the transport between them:
LocalConnector below (two engines in one process: the tests' and the notebook's), or parallel/kv_connector.py's
MpiKVConnector (two processes, the KV over MPI: `minitransformer serve --disaggregated`).

The request stays the decode engine's: its Sequence (detokenizer, stop rules, metrics, its random generator) lives
there from add_request on. The prefill engine only computes: it samples the first token with the request's own
params, and sends the generator's state along, so a seeded request draws the same tokens as it would in one engine.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.sampling_params import SamplingParams

PRODUCER, CONSUMER = "kv_producer", "kv_consumer"     # vLLM's kv_role values: who prefills, who decodes


@dataclass
class PrefillRequest:
    """Decode engine -> prefill engine: a request's prompt, to prefill and sample one token from."""
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    priority: int = 0
    cache_salt: str | None = None


@dataclass
class KVTransfer:
    """Prefill engine -> decode engine: a prompt's keys and values and its first token.

    arrays: the prompt's stored K and V, (layers, P, kv_heads, head_dim) each, then their scales (layers, P,
    kv_heads) for a scaled storage (paged_cache.PagedKVCache.export_tokens); on the host, in the pool's storage
    dtype. The transport may send them apart from the rest (MPI: as raw buffers)."""
    request_id: str
    num_tokens: int                  # P: the prompt's tokens, all of whose K and V are in `arrays`
    token: int                       # the first sampled token
    logprobs: dict | None            # its logprobs entry (when the request asked for them)
    generator_state: Mapping[str, Any]   # the request's random generator after drawing it (numpy bit_generator.state)
    scheduled_time: float            # when the prefill engine first scheduled it (metrics.now(): the monotonic
                                     # clock is one clock for every process on a machine)
    arrays: list[Any] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)


@dataclass
class TransferStats:
    """What the decode engine has received, for /metrics and lesson 16 (vLLM's NIXL connector counts the same:
    transfers, bytes per transfer, seconds per transfer)."""
    transfers: int = 0
    bytes: int = 0
    seconds: float = 0.0             # receiving them (the copy into the pool not included)
    discarded: int = 0               # arrived for a request that had been aborted meanwhile
    in_flight: int = 0               # requests at the prefill engine or on their way back, right now
    producer_blocks_used: int | None = None     # the prefill engine's pool, as it last reported it
    producer_num_blocks: int | None = None
    last: list[tuple[int, float]] = field(default_factory=list)   # (bytes, seconds) of transfers not yet published


class KVConnector(Protocol):
    """The transport between a prefill engine and a decode engine (one object per side)."""
    role: str                        # PRODUCER or CONSUMER
    producer_pool: tuple[int, int] | None    # the prefill pool's (blocks used, blocks), as last reported (or None)

    # the decode engine's side
    def request_prefill(self, request: PrefillRequest) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def receive(self) -> list[tuple[KVTransfer, float]]: ...      # what has arrived, each with its receive time

    def wait(self, timeout_s: float) -> None: ...                 # until something may have arrived, or timeout

    def refresh(self) -> None: ...                                # take in the prefill side's latest pool report

    # the prefill engine's side
    def send(self, transfer: KVTransfer) -> None: ...


class LocalConnector:
    """Two engines in one process: the messages go through deques, the arrays by reference (no copy, no time).

    connector = LocalConnector(); producer = Engine(model, kv_connector=connector.producer);
    consumer = Engine(model, kv_connector=connector.consumer); then step both. What the producer must do next is in
    `connector.requests` / `connector.aborts`; `serve_producer(producer_engine)` takes it in (the loop a prefill
    process runs between steps)."""

    def __init__(self):
        self.requests: collections.deque[PrefillRequest] = collections.deque()
        self.aborts: collections.deque[str] = collections.deque()
        self.transfers: collections.deque[KVTransfer] = collections.deque()
        self.producer, self.consumer = _LocalSide(self, PRODUCER), _LocalSide(self, CONSUMER)

    def serve_producer(self, engine) -> None:
        """Hand the prefill engine what the decode engine sent since the last call (requests, then aborts)."""
        while self.requests:
            r = self.requests.popleft()
            engine.add_request(r.prompt_token_ids, r.params, priority=r.priority, request_id=r.request_id,
                               arrival_time=r.arrival_time, cache_salt=r.cache_salt)
        while self.aborts:
            engine.abort(self.aborts.popleft())


class _LocalSide:
    def __init__(self, pair: LocalConnector, role: str):
        self.pair, self.role = pair, role
        self.producer_pool = None            # nothing reports: the caller reads the prefill engine's stats itself

    def request_prefill(self, request: PrefillRequest) -> None:
        self.pair.requests.append(request)

    def abort(self, request_id: str) -> None:
        self.pair.aborts.append(request_id)

    def receive(self) -> list[tuple[KVTransfer, float]]:
        arrived = [(t, 0.0) for t in self.pair.transfers]
        self.pair.transfers.clear()
        return arrived

    def wait(self, timeout_s: float) -> None:
        """Nothing to wait for in one process: the caller steps the prefill engine itself."""

    def refresh(self) -> None:
        """Nothing to take in: the caller can read the prefill engine's stats itself."""

    def send(self, transfer: KVTransfer) -> None:
        self.pair.transfers.append(transfer)
