"""Running the app on uvicorn: the guarded HTTP protocol, one asyncio loop, and an end that loses no client.

    run(server, sock, ...)      serves until SIGTERM or Ctrl-C, then drains and returns (the process exits 0)

The end, in order. uvicorn's main loop notices the signal and calls shutdown(). Ours first lets the app drain
(`Server.drain`): the socket keeps listening so a new request gets a 503 error object rather than a refused
connection, the running requests may finish for --shutdown-timeout seconds, and the rest are ended with their partial
text (finish_reason "abort", a final chunk and [DONE] for a stream). Only then does uvicorn close the listening
socket and the idle connections, wait for the last responses to be written, and run the app's lifespan end, which
stops the engine thread. A second signal stops the waiting for running requests: they are ended at once, the same
way (each stream gets its final chunk and [DONE]), with one log line; only a third makes uvicorn quit on the spot.

uvicorn re-raises a caught signal once it has shut down, so that the process dies of it (exit status -15, or 130 for
Ctrl-C). A server that ended every request and freed every block has done what was asked of it, so here the signal
is not re-raised and the process exits 0, as a service manager expects of a clean stop.
"""

from __future__ import annotations

import contextlib
import logging
import socket

import uvicorn

from .connections import protocol_class

log = logging.getLogger("minitransformer.server")

# After the drain, how long uvicorn waits for connections still writing (a final chunk to a slow reader) before it
# cancels them. Every request has ended by then, so this is a backstop, not a budget.
CLOSE_GRACE_S = 5


class GracefulServer(uvicorn.Server):
    """uvicorn.Server that drains the app before its own shutdown and exits 0 after a signal (module docstring)."""

    def __init__(self, config: uvicorn.Config, app_server, shutdown_timeout_s: float):
        super().__init__(config)
        self.app_server, self.shutdown_timeout_s = app_server, shutdown_timeout_s
        self.hurry = False                   # a second signal: end the running requests now

    def handle_exit(self, sig, frame) -> None:
        """uvicorn makes a second Ctrl-C a forced exit, which cuts streams mid-write; here the second signal only
        stops the drain's waiting, and a third is uvicorn's forced exit."""
        if self.should_exit and not self.hurry:
            self.hurry = True
            self._captured_signals.append(sig)
            log.info("shutting down now: a second signal; the running requests end with their partial text")
            return
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets=None) -> None:
        await self.app_server.drain(self.shutdown_timeout_s, forced=lambda: self.hurry or self.force_exit)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            try:
                yield
            finally:
                self._captured_signals.clear()       # handled: uvicorn must not raise them again on the way out


def run(server, sock: socket.socket, *, header_timeout_s: float, body_timeout_s: float, shutdown_timeout_s: float,
        log_level: str = "info", limit_concurrency: int | None = None) -> None:
    """Serve `server` (app.Server) on the bound, listening `sock` until a signal, then end gracefully (the timeouts
    are `serve`'s options, whose defaults cli/serve.py holds)."""
    config = uvicorn.Config(server.app(), log_level=log_level, lifespan="on", loop="asyncio",
                            http=protocol_class(header_timeout_s, limit_concurrency, body_timeout_s),
                            timeout_graceful_shutdown=CLOSE_GRACE_S)
    GracefulServer(config, server, shutdown_timeout_s).run(sockets=[sock])
