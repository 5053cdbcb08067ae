"""Lesson 17: what a model's shape costs — two real models side by side (SmolLM2-135M and Gemma 3 270M) and the same
arithmetic for an 8B model: where the parameters sit, what decode and prefill pay for them, how big the KV cache gets
(MQA vs GQA, a sliding window), and what quantization buys when the lm_head is most of the model.

    python lessons/17_model_shape.py [--second gemma3-270m] [--prompt-tokens 128] [--repeats 10] [--tokens 8]

Both models load through the same load_model and run through the same forward, generate() and KVCache. The
parameters are counted by place from each model's config (bench/model_shape.py) and checked against the loaded arrays;
decode steps and prefills of both are timed in turns (measure.interleaved); the KV cache's bytes per token are read
off a real cache; which of Gemma 3's layers slide is read from its config, and writing garbage into the keys a
sliding layer can no longer see shows that a cache may drop them. The 8B model is Llama 3.1 8B's shape
(viz_capacity.LLAMA_3_1_8B): arithmetic only. Claims (claims() below) are decided from the printed numbers; a timing
claim is shown only beyond the spread on a quiet machine (minitransformer/lab/measure.py).

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import dataclasses
import re
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import KVCache, SamplingParams, generate, load_model
from minitransformer.bench.model_shape import (
    FORMATS,
    counted_parameters,
    decode_call,
    decode_read_bytes,
    parameters_by_place,
    prefill_call,
)
from minitransformer.core.decode import decode_step
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.kv_cache import estimate_kv_bytes, estimate_kv_bytes_windowed
from minitransformer.core.prefill import prefill
from minitransformer.lab.claims import NUMBER, Claim, bound_line, find_numbers, flat, report, table_with
from minitransformer.lab.machine import H200
from minitransformer.lab.measure import Probe, interleaved
from minitransformer.lab.peaks import machine_profile
from minitransformer.lab.viz_capacity import LLAMA_3_1_8B

# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 2's table first: where each model's parameters sit, and the `embedding + lm_head %` column.",
    "Section 3 times a decode step and a prefill of both models in turns; `check ratio` compares the two phases.",
    "Sections 4-6 are bytes, not time: the KV cache per token and at 4k / 32k tokens, and the weight bytes a decode "
    "step reads in each format.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
PROMPT = "The capital of France is"
TEXT = ("The river runs past the old mill, where the miller kept his accounts in a book bound with red thread. "
        "Every spring the water rose and the wheel turned faster, and the village came to grind its grain. ")
CONTEXTS = (4096, 32768)
MB, MiB = 1e6, 2 ** 20
BF16 = np.float16                  # 2 bytes a value, as bf16: only the bytes matter here
DEAD_EXTRA = 88                    # tokens past the window in the dead-key check: 600 tokens for a 512 window
UNCHANGED, CHANGED = 1e-6, 1e-3    # logits "unchanged" up to float32 rounding; "changed" beyond it


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Rows are in the order the lesson prints them: the first model, the
    second model, the 8B shape."""
    text = flat(output)
    arrays = re.findall(r"check arrays (\S+): counted ([\d,]+) == config ([\d,]+)", text)
    places = table_with(output, "embedding + lm_head %")
    shares = places.numbers("embedding + lm_head %")
    decode, pre = table_with(output, "step min ms"), table_with(output, "prefill min ms")
    d_low, d_spread = decode.numbers("step min ms"), decode.numbers("spread ms")
    p_low, p_spread = pre.numbers("prefill min ms"), pre.numbers("spread ms")
    d_ratio = (d_low[1] / (d_low[0] + d_spread[0]), (d_low[1] + d_spread[1]) / d_low[0])   # second / first, range
    p_ratio = (p_low[1] / (p_low[0] + p_spread[0]), (p_low[1] + p_spread[1]) / p_low[0])
    kv = table_with(output, "KV bytes per token")
    measured = [(shape, float(m.replace(",", "")), float(b.replace(",", ""))) for shape, b, m in
                zip(kv.column("layers x KV heads x head_dim"), kv.column("KV bytes per token"), kv.column("measured"))
                if m.strip() not in ("", "-")]
    formula_ok = [4 * 2 * np.prod([int(x) for x in shape.split(" x ")]) == b == m for shape, m, b in measured]
    slide, total, window, kept, all_tokens = find_numbers(
        output, rf"check window: (\d+) of (\d+) layers slide .*?window ([\d,]+); at 32,768 tokens they keep "
                rf"({NUMBER}) of ({NUMBER}) layer-tokens")
    window_rows = table_with(output, "sliding layers keep")
    full, windowed = window_rows.numbers("every layer keeps"), window_rows.numbers("sliding layers keep")
    at_32k = [i for i, n in enumerate(window_rows.numbers("tokens")) if n == 32768]
    sliding_change, global_change = find_numbers(
        output, rf"changed the next token's logits by at most ({NUMBER}); the same garbage in the global layers' "
                rf"changed them by ({NUMBER})")
    f32 = re.findall(r"check decode bytes (\S+): computed ([\d,]+) == loaded weights ([\d,]+)", text)
    quant = table_with(output, "format")
    rows = list(zip(quant.column("model"), quant.column("format"), quant.numbers("vs bf16"),
                    quant.numbers("lm_head share")))
    mixed = [(model, gain, share) for model, fmt, gain, share in rows if fmt == "int4, lm_head int8"]
    found = [
        Claim("params-from-arrays", "the parameters counted by place from the config are the loaded arrays' sizes",
              len(arrays) == 2 and all(a == b for _, a, b in arrays),
              "; ".join(f"{name} {a} vs {b}" for name, a, b in arrays), timed=False),
        Claim("embedding-majority", "most of the second model's parameters are its embedding (its lm_head), "
              "unlike the first model's and the 8B's", shares[1] > 50 and shares[0] < 50 and shares[2] < 50,
              f"embedding + lm_head {shares[0]:.1f}% / {shares[1]:.1f}% / {shares[2]:.1f}%", timed=False),
        Claim("decode-slower", "a decode step of the second model takes longer than one of the first, beyond the "
              "spread", d_low[1] > d_low[0] + d_spread[0],
              f"{d_low[1]:.1f}-{d_low[1] + d_spread[1]:.1f} ms vs {d_low[0]:.1f}-{d_low[0] + d_spread[0]:.1f} ms"),
        Claim("vocab-decode", "the second model's extra parameters cost decode more than prefill: its decode step is "
              "further above the first model's than its prefill is, beyond both spreads", d_ratio[0] > p_ratio[1],
              f"decode {d_ratio[0]:.2f}-{d_ratio[1]:.2f}x, prefill {p_ratio[0]:.2f}-{p_ratio[1]:.2f}x"),
        Claim("kv-formula", "a real cache's bytes per token are 2 x layers x KV heads x head_dim x 4 bytes, for "
              "both models", len(measured) == 2 and all(formula_ok),
              "; ".join(f"{shape}: {m:,.0f} measured, {b:,.0f} computed" for shape, m, b in measured), timed=False),
        Claim("window-cache", "with its sliding layers keeping only the window, the second model's 32k cache is the "
              "printed share of the full one", bool(at_32k) and slide > 0 and all(
                  abs(windowed[i] / full[i] - kept / all_tokens) < 0.01 for i in at_32k if windowed[i] != full[i])
              and kept == (total - slide) * 32768 + slide * min(32768, window),
              f"{slide:.0f} of {total:.0f} layers slide; kept {kept:,.0f} of {all_tokens:,.0f} layer-tokens",
              timed=False),
        Claim("window-dead", "the keys outside a sliding layer's window change no logit; the same keys in a global "
              "layer do", sliding_change <= UNCHANGED and global_change > CHANGED,
              f"sliding {sliding_change:.1e}, global {global_change:.1e}; limits {UNCHANGED:.0e} and {CHANGED:.0e}",
              timed=False),
        Claim("decode-bytes", "the weight bytes a decode step reads, computed from the shape, are the loaded "
              "models' weight bytes in float32", len(f32) == 2 and all(a == b for _, a, b in f32),
              "; ".join(f"{name} {a} vs {b}" for name, a, b in f32), timed=False),
        Claim("lm-head-int4", "with the lm_head kept at int8, int4 layers cut the second model's decode bytes less "
              "than the 8B's, because most of them are its lm_head", len(mixed) == 3 and mixed[1][1] < mixed[2][1]
              and mixed[1][2] > 50, ", ".join(f"{m} {g:.2f}x (lm_head {s:.0f}%)" for m, g, s in mixed), timed=False),
    ]
    return found


def label(model) -> str:
    """'SmolLM2-135M-Instruct', 'gemma-3-270m': the file's name without its quantization suffix."""
    return re.sub(r"[.-]q\d.*$", "", model.path.stem, flags=re.I)


def attention_kind(config) -> str:
    """'MQA 4:1', 'GQA 9:3', 'MHA 4:4': query heads : KV heads."""
    kind = "MQA" if config.n_kv_heads == 1 else "MHA" if config.n_kv_heads == config.n_heads else "GQA"
    return f"{kind} {config.n_heads}:{config.n_kv_heads}"


def layer_list(layers) -> str:
    """(0, 1, 2, 3, 4, 6, ...) -> '0-4, 6-10, ...'."""
    runs, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            runs.append(str(start) if start == layer else f"{start}-{layer}")
            start = None
    return ", ".join(runs) or "none"


def filled_bytes_per_token(cache: KVCache) -> float:
    """Bytes of K and V a real cache holds per token, read off its arrays (not from a formula)."""
    n = cache.length
    return (cache.k[:, :, :n].nbytes + cache.v[:, :, :n].nbytes) / n


def dead_key_check(model, ids: list[int]):
    """Prefill `ids` (longer than the window), then decode one token three times: as is, with garbage in every
    sliding layer's keys and values the next query cannot see (positions <= P - window), and with the same garbage
    in the global layers'. Returns (max logit change sliding, global, dead positions, the cache)."""
    cfg, P = model.config, len(ids)
    cache = KVCache(cfg, P + 1)
    token = int(np.asarray(prefill(model, ids, cache)).argmax(-1)[0])
    clean = np.asarray(decode_step(model, [token], cache))                           # (1, V)
    dead = P - cfg.sliding_window + 1                                               # positions 0 .. P - window
    keep_k, keep_v = cache.k.copy(), cache.v.copy()                                 # (layers, 1, P + 1, K, d)
    rng = np.random.default_rng(0)
    changes = []
    for layers in (list(cfg.sliding_layers), [i for i in range(cfg.n_layers) if i not in cfg.sliding_layers]):
        cache.truncate(P)
        cache.k[...], cache.v[...] = keep_k, keep_v
        for array in (cache.k, cache.v):
            array[layers, :, :dead] = rng.normal(0, 10, array[layers, :, :dead].shape)
        logits = np.asarray(decode_step(model, [token], cache))
        changes.append(float(np.abs(logits - clean).max()))
    cache.truncate(P)
    return changes[0], changes[1], dead, cache


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--model", metavar="PATH", help="the first model (default: SmolLM2-135M)")
    ap.add_argument("--second", default="gemma3-270m", metavar="NAME|PATH",
                    help="the second model: a Gemma 3 GGUF with sliding layers (default: gemma3-270m, fetched once)")
    ap.add_argument("--prompt-tokens", type=int, default=128, help="prompt length for the prefill and decode timings")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs of each, in turns")
    ap.add_argument("--tokens", type=int, default=8, help="tokens each model generates (greedy) in section 1")
    args = ap.parse_args()
    for flag, value in (("--prompt-tokens", args.prompt_tokens), ("--repeats", args.repeats),
                        ("--tokens", args.tokens)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    models = [load_model(args.model), load_model(args.second)]
    if not models[1].config.sliding_layers:
        raise InputError(f"--second {args.second} has no sliding layers; lesson 17 needs a model with a sliding "
                         "window (Gemma 3: --second gemma3-270m)")
    probe = Probe()                                                      # is the machine quiet during this run?
    names = [label(m) for m in models]
    configs = [m.config for m in models] + [LLAMA_3_1_8B]
    all_names = names + ["Llama-3.1-8B (shape)"]
    first, second = models

    console.rule("[bold]1. Two models through the same forward, and an 8B shape")
    table = Table("", *all_names)
    rows = [("layers", "n_layers"), ("d_model", "d_model"), ("query heads", "n_heads"), ("KV heads", "n_kv_heads"),
            ("head_dim", "head_dim"), ("FFN", "ffn_dim"), ("vocabulary", "vocab_size"),
            ("context", "context_length")]
    for name, field in rows:
        table.add_row(name, *(f"{getattr(c, field):,}" for c in configs))
    table.add_row("attention", *(attention_kind(c) for c in configs))
    table.add_row("embedding and lm_head", *("tied" if c.tied_embeddings else "two tables" for c in configs))
    table.add_row("sliding layers", *(layer_list(c.sliding_layers) for c in configs))
    table.add_row("window", *(f"{c.sliding_window:,}" if c.sliding_window else "-" for c in configs))
    table.add_row("FFN activation", *(f"{c.activation} (gated)" for c in configs))
    console.print(table)
    console.print("Read from each GGUF's metadata (config.py); which layers slide comes from the config, not from "
                  "this lesson. The 8B column is Llama 3.1 8B's config.json: no weights are loaded.")
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0)
    for name, model in zip(names, models):
        out = generate(model, PROMPT, params)
        console.print(f"{name} (greedy, {len(out.token_ids)} tokens): {PROMPT!r} -> {out.text!r}")

    console.rule("[bold]2. Where the parameters sit")
    table = Table("model", "embedding", "lm_head (untied)", "attention", "FFN", "norms", "total",
                  "embedding + lm_head %")
    for name, config in zip(all_names, configs):
        by = parameters_by_place(config)
        total = sum(by.values())
        table.add_row(name, *(f"{by[p] / 1e6:,.1f}M" if by[p] else "-" for p in
                              ("embedding", "lm_head", "attention", "FFN", "norms")),
                      f"{total / 1e6:,.1f}M", f"{100 * (by['embedding'] + by['lm_head']) / total:.1f}")
    console.print(table)
    for name, model in zip(names, models):
        counted, computed = sum(counted_parameters(model).values()), sum(parameters_by_place(model.config).values())
        console.print(f"check arrays {name}: counted {counted:,} == config {computed:,}")
    console.print("An embedding is a table: a token reads one row of it. The lm_head is the same table used as a "
                  "matrix (tied), or a second one: every decoded token multiplies all of it.")

    console.rule(f"[bold]3. Decode and prefill of both, timed in turns ({args.repeats} runs each)")
    ids = [m.tokenizer.encode(TEXT * (args.prompt_tokens // 20 + 2))[:args.prompt_tokens] for m in models]
    decodes = interleaved({name: decode_call(m, p, args.repeats + 2) for name, m, p in zip(names, models, ids)},
                          repeats=args.repeats)
    prefills = interleaved({name: prefill_call(m, p) for name, m, p in zip(names, models, ids)},
                           repeats=args.repeats)
    profile, here = machine_profile()
    bandwidth = profile.read_bandwidth
    table = Table("model", "step min ms", "median ms", "spread ms", "tok/s at the min", "weights read per token MB",
                  "lm_head share", "floor ms", title=f"a decode step at context {args.prompt_tokens}")
    read = [decode_read_bytes(m.config) for m in models]
    for name, (total, head) in zip(names, read):
        t = decodes[name]
        table.add_row(name, f"{t.min * 1e3:.1f}", f"{t.median * 1e3:.1f}", f"{t.spread * 1e3:.1f}",
                      f"{1 / t.min:.1f}", f"{total / MB:,.1f}", f"{100 * head / total:.0f}%",
                      f"{total / bandwidth * 1e3:.1f}")
    console.print(table)
    table = Table("model", "prefill min ms", "median ms", "spread ms", "tok/s at the min", "ms per token",
                  title=f"a prefill of {args.prompt_tokens} tokens")
    for name in names:
        t = prefills[name]
        table.add_row(name, f"{t.min * 1e3:.1f}", f"{t.median * 1e3:.1f}", f"{t.spread * 1e3:.1f}",
                      f"{args.prompt_tokens / t.min:.0f}", f"{t.min * 1e3 / args.prompt_tokens:.2f}")
    console.print(table)
    d = [decodes[n] for n in names]
    p = [prefills[n] for n in names]
    console.print(f"check ratio: {names[1]} / {names[0]}: decode step {d[1].min / d[0].max:.2f}-"
                  f"{d[1].max / d[0].min:.2f}x, prefill {p[1].min / p[0].max:.2f}-{p[1].max / p[0].min:.2f}x (ranges "
                  f"over both spreads); weights read per decode token {read[1][0] / read[0][0]:.2f}x")
    console.print(f"floor = weights read / read bandwidth ({bandwidth / 1e9:.1f} GB/s, "
                  f"{'measured now' if here else 'measured once for this set of runs'}): a decode step reads every "
                  "weight it multiplies once, and a batch-1 step multiplies all of them, the lm_head included. A "
                  "prefill reads each weight once for all its tokens and runs the lm_head on the last one only.")
    for name, (total, _) in zip(names, read):
        console.print(bound_line(f"decode-{name.replace(' ', '-')}", decodes[name].min * 1e3,
                                 profile.floor_seconds(total) * 1e3, fmt=".2f"))
    for name, (total, _) in zip(names, read):
        console.print(f"check decode bytes {name}: computed {total:,} == loaded weights "
                      f"{models[names.index(name)].weight_bytes:,}")

    console.rule("[bold]4. KV cache bytes per token: MQA, GQA and MHA")
    first_cache = KVCache(first.config, min(16, len(ids[0])))
    prefill(first, ids[0][:first_cache.max_len], first_cache)
    needed = second.config.sliding_window + DEAD_EXTRA
    window_ids = second.tokenizer.encode(TEXT * (needed // 20 + 2))[:needed]
    sliding_change, global_change, dead, second_cache = dead_key_check(second, window_ids)
    measured = [filled_bytes_per_token(first_cache), filled_bytes_per_token(second_cache)]
    table = Table("model", "attention", "layers x KV heads x head_dim", "KV bytes per token", "bf16",
                  "measured", title="float32 unless bf16; measured: a real KVCache's arrays / its tokens")
    for i, (name, config) in enumerate(zip(all_names, configs)):
        variants = [config] + [dataclasses.replace(config, n_kv_heads=k)
                               for k in (config.n_heads, 1) if k != config.n_kv_heads and (k > 1 or i == 2)]
        for j, shape in enumerate(variants):
            table.add_row(name if j == 0 else f"{name}, as {attention_kind(shape)[:3]}", attention_kind(shape),
                          f"{shape.n_layers} x {shape.n_kv_heads} x {shape.head_dim}",
                          f"{estimate_kv_bytes(shape, 1):,}", f"{estimate_kv_bytes(shape, 1, dtype=BF16):,}",
                          f"{measured[i]:,.0f}" if j == 0 and i < 2 else "-")
    console.print(table)
    console.print("A KV head's keys and values are stored for every token; the query heads that share it store "
                  "nothing. MQA shares one KV head among all query heads, GQA one per group, MHA none.")

    console.rule("[bold]5. The KV cache at 4k and 32k tokens, with and without the sliding window")
    cfg2 = second.config
    table = Table("model", "tokens", "every layer keeps every token", "sliding layers keep the window", "kept",
                  title="MiB for one sequence, bf16 (2 bytes a value); a context past the model's own is marked *")
    for name, config in zip(all_names, configs):
        for tokens in CONTEXTS:
            full = estimate_kv_bytes(config, tokens, dtype=BF16)
            kept = estimate_kv_bytes_windowed(config, tokens, dtype=BF16)
            table.add_row(name, f"{tokens:,}" + ("*" if tokens > config.context_length else ""),
                          f"{full / MiB:,.1f}", f"{kept / MiB:,.1f}", f"{100 * kept / full:.0f}%")
    console.print(table)
    slide = len(cfg2.sliding_layers)
    kept_tokens = (cfg2.n_layers - slide) * 32768 + slide * min(32768, cfg2.sliding_window)
    console.print(f"check window: {slide} of {cfg2.n_layers} layers slide ({layer_list(cfg2.sliding_layers)}, "
                  f"from {names[1]}'s config), window {cfg2.sliding_window:,}; at 32,768 tokens they keep "
                  f"{kept_tokens:,} of {cfg2.n_layers * 32768:,} layer-tokens")
    console.print(f"check dead keys: {len(window_ids)} tokens prefilled into a real cache, then one decode step. "
                  f"Garbage written into the sliding layers' keys and values at positions 0-{dead - 1} (outside the "
                  f"window of this and every later query) changed the next token's logits by at most "
                  f"{sliding_change:.1e}; the same garbage in the global layers' changed them by {global_change:.1e}")
    console.print("This project's contiguous KVCache keeps those dead keys and masks them (section 4's measured "
                  "bytes include them); a cache that drops them holds the `sliding layers keep the window` column, "
                  "as llama.cpp's sliding-window cache and vLLM's hybrid allocator do.")

    console.rule("[bold]6. What quantization buys when the lm_head is large")
    table = Table("model", "format", "weights read per token MB", "lm_head share", "vs bf16", "H200 floor us",
                  title="the weight bytes one decode step reads (batch 1), by the format of the layers and the "
                        "lm_head")
    for name, config in zip(all_names, configs):
        bf16, _ = decode_read_bytes(config, *FORMATS["bf16"])
        for fmt, (layers, head) in FORMATS.items():
            total, head_bytes = decode_read_bytes(config, layers, head)
            table.add_row(name, fmt, f"{total / MB:,.1f}", f"{100 * head_bytes / total:.0f}%",
                          f"{bf16 / total:.2f}x", f"{total / H200.bandwidth * 1e6:,.1f}")
    console.print(table)
    console.print(f"vs bf16 = how many times fewer bytes than bf16; H200 floor = those bytes / "
                  f"{H200.bandwidth / 1e12:.1f} TB/s ({H200.name}): a batch-1 decode step cannot be faster. An "
                  "untied model's embedding table is not read at decode (one row is), so the 8B reads its lm_head, "
                  "not both tables.")

    console.rule("[bold]7. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview question: which of the two decodes faster, which holds more users, what 4-bit buys "
                 "each")
    share = [100 * (lambda b: (b["embedding"] + b["lm_head"]) / sum(b.values()))(parameters_by_place(c))
             for c in configs]
    kv = [estimate_kv_bytes(c, 1) for c in configs]
    gains = [decode_read_bytes(c, *FORMATS["bf16"])[0] / decode_read_bytes(c, *FORMATS["int4, lm_head int8"])[0]
             for c in configs]
    answer = [f"Count where the parameters sit before you count them. {names[1]} has "
              f"{sum(parameters_by_place(cfg2).values()) / 1e6:.0f}M parameters, but {share[1]:.0f}% of them are "
              f"its {cfg2.vocab_size:,}-token embedding, which is also its lm_head. {names[0]}'s share is "
              f"{share[0]:.0f}%, and the 8B's {share[2]:.0f}%."]
    if shown["decode-slower"] and shown["vocab-decode"]:
        answer.append(f"Decode reads the whole lm_head for every token, prefill once per prompt. Here a decode step "
                      f"took {d[1].min * 1e3:.1f} ms against {d[0].min * 1e3:.1f} ms "
                      f"({d[1].min / d[0].min:.2f}x; it reads {read[1][0] / read[0][0]:.2f}x the weight bytes). A "
                      f"{args.prompt_tokens}-token prefill took {p[1].min * 1e3:.0f} ms against "
                      f"{p[0].min * 1e3:.0f} ms ({p[1].min / p[0].min:.2f}x).")
    else:
        answer.append(f"Decode reads the whole lm_head for every token, prefill once per prompt: "
                      f"{read[1][0] / read[0][0]:.2f}x the weight bytes per decode step. This run could not show "
                      "what that does to the time. The claims above say why.")
    answer.append(f"Users are KV-cache bytes. {names[1]} is MQA: one KV head of {cfg2.head_dim} dims in "
                  f"{cfg2.n_layers} layers, {kv[1]:,} bytes per token in float32 against {names[0]}'s {kv[0]:,} "
                  f"(GQA, {first.config.n_kv_heads} heads of {first.config.head_dim} in {first.config.n_layers} "
                  "layers). So the bigger model stores less per token.")
    if shown["window-dead"] and shown["window-cache"]:
        full32 = estimate_kv_bytes(cfg2, 32768, dtype=BF16)
        kept32 = estimate_kv_bytes_windowed(cfg2, 32768, dtype=BF16)
        answer.append(f"And {slide} of its {cfg2.n_layers} layers see only the last {cfg2.sliding_window} tokens: "
                      f"garbage in their older keys changed no logit ({sliding_change:.1e}), so a cache may drop "
                      f"them. At 32k tokens that is {kept32 / MiB:,.0f} instead of {full32 / MiB:,.0f} MiB per "
                      "sequence in bf16.")
    answer.append(f"The 8B's GQA 32:8 stores {estimate_kv_bytes(LLAMA_3_1_8B, 1, dtype=BF16):,} bytes per token in "
                  f"bf16, {estimate_kv_bytes(LLAMA_3_1_8B, 32768, dtype=BF16) / MiB:,.0f} MiB per 32k sequence; "
                  "as MHA it would store 4 times that.")
    answer.append(f"4-bit layers with the lm_head kept at 8 bits cut the bytes a decode step reads "
                  f"{gains[1]:.2f}x for {names[1]}, against {gains[2]:.2f}x for the 8B and {gains[0]:.2f}x for "
                  f"{names[0]}: what stays at 8 bits is most of the small model. Quantize the lm_head too, or "
                  "prune the vocabulary, or the win is smaller than the bit count promises.")
    console.print(" ".join(answer))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
