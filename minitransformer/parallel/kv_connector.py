"""Disaggregated prefill/decode over MPI: a decode process and a prefill process, the KV cache sent between them.

`minitransformer serve --disaggregated` runs two ranks (parallel/launch.py starts them, as for tensor parallelism):

    rank 0: the HTTP server and the decode engine (kv_consumer)    rank 1: the prefill engine (kv_producer)

Each loads the whole model and has a KV pool of its own. serving/kv_transfer.py says what travels and
serving/engine.py what each engine does with it; this is the transport, MpiKVConnector, and the prefill process's
loop, serve_prefill. The messages:

    rank 0 -> 1, CONTROL tag:  PrefillRequest | Abort | Stop                       (small: pickled by mpi4py)
    rank 1 -> 0, HEADER tag:   a KVTransfer without its arrays, with their shapes  (pickled)  | Stopped
    rank 1 -> 0, STATUS tag:   PoolStatus: the prefill pool's blocks in use, after every change (pickled)
    rank 1 -> 0, DATA tag:     each array of a transfer, as a raw buffer (upper-case Isend / Recv: no pickling)

MPI keeps the order of messages between two ranks on one tag, so the n-th header's arrays are the next DATA
messages. The prefill rank sends with Isend and goes on prefilling: the decode rank takes a transfer in only between
two of its steps, and a blocking send of a large buffer would hold the prefill rank until then. Neither rank waits
inside MPI when idle: MPICH waits by spinning, which would take a core from the other rank on a small machine, so
an idle rank polls (Iprobe) and sleeps POLL_S between polls.

On a GPU the arrays go through the host (to_host, then xp.asarray): NIXL (vLLM's connector) moves GPU memory over
NVLink or RDMA directly; lesson 16 does the arithmetic for that case from published figures.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..core.metrics import now
from ..serving.kv_transfer import CONSUMER, PRODUCER, ConnectorSide, KVTransfer, PrefillRequest
from .communicator import import_mpi
from .launch import watch_supervisor

CONTROL, HEADER, DATA, STATUS = 11, 12, 13, 14          # MPI tags
DECODE_RANK, PREFILL_RANK = 0, 1
POLL_S = 0.0005                              # a waiting rank's sleep between two looks for a message
IDLE_POLL_S = 0.005                          # the prefill rank's longest sleep when it has had nothing to do


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Stop:
    """The decode rank is done: the prefill rank answers Stopped, sends what it still owes, and exits."""


@dataclass(frozen=True)
class Stopped:
    """The last HEADER message: every transfer the prefill rank sent came before it."""


@dataclass(frozen=True)
class PoolStatus:
    blocks_used: int
    num_blocks: int


class MpiKVConnector(ConnectorSide):
    """One side of the link (serving/kv_transfer.py's KVConnector), chosen by this process's rank: rank 0 is the
    consumer (decode), rank 1 the producer (prefill). producer_pool: the prefill pool's (blocks used, blocks), as
    rank 1 last reported it (the consumer's /metrics and the tests read it)."""

    def __init__(self, comm=None):
        MPI = import_mpi()
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        if self.comm.Get_size() != 2:
            raise RuntimeError(f"disaggregated serving runs on 2 ranks, this job has {self.comm.Get_size()}")
        super().__init__(CONSUMER if self.comm.Get_rank() == DECODE_RANK else PRODUCER)
        self.producer_pool: tuple[int, int] | None = None
        self._sending: list[tuple[list, list]] = []        # producer: (Isend requests, their arrays) in flight
        self._status: PoolStatus | None = None

    # ------------------------------------------------------------------ the decode rank's side

    def request_prefill(self, request: PrefillRequest) -> None:
        self.comm.send(request, dest=PREFILL_RANK, tag=CONTROL)

    def abort(self, request_id: str) -> None:
        self.comm.send(Abort(request_id), dest=PREFILL_RANK, tag=CONTROL)

    def receive(self) -> list[tuple[KVTransfer, float]]:
        """Every transfer that has arrived, with the seconds its arrays took to come in after their header."""
        arrived = []
        while self.comm.Iprobe(source=PREFILL_RANK, tag=HEADER):
            arrived.append(self._receive_arrays(self.comm.recv(source=PREFILL_RANK, tag=HEADER)))
        self.refresh()
        return arrived

    def refresh(self) -> None:
        """Take in the prefill rank's latest pool reports (producer_pool)."""
        while self.comm.Iprobe(source=PREFILL_RANK, tag=STATUS):
            status = self.comm.recv(source=PREFILL_RANK, tag=STATUS)
            self.producer_pool = (status.blocks_used, status.num_blocks)

    def _receive_arrays(self, header: KVTransfer) -> tuple[KVTransfer, float]:
        start = now()
        arrays = []
        for shape, dtype in header.arrays:                   # the header carries (shape, dtype) in their place
            array = np.empty(shape, dtype=np.dtype(dtype))
            self.comm.Recv(array, source=PREFILL_RANK, tag=DATA)
            arrays.append(array)
        return dataclasses.replace(header, arrays=arrays), now() - start

    def wait(self, timeout_s: float) -> None:
        """Until a header has arrived or timeout_s passed (polling, not spinning: module docstring)."""
        deadline = now() + timeout_s
        while not self.comm.Iprobe(source=PREFILL_RANK, tag=HEADER) and now() < deadline:
            time.sleep(POLL_S)

    def close(self) -> None:
        """Tell the prefill rank to stop, and take in (and drop) whatever it still sends until it says Stopped."""
        self.comm.send(Stop(), dest=PREFILL_RANK, tag=CONTROL)
        while True:
            while not self.comm.Iprobe(source=PREFILL_RANK, tag=HEADER):
                time.sleep(POLL_S)
            message = self.comm.recv(source=PREFILL_RANK, tag=HEADER)
            if isinstance(message, Stopped):
                self.refresh()                           # its reports came before Stopped too
                return
            self._receive_arrays(message)

    # ------------------------------------------------------------------ the prefill rank's side

    def send(self, transfer: KVTransfer) -> None:
        """The header now (small), the arrays with Isend: they leave while this rank prefills on."""
        arrays = [np.ascontiguousarray(a) for a in transfer.arrays]
        specs = [(a.shape, a.dtype.str) for a in arrays]
        self.comm.send(dataclasses.replace(transfer, arrays=specs), dest=DECODE_RANK, tag=HEADER)
        self._sending.append(([self.comm.Isend(a, dest=DECODE_RANK, tag=DATA) for a in arrays], arrays))
        self._sending = [(requests, kept) for requests, kept in self._sending if not _done(requests)]

    def report_pool(self, blocks_used: int, num_blocks: int) -> None:
        """Send the prefill pool's use when it changed (after a step, an abort)."""
        status = PoolStatus(blocks_used, num_blocks)
        if status != self._status:
            self.comm.send(status, dest=DECODE_RANK, tag=STATUS)
            self._status = status

    def take_messages(self, block: bool) -> list:
        """What the decode rank sent (PrefillRequest, Abort, Stop), in order; block: poll until there is one."""
        pause = POLL_S
        while block and not self.comm.Iprobe(source=DECODE_RANK, tag=CONTROL):
            time.sleep(pause)
            pause = min(2 * pause, IDLE_POLL_S)          # idle a while: look less often
        messages = []
        while self.comm.Iprobe(source=DECODE_RANK, tag=CONTROL):
            messages.append(self.comm.recv(source=DECODE_RANK, tag=CONTROL))
        return messages

    def finish(self) -> None:
        """Stopped, then wait for the arrays still on their way (the decode rank's close() takes them in)."""
        self.comm.send(Stopped(), dest=DECODE_RANK, tag=HEADER)
        for requests, _ in self._sending:
            import_mpi().Request.Waitall(requests)
        self._sending = []


def _done(requests) -> bool:
    return bool(import_mpi().Request.Testall(requests))


def serve_prefill(engine, connector: MpiKVConnector) -> None:
    """The prefill rank's loop: take the decode rank's requests and aborts, step the engine while it has prompts
    (each prefilled prompt is sent from inside the step: ConnectorSide.hand_off), report the pool, until Stop."""
    while True:
        for message in connector.take_messages(block=not engine.has_unfinished_requests()):
            if isinstance(message, Stop):
                connector.finish()
                return
            if isinstance(message, Abort):
                engine.abort(message.request_id)
            else:
                engine.add_request(message.prompt_token_ids, message.params, priority=message.priority,
                                   request_id=message.request_id, arrival_time=message.arrival_time,
                                   cache_salt=message.cache_salt)
        if engine.has_unfinished_requests():
            engine.step()
        stats = engine.stats
        connector.report_pool(stats.num_blocks - stats.num_free_blocks, stats.num_blocks)


@contextmanager
def disaggregated_rank(load, make_engine) -> Iterator[tuple[object, MpiKVConnector] | None]:
    """Inside one of the two ranks launch.py started for `serve --disaggregated`. Rank 1 loads the model with
    load(), builds its engine with make_engine(model, connector) and runs serve_prefill until rank 0 is done, then
    yields None. Rank 0 yields (model, connector) for its server and decode engine, and on the way out, whatever
    happened, tells rank 1 to stop. A prefill rank that fails ends the whole MPI job (MPI_Abort), as a tensor-parallel
    worker does, so the decode rank never waits for a rank that is gone."""
    connector = MpiKVConnector()
    watch_supervisor()
    if connector.role == PRODUCER:
        try:
            serve_prefill(make_engine(load(), connector), connector)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            connector.comm.Abort(1)
        yield None
        return
    try:
        yield load(), connector
    finally:
        connector.close()
