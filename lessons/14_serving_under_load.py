"""Lesson 14: serving under load: requests arrive over time, and a bigger batch trades one latency for another.

    python lessons/14_serving_under_load.py [--requests 16] [--rates 2,8] [--max-num-seqs 1,4,16]
                                           [--max-tokens 24] [--max-prompt 160] [--num-blocks N] [--repeats 2]
                                           [--figure PATH]

Lesson 08 gave the engine all its requests at once. A real server gets them one at a time, at random moments (a
Poisson process: independent arrivals at an average rate), and each request's latency splits into three waits:

    queue   = first scheduled - arrival     waiting for a free slot in the running batch (max_num_seqs)
    prefill = first token - first scheduled  its prompt's forward pass (shared with whatever else runs that step)
    decode  = last token - first token       its other tokens, one per engine step

The common mistake is "a bigger batch always helps". It raises throughput only while requests are waiting for slots;
each step also gets slower as the batch grows (every running request's next token waits for the whole step), and the
KV cache must hold every running request's keys and values. This lesson drives the real Engine with timed arrivals, the
loop `minitransformer serve` runs (that server's engine thread does exactly this between HTTP requests; `minitransformer
bench serve` measures the same quantities over HTTP), and sweeps the arrival rate and max_num_seqs.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import SamplingParams, load_model  # noqa: E402
from minitransformer.bench.machine import H200  # noqa: E402
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer.metrics import now  # noqa: E402
from minitransformer.serving import Engine  # noqa: E402

TEXT = ("The old lighthouse keeper climbed the stairs every evening to light the lamp. Ships passed in the dark, "
        "their crews trusting a light they never saw being lit. One winter a storm cut the island off for a month, "
        "and the keeper wrote down everything he remembered about the sea, the birds and the people who had lived "
        "there before him. ") * 6
console = Console(width=None if sys.stdout.isatty() else 120)     # piped: don't cut titles at 80 columns


def workload(tokenizer, n: int, max_prompt: int, max_tokens: int, seed: int):
    """n requests: (prompt ids of 16..max_prompt tokens, max_tokens), the same for every configuration."""
    rng, ids = np.random.default_rng(seed), tokenizer.encode(TEXT)
    lengths = rng.integers(16, max_prompt + 1, n)
    starts = rng.integers(0, len(ids) - max_prompt, n)
    return [(ids[s:s + p], max_tokens) for s, p in zip(starts, lengths)]


def arrival_offsets(n: int, rate: float, seed: int) -> np.ndarray:
    """Poisson arrivals: exponential gaps with mean 1/rate seconds; the first request arrives at 0."""
    gaps = np.random.default_rng(seed + 1).exponential(1.0 / rate, n)
    return np.concatenate([[0.0], np.cumsum(gaps[1:])])


def serve(model, requests, offsets, max_num_seqs: int, num_blocks):
    """The server's engine loop, in real time: add each request when its arrival time has come, step while there
    is work, sleep until the next arrival otherwise. Returns the results, the engine and the wall time."""
    engine = Engine(model, max_num_seqs=max_num_seqs, num_blocks=num_blocks, enable_prefix_caching=False)
    start, pending, results, peak_blocks = now(), list(range(len(requests))), {}, 0
    while pending or engine.has_unfinished_requests():
        while pending and now() - start >= offsets[pending[0]]:
            i = pending.pop(0)
            prompt, max_tokens = requests[i]
            engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                               request_id=f"r{i:02d}", arrival_time=start + offsets[i])   # queue counts from here
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    results[out.request_id] = out.result
            bm = engine.block_manager
            peak_blocks = max(peak_blocks, bm.num_blocks - bm.num_free_blocks)
        else:
            time.sleep(max(0.0, offsets[pending[0]] - (now() - start)))
    return results, engine, now() - start, peak_blocks


def summarize(results, engine, wall: float, peak_blocks: int) -> dict:
    """Throughput and the three waits (p50 / p99) over all requests of one run."""
    rs = list(results.values())
    pct = lambda xs, q: float(np.percentile(xs, q))                                     # noqa: E731
    queue = [r.metrics.queue_s for r in rs]
    prefill = [r.metrics.prefill_s for r in rs]
    decode = [r.metrics.e2e_s - r.metrics.ttft_s for r in rs]
    ttft = [r.metrics.ttft_s for r in rs]
    itl = np.concatenate([r.metrics.itl_s for r in rs])
    tokens = sum(len(r.token_ids) for r in rs)
    return {"tok_s": tokens / wall, "wall": wall,
            "queue50": pct(queue, 50), "queue99": pct(queue, 99), "prefill50": pct(prefill, 50),
            "decode50": pct(decode, 50), "ttft50": pct(ttft, 50), "ttft99": pct(ttft, 99),
            "itl50": pct(itl, 50), "itl99": pct(itl, 99), "preemptions": engine.stats.num_preemptions,
            "kv_mib": engine.kv_bytes(peak_blocks * engine.block_manager.block_size) / 2**20}


def draw(path: Path, runs: dict, rates, sizes) -> None:
    """TTFT p99, ITL p50 and throughput against max_num_seqs, one line per arrival rate."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for rate in rates:
        for ax, key, scale in zip(axes, ("ttft99", "itl50", "tok_s"), (1, 1e3, 1)):
            ax.plot(sizes, [runs[rate, m][key] * scale for m in sizes], "o-", label=load_label(rate))
    for ax, title in zip(axes, ("TTFT p99 (s): queueing", "ITL p50 (ms): every step slower",
                                "output tokens/s: throughput")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(m) for m in sizes])
        ax.set_xlabel("max_num_seqs (batch slots)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Serving under load: a bigger batch trades queueing for slower tokens (minitransformer lesson 14)")
    fig.tight_layout()
    fig.savefig(path, dpi=80)


def parse_list(text: str, name: str, kind=float) -> list:
    try:
        values = [kind(x) for x in text.split(",")]
    except ValueError:
        raise InputError(f"{name} must be comma-separated numbers, got {text!r}") from None
    if min(values) <= 0:
        raise InputError(f"{name} values must be > 0, got {text!r}")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16, help="requests per run (at least 2)")
    ap.add_argument("--rates", default="2,8", help="arrival rates to try, requests per second (default 2,8)")
    ap.add_argument("--max-num-seqs", default="1,4,16", help="batch slots to try (default 1,4,16)")
    ap.add_argument("--max-tokens", type=int, default=24, help="tokens each request generates (default 24)")
    ap.add_argument("--max-prompt", type=int, default=160, help="longest prompt in tokens (16 to 400; default 160)")
    ap.add_argument("--num-blocks", type=int, help="KV pool blocks of 16 tokens (default: room for every slot)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts and the arrival times")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of the two configurations the answer compares (at least 2): a change is a finding "
                         "only beyond their spread")
    ap.add_argument("--figure", type=Path, help="write the sweep figure here (PNG)")
    args = ap.parse_args()
    if args.repeats < 2:
        raise InputError(f"--repeats must be at least 2 (one run has no spread), got {args.repeats}")
    if args.requests < 2:
        raise InputError(f"--requests must be at least 2, got {args.requests}")
    if args.max_tokens < 2:
        raise InputError(f"--max-tokens must be at least 2 (an inter-token latency needs two tokens), got "
                         f"{args.max_tokens}")
    if not 16 <= args.max_prompt <= 400:
        raise InputError(f"--max-prompt must be in [16, 400], got {args.max_prompt}")
    rates = parse_list(args.rates, "--rates")
    sizes = sorted(parse_list(args.max_num_seqs, "--max-num-seqs", int))
    model = load_model()
    requests = workload(model.tokenizer, args.requests, args.max_prompt, args.max_tokens, args.seed)
    console.rule(f"[bold]{args.requests} requests (prompts 16-{args.max_prompt} tokens, {args.max_tokens} new tokens "
                 "each, greedy), Poisson arrivals")
    table = Table("rate /s", "slots", "out tok/s", "queue p50", "queue p99", "prefill p50", "decode p50",
                  "TTFT p99", "ITL p50 ms", "ITL p99 ms", "preempt", "KV MiB")
    runs = {}
    for rate in rates:
        offsets = arrival_offsets(args.requests, rate, args.seed)
        for m in sizes:
            results, engine, wall, peak = serve(model, requests, offsets, m, args.num_blocks)
            s = runs[rate, m] = summarize(results, engine, wall, peak)
            table.add_row(f"{rate:g}", str(m), f"{s['tok_s']:.1f}", f"{s['queue50']:.2f}", f"{s['queue99']:.2f}",
                          f"{s['prefill50']:.2f}", f"{s['decode50']:.2f}", f"{s['ttft99']:.2f}",
                          f"{s['itl50'] * 1e3:.1f}", f"{s['itl99'] * 1e3:.1f}", str(s["preemptions"]),
                          f"{s['kv_mib']:.1f}")
    console.print(table)
    console.print("rate: arrivals per second (inf: all at once); slots: max_num_seqs. Per request, queue + prefill = "
                  "TTFT and decode = the rest of its reply, in seconds (p50 / p99 over the requests); ITL = gaps "
                  "between its tokens; out tok/s = all generated tokens / wall time of the run; KV MiB = the most "
                  "cache held at once. Timings are wall-clock on a shared machine: compare rows of one run.",
                  highlight=False)
    if args.figure:
        draw(args.figure, runs, rates, sizes)
        console.print(f"figure written: {args.figure}")
    spread, offsets = {}, arrival_offsets(args.requests, max(rates), args.seed)
    for m in dict.fromkeys((sizes[0], sizes[-1])):       # the answer's two configurations, run again
        every = [runs[max(rates), m]] + [summarize(*serve(model, requests, offsets, m, args.num_blocks))
                                         for _ in range(args.repeats - 1)]
        spread[m] = {k: max(r[k] for r in every) - min(r[k] for r in every) for k in SPREAD}
        console.print(f"spread over {args.repeats} runs ({load_label(max(rates))}, max_num_seqs {m}), max - min: "
                      f"tok/s {spread[m]['tok_s']:.1f}, TTFT p99 {spread[m]['ttft99']:.2f} s, ITL p50 "
                      f"{spread[m]['itl50'] * 1e3:.1f} ms, ITL p99 {spread[m]['itl99'] * 1e3:.1f} ms", highlight=False)
    answer(runs, rates, sizes, args, spread, model.config)


SPREAD = ("tok_s", "ttft99", "itl50", "itl99")          # the numbers the answer compares


def beyond(a: dict, b: dict, key: str, spread: dict) -> bool:
    """True when b differs from a by more than the larger run-to-run spread of the two configurations."""
    return abs(b[key] - a[key]) > max(spread[0][key], spread[1][key])


def load_label(rate: float) -> str:
    return "all requests at once" if np.isinf(rate) else f"{rate:g} requests/s"


def answer(runs, rates, sizes, args, spread, config) -> None:
    """The interview answer, with this run's numbers; a change is called a change only beyond the run-to-run spread
    measured by running the two compared configurations again."""
    hi, lo, small, big = max(rates), min(rates), sizes[0], sizes[-1]
    a, b, c = runs[hi, small], runs[hi, big], runs[lo, big]
    pair = (spread[small], spread[big])
    noise = lambda key: "" if beyond(a, b, key, pair) else " (within noise)"                # noqa: E731
    if beyond(a, b, "itl50", pair) and b["itl50"] > a["itl50"]:
        itl = "But the same change made every token slower: ITL p50 "
    else:
        itl = ("The usual cost, every token slower, did not show beyond the run-to-run spread: ITL p50 "
               if not beyond(a, b, "itl50", pair) else "And every token came sooner: ITL p50 ")
    opposite = (beyond(a, b, "tok_s", pair) and beyond(a, b, "ttft99", pair)
                and (b["tok_s"] > a["tok_s"]) == (b["ttft99"] > a["ttft99"]))
    gpu = H200.seconds(H200.cost(config, 1, 64, batch=big)) / H200.seconds(H200.cost(config, 1, 64, batch=small))
    console.rule("[bold]Interview question: how would you improve throughput for a high-traffic chat API?")
    console.print(
        f"Under the heavier load ({load_label(hi)}), going from max_num_seqs {small} to {big} changed output "
        f"throughput {a['tok_s']:.1f} -> {b['tok_s']:.1f} tok/s{noise('tok_s')} and TTFT p99 {a['ttft99']:.2f} -> "
        f"{b['ttft99']:.2f} s{noise('ttft99')}, almost all of it queueing (queue p99 {a['queue99']:.2f} -> "
        f"{b['queue99']:.2f} s): continuous batching with enough slots is the first lever, because a request that "
        f"waits for a slot waits for someone else's whole reply. {itl}{a['itl50'] * 1e3:.1f} -> "
        f"{b['itl50'] * 1e3:.1f} ms (p99 {a['itl99'] * 1e3:.1f} -> {b['itl99'] * 1e3:.1f} ms{noise('itl99')}, when a "
        f"newcomer's prompt is prefilled in the same step), and the KV cache held up to {b['kv_mib']:.1f} MiB instead "
        f"of {a['kv_mib']:.1f} MiB. On this CPU a step of several sequences costs several one-sequence steps (NumPy's "
        f"BLAS, lesson 02 part 4); on an {H200.name} a bf16 decode step of {big} sequences would cost {gpu:.2f}x one "
        f"of {small} at its roofline (reading the weights dominates), so there the ITL price of more slots stays "
        f"small until the batch nears {H200.ridge:.0f} sequences. At the lighter load ({load_label(lo)}) {big} slots "
        f"delivered {c['tok_s']:.1f} tok/s: throughput cannot exceed what arrives, so extra slots there buy nothing "
        f"but memory. So: batch continuously and size max_num_seqs from the latency target (TTFT from queueing, ITL "
        f"from the step time) and the KV memory, not from throughput alone; cap max_tokens and use stop sequences so "
        f"slots free early; keep the KV cache compact (paged blocks, prefix caching: lesson 09; an int8 cache: lesson "
        f"13); and pick the smallest model (or quantized weights) that meets quality, since every decode step "
        f"streams all the weights. Watch TTFT and tokens/s separately"
        + (": this sweep moved them in opposite directions." if opposite else "."))

if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
