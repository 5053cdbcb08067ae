"""Benchmark of the single-request loop (a benchmark, not a test: these machines are shared and noisy).

    python scripts/bench_loop.py [--model PATH] [--repeats 3] [--json out.json]

Prints, for this machine and this run:
- the read bandwidth of the machine profile (one row times a large matrix: how decode reads its weights) and the
  float32 decode roofline it implies: tokens/s <= bandwidth / bytes read per token (every weight once, plus the cache);
- decode tokens/s at batch 1 and its fraction of that roofline;
- prefill tokens/s for a 200-token prompt;
- the time of no-cache generation over cached generation at 32, 128 and 256 new tokens, after a short and a
  200-token prompt (the same tokens, checked): the baseline's step n re-runs all prompt + n tokens, so the ratio
  grows with the prompt as well as with the output.
Every timing goes through minitransformer/lab/measure.py: a warm-up, then --repeats runs; each figure is the fastest run
(noise only adds time) with the median and the spread next to it; cache and no cache run in turns
(measure.interleaved), and their ratio is called beyond noise only when every no-cache run is slower than every
cached one. A measure.Probe says at the end whether the machine was quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from minitransformer import SamplingParams, generate, load_model
from minitransformer.core.kv_cache import estimate_kv_bytes
from minitransformer.lab.machine import roofline_tokens_per_s
from minitransformer.lab.measure import Probe, Timing, interleaved, time_calls
from minitransformer.lab.peaks import machine_profile
from minitransformer.no_cache import RecomputeRunner

PROMPT = ("The history of the printing press begins in the fifteenth century, when movable type changed how books "
          "were made and who could read them.")


def seconds_of(repeats: int, run) -> Timing:
    """run() returns seconds it measured itself (a phase inside generate's metrics): one warm-up call (first-touch
    page faults, BLAS threads), then `repeats` calls made by measure.time_calls -> their seconds as a Timing."""
    seconds = []
    time_calls(lambda: seconds.append(run()), repeats=repeats, warmup=1)
    return Timing(tuple(seconds[1:]))


def rate(work: float, t: Timing) -> str:
    """'41.2 tok/s (median 39.8, spread 6%)': work / the fastest run first, then how much the runs moved."""
    return f"{work / t.min:.1f} tok/s (median {work / t.median:.1f}, spread {t.relative_spread:.0%})"


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: the default model)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per figure after a warm-up; the fastest is reported, with the median and spread")
    parser.add_argument("--decode-tokens", type=int, default=128, help="new tokens of the decode-speed runs")
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[32, 128, 256], metavar="N",
                        help="new-token counts of the no-cache / cache comparison")
    parser.add_argument("--json", metavar="PATH", help="also write the numbers to this file")
    args = parser.parse_args()
    console = Console()
    model = load_model(args.model)
    tokenizer = model.tokenizer
    prompt_ids = tokenizer.encode(PROMPT)
    numbers: dict[str, float] = {}

    console.print(f"[bold]{model.path.name}[/], {os.cpu_count()} cores, prompt of {len(prompt_ids)} tokens")
    probe = Probe()
    bandwidth = machine_profile()[0].read_bandwidth
    kv_read = estimate_kv_bytes(model.config, len(prompt_ids) + args.decode_tokens // 2)   # mean cache per step
    bytes_per_token = model.weight_bytes + kv_read
    numbers["read_bandwidth_gb_s"] = bandwidth / 1e9
    numbers["bytes_read_per_decode_token"] = bytes_per_token
    numbers["roofline_decode_tok_s"] = roofline_tokens_per_s(bytes_per_token, bandwidth)

    def decode_seconds_per_token() -> float:
        return 1 / generate(model, prompt_ids, greedy(args.decode_tokens)).metrics.decode_tokens_per_s
    decode = seconds_of(args.repeats, decode_seconds_per_token)
    numbers["decode_tok_s_batch1"] = 1 / decode.min
    numbers["decode_tok_s_batch1_median"] = 1 / decode.median

    long_prompt = (tokenizer.encode(PROMPT * 20))[:200]
    prefill = seconds_of(args.repeats, lambda: generate(model, long_prompt, greedy(1)).metrics.prefill_s)
    numbers["prefill_tok_s_200"] = len(long_prompt) / prefill.min
    numbers["prefill_tok_s_200_median"] = len(long_prompt) / prefill.median

    ratios = {}                                  # (prompt tokens, new tokens) -> {"no cache", "cache"}: Timing
    for prompt in (prompt_ids, long_prompt):
        for n in args.new_tokens:
            tokens = set()

            def run(use_cache: bool, prompt=prompt, n=n, tokens=tokens):
                runner = None if use_cache else RecomputeRunner
                return lambda: tokens.add(tuple(generate(model, prompt, greedy(n), runner=runner).token_ids))
            pair = interleaved({"no cache": run(False), "cache": run(True)}, repeats=args.repeats)
            if len(tokens) != 1:
                raise SystemExit(f"cache and no-cache tokens differ at {n} new tokens: the benchmark is void")
            ratios[len(prompt), n] = pair
            numbers[f"no_cache_over_cache_p{len(prompt)}_n{n}"] = pair["no cache"].min / pair["cache"].min
            numbers[f"no_cache_over_cache_p{len(prompt)}_n{n}_beyond_noise"] = pair["no cache"].min > pair["cache"].max
    quiet = probe.finish()
    numbers["quiet"] = quiet.quiet

    table = Table(title="the inference loop on this machine", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("against", justify="right")
    table.add_row("read bandwidth (machine profile)", f"{numbers['read_bandwidth_gb_s']:.1f} GB/s", "")
    table.add_row("bytes read per decode token", f"{bytes_per_token / 2**20:.0f} MiB", "weights + cache")
    table.add_row("decode roofline (float32)", f"{numbers['roofline_decode_tok_s']:.1f} tok/s", "")
    table.add_row("decode, batch 1", rate(1, decode),
                  f"{numbers['decode_tok_s_batch1'] / numbers['roofline_decode_tok_s']:.0%} of roofline")
    table.add_row("prefill, 200-token prompt", rate(len(long_prompt), prefill),
                  f"{numbers['prefill_tok_s_200'] / numbers['decode_tok_s_batch1']:.1f}x decode")
    for (p, n), pair in ratios.items():
        slow, fast = pair["no cache"], pair["cache"]
        noise = "" if slow.min > fast.max else " (within noise)"
        table.add_row(f"no cache / cache: {p} + {n} new tokens",
                      f"{slow.min:.2f} s / {fast.min:.2f} s (medians {slow.median:.2f} / {fast.median:.2f})",
                      f"{slow.min / fast.min:.1f}x{noise}")
    console.print(table)
    console.print(f"fastest of {args.repeats} runs after a warm-up, the median and spread next to it; "
                  f"{quiet.line()}" + ("" if quiet.quiet else f". Busy ({quiet.why_busy()}): rerun on a quiet machine"),
                  markup=False, highlight=False)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(numbers, handle, indent=2)


if __name__ == "__main__":
    main()
