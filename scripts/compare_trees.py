"""Is a change faster, or no slower? The tree before it beside the tree after it, in turns, on one machine.

    git worktree add ../before HEAD~1                  # the tree before the change, beside this one
    python scripts/compare_trees.py ../before          # before vs this checkout
    python scripts/compare_trees.py OLD NEW [--turns 2] [--repeats 3] [--model PATH|NAME] [--json PATH]
                                   [--bench-args ARGS] [--engine-args ARGS]       # e.g. other batch sizes

Two benchmark runs made at different times answer nothing: machines differ 2x, and one shared machine drifts by
tens of percent over minutes. So each turn runs, in both trees, `minitransformer bench` (prefill 64 tokens, decode at
batch 1 and 16, generate with and without the cache, continuous batching) and `minitransformer bench engine`
(bench serve's workload through the Engine), each a process of its own with that tree first on the import path.
Turns alternate which tree goes first, so a drift over the run charges both alike.

It prints each figure for each tree (the median over every run of every turn, with the range) and the speed-up
new / old of the medians (> 1: the new tree is faster; for figures in seconds, old / new). A speed-up whose two
ranges overlap is marked "within noise": this run cannot tell the trees apart on that figure. Each bench prints
whether the machine was quiet; the last line counts the busy runs, whose ratios may not hold on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minitransformer.bench.report import NOISE
from minitransformer.bench.run import as_timing, beyond_noise, figure
from minitransformer.core.errors import InputError
from minitransformer.core.metrics import percentile

BENCH = ["bench", "--peers", "none"]
BENCH_ARGS = "--prefill-lengths 64 --batches 1,16"      # the rows a change to the forward moves
ENGINE = ["bench", "engine"]


def check_tree(path: str) -> Path:
    """A checkout of this project: the folder holding minitransformer/ (one line otherwise)."""
    tree = Path(path).resolve()
    if not (tree / "minitransformer" / "__init__.py").is_file():
        raise InputError(f"{path} is not a checkout of minitransformer (no minitransformer/__init__.py in it)")
    return tree


def run_in(tree: Path, args: list[str], out: Path) -> dict:
    """Run `python -m minitransformer ARGS --json OUT` with `tree` first on the import path; its JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)}
    done = subprocess.run([sys.executable, "-m", "minitransformer", *args, "--out", str(out.parent), "--json",
                           str(out)], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        command = "bench engine" if args[:2] == ENGINE else "bench"
        raise RuntimeError(f"`minitransformer {command}` in {tree} exited {done.returncode}: {last}")
    data = json.loads(out.read_text())
    if args[:2] != ENGINE and data.get("schema", 1) < 2:
        raise RuntimeError(f"`minitransformer bench` in {tree} wrote schema {data.get('schema', 1)}; compare_trees.py "
                           "reads schema 2 and later (commit 00066c4 on), where bench records its quietness")
    return data


def figures(bench: dict, engine: dict) -> dict[str, tuple[str, list[float]]]:
    """{figure: (unit, its runs)} of one turn in one tree: bench's rows of ours in the units its table prints, and
    the engine's tokens/s."""
    out = {}
    for key, row in bench["rows"].items():
        out[key] = (row["unit"], [figure(s, row) for s in as_timing(row["runs"]["ours"], row["runs_unit"]).samples])
    tokens = engine["workload"]["output_tokens"]
    out["engine"] = ("tok/s", [tokens / s for s in engine["engine"]["samples_s"]])
    return out


def quietness(bench: dict, engine: dict) -> list[dict]:
    """The bench's and the engine's quietness ({"line", "quiet", ...}) of one turn in one tree."""
    return [bench["quietness"], {**engine["quietness"], "line": "engine: " + engine["quietness"]["line"]}]


def compare(old: dict[str, tuple[str, list[float]]], new: dict[str, tuple[str, list[float]]]) -> list[dict]:
    """One entry per figure both trees have: each tree's median and range, and the speed-up new / old (for seconds,
    old / new) with whether the two ranges overlap."""
    rows = []
    for key in [k for k in new if k in old]:
        unit, old_runs = old[key]
        new_runs = new[key][1]
        old_median, new_median = percentile(old_runs, 50), percentile(new_runs, 50)
        assert old_median is not None and new_median is not None, "every figure has runs"
        speedup = new_median / old_median if unit != "s" else old_median / new_median
        overlap = not beyond_noise((min(new_runs), max(new_runs)), (min(old_runs), max(old_runs)))
        rows.append({"figure": key, "unit": unit, "old": {"median": old_median, "low": min(old_runs),
                                                          "high": max(old_runs), "runs": old_runs},
                     "new": {"median": new_median, "low": min(new_runs), "high": max(new_runs), "runs": new_runs},
                     "speedup": speedup, "within_noise": overlap})
    return rows


def table(rows: list[dict]) -> str:
    def cell(side: dict, unit: str) -> str:
        digits = 3 if unit == "s" else 1
        return f"{side['median']:.{digits}f} ({side['low']:.{digits}f}-{side['high']:.{digits}f})"
    lines = [f"{'figure':<20} {'unit':<6} {'old: median (range)':>24} {'new: median (range)':>24}  speed-up new / old"]
    for r in rows:
        lines.append(f"{r['figure']:<20} {r['unit']:<6} {cell(r['old'], r['unit']):>24} {cell(r['new'], r['unit']):>24}"
                     f"  {r['speedup']:.2f}x{NOISE if r['within_noise'] else ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", help="the tree before the change (a checkout: e.g. a git worktree)")
    parser.add_argument("new", nargs="?", default=str(ROOT), help="the tree after it (default: this checkout)")
    parser.add_argument("--turns", type=int, default=2, help="turns; each runs both trees, alternating which "
                        "goes first (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each figure in each bench (default 3)")
    parser.add_argument("--model", help="the model both trees run (default: the default model)")
    parser.add_argument("--bench-args", default=BENCH_ARGS, metavar="ARGS",
                        help=f"more options of `minitransformer bench` (default: {BENCH_ARGS!r})")
    parser.add_argument("--engine-args", default="", metavar="ARGS",
                        help="options of `minitransformer bench engine` (default: none, bench serve's workload)")
    parser.add_argument("--json", type=Path, help="also write every run and the comparison here")
    args = parser.parse_args(argv)
    try:
        trees = {"old": check_tree(args.old), "new": check_tree(args.new)}
        if args.turns < 1 or args.repeats < 1:
            raise InputError(f"--turns and --repeats must be at least 1, got {args.turns} and {args.repeats}")
    except InputError as exc:
        print(f"compare_trees.py: error: {exc}", file=sys.stderr)
        return 2
    common = ["--repeats", str(args.repeats), *(["--model", args.model] if args.model else [])]
    bench_argv = [*BENCH, *shlex.split(args.bench_args), *common]
    engine_argv = [*ENGINE, *shlex.split(args.engine_args), *common]
    pooled: dict[str, dict[str, tuple[str, list[float]]]] = {"old": {}, "new": {}}
    quiet: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="compare-trees-") as scratch:
        for turn in range(args.turns):
            for side in ("old", "new") if turn % 2 == 0 else ("new", "old"):
                print(f"turn {turn + 1}: {side} ({trees[side]})", file=sys.stderr, flush=True)
                folder = Path(scratch) / f"{side}-{turn}"
                folder.mkdir()
                try:
                    bench = run_in(trees[side], bench_argv, folder / "bench.json")
                    engine = run_in(trees[side], engine_argv, folder / "engine.json")
                except RuntimeError as exc:
                    print(f"compare_trees.py: error: {exc}", file=sys.stderr)
                    return 1
                quiet += quietness(bench, engine)
                for key, (unit, runs) in figures(bench, engine).items():
                    pooled[side].setdefault(key, (unit, []))[1].extend(runs)
    rows = compare(pooled["old"], pooled["new"])
    print(f"old: {trees['old']}\nnew: {trees['new']}\n{args.turns} turns, {args.repeats} runs of each figure per "
          f"bench, medians over all of them\n")
    print(table(rows))
    busy = [q["line"] for q in quiet if not q["quiet"]]
    verdict = f"\n{len(quiet) - len(busy)} of {len(quiet)} runs quiet"
    if busy:
        verdict += f"; {len(busy)} busy, so these ratios may not hold on a quiet machine:\n  " + "\n  ".join(busy)
    print(verdict)
    if args.json:
        args.json.write_text(json.dumps({"old": str(trees["old"]), "new": str(trees["new"]), "turns": args.turns,
                                         "repeats": args.repeats, "figures": rows, "quietness": quiet}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
