"""Lesson 09: paged attention: KV memory in blocks, block tables that grow, and prefix blocks shared between requests.

    python lessons/09_paged_attention.py [--requests 8] [--max-tokens 96] [--max-model-len 2048] [--block-size 16]

A contiguous KV cache must reserve a request's whole length up front: the context a server allows (max_model_len),
or at best prompt + max_tokens. Requests stop early, so most of it stays empty. The paged cache (vLLM, Kwon et al.,
SOSP '23) hands out blocks of block_size tokens as a sequence grows; only each sequence's last block is partly empty.
Everything below is measured on minitransformer.serving.Engine running the real model. Nothing here is timed: the
lesson's claims (claims() below) are about tokens, blocks and bytes, decided from the numbers it prints.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import math
import re
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Column, Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import SamplingParams, estimate_kv_bytes, load_model
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.lab.claims import Claim, find_numbers, flat, report, table_with
from minitransformer.lab.measure import Probe
from minitransformer.serving import Engine

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a GPU does.",
             "Give three tips for learning to cook.", "Why is the sky blue?", "Name two planets.",
             "Describe a cat in one sentence.", "How do vaccines work?", "What is 12 times 12?",
             "Tell me a short story about a robot."]
SYSTEM = ("You are a helpful assistant for a cooking school. Answer briefly and politely. If a question is not about "
          "cooking, say so and offer a cooking tip instead. Always use metric units, name the utensils needed, and "
          "warn about hot surfaces and sharp knives when they matter.")
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's table first. Compare the `used` column with the reservations and with `paged`.",
    "Section 2 prints each request's block table as it grows, one block per 16 tokens.",
    "In section 3's table, `prefix_cache_hits` counts the prompt tokens found in the cache.",
    "None of these numbers is a timing, so they are the same on any machine.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()


def mib(n):
    return f"{n / 2**20:,.2f} MiB"


def memory_table(model, args):
    """Mixed chat requests that stop at EOS; after each step, what each way of reserving memory holds for them."""
    cfg, B = model.config, args.block_size
    engine = Engine(model, max_num_seqs=args.requests, block_size=B, enable_prefix_caching=False,
                    max_model_len=args.max_model_len)
    for i in range(args.requests):
        engine.add_request(QUESTIONS[i % len(QUESTIONS)], SamplingParams(max_tokens=args.max_tokens, temperature=0.0),
                           chat=True, request_id=f"q{i}")
    table = Table(Column("step", no_wrap=True), "running", "tokens held", "used", f"reserve {args.max_model_len} each",
                  "reserve prompt+max", "paged: blocks", "paged", "paged waste")
    peak, results, total, most = None, {}, {"tokens": 0, "blocks": 0, "context": 0, "promised": 0}, {}
    while engine.has_unfinished_requests():
        results.update({o.request_id: o.result for o in engine.step() if o.finished})
        running = engine.scheduler.running
        row = {"step": len(engine.step_log), "running": len(running),
               "tokens": sum(s.num_computed_tokens for s in running),
               "blocks": sum(len(engine.block_manager.block_tables[s.request_id]) for s in running),
               "context": len(running) * args.max_model_len,
               "promised": sum(s.num_prompt_tokens + s.params.max_tokens for s in running)}
        total = {k: total[k] + row[k] for k in total}
        most = {k: max(most.get(k, 0), row[k]) for k in ("promised", "blocks")}     # what a pool must hold at once
        if peak is None or row["tokens"] > peak["tokens"]:
            peak = row
        if (row["step"] - 1) % args.every == 0:
            table.add_row(*memory_row(cfg, row, B))
    table.add_row(*memory_row(cfg, peak, B, " (peak)"), style="bold")
    console.print(table, "(peak): the step holding the most tokens. One token's K and V = "
                         f"{estimate_kv_bytes(cfg, 1):,} bytes (2 x {cfg.n_layers} layers x {cfg.n_kv_heads} kv heads "
                         f"x {cfg.head_dim} x 4 B); "
                         f"a block of {B} = {engine.cache.bytes_per_block:,} bytes")
    lengths = [len(r.token_ids) for r in results.values()]
    console.print(f"outputs: {lengths} tokens (max_tokens {args.max_tokens}; finish reasons "
                  f"{sorted({r.finish_reason for r in results.values()})})", highlight=False)
    total["steps"], total["early"] = len(engine.step_log), sum(n < args.max_tokens for n in lengths)
    total["most_promised"], total["most_blocks"] = most["promised"], most["blocks"]
    console.print(f"check token-steps over {total['steps']} steps (blocks of {B}): used {total['tokens']:,}, reserve "
                  f"{args.max_model_len} each {total['context']:,}, reserve prompt+max {total['promised']:,}, paged "
                  f"{total['blocks'] * B:,}; at once at most: paged {most['blocks']} blocks = {most['blocks'] * B:,} "
                  f"tokens, prompt+max {most['promised']:,} tokens; {total['early']} of {args.requests} requests "
                  "stopped before max_tokens", highlight=False)
    return peak, total


def memory_row(cfg, r, B, note=""):
    used, paged = estimate_kv_bytes(cfg, r["tokens"]), estimate_kv_bytes(cfg, r["blocks"] * B)
    return (f"{r['step']}{note}", str(r["running"]), str(r["tokens"]), mib(used),
            mib(estimate_kv_bytes(cfg, r["context"])),
            mib(estimate_kv_bytes(cfg, r["promised"])), str(r["blocks"]), mib(paged),
            f"{1 - used / paged:.1%}" if paged else "-")


def growing_tables(model, B):
    """Three requests decoded side by side; print the block tables whenever one of them grows."""
    engine = Engine(model, max_num_seqs=4, num_blocks=16, block_size=B, enable_prefix_caching=False)
    ids = model.tokenizer.encode(SYSTEM)
    for rid, n, out in (("a", B - 2, 2 * B), ("b", B, B + 3), ("c", 2 * B + 5, B)):
        engine.add_request(ids[:n], SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True), request_id=rid)
    last = None
    while engine.has_unfinished_requests():
        engine.step()
        seqs = {s.request_id: s for s in engine.scheduler.running}
        tables = {rid: list(engine.block_manager.block_tables[rid]) for rid in seqs}
        if tables != last:
            console.print(f"step {len(engine.step_log):3d}  free blocks {engine.block_manager.num_free_blocks:2d}  "
                          + "   ".join(f"{rid}: {seqs[rid].num_computed_tokens:3d} tokens -> {t}"
                                       for rid, t in tables.items()), highlight=False)
            last = tables
        if "c" in seqs and seqs["c"].num_computed_tokens == 2 * B + 7:
            c, pos = seqs["c"], 2 * B + 6
            slot, = engine.block_manager.slot_mapping(c, pos, pos + 1)
            console.print(f"      slot mapping: c's token at position {pos} -> block_table[{pos} // {B}] * {B} + "
                          f"{pos} % {B} = {tables['c'][pos // B]} * {B} + {pos % B} = slot {slot}", highlight=False)


def prefix_caching(model, args):
    """A shared system prompt: the first request fills the cache, later ones find its full blocks."""
    B = args.block_size
    engine = Engine(model, max_num_seqs=4, block_size=B, enable_prefix_caching=True)
    table = Table(Column("request", no_wrap=True), "prompt tokens", "prefix_cache_queries", "prefix_cache_hits",
                  "prompt tokens computed", "block table: shared with s0 + own")
    first, rows = None, []
    for i, q in enumerate(QUESTIONS[:args.shared]):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
        rid = engine.add_request(messages, SamplingParams(max_tokens=4, temperature=0.0), chat=True,
                                 request_id=f"s{i}")
        computed, blocks, result = 0, [], None
        while engine.has_unfinished_requests():
            result = next((o.result for o in engine.step() if o.finished), result)
            computed += engine.step_log[-1].num_prefill_tokens
            blocks = list(engine.block_manager.block_tables.get(rid, blocks))
        first = first or blocks
        st = engine.stats
        rows.append((len(result.prompt_token_ids), st.prefix_cache_queries, st.prefix_cache_hits, computed))
        shared = [b for b in blocks if b in first] if i else []
        table.add_row(rid, *map(str, rows[-1]), f"{shared} + {[b for b in blocks if b not in shared]}")
    console.print(table, f"counters are running totals in tokens, as vLLM counts them; blocks of {B} tokens")
    return rows


def memory_claims(output: str) -> list[Claim]:
    """Part 1: what the paged blocks held against what reservations would hold."""
    steps, B, used, context, promised, paged, most_blocks, most_paged, most_promised, early, n = find_numbers(
        output, r"check token-steps over (\d+) steps \(blocks of (\d+)\): used ([\d,]+), reserve \d+ each ([\d,]+), "
        r"reserve prompt\+max ([\d,]+), paged ([\d,]+); at once at most: paged (\d+) blocks = ([\d,]+) tokens, "
        r"prompt\+max ([\d,]+) tokens; (\d+) of (\d+) requests stopped before max_tokens")
    table = table_with(output, "tokens held")
    rows = list(zip(table.column("step"), table.numbers("running"), table.numbers("tokens held"),
                    table.numbers("paged: blocks")))
    bad = [step for step, running, tokens, blocks in rows if running and not tokens <= blocks * B < tokens
           + running * B]
    return [
        Claim("last-block-only", "paged blocks leave at most each sequence's last block partly empty",
              bool(rows) and not bad, f"tokens <= blocks x {B:.0f} < tokens + running x {B:.0f} "
              + (f"fails at step {bad[0]}" if bad else f"in all {len(rows)} rows"), timed=False),
        Claim("stops-early", "requests stop before max_tokens, so reserving max_tokens leaves memory empty",
              early > 0, f"{early:.0f} of {n:.0f} requests", timed=False),
        Claim("paged-holds-less", "summed over the run, paged blocks hold less than exact prompt + max_tokens "
              "reservations", 0 < paged < promised, f"{paged:,.0f} vs {promised:,.0f} token-steps; the tokens "
              f"themselves {used:,.0f}, reserving the whole context {context:,.0f}", timed=False),
        Claim("paged-admits-more", "at the busiest moment paged blocks hold less than the reservations would, so the "
              "same pool admits more requests", 0 < most_paged < most_promised,
              f"{most_paged:,.0f} vs {most_promised:,.0f} tokens at once", timed=False),
    ]


def table_claims(output: str) -> list[Claim]:
    """Part 2: block tables hold exactly the blocks their tokens need, grow only at the end, and map slots."""
    B, pool = find_numbers(output, r"2\. Block tables grow one block per (\d+) tokens \(a pool of (\d+) blocks\)")
    section = flat(output).split("2. Block tables grow")[1].split("3. Prefix caching")[0]
    lines = list(re.finditer(r"step (\d+) free blocks (\d+)((?: \w+: \d+ tokens -> \[[\d, ]*\])*)", section))
    states = [block_tables(line[3]) for line in lines]                    # [{request: (tokens, [blocks])}]
    problems, seen = [], {}
    for line, tables in zip(lines, states):
        owned = [b for _, table in tables.values() for b in table]
        if len(owned) != len(set(owned)) or int(line[2]) != pool - len(owned):
            problems.append(f"step {line[1]}: {len(owned)} blocks owned, {line[2]} free of {pool:.0f}")
        for rid, (n, table) in tables.items():
            if len(table) != math.ceil(n / B) or table[:len(seen.get(rid, []))] != seen.get(rid, []):
                problems.append(f"step {line[1]}: {rid} holds {n} tokens in {table}")
            seen[rid] = table
    found = [Claim("tables-grow", f"a block table holds exactly the blocks its tokens need and grows one block per "
                   f"{B:.0f} tokens, at its end", bool(lines) and not problems,
                   problems[0] if problems else f"{len(lines)} printed states", timed=False)]
    slot = re.search(r"slot mapping: (\w+)'s token at position (\d+) -> .*? = (\d+) \* \d+ \+ (\d+) = slot (\d+)",
                     section)
    if slot:
        rid, (pos, block, offset, number) = slot[1], map(int, slot.groups()[1:])
        last = [tables for line, tables in zip(lines, states) if line.start() < slot.start()]   # printed before it
        _, table = last[-1].get(rid, (0, [])) if last else (0, [])
        holds = pos // B < len(table) and block == table[int(pos // B)] and offset == pos % B and number == \
            block * B + offset
        found.append(Claim("slot-formula", "a token's slot is block_table[position // block_size] * block_size + "
                           "position % block_size", holds, f"{rid}'s position {pos}: table {table}, slot {number}",
                           timed=False))
    return found


def block_tables(text: str) -> dict[str, tuple[int, list[int]]]:
    """'a: 14 tokens -> [0]   b: 16 tokens -> [1]' -> {'a': (14, [0]), 'b': (16, [1])}."""
    return {rid: (int(n), [int(b) for b in blocks.replace(",", " ").split()])
            for rid, n, blocks in re.findall(r"(\w+): (\d+) tokens -> \[([\d, ]*)\]", text)}


def prefix_claims(output: str) -> list[Claim]:
    """Part 3: later requests find the shared system prompt's full blocks in the cache and compute only the rest."""
    B, = find_numbers(output, r"as vLLM counts them; blocks of (\d+) tokens")
    table = table_with(output, "prefix_cache_hits")
    prompts, hits, computed = (table.numbers(c) for c in ("prompt tokens", "prefix_cache_hits",
                                                           "prompt tokens computed"))
    shared = [len(re.findall(r"\d+", cell.split("+")[0])) for cell in table.column("block table")]
    found = [(hits[i] - (hits[i - 1] if i else 0), prompts[i], computed[i], shared[i]) for i in range(len(prompts))]
    later = found[1:]
    first_ok = bool(found) and found[0][0] == 0 and found[0][2] == found[0][1]
    return [
        Claim("prefix-hits", "with a shared system prompt, every later request finds cached prompt tokens and computes "
              "only the rest", first_ok and bool(later) and all(h > 0 and c == p - h for h, p, c, _ in later),
              "; ".join(f"s{i}: {h:.0f} of {p:.0f} found, {c:.0f} computed" for i, (h, p, c, _) in enumerate(found)),
              timed=False),
        Claim("prefix-whole-blocks", f"prefix-cache hits come in whole blocks of {B:.0f}, the blocks shared with s0",
              bool(later) and all(h == n * B for h, _, _, n in later),
              "; ".join(f"s{i + 1}: {h:.0f} tokens in {n} shared blocks" for i, (h, _, _, n) in enumerate(later)),
              timed=False),
    ]


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Nothing is timed: every claim is about tokens, blocks and bytes.
    ValueError when the output lacks a table, row or line a claim reads."""
    try:
        return memory_claims(output) + table_claims(output) + prefix_claims(output)
    except (KeyError, IndexError) as exc:
        raise ValueError(f"the output lacks a row or column the claims read: {exc}") from None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=8, help="chat requests in part 1 (at least 1)")
    ap.add_argument("--max-tokens", type=int, default=96, help="each request's max_tokens (most stop at EOS first)")
    ap.add_argument("--max-model-len", type=int, default=2048, help="what a contiguous server reserves per request")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block (at least 1)")
    ap.add_argument("--shared", type=int, default=4,
                    help=f"requests sharing the system prompt in part 3 (2 to {len(QUESTIONS)})")
    ap.add_argument("--every", type=int, default=16, help="print every N-th step in part 1")
    args = ap.parse_args()
    for flag, value, low in (("--requests", args.requests, 1), ("--max-tokens", args.max_tokens, 1),
                             ("--block-size", args.block_size, 1), ("--every", args.every, 1)):
        if value < low:
            raise InputError(f"{flag} must be at least {low}, got {value}")
    if not 2 <= args.shared <= len(QUESTIONS):
        raise InputError(f"--shared must be 2 to {len(QUESTIONS)}, got {args.shared}")
    model = load_model()
    probe = Probe()                      # nothing here is timed, but the transcript records how quiet the run was
    B = args.block_size

    console.rule(f"[bold]1. Memory: {args.requests} chat requests, max_tokens {args.max_tokens}, blocks of {B}")
    peak, total = memory_table(model, args)
    console.rule(f"[bold]2. Block tables grow one block per {B} tokens (a pool of 16 blocks)")
    growing_tables(model, B)
    console.rule(f"[bold]3. Prefix caching: {args.shared} requests with the same system prompt, one after another")
    rows = prefix_caching(model, args)

    console.rule("[bold]4. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    (_, _, h0, c0), (p1, _, h1, c1) = rows[0], rows[1]
    used, B_tokens = total["tokens"], total["blocks"] * B           # token-steps: memory held, summed over steps
    most_paged, most_promised = total["most_blocks"] * B, total["most_promised"]
    console.rule("[bold]Interview question: what problem does PagedAttention solve, and what does prefix caching add?")
    answer = [
        f"Fragmentation of KV memory. Summed over this run's {total['steps']} steps, the requests' K and V filled "
        f"{used / (total['context']):.1%} of what reserving {args.max_model_len} tokens each would hold. They filled "
        f"{used / total['promised']:.1%} of exact prompt + max_tokens reservations. Here {total['early']} of "
        f"{args.requests} requests stopped before max_tokens, and output tokens fill memory only as they are "
        f"generated. They filled {used / B_tokens:.1%} of the paged blocks"
        + (". Only each sequence's last block is partly empty." if shown["last-block-only"] else ".")]
    if shown["paged-holds-less"] and shown["paged-admits-more"]:
        answer.append(f"Summed over steps, paged blocks held {total['promised'] / B_tokens:.2f}x less than prompt + "
                      "max_tokens reservations. But a pool must fit the peak, not the sum. At once, paged blocks held "
                      f"at most {mib(estimate_kv_bytes(model.config, most_paged))} and the reservations "
                      f"{mib(estimate_kv_bytes(model.config, most_promised))}, "
                      f"{most_promised / most_paged:.2f}x as much. That is roughly how many times more requests the "
                      "same pool would admit here.")
    else:
        answer.append("This run could not show paged blocks holding less than prompt + max_tokens reservations. "
                      f"Summed, they held {B_tokens:,} vs {total['promised']:,} token-steps, and at most "
                      f"{most_paged:,} vs {most_promised:,} tokens at once. When requests run to max_tokens, "
                      "reserving exactly wastes nothing. Try more requests or a larger --max-tokens.")
    answer.append(f"At the busiest step {peak['running']} requests held {peak['tokens']} tokens in {peak['blocks']} "
                  "blocks.")
    if shown["prefix-hits"]:
        answer.append(f"Blocks also make sharing possible. With a shared system prompt, s1 found {h1 - h0} of its {p1} "
                      f"prompt tokens in s0's cached blocks and computed only {c1}. The first request, s0, computed "
                      f"all {c0}.")
    else:
        answer.append(f"Blocks also make sharing possible, but this run could not show it. Request s1 found {h1 - h0} "
                      f"of its {p1} prompt tokens in s0's cached blocks and computed {c1}. A block is shared only "
                      "when it is full, so try a smaller --block-size.")
    console.print(" ".join(answer))

if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
