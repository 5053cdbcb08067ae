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

The names are vLLM's (KVTransferConfig's kv_role: "kv_producer" / "kv_consumer"). The engine is given one side of
the pair (Engine(model, kv_connector=...)) and asks it, at four points of its loop, what disaggregation changes
(engine.KVHooks): `admit` a new request (a decode engine sends its prompt away), `adopt` what came back before a
step, `hand_off` a prompt whose first token was just sampled (a prefill engine sends it on), `cancel` an abort.
ConnectorSide below answers them, with the engine's two pool operations (export_kv, import_kv); a transport
underneath carries the messages: LocalConnector below (two engines in one process: the tests' and the notebook's),
or parallel/kv_connector.py's MpiKVConnector (two processes, the KV over MPI: `minitransformer serve
--disaggregated`). engine.py imports neither.

The request stays the decode engine's: its Sequence (detokenizer, stop rules, metrics, its random generator) lives
there from add_request on. The prefill engine only computes: it samples the first token with the request's own
params, and sends the generator's state along, so a seeded request draws the same tokens as it would in one engine.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.errors import InputError
from ..core.metrics import now
from ..core.sampling_params import SamplingParams

PRODUCER, CONSUMER = "kv_producer", "kv_consumer"     # vLLM's kv_role values: who prefills, who decodes
REMOTE_WAIT_S = 0.005       # a consumer with nothing to compute waits this long for a prefill before step() returns


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


class Transport(Protocol):
    """What carries the messages between a prefill engine and a decode engine (one object per side)."""
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


class ConnectorSide:
    """The engine's hooks for one side of the pair (engine.KVHooks), on top of a transport's methods: a transport
    class inherits this and calls ConnectorSide.__init__(self, role). It keeps the requests a decode engine has
    away (`remote`), those whose KV came back but found no room yet (`arrived`), and the transfer counts."""
    role: str

    def __init__(self, role: str):
        if role not in (PRODUCER, CONSUMER):
            raise InputError(f"kv_connector.role must be {PRODUCER!r} or {CONSUMER!r}, got {role!r}")
        self.role = role
        self.remote: dict[str, Any] = {}                          # request id -> its Sequence, at the prefill engine
        self.arrived: collections.deque[tuple[Any, KVTransfer]] = collections.deque()   # back, not adopted yet
        self.stats = TransferStats()

    # ------------------------------------------------------------------ the engine's hooks

    def admit(self, engine, seq) -> bool:
        """A new request: a decode engine keeps its Sequence and sends only the prompt away (True: not scheduled
        here); a prefill engine schedules it (False)."""
        if self.role != CONSUMER:
            return False
        self.remote[seq.request_id] = seq
        self.request_prefill(PrefillRequest(seq.request_id, seq.prompt_token_ids, seq.params,
                                            seq.request.arrival_time, seq.priority, seq.cache_salt))
        return True

    def cancel(self, request_id: str) -> None:
        """An abort: a request still at the prefill engine is aborted there too (which frees its blocks)."""
        if self.remote.pop(request_id, None) is not None:
            self.abort(request_id)

    def released(self, seq) -> None:
        """A request left the engine: one aborted after its KV came back, before adoption, is dropped."""
        if self.arrived:
            self.arrived = collections.deque(a for a in self.arrived if a[0] is not seq)

    def hand_off(self, engine, seq, token: int, logprobs: dict | None) -> bool:
        """A prefill engine, after a prompt's first token: send its KV (export_kv, which frees its blocks), the
        token and the generator's state to the decode engine, and let the request go here without a Result: the
        decode engine reports it. False on a decode engine (the token is appended as usual)."""
        if self.role != PRODUCER:
            return False
        scheduled = seq.metrics.scheduled_time
        state = seq.generator.bit_generator.state
        num_tokens, arrays = seq.num_computed_tokens, engine.export_kv(seq)
        self.send(KVTransfer(seq.request_id, num_tokens, token, logprobs, state,
                             now() if scheduled is None else scheduled, arrays))
        return True

    def adopt(self, engine) -> list:
        """A decode engine, before each step: take in the prefills that came back. Each gets blocks of this pool
        with its keys and values (import_kv) and its first token appended; then it decodes like any running
        sequence. One that finds no seat or no blocks waits, in arrival order, for a later step; one aborted
        meanwhile is dropped."""
        if self.role != CONSUMER:
            return []
        for transfer, seconds in self.receive():
            seq = self.remote.pop(transfer.request_id, None)
            if seq is None:
                self.stats.discarded += 1                  # aborted while it was away: nothing to adopt
                continue
            self.stats.transfers += 1
            self.stats.bytes += transfer.nbytes
            self.stats.seconds += seconds
            self.stats.last.append((transfer.nbytes, seconds))
            self.arrived.append((seq, transfer))
        outputs = []
        while self.arrived:
            seq, transfer = self.arrived[0]
            if not engine.import_kv(seq, transfer.num_tokens, transfer.arrays, transfer.scheduled_time):
                break                                     # no seat or no blocks: they free up as others finish
            self.arrived.popleft()
            seq.generator.bit_generator.state = transfer.generator_state
            outputs.append(engine.append_token(seq, transfer.token, transfer.logprobs))   # may finish it at once
        return outputs

    def idle(self, waited_for: bool) -> bool:
        """Nothing was scheduled: True when requests are away or waiting for room (the step ends without a forward),
        after waiting briefly for a prefill to come back unless this step already produced outputs."""
        if not (self.remote or self.arrived):
            return False
        if not waited_for:
            self.wait(REMOTE_WAIT_S)
        return True

    def transfer_stats(self) -> TransferStats:
        """The transfers received so far. `last` holds the (bytes, seconds) of each transfer since the previous
        call: this call takes them (the server's histograms do)."""
        self.refresh()
        last, self.stats.last = self.stats.last, []
        pool = self.producer_pool                                      # (blocks used, blocks) as last reported
        return dataclasses.replace(self.stats, last=last, in_flight=len(self.remote) + len(self.arrived),
                                   producer_blocks_used=None if pool is None else pool[0],
                                   producer_num_blocks=None if pool is None else pool[1])

    # ------------------------------------------------------------------ the transport (a subclass provides it)

    producer_pool: tuple[int, int] | None = None

    def request_prefill(self, request: PrefillRequest) -> None:
        raise NotImplementedError

    def abort(self, request_id: str) -> None:
        raise NotImplementedError

    def receive(self) -> list[tuple[KVTransfer, float]]:
        raise NotImplementedError

    def wait(self, timeout_s: float) -> None:
        raise NotImplementedError

    def refresh(self) -> None:
        raise NotImplementedError

    def send(self, transfer: KVTransfer) -> None:
        raise NotImplementedError


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


class _LocalSide(ConnectorSide):
    def __init__(self, pair: LocalConnector, role: str):
        super().__init__(role)
        self.pair = pair
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
