"""Lesson 05: sampling -- how greedy, temperature, top-k, top-p and min-p reshape the next-token distribution.

    python lessons/05_sampling.py [--prompt TEXT] [--seed 42] [--tokens 12] [--repeats 30]

One prefill of the real model gives the logits of the next token. Each setting goes through
sampling.filtered_probs -- the exact distribution sample() draws from -- and we count the tokens left with a
non-zero probability (the candidate set) and the entropy of what is left. Then the same seeded request runs twice,
and the cost of one sample() call is timed against one decode step of the model, in turns (measure.interleaved).
The lesson's claims (claims() below) are decided from the numbers it prints; the timing claim is stated only when
the run was quiet (minitransformer/measure.py).

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import math
import os
import re
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import KVCache, SamplingParams, generate, load_model
from minitransformer.claims import Claim, flat, report, table_with
from minitransformer.decode import decode_step
from minitransformer.errors import InputError, MiniTransformerError
from minitransformer.measure import Probe, interleaved
from minitransformer.prefill import prefill
from minitransformer.sampling import filtered_probs, make_generator, sample

PROMPT = "Once upon a time, in a small village by the sea, there lived a"
SETTINGS = [                                     # (name, params): vLLM's names; temperature 1 unless said
    ("greedy", SamplingParams(temperature=0.0)),
    ("temperature=0.5", SamplingParams(temperature=0.5)),
    ("temperature=1.0", SamplingParams(temperature=1.0)),
    ("temperature=1.5", SamplingParams(temperature=1.5)),
    ("top_k=20", SamplingParams(top_k=20)),
    ("top_p=0.9", SamplingParams(top_p=0.9)),
    ("min_p=0.1", SamplingParams(min_p=0.1)),
]
# Piped: 120 columns (rich would cut at 80) unless COLUMNS says otherwise. record: claims() reads what was printed.
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's table first. Each row is one sampling setting applied to the same distribution.",
    "Compare `candidates (p > 0)` and `entropy (bits)` across the rows.",
    "Section 2's `check seeds` line says whether one seed repeats and another differs.",
    "Section 3 times the sampler next to a decode step. The `sampler-small` claim says whether it stayed small.",
)
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120, record=True)
SMALL_SHARE = 0.10          # "a small share of a step": the slowest sampler's median call under 10% of the fastest step
                            # (its median, not its max: one call preempted by the OS must not decide the claim)


def entropy_bits(p: np.ndarray) -> float:
    """Shannon entropy of one distribution, in bits (0 for a point mass): how many yes/no questions a draw is."""
    p = p[p > 0].astype(np.float64)
    return float(-(p * np.log2(p)).sum()) + 0.0        # + 0.0: a point mass prints 0, not -0


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify)."""
    dist = table_with(output, "candidates")
    names = dist.column("setting")
    count = dict(zip(names, dist.numbers("candidates")))
    bits = dict(zip(names, dist.numbers("entropy")))
    temps = [f"temperature={t}" for t in ("0.5", "1.0", "1.5")]
    raw = count["temperature=1.0"]
    seeds = re.search(r"check seeds: seed \d+ twice identical = (\w+); seed \d+ differs = (\w+)", flat(output))
    if not seeds:
        raise ValueError("the output has no 'check seeds' line")
    same, differ = (flag == "True" for flag in seeds.groups())
    cost = table_with(output, "min ms")
    runs = cost.column("what runs")
    low, typical = dict(zip(runs, cost.numbers("min ms"))), dict(zip(runs, cost.numbers("median ms")))
    step = low.pop("decode step")                                         # the fastest step: the quiet-machine figure
    typical.pop("decode step")
    worst = max(typical, key=typical.get)                                 # the sampler whose typical call is slowest
    filters = ["top_k=20", "top_p=0.9", "min_p=0.1"]
    return [
        Claim("temperature-entropy", "temperature below 1 sharpens the distribution and above 1 flattens it, "
              "removing no token", bits[temps[0]] < bits[temps[1]] < bits[temps[2]]
              and all(count[t] == raw for t in temps),
              f"entropy {bits[temps[0]]:.3f} < {bits[temps[1]]:.3f} < {bits[temps[2]]:.3f} bits; candidates "
              + " / ".join(f"{count[t]:,.0f}" for t in temps), timed=False),
        Claim("filters-cut", "top_k, top_p and min_p keep fewer tokens than the raw distribution and lower its "
              "entropy; greedy keeps one", count["top_k=20"] == 20 and count["greedy"] == 1 and bits["greedy"] == 0
              and all(count[f] < raw and bits[f] < bits["temperature=1.0"] for f in filters),
              ", ".join(f"{f} {count[f]:,.0f} tokens {bits[f]:.3f} bits" for f in filters)
              + f" vs raw {raw:,.0f} tokens {bits['temperature=1.0']:.3f} bits; greedy {count['greedy']:.0f}",
              timed=False),
        Claim("seed-repeats", "the same seed draws the same tokens", same, f"identical = {same}", timed=False),
        Claim("seed-differs", "another seed draws other tokens", differ, f"differs = {differ}", timed=False),
        Claim("sampler-small", f"drawing a token costs under {SMALL_SHARE:.0%} of a decode step",
              typical[worst] < SMALL_SHARE * step,
              f"the slowest sampler's median call ({worst}) {typical[worst]:.3f} ms vs {SMALL_SHARE:.0%} of the "
              f"fastest decode step {step:.2f} ms"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default=PROMPT, help="the text whose next token we look at")
    parser.add_argument("--seed", type=int, default=42, help="seed of the reproducibility runs")
    parser.add_argument("--tokens", type=int, default=12, help="tokens generated by each seeded run")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls of each sampler and of the decode step, "
                        "in turns (min, median and spread are shown)")
    parser.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: SmolLM2-135M)")
    args = parser.parse_args()
    for flag, value in (("--tokens", args.tokens), ("--repeats", args.repeats)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    model = load_model(args.model)
    probe = Probe()                                                      # is the machine quiet during this run?
    tok = model.tokenizer
    ids = tok.encode(args.prompt)
    cache = KVCache(model.config, len(ids) + args.repeats + 2, xp=model.xp)   # the prompt + every timed decode step
    logits = prefill(model, ids, cache)                                # (1, V) the next token's raw logits
    V = logits.shape[-1]

    console.rule(f"[bold]1. One next-token distribution, seven ways to draw ({len(ids)}-token prompt, "
                 f"{V:,}-token vocab)")
    console.print(f"prompt: {args.prompt!r}")
    table = Table("setting", "candidates (p > 0)", "entropy (bits)", "top 3 after filtering")
    rows = {}
    for name, params in SETTINGS:
        probs = np.asarray(filtered_probs(logits, [params])[0])       # (V,) what sample() draws from
        order = [i for i in np.argsort(-probs, kind="stable")[:3] if probs[i] > 0]
        top = ", ".join(f"{tok.decode([int(i)])!r} {probs[i]:.1%}" for i in order)
        rows[name] = (int((probs > 0).sum()), entropy_bits(probs))
        table.add_row(name, f"{rows[name][0]:,}", f"{rows[name][1]:.3f}", top)
    console.print(table)
    console.print("temperature divides the logits by T before the softmax; top_k keeps the k best tokens, top_p the "
                  "smallest set holding that much probability, min_p every token at least that fraction of the best "
                  "one. Greedy is a point mass: one candidate, 0 bits.")

    console.rule(f"[bold]2. Seeded reproducibility: temperature 1.0, top_p 0.9, {args.tokens} tokens")
    table = Table("run", "seed", "token ids", "text")
    runs = []
    for label, seed in (("a", args.seed), ("b", args.seed), ("c", args.seed + 1)):
        params = SamplingParams(max_tokens=args.tokens, temperature=1.0, top_p=0.9, seed=seed, ignore_eos=True)
        result = generate(model, args.prompt, params)
        runs.append(result.token_ids)
        table.add_row(label, str(seed), " ".join(map(str, result.token_ids)), repr(result.text))
    console.print(table)
    same, differ = runs[0] == runs[1], runs[0] != runs[2]
    console.print(f"check seeds: seed {args.seed} twice identical = {same}; seed {args.seed + 1} differs = {differ}")

    console.rule("[bold]3. What sampling costs next to the model step")
    runs = {"decode step": lambda: decode_step(model, [int(np.argmax(logits))], cache)}
    for name, params in SETTINGS:
        generator = make_generator(0)
        runs[name] = lambda p=params, g=generator: sample(logits, [p], [g], [ids], [[]])
    timings = interleaved(runs, repeats=args.repeats)        # in turns: a busy moment hits the step and samplers alike
    step = timings["decode step"].min
    table = Table("what runs", "min ms", "median ms", "spread ms", "min / decode step's min")
    for name, t in timings.items():
        table.add_row(name, f"{t.min * 1e3:.3f}", f"{t.median * 1e3:.3f}", f"{t.spread * 1e3:.3f}",
                      f"{t.min / step:.1%}")
    console.print(table)
    console.print(f"each ran {args.repeats} times, in turns, after one untimed warm-up call: min = the fastest call, "
                  "what a quiet machine gives; median = the typical call; spread = max - min, how far to trust "
                  "either (measure.py)")
    cost = {name: timings[name].min for name, _ in SETTINGS}
    costly = max(cost, key=cost.get)
    console.print(f"check cost: decode step {step * 1e3:.2f} ms; slowest sampler ({costly}) {cost[costly] * 1e3:.3f} "
                  f"ms = {cost[costly] / step:.1%} of a step; greedy {cost['greedy'] * 1e3:.3f} ms")

    console.rule("[bold]4. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview question: what do temperature, top-k, top-p and min-p change, and what do they cost?")
    full, cold, hot = rows["temperature=1.0"], rows["temperature=0.5"], rows["temperature=1.5"]
    answer = [f"They change which tokens can be drawn and how evenly. They never change the model's work. Here the "
              f"raw distribution (temperature 1.0) gives {full[0]:,} tokens a non-zero chance. Its entropy is "
              f"{full[1]:.2f} bits, as spread as about {2 ** full[1]:.0f} equally likely choices."]
    if shown["temperature-entropy"]:
        answer.append(f"Temperature 0.5 sharpens it to {cold[1]:.2f} bits and 1.5 flattens it to {hot[1]:.2f} bits "
                      "without removing any token.")
    else:
        answer.append(f"Temperature 0.5 gives {cold[1]:.2f} bits and 1.5 gives {hot[1]:.2f} bits. This run could "
                      "not show them as sharper and flatter. The claims above say why.")
    answer.append(f"Of the filters, top_k=20 keeps {rows['top_k=20'][0]} tokens ({rows['top_k=20'][1]:.2f} bits), "
                  f"top_p=0.9 keeps {rows['top_p=0.9'][0]} ({rows['top_p=0.9'][1]:.2f} bits), and min_p=0.1 keeps "
                  f"{rows['min_p=0.1'][0]} ({rows['min_p=0.1'][1]:.2f} bits). Greedy keeps {rows['greedy'][0]}.")
    if shown["seed-repeats"]:
        answer.append(f"A seed makes a sampled reply repeatable (the same {args.tokens} tokens twice).")
    else:
        answer.append(f"This run's two replies with seed {args.seed} differed, so it could not show that a seed "
                      "makes a reply repeatable.")
    if shown["sampler-small"]:
        answer.append(f"The costliest draw ({costly}) takes {cost[costly] * 1e3:.2f} ms against {step * 1e3:.1f} ms "
                      f"for one decode step (fastest calls). That is {cost[costly] / step:.1%} of a step. On this "
                      "CPU, for one sequence, the forward pass is the bottleneck, not the sampler.")
    else:
        answer.append(f"The costliest draw ({costly}) took {cost[costly] * 1e3:.2f} ms against {step * 1e3:.1f} ms "
                      "for one decode step (fastest calls). This run could not show the sampler to be a small share "
                      "of a step. The claims above say why.")
    answer.append("What one machine shows is not a law. Elsewhere sampling can take a real share of a step. A large "
                  "vocabulary at a large batch can do it. So can a full sort for top_p on a GPU, or a copy of the "
                  "logits back to the host at every step.")
    console.print(" ".join(answer))
    if not math.isfinite(full[1]):
        raise SystemExit("entropy is not finite: the logits are broken")


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
