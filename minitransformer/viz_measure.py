"""The measurements behind figures/*.png (viz.py draws them): each a sweep of the engine itself on this machine.

Kept apart from the drawings so a reader can rerun a measurement without matplotlib, and viz.py stays a short read.
"""

from __future__ import annotations

import os
import platform
import statistics
from dataclasses import dataclass

import numpy as np

from .bench.machine import measure_copy_bandwidth, measure_gemm_flops
from .decode import decode_step
from .generate import generate
from .kv_cache import KVCache
from .metrics import now
from .prefill import prefill
from .sampling_params import SamplingParams

TEXT = ("The history of the printing press begins in the fifteenth century, when movable metal type changed how "
        "books were made, how much they cost, and who could read them. ")

@dataclass(frozen=True)
class Sweep:
    """What each figure measures; FULL fits in about 3 minutes on 2 cores, QUICK in seconds."""
    prompt_lengths: tuple[int, ...]
    context_lengths: tuple[int, ...]
    decode_steps: int            # decode steps timed per context length (the median is plotted)
    repeats: int                 # TTFT runs per prompt length (the median is plotted)
    no_cache_tokens: int         # new tokens of the cache vs no-cache request
    kv_lengths: tuple[int, ...]  # prompt lengths whose cache bytes are measured, per batch size
    kv_batches: tuple[int, ...]
    copy_bytes: int
    gemm_n: int


FULL = Sweep((32, 64, 128, 256, 512, 1024), (32, 256, 512, 1024, 2048), 5, 3, 128, (16, 64, 128), (1, 4, 16),
             256 * 2**20, 1024)
QUICK = Sweep((8, 32), (8, 32), 2, 1, 6, (4, 8), (1, 4), 32 * 2**20, 256)


def machine_label() -> str:
    """The CPU model and core count, e.g. "AMD EPYC, 2 cores (x86_64)": every figure says where it was measured."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            name = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {os.cpu_count()} cores ({platform.machine()})"


def _ids(model, n: int) -> list[int]:
    ids = model.tokenizer.encode(TEXT * (n // 25 + 2))
    return ids[:n]


# ---------------------------------------------------------------------------------------------------- measure

def measure_ttft(model, sweep: Sweep, tick) -> dict:
    """prompt tokens -> median TTFT and prefill seconds of a 1-token request (generate's own metrics)."""
    ttft, prefill_s = [], []
    params = SamplingParams(max_tokens=1, temperature=0.0)
    for n in sweep.prompt_lengths:
        runs = [generate(model, _ids(model, n), params).metrics for _ in range(sweep.repeats)]
        ttft.append(statistics.median(m.ttft_s for m in runs))
        prefill_s.append(statistics.median(m.prefill_s for m in runs))
        tick()
    return {"tokens": list(sweep.prompt_lengths), "ttft_s": ttft, "prefill_s": prefill_s, "repeats": sweep.repeats}


def measure_itl(model, sweep: Sweep, tick) -> dict:
    """context tokens -> median seconds of one decode_step with that many tokens already cached."""
    itl = []
    for n in sweep.context_lengths:
        cache = KVCache(model.config, n + sweep.decode_steps + 1, xp=model.xp)
        prefill(model, _ids(model, n), cache)
        times = []
        for _ in range(sweep.decode_steps + 1):                  # the first step is a warm-up
            start = now()
            decode_step(model, [42], cache)
            times.append(now() - start)
        itl.append(statistics.median(times[1:]))
        tick()
    return {"tokens": list(sweep.context_lengths), "itl_s": itl}


def measure_cache_vs_no_cache(model, sweep: Sweep, tick) -> dict:
    """Per-step seconds of one greedy request with the cache and without it (the same tokens, checked)."""
    params = SamplingParams(max_tokens=sweep.no_cache_tokens, temperature=0.0, ignore_eos=True)
    prompt = _ids(model, 32)
    runs = {}
    for label, use_cache in (("with KV cache", True), ("no cache (recompute)", False)):
        result = generate(model, prompt, params, use_cache=use_cache)
        m = result.metrics
        runs[label] = (result.token_ids, [m.prefill_s] + m.itl_s)    # step 0 = prefill + first sample
        tick()
    (a, with_cache), (b, without) = runs.values()
    if a != b:
        raise RuntimeError("cache and no-cache tokens differ: the comparison is void")
    return {"prompt_tokens": len(prompt), "with_cache_s": with_cache, "no_cache_s": without}


def measure_kv_bytes(model, sweep: Sweep, tick) -> dict:
    """KVCache.bytes_used after prefilling `batch` copies of a prompt, at a few lengths and batch sizes."""
    measured = []
    for batch in sweep.kv_batches:
        for n in sweep.kv_lengths:
            cache = KVCache(model.config, n, batch=batch, xp=model.xp)
            prefill(model, np.asarray([_ids(model, n)] * batch), cache)
            measured.append((batch, n, cache.bytes_used))
            cache.release()
        tick()
    return {"measured": measured}


def measure_peaks(model, sweep: Sweep, tick) -> dict:
    bandwidth = measure_copy_bandwidth(model.xp, sweep.copy_bytes, repeats=3)
    tick()
    flops = measure_gemm_flops(model.xp, sweep.gemm_n, repeats=3)
    tick()
    return {"bandwidth": bandwidth, "flops": flops}


# ---------------------------------------------------------------------------------------------------- draw
