"""`minitransformer serve` as a real process for tests: started on a free port, stopped afterwards, nothing left.

The server binds `--port 0` itself and prints its URL on the startup line, so there is no race for a port. When a
test is done with it, `running_server` stops it with SIGTERM (a graceful shutdown, exit status 0) and fails the test
if the server's log holds a traceback: every error a client can cause must be an answer, never a crash.

Below it, what the server tests' clients share: post a body, check an OpenAI error object, read one /metrics
sample, read a stream's events (in the background: Stream), and a server the test ends with its own signal.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

import httpx

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


# ---------------------------------------------------------------------------------------------------- a client's view

def post(server, body, path="/v1/completions", headers=None, **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=headers, timeout=120, **kwargs)


def assert_error(response: httpx.Response, status: int, *words: str, param=None, code=None) -> dict:
    """An OpenAI error object with this status, these words in its message, this param and code."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    for word in words:
        assert word in error["message"], error["message"]
    assert (error["param"], error["code"]) == (param, code), error
    return error


def metric(server, name: str, headers=None) -> float:
    """One sample of /metrics (without labels but model_name)."""
    text = httpx.get(server.url + "/metrics", headers=headers, timeout=30).text
    match = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert match, text
    return float(match.group(1))


def address(server) -> tuple[str, int]:
    parts = urlsplit(server.url)
    return parts.hostname, parts.port


def read_to_close(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def sse_payloads(response):
    """The `data:` payloads of a server-sent-event stream, as they arrive."""
    return (line[6:] for line in response.iter_lines() if line.startswith("data: "))


class Stream(threading.Thread):
    """A streamed completion read in the background: its payloads, and an event once two chunks arrived."""

    def __init__(self, server, body):
        super().__init__(daemon=True)
        self.server, self.body, self.payloads, self.running, self.error = server, body, [], threading.Event(), None

    def run(self):
        try:
            with httpx.stream("POST", self.server.url + "/v1/completions", json=self.body, timeout=120) as response:
                if response.status_code != 200:
                    raise AssertionError(f"status {response.status_code}: {response.read().decode()}")
                for payload in sse_payloads(response):
                    self.payloads.append(payload)
                    if len(self.payloads) >= 2:
                        self.running.set()
        except Exception as exc:                              # the test reports it: a stream must end cleanly
            self.error = exc
        finally:
            self.running.set()

    def chunks(self) -> list[dict]:
        return [json.loads(p) for p in self.payloads if p != "[DONE]"]


@contextlib.contextmanager
def server_to_signal(*args: str):
    """A server the test itself ends with a signal; stopped anyway afterwards, its log shown if the test failed."""
    server = ServerProcess(list(args))
    try:
        yield server
    finally:
        server.stop()
        print(f"--- server log ---\n{server.log}")
