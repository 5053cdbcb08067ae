"""`minitransformer bench serve --compare`: our server and llama-cpp-python's, side by side on this machine.

The peer is llama-cpp-python's own server (`python -m llama_cpp.server`, FastAPI over the llama.cpp library), which
serves one request at a time; llama.cpp's own `llama-server` (C++) is a different server that batches parallel slots
(`-np N -cb`), and is not what this measures. Both load the same GGUF, listen on free loopback ports, and get the
same prompts at the same arrival times. Both are started first; then at each rate one runs and then the other, never
together (on a small machine two servers would steal each other's cores and both numbers would be wrong), in turns
(serve.run_sweeps), so a slow spell of the machine falls on both. A measure.Probe watches the whole comparison.
Every server started here is stopped here (terminate, wait, kill), on success, error, Ctrl-C or SIGTERM alike.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

from ..measure import Probe
from .serve import BenchServeError, ServeSettings, run_sweeps
from .serve_report import PEER           # the peer's name in serve.json and the tables: its server, not llama-server


def free_port() -> int:
    """A port nobody listens on right now (the OS picks it; a race with another process is possible but rare)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ManagedServer:
    """A server process for the length of a `with` block: started, polled until ready, always stopped.

    It runs in its own session (process group), so a Ctrl-C in the terminal reaches only us and we stop it in order,
    and stopping the group also stops any worker the server itself started. Its output goes to a log file, whose
    last lines are quoted if it dies before it is ready.
    """

    def __init__(self, name: str, argv: list[str], port: int, ready_path: str, log_path: Path,
                 ready_timeout_s: float = 300.0):
        self.name, self.argv, self.ready_path, self.log_path = name, argv, ready_path, Path(log_path)
        self.url = f"http://127.0.0.1:{port}"
        self.ready_timeout_s = ready_timeout_s
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "ManagedServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        try:
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


def ours_argv(model_path: str, port: int, max_num_seqs: int) -> list[str]:
    return [sys.executable, "-m", "minitransformer", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--model", model_path, "--max-num-seqs", str(max_num_seqs)]


def llama_cpp_argv(model_path: str, port: int, n_threads: int) -> list[str]:
    # --interrupt_requests False: a new request waits for the running one instead of cutting its stream short.
    return [sys.executable, "-m", "llama_cpp.server", "--model", model_path, "--host", "127.0.0.1",
            "--port", str(port), "--interrupt_requests", "False", "--n_threads", str(n_threads)]


def llama_cpp_missing() -> str | None:
    """Why llama-cpp-python's server cannot run here, in one line, or None when it can."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama_cpp is not importable (pip install 'llama-cpp-python[server]'): running ours alone"
    if importlib.util.find_spec("sse_starlette") is None or importlib.util.find_spec("pydantic_settings") is None:
        return "llama_cpp is installed without its server extra (pip install 'llama-cpp-python[server]'): " \
               "running ours alone"
    return None


class _TerminateAsInterrupt:
    """Inside this block SIGTERM raises KeyboardInterrupt, so `with ManagedServer` still stops its server."""

    def __enter__(self):
        def handler(signum, frame):
            raise KeyboardInterrupt
        self.previous = signal.signal(signal.SIGTERM, handler)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self.previous)


def run_compare(model_path: str, s: ServeSettings, log_dir: Path, max_num_seqs: int = 8,
                n_threads: int | None = None, on_server=None, on_done=None,
                on_rate=None) -> tuple[dict, str | None, object]:
    """Start both servers, measure them in turns, stop them -> ({name: sweep}, a note when llama-cpp-python could not
    run, the run's measure.Quietness)."""
    import asyncio

    n_threads = n_threads or os.cpu_count() or 1
    servers = [("ours", lambda port: ours_argv(model_path, port, max_num_seqs), "/health")]
    note = llama_cpp_missing()
    if note is None:
        # llama-cpp-python's server has no /health; /v1/models answers once the model is loaded.
        servers.append((PEER, lambda port: llama_cpp_argv(model_path, port, n_threads), "/v1/models"))
    with _TerminateAsInterrupt(), ExitStack() as stack:
        started = {}
        for name, argv, ready_path in servers:
            port = free_port()
            if on_server:
                on_server(name, port)
            started[name] = stack.enter_context(ManagedServer(name, argv(port), port, ready_path,
                                                              log_dir / f"server-{name}.log"))
        probe = Probe()
        sweeps = asyncio.run(run_sweeps({name: server.url for name, server in started.items()}, s,
                                        on_done=on_done, on_rate=on_rate))
        quiet = probe.finish()
        for name, server in started.items():
            if server.process.poll() is not None:
                # Its requests are already counted as failed; this says why they failed.
                sweeps[name]["exited"] = (f"exited with code {server.process.returncode} during the run: "
                                          f"{server.log_tail()}")
    return sweeps, note, quiet
