"""`minitransformer bench engine`: how fast bench serve's workload could run, given our own offline rates, next to
what the Engine alone and the HTTP server achieve on it.

The workload is bench serve's (serve_workload.make_prompts: mixed 16/64/200-word slices of a real text), each
request max_tokens 48 with ignore_eos, all of them queued at once, max_num_seqs 16. Reading order:

    measure_prefill   each distinct prompt length, prefilled alone through Engine.step (one sequence, prefix cache
                      off): seconds per prompt length
    measure_decode    decode-only Engine steps at batch size B over the workload's own contexts (B of its prompts
                      run to max_tokens; the step_log's durations of the steps that decoded all B): seconds per step
    predict_seconds   the bound: every step the scheduler really ran (the Engine's step_log) predicted from those
                      rates and summed (a pure function: the tests feed it a synthetic log)
    measure_engine    Engine(model, max_num_seqs).run() on the workload, timed by measure.time_calls' rules (one
                      untimed run, then repeats: fastest, median, spread), each on a fresh Engine
    measure_server    optional: the same workload all at once through bench serve's client against a URL, as
                      many runs as the engine's (each with fresh text of the same lengths), the fastest kept
    run_engine_bench  all of it -> one dict, which print_table and write_json show

Quietness (measure.Probe) is watched twice: over the engine and its offline rates, and over the server's run, where
a server on this machine (found by its port) is this run's own work, not another program's.

How a step is predicted: its prefill tokens at the workload's prefill rate (the seconds of prefilling each of its
prompts alone, summed, over their tokens), plus, when it decodes, one decode step at its decode batch size
(linear between the batch sizes measured). A mixed step (prefill chunks riding along with decodes) pays the fixed
per-step work twice in this sum, once in each measured rate: the bound is a little generous to the engine there.
The engine's ratio to the bound (predicted / engine seconds) says how much of the engine's time is the cost of its
parts; the server's to the engine's (engine / server seconds), how much HTTP, streaming and its event loop add.
"""

from __future__ import annotations

import asyncio
import functools
from bisect import bisect_left

from ..core.metrics import now
from ..core.request import make_request
from ..core.sampling_params import SamplingParams
from ..lab.measure import Probe, Quietness, Timing, time_calls
from ..serving.engine import Engine
from .serve_workload import ServeSettings, make_prompts

ENGINE_TARGET = 0.85     # the targets: engine >= 0.85x of its bound, server >= 0.95x of the engine
SERVER_TARGET = 0.95


def workload_params(max_tokens: int) -> SamplingParams:
    """Greedy, every request runs to max_tokens (bench serve's --ignore-eos), so the work does not depend on text."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def prompt_lengths(model, prompts: list[str], max_tokens: int) -> list[int]:
    """Each prompt's token count, tokenized exactly as the Engine tokenizes it."""
    return [len(make_request(model, p, workload_params(max_tokens)).prompt_token_ids) for p in prompts]


# ------------------------------------------------------------------------------------------------ offline rates

def measure_prefill(model, prompts: list[str], max_tokens: int, repeats: int) -> dict[int, Timing]:
    """{prompt tokens: Timing of one prefill step}, one prompt of each distinct length, each prefilled alone.

    One sequence in an Engine of one slot, max_tokens 1: its only step is the whole prompt's prefill (the budget
    of 512 tokens holds any prompt here) and the sampling of its one token, through the same model_runner path the
    workload takes. The prefix cache is off, or the repeats would skip the prefill they time."""
    engine = Engine(model, max_num_seqs=1, enable_prefix_caching=False)
    one_token = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    by_length = dict(zip(prompt_lengths(model, prompts, max_tokens), prompts))

    def prefill(prompt: str) -> None:
        engine.add_request(prompt, one_token)
        engine.run()

    return {length: time_calls(functools.partial(prefill, prompt), repeats=repeats)
            for length, prompt in sorted(by_length.items())}


def measure_decode(model, prompts: list[str], batch: int, max_tokens: int, repeats: int) -> Timing:
    """Seconds per decode-only step at `batch` sequences, over the workload's own contexts: each repeat runs
    `batch` of its prompts to max_tokens in an Engine of `batch` slots, and its sample is the mean duration (the
    step_log's) of the steps that decoded all `batch` and prefilled nothing, their contexts growing from the prompt
    to prompt + max_tokens. One warm-up repeat is dropped."""
    chosen = [prompts[i % len(prompts)] for i in range(batch)]
    samples = []
    for attempt in range(repeats + 1):
        engine = Engine(model, max_num_seqs=batch, enable_prefix_caching=False)
        for prompt in chosen:
            engine.add_request(prompt, workload_params(max_tokens))
        engine.run()
        full = [r.duration_s for r in engine.step_log if r.num_prefill_tokens == 0 and r.num_decode_tokens == batch]
        if attempt and full:
            samples.append(sum(full) / len(full))
    if not samples:
        raise ValueError(f"no decode-only step ran at batch {batch}: raise max_tokens above 1")
    return Timing(tuple(samples))


def decode_batches(step_batches: list[int]) -> list[int]:
    """The batch sizes to measure decode at: 1, the powers of two below the largest, and the largest that the step
    log holds; the others are interpolated (step time is close to linear in the batch size here)."""
    largest = max(step_batches, default=0)
    if largest == 0:
        return []
    sizes = {1, largest}
    size = 2
    while size < largest:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


# ------------------------------------------------------------------------------------------------ the bound

def decode_step_seconds(batch: int, measured: dict[int, float]) -> float:
    """Seconds of one decode step at `batch`, linear between the nearest measured batch sizes (flat outside)."""
    sizes = sorted(measured)
    if batch in measured:
        return measured[batch]
    i = bisect_left(sizes, batch)
    if i == 0:
        return measured[sizes[0]]
    if i == len(sizes):
        return measured[sizes[-1]]
    low, high = sizes[i - 1], sizes[i]
    return measured[low] + (measured[high] - measured[low]) * (batch - low) / (high - low)


def prefill_seconds_per_token(lengths: list[int], prefill_s: dict[int, float]) -> float:
    """The workload's prefill rate: every prompt prefilled alone at its measured time, over all their tokens."""
    return sum(prefill_s[n] for n in lengths) / sum(lengths)


def predict_seconds(steps: list[tuple[int, int]], s_per_prefill_token: float,
                    decode_s: dict[int, float]) -> dict:
    """The bound for a run whose steps were (prefill tokens, decode tokens): each step's prefill tokens at the
    prefill rate plus, if it decodes, one decode step at its batch -> {"prefill_s", "decode_s", "total_s",
    "steps": {"prefill_only", "decode_only", "mixed"}, "decode_steps_by_batch": {batch: count}}."""
    prefill = decode = 0.0
    kinds = {"prefill_only": 0, "decode_only": 0, "mixed": 0}
    by_batch: dict[int, int] = {}
    for prefill_tokens, decode_tokens in steps:
        prefill += prefill_tokens * s_per_prefill_token
        if decode_tokens:
            decode += decode_step_seconds(decode_tokens, decode_s)
            by_batch[decode_tokens] = by_batch.get(decode_tokens, 0) + 1
        kind = "mixed" if prefill_tokens and decode_tokens else "decode_only" if decode_tokens else "prefill_only"
        kinds[kind] += bool(prefill_tokens or decode_tokens)
    return {"prefill_s": prefill, "decode_s": decode, "total_s": prefill + decode, "steps": kinds,
            "decode_steps_by_batch": dict(sorted(by_batch.items()))}


# ------------------------------------------------------------------------------------------------ what runs

def measure_engine(model, prompts: list[str], max_num_seqs: int, max_tokens: int,
                   repeats: int) -> tuple[Timing, Engine]:
    """Engine(model, max_num_seqs).run() with every prompt queued at once, timed from the queueing (tokenizing
    included, as a server pays it) to the last token, after one untimed run (measure.time_calls' rule). Each run
    gets a fresh Engine, built before the clock starts (a server builds its one at start-up), so no run reuses
    another's prefix cache. -> (Timing, the last run's Engine, whose step_log the bound is summed over)."""
    samples = []
    for attempt in range(repeats + 1):
        engine = Engine(model, max_num_seqs=max_num_seqs)
        start = now()
        for prompt in prompts:
            engine.add_request(prompt, workload_params(max_tokens))
        results = engine.run()
        seconds = now() - start
        if len(results) != len(prompts) or any(len(r.token_ids) != max_tokens for r in results.values()):
            raise RuntimeError("the engine did not finish every request at max_tokens")
        if attempt:
            samples.append(seconds)
    return Timing(tuple(samples)), engine


def measure_server(url: str, settings: ServeSettings) -> tuple[dict, Quietness]:
    """The same prompts, all at once, through bench serve's client, once per rate in settings.rates (the caller
    asks for as many runs as the engine had: the fastest of N on both sides) -> ({"wall_s": the fastest run,
    "samples_s", "completed", ...} over all runs, the quietness over them). Each run sends text of its own
    (bench serve's rule: a rerun of the same prompts would be served from the prefix cache), of the same lengths.
    A server on this machine is not another program: its CPU time is taken out of the others' share."""
    from .serve import run_sweep
    from .serve_report import summarize

    pid = listening_pid(url)
    probe = Probe(pids=(pid,) if pid else ())
    runs = asyncio.run(run_sweep(url, settings))["runs"]
    quiet = probe.finish()
    summaries = [summarize(run["records"], run["wall_s"], settings) for run in runs]
    walls = [run["wall_s"] for run in runs]
    return ({"url": url, "wall_s": min(walls), "samples_s": walls,
             "completed": sum(s["completed"] for s in summaries), "failed": sum(s["failed"] for s in summaries),
             "output_tokens": sum(s["output_tokens"] for s in summaries),
             "errors": [e for s in summaries for e in s["errors"]][:3], "server_pid": pid}, quiet)


def listening_pid(url: str) -> int | None:
    """The process listening on the URL's loopback port, or None (another machine, not Linux, not ours to read).
    Found as `ss -lp` finds it: the port's listening socket in /proc/net/tcp*, then the process holding it."""
    import os
    from urllib.parse import urlsplit

    parts = urlsplit(url if "//" in url else f"http://{url}")
    if parts.hostname not in ("127.0.0.1", "localhost", "::1") or parts.port is None:
        return None
    sockets = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()                  # sl, local "ADDR:PORT" (hex), remote, state (0A: listening), ...
            if int(fields[1].rsplit(":", 1)[1], 16) == parts.port and fields[3] == "0A":
                sockets.add(f"socket:[{fields[9]}]")
    for pid in filter(str.isdigit, os.listdir("/proc") if sockets else []):
        try:
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in sockets for fd in os.listdir(f"/proc/{pid}/fd")):
                return int(pid)
        except OSError:                           # gone meanwhile, or another user's
            continue
    return None


def _timing_json(t: Timing) -> dict:
    return {"min_s": t.min, "median_s": t.median, "spread_s": t.spread, "samples_s": list(t.samples)}


def run_engine_bench(model, num_prompts: int = 32, seed: int = 0, max_tokens: int = 48, max_num_seqs: int = 16,
                     prompt_words: tuple[int, ...] = ServeSettings.prompt_words, repeats: int = 3,
                     url: str | None = None, progress=print) -> dict:
    """Measure the engine on the workload, then the offline rates its steps need, then (with a URL) the server;
    the machine's quietness over all of it. -> the dict print_table and write_json show."""
    prompts = make_prompts(num_prompts, seed, prompt_words)
    lengths = prompt_lengths(model, prompts, max_tokens)
    probe = Probe()
    progress(f"engine: {num_prompts} requests at once, max_num_seqs {max_num_seqs}, {repeats} runs")
    engine_t, engine = measure_engine(model, prompts, max_num_seqs, max_tokens, repeats)
    steps = [(r.num_prefill_tokens, r.num_decode_tokens) for r in engine.step_log]
    progress(f"prefill: {len(set(lengths))} prompt lengths, alone")
    prefill = measure_prefill(model, prompts, max_tokens, repeats)
    decode = {}
    for batch in decode_batches([d for _, d in steps]):
        progress(f"decode: batch {batch}")
        decode[batch] = measure_decode(model, prompts, batch, max_tokens, repeats)
    bound = predict_seconds(steps, prefill_seconds_per_token(lengths, {n: t.min for n, t in prefill.items()}),
                            {b: t.min for b, t in decode.items()})
    quiet = probe.finish()
    server = server_quiet = None
    if url:
        progress(f"server: the same workload at once through {url}, {repeats} runs")
        server, server_quiet = measure_server(url, ServeSettings(
            rates=(float("inf"),) * repeats, num_prompts=num_prompts, seed=seed, max_tokens=max_tokens, ignore_eos=True,
            prompt_words=prompt_words))
    return {
        "settings": {"num_prompts": num_prompts, "seed": seed, "max_tokens": max_tokens, "max_num_seqs": max_num_seqs,
                     "prompt_words": list(prompt_words), "repeats": repeats, "url": url},
        "workload": {"prompt_tokens": sum(lengths), "output_tokens": num_prompts * max_tokens,
                     "prompt_lengths": lengths},
        "prefill_s_by_length": {str(n): _timing_json(t) for n, t in prefill.items()},
        "decode_step_s_by_batch": {str(b): _timing_json(t) for b, t in decode.items()},
        "bound": bound,
        "steps": [list(step) for step in steps],              # (prefill tokens, decode tokens) of each engine step
        "engine": _timing_json(engine_t),
        "server": server,
        "ratios": ratios(bound["total_s"], engine_t.min, server["wall_s"] if server else None),
        "quietness": _quiet_json(quiet),                      # over the engine and its offline rates
        "server_quietness": server_quiet and _quiet_json(server_quiet),
    }


def _quiet_json(q: Quietness) -> dict:
    return {"line": q.line(), "quiet": q.quiet, "why_busy": q.why_busy()}


def ratios(bound_s: float, engine_s: float, server_s: float | None) -> dict:
    """Speeds relative to each other: engine / bound = bound seconds / engine seconds (1.0: the engine costs no
    more than its parts), server / engine = engine seconds / server seconds."""
    return {"engine_over_bound": bound_s / engine_s, "server_over_engine": engine_s / server_s if server_s else None}


# ------------------------------------------------------------------------------------------------ output

def seconds(value: float) -> str:
    """Three significant digits: 21.4, 0.153, 0.00412 (the real model's seconds and a tiny model's alike)."""
    return f"{value:.3g}"


def table_cells(result: dict) -> dict[str, str]:
    """The summary row's cells, formatted once: the table prints them and the tests read them back."""
    engine, server, r = result["engine"], result["server"], result["ratios"]
    return {
        "bound s": seconds(result["bound"]["total_s"]),
        "engine s (median, spread)": _spread_cell(Timing(tuple(engine["samples_s"]))),
        "engine / bound": f"{r['engine_over_bound']:.2f}",
        "server s (median, spread)": "-" if server is None else _spread_cell(Timing(tuple(server["samples_s"]))),
        "server / engine": "-" if r["server_over_engine"] is None else f"{r['server_over_engine']:.2f}",
    }


def _spread_cell(t: Timing) -> str:
    return f"{seconds(t.min)} ({seconds(t.median)}, {seconds(t.spread)})"


def verdicts(result: dict) -> list[str]:
    """One line per target, only when the machine was quiet over what it compares: on a busy one a ratio says
    nothing. The server's ratio needs both parts quiet (the engine's and the server's)."""
    engine_q, server_q, r = result["quietness"], result["server_quietness"], result["ratios"]
    if not engine_q["quiet"]:
        return [f"The machine was busy ({engine_q['why_busy']}): no verdict; close other programs and rerun."]
    lines = [_verdict("engine / bound", r["engine_over_bound"], ENGINE_TARGET)]
    if r["server_over_engine"] is not None:
        lines.append(_verdict("server / engine", r["server_over_engine"], SERVER_TARGET) if server_q["quiet"] else
                     f"The machine was busy while the server ran ({server_q['why_busy']}): no server verdict.")
    return lines


def _verdict(name: str, ratio: float, target: float) -> str:
    return f"{name} {ratio:.2f}: {'meets' if ratio >= target else 'misses'} the target {target}"


def print_table(result: dict, console) -> None:
    from rich.table import Table

    s, w, b = result["settings"], result["workload"], result["bound"]
    table = Table(title=f"bench engine: {s['num_prompts']} requests at once ({w['prompt_tokens']} prompt tokens, "
                        f"{w['output_tokens']} output), max_num_seqs {s['max_num_seqs']}; fastest of "
                        f"{s['repeats']} runs", title_justify="left")
    cells = table_cells(result)
    for name in cells:
        table.add_column(name, justify="right")
    table.add_row(*cells.values())
    console.print(table)
    by_batch = ", ".join(f"{n}x b{batch}" for batch, n in b["decode_steps_by_batch"].items())
    console.print(f"bound: prefill {seconds(b['prefill_s'])} s + decode {seconds(b['decode_s'])} s over the "
                  f"engine's steps ({b['steps']['prefill_only']} prefill, {b['steps']['mixed']} mixed, "
                  f"{b['steps']['decode_only']} decode-only; decode batches {by_batch})")
    server = result["server"]
    if server and server["failed"]:
        console.print(f"server: {server['failed']} of {s['num_prompts']} requests failed: {server['errors']}")
    console.print("engine and its rates: " + result["quietness"]["line"])
    if result["server_quietness"]:
        local = " (its own CPU time not counted as another program's)" if result["server"]["server_pid"] else ""
        console.print(f"server run{local}: " + result["server_quietness"]["line"])
    for line in verdicts(result):
        console.print(line)


def write_json(result: dict, path) -> None:
    import json
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
