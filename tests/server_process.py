"""`minitransformer serve` as a real process for tests: started on a free port, stopped afterwards, nothing left.

The server binds `--port 0` itself and prints its URL on the startup line, so there is no race for a port.
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
    def __init__(self, args: list[str]):
        self.process = subprocess.Popen([sys.executable, "-m", "minitransformer", "serve", "--port", "0", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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

        threading.Thread(target=read, daemon=True).start()
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


@contextlib.contextmanager
def running_server(*args: str):
    server = ServerProcess(list(args))
    try:
        yield server
    finally:
        server.stop()
        print(f"--- server log ({' '.join(args)}) ---\n{server.log}")      # shown by pytest when a test failed


def wait_for(condition, timeout_s: float, interval_s: float = 0.05):
    """Poll until condition() is truthy (returns it) or the time is up (returns the last value)."""
    deadline = time.monotonic() + timeout_s
    value = condition()
    while not value and time.monotonic() < deadline:
        time.sleep(interval_s)
        value = condition()
    return value
