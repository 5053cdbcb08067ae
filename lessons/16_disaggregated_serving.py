"""Lesson 16: prefill/decode interference, and three fixes: chunked prefill, disaggregation, replicas behind a router.

    python lessons/16_disaggregated_serving.py [--rounds 3] [--chats 20] [--chat-rate 2] [--chat-tokens 24]
                                               [--long-prompts 4] [--long-words 900] [--chunk 128]
                                               [--tenants 3] [--tenant-requests 6] [--tenant-rate auto]
                                               [--router-rounds 2] [--figure figures/disaggregated_itl.png]

A long prompt's prefill is one big forward. When the engine runs it in the same step as the other requests' decode
tokens, every one of those decodes waits for the whole prefill: a chat that was getting a token every tenth of a
second gets nothing for a second or two. Lesson 08 saw that from inside one engine; here it is measured the way a
user meets it, through the HTTP API (minitransformer/bench/interference.py: steady short chats at Poisson times, and
now and then a long prompt), against three servers on the same machine's cores:

    no chunking               one process, `serve --max-num-batched-tokens 2048`: a long prompt is prefilled in one
                              step
    chunked                   one process, `serve --max-num-batched-tokens 128` (--chunk): at most 128 tokens a step,
                              so a long prompt is prefilled over many steps, each also carrying the chats' decodes
    disaggregated             `serve --disaggregated`: a prefill process and a decode process (one core each), the
                              prompt's KV cache sent from the first to the second over MPI (serving/kv_transfer.py,
                              parallel/kv_connector.py), as DistServe, Splitwise, vLLM's KV connectors and NVIDIA
                              Dynamo do across GPUs

Part 1 times the chats' TTFT and inter-token latency (ITL) under each, in turns, round after round. Part 2 reads
what the transfer cost off the disaggregated server's /metrics: bytes and seconds per prompt token. Part 3 does the
same arithmetic for a pair of H200s running Llama 3.1 8B, over NVLink and over RDMA, from published figures.

Part 4 is the other way past one server: whole replicas behind a router (`serve --replicas 2`, SGLang's model
gateway, the `router` extra). Several tenants each send their own long system prompt with short questions; each
replica has its own prefix cache, so where the router sends a tenant's next request decides whether its system
prompt is found there or prefilled again. Round robin against cache aware, each on fresh replicas, in turns
(minitransformer/bench/router_workload.py): the prefix-cache hit rate off the replicas' /metrics, and TTFT. The
tenants send at a light load for this machine (--tenant-rate auto): a fraction of the uncached requests per second it
prefills, timed first. Near capacity every request queues under either policy, and which one is ahead is decided by
queueing, not by the caches.

Every server runs on this machine's cores: the colocated ones with every core for their matmuls, the disaggregated
one with one core per process. The claims (claims() below) are decided from the printed numbers
(minitransformer/lab/claims.py); a claim about time needs a quiet machine and a difference beyond the rounds' spread.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import asyncio
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.bench.interference import Traffic, arrivals, run_round, summarize, transfer_totals, warm_up_plan
from minitransformer.bench.managed_server import ManagedServer, Termination, free_port
from minitransformer.bench.router_workload import (
    AUTO_LOAD,
    TENANTS,
    TenantWorkload,
    rate_for_this_machine,
    run_policy,
    uncached_seconds,
)
from minitransformer.bench.serve import BenchServeError
from minitransformer.core.config import ModelConfig
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.gguf_file import open_gguf
from minitransformer.core.kv_cache import kv_bytes_per_token
from minitransformer.core.metrics import now
from minitransformer.lab.claims import NUMBER, Claim, cell_range, find_numbers, report, span, spread_cell, table_with
from minitransformer.lab.machine import H200, IB_NDR, NVLINK4
from minitransformer.lab.measure import Probe, descendant_groups, descendants
from minitransformer.models import resolve_model_path

CONFIGS = ("no chunking", "chunked", "disaggregated")          # the servers of part 1, in that order
NO_CHUNK_TOKENS = 2048                   # more than any prompt here: a prefill is never split
PROJECTED_PROMPT = 4096                  # part 3: a 4,096-token prompt of Llama 3.1 8B
# Llama 3.1 8B's published shape (its config.json): 32 layers, d_model 4096, 32 query heads and 8 KV heads of 128.
LLAMA_8B = ModelConfig(name="Llama 3.1 8B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, head_dim=128,
                       ffn_dim=14336, norm_eps=1e-5, rope_base=5e5, context_length=131072, vocab_size=128256,
                       tied_embeddings=False)
POLICIES = ("round_robin", "cache_aware")             # smg's --policy names, part 4's rows
SMALL_SHARE = 0.05                       # "small next to the prefill": under 5% of its time
WHAT_TO_LOOK_AT = (
    "Table 1b's `chat ITL p99` is how long the chats' worst gaps between tokens were: compare the three rows; 1a's "
    "`long TTFT p50` is what each fix costs the long prompts themselves.",
    "Part 2's check lines: the bytes per prompt token are the model's shape; the seconds are the transfer's cost.",
    "Table 3 is arithmetic from published figures, no timing: the transfer next to the prefill it saves.",
    "Table 4: `hit rate` is the share of prompt tokens found in a replica's prefix cache under each router policy.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()


# ------------------------------------------------------------------------------------------------ the claims

def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify)."""
    table = table_with(output, "chat ITL p99")
    rows = {row[0]: dict(zip(table.columns, row)) for row in table.rows}
    ttft = table_with(output, "long TTFT p50")
    long_ttft = {row[0]: cell_range(dict(zip(ttft.columns, row))["long TTFT p50 s"]) for row in ttft.rows}
    no_chunk = rows[CONFIGS[0]]
    itl = {name: cell_range(rows[name]["chat ITL p99 ms"]) for name in CONFIGS}
    failed = sum(float(r["failed"]) for r in rows.values())
    per_token, formula = find_numbers(output, rf"check bytes: ({NUMBER}) bytes per prompt token sent; the model's "
                                              rf"shape gives ({NUMBER})")
    transfer_us, prefill_us = find_numbers(output, rf"check transfer: ({NUMBER}) us per prompt token to send, "
                                                   rf"({NUMBER}) us per prompt token from first schedule to first "
                                                   "token")
    projected = table_with(output, "link")
    share = {row[0]: float(dict(zip(projected.columns, row))["transfer / prefill %"]) for row in projected.rows}
    nv, ib = share[NVLINK4.name], share[IB_NDR.name]
    routed = table_with(output, "hit rate")
    policy = {row[0]: dict(zip(routed.columns, row)) for row in routed.rows}
    hits = {name: cell_range(policy[name]["hit rate %"]) for name in POLICIES}
    mean_ttft = {name: cell_range(policy[name]["TTFT mean ms"]) for name in POLICIES}
    routed_failed = sum(float(r["failed"]) for r in policy.values())
    below = lambda a, b: a[1] < b[0]
    return [
        Claim("no-request-lost", "every request of every round was answered", failed + routed_failed == 0,
              f"{failed + routed_failed:.0f} failed", timed=False),
        Claim("interference", "a long prompt prefilled in one step stalls the chats decoding next to it: their ITL p99 "
              "is many times their p50", cell_range(no_chunk["chat ITL p99 ms"])[0]
              > 4 * cell_range(no_chunk["chat ITL p50 ms"])[1],
              f"p99 {span(itl[CONFIGS[0]], 'ms')} vs p50 {span(cell_range(no_chunk['chat ITL p50 ms']), 'ms')}"),
        Claim("chunking-cuts-itl", "chunked prefill lowers the chats' ITL p99", below(itl[CONFIGS[1]], itl[CONFIGS[0]]),
              f"{span(itl[CONFIGS[1]], 'ms')} vs {span(itl[CONFIGS[0]], 'ms')} unchunked"),
        Claim("disaggregation-cuts-itl", "disaggregation lowers the chats' ITL p99",
              below(itl[CONFIGS[2]], itl[CONFIGS[0]]),
              f"{span(itl[CONFIGS[2]], 'ms')} vs {span(itl[CONFIGS[0]], 'ms')} colocated unchunked"),
        Claim("disaggregation-beats-chunking", "disaggregation lowers the chats' ITL p99 below chunked prefill's",
              below(itl[CONFIGS[2]], itl[CONFIGS[1]]),
              f"{span(itl[CONFIGS[2]], 'ms')} vs {span(itl[CONFIGS[1]], 'ms')} chunked", required=False,
              refuted=below(itl[CONFIGS[1]], itl[CONFIGS[2]])),
        Claim("chunking-costs-long-ttft", "chunking makes the long prompts themselves wait longer for their first "
              "token", below(long_ttft[CONFIGS[0]], long_ttft[CONFIGS[1]]),
              f"{span(long_ttft[CONFIGS[1]])} vs {span(long_ttft[CONFIGS[0]])} unchunked", required=False,
              refuted=below(long_ttft[CONFIGS[1]], long_ttft[CONFIGS[0]])),
        Claim("kv-bytes", "what is sent per prompt token is the model's KV shape: layers x 2 x KV heads x head_dim x "
              "4 bytes", per_token == formula, f"{per_token:,.0f} vs {formula:,.0f}", timed=False),
        Claim("transfer-small", f"sending the KV cache costs under {SMALL_SHARE:.0%} of the time its prompt took from "
              "first schedule to first token on this busy server",
              transfer_us < SMALL_SHARE * prefill_us, f"{transfer_us:.2f} vs {prefill_us:.1f} us per token"),
        Claim("nvlink-cheap", f"on H200s over NVLink the transfer is under {SMALL_SHARE:.0%} of the prefill "
              "(published figures)", nv < 100 * SMALL_SHARE, f"{nv:.1f}%", timed=False),
        Claim("rdma-costs-more", "over RDMA between machines it is a larger share: the link sets where disaggregation "
              "pays", ib > nv, f"{ib:.1f}% vs {nv:.1f}% over NVLink", timed=False),
        Claim("cache-aware-hits", "a cache-aware router finds more of the prompts in the replicas' prefix caches than "
              "round robin", below(hits["round_robin"], hits["cache_aware"]),
              f"{span(hits['cache_aware'], '%')} vs {span(hits['round_robin'], '%')}", timed=False),
        Claim("cache-aware-ttft", "and the tenants' first tokens come sooner on average",
              below(mean_ttft["cache_aware"], mean_ttft["round_robin"]),
              f"{span(mean_ttft['cache_aware'], 'ms')} vs {span(mean_ttft['round_robin'], 'ms')}"),
    ]


# ------------------------------------------------------------------------------------------------ part 1

def server_argv(config: str, port: int, chunk: int, model: str | None) -> list[str]:
    common = [sys.executable, "-m", "minitransformer", "serve", "--port", str(port), "--max-num-seqs", "16",
              "--log-level", "warning", *(["--model", model] if model else [])]
    if config == CONFIGS[2]:
        return [*common, "--disaggregated"]               # its prefill process takes the default 512 a step
    return [*common, "--max-num-batched-tokens", str(NO_CHUNK_TOKENS if config == CONFIGS[0] else chunk)]


def part_interference(args, traffic: Traffic, logs: Path, stack: ExitStack, termination) -> dict:
    """Start the three servers, then run the traffic through each in turns, round after round."""
    servers = {}
    for i, config in enumerate(CONFIGS):
        port = free_port()
        servers[config] = stack.enter_context(ManagedServer(
            config, server_argv(config, port, args.chunk, args.model), port, "/health", logs / f"server-{i}.log",
            check=termination.check))
    for server in servers.values():                # first requests, and the prefill rank's start, not measured
        warm = asyncio.run(termination.run(run_round(server.url, warm_up_plan(traffic, args.rounds))))
        failed = [record.error for _, record in warm if not record.ok]
        if failed:
            raise BenchServeError(f"the warm-up request to the {server.name} server failed: {failed[0]}")
    groups = sorted({g for server in servers.values() for g in descendant_groups(server.running.pid)})
    probe = Probe(process_groups=groups)           # the servers' CPU (all their processes) is this run's own work
    runs: dict[str, list] = {config: [] for config in CONFIGS}
    last: dict[str, list] = {}                       # each server's last round, as the client saw it (the figure)
    transfers = []
    for r in range(args.rounds):
        plan = arrivals(traffic, r)
        for config in (CONFIGS if r % 2 == 0 else CONFIGS[::-1]):     # turns: a slow spell falls on all three
            url = servers[config].url
            before = transfer_totals(url) if config == CONFIGS[2] else None
            done = asyncio.run(termination.run(run_round(url, plan)))
            runs[config].append(summarize(done))
            last[config] = done
            if before is not None:
                after = transfer_totals(url)
                transfers.append({key: after[key] - before[key] for key in after}
                                 | {"prompt_tokens": runs[config][-1].prompt_tokens})
            console.print(f"round {r + 1} of {args.rounds}: {config} done", highlight=False)
    what = (f"{traffic.chats} chats of {traffic.chat_words} words at {traffic.chat_rate:g}/s ({traffic.chat_tokens} "
            f"tokens each) and {traffic.long_prompts} prompts of {traffic.long_words} words ({traffic.long_tokens} "
            f"tokens each), {args.rounds} rounds: best (median, spread)")
    columns = {"1a. Time to first token": (("chat TTFT p50 s", lambda s: s.chat_ttft_p50, ".2f"),
                                           ("chat TTFT p99 s", lambda s: s.chat_ttft_p99, ".2f"),
                                           ("long TTFT p50 s", lambda s: s.long_ttft_p50, ".2f")),
               "1b. Inter-token latency": (("chat ITL p50 ms", lambda s: s.chat_itl_p50 * 1e3, ".0f"),
                                           ("chat ITL p99 ms", lambda s: s.chat_itl_p99 * 1e3, ".0f"))}
    for title, cells in columns.items():
        table = Table(title=f"{title}: {what}")
        table.add_column("configuration")
        for name, _, _ in cells:
            table.add_column(name, justify="right")
        if title.startswith("1b"):
            table.add_column("failed", justify="right")
        for config in CONFIGS:
            rounds = runs[config]
            row = [spread_cell([value(s) for s in rounds], fmt) for _, value, fmt in cells]
            table.add_row(config, *row, *([str(sum(s.failed for s in rounds))] if title.startswith("1b") else []))
        console.print(table)
    if args.figure:
        from minitransformer.lab.viz_interference import draw_interference
        draw_interference({config: last[config] for config in CONFIGS}, args.figure)
        console.print(f"figure written: {args.figure}")
    return {"transfers": transfers, "probe": probe}


# ------------------------------------------------------------------------------------------------ part 2

def part_transfer(transfers: list[dict], model_path: str) -> None:
    console.rule("[bold]2. What the transfer cost (the disaggregated server's /metrics, summed over the rounds)")
    config = ModelConfig.from_gguf(open_gguf(resolve_model_path(model_path)))
    total = {key: sum(t[key] for t in transfers) for key in transfers[0]}
    per_token = total["bytes"] / total["prompt_tokens"]
    console.print(f"check bytes: {per_token:,.0f} bytes per prompt token sent; the model's shape gives "
                  f"{kv_bytes_per_token(config):,} ({config.n_layers} layers x 2 x {config.n_kv_heads} KV heads x "
                  f"{config.head_dim} x 4 bytes)", highlight=False)
    console.print(f"check transfer: {total['seconds'] / total['prompt_tokens'] * 1e6:.2f} us per prompt token to "
                  f"send, {total['prefill_s'] / total['prompt_tokens'] * 1e6:.1f} us per prompt token from first "
                  f"schedule to first token ({total['count']:.0f} transfers, {total['bytes'] / 2**20:,.0f} MiB in "
                  f"{total['seconds'] * 1e3:.0f} ms; that second figure is not a prefill's cost: it includes the "
                  "transfer and the steps the prompt shared with other requests on this loaded server. Lesson 02 "
                  "times a prefill alone, a few times less per token)", highlight=False)


# ------------------------------------------------------------------------------------------------ part 3

def part_projection() -> None:
    """A 4,096-token prompt of Llama 3.1 8B in bf16 on an H200: its prefill at the roofline, its KV over each link."""
    per_token = kv_bytes_per_token(LLAMA_8B, dtype=np.float16)          # bf16 has float16's 2 bytes
    nbytes = per_token * PROJECTED_PROMPT
    prefill = H200.seconds(H200.cost(LLAMA_8B, PROJECTED_PROMPT))
    table = Table(title=f"3. Llama 3.1 8B, one {PROJECTED_PROMPT:,}-token prompt, bf16: {per_token:,} bytes of KV "
                        f"per token, {nbytes / 2**20:,.0f} MiB; prefill on one H200 at its roofline "
                        f"{prefill * 1e3:.1f} ms (published figures, no timing)")
    for column in ("link", "GB/s", "transfer ms", "transfer / prefill %"):
        table.add_column(column, justify="left" if column == "link" else "right")
    for link in (NVLINK4, IB_NDR):
        seconds = link.transfer_seconds(nbytes)
        table.add_row(link.name, f"{link.bandwidth / 1e9:.0f}", f"{seconds * 1e3:.2f}",
                      f"{100 * seconds / prefill:.1f}")
    console.print(table)
    console.print("A real prefill runs at perhaps half the roofline's speed, which halves these shares; a transfer "
                  "can also start layer by layer while the prefill goes on (vLLM's connectors save each layer's KV as "
                  "it is computed), hiding most of it.", highlight=False)


# ------------------------------------------------------------------------------------------------ part 4

def part_router(args) -> None:
    """Round robin and cache aware on the same tenants, each on fresh replicas, in turns over --router-rounds."""
    workload = TenantWorkload(tenants=args.tenants, rounds=args.tenant_requests, system_words=args.system_words,
                              max_tokens=args.tenant_tokens)                  # its rate: --tenant-rate, set below
    options = ["--max-num-seqs", "4", "--num-blocks", "256", "--log-level", "warning",
               *(["--model", args.model] if args.model else [])]
    if args.tenant_rate == "auto":         # a light load on this machine, whatever its speed (router_workload.py)
        uncached = uncached_seconds(workload, options)
        workload = replace(workload, rate=rate_for_this_machine(uncached))
        console.print(f"check tenant rate: a tenant request whose system prompt no replica had seen took "
                      f"{uncached:.2f} s to its first token, alone on fresh replicas (each tenant's first, one at a "
                      f"time): this machine prefills about {1 / uncached:.2f} of them a second, and the tenants send "
                      f"{workload.rate:g}/s, {AUTO_LOAD:g} of that (--tenant-rate auto)", highlight=False)
    else:
        workload = replace(workload, rate=args.tenant_rate)
    runs: dict[str, list[dict]] = {name: [] for name in POLICIES}
    for r in range(args.router_rounds):
        for name in (POLICIES if r % 2 == 0 else POLICIES[::-1]):
            runs[name].append(run_policy(name, workload, options, replicas=2))
            console.print(f"router round {r + 1} of {args.router_rounds}: {name} done", highlight=False)
    table = Table(title=f"4. Two replicas behind smg: {workload.tenants} tenants x {workload.rounds} requests, each "
                        f"a ~{workload.system_words}-word system prompt of its own + a question, {workload.rate:g}/s, "
                        f"{args.router_rounds} runs per policy on fresh replicas: best (median, spread)")
    for column in ("policy", "hit rate %", "TTFT mean ms", "TTFT p50 ms", "TTFT p99 ms", "failed"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name in POLICIES:
        cells = [spread_cell([100 * run["hit_rate"] for run in runs[name]], ".1f")]
        cells += [spread_cell([run[key] for run in runs[name]], ".0f")
                  for key in ("ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms")]
        table.add_row(name, *cells, str(sum(run["failed"] for run in runs[name])))
    console.print(table)
    for name in POLICIES:
        replicas = [f"{100 * (r['hit_rate'] or 0):.0f}% of {r['queries']:,.0f}"
                    for r in runs[name][-1]["replicas"].values()]
        console.print(f"check replicas {name}: its last run's replicas found {' and '.join(replicas)} prompt tokens",
                      highlight=False)


# ------------------------------------------------------------------------------------------------ main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the traffic per server, in turns (at least 2; default 3)")
    ap.add_argument("--chats", type=int, default=20, help="short chats per round (default 20)")
    ap.add_argument("--chat-rate", type=float, default=2.0, help="chats per second, Poisson (default 2)")
    ap.add_argument("--chat-tokens", type=int, default=24, help="tokens each chat generates (default 24)")
    ap.add_argument("--long-prompts", type=int, default=4,
                    help="long prompts per round (default 4: enough stalled gaps for the ITL p99 to see them)")
    ap.add_argument("--long-words", type=int, default=900, help="words per long prompt (default 900, ~1,200 tokens)")
    ap.add_argument("--chunk", type=int, default=128,
                    help="--max-num-batched-tokens of the chunked server (default 128)")
    ap.add_argument("--tenants", type=int, default=3, help="tenants behind the router (1-5; default 3)")
    ap.add_argument("--tenant-requests", type=int, default=6, help="requests per tenant (default 6)")
    ap.add_argument("--system-words", type=int, default=300, help="words of each tenant's system prompt (default 300)")
    ap.add_argument("--tenant-rate", default="auto",
                    help=f"the tenants' requests per second (default auto: {AUTO_LOAD:g} of the uncached requests per "
                         "second this machine prefills, timed first)")
    ap.add_argument("--tenant-tokens", type=int, default=8, help="tokens each tenant request generates (default 8)")
    ap.add_argument("--router-rounds", type=int, default=2,
                    help="runs of the tenants per router policy, in turns, each on fresh replicas (>= 2; default 2)")
    ap.add_argument("--figure", type=Path, help="draw the chats' gaps of each server's last round here (PNG)")
    ap.add_argument("--model", default=None, help="the GGUF the servers load (default: the default model)")
    args = ap.parse_args()
    if args.rounds < 2:
        raise InputError(f"--rounds must be at least 2 (one round has no spread), got {args.rounds}")
    for name in ("chats", "chat_tokens", "long_prompts", "long_words"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 < args.chat_rate < float("inf"):
        raise InputError(f"--chat-rate must be > 0, got {args.chat_rate}")
    if args.router_rounds < 2:
        raise InputError(f"--router-rounds must be at least 2 (one run has no spread), got {args.router_rounds}")
    if not 1 <= args.tenants <= len(TENANTS):
        raise InputError(f"--tenants must be in [1, {len(TENANTS)}], got {args.tenants}")
    for name in ("tenant_requests", "system_words", "tenant_tokens"):
        if getattr(args, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.tenant_rate != "auto":
        try:
            args.tenant_rate = float(args.tenant_rate)
        except ValueError:
            raise InputError(f"--tenant-rate must be 'auto' or a number > 0, got {args.tenant_rate!r}") from None
        if not 0 < args.tenant_rate < float("inf"):
            raise InputError(f"--tenant-rate must be > 0, got {args.tenant_rate}")
    if not 16 <= args.chunk < NO_CHUNK_TOKENS:
        raise InputError(f"--chunk must be in [16, {NO_CHUNK_TOKENS}), got {args.chunk}")
    from minitransformer.cli.replicas import find_smg
    from minitransformer.parallel.launch import find_mpiexec
    find_mpiexec()                                   # the disaggregated server's ranks: one line when MPI is missing
    find_smg()                                       # part 4's router: one line when the router extra is missing
    traffic = Traffic(chats=args.chats, chat_rate=args.chat_rate, chat_tokens=args.chat_tokens,
                      long_prompts=args.long_prompts, long_words=args.long_words)
    with ExitStack() as stack, Termination() as termination, tempfile.TemporaryDirectory() as logs:
        measured = part_interference(args, traffic, Path(logs), stack, termination)
        stack.close()                                # every server stopped before anything else is timed
    part_transfer(measured["transfers"], args.model)
    part_projection()
    part_router(args)
    console.rule("[bold]5. What this run shows")
    settle_after_servers()
    quiet = measured["probe"].finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)
    answer(shown)


def settle_after_servers(timeout_s: float = 15.0, settle_s: float = 1.0) -> None:
    """Wait until every process this lesson started has exited (a server's ranks and replicas leave a moment after
    the server is stopped), then settle_s more: the probe's closing calibration must not time our own servers'
    exit as another program's load."""
    deadline = now() + timeout_s
    while descendants(os.getpid()) and now() < deadline:
        time.sleep(0.1)
    time.sleep(settle_s)


def answer(shown: dict) -> None:
    """The interview answer; every direction it states is a claim this run showed."""
    console.rule("[bold]Interview question: a long prompt makes every other user's stream stutter. Why, and what "
                 "would you do?")
    text = ["Prefill and decode share the engine's steps: a step that carries a long prompt's prefill lasts as long "
            "as that prefill, and every decoding request waits for it before its next token."]
    if shown["interference"]:
        text.append("This run saw it: the chats' ITL p99 was many times their p50 with unchunked prefill.")
    if shown["chunking-cuts-itl"]:
        text.append("Chunked prefill caps the prefill tokens per step, so decodes keep flowing; it lowered the chats' "
                    "ITL p99 here.")
    if shown["chunking-costs-long-ttft"]:
        text.append("Its price is paid by the long prompt itself, whose first token came later.")
    if shown["disaggregation-cuts-itl"]:
        text.append("Disaggregation goes further: prefill runs on other hardware, so decode steps never carry it; "
                    "it lowered the ITL p99 too, on the same cores.")
    if shown["kv-bytes"]:
        text.append("The price of disaggregation is shipping the KV cache: exactly layers x 2 x KV heads x head_dim x "
                    "bytes per prompt token.")
    if shown["transfer-small"]:
        text.append("Sending it took a small fraction of the time its prompt took from first schedule to first "
                    "token.")
    if shown["nvlink-cheap"] and shown["rdma-costs-more"]:
        text.append("Across GPUs the link decides: over NVLink a Llama 3.1 8B prompt's KV moves in a small share of "
                    "its prefill, over RDMA between machines in a larger one. Disaggregation pays when prompts are "
                    "long, decode latency has an SLO, and the link is fast; with short prompts or a slow link, chunked "
                    "prefill in one engine is simpler and as good.")
    if shown["cache-aware-hits"]:
        text.append("Past one machine, replicas behind a router: each replica's prefix cache holds only what was sent "
                    "to it, so a router that sends a tenant back where its system prompt was seen (smg's cache-aware "
                    "policy, matching the request's text against what it sent each replica) found more of the "
                    "prompts cached than round robin.")
        if shown["cache-aware-ttft"]:
            text.append("Those tenants' first tokens came sooner on average.")
        text.append("What such a router needs to know: which replica has seen which prefix (here guessed from the "
                    "text it routed; llm-d and vLLM's production stack read KV-cache events from the engines) and how "
                    "loaded each replica is, so one hot prefix does not pin all traffic to one replica.")
    console.print(" ".join(text))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
