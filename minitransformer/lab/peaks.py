"""This machine measured: a read stream, a copy and a matmul, timed in turns into one MachineProfile.

Every lesson, figure and benchmark that quotes a bandwidth, the GEMM peak or a floor derived from them reads it from
here, measured once for a set of runs and handed on as one JSON file ($MINITRANSFORMER_MACHINE_PROFILE,
machine_profile), so they all quote one set of numbers:

    read bandwidth   bytes per second of one row times a matrix far larger than the caches, (1, R) @ (R, C): a
                     read-only stream, the way a decode step reads its weights. Floors divide by this one: a decode
                     step cannot beat it, since both read the same bytes through the same BLAS routine and the step
                     does more besides (lesson 07 prints each step against it)
    copy bandwidth   bytes read + written per second by a large array copy (the STREAM "copy" convention); counting
                     both directions, it is no bound on a stream that only reads
    GEMM peak        float32 n x n matmul FLOP/s (2 n^3 FLOPs per product), what a long prefill can approach

Each is the fastest of its repeats (noise on a shared machine only adds time), with the median and spread beside it;
every timing goes through measure.py. machine.py turns the profile into a roofline.
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import platform
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy

from ..core.backend import synchronize
from .measure import Timing, interleaved


def sync_for(xp):
    """measure.time_calls' `sync` for this array module: a GPU call returns before its work is done."""
    return None if xp is numpy else (lambda: synchronize(xp))


def read_call(xp=numpy, nbytes: int = 512 * 2**20) -> tuple[int, Callable[[], object]]:
    """(bytes read per call, a call) of one row times an `nbytes` float32 matrix, (1, R) @ (R, 2048).

    This is how a decode step reads its weights: x (1, D) @ w (D, O), each weight read once and used for one
    multiply-add, through the same BLAS routine (which spreads the rows over all cores). The matrix is far larger
    than any cache, so the rate is what main memory delivers to a read-only stream; the one-row result written back
    is a few KB. A decode step cannot read its weights faster than this, which is why floors divide by it.
    """
    columns = 2048
    rows = max(nbytes // (4 * columns), 1)
    w = xp.ones((rows, columns), dtype=xp.float32)                       # (R, C): far larger than the caches
    x = xp.ones((1, rows), dtype=xp.float32)                             # (1, R): one row, like a decode step
    return int(w.nbytes), lambda: x @ w


def copy_call(xp=numpy, nbytes: int = 256 * 2**20) -> tuple[int, Callable[[], object]]:
    """(bytes moved per call, a call) copying an `nbytes` float32 array: read + write, 2 x nbytes.

    On the CPU one thread cannot saturate memory, so the copy is split across all cores (numpy releases the GIL);
    the array is much larger than any cache so the number is DRAM bandwidth.
    """
    src = xp.ones(max(nbytes // 4, 1), dtype=xp.float32)
    dst = xp.empty_like(src)
    if xp is not numpy:
        return 2 * src.nbytes, lambda: xp.copyto(dst, src)
    threads = os.cpu_count() or 1
    bounds = numpy.linspace(0, src.size, threads + 1).astype(int)
    slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]

    def copy() -> None:
        list(_copy_pool().map(lambda s: numpy.copyto(dst[s], src[s]), slices))
    return 2 * src.nbytes, copy


@functools.cache
def _copy_pool() -> ThreadPoolExecutor:
    """One pool of a thread per core for every copy_call of the process: the copies of every profile measured share
    it, instead of each leaving its own idle threads behind."""
    return ThreadPoolExecutor(os.cpu_count() or 1)


def gemm_call(xp=numpy, n: int = 1024) -> tuple[float, Callable[[], object]]:
    """(FLOPs per call, a call) of a float32 (n, n) @ (n, n): 2 n^3 FLOPs (a multiply and an add per term). This is
    the compute peak a prefill can approach: its matmuls are large in all three sizes."""
    rng = numpy.random.default_rng(0)
    a = xp.asarray(rng.standard_normal((n, n), dtype=numpy.float32))
    b = xp.asarray(rng.standard_normal((n, n), dtype=numpy.float32))
    return 2.0 * n**3, lambda: a @ b


# ------------------------------------------------------------------------------------------------ the profile

PROFILE_ENV = "MINITRANSFORMER_MACHINE_PROFILE"     # a profile's JSON file, measured once for a set of runs
GB, GFLOP = 1e9, 1e9


def machine_label() -> str:
    """The CPU model and core count, e.g. "AMD EPYC, 2 cores (x86_64)": every figure says where it was measured."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            name = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores ({platform.machine()})"


@dataclass(frozen=True)
class MachineProfile:
    """This machine measured once: a read stream, a copy and a matmul, each timed `repeats` times.

    The figures a lesson quotes are the fastest repeat of each (what the hardware does when nothing else runs);
    the median and spread say how far one moment of a shared machine is from that. Everything derived from the
    profile (a floor, the ridge, a roofline) reads it from here, so one run of the lessons, the figures and the
    benchmark quote one set of numbers, and tests/test_quoted_numbers.py holds the documents to them.
    """
    label: str                 # machine_label()
    measured: str              # UTC time, 'YYYY-MM-DD HH:MM'
    read_bytes: int            # bytes read per call of read_call
    read: Timing
    copy_bytes: int            # bytes read + written per call of copy_call
    copy: Timing
    gemm_flops: float          # FLOPs per call of gemm_call
    gemm: Timing

    @property
    def read_bandwidth(self) -> float:
        """bytes/s of the fastest read stream: the memory roof, and the rate every floor divides by."""
        return self.read_bytes / self.read.min

    @property
    def copy_bandwidth(self) -> float:
        """bytes/s (read + written) of the fastest copy: STREAM's convention, below the read stream."""
        return self.copy_bytes / self.copy.min

    @property
    def gemm_peak(self) -> float:
        """FLOP/s of the fastest float32 matmul: the compute roof."""
        return self.gemm_flops / self.gemm.min

    @property
    def ridge(self) -> float:
        """FLOP per byte where the two roofs meet: GEMM peak / read bandwidth."""
        return self.gemm_peak / self.read_bandwidth

    def floor_seconds(self, nbytes: float) -> float:
        """The least time reading `nbytes` can take here: a step that reads them cannot be faster."""
        return nbytes / self.read_bandwidth

    def line(self) -> str:
        """One line every run that uses the profile prints, and tests read back (PROFILE_LINE)."""
        def rate(units: float, timing: Timing, scale: float) -> str:
            return (f"{units / timing.min / scale:.1f} (median {units / timing.median / scale:.1f}, spread "
                    f"{timing.relative_spread:.0%})")
        return (f"machine profile ({self.label}, {self.measured} UTC, best of {len(self.read.samples)}): "
                f"read {rate(self.read_bytes, self.read, GB)} GB/s; copy {rate(self.copy_bytes, self.copy, GB)} "
                f"GB/s (read + write); GEMM {rate(self.gemm_flops, self.gemm, GFLOP)} GFLOP/s; ridge "
                f"{self.ridge:.2f} FLOP/byte (GEMM / read)")

    def to_json(self) -> dict:
        return {"label": self.label, "measured": self.measured,
                "read": {"bytes": self.read_bytes, "seconds": list(self.read.samples)},
                "copy": {"bytes": self.copy_bytes, "seconds": list(self.copy.samples)},
                "gemm": {"flops": self.gemm_flops, "seconds": list(self.gemm.samples)}}

    @classmethod
    def from_json(cls, data: dict) -> MachineProfile:
        return cls(data["label"], data["measured"], int(data["read"]["bytes"]), Timing(tuple(data["read"]["seconds"])),
                   int(data["copy"]["bytes"]), Timing(tuple(data["copy"]["seconds"])),
                   float(data["gemm"]["flops"]), Timing(tuple(data["gemm"]["seconds"])))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")

    @classmethod
    def load(cls, path: Path) -> MachineProfile:
        return cls.from_json(json.loads(Path(path).read_text()))


def measure_profile(xp=numpy, repeats: int = 10, copy_bytes: int = 256 * 2**20,
                    read_bytes: int | None = None) -> MachineProfile:
    """Time the read stream, the copy and the matmul `repeats` times each, in turns (measure.interleaved), so a
    busy moment of the machine slows all three alike instead of one of them. The read stream is twice the copy's
    array unless given: the copy touches its bytes twice (read + write), so both move about as many."""
    read_bytes = 2 * copy_bytes if read_bytes is None else read_bytes
    (read, read_call_), (copy, copy_call_), (flops, gemm_call_) = (read_call(xp, read_bytes),
                                                                    copy_call(xp, copy_bytes), gemm_call(xp))
    timings = interleaved({"read": read_call_, "copy": copy_call_, "gemm": gemm_call_}, repeats, sync=sync_for(xp))
    when = datetime.datetime.now(datetime.timezone.utc)
    return MachineProfile(machine_label(), f"{when:%Y-%m-%d %H:%M}", read, timings["read"], copy, timings["copy"],
                          flops, timings["gemm"])


def machine_profile(xp=numpy, repeats: int = 10, **sizes) -> tuple[MachineProfile, bool]:
    """(the profile, measured_here): read from $MINITRANSFORMER_MACHINE_PROFILE when a caller measured it once for
    a set of runs (make_transcripts.py, so every transcript, figure and README table quotes the same numbers),
    else measured now."""
    given = os.environ.get(PROFILE_ENV)
    if given:
        return MachineProfile.load(Path(given)), False
    return measure_profile(xp, repeats, **sizes), True
