"""Benchmark of the serving engine (a benchmark, not a test: these machines are shared and noisy).

    python scripts/bench_serving.py [--requests 16] [--max-tokens 64] [--baseline-requests 4] [--json]

Aggregate tokens/s for --requests concurrent requests (mixed prompts, greedy, fixed output length) through
- the Engine with continuous batching (all requests in one batch, max_num_seqs = --requests),
- our own batch-1 loop: generate() one request after another,
- llama.cpp single stream (llama-cpp-python, n_threads = cores), when `import llama_cpp` works,
and the ratios between them. Tokens/s counts every generated token over the wall time, prefill included, the same
way for all three (static vs continuous batching, which differ only with mixed output lengths, is lesson 08's).
The batch-1 and llama.cpp figures use --baseline-requests prompts spread over the list (the same mix of lengths; a
rate does not need all of them). It also prints what bounds a decode step: the weight bytes every step streams, over
its time. The three are timed in turns (measure.interleaved), --repeats rounds after one untimed round; each rate is
the fastest round's, with the median next to it, and a ratio is marked within noise when the two
rounds' ranges overlap. A measure.Probe says whether the machine was quiet.
--json prints one JSON object on stdout instead of the table.
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
from minitransformer import SamplingParams, generate, load_model

# The prompt mix and the engine run are shared with `minitransformer bench`.
from minitransformer.bench.workloads import run_engine, serving_prompts as prompts
from minitransformer.lab.measure import Probe, interleaved
from minitransformer.lab.peaks import machine_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: the default model)")
    parser.add_argument("--requests", type=int, default=16, help="concurrent requests")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--baseline-requests", type=int, default=4, help="requests timed one by one")
    parser.add_argument("--max-prompt-tokens", type=int, help="cut every prompt to this many tokens")
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp even when it is installed")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the three, in turns; the fastest is reported")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args()
    console = Console(stderr=args.json)
    model = load_model(args.model)
    prompt_ids = [model.tokenizer.encode(text)[:args.max_prompt_tokens] for text in prompts(args.requests)]  # ids
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
    generate(model, prompt_ids[0], SamplingParams(max_tokens=4, temperature=0.0))          # warm-up
    numbers = {"requests": args.requests, "max_tokens": args.max_tokens, "cores": os.cpu_count()}
    spaced = list(range(0, args.requests, max(1, args.requests // args.baseline_requests)))[:args.baseline_requests]

    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    if args.no_llama_cpp:
        llama_cpp = None
    if llama_cpp is not None:
        llm = llama_cpp.Llama(model_path=str(model.path), n_ctx=1024, n_threads=os.cpu_count(), verbose=False)
        eos = {model.tokenizer.eos_id: -1e9}                    # fixed output length, as ignore_eos above

    last, tokens, same = {}, {}, [True]                  # the last round's engine and results; tokens per round

    def continuous():
        _, last["results"], last["engine"] = run_engine(model, prompt_ids, params, "continuous")
        tokens["continuous"] = sum(len(r.token_ids) for r in last["results"])

    def batch1():                                        # the same mix of lengths, one request after another
        outs = [generate(model, prompt_ids[i], params) for i in spaced]
        tokens["batch1"] = sum(len(out.token_ids) for out in outs)
        if "results" in last:
            same[0] &= all(out.token_ids == last["results"][i].token_ids for out, i in zip(outs, spaced))

    def llama_single_stream():
        outs = [llm.create_completion(prompt_ids[i], max_tokens=args.max_tokens, temperature=0.0, logit_bias=eos)
                for i in spaced]
        tokens["llama_cpp"] = sum(out["usage"]["completion_tokens"] for out in outs)

    runs = {"continuous": continuous, "batch1": batch1}
    if llama_cpp is not None:
        runs["llama_cpp"] = llama_single_stream
    probe = Probe()
    timings = interleaved(runs, repeats=args.repeats, warmup=1)          # one untimed round first
    quiet = probe.finish()
    rates = {}
    for name, t in timings.items():
        numbers[f"{name}_tok_s"] = tokens[name] / t.min
        numbers[f"{name}_tok_s_median"] = tokens[name] / t.median
        rates[name] = (tokens[name] / t.max, tokens[name] / t.min)      # the slowest and the fastest round
    numbers["engine_tokens_equal_batch1"] = bool(same[0])
    numbers["quiet"], numbers["quietness"] = quiet.quiet, quiet.line()

    engine = last["engine"]
    most = max(r.num_decode_tokens for r in engine.step_log)            # args.requests unless max_tokens is tiny
    decode_steps = [r.duration_s for r in engine.step_log if r.num_decode_tokens == most]
    numbers["decode_step_sequences"] = most
    numbers["decode_step_s_median"] = statistics.median(decode_steps)
    numbers["weight_gb_s_in_decode"] = model.weight_bytes / numbers["decode_step_s_median"] / 1e9
    numbers["read_bandwidth_gb_s"] = machine_profile()[0].read_bandwidth / 1e9      # a read-only stream
    numbers["prefill_step_s"] = engine.step_log[0].duration_s
    numbers["prefill_tokens"] = engine.step_log[0].num_prefill_tokens

    if args.json:
        print(json.dumps(numbers))
        return
    table = Table(title=f"{args.requests} requests x {args.max_tokens} tokens, {os.cpu_count()} cores",
                  title_justify="left")
    for column in ("engine", "tok/s", "vs batch-1 loop", "vs llama.cpp"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    def versus(name: str, other: str) -> str:
        """Fastest over fastest, and 'within noise' when the two rounds' ranges of tok/s overlap."""
        if other not in rates:
            return "n/a"
        (low, high), (other_low, other_high) = rates[name], rates[other]
        apart = name == other or low > other_high or high < other_low
        return f"{high / other_high:.2f}x" + ("" if apart else " (within noise)")
    labels = {"continuous": "continuous batching", "batch1": "our batch-1 loop",
              "llama_cpp": "llama.cpp single stream (llama-cpp-python)"}
    for name in timings:
        rate = f"{numbers[f'{name}_tok_s']:.1f} (median {numbers[f'{name}_tok_s_median']:.1f})"
        table.add_row(labels[name], rate, versus(name, "batch1"), versus(name, "llama_cpp"))
    console.print(table)
    console.print(f"fastest of {args.repeats} rounds in turns; {quiet.line()}"
                  + ("" if quiet.quiet else f". Busy ({quiet.why_busy()}): rerun on a quiet machine"),
                  markup=False, highlight=False)
    console.print(f"decode step with {numbers['decode_step_sequences']} sequences: "
                  f"{numbers['decode_step_s_median'] * 1e3:.0f} ms (median), streaming all "
                  f"{model.weight_bytes / 2**20:.0f} MiB of weights once: "
                  f"{numbers['weight_gb_s_in_decode']:.1f} GB/s of weights, against a read bandwidth of "
                  f"{numbers['read_bandwidth_gb_s']:.1f} GB/s on this machine.\n"
                  f"first step: {numbers['prefill_tokens']} prompt tokens in {numbers['prefill_step_s']:.2f} s; "
                  f"engine tokens equal the batch-1 loop's: {numbers['engine_tokens_equal_batch1']}")


if __name__ == "__main__":
    main()
