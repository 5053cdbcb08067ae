"""`minitransformer bench serve`: the load generator's flags and the command (minitransformer/bench/serve.py).

It is a sub-mode of `bench`, so `minitransformer bench --quick` keeps meaning what it meant.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from ..core.errors import InputError


def add_bench_serve_parser(bench, parser_class):
    """`bench serve ...` as an optional sub-command of the `bench` parser -> the sub-commands (bench engine's too)."""
    modes = bench.add_subparsers(dest="bench_mode", parser_class=parser_class, metavar="serve|engine",
                                 help="optional: load-test an HTTP server instead (bench serve --help), or the "
                                      "engine against its own rates' bound (bench engine --help)")
    from ..bench.serve_compare import VLLM_BINDINGS, VLLM_MODES
    from ..bench.serve_workload import ENDPOINTS

    p = modes.add_parser("serve", help="load-test an OpenAI-compatible server (ours, llama-cpp-python's, "
                          "llama.cpp's llama-server, vLLM) over HTTP")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--url", help="the server to measure, e.g. http://127.0.0.1:8000")
    target.add_argument("--compare", nargs="?", const="all", metavar="PEER,PEER",
                        help="start our server and the peers on free loopback ports, measure them in turns at each "
                        "rate, stop them. Peers: llama-cpp-python, llama-server, vllm (default: every one that is "
                        "set up; python scripts/setup_peers.py sets up llama-server and vllm)")
    p.add_argument("--model", metavar="NAME|PATH",
                   help="the model name to ask for (default: the first one GET /v1/models lists); with --compare: "
                        "the GGUF both servers load (default: SmolLM2-135M-Instruct)")
    p.add_argument("--endpoint", choices=ENDPOINTS, default="completions",
                   help="POST /v1/completions (default) or /v1/chat/completions")
    p.add_argument("--request-rate", default="1,2,4", metavar="R,R,...",
                   help="Poisson arrival rates in requests/s, `inf` = all at once (default 1,2,4)")
    p.add_argument("--repeats", type=int, default=1, metavar="N",
                   help="run the list of rates N times (every other time in reverse, always with fresh prompts), "
                        "so each ratio gets a median and a range over N runs instead of one number (default 1)")
    p.add_argument("--num-prompts", type=int, default=32, metavar="N", help="requests per rate (default 32)")
    p.add_argument("--prompt-words", default="16,64,200", metavar="W,W,...",
                   help="each prompt is a slice of a shipped text, its length in words drawn from these "
                        "(default 16,64,200)")
    p.add_argument("--max-concurrency", type=int, metavar="C", help="at most C requests in flight (default: no cap)")
    p.add_argument("--seed", type=int, default=0, help="prompts and arrival times (default 0)")
    p.add_argument("--max-tokens", type=int, default=48, metavar="N", help="max_tokens of each request (default 48)")
    p.add_argument("--temperature", type=float, default=0.0, help="temperature of each request (default 0: greedy)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos (a vLLM extension) so every request runs to max_tokens")
    p.add_argument("--timeout", type=float, default=300.0, metavar="SEC", help="per-request timeout (default 300)")
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0, metavar="MS",
                   help="goodput SLO: time to first token at most MS (default 1000)")
    p.add_argument("--slo-tpot-ms", type=float, default=100.0, metavar="MS",
                   help="goodput SLO: time per output token after the first at most MS (default 100)")
    p.add_argument("--slo-e2el-ms", type=float, metavar="MS", help="goodput SLO: end-to-end latency (default: none)")
    p.add_argument("--max-num-seqs", type=int, default=8, metavar="N",
                   help="with --compare: every server's slot count: our batch size, llama-server's -np, vLLM's "
                        "--max-num-seqs (default 8)")
    p.add_argument("--n-threads", type=int, metavar="N",
                   help="with --compare: llama-cpp-python's and llama-server's threads (default: cores)")
    p.add_argument("--vllm-mode", choices=VLLM_MODES, default="eager",
                   help="with --compare: vLLM with --enforce-eager (default; starts in ~80 s) or compiled "
                        "(5-7 minutes of compiling at each start)")
    p.add_argument("--vllm-binding", choices=VLLM_BINDINGS, default="default",
                   help="with --compare: vLLM's own core binding (default; on a small machine one core computes "
                        "and the rest are reserved) or every core for compute")
    p.add_argument("--out", default="bench_results", metavar="DIR",
                   help="folder for serve.json, serve.png and the servers' logs (default: bench_results)")
    p.add_argument("--json", metavar="PATH", help="write the JSON here instead of DIR/serve.json")
    return modes


def parse_rates(text: str) -> tuple[float, ...]:
    """`1,2,inf` -> (1.0, 2.0, inf); each rate must be a positive number or inf."""
    rates = []
    for part in text.split(","):
        try:
            rate = float(part)
        except ValueError:
            raise InputError(f"--request-rate: {part.strip()!r} is not a number or inf (e.g. 1,2,inf)") from None
        if not rate > 0 or math.isnan(rate):
            raise InputError(f"--request-rate: each rate must be > 0 requests/s, got {part.strip()}")
        rates.append(rate)
    return tuple(rates)


def parse_words(text: str) -> tuple[int, ...]:
    try:
        words = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"--prompt-words: expected whole numbers like 16,64,200, got {text!r}") from None
    if min(words) < 1:
        raise InputError(f"--prompt-words: each length must be >= 1 word, got {text}")
    return words


def settings_from_args(args):
    from ..bench.serve import ServeSettings
    from ..bench.serve_workload import distinct_rounds

    for flag, value, low in (("--num-prompts", args.num_prompts, 1), ("--repeats", args.repeats, 1),
                             ("--max-tokens", args.max_tokens, 1),
                             ("--max-concurrency", args.max_concurrency, 1), ("--max-num-seqs", args.max_num_seqs, 1),
                             ("--n-threads", args.n_threads, 1)):
        if value is not None and value < low:
            raise InputError(f"{flag} must be >= {low}, got {value}")
    for flag, value in (("--temperature", args.temperature), ("--timeout", args.timeout),
                        ("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms),
                        ("--slo-e2el-ms", args.slo_e2el_ms)):
        if value is not None and (value < 0 or math.isnan(value) or (flag == "--timeout" and value == 0)):
            raise InputError(f"{flag} must be {'> 0' if flag == '--timeout' else '>= 0'}, got {value}")
    once = parse_rates(args.request_rate)
    # every other repeat in reverse, (1, inf) three times: (1, inf, inf, 1, 1, inf). run_sweeps flips which server
    # goes first from one run to the next, so this way each rate is measured with each server first about as often
    rates = tuple(rate for k in range(args.repeats) for rate in (once if k % 2 == 0 else once[::-1]))
    rounds = distinct_rounds(args.num_prompts)                        # each run and the warm-up take one round
    if len(rates) + 1 > rounds:
        print(f"warning: {len(rates)} runs of {args.num_prompts} prompts plus the warm-up need {len(rates) + 1} "
              f"rounds of distinct prompts; the shipped text has {rounds}, so later runs partly resend earlier "
              "prompts and every server's prefix cache skips part of their prefill", file=sys.stderr)
    return ServeSettings(rates=rates, num_prompts=args.num_prompts,
                         prompt_words=parse_words(args.prompt_words), max_concurrency=args.max_concurrency,
                         seed=args.seed, endpoint=args.endpoint,
                         max_tokens=args.max_tokens, temperature=args.temperature, ignore_eos=args.ignore_eos,
                         model=None if args.compare else args.model, timeout_s=args.timeout,
                         slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms, slo_e2el_ms=args.slo_e2el_ms)


def cmd_bench_serve(args) -> int:
    """Measure (progress on stderr), print the tables on stdout, write serve.json and serve.png."""
    import asyncio

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..bench.serve import run_sweep
    from ..bench.serve_report import build_result, print_tables, write_outputs

    s = settings_from_args(args)
    out = Path(args.out)
    if args.compare:
        from ..bench.serve_compare import choose_peers
        from ..models import resolve_model_path

        wanted = choose_peers(args.compare)          # a bad name is a one-line error before anything starts
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description:<34}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=not err.is_terminal) as progress:
        state: dict[str, Any] = {"server": "server", "task": None}      # task: rich's TaskID of the rate running

        def on_rate(rate, server=None):
            state["task"] = progress.add_task(f"{server or state['server']} at {rate:g} req/s", total=s.num_prompts)

        def on_done(record):
            progress.advance(state["task"])

        if args.compare:
            from ..bench.serve_compare import CompareOptions, log_name, run_compare

            model_path = str(resolve_model_path(args.model))

            def on_server(name, port):
                state["server"] = name
                progress.console.print(f"starting {name} on 127.0.0.1:{port} "
                                       f"(log: {out}/server-{log_name(name)}.log)", markup=False, highlight=False)

            options = CompareOptions(max_num_seqs=args.max_num_seqs, n_threads=args.n_threads,
                                     vllm_mode=args.vllm_mode, vllm_binding=args.vllm_binding)
            sweeps, note, quiet = run_compare(model_path, s, out, options, wanted, on_server=on_server,
                                              on_done=on_done, on_rate=on_rate,
                                              on_skip=lambda line: progress.console.print(line, markup=False,
                                                                                          highlight=False))
        else:
            from ..lab.measure import Probe

            probe = Probe()                     # this machine's quietness: the client's, and a local server's
            sweeps, note = {"server": asyncio.run(run_sweep(args.url, s, on_done=on_done, on_rate=on_rate))}, None
            quiet = probe.finish()
    result = build_result(sweeps, s, note, quiet)
    print_tables(result, Console(width=220))
    paths = write_outputs(result, out, Path(args.json) if args.json else None)
    for path in paths.values():
        print(f"wrote {path}", file=sys.stderr)
    return 0
