"""Lesson 14 runs as a learner runs it (a subprocess on the real model, small settings) and its numbers hold together:
one row per (rate, max_num_seqs), queueing where slots are few, more KV memory where they are many, the answer
quoting the table."""

from __future__ import annotations

import re

import numpy as np
import pytest

from test_lessons_08_10 import load_lesson, run_lesson

L14 = "14_serving_under_load.py"
ARGS = ["--requests", "4", "--rates", "inf,4", "--max-num-seqs", "1,4", "--max-tokens", "4", "--max-prompt", "32"]
ROW = r"^\s*(inf|4)\s+([14])" + r"\s+([0-9.]+)" * 8 + r"\s+(\d+)\s+([0-9.]+)\s*$"
COLUMNS = ["tok_s", "queue50", "queue99", "prefill50", "decode50", "ttft99", "itl50", "itl99", "preempt", "kv_mib"]


@pytest.fixture(scope="module")
def lesson_14(real_model_path, tmp_path_factory):
    figure = tmp_path_factory.mktemp("fig") / "load.png"
    return run_lesson(L14, real_model_path, *ARGS, "--figure", str(figure)), figure


def rows(output: str) -> dict:
    table = {}
    for line in output.splitlines():
        match = re.match(ROW, line.replace("│", " ").replace("┃", " "))
        if match:
            rate, slots, *values = match.groups()
            table[rate, int(slots)] = dict(zip(COLUMNS, map(float, values)))
    return table


def test_every_configuration_has_a_row_and_the_figure_is_drawn(lesson_14):
    output, figure = lesson_14
    table = rows(output)
    assert set(table) == {("inf", 1), ("inf", 4), ("4", 1), ("4", 4)}, output[-3000:]
    assert figure.stat().st_size > 10_000
    for row in table.values():
        assert row["preempt"] == 0                              # the default pool has room for every slot
        assert row["queue99"] >= row["queue50"] and row["itl99"] >= row["itl50"]


def test_all_at_once_one_slot_queues_and_four_slots_hold_more_cache(lesson_14):
    table = rows(lesson_14[0])
    one, four = table["inf", 1], table["inf", 4]
    assert one["queue99"] > four["queue99"]                     # with one slot the last request waits for three
    assert one["queue99"] > one["decode50"]                     # ... for at least one other whole reply
    assert four["kv_mib"] > one["kv_mib"]                       # four requests' keys and values held at once


def test_the_answer_quotes_the_table(lesson_14):
    output = lesson_14[0]
    table = rows(output)
    small, big = table["inf", 1], table["inf", 4]
    answer = " ".join(output[output.index("Interview question"):].split())      # rich wraps lines anywhere
    assert f"{small['tok_s']:.1f} -> {big['tok_s']:.1f} tok/s" in answer
    assert f"TTFT p99 {small['ttft99']:.2f} -> {big['ttft99']:.2f} s" in answer
    assert f"ITL p50 {small['itl50']:.1f} -> {big['itl50']:.1f} ms" in answer


def test_verdicts_only_beyond_the_measured_spread(lesson_14):
    """The two compared configurations are run again; each 'within noise' / 'slower' in the answer follows from the
    printed spreads (cases within printing precision of the boundary are not judged)."""
    output = lesson_14[0]
    table, flat = rows(output), " ".join(output.split())
    small, big = table["inf", 1], table["inf", 4]
    spread = {m: [float(x) for x in re.search(rf"spread over 2 runs \(all requests at once, max_num_seqs {m}\), "
                                              r"max - min: tok/s ([0-9.]+), TTFT p99 ([0-9.]+) s, ITL p50 "
                                              r"([0-9.]+) ms, ITL p99 ([0-9.]+) ms", flat).groups()] for m in (1, 4)}
    answer = flat[flat.index("Interview question"):]
    for key, index, text, precision in (("tok_s", 0, f"{small['tok_s']:.1f} -> {big['tok_s']:.1f} tok/s", 0.1),
                                        ("ttft99", 1, f"{small['ttft99']:.2f} -> {big['ttft99']:.2f} s", 0.01)):
        limit, diff = max(spread[1][index], spread[4][index]), abs(big[key] - small[key])
        if abs(diff - limit) > 2 * precision:
            assert (f"{text} (within noise)" in answer) == (diff <= limit), (key, diff, limit)
    limit, diff = max(spread[1][2], spread[4][2]), big["itl50"] - small["itl50"]
    if abs(abs(diff) - limit) > 0.2:
        assert ("made every token slower" in answer) == (diff > limit)
        assert ("did not show beyond the run-to-run spread" in answer) == (abs(diff) <= limit)
    assert re.search(r"a bf16 decode step of 4 sequences would cost 1\.0\dx one of 1 at its roofline", answer)


def test_arrivals_are_poisson_and_reproducible():
    lesson = load_lesson(L14)
    offsets = lesson.arrival_offsets(20_000, 4.0, seed=3)
    gaps = np.diff(offsets)
    assert offsets[0] == 0 and np.all(gaps >= 0)
    assert abs(gaps.mean() - 0.25) < 4 * 0.25 / np.sqrt(len(gaps))          # exponential: std = mean
    assert np.array_equal(offsets, lesson.arrival_offsets(20_000, 4.0, seed=3))
    assert np.all(lesson.arrival_offsets(5, float("inf"), seed=0) == 0)     # "inf": all at once


def test_bad_flags_are_one_line_and_exit_2(real_model_path):
    import subprocess
    import sys

    from test_lessons_08_10 import ROOT
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / L14), "--rates", "fast"], capture_output=True,
                            text=True, cwd=ROOT)
    assert result.returncode == 2 and "--rates must be comma-separated numbers" in result.stderr
    assert "Traceback" not in result.stderr
