"""`minitransformer serve`: the OpenAI-compatible HTTP server (minitransformer/server/) on uvicorn.

Everything that can be wrong with the options (a bad keys file, a port in use) is one line and exit code 2, checked
before the model loads where it can be. The socket is bound here, before uvicorn runs, so the startup line can give
the real URL even for `--port 0` (any free port: what the tests use).
"""

from __future__ import annotations

import socket
from pathlib import Path

from ..errors import InputError
from .options import _add_model_options, _load


def add_serve_parser(commands) -> None:
    serve = commands.add_parser("serve", help="serve the model over an OpenAI-compatible HTTP API (curl, openai)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    _add_model_options(serve)
    serve.add_argument("--served-model-name", metavar="NAME",
                       help="the model's name in the API (default: the GGUF file name without .gguf)")
    serve.add_argument("--max-num-seqs", type=int, default=16, metavar="N",
                       help="most requests in the running batch (default 16)")
    serve.add_argument("--num-blocks", type=int, metavar="N",
                       help="KV cache blocks in the pool (default: enough for max-num-seqs contexts, up to 512 MiB)")
    serve.add_argument("--block-size", type=int, default=16, metavar="N", help="tokens per KV block (default 16)")
    serve.add_argument("--policy", choices=("continuous", "static", "priority"), default="continuous",
                       help="how the scheduler admits requests (default continuous; priority uses the requests' "
                            "priority field, lower first)")
    serve.add_argument("--max-waiting", type=int, default=256, metavar="N",
                       help="refuse new requests with 429 while this many wait for a slot (default 256)")
    serve.add_argument("--api-keys", metavar="FILE",
                       help='JSON {"key": {"tenant": NAME, "quota_tokens": N, "priority": P}}: require a key')
    serve.add_argument("--request-timeout", type=float, metavar="S",
                       help="end a request this many seconds after it arrived (finish_reason length, stop_reason "
                            "timeout)")
    serve.add_argument("--max-body-bytes", type=int, default=1 << 20, metavar="N",
                       help="refuse larger request bodies with 413 (default 1 MiB)")
    serve.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                       help="uvicorn's log level (default info: one line per request)")


def cmd_serve(args) -> int:
    import uvicorn
    from rich.console import Console

    from ..serving import Engine
    from ..server import EngineLoop, Server, ServerConfig, ServerMetrics
    from ..server.tenants import load_api_keys, tenant_quotas

    for name in ("max_num_seqs", "block_size", "max_waiting", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        raise InputError(f"--port must be in [0, 65535], got {args.port}")
    if args.request_timeout is not None and not args.request_timeout > 0:
        raise InputError(f"--request-timeout must be > 0 seconds, got {args.request_timeout}")
    keys = load_api_keys(args.api_keys) if args.api_keys else None
    model = _load(args)
    engine = Engine(model, max_num_seqs=args.max_num_seqs, num_blocks=args.num_blocks, block_size=args.block_size,
                    policy=args.policy, kv_cache=args.kv_cache,
                    tenant_token_quota=tenant_quotas(keys) if keys else None)
    name = args.served_model_name or Path(model.path).name.removesuffix(".gguf")
    sock = _bind(args.host, args.port)
    server = Server(model, EngineLoop(engine, ServerMetrics(name), args.request_timeout, args.max_waiting),
                    ServerConfig(name, api_keys=keys, max_body_bytes=args.max_body_bytes))
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    bm = engine.block_manager
    pool_mib = engine.kv_bytes(bm.num_blocks * bm.block_size) / 2**20
    Console(stderr=True, soft_wrap=True).print(
        f"[bold]minitransformer serve[/] {url}  model [cyan]{name}[/] ({model.config.n_layers} layers, "
        f"{args.device}, weights {args.weights})  KV pool {bm.num_blocks} blocks x {bm.block_size} tokens = "
        f"{pool_mib:.0f} MiB  max {args.max_num_seqs} running, policy {args.policy}"
        + ("  API keys required" if keys else "") + "  (Ctrl-C stops)", highlight=False)
    config = uvicorn.Config(server.app(), log_level=args.log_level, timeout_graceful_shutdown=5, lifespan="on")
    web = uvicorn.Server(config)
    server.stopping = lambda: web.should_exit        # the live page's event streams end when Ctrl-C is pressed
    web.run(sockets=[sock])
    return 0


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket, or one line saying why not (port in use, unknown host)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock
