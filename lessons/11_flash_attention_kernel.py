"""Lesson 11: the FlashAttention kernel, read and run on the CPU: the real CUDA source, one tile at a time.

    python lessons/11_flash_attention_kernel.py [--prompt TEXT] [--layers N] [--head H] [--block-size 16]
                                                [--partition-size 32] [--sizes 1024,4096,32768] [--repeats 5]

minitransformer/kernels/*.cu are compiled by g++ with a header that plays the GPU (kernels/cpu_runner.py), so the
exact source CuPy would build runs here on the real model's q, k, v next to layers.attention. No GPU needed.
The lesson's claims (claims() below) are decided from the numbers it prints: the correctness ones (differences below
the kernel tests' float32 tolerance) hold whatever the machine is doing; the one about time (the runner vs NumPy,
timed in turns) is stated only when the run was quiet (minitransformer/lab/measure.py).

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import math
import re
import sys
import unittest.mock
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
import minitransformer.core.attention
from minitransformer import KVCache, load_model
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.layers import attention
from minitransformer.core.prefill import prefill
from minitransformer.kernels import flash_prefill, paged_decode
from minitransformer.kernels.attention import PREFILL_FILE, plan_flash_prefill, plan_paged_decode, prefill_shared_bytes
from minitransformer.kernels.loader import source_constant
from minitransformer.kernels.prefill_wmma import WMMA_FILE, wmma_shared_bytes
from minitransformer.lab.claims import NUMBER, Claim, find_numbers, report, table_with
from minitransformer.lab.measure import Probe, interleaved

PROMPT = ("Attention lets every token look back at the tokens before it. A GPU kernel computes it in tiles: a block of "
          "threads loads a few queries, streams the keys and values through fast shared memory one tile at a time, "
          "and keeps only a running maximum, a running sum and a partial output for each query row, so the full "
          "table of scores never has to exist in memory.")
BQ, BK = source_constant(PREFILL_FILE, "PREFILL_BLOCK_Q"), source_constant(PREFILL_FILE, "PREFILL_BLOCK_K")
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read the `check` lines of sections 2 to 4 first. Each gives a kernel's largest difference from NumPy.",
    "Section 1's table shows which key tiles each query tile visits and which it skips.",
    "Section 5's table counts the bytes each way of computing attention moves, from formulas.",
    "The claim lines under 'What this run shows' say which checks held.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
TOL = 1e-5                  # the kernel tests' float32 tolerance: a kernel that differs by more is wrong
GPU_CALLS = 20              # launches per timed sample on a GPU: one launch is a few microseconds, below the clock's


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Every claim but one is about correctness and holds on any machine; the
    one about time compares two contenders timed in turns and holds only when their ranges do not overlap."""
    n = f"({NUMBER})"
    T, = find_numbers(output, r"flash_prefill on (\d+) tokens")
    visited, total, skipped = find_numbers(output, r"check tiles: visited (\d+) of (\d+), skipped (\d+)")
    tiles_q, tiles_k = -(-int(T) // BQ), -(-int(T) // BK)
    needed = sum(-(-min(int(T), BQ * (i + 1)) // BK) for i in range(tiles_q))   # query tile i: keys 0..its last row
    prefill_diff, layers = find_numbers(output, rf"check prefill: max \|kernel - array\| = {n} over (\d+) layers")
    runner, runner_median, runner_spread, array, array_median, array_spread = find_numbers(
        output, rf"CPU runner {n} ms \(median {n}, spread {n}\), NumPy {n} ms \(median {n}, spread {n}\)")
    mirror_out, mirror_lse = find_numbers(output, rf"check mirror: \|acc/l - kernel out\| = {n}, "
                                                  rf"\|m \+ log l - kernel lse\| = {n}")
    merge_out, merge_lse = find_numbers(output, rf"check merge: \|mirror - kernel out\| = {n}, "
                                                rf"\|M \+ log sum w - kernel lse\| = {n}")
    decode, = find_numbers(output, rf"check decode: max \|paged kernel - array\| = {n}")
    baseline, = find_numbers(output, rf"check decode baseline: max \|paged_decode_simple.cu - paged_decode.cu\| = {n}")
    wmma, ratio = find_numbers(output, rf"check wmma: max \|wmma - float32 array\| = {n} over \d+ layers, max "
                                       rf"\|wmma - array on float16 inputs\| / bound = {n}")
    memory = table_with(output, "T = S")
    largest = memory.numbers("T = S")[-1]
    narrow, wide = memory.numbers("kernel")[-1], memory.numbers("with 128-row")[-1]
    found = [
        Claim("tiles-causal", "the grid visits the tiles causal attention needs and skips those wholly in the future",
              (visited, total, skipped) == (needed, tiles_q * tiles_k, tiles_q * tiles_k - needed),
              f"visited {visited:.0f} of {total:.0f}; query tile i needs keys up to its last row: {needed} of "
              f"{tiles_q * tiles_k} for T = {T:.0f}", timed=False),
        Claim("prefill-exact", "the CUDA prefill kernel computes the same attention as layers.attention",
              prefill_diff < TOL, f"max difference {prefill_diff:.2e} over {layers:.0f} layers, tolerance {TOL:.0e}",
              timed=False),
        Claim("mirror-exact", "the online-softmax recurrence, tile by tile, ends at the kernel's output and LSE",
              max(mirror_out, mirror_lse) < TOL, f"{mirror_out:.2e} and {mirror_lse:.2e}", timed=False),
        Claim("decode-exact", "paged decode's partitions merged by log-sum-exp give the array's answer",
              max(merge_out, merge_lse, decode, baseline) < TOL,
              f"merge {max(merge_out, merge_lse):.2e}, kernel vs array {decode:.2e}, two kernels {baseline:.2e}",
              timed=False),
        Claim("wmma-bound", "the tensor-core kernel's own error stays under its float16 bound", ratio <= 1,
              f"largest error / bound {ratio:.2f}; against the float32 array {wmma:.2e}", timed=False),
        Claim("wide-tiles-move-less", "wider query tiles move fewer bytes (fewer re-reads of K and V)",
              wide < narrow, f"T = {largest:.0f}: {wide:.2f} GiB with 128-row tiles vs {narrow:.2f} GiB with 16-row "
              "tiles (formulas, not timings)", timed=False),
        Claim("runner-slower", "the CPU runner is slower than NumPy's attention", runner > array + array_spread,
              f"runner fastest {runner:.1f} ms vs NumPy slowest {array + array_spread:.1f} ms (fastest {array:.1f}, "
              f"spread {array_spread:.1f})"),
    ]
    gpu = re.search(rf"check gpu: prefill max diff {n}, decode {n}", " ".join(output.split()))
    if gpu:
        worst = max(float(gpu.group(1)), float(gpu.group(2)))
        found.append(Claim("gpu-exact", "on the GPU the kernels give the array's answer", worst < TOL,
                           f"largest difference {worst:.2e}", timed=False))
    return found


def record_attention(model, ids):
    """Prefill `ids` with every layer's call of layers.causal_attention recorded.
    Returns [(q, k, v, q_pos, k_pos, out)], cache."""
    calls, real = [], minitransformer.core.attention.causal_attention
    def spy(*args):
        calls.append([np.ascontiguousarray(a) for a in args] + [real(*args)])
        return calls[-1][-1]
    cache = KVCache(model.config, max_len=len(ids))
    with unittest.mock.patch.object(minitransformer.core.attention, "causal_attention", spy):
        prefill(model, ids, cache)
    return calls, cache


def tiles_visited(Tq, Tk):
    """(query tile, key tile) -> 0 skipped, 1 visited with the causal mask inside it, 2 fully visible. The rule of
    flash_prefill.cu step 3: a block reads keys 0 .. position of its last row, BLOCK_K at a time."""
    grid = np.zeros((-(-Tq // BQ), -(-Tk // BK)), int)
    for i in range(grid.shape[0]):
        first, last = Tk - Tq + i * BQ, Tk - Tq + min((i + 1) * BQ, Tq) - 1    # positions of the tile's rows
        for j in range(-(-(last + 1) // BK)):
            grid[i, j] = 2 if (j + 1) * BK - 1 <= first else 1
    return grid


def online_softmax(q_row, k, v):
    """Array mirror of the kernel's loop for one query row that sees all S keys, last key tile first. Per tile:
    (keys, tile max, running max m, running sum l, rescale alpha, unnormalised output acc).   k, v (S, d)."""
    s = (k @ q_row) * (1.0 / math.sqrt(len(q_row)))                       # (S,) scores
    m, l, acc, steps = -math.inf, 0.0, np.zeros_like(q_row), []
    for j in range(-(-len(s) // BK) - 1, -1, -1):
        tile = slice(j * BK, min(len(s), (j + 1) * BK))
        m_new = max(m, float(s[tile].max()))
        alpha, p = math.exp(m - m_new), np.exp(s[tile] - m_new)            # p (tile,): unnormalised probabilities
        m, l, acc = m_new, l * alpha + float(p.sum()), acc * alpha + p @ v[tile]
        steps.append((f"{tile.start}-{tile.stop - 1}", float(s[tile].max()), m, l, alpha, acc))
    return steps


def traffic(T, H, K, d, block_q, itemsize=4):
    """Global-memory bytes of one layer's causal prefill (Tq = Tk = T): naive (write the scores, read them, write
    probabilities, read them) vs the tiled kernel (each query tile re-reads the K and V tiles it needs)."""
    q_and_out = 2 * H * T * d
    naive = q_and_out + 2 * K * T * d + 4 * H * T * T
    keys = sum(min(T, -(-min(T, (i + 1) * block_q) // BK) * BK) for i in range(-(-T // block_q)))
    return naive * itemsize, (q_and_out + 2 * H * keys * d + H * T) * itemsize


def tensor_core_errors(calls):
    """Per layer, with q, k, v rounded to float16: (input rounding = |array(f16 inputs) - array(f32)|, |wmma - array
    (f16 inputs)|, its bound, |wmma - array(f32)|). The bound: P rounded to float16 moves a row by at most
    max|v| (2^-11 + T 2^-25), the float16 output adds 2^-11 |out| (tests/test_flash_prefill_wmma.py derives it)."""
    rows = []
    for q, k, v, q_pos, k_pos, ref in calls:
        q16, k16, v16 = (a.astype(np.float16) for a in (q, k, v))
        ref16 = attention(*(a.astype(np.float32) for a in (q16, k16, v16)), q_pos, k_pos)   # (1, H, T, d)
        out16 = flash_prefill(q16, k16, v16, variant="wmma").astype(np.float32)
        bound = float(np.abs(v16).max()) * (2.0**-11 + k.shape[2] * 2.0**-25) + 2.0**-11 * float(np.abs(ref16).max())
        rows.append((float(np.abs(ref16 - ref).max()), float(np.abs(out16 - ref16).max()), bound,
                     float(np.abs(out16 - ref).max())))
    return np.array(rows)                                                  # (layers, 4)


def gib(n):
    return f"{n / 2**30:,.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt", default=PROMPT, help="text whose attention the kernels compute")
    ap.add_argument("--layers", type=int, default=30, help="layers whose attention is run through the kernel")
    ap.add_argument("--head", type=int, help="head of the row shown tile by tile (default: the most rescales)")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block in the paged-decode part")
    ap.add_argument("--partition-size", type=int, default=32,
                    help="keys per partition of the paged-decode kernel (a multiple of --block-size)")
    ap.add_argument("--sizes", default="1024,4096,32768", help="sequence lengths for the memory-traffic table")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each contender in section 2 (at least 2)")
    args = ap.parse_args()
    if args.repeats < 2:
        raise InputError(f"--repeats must be at least 2 (one run has no spread), got {args.repeats}")
    model = load_model()
    probe = Probe()                                                      # is the machine quiet during this run?
    cfg, ids = model.config, model.tokenizer.encode(args.prompt)
    T, H, K, d, G = len(ids), cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_heads // cfg.n_kv_heads
    calls, cache = record_attention(model, ids)
    q, k, v, q_pos, k_pos, ref = calls[0]                                  # layer 0: q (1, H, T, d), k v (1, K, T, d)

    console.rule(f"[bold]1. Mapping: flash_prefill on {T} tokens, GQA {H}/{K}, head_dim {d}")
    grid = tiles_visited(T, T)
    console.print(f"grid = (ceil({T}/{BQ}), H, B) = {(grid.shape[0], H, 1)} blocks of 128 threads; warp w owns rows "
                  f"4w..4w+3 of the block's {BQ}; lane j scores key j of each {BK}-key tile and owns output dims j, "
                  f"j+32. Shared memory per block: {prefill_shared_bytes(d)} B = q_tile ({BQ},{d}) + k_tile "
                  f"({BK},{d}+1) + v_tile ({BK},{d}), float32")
    table = Table("query tile", "rows", "key tiles, in visiting order", "skipped (all in the future)")
    for i, row in enumerate(grid):
        seen = [f"{j * BK}-{min(T, (j + 1) * BK) - 1}" + ("*" if row[j] == 1 else "") for j in np.flatnonzero(row)]
        table.add_row(str(i), f"{i * BQ}-{min(T, (i + 1) * BQ) - 1}", "  ".join(seen[::-1]), str((row == 0).sum()))
    console.print(table, "* = the causal mask cuts through this tile")
    console.print(f"check tiles: visited {(grid > 0).sum()} of {grid.size}, skipped {(grid == 0).sum()}")

    console.rule("[bold]2. The real kernel (CPU runner) vs layers.attention (NumPy), the model's own q, k, v")
    out, lse = flash_prefill(q, k, v, return_lse=True)                     # the first call compiles (cached on disk)
    diffs = [float(np.abs(flash_prefill(*c[:3]) - c[-1]).max()) for c in calls[:args.layers]]
    console.print(f"check prefill: max |kernel - array| = {max(diffs):.2e} over {len(diffs)} layers "
                  f"(layer 0: {diffs[0]:.2e}); the float32 tolerance is {TOL:.0e}")
    timed = interleaved({"runner": lambda: flash_prefill(q, k, v),            # in turns: a busy moment hits both
                         "numpy": lambda: attention(q, k, v, q_pos, k_pos)}, repeats=args.repeats)
    console.print(f"check time per layer (layer 0, {args.repeats} runs each in turns after a warm-up; the fastest "
                  f"run is the figure a quiet machine gives): CPU runner {timed['runner'].ms()}, NumPy "
                  f"{timed['numpy'].ms()}. The runner plays the GPU's blocks one after another and their threads as "
                  "fibers on one core: it is here to prove the CUDA source right, and its time says nothing about a "
                  "GPU's.")

    console.rule("[bold]3. One query row, one key tile at a time, in the kernel's order: the array mirror")
    row = T - 1
    mirror = {hh: online_softmax(q[0, hh, row], k[0, hh // G], v[0, hh // G]) for hh in range(H)}
    h = args.head if args.head is not None else max(range(H), key=lambda hh: sum(s[4] < 1 for s in mirror[hh][1:]))
    table = Table("key tile", "tile max", "running max m", "alpha = e^(m_old - m)", "running sum l", "|acc/l - out|")
    for tile, tile_max, m, l, alpha, acc in mirror[h]:
        table.add_row(tile, f"{tile_max:.3f}", f"{m:.3f}", f"{alpha:.4f}", f"{l:.4f}",
                      f"{np.abs(acc / l - out[0, h, row]).max():.2e}")
    console.print(f"layer 0, head {h}, row {row}: where alpha < 1 the max grew and everything summed so far shrinks",
                  table)
    _, _, m, l, _, acc = mirror[h][-1]
    console.print(f"check mirror: |acc/l - kernel out| = {np.abs(acc / l - out[0, h, row]).max():.2e}, "
                  f"|m + log l - kernel lse| = {abs(m + math.log(l) - lse[0, h, row]):.2e}")

    bs, P = args.block_size, args.partition_size
    console.rule(f"[bold]4. Paged decode: layer 0's cache in blocks of {bs} tokens, partitions of {P}")
    n_b, nblk = T // 2 + 3, -(-T // bs)                                    # sequence B = the first n_b tokens of A
    table_a = np.random.default_rng(0).permutation(nblk + 2)[:nblk].astype(np.int32)   # shuffled; 2 blocks spare
    pool = np.full((2, nblk + 2, bs, K, d), np.nan, np.float32)           # (k|v, blocks, block_size, K, d); NaN unused
    kv = np.stack([cache.k[0, 0], cache.v[0, 0]])                        # (k|v, T, K, d)
    for i, block in enumerate(table_a):
        pool[:, block, :min(bs, T - i * bs)] = kv[:, i * bs:(i + 1) * bs]
    tables = np.full((2, nblk), -1, np.int32)
    tables[0], tables[1, :-(-n_b // bs)] = table_a, table_a[:-(-n_b // bs)]   # B shares A's blocks: a common prefix
    seq_lens = np.array([T, n_b], np.int32)
    q_dec = np.ascontiguousarray(q[0, :, [T - 1, n_b - 1]])               # (2, H, d): each sequence's newest query
    plan = plan_paged_decode(q_dec, pool[0], pool[1], tables, seq_lens, partition_size=P)
    out_d, lse_d = plan.run()
    part_out, part_max, part_sum = plan.partials             # (B, H, parts, d), (B, H, parts) x2
    console.print(f"block_tables = {tables.tolist()}, seq_lens = {seq_lens.tolist()}: B's last block also holds A's "
                  f"tokens {n_b}.. which must not leak in; unused blocks are NaN")
    used = -(-T // P)
    M = part_max[0, h, :used].max()
    w = part_sum[0, h, :used] * np.exp(part_max[0, h, :used] - M)         # (used,) each partition's share of the sum
    table = Table("partition", "tokens", "physical blocks", "part_max", "part_sum", "weight e^(max-M) x sum")
    for p in range(used):
        lo, hi = p * P, min(T, (p + 1) * P)
        table.add_row(str(p), f"{lo}-{hi - 1}", str(tables[0, lo // bs:-(-hi // bs)].tolist()),
                      f"{part_max[0, h, p]:.3f}", f"{part_sum[0, h, p]:.3f}", f"{w[p]:.3f}")
    console.print(f"sequence A, head {h}: kernel 1 wrote one partial result per partition", table)
    merged = (w[:, None] * part_out[0, h, :used]).sum(0) / w.sum()        # (d,) the LSE merge, array mirror
    console.print(f"check merge: |mirror - kernel out| = {np.abs(merged - out_d[0, h]).max():.2e}, |M + log sum w - "
                  f"kernel lse| = {abs(M + math.log(w.sum()) - lse_d[0, h]):.2e}")
    ref_d = ref[0, :, [T - 1, n_b - 1]]                                    # (2, H, d): the prefill rows, same queries
    console.print(f"check decode: max |paged kernel - array| = {np.abs(out_d - ref_d).max():.2e} (both sequences, "
                  f"all {H} heads)")
    simple_d, _ = plan_paged_decode(q_dec, pool[0], pool[1], tables, seq_lens, partition_size=P,
                                    variant="simple").run()
    console.print(f"check decode baseline: max |paged_decode_simple.cu - paged_decode.cu| = "
                  f"{np.abs(simple_d - out_d).max():.2e}. Same partials, same merge; the default kernel reads 16 bytes "
                  f"per load, {source_constant('paged_decode.cu', 'DECODE_LOADS')} loads per lane before the first "
                  f"reduction, a block at a time. `python -m minitransformer.kernels.sass_report` shows both in SASS "
                  f"and estimates the bandwidth each reaches on an H200.")

    console.rule("[bold]5. Memory traffic of causal prefill, one layer, float32 (the formulas in traffic())")
    sizes = [int(x) for x in args.sizes.split(",")]
    table = Table("T = S", "naive scores buffer", "naive bytes moved", f"kernel ({BQ}-row tiles)", "with 128-row tiles")
    for n in sizes:
        naive, tiled = traffic(n, H, K, d, BQ)
        table.add_row(str(n), gib(4 * H * n * n), gib(naive), gib(tiled), gib(traffic(n, H, K, d, 128)[1]))
    console.print(table)

    console.rule("[bold]6. Tensor cores: flash_prefill_wmma.cu, float16 inputs, float32 accumulators")
    WQ, WK = source_constant(WMMA_FILE, "WMMA_BLOCK_Q"), source_constant(WMMA_FILE, "WMMA_BLOCK_K")
    table = Table("wmma fragment (16x16)", "type", "holds", "per lane on a GPU (CUDA's mma.h)")
    table.add_row("matrix_a, row_major", "float16", "Q: 16 rows x 16 dims, or P: 16 rows x 16 keys", "16")
    table.add_row("matrix_b, col_major", "float16", "K^T: 16 dims x 16 keys (K stored (keys, d))", "16")
    table.add_row("matrix_b, row_major", "float16", "V: 16 keys x 16 dims", "16")
    table.add_row("accumulator", "float32", "S: 16 rows x 16 keys, or O: 16 rows x 16 dims", "8")
    console.print(table)
    fmas = 2 * 16 * WK * d                                                 # S and P V for 16 rows, one key tile
    console.print(f"One wmma::mma_sync: a warp computes c += a b on 16x16 tiles, 16 x 16 x 16 = 4096 multiply-adds. "
                  f"Per key tile of {WK} keys a warp's 16 rows need {fmas} multiply-adds (S = Q K^T and P V at d = "
                  f"{d}): the CUDA-core kernel issues them as {fmas} scalar FMAs, the tensor-core kernel as "
                  f"{fmas // 4096} mma_sync. Blocks of {WQ} rows (4 warps x 16), {wmma_shared_bytes(d)} B of shared "
                  f"memory (float16 tiles, per-warp S and P). Products of float16 numbers are exact in float32 and "
                  f"summed in float32; the probabilities P are rounded to float16 before P V.")
    errors = tensor_core_errors(calls[:args.layers])
    table = Table("layer", "f16 inputs: array vs f32 array", "wmma vs array on f16 inputs", "bound (column 3)",
                  "wmma vs f32 array")
    for i in sorted({0, len(errors) // 2, len(errors) - 1}):
        table.add_row(str(i), *(f"{x:.2e}" for x in errors[i]))
    console.print("Max |difference| per layer, the model's own q, k, v rounded to float16:", table)
    q16, k16, v16 = (a.astype(np.float16) for a in (q, k, v))
    cuda_core16 = float(np.abs(flash_prefill(q16, k16, v16).astype(np.float32) - ref).max())
    console.print(f"check wmma: max |wmma - float32 array| = {errors[:, 3].max():.2e} over {len(errors)} layers, "
                  f"max |wmma - array on float16 inputs| / bound = {(errors[:, 1] / errors[:, 2]).max():.2f}")
    console.print(f"check wmma layer 0: CUDA-core kernel in float16 {cuda_core16:.2e}, tensor-core kernel "
                  f"{errors[0, 3]:.2e} (max |kernel - float32 array|)")
    console.print("Column 2 is what rounding the inputs to float16 costs any float16 kernel; column 3 is the "
                  "tensor-core kernel's own share (P and the output rounded to float16), which column 4 bounds "
                  "(claim wmma-bound, section 8); column 5 is what a user of the float16 kernel sees against the "
                  "float32 model.")

    console.rule("[bold]7. On a GPU")
    try:
        import cupy as cp
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("CuPy sees no GPU")
    except Exception as exc:   # no CuPy, or no CUDA driver
        console.print(f"No GPU through CuPy here ({type(exc).__name__}): the kernels ran on the CPU runner only.")
    else:
        gpu_section(cp, q, k, v, q_pos, k_pos, ref, (q_dec, pool[0], pool[1], tables, seq_lens), ref_d, P,
                    args.repeats)

    console.rule("[bold]8. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview question: how does FlashAttention compute exact attention without the T x S matrix?")
    naive, tiled = traffic(sizes[-1], H, K, d, BQ)
    answer = [f"By tiling with an online softmax. A block owns {BQ} query rows. It streams the keys through shared "
              f"memory, {BK} at a time. Per row it keeps only a running max m, a running sum l and an unnormalised "
              "output. When a tile raises m, the sum and the output are rescaled by e^(m_old - m)."]
    if shown["mirror-exact"] and shown["prefill-exact"]:
        answer.append(f"On the real model (layer 0, head {h}, row {row}), that recurrence over {len(mirror[h])} tiles "
                      f"matched the kernel to {np.abs(acc / l - out[0, h, row]).max():.1e}. The kernel matched "
                      f"layers.attention to {max(diffs):.1e} on {len(diffs)} layers. It visited {(grid > 0).sum()} of "
                      f"{grid.size} tile pairs and skipped those wholly in the future.")
    else:
        answer.append("This run's kernel did not match the array version within the float32 tolerance. The claims "
                      "above say where. A kernel that differs is wrong, whatever it saves.")
    if shown["decode-exact"]:
        answer.append(f"Paged decode splits the keys into partitions and merges them by log-sum-exp, here to "
                      f"{np.abs(out_d - ref_d).max():.1e}.")
    answer.append(f"What it saves: at T = {sizes[-1]} the naive version writes a {gib(4 * H * sizes[-1] ** 2)} score "
                  f"buffer per layer, the kernel {prefill_shared_bytes(d) / 1024:.1f} KiB of tiles per block. Bytes "
                  f"moved are another matter. With {BQ}-row tiles the K/V re-reads cost {gib(tiled)} vs {gib(naive)} "
                  f"naive. A GPU's L2 cache absorbs part of that. FlashAttention-2's 64-128 rows would need "
                  f"{gib(traffic(sizes[-1], H, K, d, 128)[1])}.")
    if shown["runner-slower"]:
        answer.append(f"Speed is a GPU's business. On this CPU the runner took {timed['runner'].min * 1e3:.0f} ms per "
                      f"layer against NumPy's {timed['numpy'].min * 1e3:.1f} ms (fastest of {args.repeats}). It plays "
                      "the GPU's threads one after another.")
    console.print(" ".join(answer))


def gpu_section(cp, q, k, v, q_pos, k_pos, ref, paged_args, ref_d, P, repeats) -> None:
    """Section 7 where CuPy sees a GPU: the same kernels on it, their answers against the array version, and their
    times against layers.attention on CuPy, in turns. One sample is GPU_CALLS launches (one launch takes a few
    microseconds, too short for the host clock), and the device is synchronised before the clock stops."""
    sync = cp.cuda.Device().synchronize

    def batch(fn):
        return lambda: [fn() for _ in range(GPU_CALLS)]

    def us(t) -> str:                                                    # Timing of GPU_CALLS launches -> per launch
        per = 1e6 / GPU_CALLS
        return f"{t.min * per:.1f} us (median {t.median * per:.1f}, spread {t.spread * per:.1f})"

    qg, kg, vg, qpg, kpg = (cp.asarray(a) for a in (q, k, v, q_pos, k_pos))
    plan_g = plan_flash_prefill(qg, kg, vg)                              # checked once; run() only launches
    out_g = paged_decode(*(cp.asarray(a) for a in paged_args), partition_size=P)
    t = interleaved({"kernel": batch(plan_g.run), "array": batch(lambda: attention(qg, kg, vg, qpg, kpg))},
                    repeats=repeats, sync=sync)
    console.print(f"check gpu: prefill max diff {float(np.abs(plan_g.out.get() - ref).max()):.2e}, decode "
                  f"{float(np.abs(out_g.get() - ref_d).max()):.2e}; per layer ({repeats} samples of {GPU_CALLS} "
                  f"launches, in turns): flash_prefill {us(t['kernel'])} vs layers.attention on CuPy "
                  f"{us(t['array'])}")
    q16g, k16g, v16g = (cp.asarray(a.astype(np.float16)) for a in (q, k, v))
    t16 = interleaved({name: batch(plan_flash_prefill(q16g, k16g, v16g, variant=name).run)
                       for name in ("cuda_cores", "wmma")}, repeats=repeats, sync=sync)
    console.print(f"check gpu float16: CUDA-core kernel {us(t16['cuda_cores'])}, tensor-core kernel "
                  f"{us(t16['wmma'])} per layer")


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
