"""Lesson 03: the KV cache — every layer keeps the keys and values of every past token, one more row per token, and
that memory, not the weights, is what grows with context length and with the number of users.

    python lessons/03_kv_cache_growth.py [--prompt TEXT] [--tokens 12] [--batch 1] [--compare gemma3-270m]

The loop is prefill.py + decode.py on a kv_cache.KVCache; after every token the table shows the cache's shape and
its bytes counted from the arrays themselves, next to kv_cache.estimate_kv_bytes (the H1 formula). Nothing here is
timed: every claim (claims() below) is about bytes and values, decided from the numbers the lesson prints.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import KVCache, SamplingParams, estimate_kv_bytes, load_model
from minitransformer.core.decode import decode_step
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.prefill import prefill
from minitransformer.core.sampling import sample
from minitransformer.lab.claims import NUMBER, Claim, find_numbers, flat, report
from minitransformer.lab.measure import Probe

PROMPT = "The cat sat on the mat, and the dog sat on the rug, because"
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's table first. The `total measured` column should grow by the same bytes every row.",
    "`same?` compares the measured bytes with estimate_kv_bytes, and `reserved` is what was allocated up front.",
    "Section 3 projects the same formula onto an 8B-class model, with no timing involved.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
SAME_VALUES = 1e-4          # float32 sums in another order: token by token and one pass agree to about 1e-5
KEY_DIFFERS = 0.01          # the same token's keys at two positions count as different when they differ by 1%+
H1_SHAPE = 2 * 32 * 8 * 128 * 2      # K and V x 32 layers x 8 KV heads x head_dim 128 x 2 bytes (float16)


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). All of it is bytes and values, none of it time: timed=False."""
    text = flat(output)
    bytes_line = re.search(r"check bytes: (.*?) check estimator", text)
    history = [(int(s), int(b)) for s, b in re.findall(r"S=(\d+): (\d+)", bytes_line[1] if bytes_line else "")]
    same, steps, per_token, batch = find_numbers(output, r"check estimator: measured == estimate_kv_bytes at (\d+) "
                                                         r"of (\d+) steps; each token adds ([\d,]+) bytes \(batch "
                                                         r"(\d+)\)")
    reserved, distinct, full = find_numbers(output, r"check reserved: ([\d,]+) bytes on every row \((\d+) "
                                                    r"distinct\); the full cache holds ([\d,]+) bytes")
    diff, = find_numbers(output, rf"check recompute: max \|cache built token by token - cache of one full pass\| = "
                                 rf"({NUMBER})")
    small, large = find_numbers(output, r"check H1: 4096 tokens x batch 4 = ([\d.]+) GiB; 16384 tokens x batch 16 = "
                                        r"([\d.]+) GiB")
    per_s = {b / s for s, b in history}                                  # bytes per token of context: one value?
    steps_added = {b2 - b1 for (_, b1), (_, b2) in zip(history, history[1:])}
    found = [
        Claim("estimator", "the bytes counted from the arrays equal estimate_kv_bytes (the H1 formula) at every step",
              steps > 0 and same == steps, f"{same:.0f} of {steps:.0f} steps", timed=False),
        Claim("linear-in-tokens", "every token adds the same bytes: the cache grows linearly with the context",
              len(history) > 1 and len(per_s) == 1 and steps_added == {per_token},
              f"{len(history)} steps; bytes / context tokens: {', '.join(f'{x:,.0f}' for x in sorted(per_s))}; "
              f"added per step: {', '.join(f'{x:,}' for x in sorted(steps_added))} (batch {batch:.0f})",
              timed=False),
        Claim("preallocated", "the reserved bytes never change: the whole cache is allocated up front",
              distinct == 1 and reserved >= full, f"{reserved:,.0f} bytes reserved on every row, {full:,.0f} filled "
              "at the end", timed=False),
        Claim("recompute-same", "decode stored the keys and values a full pass over the same tokens computes",
              diff < SAME_VALUES, f"max difference {diff:.1e}, limit {SAME_VALUES:.0e}", timed=False),
        Claim("h1", "the projection reproduces H1: 2.00 GiB at 4096 tokens x batch 4, 32.00 GiB at 16384 x 16",
              (small, large) == (round(H1_SHAPE * 4096 * 4 / 2**30, 2), round(H1_SHAPE * 16384 * 16 / 2**30, 2)),
              f"printed {small:.2f} and {large:.2f} GiB", timed=False),
    ]
    second = re.search(r"check second model: measured == estimate_kv_bytes at (\d+) of (\d+) steps", text)
    if second:                                           # printed only with --compare
        found.append(Claim("second-model-estimator", "the second model's cache, counted from its arrays, equals "
                           "estimate_kv_bytes at every step", second[1] == second[2] and int(second[2]) > 0,
                           f"{second[1]} of {second[2]} steps", timed=False))
    keys = re.search(rf"its keys in layer \d+ differ by ({NUMBER})%", text)
    if keys:                                             # printed only when a token appears twice in the text
        change = float(keys[1]) / 100
        found.append(Claim("context-in-keys", "the same token stored at two positions has different keys",
                           change > KEY_DIFFERS, f"{change:.0%} apart, limit {KEY_DIFFERS:.0%}", timed=False))
    return found


def measured_bytes(cache: KVCache) -> list[int]:
    """Bytes of the filled K and V of each layer, read off the arrays (not from a formula)."""
    n = cache.length
    return [int(cache.k[layer, :, :n].nbytes + cache.v[layer, :, :n].nbytes) for layer in range(len(cache.k))]


def table_of(rows, last=None):
    """The steps so far; the live view shows only the last rows that fit the screen, the full table comes after."""
    table = Table("step", "new token", "K shape = V shape", "per layer", "total measured", "estimate_kv_bytes",
                  "same?", "reserved")
    for row in rows[-last:] if last else rows:
        table.add_row(*row)
    return table


def compare_model(other, prompt: str, tokens: int, own_per_token: int, model) -> None:
    """Section 3b (with --compare): the same prompt and greedy tokens through `other`'s own KVCache, its bytes read
    off the arrays after every step next to estimate_kv_bytes, against this model's bytes per token."""
    cfg, own = other.config, model.config
    console.rule(f"[bold]3b. The same measurement on a second model: {other.path.stem}")
    ids = other.tokenizer.encode(prompt)
    cache = KVCache(cfg, len(ids) + tokens)
    logits = prefill(other, [ids], cache)                                        # (1, V)
    history = []
    for step in range(tokens + 1):
        history.append((cache.length, sum(measured_bytes(cache)), estimate_kv_bytes(cfg, cache.length)))
        if step < tokens:
            logits = decode_step(other, [int(np.asarray(logits).argmax(-1)[0])], cache)   # greedy
    table = Table("model", "layers x KV heads x head_dim", "bytes per token", "measured after the last step",
                  "estimate_kv_bytes")
    table.add_row("this model", f"{own.n_layers} x {own.n_kv_heads} x {own.head_dim}", f"{own_per_token:,}",
                  "", "")
    n, measured, estimate = history[-1]
    table.add_row(other.path.stem, f"{cfg.n_layers} x {cfg.n_kv_heads} x {cfg.head_dim}", f"{measured // n:,}",
                  f"{measured:,} B at {n} tokens", f"{estimate:,} B")
    console.print(table)
    console.print(f"check second model: measured == estimate_kv_bytes at {sum(m == e for _, m, e in history)} of "
                  f"{len(history)} steps; {measured // n:,} bytes per token vs this model's {own_per_token:,} "
                  f"({measured // n / own_per_token:.2f}x), with {other.weight_bytes / 2**20:,.0f} MiB of weights vs "
                  f"{model.weight_bytes / 2**20:,.0f}")


def gib(n: float) -> str:
    return f"{n / 2**30:,.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))   # the whole first sentence
    ap.add_argument("--prompt", default=PROMPT, help="text whose cache we watch grow")
    ap.add_argument("--tokens", type=int, default=12, help="tokens to decode (greedy)")
    ap.add_argument("--batch", type=int, default=1, help="copies of the prompt decoded together")
    ap.add_argument("--compare", metavar="NAME|PATH", help="a second model (e.g. gemma3-270m) whose cache is measured "
                    "the same way after section 3: the model-size lever measured, not projected (lesson 17 goes on)")
    args = ap.parse_args()
    for flag, value in (("--tokens", args.tokens), ("--batch", args.batch)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    model = load_model()
    probe = Probe()                             # nothing here is timed, but every lesson reports how quiet it ran
    cfg, tok, B = model.config, model.tokenizer, args.batch
    prompt_ids = tok.encode(args.prompt)
    P = len(prompt_ids)
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0.0)

    console.rule(f"[bold]1. The cache after the prompt ({P} tokens) and after every decoded token, batch {B}")
    console.print(f"K and V are each (layers, batch, tokens, kv_heads, head_dim) = ({cfg.n_layers}, {B}, S, "
                  f"{cfg.n_kv_heads}, {cfg.head_dim}) float32: {cfg.n_kv_heads} KV heads, not {cfg.n_heads} query "
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
    console.print("reserved: the bytes allocated when the cache was made, for prompt + max_tokens positions; "
                  "measured: the rows filled so far")
    per_token = history[1][1] - history[0][1] if len(history) > 1 else estimate_kv_bytes(cfg, 1, B)
    console.print("check bytes: " + ", ".join(f"S={s}: {m}" for s, m, _ in history))
    console.print(f"check estimator: measured == estimate_kv_bytes at {sum(m == e for _, m, e in history)} of "
                  f"{len(history)} steps; each token adds {per_token:,} bytes (batch {B})")
    reserved = {row[-1] for row in rows}
    console.print(f"check reserved: {cache.bytes_reserved:,} bytes on every row ({len(reserved)} distinct); the full "
                  f"cache holds {history[-1][1]:,} bytes")
    table = Table("layer", "K shape", "V shape", "bytes (K + V)")
    shown = sorted({0, 1, cfg.n_layers - 1})
    for layer in shown:
        n = cache.length
        table.add_row(str(layer), str(cache.k[layer, :, :n].shape), str(cache.v[layer, :, :n].shape),
                      f"{measured_bytes(cache)[layer]:,}")
    console.print(f"every layer holds its own K and V (layers {', '.join(map(str, shown))} of {cfg.n_layers} shown):",
                  table)

    console.rule("[bold]2. What is in the cache: attention keys and values, not text")
    ids, last = prompt_ids + out, cfg.n_layers - 1
    fresh = KVCache(cfg, len(ids))
    prefill(model, ids[:cache.length], fresh)                                    # all tokens in one pass
    same = float(np.abs(fresh.k[:, 0] - cache.k[:, 0, :fresh.length]).max())
    console.print(f"Stored per token: {per_token // B:,} bytes of K and V (batch {B}: {per_token:,}), where the "
                  f"token's id is one integer and its text a few bytes.")
    repeats = [t for t in ids if ids.count(t) > 1]
    if repeats:                                                                  # the same token twice
        a, b = [i for i, t in enumerate(ids) if t == repeats[0]][:2]
        k_a, k_b = cache.k[last, 0, a], cache.k[last, 0, b]                 # (kv_heads, head_dim) each
        change = float(np.linalg.norm(k_a - k_b) / np.linalg.norm(k_a))
        console.print(f"token {tok.decode([repeats[0]])!r} is at positions {a} and {b}; its keys in layer {last} "
                      f"differ by {change:.0%} (|k_b - k_a| / |k_a|)")
    console.print(f"check recompute: max |cache built token by token - cache of one full pass| = {same:.1e}")
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
    if args.compare:
        compare_model(load_model(args.compare), args.prompt, args.tokens, per_token // B, model)

    console.rule("[bold]4. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview question: what does the KV cache store, and how big does it get?")
    answer = [f"Keys and values of every attention layer for every past token, not text. Here that is "
              f"{per_token // B:,} bytes per token (2 x {cfg.n_layers} layers x {cfg.n_kv_heads} KV heads x "
              f"{cfg.head_dim} dims x 4 bytes). This run measured {history[-1][1]:,} bytes after {history[-1][0]} "
              f"tokens x batch {B}"
              + (", equal to the estimate at every step." if shown["estimator"] else
                 ". That count did not match the estimate at every step. The claims above say why.")]
    if shown.get("context-in-keys") and shown["recompute-same"]:
        answer.append(f"They are not the text in another form. The same token's keys at two positions differed by "
                      f"{change:.0%}, because a key encodes the token in its position and its context. They are also "
                      f"what a full pass over the same tokens computes, to {same:.0e} (float32 rounding). So decode "
                      "stores them once and never recomputes them.")
    elif shown["recompute-same"]:
        answer.append(f"They are what a full pass over the same tokens computes, to {same:.0e} (float32 rounding). "
                      "So decode stores them once and never recomputes them.")
    if shown["linear-in-tokens"] and shown["estimator"]:
        answer.append(f"Every token added the same {per_token:,} bytes, so the cache grows linearly in tokens. The "
                      "formula it matched is linear in the batch too.")
    else:
        answer.append("This run's steps could not show the linear growth itself. The claims above say why. The H1 "
                      "formula gives the sizes below.")
    answer.append(f"For 32 layers, 8 KV heads and head_dim 128 in float16, 4k tokens x batch 4 need {gib(small)} and "
                  f"16k tokens x batch 16 need {gib(large)}. For this model, 16 users at its full "
                  f"{cfg.context_length:,}-token context would need {gib(own)} of cache, "
                  f"{own / model.weight_bytes:.0f}x its {gib(model.weight_bytes)} of weights. How many requests fit "
                  "depends on two things the model fixes. One is the bytes per token: 2 x layers x KV heads x "
                  f"head_dim x bytes per value. Sharing {cfg.n_kv_heads} KV heads among {cfg.n_heads} query heads "
                  f"makes them {cfg.n_heads // cfg.n_kv_heads}x fewer. The other is the memory its weights take. "
                  "Context length x concurrent users multiplies the bytes per token until the rest of memory is "
                  "full.")
    if shown["preallocated"]:
        answer.append(f"This KVCache reserves all {cache.bytes_reserved:,} bytes for prompt + max_tokens up front. "
                      "The reserved column never changed. Lesson 09's paged cache hands out blocks as tokens arrive "
                      "instead.")
    console.print(" ".join(answer))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
