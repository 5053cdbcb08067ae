"""claims.relation_problems: the kinds of self-contradiction a reader caught in the transcripts, refused in any
lesson's output (issue 46): a value beyond its own bound, a part above its whole, a slope against its endpoints, a
named winner that a printed cell beats. Each kind is planted here in a few lines; tests/test_transcripts.py plants
each in a real transcript."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from rich.table import Table

from minitransformer.lab.claims import bound_line, part_line, relation_problems, winner_line


@pytest.mark.parametrize("measured, kind, refused", [(16.4, "floor", False), (14.2, "floor", False),
                                                     (13.0, "floor", True), (70.0, "ceiling", False),
                                                     (80.0, "ceiling", True)])
def test_a_value_beyond_its_own_bound_is_refused_unless_the_line_says_why(measured, kind, refused):
    bound = 14.2 if kind == "floor" else 72.0
    line = bound_line("decode-step", measured, bound, kind=kind)
    problems = relation_problems(f"some text\n{line} (the fastest step)\nmore text")
    assert bool(problems) == refused, problems
    if refused:
        assert f"beyond its own {kind}" in problems[0] and "decode-step" in problems[0]
        assert relation_problems(bound_line("decode-step", measured, bound, kind=kind, why="the caches held it")) == []


def test_a_part_larger_than_its_whole_is_refused_unless_the_line_says_why():
    assert relation_problems(part_line("cut", "queue p99 fell", 1.20, "TTFT p99 fell", 1.90)) == []
    above = part_line("cut", "queue p99 fell", 6.42, "TTFT p99 fell", 5.91)
    assert "(109%)" in above
    problems = relation_problems("claim x: shown: (" + above + " (at least 80% needed))")
    assert len(problems) == 1 and "larger than its whole" in problems[0]
    explained = part_line("cut", "queue p99 fell", 6.42, "TTFT p99 fell", 5.91, why="percentiles do not add")
    assert relation_problems(explained) == []


@pytest.mark.parametrize("text, refused", [
    ("cache 16.4 -> 17.0 ms (slope -31 us per token)", True),          # lesson 04 as it was
    ("cache 16.4 -> 17.0 ms (slope +31 us per token)", False),
    ("no cache 145.0 -> 90.4 ms (slope -1439 us per token)", False),
    ("cache 16.4 -> 16.4 ms (slope +2 us per token)", False),          # equal printed ends: either sign rounds there
])
def test_a_slope_whose_sign_contradicts_its_endpoints_is_refused(text, refused):
    assert bool(relation_problems(f"decode steps, first vs last quarter: {text}")) == refused


def clock_table() -> str:
    """Lesson 08's table as rich prints it to a pipe: contenders are columns, metrics are rows, cells 'best (median,
    spread)'."""
    console = Console(file=io.StringIO(), width=120, color_system=None)
    table = Table("3 runs each, in turns", "static, 8 slots", "continuous, 4 slots", "continuous, 8 slots",
                  "continuous, 16 slots")
    table.add_row("tok/s", "48.8 (47.6, 13.3)", "51.1 (50.8, 5.7)", "70.4 (67.8, 12.2)", "67.5 (63.4, 4.4)")
    table.add_row("TTFT p50 s", "1.92 (1.98, 0.07)", "1.32 (1.35, 0.03)", "0.57 (0.59, 0.07)", "0.78 (0.79, 0.10)")
    console.print(table)
    return console.file.getvalue()


def test_a_named_winner_is_checked_against_the_printed_table():
    text = clock_table()
    values = {"static, 8 slots": 48.8, "continuous, 4 slots": 51.1, "continuous, 8 slots": 70.4,
              "continuous, 16 slots": 67.5}
    line = winner_line("tok/s", True, values)
    assert line == "best on tok/s (highest): continuous, 8 slots (70.4)"
    assert relation_problems(text + line) == []
    assert relation_problems(text + winner_line("TTFT p50 s", False, {"continuous, 8 slots": 0.57},
                                                fmt=".2f")) == []
    beaten = relation_problems(text + "best on tok/s (highest): continuous, 16 slots (67.5)")   # lesson 08's words
    assert len(beaten) == 1 and "continuous, 8 slots (70.4)" in beaten[0] and "beats it" in beaten[0]
    assert relation_problems(text + "best on ITL p50 ms (lowest): continuous, 4 slots (49.9)")[0].endswith(
        "no printed table has a row or column named 'ITL p50 ms'")


def test_a_winner_in_a_table_whose_rows_are_the_contenders():
    console = Console(file=io.StringIO(), width=100, color_system=None)
    table = Table("setting", "step min ms", "median ms")
    for name, low, median in (("float32", "16.4", "17.5"), ("int8 weights", "28.7", "29.4")):
        table.add_row(name, low, median)
    console.print(table)
    text = console.file.getvalue()
    assert relation_problems(text + "best on step min ms (lowest): float32 (16.4)") == []
    assert relation_problems(text + "best on step min ms (lowest): int8 weights (28.7)")
