"""Lesson 14: serving under load: requests arrive over time, and a bigger batch trades one latency for another.

    python lessons/14_serving_under_load.py [--requests 16] [--rates auto] [--max-num-seqs 1,4,16]
                                           [--max-tokens 24] [--max-prompt 160] [--num-blocks N] [--repeats 3]
                                           [--figure PATH]

Lesson 08 gave the engine all its requests at once. A real server gets them one at a time, at random moments (a
Poisson process: independent arrivals at an average rate), and each request's latency splits into three waits:

    queue   = first scheduled - arrival     waiting for a free slot in the running batch (max_num_seqs)
    prefill = first token - first scheduled  its prompt's forward pass (shared with whatever else runs that step)
    decode  = last token - first token       its other tokens, one per engine step

The common mistake is "a bigger batch always helps". It raises throughput only while requests are waiting for slots;
each step may also get slower as the batch grows (every running request's next token waits for the whole step), and
the KV cache must hold every running request's keys and values. This lesson drives the real Engine with timed
arrivals, the loop `minitransformer serve` runs (that server's engine thread does exactly this between HTTP requests;
`minitransformer bench serve` measures the same quantities over HTTP), and sweeps the arrival rate and max_num_seqs.
The loop and the numbers each run is summarized into are minitransformer/lab/engine_load.py; the figure
figures/serving_tradeoff.png runs the same loop and draws throughput against TTFT p99.

Every configuration runs --repeats times, in turns (round 1 runs each once, then round 2, ...), so a busy moment hits
them alike; each run's throughput is checked against what its own requests' times imply (a run that stalled is
flagged), and a change between configurations is called a change only when the ranges of their runs do not overlap.
The lesson's claims (claims() below) are decided from the numbers it prints (minitransformer/lab/claims.py).

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import load_model
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.lab.claims import Claim, find_numbers, part_line, report, table_with
from minitransformer.lab.engine_load import (
    AT_BOUND,
    HEAVY,
    LIGHT,
    arrival_bound,
    arrival_offsets,
    fastest_service,
    load_label,
    rates_for_this_machine,
    spread_of,
    sweep,
    workload,
)
from minitransformer.lab.machine import H200
from minitransformer.lab.measure import Probe

# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 2's table first. It gives each configuration's best run, median and spread.",
    "At the higher rate, compare `tok/s`, `TTFT p99` and `ITL p50` as the slots grow.",
    "Section 1's `implied tok/s` column checks each run against its own requests' times.",
    "The claim lines under 'What this run shows' say which of these this run showed.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
AGREE = 1.5           # a run's tok/s within this factor of what its requests' median service time implies
QUEUEING = 0.8        # "almost all of it queueing": the queue p99 drop is at least 80% of the TTFT p99 drop


# ------------------------------------------------------------------------------------------------ the claims

def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Table 1 has every run; table 2 each configuration's best / median /
    spread over its runs. Compared at the heavier load: the fewest slots (S) and the most (B)."""
    n_runs, = find_numbers(output, r"each configuration run (\d+) times in turns")
    runs = table_with(output, "run")
    per_run = [dict(zip(runs.columns, row)) for row in runs.rows]
    ratios = [(float(r["out tok/s"]) / float(r["implied tok/s"]), r) for r in per_run]
    off = [(x, r) for x, r in ratios if not 1 / AGREE <= x <= AGREE]
    worst = max(ratios, key=lambda xr: max(xr[0], 1 / xr[0]))
    summary = table_with(output, "tok/s best")
    conf = {}                                            # (rate, slots) as printed -> {column: number}
    for row in summary.rows:
        cell = dict(zip(summary.columns, row))
        conf[cell["rate /s"], cell["slots"]] = {name: float(cell[name]) for name in summary.columns[2:]}
    rates = sorted({rate for rate, _ in conf}, key=float)
    slots = sorted({m for _, m in conf}, key=int)
    heavy, light, S, B = rates[-1], rates[0], slots[0], slots[-1]
    a, b, c = conf[heavy, S], conf[heavy, B], conf[light, B]
    kv = {m: [float(r["KV MiB"]) for r in per_run if (r["rate /s"], r["slots"]) == (heavy, m)] for m in (S, B)}
    bound, = find_numbers(output, rf"check arrivals at {light} requests/s: .*? at most ([\d.]+) tok/s")
    several = n_runs >= 2
    needs = "" if several else "; one run has no spread to judge by"
    at = f"at {heavy} requests/s, {S} -> {B} slots"
    ttft_drop, queue_drop = a["TTFT p99 median"] - b["TTFT p99 median"], a["queue p99 median"] - b["queue p99 median"]
    ttft_down = several and b["TTFT p99 best"] + b["TTFT p99 spread"] < a["TTFT p99 best"]
    return [
        Claim("rows-agree", f"every run's throughput is what its own requests' times imply (within a factor {AGREE})",
              not off, f"{len(per_run) - len(off)} of {len(per_run)} runs agree; furthest: {worst[1]['rate /s']}/s, "
              f"{worst[1]['slots']} slots, run {worst[1]['run']}: {worst[1]['out tok/s']} vs "
              f"{worst[1]['implied tok/s']} tok/s"),
        Claim("throughput-up", f"more slots raise throughput under the heavier load ({at})",
              several and b["tok/s best"] - b["tok/s spread"] > a["tok/s best"],
              f"the {B}-slot runs' slowest {b['tok/s best'] - b['tok/s spread']:.1f} tok/s vs the {S}-slot runs' "
              f"fastest {a['tok/s best']:.1f}{needs}"),
        Claim("queueing-down", f"more slots cut TTFT p99 under the heavier load ({at})",
              ttft_down, f"the {B}-slot runs' worst {b['TTFT p99 best'] + b['TTFT p99 spread']:.2f} s vs the "
              f"{S}-slot runs' best {a['TTFT p99 best']:.2f} s{needs}"),
        Claim("ttft-is-queueing", f"almost all of that cut in TTFT p99 is queueing ({at}, medians)",
              ttft_down and queue_drop >= QUEUEING * ttft_drop,
              part_line("ttft-cut", "the queue p99's fall", queue_drop, "TTFT p99's fall", ttft_drop, why=(
                  "percentiles do not add: the request waiting longest in the queue is not the one with the longest "
                  "TTFT, and with more slots each prompt's prefill shares its steps with more decodes, so the time "
                  "after the queue grew" if queue_drop > ttft_drop else ""))
              + f" (at least {QUEUEING:.0%} needed" + ("" if ttft_down else "; and TTFT p99 must first fall beyond "
                                                        "the spread") + ")"),
        Claim("itl-up", f"more slots make every token slower: ITL p50 grows ({at})",
              several and b["ITL p50 best"] > a["ITL p50 best"] + a["ITL p50 spread"],
              f"the {B}-slot runs' best {b['ITL p50 best']:.1f} ms vs the {S}-slot runs' worst "
              f"{a['ITL p50 best'] + a['ITL p50 spread']:.1f} ms{needs}"),
        Claim("kv-up", f"more slots hold more KV cache at once ({at})", min(kv[B]) > max(kv[S]),
              f"{B} slots at least {min(kv[B]):.1f} MiB in every run, {S} at most {max(kv[S]):.1f} MiB",
              timed=False),
        Claim("light-at-bound", f"at {light} requests/s, {B} slots deliver what the arrivals allow "
              f"(at least {AT_BOUND:.0%} of it)", c["tok/s best"] >= AT_BOUND * bound,
              f"{c['tok/s best']:.1f} of at most {bound:.1f} tok/s ({c['tok/s best'] / bound:.0%})"),
    ]


# ------------------------------------------------------------------------------------------------ the runs
# The runs themselves (arrivals, the engine loop, each run's summary) are minitransformer/lab/engine_load.py.


def draw(path: Path, runs: dict, rates, sizes) -> None:
    """TTFT p99, ITL p50 and throughput against max_num_seqs, one line per arrival rate: each configuration's best
    run, with a bar over the range of its runs."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for rate in rates:
        for ax, key, scale, up in zip(axes, ("ttft99", "itl50", "tok_s"), (1, 1e3, 1), (False, False, True)):
            values = [[r[key] * scale for r in runs[rate, m]] for m in sizes]
            best = [max(v) if up else min(v) for v in values]
            ax.errorbar(sizes, best, yerr=[[b - min(v) for b, v in zip(best, values)],
                                           [max(v) - b for b, v in zip(best, values)]],
                        fmt="o-", capsize=3, label=load_label(rate))
    for ax, title in zip(axes, ("TTFT p99 (s): queueing", "ITL p50 (ms): the step time",
                                "output tokens/s: throughput")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(m) for m in sizes])
        ax.set_xlabel("max_num_seqs (batch slots)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Serving under load: best run per configuration, bars over all its runs (minitransformer lesson 14)")
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


def headers(*names: str) -> list[str]:
    """Column names broken into lines of a word or two: a table this wide fits 120 columns only when no header is
    wider than its numbers (claims.tables() joins the lines again)."""
    split = {"rate /s": "rate\n/s", "ITL p50 ms": "ITL\np50 ms", "ITL p99 ms": "ITL\np99 ms", "KV MiB": "KV\nMiB",
             "queue p99 median": "queue\np99\nmedian"}
    return [split.get(name, name.replace(" ", "\n")) for name in names]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=16, help="requests per run (at least 2)")
    ap.add_argument("--rates", default="auto",
                    help="arrival rates to try, requests per second, e.g. 2,8 (default auto: half and three times "
                         "what this machine serves with the most slots, measured first)")
    ap.add_argument("--max-num-seqs", default="1,4,16", help="batch slots to try (default 1,4,16)")
    ap.add_argument("--max-tokens", type=int, default=24, help="tokens each request generates (default 24)")
    ap.add_argument("--max-prompt", type=int, default=160, help="longest prompt in tokens (16 to 400; default 160)")
    ap.add_argument("--num-blocks", type=int, help="KV pool blocks of 16 tokens (default: room for every slot)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts and the arrival times")
    ap.add_argument("--repeats", type=int, default=3,
                    help="runs of every configuration, in turns (at least 2): a change is a finding only beyond "
                         "their spread")
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
    auto = args.rates == "auto"
    rates = [] if auto else sorted(parse_list(args.rates, "--rates"))
    sizes = sorted(parse_list(args.max_num_seqs, "--max-num-seqs", int))
    if len(sizes) < 2 or (len(rates) < 2 and not auto):
        raise InputError("give at least two --rates and two --max-num-seqs: the lesson compares them")
    model = load_model()
    probe = Probe()                                                      # is the machine quiet during this run?
    requests = workload(model.tokenizer, args.requests, args.max_prompt, args.max_tokens, args.seed)
    if auto:
        tok_s, per_second, light, heavy = rates_for_this_machine(model, requests, sizes[-1], args.num_blocks)
        rates = [light, heavy]
        console.print(f"rates: with all {args.requests} requests at once, {sizes[-1]} slots served {tok_s:.1f} tok/s "
                      f"on this machine, {per_second:.2f} requests/s of {args.max_tokens} tokens. Light load: "
                      f"{light:g} requests/s ({LIGHT:.0%} of that); heavy load: {heavy:g} requests/s ({HEAVY:g}x). "
                      "--rates sets them yourself.", highlight=False)
    offsets = {rate: arrival_offsets(args.requests, rate, args.seed) for rate in rates}

    console.rule(f"[bold]1. {args.requests} requests (prompts 16-{args.max_prompt} tokens, {args.max_tokens} new "
                 "tokens each, greedy), Poisson arrivals")
    runs = sweep(model, requests, offsets, sizes, args.repeats, args.num_blocks)     # after an untimed warm-up
    table = Table(*headers("rate /s", "slots", "run", "out tok/s", "implied tok/s", "queue p50", "queue p99",
                           "prefill p50", "decode p50", "TTFT p99", "ITL p50 ms", "ITL p99 ms", "KV MiB"))
    for (rate, m), done in runs.items():
        for i, s in enumerate(done):
            table.add_row(f"{rate:g}", str(m), str(i + 1), f"{s['tok_s']:.1f}", f"{s['implied']:.1f}",
                          f"{s['queue50']:.2f}", f"{s['queue99']:.2f}", f"{s['prefill50']:.2f}",
                          f"{s['decode50']:.2f}", f"{s['ttft99']:.2f}", f"{s['itl50'] * 1e3:.1f}",
                          f"{s['itl99'] * 1e3:.1f}", f"{s['kv_mib']:.1f}")
    console.print(f"Every run: each configuration run {args.repeats} times in turns (run r of every configuration "
                  "before run r + 1 of any), after an untimed warm-up.", table)
    console.print("rate: arrivals per second; slots: max_num_seqs. Per request, queue + prefill = TTFT and decode = "
                  "the rest of its reply, in seconds (p50 / p99 over the requests); ITL = gaps between its tokens; "
                  "out tok/s = all generated tokens / wall time of the run; implied tok/s = the same tokens / the "
                  "wall time the run's median request implies (its first-scheduled-to-finished time, replayed on the "
                  "same arrivals with the same slots): a run far from it stalled somewhere its typical request did "
                  "not; KV MiB = the most cache held at once.", highlight=False)
    off = [(rate, m, i + 1, s) for (rate, m), done in runs.items() for i, s in enumerate(done)
           if not 1 / AGREE <= s["tok_s"] / s["implied"] <= AGREE]
    preempted = sum(s["preemptions"] for done in runs.values() for s in done)
    console.print(f"check preemptions: {preempted} in all runs (a preempted request is recomputed: its times grow)")
    console.print(f"check runs: {sum(map(len, runs.values())) - len(off)} of {sum(map(len, runs.values()))} within "
                  f"a factor {AGREE} of their implied tok/s"
                  + "".join(f"; {rate:g}/s, {m} slots, run {i}: {s['tok_s']:.1f} vs {s['implied']:.1f} tok/s"
                            for rate, m, i, s in off), highlight=False)

    console.rule("[bold]2. Each configuration over its runs: best (the quiet-machine figure), median, spread")
    table = Table(*headers("rate /s", "slots", "tok/s best", "tok/s median", "tok/s spread", "TTFT p99 best",
                           "TTFT p99 median", "TTFT p99 spread", "queue p99 median", "ITL p50 best", "ITL p50 median",
                           "ITL p50 spread"))
    for (rate, m), done in runs.items():
        cells = [*spread_of(done, "tok_s", True), *spread_of(done, "ttft99"), spread_of(done, "queue99")[1]]
        itl = [x * 1e3 for x in spread_of(done, "itl50")]
        table.add_row(f"{rate:g}", str(m), *(f"{x:.1f}" for x in cells[:3]), *(f"{x:.2f}" for x in cells[3:]),
                      *(f"{x:.1f}" for x in itl))
    console.print(table)
    console.print("best: the highest tok/s and the lowest latencies of the runs (noise only ever slows a run down); "
                  "spread: highest - lowest. TTFT and queue in seconds, ITL in ms.", highlight=False)
    for rate in rates:
        last, fastest = float(offsets[rate][-1]), fastest_service(runs, rate)
        tokens = runs[rate, sizes[0]][0]["tokens"]
        console.print(f"check arrivals at {rate:g} requests/s: the last request arrives at {last:.2f} s and needs at "
                      f"least {fastest:.2f} s of service (the fastest any request got), so the {tokens} tokens take "
                      f"{last + fastest:.2f} s at the least: at most {arrival_bound(runs, offsets, rate):.1f} tok/s",
                      highlight=False)
    if args.figure:
        draw(args.figure, runs, rates, sizes)
        console.print(f"figure written: {args.figure}")

    console.rule("[bold]3. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)
    answer(shown, runs, rates, sizes, model.config, offsets, args.repeats, stalled=bool(off))


def answer(shown, runs, rates, sizes, config, offsets, repeats, stalled: bool) -> None:
    """The interview answer, with this run's numbers; every direction it states is a claim this run showed."""
    heavy, light, small, big = rates[-1], rates[0], sizes[0], sizes[-1]
    a, b, c = runs[heavy, small], runs[heavy, big], runs[light, big]
    best = lambda done, key, up=False: spread_of(done, key, up)[0]
    median = lambda done, key: spread_of(done, key)[1]
    gpu = H200.seconds(H200.cost(config, 1, 64, batch=big)) / H200.seconds(H200.cost(config, 1, 64, batch=small))
    console.rule("[bold]Interview question: how would you improve throughput for a high-traffic chat API?")
    text = [f"Under the heavier load ({load_label(heavy)}), going from max_num_seqs {small} to {big}"]
    tput = f"{best(a, 'tok_s', True):.1f} -> {best(b, 'tok_s', True):.1f} tok/s"
    ttft = f"{best(a, 'ttft99'):.2f} -> {best(b, 'ttft99'):.2f} s"
    if shown["throughput-up"] and shown["queueing-down"]:
        text[0] += (f" raised output throughput {tput} and cut TTFT p99 {ttft} (best of {repeats} runs each, their "
                    "ranges apart)")
        if shown["ttft-is-queueing"]:
            text[0] += (f", almost all of it queueing (queue p99 medians {median(a, 'queue99'):.2f} -> "
                        f"{median(b, 'queue99'):.2f} s)")
        text[0] += (". Continuous batching with enough slots is the first lever. A request that waits for a slot "
                    "waits for someone else's whole reply.")
    else:
        text[0] += (f" moved output throughput {tput} and TTFT p99 {ttft} (best of {repeats} runs each). This run "
                    "could not show both changes beyond the spread of its runs. So it does not say here what more "
                    "slots buy.")
    itl = f"{best(a, 'itl50') * 1e3:.1f} -> {best(b, 'itl50') * 1e3:.1f} ms"
    if shown["itl-up"]:
        text.append(f"The price: every token came slower, ITL p50 {itl}. On this CPU a step of {big} sequences cost "
                    f"more than a step of {small}. Lesson 02, part 4, traces that to NumPy's BLAS.")
    else:
        text.append(f"The step time gave ITL p50 {itl}. This run could not show a change in it beyond its spread.")
    if shown["kv-up"]:
        text.append(f"And the KV cache held up to {max(s['kv_mib'] for s in b):.1f} MiB instead of "
                    f"{max(s['kv_mib'] for s in a):.1f} MiB.")
    text.append(f"On an {H200.name} a bf16 decode step of {big} sequences would cost {gpu:.2f}x one of {small} at "
                f"its roofline. Reading the weights dominates there. So the ITL price of more slots stays small "
                f"until the batch nears {H200.ridge:.0f} sequences.")
    got, bound = best(c, "tok_s", True), arrival_bound(runs, offsets, light)
    if shown["light-at-bound"]:
        text.append(f"At the lighter load ({load_label(light)}) {big} slots delivered {got:.1f} tok/s, "
                    f"{got / bound:.0%} of the {bound:.1f} tok/s the arrivals allow. There throughput cannot exceed "
                    "what arrives. Slots beyond those that keep up buy nothing there but memory.")
    else:
        text.append(f"At the lighter load ({load_label(light)}) {big} slots delivered {got:.1f} tok/s against the "
                    f"{bound:.1f} tok/s the arrivals allow. This run cannot say what held them back.")
    if stalled:
        text.append("Some runs' throughput is not what their own requests' times imply (see the check runs line "
                    "above). They stalled, and their rows describe the stall, not the engine.")
    text.append("So batch continuously. Size max_num_seqs from the latency target and the KV memory, not from "
                "throughput alone. Queueing sets TTFT, and the step time sets ITL. Cap max_tokens and use stop "
                "sequences, so slots free early. Keep the KV cache compact with paged blocks and prefix caching "
                "(lesson 09) or an int8 cache (lesson 13). Pick the smallest model, or quantized weights, that meets "
                "quality, since every decode step streams all the weights. Watch TTFT and tokens/s separately.")
    console.print(" ".join(text))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
