"""The Engine under load, in-process: requests arrive at Poisson times while the engine steps (lesson 14 and the
figure serving_tradeoff.png both run this one loop).

    workload         n prompts of 16..max_prompt tokens cut from one text, each asking max_tokens (the same for
                     every configuration, so configurations compare)
    arrival_offsets  when each request arrives, in seconds after the start (bench/serve_workload.py's Poisson gaps)
    serve_arrivals   the server's engine loop in real time: add each request when its time has come, step while
                     there is work, sleep until the next arrival otherwise
    rates_for_this_machine
                     --rates auto: a light and a heavy arrival rate from what this machine serves, all requests
                     at once
    summarize        one run -> throughput, the waits' percentiles over its requests, the KV memory it held, and the
                     throughput its own median request implies (replay_wall)
    sweep            every (rate, max_num_seqs) configuration `repeats` times, in turns (measure.interleaved)
    arrival_bound    the most output tokens/s a rate's arrivals allow: nothing can finish before it has arrived

`minitransformer serve`'s engine thread runs the same loop between HTTP requests, and `minitransformer bench serve`
measures the same quantities over HTTP; here there is no network, so what is measured is the engine and its
scheduler alone.
"""

from __future__ import annotations

import heapq
import time

import numpy as np

from ..core.metrics import now, percentile
from ..core.request import Result
from ..core.sampling_params import SamplingParams
from ..serving import Engine
from .measure import Timing, interleaved

TEXT = ("The old lighthouse keeper climbed the stairs every evening to light the lamp. Ships passed in the dark, "
        "their crews trusting a light they never saw being lit. One winter a storm cut the island off for a month, "
        "and the keeper wrote down everything he remembered about the sea, the birds and the people who had lived "
        "there before him. ") * 6
AT_BOUND = 0.80       # "limited by the arrivals": at least 80% of the most the arrivals allow (that bound serves the
                      # last request alone at the fastest service any request got: no run can quite reach it)
LIGHT, HEAVY = 0.5, 3.0   # --rates auto: the light and heavy arrival rates as fractions of what this machine serves


def poisson_gaps(rate: float, n: int, seed: int) -> np.ndarray:
    """n gaps in seconds between arrivals: exponential with mean 1/rate (Poisson arrivals), zeros when rate is inf."""
    if rate <= 0:
        raise ValueError(f"request rate must be > 0, got {rate}")
    if np.isinf(rate):
        return np.zeros(n)
    return np.random.default_rng(seed).exponential(1.0 / rate, size=n)


def load_label(rate: float) -> str:
    """How a rate reads in a table or a legend: inf means every request arrives at the start."""
    return "all requests at once" if np.isinf(rate) else f"{rate:g} requests/s"


def workload(tokenizer, n: int, max_prompt: int, max_tokens: int, seed: int) -> list[tuple[list[int], int]]:
    """n requests: (prompt ids of 16..max_prompt tokens, max_tokens), the same for every configuration."""
    rng, ids = np.random.default_rng(seed), tokenizer.encode(TEXT)
    lengths = rng.integers(16, max_prompt + 1, n)
    starts = rng.integers(0, len(ids) - max_prompt, n)
    return [(ids[s:s + p], max_tokens) for s, p in zip(starts, lengths)]


def arrival_offsets(n: int, rate: float, seed: int) -> np.ndarray:
    """Poisson arrivals: exponential gaps with mean 1/rate seconds (none when rate is inf); the first request
    arrives at 0. -> (n,) seconds after the start."""
    gaps = poisson_gaps(rate, n, seed + 1)                                # (n,) the first gap is not used
    return np.concatenate([[0.0], np.cumsum(gaps[1:])])


def serve_arrivals(model, requests, offsets, max_num_seqs: int,
                   num_blocks=None) -> tuple[dict[str, Result], Engine, float, int]:
    """The server's engine loop, in real time: add each request when its arrival time has come, step while there
    is work, sleep until the next arrival otherwise. -> (results by request id, the engine, the wall time, the most
    KV blocks held at once)."""
    engine = Engine(model, max_num_seqs=max_num_seqs, num_blocks=num_blocks, enable_prefix_caching=False)
    start, pending, peak_blocks = now(), list(range(len(requests))), 0
    results: dict[str, Result] = {}
    while pending or engine.has_unfinished_requests():
        while pending and now() - start >= offsets[pending[0]]:
            i = pending.pop(0)
            prompt, max_tokens = requests[i]
            engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                               request_id=f"r{i:02d}", arrival_time=start + offsets[i])   # queue counts from here
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.result is not None:                     # finished
                    results[out.request_id] = out.result
            bm = engine.block_manager
            peak_blocks = max(peak_blocks, bm.num_blocks - bm.num_free_blocks)
        else:
            time.sleep(max(0.0, offsets[pending[0]] - (now() - start)))
    return results, engine, now() - start, peak_blocks


def rates_for_this_machine(model, requests, slots: int, num_blocks=None) -> tuple[float, float, float, float]:
    """--rates auto (lesson 14, serving_tradeoff.png): the two arrival rates from what this machine serves. With
    every request arriving at once, `slots` slots deliver the most tokens per second it can (after an untimed
    warm-up); over the tokens a request asks for, that is the most requests per second it keeps up with. Light load
    is LIGHT of it (the slots keep up: lesson 14's claim light-at-bound), heavy load HEAVY times it (requests queue
    for slots). Fixed rates would be different loads on different machines: 2 requests/s was light on a 2-core
    machine that served about 3 per second, and beyond what a slower one served (26 of the 46 tok/s its arrivals
    allowed). -> (tok/s, requests/s, light, heavy)."""
    serve_arrivals(model, requests[:2], np.zeros(2), slots, num_blocks)                 # first-call costs, untimed
    results, _, wall, _ = serve_arrivals(model, requests, np.zeros(len(requests)), slots, num_blocks)
    tokens = sum(len(r.token_ids) for r in results.values())
    tok_s = tokens / wall
    per_second = tok_s / (tokens / len(requests))                  # requests/s: tok/s over tokens per request
    two_digits = lambda x: float(f"{x:.2g}")                        # a rate a reader can type back
    return tok_s, per_second, two_digits(LIGHT * per_second), two_digits(HEAVY * per_second)


def replay_wall(offsets, service: float, slots: int) -> float:
    """When the last request would finish if every request took `service` seconds once it had a slot: first come,
    first served on `slots` slots, the arrivals as they were. What the run's own typical request implies."""
    free = [0.0] * slots                                               # when each slot is next free
    finish = 0.0
    for arrival in sorted(offsets):
        start = max(arrival, heapq.heappop(free))
        heapq.heappush(free, start + service)
        finish = max(finish, start + service)
    return finish


def summarize(results, engine, wall: float, peak_blocks: int, offsets, slots: int) -> dict:
    """Throughput (all generated tokens / the run's wall time), the three waits (p50 / p99 over the requests) and
    the throughput the run's median service time (first scheduled -> finished) implies when replayed on the same
    arrivals. ttft_s keeps every request's TTFT, the numbers ttft99 is the 99th percentile of."""
    rs = list(results.values())
    pct = percentile
    queue = [r.metrics.queue_s for r in rs]
    service = [r.metrics.e2e_s - r.metrics.queue_s for r in rs]
    ttft = [r.metrics.ttft_s for r in rs]
    itl = np.concatenate([r.metrics.itl_s for r in rs])                 # (all gaps of all requests,)
    tokens = sum(len(r.token_ids) for r in rs)
    return {"tok_s": tokens / wall, "implied": tokens / replay_wall(offsets, Timing(tuple(service)).median, slots),
            "queue50": pct(queue, 50), "queue99": pct(queue, 99),
            "prefill50": pct([r.metrics.prefill_s for r in rs], 50),
            "decode50": pct([r.metrics.e2e_s - r.metrics.ttft_s for r in rs], 50),
            "ttft99": pct(ttft, 99), "itl50": pct(itl, 50), "itl99": pct(itl, 99),
            "preemptions": engine.stats.num_preemptions, "fastest_service": min(service), "tokens": tokens,
            "wall_s": wall, "ttft_s": ttft,
            "kv_mib": engine.kv_bytes(peak_blocks * engine.block_manager.block_size) / 2**20}


def sweep(model, requests, offsets: dict, sizes, repeats: int, num_blocks=None,
          tick=lambda: None) -> dict[tuple[float, int], list[dict]]:
    """Every (rate, max_num_seqs) configuration run `repeats` times in turns (run r of each before run r + 1 of
    any, so a busy moment hits them alike), after one untimed warm-up. `offsets` maps each rate to its arrival
    offsets. -> {(rate, max_num_seqs): [summarize() of each run]}."""
    serve_arrivals(model, requests[:2], np.zeros(2), max(sizes), num_blocks)   # warm-up: first-call costs, untimed
    runs: dict[tuple[float, int], list[dict]] = {(rate, m): [] for rate in offsets for m in sizes}

    def configuration(rate, m):
        def run():
            result = serve_arrivals(model, requests, offsets[rate], m, num_blocks)
            runs[rate, m].append(summarize(*result, offsets[rate], m))
            tick()
        return run

    interleaved({f"{rate:g}/{m}": configuration(rate, m) for rate, m in runs}, repeats=repeats, warmup=0)
    return runs


def spread_of(runs: list[dict], key: str, higher_is_better: bool = False) -> tuple[float, float, float]:
    """(best, median, spread) of one number over a configuration's runs: the best run is the one a quiet machine
    gives (noise only slows a run down), the spread (max - min) says how far to trust a difference."""
    timing = Timing(tuple(r[key] for r in runs))
    return (timing.max if higher_is_better else timing.min), timing.median, timing.spread


def fastest_service(runs: dict, rate: float) -> float:
    """The shortest first-scheduled -> finished time any request got at `rate`, in any configuration."""
    return min(s["fastest_service"] for (r, _), done in runs.items() if r == rate for s in done)


def arrival_bound(runs: dict, offsets: dict, rate: float) -> float:
    """The most output tokens/s `rate`'s arrivals allow: every token of a run, over the last arrival plus the
    fastest service any request got at that rate. No run can beat it, whatever its slots."""
    tokens = next(done[0]["tokens"] for (r, _), done in runs.items() if r == rate)
    return tokens / (float(offsets[rate][-1]) + fastest_service(runs, rate))
