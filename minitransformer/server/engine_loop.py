"""The engine thread: one thread owns the Engine and steps it while it has work; HTTP handlers talk to it by message.

    handler (event loop)                         engine thread
    ---------------------                        ----------------------------------------------------------
    submit(ids, params) --- command queue --->   engine.add_request(...)   (or refuse: queue full, quota)
                        <--- Future ----------   request id
    await items.get()   <--- call_soon_threadsafe: one Delta per step per request (text, tokens, logprobs)
    abort(rid)          --- command queue --->   engine.abort(rid): blocks freed now, final item next step

Why a thread and queues: the Engine is plain synchronous code (serving/engine.py) and is not thread-safe, and a model
step takes milliseconds to seconds. Run on the event loop, it would freeze every connection for a whole step; run
from several handlers at once, it would corrupt the block tables. So exactly one thread touches the Engine, and the
event loop only ever waits on queues. Between two steps the thread takes in every command that arrived, which is
what makes the batching continuous: a request that arrives mid-stream joins the running batch at the next step.

The thread reads the Engine only through its read API (serving/outputs.py: the outputs of step(), stats,
snapshot(), recent_steps()), never its block manager, scheduler or sequences: tests/test_layering.py checks that.

A request lives as long as its client: a handler whose client went away calls abort(), and the thread aborts it
before the next step. A request older than --request-timeout is aborted by the engine itself (add_request's
timeout), with stop_reason "timeout".
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from ..core.request import Delta
from ..serving import Engine
from .errors import EngineFailed, QueueFull
from .prometheus import ServerMetrics
from .responses import finish

log = logging.getLogger("minitransformer.server")
IDLE_REFRESH_S = 0.1


class EngineLoop:
    """Owns `engine` on its own thread; see the module docstring."""

    def __init__(self, engine: Engine, metrics: ServerMetrics, request_timeout_s: float | None = None,
                 max_waiting: int | None = None):
        self.engine, self.metrics = engine, metrics
        self.request_timeout_s, self.max_waiting = request_timeout_s, max_waiting
        self.stats = engine.stats                        # a fresh snapshot after every step, read by /metrics
        self.error: str | None = None                    # set when a step failed: the server stops taking work
        self._commands: queue.Queue = queue.Queue()
        self._sinks: dict[str, object] = {}              # request id -> callable(Delta), into its handler
        self.publish_hooks: list = []                    # fn(loop), called in the engine thread after each publish
        self._thread = threading.Thread(target=self._run, name="minitransformer-engine", daemon=True)

    # ------------------------------------------------------------------ called from the event loop

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Abort whatever is still running, tell its clients, and end the thread."""
        self._commands.put(None)
        self._thread.join(timeout_s)

    def submit(self, prompt_ids: list[int], params, priority: int, tenant: str | None, arrival_time: float,
               sink, request_id: str | None = None, cache_salt: str | None = None) -> Future:
        """Hand a tokenized request to the engine thread. The Future resolves to its request id, or to the error
        that refused it (InputError, QuotaError, QueueFull, EngineFailed). `sink(Delta)` is called from the
        engine thread. request_id: the id to give it (the server's are random); cache_salt: Engine.add_request's."""
        future: Future = Future()
        self._commands.put(lambda: self._add(future, sink, prompt_ids, params, priority, tenant, arrival_time,
                                             request_id, cache_salt))
        return future

    def abort(self, request_id: str, reason: str = "cancelled") -> None:
        self._commands.put(lambda: self.engine.abort(request_id, reason=reason))

    def abort_all(self, reason: str) -> None:
        """End every request the engine holds, running or waiting: each handler gets its final item (finish_reason
        "abort", stop_reason `reason`) with the text it has so far, and the blocks are freed."""
        def abort_all():
            for request_id in self.engine.unfinished_request_ids():
                self.engine.abort(request_id, reason=reason)
        self._commands.put(abort_all)

    def call_soon(self, fn) -> None:
        """Run fn() in the engine thread before its next step (an idle thread wakes up, runs it and publishes)."""
        self._commands.put(fn)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        while True:
            busy = self.error is None and self.engine.has_unfinished_requests()
            commands = [] if busy else self._wait_for_command()
            while True:
                try:
                    commands.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            for command in commands:
                if command is None:
                    return self._shutdown()
                try:
                    command()
                except Exception:                        # a bug in one command must not end the thread
                    log.exception("an engine command failed")
            if self.engine.has_unfinished_requests() and self.error is None:
                try:
                    outputs = self.engine.step()
                except Exception as exc:                 # a bug in a step: fail its requests, keep the process up
                    log.exception("engine step failed; the server stops taking requests")
                    # what every client and /health (no key needed) are told: not the exception's text, which can
                    # hold another request's data (a grammar, a prompt); the log has it
                    self._fail_all(f"the engine failed ({type(exc).__name__}); the server log has the details")
                    continue
                self._publish()                          # first: a client that sees its token sees these stats
                self._dispatch(outputs)
            else:
                self._publish()

    def _wait_for_command(self) -> list:
        """Idle: sleep until a command comes. A disaggregated engine also wakes every IDLE_REFRESH_S, so that the
        prefill process's reports (its pool freed after an abort) reach /metrics while nothing runs here."""
        try:
            return [self._commands.get(timeout=None if self.engine.kv_role is None else IDLE_REFRESH_S)]
        except queue.Empty:
            return []

    def _add(self, future: Future, sink, prompt_ids, params, priority, tenant, arrival_time, request_id=None,
             cache_salt=None) -> None:
        if not future.set_running_or_notify_cancel():
            return                                       # the client left before its request got here
        if self.error is not None:
            future.set_exception(EngineFailed(self.error))
            return
        waiting = self.engine.stats.num_waiting_reqs
        if self.max_waiting is not None and waiting >= self.max_waiting:
            future.set_exception(QueueFull(f"the waiting queue is full ({waiting} requests waiting, "
                                           f"--max-waiting {self.max_waiting}); retry shortly"))
            return
        try:
            request_id = self.engine.add_request(prompt_ids, params, priority=priority, tenant=tenant,
                                                 arrival_time=arrival_time, request_id=request_id,
                                                 cache_salt=cache_salt, timeout=self.request_timeout_s)
        except Exception as exc:                         # InputError, QuotaError, ... or a bug: the handler says
            future.set_exception(exc)
            return
        self._sinks[request_id] = sink
        future.set_result(request_id)

    def _dispatch(self, outputs) -> None:
        """Each RequestOutput of the step -> its handler: its Delta (text, tokens, logprob entries, Result)."""
        for out in outputs:
            rid = out.request_id
            sink = self._sinks.get(rid)
            if out.finished:
                self._sinks.pop(rid, None)
                self.metrics.observe_finished(out.result, finish(out.result)[0])
            if sink is not None:
                _deliver(sink, out.delta)

    def _publish(self) -> None:
        """Snapshots for readers on other threads (assigning a reference is atomic)."""
        self.stats = self.engine.stats
        self.metrics.observe_transfers(self.engine.take_kv_transfer_stats())
        for hook in self.publish_hooks:                  # live.py: the live page's snapshot, only while watched
            hook(self)

    def _fail_all(self, message: str) -> None:
        self.error = message
        try:
            for request_id in self.engine.unfinished_request_ids():
                self.engine.abort(request_id)            # frees their blocks
        except Exception:
            log.exception("could not abort the requests of the failed engine")
        for sink in self._sinks.values():
            _deliver(sink, Delta("", [], logprobs=[], error=message))
        self._sinks.clear()

    def _shutdown(self) -> None:
        if self.error is not None:
            return
        for request_id in self.engine.unfinished_request_ids():
            self.engine.abort(request_id)
        while self.engine.has_unfinished_requests():
            self._dispatch(self.engine.step())           # only the aborts' final outputs: no model work
        self._publish()


def _deliver(sink, item: Delta) -> None:
    try:
        sink(item)
    except RuntimeError:                                 # the handler's event loop is closed: nobody to tell
        pass
