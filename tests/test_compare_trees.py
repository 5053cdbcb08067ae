"""scripts/compare_trees.py: two checkouts benchmarked in turns, and the speed-up of each figure with its noise."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "compare_trees.py"
spec = importlib.util.spec_from_file_location("compare_trees", SCRIPT)
assert spec and spec.loader
compare_trees = importlib.util.module_from_spec(spec)
spec.loader.exec_module(compare_trees)

TINY_BENCH = "--quick --prefill-lengths 8 --batches 1,2"            # the tiny model's context is 128 tokens
TINY_ENGINE = "--num-prompts 4 --prompt-words 3,12 --max-tokens 4 --max-num-seqs 2"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_two_trees_in_turns_give_every_figure_with_its_speedup(tiny_model_path, tmp_path):
    out = tmp_path / "compare.json"
    done = run(str(ROOT), str(ROOT), "--model", str(tiny_model_path), "--turns", "2", "--repeats", "1",
               "--bench-args", TINY_BENCH, "--engine-args", TINY_ENGINE, "--json", str(out))
    assert done.returncode == 0, done.stderr
    turns = [line for line in done.stderr.splitlines() if line.startswith("turn ")]
    assert [t.split(" (")[0] for t in turns] == ["turn 1: old", "turn 1: new", "turn 2: new", "turn 2: old"]
    data = json.loads(out.read_text())
    figures = {f["figure"]: f for f in data["figures"]}
    assert set(figures) == {"prefill_8", "decode_b1", "decode_b2", "generate_cache", "generate_no_cache",
                            "continuous", "engine"}
    for f in figures.values():
        assert len(f["old"]["runs"]) == len(f["new"]["runs"]) == 2          # one run per turn in each tree
        faster = f["new"]["median"] / f["old"]["median"]
        assert f["speedup"] == pytest.approx(faster if f["unit"] == "tok/s" else 1 / faster)
        printed = next(line for line in done.stdout.splitlines() if line.startswith(f["figure"] + " "))
        assert printed.split()[-1 if not f["within_noise"] else -3] == f"{f['speedup']:.2f}x"
    assert len(data["quietness"]) == 8                                       # bench + engine, 2 trees, 2 turns
    quiet = sum(q["quiet"] for q in data["quietness"])
    assert f"{quiet} of 8 runs quiet" in done.stdout


def test_the_speedup_and_its_noise():
    old = {"decode_b1": ("tok/s", [10.0, 11.0]), "generate_cache": ("s", [2.0, 2.2]), "prefill_8": ("tok/s", [5.0])}
    new = {"decode_b1": ("tok/s", [12.0, 13.0]), "generate_cache": ("s", [2.1, 2.3]), "engine": ("tok/s", [1.0])}
    rows = {r["figure"]: r for r in compare_trees.compare(old, new)}
    assert set(rows) == {"decode_b1", "generate_cache"}                       # only what both trees measured
    assert rows["decode_b1"]["speedup"] == pytest.approx(12.5 / 10.5) and not rows["decode_b1"]["within_noise"]
    assert rows["generate_cache"]["speedup"] == pytest.approx(2.1 / 2.2)      # seconds: old / new, < 1 is slower
    assert rows["generate_cache"]["within_noise"]


@pytest.mark.parametrize("args, expected", [
    (["/nonexistent"], "/nonexistent is not a checkout of minitransformer"),
    ([str(ROOT), "--turns", "0"], "--turns and --repeats must be at least 1, got 0 and 3"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
    done = run(*args)
    assert done.returncode == 2 and done.stderr.strip() == f"compare_trees.py: error: {expected}" + (
        " (no minitransformer/__init__.py in it)" if "checkout" in expected else "")


def test_a_tree_whose_bench_fails_is_named_in_one_line(tmp_path):
    broken = tmp_path / "broken"
    (broken / "minitransformer").mkdir(parents=True)
    (broken / "minitransformer" / "__init__.py").write_text("")           # a package with no command line
    done = run(str(broken), str(ROOT), "--turns", "1")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"compare_trees.py: error: `minitransformer bench` in {broken} exited 1: ")
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 2    # its turn, then why
