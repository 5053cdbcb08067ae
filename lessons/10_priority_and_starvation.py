"""Lesson 10: priority scheduling: urgent requests jump the queue, and aging keeps the rest from starving.

    python lessons/10_priority_and_starvation.py [--slots 4] [--flood 12] [--urgent 3] [--low-tokens 24]
                                                [--urgent-tokens 8] [--stream 24] [--aging 8]

Part 1: a flood of low-priority requests fills the queue, then a few urgent ones arrive. FCFS ("continuous") serves
them in arrival order; "priority" (lower number = more urgent, vLLM's convention) moves them to the front.
Part 2: if urgent work never stops arriving, strict priority never serves a low-priority request: starvation.
Aging (a waiting request's priority improves with the steps it has waited) bounds that wait.
Everything is measured on minitransformer.serving.Engine with the real model, greedy, ignore_eos (fixed lengths).
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import SamplingParams, load_model  # noqa: E402
from minitransformer.serving import Engine  # noqa: E402

TEXT = ("The kitchen was quiet before dawn. The baker lit the oven, weighed the flour, and set the first dough to "
        "rest while the city slept. By six the shelves were full and the first customers were at the door. ") * 3
NO_AGING = 10**9                 # aging_steps longer than any run: aging never happens
console = Console(width=None if sys.stdout.isatty() else 120)     # piped: don't cut titles at 80 columns


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
    ids = model.tokenizer.encode(TEXT)
    arrivals = {0: [(f"low{i:02d}", ids[i:i + 40], args.low_tokens, 1) for i in range(args.flood)],
                3: [(f"URGENT{i}", ids[60 + i:100 + i], args.urgent_tokens, 0) for i in range(args.urgent)]}
    engine = Engine(model, max_num_seqs=args.slots, policy=policy, enable_prefix_caching=False)
    return run_until_done(engine, arrivals), len(engine.step_log)


def starvation(model, args, aging):
    """Two slots; one urgent request (3 tokens: it holds a slot 3 steps) arrives every step for --stream steps, so
    urgent work arrives faster (1 per step) than it is served (2 per 3 steps). The patient one arrives at step 1."""
    ids = model.tokenizer.encode(TEXT)
    arrivals = {i: [(f"u{i:03d}", ids[i % 50:i % 50 + 20], 3, 0)] for i in range(args.stream)}
    arrivals[0].append((f"u{args.stream:03d}", ids[60:80], 3, 0))          # two at step 0: both slots busy
    arrivals.setdefault(1, []).append(("patient", ids[:40], 4, 1))
    engine = Engine(model, max_num_seqs=2, policy="priority", enable_prefix_caching=False, aging_steps=aging)
    return run_until_done(engine, arrivals)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--slots", type=int, default=4, help="max_num_seqs in part 1")
    ap.add_argument("--flood", type=int, default=12, help="low-priority requests arriving at step 0")
    ap.add_argument("--urgent", type=int, default=3, help="urgent requests arriving at step 3")
    ap.add_argument("--low-tokens", type=int, default=24, help="max_tokens of each low-priority request in part 1")
    ap.add_argument("--urgent-tokens", type=int, default=8, help="max_tokens of each urgent request in part 1")
    ap.add_argument("--stream", type=int, default=24, help="steps during which one urgent request arrives per step")
    ap.add_argument("--aging", type=int, default=8, help="steps of waiting that raise a request one priority level")
    args = ap.parse_args()
    for flag, value in (("--slots", args.slots), ("--flood", args.flood), ("--urgent", args.urgent),
                        ("--low-tokens", args.low_tokens), ("--urgent-tokens", args.urgent_tokens),
                        ("--stream", args.stream), ("--aging", args.aging)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    model = load_model()

    console.rule(f"[bold]1. {args.flood} low-priority requests (priority 1) at step 0, {args.urgent} urgent "
                 f"(priority 0) at step 3, {args.slots} slots")
    table = Table("policy", "urgent: steps to first token", "urgent TTFT p50 s", "urgent TTFT max s",
                  "low: TTFT p50 s", "low: TTFT max s", "last first token at step",
                  "engine steps")
    part1 = {}
    for policy in ("continuous", "priority"):
        runs, steps = flood(model, args, policy)
        part1[policy] = runs
        urgent = [v for k, v in runs.items() if k.startswith("URGENT")]
        low = [v for k, v in runs.items() if k.startswith("low")]
        waits = [f - a for a, f, _ in urgent]
        table.add_row("FCFS (continuous)" if policy == "continuous" else "priority", str(waits),
                      f"{np.median([r.metrics.ttft_s for *_, r in urgent]):.3f}",
                      f"{max(r.metrics.ttft_s for *_, r in urgent):.3f}",
                      f"{np.median([r.metrics.ttft_s for *_, r in low]):.3f}",
                      f"{max(r.metrics.ttft_s for *_, r in low):.3f}", str(max(f for _, f, _ in runs.values())),
                      str(steps))
    console.print(table, "last first token: when the last-served request started (FCFS: an urgent one behind the "
                         "flood; priority: a low one); engine steps: the whole run, about equal, as the work is the same")

    console.rule(f"[bold]2. Starvation: one patient request (priority 1) vs an urgent arrival every step for "
                 f"{args.stream} steps, 2 slots")
    table = Table("aging", "patient: arrived step", "first token step", "waited steps", "queue s",
                  "urgent served before it")
    part2 = {}
    for aging in (NO_AGING, args.aging):
        runs = part2[aging] = starvation(model, args, aging)
        a, f, r = runs["patient"]
        ahead = sum(1 for k, (_, uf, _) in runs.items() if k != "patient" and uf < f)
        table.add_row("off" if aging == NO_AGING else f"every {aging} steps", str(a), str(f), str(f - a),
                      f"{r.metrics.queue_s:.3f}", str(ahead))
    console.print(table, f"aging off = aging_steps {NO_AGING:.0e}, longer than the run")

    u_fcfs = [f - a for k, (a, f, _) in part1["continuous"].items() if k.startswith("URGENT")]
    u_prio = [f - a for k, (a, f, _) in part1["priority"].items() if k.startswith("URGENT")]
    low_ttft = {p: np.median([r.metrics.ttft_s for k, (*_, r) in part1[p].items() if k.startswith("low")])
                for p in part1}
    (a0, f0, _), (a1, f1, _) = part2[NO_AGING]["patient"], part2[args.aging]["patient"]
    console.rule("[bold]Interview question: how do you serve urgent requests first without starving the others?")
    console.print(
        f"Order the waiting queue by priority, and age it. Behind a flood of {args.flood} low-priority requests, FCFS "
        f"gave the urgent ones their first token {max(u_fcfs)} steps after arrival; priority scheduling took "
        f"{max(u_prio)} steps (the wait for a running request to free a slot: running requests are not preempted for "
        f"it, only when KV blocks run out). The low-priority median TTFT went {low_ttft['continuous']:.2f} -> "
        f"{low_ttft['priority']:.2f} s. But strict priority lets a steady stream of urgent work starve the rest: "
        f"without aging the patient request waited {f0 - a0} steps (the last urgent one arrived at step "
        f"{args.stream - 1}, it got its first token at step {f0}); with its priority improving by one level every "
        f"{args.aging} steps waited, {f1 - a1} steps. Aging (or a per-tenant quota) bounds how long the least urgent "
        "request can wait, whatever the urgent traffic does.")

    console.rule("[bold]3. Admission control: add_request refuses what could never run, or a tenant over its quota")
    ids = model.tokenizer.encode(TEXT)
    engine = Engine(model, max_num_seqs=2, max_model_len=64, tenant_token_quota=100, enable_prefix_caching=False)
    for what, prompt, n, tenant in (("tenant a, 40 + 8 tokens", ids[:40], 8, "a"),
                                    ("tenant a again, 40 + 8", ids[40:80], 8, "a"),
                                    ("tenant a a third time, 40 + 8", ids[80:120], 8, "a"),
                                    ("tenant b, 60 + 8 tokens", ids[:60], 8, "b"),
                                    ("tenant b, 40 + 8 tokens", ids[:40], 8, "b")):
        try:
            engine.add_request(prompt, params(n), tenant=tenant)
            console.print(f"{what}: accepted", highlight=False)
        except InputError as exc:
            console.print(f"{what}: refused: {exc}", highlight=False)
    console.print("max_model_len 64 and tenant_token_quota 100 (prompt + max_tokens in flight per tenant): refusing at "
                  "admission keeps one tenant or one huge request from filling the queue and the KV pool")


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
