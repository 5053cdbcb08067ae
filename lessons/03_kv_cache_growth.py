"""Lesson 03: the KV cache — every layer keeps the keys and values of every past token, one more row per token, and
that memory, not the weights, is what grows with context length and with the number of users.

    python lessons/03_kv_cache_growth.py [--prompt TEXT] [--tokens 12] [--batch 1]

The loop is prefill.py + decode.py on a kv_cache.KVCache; after every token the table shows the cache's shape and
its bytes counted from the arrays themselves, next to kv_cache.estimate_kv_bytes (the H1 formula).
"""

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import KVCache, SamplingParams, estimate_kv_bytes, load_model  # noqa: E402
from minitransformer.decode import decode_step  # noqa: E402
from minitransformer.prefill import prefill  # noqa: E402
from minitransformer.sampling import sample  # noqa: E402

PROMPT = "The cat sat on the mat, and the dog sat on the rug, because"
console = Console(width=None if sys.stdout.isatty() else 120)     # piped: don't cut lines at 80 columns


def measured_bytes(cache: KVCache) -> list[int]:
    """Bytes of the filled K and V of each layer, read off the arrays (not from a formula)."""
    n = cache.length
    return [int(cache.k[layer, :, :, :n].nbytes + cache.v[layer, :, :, :n].nbytes) for layer in range(len(cache.k))]


def table_of(rows, last=None):
    """The steps so far; the live view shows only the last rows that fit the screen, the full table comes after."""
    table = Table("step", "new token", "K shape = V shape", "per layer", "total measured", "estimate_kv_bytes",
                  "same?", "reserved")
    for row in rows[-last:] if last else rows:
        table.add_row(*row)
    return table


def gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))   # the whole first sentence
    ap.add_argument("--prompt", default=PROMPT, help="text whose cache we watch grow")
    ap.add_argument("--tokens", type=int, default=12, help="tokens to decode (greedy)")
    ap.add_argument("--batch", type=int, default=1, help="copies of the prompt decoded together")
    args = ap.parse_args()
    for flag, value in (("--tokens", args.tokens), ("--batch", args.batch)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    model = load_model()
    cfg, tok, B = model.config, model.tokenizer, args.batch
    prompt_ids = tok.encode(args.prompt)
    P = len(prompt_ids)
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0.0)

    console.rule(f"[bold]1. The cache after the prompt ({P} tokens) and after every decoded token, batch {B}")
    console.print(f"K and V are each (layers, batch, kv_heads, tokens, head_dim) = ({cfg.n_layers}, {B}, "
                  f"{cfg.n_kv_heads}, S, {cfg.head_dim}) float32: {cfg.n_kv_heads} KV heads, not {cfg.n_heads} query "
                  f"heads (grouped-query attention shares each KV head among {cfg.group_size} query heads)")
    cache = KVCache(cfg, P + args.tokens, batch=B)
    out, history, rows = [], [], []
    with Live(table_of(rows), console=console, auto_refresh=False, transient=True) as live:
        logits = prefill(model, [prompt_ids] * B, cache)                             # (B, V)
        for step in range(args.tokens + 1):
            per_layer = measured_bytes(cache)
            total, estimate = sum(per_layer), estimate_kv_bytes(cfg, cache.length, B)
            history.append((cache.length, total, estimate))
            label = "prompt" if step == 0 else repr(tok.decode([out[-1]]))
            rows.append((str(step), label, str(cache.shape), f"{per_layer[0]:,} B", f"{total:,} B", f"{estimate:,} B",
                         "[green]yes" if total == estimate else "[red]NO", f"{cache.bytes_reserved:,} B"))
            live.update(table_of(rows, max(3, console.size.height - 8)), refresh=True)
            if step == args.tokens:
                break
            tokens = sample(logits, [greedy] * B, [None] * B, [prompt_ids] * B, [out] * B)   # (B,) greedy
            out.append(int(tokens[0]))
            logits = decode_step(model, tokens, cache)                               # one new K/V row per layer
    console.print(table_of(rows))
    console.print("reserved is the same on every row: the cache is preallocated once for prompt + max_tokens "
                  "positions; the measured bytes are the rows filled so far")
    per_token = history[1][1] - history[0][1] if len(history) > 1 else estimate_kv_bytes(cfg, 1, B)
    console.print("check bytes: " + ", ".join(f"S={s}: {m}" for s, m, _ in history))
    console.print(f"check estimator: measured == estimate_kv_bytes at {sum(m == e for _, m, e in history)} of "
                  f"{len(history)} steps; each token adds {per_token:,} bytes (batch {B})")
    table = Table("layer", "K shape", "V shape", "bytes (K + V)")
    shown = sorted({0, 1, cfg.n_layers - 1})
    for layer in shown:
        n = cache.length
        table.add_row(str(layer), str(cache.k[layer, :, :, :n].shape), str(cache.v[layer, :, :, :n].shape),
                      f"{measured_bytes(cache)[layer]:,}")
    console.print(f"every layer holds its own K and V (layers {', '.join(map(str, shown))} of {cfg.n_layers} shown):",
                  table)

    console.rule("[bold]2. What is in the cache: attention keys and values, not text")
    ids, last = prompt_ids + out, cfg.n_layers - 1
    fresh = KVCache(cfg, len(ids))
    prefill(model, ids[:cache.length], fresh)                                    # all tokens in one pass
    same = float(np.abs(fresh.k[:, 0] - cache.k[:, 0, :, :fresh.length]).max())
    console.print(f"Stored per token: {per_token // B:,} bytes of K and V (batch {B}: {per_token:,}), where the "
                  f"token's id is one integer and its text a few bytes.")
    repeats = [t for t in ids if ids.count(t) > 1]
    if repeats:                                                                  # the same token twice
        a, b = [i for i, t in enumerate(ids) if t == repeats[0]][:2]
        k_a, k_b = cache.k[last, 0, :, a], cache.k[last, 0, :, b]                 # (kv_heads, head_dim) each
        change = float(np.linalg.norm(k_a - k_b) / np.linalg.norm(k_a))
        console.print(f"token {tok.decode([repeats[0]])!r} is at positions {a} and {b}; its keys in layer {last} "
                      f"differ by {change:.0%} (|k_b - k_a| / |k_a|): a key encodes the token in its position and "
                      "context, so the cache cannot be replaced by the text of the past tokens.")
    console.print(f"check recompute: max |cache built token by token - cache of one full pass| = {same:.1e}: decode "
                  "stored exactly the keys and values a full pass computes, so it never recomputes them")
    console.print("Diagram: figures/kv_cache_growth.png, one layer's K in a real KVCache after prefill and after each "
                  "decode step, per KV head (positions x head_dim), with the cache's shape and bytes.")

    console.rule("[bold]3. Projection: an 8B-class shape (32 layers, 8 KV heads, head_dim 128) in float16")
    big = dataclasses.replace(cfg, n_layers=32, n_kv_heads=8, head_dim=128, context_length=16384)
    batches = (1, 4, 16)
    table = Table("shape", "values", "tokens", *(f"batch {b}" for b in batches))
    for name, shape, dtype, lengths in (("32 layers x 8 KV heads x 128", big, np.float16, (4096, 16384)),
                                        (f"this model ({cfg.n_layers} x {cfg.n_kv_heads} x {cfg.head_dim})", cfg,
                                         np.float32, (4096, cfg.context_length))):
        for n in lengths:
            table.add_row(name, np.dtype(dtype).name, f"{n:,}",
                          *(gib(estimate_kv_bytes(shape, n, b, dtype)) for b in batches))
    console.print(table)
    own = estimate_kv_bytes(cfg, cfg.context_length, 16)
    small, large = estimate_kv_bytes(big, 4096, 4, np.float16), estimate_kv_bytes(big, 16384, 16, np.float16)
    console.print(f"check H1: 4096 tokens x batch 4 = {gib(small)}; 16384 tokens x batch 16 = {gib(large)}")

    console.rule("[bold]Interview question: what does the KV cache store, and how big does it get?")
    console.print(
        f"Keys and values of every attention layer for every past token, not text: here {per_token // B:,} bytes per "
        f"token (2 x {cfg.n_layers} layers x {cfg.n_kv_heads} KV heads x {cfg.head_dim} dims x 4 bytes), measured "
        f"{history[-1][1]:,} bytes after {history[-1][0]} tokens x batch {B}, equal to the estimate. It grows "
        f"linearly in tokens and in batch: for 32 layers, 8 KV heads, head_dim 128 in float16, 4k tokens x batch 4 "
        f"need {gib(small)} and 16k tokens x batch 16 need {gib(large)}. For this model, 16 users at its full "
        f"{cfg.context_length:,}-token context would need {gib(own)} of cache, {own / model.weight_bytes:.0f}x its "
        f"{gib(model.weight_bytes)} of weights. How many requests fit depends on both: the model fixes the bytes per "
        f"token (2 x layers x KV heads x head_dim x bytes per value; sharing {cfg.n_kv_heads} KV heads among "
        f"{cfg.n_heads} query heads makes them {cfg.n_heads // cfg.n_kv_heads}x fewer) and the memory its weights "
        f"take; context length x concurrent users multiply those bytes per token until the rest of memory is full.")

if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
