"""`minitransformer bench serve`: the pure parts (percentiles, goodput, Poisson arrivals, SSE parsing) directly; one
request against a scripted HTTP transport for every way a stream can end; the server lifecycle with a stand-in
process; and end to end against our own server on the tiny model. Latencies themselves are never asserted."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import httpx
import numpy as np
import pytest

from minitransformer import cli
from minitransformer.bench import serve_compare, serve_report
from minitransformer.bench.managed_server import ManagedServer, free_port
from minitransformer.bench.serve import BenchServeError, RequestRecord, SSEParser, send_request
from minitransformer.bench.serve_workload import ServeSettings, arrival_times, make_prompts, poisson_gaps


def test_percentile_is_numpy_linear_and_none_when_empty():
    values = [0.3, 0.1, 0.9, 0.5, 0.7, 0.2]
    for q in (0, 50, 90, 99, 100):
        assert serve_report.percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert serve_report.percentile([2.0, 4.0], 50) == 3.0
    assert serve_report.percentile([], 50) is None


def test_poisson_gaps_mean_within_bound_and_reproducible():
    rate, n = 4.0, 20_000
    gaps = poisson_gaps(rate, n, seed=7)
    # Exponential gaps have standard deviation 1/rate, so the mean of n is 1/rate within 5 / (rate sqrt(n)).
    assert abs(gaps.mean() - 1 / rate) < 5 / (rate * np.sqrt(n))
    assert (gaps >= 0).all()
    assert np.array_equal(gaps, poisson_gaps(rate, n, seed=7))
    assert not np.array_equal(gaps, poisson_gaps(rate, n, seed=8))
    assert not poisson_gaps(float("inf"), 5, seed=0).any()
    times = arrival_times(2.0, 6, seed=1)
    assert times[0] == 0.0 and (np.diff(times) >= 0).all() and len(times) == 6
    with pytest.raises(ValueError):
        poisson_gaps(0.0, 3, seed=0)


def test_prompts_are_reproducible_and_of_mixed_lengths():
    prompts = make_prompts(40, seed=3)
    assert prompts == make_prompts(40, seed=3) and prompts != make_prompts(40, seed=4)
    assert {len(p.split()) for p in prompts} == set(ServeSettings.prompt_words)
    assert {len(p.split()) for p in make_prompts(10, seed=0, lengths=(5, 9))} == {5, 9}


def test_each_round_has_the_same_lengths_and_text_no_other_round_starts_with():
    """A rate must not re-send an earlier rate's prompts: the server's prefix cache would skip their prefill."""
    rounds = [make_prompts(32, seed=0, round=r) for r in range(4)]
    assert all([len(p.split()) for p in r] == [len(p.split()) for p in rounds[0]] for r in rounds)
    openings = [" ".join(p.split()[:3]) for r in rounds for p in r]
    assert len(set(openings)) == len(openings) == 128
    from minitransformer.bench.serve import warmup_prompts
    warm = warmup_prompts(ServeSettings(rates=(1.0, 2.0, 4.0)))
    assert sorted(len(p.split()) for p in warm) == sorted(ServeSettings.prompt_words)
    assert not {" ".join(p.split()[:3]) for p in warm} & set(openings[:96])      # nothing the 3 rates send


STREAM = (b'data: {"choices": [{"text": "Hel"}]}\n\n'
          b': keep-alive comment\n\n'
          b'data: {"choices": [{"text": "lo \xc3\xa9t\xc3\xa9"}]}\r\n\r\n'
          b'event: message\ndata: {"a":\ndata: 1}\n\n'
          b'data: [DONE]\n\n')
EVENTS = ['{"choices": [{"text": "Hel"}]}', '{"choices": [{"text": "lo été"}]}', '{"a":\n1}', "[DONE]"]


def test_sse_parser_whole_stream():
    parser = SSEParser()
    assert parser.feed(STREAM) + parser.close() == EVENTS


@pytest.mark.parametrize("size", [1, 2, 3, 7, 16])
def test_sse_parser_any_split_of_the_reads(size):
    """Reads ending mid-JSON, between \\r and \\n, or inside a UTF-8 character give the same events."""
    parser, events = SSEParser(), []
    for i in range(0, len(STREAM), size):
        events += parser.feed(STREAM[i:i + size])
    assert events + parser.close() == EVENTS


def test_sse_parser_flushes_a_last_event_without_blank_line():
    parser = SSEParser()
    assert parser.feed(b"data: [DONE]") == [] and parser.close() == ["[DONE]"]


def _record(ttft, e2el, tokens, error=None):
    r = RequestRecord(prompt_words=5, ttft_s=ttft, e2el_s=e2el, output_tokens=tokens, error=error,
                      itl_s=[(e2el - ttft) / max(tokens - 1, 1)] * max(tokens - 1, 0) if ttft else [])
    r.usage_reported = error is None
    return r


def test_goodput_counts_requests_within_every_slo():
    s = ServeSettings(slo_ttft_ms=500, slo_tpot_ms=50)
    good = _record(0.2, 0.2 + 9 * 0.04, 10)                      # TPOT 40 ms
    slow_tpot = _record(0.2, 0.2 + 9 * 0.06, 10)                 # TPOT 60 ms
    slow_ttft = _record(0.6, 0.7, 2)
    one_token = _record(0.1, 0.1, 1)                             # no TPOT: counts as 0, as vLLM
    failed = _record(None, None, 0, error="HTTP 500: boom")
    assert [serve_report.is_good(r, s) for r in (good, slow_tpot, slow_ttft, one_token, failed)] == \
        [True, False, False, True, False]
    assert serve_report.is_good(good, ServeSettings(slo_ttft_ms=500, slo_tpot_ms=50, slo_e2el_ms=100)) is False
    m = serve_report.summarize([good, slow_tpot, slow_ttft, one_token, failed], wall_s=2.0, s=s)
    assert (m["completed"], m["failed"], m["errors"]) == (4, 1, {"HTTP 500: boom": 1})
    assert m["request_throughput"] == 2.0 and m["goodput"] == 1.0
    assert m["output_throughput"] == (10 + 10 + 2 + 1) / 2.0 and m["tokens_counted_from"] == "usage"
    assert m["ttft_ms"]["p50"] == pytest.approx(np.percentile([200, 200, 600, 100], 50))


def _client(chunks, status=200, fail_after=None):
    """An AsyncClient whose every POST answers with these byte chunks (or raises a read error after some)."""
    async def body():
        for i, chunk in enumerate(chunks):
            if fail_after is not None and i == fail_after:
                raise httpx.ReadError("connection reset")
            await asyncio.sleep(0.001)
            yield chunk

    def handler(request):
        return httpx.Response(status, content=body())
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _send(chunks, endpoint="completions", **kw):
    async def go():
        async with _client(chunks, **kw) as client:
            return await send_request(client, "http://test/v1/x", {}, endpoint, RequestRecord(prompt_words=1))
    return asyncio.run(go())


def _sse(*events):
    return [f"data: {json.dumps(e) if isinstance(e, dict) else e}\n\n".encode() for e in events]


def test_request_with_usage_chunk():
    r = _send(_sse({"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}, {"choices": [{"text": "c"}]},
                   {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}, "[DONE]"))
    assert r.ok and r.output_tokens == 3 and r.prompt_tokens == 7 and r.usage_reported
    assert len(r.itl_s) == 2 and 0 < r.ttft_s <= r.e2el_s and r.tpot_s == pytest.approx((r.e2el_s - r.ttft_s) / 2)


def test_chat_role_chunk_is_not_the_first_token_and_chunks_count_without_usage():
    r = _send(_sse({"choices": [{"delta": {"role": "assistant"}}]}, {"choices": [{"delta": {"content": "Hi"}}]},
                   {"choices": [{"delta": {"content": ""}}]}, {"choices": [{"delta": {"content": "!"}}]}, "[DONE]"),
              endpoint="chat")
    assert r.ok and r.content_chunks == 2 and r.output_tokens == 2 and not r.usage_reported and len(r.itl_s) == 1


@pytest.mark.parametrize("kw, chunks, error", [
    ({"status": 400}, [b'{"error": {"message": "prompt too long", "type": "BadRequestError"}}'],
     "HTTP 400: prompt too long"),
    ({}, _sse({"choices": [{"text": "a"}]}), "the stream ended before data: [DONE]"),
    ({"fail_after": 1}, _sse({"choices": [{"text": "a"}]}, {"choices": [{"text": "b"}]}, "[DONE]"), "disconnected"),
    ({}, _sse("[DONE]"), "no content in the stream"),
    ({}, _sse({"error": {"message": "engine died"}}), "bad stream"),
])
def test_failed_requests_are_records_with_their_error(kw, chunks, error):
    r = _send(chunks, **kw)
    assert not r.ok and r.error.startswith(error) and r.tpot_s is None


def test_result_json_and_figure(tmp_path):
    s = ServeSettings(rates=(1.0, float("inf")), num_prompts=2)
    runs = [{"rate": rate, "wall_s": 1.0, "records": [_record(0.1, 0.5, 5), _record(None, None, 0, error="x")]}
            for rate in s.rates]
    names = ("ours", serve_report.LLAMA_CPP_PYTHON, serve_report.LLAMA_SERVER)
    sweeps = {name: {"url": "u", "model": "m", "endpoint": "e", "runs": runs, "command": f"{name} --port 1"}
              for name in names}
    result = serve_report.build_result(sweeps, s)
    assert result["settings"]["rates"] == [1.0, "inf"]
    expected = [(name, 1.0) for name in names[1:] for _ in s.rates]                  # ours / each peer, per rate
    assert [(r["peer"], r["output_throughput"]) for r in result["ratios"]] == expected
    assert result["servers"][serve_report.LLAMA_SERVER]["command"] == "llama.cpp's llama-server --port 1"
    paths = serve_report.write_outputs(result, tmp_path)
    assert json.loads(paths["json"].read_text()) == json.loads(json.dumps(result))
    assert paths["figure"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_servers_take_turns_at_each_rate_the_order_flipping(monkeypatch):
    """run_sweeps: at each rate each server runs once, A B then B A, so a slow spell falls on both servers."""
    import asyncio
    from contextlib import asynccontextmanager

    from minitransformer.bench import serve
    order, sleeps = [], []

    @asynccontextmanager
    async def client(base, s):
        yield base

    async def prepare(client, url, s):
        return {"url": url, "model": "m", "endpoint": url, "runs": []}

    async def run_rate(client, url, model, prompts, rate, s, on_done=None):
        order.append((client, rate))
        return [], 1.0

    async def sleep(seconds):
        sleeps.append(seconds)
    monkeypatch.setattr(serve, "http_client", client)
    monkeypatch.setattr(serve, "_prepare", prepare)
    monkeypatch.setattr(serve, "run_rate", run_rate)
    monkeypatch.setattr(serve.asyncio, "sleep", sleep)
    s = ServeSettings(rates=(1.0, 2.0, 4.0), num_prompts=2)
    rates = []
    sweeps = asyncio.run(serve.run_sweeps({"ours": "A", "peer": "B"}, s, on_rate=lambda r, n: rates.append((n, r))))
    assert order == [("A", 1.0), ("B", 1.0), ("B", 2.0), ("A", 2.0), ("A", 4.0), ("B", 4.0)]
    assert [run["rate"] for run in sweeps["peer"]["runs"]] == [1.0, 2.0, 4.0]          # each in rate order
    assert rates[:2] == [("ours", 1.0), ("peer", 1.0)] and len(sleeps) == 6          # a settle before each run
    order.clear()
    alone = asyncio.run(serve.run_sweep("A", s))
    assert [run["rate"] for run in alone["runs"]] == [1.0, 2.0, 4.0] and len(sleeps) == 6   # one server: no settle


def test_result_says_how_quiet_the_machine_was():
    from minitransformer.lab.measure import Quietness
    s = ServeSettings(rates=(1.0,), num_prompts=1)
    runs = [{"rate": 1.0, "wall_s": 1.0, "records": [_record(0.1, 0.5, 5)]}]
    sweeps = {name: {"url": "u", "model": "m", "endpoint": "e", "runs": runs}
              for name in ("ours", serve_report.LLAMA_CPP_PYTHON)}
    busy = Quietness(load=1.9, others=0.6, cores=2, calibration_before=1e-3, calibration_after=1.3e-3)
    result = serve_report.build_result(sweeps, s, quiet=busy)
    assert result["quietness"] == {"line": busy.line(), "quiet": False, "why_busy": busy.why_busy()}
    from rich.console import Console
    console = Console(record=True, width=220)
    serve_report.print_tables(result, console)
    text = " ".join(console.export_text().split())
    assert "ours / each peer" in text and "llama-cpp-python's server" in text and "no spread of its own" in text
    assert busy.line() in text and "The machine was busy (other programs used 60%" in text


@pytest.mark.parametrize("argv", [["--url", "http://x", "--request-rate", "1,abc"], ["--url", "http://x", "--compare"],
                                  [], ["--url", "http://x", "--request-rate", "0"],
                                  ["--url", "http://x", "--seed", "x"], ["--url", "http://x", "--num-prompts", "0"],
                                  ["--compare", "--endpoint", "edit"], ["--compare", "--prompt-words", "8,0"],
                                  ["--compare", "llama-server,sglang"], ["--compare", "--repeats", "0"]])
def test_bad_flags_are_one_line_exit_2(argv):
    result = subprocess.run([sys.executable, "-m", "minitransformer", "bench", "serve", *argv], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_repeats_run_the_whole_list_of_rates_again_and_warn_before_prompts_repeat(capsys):
    from minitransformer.bench.serve_workload import distinct_rounds, shipped_words
    from minitransformer.cli.bench_serve import settings_from_args

    def settings(*argv):
        return settings_from_args(cli.build_parser().parse_args(["bench", "serve", "--compare", *argv]))

    s = settings("--request-rate", "inf,8", "--repeats", "3")
    inf = float("inf")
    assert s.rates == (inf, 8.0, 8.0, inf, inf, 8.0) and capsys.readouterr().err == ""
    # run_sweeps puts ours first at even turns: each rate gets ours first, then second, then first again
    assert [i % 2 for i, rate in enumerate(s.rates) if rate == inf] == [0, 1, 0]
    assert [i % 2 for i, rate in enumerate(s.rates) if rate == 8.0] == [1, 0, 1]
    assert distinct_rounds(32) == len(shipped_words()) // 32 == 16
    # 7 runs + the warm-up fit the text's 16 rounds of 32 prompts; 8 x 2 runs + the warm-up do not
    settings("--request-rate", "inf", "--repeats", "7")
    assert capsys.readouterr().err == ""
    settings("--request-rate", "inf,8", "--repeats", "8")
    warning = capsys.readouterr().err
    assert warning.startswith("warning: 16 runs of 32 prompts plus the warm-up need 17 rounds") and "has 16" in warning
    prompts = [p for r in range(16) for p in make_prompts(32, 0, round=r)]           # what 15 runs + warm-up send
    assert len({" ".join(p.split()[:3]) for p in prompts}) == len(prompts)            # no start sent twice


def test_repeats_give_each_ratio_a_median_and_a_range(tmp_path):
    """--repeats N: a ratio per turn, then per peer and rate the median, lowest and highest of the N; the figure
    draws each rate once, at the median of its runs."""
    from rich.console import Console

    s = ServeSettings(rates=(float("inf"), 8.0) * 3, num_prompts=1)

    def sweep(walls):
        runs = [{"rate": rate, "wall_s": wall, "records": [_record(0.1 * wall, 0.5, 10)]}
                for rate, wall in zip(s.rates, walls)]
        return {"url": "u", "model": "m", "endpoint": "e", "runs": runs}

    # ours: 10 tokens in 1, 2, 1, 1, 1, 4 s; the peer: 10 tokens in 2 s every run
    result = serve_report.build_result({"ours": sweep([1, 2, 1, 1, 1, 4]),
                                        serve_report.LLAMA_SERVER: sweep([2] * 6)}, s)
    assert [r["output_throughput"] for r in result["ratios"]] == [2.0, 1.0, 2.0, 2.0, 2.0, 0.5]
    spread = {row["request_rate"]: row for row in result["ratio_spread"]}
    assert spread["inf"]["runs"] == 3 and spread["inf"]["output_throughput"] == {"median": 2.0, "min": 2.0, "max": 2.0}
    assert spread[8.0]["output_throughput"] == {"median": 1.0, "min": 0.5, "max": 2.0}
    assert spread[8.0]["ttft_p99"]["median"] == pytest.approx(1.0)                 # TTFT 0.1 x wall: same ratios
    console = Console(record=True, width=220)
    serve_report.print_tables(result, console)
    text = " ".join(console.export_text().split())
    assert "median (lowest-highest)" in text and "1.00x (0.50-2.00)" in text and "no spread of its own" not in text
    assert serve_report.ratio_spread(result["ratios"][:2]) == []                    # one run per rate: no spread
    paths = serve_report.write_outputs(result, tmp_path)
    assert paths["figure"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plain_bench_still_parses_without_serve():
    args = cli.build_parser().parse_args(["bench", "--quick", "--peers", "none"])
    assert args.bench_mode is None and args.quick


def test_managed_server_ready_then_stopped(tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with ManagedServer("stand-in", argv, port, "/", tmp_path / "log") as server:
        assert httpx.get(server.url + "/", trust_env=False).status_code == 200
    assert server.process.poll() is not None
    with pytest.raises(RuntimeError):                            # an error inside the block still stops it
        with ManagedServer("stand-in", argv, port, "/", tmp_path / "log") as server:
            raise RuntimeError("boom")
    assert server.process.poll() is not None


def test_managed_server_that_dies_is_a_clear_error(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"]
    with pytest.raises(BenchServeError, match="exited with code 3 before it was ready: no such model"):
        with ManagedServer("broken", argv, free_port(), "/health", tmp_path / "log"):
            pass


def test_end_to_end_against_our_server(our_server, tmp_path, capsys):
    argv = ["bench", "serve", "--url", our_server.url, "--request-rate", "inf,20", "--num-prompts", "4",
            "--prompt-words", "3,12",  # the tiny model's context is 128 tokens
            "--max-tokens", "4", "--ignore-eos", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "TTFT ms p50/p90/p99" in out
    data = json.loads((tmp_path / "serve.json").read_text())
    for run in data["servers"]["server"]["runs"]:
        m = run["summary"]
        assert (m["completed"], m["failed"], m["output_tokens"]) == (4, 0, 16) and m["tokens_counted_from"] == "usage"
        assert all(len(r["itl_s"]) == r["content_chunks"] - 1 for r in run["records"])


def _prefix_cache_hits(url: str) -> int:
    text = httpx.get(f"{url}/metrics", trust_env=False).text
    return int(float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("vllm:prefix_cache_hits_total"))))


def test_a_second_rate_does_the_same_work_as_the_first(our_server):
    """The same rate twice in one run: the second must prefill as much as the first. It used to re-send the first
    rate's prompts, hit our prefix cache for nearly every prompt token and look about twice as fast (so did
    llama-server and vLLM). The cache's hit counter, read from /metrics before and after each rate, does not depend
    on how busy the machine is, so it is what is asserted (the old client: 80 hits in the first rate, from its
    warm-up's prompt, and 272 in the second); the token counts must agree too."""
    from minitransformer.bench.serve import run_sweep
    s = ServeSettings(rates=(float("inf"), float("inf")), num_prompts=6, prompt_words=(12, 20), max_tokens=3,
                      ignore_eos=True, seed=11)       # a seed no other test here uses: its text is new to the server
    hits = []
    sweep = asyncio.run(run_sweep(our_server.url, s, on_rate=lambda rate: hits.append(_prefix_cache_hits(
        our_server.url))))
    hits.append(_prefix_cache_hits(our_server.url))
    first, second = (serve_report.summarize(run["records"], run["wall_s"], s) for run in sweep["runs"])
    assert (first["completed"], second["completed"]) == (6, 6)
    assert first["output_tokens"] == second["output_tokens"] == 18
    assert abs(second["prompt_tokens"] - first["prompt_tokens"]) <= 0.3 * first["prompt_tokens"]
    assert hits[2] - hits[1] == hits[1] - hits[0] == 0, f"prefix-cache hits before/between/after: {hits}"


def test_compare_runs_ours_alone_when_no_peer_is_set_up(tiny_model_path, tmp_path, capsys, monkeypatch):
    """Each missing peer: one line on stderr saying how to get it, and in serve.json's note; ours still runs."""
    monkeypatch.setattr(serve_compare, "llama_cpp_missing", lambda: "skipping llama-cpp-python's server: llama_cpp "
                        "is not importable (pip install 'llama-cpp-python[server]')")
    monkeypatch.setenv("MINITRANSFORMER_PEERS", str(tmp_path / "no-peers"))      # an empty peers cache
    argv = ["bench", "serve", "--compare", "--model", str(tiny_model_path), "--request-rate", "inf",
            "--prompt-words", "3,12",
            "--num-prompts", "2", "--max-tokens", "3", "--max-num-seqs", "2", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    err = " ".join(capsys.readouterr().err.split())
    for line in ("skipping llama-cpp-python's server: llama_cpp is not importable",
                 "skipping llama.cpp's llama-server: llama.cpp's llama-server is not built",
                 "build it with `python scripts/setup_peers.py llama-server`",
                 "skipping vLLM's CPU build (eager, vLLM's core binding): vLLM's CPU build is not set up",
                 "set it up with `python scripts/setup_peers.py vllm`"):
        assert line in err, err
    data = json.loads((tmp_path / "serve.json").read_text())
    assert list(data["servers"]) == ["ours"] and data["ratios"] == []
    assert data["note"].count("skipping") == 3
    assert "--max-num-seqs 2" in data["servers"]["ours"]["command"]
    assert (tmp_path / "server-ours.log").exists()


@pytest.mark.parametrize("moment", ["starting", "sweeping"])
def test_sigterm_during_compare_stops_the_server(tiny_model_path, tmp_path, moment):
    """The bench process is told to stop, as it starts our server or once its sweep runs: it exits 130 and nothing
    listens on the port. (Raised while Python ran an import lock's callback, the KeyboardInterrupt of an early
    SIGTERM was once dropped, and the bench ran on for its whole sweep.)"""
    import re
    import signal
    import threading
    import time

    from minitransformer.bench.engine_bound import listening_pid

    bench = subprocess.Popen([sys.executable, "-m", "minitransformer", "bench", "serve", "--compare", "--model",
                              str(tiny_model_path), "--request-rate", "0.2", "--num-prompts", "50",
                              "--prompt-words", "3", "--out", str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, MINITRANSFORMER_PEERS=str(tmp_path / "no-peers")))
    port, left_running = None, False
    try:
        match = None
        while match is None:                                     # a line about llama.cpp may come first
            line = bench.stderr.readline()
            assert line, "bench serve ended before starting our server"
            match = re.search(r"starting ours on 127\.0\.0\.1:(\d+)", line)
        port = int(match.group(1))
        # keep reading its stderr: a full pipe would block the bench in a write and look like a hang on SIGTERM
        threading.Thread(target=bench.stderr.read, daemon=True).start()
        deadline = time.monotonic() + 120
        while moment == "sweeping" and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False).status_code == 200:
                    time.sleep(1.5)                              # past its readiness poll: in the warm-up or a rate
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 130
    finally:
        bench.kill()
        bench.wait()
        # a bench killed here cannot stop the server it started in a session of its own: stop it, then fail below
        server = listening_pid(f"http://127.0.0.1:{port}") if port else None
        if server:
            os.kill(server, signal.SIGKILL)
            left_running = True
    assert not left_running, "bench serve left our server running after SIGTERM"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False)
