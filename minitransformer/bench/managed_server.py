"""A server process for the length of a `with` block, and how a benchmark that started some stops them on SIGTERM.

    free_port        a loopback port nobody listens on right now
    ManagedServer    start a server in its own session, poll it until ready, always stop it (terminate, wait, kill)
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
                 check: Callable[[], None] | None = None):
        """check: called at every readiness poll; it raises to give up the wait (a SIGTERM that came meanwhile)."""
        self.name, self.argv, self.ready_path, self.log_path = name, argv, ready_path, Path(log_path)
        self.env = env                                 # the whole environment of the process; None: ours
        self.check = check
        self.url = f"http://127.0.0.1:{port}"
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> ManagedServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            # A Ctrl-C between the fork and `self.process = ...` would leave a server nobody stops: it waits,
            # blocked, until that is set, and then lands in this try.
            with _signals_held(signal.SIGINT), open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log,
                                                stderr=subprocess.STDOUT, start_new_session=True, env=self.env)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.check:
                self.check()
            if self.process.poll() is not None:
                raise BenchServeError(f"{self.name} server exited with code {self.process.returncode} before it was "
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
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=grace_s)
                return
            except subprocess.TimeoutExpired:
                continue


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
