"""docs/code_tour.md stays true: it lists every file of core/ with its real size, the functions it names on the
one-token path exist, and the path's size it quotes is what scripts/trace_one_request.py measures. The path may
only shrink: a learner reads at most BUDGET lines of source to follow one greedy request (the functions that ran
for it on the tree this layout replaced, counted the same way: 1,001 lines in 94 functions)."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

from minitransformer import SamplingParams, generate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import trace_one_request  # noqa: E402

TOUR = (ROOT / "docs" / "code_tour.md").read_text()
CORE = ROOT / "minitransformer" / "core"
BUDGET = 1001


def lines_of(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_the_table_lists_every_core_file_with_its_size():
    rows = {name: int(lines) for name, lines in re.findall(r"^\|[^|]*\| `([\w.]+\.py)` \| (\d+) \|", TOUR, re.M)}
    assert set(rows) == {p.name for p in CORE.glob("*.py")}, "list each file of core/ once in docs/code_tour.md"
    wrong = {name: (listed, lines_of(CORE / name)) for name, listed in rows.items() if listed != lines_of(CORE / name)}
    assert not wrong, f"(listed, real) sizes differ: update docs/code_tour.md's table: {wrong}"
    total = int(re.search(r"\*\*total\*\* \| \*\*(\d+)\*\*", TOUR).group(1))
    assert total == sum(lines_of(p) for p in CORE.glob("*.py"))


def test_the_path_names_functions_that_exist():
    path = TOUR[TOUR.index("## One token, file by file"):TOUR.index("## Where each optimization attaches")]
    names = re.findall(r"`((?:[a-z_]+)\.[A-Za-z_.]+)`", path)
    assert len(names) > 20
    for dotted in names:
        module, *attributes = dotted.split(".")
        owner = importlib.import_module(f"minitransformer.core.{module}")
        for attribute in attributes:
            assert hasattr(owner, attribute), f"docs/code_tour.md names {dotted}, which core/ does not have"
            owner = getattr(owner, attribute)


def traced(model) -> tuple[int, int, int]:
    """(lines, functions, files) of the package's functions one greedy 8-token request runs."""
    params = SamplingParams(max_tokens=8, temperature=0.0)
    generate(model, "The capital of France is", params)
    seen = trace_one_request.trace(lambda: generate(model, "The capital of France is", params))
    return sum(sum(f.values()) for f in seen.values()), sum(len(f) for f in seen.values()), len(seen)


def test_one_request_reads_no_more_than_the_budget(tiny_model):
    lines, functions, files = traced(tiny_model)
    assert lines <= BUDGET and functions > 50 and files > 10


@pytest.mark.real_model
def test_the_quoted_path_is_what_the_tracer_measures(real_model):
    lines, functions, files = traced(real_model)
    quoted = re.search(r"runs (\d+) functions of (\d+) files of `core/`, ([\d,]+) lines in all", TOUR)
    assert quoted, "docs/code_tour.md quotes the traced path's size"
    assert (int(quoted.group(1)), int(quoted.group(2)), int(quoted.group(3).replace(",", ""))) == \
        (functions, files, lines)
    assert lines <= BUDGET
