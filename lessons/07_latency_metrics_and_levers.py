"""Lesson 07: latency metrics and the levers that move them -- queue, prefill, TTFT, ITL, tokens/s, total.

    python lessons/07_latency_metrics_and_levers.py [--tokens 16] [--lengths 32,128,256] [--outputs 4,8,16]
                                                    [--repeats 5] [--compare gemma3-270m]

Part 1 serves three requests that arrive together on one slot, one after the other (no batching: lesson 08), and
prints metrics.py's numbers for each. Part 2 runs one request streamed and not streamed, in turns. Part 3 turns each
lever -- output length, context length, bytes per token (model size, quantization) -- and measures what it moves:
every setting of a lever runs --repeats times, in turns with the others (measure.interleaved), and the fastest run
(min) is reported with the median and the spread. The tables of the course (T1 phases, T2 levers, T4 tuning guide)
end it, filled with this run's numbers. The lesson's claims (claims() below) are decided from the numbers it prints,
and a timing claim is stated only when the run was quiet (minitransformer/lab/measure.py).

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import os
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import KVCache, SamplingParams, generate, load_model, stream
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.generate import CachedRunner, make_request, run_request
from minitransformer.core.metrics import now
from minitransformer.core.prefill import prefill
from minitransformer.core.sampling import make_generator, sample
from minitransformer.lab.claims import NUMBER, Claim, bound_line, find_numbers, flat, report, table_with
from minitransformer.lab.machine import H200, forward_cost
from minitransformer.lab.measure import Probe, Timing, interleaved, time_calls
from minitransformer.lab.peaks import machine_profile

REQUESTS = ["What is 2+2?", "Name three colors of the rainbow.", "Write one sentence about the sea."]
TEXT = ("The history of the printing press begins in the fifteenth century, when movable metal type changed how "
        "books were made, how much they cost, and who could read them. ")
# Q4_1 stores 32 weights in 20 bytes (16 bytes of 4-bit values + a float16 scale + a float16 min; lesson 13 prints
# them): 5 bits, 0.625 bytes per weight.
HYPOTHETICAL = [("1B float16", 1e9 * 2), ("7B float16", 7e9 * 2), ("7B Q4_1", 7e9 * 0.625)]
# Piped: 120 columns (rich would cut at 80) unless COLUMNS says otherwise. record: claims() reads what was printed.
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's table first. All three requests arrive at once, so compare `queue ms` with `TTFT ms`.",
    "Section 3 moves one lever at a time. Read which column moves in each of its tables.",
    "Section 4 fills the course's tables with this run's numbers.",
    "The claim lines under 'What this run shows' say which effects this run showed beyond the noise.",
)
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120, record=True)
FLAT_BAND = 0.25            # ITL counts as flat when its fastest gap at every prompt length is within 25% of the first
SAME_BAND = 0.05            # streaming counts as costing nothing extra when the two totals' mins are within 5%


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def beyond(lower: list[float], upper: list[float]) -> bool:
    """Each setting's fastest run is slower than the previous setting's slowest: the growth is beyond the spread."""
    return all(lo > hi for lo, hi in zip(lower[1:], upper[:-1]))


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Part 1 ran once, so its claim needs a margin larger than the three
    prefills' own differences; every other timing ran --repeats times, and a claim needs the ranges apart."""
    fifo = table_with(output, "queue ms")
    prefills, queues, ttfts = fifo.numbers("prefill ms"), fifo.numbers("queue ms"), fifo.numbers("TTFT ms")
    noise = max(prefills) - min(prefills)
    streamed = table_with(output, "first text min ms")
    first_min, first_med, first_spread = (streamed.numbers(c) for c in ("first text min", "first text median",
                                                                         "first text spread"))
    total_min, total_spread = streamed.numbers("total min"), streamed.numbers("total spread")
    out = table_with(output, "output tokens")
    n_out, e2e_min, e2e_spread = out.numbers("output tokens"), out.numbers("total min"), out.numbers("total spread")
    ctx = table_with(output, "prompt tokens")
    n_ctx, ttft_min, ttft_spread = ctx.numbers("prompt tokens"), ctx.numbers("TTFT min"), ctx.numbers("TTFT spread")
    itl_min = ctx.numbers("ITL min")
    growth = ttft_min[-1] / ttft_min[0]
    itl_change = max(abs(x / itl_min[0] - 1) for x in itl_min)
    decode_ms, floor_ms = find_numbers(output, r"bound decode-step: measured ([\d.]+) ms, floor ([\d.]+) ms")
    gap_ms, _ = find_numbers(output, r"bound fastest-gap: measured ([\d.]+) ms, floor ([\d.]+) ms")
    ridge, = find_numbers(output, r"ridge point = .*? = ([\d.]+) FLOP/byte")
    pre, dec = find_numbers(output, r"check roofline: prefill ([\d.]+) FLOP/byte, decode ([\d.]+) FLOP/byte")
    found = [
        Claim("queue-in-ttft", "a request that waits its turn gets its first token later though its own prefill "
              "costs the same: the wait is in its TTFT", ttfts[-1] - ttfts[0] > noise and queues[-1] > prefills[-1],
              f"r{len(ttfts) - 1} TTFT {ttfts[-1]:.1f} vs r0 {ttfts[0]:.1f} ms, queue {queues[-1]:.1f} ms; the "
              f"prefills differ by {noise:.1f} ms"),
        Claim("stream-first-sooner", "streaming shows the first text before a non-streamed reply shows any",
              first_min[0] + first_spread[0] < total_min[1],
              f"streamed first text {first_min[0]:.1f}-{first_min[0] + first_spread[0]:.1f} ms (median "
              f"{first_med[0]:.1f}) vs not streamed {total_min[1]:.1f} ms at the fastest"),
        Claim("stream-same-total", f"streaming does not change the total (fastest runs within {SAME_BAND:.0%})",
              abs(total_min[0] / total_min[1] - 1) <= SAME_BAND,
              f"{total_min[0]:.1f} vs {total_min[1]:.1f} ms ({total_min[0] / total_min[1] - 1:+.1%}; spreads "
              f"{total_spread[0]:.1f} and {total_spread[1]:.1f} ms)"),
        Claim("e2e-grows-with-output", "the total grows with the output length",
              beyond(e2e_min, [a + b for a, b in zip(e2e_min, e2e_spread)]),
              ", ".join(f"{n:.0f} tokens {a:.1f}-{a + b:.1f} ms" for n, a, b in zip(n_out, e2e_min, e2e_spread))),
        Claim("ttft-grows-with-prompt", "TTFT grows with the prompt length",
              beyond(ttft_min, [a + b for a, b in zip(ttft_min, ttft_spread)]),
              ", ".join(f"{n:.0f} tokens {a:.1f}-{a + b:.1f} ms" for n, a, b in zip(n_ctx, ttft_min, ttft_spread))),
        Claim("itl-flat", f"ITL stays flat as the prompt grows (within ±{FLAT_BAND:.0%}, and far less than TTFT "
              "grows)", itl_change <= FLAT_BAND and itl_change < (growth - 1) / 4,
              f"fastest gaps {' / '.join(f'{x:.1f}' for x in itl_min)} ms (at most {itl_change:.0%} from the first) "
              f"while TTFT grew {growth:.1f}x"),
        Claim("above-floor", "a decode step, and even the fastest single gap between tokens, takes at least the "
              "weight bytes over the read bandwidth (the floor)", min(decode_ms, gap_ms) >= floor_ms,
              f"{decode_ms:.1f} ms per token, fastest gap {gap_ms:.1f} ms, floor {floor_ms:.1f} ms"),
        Claim("roofline", "by the roofline, prefill is compute-bound and decode memory-bound on this machine",
              pre > ridge > dec, f"prefill {pre:.2f}, decode {dec:.2f} FLOP/byte, ridge {ridge:.2f}"),
    ]
    second = re.search(rf"check second model: decode ({NUMBER})-({NUMBER}) ms per token vs this model's "
                       rf"({NUMBER})-({NUMBER}); weights ({NUMBER})x", flat(output))
    if second:                                           # printed only with --compare
        low, high, own_low, own_high, ratio = (float(x) for x in second.groups())
        bigger = ratio > 1
        found.append(Claim("model-size-measured", f"the model with {'more' if bigger else 'fewer'} weight bytes "
                           f"decodes {'slower' if bigger else 'faster'}, beyond both spreads",
                           low > own_high if bigger else high < own_low,
                           f"{low:.1f}-{high:.1f} vs {own_low:.1f}-{own_high:.1f} ms per token, weights {ratio:.2f}x",
                           required=False, refuted=high < own_low if bigger else low > own_high))
    return found


def repeated(runs: dict, repeats: int) -> tuple[dict[str, Timing], dict[str, list]]:
    """Time each run (a callable returning a Result) in turns, and keep the Results of the timed calls (not the
    warm-up's), whose metrics split each call's time into TTFT and gaps."""
    kept = {name: [] for name in runs}
    timings = interleaved({name: (lambda name=name, run=run: kept[name].append(run())) for name, run in runs.items()},
                          repeats=repeats)
    return timings, {name: results[-repeats:] for name, results in kept.items()}


def spread_cells(t: Timing) -> list[str]:
    """min, median, spread in ms: the quiet-machine figure, the typical one, how far to trust them."""
    return [ms(t.min), ms(t.median), ms(t.spread)]


def compare_model(model, other, tokens: int, repeats: int, bandwidth: float) -> None:
    """Part 3b (with --compare): the same greedy request on both models, in turns, and the time per output token
    (TPOT) of each run next to the floor its weight bytes set: the model-size lever measured, not computed."""
    console.rule(f"[bold]3b. The model-size lever, measured: {model.path.stem} and {other.path.stem}, in turns")
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    models = {m.path.stem: m for m in (model, other)}
    _, runs = repeated({name: (lambda m=m: generate(m, TEXT, params)) for name, m in models.items()}, repeats)
    per_token = {name: Timing(tuple(r.metrics.tpot_s for r in runs[name])) for name in models}
    table = Table("model", "weights GB", "floor ms/token", "decode ms/token min", "median", "spread",
                  "x the floor")
    for name, m in models.items():
        t = per_token[name]
        table.add_row(name, f"{m.weight_bytes / 1e9:.3f}", ms(m.weight_bytes / bandwidth), *spread_cells(t),
                      f"{t.min / (m.weight_bytes / bandwidth):.1f}")
    console.print(table)
    mine, theirs = per_token[model.path.stem], per_token[other.path.stem]
    console.print(f"check second model: decode {ms(theirs.min)}-{ms(theirs.max)} ms per token vs this model's "
                  f"{ms(mine.min)}-{ms(mine.max)}; weights {other.weight_bytes / model.weight_bytes:.2f}x "
                  f"({tokens} greedy tokens, {repeats} runs each; decode ms/token = TPOT, metrics.py)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16, help="output tokens of each request in parts 1 and 2")
    ap.add_argument("--lengths", default="32,128,256", help="prompt lengths of the context-length lever")
    ap.add_argument("--outputs", default="4,8,16", help="output lengths of the output-length lever")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each setting in parts 2 and 3, in turns")
    ap.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: SmolLM2-135M)")
    ap.add_argument("--compare", metavar="NAME|PATH", help="a second model (e.g. gemma3-270m): its decode is timed in "
                    "turns with this one's after part 3, the model-size lever measured rather than computed")
    args = ap.parse_args()
    if args.tokens < 2 or args.repeats < 1:
        raise InputError(f"--tokens must be at least 2 and --repeats at least 1, got {args.tokens}, {args.repeats}")
    try:
        lengths, outputs = [int(x) for x in args.lengths.split(",")], [int(x) for x in args.outputs.split(",")]
    except ValueError:
        raise InputError("--lengths and --outputs must be comma-separated integers") from None
    if min(lengths) < 1 or min(outputs) < 2:
        raise InputError("--lengths must be at least 1 each and --outputs at least 2 each (a gap between tokens)")
    model = load_model(args.model)
    probe = Probe()                                                      # is the machine quiet during this run?
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)   # fixed work per request
    generate(model, "warm-up", SamplingParams(max_tokens=2))                           # first-call costs out

    console.rule(f"[bold]1. Three requests arrive at once; one slot serves them in order ({args.tokens} tokens each)")
    arrival = now()
    requests = [make_request(model, p, params, chat=True, arrival=arrival) for p in REQUESTS]
    results = [list(run_request(model, r, CachedRunner(model, r)))[-1].result
               for r in requests]                                                       # FIFO, one at a time
    table = Table("request", "prompt tok", "queue ms", "prefill ms", "TTFT ms", "ITL p50 ms", "ITL p90 ms",
                  "decode tok/s", "total ms")
    for i, r in enumerate(results):
        m, itl = r.metrics, r.metrics.itl_summary()
        table.add_row(f"r{i}", str(r.usage.prompt_tokens), ms(m.queue_s), ms(m.prefill_s), ms(m.ttft_s),
                      ms(itl["p50"]), ms(itl["p90"]), f"{m.decode_tokens_per_s:.1f}", ms(m.e2e_s))
    console.print(table, "queue = waiting for the slot; TTFT = queue + prefill; ITL = gap between tokens; "
                  "decode tok/s = (n - 1) / (total - TTFT); total = arrival to last token (metrics.py). One run: "
                  "part 1 shows what each number means; parts 2 and 3 repeat every run")

    console.rule(f"[bold]2. The same request streamed and not streamed (P2), {args.repeats} times each, in turns")
    firsts = []                                       # seconds to the first visible text, one per streamed call

    def streamed():
        start = now()
        first = None
        for delta in stream(model, REQUESTS[2], params, chat=True):
            if first is None and delta.text:
                first = now() - start                 # the user sees the first characters
        firsts.append(first)

    modes = interleaved({"streamed": streamed,        # the client sees text only when generate returns
                         "not streamed": lambda: generate(model, REQUESTS[2], params, chat=True)},
                        repeats=args.repeats)
    first = Timing(tuple(firsts[-args.repeats:]))                                       # the timed calls' own
    blocking = modes["not streamed"]
    table = Table("mode", "first text min ms", "first text median ms", "first text spread ms", "total min ms",
                  "total median ms", "total spread ms")
    table.add_row("streamed", *spread_cells(first), *spread_cells(modes["streamed"]))
    table.add_row("not streamed", *spread_cells(blocking), *spread_cells(blocking))
    console.print(table, "min = the fastest of the runs, what a quiet machine gives; median = the typical run; "
                  "spread = max - min, how far to trust either (measure.py). Not streamed, the first text comes "
                  "with the last.")
    console.print(f"check streaming: first text {ms(first.min)} ms streamed vs {ms(blocking.min)} ms not streamed "
                  f"(mins, {first.min / blocking.min:.2f}x); totals {ms(modes['streamed'].min)} vs "
                  f"{ms(blocking.min)} ms ({modes['streamed'].min / blocking.min:.2f}x; same tokens, same passes)")

    console.rule(f"[bold]3. The levers, one at a time ({args.repeats} runs of each setting, in turns)")
    greedy = lambda n: SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    out_t, out_runs = repeated({n: (lambda n=n: generate(model, REQUESTS[0], greedy(n), chat=True)) for n in outputs},
                               args.repeats)
    table = Table("output tokens", "total min ms", "total median ms", "total spread ms", "TTFT min ms",
                  "decode ms/token (min)")
    tpot = {n: min(r.metrics.tpot_s for r in out_runs[n]) for n in outputs}
    for n in outputs:
        table.add_row(str(n), *spread_cells(out_t[n]), ms(min(r.metrics.ttft_s for r in out_runs[n])), ms(tpot[n]))
    per_token = (out_t[outputs[-1]].min - out_t[outputs[0]].min) / (outputs[-1] - outputs[0]) \
        if len(outputs) > 1 else tpot[outputs[0]]
    console.print(table, f"check output: each extra output token added {ms(per_token)} ms to the total (mins)")

    ids = model.tokenizer.encode(TEXT * (max(lengths) // 20 + 2))
    _, ctx_runs = repeated({n: (lambda n=n: generate(model, ids[:n], greedy(4))) for n in lengths}, args.repeats)
    ttft = {n: Timing(tuple(r.metrics.ttft_s for r in ctx_runs[n])) for n in lengths}
    itl = {n: Timing(tuple(gap for r in ctx_runs[n] for gap in r.metrics.itl_s)) for n in lengths}
    table = Table("prompt tokens", "TTFT min ms", "TTFT median ms", "TTFT spread ms", "ITL min ms", "ITL median ms",
                  "ITL spread ms")
    for n in lengths:
        table.add_row(str(n), *spread_cells(ttft[n]), *spread_cells(itl[n]))
    ttft_growth = ttft[lengths[-1]].min / ttft[lengths[0]].min
    console.print(table, f"check context: {lengths[-1]} prompt tokens took {ttft_growth:.1f}x the TTFT of "
                  f"{lengths[0]} (mins); ITL moved {itl[lengths[-1]].min / itl[lengths[0]].min:.2f}x (3 gaps a run)")

    profile, here = machine_profile()
    bandwidth, gemm = profile.read_bandwidth, profile.gemm_peak
    peaks_from = "measured now" if here else "measured once for this set of runs"
    decode_ms = tpot[outputs[-1]]                     # the fastest mean gap of the longest output
    ours = [("ours, float32 in memory", model.weight_bytes), ("ours as stored (Q4_1 file)", model.path.stat().st_size)]
    table = Table("model", "weight bytes per token", "floor ms/token", "ceiling tok/s", "measured ms/token",
                  "H200 floor ms/token")
    for name, size in ours + HYPOTHETICAL:
        table.add_row(name, f"{size / 1e9:.3f} GB", ms(size / bandwidth), f"{bandwidth / size:.1f}",
                      ms(decode_ms) if size == model.weight_bytes else "", f"{size / H200.bandwidth * 1e3:.3f}")
    console.print(profile.line(), markup=False, highlight=False)
    console.print(f"read bandwidth ({peaks_from}): {bandwidth / 1e9:.1f} GB/s, the fastest read-only stream of one "
                  "row times a large matrix, as a decode step reads its weights. Every decode step reads all weights "
                  "once, so weight bytes / read bandwidth is a floor on the time per token. H200 floor: the same "
                  f"bytes over an {H200.name}'s published {H200.bandwidth / 1e12:.1f} TB/s, "
                  f"{H200.bandwidth / bandwidth:.0f}x this CPU's measured read bandwidth", table)
    floor = profile.floor_seconds(model.weight_bytes)
    fastest_gap = min(itl[n].min for n in lengths)                  # one gap between two tokens, the fastest seen
    console.print(bound_line("decode-step", decode_ms * 1e3, floor * 1e3, fmt=".2f")
                  + f" (the fastest mean gap of {outputs[-1]} tokens: {decode_ms / floor:.2f}x the floor)")
    console.print(bound_line("fastest-gap", fastest_gap * 1e3, floor * 1e3, fmt=".2f")
                  + " (the fastest single gap of section 3's runs)")
    if args.compare:
        compare_model(model, load_model(args.compare), outputs[-1], args.repeats, bandwidth)

    console.rule("[bold]4. The course's tables, with this run's numbers")
    cache = KVCache(model.config, lengths[-1])
    logits = prefill(model, ids[: lengths[-1]], cache)                               # (1, V)
    gen = make_generator(0)
    sampled = time_calls(lambda: sample(logits, [SamplingParams(top_p=0.9)], [gen], [ids], [[]]), repeats=20)
    ridge = gemm / bandwidth                               # FLOP/byte where this machine stops being memory-bound
    console.print(f"ridge point = GEMM peak {gemm / 1e9:.1f} GFLOP/s (float32 1024x1024 matmul) / read bandwidth "
                  f"{bandwidth / 1e9:.1f} GB/s = {ridge:.2f} FLOP/byte ({peaks_from}; both vary between runs: the "
                  "profile line above gives their medians and spreads)")
    pre, dec = forward_cost(model.config, lengths[-1]), forward_cost(model.config, 1, lengths[-1])
    console.print(f"check roofline: prefill {pre.intensity:.2f} FLOP/byte, decode {dec.intensity:.2f} FLOP/byte "
                  f"(FLOPs per byte moved, lab/machine.py forward_cost)")
    bound = lambda c: f"{'compute' if c.intensity > ridge else 'memory'} ({c.intensity:.2f} FLOP/byte)"
    t1 = Table("T1 phase", "processes", f"roofline bound (ridge {ridge:.2f} FLOP/byte)", "user-facing metric",
               "measured (min)")
    t1.add_row("prefill", f"all {lengths[-1]} prompt tokens at once", bound(pre), "TTFT",
               f"{ms(ttft[lengths[-1]].min)} ms")
    t1.add_row("decode", "1 token + the KV cache", bound(dec), "ITL, tok/s", f"{ms(decode_ms)} ms/token")
    t1.add_row("sampling", f"{logits.shape[-1]:,} logits -> 1 id", "n/a (no weights read)", "part of ITL",
               f"{sampled.min * 1e3:.2f} ms (top_p)")
    t2 = Table("T2 lever", "effect measured here (mins)", "trade-off", "mitigation")
    big = HYPOTHETICAL[1]
    t2.add_row("model size", f"{big[0]}: floor {ms(big[1] / bandwidth)} ms/token vs {ms(ours[0][1] / bandwidth)}",
               "quality vs speed", "right-size, distill")
    t2.add_row("context length", f"TTFT {ms(ttft[lengths[0]].min)} -> {ms(ttft[lengths[-1]].min)} ms "
               f"({lengths[0]} -> {lengths[-1]} tokens)", "every prompt token is prefilled and cached",
               "trim prompts, cache prefixes")
    t2.add_row("output length", f"+{ms(per_token)} ms per token", "one decode step per output token",
               "max_tokens caps, stop strings")
    t2.add_row("quantization", f"weights kept 4-bit read {ours[0][1] / ours[1][1]:.1f}x fewer bytes: "
               f"floor {ms(ours[1][1] / bandwidth)} ms/token", "some accuracy", "4/8-bit weights (lesson 13)")
    console.print(t1, t2)

    console.rule("[bold]5. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    short, long = ttft[lengths[0]].min, ttft[lengths[-1]].min
    t4 = Table("T4 tuning step", "what it bought here")
    t4.add_row("smaller or quantized model", f"floor {ms(ours[1][1] / bandwidth)} vs {ms(big[1] / bandwidth)} "
               f"ms/token (ours Q4_1 vs {big[0]})")
    t4.add_row("prompt trimming", f"{lengths[-1]} -> {lengths[0]} tokens saves {ms(long - short)} ms of TTFT"
               if shown["ttft-grows-with-prompt"] else f"TTFT {ms(long)} ms at {lengths[-1]} tokens vs {ms(short)} "
               f"at {lengths[0]}: this run could not show a saving")
    t4.add_row("continuous batching", "more requests per pass: lesson 08 measures it")
    t4.add_row("streaming", f"first text at {ms(first.min)} ms instead of {ms(blocking.min)} ms"
               if shown["stream-first-sooner"] else f"first text at {ms(first.min)} vs {ms(blocking.min)} ms: this "
               "run could not show it sooner")
    cut = (f"{outputs[0]} instead of {outputs[-1]} tokens: total {ms(out_t[outputs[0]].min)} instead of "
           f"{ms(out_t[outputs[-1]].min)} ms")
    t4.add_row("output caps + stops", cut if shown["e2e-grows-with-output"] else
               f"{outputs[0]} vs {outputs[-1]} tokens: total {ms(out_t[outputs[0]].min)} vs "
               f"{ms(out_t[outputs[-1]].min)} ms: this run could not show a saving")
    console.print(t4)

    console.rule("[bold]Interview question: which latencies do you watch, and why not just the total? (M3)")
    r0, r2 = results[0].metrics, results[-1].metrics
    streamed_total = modes["streamed"].min
    answer = ["Each one separately. They answer different questions: when the text starts, how fast it flows, and "
              "when it is done."]
    if shown["stream-first-sooner"] and shown["stream-same-total"]:
        answer.append(f"The total alone hides what users feel. Streamed and not streamed, the same reply took "
                      f"{ms(streamed_total)} vs {ms(blocking.min)} ms in total, yet its first text showed after "
                      f"{ms(first.min)} vs {ms(blocking.min)} ms.")
    else:
        answer.append(f"Streamed and not streamed, the same reply took {ms(streamed_total)} vs {ms(blocking.min)} ms "
                      f"in total and showed its first text after {ms(first.min)} vs {ms(blocking.min)} ms. This run "
                      "could not show what streaming changes. The claims above say why.")
    if shown["queue-in-ttft"]:
        answer.append(f"Request r2 did the same kind of work as r0 (prefill {ms(r2.prefill_s)} vs {ms(r0.prefill_s)} "
                      f"ms). But it waited {ms(r2.queue_s)} ms in the queue, so its TTFT was {ms(r2.ttft_s)} ms "
                      f"against {ms(r0.ttft_s)}.")
    else:
        answer.append(f"Request r2 had prefill {ms(r2.prefill_s)} ms, queue {ms(r2.queue_s)} ms and TTFT "
                      f"{ms(r2.ttft_s)} ms, against r0's TTFT of {ms(r0.ttft_s)} ms. This run could not show the "
                      "queue's share.")
    levers = []
    if shown["ttft-grows-with-prompt"]:
        levers.append(f"Here TTFT follows the prompt ({ttft_growth:.1f}x from {lengths[0]} to {lengths[-1]} tokens) "
                      "and the queue.")
    if shown["itl-flat"]:
        levers.append(f"ITL stays flat as the prompt grows ({ms(itl[lengths[0]].min)} -> {ms(itl[lengths[-1]].min)} "
                      "ms).")
    if shown["above-floor"]:
        levers.append(f"A decode step ({ms(decode_ms)} ms here) cannot beat the bytes it reads. Reading "
                      f"{model.weight_bytes / 1e9:.2f} GB at {bandwidth / 1e9:.1f} GB/s sets a floor of {ms(floor)} "
                      "ms.")
    if shown["e2e-grows-with-output"]:
        levers.append(f"And the total adds {ms(per_token)} ms per output token.")
    answer += levers
    if all(shown[k] for k in ("ttft-grows-with-prompt", "itl-flat", "e2e-grows-with-output")):
        answer.append("So caps and stops cut the total. Trimming the prompt and controlling the queue cut TTFT. A "
                      "smaller or quantized model lowers the floor under ITL.")
    else:
        answer.append("This run could not show every lever. The claims above say which. Run it again with nothing "
                      "else on the machine if the quietness line says it was busy.")
    console.print(" ".join(answer))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
