"""Lesson 02: prefill vs decode — the first token waits for the whole prompt, each later token for one pass over
the weights, and the FLOPs and bytes of each phase say which resource limits it.

    python lessons/02_prefill_vs_decode.py [--prompt-tokens 200] [--new-tokens 16] [--lengths 16,64,256]
                                           [--steps 4] [--repeats 3]

Part 1 times one request (TTFT and inter-token latency, generate.py's metrics). Part 2 sweeps the prompt length
(prefill.py) and the context length (decode.py), and puts each measured time next to the work the pass does
(bench/machine.py's forward_cost) and this machine's measured peaks: bytes/s of a large copy, FLOP/s of a matmul.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import KVCache, SamplingParams, generate, load_model  # noqa: E402
from minitransformer.bench.machine import (H200, forward_cost, measure_copy_bandwidth,  # noqa: E402
                                           measure_gemm_flops, measure_matmul_rows, roofline_tokens_per_s)
from minitransformer.decode import decode_step  # noqa: E402
from minitransformer.prefill import prefill  # noqa: E402

TEXT = ("The history of the printing press begins in the fifteenth century, when movable metal type changed how "
        "books were made, how much they cost, and who could read them. ")
console = Console(width=None if sys.stdout.isatty() else 120)     # piped: don't cut lines at 80 columns


def timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def first_length(intensity, ridge: float, limit: int = 8192) -> str:
    """The smallest power of two n with intensity(n) above the ridge: the prompt length where prefill turns
    compute-bound."""
    n = 1
    while n <= limit and intensity(n) <= ridge:
        n *= 2
    return f"{n}" if n <= limit else f"over {limit}"


def batch_decode(model, tokens, L: int, batch: int, steps: int):
    """Seconds of each of `steps` decode steps of `batch` sequences at context L (after one warm-up step)."""
    cache = KVCache(model.config, L + steps + 1, batch=batch)
    prefill(model, [tokens[:L]] * batch, cache)                            # (B, L): the same prompt B times
    decode_step(model, [tokens[L]] * batch, cache)
    return [timed(lambda: decode_step(model, [tokens[L]] * batch, cache)) for _ in range(steps)]


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))   # the whole first sentence
    ap.add_argument("--prompt-tokens", type=int, default=200, help="prompt length of the timed request")
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens the timed request generates")
    ap.add_argument("--lengths", default="16,64,256", help="prompt (and decode context) lengths of the sweep")
    ap.add_argument("--steps", type=int, default=4, help="decode steps timed at each context length")
    ap.add_argument("--repeats", type=int, default=3, help="prefills per length; the median is shown")
    ap.add_argument("--batch", type=int, default=4, help="sequences per decode step in the batching part (4.)")
    args = ap.parse_args()
    for flag, value in (("--prompt-tokens", args.prompt_tokens), ("--new-tokens", args.new_tokens),
                        ("--steps", args.steps), ("--repeats", args.repeats), ("--batch", args.batch)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        raise InputError(f"--lengths must be comma-separated integers, got {args.lengths!r}") from None
    if not lengths or min(lengths) < 1:
        raise InputError(f"--lengths must be at least 1 each, got {args.lengths!r}")
    model = load_model()
    cfg, weights = model.config, model.weight_bytes
    tokens = model.tokenizer.encode(TEXT * (1 + max(lengths + [args.prompt_tokens]) // 20))   # 30 tokens a copy

    console.rule("[bold]1. This machine's two peaks")
    peaks = [(measure_copy_bandwidth(), measure_gemm_flops()) for _ in range(3)]     # 3 times: their spread
    bandwidth, gemm = (statistics.median(column) for column in zip(*peaks))
    ridge = gemm / bandwidth
    ridges = [g / b for b, g in peaks]
    near = lambda intensity: min(ridges) <= intensity <= max(ridges)        # noqa: E731 -- within the spread
    console.print(f"memory: {bandwidth / 1e9:.1f} GB/s (a 256 MiB copy, read + write); arithmetic: {gemm / 1e9:.1f} "
                  f"GFLOP/s (float32 1024x1024 matmul). Ridge point: {ridge:.1f} FLOP per byte (medians of 3 "
                  f"measurements; the ridge ranged {min(ridges):.1f}-{max(ridges):.1f}). A pass doing fewer FLOPs per "
                  "byte it moves waits on memory; one doing more waits on arithmetic.")

    console.rule(f"[bold]2. One request: a {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens")
    prompt = tokens[:args.prompt_tokens]
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    generate(model, prompt[:8], SamplingParams(max_tokens=2, temperature=0.0))      # warm-up: BLAS threads, pages
    result = generate(model, prompt, params)
    m = result.metrics
    ttft, itl = m.ttft_s, m.itl_summary()
    console.print(f"[cyan]prefill[/] TTFT = {ttft * 1e3:.0f} ms   [magenta]decode[/] ITL p50 = {itl['p50'] * 1e3:.1f} "
                  f"ms (mean {itl['mean'] * 1e3:.1f}, p90 {itl['p90'] * 1e3:.1f})   total = {m.e2e_s * 1e3:.0f} ms")
    console.print(f"check request: TTFT {ttft * 1e3:.2f} ms, ITL p50 {itl['p50'] * 1e3:.2f} ms, "
                  f"TTFT / ITL = {ttft / itl['p50']:.1f}")

    console.rule("[bold]3. Sweep: prefill of L tokens vs one decode step at context L")
    table = Table("phase", "L", "time ms", "tok/s", "GFLOP", "MB moved", "FLOP/byte", "GFLOP/s (of peak)",
                  "GB/s (of peak)", "bound by")
    rows = {}
    for L in lengths:
        caches = []

        def run_prefill():
            caches.append(KVCache(cfg, L + args.steps))
            prefill(model, tokens[:L], caches[-1])
        t_pre = statistics.median(timed(run_prefill) for _ in range(args.repeats))
        cache = caches[-1]
        t_dec = statistics.median(timed(lambda: decode_step(model, [tokens[L]], cache)) for _ in range(args.steps))
        costs = forward_cost(cfg, L, weight_bytes=weights), forward_cost(cfg, 1, L, weight_bytes=weights)
        for phase, colour, seconds, cost, n in (("prefill", "cyan", t_pre, costs[0], L),
                                                ("decode", "magenta", t_dec, costs[1], 1)):
            flops_s, bytes_s = cost.flops / seconds, cost.bytes / seconds
            bound = "compute" if cost.intensity > ridge else "memory"
            label = "near the ridge" if near(cost.intensity) else bound       # within the spread: no firm call
            rows[phase, L] = (seconds, cost, flops_s, bytes_s, bound)
            table.add_row(f"[{colour}]{phase}", str(L), f"{seconds * 1e3:.1f}", f"{n / seconds:.0f}",
                          f"{cost.flops / 1e9:.2f}", f"{cost.bytes / 1e6:.0f}", f"{cost.intensity:.1f}",
                          f"{flops_s / 1e9:.1f} ({flops_s / gemm:.0%})",
                          f"{bytes_s / 1e9:.1f} ({bytes_s / bandwidth:.0%})", f"[{colour}]{label}")
    console.print(table)
    console.print("FLOPs: 2 per weight per token + attention; bytes: weights once + KV cache + activations "
                  "(forward_cost's docstring). 'bound by' compares FLOP/byte with the ridge point; within the range "
                  "the ridge took over its 3 measurements, 'near the ridge' (no firm call inside the noise).")
    console.print("Diagram: figures/prefill_vs_decode_shapes.png, one layer's matrix products for a 64-token prompt "
                  "and for one decode token, drawn to scale, each with its FLOPs, bytes and FLOP/byte.")
    for (phase, L), (seconds, cost, _, _, bound) in rows.items():
        console.print(f"check cost: {phase} {L}: {cost.flops:.0f} FLOP, {cost.bytes:.0f} bytes, {seconds:.6f} s, "
                      f"{bound}")

    console.rule(f"[bold]4. Batching decode: one step for {args.batch} sequences at context {lengths[0]}")
    B, L0, n = args.batch, lengths[0], 2 * args.steps
    one, many = batch_decode(model, tokens, L0, 1, n), batch_decode(model, tokens, L0, B, n)
    t1, tb = statistics.median(one), statistics.median(many)
    c1, cb = forward_cost(cfg, 1, L0, weight_bytes=weights), forward_cost(cfg, 1, L0, batch=B, weight_bytes=weights)
    w = model.layers[0].w_gate_up                                                          # (576, 3072)
    mm = measure_matmul_rows(model.xp, w, (1, B))
    g1, gb = H200.seconds(H200.cost(cfg, 1, L0)), H200.seconds(H200.cost(cfg, 1, L0, batch=B))
    table = Table("batch", "ms per step (median)", "min-max ms", "tokens/s", "x a batch-1 step", "MB moved",
                  f"one matmul (B, {w.shape[0]}) @ ({w.shape[0]}, {w.shape[1]}): x B=1", "H200 roofline us",
                  "H200: x a batch-1 step")
    for b, times, t, c, g in ((1, one, t1, c1, g1), (B, many, tb, cb, gb)):
        table.add_row(str(b), f"{t * 1e3:.1f}", f"{min(times) * 1e3:.1f}-{max(times) * 1e3:.1f}", f"{b / t:.0f}",
                      f"{t / t1:.2f}", f"{c.bytes / 1e6:.0f}", f"{mm[b] / mm[1]:.2f}", f"{g * 1e6:.1f}",
                      f"{g / g1:.2f}")
    console.print(table, f"median of {n} steps each; MB moved from forward_cost (the weights are read once per step "
                         "whatever the batch); H200: roofline time at bf16 from the datasheet's "
                         f"{H200.bandwidth / 1e12:.1f} TB/s and {H200.flops / 1e12:.0f} TFLOP/s")
    console.print(f"check batch: {B} sequences {tb:.6f} s, 1 sequence {t1:.6f} s, ratio {tb / t1:.2f}; bytes ratio "
                  f"{cb.bytes / c1.bytes:.3f}; matmul ratio {mm[B] / mm[1]:.2f}; H200 ratio {gb / g1:.3f}")
    console.print(
        f"A step of {B} sequences moved {cb.bytes / c1.bytes:.2f}x the bytes of a step of one, yet took {tb / t1:.2f}x "
        f"as long, so batching {B} raised tokens/s only {B * t1 / tb:.1f}x. Bytes do not decide this on this CPU: one "
        f"matmul with {B} rows cost {mm[B] / mm[1]:.2f}x the same matmul with one row, because NumPy's BLAS multiplies "
        "one row with a matrix-vector routine and several rows with a matrix-matrix routine built for large blocks, "
        f"whose fixed work at a few rows outweighs the arithmetic (lesson 08's engine steps and lesson 12's verify "
        f"passes pay the same price). On an {H200.name} a bf16 step of {B} sequences is still bound by reading the "
        f"weights: {gb / g1:.2f}x a step of one, so {B} sequences would get about {B * g1 / gb:.1f}x the tokens/s, "
        f"until the batch nears its ridge: each sequence does 2 FLOPs per 2-byte weight read once, so B sequences "
        f"make about B FLOP/byte, compute-bound from about {H200.ridge:.0f} sequences (later still, as the cache "
        "reads grow with the batch).", highlight=False)

    longest = max(lengths)

    def verdict(intensity, bound):
        """A firm label only when the intensity is outside the range the measured ridge took."""
        return "near the ridge" if near(intensity) else f"{bound}-bound"
    t_pre, pre, pre_flops_s, pre_bytes_s, pre_bound = rows["prefill", longest]
    t_dec, dec, dec_flops_s, dec_bytes_s, dec_bound = rows["decode", longest]
    decode_ms = [rows["decode", L][0] * 1e3 for L in lengths]
    roofline = roofline_tokens_per_s(dec.bytes, bandwidth)
    console.rule("[bold]Interview questions")
    console.print(
        f"[bold]Why is the first token slower than the rest?[/] The first token needs the whole prompt through every "
        f"layer: prefill of {len(prompt)} tokens made TTFT {ttft * 1e3:.0f} ms, while each later token needs one "
        f"token's pass: ITL p50 {itl['p50'] * 1e3:.1f} ms, {ttft / itl['p50']:.0f}x less. In the sweep, prefill took "
        f"{rows['prefill', lengths[0]][0] * 1e3:.0f} ms at {lengths[0]} tokens and {t_pre * 1e3:.0f} ms at "
        f"{longest}, while a decode step took {min(decode_ms):.0f}-{max(decode_ms):.0f} ms at every context length. "
        f"That is also why total latency alone misleads: this request's {m.e2e_s * 1e3:.0f} ms were "
        f"{ttft / m.e2e_s:.0%} waiting for the first token, and TTFT and ITL have different causes and fixes.")
    console.print(
        f"[bold]Why does decode become memory-bandwidth-bound?[/] A decode step multiplies every weight by one row: "
        f"{dec.flops / 1e9:.2f} GFLOP over {dec.bytes / 1e6:.0f} MB moved = {dec.intensity:.2f} FLOP/byte, against "
        f"this machine's ridge of {ridge:.1f}: {verdict(dec.intensity, dec_bound)}. It ran at {dec_bytes_s / 1e9:.1f} GB/s "
        f"({dec_bytes_s / bandwidth:.0%} of the measured copy bandwidth) and {dec_flops_s / 1e9:.1f} GFLOP/s "
        f"({dec_flops_s / gemm:.0%} of the GEMM peak). Bytes bound it at {roofline:.0f} tokens/s (bandwidth / bytes "
        f"per token); measured {1 / t_dec:.0f}. Prefill of {longest} tokens reuses each weight {longest} times: "
        f"{pre.intensity:.0f} FLOP/byte, {pre_flops_s / 1e9:.1f} GFLOP/s ({pre_flops_s / gemm:.0%} of peak) at "
        f"{pre_bytes_s / 1e9:.1f} GB/s ({pre_bytes_s / bandwidth:.0%}): {verdict(pre.intensity, pre_bound)}.")
    g_dec, g_pre = H200.cost(cfg, 1, longest), H200.cost(cfg, longest)
    console.print(
        f"[bold]The same arithmetic on an {H200.name}[/] ({H200.bandwidth / 1e12:.1f} TB/s, {H200.flops / 1e12:.0f} "
        f"TFLOP/s dense {H200.dtype}, published figures, not measured here): its ridge is {H200.ridge:.0f} FLOP/byte "
        f"against this CPU's measured {ridge:.1f}. Decode at context {longest} in bf16: {g_dec.intensity:.2f} "
        f"FLOP/byte, memory-bound, at best {H200.seconds(g_dec) * 1e6:.0f} us per token "
        f"({1 / H200.seconds(g_dec):,.0f} tokens/s; this CPU's roof: {roofline:.0f}). Prefill of {longest} tokens: "
        f"{g_pre.intensity:.0f} FLOP/byte, {'compute' if g_pre.intensity > H200.ridge else 'memory'}-bound there, "
        f"at best {H200.seconds(g_pre) * 1e3:.3f} ms. A prompt of P tokens does 2P FLOPs per 2-byte weight, so on "
        f"the H200 prefill turns compute-bound from about {H200.ridge:.0f} tokens when only the weights cross memory "
        "(fused kernels keep activations on chip; forward_cost also counts every activation written and read back, "
        "as this NumPy code does), and on this CPU from about "
        f"{first_length(lambda n: forward_cost(cfg, n, weight_bytes=weights).intensity, ridge)} tokens: the faster "
        "the memory relative to the arithmetic units, the more tokens a pass needs to keep them busy. (A model this "
        "small runs far above these bounds on a real GPU: each step launches hundreds of small kernels.)",
        highlight=False)


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
