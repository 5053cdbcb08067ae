"""`minitransformer bench engine`: the engine's bound on bench serve's workload (minitransformer/bench/engine_bound.py).

A sub-mode of `bench`, beside `bench serve`: it loads the model itself, so it needs no server unless --url is given.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..core.errors import InputError
from .options import MODEL_HELP


def add_bench_engine_parser(modes) -> None:
    """`bench engine ...` on the `bench` parser's sub-modes (the ones `bench serve` lives on)."""
    p = modes.add_parser("engine", help="bench serve's workload through the Engine alone, next to the time our "
                         "offline prefill and decode rates predict for it (and a server's, with --url)")
    p.add_argument("--model", metavar="PATH|NAME", help=MODEL_HELP)
    p.add_argument("--url", help="also send the same prompts, all at once, to this server (ours: start it with "
                   "--max-num-seqs equal to this run's, and fresh, so its prefix cache holds none of them)")
    p.add_argument("--num-prompts", type=int, default=32, metavar="N", help="requests (default 32)")
    p.add_argument("--prompt-words", default="16,64,200", metavar="W,W,...",
                   help="prompt lengths in words, as bench serve's (default 16,64,200)")
    p.add_argument("--seed", type=int, default=0, help="which prompts (default 0: bench serve's first rate's)")
    p.add_argument("--max-tokens", type=int, default=48, metavar="N", help="tokens per request (default 48)")
    p.add_argument("--max-num-seqs", type=int, default=16, metavar="N", help="the Engine's batch size (default 16)")
    p.add_argument("--repeats", type=int, default=3, metavar="N", help="timed runs of each measurement (default 3)")
    p.add_argument("--out", default="bench_results", metavar="DIR",
                   help="folder for engine.json (default: bench_results)")
    p.add_argument("--json", metavar="PATH", help="write the JSON here instead of DIR/engine.json")


def cmd_bench_engine(args) -> int:
    """Measure (progress on stderr), print the table on stdout, write engine.json."""
    from rich.console import Console

    from .. import load_model
    from ..bench.engine_bound import print_table, run_engine_bench, write_json
    from .bench_serve import parse_words

    for flag, value in (("--num-prompts", args.num_prompts), ("--max-tokens", args.max_tokens),
                        ("--max-num-seqs", args.max_num_seqs), ("--repeats", args.repeats)):
        if value < 1:
            raise InputError(f"{flag} must be >= 1, got {value}")
    if args.max_tokens < 2:
        raise InputError(f"--max-tokens must be >= 2 (a decode step needs a token after the first), got "
                         f"{args.max_tokens}")
    words = parse_words(args.prompt_words)
    model = load_model(args.model)
    result = run_engine_bench(model, num_prompts=args.num_prompts, seed=args.seed, max_tokens=args.max_tokens,
                              max_num_seqs=args.max_num_seqs, prompt_words=words, repeats=args.repeats,
                              url=args.url, progress=lambda line: print(line, file=sys.stderr))
    print_table(result, Console(width=200))
    path = Path(args.json) if args.json else Path(args.out) / "engine.json"
    write_json(result, path)
    print(f"wrote {path}", file=sys.stderr)
    return 0
