"""Lesson 10: priority scheduling: urgent requests jump the queue, and aging keeps the rest from starving.

    python lessons/10_priority_and_starvation.py [--slots 4] [--flood 12] [--urgent 3] [--low-tokens 24]
                                                [--urgent-tokens 8] [--stream 24] [--aging 8] [--repeats 3]

Part 1: a flood of low-priority requests fills the queue, then a few urgent ones arrive. FCFS ("continuous") serves
them in arrival order; "priority" (lower number = more urgent, vLLM's convention) moves them to the front.
Part 2: if urgent work never stops arriving, strict priority never serves a low-priority request: starvation.
Aging (a waiting request's priority improves with the steps it has waited) bounds that wait.
Part 3: admission control refuses, up front, what could never run or what would put a tenant over its quota.
Everything is measured on minitransformer.serving.Engine with the real model, greedy, ignore_eos (fixed lengths).

The order of service is counted in engine steps, the same on any machine. The seconds are wall-clock: each policy
runs --repeats times in turns with the other, after one untimed warm-up round, and a timing claim is stated only when
it holds beyond the spread of those runs on a quiet machine (minitransformer/measure.py). The lesson's claims
(claims() below) are decided from the numbers it prints.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Column, Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import SamplingParams, load_model  # noqa: E402
from minitransformer.claims import Claim, find_numbers, flat, report, table_with  # noqa: E402
from minitransformer.measure import Probe, interleaved  # noqa: E402
from minitransformer.serving import Engine  # noqa: E402

TEXT = ("The kitchen was quiet before dawn. The baker lit the oven, weighed the flour, and set the first dough to "
        "rest while the city slept. By six the shelves were full and the first customers were at the door. ") * 3
NO_AGING = 10**9                 # aging_steps longer than any run: aging never happens
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's first table. It counts engine steps, so it is the same on any machine.",
    "Compare the urgent requests' steps to a first token under FCFS and under priority.",
    "In section 2's table, `waited steps` is the patient request's wait with aging off and on.",
    "The tables in seconds repeat these comparisons. Their claims need a quiet run.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
ADMISSIONS = (("tenant a, 40 + 8 tokens", 0, 40, "a", "accepted"),       # (what, start, prompt, tenant, expected)
              ("tenant a again, 40 + 8", 40, 40, "a", "accepted"),
              ("tenant a a third time, 40 + 8", 80, 40, "a", "refused"),    # 3 x 48 = 144 > the quota of 100
              ("tenant b, 60 + 8 tokens", 0, 60, "b", "refused"),           # 68 > max_model_len 64
              ("tenant b, 40 + 8 tokens", 0, 40, "b", "accepted"))


def params(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def run_until_done(engine, arrivals):
    """Step the engine; before step i add the requests arrivals[i] = [(id, prompt, max_tokens, priority)].
    Returns {id: (arrival step, first-token step, Result)}."""
    seen, done, step = {}, {}, 0
    while engine.has_unfinished_requests() or step <= max(arrivals):
        for rid, prompt, n, priority in arrivals.get(step, []):
            engine.add_request(prompt, params(n), priority=priority, request_id=rid)
            seen[rid] = [step, None]
        if not engine.has_unfinished_requests():
            step += 1
            continue
        for out in engine.step():
            if seen[out.request_id][1] is None:
                seen[out.request_id][1] = step
            if out.finished:
                done[out.request_id] = out.result
        step += 1
    return {rid: (a, f, done[rid]) for rid, (a, f) in seen.items()}


def flood(model, args, policy):
    """Part 1's workload under one policy: ({id: (arrival step, first-token step, Result)}, the engine)."""
    ids = model.tokenizer.encode(TEXT)
    arrivals = {0: [(f"low{i:02d}", ids[i:i + 40], args.low_tokens, 1) for i in range(args.flood)],
                3: [(f"URGENT{i}", ids[60 + i:100 + i], args.urgent_tokens, 0) for i in range(args.urgent)]}
    engine = Engine(model, max_num_seqs=args.slots, policy=policy, enable_prefix_caching=False)
    return run_until_done(engine, arrivals), engine


def starvation(model, args, aging):
    """Two slots; one urgent request (3 tokens: it holds a slot 3 steps) arrives every step for --stream steps, so
    urgent work arrives faster (1 per step) than it is served (2 per 3 steps). The patient one arrives at step 1."""
    ids = model.tokenizer.encode(TEXT)
    arrivals = {i: [(f"u{i:03d}", ids[i % 50:i % 50 + 20], 3, 0)] for i in range(args.stream)}
    arrivals[0].append((f"u{args.stream:03d}", ids[60:80], 3, 0))          # two at step 0: both slots busy
    arrivals.setdefault(1, []).append(("patient", ids[:40], 4, 1))
    engine = Engine(model, max_num_seqs=2, policy="priority", enable_prefix_caching=False, aging_steps=aging)
    return run_until_done(engine, arrivals)


def in_turns(contenders: dict, repeats: int) -> tuple[dict, dict]:
    """Run each contender once untimed (the warm-up; its schedule is the same in every run, so the step counts come
    from it), then `repeats` times in turns with the others. Returns ({name: first result}, {name: [results]})."""
    first = {name: run() for name, run in contenders.items()}
    timed = {name: [] for name in contenders}

    def keep(name):
        return lambda: timed[name].append(contenders[name]())
    interleaved({name: keep(name) for name in contenders}, repeats=repeats, warmup=0)    # the round above warmed up
    return first, timed


def cell(values, fmt=".2f") -> str:
    """'4.74 (4.80, 0.12)': the fastest run (what a quiet machine gives), the median, the spread (max - min)."""
    return f"{min(values):{fmt}} ({np.median(values):{fmt}}, {max(values) - min(values):{fmt}})"


def of(runs, prefix):
    return [v for k, v in runs.items() if k.startswith(prefix)]


# ------------------------------------------------------------------------------------------------ claims

def cell_range(text: str) -> tuple[float, float]:
    """[fastest, slowest] of a cell 'min (median, spread)'."""
    low, _, spread = (float(x) for x in re.findall(r"\d+(?:\.\d+)?", text))
    return low, low + spread


def below(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """A's whole range lies below B's: a difference beyond both runs' spread."""
    return a[1] < b[0]


def span(r, unit="s") -> str:
    return f"{r[0]:.2f}-{r[1]:.2f} {unit}"


def order_claims(output: str) -> list[Claim]:
    """Part 1, in steps: who got served first, what the others paid, and that nobody was preempted."""
    table = table_with(output, "urgent: steps")
    policy = [p.split()[0] for p in table.column("policy")]                    # 'FCFS (continuous)' -> 'FCFS'
    urgent = {p: [float(x) for x in re.findall(r"\d+", c)] for p, c in zip(policy, table.column("urgent: steps"))}
    low = dict(zip(policy, table.numbers("low: mean steps")))
    steps = dict(zip(policy, table.numbers("engine steps")))
    preempted = dict(zip(policy, table.numbers("preemptions")))
    return [
        Claim("urgent-first", "priority scheduling gives the urgent requests their first token in fewer steps than "
              "FCFS", max(urgent["priority"]) < min(urgent["FCFS"]),
              f"at most {max(urgent['priority']):.0f} vs at least {min(urgent['FCFS']):.0f} steps", timed=False),
        Claim("low-later", "the low-priority requests pay for it: their first tokens come later on average",
              low["priority"] > low["FCFS"], f"mean {low['priority']:.1f} vs {low['FCFS']:.1f} steps", timed=False),
        Claim("same-work", "both policies take about the same engine steps for the same work (within 5%)",
              abs(steps["priority"] - steps["FCFS"]) <= max(1.0, 0.05 * max(steps.values())),
              f"{steps['priority']:.0f} vs {steps['FCFS']:.0f} steps", timed=False),
        Claim("no-preemption", "no running request was preempted for the urgent ones: they waited for a slot to free",
              not any(preempted.values()), f"preemptions: priority {preempted['priority']:.0f}, FCFS "
                                           f"{preempted['FCFS']:.0f}", timed=False),
    ]


def clock_claims(output: str) -> list[Claim]:
    """Part 1 and 2 in seconds: only beyond the spread of the repeated runs."""
    table = table_with(output, "urgent TTFT max s")
    policy = [p.split()[0] for p in table.column("policy")]
    urgent = dict(zip(policy, map(cell_range, table.column("urgent TTFT max s"))))
    low = dict(zip(policy, map(cell_range, table.column("low TTFT mean s"))))
    aging = table_with(output, "waited steps")
    queue = [cell_range(c) for c in aging.column("queue s")]
    return [
        Claim("urgent-sooner-s", "in seconds too, priority gets the urgent requests their first token sooner",
              below(urgent["priority"], urgent["FCFS"]),
              f"worst urgent TTFT {span(urgent['priority'])} vs {span(urgent['FCFS'])}"),
        Claim("low-later-s", "in seconds too, the low-priority requests wait longer for their first token",
              below(low["FCFS"], low["priority"]), f"mean low TTFT {span(low['priority'])} vs {span(low['FCFS'])}"),
        Claim("aging-sooner-s", "in seconds too, aging shortens the patient request's wait in the queue",
              len(queue) == 2 and below(queue[1], queue[0]), f"queue {span(queue[1])} with aging vs "
                                                             f"{span(queue[0])} without" if len(queue) == 2 else ""),
    ]


def starvation_claims(output: str) -> list[Claim]:
    """Part 2, in steps: without aging the patient request waits out the whole urgent stream; aging bounds it."""
    stream, = find_numbers(output, r"an urgent arrival every step for (\d+) steps")
    table = table_with(output, "waited steps")
    first = table.numbers("first token step")
    waited = table.numbers("waited steps")
    return [
        Claim("starves", "without aging, the patient request waits until the urgent stream stops",
              first[0] >= stream, f"first token at step {first[0]:.0f}; urgent requests arrived at steps 0 to "
                                  f"{stream - 1:.0f}", timed=False),
        Claim("aging-bounds", "with aging, the patient request waits fewer steps",
              len(waited) == 2 and waited[1] < waited[0],
              f"{waited[-1]:.0f} vs {waited[0]:.0f} steps", timed=False),
    ]


def admission_claims(output: str) -> list[Claim]:
    """Part 3: add_request accepted and refused exactly the requests the limits say."""
    text = flat(output)
    got = [(what, m[1] if (m := re.search(re.escape(what) + r": (accepted|refused)", text)) else "missing")
           for what, *_ in ADMISSIONS]
    wrong = [f"{what}: {outcome}" for (what, outcome), (*_, expected) in zip(got, ADMISSIONS) if outcome != expected]
    return [Claim("admission", "admission control refuses a request over max_model_len and a tenant over its quota, "
                  "and accepts the rest", not wrong, wrong[0] if wrong else f"{len(got)} of {len(got)} as expected",
                  timed=False)]


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify): the order of service in steps, and the seconds beyond their spread.
    ValueError when the output lacks a table, row or line a claim reads."""
    try:
        return order_claims(output) + starvation_claims(output) + admission_claims(output) + clock_claims(output)
    except (KeyError, IndexError) as exc:
        raise ValueError(f"the output lacks a row or column the claims read: {exc}") from None


# ------------------------------------------------------------------------------------------------ the lesson

def part1(model, args):
    """Both policies on the flood, in turns; prints the steps table and the seconds table. Returns the first runs."""
    first, timed = in_turns({p: (lambda p=p: flood(model, args, p)) for p in ("continuous", "priority")},
                            args.repeats)
    name = {"continuous": "FCFS (continuous)", "priority": "priority"}
    steps = Table(Column("policy", no_wrap=True), "urgent: steps to first token", "low: mean steps to first token",
                  "last first token: step, request", "engine steps", "preemptions")
    for policy, (runs, engine) in first.items():
        last = max(runs, key=lambda k: runs[k][1])
        steps.add_row(name[policy], str([f - a for a, f, _ in of(runs, "URGENT")]),
                      f"{np.mean([f - a for a, f, _ in of(runs, 'low')]):.1f}", f"{runs[last][1]}, {last}",
                      str(len(engine.step_log)), str(sum(len(r.preempted) for r in engine.step_log)))
    console.print(steps, "steps are the same on any machine; engine steps: the whole run")
    clock = Table(Column("policy", no_wrap=True), "urgent TTFT max s", "low TTFT mean s")
    for policy, runs in timed.items():
        clock.add_row(name[policy], cell([max(r.metrics.ttft_s for *_, r in of(run, "URGENT")) for run, _ in runs]),
                      cell([np.mean([r.metrics.ttft_s for *_, r in of(run, "low")]) for run, _ in runs]))
    console.print(clock, f"{args.repeats} runs of each policy, in turns, after an untimed one: min (median, spread); "
                         "min is what a quiet machine gives (noise only ever adds time), spread = max - min",
                  highlight=False)
    return {p: runs for p, (runs, _) in first.items()}


def part2(model, args):
    """The patient request without and with aging, in turns; prints the table. Returns the first runs."""
    first, timed = in_turns({aging: (lambda a=aging: starvation(model, args, a)) for aging in (NO_AGING, args.aging)},
                            args.repeats)
    table = Table(Column("aging", no_wrap=True), "patient: arrived step", "first token step", "waited steps",
                  "urgent served before it", "queue s")
    for aging, runs in first.items():
        a, f, _ = runs["patient"]
        ahead = sum(1 for k, (_, uf, _) in runs.items() if k != "patient" and uf < f)
        table.add_row("off" if aging == NO_AGING else f"every {aging} steps", str(a), str(f), str(f - a), str(ahead),
                      cell([run["patient"][2].metrics.queue_s for run in timed[aging]]))
    console.print(table, f"aging off = aging_steps {NO_AGING:.0e}, longer than the run; queue s: {args.repeats} runs "
                         "in turns, min (median, spread)", highlight=False)
    return first


def part3(model):
    """Admission control on a small engine: each request accepted or refused, with the reason."""
    ids = model.tokenizer.encode(TEXT)
    engine = Engine(model, max_num_seqs=2, max_model_len=64, tenant_token_quota=100, enable_prefix_caching=False)
    for what, start, n, tenant, _ in ADMISSIONS:
        try:
            engine.add_request(ids[start:start + n], params(8), tenant=tenant)
            console.print(f"{what}: accepted", highlight=False)
        except InputError as exc:
            console.print(f"{what}: refused: {exc}", highlight=False)
    console.print("max_model_len 64 and tenant_token_quota 100 (prompt + max_tokens in flight per tenant): refusing at "
                  "admission keeps one tenant or one huge request from filling the queue and the KV pool")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=4, help="max_num_seqs in part 1")
    ap.add_argument("--flood", type=int, default=12, help="low-priority requests arriving at step 0")
    ap.add_argument("--urgent", type=int, default=3, help="urgent requests arriving at step 3")
    ap.add_argument("--low-tokens", type=int, default=24, help="max_tokens of each low-priority request in part 1")
    ap.add_argument("--urgent-tokens", type=int, default=8, help="max_tokens of each urgent request in part 1")
    ap.add_argument("--stream", type=int, default=24, help="steps during which one urgent request arrives per step")
    ap.add_argument("--aging", type=int, default=8, help="steps of waiting that raise a request one priority level")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each policy, in turns (at least 2)")
    args = ap.parse_args()
    for flag, value, low in (("--slots", args.slots, 1), ("--flood", args.flood, 1), ("--urgent", args.urgent, 1),
                             ("--low-tokens", args.low_tokens, 1), ("--urgent-tokens", args.urgent_tokens, 1),
                             ("--stream", args.stream, 1), ("--aging", args.aging, 1), ("--repeats", args.repeats, 2)):
        if value < low:
            raise InputError(f"{flag} must be at least {low}, got {value}")
    model = load_model()
    probe = Probe()                                                      # is the machine quiet during this run?

    console.rule(f"[bold]1. {args.flood} low-priority requests (priority 1) at step 0, {args.urgent} urgent "
                 f"(priority 0) at step 3, {args.slots} slots")
    flooded = part1(model, args)
    console.rule(f"[bold]2. Starvation: one patient request (priority 1) vs an urgent arrival every step for "
                 f"{args.stream} steps, 2 slots")
    starved = part2(model, args)
    console.rule("[bold]3. Admission control: add_request refuses what could never run, or a tenant over its quota")
    part3(model)

    console.rule("[bold]4. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    u_fcfs = [f - a for a, f, _ in of(flooded["continuous"], "URGENT")]
    u_prio = [f - a for a, f, _ in of(flooded["priority"], "URGENT")]
    low = {p: np.mean([f - a for a, f, _ in of(flooded[p], "low")]) for p in flooded}
    (a0, f0, _), (a1, f1, _) = starved[NO_AGING]["patient"], starved[args.aging]["patient"]
    console.rule("[bold]Interview question: how do you serve urgent requests first without starving the others?")
    answer = ["Order the waiting queue by priority, and age it."]
    if shown["urgent-first"]:
        answer.append(f"Behind a flood of {args.flood} low-priority requests, FCFS gave the urgent ones their first "
                      f"token {max(u_fcfs)} steps after arrival; priority scheduling took {max(u_prio)} steps"
                      + (". That is the wait for a running request to free a slot. Running requests are not "
                         "preempted for it, only when KV blocks run out." if shown["no-preemption"] else "."))
    else:
        answer.append(f"This run could not show priority serving the urgent requests sooner: {max(u_prio)} steps "
                      f"under priority vs {max(u_fcfs)} under FCFS. The claims above say why.")
    if shown["low-later"]:
        answer.append(f"The low-priority requests paid for it: their first token came {low['continuous']:.1f} -> "
                      f"{low['priority']:.1f} steps after arrival on average"
                      + (", later in seconds too (beyond the spread of the runs)." if shown["low-later-s"] else "."))
    else:
        answer.append(f"This run could not show what the low-priority requests paid: {low['continuous']:.1f} steps "
                      f"to their first token on average under FCFS, {low['priority']:.1f} under priority.")
    if shown["starves"]:
        starving = (f"But strict priority lets a steady stream of urgent work starve the rest: without aging the "
                    f"patient request waited {f0 - a0} steps (the last urgent one arrived at step {args.stream - 1}, "
                    f"it got its first token at step {f0})")
    else:
        starving = (f"Strict priority can starve the rest under a steady stream of urgent work, but this run could not "
                    f"show it: without aging the patient request waited {f0 - a0} steps, its first token at step "
                    f"{f0}, before the stream of {args.stream} steps ended")
    if shown["aging-bounds"]:
        answer.append(f"{starving}; with its priority improving by one level every {args.aging} steps waited, "
                      f"{f1 - a1} steps. Aging (or a per-tenant quota) bounds how long the least urgent request can "
                      "wait, whatever the urgent traffic does.")
    else:
        answer.append(f"{starving}; with aging every {args.aging} steps it waited {f1 - a1} steps, so this run could "
                      "not show aging shortening the wait.")
    console.print(" ".join(answer))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
