"""The measurements behind figures/*.png (viz.py draws them): each a sweep of the engine itself on this machine.

Kept apart from the drawings so a reader can rerun a measurement without matplotlib, and viz.py stays a short read.
Every timing follows measure.py's rules: a warm-up call first, then repeats, and the fastest repeat is the figure
drawn (noise on a shared machine only adds time), with the median and the slowest kept next to it; the two
contenders of a comparison (with and without the KV cache) run in turns. `minitransformer figures` watches the
whole sweep with a measure.Probe and refuses to draw a timed figure from a busy run (viz.make_figures).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..core.decode import decode_step
from ..core.generate import generate
from ..core.kv_cache import KVCache
from ..core.prefill import prefill
from ..core.sampling_params import SamplingParams
from ..no_cache import RecomputeRunner
from .measure import Timing, interleaved, time_calls
from .peaks import MachineProfile, machine_profile

TEXT = ("The history of the printing press begins in the fifteenth century, when movable metal type changed how "
        "books were made, how much they cost, and who could read them. ")

@dataclass(frozen=True)
class Sweep:
    """What each figure measures; FULL fits in about 3 minutes on 2 cores, QUICK in seconds."""
    prompt_lengths: tuple[int, ...]
    context_lengths: tuple[int, ...]
    decode_steps: int            # decode steps timed per context length (the fastest is plotted)
    repeats: int                 # TTFT runs per prompt length (the fastest is plotted)
    no_cache_tokens: int         # new tokens of the cache vs no-cache request
    kv_lengths: tuple[int, ...]  # prompt lengths whose cache bytes are measured, per batch size
    kv_batches: tuple[int, ...]
    copy_bytes: int              # the profile's copy; its read stream is twice as large
    step_runs: int = 1           # requests each way, in turns, of the cache vs no-cache figure (per step: fastest)
    profile_repeats: int = 10    # repeats of each machine-profile timing


FULL = Sweep((32, 64, 128, 256, 512, 1024), (32, 256, 512, 1024, 2048), 5, 3, 128, (16, 64, 128), (1, 4, 16),
             256 * 2**20, step_runs=3)
QUICK = Sweep((8, 32), (8, 32), 2, 1, 6, (4, 8), (1, 4), 32 * 2**20, profile_repeats=2)


def text_ids(model, n: int) -> list[int]:
    ids = model.tokenizer.encode(TEXT * (n // 25 + 2))
    return ids[:n]


# ---------------------------------------------------------------------------------------------------- measure

def _repeat(run, repeats: int) -> list:
    """What `repeats` calls of run() returned, after one warm-up call whose result is dropped (measure.time_calls
    makes the calls: its warm-up first, then the repeats)."""
    results = []
    time_calls(lambda: results.append(run()), repeats=repeats, warmup=1)
    return results[1:]


def _spread(key: str, timing: Timing) -> dict:
    """{key: fastest, key_median: median, key_max: slowest} in seconds: the figure and how far to trust it."""
    stem = key.removesuffix("_s")
    return {key: timing.min, f"{stem}_median_s": timing.median, f"{stem}_max_s": timing.max}


def measure_ttft(model, sweep: Sweep, tick) -> dict:
    """prompt tokens -> TTFT and prefill seconds of a 1-token request (generate's own metrics): fastest of
    `repeats` runs after a warm-up at the same length, with the median and the slowest."""
    columns: dict[str, list[float]] = {}
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for n in sweep.prompt_lengths:
        ids = text_ids(model, n)
        runs = [result.metrics for result in _repeat(lambda ids=ids: generate(model, ids, params), sweep.repeats)]
        for key, values in (_spread("ttft_s", Timing(tuple(m.ttft_s for m in runs))) | _spread(
                "prefill_s", Timing(tuple(m.prefill_s for m in runs)))).items():
            columns.setdefault(key, []).append(values)
        tick()
    return {"tokens": list(sweep.prompt_lengths), **columns, "repeats": sweep.repeats}


def measure_itl(model, sweep: Sweep, tick) -> dict:
    """context tokens -> seconds of one decode_step with that many tokens already cached: measure.time_calls, one
    warm-up step then `decode_steps` timed ones (each adds a token, so the context grows by at most that many)."""
    columns: dict[str, list[float]] = {}
    for n in sweep.context_lengths:
        cache = KVCache(model.config, n + sweep.decode_steps + 1, xp=model.xp)
        prefill(model, text_ids(model, n), cache)
        timing = time_calls(functools.partial(decode_step, model, [42], cache), repeats=sweep.decode_steps, warmup=1)
        for key, value in _spread("itl_s", timing).items():
            columns.setdefault(key, []).append(value)
        tick()
    return {"tokens": list(sweep.context_lengths), **columns, "steps": sweep.decode_steps}


def measure_cache_vs_no_cache(model, sweep: Sweep, tick) -> dict:
    """Per-step seconds of one greedy request with the cache and without it (the same tokens, checked): `step_runs`
    requests each way, in turns (measure.interleaved), each step the fastest of its runs; the requests' totals as
    Timings. make_figures' warm-up comes before; a warm-up of its own would cost a whole no-cache request."""
    params = SamplingParams(max_tokens=sweep.no_cache_tokens, temperature=0.0, ignore_eos=True)
    prompt = text_ids(model, 32)
    results: dict[str, list] = {"with_cache": [], "no_cache": []}

    def request(key: str, use_cache: bool):
        def run():
            results[key].append(generate(model, prompt, params, runner=None if use_cache else RecomputeRunner))
            tick()
        return run
    totals = interleaved({"with_cache": request("with_cache", True), "no_cache": request("no_cache", False)},
                         repeats=sweep.step_runs, warmup=0)
    tokens = {tuple(r.token_ids) for runs in results.values() for r in runs}
    if len(tokens) != 1:
        raise RuntimeError("cache and no-cache tokens differ: the comparison is void")
    out: dict[str, Any] = {"prompt_tokens": len(prompt), "runs": sweep.step_runs}
    for key, runs in results.items():
        steps = [[r.metrics.prefill_s] + list(r.metrics.itl_s) for r in runs]   # step 0 = prefill + first sample
        out[f"{key}_s"] = [min(column) for column in zip(*steps)]
        out[f"{key}_total"] = totals[key]
    return out


def measure_kv_bytes(model, sweep: Sweep, tick) -> dict:
    """KVCache.bytes_used after prefilling `batch` copies of a prompt, at a few lengths and batch sizes."""
    measured = []
    for batch in sweep.kv_batches:
        for n in sweep.kv_lengths:
            cache = KVCache(model.config, n, batch=batch, xp=model.xp)
            prefill(model, np.asarray([text_ids(model, n)] * batch), cache)
            measured.append((batch, n, cache.bytes_used))
            cache.release()
        tick()
    return {"measured": measured}


def measure_peaks(model, sweep: Sweep, tick) -> MachineProfile:
    """This machine's profile (read bandwidth, copy bandwidth, GEMM FLOP/s), or the one a caller measured once for
    a whole set of runs ($MINITRANSFORMER_MACHINE_PROFILE, peaks.machine_profile): figures and transcripts made
    together quote one set of numbers. The floors and the memory roof divide by the read bandwidth."""
    profile, _ = machine_profile(model.xp, repeats=sweep.profile_repeats, copy_bytes=sweep.copy_bytes)
    tick()
    tick()
    return profile


# ---------------------------------------------------------------------------------------------------- draw


# ---------------------------------------------------------------------------------------------------- record

def save_measurements(path: Path, measured: dict[str, Any], run: dict[str, Any]) -> None:
    """Write every measurement of this run to `path` as JSON, each with `run` (machine, model, quietness): the
    numbers the figures draw, which figures/README.md quotes. A partial run (--only) replaces only its own."""
    record = {key: {**run, "data": jsonable(value)} for key, value in measured.items()}
    old = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**old, **record}, indent=1) + "\n")


def jsonable(value: Any) -> Any:
    """A measurement as JSON can hold it: dataclasses and objects as their fields, tuple keys as 'a, b', arrays as
    lists, a MachineProfile as its own JSON."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {(", ".join(map(str, k)) if isinstance(k, tuple) else str(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)
