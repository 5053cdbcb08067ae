"""Connection hygiene, below the routes: every connection must say what it wants in time, there are at most so many
of them, and running out of file descriptors is one log line, not a traceback per refused accept.

uvicorn's `timeout_keep_alive` closes a connection that stays idle *after a response*; nothing closes one that never
sends a request, or sends half a request line and stops (slowloris). Each such connection holds a file descriptor
forever. uvicorn has no setting for it and h11 (the HTTP/1.1 parser uvicorn uses here) bounds the size of an
unfinished request head, not its time. So `protocol_class` below subclasses uvicorn's own h11 protocol with one timer:
armed while the connection waits for a request head (from the moment it opens, and again when the first bytes of a
next request arrive), cancelled when the head is complete, and when it fires the connection is closed. It is the
timer Go's http.Server calls ReadHeaderTimeout and nginx client_header_timeout. A second timer does the same for the
body (Go's ReadTimeout, nginx client_body_timeout): armed when a head announces a body, cancelled when the whole body
has arrived; a client that sends a head with Content-Length 100000, 13 bytes and then nothing is closed after
--body-timeout seconds, with one log line. Neither limits a long streamed response.

The same class caps the open connections (--limit-concurrency): a connection over the cap is answered 503 with
OpenAI's error object (uvicorn's own limit answers in plain text) and closed, so it gives its descriptor back; an
idle one over the cap is closed by the header timer.

Out of file descriptors, accept() fails with EMFILE. asyncio (3.11) then reports it, stops watching the listening
socket and schedules a retry a second later -- and goes on calling accept() up to the listen backlog (2048) times in
the same wakeup, each failure another report and another retry timer: tens of thousands of tracebacks a minute, and
a burst of stale retries that fail once more when the socket closes at shutdown. `ListeningSocket` reports EMFILE
once per wakeup (the next accept() of that wakeup says "nothing to accept", which ends asyncio's loop), and
`quiet_accept_errors` turns what is left into one log line every REFUSAL_LOG_INTERVAL_S.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import resource
import socket

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..core.metrics import now

log = logging.getLogger("minitransformer.server")

REFUSAL_LOG_INTERVAL_S = 10.0        # at most one log line this often about refused connections or accepts
OUT_OF_DESCRIPTORS = {errno.EMFILE, errno.ENFILE}


def protocol_class(header_timeout_s: float, limit_concurrency: int | None, body_timeout_s: float) -> type:
    """uvicorn's h11 protocol with request-head and request-body deadlines and a connection cap (see the module
    docstring)."""
    refusals = RateLimitedLog(REFUSAL_LOG_INTERVAL_S)

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._head_timer: asyncio.TimerHandle | None = None
            self._body_timer: asyncio.TimerHandle | None = None
            if limit_concurrency is not None and len(self.connections) > limit_concurrency:
                self.app = _over_capacity(limit_concurrency)
                refusals.log("refusing connections over --limit-concurrency %d with 503", limit_concurrency)
            self._arm_head_timer()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE:           # the head is still incomplete
                if self._head_timer is None and not self.transport.is_closing():
                    self._arm_head_timer()
            else:                                           # a whole head arrived: the request runs
                self._cancel_head_timer()
            if self.conn.their_state is h11.SEND_BODY:      # its body is on the way, or not
                if self._body_timer is None and not self.transport.is_closing():
                    self._body_timer = self.loop.call_later(body_timeout_s, self._body_timed_out)
            elif self._body_timer is not None:              # the whole body arrived
                self._body_timer.cancel()
                self._body_timer = None

        def connection_lost(self, exc) -> None:
            self._cancel_head_timer()
            if self._body_timer is not None:
                self._body_timer.cancel()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _cancel_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()                      # nothing was asked: no response is owed

        def _body_timed_out(self) -> None:
            self._body_timer = None
            if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                peer = self.transport.get_extra_info("peername")
                log.warning("closed a connection from %s whose request body did not arrive within %gs "
                            "(--body-timeout)", peer[0] if peer else "?", body_timeout_s)
                self.transport.close()                      # the handler reading it ends as a disconnect

    return GuardedH11Protocol


def _over_capacity(limit: int):
    """An ASGI app answering 503 with OpenAI's error object, closing the connection."""
    body = json.dumps({"error": {"message": f"the server holds its limit of {limit} connections "
                                            "(--limit-concurrency); retry shortly", "type": "server_error",
                                 "param": None, "code": "too_many_connections"}}).encode()

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close"), (b"retry-after", b"1")]})
        await send({"type": "http.response.body", "body": body})
    return app


class ListeningSocket(socket.socket):
    """A listening socket whose accept() raises EMFILE / ENFILE once, then BlockingIOError once, so asyncio's accept
    loop stops at the first failure instead of retrying (and scheduling a retry timer) up to the backlog."""

    _failed = False

    def accept(self):
        if self._failed:
            self._failed = False
            raise BlockingIOError(errno.EAGAIN, "accept retried after running out of file descriptors")
        try:
            return super().accept()
        except OSError as exc:
            self._failed = exc.errno in OUT_OF_DESCRIPTORS
            raise


class RateLimitedLog:
    """A warning at most once per interval, with the number of times it was suppressed in between."""

    def __init__(self, interval_s: float):
        self.interval_s, self.suppressed = interval_s, 0
        self.last: float | None = None          # now() of the last line logged

    def log(self, message: str, *args) -> None:
        clock = now()
        if self.last is not None and clock - self.last < self.interval_s:
            self.suppressed += 1
            return
        extra = f" ({self.suppressed} more since the last such line)" if self.suppressed else ""
        log.warning(message + extra, *args)
        self.last, self.suppressed = clock, 0


def quiet_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Out of file descriptors, asyncio's accept loop reports every failed accept with a traceback and retries a
    second later. The condition is one fact, so it is logged as one line (at most every REFUSAL_LOG_INTERVAL_S):
    what happened, the limit, and what frees descriptors. Other loop errors keep the default report."""
    lines = RateLimitedLog(REFUSAL_LOG_INTERVAL_S)
    default = loop.get_exception_handler()

    def handler(loop, context) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS:
            soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            lines.log("out of file descriptors (%s; ulimit -n is %d): new connections wait until open ones close "
                      "(idle ones within --header-timeout); --limit-concurrency keeps below the limit",
                      exc.strerror, soft)
            return
        if _stale_accept_retry(context):
            return                               # the listening socket closed (shutdown) while a retry was due

        if default is not None:
            default(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def _stale_accept_retry(context: dict) -> bool:
    """asyncio's accept retry (`_start_serving`, scheduled after EMFILE) that fired after the listening socket was
    closed: its fileno is -1 and it fails with ValueError. Nothing is lost: the server stopped listening on purpose."""
    callback = getattr(context.get("handle"), "_callback", None)
    return isinstance(context.get("exception"), ValueError) and getattr(callback, "__name__", "") == "_start_serving"
