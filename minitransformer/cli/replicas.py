"""`minitransformer serve --replicas N`: N servers behind SGLang's model gateway (smg), started and stopped together.

    client --HTTP--> smg (--host/--port: the router) --HTTP--> replica 1 .. N (`minitransformer serve`, loopback)

Why smg (the `router` extra): it speaks OpenAI's API in front of plain HTTP workers, installs as a prebuilt wheel
with no Rust build, and its cache_aware policy works from the request alone: it keeps an approximate radix tree of
the prompt text (characters, no tokenizer) each worker has seen and sends a request to the worker with the longest
match, unless that worker is much busier than the rest (docs/ARCHITECTURE.md, lesson 16). vllm-router's
cache_aware tokenizes every request on every worker first; sglang-router is smg's older name (it installs a `smg`
script too: never both in one environment).

The process the user started becomes a supervisor, as with --tensor-parallel-size (parallel/launch.py):
  1. N replicas: this same command again (the same model and serve options), each on a free loopback port, with
     `--replicas 1`; their output goes to log files, whose last lines are quoted if one dies;
  2. once every replica answers /health: `smg launch` on --host/--port, and its /readiness;
  3. one startup line (the router's URL, the policy, each replica's URL), then it watches them.
Stopping, whatever happens, leaves nothing running:
  - Ctrl-C or SIGTERM: the router first (it stops taking requests), then the replicas together (SIGTERM: each drains
    its running requests for --shutdown-timeout), SIGKILL to whatever is left after a grace; exit 0;
  - a replica or the router exits by itself: everything else is stopped, one line says which, exit 1;
  - the supervisor killed with SIGKILL (it can stop nobody): each replica watches that its parent is still the
    supervisor (watch_supervisor) and exits; smg, which runs no code of ours, gets the kernel's PR_SET_PDEATHSIG.
Every child runs in a session of its own, so a Ctrl-C on the terminal reaches the supervisor alone, which stops them
in that order.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..core.errors import InputError

SUPERVISOR_ENV = "MINITRANSFORMER_REPLICA_SUPERVISOR"   # set in each replica: the pid of the supervisor
ROUTER_EXTRA_HINT = "install the router with `pip install 'minitransformer[router]'` (SGLang's model gateway, smg)"
ROUTER_POLICIES = ("cache_aware", "round_robin")
ROUTER_GRACE_S = 2          # smg's --shutdown-grace-period-secs: in-flight requests through it may finish this long
STOP_MARGIN_S = 5.0         # on top of each child's own drain, before SIGKILL
POLL_S = 0.2                # how often the supervisor looks whether a child has exited
WATCH_INTERVAL_S = 0.5      # how often a replica looks whether its supervisor is still there
SMG_LOG_LEVELS = {"debug": "debug", "info": "info", "warning": "warn", "error": "error"}


def add_replicas_options(parser) -> None:
    parser.add_argument("--replicas", type=int, default=1, metavar="N",
                        help="run N servers behind a router (SGLang's smg, the 'router' extra) on --host/--port; "
                             "the replicas listen on free loopback ports (default 1: no router)")
    parser.add_argument("--router-policy", choices=ROUTER_POLICIES, default="cache_aware",
                        help="how the router picks a replica with --replicas: cache_aware (the replica whose cache "
                             "holds the longest prefix of the prompt's text) or round_robin (default cache_aware)")


def find_smg() -> str:
    """The smg of this Python's environment (pip puts it next to python), else the PATH's; else one line saying
    how to install it."""
    beside = Path(sys.executable).parent / "smg"
    found = str(beside) if beside.is_file() else shutil.which("smg")
    if found is None:
        raise InputError(f"--replicas puts the replicas behind a router, and smg is not installed; {ROUTER_EXTRA_HINT}")
    return found


def check_replicas(args) -> None:
    """Refuse what --replicas cannot run, before anything starts (exit 2)."""
    if args.replicas < 1:
        raise InputError(f"--replicas must be at least 1, got {args.replicas}")
    if args.replicas == 1:
        return
    if args.tensor_parallel_size > 1:
        raise InputError("--replicas with --tensor-parallel-size > 1 is not supported yet; use one or the other")
    if args.disaggregated:
        raise InputError("--replicas with --disaggregated is not supported yet; use one or the other")
    if args.api_keys or args.metrics_key:
        raise InputError("--replicas with --api-keys or --metrics-key is not supported yet: the router registers "
                         "each replica without a key")


def serve_replicas(args, sock) -> int:
    """Run the replicas and the router until a signal (0) or until one of them exits (1). `sock`: the router's
    address, bound by the caller to check it (a port in use is exit 2 before anything starts); it is closed just
    before smg binds the same port."""
    from ..bench.managed_server import ManagedServer, free_port, stop_all
    from ..core.gguf_file import open_gguf
    from ..models import resolve_model_path, signals_exit
    from ..server.runner import CLOSE_GRACE_S

    smg = find_smg()
    # a missing or foreign file is exit 2 here, not N replicas that die; the default model is fetched once, not N times
    open_gguf(resolve_model_path(args.model))
    host, port = sock.getsockname()[:2]
    router_url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    logs = Path(tempfile.mkdtemp(prefix="minitransformer-replicas-"))
    env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
    # Each replica's BLAS would start one thread per core: N x cores threads on too few cores (run_ranks does the
    # same for tensor-parallel ranks). Give each its share unless told.
    threads = str(max(1, (os.cpu_count() or 1) // args.replicas))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, threads)
    replicas = []
    for index in range(args.replicas):
        replica_port = free_port()
        # the same command and options; later flags win in argparse, so these replace --host/--port/--replicas
        argv = [sys.executable, "-m", "minitransformer", *args.argv,
                "--host", "127.0.0.1", "--port", str(replica_port), "--replicas", "1"]
        replicas.append(ManagedServer(f"replica {index + 1}", argv, replica_port, "/health",
                                      logs / f"replica-{index + 1}.log", env=env))
    router = ManagedServer("router", [smg, "launch", "--host", host, "--port", str(port),
                                      "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                                      "--worker-urls", *(r.url for r in replicas), "--policy", args.router_policy,
                                      "--shutdown-grace-period-secs", str(ROUTER_GRACE_S),
                                      "--log-level", SMG_LOG_LEVELS[args.log_level]],
                           port, "/readiness", logs / "router.log", preexec_fn=_die_with_parent)
    router.url = router_url
    drain_s = args.shutdown_timeout + CLOSE_GRACE_S + STOP_MARGIN_S
    code = 0
    try:
        with signals_exit():            # SIGTERM / SIGHUP raise SystemExit: the finally stops everything
            try:
                for replica in replicas:
                    replica.start()
                for replica in replicas:
                    replica.wait_ready()
                sock.close()
                router.start()
                router.wait_ready()
                print(f"minitransformer serve --replicas {args.replicas}: router {router_url} (smg, policy "
                      f"{args.router_policy}) -> replicas {' '.join(r.url for r in replicas)}  (Ctrl-C stops)",
                      file=sys.stderr, flush=True)
                code = _watch([router, *replicas], logs)
            except (KeyboardInterrupt, SystemExit):
                code = 0                # asked to stop: a clean stop is success
    except Exception as exc:            # a replica or the router died before it was ready (ManagedServer says so)
        print(f"minitransformer: error: {exc} (logs in {logs})", file=sys.stderr)
        code = 1
    finally:
        sock.close()
        # The replicas first: each drains as one server does (its running streams end with their final chunk and
        # [DONE], which the router still carries to the clients; a new request gets 503), then the router.
        stop_all(replicas, drain_s)
        stop_all([router], ROUTER_GRACE_S + STOP_MARGIN_S)
        if code == 0:
            shutil.rmtree(logs, ignore_errors=True)
    return code


def _watch(children, logs: Path) -> int:
    """Wait until a child exits by itself: one line naming it and its log's last lines (the logs are kept), and 1."""
    while True:
        for child in children:
            status = child.running.poll()
            if status is not None:
                print(f"minitransformer: error: the {child.name} ({child.url}) exited with code {status}; stopping "
                      f"the others (logs in {logs}). Its log ends: {child.log_tail()}", file=sys.stderr, flush=True)
                return 1
        time.sleep(POLL_S)


def _die_with_parent() -> None:
    """In the router's process, between fork and exec: ask Linux to send it SIGTERM when its parent (the
    supervisor) dies, even by SIGKILL (prctl(2) PR_SET_PDEATHSIG). smg runs no code of ours that could watch, as a
    replica does. Elsewhere, nothing: a supervisor killed with SIGKILL there leaves smg running."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def watch_supervisor() -> None:
    """In a replica (SUPERVISOR_ENV set): exit at once if the supervisor that started it is gone, killed too hard
    to stop us. A daemon thread checks that our parent is still that process: an orphan is re-parented (to init or
    a subreaper), so os.getppid() changes, and a reused pid cannot fool it. parallel/launch.py's ranks do the same
    by pid."""
    expected = int(os.environ.get(SUPERVISOR_ENV, "0"))
    if expected <= 0:
        return

    def watch():
        while os.getppid() == expected:
            time.sleep(WATCH_INTERVAL_S)
        os._exit(1)

    threading.Thread(target=watch, name="watch-supervisor", daemon=True).start()
