"""measure.py (timing with min / median / spread, interleaving, the quietness probe) and claims.py (a lesson's claims
read back from what it printed). No timed assertions: the tests count calls, check the arithmetic on given samples
and read rich's real output back."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
import time

import pytest
from rich.console import Console
from rich.table import Table

from minitransformer.lab import measure
from minitransformer.lab.claims import (
    Claim,
    find_numbers,
    is_shown,
    printed_verdicts,
    report,
    table_with,
    tables,
    to_float,
    verdict_line,
)
from minitransformer.lab.measure import Probe, Quietness, Timing, interleaved, machine_peaks, time_calls


def test_timing_statistics():
    t = Timing((0.030, 0.010, 0.020, 0.014))
    assert (t.min, t.max) == (0.010, 0.030)
    assert t.median == pytest.approx(0.017)
    assert t.spread == pytest.approx(0.020) and t.relative_spread == pytest.approx(2.0)
    assert t.ms() == "10.0 ms (median 17.0, spread 20.0)"


def test_time_calls_warms_up_then_keeps_every_repeat():
    calls, synced = [], []
    timing = time_calls(lambda: calls.append(1), repeats=4, warmup=2, sync=lambda: synced.append(1))
    assert len(calls) == 6 and len(synced) == 6 and len(timing.samples) == 4
    assert all(s >= 0 for s in timing.samples)
    with pytest.raises(ValueError):
        time_calls(lambda: None, repeats=0)


def test_interleaved_runs_contenders_in_turns():
    order = []
    timings = interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, warmup=1)
    assert order == ["a", "b"] * 4                       # one warm-up round, then three timed rounds, A B A B ...
    assert set(timings) == {"a", "b"} and all(len(t.samples) == 3 for t in timings.values())


def quiet(others=0.01, before=1e-3, after=1.02e-3, load=0.3, cores=2) -> Quietness:
    return Quietness(load=load, others=others, cores=cores, calibration_before=before, calibration_after=after)


def test_quietness_limits_and_reasons():
    assert quiet().quiet and quiet().why_busy() == ""
    busy = quiet(others=0.45)
    assert not busy.quiet and "other programs used 45% of the 2 cores" in busy.why_busy()
    drifted = quiet(after=1.3e-3)
    assert not drifted.quiet and "drifted +30%" in drifted.why_busy()
    assert quiet(others=None, load=0.4).quiet and not quiet(others=None, load=1.5).quiet    # no /proc/stat


@pytest.mark.parametrize("q", [quiet(), quiet(others=0.45, after=1.3e-3), quiet(others=None)])
def test_quietness_line_reads_back_even_when_wrapped(q):
    line = q.line()
    wrapped = textwrap.fill(line, 40)                             # rich wraps at spaces, as textwrap does
    back = Quietness.parse("before\n" + wrapped + "\nafter")
    assert back is not None and back.quiet == q.quiet and back.line() == line
    assert Quietness.parse("no probe here") is None


def test_probe_sees_a_quiet_or_busy_machine_as_a_share_between_0_and_1():
    result = Probe().finish()
    assert result.cores >= 1 and result.calibration_before > 0 and result.calibration_after > 0
    assert result.others is None or 0.0 <= result.others <= 1.0


def test_machine_peaks_come_from_the_environment_when_a_run_measured_them_once(monkeypatch):
    monkeypatch.setenv(measure.PEAKS_ENV, "2e10,5e10")
    assert machine_peaks(lambda: pytest.fail("measured again")) == (2e10, 5e10, False)
    monkeypatch.delenv(measure.PEAKS_ENV)
    assert machine_peaks(lambda: (1.0, 2.0)) == (1.0, 2.0, True)


def test_the_probe_times_its_calibration_in_a_new_process_not_in_the_run_it_watches(monkeypatch):
    """The run's own matmuls speed up its next small one (its process's state, not the machine's), which read as a
    drift no other program caused: each end times the calibration in a new process, and this one never runs it."""
    monkeypatch.setattr(measure, "calibration_seconds", lambda *a, **k: pytest.fail("timed in the watched process"))
    seen = []
    real_run = measure.subprocess.run
    monkeypatch.setattr(measure.subprocess, "run", lambda argv, **kw: seen.append(argv) or real_run(argv, **kw))
    result = Probe().finish()
    assert len(seen) == 2 and all(argv[0] == sys.executable for argv in seen)
    assert result.calibration_before > 0 and result.calibration_after > 0


# ------------------------------------------------------------------------------------------------ claims

def rendered(width=60) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    table = Table("step", "cache ms", "a long column name that wraps")
    table.add_row("1", "65.8", "first\nsecond line")
    table.add_row("2", "1,018.0", "x")
    console.print("check totals: cache 0.897 s, no cache " + "padding words " * 6 + "5.894 s")
    console.print(table)
    return console.file.getvalue()


def test_tables_read_rich_output_back_with_wrapped_cells():
    text = rendered()
    [table] = tables(text)
    assert table.columns[:2] == ["step", "cache ms"] and table.columns[2].startswith("a long column name")
    assert table.numbers("cache ms") == [65.8, 1018.0]
    assert table.column("a long")[0] == "first second line"                     # a wrapped row joined
    assert table_with(text, "cache ms") is not None
    with pytest.raises(ValueError):
        table_with(text, "no such column")
    assert to_float("3.4x") == 3.4 and to_float("47%") == 47.0


def test_find_numbers_reads_across_rich_line_breaks():
    assert find_numbers(rendered(40), r"check totals: cache ([\d.]+) s, no cache .*? ([\d.]+) s") == [0.897, 5.894]
    with pytest.raises(ValueError, match="no line matching"):
        find_numbers("nothing", r"check x: ([\d.]+)")


def test_a_timed_claim_is_shown_only_on_a_quiet_run_an_untimed_one_always():
    timed = Claim("faster", "A is faster than B", True, "1.0 vs 2.0 ms")
    untimed = Claim("same", "the same tokens", True, "48 of 48", timed=False)
    wrong = Claim("grows", "it grows", False, "10 -> 9 ms")
    assert is_shown(timed, quiet()) and not is_shown(timed, quiet(others=0.5)) and not is_shown(timed, None)
    assert is_shown(untimed, quiet(others=0.5))
    assert not is_shown(wrong, quiet())
    assert "the machine was busy (other programs used 50%" in verdict_line(timed, quiet(others=0.5))
    assert "its numbers do not show it" in verdict_line(wrong, quiet())


def test_report_prints_verdicts_that_read_back():
    console = Console(file=io.StringIO(), width=50, color_system=None)
    found = [Claim("faster", "A is faster than B [not markup]", True, "1.0 vs 2.0 ms"),
             Claim("grows", "it grows", False, "10 -> 9 ms")]
    shown = report(console, found, quiet())
    assert shown == {"faster": True, "grows": False}
    text = console.file.getvalue()
    assert "[not markup]" in " ".join(text.split())               # printed as text, not as rich markup
    assert printed_verdicts(text) == shown


SPIN = ("import time\ninput()\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"
        "print('spun', flush=True)\ninput()\n")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_probe_counts_the_process_groups_it_is_given_as_its_own_work():
    """A child in a session of its own (as bench serve --compare starts each server) spins 0.6 s of CPU, once both
    probes have started, while they watch the same window: the one told the child's process group does not count
    that CPU as another program's, the other does. The difference is the child's CPU over the cores' capacity in the
    window, so it does not depend on how busy the machine is."""
    child = subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        start = time.perf_counter()
        blind, told = Probe(), Probe(process_groups=[child.pid])
        started = measure.group_cpu_seconds(child.pid)               # its start-up, before either window counts
        child.stdin.write("go\n")
        child.stdin.flush()
        # The child says when its 0.6 s are spun (its own clock), then waits on stdin. Waiting for /proc to show
        # 0.6 s instead could wait forever: /proc's ticks can fall a tick short of the child's clock.
        assert child.stdout.readline() == "spun\n"
        spun = measure.group_cpu_seconds(child.pid) - started
        seen_blind, seen_told = blind.finish(), told.finish()
        capacity = (time.perf_counter() - start) * (os.cpu_count() or 1)    # CPU seconds the cores had meanwhile
    finally:
        child.communicate("\n", timeout=30)
    assert spun >= 0.5, spun                                          # /proc saw the spin, to within its ticks
    assert seen_blind.others is not None and seen_told.others is not None
    # at least most of the child's CPU moved from "another program's" to "ours" (the ticks are 10 ms coarse)
    assert seen_blind.others - seen_told.others >= 0.8 * spun / capacity, (spun, capacity, seen_blind, seen_told)
    assert measure.group_cpu_seconds(child.pid) == 0.0                 # gone: nothing left to count
