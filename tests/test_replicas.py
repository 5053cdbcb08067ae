"""`minitransformer serve --replicas 2`: two servers behind SGLang's model gateway (smg). A greedy request through the
router gets what one replica alone gives; SIGTERM stops the router and the replicas and exits 0, a replica that dies
stops the rest (exit 1), and a supervisor killed with SIGKILL leaves nothing behind either; what --replicas cannot run
is one line and exit code 2."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from minitransformer.cli import main
from server_process import ServerProcess, Stream, wait_for

MODEL = "SmolLM2-135M-Instruct.Q4_1"
OPTIONS = ["--replicas", "2", "--max-num-seqs", "2", "--num-blocks", "64", "--log-level", "warning"]


def descendants(pid: int) -> set[int]:
    """Every process below `pid` now (children, their children, ...), from /proc's parent links."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])     # field 4, after the (comm)
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def started(model_path, *extra: str) -> tuple[ServerProcess, list[str], set[int]]:
    """The command on free ports: its process, its replicas' URLs (from the startup line), and what it started."""
    server = ServerProcess(["--model", str(model_path), *OPTIONS, *extra])
    assert server.wait_for_log("(Ctrl-C stops)", timeout_s=120), server.log
    line = next(line for line in server.log.splitlines() if "--replicas 2: router" in line)
    replicas = re.findall(r"http://127\.0\.0\.1:\d+", line.partition("-> replicas")[2])
    return server, replicas, descendants(server.process.pid)


@pytest.fixture(autouse=True, scope="module")
def logs_in_a_test_folder(tmp_path_factory):
    """The supervisor keeps its children's logs when one died or when it was killed: in pytest's folder, not /tmp."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(tmp_path_factory.mktemp("replica-logs")))
        yield


@pytest.fixture(scope="module")
def replicas(real_model_path):
    server, urls, children = started(real_model_path)
    try:
        yield server, urls, children
    finally:
        server.stop()
        print(f"--- supervisor log ---\n{server.log}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_a_greedy_request_through_the_router_equals_one_replicas_and_sigterm_stops_all(replicas):
    server, urls, children = replicas
    assert len(urls) == 2 and server.url not in urls
    assert len(children) >= 3                            # two replicas and smg (and whatever they started)
    for url in urls:
        assert httpx.get(url + "/health").status_code == 200
    body = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    routed = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    direct = httpx.post(urls[0] + "/v1/completions", json=body, timeout=120)
    assert routed.status_code == direct.status_code == 200, (routed.text, direct.text)
    assert routed.json()["choices"][0]["text"] == direct.json()["choices"][0]["text"]
    assert routed.json()["usage"] == direct.json()["usage"] == {"prompt_tokens": 5, "completion_tokens": 8,
                                                                "total_tokens": 13}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}
    routed_chat = httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=120).json()
    direct_chat = httpx.post(urls[1] + "/v1/chat/completions", json=chat, timeout=120).json()
    assert routed_chat["choices"][0]["message"] == direct_chat["choices"][0]["message"]

    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0, server.log
    left = [pid for pid in children if alive(pid)]
    assert not left, f"still running after the supervisor exited: {left}\n{server.log}"
    assert "Traceback" not in server.log, server.log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_sigterm_ends_the_streams_through_the_router_as_one_server_ends_them(real_model_path):
    """The replicas drain first (their running streams end with a final chunk, finish_reason abort, and [DONE],
    carried by the router still up), then the router stops: no stream is cut mid-chunk."""
    server, urls, children = started(real_model_path, "--shutdown-timeout", "2")
    try:
        long = {"model": MODEL, "prompt": "Write a very long story about a dragon.", "max_tokens": 900,
                "temperature": 0, "ignore_eos": True, "stream": True}
        streams = [Stream(server, long) for _ in range(2)]
        for stream in streams:
            stream.start()
        assert all(stream.running.wait(120) for stream in streams)
        server.process.send_signal(signal.SIGTERM)
        for stream in streams:
            stream.join(60)
        assert server.process.wait(60) == 0, server.log
    finally:
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.stop()
    for stream in streams:
        assert stream.error is None and stream.payloads[-1] == "[DONE]", (stream.error, stream.payloads[-3:])
        last = [c for c in stream.chunks() if c["choices"]][-1]["choices"][0]
        assert (last["finish_reason"], last["stop_reason"]) == ("abort", "shutdown")
    assert "Traceback" not in server.log, server.log


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_a_supervisor_killed_with_sigkill_leaves_no_replica_or_router(tiny_model_path):
    server, urls, children = started(tiny_model_path)
    try:
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait(10)
        gone = wait_for(lambda: not any(alive(pid) for pid in children), timeout_s=15)
        assert gone, [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in children if alive(pid)]
    finally:
        for pid in children:                             # on failure: leave nothing for the next test
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process tree from /proc")
def test_a_replica_that_dies_stops_the_rest_with_one_line_and_exit_1(tiny_model_path):
    server, urls, children = started(tiny_model_path)
    try:
        port = urls[1].rpartition(":")[2]
        replica = next(pid for pid in children if f"--port\0{port}\0".encode()
                       in Path(f"/proc/{pid}/cmdline").read_bytes())
        os.kill(replica, signal.SIGKILL)
        assert server.process.wait(60) == 1, server.log
        server.reader.join(10)
        errors = [line for line in server.log.splitlines() if line.startswith("minitransformer: error:")]
        assert len(errors) == 1 and f"the replica 2 ({urls[1]}) exited with code -9" in errors[0], server.log
        assert not [pid for pid in children if alive(pid)]
    finally:
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.stop()


@pytest.mark.parametrize("extra, message", [
    (["--tensor-parallel-size", "2"], "--replicas with --tensor-parallel-size > 1 is not supported yet"),
    (["--metrics-key", "k"], "--replicas with --api-keys or --metrics-key is not supported yet"),
    (["--model", "/nonexistent/model.gguf"], "model file not found: /nonexistent/model.gguf"),
])
def test_what_replicas_cannot_run_is_one_line_and_exit_2(extra, message):
    done = subprocess.run([sys.executable, "-m", "minitransformer", "serve", "--port", "0", "--replicas", "2", *extra],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and message in done.stderr, done.stderr


def test_replicas_without_smg_name_the_extra_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))    # no smg beside it
    monkeypatch.setenv("PATH", str(tmp_path))                             # nor on the PATH
    assert main(["serve", "--port", "0", "--replicas", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'minitransformer[router]'" in err, err
