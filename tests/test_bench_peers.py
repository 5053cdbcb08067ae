"""The peers people run, as the benchmarks start them: llama.cpp's llama-server and llama-batched-bench, vLLM's CPU
build, llama-cpp-python's server. The command lines and skip lines are checked everywhere; the parser on a real
captured llama-batched-bench table; the cached llama.cpp tools are really started where scripts/setup_peers.py has
built them (elsewhere, CI included, those tests skip with the command that builds them)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minitransformer.bench import peer_cache, serve_compare
from minitransformer.bench.managed_server import ManagedServer, free_port
from minitransformer.bench.peers import LlamaBatchedBench, batched_bench_argv, parse_batched_bench
from minitransformer.bench.serve import run_sweep
from minitransformer.bench.serve_compare import (
    CompareOptions,
    context_per_request,
    llama_server_argv,
    plan_servers,
    vllm_argv,
    vllm_env,
)
from minitransformer.bench.serve_report import LLAMA_CPP_PYTHON, LLAMA_SERVER, summarize, vllm_name
from minitransformer.bench.serve_workload import ServeSettings
from minitransformer.models import find_default_model

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "llama_batched_bench.jsonl"


def test_llama_server_command_line():
    argv = llama_server_argv(Path("/c/bin/llama-server"), "m.gguf", 8123, n_threads=2, slots=16,
                             context_per_request=512)
    assert argv[0] == "/c/bin/llama-server"
    flags = {flag: argv[argv.index(flag) + 1] for flag in ("-m", "--host", "--port", "-t", "-tb", "-np", "-c")}
    assert flags["-m"] == "m.gguf" and flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["-t"] == flags["-tb"] == "2" and flags["-np"] == "16"
    assert flags["-c"] == str(16 * 512)                 # llama-server splits -c across its slots
    assert "-cb" in argv and "--no-webui" in argv and "--no-cache-prompt" not in argv   # prompt cache stays on


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_vllm_command_line_and_bindings(mode, tmp_path):
    argv = vllm_argv(Path("/v/bin/python"), Path("/hf/model"), 8124, slots=16, mode=mode)
    assert argv[:3] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(argv[3::2], argv[4::2]))
    assert flags["--model"] == "/hf/model" and flags["--dtype"] == "float32" and flags["--max-num-seqs"] == "16"
    assert ("--enforce-eager" in argv) == (mode == "eager")
    default, everything = vllm_env("default", 4, tmp_path), vllm_env("all-cores", 4, tmp_path)
    assert default["HF_HUB_OFFLINE"] == "1" and "VLLM_CPU_OMP_THREADS_BIND" not in default
    assert everything["VLLM_CPU_OMP_THREADS_BIND"] == "0-3" and everything["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert vllm_name(mode, "all-cores") == f"vLLM's CPU build ({mode}, all cores for compute)"


def test_every_peer_planned_with_its_exact_name_and_the_same_slots(tiny_model_path, tmp_path, monkeypatch):
    """A peers cache laid out as setup_peers.py leaves it: every peer is planned, each with `slots` slots."""
    cache = tmp_path / "peers"
    for tool in peer_cache.LLAMA_BINARIES:
        path = peer_cache.llama_binary(tool, cache)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    python = peer_cache.vllm_python(cache)
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    hf = peer_cache.hf_export_dir(tiny_model_path, cache)
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    monkeypatch.setattr(serve_compare, "llama_cpp_missing", lambda: None)
    s = ServeSettings(rates=(1.0,), num_prompts=4, prompt_words=(3, 12), max_tokens=8)
    o = CompareOptions(max_num_seqs=6, n_threads=2, vllm_mode="compiled", vllm_binding="all-cores", peers_cache=cache)
    servers, skipped = plan_servers(str(tiny_model_path), s, o, tmp_path / "scratch")
    assert skipped == []
    names = [spec.name for spec in servers]
    assert names == ["ours", LLAMA_CPP_PYTHON, LLAMA_SERVER, "vLLM's CPU build (compiled, all cores for compute)"]
    commands = {spec.name: spec.argv(9000) for spec in servers}
    assert commands["ours"][-2:] == ["--max-num-seqs", "6"]
    assert commands[LLAMA_SERVER][commands[LLAMA_SERVER].index("-np") + 1] == "6"
    assert commands[names[3]][commands[names[3]].index("--max-num-seqs") + 1] == "6"
    ctx = context_per_request(str(tiny_model_path), s)
    assert ctx % 256 == 0 and commands[LLAMA_SERVER][commands[LLAMA_SERVER].index("-c") + 1] == str(6 * ctx)
    vllm = servers[3]
    assert vllm.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and vllm.ready_timeout_s > 600    # compiling is slow
    assert vllm.command(9000).startswith("HF_HUB_OFFLINE=1 ") and "--enforce-eager" not in vllm.command(9000)
    only, _ = plan_servers(str(tiny_model_path), s, o, tmp_path / "scratch", wanted=["llama-server"])
    assert [spec.name for spec in only] == ["ours", LLAMA_SERVER]


def test_missing_peers_are_skipped_with_how_to_get_them(tiny_model_path, tmp_path, monkeypatch):
    o = CompareOptions(peers_cache=tmp_path / "empty")
    s = ServeSettings(rates=(1.0,), num_prompts=2)
    servers, skipped = plan_servers(str(tiny_model_path), s, o, tmp_path, wanted=["llama-server", "vllm"])
    assert [spec.name for spec in servers] == ["ours"]
    assert skipped[0].startswith(f"skipping {LLAMA_SERVER}: ") and skipped[0].endswith(
        "build it with `python scripts/setup_peers.py llama-server`")
    assert skipped[1].startswith("skipping vLLM's CPU build (eager, vLLM's core binding): ") and skipped[1].endswith(
        "set it up with `python scripts/setup_peers.py vllm`")
    monkeypatch.setenv("MINITRANSFORMER_PEERS", str(tmp_path / "empty"))           # the default cache, empty
    peer = LlamaBatchedBench(tiny_model_path)
    assert not peer.available() and "python scripts/setup_peers.py llama-server" in peer.reason


def test_batched_bench_table_parsed_from_a_real_output():
    rows = parse_batched_bench("main: some log line\n" + FIXTURE.read_text())
    assert [(r["pp"], r["tg"], r["pl"]) for r in rows] == [(32, 8, 1), (32, 8, 4)]
    for r in rows:
        # its own columns agree with its definitions: S_PP = pl * pp / t_pp, S_TG = pl * tg / t_tg
        assert r["speed_pp"] == pytest.approx(r["pl"] * r["pp"] / r["t_pp"], rel=1e-4)
        assert r["speed_tg"] == pytest.approx(r["pl"] * r["tg"] / r["t_tg"], rel=1e-4)
        assert r["n_kv"] == r["pl"] * (r["pp"] + r["tg"]) and r["n_threads"] == 2
    assert parse_batched_bench("|    PP |     TG |    B |\n") == []          # the markdown table is not jsonl


def test_batched_bench_context_holds_every_sequence():
    argv = batched_bench_argv(Path("b"), "m.gguf", prompt=100, new=64, batch=16, threads=2)
    flags = dict(zip(argv[1::2], argv[2::2]))
    assert int(flags["-c"]) >= 16 * (100 + 64) and int(flags["-c"]) % 256 == 0
    assert (flags["-npp"], flags["-ntg"], flags["-npl"], flags["-t"]) == ("100", "64", "16", "2")
    assert flags["--output-format"] == "jsonl" and "-pps" not in argv                 # distinct prompts


def _need_llama_tool(name: str) -> Path:
    why = peer_cache.llama_missing(name)
    if why:
        pytest.skip(why)
    model = find_default_model()
    if model is None:
        pytest.skip("the default model is not on disk (minitransformer download)")
    return model


def test_cached_batched_bench_really_runs():
    model = _need_llama_tool("llama-batched-bench")
    peer = LlamaBatchedBench(model)
    assert peer.available(), peer.reason
    assert peer.decode_tok_s(2, list(range(16)), 4) > 0
    assert peer.continuous_tok_s([list(range(10)), list(range(20))], 3) > 0


def test_cached_llama_server_answers_our_bench_client(tmp_path):
    """llama.cpp's llama-server from the cache, as --compare starts it, serves bench serve's requests, 24 sent one
    after another. (On one kept-alive connection it dropped 1 request in 8 as "Server disconnected": all 24 pass
    only because each request gets a connection of its own.)"""
    model = _need_llama_tool("llama-server")
    s = ServeSettings(rates=(float("inf"),), num_prompts=24, prompt_words=(8,), max_tokens=4, ignore_eos=True,
                      max_concurrency=1)
    o = CompareOptions(max_num_seqs=2)
    spec = serve_compare.peer_spec("llama-server", str(model), s, o, tmp_path)
    port = free_port()
    with ManagedServer(spec.name, spec.argv(port), port, spec.ready_path, tmp_path / "llama-server.log",
                       ready_timeout_s=120, env=dict(os.environ, **spec.env)) as server:
        sweep = asyncio.run(run_sweep(server.url, s))
    assert server.process.poll() is not None                                   # stopped on leaving the block
    summary = summarize(sweep["runs"][0]["records"], sweep["runs"][0]["wall_s"], s)
    assert (summary["completed"], summary["failed"], summary["output_tokens"]) == (24, 0, 96), summary["errors"]


def _setup(*argv, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_peers.py"), *argv], capture_output=True,
                          text=True, timeout=120, env=env)


def test_setup_script_without_cmake_is_one_line_exit_2(tmp_path):
    done = _setup("llama-server", "--cache", str(tmp_path / "peers"), env=dict(os.environ, PATH=str(tmp_path)))
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0, done.stderr
    assert done.stderr.startswith("setup_peers: cmake not found on PATH")


def test_setup_script_does_nothing_when_everything_is_there():
    if peer_cache.llama_missing("llama-server") or peer_cache.llama_missing("llama-batched-bench"):
        pytest.skip(peer_cache.llama_missing("llama-server") or peer_cache.llama_missing("llama-batched-bench"))
    done = _setup("llama-server")
    assert done.returncode == 0, done.stderr
    assert "llama.cpp: already built" in done.stdout and "build:" not in done.stdout
    model = find_default_model()
    if model is None or peer_cache.vllm_missing(model):
        return
    done = _setup("vllm")
    assert done.returncode == 0, done.stderr
    assert "already installed" in done.stdout and "HF export: already at" in done.stdout
    assert json.loads((peer_cache.hf_export_dir(model) / "config.json").read_text()).get("quantization_config") is None


def _setup_module():
    """scripts/setup_peers.py as a module (it is a script, not part of the package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("setup_peers", ROOT / "scripts" / "setup_peers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_build_that_dies_of_a_signal_is_told_from_one_that_runs(tmp_path):
    """The check after a build: a binary killed by SIGILL (AMX reported, not enabled) is named as such; one that
    runs passes; one that fails says its exit code and last line."""
    setup = _setup_module()
    bench, server = tmp_path / "llama-batched-bench", tmp_path / "llama-server"
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    for script, expected in (("kill -ILL $$", "died of SIGILL running llama-batched-bench"),
                             ("exit 0", None),
                             ("echo 'error: bad model' >&2; exit 1",
                              "exits with code 1 running llama-batched-bench: error: bad model")):
        bench.write_text(f"#!/bin/sh\n{script}\n")
        bench.chmod(0o755)
        assert setup.llama_runs(tmp_path, model) == expected
    server.write_text("#!/bin/sh\n[ \"$1\" = --version ] && exit 0\nexit 3\n")     # no model: --version only
    server.chmod(0o755)
    assert setup.llama_runs(tmp_path, None) is None


def test_the_portable_build_uses_what_the_cpu_reports_and_never_amx():
    setup = _setup_module()
    options = setup.portable_options("processor : 0\nflags : fpu sse4_2 avx avx2 fma f16c avx512f amx_tile amx_int8\n")
    assert "-DGGML_NATIVE=OFF" in options
    assert {"-DGGML_AVX2=ON", "-DGGML_AVX512=ON", "-DGGML_F16C=ON", "-DGGML_SSE42=ON"} <= set(options)
    assert "-DGGML_AVX512_VNNI=OFF" in options
    assert not any(option.startswith("-DGGML_AMX") and option.endswith("=ON") for option in options)
