"""Lesson 08: static vs continuous batching: one workload, two schedulers, the same tokens; how many steps each
needs, what one step of several sequences costs, and what the clock says about throughput and waiting.

    python lessons/08_static_vs_continuous_batching.py [--requests 16] [--max-num-seqs 8] [--sweep 4,8,16]
                                                      [--max-prompt 96] [--max-output 40] [--repeats 3]
                                                      [--step-repeats 10] [--figure PATH]

Static batching (the pre-2022 way) forms a group of max_num_seqs requests and runs it until its *longest* member is
done: a finished member's slot sits idle and the queue waits behind it. Continuous batching (Orca, OSDI '22; vLLM)
schedules per iteration: a finished request leaves after its step and a waiting one joins the next. Both run here
through minitransformer.serving.Engine on the real model, greedy with ignore_eos, so both must produce the same tokens.

Steps and slot utilization do not depend on the machine. Wall-clock numbers do: every configuration runs the whole
workload --repeats times, in turns with the others (static, continuous, static, ... so a busy moment hits all of
them), after one untimed warm-up round. The lesson's claims (claims() below) are decided from the numbers it prints;
a timing claim is stated only when it holds beyond the spread of those runs and the machine was quiet
(minitransformer/lab/measure.py).

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import os
import platform
import re
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Column, Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import SamplingParams, load_model
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.lab.claims import Claim, find_numbers, report, table_with, winner_line
from minitransformer.lab.machine import H200
from minitransformer.lab.measure import Probe, interleaved
from minitransformer.serving import Engine

TEXT = ("A serving engine keeps many requests in flight at once. Each step it decides which requests run, gives each "
        "one a slice of the token budget, runs one forward pass over all of their tokens together, samples one new "
        "token per running request and streams it out. Requests arrive at any time, with short or long prompts, and "
        "ask for a few words or a long answer, so no two of them finish at the same moment. ") * 4
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read sections 1 and 2 side by side. Each row is a request and each column an engine step.",
    "Section 3's table gives what one engine step costs for each mix of sequences.",
    "Section 4's table sets static against continuous batching, and 4 against 8 and 16 slots.",
    "The claim lines under 'What this run shows' say which differences this run showed.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
CONTEXT = 64                 # tokens each sequence holds before part 3's timed steps (the H200 column's context too)
STEP_WARMUP = 2              # untimed rounds of part 3's steps before the timed ones


def workload(tokenizer, n, max_prompt, max_output, seed):
    """n requests with mixed prompt and output lengths: [(request id, prompt ids, max_tokens)], reproducible."""
    rng, ids = np.random.default_rng(seed), tokenizer.encode(TEXT)
    prompts = rng.integers(8, max_prompt + 1, n)
    outputs = np.where(rng.random(n) < 0.25, rng.integers(max_output // 2, max_output + 1, n),   # a quarter long
                       rng.integers(2, max(3, max_output // 4) + 1, n))                           # the rest short
    return [(f"r{i:02d}", ids[s % 50:s % 50 + p], int(o))
            for i, (p, o, s) in enumerate(zip(prompts, outputs, rng.integers(0, 10_000, n)))]


def serve(model, requests, policy, max_num_seqs):
    """Run the whole workload (all arriving now) through one Engine, stepping by hand to watch every step.
    Returns results {id: Result}, lanes {id: per-step chars} and the engine (its step_log)."""
    engine = Engine(model, max_num_seqs=max_num_seqs, policy=policy, enable_prefix_caching=False)
    for rid, prompt, max_tokens in requests:
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                           request_id=rid)
    results, lanes, admitted, started = {}, {rid: [] for rid, _, _ in requests}, set(), set()
    while engine.has_unfinished_requests():
        outputs = engine.step()
        scheduled = set(engine.step_log[-1].request_ids)
        admitted |= scheduled
        for rid, lane in lanes.items():       # P: prefill (no token out before this step), D: decode, .: queued
            lane.append("P" if rid in scheduled and rid not in started else "D" if rid in scheduled
                        else " " if rid in results else "-" if rid in admitted else ".")
        for out in outputs:
            started.add(out.request_id)
            if out.finished:
                results[out.request_id] = out.result
    return results, lanes, engine


def schedule(results, engine, max_num_seqs) -> dict:
    """What a run's schedule did, the same on any machine: steps, slot utilization (scheduled sequences / (steps x
    slots)), output tokens per step, and the most prompt tokens one step prefilled while it also decoded running
    requests (their next token waited for that prefill)."""
    log = engine.step_log
    busy = sum(len(r.request_ids) for r in log)
    tokens = sum(len(r.token_ids) for r in results.values())
    beside = max([r.num_prefill_tokens for r in log if r.num_decode_tokens and r.num_prefill_tokens], default=0)
    return {"steps": len(log), "util": busy / (len(log) * max_num_seqs), "tokens": tokens,
            "tok_step": tokens / len(log), "beside": beside}


def latencies(results) -> dict:
    """TTFT and ITL percentiles of one run, in seconds."""
    ttft = [r.metrics.ttft_s for r in results.values()]
    itl = np.concatenate([r.metrics.itl_s for r in results.values()])
    return {"ttft50": np.percentile(ttft, 50), "ttft99": np.percentile(ttft, 99),
            "itl50": np.percentile(itl, 50), "itl99": np.percentile(itl, 99)}


def draw(path, runs, requests, max_num_seqs):
    """One panel per policy: each request's life as bars on a step axis (queued, prefill, decode)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.2 + 0.22 * len(requests) * len(runs)), sharex=True)
    colors = {".": "#dddddd", "P": "#d62728", "D": "#1f77b4", "-": "#ffbf00"}
    for ax, (policy, (lanes, s)) in zip(axes, runs.items()):
        for y, lane in enumerate(lanes.values()):
            for ch, color in colors.items():
                ax.broken_barh([(i, 1) for i, c in enumerate(lane) if c == ch], (y - 0.4, 0.8), color=color)
        ax.set_yticks(range(len(lanes)), list(lanes), fontsize=7)
        ax.invert_yaxis()
        ax.set_ylabel("request")
        ax.set_title(f"{policy}: {s['steps']} steps, slot utilization {s['util']:.0%}, {s['tok_step']:.2f} output "
                     "tokens per step", fontsize=9)
    axes[-1].set_xlabel("engine step (one forward pass over every scheduled token)")
    names = {".": "queued", "P": "prefill", "D": "decode", "-": "admitted, not scheduled this step"}
    shown = [ch for ch in colors if any(ch in lane for run in runs.values() for lane in run[0].values())]
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=colors[ch]) for ch in shown], [names[ch] for ch in shown],
               loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"Static vs continuous batching: {len(requests)} requests, max_num_seqs={max_num_seqs}")
    fig.text(0.01, 0.005, f"SmolLM2-135M float32 on {platform.machine()} CPU, {platform.system()}, "
                          f"{os.cpu_count()} cores (minitransformer lesson 08)", fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 0.93))
    fig.savefig(path, dpi=80)


# ------------------------------------------------------------------------------------------------ part 3: one step

def ready_engine(model, ids, decoding: int, slots: int, steps: int, prompt: int = 0) -> Engine:
    """An engine with `decoding` sequences of CONTEXT tokens already past their prefill and `steps` tokens left to
    decode, so each later step() decodes one token for each (their context grows by one per step)."""
    engine = Engine(model, max_num_seqs=slots, enable_prefix_caching=False,
                    max_num_batched_tokens=max(512, prompt + slots),           # a newcomer's prompt fits one step
                    max_model_len=CONTEXT + steps + max(prompt, 2) + 2)
    params = SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    for i in range(decoding):
        engine.add_request(ids[i:i + CONTEXT], params, request_id=f"d{i}")
    while any(not s.output_ids for s in engine.sequences.values()):       # prefill (a long one in chunks)
        engine.step()
    return engine


def with_newcomer(engine: Engine, prompt_ids) -> None:
    """One step in which a newcomer's whole prompt is prefilled beside the running decodes. It asks for one token,
    which its prefill samples, so it leaves in the same step and the next call brings another."""
    engine.add_request(prompt_ids, SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    engine.step()


def step_costs(model, sizes, slots, prompt, repeats):
    """Time one engine step per contender, in turns: a decode-only step of b sequences for each b in `sizes`, and a
    step of slots - 1 decodes beside a newcomer's `prompt`-token prefill. Returns ({label: Timing}, the mixed row's
    label, shapes): shapes = (timed steps whose prompt and decode tokens were what their label says, all timed
    steps)."""
    ids = model.tokenizer.encode(TEXT)
    steps = STEP_WARMUP + repeats
    engines = {str(b): ready_engine(model, ids, b, b, steps) for b in sizes}
    mixed = f"{slots - 1} decode + {prompt}-token prefill"
    engines[mixed] = ready_engine(model, ids, slots - 1, slots, steps, prompt)
    newcomer = (ids * (1 + (CONTEXT + prompt) // len(ids)))[CONTEXT:CONTEXT + prompt]
    calls = {label: engine.step for label, engine in engines.items()}
    calls[mixed] = lambda: with_newcomer(engines[mixed], newcomer)
    timings = interleaved(calls, repeats=repeats, warmup=STEP_WARMUP)
    wanted = {label: (0, int(label)) for label in engines if label != mixed} | {mixed: (prompt, slots - 1)}
    good = sum((r.num_prefill_tokens, r.num_decode_tokens) == wanted[label]
               for label, engine in engines.items() for r in engine.step_log[-repeats:])
    return timings, mixed, (good, repeats * len(engines))


def print_step_costs(model, timings, mixed, shapes, repeats):
    """The table of part 3 and its check line."""
    one = H200.seconds(H200.cost(model.config, 1, CONTEXT))
    table = Table(Column("sequences", no_wrap=True), "min ms", "median ms", "spread ms", "x one (min)",
                  "tok/s (min)", "H200: x one")
    base = timings["1"].min
    for label, t in timings.items():
        b = int(label.split()[0]) + (label == mixed)                   # tokens out of the step: one per sequence
        h200 = "-" if label == mixed else f"{H200.seconds(H200.cost(model.config, 1, CONTEXT, batch=b)) / one:.2f}"
        table.add_row(label, f"{t.min * 1e3:.1f}", f"{t.median * 1e3:.1f}", f"{t.spread * 1e3:.1f}",
                      f"{t.min / base:.2f}", f"{b / t.min:.0f}", h200)
    console.print(table, f"one engine step, timed {repeats} times in turns with the other rows (after {STEP_WARMUP} "
                         f"untimed rounds), each sequence at context {CONTEXT} to {CONTEXT + STEP_WARMUP + repeats}. "
                         "min: the figure a quiet machine gives (noise only ever adds time); median: a typical step; "
                         "spread: max - min. x one, tok/s: from the mins. H200: roofline time at bf16 from the "
                         f"datasheet ({H200.bandwidth / 1e12:.1f} TB/s, {H200.flops / 1e12:.0f} TFLOP/s), a model, "
                         "not a measurement", highlight=False)
    console.print(f"check step shapes: {shapes[0]} of {shapes[1]} timed steps had the prompt and decode tokens their "
                  "row names", highlight=False)


# ------------------------------------------------------------------------------------------------ part 4: the clock

def cell(values, best, fmt) -> str:
    """'46.2 (45.9, 0.8)': the best run (max for tok/s, min for a time), the median, the spread (max - min)."""
    return f"{best(values):{fmt}} ({np.median(values):{fmt}}, {max(values) - min(values):{fmt}})"


def column_name(policy, m) -> str:
    return f"{policy}, {m} slot{'s' if m != 1 else ''}"


def print_clock_table(configs, sched, timed, repeats):
    """Part 4's table, one column per configuration: the schedule (the same every run), then the clock."""
    table = Table(Column(f"{repeats} runs each, in turns", no_wrap=True), *(column_name(p, m) for p, m in configs))
    for key, label, fmt in (("steps", "steps", "d"), ("util", "slot util", ".3f"), ("tok_step", "tok/step", ".2f"),
                            ("beside", "prefill beside decodes", "d")):
        table.add_row(label, *(f"{sched[c][key]:{fmt}}" for c in configs))
    for key, label, scale, fmt in (("tok_s", "tok/s", 1, ".1f"), ("ttft50", "TTFT p50 s", 1, ".2f"),
                                   ("ttft99", "TTFT p99 s", 1, ".2f"), ("itl50", "ITL p50 ms", 1e3, ".1f"),
                                   ("itl99", "ITL p99 ms", 1e3, ".1f")):
        best = max if key == "tok_s" else min
        table.add_row(label, *(cell([r[key] * scale for r in timed[c]], best, fmt) for c in configs))
    console.print(table, "cells of the timed rows: best (median, spread) over the runs; best is the highest tok/s and "
                         "the lowest time, what a quiet machine gives; spread = max - min. prefill beside decodes: the "
                         "most prompt tokens one step prefilled while running requests waited in it for their next "
                         "token", highlight=False)
    for key, label, scale, fmt in (("tok_s", "tok/s", 1, ".1f"), ("ttft50", "TTFT p50 s", 1, ".2f"),
                                   ("itl50", "ITL p50 ms", 1e3, ".1f")):        # each row's winner, named by its cells
        best = max if key == "tok_s" else min
        values = {column_name(*c): float(f"{best(r[key] * scale for r in timed[c]):{fmt}}") for c in configs}
        console.print(winner_line(label, key == "tok_s", values, fmt), highlight=False)


# ------------------------------------------------------------------------------------------------ claims

def cell_numbers(cell_text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell_text)]


def clock_table(output: str) -> tuple[dict, list[int]]:
    """Part 4's table as {(policy, slots): {row label: [numbers]}} and the continuous slot counts, in order."""
    table = table_with(output, "static,")
    found = {}
    for i, name in enumerate(table.columns[1:], start=1):
        m = re.fullmatch(r"(static|continuous), (\d+) slots?", name)
        if m:
            found[m[1], int(m[2])] = {row[0]: cell_numbers(row[i]) for row in table.rows}
    return found, sorted(m for p, m in found if p == "continuous")


def time_range(cell_values) -> tuple[float, float]:
    """[fastest, slowest] of a timed cell 'min (median, spread)'."""
    low, _, spread = cell_values
    return low, low + spread


def rate_range(cell_values) -> tuple[float, float]:
    """[lowest, highest] of a tok/s cell 'best (median, spread)'."""
    high, _, spread = cell_values
    return high - spread, high


def below(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """A's whole range lies below B's: a difference beyond both runs' spread."""
    return a[1] < b[0]


def span(values, unit, fmt=".1f") -> str:
    return f"{values[0]:{fmt}}-{values[1]:{fmt}} {unit}"


def step_claims(output: str) -> list[Claim]:
    """Part 3: what a step of b sequences costs against a step of one, and a step with a newcomer's prompt in it."""
    table = table_with(output, "min ms")
    rows = {row[0]: [float(row[1]), float(row[3])] for row in table.rows}          # label: [min, spread]
    good, total = find_numbers(output, r"check step shapes: (\d+) of (\d+) timed steps")
    sizes = sorted(int(label) for label in rows if label.isdigit())
    b = 4 if 4 in sizes else sizes[-1]
    one, big = rows["1"], rows[str(b)]
    one_r, big_r = (one[0], one[0] + one[1]), (big[0], big[0] + big[1])
    found = [Claim("step-shapes", "every timed step held the tokens its row names", good == total,
                   f"{good:.0f} of {total:.0f}", timed=False)]
    if b > 1:
        found += [
            Claim("batch-not-free", f"on this CPU a decode step of {b} sequences costs more than a step of one",
                  below(one_r, big_r), f"{b} sequences {span(big_r, 'ms')} vs one {span(one_r, 'ms')}"),
            Claim("batch-pays", f"a decode step of {b} sequences costs less than {b} steps of one, so batching "
                  "raises tokens/s", big_r[1] < b * one_r[0],
                  f"slowest {b}-sequence step {big_r[1]:.1f} ms vs {b} x the fastest one-sequence step "
                  f"{b * one_r[0]:.1f} ms")]
    mixed = next((label for label in rows if "prefill" in label), None)
    if mixed:
        slots = int(mixed.split()[0]) + 1
        plain = rows.get(str(slots))
        if plain:
            mixed_r, plain_r = (rows[mixed][0], sum(rows[mixed])), (plain[0], sum(plain))
            found.append(Claim("prefill-stalls", "a step that prefills a newcomer's prompt beside the decodes takes "
                               f"longer than a decode-only step of {slots} sequence{'s' if slots != 1 else ''}",
                               below(plain_r, mixed_r), f"{span(mixed_r, 'ms')} vs {span(plain_r, 'ms')}"))
    return found


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Timed claims need the two ranges [best, worst] over the repeated runs
    (or steps) not to overlap. ValueError when the output lacks a table, row or line a claim reads."""
    try:
        return read_claims(output)
    except (KeyError, IndexError) as exc:
        raise ValueError(f"the output lacks a row or column the claims read: {exc}") from None


def read_claims(output: str) -> list[Claim]:
    same, n = find_numbers(output, r"check tokens: static == continuous for (\d+)/(\d+) requests")
    found = [Claim("same-tokens", "static and continuous batching produce the same tokens", same == n,
                   f"{same:.0f} of {n:.0f} requests", timed=False)]
    found += step_claims(output)
    cols, sizes = clock_table(output)
    static = next(((p, m) for p, m in cols if p == "static"), None)
    co = cols.get(("continuous", static[1])) if static else None
    if static and co:
        st = cols[static]
        found += [
            Claim("fewer-steps", "continuous batching needs fewer steps than static for the same tokens",
                  co["steps"][0] < st["steps"][0] and co["slot util"][0] > st["slot util"][0],
                  f"{co['steps'][0]:.0f} vs {st['steps'][0]:.0f} steps, slot utilization {co['slot util'][0]:.3f} vs "
                  f"{st['slot util'][0]:.3f}", timed=False),
            Claim("continuous-throughput", "continuous batching delivers more tokens per second than static",
                  below(rate_range(st["tok/s"]), rate_range(co["tok/s"])),
                  f"{span(rate_range(co['tok/s']), 'tok/s')} vs {span(rate_range(st['tok/s']), 'tok/s')}"),
            Claim("continuous-ttft", "continuous batching brings the median first token sooner than static",
                  below(time_range(co["TTFT p50 s"]), time_range(st["TTFT p50 s"])),
                  f"TTFT p50 {span(time_range(co['TTFT p50 s']), 's', '.2f')} vs "
                  f"{span(time_range(st['TTFT p50 s']), 's', '.2f')}"),
            Claim("continuous-ttft-tail", "continuous batching brings the p99 first token sooner than static",
                  below(time_range(co["TTFT p99 s"]), time_range(st["TTFT p99 s"])),
                  f"TTFT p99 {span(time_range(co['TTFT p99 s']), 's', '.2f')} vs "
                  f"{span(time_range(st['TTFT p99 s']), 's', '.2f')}")]
    if len(sizes) > 1:
        lo, hi = cols["continuous", sizes[0]], cols["continuous", sizes[-1]]
        a, b = sizes[0], sizes[-1]
        found += [
            Claim("bigger-fewer-steps", f"continuous batching with {b} slots makes more tokens per step than with {a}",
                  hi["tok/step"][0] > lo["tok/step"][0], f"{hi['tok/step'][0]:.2f} vs {lo['tok/step'][0]:.2f}",
                  timed=False),
            Claim("bigger-bigger-prefills", f"with {b} slots a step prefills more prompt tokens beside running "
                  f"decodes than with {a}", hi["prefill beside decodes"][0] > lo["prefill beside decodes"][0],
                  f"at most {hi['prefill beside decodes'][0]:.0f} vs {lo['prefill beside decodes'][0]:.0f} tokens",
                  timed=False),
            Claim("bigger-throughput", f"{b} slots deliver more tokens per second than {a}",
                  below(rate_range(lo["tok/s"]), rate_range(hi["tok/s"])),
                  f"{span(rate_range(hi['tok/s']), 'tok/s')} vs {span(rate_range(lo['tok/s']), 'tok/s')}"),
            Claim("bigger-ttft", f"{b} slots bring the median first token sooner than {a} (a shorter queue)",
                  below(time_range(hi["TTFT p50 s"]), time_range(lo["TTFT p50 s"])),
                  f"TTFT p50 {span(time_range(hi['TTFT p50 s']), 's', '.2f')} vs "
                  f"{span(time_range(lo['TTFT p50 s']), 's', '.2f')}"),
            Claim("bigger-itl", f"{b} slots make each running request's tokens come slower than {a} (ITL p50)",
                  below(time_range(lo["ITL p50 ms"]), time_range(hi["ITL p50 ms"])),
                  f"ITL p50 {span(time_range(hi['ITL p50 ms']), 'ms')} vs {span(time_range(lo['ITL p50 ms']), 'ms')}"),
            Claim("bigger-itl-tail", f"{b} slots make the p99 gap between a request's tokens longer than {a}",
                  below(time_range(lo["ITL p99 ms"]), time_range(hi["ITL p99 ms"])),
                  f"ITL p99 {span(time_range(hi['ITL p99 ms']), 'ms')} vs {span(time_range(lo['ITL p99 ms']), 'ms')}"),
        ]
    return found


# ------------------------------------------------------------------------------------------------ the answer

def step_answer(shown, timings, config) -> str:
    """What part 3's steps say about batching on this CPU, only as far as its claims were shown."""
    sizes = [int(label) for label in timings if label.isdigit()]
    b = 4 if 4 in sizes else max(sizes)
    if b == 1:
        return ""
    ratio = timings[str(b)].min / timings["1"].min
    gpu = H200.seconds(H200.cost(config, 1, CONTEXT, batch=b)) / H200.seconds(H200.cost(config, 1, CONTEXT))
    roofline = (f"On an {H200.name} the step would stay bound by reading the weights: {gpu:.2f}x a step of one. "
                f"That gives about {b / gpu:.1f}x the tokens/s, a roofline estimate, not measured here.")
    if shown["batch-not-free"] and shown["batch-pays"]:
        return (f"A decode step of {b} sequences took {ratio:.2f}x a step of one here. Reading the weights once for "
                f"all of them would make it about 1x. So {b} slots gave {b / ratio:.1f}x the tokens/s of one, not "
                f"{b}x. On this CPU NumPy's BLAS multiplies a few rows with its matrix-matrix routine. That costs "
                "more than its one-row matrix-vector routine. Lesson 02, part 4, times one matmul both ways. "
                + roofline)
    return (f"A decode step of {b} sequences took {ratio:.2f}x a step of one by the mins. This run could not show "
            f"beyond the spread both that it costs more than one step and less than {b}. The claims above say why. "
            + roofline)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16, help="requests in the workload (at least 1)")
    ap.add_argument("--max-num-seqs", type=int, default=8, help="slots per step (the batch size)")
    ap.add_argument("--sweep", default="4,8,16", help="max_num_seqs values for the 'bigger batch?' columns")
    ap.add_argument("--max-prompt", type=int, default=96, help="longest prompt in tokens (at least 8)")
    ap.add_argument("--max-output", type=int, default=40, help="longest max_tokens of a request (at least 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random workload")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each configuration, in turns (at least 2): "
                                                          "a difference is called a finding only beyond their spread")
    ap.add_argument("--step-repeats", type=int, default=10, help="timed steps of each kind in part 3 (at least 2)")
    ap.add_argument("--figure", type=Path, help="write the timeline figure here (PNG)")
    args = ap.parse_args()
    for flag, value, low in (("--requests", args.requests, 1), ("--max-num-seqs", args.max_num_seqs, 1),
                             ("--max-prompt", args.max_prompt, 8), ("--max-output", args.max_output, 2),
                             ("--repeats", args.repeats, 2), ("--step-repeats", args.step_repeats, 2)):
        if value < low:
            raise InputError(f"{flag} must be at least {low}, got {value}" + (" (one run has no spread)"
                                                                             if "repeats" in flag else ""))
    try:
        sizes = [int(x) for x in args.sweep.split(",")]
    except ValueError:
        raise InputError(f"--sweep must be comma-separated integers, got {args.sweep!r}") from None
    if min(sizes) < 1:
        raise InputError(f"--sweep values must be at least 1, got {args.sweep!r}")
    model = load_model()
    probe = Probe()                                                      # is the machine quiet during this run?
    M, requests = args.max_num_seqs, workload(model.tokenizer, args.requests, args.max_prompt, args.max_output,
                                              args.seed)
    configs = [("static", M)] + [("continuous", m) for m in sorted(set(sizes) | {M})]
    # Round 0, untimed: the warm-up, and the schedules (the same in every run) that parts 1, 2 and 4 print.
    first = {c: serve(model, requests, *c) for c in configs}
    sched = {c: schedule(first[c][0], first[c][2], c[1]) for c in configs}
    for number, policy in ((1, "static"), (2, "continuous")):
        results, lanes, _ = first[policy, M]
        console.rule(f"[bold]{number}. {policy} batching, max_num_seqs={M}: one row per request, one column per step")
        for (rid, prompt, max_tokens), lane in zip(requests, lanes.values()):
            console.print(f"{rid} prompt {len(prompt):3d} out {max_tokens:2d} |{''.join(lane)}|", highlight=False)
        s = sched[policy, M]
        console.print(f"{policy}: steps {s['steps']}, slot utilization {s['util']:.3f}, {s['tokens']} tokens = "
                      f"{s['tok_step']:.2f} per step", highlight=False)
    names = {"P": "P prefill (PP..: a long prompt split over steps by the token budget, chunked prefill)",
             "D": "D decode", ".": ". queued", "-": "- admitted but not scheduled this step"}
    seen = {ch for c in configs[:2] for lane in first[c][1].values() for ch in lane}
    console.print(", ".join(names[ch] for ch in names if ch in seen) + ", blank done", highlight=False)
    st_results, co_results = first["static", M][0], first["continuous", M][0]
    same = sum(st_results[rid].token_ids == co_results[rid].token_ids for rid, _, _ in requests)
    console.print(f"check tokens: static == continuous for {same}/{len(requests)} requests; r00 = "
                  f"{co_results['r00'].token_ids}")
    if args.figure:
        draw(args.figure, {p: (first[p, M][1], sched[p, M]) for p in ("static", "continuous")}, requests, M)
        console.print(f"figure written: {args.figure}")

    console.rule("[bold]3. What one engine step costs, by the sequences in it")
    step_sizes = sorted({2 ** k for k in range(M.bit_length()) if 2 ** k <= M} | {M})
    timings, mixed, shapes = step_costs(model, step_sizes, M, args.max_prompt, args.step_repeats)
    print_step_costs(model, timings, mixed, shapes, args.step_repeats)

    console.rule(f"[bold]4. The clock: static vs continuous, and a bigger batch ({args.repeats} runs each, in turns)")
    timed = {c: [] for c in configs}

    def timed_run(config):
        def run():
            results, _, _ = serve(model, requests, *config)
            timed[config].append(latencies(results))
        return run
    walls = interleaved({c: timed_run(c) for c in configs}, repeats=args.repeats, warmup=0)   # round 0: warm-up
    for c in configs:
        for run, seconds in zip(timed[c], walls[c].samples):
            run["tok_s"] = sched[c]["tokens"] / seconds
    print_clock_table(configs, sched, timed, args.repeats)

    console.rule("[bold]5. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview question: what does continuous batching change over static batching, and is a "
                 "bigger batch better?")
    st, co = sched["static", M], sched["continuous", M]
    best = {c: {k: (max if k == "tok_s" else min)(r[k] for r in timed[c]) for k in timed[c][0]} for c in configs}
    bs, bc = best["static", M], best["continuous", M]
    answer = [f"Static batching holds a slot until the longest request of its group is done: here {st['steps']} steps "
              f"at {st['util']:.0%} slot utilization. Continuous batching refills a slot the step after it frees: "
              f"{co['steps']} steps at {co['util']:.0%} for the same tokens ({same}/{len(requests)} identical), "
              f"{co['tok_step']:.2f} vs {st['tok_step']:.2f} tokens per step."]
    answer.append("So the same work took fewer steps." if shown["fewer-steps"] else
                  "This workload could not show a difference in steps. A static group idles only while its "
                  "members' lengths differ.")
    clock = (("continuous-throughput", f"{bc['tok_s']:.1f} vs {bs['tok_s']:.1f} tok/s"),
             ("continuous-ttft", f"TTFT p50 {bc['ttft50']:.2f} vs {bs['ttft50']:.2f} s"),
             ("continuous-ttft-tail", f"TTFT p99 {bc['ttft99']:.2f} vs {bs['ttft99']:.2f} s"))
    held = [what for k, what in clock if shown[k]]
    missed = [what for k, what in clock if not shown[k]]
    if held:
        answer.append(f"On the clock, continuous vs static: {', '.join(held)}. Each is the best of {args.repeats} "
                      "runs, and the two ranges do not overlap.")
    if missed:
        answer.append(f"This run could not show beyond its spread: {', '.join(missed)} (continuous vs static).")
    answer.append(step_answer(shown, timings, model.config))
    if len(set(sizes) | {M}) > 1:
        answer.append(bigger_answer(shown, sched, best, sorted(set(sizes) | {M}), args.repeats, timings, mixed, M))
    console.print(" ".join(a for a in answer if a), highlight=False)


def bigger_answer(shown, sched, best, sizes, repeats, timings, mixed, M) -> str:
    """Is a bigger batch better? Only the differences this run showed beyond its spread are stated."""
    a, b = sizes[0], sizes[-1]
    lo, hi = best["continuous", a], best["continuous", b]
    parts = [f"From max_num_seqs {a} to {b} (best of {repeats} runs each): throughput {lo['tok_s']:.1f} -> "
             f"{hi['tok_s']:.1f} tok/s, the p50 gap between a request's tokens (ITL) {lo['itl50'] * 1e3:.1f} -> "
             f"{hi['itl50'] * 1e3:.1f} ms, TTFT p50 {lo['ttft50']:.2f} -> {hi['ttft50']:.2f} s, p99 ITL "
             f"{lo['itl99'] * 1e3:.1f} -> {hi['itl99'] * 1e3:.1f} ms."]
    if shown["bigger-ttft"] and shown["bigger-itl"]:
        parts.append("So the small batch made requests wait in the queue (TTFT). The large one made every running "
                     "request's tokens slower (ITL). Choose max_num_seqs from the latency target, not from "
                     "throughput alone.")
    elif shown["bigger-itl"]:
        parts.append("Here the bigger batch gave every running request slower tokens (ITL p50). It did not bring the "
                     "first token sooner beyond the spread. A bigger batch is not free.")
    elif shown["bigger-ttft"]:
        parts.append("Here the bigger batch brought the first token sooner. Its usual cost, slower tokens for every "
                     "running request, did not show beyond the spread.")
    else:
        parts.append("This run could not show a latency difference between the two sizes beyond its spread. The "
                     "usual trade-off is a longer queue with a small batch and slower tokens with a large one.")
    top = max(sizes, key=lambda m: best["continuous", m]["tok_s"])
    if shown["bigger-throughput"] and top == b:
        parts.append(f"The biggest batch delivered the most tokens per second of the sizes tried "
                     f"({hi['tok_s']:.1f} tok/s).")
    elif shown["bigger-throughput"]:
        parts.append(f"{b} slots delivered more tokens per second than {a}, but the most came from {top} slots "
                     f"({best['continuous', top]['tok_s']:.1f} tok/s, best run): past "
                     "it, each step's longer prefills and wider matmuls cost more than the extra rows bring. The "
                     "optimum is a measurement on each machine, not the biggest batch that fits.")
    stall = timings[mixed].min / timings[str(M)].min if str(M) in timings else None
    if shown["bigger-itl-tail"] and shown.get("prefill-stalls") and shown["bigger-bigger-prefills"]:
        parts.append(f"The tail paid too: p99 ITL rose {lo['itl99'] * 1e3:.1f} -> {hi['itl99'] * 1e3:.1f} ms. A "
                     "running request's next token waits whenever a newcomer's prompt is prefilled in the same step. "
                     f"In part 3 such a step took {stall:.2f}x a decode-only one. A bigger batch admits more "
                     f"newcomers at once: up to {sched['continuous', b]['beside']} prompt tokens beside the decodes "
                     f"vs {sched['continuous', a]['beside']}.")
    elif shown["bigger-itl-tail"]:
        parts.append("The p99 gap between tokens grew beyond the spread. This run could not show its cause, a "
                     "newcomer's prefill in the step, beyond its own spread.")
    else:
        parts.append("This run could not show a difference in the p99 gap between tokens beyond its spread.")
    return " ".join(parts)


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
