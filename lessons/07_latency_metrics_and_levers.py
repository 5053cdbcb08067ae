"""Lesson 07: latency metrics and the levers that move them -- queue, prefill, TTFT, ITL, tokens/s, total.

    python lessons/07_latency_metrics_and_levers.py [--tokens 16] [--lengths 32,128,256] [--outputs 4,8,16]

Part 1 serves three requests that arrive together on one slot, one after the other (no batching: lesson 08), and
prints metrics.py's numbers for each. Part 2 runs one request streamed and not streamed. Part 3 turns each lever --
output length, context length, bytes per token (model size, quantization) -- and measures what it moves. The tables
of the course (T1 phases, T2 levers, T4 tuning guide) end it, filled with this run's numbers.
"""

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import KVCache, SamplingParams, generate, load_model, stream  # noqa: E402
from minitransformer.bench.machine import H200, forward_cost, measure_copy_bandwidth, measure_gemm_flops  # noqa: E402
from minitransformer.generate import _run, make_request, make_runner  # noqa: E402
from minitransformer.metrics import now  # noqa: E402
from minitransformer.prefill import prefill  # noqa: E402
from minitransformer.sampling import make_generator, sample  # noqa: E402

REQUESTS = ["What is 2+2?", "Name three colors of the rainbow.", "Write one sentence about the sea."]
TEXT = ("The history of the printing press begins in the fifteenth century, when movable metal type changed how "
        "books were made, how much they cost, and who could read them. ")
# Q4_1 stores 32 weights in 20 bytes (16 bytes of 4-bit values + a float16 scale + a float16 min; lesson 13 prints
# them): 5 bits, 0.625 bytes per weight.
HYPOTHETICAL = [("1B float16", 1e9 * 2), ("7B float16", 7e9 * 2), ("7B Q4_1", 7e9 * 0.625)]
# Piped: 120 columns (rich would cut at 80) unless COLUMNS says otherwise.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16, help="output tokens of each request in parts 1 and 2")
    ap.add_argument("--lengths", default="32,128,256", help="prompt lengths of the context-length lever")
    ap.add_argument("--outputs", default="4,8,16", help="output lengths of the output-length lever")
    ap.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: SmolLM2-135M)")
    args = ap.parse_args()
    if args.tokens < 1:
        raise InputError(f"--tokens must be at least 1, got {args.tokens}")
    try:
        lengths, outputs = [int(x) for x in args.lengths.split(",")], [int(x) for x in args.outputs.split(",")]
    except ValueError:
        raise InputError("--lengths and --outputs must be comma-separated integers") from None
    if min(lengths + outputs) < 1:
        raise InputError("--lengths and --outputs must be at least 1 each")
    model = load_model(args.model)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)   # fixed work per request
    generate(model, "warm-up", SamplingParams(max_tokens=2))                           # first-call costs out

    console.rule(f"[bold]1. Three requests arrive at once; one slot serves them in order ({args.tokens} tokens each)")
    arrival = now()
    requests = [make_request(model, p, params, chat=True, arrival=arrival) for p in REQUESTS]
    results = [list(_run(model, r, None, None, make_runner(model, r, use_cache=True)))[-1].result
               for r in requests]                                                       # FIFO, one at a time
    table = Table("request", "prompt tok", "queue ms", "prefill ms", "TTFT ms", "ITL p50 ms", "ITL p90 ms",
                  "decode tok/s", "total ms")
    for i, r in enumerate(results):
        m, itl = r.metrics, r.metrics.itl_summary()
        table.add_row(f"r{i}", str(r.usage.prompt_tokens), ms(m.queue_s), ms(m.prefill_s), ms(m.ttft_s),
                      ms(itl["p50"]), ms(itl["p90"]), f"{m.decode_tokens_per_s:.1f}", ms(m.e2e_s))
    console.print(table, "queue = waiting for the slot; TTFT = queue + prefill; ITL = gap between tokens; "
                  "decode tok/s = (n - 1) / (total - TTFT); total = arrival to last token (metrics.py)")

    console.rule("[bold]2. The same request streamed and not streamed (P2)")
    start = now()
    first = None
    for delta in stream(model, REQUESTS[2], params, chat=True):
        if first is None and delta.text:
            first = now() - start                                     # the user sees the first characters
    streamed_total = now() - start
    start = now()
    generate(model, REQUESTS[2], params, chat=True)                   # the client sees text only when it returns
    blocking_total = now() - start
    table = Table("mode", "first text visible ms", "total ms")
    table.add_row("streamed", ms(first), ms(streamed_total))
    table.add_row("not streamed", ms(blocking_total), ms(blocking_total))
    console.print(table)
    console.print(f"check streaming: first text {blocking_total / first:.1f}x sooner; total time "
                  f"{streamed_total / blocking_total:.2f}x the non-streamed one (same tokens, same passes)")

    console.rule("[bold]3. The levers, one at a time")
    table = Table("output tokens", "total ms", "TTFT ms", "decode ms/token")
    out_runs = [generate(model, REQUESTS[0], SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True),
                         chat=True).metrics for n in outputs]
    for n, m in zip(outputs, out_runs):
        table.add_row(str(n), ms(m.e2e_s), ms(m.ttft_s), ms(m.tpot_s))
    per_token = (out_runs[-1].e2e_s - out_runs[0].e2e_s) / (outputs[-1] - outputs[0])
    console.print(table, f"check output: each extra output token added {ms(per_token)} ms to the total")

    ids = model.tokenizer.encode(TEXT * (max(lengths) // 20 + 2))
    table = Table("prompt tokens", "TTFT ms", "ITL p50 ms")
    ctx_runs = [generate(model, ids[:n], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)).metrics
                for n in lengths]
    for n, m in zip(lengths, ctx_runs):
        table.add_row(str(n), ms(m.ttft_s), ms(m.itl_summary()["p50"]))
    ttft_growth = ctx_runs[-1].ttft_s / ctx_runs[0].ttft_s
    console.print(table, f"check context: {lengths[-1]} prompt tokens took {ttft_growth:.1f}x the TTFT of "
                  f"{lengths[0]}; ITL moved {ctx_runs[-1].itl_summary()['p50'] / ctx_runs[0].itl_summary()['p50']:.2f}x")

    bandwidth = measure_copy_bandwidth(nbytes=128 * 2**20, repeats=3)
    decode_ms = out_runs[-1].tpot_s
    ours = [("ours, float32 in memory", model.weight_bytes), ("ours as stored (Q4_1 file)", model.path.stat().st_size)]
    table = Table("model", "weight bytes per token", "floor ms/token", "ceiling tok/s", "measured ms/token",
                  "H200 floor ms/token")
    for name, size in ours + HYPOTHETICAL:
        table.add_row(name, f"{size / 1e9:.3f} GB", ms(size / bandwidth), f"{bandwidth / size:.1f}",
                      ms(decode_ms) if size == model.weight_bytes else "", f"{size / H200.bandwidth * 1e3:.3f}")
    console.print(f"copy bandwidth measured now: {bandwidth / 1e9:.1f} GB/s; every decode step reads all weights once, "
                  f"so bytes / bandwidth is a floor on the time per token. H200 floor: the same bytes over an "
                  f"{H200.name}'s published {H200.bandwidth / 1e12:.1f} TB/s, "
                  f"{H200.bandwidth / bandwidth:.0f}x this CPU's measured bandwidth", table)

    console.rule("[bold]4. The course's tables, with this run's numbers")
    cache = KVCache(model.config, lengths[-1])
    logits = prefill(model, ids[: lengths[-1]], cache)                               # (1, V)
    gen = make_generator(0)
    start = now()
    for _ in range(20):
        sample(logits, [SamplingParams(top_p=0.9)], [gen], [ids], [[]])
    sample_s = (now() - start) / 20
    gemm = measure_gemm_flops(n=512)
    ridge = gemm / bandwidth                               # FLOP/byte where this machine stops being memory-bound
    console.print(f"ridge point = GEMM peak {gemm / 1e9:.1f} GFLOP/s (float32 512x512 matmul) / copy bandwidth "
                  f"{bandwidth / 1e9:.1f} GB/s = {ridge:.2f} FLOP/byte; both peaks are measured now and vary "
                  f"between runs")
    pre, dec = forward_cost(model.config, lengths[-1]), forward_cost(model.config, 1, lengths[-1])
    bound = lambda c: f"{'compute' if c.intensity > ridge else 'memory'} ({c.intensity:.2f} FLOP/byte)"  # noqa: E731
    t1 = Table("T1 phase", "processes", f"bottleneck (ridge {ridge:.2f} FLOP/byte)", "user-facing metric", "measured")
    t1.add_row("prefill", f"all {lengths[-1]} prompt tokens at once", bound(pre), "TTFT",
               f"{ms(ctx_runs[-1].prefill_s)} ms")
    t1.add_row("decode", "1 token + the KV cache", bound(dec), "ITL, tok/s", f"{ms(decode_ms)} ms/token")
    t1.add_row("sampling", f"{logits.shape[-1]:,} logits -> 1 id", "neither (tiny)", "part of ITL",
               f"{sample_s * 1e3:.2f} ms (top_p)")
    t2 = Table("T2 lever", "effect measured here", "trade-off", "mitigation")
    big = HYPOTHETICAL[1]
    t2.add_row("model size", f"{big[0]}: floor {ms(big[1] / bandwidth)} ms/token vs {ms(ours[0][1] / bandwidth)}",
               "quality vs speed", "right-size, distill")
    t2.add_row("context length", f"TTFT {ms(ctx_runs[0].ttft_s)} -> {ms(ctx_runs[-1].ttft_s)} ms "
               f"({lengths[0]} -> {lengths[-1]} tokens)", "more context, slower start, bigger cache",
               "trim prompts, cache prefixes")
    t2.add_row("output length", f"+{ms(per_token)} ms per token", "longer answers cost linearly",
               "max_tokens caps, stop strings")
    t2.add_row("quantization", f"weights kept 4-bit read {ours[0][1] / ours[1][1]:.1f}x fewer bytes: "
               f"floor {ms(ours[1][1] / bandwidth)} ms/token", "some accuracy", "4/8-bit weights (lesson 13)")
    t4 = Table("T4 tuning step", "what it bought here")
    t4.add_row("smaller or quantized model", f"floor {ms(ours[1][1] / bandwidth)} vs {ms(big[1] / bandwidth)} "
               f"ms/token (ours Q4_1 vs {big[0]})")
    t4.add_row("prompt trimming", f"{lengths[-1]} -> {lengths[0]} tokens saves "
               f"{ms(ctx_runs[-1].ttft_s - ctx_runs[0].ttft_s)} ms of TTFT")
    t4.add_row("continuous batching", "more requests per pass: lesson 08 measures it")
    t4.add_row("streaming", f"first text at {ms(first)} ms instead of {ms(blocking_total)} ms")
    t4.add_row("output caps + stops", f"{outputs[0]} instead of {outputs[-1]} tokens: total "
               f"{ms(out_runs[0].e2e_s)} instead of {ms(out_runs[-1].e2e_s)} ms")
    console.print(t1, t2, t4)

    console.rule("[bold]Interview question: which latencies do you watch, and why not just the total? (M3)")
    r0, r2 = results[0].metrics, results[2].metrics
    console.print(
        f"Each one separately, because the levers move them separately. The total alone hides what users feel: "
        f"streamed and not streamed, the same reply took {ms(streamed_total)} vs {ms(blocking_total)} ms in total, "
        f"yet its first text showed after {ms(first)} vs {ms(blocking_total)} ms. Request r2 did the same kind of work "
        f"as r0 (prefill {ms(r2.prefill_s)} vs {ms(r0.prefill_s)} ms) but waited {ms(r2.queue_s)} ms in the queue, so "
        f"its TTFT was {ms(r2.ttft_s)} ms against {ms(r0.ttft_s)}. TTFT follows the prompt ({ttft_growth:.1f}x from "
        f"{lengths[0]} to {lengths[-1]} tokens) and the queue; ITL ({ms(decode_ms)} ms/token here) follows the bytes "
        f"read per step ({ours[0][1] / 1e9:.2f} GB at {bandwidth / 1e9:.1f} GB/s); the total adds {ms(per_token)} ms "
        f"per output token. Caps and stops cut the total, trimming and queue control cut TTFT, a smaller or "
        f"quantized model cuts ITL.")


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
