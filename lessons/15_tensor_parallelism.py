"""Lesson 15: tensor parallelism — one model split over several processes, the same tokens, and what the joins cost.

    python lessons/15_tensor_parallelism.py [--size 3] [--tokens 24] [--repeats 5] [--prefill-rows 64]
                                            [--figure figures/tensor_parallel_layer.png]

A model too big for one GPU is split inside every layer (Megatron-LM, Shoeybi et al., 2019): each rank holds some of
the attention heads and some of the FFN columns, computes its part of the layer, and an all-reduce sums the parts.
Two all-reduces per layer and nothing else, because each column-parallel product (q/k/v by heads, gate/up by
columns) feeds its row-parallel partner (the output projection, down) without an exchange: the nonlinearity between
them never mixes the split dimension (minitransformer/parallel/plan.py draws the layer).

This lesson runs it for real. Part 1 generates the same prompt with `minitransformer generate --tensor-parallel-size
N` at sizes 1 and 3 (the project's CLI starts the MPI ranks and stops them) and compares the token ids. Part 2
starts 3 ranks of this same script through the same launcher (parallel/launch.py), each loading only its shard,
and times decode steps on every rank: the all-reduces (counted and timed by the communicator), the step message
the driver sends, and the compute left over; one process times the same steps before and after. It also times
one all-reduce alone, at a decode token's size and a prefill's. Part 3 does the same arithmetic for Llama 3.1 8B on
8 GPUs from published figures (NVLink 4, PCIe 5, NCCL's latency model, the H200's roofline) and finds where
splitting stops paying.

On a 2-core machine more ranks do not add cores: three ranks share the same two. What splitting saves (a third of
the layers' weights read per rank) and what it costs (60 all-reduces a token, each a round trip between processes,
waiting for the slowest) are both printed, and the claims (claims() below) are decided from those numbers
(minitransformer/lab/claims.py). The three about this machine's speed (no-faster-here, joins-cost-more,
joins-are-waiting) are what the 2-core machine of the committed transcript shows; on a machine with a free core per
rank and more, a run may not show them, and its verdict lines then say so.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import KVCache, load_model
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.metrics import now
from minitransformer.lab.claims import Claim, cell_range, find_numbers, report, spread_cell, table_with
from minitransformer.lab.machine import H200, NVLINK4, PCIE5, split_step
from minitransformer.lab.measure import Probe, time_calls
from minitransformer.parallel.launch import in_rank_process, run_ranks
from minitransformer.parallel.plan import ShardPlan, check_tensor_parallel_size, supported_sizes

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is"
LINKS = {"NVLink 4": NVLINK4, "PCIe 5 x16": PCIE5}   # table 3's rows: published figures (lab/machine.py)
# Llama 3.1 8B's published shape (its config.json): 32 layers, d_model 4096, 32 query heads and 8 KV heads of 128,
# FFN 14336, vocabulary 128256, untied lm_head.
LLAMA_8B = dict(name="Llama 3.1 8B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128,
                ffn_dim=14336, vocab_size=128256, tied_embeddings=False)
PROJECTED_TOKENS = (1, 1024)             # one decode token; a 1,024-token prefill
PROJECTED_GPUS = 16                      # sizes up to this in the table (8 = one NVLink node)
LATENCY_BOUND = 4                        # "latency-bound": P x the bytes cost less than P / 4 x the time
WAITING = 2                              # "mostly waiting": in-forward all-reduces > 2x the same ones alone
WHAT_TO_LOOK_AT = (
    "Part 1's check lines say whether 3 ranks gave the token ids of one process, and what each rank's cache holds.",
    "Table 2a is one decode token per rank: `all-reduce ms` is time spent joining, `compute ms` the rest.",
    "Table 2c times one all-reduce alone: compare `us` for 1 row and for the prefill's rows with their bytes.",
    "Table 3 is arithmetic from published figures, no timing: read `all-reduce ms` next to `compute ms`.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()


# ------------------------------------------------------------------------------------------------ the claims

def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify)."""
    size, same, total = find_numbers(output, r"check tokens: size (\d+) gave (\d+) of (\d+) token ids of size 1")
    kv_tp, kv_one = find_numbers(output, rf"check KV: rank 0's cache at size {size:.0f} holds ({NUMBER}) bytes, "
                                         rf"size 1's ({NUMBER})")
    layers, d_model = find_numbers(output, r"check shapes: (\d+) layers, d_model (\d+)")
    ranks = table_with(output, "all-reduces per token")
    cells = [dict(zip(ranks.columns, row)) for row in ranks.rows]
    one = next(c for c in cells if c["rank"] == "1 process")
    split = [c for c in cells if c["rank"] != "1 process"]
    counts = [float(c["all-reduces per token"]) for c in split]
    each = [float(c["bytes each"].replace(",", "")) for c in split]
    step_one, step_tp = cell_range(one["step ms"]), cell_range(split[0]["step ms"])
    reduce_tp, compute_tp = cell_range(split[0]["all-reduce ms"]), cell_range(split[0]["compute ms"])
    alone = table_with(output, "all-reduce of")
    rows = [dict(zip(alone.columns, row)) for row in alone.rows]
    small, big = median_cell(rows[0]["us"]), median_cell(rows[-1]["us"])
    lone_calls, lone_ms, inside_ms = find_numbers(
        output, r"check waiting: (\d+) lone all-reduces take \d+ x [\d.]+ us = ([\d.]+) ms \(medians\); inside "
                r"rank 0's fastest run they took ([\d.]+) ms")
    ratio = float(rows[-1]["bytes"].replace(",", "")) / float(rows[0]["bytes"].replace(",", ""))
    projected = table_with(output, "link")
    proj = {(r[0], r[1], r[2]): dict(zip(projected.columns, r)) for r in projected.rows}
    nv, pcie = LINKS

    def at(link, tokens, n, column):
        return float(proj[link, f"{tokens:,}", str(n)][column].replace(",", ""))
    saved = step_one[1] - compute_tp[0]                # the most splitting can have saved rank 0's compute
    return [
        Claim("same-tokens", f"{size:.0f} ranks generate the token ids of one process", same == total and total > 0,
              f"{same:.0f} of {total:.0f} identical", timed=False),
        Claim("kv-split", f"each rank's KV cache holds only its KV heads: 1/{size:.0f} of one process's",
              kv_tp * size == kv_one, f"{kv_tp:,.0f} x {size:.0f} vs {kv_one:,.0f} bytes", timed=False),
        Claim("two-per-layer", "every rank runs two all-reduces per layer, each of one token's hidden state "
              "(d_model float32 values)", all(c == 2 * layers for c in counts) and all(b == d_model * 4 for b in each),
              f"{', '.join(f'{c:.0f}' for c in counts)} per token for {layers:.0f} layers; "
              f"{', '.join(f'{b:,.0f}' for b in each)} bytes each", timed=False),
        Claim("small-is-latency", f"a decode token's all-reduce costs its latency, not its bytes: {ratio:.0f}x the "
              f"bytes cost less than {ratio / LATENCY_BOUND:.0f}x the time",
              big[0] < small[0] * ratio / LATENCY_BOUND and big[1] < small[1] * ratio / LATENCY_BOUND,
              f"fastest {big[0]:.1f} vs {small[0]:.1f} us, medians {big[1]:.1f} vs {small[1]:.1f} us"),
        Claim("joins-are-waiting", f"inside the forward most of the all-reduce time is waiting for the slowest rank: "
              f"more than {WAITING}x what the same all-reduces cost alone", inside_ms > WAITING * lone_ms,
              f"{inside_ms:.2f} ms a token vs {lone_calls:.0f} lone ones' {lone_ms:.2f} ms"),
        Claim("no-faster-here", f"{size:.0f} ranks on this machine's {os_cores(output)} cores take longer per token "
              "than one process", step_tp[0] > step_one[1],
              f"rank 0's fastest {step_tp[0]:.2f} ms vs one process's slowest {step_one[1]:.2f} ms"),
        Claim("joins-cost-more", "the all-reduces cost rank 0 more per token than splitting saved its compute",
              reduce_tp[0] > saved, f"all-reduces at least {reduce_tp[0]:.2f} ms; compute saved at most "
              f"{saved:.2f} ms (one process's slowest step - rank 0's fastest compute)"),
        Claim("decode-latency", "for one decode token of the 8B model on 8 GPUs over NVLink, the all-reduces take "
              "longer than the split compute", at(nv, 1, 8, "all-reduce ms") > at(nv, 1, 8, "compute ms"),
              f"{at(nv, 1, 8, 'all-reduce ms'):.3f} vs {at(nv, 1, 8, 'compute ms'):.3f} ms", timed=False),
        Claim("fast-links", "splitting a 1,024-token prefill over 8 GPUs pays over NVLink and not over PCIe",
              at(nv, 1024, 8, "speedup") > 1 > at(pcie, 1024, 8, "speedup"),
              f"{at(nv, 1024, 8, 'speedup'):.2f}x vs {at(pcie, 1024, 8, 'speedup'):.2f}x", timed=False),
        Claim("crossover", "over NVLink one decode token still gains from 4 to 8 GPUs and loses from 8 to 16",
              at(nv, 1, 8, "step ms") < min(at(nv, 1, 4, "step ms"), at(nv, 1, 16, "step ms")),
              f"{at(nv, 1, 4, 'step ms'):.3f} -> {at(nv, 1, 8, 'step ms'):.3f} -> {at(nv, 1, 16, 'step ms'):.3f} ms",
              timed=False),
    ]


NUMBER = r"[\d,]+"


def median_cell(cell: str) -> tuple[float, float]:
    """(fastest, median) of a spread_cell 'min (median, spread)'."""
    low, median, _ = (float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell))
    return low, median
CORES = r"this machine has (\d+) cores"


def os_cores(output: str) -> str:
    """The machine's core count as the lesson printed it (the claim names it)."""
    cores, = find_numbers(output, CORES)
    return f"{cores:.0f}"


# ------------------------------------------------------------------------------------------------ the ranks

def time_decode(model, prompt_ids: list[int], tokens: list[int], repeats: int, comm=None) -> list[dict]:
    """Per timed repeat, the mean per decode token of: the step, the all-reduces inside it, the step message (the
    broadcast the driver sends before each forward, parallel/driver.py), and the rest, this rank's compute.

    Every rank runs the same steps on the same token ids (the ones one process generated), so no rank waits for a
    sample: what the ranks wait for is each other, inside the all-reduces. One untimed repeat first (warm-up)."""
    from minitransformer.parallel.driver import NO_LOGITS_ROWS, StepMessage

    P = len(prompt_ids)
    rank = 0 if comm is None else comm.rank
    out = []
    for repeat in range(repeats + 1):
        cache = KVCache(model.config, P + len(tokens), xp=model.xp)
        model.forward([prompt_ids], [list(range(P))], cache, last_only=True)
        if comm is not None:
            comm.barrier()                                       # every rank starts the decode together
            comm.stats.reset()
        steps, reduces, messages = [], [], []
        for i, token in enumerate(tokens):
            ids, positions = np.array([[token]]), np.array([[P + i]])     # (1, 1) each
            before = _seconds(comm)
            start = now()
            if comm is not None:
                comm.broadcast(StepMessage("forward", ids, positions) if rank == 0 else None)
            if rank == 0:
                model.forward(ids, positions, cache, last_only=True)                     # (1, V): rank 0 samples
            else:
                model.forward(ids, positions, cache, logits_rows=NO_LOGITS_ROWS)         # workers: no logits
            steps.append(now() - start)
            after = _seconds(comm)
            reduces.append(after[0] - before[0])
            messages.append(after[1] - before[1])
        if repeat == 0:
            continue
        stats = comm.stats.snapshot().get("all_reduce", {}) if comm is not None else {}
        n = len(tokens)
        out.append({"step": sum(steps) / n, "all_reduce": sum(reduces) / n, "message": sum(messages) / n,
                    "compute": (sum(steps) - sum(reduces) - sum(messages)) / n,
                    "calls": stats.get("calls", 0) / n,
                    "bytes_each": stats.get("bytes", 0) / max(stats.get("calls", 1), 1)})
    return out


def _seconds(comm) -> tuple[float, float]:
    """Seconds this rank has spent in all-reduces and in broadcasts so far (CollectiveStats)."""
    if comm is None:
        return 0.0, 0.0
    counts = comm.stats.counts
    return (counts["all_reduce"].seconds if "all_reduce" in counts else 0.0,
            counts["broadcast"].seconds if "broadcast" in counts else 0.0)


def time_all_reduce_alone(comm, d_model: int, rows: list[int], repeats: int = 40) -> dict[int, list[float]]:
    """One all-reduce of (rows, d_model) float32 and nothing else, `repeats` times after a warm-up: its cost with
    no compute to wait for. Zeros, so the repeated in-place sums stay finite."""
    found = {}
    for n in rows:
        buffer = np.zeros((n, d_model), dtype=np.float32)                 # (rows, D)
        comm.barrier()
        found[n] = list(time_calls(lambda buffer=buffer: comm.all_reduce(buffer), repeats=repeats, warmup=5).samples)
    return found


def rank_main(job_path: Path, out_path: Path) -> None:
    """What each of the N ranks runs (this script, started by run_ranks): load this rank's shard, time the decode
    steps and the lone all-reduces, and rank 0 writes every rank's numbers to `out_path`."""
    from minitransformer.parallel.communicator import MpiCommunicator
    from minitransformer.parallel.launch import watch_supervisor

    comm = MpiCommunicator()
    watch_supervisor()                       # the lesson's process gone: exit rather than wait
    try:
        job = json.loads(job_path.read_text())
        model = load_model(job["model"], comm=comm)                       # only this rank's heads and FFN columns
        decode = time_decode(model, job["prompt_ids"], job["tokens"], job["repeats"], comm)
        alone = time_all_reduce_alone(comm, model.config.d_model, [1, job["prefill_rows"]])
        mine = {"rank": comm.rank, "decode": decode, "alone": {str(k): v for k, v in alone.items()},
                "heads": [model.config.n_heads, model.config.n_kv_heads, model.config.ffn_dim]}
        everyone = comm.comm.gather(mine, root=0)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        comm.abort()                         # no rank is left waiting in a collective for this one
        raise
    if comm.rank == 0:
        out_path.write_text(json.dumps(everyone))


# ------------------------------------------------------------------------------------------------ part 1: tokens

def generate_cli(size: int, tokens: int) -> dict:
    """`minitransformer generate PROMPT --tensor-parallel-size N --json` as a user runs it: the CLI starts the ranks
    under mpiexec and stops them all before it returns (parallel/launch.py)."""
    done = subprocess.run([sys.executable, "-m", "minitransformer", "generate", PROMPT, "--max-tokens", str(tokens),
                           "--ignore-eos", "--json", "--tensor-parallel-size", str(size)],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                                                      os.environ.get("PYTHONPATH")]))})
    if done.returncode != 0:
        raise InputError(f"generate --tensor-parallel-size {size} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout)


def part_tokens(size: int, tokens: int, config) -> dict:
    console.rule(f"[bold]1. The same prompt at sizes 1 and {size}: minitransformer generate --tensor-parallel-size N")
    runs = {n: generate_cli(n, tokens) for n in (1, size)}
    table = Table("size", "q heads / KV heads / FFN per rank", "tokens", "first token ids", "KV cache bytes (rank 0)")
    for n, run in runs.items():
        local = ShardPlan(config, n, 0).shard_config()
        table.add_row(str(n), f"{local.n_heads} / {local.n_kv_heads} / {local.ffn_dim}",
                      str(len(run["token_ids"])), " ".join(map(str, run["token_ids"][:8])) + " ...",
                      f"{run['kv_cache']['bytes']:,}")
    console.print(f"Prompt {PROMPT!r}, {tokens} greedy tokens (--ignore-eos), --json:", table)
    one, split = runs[1]["token_ids"], runs[size]["token_ids"]
    same = sum(a == b for a, b in zip(one, split)) if len(one) == len(split) else 0
    console.print(f"check tokens: size {size} gave {same} of {len(one)} token ids of size 1", highlight=False)
    console.print(f"check KV: rank 0's cache at size {size} holds {runs[size]['kv_cache']['bytes']:,} bytes, size 1's "
                  f"{runs[1]['kv_cache']['bytes']:,}: rank 0 keeps {ShardPlan(config, size, 0).local_kv_heads} of the "
                  f"{config.n_kv_heads} KV heads", highlight=False)
    console.print(f"The text: {runs[size]['text']!r}", highlight=False, markup=False)
    return runs[1]


# ------------------------------------------------------------------------------------------------ part 2: costs

def part_costs(args, model, first: dict) -> dict:
    c = model.config
    console.rule(f"[bold]2. Where the ranks meet: the all-reduces of one decode token at size {args.size}, measured")
    prompt_ids = model.tokenizer.encode(PROMPT)
    tokens = first["token_ids"][:args.tokens]
    half = (args.repeats + 1) // 2
    one = time_decode(model, prompt_ids, tokens, half)                   # one process, before the ranks ...
    with tempfile.TemporaryDirectory() as folder:
        job, out = Path(folder) / "job.json", Path(folder) / "ranks.json"
        job.write_text(json.dumps({"model": str(model.path), "prompt_ids": prompt_ids, "tokens": tokens,
                                   "repeats": args.repeats, "prefill_rows": args.prefill_rows}))
        code = run_ranks(["--rank-job", str(job), "--rank-out", str(out)], args.size,
                         program=[sys.executable, str(Path(__file__).resolve())])
        if code != 0 or not out.is_file():
            raise InputError(f"the {args.size} ranks failed (exit code {code}); their error is above")
        ranks = json.loads(out.read_text())
    one += time_decode(model, prompt_ids, tokens, args.repeats - half)  # ... and after them
    cores = os.cpu_count() or 1
    threads = int(os.environ.get("OPENBLAS_NUM_THREADS") or max(1, cores // args.size))      # as run_ranks sets it
    console.print(f"check shapes: {c.n_layers} layers, d_model {c.d_model}: each all-reduce sums one token's hidden "
                  f"state, {c.d_model} float32 values = {c.d_model * 4:,} bytes", highlight=False)
    console.print(f"{len(tokens)} decode steps after the {len(prompt_ids)}-token prompt, each rank the same token ids; "
                  f"the {args.size} ranks run {args.repeats} times after a warm-up, one process {half} times before "
                  f"them and {args.repeats - half} after. Each rank has {threads} BLAS thread{'s' * (threads != 1)} "
                  f"(run_ranks gives each its share of the cores); this machine has {cores} cores.", highlight=False)

    def ms(rows, key):
        return spread_cell([r[key] * 1e3 for r in rows], ".1f")
    table = Table("rank", "all-reduces per token", "bytes each", "all-reduce ms", "message ms", "compute ms",
                  "step ms")
    table.add_row("1 process", "0", "0", "0", "0", ms(one, "compute"), ms(one, "step"))
    for r in ranks:
        d = r["decode"]
        table.add_row(str(r["rank"]), f"{d[0]['calls']:.0f}", f"{d[0]['bytes_each']:,.0f}", ms(d, "all_reduce"),
                      ms(d, "message"), ms(d, "compute"), ms(d, "step"))
    console.print("2a. One decode token, per rank: fastest of the runs (median, spread), each run's mean over its "
                  "steps.", table)
    console.print("all-reduce ms: time inside the all-reduces, waiting for the slowest rank included; message ms: the "
                  "driver's step message (a broadcast of the token ids, parallel/driver.py), where the workers also "
                  "wait for rank 0's lm_head (replicated: rank 0 alone computes the logits); compute ms: the rest of "
                  "the step. One process has no all-reduces and no message.", highlight=False)

    r0 = ranks[0]["decode"]
    best = min(r0, key=lambda r: r["step"])
    fastest_one = min(one, key=lambda r: r["step"])
    table = Table("scope", "all-reduces", "bytes", "all-reduce ms", "compute per rank ms", "one process ms")
    for scope, share in (("one layer", 1 / c.n_layers), (f"one token ({c.n_layers} layers)", 1.0)):
        table.add_row(scope, f"{best['calls'] * share:.0f}", f"{best['calls'] * share * best['bytes_each']:,.0f}",
                      f"{best['all_reduce'] * share * 1e3:.3f}", f"{best['compute'] * share * 1e3:.3f}",
                      f"{fastest_one['step'] * share * 1e3:.3f}")
    console.print(f"2b. Per layer and per token, rank 0's fastest run at size {args.size} next to one process's "
                  "fastest:", table)

    table = Table("all-reduce of", "bytes", "us", "GB/s")
    for n in (1, args.prefill_rows):
        samples = ranks[0]["alone"][str(n)]
        label = "1 row (a decode token)" if n == 1 else f"{n} rows (a {n}-token prefill)"
        nbytes = n * c.d_model * 4
        table.add_row(label, f"{nbytes:,}", spread_cell([s * 1e6 for s in samples], ".1f"),
                      f"{nbytes / min(samples) / 1e9:.2f}")
    console.print(f"2c. One all-reduce alone over {args.size} ranks, no compute between them (rank 0, 40 calls after "
                  "a warm-up):", table)
    lone = sorted(ranks[0]["alone"]["1"])[len(ranks[0]["alone"]["1"]) // 2]          # the median lone all-reduce
    console.print(f"check waiting: {best['calls']:.0f} lone all-reduces take {best['calls']:.0f} x {lone * 1e6:.1f} us "
                  f"= {best['calls'] * lone * 1e3:.2f} ms (medians); inside rank 0's fastest run they took "
                  f"{best['all_reduce'] * 1e3:.2f} ms a token. The rest is waiting for the slowest rank: "
                  f"{args.size} ranks take turns on {cores} cores, and a rank that waits spins on a core.",
                  highlight=False)
    return {"one": one, "ranks": ranks, "prompt_tokens": len(prompt_ids)}


# ------------------------------------------------------------------------------------------------ part 3: 8B

def part_projection(config) -> dict:
    llama = dataclasses.replace(config, **LLAMA_8B)
    console.rule("[bold]3. The same arithmetic for Llama 3.1 8B on up to 16 GPUs, from published figures (no timing)")
    console.print(
        f"Figures used: {H200.name}: {H200.bandwidth / 1e12:.1f} TB/s, {H200.flops / 1e12:.0f} TFLOP/s dense bf16 "
        "(NVIDIA's datasheet); compute per GPU = its roofline time / n. NVLink 4 (H100/H200 SXM): 900 GB/s "
        f"bidirectional per GPU, so {NVLINK4.bandwidth / 1e9:.0f} GB/s each way (NVIDIA's datasheets); PCIe 5.0 x16: "
        f"{PCIE5.bandwidth / 1e9:.0f} GB/s each way (PCI-SIG). A ring all-reduce of B bytes over n GPUs: "
        f"base latency + 2(n-1) x hop latency + 2(n-1)/n x B / bandwidth, with NCCL's own latency figures (src/graph/"
        f"tuning.cc, ring, LL protocol): base {NVLINK4.base_latency * 1e6:.1f} us, {NVLINK4.hop_latency * 1e6:.1f} us "
        f"per NVLink hop, {PCIE5.hop_latency * 1e6:.1f} us per PCIe hop. 2 all-reduces per layer, "
        f"{llama.n_layers} layers, bf16: {llama.d_model * 2:,} bytes per token each. Sizes the plan allows for its "
        f"{llama.n_heads} query heads, {llama.n_kv_heads} KV heads and FFN {llama.ffn_dim}: "
        f"{', '.join(map(str, supported_sizes(llama)))}. One NVLink node holds 8 GPUs; 16 is shown as if one link "
        "reached them all.", highlight=False)
    sizes = [n for n in supported_sizes(llama) if n <= PROJECTED_GPUS]
    table = Table("link", "tokens", "GPUs", "compute ms", "all-reduces", "bytes each", "all-reduce ms", "step ms",
                  "speedup", "x vs half")
    found = {}
    for name, link in LINKS.items():
        for tokens in PROJECTED_TOKENS:
            one = split_step(H200, link, llama, tokens, 1).seconds
            previous = None
            for n in sizes:
                s = split_step(H200, link, llama, tokens, n)
                found[name, tokens, n] = s
                table.add_row(name, f"{tokens:,}", str(n), f"{s.compute * 1e3:.3f}", str(s.all_reduces),
                              f"{s.all_reduce_bytes:,.0f}", f"{s.communication * 1e3:.3f}", f"{s.seconds * 1e3:.3f}",
                              f"{one / s.seconds:.2f}", "" if previous is None else f"{previous / s.seconds:.2f}")
                previous = s.seconds
    console.print(table)
    console.print("speedup: the 1-GPU step / this one; x vs half: the step at half as many GPUs / this one (below 1: "
                  "the doubling made the step slower).", highlight=False)
    for name in LINKS:
        for tokens in PROJECTED_TOKENS:
            best = min(sizes, key=lambda n: found[name, tokens, n].seconds)
            console.print(f"check crossover {name}, {tokens:,} token{'s' * (tokens != 1)}: the step is shortest "
                          f"at {best} GPU{'s' * (best != 1)} ({found[name, tokens, best].seconds * 1e3:.3f} ms); "
                          "more GPUs add all-reduce time faster than they remove compute", highlight=False)
    return found


# ------------------------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=3, help="ranks to split the model over (default 3; SmolLM2: 1 or 3)")
    ap.add_argument("--tokens", type=int, default=24, help="greedy tokens to generate and time (default 24)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of the decode steps (at least 2; default 5)")
    ap.add_argument("--prefill-rows", type=int, default=64, help="rows of the prefill-sized all-reduce (default 64)")
    ap.add_argument("--figure", type=Path, help="draw one layer's split over --size ranks here (PNG)")
    ap.add_argument("--rank-job", type=Path, help=argparse.SUPPRESS)     # set by run_ranks for the rank processes
    ap.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if in_rank_process():
        rank_main(args.rank_job, args.rank_out)
        return
    if args.repeats < 2:
        raise InputError(f"--repeats must be at least 2 (one run has no spread), got {args.repeats}")
    if not 2 <= args.tokens <= 256:
        raise InputError(f"--tokens must be in [2, 256], got {args.tokens}")
    if not 2 <= args.prefill_rows <= 4096:
        raise InputError(f"--prefill-rows must be in [2, 4096], got {args.prefill_rows}")
    if args.size < 2:
        raise InputError(f"--size must be at least 2 (the lesson compares it with one process), got {args.size}")
    check_mpi()
    model = load_model()
    check_tensor_parallel_size(model.config, args.size)
    probe = Probe()                                                      # is the machine quiet during this run?
    first = part_tokens(args.size, args.tokens, model.config)
    costs = part_costs(args, model, first)
    part_projection(model.config)
    if args.figure:
        from minitransformer.lab.viz_parallel import draw_tensor_parallel_layer
        draw_tensor_parallel_layer(model.config, args.size, args.figure, model.path.stem)
        console.print(f"figure written: {args.figure}")
    console.rule("[bold]4. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)
    answer(shown, args.size, model.config, costs)


def check_mpi() -> None:
    """The lesson needs the parallel extra (mpi4py and the MPICH wheel): one clear line when they are missing."""
    from minitransformer.parallel.launch import find_mpiexec
    find_mpiexec()


def answer(shown: dict, size: int, config, costs: dict) -> None:
    """The interview answer, with this run's numbers; every direction it states is a claim this run showed."""
    c = config
    llama = dataclasses.replace(config, **LLAMA_8B)
    one = min(r["step"] for r in costs["one"]) * 1e3
    r0 = min(costs["ranks"][0]["decode"], key=lambda r: r["step"])
    console.rule("[bold]Interview question: how does tensor parallelism split attention and the MLP, and what does "
                 "it cost per token?")
    text = [f"Each rank holds whole heads: q, k and v are split by heads (column-parallel), so attention needs no "
            f"other rank's numbers, and the output projection takes only that rank's rows (row-parallel), giving a "
            f"partial sum. The MLP is split the same way: gate and up by columns, down by the matching rows. One "
            f"all-reduce completes each half, so a layer costs two. Here at size {size} each rank held "
            f"{c.n_heads // size} of {c.n_heads} query heads and {c.ffn_dim // size} of {c.ffn_dim} FFN columns."]
    if shown["same-tokens"]:
        text.append("The split model generated the same token ids as one process.")
    if shown["two-per-layer"]:
        text.append(f"Per decode token that is {2 * c.n_layers} all-reduces of {c.d_model * 4:,} bytes each "
                    f"({2 * c.n_layers * c.d_model * 4:,} bytes a token).")
    if shown["kv-split"]:
        text.append(f"Each rank's KV cache holds only its KV heads, 1/{size} of the whole.")
    text.append(f"On this machine rank 0's fastest run spent {r0['all_reduce'] * 1e3:.2f} ms a token in all-reduces "
                f"and {r0['compute'] * 1e3:.2f} ms computing; one process took {one:.2f} ms a step.")
    if shown["joins-are-waiting"]:
        text.append(f"Most of those all-reduce milliseconds were waiting: {size} ranks took turns on this machine's "
                    f"{os.cpu_count()} cores, and every all-reduce waits for the last rank to arrive.")
    if shown["small-is-latency"]:
        text.append("An all-reduce this small costs its latency, not its bytes: a prefill-sized one carried many "
                    "times the bytes for not many times the time.")
    if shown["no-faster-here"]:
        text.append(f"So {size} ranks were slower than one process here: they share the same cores, so splitting "
                    "adds no arithmetic or memory bandwidth, only the joins.")
        if shown["joins-cost-more"]:
            text.append("The all-reduces alone cost more than splitting saved in compute.")
    else:
        text.append(f"This run could not show {size} ranks slower than one process beyond its spread.")
    nv = split_step(H200, NVLINK4, llama, 1, 8)
    text.append(f"On 8 H200s over NVLink, by published figures, a Llama 3.1 8B decode token would spend "
                f"{nv.compute * 1e3:.3f} ms computing and {nv.communication * 1e3:.3f} ms in its "
                f"{nv.all_reduces} all-reduces: latency-bound, so tensor parallelism is kept inside a node's fast "
                f"links, and engines fuse or shorten the all-reduce (one-shot kernels, NVLink SHARP).")
    if shown["fast-links"]:
        text.append("Over PCIe a 1,024-token prefill would not pay at 8 GPUs, where NVLink still pays: that is why "
                    "TP needs fast links.")
    text.append("Beyond a node, pipeline parallelism (whole layers per GPU, one send per micro-batch) and "
                "data-parallel replicas (whole models, no exchange per token) take over.")
    console.print(" ".join(text))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
