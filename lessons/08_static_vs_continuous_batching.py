"""Lesson 08: static vs continuous batching: one workload, two schedulers, the same tokens, different waits.

    python lessons/08_static_vs_continuous_batching.py [--requests 16] [--max-num-seqs 8] [--sweep 4,8,16]
                                                      [--max-prompt 96] [--max-output 40] [--repeats 2]
                                                      [--figure PATH]

Static batching (the pre-2022 way) forms a group of max_num_seqs requests and runs it until its *longest* member is
done: a finished member's slot sits idle and the queue waits behind it. Continuous batching (Orca, OSDI '22; vLLM)
schedules per iteration: a finished request leaves after its step and a waiting one joins the next. Both run here
through minitransformer.serving.Engine on the real model, greedy with ignore_eos, so both must produce the same tokens.
"""

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import SamplingParams, load_model  # noqa: E402
from minitransformer.bench.machine import H200  # noqa: E402
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


def repeated(first: dict, again, repeats: int) -> dict:
    """The median of each metric over `repeats` runs (`first` and more from again()), with s["spread"][metric] =
    max - min over the runs: how far one run's wall-clock numbers move when nothing but the machine changes."""
    runs = [first] + [again() for _ in range(repeats - 1)]
    s = {k: first[k] if all(r[k] == first[k] for r in runs) else float(np.median([r[k] for r in runs]))
         for k in first}                                     # step counts are the same every run: kept as ints
    s["spread"] = {k: max(r[k] for r in runs) - min(r[k] for r in runs) for k in first}
    return s


def differs(a: dict, b: dict, key: str) -> bool:
    """True when the two medians differ by more than either one's run-to-run spread: a difference worth calling
    a finding. Within the spread, the same measurement repeated could have come out the other way."""
    return abs(b[key] - a[key]) > max(a["spread"][key], b["spread"][key])


def change(a: dict, b: dict, key: str, unit: str, scale: float = 1, fmt: str = ".1f") -> str:
    """'rose 10.0 -> 14.0 tok/s (1.40x)', or '... (1.02x, within noise)' when within the measured spread."""
    x, y = a[key] * scale, b[key] * scale
    ratio = f"{y / x:.2f}x" if x else "n/a"
    return (f"{'rose' if y > x else 'fell'} {x:{fmt}} -> {y:{fmt}} {unit} "
            f"({ratio}{'' if differs(a, b, key) else ', within noise'})")


def versus(a: dict, b: dict, key: str, unit: str, fmt: str = ".1f") -> str:
    """'14.0 vs 10.0 tok/s (1.40x)', or '10.2 vs 10.0 tok/s (within noise)' when within the measured spread."""
    return (f"{a[key]:{fmt}} vs {b[key]:{fmt}} {unit} "
            f"({f'{a[key] / b[key]:.2f}x' if b[key] and differs(b, a, key) else 'within noise'})")


def trade_off(lo: dict, hi: dict) -> str:
    """The verdict on a bigger batch (lo -> hi), drawn only from differences beyond the measured spread."""
    slower_tokens = differs(lo, hi, "itl50") and hi["itl50"] > lo["itl50"]
    sooner = [f"TTFT p{k[4:]}" for k in ("ttft50", "ttft99") if differs(lo, hi, k) and hi[k] < lo[k]]
    later = [f"TTFT p{k[4:]}" for k in ("ttft50", "ttft99") if differs(lo, hi, k) and hi[k] > lo[k]]
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
                "noise: on this workload, at these sizes, bigger helped; the usual cost (slower tokens for every "
                "running request) did not show beyond the run-to-run spread.")
    return ("This run shows no latency difference beyond the run-to-run spread (the usual trade-off: small batch, "
            "longer queue; large batch, slower tokens); on a shared machine timings are noisy, so run it again with "
            "more --repeats or more requests.")


def decode_step_costs(engines) -> dict[int, list[float]]:
    """Durations of the decode-only steps (no prompt tokens in them) of these engines, by sequences in the step."""
    costs: dict[int, list[float]] = {}
    for engine in engines:
        for r in engine.step_log:
            if r.num_prefill_tokens == 0 and r.num_decode_tokens:
                costs.setdefault(r.num_decode_tokens, []).append(r.duration_s)
    return dict(sorted(costs.items()))


def batch_cost(model, engines) -> None:
    """What one decode step costs per batch size here, against what reading the weights once would predict."""
    costs = decode_step_costs(engines)
    base = statistics.median(costs[1]) if 1 in costs else None
    table = Table("sequences in the step", "decode-only steps", "median ms", "x a 1-sequence step", "tokens/s",
                  "H200: x a 1-sequence step")
    one = H200.seconds(H200.cost(model.config, 1, 64))
    for b, times in costs.items():
        t = statistics.median(times)
        table.add_row(str(b), str(len(times)), f"{t * 1e3:.1f}", f"{t / base:.2f}" if base else "-", f"{b / t:.0f}",
                      f"{H200.seconds(H200.cost(model.config, 1, 64, batch=b)) / one:.2f}")
    console.print(table, "decode-only steps of the static and continuous runs above, by how many sequences they "
                         "decoded (engine.step_log's durations; steps with a prompt in them left out). H200: roofline "
                         f"time at bf16 from the datasheet ({H200.bandwidth / 1e12:.1f} TB/s, {H200.flops / 1e12:.0f} "
                         "TFLOP/s) at context 64")
    b = 4 if 4 in costs else max(costs)
    if base and b > 1:
        ratio = statistics.median(costs[b]) / base
        gpu = H200.seconds(H200.cost(model.config, 1, 64, batch=b)) / one
        console.print(
            f"A decode step of {b} sequences took {ratio:.2f}x a step of one here, where reading the weights once "
            f"for all of them would make it about 1x: so {b} slots gave {b / ratio:.1f}x the tokens/s of one, not "
            f"{b}x. On this CPU NumPy's BLAS multiplies a few rows with its matrix-matrix routine, which costs several "
            f"times its one-row matrix-vector routine (lesson 02, part 4, times one matmul both ways). On an "
            f"{H200.name} the step would stay bound by reading the weights: {gpu:.2f}x a step of one, so about "
            f"{b / gpu:.1f}x the tokens/s: there batching pays almost in full.", highlight=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16, help="requests in the workload (at least 1)")
    ap.add_argument("--max-num-seqs", type=int, default=8, help="slots per step (the batch size)")
    ap.add_argument("--sweep", default="4,8,16", help="max_num_seqs values for the 'bigger batch?' table")
    ap.add_argument("--max-prompt", type=int, default=96, help="longest prompt in tokens (at least 8)")
    ap.add_argument("--max-output", type=int, default=40, help="longest max_tokens of a request (at least 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random workload")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each configuration (at least 2): a difference is "
                                                          "called a finding only beyond their spread")
    ap.add_argument("--figure", type=Path, help="write the timeline figure here (PNG)")
    args = ap.parse_args()
    if args.requests < 1:
        raise InputError(f"--requests must be at least 1, got {args.requests}")
    if args.max_num_seqs < 1:
        raise InputError(f"--max-num-seqs must be at least 1, got {args.max_num_seqs}")
    if args.max_prompt < 8:
        raise InputError(f"--max-prompt must be at least 8, got {args.max_prompt}")
    if args.repeats < 2:
        raise InputError(f"--repeats must be at least 2 (one run has no spread), got {args.repeats}")
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
    engines = [run[2] for run in runs.values()]                 # every run at max_num_seqs, for batch_cost

    def again(policy, m):
        results, _, engine, wall = serve(model, requests, policy, m)
        if m == args.max_num_seqs:
            engines.append(engine)
        return summarize(results, engine, wall, m)
    medians = {p: repeated(run[-1], lambda p=p: again(p, args.max_num_seqs), args.repeats) for p, run in runs.items()}

    console.rule("[bold]What one decode step costs, by the number of sequences in it")
    batch_cost(model, engines)

    console.rule("[bold]Does a bigger batch help? Continuous batching at several max_num_seqs")
    table = Table("max_num_seqs", "steps", "slot util", "tok/step", "tok/s", "TTFT p50 s", "TTFT p99 s", "ITL p50 ms",
                  "ITL p99 ms")
    sweep = {}
    for m in sizes:
        if m == args.max_num_seqs:                                        # already measured above
            s = sweep[m] = medians["continuous"]
        else:
            s = sweep[m] = repeated(again("continuous", m), lambda m=m: again("continuous", m), args.repeats)
        table.add_row(str(m), str(s["steps"]), f"{s['util']:.3f}", f"{s['tok_step']:.2f}", f"{s['tok_s']:.1f}",
                      f"{s['ttft50']:.3f}", f"{s['ttft99']:.3f}", f"{s['itl50'] * 1e3:.1f}", f"{s['itl99'] * 1e3:.1f}")
    console.print(table, f"medians of {args.repeats} runs each. tok/step does not depend on the machine's speed; "
                         "tok/s, TTFT and ITL are wall-clock measurements, noisy on a shared machine, so each run was "
                         "repeated; their spread (max - min over the runs):")
    for name, s in [(f"continuous, max_num_seqs {m}", s) for m, s in sweep.items()] + [("static", medians["static"])]:
        d = s["spread"]
        console.print(f"spread {name}: tok/s {d['tok_s']:.1f}, TTFT p50 {d['ttft50']:.3f} s, TTFT p99 "
                      f"{d['ttft99']:.3f} s, ITL p50 {d['itl50'] * 1e3:.1f} ms, ITL p99 {d['itl99'] * 1e3:.1f} ms",
                      highlight=False)
    if args.figure:
        draw(args.figure, runs, requests, args.max_num_seqs)
        console.print(f"figure written: {args.figure}")

    st, co = medians["static"], medians["continuous"]
    lo, hi = sweep[min(sweep)], sweep[max(sweep)]
    tail_worse = differs(lo, hi, "itl99") and hi["itl99"] > lo["itl99"]
    bigger = "" if lo is hi else (
        f"From max_num_seqs {min(sweep)} to {max(sweep)}: throughput {change(lo, hi, 'tok_s', 'tok/s')}, "
        f"the p50 gap between a request's tokens (ITL) {change(lo, hi, 'itl50', 'ms', 1e3)}, "
        f"TTFT p50 {change(lo, hi, 'ttft50', 's', fmt='.3f')} and TTFT p99 "
        f"{change(lo, hi, 'ttft99', 's', fmt='.3f')} (medians of {args.repeats} runs; a change within their "
        f"run-to-run spread is called within noise). " + trade_off(lo, hi)
        + (" The tail paid too: p99 ITL " if tail_worse else " p99 ITL ")
        + change(lo, hi, "itl99", "ms", 1e3)
        + (", because a running request's next token waits whenever a newcomer's whole prompt is prefilled in the "
           "same step, and a bigger batch admits more newcomers at once." if tail_worse else "."))
    console.rule("[bold]Interview question: why does continuous batching beat static batching, and is bigger better?")
    console.print(
        f"Static batching holds a slot until the longest request of its group is done: here {st['steps']} steps at "
        f"{st['util']:.0%} slot utilization. Continuous batching refills a slot the step after it frees: "
        f"{co['steps']} steps at {co['util']:.0%} for the same tokens ({same}/{len(requests)} identical), "
        f"{co['tok_step']:.2f} vs {st['tok_step']:.2f} tokens per step; measured (continuous vs static) "
        f"{versus(co, st, 'tok_s', 'tok/s')}, TTFT p50 {versus(co, st, 'ttft50', 's', '.2f')} and "
        f"TTFT p99 {versus(co, st, 'ttft99', 's', '.2f')}. " + bigger)


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
