"""Lesson 13: quantization — fewer bytes per weight and per cached key, and what it costs in quality, measured.

    python lessons/13_quantization.py [--tokens 1024] [--window 256] [--greedy-tokens 64] [--prompts 1]
                                      [--kv-tokens 8192] [--repeats 10] [--compare gemma3-270m]

Part 1 unpacks one Q4_1 block of the GGUF file itself by hand (scale, minimum, 32 four-bit values) and compares it
with the library's dequantize; then quantizes the same 32 weights with our own int4 format. Part 2 builds int8 and int4
copies of the model (minitransformer/quantize/) and an int8 KV cache, and measures each against float32 on the
docstrings of Python's standard library (minitransformer/lab/quality.py). Part 3 runs the CUDA dequantize-GEMV kernel on
the CPU runner against the NumPy path. Part 4 times one decode step of each setting, in turns (measure.interleaved),
against the floor its weight bytes set. The lesson's claims (claims() below) are decided from the numbers it prints,
and a timing claim is stated only when the run was quiet (minitransformer/lab/measure.py).

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import estimate_kv_bytes, load_model
from minitransformer.bench.model_shape import decode_call
from minitransformer.core.errors import MiniTransformerError
from minitransformer.core.gguf_file import dequantize, open_gguf
from minitransformer.kernels.quant import dequant_gemv
from minitransformer.lab.claims import Claim, bound_line, find_numbers, flat, report, table_with
from minitransformer.lab.machine import H200
from minitransformer.lab.measure import Probe, interleaved
from minitransformer.lab.peaks import machine_profile
from minitransformer.lab.quality import GREEDY_PROMPTS, corpus_ids, score_corpus, score_greedy
from minitransformer.quantize import QuantizedLinear, expected_weight_bytes, quantize_int4, quantize_model, unpack_int4

# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read Part 2's table first. Compare each setting's `weights MiB` and `perplexity` with float32's row.",
    "The `check greedy` lines say how many tokens of each greedy continuation match float32's.",
    "Part 4's table times one decode step per setting. The speed claims say which way this machine went.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
MiB = 2 ** 20
QUANTIZED = ("int8 weights", "int4 weights", "int8 KV cache")
SPEED_KEYS = {"int8 weights": "int8-speed", "int4 weights": "int4-speed", "int8 KV cache": "kv8-speed"}
GREEDY_KEYS = {"int8 weights": "same-greedy-int8", "int4 weights": "same-greedy-int4",
               "int8 KV cache": "same-greedy-kv8"}
WITH = {"int8 weights": "int8 weights", "int4 weights": "int4 weights", "int8 KV cache": "an int8 KV cache"}
PPL_BAND, KL_SMALL = 0.01, 0.01     # "close to float32": perplexity within 1% and mean KL under 0.01 nats


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify)."""
    by_hand, = find_numbers(output, r"check Q4_1 block: max \|by hand - library\| = ([\d.e+-]+)")
    int4_exact, = find_numbers(output, r"our int4 reproduces ([\d.]+)% exactly")
    memory = [find_numbers(output, rf"check memory {s}: weights (\d+) bytes, computed (\d+) bytes, [\d.]+x smaller "
                                   r"than float32 \((\d+) bytes\)") for s in ("int8", "int4")]
    quality = table_with(output, "perplexity")
    names = quality.column("setting")
    kv = dict(zip(names, quality.numbers("KV MiB")))
    ppl, kl = dict(zip(names, quality.numbers("perplexity"))), dict(zip(names, quality.numbers("KL")))
    kernels = [find_numbers(output, rf"check kernel {s}: max \|kernel - numpy\| / max \|y\| = ([\d.e+-]+)")[0]
               for s in ("int8", "int4")]
    speed = table_with(output, "step min ms")
    rows = speed.column("setting")
    low = dict(zip(rows, speed.numbers("step min ms")))
    high = {name: low[name] + spread for name, spread in zip(rows, speed.numbers("spread ms"))}
    found = [
        Claim("q4_1-by-hand", "20 bytes of the file, decoded by hand, are the library's 32 weights", by_hand < 1e-6,
              f"max difference {by_hand:.2e}", timed=False),
        Claim("int4-on-q4-grid", "our int4 groups fall on Q4_1's own grid: they reproduce the weights exactly",
              int4_exact == 100, f"{int4_exact:.2f}% exact", timed=False),
        Claim("memory-as-computed", "each format stores the bytes computed for it, fewer than float32's",
              all(shown == computed < f32 for shown, computed, f32 in memory)
              and kv["int8 KV cache"] < kv["float32"],
              f"weights int8 {memory[0][0]:,.0f} / int4 {memory[1][0]:,.0f} vs {memory[0][2]:,.0f} bytes; KV "
              f"{kv['int8 KV cache']:.2f} vs {kv['float32']:.2f} MiB", timed=False),
        Claim("kernel-matches", "the CUDA kernel, emulated, computes what NumPy computes", max(kernels) < 1e-5,
              f"max relative difference {max(kernels):.2e}", timed=False),
        Claim("ppl-close", f"every quantized setting stays close to float32 on average: perplexity within "
              f"{PPL_BAND:.0%} and mean KL under {KL_SMALL} nats",
              all(abs(ppl[n] / ppl["float32"] - 1) <= PPL_BAND and kl[n] < KL_SMALL for n in QUANTIZED),
              ", ".join(f"{n} {ppl[n]:.4f} ({ppl[n] / ppl['float32'] - 1:+.2%}), KL {kl[n]:.5f}" for n in QUANTIZED)
              + f"; float32 {ppl['float32']:.4f}", timed=False),
    ]
    for name in QUANTIZED:
        same, total = find_numbers(output, rf"check greedy {name}: identical to float32's for (\d+) of (\d+) tokens")
        found.append(Claim(GREEDY_KEYS[name], f"{name}: the greedy continuation is float32's, token for token",
                           same == total, f"{same:.0f} of {total:.0f} tokens identical", timed=False,
                           required=False))       # one flipped near-tie changes the rest: either answer is honest
    for name in QUANTIZED:
        faster = low[name] < low["float32"]
        apart = high[name] < low["float32"] if faster else low[name] > high["float32"]
        found.append(Claim(SPEED_KEYS[name], f"a decode step with {WITH[name]} is {'faster' if faster else 'slower'} "
                           "than float32's here", apart, f"{low[name]:.1f}-{high[name]:.1f} ms vs float32 "
                           f"{low['float32']:.1f}-{high['float32']:.1f} ms", required=False))   # NumPy decides
    second = re.search(r"check second model memory: int8 (\d+) bytes, computed (\d+); int4 (\d+) bytes, computed "
                       r"(\d+); int4 is ([\d.]+)x smaller than float32 here vs ([\d.]+)x for this model", flat(output))
    if second:                                           # printed only with --compare
        i8, i8_computed, i4, i4_computed, theirs, ours = (float(x) for x in second.groups())
        found.append(Claim("second-model-memory", "the second model's int8 and int4 copies store the bytes computed "
                           "for them; int4 shrinks it less than this model, its int8 embedding (the lm_head) being "
                           "a larger share", i8 == i8_computed and i4 == i4_computed and theirs < ours,
                           f"int4 {theirs:.2f}x vs {ours:.2f}x smaller than float32", timed=False))
    return found


def part1_q4_1_block(path, name="blk.0.attn_q.weight"):
    """Row 0, block 0 of a Q4_1 tensor: 20 bytes = float16 scale d, float16 minimum m, 16 bytes of 4-bit levels."""
    tensor = next(t for t in open_gguf(path).tensors if t.name == name)
    raw = np.asarray(tensor.data[0, :20])                                 # (20,) uint8: the first block of row 0
    d, m = raw[0:2].view(np.float16)[0], raw[2:4].view(np.float16)[0]
    qs = raw[4:20]
    levels = np.concatenate([qs & 0x0F, qs >> 4])                         # (32,): ggml puts values j, j+16 in byte j
    by_hand = levels.astype(np.float32) * np.float32(d) + np.float32(m)   # w = d * q + m
    whole = dequantize(tensor)                                            # (out, in) = (576, 576), the loader's
    library = whole[0, :32]                                               # (32,) float32 weights of that block
    console.rule(f"Part 1: one Q4_1 block of {name} ({tensor.tensor_type.name}), by hand")
    console.print(f"bytes 0-1 d = {float(d):.6g}, bytes 2-3 m = {float(m):.6g}, bytes 4-19 = {qs.tolist()}")
    console.print(f"levels (low nibbles hold weights 0-15 of the block, high nibbles weights 16-31): {levels.tolist()}")
    first = ", ".join(f"{v:.5f}" for v in by_hand[:4])
    console.print(f"20 bytes -> 32 weights = {20 * 8 / 32:.0f} bits per weight; first 4: by hand [{first}], library "
                  f"[{', '.join(f'{v:.5f}' for v in library[:4])}]")
    console.print(f"check Q4_1 block: max |by hand - library| = {np.abs(by_hand - library).max():.2e}")
    same = {s: float((QuantizedLinear.from_float(whole, s).dequantize() == whole).mean()) for s in ("int8", "int4")}
    console.print(f"check requantize: of {name}'s {whole.size} float32 weights (all decoded from Q4_1), our int4 "
                  f"reproduces {100 * same['int4']:.2f}% exactly, int8 {100 * same['int8']:.2f}% (int4 groups of 32 "
                  "are laid out as Q4_1's blocks are; int8 has one scale per row)")
    packed, scale, low = quantize_int4(library[None])                     # our format, same 32 weights
    ours = unpack_int4(packed)[0].astype(np.float32) * np.float32(scale[0, 0]) + np.float32(low[0, 0])
    error, half = np.abs(ours - library).max(), float(scale[0, 0]) / 2      # rounding to a level: at most half a step
    console.print(f"our int4 of the same weights: scale {float(scale[0, 0]):.6g}, min {float(low[0, 0]):.6g}, levels "
                  f"{unpack_int4(packed)[0].tolist()} (byte k = values 2k, 2k+1); max error "
                  f"{error:.2e} {'<=' if error <= half else '>'} scale/2 = {half:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="corpus tokens scored (perplexity, KL, top-1)")
    ap.add_argument("--window", type=int, default=256, help="tokens per scored window")
    ap.add_argument("--greedy-tokens", type=int, default=64,
                    help="tokens generated greedily per prompt, compared with float32's")
    ap.add_argument("--prompts", type=int, default=1, help=f"greedy prompts (at most {len(GREEDY_PROMPTS)})")
    ap.add_argument("--kv-tokens", type=int, default=8192, help="context length for the KV-cache memory column")
    ap.add_argument("--repeats", type=int, default=10, help="timed decode steps of each setting, in turns")
    ap.add_argument("--compare", metavar="NAME|PATH", help="a second model (e.g. gemma3-270m): its int8 and int4 "
                    "copies are built and measured after part 4 (memory and a decode step), beside this model's")
    args = ap.parse_args()

    model = load_model()
    probe = Probe()                                                      # is the machine quiet during this run?
    part1_q4_1_block(model.path)

    console.rule("Part 2: float32 vs int8 / int4 weights vs an int8 KV cache")
    cfg = model.config
    models = {"int8": quantize_model(model, "int8"), "int4": quantize_model(model, "int4")}
    for scheme, q in models.items():
        console.print(f"check memory {scheme}: weights {q.weight_bytes} bytes, computed "
                      f"{expected_weight_bytes(cfg, scheme)} bytes, {model.weight_bytes / q.weight_bytes:.2f}x "
                      f"smaller than float32 ({model.weight_bytes} bytes)")
    settings = {"float32": (model, "f32"), "int8 weights": (models["int8"], "f32"),       # name -> (model, KV storage)
                "int4 weights": (models["int4"], "f32"), "int8 KV cache": (model, "int8")}
    ids = corpus_ids(model.tokenizer, args.tokens)
    prompts = [model.tokenizer.encode(p) for p in GREEDY_PROMPTS[:args.prompts]]
    with console.status("scoring the corpus and the greedy continuations"):
        scores = score_corpus(settings, ids, args.window)
        score_greedy(settings, scores, prompts, args.greedy_tokens)
    table = Table("setting", "weights MiB", f"KV MiB @{args.kv_tokens}", "perplexity", "KL nats", "top-1",
                  f"greedy/{args.greedy_tokens}", title=f"{len(ids)} stdlib-docstring tokens, windows of "
                  f"{args.window}; {len(prompts)} greedy prompt(s)")
    for name, s in scores.items():
        table.add_row(name, f"{settings[name][0].weight_bytes / MiB:.2f}",
                      f"{estimate_kv_bytes(cfg, args.kv_tokens, storage=settings[name][1]) / MiB:.2f}",
                      f"{s.perplexity:.4f}",
                      f"{s.mean_kl:.5f}", f"{s.top1_agreement:.4f}", f"{s.greedy_agreement:.4f}")
    console.print(table)
    console.print(f"scored positions: {scores['float32'].positions}; greedy/{args.greedy_tokens} = the tokens "
                  "identical to float32's before the first difference, as a fraction (after it the texts no longer "
                  "line up)")
    for name in QUANTIZED:
        same = scores[name].greedy_same                                   # per prompt: tokens before the first change
        console.print(f"check greedy {name}: identical to float32's for {sum(same)} of "
                      f"{args.greedy_tokens * len(same)} tokens; first difference (per prompt): "
                      + ", ".join("none" if k == args.greedy_tokens else f"token {k + 1}" for k in same))

    console.rule("Part 3: the dequantize-GEMV CUDA kernel (kernels/dequant_gemv.cu) on the CPU runner")
    x = np.random.default_rng(0).normal(size=(1, cfg.d_model)).astype(np.float32)    # one decode row
    for scheme, q in models.items():
        w = q.layers[0].w_qkv
        diff = np.abs(dequant_gemv(x, w) - x @ w).max() / np.abs(x @ w).max()
        console.print(f"check kernel {scheme}: max |kernel - numpy| / max |y| = {diff:.2e} on layer 0's q|k|v "
                      f"({w.out_features} x {w.in_features}): {w.nbytes} bytes read, float32 "
                      f"{4 * w.in_features * w.out_features}")

    console.rule(f"Part 4: one decode step of each setting, {args.repeats} times, in turns (NumPy, this CPU)")
    steps = interleaved({name: decode_call(weights, prompts[0], args.repeats + 2, storage)
                         for name, (weights, storage) in settings.items()}, repeats=args.repeats)
    profile, here = machine_profile()
    bandwidth = profile.read_bandwidth
    speed = Table("setting", "step min ms", "median ms", "spread ms", "tok/s at the min", "weights floor ms")
    for name, t in steps.items():
        speed.add_row(name, f"{t.min * 1e3:.1f}", f"{t.median * 1e3:.1f}", f"{t.spread * 1e3:.1f}", f"{1 / t.min:.1f}",
                      f"{settings[name][0].weight_bytes / bandwidth * 1e3:.2f}")
    console.print(speed)
    console.print(f"min = the fastest step, what a quiet machine gives; median = the typical step; spread = max - min "
                  f"(measure.py). Floor = weight bytes / read bandwidth ({bandwidth / 1e9:.1f} GB/s, "
                  f"{'measured now' if here else 'measured once for this set of runs'}: one row times a large "
                  "matrix, the way a step reads its weights): a step reads every weight once, so it cannot be faster")
    for name, t in steps.items():
        console.print(bound_line(f"step-{name.replace(' ', '-')}", t.min * 1e3,
                                 profile.floor_seconds(settings[name][0].weight_bytes) * 1e3, fmt=".2f"))

    if args.compare:
        compare_model(model, models, load_model(args.compare), prompts[0], args.repeats)

    console.rule("Part 5: What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    f32, i8, i4 = scores["float32"], scores["int8 weights"], scores["int4 weights"]
    console.rule("Interview question: what does quantizing the weights buy, and what does it cost?")
    answer = [
        f"Memory: the weights shrink {model.weight_bytes / models['int8'].weight_bytes:.2f}x at int8 and "
        f"{model.weight_bytes / models['int4'].weight_bytes:.2f}x at int4 ({model.weight_bytes / MiB:.0f} -> "
        f"{models['int8'].weight_bytes / MiB:.0f} / {models['int4'].weight_bytes / MiB:.0f} MiB), and an int8 KV "
        f"cache is {estimate_kv_bytes(cfg, 1) / estimate_kv_bytes(cfg, 1, storage='int8'):.2f}x smaller. Decode "
        "reads every weight per token. So a kernel that reads only the quantized bytes, like part 3's, reads fewer by "
        f"the same factor. Quality: perplexity {f32.perplexity:.3f} -> {i8.perplexity:.3f} (int8) / "
        f"{i4.perplexity:.3f} (int4), KL {i8.mean_kl:.4f} / {i4.mean_kl:.4f} nats, top-1 agreement "
        f"{i8.top1_agreement:.3f} / {i4.top1_agreement:.3f}. The int8 KV cache scores perplexity "
        f"{scores['int8 KV cache'].perplexity:.3f}, KL {scores['int8 KV cache'].mean_kl:.4f}, top-1 "
        f"{scores['int8 KV cache'].top1_agreement:.3f}.",
        "Greedy text, against float32's.", *(greedy_words(name, scores[name], args.greedy_tokens) + "."
                                             for name in QUANTIZED)]
    lower = [name for name in QUANTIZED if scores[name].perplexity < f32.perplexity]
    if lower:
        answer.append(f"{' and '.join(lower)} scored a lower perplexity than float32 on this one {len(ids)}-token "
                      "corpus. That is rounding that happened to suit this text, not a better model.")
    if shown["ppl-close"] and all(shown[GREEDY_KEYS[n]] for n in QUANTIZED):
        answer.append("On this text the cost in quality is small by every measure here.")
    elif shown["ppl-close"]:
        diverged = " and ".join(WITH[n] for n in QUANTIZED if not shown[GREEDY_KEYS[n]])
        answer.append(f"On average the cost is small: perplexity within {PPL_BAND:.0%}, KL under {KL_SMALL} nats. "
                      f"But it is not nothing. With {diverged} the greedy text left float32's. A small rounding can "
                      "flip a close argmax. After one flipped token, a greedy continuation is another text.")
    else:
        answer.append("This run could not show the cost to be small. The claims above say why.")
    if shown["int4-on-q4-grid"]:
        answer.append("Mind the baseline. This 'float32' model is decoded from Q4_1. Our int4 groups re-find its grid "
                      "(part 1), so int4's loss here is its int8 embedding's. int8's per-row grid adds new rounding.")
    else:
        answer.append("Mind the baseline. This 'float32' model is decoded from Q4_1, a 4-bit format of its own.")
    answer.append("Speed here (NumPy, this CPU, fastest of "
                  f"{args.repeats} steps): " + ", ".join(f"{name} {steps[name].min * 1e3:.1f} ms" for name in steps)
                  + ". " + " ".join(speed_words(name, shown[SPEED_KEYS[name]], steps) for name in QUANTIZED)
                  + " The kernel of part 3 turns levels into floats in registers, so the bytes it reads are only "
                  "the quantized ones.")
    console.print(" ".join(answer))
    sizes = {"float32": model.weight_bytes, "int8": models["int8"].weight_bytes, "int4": models["int4"].weight_bytes}
    here = ", ".join(f"{name} {size / bandwidth * 1e3:.2f} ms" for name, size in sizes.items())
    bf16 = model.weight_bytes / 2                                        # the same weights stored in 2 bytes
    gpu = ", ".join(f"{name} {size / H200.bandwidth * 1e6:.1f} us" for name, size in
                    (("bf16", bf16), ("int8", sizes["int8"]), ("int4", sizes["int4"])))
    console.print(
        f"[bold]The bandwidth floor, here and on an H200.[/] A decode step reads every weight once, so weight bytes / "
        f"memory bandwidth bounds its time from below. On this CPU, at a read bandwidth of {bandwidth / 1e9:.1f} GB/s, "
        f"the floor is {here} per token. float32 measured {steps['float32'].min * 1e3:.1f} ms. On an {H200.name} "
        f"({H200.bandwidth / 1e12:.1f} TB/s, published) it is {gpu} per token. A kernel that reads only the quantized "
        f"bytes, like part 3's, can approach that floor. At int4 the floor is {bf16 / sizes['int4']:.1f}x lower than "
        "at bf16, as long as decode stays memory-bound." + slower_here(shown, steps), highlight=False)


def slower_here(shown: dict, steps: dict) -> str:
    """One sentence on what differs between the machines, said only when this run showed a quantized step slower."""
    slower = [name for name in ("int8 weights", "int4 weights") if shown[SPEED_KEYS[name]]
              and steps[name].min > steps["float32"].min]
    if not slower:
        return ""
    return (f" Here {' and '.join(slower)} decoded slower than float32, the opposite of that arithmetic. What differs "
            "between the machines: a GPU kernel dequantizes in registers while it reads, so fewer bytes read are "
            "less time; NumPy dequantizes in a pass of its own that writes float32 back to memory and reads it "
            "again, so on this CPU the quantized step moves more bytes, not fewer.")


def compare_model(model, models: dict, other, prompt_text_ids: list[int], repeats: int) -> None:
    """Part 4b (with --compare): the same formats on a second model, its bytes read off the quantized arrays and a
    decode step of each timed in turns; the embedding stays int8 (quantize_model's default) in both models."""
    console.rule(f"Part 4b: the same formats on {other.path.stem}")
    copies = {"float32": other, "int8 weights": quantize_model(other, "int8"),
              "int4 weights": quantize_model(other, "int4")}
    prompt = other.tokenizer.encode(model.tokenizer.decode(prompt_text_ids))
    steps = interleaved({name: decode_call(m, prompt, repeats + 2) for name, m in copies.items()}, repeats=repeats)
    table = Table("setting", "weights MiB", "vs float32", "this model vs float32", "step min ms", "median ms",
                  "spread ms")
    own = {"float32": model, "int8 weights": models["int8"], "int4 weights": models["int4"]}
    for name, m in copies.items():
        t = steps[name]
        table.add_row(name, f"{m.weight_bytes / MiB:,.1f}", f"{other.weight_bytes / m.weight_bytes:.2f}x",
                      f"{model.weight_bytes / own[name].weight_bytes:.2f}x", f"{t.min * 1e3:.1f}",
                      f"{t.median * 1e3:.1f}", f"{t.spread * 1e3:.1f}")
    console.print(table)
    cfg = other.config
    i8, i4 = copies["int8 weights"].weight_bytes, copies["int4 weights"].weight_bytes
    console.print(f"check second model memory: int8 {i8} bytes, computed {expected_weight_bytes(cfg, 'int8')}; int4 "
                  f"{i4} bytes, computed {expected_weight_bytes(cfg, 'int4')}; int4 is {other.weight_bytes / i4:.2f}x "
                  f"smaller than float32 here vs {model.weight_bytes / models['int4'].weight_bytes:.2f}x for this "
                  f"model: its int8 embedding, which is also its lm_head ({cfg.vocab_size:,} x {cfg.d_model}), is "
                  f"{100 * cfg.vocab_size * (cfg.d_model + 4) / i4:.0f}% of its int4 bytes (lesson 17)")


def greedy_words(name: str, score, n: int) -> str:
    """'int8 KV cache: identical for the first 32 of 64 tokens, then diverged (agreement 0.50)', per prompt."""
    parts = [f"all {n} tokens identical" if k == n else f"identical for the first {k} of {n} tokens, then diverged"
             for k in score.greedy_same]
    return f"{name}: {', '.join(parts)} (agreement {score.greedy_agreement:.2f})"


WHY_SLOWER = {"int8 weights": "NumPy converts each int8 block to float32 in a pass of its own before the product",
              "int4 weights": "NumPy multiplies int4 levels group by group, 32 at a time, in passes of their own",
              "int8 KV cache": "every step quantizes the new key and value and converts every cached one back to "
                               "float32 before attention (kv_storage.py)"}


def speed_words(name: str, shown: bool, steps: dict) -> str:
    """The speed verdict for one setting against float32, only in the direction its claim showed."""
    ours, base = steps[name].min * 1e3, steps["float32"].min * 1e3
    if not shown:
        return (f"Whether a step with {WITH[name]} is faster or slower than float32's, this run cannot say "
                f"({ours:.1f} vs {base:.1f} ms): the claims above say whether the runs overlapped or the machine "
                "was busy.")
    if ours < base:
        return (f"With {WITH[name]} NumPy turned the fewer bytes into less time: {ours:.1f} vs {base:.1f} ms per step, "
                f"{base / ours:.2f}x.")
    return (f"With {WITH[name]} NumPy does not turn the fewer bytes into less time: {ours:.1f} vs {base:.1f} ms per "
            f"step. That is because {WHY_SLOWER[name]}.")


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
