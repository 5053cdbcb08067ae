"""Benchmark of the single-request loop (a benchmark, not a test: these machines are shared and noisy).

    python scripts/bench_loop.py [--model PATH] [--repeats 3] [--json out.json]

Prints, for this machine and this run:
- the memory copy bandwidth (STREAM "copy" convention: bytes read + bytes written per second, all cores) and the
  float32 decode roofline it implies: tokens/s <= bandwidth / bytes read per token (every weight once, plus the cache);
- decode tokens/s at batch 1 and its fraction of that roofline;
- prefill tokens/s for a 200-token prompt;
- the time of no-cache generation over cached generation at 32, 128 and 256 new tokens, after a short and a
  200-token prompt (the same tokens, checked): the baseline's step n re-runs all prompt + n tokens, so the ratio
  grows with the prompt as well as with the output.
Each figure is the median of --repeats runs after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from minitransformer import SamplingParams, generate, load_model  # noqa: E402
from minitransformer.bench.machine import measure_copy_bandwidth, roofline_tokens_per_s  # noqa: E402
from minitransformer.kv_cache import estimate_kv_bytes  # noqa: E402

PROMPT = ("The history of the printing press begins in the fifteenth century, when movable type changed how books "
          "were made and who could read them.")


def median_of(repeats: int, run) -> float:
    run()                                                    # warm-up: first-touch page faults, BLAS threads
    return statistics.median(run() for _ in range(repeats))


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: the default model)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the median is reported")
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
    bandwidth = measure_copy_bandwidth()
    kv_read = estimate_kv_bytes(model.config, len(prompt_ids) + args.decode_tokens // 2)   # mean cache per step
    bytes_per_token = model.weight_bytes + kv_read
    numbers["copy_bandwidth_gb_s"] = bandwidth / 1e9
    numbers["bytes_read_per_decode_token"] = bytes_per_token
    numbers["roofline_decode_tok_s"] = roofline_tokens_per_s(bytes_per_token, bandwidth)

    def decode_rate() -> float:
        result = generate(model, prompt_ids, greedy(args.decode_tokens))
        return result.metrics.decode_tokens_per_s
    numbers["decode_tok_s_batch1"] = median_of(args.repeats, decode_rate)

    long_prompt = (tokenizer.encode(PROMPT * 20))[:200]

    def prefill_rate() -> float:
        result = generate(model, long_prompt, greedy(1))
        return len(long_prompt) / result.metrics.prefill_s
    numbers["prefill_tok_s_200"] = median_of(args.repeats, prefill_rate)

    ratios = {}                                  # (prompt tokens, new tokens) -> (no-cache seconds, cache seconds)
    for prompt in (prompt_ids, long_prompt):
        for n in args.new_tokens:
            cached = generate(model, prompt, greedy(n))
            baseline = generate(model, prompt, greedy(n), use_cache=False)
            if cached.token_ids != baseline.token_ids:
                raise SystemExit(f"cache and no-cache tokens differ at {n} new tokens: the benchmark is void")
            ratios[len(prompt), n] = (baseline.metrics.e2e_s, cached.metrics.e2e_s)
            numbers[f"no_cache_over_cache_p{len(prompt)}_n{n}"] = baseline.metrics.e2e_s / cached.metrics.e2e_s

    table = Table(title="the inference loop on this machine", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("against", justify="right")
    table.add_row("copy bandwidth (read + write)", f"{numbers['copy_bandwidth_gb_s']:.1f} GB/s", "")
    table.add_row("bytes read per decode token", f"{bytes_per_token / 2**20:.0f} MiB", "weights + cache")
    table.add_row("decode roofline (float32)", f"{numbers['roofline_decode_tok_s']:.1f} tok/s", "")
    table.add_row("decode, batch 1", f"{numbers['decode_tok_s_batch1']:.1f} tok/s",
                  f"{numbers['decode_tok_s_batch1'] / numbers['roofline_decode_tok_s']:.0%} of roofline")
    table.add_row("prefill, 200-token prompt", f"{numbers['prefill_tok_s_200']:.0f} tok/s",
                  f"{numbers['prefill_tok_s_200'] / numbers['decode_tok_s_batch1']:.1f}x decode")
    for (p, n), (slow, fast) in ratios.items():
        table.add_row(f"no cache / cache: {p} + {n} new tokens", f"{slow:.2f} s / {fast:.2f} s",
                      f"{slow / fast:.1f}x")
    console.print(table)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(numbers, handle, indent=2)


if __name__ == "__main__":
    main()
