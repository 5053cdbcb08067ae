"""Lesson 10: priority scheduling: urgent requests jump the queue, and aging keeps the rest from starving.

    python lessons/10_priority_and_starvation.py [--slots 4] [--flood 12] [--urgent 3] [--low-tokens 24]
                                                [--urgent-tokens 8] [--stream 24] [--aging 8] [--repeats 3]
                                                [--hog-tokens 160] [--cap 72] [--request-timeout 1.0] [--cancel-at 6]

Part 1: a flood of low-priority requests fills the queue, then a few urgent ones arrive. FCFS ("continuous") serves
them in arrival order; "priority" (lower number = more urgent, vLLM's convention) moves them to the front.
Part 2: if urgent work never stops arriving, strict priority never serves a low-priority request: starvation.
Aging (a waiting request's priority improves with the steps it has waited) bounds that wait.
Parts 3 to 6 are guardrails: limits that keep one request or one tenant from hurting the others.
Part 3: admission control refuses, up front, what could never run or what would put a tenant over its quota.
Part 4: a long request holds the only slot and the short ones wait it out; max_model_len caps how long that is.
Part 5: the server's request timeout (server/engine_loop.py, run here as the server runs it) ends a request with its
partial text, and its KV blocks come back.
Part 6: a cancelled request frees its blocks at once, and the others' tokens stay exactly the same.
Everything is measured on minitransformer.serving.Engine with the real model, greedy, ignore_eos (fixed lengths).

The order of service is counted in engine steps, the same on any machine. The seconds are wall-clock: each policy
runs --repeats times in turns with the other, after one untimed warm-up round, and a timing claim is stated only when
it holds beyond the spread of those runs on a quiet machine (minitransformer/lab/measure.py). The lesson's claims
(claims() below) are decided from the numbers it prints.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import re
import sys
import threading
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Column, Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import SamplingParams, load_model
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.metrics import now
from minitransformer.lab.claims import (
    Claim,
    below,
    cell_range,
    find_numbers,
    flat,
    report,
    span,
    spread_cell,
    table_with,
)
from minitransformer.lab.measure import Probe, in_turns
from minitransformer.server import EngineLoop, ServerMetrics
from minitransformer.server.responses import finish
from minitransformer.serving import Engine

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
HOG_PROMPT, SHORTS, SHORT_TOKENS = 40, 3, 4           # part 4: the hog's prompt; the short requests
TIMEOUT_PROMPT, TIMEOUT_ASKED, TIMEOUT_POOL = 20, 1000, 64    # part 5: 64 blocks x 16 = 1024 tokens of K and V
CANCEL_TOKENS, CANCEL_POOL = 16, 32                   # part 6


def params(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def run_until_done(engine, arrivals):
    """Step the engine; before step i add the requests arrivals[i] = [(id, prompt, max_tokens, priority)].
    A request already in the engine arrived at step 0. Returns {id: (arrival step, first-token step, Result)}."""
    seen, done, step = {rid: [0, None] for rid in engine.unfinished_request_ids()}, {}, 0
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


def hog_run(model, args, max_model_len):
    """Part 4 under one limit. One slot; the hog (a 40-token prompt) asks for --hog-tokens at step 0 and, if
    max_model_len refuses it, asks again for what the limit leaves; SHORTS short requests arrive at step 1.
    Returns (the refusal or None, {id: (arrival step, first-token step, Result)})."""
    ids = model.tokenizer.encode(TEXT)
    engine = Engine(model, max_num_seqs=1, max_model_len=max_model_len, enable_prefix_caching=False)
    refusal = None
    try:
        engine.add_request(ids[:HOG_PROMPT], params(args.hog_tokens), request_id="hog")
    except InputError as exc:                        # a client told "too long" asks again within the limit
        refusal = str(exc)
        engine.add_request(ids[:HOG_PROMPT], params(max_model_len - HOG_PROMPT), request_id="hog")
    arrivals = {1: [(f"short{i}", ids[50 + i:70 + i], SHORT_TOKENS, 0) for i in range(SHORTS)]}
    return refusal, run_until_done(engine, arrivals)


def timeout_run(model, args):
    """Part 5: one request on the server's engine thread with --request-timeout, as `minitransformer serve` runs
    it. Returns ([(Delta, free KV blocks after its step)], free blocks before it, seconds)."""
    engine = Engine(model, max_num_seqs=1, num_blocks=TIMEOUT_POOL, enable_prefix_caching=False)
    loop = EngineLoop(engine, ServerMetrics("lesson-10"), request_timeout_s=args.request_timeout)
    seen, ended = [], threading.Event()

    def sink(delta):                                           # called on the engine thread, after each step
        seen.append((delta, loop.stats.num_free_blocks))
        if delta.finish_reason is not None or delta.error is not None:
            ended.set()
    loop.start()
    free_before, start = loop.stats.num_free_blocks, now()
    prompt = model.tokenizer.encode(TEXT)[:TIMEOUT_PROMPT]
    loop.submit(prompt, params(TIMEOUT_ASKED), priority=0, tenant=None, arrival_time=start, sink=sink).result()
    finished = ended.wait(args.request_timeout + 600)
    seconds = now() - start
    loop.stop()
    if not finished:
        raise RuntimeError("the timed-out request never ended")
    return seen, free_before, seconds


def cancel_run(model, args, cancel: bool):
    """Part 6: requests a, b (and c) decode together; c is aborted before step --cancel-at. Returns ({id: Result},
    (free blocks before the abort, right after it, blocks in c's block table) or None)."""
    ids = model.tokenizer.encode(TEXT)
    engine = Engine(model, max_num_seqs=3, num_blocks=CANCEL_POOL, enable_prefix_caching=False)
    for rid, start in (("a", 0), ("b", 30), ("c", 60))[:3 if cancel else 2]:
        engine.add_request(ids[start:start + 24], params(CANCEL_TOKENS), request_id=rid)
    results, freed, step = {}, None, 0
    while engine.has_unfinished_requests():
        if cancel and step == args.cancel_at:
            held = next(v.block_table for v in engine.snapshot().running if v.request_id == "c")
            before = engine.stats.num_free_blocks
            engine.abort("c")                              # what the server does when c's client goes away
            freed = (before, engine.stats.num_free_blocks, len(held))
        results.update({o.request_id: o.result for o in engine.step() if o.finished})
        step += 1
    return results, freed


def of(runs, prefix):
    return [v for k, v in runs.items() if k.startswith(prefix)]


# ------------------------------------------------------------------------------------------------ claims

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


def cap_claims(output: str) -> list[Claim]:
    """Part 4, in steps: the hog makes the short requests wait out its whole reply; max_model_len bounds that."""
    table = table_with(output, "hog: asked")
    rows = {row[0].split()[0]: row for row in table.rows}                 # 'none 8192' -> 'none'
    col = {name: i for i, name in enumerate(table.columns)}
    first_wait = {k: int(re.findall(r"\d+", r[col["short requests: steps waited"]])[0]) for k, r in rows.items()}
    last = int(rows["none"][col["hog: last token step"]])
    arrived, = find_numbers(output, r"short requests arrive at step (\d+)")
    cap, prompt, bound = find_numbers(output, r"holds the slot for at most (\d+) - (\d+) = (\d+) steps")
    refused = rows["max_model_len"][col["hog: admission"]].startswith("refused")
    return [
        Claim("hog-starves", "without a cap, the first short request waits out the hog's whole reply",
              arrived + first_wait["none"] > last,
              f"it waited {first_wait['none']} steps; the hog's last token came at step {last}", timed=False),
        Claim("cap-bounds", "max_model_len refuses the hog's request, and the first short request then waits at most "
              "what the cap leaves one request", refused and first_wait["max_model_len"] <= bound,
              f"{'refused' if refused else 'accepted'}; waited {first_wait['max_model_len']} steps, at most "
              f"{cap:.0f} - {prompt:.0f} = {bound:.0f}; {first_wait['none']} without the cap", timed=False),
    ]


def timeout_claims(output: str) -> list[Claim]:
    """Part 5: the timed-out request ends with its partial text and its reason, and its blocks come back."""
    text = flat(output)
    made, asked = find_numbers(output, r"ended after [\d.]+ s with (\d+) of (\d+) tokens")
    m = re.search(r"The engine's Result: finish_reason (\w+), stop_reason (\w+)", text)
    reason = (m[1], m[2]) if m else ("missing", "missing")
    before, pool, running, after = find_numbers(
        output, r"KV blocks free: (\d+) of (\d+) before it, (\d+) of \d+ after its last token, (\d+) of \d+ after")
    return [
        Claim("timeout-partial", "a request past its timeout ends with the text it has so far and says why",
              reason == ("abort", "timeout") and 0 < made < asked,
              f"{made:.0f} of {asked:.0f} tokens; finish_reason {reason[0]}, stop_reason {reason[1]}", timed=False),
        Claim("timeout-frees", "its KV blocks all come back when it times out",
              running < pool and after == before == pool,
              f"{running:.0f} of {pool:.0f} free while it ran, {after:.0f} after", timed=False),
    ]


def cancel_claims(output: str) -> list[Claim]:
    """Part 6: the cancelled request frees its blocks before the next step; the others' tokens do not change."""
    table = table_with(output, "same tokens as without c")
    col = {name: i for i, name in enumerate(table.columns)}
    cancelled = [r for r in table.rows if "cancelled" in r[0]]
    others = [r for r in table.rows if "cancelled" not in r[0]]
    before, after, held = find_numbers(output, r"before abort\('c'\): (\d+) of \d+ KV blocks free\. Right after it, "
                                               r"before any other step: (\d+) of \d+\. c's block table held (\d+)")
    ended = len(cancelled) == 1 and (cancelled[0][col["finish_reason"]], cancelled[0][col["stop_reason"]]) == \
        ("abort", "cancelled")
    same = [re.findall(r"\d+", r[col["same tokens as without c"]]) for r in others]
    unchanged = bool(others) and all(s[0] == s[1] == r[col["tokens made"]] for s, r in zip(same, others))
    return [
        Claim("cancel-frees", "a cancelled request ends with finish_reason abort and gives back all its blocks at "
              "once, before the next step", ended and held > 0 and after - before == held,
              f"{before:.0f} -> {after:.0f} free; c held {held:.0f}", timed=False),
        Claim("cancel-unaffected", "the other requests make exactly the tokens they make without the cancelled one",
              unchanged, ", ".join(f"{r[0]}: {r[col['same tokens as without c']]}" for r in others), timed=False),
    ]


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify): the order of service in steps, and the seconds beyond their spread.
    ValueError when the output lacks a table, row or line a claim reads."""
    try:
        return (order_claims(output) + starvation_claims(output) + admission_claims(output) + cap_claims(output)
                + timeout_claims(output) + cancel_claims(output) + clock_claims(output))
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
        clock.add_row(name[policy],
                      spread_cell([max(r.metrics.ttft_s for *_, r in of(run, "URGENT")) for run, _ in runs]),
                      spread_cell([np.mean([r.metrics.ttft_s for *_, r in of(run, "low")]) for run, _ in runs]))
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
                      spread_cell([run["patient"][2].metrics.queue_s for run in timed[aging]]))
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
    sizes = engine.config
    console.print(f"The KV pool holds {sizes.num_blocks} blocks x {sizes.block_size} = {sizes.pool_tokens} tokens. "
                  "A quota of 100 keeps any one tenant to part of it.", highlight=False)


def part4(model, args):
    """The hog and the short requests with no cap and with max_model_len --cap; prints the table. Returns
    ({limit label: (first short's wait, the hog's tokens)}, the refusal)."""
    context = model.config.context_length
    table = Table(Column("limit", no_wrap=True), "hog: asked", "hog: admission", "hog: tokens made",
                  "hog: last token step", "short requests: steps waited")
    waits, refused = {}, None
    for label, limit in (("none", context), ("max_model_len", args.cap)):
        refusal, runs = hog_run(model, args, limit)
        refused = refused or refusal
        _, hog_first, hog = runs["hog"]
        wait = [f - a for a, f, _ in of(runs, "short")]
        made = len(hog.token_ids)
        admission = "accepted" if refusal is None else f"refused; asked again for {limit - HOG_PROMPT}"
        table.add_row(f"{label} {limit}", str(args.hog_tokens), admission, str(made), str(hog_first + made - 1),
                      str(wait))
        waits[label] = (wait[0], made)
    console.print(table, highlight=False)
    console.print(f"One slot stands for a server whose slots are all busy. The hog's prompt is {HOG_PROMPT} tokens. "
                  f"The {SHORTS} short requests arrive at step 1 and ask for {SHORT_TOKENS} tokens each. Each also "
                  "waits for the short ones ahead of it. The hog makes one token per step.", highlight=False)
    if refused:
        console.print(f"The refusal: {refused}.", highlight=False)
    console.print(f"With max_model_len {args.cap}, one request holds the slot for at most {args.cap} - {HOG_PROMPT} "
                  f"= {args.cap - HOG_PROMPT} steps.", highlight=False)
    return waits


def part5(model, args):
    """The request timeout on the server's engine thread; prints what the request got back. Returns its tokens."""
    seen, free_before, seconds = timeout_run(model, args)
    pool = TIMEOUT_POOL
    last = seen[-1][0]
    if last.result is None:
        raise RuntimeError(f"the engine thread failed: {last.error}")
    result, made = last.result, len(last.result.token_ids)
    free_running = seen[-2][1] if len(seen) > 1 else free_before            # read after its last token's step
    api_finish, api_stop = finish(result)
    text = result.text if len(result.text) <= 60 else result.text[:60] + "..."
    for line in (f"It asked for {TIMEOUT_ASKED} tokens. --request-timeout is {args.request_timeout:g} s.",
                 f"It ended after {seconds:.2f} s with {made} of {TIMEOUT_ASKED} tokens.",
                 f"The engine's Result: finish_reason {result.finish_reason}, stop_reason {result.stop_reason}.",
                 (f"The HTTP API reports finish_reason {api_finish}, stop_reason {api_stop}. OpenAI clients read "
                  "\"length\" as cut short by a limit, and keep the text (server/responses.py)."),
                 f"Its partial text: {text!r}",
                 (f"KV blocks free: {free_before} of {pool} before it, {free_running} of {pool} after its last "
                  f"token, {seen[-1][1]} of {pool} after the timeout.")):
        console.print(line, highlight=False, markup=False)
    return made


def part6(model, args):
    """Three requests, one cancelled mid-decode, against the same two alone; prints the table. Returns the blocks
    the cancelled request gave back."""
    alone, _ = cancel_run(model, args, cancel=False)
    results, (before, after, held) = cancel_run(model, args, cancel=True)
    table = Table(Column("request", no_wrap=True), "finish_reason", "stop_reason", "tokens made",
                  "same tokens as without c")
    for rid, result in sorted(results.items()):
        same = "-"
        if rid in alone:
            ref = alone[rid].token_ids
            same = f"{sum(x == y for x, y in zip(result.token_ids, ref))} of {len(ref)}"
        table.add_row(rid if rid in alone else f"{rid}, cancelled before step {args.cancel_at}", result.finish_reason,
                      str(result.stop_reason or "-"), str(len(result.token_ids)), same)
    console.print(table, highlight=False)
    console.print(f"Just before abort('c'): {before} of {CANCEL_POOL} KV blocks free. Right after it, before any "
                  f"other step: {after} of {CANCEL_POOL}. c's block table held {held} blocks. The server calls the "
                  "same abort when a client goes away (server/engine_loop.py).", highlight=False, markup=False)
    return after - before


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
    ap.add_argument("--hog-tokens", type=int, default=160, help="max_tokens of part 4's long request")
    ap.add_argument("--cap", type=int, default=72, help="part 4's max_model_len, the cap (prompt + max_tokens)")
    ap.add_argument("--request-timeout", type=float, default=1.0, help="part 5's timeout in seconds")
    ap.add_argument("--cancel-at", type=int, default=6, help="the step before which part 6 cancels a request")
    args = ap.parse_args()
    for flag, value, low in (("--slots", args.slots, 1), ("--flood", args.flood, 1), ("--urgent", args.urgent, 1),
                             ("--low-tokens", args.low_tokens, 1), ("--urgent-tokens", args.urgent_tokens, 1),
                             ("--stream", args.stream, 1), ("--aging", args.aging, 1), ("--repeats", args.repeats, 2),
                             ("--hog-tokens", args.hog_tokens, 1), ("--cap", args.cap, HOG_PROMPT + 1),
                             ("--cancel-at", args.cancel_at, 1)):
        if value < low:
            raise InputError(f"{flag} must be at least {low}, got {value}")
    if not 0 < args.request_timeout <= 60:
        raise InputError(f"--request-timeout must be in (0, 60] seconds, got {args.request_timeout}")
    if args.cancel_at >= CANCEL_TOKENS:
        raise InputError(f"--cancel-at must be below {CANCEL_TOKENS}, the tokens each request asks for")
    model = load_model()
    if args.cap > model.config.context_length:
        raise InputError(f"--cap must be at most {model.config.context_length}, the model's context")
    probe = Probe()                                                      # is the machine quiet during this run?

    console.rule(f"[bold]1. {args.flood} low-priority requests (priority 1) at step 0, {args.urgent} urgent "
                 f"(priority 0) at step 3, {args.slots} slots")
    flooded = part1(model, args)
    console.rule(f"[bold]2. Starvation: one patient request (priority 1) vs an urgent arrival every step for "
                 f"{args.stream} steps, 2 slots")
    starved = part2(model, args)
    console.rule("[bold]3. Admission control: add_request refuses what could never run, or a tenant over its quota")
    part3(model)
    console.rule(f"[bold]4. A long request holds the only slot: {SHORTS} short requests wait, without a cap and with "
                 f"max_model_len {args.cap}")
    waits = part4(model, args)
    console.rule(f"[bold]5. A request timeout: the server's engine thread ends a request after "
                 f"{args.request_timeout:g} s, with its partial text")
    made = part5(model, args)
    console.rule("[bold]6. Cancellation: a request aborted mid-decode frees its blocks at once")
    freed = part6(model, args)

    console.rule("[bold]7. What this run shows")
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
    console.print(" ".join(guardrails_answer(args, shown, waits, made, freed)))



def guardrails_answer(args, shown, waits, made, freed) -> list[str]:
    """The answer's second paragraph: what parts 4 to 6 showed, each sentence only if its claim was shown."""
    (w0, hog0), (w1, hog1) = waits["none"], waits["max_model_len"]
    said = {"hog-starves": f"A long request can starve the rest too. With one slot, a {hog0}-token reply made the "
                           f"first short request wait {w0} steps.",
            "cap-bounds": f"A cap bounds that wait. max_model_len {args.cap} refused the long request. Asked again "
                          f"for {hog1} tokens, it kept the short one waiting {w1} steps.",
            "timeout-partial": f"A request timeout bounds the time instead. After {args.request_timeout:g} s the "
                               f"request ended with {made} of {TIMEOUT_ASKED} tokens and stop_reason timeout. The "
                               f"client keeps the partial text.",
            "timeout-frees": "Its KV blocks all came back.",
            "cancel-frees": f"A cancelled request gave its {freed} blocks back at once, before the next step.",
            "cancel-unaffected": "The other requests' tokens did not change."}
    lines = [text for key, text in said.items() if shown[key]]
    missed = [key for key in said if not shown[key]]
    if missed:
        lines.append(f"This run could not show {', '.join(missed)} (see the claims above).")
    return lines + ["A per-tenant quota refuses what would fill the KV cache (part 3)."]


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
