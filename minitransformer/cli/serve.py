"""`minitransformer serve`: the OpenAI-compatible HTTP server (minitransformer/server/) on uvicorn.

Everything that can be wrong with the options (a bad keys file, a port in use, a host that cannot be bound) is one
line and exit code 2, checked before the model loads: the socket is bound first, which also lets the startup line
give the real URL even for `--port 0` (any free port: what the tests use). Connections that arrive while the model
loads wait in the socket's backlog.

With --tensor-parallel-size N the command runs again as N ranks (cli/tensor_parallel.py, parallel/launch.py): the
first process only checks the options and the port, then supervises; rank 0 loads its shard, binds, and serves with
the engine on its DriverTransformer, whose every step reaches the other ranks (parallel/driver.py); they stop when
rank 0 does.

With --replicas N it runs again as N servers behind a router instead (cli/replicas.py); this process supervises.
"""

from __future__ import annotations

import logging
import re
import socket
import sys
from pathlib import Path

from ..core.errors import InputError
from ..core.sampling_params import options_of
from ..serving.engine_args import EngineArgs
from .options import (
    add_constraint_limit_options,
    add_model_options,
    add_options,
    checked,
    constraint_limits,
    load_model_from_args,
)
from .replicas import add_replicas_options, check_replicas, serve_replicas, watch_supervisor
from .tensor_parallel import add_tensor_parallel_option, launch_tensor_parallel, model_for_args

ORIGIN = re.compile(r"https?://[^/\s?#]+")          # what a browser sends in Origin: scheme://host[:port], no path


def add_serve_parser(commands) -> None:
    serve = commands.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API (curl, openai)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    add_model_options(serve)
    add_tensor_parallel_option(serve)
    add_replicas_options(serve)
    serve.add_argument("--served-model-name", metavar="NAME",
                       help="the model's name in the API (default: the GGUF file name without .gguf)")
    add_options(serve.add_argument_group("engine (serving/engine_args.py's EngineArgs)"), options_of(EngineArgs))
    add_constraint_limit_options(serve)
    serve.add_argument("--disaggregated", action="store_true",
                       help="prefill in a second process and send each prompt's KV cache to this one, which only "
                            "decodes (two MPI ranks, the 'parallel' extra; lesson 16)")
    serve.add_argument("--max-waiting", type=int, default=256, metavar="N",
                       help="refuse new requests with 429 while this many wait for a slot (default 256)")
    serve.add_argument("--api-keys", metavar="FILE",
                       help='JSON {"key": {"tenant": NAME, "quota_tokens": N, "priority": P, "cache_salt": S}}: '
                            "require a key; tenants are kept apart (server/tenants.py)")
    serve.add_argument("--metrics-key", metavar="KEY",
                       help="the operator's key: the only one that reads /metrics, and it sees every tenant's "
                            "requests on /v1/engine/events (without it, with --api-keys any key reads /metrics)")
    serve.add_argument("--request-timeout", type=float, metavar="S",
                       help="end a request this many seconds after it arrived (finish_reason length, stop_reason "
                            "timeout)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="N",
                       help="refuse larger request bodies with 413 (default 1 MiB)")
    serve.add_argument("--allowed-hosts", action="append", default=[], metavar="NAME[,NAME...]",
                       help="more names the Host header may carry (default: the --host name, localhost, and any IP "
                            "address); other names get 403, which stops DNS rebinding; '*' allows any")
    serve.add_argument("--allowed-origins", action="append", default=[], metavar="ORIGIN[,ORIGIN...]",
                       help="web origins (http://localhost:3000) whose pages may call the API from a browser "
                            "(CORS); '*' allows any (default: none)")
    serve.add_argument("--shutdown-timeout", type=float, default=5.0, metavar="S",
                       help="on SIGTERM or Ctrl-C, running requests may finish for this long; the rest end with "
                            "their partial text, finish_reason abort (default 5)")
    serve.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                       help="close a connection whose request head has not fully arrived after this long "
                            "(default 10)")
    serve.add_argument("--body-timeout", type=float, default=30.0, metavar="S",
                       help="close a connection whose request body has not fully arrived this long after its head "
                            "(default 30)")
    serve.add_argument("--limit-concurrency", type=int, metavar="N",
                       help="answer connections past this many open ones with 503 (default: no limit)")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                       help="uvicorn's and the server's log level (default info: one line per request)")


def cmd_serve(args) -> int:
    from ..parallel.launch import STOP_GRACE_S, in_rank_process
    from ..server.guard import AllowedHosts
    from ..server.runner import CLOSE_GRACE_S
    from ..server.tenants import load_api_keys

    _check_options(args)
    check_replicas(args)
    keys = load_api_keys(args.api_keys) if args.api_keys else None
    hosts = AllowedHosts.for_binding(args.host, _split(args.allowed_hosts))
    origins = frozenset(_origins(args.allowed_origins))
    if args.replicas > 1:                     # N of this command behind a router (cli/replicas.py)
        return serve_replicas(args, _bind(args.host, args.port))
    watch_supervisor()                        # a replica: exit if the supervisor above was killed
    if (args.tensor_parallel_size > 1 or args.disaggregated) and not in_rank_process():
        _bind(args.host, args.port).close()       # a port in use or a bad host: exit 2 before N processes start
    # --tensor-parallel-size N: this command again as N ranks; rank 0 serves, the others run its forwards. A signal
    # goes to rank 0, which drains as one process would (--shutdown-timeout, then uvicorn's close), then stops them.
    drain_s = args.shutdown_timeout + CLOSE_GRACE_S + STOP_GRACE_S
    launched = launch_tensor_parallel(args, drain_s=drain_s)
    if launched is not None:
        return launched
    if args.disaggregated:
        return _serve_disaggregated(args, keys, hosts, origins, drain_s)
    sock = None if in_rank_process() else _bind(args.host, args.port)
    try:
        with model_for_args(args) as model:
            if model is None:                    # a tensor-parallel worker: rank 0's server has stopped it
                return 0
            if sock is None:                     # rank 0 binds once every rank has its shard
                sock = _bind(args.host, args.port)
            _serve(args, model, sock, keys, hosts, origins)
    except BaseException:
        if sock is not None:
            sock.close()
        raise
    return 0


def _serve_disaggregated(args, keys, hosts, origins, drain_s: float) -> int:
    """--disaggregated: this command again as 2 MPI ranks (parallel/launch.py); rank 0 serves and decodes, rank 1
    prefills (parallel/kv_connector.py). Both build their engine from the same options, so a request rank 0 admits
    fits rank 1's pool too."""
    from ..parallel.kv_connector import disaggregated_rank
    from ..parallel.launch import in_rank_process, run_ranks

    if not in_rank_process():
        return run_ranks(args.argv, 2, drain_s=drain_s, rank_names=("the decode process (rank 0)",
                                                                    "the prefill process (rank 1)"))
    with disaggregated_rank(lambda: load_model_from_args(args),
                            lambda model, connector: _engine(args, model, keys, connector)) as rank:
        if rank is not None:                     # rank 0; rank 1 has prefilled until rank 0 stopped it
            model, connector = rank
            _serve(args, model, _bind(args.host, args.port), keys, hosts, origins, connector)
    return 0


def engine_args(args, keys=None) -> EngineArgs:
    """The EngineArgs the options describe, checked (an error names the flag); keys: the --api-keys tenants."""
    from ..server.tenants import tenant_quotas

    options = options_of(EngineArgs)
    return checked(lambda: EngineArgs(**{o.name: getattr(args, o.name) for o in options}, kv_cache=args.kv_cache,
                                      tenant_token_quota=tenant_quotas(keys) if keys else None), options)


def _engine(args, model, keys, kv_connector=None):
    """The Engine the options describe (kv_connector: one side of a disaggregated pair)."""
    from ..serving import Engine

    return Engine(model, engine_args(args, keys), kv_connector=kv_connector)


def _serve(args, model, sock, keys, hosts, origins, kv_connector=None) -> None:
    """The engine, the app, the startup line, then uvicorn until a signal (one process, or rank 0 of N)."""
    from rich.console import Console

    from ..server import EngineLoop, Server, ServerConfig, ServerMetrics
    from ..server.runner import run

    engine = _engine(args, model, keys, kv_connector)
    name = args.served_model_name or Path(model.path).name.removesuffix(".gguf")
    server = Server(model, EngineLoop(engine, ServerMetrics(name), args.request_timeout, args.max_waiting),
                    ServerConfig(name, api_keys=keys, max_body_bytes=args.max_body_bytes, allowed_hosts=hosts,
                                 constraint_limits=constraint_limits(args),
                                 allowed_origins=origins, metrics_key=args.metrics_key))
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    sizes = engine.config
    ranks = args.tensor_parallel_size
    Console(stderr=True, soft_wrap=True).print(
        f"[bold]minitransformer serve[/] {url}  model [cyan]{name}[/] ({model.config.n_layers} layers, "
        f"{args.device}, weights {args.weights}" + (f", tensor parallel over {ranks} ranks" if ranks > 1 else "")
        + (", disaggregated: prefill in a second process" if kv_connector is not None else "")
        + f")  KV pool {sizes.num_blocks} blocks x {sizes.block_size} tokens = "
        f"{sizes.kv_pool_bytes / 2**20:.0f} MiB" + (" per rank" if ranks > 1 else "")
        + f"  max {args.max_num_seqs} running, policy {args.policy}"
        + ("  API keys required" if keys else "") + "  (Ctrl-C stops)", highlight=False)
    _log_to_stderr(args.log_level)
    run(server, sock, log_level=args.log_level, header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
        limit_concurrency=args.limit_concurrency, shutdown_timeout_s=args.shutdown_timeout)


def _check_options(args) -> None:
    """The numeric options' ranges, before anything is loaded or bound."""
    engine_args(args)
    constraint_limits(args)
    if args.disaggregated:                   # decided here, before any rank starts (each would say it again)
        if args.tensor_parallel_size > 1:
            raise InputError("--disaggregated with --tensor-parallel-size is not supported; use one or the other")
        if args.policy == "static":
            raise InputError("--disaggregated admits each request when its prefill comes back, which the static "
                             "policy's fixed groups cannot; use --policy continuous or priority")
        if args.device == "gpu":
            raise InputError("--disaggregated runs its two ranks on the CPU (the KV cache goes over MPI through host "
                             "memory); use --device cpu")
    for name in ("max_waiting", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {args.port}")
    for name in ("request_timeout", "header_timeout", "body_timeout"):
        value = getattr(args, name)
        if value is not None and not 0 < value < float("inf"):
            raise InputError(f"--{name.replace('_', '-')} must be > 0 seconds, got {value}")
    if not 0 <= args.shutdown_timeout < float("inf"):
        raise InputError(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    if args.limit_concurrency is not None and args.limit_concurrency < 1:
        raise InputError(f"--limit-concurrency must be at least 1, got {args.limit_concurrency}")
    if args.metrics_key is not None and (not args.metrics_key.strip() or args.metrics_key != args.metrics_key.strip()):
        raise InputError("--metrics-key must be non-empty and have no surrounding spaces")


def _split(values: list[str]) -> list[str]:
    """Repeated and comma-separated option values, as one list."""
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _origins(values: list[str]) -> list[str]:
    """--allowed-origins, each checked: a browser's Origin is scheme://host[:port] with no path, so an origin written
    with a trailing slash would silently never match."""
    origins = _split(values)
    for origin in origins:
        if origin != "*" and not ORIGIN.fullmatch(origin):
            raise InputError(f"--allowed-origins: {origin!r} is not an origin; write scheme://host[:port] with no "
                             "path or trailing slash, e.g. http://localhost:3000 (or '*' for any)")
    return origins


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket, or one line saying why not (port in use, unknown host, an address not on this machine)."""
    from ..server.connections import ListeningSocket

    sock = None
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = ListeningSocket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        if sock is not None:
            sock.close()
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _log_to_stderr(level: str) -> None:
    """The server's own lines (shutdown phases, refused connections, bugs) on stderr, formatted as uvicorn's."""
    from uvicorn.logging import DefaultFormatter

    logger = logging.getLogger("minitransformer")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s", use_colors=False))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level.upper())
