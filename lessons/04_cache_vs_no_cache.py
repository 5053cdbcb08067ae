"""Lesson 04: the KV cache vs recomputing everything — identical tokens; how each loop's step time changes as the
context grows, and what the total costs.

    python lessons/04_cache_vs_no_cache.py [--prompt-tokens 40] [--tokens 48] [--rows 8]

Both runs are generate.py's loop: with the cache (prefill.py + decode.py) and with no_cache.py's baseline, whose
step n runs the model over the prompt and all n tokens so far again. Greedy sampling, so the tokens must agree.
The lesson's claims (claims() below) are decided from the numbers it prints, and a timing claim is stated only when
the run was quiet (minitransformer/lab/measure.py): on a busy machine the lesson says it could not show it.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import SamplingParams, generate, load_model
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.lab.claims import Claim, find_numbers, report, table_with
from minitransformer.lab.measure import Probe
from minitransformer.no_cache import RecomputeRunner

TEXT = ("The history of the printing press begins in the fifteenth century, when movable metal type changed how "
        "books were made, how much they cost, and who could read them. ")
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 2's table first. Compare the `cache ms` and `no cache ms` columns as the step number grows.",
    "Section 1's `check tokens` line says whether both loops produced the same tokens.",
    "Section 3's `check totals` line gives both loops' total time.",
    "The claim lines under 'What this run shows' say which trends this run showed beyond the noise.",
)

console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
FLAT_BAND = 0.25            # a cached step counts as flat when its last quarter is within 25% of its first


def step_times(result) -> np.ndarray:
    """Seconds of each step: the first is prefill + sample (TTFT minus queueing), then the gaps between tokens."""
    m = result.metrics
    return np.diff([m.scheduled_time] + m.token_times)                       # (n,)


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Each step was timed once, so a quarter's min-max range is the spread."""
    same, n = find_numbers(output, r"check tokens: identical at (\d+) of (\d+) positions")
    c_lo, c_hi, c_lo2, c_hi2, s_lo, s_hi, s_lo2, s_hi2 = find_numbers(
        output, r"check quarters: cache first ([\d.]+)-([\d.]+) ms, last ([\d.]+)-([\d.]+) ms; no cache first "
        r"([\d.]+)-([\d.]+) ms, last ([\d.]+)-([\d.]+) ms")
    c_first, c_last, s_first, s_last = find_numbers(
        output, r"decode steps, first vs last quarter \(medians\): cache ([\d.]+) -> ([\d.]+) ms .*?no cache "
        r"([\d.]+) -> ([\d.]+) ms")
    table = table_with(output, "cache ms")
    steps, fast, slow = table.numbers("step"), table.numbers("cache ms"), table.numbers("no cache ms")
    decode = [(s, f, w) for s, f, w in zip(steps, fast, slow) if s > 1]             # step 1 is the prefill
    slowest = max(decode, key=lambda r: r[1] / r[2]) if decode else (0, 0.0, 1.0)
    total_fast, total_slow = find_numbers(output, r"check totals: cache ([\d.]+) s, no cache ([\d.]+) s")
    per_fast, per_slow = find_numbers(output, r"per token-pass: ([\d.]+) ms in a cached decode step .*? vs "
                                              r"([\d.]+) ms inside a recompute step")
    change = c_last / c_first - 1
    return [
        Claim("same-tokens", "both loops produce the same tokens", same == n, f"{same:.0f} of {n:.0f}", timed=False),
        Claim("recompute-grows", "without the cache, a step's time grows with the context",
              s_lo2 > s_hi, f"no-cache steps {s_first:.1f} -> {s_last:.1f} ms (medians); the last quarter's fastest "
              f"{s_lo2:.1f} ms vs the first quarter's slowest {s_hi:.1f} ms"),
        Claim("cache-flat", "with the cache, a step's time stays flat",
              abs(change) <= FLAT_BAND and (c_last - c_first) < (s_last - s_first) / 4,
              f"cached steps {c_first:.1f} -> {c_last:.1f} ms ({change:+.0%}, band ±{FLAT_BAND:.0%}; ranges "
              f"{c_lo:.1f}-{c_hi:.1f} and {c_lo2:.1f}-{c_hi2:.1f} ms), against a no-cache change of "
              f"{s_last - s_first:+.1f} ms"),
        Claim("cache-faster", "every decode step shown is faster with the cache",
              all(f < w for _, f, w in decode),
              f"closest: step {slowest[0]:.0f}, {slowest[1]:.1f} ms cached vs {slowest[2]:.1f} ms recomputed"),
        Claim("total", "the cached loop takes less time in total", total_fast < total_slow,
              f"{total_fast:.3f} s vs {total_slow:.3f} s"),
        Claim("shared-reads", "a recompute step costs less per token than a cached step (each weight read serves "
              "many tokens)", per_slow < per_fast, f"{per_slow:.2f} vs {per_fast:.2f} ms per token-pass"),
    ]


def quarter(times: np.ndarray, last: bool) -> np.ndarray:
    """The first or last quarter of the decode steps (steps 2..N; step 1 is the prefill)."""
    decode = times[1:]
    k = max(1, len(decode) // 4)
    return decode[-k:] if last else decode[:k]


def trend(times: np.ndarray) -> tuple[float, float, float]:
    """(first quarter's median, last quarter's median, seconds per token between them). The slope joins the two
    medians, the quarters' middles (N - k - 1 tokens apart), so it cannot contradict them in sign, as a least-squares
    line through every step could when one noisy step pulls it."""
    first, last = float(np.median(quarter(times, False))), float(np.median(quarter(times, True)))
    k = len(quarter(times, False))
    apart = len(times) - k - 1                                  # from the middle of steps 2..k+1 to that of the last k
    return first, last, (last - first) / apart if apart > 0 else 0.0


def main():
    ap = argparse.ArgumentParser(description="Lesson 04: the KV cache vs recomputing everything: identical tokens, "
                                 "flat vs growing step times.")
    ap.add_argument("--prompt-tokens", type=int, default=40, help="prompt length in tokens (cut from a fixed text)")
    ap.add_argument("--tokens", type=int, default=48, help="new tokens (greedy, EOS ignored)")
    ap.add_argument("--rows", type=int, default=8, help="steps shown in the table")
    ap.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: SmolLM2-135M)")
    args = ap.parse_args()
    for flag, value in (("--prompt-tokens", args.prompt_tokens), ("--tokens", args.tokens), ("--rows", args.rows)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    model = load_model(args.model)
    probe = Probe()                                                      # is the machine quiet during this run?
    prompt = model.tokenizer.encode(TEXT * (1 + args.prompt_tokens // 20))[:args.prompt_tokens]
    P, N = len(prompt), args.tokens
    params = SamplingParams(max_tokens=N, temperature=0.0, ignore_eos=True)
    generate(model, prompt[:8], SamplingParams(max_tokens=2, temperature=0.0))      # warm-up: BLAS threads, pages

    console.rule(f"[bold]1. The same request twice: {P} prompt tokens, {N} new tokens")
    cached = generate(model, prompt, params)
    console.print(f"with the cache: {cached.metrics.e2e_s:.2f} s, cache holds {cached.kv_cache_tokens} tokens = "
                  f"{cached.kv_cache_bytes:,} bytes at the end")
    recompute = generate(model, prompt, params, runner=RecomputeRunner)
    console.print(f"without it:     {recompute.metrics.e2e_s:.2f} s, nothing stored between steps")
    same = sum(a == b for a, b in zip(cached.token_ids, recompute.token_ids))
    console.print(f"check tokens: identical at {same} of {N} positions; ids {cached.token_ids}")
    console.print(f"text: {cached.text!r}")

    console.rule("[bold]2. Time per step, with the cache and without")
    fast, slow = step_times(cached), step_times(recompute)                  # (N,) each
    shown = sorted(set(np.linspace(0, N - 1, min(args.rows, N)).round().astype(int)))
    scale = 40 / slow.max()
    table = Table("step", "tokens through the model", "cache ms", "no cache ms", "no-cache / cache",
                  "step time: [green]cache[/] (top) / [red]no cache[/] (bottom)")
    for i in shown:
        work_fast, work_slow = (P if i == 0 else 1), P + i
        table.add_row(str(i + 1), f"{work_fast} vs {work_slow}", f"{fast[i] * 1e3:.1f}", f"{slow[i] * 1e3:.1f}",
                      f"{slow[i] / fast[i]:.1f}x", "[green]" + "█" * max(1, round(fast[i] * scale)) + "\n[red]"
                      + "█" * max(1, round(slow[i] * scale)))
    console.print(table)
    first_fast, last_fast, slope_fast = trend(fast)                        # slope: seconds per extra token
    first_slow, last_slow, slope_slow = trend(slow)
    console.print(f"decode steps, first vs last quarter (medians): cache {first_fast * 1e3:.1f} -> "
                  f"{last_fast * 1e3:.1f} ms (slope {slope_fast * 1e6:+.0f} us per token), no cache "
                  f"{first_slow * 1e3:.1f} -> {last_slow * 1e3:.1f} ms (slope {slope_slow * 1e6:+.0f} us per token)")
    ranges = [f"{q.min() * 1e3:.1f}-{q.max() * 1e3:.1f} ms" for t in (fast, slow) for q in (quarter(t, False),
                                                                                          quarter(t, True))]
    console.print(f"check quarters: cache first {ranges[0]}, last {ranges[1]}; no cache first {ranges[2]}, last "
                  f"{ranges[3]}")

    console.rule("[bold]3. The totals")
    passes_fast = P + (N - 1)                                  # prompt once, then one token per step
    passes_slow = sum(P + i for i in range(N))                 # step i runs all P + i tokens again
    total_fast, total_slow = cached.metrics.e2e_s, recompute.metrics.e2e_s
    console.print(f"check work: token-passes cache {passes_fast}, no cache {passes_slow} "
                  f"({passes_slow / passes_fast:.1f}x the work)")
    console.print(f"check totals: cache {total_fast:.3f} s, no cache {total_slow:.3f} s, ratio "
                  f"{total_slow / total_fast:.2f}x")

    per_token_slow = slow[1:].sum() / (passes_slow - P)        # seconds per token-pass in the recompute steps
    per_token_fast = fast[1:].mean() if N > 1 else fast[0]    # a decode step: one token-pass
    console.print(f"per token-pass: {per_token_fast * 1e3:.2f} ms in a cached decode step (one token per read of the "
                  f"weights) vs {per_token_slow * 1e3:.2f} ms inside a recompute step ({P + 1}-{P + N - 1} tokens "
                  "per read): why the time ratio is smaller than the work ratio (lesson 02)")

    console.rule("[bold]4. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview question: what does the KV cache buy, and what would recomputing cost?")
    answer = [f"Both loops produced the same {N} tokens ({same} of {N} identical). Without the cache, step n runs "
              f"the model over all {P} + n tokens again. So the total work is quadratic: {passes_slow:,} "
              f"token-passes instead of {passes_fast:,}. With the cache, each step runs one token against the stored "
              f"keys and values. The price is {cached.kv_cache_bytes:,} bytes of cache."]
    if shown["recompute-grows"] and shown["cache-flat"]:
        answer.append(f"The clock agrees. The recompute steps went from {first_slow * 1e3:.0f} to "
                      f"{last_slow * 1e3:.0f} ms ({slope_slow * 1e6:+.0f} us per extra token). The cached steps "
                      f"went from {first_fast * 1e3:.0f} to {last_fast * 1e3:.0f} ms.")
    else:
        answer.append("This run's step times could not show how each loop's step grows. The claims above say why. "
                      "The token-pass counts hold whatever the machine is doing.")
    if shown["total"] and shown["shared-reads"]:
        answer.append(f"In total {total_slow:.2f} s vs {total_fast:.2f} s = {total_slow / total_fast:.1f}x. The time "
                      f"ratio is below the {passes_slow / passes_fast:.0f}x work ratio. A recompute pass shares each "
                      f"weight read among many tokens: {per_token_slow * 1e3:.2f} ms per token-pass vs "
                      f"{per_token_fast * 1e3:.2f} ms. The work ratio grows with the output, and the gap with it. "
                      "Try --tokens 128.")
    else:
        answer.append(f"In total {total_slow:.2f} s vs {total_fast:.2f} s. This run was not quiet enough to say "
                      "what the ratio means. Run it again with nothing else on the machine.")
    console.print(" ".join(answer))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
