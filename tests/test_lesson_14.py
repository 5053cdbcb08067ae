"""Lesson 14 runs as a learner runs it (a subprocess on the real model, small settings) and its numbers hold together:
every configuration run --repeats times, each run checked against what its own requests' times imply, each
configuration's best / median / spread over its runs, queueing where slots are few, more KV memory where they are
many, claims decided from the printed numbers (and flipped by an edited one), the answer quoting only what they
showed."""

from __future__ import annotations

import re

import numpy as np
import pytest

from minitransformer.lab import engine_load
from minitransformer.lab.claims import printed_verdicts, table_with
from minitransformer.lab.measure import Quietness
from printed_output import edit_cell
from test_lessons_08_10 import load_lesson, run_lesson

L14 = "14_serving_under_load.py"
REPEATS = 2
ARGS = ["--requests", "4", "--rates", "inf,4", "--max-num-seqs", "1,4", "--max-tokens", "4", "--max-prompt", "32",
        "--repeats", str(REPEATS)]
CONFIGS = {("inf", "1"), ("inf", "4"), ("4", "1"), ("4", "4")}


@pytest.fixture(scope="module")
def lesson_14(real_model_path, tmp_path_factory):
    figure = tmp_path_factory.mktemp("fig") / "load.png"
    return run_lesson(L14, real_model_path, *ARGS, "--figure", str(figure)), figure


def runs_of(output: str) -> list[dict]:
    table = table_with(output, "implied tok/s")
    return [dict(zip(table.columns, row)) for row in table.rows]


def summary_of(output: str) -> dict:
    table = table_with(output, "tok/s best")
    cells = [dict(zip(table.columns, row)) for row in table.rows]
    return {(c["rate /s"], c["slots"]): {k: float(v) for k, v in c.items() if k not in ("rate /s", "slots")}
            for c in cells}


def flat(output: str) -> str:
    return " ".join(output.split())


def test_every_configuration_runs_repeatedly_and_the_figure_is_drawn(lesson_14):
    output, figure = lesson_14
    runs = runs_of(output)
    assert sorted((r["rate /s"], r["slots"], r["run"]) for r in runs) == sorted(
        (rate, m, str(i)) for rate, m in CONFIGS for i in range(1, REPEATS + 1)), output[-3000:]
    assert f"each configuration run {REPEATS} times in turns" in flat(output)
    assert "check preemptions: 0 in all runs" in output                  # the default pool has room for every slot
    assert figure.stat().st_size > 10_000
    for r in runs:
        assert float(r["queue p99"]) >= float(r["queue p50"]) and float(r["ITL p99 ms"]) >= float(r["ITL p50 ms"])


def test_summary_is_best_median_spread_of_the_runs(lesson_14):
    """Table 2 is table 1 summarised: the highest tok/s and the lowest latencies are the best, spread = max - min."""
    output, _ = lesson_14
    runs, summary = runs_of(output), summary_of(output)
    assert set(summary) == CONFIGS
    for key, row in summary.items():
        mine = [r for r in runs if (r["rate /s"], r["slots"]) == key]
        tok_s, ttft = [float(r["out tok/s"]) for r in mine], [float(r["TTFT p99"]) for r in mine]
        itl = [float(r["ITL p50 ms"]) for r in mine]
        assert row["tok/s best"] == pytest.approx(max(tok_s), abs=0.051)
        assert row["tok/s spread"] == pytest.approx(max(tok_s) - min(tok_s), abs=0.11)
        assert row["TTFT p99 best"] == pytest.approx(min(ttft), abs=0.006)
        assert row["TTFT p99 spread"] == pytest.approx(max(ttft) - min(ttft), abs=0.011)
        assert row["TTFT p99 median"] == pytest.approx(float(np.median(ttft)), abs=0.011)
        assert row["ITL p50 best"] == pytest.approx(min(itl), abs=0.051)


def test_all_at_once_one_slot_queues_and_four_slots_hold_more_cache(lesson_14):
    """Structural, whatever the machine: all four requests at once on one slot, the last waits for three whole
    replies; on four slots they all hold cache at once."""
    runs = runs_of(lesson_14[0])
    for one, four in zip(*([r for r in runs if (r["rate /s"], r["slots"]) == ("inf", m)] for m in ("1", "4"))):
        assert float(one["queue p99"]) > float(four["queue p99"])
        assert float(one["queue p99"]) > float(one["decode p50"])
        assert float(four["KV MiB"]) > float(one["KV MiB"])


def test_replay_of_the_typical_request():
    """replay_wall: first come, first served on `slots` slots, each request taking the same service time."""
    replay_wall = engine_load.replay_wall
    assert replay_wall([0, 0, 0], 1.0, 1) == pytest.approx(3.0)          # one after another
    assert replay_wall([0, 0, 0], 1.0, 3) == pytest.approx(1.0)          # all at once
    assert replay_wall([0, 5], 1.0, 1) == pytest.approx(6.0)             # idle until the second arrives
    assert replay_wall([0, 0.5, 0.6], 1.0, 2) == pytest.approx(2.0)      # the third waits for the first


def decided(output: str) -> dict:
    return {c.key: c for c in load_lesson(L14).claims(output)}


def test_claims_and_the_answer_follow_the_printed_numbers(lesson_14):
    output, _ = lesson_14
    found = decided(output)
    assert set(found) == {"rows-agree", "throughput-up", "queueing-down", "ttft-is-queueing", "itl-up", "kv-up",
                          "light-at-bound"}
    assert found["kv-up"].holds and not found["kv-up"].timed
    quiet, verdicts = Quietness.parse(output), printed_verdicts(output)
    for key, claim in found.items():
        assert verdicts[key] == (claim.holds and (not claim.timed or quiet.quiet)), key
    answer = flat(output[output.index("Interview question"):])
    summary = summary_of(output)
    small, big = summary["inf", "1"], summary["inf", "4"]
    assert f"{small['tok/s best']:.1f} -> {big['tok/s best']:.1f} tok/s" in answer
    assert f"{small['TTFT p99 best']:.2f} -> {big['TTFT p99 best']:.2f} s" in answer
    assert f"ITL p50 {small['ITL p50 best']:.1f} -> {big['ITL p50 best']:.1f} ms" in answer
    assert ("raised output throughput" in answer) == (verdicts["throughput-up"] and verdicts["queueing-down"])
    assert ("almost all of it queueing" in answer) == (verdicts["throughput-up"] and verdicts["queueing-down"]
                                                        and verdicts["ttft-is-queueing"])
    assert ("The price: every token came slower" in answer) == verdicts["itl-up"]
    assert ("throughput cannot exceed what arrives" in answer) == verdicts["light-at-bound"]
    assert ("stalled" in answer) == (not found["rows-agree"].holds)
    assert re.search(r"a bf16 decode step of 4 sequences would cost 1\.0\dx one of 1 at its roofline", answer)


def test_an_edited_number_flips_its_claim(lesson_14):
    output, _ = lesson_14
    stalled = edit_cell(output, "implied tok/s", ("inf", "1", "1"), "9999.0")        # 1 run far from its requests
    assert not decided(stalled)["rows-agree"].holds
    agree = output
    for rate, m in CONFIGS:
        for run in range(1, REPEATS + 1):
            tok_s = next(r["out tok/s"] for r in runs_of(output) if (r["rate /s"], r["slots"], r["run"]) ==
                         (rate, m, str(run)))
            agree = edit_cell(agree, "implied tok/s", (rate, m, str(run)), tok_s)
    assert decided(agree)["rows-agree"].holds
    # four slots far ahead of one, with no spread: throughput rose beyond it; then the ranges made to overlap
    up = edit_cell(edit_cell(output, "tok/s best", ("inf", "4"), "999.0"), "tok/s spread", ("inf", "4"), "0.0")
    assert decided(up)["throughput-up"].holds
    overlap = edit_cell(up, "tok/s spread", ("inf", "4"), "998.0")
    assert not decided(overlap)["throughput-up"].holds
    slower = edit_cell(edit_cell(output, "ITL p50 best", ("inf", "4"), "9999.0"), "ITL p50 spread", ("inf", "1"),
                       "0.0")
    assert decided(slower)["itl-up"].holds
    assert not decided(edit_cell(output, "ITL p50 best", ("inf", "4"), "0.0"))["itl-up"].holds
    less_kv = edit_cell(output, "KV MiB", ("inf", "4", "1"), "0.0")
    assert not decided(less_kv)["kv-up"].holds
    at_bound = edit_cell(output, "tok/s best", ("4", "4"), "9999.0")
    assert decided(at_bound)["light-at-bound"].holds
    assert not decided(edit_cell(output, "tok/s best", ("4", "4"), "0.0"))["light-at-bound"].holds


def test_arrivals_are_poisson_and_reproducible():
    arrival_offsets = engine_load.arrival_offsets
    offsets = arrival_offsets(20_000, 4.0, seed=3)
    gaps = np.diff(offsets)
    assert offsets[0] == 0 and np.all(gaps >= 0)
    assert abs(gaps.mean() - 0.25) < 4 * 0.25 / np.sqrt(len(gaps))          # exponential: std = mean
    assert np.array_equal(offsets, arrival_offsets(20_000, 4.0, seed=3))
    assert np.all(arrival_offsets(5, float("inf"), seed=0) == 0)     # "inf": all at once
    # the lesson's own arrivals: its transcript's "the last request arrives at 6.94 s" (16 requests, 2/s, seed 0)
    assert round(float(arrival_offsets(16, 2.0, seed=0)[-1]), 2) == 6.94


@pytest.mark.parametrize("flags, message", [(["--rates", "fast"], "--rates must be comma-separated numbers"),
                                            (["--repeats", "1"], "--repeats must be at least 2")])
def test_bad_flags_are_one_line_and_exit_2(real_model_path, flags, message):
    import subprocess
    import sys

    from test_lessons_08_10 import ROOT
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / L14), *flags], capture_output=True, text=True,
                            cwd=ROOT)
    assert result.returncode == 2 and message in result.stderr
    assert "Traceback" not in result.stderr


def test_auto_rates_are_fractions_of_what_this_machine_serves(real_model):
    """--rates auto (the default): every request at once gives this machine's tokens per second with the most slots;
    the light rate is LIGHT of the requests/s that makes, the heavy one HEAVY times it, each to two digits. A fixed
    2 requests/s was light on one machine and beyond a slower one's capacity."""
    requests = engine_load.workload(real_model.tokenizer, 4, 32, 4, 0)
    tok_s, per_second, light, heavy = engine_load.rates_for_this_machine(real_model, requests, 4)
    assert tok_s > 0 and per_second == pytest.approx(tok_s / 4)          # 4 tokens per request (ignore_eos)
    assert light == float(f"{engine_load.LIGHT * per_second:.2g}")
    assert heavy == float(f"{engine_load.HEAVY * per_second:.2g}")
    assert 0 < light < per_second < heavy
