"""How this project times things, and how it knows whether a timing can be trusted.

Every lesson, figure, notebook and benchmark times through this module, so they all follow the same rules:

    time_calls    warm up, then repeat a call and keep every sample: min, median, spread
    interleaved   two or more contenders timed in turns (A B A B ...), so a slow moment hits each of them alike
    in_turns      the same, keeping each run's result, after one untimed round whose results give the step counts
    Probe         is the machine quiet? Other programs' share of the CPUs during the run (read from the kernel's
                  counters, minus our own CPU time), the load average, and a fixed calibration (one matmul of the
                  default model's shape) timed in a new process at the start and at the end: on a quiet machine the
                  two agree
    machine_peaks this machine's copy bandwidth and GEMM FLOP/s, measured once and reused by every lesson of a run

Why the minimum: noise on a shared machine only ever adds time (another program takes the core, a cache is
evicted), so the fastest of several repeats is the closest to what the code costs on a quiet machine; the median
says what a user typically sees; the spread (max - min) says how much to trust either. A difference smaller than the
spread is not a difference (lessons/README.md: reading numbers honestly; lesson 02 shows it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy

from ..core.metrics import now, percentile

OTHERS_LIMIT = 0.10      # other programs may use at most 10% of all cores during a run that counts as quiet
DRIFT_LIMIT = 0.10       # the calibration at the end may differ from the one at the start by at most 10%


# ------------------------------------------------------------------------------------------------ timing

@dataclass(frozen=True)
class Timing:
    """Repeated measurements of one thing, in seconds, in the order they ran."""
    samples: tuple[float, ...]

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def median(self) -> float:
        median = percentile(self.samples, 50)
        assert median is not None, "a Timing has samples"
        return median

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def spread(self) -> float:
        """max - min: a difference between two timings smaller than this is inside the noise."""
        return self.max - self.min

    @property
    def relative_spread(self) -> float:
        return self.spread / self.min if self.min > 0 else 0.0

    def ms(self) -> str:
        """'18.1 ms (median 18.4, spread 0.6)': the quiet-machine figure first, then how much to trust it."""
        return f"{self.min * 1e3:.1f} ms (median {self.median * 1e3:.1f}, spread {self.spread * 1e3:.1f})"


def time_calls(run: Callable[[], object], repeats: int = 5, warmup: int = 1,
               sync: Callable[[], None] | None = None) -> Timing:
    """Seconds of `repeats` calls of run(), after `warmup` untimed calls (first-call costs: page faults, BLAS thread
    start-up, allocator growth are not what a lesson measures). `sync` waits for a GPU to finish (backend's
    synchronize): a CuPy call returns before its work is done."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        run()
        if sync:
            sync()
    samples = []
    for _ in range(repeats):
        start = now()
        run()
        if sync:
            sync()
        samples.append(now() - start)
    return Timing(tuple(samples))


Key = TypeVar("Key", bound=Hashable)      # what names a contender in interleaved(): a label, a row count


def interleaved(runs: dict[Key, Callable[[], object]], repeats: int = 5, warmup: int = 1,
                sync: Callable[[], None] | None = None) -> dict[Key, Timing]:
    """Time several contenders in turns: round r runs each once, in the same order. Timing A five times and then B
    five times would charge B (or A) alone for a busy moment; in turns, both pay for it."""
    for _ in range(warmup):
        for run in runs.values():
            run()
            if sync:
                sync()
    samples: dict[Key, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            start = now()
            run()
            if sync:
                sync()
            samples[name].append(now() - start)
    return {name: Timing(tuple(s)) for name, s in samples.items()}


def in_turns(contenders: dict[str, Callable[[], object]], repeats: int) -> tuple[dict, dict]:
    """Run each contender once untimed (the warm-up), then `repeats` times in turns with the others, keeping what
    each run returns. For runs whose schedule is the same every time (engine steps, token ids: lesson 10), the
    warm-up's result gives those numbers and the timed ones give the seconds.
    Returns ({name: the warm-up's result}, {name: [the timed runs' results]})."""
    first = {name: run() for name, run in contenders.items()}
    timed: dict[str, list] = {name: [] for name in contenders}

    def keep(name):
        return lambda: timed[name].append(contenders[name]())
    interleaved({name: keep(name) for name in contenders}, repeats=repeats, warmup=0)    # the round above warmed up
    return first, timed


# ------------------------------------------------------------------------------------------------ quietness

def _machine_ticks() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat (Linux); None elsewhere.
    Steal time counts as busy: it is a neighbour on the same host taking our virtual CPU."""
    try:
        with open("/proc/stat") as stat:
            fields = [float(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    hz = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)            # idle + iowait
    total = sum(fields[:8])                                               # guest time is already inside user
    return (total - idle) / hz, total / hz


def _own_cpu_seconds(process_groups: tuple[int, ...] = (), pids: tuple[int, ...] = ()) -> float:
    """CPU seconds of this process (and its waited-for children), plus every live process of `process_groups` and
    every process in `pids`."""
    t = os.times()
    return (t.user + t.system + t.children_user + t.children_system + sum(map(group_cpu_seconds, process_groups))
            + sum(map(process_cpu_seconds, pids)))


def _proc_stats() -> dict[int, list[str]]:
    """/proc/PID/stat of every process we can read, split into fields after the command name (field 3 onwards)."""
    stats = {}
    for pid in filter(str.isdigit, os.listdir("/proc") if os.path.isdir("/proc") else ()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stats[int(pid)] = f.read().rsplit(")", 1)[1].split()   # the command name may hold spaces
        except OSError:                                                # it exited meanwhile, or is not ours to read
            continue
    return stats


def descendants(pid: int, stats: dict[int, list[str]] | None = None) -> set[int]:
    """Every live process below `pid` (children, their children, ...); empty off Linux."""
    stats = _proc_stats() if stats is None else stats
    below, found = {pid}, True
    while found:
        found = False
        for child, fields in stats.items():
            if child not in below and int(fields[1]) in below:             # fields[1]: ppid
                below.add(child)
                found = True
    return below - {pid}


def descendant_groups(pid: int) -> list[int]:
    """The process groups of `pid` and of every process below it: a server that starts its own process groups
    (`serve --disaggregated` runs mpiexec in a session of its own) is all its groups' work, for Probe."""
    stats = _proc_stats()
    return sorted({int(stats[p][2]) for p in descendants(pid, stats) | {pid} if p in stats})   # fields[2]: pgrp


def _cpu_ticks(fields: list[str]) -> int:
    return int(fields[11]) + int(fields[12])                           # utime + stime (fields 14, 15): all threads


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds of one process over all its threads; 0.0 once it is gone (or off Linux)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return _cpu_ticks(f.read().rsplit(")", 1)[1].split()) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def group_cpu_seconds(group: int) -> float:
    """CPU seconds of every live process whose process group is `group` (field 5 of /proc/PID/stat); 0.0 where
    /proc cannot tell (not Linux). A server this run started (bench serve --compare starts each in a session of its
    own) is one group: its workers' CPU counts too."""
    ticks = sum(_cpu_ticks(fields) for fields in _proc_stats().values() if int(fields[2]) == group)
    return ticks / os.sysconf("SC_CLK_TCK") if ticks else 0.0


_CALIBRATION: list[numpy.ndarray] = []     # allocated once per process: the same pages at both ends of a run


def calibration_seconds(repeats: int = 40) -> float:
    """Fastest of `repeats` runs of one fixed matmul of the default model's shape: 64 tokens through the fused
    gate/up projection, (64, 576) @ (576, 3072), ~1 ms. Timed at a run's start and end (in a new process each time:
    fresh_calibration_seconds), it must agree on a quiet machine; when it does not, something else took the cores in
    between. (The arrays are kept for the process: fresh ones land on other pages, which alone moves the time by
    several percent between two calls in one process.)"""
    if not _CALIBRATION:
        rng = numpy.random.default_rng(0)
        _CALIBRATION.extend([rng.standard_normal((64, 576), dtype=numpy.float32),       # (64, D)
                             rng.standard_normal((576, 3072), dtype=numpy.float32)])    # (D, 2F)
    x, w_gate_up = _CALIBRATION
    return time_calls(lambda: x @ w_gate_up, repeats=repeats, warmup=3).min


_CHILD = ("import sys; sys.path.insert(0, sys.argv[1]); from minitransformer.lab.measure import calibration_seconds; "
          "print(min(calibration_seconds(), calibration_seconds()))")


def fresh_calibration_seconds() -> float:
    """calibration_seconds() timed in a new Python process, the better of two: the machine's speed, not this
    process's. A process that has just run large matmuls times the same small one faster than it did before them:
    on a 2-core EPYC guest, 3.5-3.7 ms right after a few seconds of prefill-sized products against 5.8-11 ms in a
    fresh process at the same moment, so a lesson's own work made its calibration drift by -40% to -53% with no
    other program running. A new process at each end of a run starts from the same state both times."""
    package_parent = str(Path(__file__).resolve().parents[2])
    done = subprocess.run([sys.executable, "-c", _CHILD, package_parent], capture_output=True, text=True,
                          check=True, timeout=120)
    return float(done.stdout.split()[-1])


QUIET_LINE = re.compile(r"quietness: load average (?P<load>[\d.]+) at the start; other programs used "
                        r"(?P<others>[\d.]+|\?)% of the (?P<cores>\d+) cores; calibration (?P<before>[\d.]+) -> "
                        r"(?P<after>[\d.]+) ms \((?P<drift>[-+][\d.]+)%\): (?P<verdict>quiet|busy)")


@dataclass(frozen=True)
class Quietness:
    """What the probe saw over one run: could another program have disturbed its timings?"""
    load: float                       # 1-minute load average at the start (it includes this run's own threads)
    others: float | None              # other programs' share of all cores during the run, 0..1 (None: unknown)
    cores: int
    calibration_before: float         # seconds
    calibration_after: float

    @property
    def drift(self) -> float:
        """Relative change of the calibration from the start to the end of the run."""
        return self.calibration_after / self.calibration_before - 1

    @property
    def quiet(self) -> bool:
        others_ok = self.others <= OTHERS_LIMIT if self.others is not None else self.load < 0.5 * self.cores
        return others_ok and abs(self.drift) <= DRIFT_LIMIT

    def why_busy(self) -> str:
        """Plain words for what disturbed the run, '' when it was quiet."""
        reasons = []
        if self.others is not None and self.others > OTHERS_LIMIT:
            reasons.append(f"other programs used {self.others:.0%} of the {self.cores} cores "
                           f"(limit {OTHERS_LIMIT:.0%})")
        if self.others is None and self.load >= 0.5 * self.cores:
            reasons.append(f"the load average was {self.load:.1f} on {self.cores} cores")
        if abs(self.drift) > DRIFT_LIMIT:
            reasons.append(f"the calibration drifted {self.drift:+.0%} between start and end "
                           f"(limit ±{DRIFT_LIMIT:.0%})")
        return "; ".join(reasons)

    def line(self) -> str:
        """One line a transcript keeps and `make_transcripts.py --verify` reads back (QUIET_LINE)."""
        others = "?" if self.others is None else f"{self.others * 100:.1f}"
        return (f"quietness: load average {self.load:.2f} at the start; other programs used {others}% of the "
                f"{self.cores} cores; calibration {self.calibration_before * 1e3:.2f} -> "
                f"{self.calibration_after * 1e3:.2f} ms ({self.drift * 100:+.1f}%): "
                + ("quiet" if self.quiet else "busy"))

    @classmethod
    def parse(cls, text: str) -> Quietness | None:
        """The Quietness whose line() appears in `text` (wrapped or not), or None."""
        m = QUIET_LINE.search(" ".join(text.split()))
        if not m:
            return None
        others = None if m["others"] == "?" else float(m["others"]) / 100
        before = float(m["before"]) / 1e3                  # the drift as printed, not from the rounded times
        return cls(load=float(m["load"]), others=others, cores=int(m["cores"]), calibration_before=before,
                   calibration_after=before * (1 + float(m["drift"]) / 100))


class Probe:
    """Watches one run: start it before the timed work, finish() after. Costs a new process at each end (~1 s on a
    2-core guest)."""

    def __init__(self, process_groups: Iterable[int] = (), pids: Iterable[int] = ()) -> None:
        """process_groups, pids: other processes whose CPU is this run's own work, not another program's (the servers
        a benchmark started, by process group; a server it found on this machine, by pid)."""
        self.process_groups, self.pids = tuple(process_groups), tuple(pids)
        self.load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        self.calibration_before = fresh_calibration_seconds()     # before the CPU counters: its CPU is not the run's
        self._ticks = _machine_ticks()
        self._own = _own_cpu_seconds(self.process_groups, self.pids)

    def finish(self) -> Quietness:
        ticks, own = _machine_ticks(), _own_cpu_seconds(self.process_groups, self.pids)
        others = None
        if self._ticks and ticks and ticks[1] > self._ticks[1]:
            busy = ticks[0] - self._ticks[0]
            capacity = ticks[1] - self._ticks[1]
            others = max(0.0, busy - (own - self._own)) / capacity
        return Quietness(load=self.load, others=others, cores=os.cpu_count() or 1,
                         calibration_before=self.calibration_before,
                         calibration_after=fresh_calibration_seconds())      # after the counters, likewise


# ------------------------------------------------------------------------------------------------ peaks

PEAKS_ENV = "MINITRANSFORMER_PEAKS"      # "bytes_per_s,flop_per_s": set by make_transcripts.py for a whole run


def machine_peaks(measure: Callable[[], tuple[float, float]]) -> tuple[float, float, bool]:
    """(copy bandwidth bytes/s, GEMM FLOP/s, measured_here): from $MINITRANSFORMER_PEAKS when a caller measured them
    once for a set of runs (so every transcript quotes the same ridge point), else from measure()."""
    given = os.environ.get(PEAKS_ENV)
    if given:
        bandwidth, flops = (float(x) for x in given.split(","))
        return bandwidth, flops, False
    bandwidth, flops = measure()
    return bandwidth, flops, True
