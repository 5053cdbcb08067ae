"""Lesson 09: paged attention: KV memory in blocks, block tables that grow, and prefix blocks shared between requests.

    python lessons/09_paged_attention.py [--requests 8] [--max-tokens 96] [--max-model-len 2048] [--block-size 16]

A contiguous KV cache must reserve a request's whole length up front: the context a server allows (max_model_len),
or at best prompt + max_tokens. Requests stop early, so most of it stays empty. The paged cache (vLLM, Kwon et al.,
SOSP '23) hands out blocks of block_size tokens as a sequence grows; only each sequence's last block is partly empty.
Everything below is measured on minitransformer.serving.Engine running the real model.
"""

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import SamplingParams, estimate_kv_bytes, load_model  # noqa: E402
from minitransformer.serving import Engine  # noqa: E402

QUESTIONS = ["What is the capital of France?", "Write a haiku about the sea.", "Explain what a GPU does.",
             "Give three tips for learning to cook.", "Why is the sky blue?", "Name two planets.",
             "Describe a cat in one sentence.", "How do vaccines work?", "What is 12 times 12?",
             "Tell me a short story about a robot."]
SYSTEM = ("You are a helpful assistant for a cooking school. Answer briefly and politely. If a question is not about "
          "cooking, say so and offer a cooking tip instead. Always use metric units, name the utensils needed, and "
          "warn about hot surfaces and sharp knives when they matter.")
console = Console(width=None if sys.stdout.isatty() else 120)     # piped: don't cut titles at 80 columns


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
    table = Table("step", "running", "tokens held", "used", f"reserve {args.max_model_len} each",
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
    console.print(table, f"(peak): the step holding the most tokens. One token's K and V = {estimate_kv_bytes(cfg, 1):,} "
                         f"bytes (2 x {cfg.n_layers} layers x {cfg.n_kv_heads} kv heads x {cfg.head_dim} x 4 B); "
                         f"a block of {B} = {engine.cache.bytes_per_block:,} bytes")
    lengths = [len(r.token_ids) for r in results.values()]
    console.print(f"outputs: {lengths} tokens (max_tokens {args.max_tokens}; finish reasons "
                  f"{sorted({r.finish_reason for r in results.values()})})", highlight=False)
    total["steps"], total["early"] = len(engine.step_log), sum(n < args.max_tokens for n in lengths)
    total["most_promised"], total["most_blocks"] = most["promised"], most["blocks"]
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
    table = Table("request", "prompt tokens", "prefix_cache_queries", "prefix_cache_hits", "prompt tokens computed",
                  "block table: shared with s0 + own")
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=8, help="chat requests in part 1 (at least 1)")
    ap.add_argument("--max-tokens", type=int, default=96, help="each request's max_tokens (most stop at EOS first)")
    ap.add_argument("--max-model-len", type=int, default=2048, help="what a contiguous server reserves per request")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block (at least 1)")
    ap.add_argument("--shared", type=int, default=4, help=f"requests sharing the system prompt in part 3 (2 to {len(QUESTIONS)})")
    ap.add_argument("--every", type=int, default=16, help="print every N-th step in part 1")
    args = ap.parse_args()
    for flag, value, low in (("--requests", args.requests, 1), ("--max-tokens", args.max_tokens, 1),
                             ("--block-size", args.block_size, 1), ("--every", args.every, 1)):
        if value < low:
            raise InputError(f"{flag} must be at least {low}, got {value}")
    if not 2 <= args.shared <= len(QUESTIONS):
        raise InputError(f"--shared must be 2 to {len(QUESTIONS)}, got {args.shared}")
    model = load_model()
    B = args.block_size

    console.rule(f"[bold]1. Memory: {args.requests} chat requests, max_tokens {args.max_tokens}, blocks of {B}")
    peak, total = memory_table(model, args)
    console.rule(f"[bold]2. Block tables grow one block per {B} tokens (a pool of 16 blocks)")
    growing_tables(model, B)
    console.rule(f"[bold]3. Prefix caching: {args.shared} requests with the same system prompt, one after another")
    rows = prefix_caching(model, args)

    (_, _, h0, c0), (p1, _, h1, c1) = rows[0], rows[1]
    used, B_tokens = total["tokens"], total["blocks"] * B           # token-steps: memory held, summed over steps
    console.rule("[bold]Interview question: what problem does PagedAttention solve, and what does prefix caching add?")
    console.print(
        f"Fragmentation of KV memory. Summed over this run's {total['steps']} steps, the requests' K and V filled "
        f"{used / (total['context']):.1%} of what reserving {args.max_model_len} tokens each would hold, "
        f"{used / total['promised']:.1%} of exact prompt + max_tokens reservations ({total['early']} of "
        f"{args.requests} requests stopped before max_tokens, and output tokens fill memory only as they are "
        f"generated), and {used / B_tokens:.1%} of the paged blocks (only each sequence's last block is partly "
        f"empty). Summed over steps, paged blocks held {total['promised'] / B_tokens:.2f}x less than prompt + max_tokens "
        f"reservations, but a pool must fit the peak, not the sum: at most "
        f"{mib(estimate_kv_bytes(model.config, total['most_blocks'] * B))} paged vs "
        f"{mib(estimate_kv_bytes(model.config, total['most_promised']))} reserved at once, "
        f"{total['most_promised'] / (total['most_blocks'] * B):.2f}x, roughly how many times more requests "
        f"the same pool would admit here. At the busiest step {peak['running']} requests held {peak['tokens']} tokens in "
        f"{peak['blocks']} blocks. Blocks also make sharing possible: with a shared system prompt, s1 found "
        f"{h1 - h0} of its {p1} prompt tokens in s0's cached blocks and computed only {c1}; s0 computed all {c0}.")


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
