"""A server process for the length of a `with` block, and how a benchmark that started some stops them on SIGTERM.

    free_port        a loopback port nobody listens on right now
    ManagedServer    start a server in its own session, poll it until ready, always stop it (terminate, wait, kill)
    stop_all         stop several at once: SIGTERM to all, one shared grace, then SIGKILL
    Termination      SIGTERM ends the run the way Ctrl-C does, at a safe point, so every ManagedServer is stopped

bench serve --compare (serve_compare.py) starts ours and the peers with these; the tests start ours the same way.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from ..core.metrics import now
from .serve import BenchServeError


def free_port() -> int:
    """A port nobody listens on right now (the OS picks it; a race with another process is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _signals_held(*signums):
    """Block these signals for the block; one that came meanwhile is handled as the block ends."""
    if not hasattr(signal, "pthread_sigmask"):         # not POSIX: nothing to hold
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class ManagedServer:
    """A server process for the length of a `with` block: started, polled until ready, always stopped.

    It runs in its own session (process group), so a Ctrl-C in the terminal reaches only us and we stop it in order,
    and stopping the group also stops any worker the server itself started. Its output goes to a log file, whose
    last lines are quoted if it dies before it is ready.
    """

    def __init__(self, name: str, argv: list[str], port: int, ready_path: str, log_path: Path,
                 ready_timeout_s: float = 300.0, env: dict[str, str] | None = None,
                 check: Callable[[], None] | None = None, preexec_fn: Callable[[], None] | None = None):
        """check: called at every readiness poll; it raises to give up the wait (a SIGTERM that came meanwhile).
        preexec_fn: run in the child between fork and exec (cli/replicas.py: die with the parent)."""
        self.name, self.argv, self.ready_path, self.log_path = name, argv, ready_path, Path(log_path)
        self.env = env                                 # the whole environment of the process; None: ours
        self.check, self.preexec_fn = check, preexec_fn
        self.url = f"http://127.0.0.1:{port}"
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ManagedServer:
        try:
            self.start()
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def start(self) -> None:
        """Start the process and return at once (wait_ready() waits for it); __enter__ does both."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # A Ctrl-C or SIGTERM between the fork and `self.process = ...` would leave a server nobody stops: it waits,
        # blocked, until that is set, and then lands in the caller's cleanup. The child inherits the blocked mask
        # (exec keeps it), so it unblocks them first: a server that cannot receive SIGTERM cannot drain.
        held = (signal.SIGINT, signal.SIGTERM)

        def in_child() -> None:
            if hasattr(signal, "pthread_sigmask"):
                signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
            if self.preexec_fn is not None:
                self.preexec_fn()

        with _signals_held(*held), open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True, env=self.env,
                                            preexec_fn=in_child if os.name == "posix" else None)

    def wait_ready(self) -> None:
        self._wait_ready(self.running)

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def running(self) -> subprocess.Popen:
        """The server's process, started by __enter__."""
        if self.process is None:
            raise RuntimeError(f"the {self.name} server was not started: use it in a with statement")
        return self.process

    def _wait_ready(self, process: subprocess.Popen) -> None:
        import httpx

        deadline = now() + self.ready_timeout_s
        while now() < deadline:
            if self.check:
                self.check()
            if process.poll() is not None:
                raise BenchServeError(f"{self.name} server exited with code {process.returncode} before it was "
                                      f"ready: {self.log_tail()}")
            try:
                if httpx.get(self.url + self.ready_path, timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass                                   # not listening yet
            time.sleep(0.25)
        raise BenchServeError(f"{self.name} server not ready at {self.url}{self.ready_path} after "
                              f"{self.ready_timeout_s:.0f} s (log: {self.log_path})")

    def log_tail(self, lines: int = 3) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return f"(no log at {self.log_path})"
        return " | ".join(tail) or "(empty log)"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM to the group, wait up to grace_s, then SIGKILL; idempotent."""
        stop_all([self], grace_s)

    def signal_group(self, signum: int) -> None:
        """Send signum to the server's process group (itself and whatever it started), if it is still running."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass


def stop_all(servers: list[ManagedServer], grace_s: float) -> None:
    """SIGTERM to every server's group at once, then wait up to grace_s for them all (each drains in parallel),
    then SIGKILL to those still there; idempotent."""
    for server in servers:
        server.signal_group(signal.SIGTERM)
    deadline = now() + grace_s
    for server in servers:
        if server.process is None:
            continue
        try:
            server.process.wait(timeout=max(deadline - now(), 0.0))
        except subprocess.TimeoutExpired:
            server.signal_group(signal.SIGKILL)
            server.process.wait()


class Termination:
    """Inside this block SIGTERM ends the run the way Ctrl-C does, and `with ManagedServer` still stops its servers.

    The handler only takes note; while the sweeps' task runs it also cancels that task, from inside the event loop.
    The waits call check(), which raises KeyboardInterrupt there. (A KeyboardInterrupt raised by the handler itself
    lands wherever the main thread happens to be: raised inside an import lock's callback, Python dropped it as
    "Exception ignored", and the bench ran on through its whole sweep.)"""

    def __enter__(self):
        self.received, self.task = False, None
        self.previous = signal.signal(signal.SIGTERM, self._handler)
        return self

    def _handler(self, signum, frame):
        self.received = True
        if self.task is not None:
            self.task.get_loop().call_soon_threadsafe(self.task.cancel)

    def check(self) -> None:
        if self.received:
            raise KeyboardInterrupt

    async def run(self, coroutine):
        """Await coroutine -> its result, or None when a SIGTERM cancelled it (check() then raises)."""
        import asyncio

        self.task = asyncio.current_task()
        try:
            if self.received:                          # one came before the task was known
                coroutine.close()
                return None
            return await coroutine
        except asyncio.CancelledError:
            if self.received:
                return None
            raise
        finally:
            self.task = None

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self.previous)
