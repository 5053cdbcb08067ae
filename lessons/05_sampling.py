"""Lesson 05: sampling -- how greedy, temperature, top-k, top-p and min-p reshape the next-token distribution, and
how a structured-output mask holds it to a JSON schema.

    python lessons/05_sampling.py [--prompt TEXT] [--seed 42] [--tokens 12] [--repeats 30] [--json-tokens 64]

One prefill of the real model gives the logits of the next token. Each setting goes through
sampling.filtered_probs -- the exact distribution sample() draws from -- and we count the tokens left with a
non-zero probability (the candidate set) and the entropy of what is left. Then the same seeded request runs twice,
and the cost of one sample() call is timed against one decode step of the model, in turns (measure.interleaved).
The lesson's claims (claims() below) are decided from the numbers it prints; the timing claim is stated only when
the run was quiet (minitransformer/lab/measure.py).

Sections 4-6 add the one sampling stage that changes what may be drawn at all: structured output (structured/).
The same chat prompt runs greedy twice, free and held to a JSON schema; the per-step table shows how many tokens each
step's mask allowed and where it overruled the model's own favourite; then one mask per token is timed against a
decode step, in turns.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import json
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
from minitransformer.core.backend import synchronize
from minitransformer.core.decode import decode_step
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.prefill import prefill
from minitransformer.core.sampling import filtered_probs, make_generator, mask_tokens, sample
from minitransformer.lab.claims import Claim, flat, report, table_with
from minitransformer.lab.measure import Probe, Timing, interleaved
from minitransformer.structured import Constraint, StructuredOutputsParams

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
JSON_PROMPT = "Describe a person as JSON."            # a chat message: the model answers in prose unless held to JSON
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
# Piped: 120 columns (rich would cut at 80) unless COLUMNS says otherwise. record: claims() reads what was printed.
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's table first. Each row is one sampling setting applied to the same distribution: compare "
    "`candidates (p > 0)` and `entropy (bits)` across the rows. Section 2's `check seeds` line says whether one seed "
    "repeats and another differs.",
    "Section 4's `check json` line says which reply parses. In section 5's table, compare `kept` with "
    "`argmax allowed`: the mask changes greedy's choice only where it forbids the model's favourite.",
    "Sections 3 and 6 time the sampler and the JSON mask next to a decode step. The `sampler-small` and `mask-small` "
    "claims say whether each stayed small.",
)
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120, record=True)
SMALL_SHARE = 0.10          # "a small share of a step": the slowest sampler's median call under 10% of the fastest step
                            # (its median, not its max: one call preempted by the OS must not decide the claim)


def entropy_bits(p: np.ndarray) -> float:
    """Shannon entropy of one distribution, in bits (0 for a point mass): how many yes/no questions a draw is."""
    p = p[p > 0].astype(np.float64)
    return float(-(p * np.log2(p)).sum()) + 0.0        # + 0.0: a point mass prints 0, not -0


def schema_problems(value, schema: dict) -> list[str]:
    """What in `value` breaks `schema`, for the few JSON Schema keywords SCHEMA uses (a full validator, such as the
    jsonschema package the tests check with, knows them all): an empty list when it matches."""
    if schema["type"] == "object":
        if not isinstance(value, dict):
            return [f"{value!r:.20} is not an object"]
        problems = [f"{key!r} is missing" for key in schema["required"] if key not in value]
        problems += [f"{key!r} is not allowed" for key in value if key not in schema["properties"]]
        return problems + [p for key, sub in schema["properties"].items() if key in value
                           for p in schema_problems(value[key], sub)]
    if not isinstance(value, {"string": str, "integer": int}[schema["type"]]) or isinstance(value, bool):
        return [f"{value!r:.20} is not a {schema['type']}"]
    if schema["type"] == "string" and len(value) > schema["maxLength"]:
        return [f"{value!r:.20} is longer than {schema['maxLength']}"]
    if schema["type"] == "integer" and not schema["minimum"] <= value <= schema["maximum"]:
        return [f"{value} is outside [{schema['minimum']}, {schema['maximum']}]"]
    return []


def json_verdict(text: str) -> tuple[str, str]:
    """(what json.loads says, whether the value matches SCHEMA): 'generate, then parse' as a client would do it."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        return f"fails: {e.msg}", "-"
    problems = schema_problems(value, SCHEMA)
    return "parses", "yes" if not problems else "no: " + "; ".join(problems)


def print_timings(timings: dict, what: str) -> float:
    """One row per timed thing (min, median, spread in ms, and its min as a share of the decode step's min), printed;
    returns the decode step's min in seconds."""
    step = timings["decode step"].min
    table = Table(what, "min ms", "median ms", "spread ms", "min / decode step's min")
    for name, t in timings.items():
        table.add_row(name, f"{t.min * 1e3:.3f}", f"{t.median * 1e3:.3f}", f"{t.spread * 1e3:.3f}",
                      f"{t.min / step:.1%}")
    console.print(table)
    return step


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
        *structured_claims(output),
    ]


def structured_claims(output: str) -> list[Claim]:
    """Sections 4-6's claims, from the `check json` line, the per-step mask table and the mask's cost table."""
    found = re.search(r"check json: free parses = (\w+); constrained parses = (\w+), matches the schema = (\w+), "
                      r"stop_reason = (\S+)", flat(output))
    if not found:
        raise ValueError("the output has no 'check json' line")
    free_parses, held_parses, held_matches = (flag == "True" for flag in found.groups()[:3])
    steps = table_with(output, "argmax allowed")
    kept, allowed = steps.column("kept"), steps.column("argmax allowed")
    changed = [step for step, k in zip(steps.column("step"), kept) if k == "no"]
    cost = table_with(output, "what runs per token")
    low, spread = (dict(zip(cost.column("what runs"), cost.numbers(name))) for name in ("min ms", "spread ms"))
    step = low["decode step"]
    mask_max = low["json mask"] + spread["json mask"]                 # the slowest mask: the whole range must be small
    return [
        Claim("constrained-valid", "the reply held to the schema parses and matches it, and the constraint ended it",
              held_parses and held_matches and found.group(4) == "'structured'",
              f"parses = {held_parses}, matches = {held_matches}, stop_reason {found.group(4)}", timed=False),
        Claim("free-fails", "the same prompt, greedy without the mask, gives a reply json.loads rejects",
              not free_parses, f"free parses = {free_parses}", timed=False, required=False),
        Claim("mask-steers", "the mask changed greedy's choice, at exactly the steps where it forbade the model's "
              "favourite", bool(changed) and all((k == "yes") == (a == "yes") for k, a in zip(kept, allowed)),
              f"changed at steps {', '.join(changed) or 'none'} of the {len(kept)} shown; the favourite forbidden "
              f"at {allowed.count('no')}", timed=False),
        Claim("mask-small", f"the JSON mask costs under {SMALL_SHARE:.0%} of a decode step per token",
              mask_max < SMALL_SHARE * step,
              f"the slowest mask per token {mask_max:.3f} ms vs {SMALL_SHARE:.0%} of the fastest decode step "
              f"{step:.2f} ms"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default=PROMPT, help="the text whose next token we look at")
    parser.add_argument("--seed", type=int, default=42, help="seed of the reproducibility runs")
    parser.add_argument("--tokens", type=int, default=12, help="tokens generated by each seeded run")
    parser.add_argument("--repeats", type=int, default=30, help="timed calls of each sampler and of the decode step, "
                        "in turns (min, median and spread are shown)")
    parser.add_argument("--json-tokens", type=int, default=64, help="max_tokens of the free and the JSON-schema "
                        "replies (the schema's reply needs about 20)")
    parser.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: SmolLM2-135M)")
    args = parser.parse_args()
    for flag, value in (("--tokens", args.tokens), ("--repeats", args.repeats), ("--json-tokens", args.json_tokens)):
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
    step = print_timings(timings, "what runs")
    console.print(f"each ran {args.repeats} times, in turns, after one untimed warm-up call: min = the fastest call, "
                  "what a quiet machine gives; median = the typical call; spread = max - min, how far to trust "
                  "either (measure.py)")
    cost = {name: timings[name].min for name, _ in SETTINGS}
    costly = max(cost, key=cost.get)
    console.print(f"check cost: decode step {step * 1e3:.2f} ms; slowest sampler ({costly}) {cost[costly] * 1e3:.3f} "
                  f"ms = {cost[costly] / step:.1%} of a step; greedy {cost['greedy'] * 1e3:.3f} ms")

    held = show_structured(model, args, V)

    console.rule("[bold]7. What this run shows")
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
    answer_structured(held, shown)
    if not math.isfinite(full[1]):
        raise SystemExit("entropy is not finite: the logits are broken")


def show_structured(model, args, V: int) -> dict:
    """Sections 4-6: the same chat prompt free and held to SCHEMA, the mask at each step, and what one mask costs
    next to a decode step. Returns what the answer quotes."""
    tok = model.tokenizer
    console.rule(f"[bold]4. Structured output: one chat prompt, greedy, free and held to a JSON schema "
                 f"({args.json_tokens} tokens at most)")
    console.print(f"prompt: {JSON_PROMPT!r}; schema: {json.dumps(SCHEMA)}", markup=False, highlight=False)
    held_params = SamplingParams(max_tokens=args.json_tokens, temperature=0.0,
                                 structured=StructuredOutputsParams(json=SCHEMA),
                                 logprobs=1)                # logprobs come from the raw logits: the unmasked favourite
    free = generate(model, JSON_PROMPT, SamplingParams(max_tokens=args.json_tokens, temperature=0.0), chat=True)
    held = generate(model, JSON_PROMPT, held_params, chat=True)
    table = Table("run", "tokens", "finish (stop_reason)", "json.loads", "matches the schema")
    verdicts = {}
    for name, result in (("free", free), ("constrained", held)):
        verdicts[name] = json_verdict(result.text)
        table.add_row(name, str(len(result.token_ids)), f"{result.finish_reason} ({result.stop_reason!r})",
                      *verdicts[name])
    console.print(table)
    for name, result in (("free", free), ("constrained", held)):
        console.print(f"{name}: {result.text!r}", markup=False, highlight=False)
    parses, matches = verdicts["constrained"][0] == "parses", verdicts["constrained"][1] == "yes"
    console.print(f"check json: free parses = {verdicts['free'][0] == 'parses'}; constrained parses = {parses}, "
                  f"matches the schema = {matches}, stop_reason = {held.stop_reason!r}", markup=False, highlight=False)

    console.rule(f"[bold]5. The mask at each step: how many of the {V:,} tokens it allowed, and greedy's choice "
                 "without it")
    counts = held.structured["allowed_tokens"]            # one mask per generated token, counted by the Constraint
    replay = Constraint(held_params.structured, tok)      # the same matcher again: was the model's favourite allowed?
    table = Table("step", "allowed tokens", "chosen", "p unmasked", "unmasked argmax", "its p", "argmax allowed",
                  "kept")
    for step, (token, entry, count) in enumerate(zip(held.token_ids, held.logprobs, counts)):
        favourite, favourite_logprob = entry["top"][0]    # the raw logits' best token: greedy without the mask
        favourite_allowed = bool(replay.allowed(V)[favourite])
        replay.accept(token)
        table.add_row(str(step), f"{count:,}", repr(tok.decode([token])), f"{math.exp(entry['logprob']):.2%}",
                      repr(tok.decode([favourite])), f"{math.exp(favourite_logprob):.2%}",
                      "yes" if favourite_allowed else "no", "yes" if token == favourite else "no")
    console.print(table)
    console.print("Greedy with a mask takes the best of the allowed tokens: where the model's favourite is allowed it "
                  "is kept, elsewhere the mask decides, and the text goes on from the mask's choice. Generating "
                  "freely and parsing afterwards keeps every favourite, and so keeps the free reply above. `p "
                  "unmasked` is the chosen token's probability before the mask; `allowed tokens` counts the ids "
                  "the mask left (inside a string almost any token fits; between keys only a few do).")

    console.rule("[bold]6. What the mask costs per token, next to the model step")
    cache = KVCache(model.config, len(held.prompt_token_ids) + args.repeats + 2, xp=model.xp)
    logits = prefill(model, held.prompt_token_ids, cache)            # (1, V): any logits do, the mask ignores them
    fresh = iter([Constraint(held_params.structured, tok) for _ in range(args.repeats + 1)])   # built untimed

    def walk():          # the constrained reply again: compute each step's mask, apply it, advance the matcher
        constraint = next(fresh)
        for token in held.token_ids:
            mask_tokens(logits, [()], [constraint.allowed(V)])
            constraint.accept(token)
    timings = interleaved({"decode step": lambda: decode_step(model, [held.token_ids[0]], cache), "json mask": walk},
                          repeats=args.repeats, sync=lambda: synchronize(model.xp))
    n = len(held.token_ids)
    timings["json mask"] = Timing(tuple(s / n for s in timings["json mask"].samples))   # per token
    step = print_timings(timings, "what runs per token")
    console.print(f"json mask: one walk through the constrained reply's {n} tokens (compute the mask, set the others' "
                  f"logits to -inf, advance the matcher), divided by {n}; timed {args.repeats} times in turns with the "
                  f"decode step, after an untimed warm-up. The request's own record (Result.structured's "
                  f"mask_s_per_token, computing the masks only, in section 4's run): "
                  f"{held.structured['mask_s_per_token'] * 1e3:.3f} ms.")
    return {"result": held, "mask": timings["json mask"], "step": timings["decode step"], "free": free,
            "counts": counts}


def answer_structured(held: dict, shown: dict) -> None:
    """The second interview question, answered with sections 4-6's numbers and only what their claims showed."""
    console.rule("[bold]Interview question: how does an engine guarantee valid JSON, and what does it cost?")
    result, counts, mask, step = held["result"], held["counts"], held["mask"], held["step"]
    answer = ["It never lets the model write anything else. Before each draw a matcher compiled from the schema "
              "(llguidance here; an option in vLLM and SGLang, whose default is xgrammar) marks which tokens keep "
              "the text a prefix of "
              "some valid reply. The others get a logit of -inf, so greedy or sampled, only they can be drawn. "
              "After the draw the matcher advances by the chosen token, and the request stops once the value is "
              "complete."]
    if shown["constrained-valid"]:
        answer.append(f"Here the reply held to the schema parsed and matched it after {len(result.token_ids)} "
                      f"tokens.")
    else:
        answer.append("This run's constrained reply did not parse and match the schema. The claims above say why "
                      "(a max_tokens too small to finish it ends with finish_reason 'length').")
    if shown["free-fails"]:
        answer.append("The free reply to the same prompt did not parse: generate-then-parse can only reject it and "
                      "try again.")
    else:
        answer.append("The free reply parsed this time, but nothing guaranteed it would.")
    if shown["mask-steers"]:
        answer.append(f"Each step's mask allowed between {min(counts):,} and {max(counts):,} tokens. It changed "
                      "greedy's choice only where it forbade the model's favourite. That is why constrained greedy "
                      "is not the free reply, parsed: the mask moves the argmax, and the model writes on from there.")
    if shown["mask-small"]:
        answer.append(f"One mask cost {mask.min * 1e3:.3f} ms per token against {step.min * 1e3:.1f} ms for a decode "
                      f"step (fastest calls), {mask.min / step.min:.1%} of it.")
    else:
        answer.append(f"One mask cost {mask.min * 1e3:.3f} ms per token against {step.min * 1e3:.1f} ms for a decode "
                      "step (fastest calls). This run could not show it to be a small share. The claims above say "
                      "why.")
    answer.append("On a GPU a step takes milliseconds or less and the mask is CPU work, so vLLM computes the batch's "
                  "masks on the CPU while the GPU runs the forward pass, then applies them as one bitmask.")
    console.print(" ".join(answer))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
