"""`minitransformer bench serve --compare`: our server and the peer servers people run, side by side on this machine.

The peers, each under its exact name (serve.json and the tables use these names):

    llama-cpp-python's server   `python -m llama_cpp.server` (FastAPI over the llama.cpp library): one request at a
                                time, whatever the load
    llama.cpp's llama-server    llama.cpp's own C++ server: N parallel slots with continuous batching (`-np N -cb`),
                                its prompt cache on (as our prefix cache is); built by scripts/setup_peers.py
    vLLM's CPU build            vLLM 0.32's OpenAI server on the HF-format copy of the same GGUF, float32, eager or
                                compiled, with vLLM's own core binding or every core for compute; its name says which

Every server gets the same slot count, loads the same model, listens on a free loopback port and gets the same
prompts at the same arrival times. All are started first; then at each rate one runs after the other, never together
(on a small machine two servers would steal each other's cores and every number would be wrong), in turns
(serve.run_sweeps), so a slow spell of the machine falls on all. A peer that is not set up is skipped with one line
saying how to set it up. A measure.Probe watches the whole comparison; the servers' CPU (each server's process group)
is this run's own work there, not another program's. Every server started here is stopped here (terminate, wait,
kill: managed_server.py), on success, error, Ctrl-C or SIGTERM alike.
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from ..lab.measure import Probe
from . import peer_cache
from .managed_server import ManagedServer, Termination, free_port
from .serve import ServeSettings, run_sweeps
from .serve_report import LLAMA_CPP_PYTHON, LLAMA_SERVER, vllm_name
from .serve_workload import make_prompts

PEER_KEYS = ("llama-cpp-python", "llama-server", "vllm")      # what --compare / --peers choose from
VLLM_MODES = ("eager", "compiled")
VLLM_BINDINGS = ("default", "all-cores")


@dataclass(frozen=True)
class CompareOptions:
    """How the servers are started. Every server gets max_num_seqs slots; n_threads is llama.cpp's threads.

    vllm_mode: `eager` (--enforce-eager: starts in ~80 s here) or `compiled` (torch.compile and CUDA-graph-free CPU
    graphs: 5-7 minutes at each start). vllm_binding: `default` is vLLM's own, which on a small machine binds one
    core for compute and reserves the rest; `all-cores` binds every core for compute and reserves none."""
    max_num_seqs: int = 8
    n_threads: int | None = None
    vllm_mode: str = "eager"
    vllm_binding: str = "default"
    peers_cache: Path | None = None

    @property
    def threads(self) -> int:
        return self.n_threads or os.cpu_count() or 1


@dataclass(frozen=True)
class ServerSpec:
    """One server to start: its exact name, its command line for a port, the path that answers 200 once it is
    ready, the variables it needs on top of ours, and how long its start may take."""
    name: str
    argv: Callable[[int], list[str]]
    ready_path: str
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 300.0

    def command(self, port: int) -> str:
        """The command line as a shell would take it, with its variables: what serve.json records."""
        import shlex
        return " ".join([f"{k}={shlex.quote(v)}" for k, v in self.env.items()] + [shlex.join(self.argv(port))])


def ours_argv(model_path: str, port: int, max_num_seqs: int) -> list[str]:
    return [sys.executable, "-m", "minitransformer", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--model", model_path, "--max-num-seqs", str(max_num_seqs)]


def llama_cpp_argv(model_path: str, port: int, n_threads: int) -> list[str]:
    # --interrupt_requests False: a new request waits for the running one instead of cutting its stream short.
    return [sys.executable, "-m", "llama_cpp.server", "--model", model_path, "--host", "127.0.0.1",
            "--port", str(port), "--interrupt_requests", "False", "--n_threads", str(n_threads)]


def llama_server_argv(binary: Path, model_path: str, port: int, n_threads: int, slots: int,
                      context_per_request: int) -> list[str]:
    """llama.cpp's llama-server with `slots` parallel slots and continuous batching. It splits -c evenly across its
    slots, so -c is slots x what one request needs; its prompt cache stays on (its default, like our prefix cache)."""
    return [str(binary), "-m", model_path, "--host", "127.0.0.1", "--port", str(port), "-t", str(n_threads),
            "-tb", str(n_threads), "-np", str(slots), "-cb", "-c", str(slots * context_per_request), "--no-webui"]


def vllm_argv(python: Path, hf_dir: Path, port: int, slots: int, mode: str) -> list[str]:
    """vLLM's OpenAI server module (the wheel's `vllm` command fails: it looks up a distribution named vllm)."""
    argv = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(hf_dir), "--host", "127.0.0.1",
            "--port", str(port), "--dtype", "float32", "--max-num-seqs", str(slots)]
    return argv + (["--enforce-eager"] if mode == "eager" else [])


def vllm_env(binding: str, cores: int, scratch: Path) -> dict[str, str]:
    """vLLM's variables: offline, 2 GiB of KV cache, its caches in a scratch folder, and the core binding."""
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CACHE_ROOT": str(scratch / "vllm"),
           "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"), "VLLM_NO_USAGE_STATS": "1"}
    if binding == "all-cores":
        env |= {"VLLM_CPU_OMP_THREADS_BIND": f"0-{cores - 1}", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    return env


def context_per_request(model_path: str, s: ServeSettings) -> int:
    """The context one request of this workload needs: its longest prompt in tokens + max_tokens, with room for a
    chat template (a quarter more and 64 tokens), rounded up to a multiple of 256."""
    from .. import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    longest = max(len(tokenizer.encode(p)) for p in make_prompts(s.num_prompts, s.seed, s.prompt_words))
    need = (longest + s.max_tokens) * 1.25 + 64
    return 256 * math.ceil(need / 256)


def llama_cpp_missing() -> str | None:
    """Why llama-cpp-python's server cannot run here, in one line, or None when it can."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"skipping {LLAMA_CPP_PYTHON}: llama_cpp is not importable (pip install 'llama-cpp-python[server]')"
    if importlib.util.find_spec("sse_starlette") is None or importlib.util.find_spec("pydantic_settings") is None:
        return (f"skipping {LLAMA_CPP_PYTHON}: llama_cpp is installed without its server extra "
                "(pip install 'llama-cpp-python[server]')")
    return None


def peer_missing(key: str, model_path: str, o: CompareOptions) -> str | None:
    """Why the peer `key` cannot run here, in one line that says how to set it up, or None when it can."""
    if key == "llama-cpp-python":
        return llama_cpp_missing()
    if key == "llama-server":
        why = peer_cache.llama_missing("llama-server", o.peers_cache)
        return why and f"skipping {LLAMA_SERVER}: {why}"
    why = peer_cache.vllm_missing(model_path, o.peers_cache)
    return why and f"skipping {vllm_name(o.vllm_mode, o.vllm_binding)}: {why}"


def peer_spec(key: str, model_path: str, s: ServeSettings, o: CompareOptions, scratch: Path) -> ServerSpec:
    """The ServerSpec of a peer that is set up."""
    if key == "llama-cpp-python":
        # Its server has no /health; /v1/models answers once the model is loaded.
        return ServerSpec(LLAMA_CPP_PYTHON, lambda port: llama_cpp_argv(model_path, port, o.threads), "/v1/models")
    if key == "llama-server":
        binary, ctx = peer_cache.llama_binary("llama-server", o.peers_cache), context_per_request(model_path, s)
        return ServerSpec(LLAMA_SERVER,
                          lambda port: llama_server_argv(binary, model_path, port, o.threads, o.max_num_seqs, ctx),
                          "/health", env={"LD_LIBRARY_PATH": str(binary.parent)})
    python, hf_dir = peer_cache.vllm_python(o.peers_cache), peer_cache.hf_export_dir(model_path, o.peers_cache)
    return ServerSpec(vllm_name(o.vllm_mode, o.vllm_binding),
                      lambda port: vllm_argv(python, hf_dir, port, o.max_num_seqs, o.vllm_mode), "/health",
                      env=vllm_env(o.vllm_binding, os.cpu_count() or 1, scratch),
                      ready_timeout_s=300.0 if o.vllm_mode == "eager" else 1200.0)


def choose_peers(text: str | None) -> list[str] | None:
    """--compare's value: None or "all" -> None (every peer that is set up); "a,b" -> those, checked."""
    if text is None or text.strip() == "all":
        return None
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    bad = [name for name in wanted if name not in PEER_KEYS]
    if not wanted or bad:
        from ..core.errors import InputError
        raise InputError(f"--compare takes a comma-separated subset of {', '.join(PEER_KEYS)} (or nothing: every "
                         f"peer that is set up); got {text!r}")
    return wanted


def plan_servers(model_path: str, s: ServeSettings, o: CompareOptions, scratch: Path,
                 wanted: list[str] | None = None) -> tuple[list[ServerSpec], list[str]]:
    """Ours and every wanted peer (None: all of them) -> (the servers to start, one skip line per missing peer)."""
    servers = [ServerSpec("ours", lambda port: ours_argv(model_path, port, o.max_num_seqs), "/health")]
    skipped = []
    for key in wanted or PEER_KEYS:
        why = peer_missing(key, model_path, o)
        if why:
            skipped.append(why)
        else:
            servers.append(peer_spec(key, model_path, s, o, scratch))
    return servers, skipped


def run_compare(model_path: str, s: ServeSettings, log_dir: Path, options: CompareOptions = CompareOptions(),
                wanted: list[str] | None = None, on_server=None, on_done=None, on_rate=None,
                on_skip=None) -> tuple[dict, str | None, object]:
    """Start ours and the peers that are set up, measure them in turns, stop them -> ({name: sweep}, the skip lines
    joined (None when every wanted peer ran), the run's measure.Quietness). on_skip(line) hears each skip line
    before anything starts. Each sweep records the command its server was started with."""
    import asyncio

    scratch = options.peers_cache or peer_cache.peers_dir()
    servers, skipped = plan_servers(model_path, s, options, scratch / "scratch", wanted)
    for line in skipped if on_skip else ():
        on_skip(line)
    with Termination() as termination, ExitStack() as stack:
        started, commands = {}, {}
        for spec in servers:
            port = free_port()
            if on_server:
                on_server(spec.name, port)
            commands[spec.name] = spec.command(port)
            env = dict(os.environ, **spec.env) if spec.env else None
            started[spec.name] = stack.enter_context(ManagedServer(
                spec.name, spec.argv(port), port, spec.ready_path, log_dir / f"server-{log_name(spec.name)}.log",
                ready_timeout_s=spec.ready_timeout_s, env=env, check=termination.check))
        termination.check()
        probe = Probe(process_groups=[server.running.pid for server in started.values()])   # their own sessions
        sweeps = asyncio.run(termination.run(run_sweeps({name: server.url for name, server in started.items()}, s,
                                                      on_done=on_done, on_rate=on_rate)))
        termination.check()
        quiet = probe.finish()
        for name, server in started.items():
            sweeps[name]["command"] = commands[name]
            if server.running.poll() is not None:
                # Its requests are already counted as failed; this says why they failed.
                sweeps[name]["exited"] = (f"exited with code {server.running.returncode} during the run: "
                                          f"{server.log_tail()}")
    return sweeps, "; ".join(skipped) or None, quiet


def log_name(name: str) -> str:
    """A server's short name for its log file: ours, llama-cpp-python, llama-server or vllm."""
    short = {LLAMA_CPP_PYTHON: "llama-cpp-python", LLAMA_SERVER: "llama-server"}
    return "vllm" if name.startswith("vLLM") else short.get(name, name)
