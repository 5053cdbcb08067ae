"""Lesson 13: quantization — fewer bytes per weight and per cached key, and what it costs in quality, measured.

    python lessons/13_quantization.py [--tokens 1024] [--window 256] [--greedy-tokens 64] [--prompts 1]
                                      [--kv-tokens 8192]

Part 1 unpacks one Q4_1 block of the GGUF file itself by hand (scale, minimum, 32 four-bit values) and compares it
with the library's dequantize; then quantizes the same 32 weights with our own int4 format. Part 2 builds int8 and int4
copies of the model (minitransformer/quantize/) and an int8 KV cache, and measures each against float32 on the
docstrings of Python's standard library (minitransformer/quality.py). Part 3 runs the CUDA dequantize-GEMV kernel on
the CPU runner against the NumPy path.
"""

import argparse
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import MiniTransformerError  # noqa: E402
from minitransformer import estimate_kv_bytes, load_model  # noqa: E402
from minitransformer.bench.machine import H200, measure_copy_bandwidth  # noqa: E402
from minitransformer.kernels.quant import dequant_gemv  # noqa: E402
from minitransformer.quality import GREEDY_PROMPTS, corpus_ids, score_corpus, score_greedy  # noqa: E402
from minitransformer.quantize import (Int8KVCache, QuantizedLinear, estimate_int8_kv_bytes,  # noqa: E402
                                      expected_weight_bytes, quantize_int4, quantize_model, unpack_int4)
from minitransformer.weights import dequantize, open_gguf  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 120)     # piped: don't cut titles at 80 columns
MiB = 2 ** 20


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
                  f"reproduces {100 * same['int4']:.2f}% exactly, int8 {100 * same['int8']:.2f}%: int4 groups of 32 "
                  "fall on Q4_1's own blocks, a per-row int8 grid does not")
    packed, scale, low = quantize_int4(library[None])                     # our format, same 32 weights
    ours = unpack_int4(packed)[0].astype(np.float32) * np.float32(scale[0, 0]) + np.float32(low[0, 0])
    console.print(f"our int4 of the same weights: scale {float(scale[0, 0]):.6g}, min {float(low[0, 0]):.6g}, levels "
                  f"{unpack_int4(packed)[0].tolist()} (byte k = values 2k, 2k+1); max error "
                  f"{np.abs(ours - library).max():.2e} <= scale/2 = {float(scale[0, 0]) / 2:.2e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="corpus tokens scored (perplexity, KL, top-1)")
    ap.add_argument("--window", type=int, default=256, help="tokens per scored window")
    ap.add_argument("--greedy-tokens", type=int, default=64, help="tokens generated greedily per prompt, compared with float32's")
    ap.add_argument("--prompts", type=int, default=1, help=f"greedy prompts (at most {len(GREEDY_PROMPTS)})")
    ap.add_argument("--kv-tokens", type=int, default=8192, help="context length for the KV-cache memory column")
    args = ap.parse_args()

    model = load_model()
    part1_q4_1_block(model.path)

    console.rule("Part 2: float32 vs int8 / int4 weights vs an int8 KV cache")
    cfg = model.config
    models = {"int8": quantize_model(model, "int8"), "int4": quantize_model(model, "int4")}
    for scheme, q in models.items():
        console.print(f"check memory {scheme}: weights {q.weight_bytes} bytes, computed "
                      f"{expected_weight_bytes(cfg, scheme)} bytes, {model.weight_bytes / q.weight_bytes:.2f}x "
                      f"smaller than float32 ({model.weight_bytes} bytes)")
    settings = {"float32": (model, None), "int8 weights": (models["int8"], None),
                "int4 weights": (models["int4"], None), "int8 KV cache": (model, Int8KVCache)}
    ids = corpus_ids(model.tokenizer, args.tokens)
    prompts = [model.tokenizer.encode(p) for p in GREEDY_PROMPTS[:args.prompts]]
    with console.status("scoring the corpus and the greedy continuations"):
        scores = score_corpus(settings, ids, args.window)
        score_greedy(settings, scores, prompts, args.greedy_tokens)
    kv = {"int8 KV cache": estimate_int8_kv_bytes(cfg, args.kv_tokens)}
    table = Table("setting", "weights MiB", f"KV MiB @{args.kv_tokens}", "perplexity", "KL nats", "top-1",
                  f"greedy/{args.greedy_tokens}", "decode tok/s", title=f"{len(ids)} stdlib-docstring tokens, "
                  f"windows of {args.window}; {len(prompts)} greedy prompt(s)")
    for name, s in scores.items():
        table.add_row(name, f"{settings[name][0].weight_bytes / MiB:.2f}",
                      f"{kv.get(name, estimate_kv_bytes(cfg, args.kv_tokens)) / MiB:.2f}", f"{s.perplexity:.4f}",
                      f"{s.mean_kl:.5f}", f"{s.top1_agreement:.4f}", f"{s.greedy_agreement:.4f}",
                      f"{s.decode_tokens_per_s:.1f}")
    console.print(table)
    console.print(f"scored positions: {scores['float32'].positions}")

    console.rule("Part 3: the dequantize-GEMV CUDA kernel (kernels/dequant_gemv.cu) on the CPU runner")
    x = np.random.default_rng(0).normal(size=(1, cfg.d_model)).astype(np.float32)    # one decode row
    for scheme, q in models.items():
        w = q.layers[0].w_qkv
        diff = np.abs(dequant_gemv(x, w) - x @ w).max() / np.abs(x @ w).max()
        console.print(f"check kernel {scheme}: max |kernel - numpy| / max |y| = {diff:.2e} on layer 0's q|k|v "
                      f"({w.out_features} x {w.in_features}): {w.nbytes} bytes read, float32 "
                      f"{4 * w.in_features * w.out_features}")

    f32, i8, i4 = scores["float32"], scores["int8 weights"], scores["int4 weights"]
    console.rule("Interview question: what does quantizing the weights buy, and what does it cost?")
    console.print(
        f"Memory: the weights shrink {model.weight_bytes / models['int8'].weight_bytes:.2f}x at int8 and "
        f"{model.weight_bytes / models['int4'].weight_bytes:.2f}x at int4 ({model.weight_bytes / MiB:.0f} -> "
        f"{models['int8'].weight_bytes / MiB:.0f} / {models['int4'].weight_bytes / MiB:.0f} MiB), and an int8 KV cache "
        f"is {estimate_kv_bytes(cfg, 1) / estimate_int8_kv_bytes(cfg, 1):.2f}x smaller. Decode reads every weight per "
        f"token, so on a GPU the kernel's bytes read fall by the same factor. Quality: perplexity {f32.perplexity:.3f}"
        f" -> {i8.perplexity:.3f} (int8) / {i4.perplexity:.3f} (int4), KL {i8.mean_kl:.4f} / {i4.mean_kl:.4f} nats, "
        f"top-1 agreement {i8.top1_agreement:.3f} / {i4.top1_agreement:.3f}, greedy text identical for "
        f"{round(i8.greedy_agreement * args.greedy_tokens)}/{args.greedy_tokens} (int8) and "
        f"{round(i4.greedy_agreement * args.greedy_tokens)}/{args.greedy_tokens} (int4) tokens per prompt (perplexity "
        f"gaps under about 1% are within the noise of a {len(ids)}-token corpus, even when a quantized model scores "
        "lower). Mind the baseline: "
        "this 'float32' model is decoded from Q4_1, so int4 groups re-find its grid (part 1) and int4's loss here "
        "is its int8 embedding's, while int8's per-row grid adds new rounding. Speed here (NumPy, this CPU): "
        f"{f32.decode_tokens_per_s:.1f} tok/s float32, {i8.decode_tokens_per_s:.1f} int8, "
        f"{i4.decode_tokens_per_s:.1f} int4: NumPy converts each int8 block to float32, and multiplies int4 levels "
        "group by group, in passes of their own, so part of the saved bytes is spent again; the kernel of part 3 "
        "turns levels into floats in registers, so the bytes it reads are only the quantized ones.")
    bandwidth = measure_copy_bandwidth(nbytes=128 * MiB, repeats=3)
    sizes = {"float32": model.weight_bytes, "int8": models["int8"].weight_bytes, "int4": models["int4"].weight_bytes}
    here = ", ".join(f"{name} {size / bandwidth * 1e3:.2f} ms" for name, size in sizes.items())
    bf16 = model.weight_bytes / 2                                        # the same weights stored in 2 bytes
    gpu = ", ".join(f"{name} {size / H200.bandwidth * 1e6:.1f} us" for name, size in
                    (("bf16", bf16), ("int8", sizes["int8"]), ("int4", sizes["int4"])))
    console.print(
        f"[bold]The bandwidth floor, here and on an H200.[/] A decode step reads every weight once, so weight bytes / "
        f"memory bandwidth bounds its time from below. This CPU (copy bandwidth measured now: {bandwidth / 1e9:.1f} "
        f"GB/s): {here} per token; float32 measured {1e3 / f32.decode_tokens_per_s:.1f} ms. An {H200.name} "
        f"({H200.bandwidth / 1e12:.1f} TB/s, published): {gpu} per token; a kernel that reads only the quantized bytes "
        f"(part 3's) can approach that floor, {bf16 / sizes['int4']:.1f}x lower at int4 than at bf16, as long as "
        "decode stays memory-bound; NumPy on this CPU does not turn the fewer bytes into less time (the speeds "
        "above).", highlight=False)

if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
