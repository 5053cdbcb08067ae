"""Lesson 08: static vs continuous batching: one workload, two schedulers, the same tokens, different waits.

    python lessons/08_static_vs_continuous_batching.py [--requests 16] [--max-num-seqs 8] [--sweep 4,8,16]
                                                      [--max-prompt 96] [--max-output 40] [--figure PATH]

Static batching (the pre-2022 way) forms a group of max_num_seqs requests and runs it until its *longest* member is
done: a finished member's slot sits idle and the queue waits behind it. Continuous batching (Orca, OSDI '22; vLLM)
schedules per iteration: a finished request leaves after its step and a waiting one joins the next. Both run here
through minitransformer.serving.Engine on the real model, greedy with ignore_eos, so both must produce the same tokens.
"""

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import SamplingParams, load_model  # noqa: E402
from minitransformer.serving import Engine  # noqa: E402

TEXT = ("A serving engine keeps many requests in flight at once. Each step it decides which requests run, gives each "
        "one a slice of the token budget, runs one forward pass over all of their tokens together, samples one new "
        "token per running request and streams it out. Requests arrive at any time, with short or long prompts, and "
        "ask for a few words or a long answer, so no two of them finish at the same moment. ") * 4
console = Console(width=None if sys.stdout.isatty() else 120)     # piped: don't cut titles at 80 columns


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
    Returns results {id: Result}, lanes {id: per-step chars}, the engine, and the wall time in seconds."""
    engine = Engine(model, max_num_seqs=max_num_seqs, policy=policy, enable_prefix_caching=False)
    for rid, prompt, max_tokens in requests:
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                           request_id=rid)
    results, lanes, admitted, started = {}, {rid: [] for rid, _, _ in requests}, set(), set()
    t0 = time.perf_counter()
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
    return results, lanes, engine, time.perf_counter() - t0


def summarize(results, engine, wall, max_num_seqs):
    """Slot utilization (scheduled sequences / (steps x slots)), throughput and TTFT percentiles of one run."""
    busy = sum(len(r.request_ids) for r in engine.step_log)
    tokens = sum(len(r.token_ids) for r in results.values())
    ttft = [r.metrics.ttft_s for r in results.values()]
    itl = np.concatenate([r.metrics.itl_s for r in results.values()])
    return {"steps": len(engine.step_log), "util": busy / (len(engine.step_log) * max_num_seqs), "tokens": tokens,
            "tok_step": tokens / len(engine.step_log), "wall": wall, "tok_s": tokens / wall,
            "ttft50": np.percentile(ttft, 50), "ttft99": np.percentile(ttft, 99),
            "itl50": np.percentile(itl, 50), "itl99": np.percentile(itl, 99)}


def draw(path, runs, requests, max_num_seqs):
    """One panel per policy: each request's life as bars on a time axis (queued, prefill, decode)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 2.2 + 0.22 * len(requests) * len(runs)), sharex=True)
    colors = {".": "#dddddd", "P": "#d62728", "D": "#1f77b4", "-": "#ffbf00"}
    for ax, (policy, (results, lanes, engine, wall, s)) in zip(axes, runs.items()):
        for y, (rid, lane) in enumerate(lanes.items()):
            for ch, color in colors.items():
                ax.broken_barh([(i, 1) for i, c in enumerate(lane) if c == ch], (y - 0.4, 0.8), color=color)
        ax.set_yticks(range(len(lanes)), list(lanes), fontsize=7)
        ax.invert_yaxis()
        ax.set_ylabel("request")
        ax.set_title(f"{policy}: {s['steps']} steps, slot utilization {s['util']:.0%}, {s['tok_step']:.2f} output "
                     "tokens per step", fontsize=9)
    axes[-1].set_xlabel("engine step (one forward pass over every scheduled token)")
    names = {".": "queued", "P": "prefill", "D": "decode", "-": "admitted, not scheduled this step"}
    shown = [ch for ch in colors if any(ch in lane for run in runs.values() for lane in run[1].values())]
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=colors[ch]) for ch in shown], [names[ch] for ch in shown],
               loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"Static vs continuous batching: {len(requests)} requests, max_num_seqs={max_num_seqs}")
    fig.text(0.01, 0.005, f"SmolLM2-135M float32 on {platform.machine()} CPU, {platform.system()}, "
                          f"{os.cpu_count()} cores (minitransformer lesson 08)", fontsize=7)
    fig.tight_layout(rect=(0, 0.02, 1, 0.93))
    fig.savefig(path, dpi=80)


MARGIN = 0.10          # wall-clock differences within 10% are "about the same": noise on a shared machine


def differs(a: float, b: float) -> bool:
    """True when b is more than MARGIN away from a (relative): a difference worth calling a finding."""
    return abs(b - a) > MARGIN * abs(a)


def change(a: float, b: float, unit: str, fmt: str = ".1f") -> str:
    """'rose 10.0 -> 14.0 tok/s (1.40x)', with ', about the same' added when the change is within MARGIN."""
    ratio = f"{b / a:.2f}x" if a else "n/a"
    return (f"{'rose' if b > a else 'fell'} {a:{fmt}} -> {b:{fmt}} {unit} "
            f"({ratio}{'' if differs(a, b) else ', about the same'})")


def versus(a: float, b: float, unit: str, fmt: str = ".1f") -> str:
    """'14.0 vs 10.0 tok/s (1.40x)', or '10.2 vs 10.0 tok/s (about the same)' when within MARGIN."""
    return f"{a:{fmt}} vs {b:{fmt}} {unit} ({f'{a / b:.2f}x' if b and differs(b, a) else 'about the same'})"


def trade_off(lo: dict, hi: dict) -> str:
    """The verdict on a bigger batch (lo -> hi), drawn only from differences beyond MARGIN."""
    slower_tokens = differs(lo["itl50"], hi["itl50"]) and hi["itl50"] > lo["itl50"]
    sooner = [f"TTFT p{k[4:]}" for k in ("ttft50", "ttft99") if differs(lo[k], hi[k]) and hi[k] < lo[k]]
    later = [f"TTFT p{k[4:]}" for k in ("ttft50", "ttft99") if differs(lo[k], hi[k]) and hi[k] > lo[k]]
    if slower_tokens and sooner and not later:
        return ("So the small batch made requests wait in the queue (TTFT) and the large one made every running "
                "request's tokens slower (ITL): choose max_num_seqs from the latency target, not from throughput "
                "alone.")
    if slower_tokens or later:
        costs = (["slower tokens (ITL p50)"] if slower_tokens else []) + [f"a later first token ({k})" for k in later]
        gains = f", and a sooner first token ({', '.join(sooner)})" if sooner else ""
        return (f"Here the bigger batch cost latency: {', '.join(costs)}{gains}. A bigger batch is not free: choose "
                "max_num_seqs from the latency target, not from throughput alone.")
    if sooner:
        return (f"Here the bigger batch brought the first token sooner ({', '.join(sooner)}) and kept ITL p50 within "
                "the margin: on this workload, at these sizes, bigger helped; the usual cost (slower tokens for every "
                "running request) did not show beyond the margin.")
    return (f"This run shows no latency difference beyond {MARGIN:.0%} (the usual trade-off: small batch, longer "
            "queue; large batch, slower tokens); on a shared machine timings are noisy, so run it again or with "
            "more requests.")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16, help="requests in the workload (at least 1)")
    ap.add_argument("--max-num-seqs", type=int, default=8, help="slots per step (the batch size)")
    ap.add_argument("--sweep", default="4,8,16", help="max_num_seqs values for the 'bigger batch?' table")
    ap.add_argument("--max-prompt", type=int, default=96, help="longest prompt in tokens (at least 8)")
    ap.add_argument("--max-output", type=int, default=40, help="longest max_tokens of a request (at least 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random workload")
    ap.add_argument("--figure", type=Path, help="write the timeline figure here (PNG)")
    args = ap.parse_args()
    if args.requests < 1:
        raise InputError(f"--requests must be at least 1, got {args.requests}")
    if args.max_num_seqs < 1:
        raise InputError(f"--max-num-seqs must be at least 1, got {args.max_num_seqs}")
    if args.max_prompt < 8:
        raise InputError(f"--max-prompt must be at least 8, got {args.max_prompt}")
    if args.max_output < 2:
        raise InputError(f"--max-output must be at least 2, got {args.max_output}")
    try:
        sizes = [int(x) for x in args.sweep.split(",")]
    except ValueError:
        raise InputError(f"--sweep must be comma-separated integers, got {args.sweep!r}") from None
    if min(sizes) < 1:
        raise InputError(f"--sweep values must be at least 1, got {args.sweep!r}")
    model = load_model()
    requests = workload(model.tokenizer, args.requests, args.max_prompt, args.max_output, args.seed)
    runs = {}
    for policy in ("static", "continuous"):
        results, lanes, engine, wall = serve(model, requests, policy, args.max_num_seqs)
        runs[policy] = (results, lanes, engine, wall, summarize(results, engine, wall, args.max_num_seqs))
        console.rule(f"[bold]{policy} batching, max_num_seqs={args.max_num_seqs}: one row per request, one column "
                     "per step")
        for (rid, prompt, max_tokens), lane in zip(requests, lanes.values()):
            console.print(f"{rid} prompt {len(prompt):3d} out {max_tokens:2d} |{''.join(lane)}|", highlight=False)
        s = runs[policy][-1]
        console.print(f"{policy}: steps {s['steps']}, slot utilization {s['util']:.3f}, {s['tokens']} tokens = "
                      f"{s['tok_step']:.2f} per step, in {s['wall']:.2f} s = {s['tok_s']:.1f} tok/s, TTFT p50 "
                      f"{s['ttft50']:.3f} s p99 {s['ttft99']:.3f} s", highlight=False)
    names = {"P": "P prefill (PP..: a long prompt split over steps by the token budget, chunked prefill)",
             "D": "D decode", ".": ". queued", "-": "- admitted but not scheduled this step"}
    seen = {ch for run in runs.values() for lane in run[1].values() for ch in lane}
    console.print(", ".join(names[ch] for ch in names if ch in seen) + ", blank done", highlight=False)
    same = sum(runs["static"][0][rid].token_ids == runs["continuous"][0][rid].token_ids for rid, _, _ in requests)
    console.print(f"check tokens: static == continuous for {same}/{len(requests)} requests; r00 = "
                  f"{runs['continuous'][0]['r00'].token_ids}")

    console.rule("[bold]Does a bigger batch help? Continuous batching at several max_num_seqs")
    table = Table("max_num_seqs", "steps", "slot util", "tok/step", "tok/s", "TTFT p50 s", "TTFT p99 s", "ITL p50 ms",
                  "ITL p99 ms")
    sweep = {}
    for m in sizes:
        if m == args.max_num_seqs:                                        # already measured above
            s = sweep[m] = runs["continuous"][-1]
        else:
            results, _, engine, wall = serve(model, requests, "continuous", m)
            s = sweep[m] = summarize(results, engine, wall, m)
        table.add_row(str(m), str(s["steps"]), f"{s['util']:.3f}", f"{s['tok_step']:.2f}", f"{s['tok_s']:.1f}",
                      f"{s['ttft50']:.3f}", f"{s['ttft99']:.3f}", f"{s['itl50'] * 1e3:.1f}", f"{s['itl99'] * 1e3:.1f}")
    console.print(table, "tok/step does not depend on the machine's speed; tok/s, TTFT and ITL are wall-clock "
                         "measurements (noisy on a shared machine)")
    if args.figure:
        draw(args.figure, runs, requests, args.max_num_seqs)
        console.print(f"figure written: {args.figure}")

    st, co = runs["static"][-1], runs["continuous"][-1]
    lo, hi = sweep[min(sweep)], sweep[max(sweep)]
    tail_worse = differs(lo["itl99"], hi["itl99"]) and hi["itl99"] > lo["itl99"]
    bigger = "" if lo is hi else (
        f"From max_num_seqs {min(sweep)} to {max(sweep)}: throughput {change(lo['tok_s'], hi['tok_s'], 'tok/s')}, "
        f"the p50 gap between a request's tokens (ITL) {change(lo['itl50'] * 1e3, hi['itl50'] * 1e3, 'ms')}, "
        f"TTFT p50 {change(lo['ttft50'], hi['ttft50'], 's', '.3f')} and TTFT p99 "
        f"{change(lo['ttft99'], hi['ttft99'], 's', '.3f')} (a change within {MARGIN:.0%} is called about the same: "
        f"one run on a shared machine varies that much). " + trade_off(lo, hi)
        + (" The tail paid too: p99 ITL " if tail_worse else " p99 ITL ")
        + change(lo["itl99"] * 1e3, hi["itl99"] * 1e3, "ms")
        + (", because a running request's next token waits whenever a newcomer's whole prompt is prefilled in the "
           "same step, and a bigger batch admits more newcomers at once." if tail_worse else "."))
    console.rule("[bold]Interview question: why does continuous batching beat static batching, and is bigger better?")
    console.print(
        f"Static batching holds a slot until the longest request of its group is done: here {st['steps']} steps at "
        f"{st['util']:.0%} slot utilization. Continuous batching refills a slot the step after it frees: "
        f"{co['steps']} steps at {co['util']:.0%} for the same tokens ({same}/{len(requests)} identical), "
        f"{co['tok_step']:.2f} vs {st['tok_step']:.2f} tokens per step; measured (continuous vs static) "
        f"{versus(co['tok_s'], st['tok_s'], 'tok/s')}, TTFT p50 {versus(co['ttft50'], st['ttft50'], 's', '.2f')} and "
        f"TTFT p99 {versus(co['ttft99'], st['ttft99'], 's', '.2f')}. " + bigger)


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
