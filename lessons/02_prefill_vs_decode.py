"""Lesson 02: prefill vs decode — the first token waits for the whole prompt, each later token for one pass over
the weights, and the FLOPs and bytes of each phase say which resource limits it.

    python lessons/02_prefill_vs_decode.py [--prompt-tokens 200] [--new-tokens 16] [--lengths 16,64,256]
                                           [--steps 10] [--repeats 5] [--batch 4]

Part 2 times one request (TTFT and inter-token latency, generate.py's metrics) several times. Part 3 sweeps the
prompt length (prefill.py) and the context length (decode.py), and puts each measured time next to the work the pass
does (lab/machine.py's forward_cost) and this machine's profile: bytes/s of a large read, FLOP/s of a matmul.
Every timing is repeated after a warm-up, and every comparison is timed in turns (minitransformer/lab/measure.py); the
lesson's claims (claims() below) are decided from the numbers it prints, and a claim about time is stated only when
it holds beyond the measured spread on a quiet machine.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import re
import statistics
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import KVCache, SamplingParams, generate, load_model
from minitransformer.core.decode import decode_step
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.prefill import prefill
from minitransformer.lab.claims import Claim, bound_line, find_numbers, flat, report
from minitransformer.lab.machine import H200, forward_cost, roofline_tokens_per_s
from minitransformer.lab.measure import Probe, Timing, interleaved
from minitransformer.lab.peaks import machine_profile

TEXT = ("The history of the printing press begins in the fifteenth century, when movable metal type changed how "
        "books were made, how much they cost, and who could read them. ")
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's ridge point first. It is this machine's FLOP/byte where compute and memory meet.",
    "In section 3's table, compare each row's FLOP/byte with that ridge. The `says` column names the bound.",
    "In section 4, `x a batch-1 step` is what one step for 4 sequences costs next to a step for one.",
    "The claim lines under 'What this run shows' say which of these this run could show.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()

NEAR = 2.0                # FLOP/byte within 2x of the ridge: no firm call (the ridge is itself two timings)
RATE_DIP = 0.10           # prefill tok/s "does not fall" when each longer prompt keeps at least 90% of the shorter's
DECODE_BAND = 0.25        # a decode step is "flat" when its fastest time moves less than 25% across the contexts
MEMORY_PACE = 0.5         # decode "runs at the memory's pace" when it moves at least half the read bandwidth
COMPUTE_PACE = 1 / 3      # prefill "runs near the arithmetic roof" when it reaches at least a third of the GEMM peak
MATMUL_REPEATS = 20       # one matmul takes ~0.1 ms: cheap to repeat


# ------------------------------------------------------------------------------------------------ the claims

def cost_lines(output: str) -> dict[tuple[str, int], dict[str, float]]:
    """{(phase, L): numbers} from the 'check cost:' lines, in the order printed."""
    found = {}
    for m in re.finditer(r"check cost: (prefill|decode) (\d+): (\d+) FLOP, (\d+) bytes, ([\d.]+)-([\d.]+) s "
                         r"\(median ([\d.]+)\)", flat(output)):
        flops, nbytes, lo, hi, median = (float(x) for x in m.groups()[2:])
        found[m[1], int(m[2])] = {"flops": flops, "bytes": nbytes, "min": lo, "max": hi, "median": median}
    if not found:
        raise ValueError("the output has no 'check cost:' lines")
    return found


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Times are the fastest (min) and slowest (max) of repeated runs; a claim
    about time holds only beyond that spread. Which resource bounds a pass is read from FLOP/byte against the ridge:
    a count, not a time (timed=False), though the ridge itself was measured."""
    bandwidth, gemm, ridge = find_numbers(output, r"check peaks: bandwidth ([\d.]+) GB/s, GEMM ([\d.]+) GFLOP/s, "
                                                  r"ridge ([\d.]+) FLOP/byte")
    ttft_lo, ttft_hi, itl_lo, itl_hi = find_numbers(output, r"check request: TTFT ([\d.]+)-([\d.]+) ms, ITL p50 "
                                                            r"([\d.]+)-([\d.]+) ms")
    cost = cost_lines(output)
    lengths = sorted(L for phase, L in cost if phase == "prefill")
    pre = [cost["prefill", L] for L in lengths]
    dec = [cost["decode", L] for L in lengths]
    longest, first, last = pre[-1], dec[0], dec[-1]
    rates = [L / p["min"] for L, p in zip(lengths, pre)]                     # prefill tokens/s, fastest run
    dips = [b / a - 1 for a, b in zip(rates, rates[1:])]
    decode_change = last["min"] / first["min"] - 1
    decode_bytes_s = last["bytes"] / last["min"] / 1e9                      # GB/s of the fastest step
    prefill_flops_s = longest["flops"] / longest["min"] / 1e9                # GFLOP/s of the fastest pass
    b, many_lo, many_hi, one_lo, one_hi = find_numbers(
        output, r"check batch: (\d+) sequences ([\d.]+)-([\d.]+) s, 1 sequence ([\d.]+)-([\d.]+) s")
    mm_lo, mm_hi, mm1_lo, mm1_hi = find_numbers(output, r"matmul \d+ rows ([\d.]+)-([\d.]+) us, 1 row "
                                                        r"([\d.]+)-([\d.]+) us")
    h_ridge, h_decode, h_batch = find_numbers(output, r"check h200: ridge ([\d.]+) FLOP/byte, decode ([\d.]+) "
                                                      r"FLOP/byte, batch ratio ([\d.]+)")
    intensity = lambda c: c["flops"] / c["bytes"]
    return [
        Claim("first-token-slower", "the first token takes longer than each later one (a whole prompt vs one "
              "token)", ttft_lo > itl_hi, f"fastest TTFT {ttft_lo:.1f} ms vs slowest ITL p50 {itl_hi:.1f} ms"),
        Claim("decode-memory-bound", f"a decode step does too few FLOPs per byte for the arithmetic to limit it "
              f"(below the ridge / {NEAR:.0f})", all(intensity(d) < ridge / NEAR for d in dec),
              f"decode {max(intensity(d) for d in dec):.2f} FLOP/byte at most, ridge {ridge:.2f}", timed=False),
        Claim("prefill-compute-bound", f"a {lengths[-1]}-token prefill does enough FLOPs per byte for the "
              f"arithmetic to limit it (above {NEAR:.0f}x the ridge)", intensity(longest) > ridge * NEAR,
              f"{intensity(longest):.1f} FLOP/byte, ridge {ridge:.2f}", timed=False),
        Claim("prefill-rate", f"prefill tokens/s does not fall as the prompt grows (each step within "
              f"{RATE_DIP:.0%})", all(d >= -RATE_DIP for d in dips),
              "fastest runs " + " -> ".join(f"{r:.0f}" for r in rates) + " tok/s at " +
              ", ".join(map(str, lengths)) + " tokens"),
        Claim("prefill-token-cheaper", f"a token of a {lengths[-1]}-token prefill costs less than a decode step",
              longest["max"] / lengths[-1] < last["min"],
              f"{longest['max'] / lengths[-1] * 1e3:.2f} ms per prompt token at the slowest vs "
              f"{last['min'] * 1e3:.1f} ms per decode step at the fastest"),
        Claim("decode-flat", f"a decode step's time barely changes with the context (within {DECODE_BAND:.0%})",
              abs(decode_change) <= DECODE_BAND,
              f"fastest step {first['min'] * 1e3:.1f} ms at {lengths[0]} -> {last['min'] * 1e3:.1f} ms at "
              f"{lengths[-1]} ({decode_change:+.0%})"),
        Claim("decode-memory-pace", f"a decode step moves its bytes at the memory's pace (at least "
              f"{MEMORY_PACE:.0%} of the read bandwidth)", decode_bytes_s >= MEMORY_PACE * bandwidth,
              f"{decode_bytes_s:.1f} GB/s vs {bandwidth:.1f} GB/s"),
        Claim("prefill-compute-pace", f"a {lengths[-1]}-token prefill runs near the arithmetic roof (at least "
              f"{COMPUTE_PACE:.0%} of the GEMM peak)", prefill_flops_s >= COMPUTE_PACE * gemm,
              f"{prefill_flops_s:.1f} GFLOP/s vs {gemm:.1f} GFLOP/s"),
        Claim("batch-costs-more", f"a decode step of {b:.0f} sequences takes longer than a step of one",
              many_lo > one_hi, f"{many_lo * 1e3:.1f}-{many_hi * 1e3:.1f} ms vs {one_lo * 1e3:.1f}-"
              f"{one_hi * 1e3:.1f} ms"),
        Claim("batch-gain", f"batching {b:.0f} sequences raises decode tokens/s",
              many_hi < b * one_lo, f"{b:.0f} sequences at the slowest {many_hi * 1e3:.1f} ms vs {b:.0f} single "
              f"steps at the fastest {b * one_lo * 1e3:.1f} ms"),
        Claim("matmul-rows", f"one matmul with {b:.0f} rows costs more than the same matmul with one row",
              mm_lo > mm1_hi, f"{mm_lo:.0f}-{mm_hi:.0f} us vs {mm1_lo:.0f}-{mm1_hi:.0f} us"),
        Claim("h200-memory-bound", f"on the H200 (datasheet) a bf16 decode step is memory-bound and a batch of "
              f"{b:.0f} costs within 5% of one sequence", h_decode < h_ridge and h_batch < 1.05,
              f"{h_decode:.2f} FLOP/byte vs ridge {h_ridge:.0f}; batch ratio {h_batch:.3f}", timed=False),
    ]


# ------------------------------------------------------------------------------------------------ the lesson

def first_length(intensity, ridge: float, limit: int = 8192) -> str:
    """The smallest power of two n with intensity(n) above the ridge: the prompt length where prefill turns
    compute-bound."""
    n = 1
    while n <= limit and intensity(n) <= ridge:
        n *= 2
    return f"{n}" if n <= limit else f"over {limit}"


def label(intensity: float, ridge: float) -> str:
    """What FLOP/byte says about a pass: a firm call only when it is more than NEAR x away from the ridge."""
    if intensity > ridge * NEAR:
        return "compute"
    return "memory" if intensity < ridge / NEAR else "near the ridge"


def times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def ms_range(t: Timing) -> str:
    return f"{t.min * 1e3:.1f}-{t.max * 1e3:.1f} ms"


def one_request(model, prompt, params, repeats: int):
    """The same request `repeats` times after a warm-up request: TTFT, ITL p50 and e2e of each, as Timings."""
    generate(model, prompt[:8], SamplingParams(max_tokens=2, temperature=0.0))      # warm-up: BLAS threads, pages
    metrics = [generate(model, prompt, params).metrics for _ in range(repeats)]
    return (Timing(tuple(m.ttft_s for m in metrics)), Timing(tuple(m.itl_summary()["p50"] for m in metrics)),
            Timing(tuple(m.e2e_s for m in metrics)), metrics)


def sweep(model, tokens, lengths, prefill_repeats: int, decode_repeats: int):
    """{L: Timing} of a prefill of L tokens, then of one decode step at context L; each set timed in turns."""
    caches = {L: KVCache(model.config, L + 1) for L in lengths}

    def prefill_of(L):
        def run():
            caches[L].truncate(0)                                       # the same empty cache every time
            prefill(model, tokens[:L], caches[L])
        return run

    def decode_at(L):
        def run():
            caches[L].truncate(L)                                       # back to context L: one new row each time
            decode_step(model, [tokens[L]], caches[L])
        return run
    prefills = interleaved({L: prefill_of(L) for L in lengths}, repeats=prefill_repeats)
    decodes = interleaved({L: decode_at(L) for L in lengths}, repeats=decode_repeats)
    return prefills, decodes


def batch_steps(model, tokens, L: int, batch: int, repeats: int):
    """Timings of one decode step for 1 sequence and for `batch` sequences at context L, in turns."""
    def step_of(B):
        cache = KVCache(model.config, L + 1, batch=B)
        prefill(model, [tokens[:L]] * B, cache)                              # (B, L): the same prompt B times

        def run():
            cache.truncate(L)
            decode_step(model, [tokens[L]] * B, cache)
        return run
    return interleaved({1: step_of(1), batch: step_of(batch)}, repeats=repeats)


def matmul_rows(model, batch: int):
    """x (T, D) @ w_gate_up (D, 2F) for T = 1 and T = batch, timed in turns: the same weights read, T rows."""
    w = model.layers[0].w_gate_up                                                # (576, 3072)
    x = {T: np.ones((T, w.shape[0]), dtype=w.dtype) for T in (1, batch)}        # (T, D)
    return w.shape, interleaved({T: (lambda x=x[T]: x @ w) for T in (1, batch)}, repeats=MATMUL_REPEATS)


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))   # the whole first sentence
    ap.add_argument("--prompt-tokens", type=int, default=200, help="prompt length of the timed request")
    ap.add_argument("--new-tokens", type=int, default=16, help="tokens the timed request generates (at least 2)")
    ap.add_argument("--lengths", default="16,64,256", help="prompt (and decode context) lengths of the sweep")
    ap.add_argument("--steps", type=int, default=10, help="timed decode steps at each context length and batch")
    ap.add_argument("--repeats", type=int, default=5, help="timed requests (part 2) and prefills per length (part 3)")
    ap.add_argument("--batch", type=int, default=4, help="sequences per decode step in the batching part (4.)")
    args = ap.parse_args()
    for flag, value, least in (("--prompt-tokens", args.prompt_tokens, 1), ("--new-tokens", args.new_tokens, 2),
                               ("--steps", args.steps, 1), ("--repeats", args.repeats, 1),
                               ("--batch", args.batch, 2)):
        if value < least:
            raise InputError(f"{flag} must be at least {least}, got {value}")
    try:
        lengths = sorted(set(int(x) for x in args.lengths.split(",")))
    except ValueError:
        raise InputError(f"--lengths must be comma-separated integers, got {args.lengths!r}") from None
    if not lengths or min(lengths) < 1:
        raise InputError(f"--lengths must be at least 1 each, got {args.lengths!r}")
    model = load_model()
    probe = Probe()                                                      # is the machine quiet during this run?
    cfg, weights = model.config, model.weight_bytes
    tokens = model.tokenizer.encode(TEXT * (1 + max(lengths + [args.prompt_tokens]) // 20))   # 30 tokens a copy

    console.rule("[bold]1. This machine's two peaks")
    profile, measured_here = machine_profile()
    bandwidth, gemm, ridge = profile.read_bandwidth, profile.gemm_peak, profile.ridge
    console.print(profile.line(), markup=False, highlight=False)
    console.print(f"memory: {bandwidth / 1e9:.1f} GB/s read (one row times a {profile.read_bytes / 2**20:.0f} MiB "
                  f"matrix, a read-only stream the way a decode step reads its weights; a copy, which writes every "
                  f"byte it reads, moved {profile.copy_bandwidth / 1e9:.1f} GB/s counting both); arithmetic: "
                  f"{gemm / 1e9:.1f} GFLOP/s (float32 1024x1024 matmul). Ridge point: {ridge:.1f} FLOP per byte ("
                  + ("measured by this run" if measured_here else "measured once for this set of runs by "
                     "scripts/make_transcripts.py, so every transcript quotes this profile")
                  + "). A pass doing fewer FLOPs per byte it moves waits on memory; one doing more waits on "
                  f"arithmetic. The peaks are timings too (a busy machine lowers them), so this lesson calls a pass "
                  f"memory- or compute-bound only when its FLOP/byte is more than {NEAR:.0f}x away from the ridge.")
    console.print(f"check peaks: bandwidth {bandwidth / 1e9:.2f} GB/s, GEMM {gemm / 1e9:.2f} GFLOP/s, ridge "
                  f"{ridge:.2f} FLOP/byte")

    console.rule(f"[bold]2. One request: a {args.prompt_tokens}-token prompt, {args.new_tokens} new tokens, "
                 f"{times(args.repeats)}")
    prompt = tokens[:args.prompt_tokens]
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
    ttft, itl, e2e, metrics = one_request(model, prompt, params, args.repeats)
    console.print(f"the request ran {times(args.repeats)} after a warm-up request; each figure is the fastest run, "
                  "then the median and the spread (max - min): the fastest is what a quiet machine gives, the median "
                  "what you typically get, the spread how far to trust either.")
    console.print(f"[cyan]prefill[/] TTFT {ttft.ms()}   [magenta]decode[/] ITL p50 {itl.ms()}   total {e2e.ms()}")
    console.print(f"check request: TTFT {ms_range(ttft)}, ITL p50 {ms_range(itl)}, TTFT / ITL = "
                  f"{ttft.min / itl.min:.1f} (fastest runs)")

    console.rule("[bold]3. Sweep: prefill of L tokens vs one decode step at context L")
    prefills, decodes = sweep(model, tokens, lengths, args.repeats, args.steps)
    console.print(f"prefills timed in turns across the lengths ({args.repeats} rounds), decode steps likewise "
                  f"({args.steps} rounds), each after a warm-up round; rates are from the fastest run")
    table = Table("phase", "L", "min ms", "median ms", "spread ms", "tok/s", "MB moved", "FLOP/byte",
                  "GFLOP/s (of peak)", "GB/s (of peak)", "FLOP/byte says")
    lines = []
    for L in lengths:
        for phase, colour, t, cost, n in (
                ("prefill", "cyan", prefills[L], forward_cost(cfg, L, weight_bytes=weights), L),
                ("decode", "magenta", decodes[L], forward_cost(cfg, 1, L, weight_bytes=weights), 1)):
            flops_s, bytes_s = cost.flops / t.min, cost.bytes / t.min
            table.add_row(f"[{colour}]{phase}", str(L), f"{t.min * 1e3:.1f}", f"{t.median * 1e3:.1f}",
                          f"{t.spread * 1e3:.1f}", f"{n / t.min:.0f}", f"{cost.bytes / 1e6:.0f}",
                          f"{cost.intensity:.1f}", f"{flops_s / 1e9:.1f} ({flops_s / gemm:.0%})",
                          f"{bytes_s / 1e9:.1f} ({bytes_s / bandwidth:.0%})",
                          f"[{colour}]{label(cost.intensity, ridge)}")
            lines.append(f"check cost: {phase} {L}: {cost.flops:.0f} FLOP, {cost.bytes:.0f} bytes, "
                         f"{t.min:.6f}-{t.max:.6f} s (median {t.median:.6f})")
    console.print(table)
    console.print("FLOPs: 2 per weight per token + attention; bytes: weights once + KV cache + activations "
                  "(forward_cost's docstring). GFLOP/s and GB/s are achieved rates, from the fastest run. 'FLOP/byte "
                  f"says' compares FLOP/byte with the ridge: within {NEAR:.0f}x of it, 'near the ridge'.")
    quickest = min(decodes, key=lambda L: decodes[L].min)
    console.print(bound_line("decode-step", decodes[quickest].min * 1e3, profile.floor_seconds(weights) * 1e3,
                             fmt=".2f") + f" (the fastest decode step, at context {quickest}; floor = weight bytes / "
                  "read bandwidth: every step reads every weight once)")
    console.print("Diagram: figures/prefill_vs_decode_shapes.png, one layer's matrix products for a 64-token prompt "
                  "and for one decode token, drawn to scale, each with its FLOPs, bytes and FLOP/byte.")
    for line in lines:
        console.print(line)

    B, L0 = args.batch, lengths[0]
    console.rule(f"[bold]4. Batching decode: one step for {B} sequences vs one at context {L0}")
    steps = batch_steps(model, tokens, L0, B, args.steps)
    t1, tb = steps[1], steps[B]
    c1, cb = forward_cost(cfg, 1, L0, weight_bytes=weights), forward_cost(cfg, 1, L0, batch=B, weight_bytes=weights)
    shape, mm = matmul_rows(model, B)
    g1, gb = H200.seconds(H200.cost(cfg, 1, L0)), H200.seconds(H200.cost(cfg, 1, L0, batch=B))
    table = Table("batch", "min ms", "median ms", "spread ms", "tokens/s", "x a batch-1 step", "MB moved",
                  f"one matmul (B, {shape[0]}) @ {shape}: us", "H200 roofline us", "H200: x a batch-1 step")
    for b, t, c, m, g in ((1, t1, c1, mm[1], g1), (B, tb, cb, mm[B], gb)):
        table.add_row(str(b), f"{t.min * 1e3:.1f}", f"{t.median * 1e3:.1f}", f"{t.spread * 1e3:.1f}",
                      f"{b / t.min:.0f}", f"{t.min / t1.min:.2f}", f"{c.bytes / 1e6:.0f}",
                      f"{m.min * 1e6:.0f} (median {m.median * 1e6:.0f})", f"{g * 1e6:.1f}", f"{g / g1:.2f}")
    console.print(table, f"the two steps timed in turns ({args.steps} rounds), the two matmuls likewise "
                         f"({MATMUL_REPEATS}); tokens/s and ratios from the fastest runs. MB moved from forward_cost "
                         "(the weights are read once per step whatever the batch); H200: roofline time at bf16 from "
                         f"the datasheet's {H200.bandwidth / 1e12:.1f} TB/s and {H200.flops / 1e12:.0f} TFLOP/s")
    console.print(f"check batch: {B} sequences {tb.min:.6f}-{tb.max:.6f} s, 1 sequence {t1.min:.6f}-{t1.max:.6f} s, "
                  f"ratio {tb.min / t1.min:.2f}; bytes ratio {cb.bytes / c1.bytes:.3f}; matmul {B} rows "
                  f"{mm[B].min * 1e6:.1f}-{mm[B].max * 1e6:.1f} us, 1 row {mm[1].min * 1e6:.1f}-"
                  f"{mm[1].max * 1e6:.1f} us, ratio {mm[B].min / mm[1].min:.2f}; H200 ratio {gb / g1:.3f}")
    longest = max(lengths)
    g_dec, g_pre = H200.cost(cfg, 1, longest), H200.cost(cfg, longest)
    console.print(f"check h200: ridge {H200.ridge:.0f} FLOP/byte, decode {g_dec.intensity:.2f} FLOP/byte, batch "
                  f"ratio {gb / g1:.3f}")

    console.rule("[bold]5. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview questions")
    pre, dec = forward_cost(cfg, longest, weight_bytes=weights), forward_cost(cfg, 1, longest, weight_bytes=weights)
    t_pre, t_dec = prefills[longest], decodes[longest]
    answer = [f"[bold]Why is the first token slower than the rest?[/] The first token needs the whole prompt to pass "
              f"through every layer. Each later token needs one token's pass. The same request, with a prompt of "
              f"{len(prompt)} tokens, was run {times(args.repeats)}. It had TTFT {ttft.min * 1e3:.0f} ms at the "
              f"fastest (median {ttft.median * 1e3:.0f}) and ITL p50 {itl.min * 1e3:.1f} ms "
              f"(median {itl.median * 1e3:.1f})."]
    if shown["first-token-slower"]:
        answer.append(f"The first token took {ttft.min / itl.min:.0f}x as long, beyond the spread of either.")
    else:
        answer.append("This run could not show the difference beyond its spread. The claims above say why.")
    answer.append(f"In the sweep, prefill took {prefills[lengths[0]].min * 1e3:.0f} ms at {lengths[0]} tokens and "
                  f"{t_pre.min * 1e3:.0f} ms at {longest} (fastest runs).")
    answer.append(f"That is {t_pre.min / longest * 1e3:.2f} ms per prompt token against {t_dec.min * 1e3:.1f} ms "
                  "for a decode step.")
    if shown["prefill-token-cheaper"]:
        answer.append("The prompt's tokens share each read of the weights. A decode step has only one token to "
                      "share it with.")
    else:
        answer.append("This run could not show the difference beyond its spread.")
    decode_ms = ", ".join(f"{decodes[L].min * 1e3:.1f}" for L in lengths)
    if shown["decode-flat"]:
        answer.append(f"A decode step took {decode_ms} ms at contexts {', '.join(map(str, lengths))}. That is "
                      "about the same, because the weights it reads dwarf the cache it reads.")
    else:
        answer.append(f"A decode step took {decode_ms} ms at contexts {', '.join(map(str, lengths))}. This run "
                      "could not show whether that stays flat.")
    share = [m.ttft_s / m.e2e_s for m in metrics]
    answer.append(f"This is also why total latency alone misleads. TTFT was {statistics.median(share):.0%} of this "
                  "request's total (median of the runs). TTFT and ITL have different causes and different fixes.")
    console.print(" ".join(answer))

    dec_flops_s, dec_bytes_s = dec.flops / t_dec.min, dec.bytes / t_dec.min
    pre_flops_s, pre_bytes_s = pre.flops / t_pre.min, pre.bytes / t_pre.min
    roofline, made = roofline_tokens_per_s(dec.bytes, bandwidth), 1 / t_dec.min
    answer = [f"[bold]Why does decode become memory-bandwidth-bound?[/] A decode step multiplies every weight by one "
              f"row. It does {dec.flops / 1e9:.2f} GFLOP over {dec.bytes / 1e6:.0f} MB moved = {dec.intensity:.2f} "
              f"FLOP/byte, against this machine's ridge of {ridge:.1f}:"]
    answer.append(f"more than {NEAR:.0f}x below it, memory-bound." if shown["decode-memory-bound"] else
                  f"not {NEAR:.0f}x below it, too near to call.")
    answer.append(f"Its fastest step at context {longest} moved {dec_bytes_s / 1e9:.1f} GB/s "
                  f"({dec_bytes_s / bandwidth:.0%} of the read bandwidth) and did {dec_flops_s / 1e9:.1f} GFLOP/s "
                  f"({dec_flops_s / gemm:.0%} of the GEMM peak). At the read bandwidth its bytes allow "
                  f"{roofline:.0f} tokens/s (bandwidth / bytes per step); its fastest step made {made:.0f} "
                  f"({made / roofline:.0%} of that).")
    if shown["decode-memory-pace"]:
        answer.append("So it runs at the memory's pace. It is memory-bound when measured, not only on paper.")
    else:
        answer.append("This run could not show it running at the memory's pace. The claims above say why.")
    if made > roofline:
        answer.append("That is above the roofline. The byte count assumes every activation goes to memory and back; "
                      "the small ones stay in the caches, so the step moved fewer bytes than counted. The weights "
                      "alone cannot be read faster, which the bound line above holds the step to.")
    answer.append(f"Prefill of {longest} tokens reuses each weight {longest} times: {pre.intensity:.1f} FLOP/byte,")
    answer.append(f"more than {NEAR:.0f}x the ridge, compute-bound." if shown["prefill-compute-bound"] else
                  f"not {NEAR:.0f}x above the ridge, too near to call.")
    answer.append(f"Its fastest pass did {pre_flops_s / 1e9:.1f} GFLOP/s ({pre_flops_s / gemm:.0%} of the GEMM "
                  f"peak) at {pre_bytes_s / 1e9:.1f} GB/s ({pre_bytes_s / bandwidth:.0%} of the read bandwidth)."
                  + (" That is near the arithmetic roof." if shown["prefill-compute-pace"] else
                     " This run could not show it running near the arithmetic roof."))
    rates = " -> ".join(f"{L / prefills[L].min:.0f}" for L in lengths)
    if shown["prefill-rate"]:
        answer.append(f"And prefill tokens/s did not fall as the prompt grew ({rates} tok/s at "
                      f"{', '.join(map(str, lengths))} tokens). A longer prompt spreads each weight read over more "
                      "tokens. That goes on until the arithmetic, not the memory, sets the pace.")
    else:
        answer.append(f"Prefill tokens/s went {rates} at {', '.join(map(str, lengths))} tokens. This run could not "
                      "show that it does not fall as the prompt grows.")
    console.print(" ".join(answer))

    gain = B * t1.min / tb.min
    answer = [f"[bold]What does batching decode buy?[/] A step of {B} sequences moved {cb.bytes / c1.bytes:.2f}x "
              f"the bytes of a step of one and took {tb.min / t1.min:.2f}x as long (fastest steps; ranges "
              f"{ms_range(tb)} and {ms_range(t1)}),"]
    if shown["batch-gain"]:
        answer.append(f"so batching {B} raised tokens/s {gain:.1f}x, beyond the spread.")
    else:
        answer.append(f"so {gain:.1f}x the tokens/s at the fastest. This run could not show batching {B} raising "
                      "tokens/s beyond its spread.")
    if shown["batch-costs-more"] and shown["matmul-rows"]:
        answer.append(f"Bytes do not decide this on this CPU. One matmul with {B} rows cost "
                      f"{mm[B].min / mm[1].min:.2f}x the same matmul with one row. NumPy's BLAS multiplies one row "
                      "with a matrix-vector routine. Several rows go to a matrix-matrix routine built for large "
                      "blocks. At a few rows, that routine's fixed work outweighs the arithmetic. Lesson 08's engine "
                      "steps and lesson 12's verify passes pay the same price.")
    elif shown["batch-costs-more"]:
        answer.append(f"The step of {B} took longer for about the same bytes. This run could not show why from one "
                      f"matmul: {mm[B].min * 1e6:.0f} vs {mm[1].min * 1e6:.0f} us at the fastest.")
    else:
        answer.append(f"This run could not show a step of {B} costing more than a step of one beyond the spread.")
    if shown["h200-memory-bound"]:
        answer.append(f"On an {H200.name} a bf16 step of {B} sequences is still bound by reading the weights. It "
                      f"costs {gb / g1:.2f}x a step of one, so {B} sequences would get about {B * g1 / gb:.1f}x the "
                      "tokens/s. That holds until the batch nears the ridge. Each sequence does 2 FLOPs per 2-byte "
                      "weight, and each weight is read once for all of them. So B sequences make about B FLOP/byte, "
                      f"and the step turns compute-bound from about {H200.ridge:.0f} sequences. The cache reads grow "
                      "with the batch, so in practice it turns later still.")
    console.print(" ".join(answer), highlight=False)

    console.print(
        f"[bold]The same arithmetic on an {H200.name}[/] ({H200.bandwidth / 1e12:.1f} TB/s, {H200.flops / 1e12:.0f} "
        f"TFLOP/s dense {H200.dtype}, published figures, not measured here). On those figures its ridge is "
        f"{H200.ridge:.0f} FLOP/byte, against this CPU's measured {ridge:.1f}. Decode at context {longest} in bf16 "
        f"does {g_dec.intensity:.2f} FLOP/byte, so it is {'compute' if g_dec.intensity > H200.ridge else 'memory'}"
        f"-bound there. It takes at best {H200.seconds(g_dec) * 1e6:.0f} us per token "
        f"({1 / H200.seconds(g_dec):,.0f} tokens/s). This CPU's read bandwidth allows {roofline:.0f} tokens/s. "
        f"Prefill of {longest} tokens does {g_pre.intensity:.0f} FLOP/byte, so it is "
        f"{'compute' if g_pre.intensity > H200.ridge else 'memory'}-bound there, at best "
        f"{H200.seconds(g_pre) * 1e3:.3f} ms. A prompt of P tokens does 2P FLOPs per 2-byte weight. So on the H200, "
        f"prefill turns compute-bound from about {H200.ridge:.0f} tokens when only the weights cross memory. That is "
        "what fused kernels achieve: they keep activations on chip. forward_cost also counts every activation "
        "written and read back, as this NumPy code does. By that count, prefill on this CPU passes the ridge from "
        f"about {first_length(lambda n: forward_cost(cfg, n, weight_bytes=weights).intensity, ridge)} tokens. The "
        "faster the memory is next to the arithmetic units, the more tokens a pass needs to keep them busy. A model "
        "this small runs far above these bounds on a real GPU, because each step launches hundreds of small "
        "kernels.",
        highlight=False)


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
