"""`minitransformer serve` as a real process for tests: started on a free port, stopped afterwards, nothing left.

The server binds `--port 0` itself and prints its URL on the startup line, so there is no race for a port. When a
test is done with it, `running_server` stops it with SIGTERM (a graceful shutdown, exit status 0) and fails the test
if the server's log holds a traceback: every error a client can cause must be an answer, never a crash.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import threading
import time

STARTUP_TIMEOUT_S = 120


class ServerProcess:
    """preexec_fn: run in the child before it starts (e.g. to lower a resource limit)."""

    def __init__(self, args: list[str], preexec_fn=None):
        self.process = subprocess.Popen([sys.executable, "-m", "minitransformer", "serve", "--port", "0", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        preexec_fn=preexec_fn)
        self.lines: list[str] = []
        self.url = None
        ready = threading.Event()

        def read():                          # keep draining the log, or the server blocks on a full pipe
            for line in self.process.stdout:
                self.lines.append(line)
                match = re.search(r"http://127\.0\.0\.1:\d+", line)
                if match and self.url is None:
                    self.url = match.group(0)
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(STARTUP_TIMEOUT_S) or self.url is None:
            self.stop()
            raise RuntimeError("the server did not start:\n" + self.log)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.reader.join(10)                 # the log's last lines, up to the end of the pipe


    def wait_for_log(self, text: str, timeout_s: float = 60) -> bool:
        """Wait until `text` appears in the server's log."""
        return bool(wait_for(lambda: text in self.log, timeout_s))


@contextlib.contextmanager
def running_server(*args: str, preexec_fn=None):
    server = ServerProcess(list(args), preexec_fn)
    try:
        yield server
    finally:
        server.stop()
        print(f"--- server log ({' '.join(args)}) ---\n{server.log}")      # shown by pytest when a test failed
    assert "Traceback" not in server.log, "the server logged a traceback:\n" + server.log


def wait_for(condition, timeout_s: float, interval_s: float = 0.05):
    """Poll until condition() is truthy (returns it) or the time is up (returns the last value)."""
    deadline = time.monotonic() + timeout_s
    value = condition()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = condition()
    return value
