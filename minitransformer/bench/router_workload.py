"""Replicas behind a router, round robin against cache aware, on a multi-tenant workload (lesson 16's second half).

    tenant_prompts      T tenants, each a long system prompt of its own (~300 words, ~400 tokens) + short questions
    prefix_counters     a replica's prefix-cache counters, read from its /metrics (vLLM's names)
    hit_rates           before/after counters -> the hit rate of each replica and of all of them
    run_policy          fresh replicas + smg with one policy (`serve --replicas N`), the workload, the numbers
    uncached_seconds    what one tenant request costs this machine when its system prompt is cached nowhere
    rate_for_this_machine   the arrival rate AUTO_LOAD of what that cost allows (lesson 16's --tenant-rate auto)
    compare_policies    run_policy for each policy on the same workload -> plain numbers

Why a router needs to know about caches: each replica keeps its own prefix cache. A tenant's requests all begin with
the same long system prompt; sent to the replica that served that tenant before, its blocks are found in the cache
and only the question is prefilled; sent anywhere else, the whole prompt is prefilled again, and that replica's
cache holds one more copy of it. Round robin scatters a tenant's requests over the replicas (with T tenants on N
replicas, T and N coprime: every tenant reaches every replica); cache aware sends each one where its prefix was seen.

Each policy gets replicas started afresh, so both begin with empty caches, and each replica is warmed up directly
with a prompt of its own before the counters are read. The hit rate is in prompt tokens, as the server counts them:
vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total over the run. TTFT is the client's (bench/serve.py).
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from importlib.resources import files
from pathlib import Path

from ..core.metrics import now, percentile
from ..server.prometheus import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES
from .managed_server import ManagedServer, free_port
from .serve import RequestRecord, build_payload, first_model, run_rate, send_request
from .serve_workload import ServeSettings

TENANTS = ("Acme Logistics", "Borealis Bank", "Cobalt Health", "Dune Travel", "Ember Games")
QUESTIONS = ("What should I read first?", "Summarize the main idea in one sentence.", "Who is this text for?",
             "Name one thing the text describes.", "What is the tone of the text?", "Give me a title for it.")
COUNTERS = (PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES)
# --tenant-rate auto: the tenants send at this fraction of the uncached requests per second this machine prefills.
# A light load, where a request finds its replica idle and its TTFT is the prefill it needs: cache aware then saves
# each tenant's repeated system prompt. Near capacity requests queue, and cache aware's uneven split (3 tenants on 2
# replicas: one replica gets two of them) can cost more in queueing than its hits save. A fixed 0.5 requests/s was
# about 0.3 of capacity where lesson 02 measured 1.53 ms of prefill per prompt token (~420 tokens a request: ~0.64 s,
# and cache aware's TTFT mean was 352 against round robin's 527 ms), and all of it where lesson 02 measured 4.79 ms
# (TTFT means of 2.5-2.7 s under either policy, neither ahead).
AUTO_LOAD = 0.3


@dataclass(frozen=True)
class TenantWorkload:
    """What each policy is asked: the same requests, in the same order, at the same arrival times."""
    tenants: int = 3                 # odd, so that round robin on 2 replicas does not keep a tenant on one by chance
    rounds: int = 6                  # requests per tenant; round r sends each tenant's r-th question
    system_words: int = 300          # ~400 tokens of SmolLM2's tokenizer
    rate: float = 0.5                # requests per second (Poisson arrivals, bench/serve_workload.py)
    max_tokens: int = 8
    seed: int = 0
    max_concurrency: int | None = None   # requests in flight at most (None: as they arrive); 1: one at a time


def tenant_prompts(w: TenantWorkload) -> list[tuple[int, str]]:
    """(tenant, completion prompt) in sending order: round by round, every tenant once per round. A tenant's
    system prompt is a slice of the shipped text starting at its own word, so no two tenants share a first block
    of tokens (or a first character: smg's tree is over characters)."""
    if not 1 <= w.tenants <= len(TENANTS):
        raise ValueError(f"tenants must be in [1, {len(TENANTS)}], got {w.tenants}")
    words = files(__package__).joinpath("serve_text.txt").read_text(encoding="utf-8").split()
    step = len(words) // w.tenants
    systems = [f"{TENANTS[t]} assistant: answer questions about this text.\n\n"
               + " ".join(words[(t * step + j) % len(words)] for j in range(w.system_words))
               for t in range(w.tenants)]
    return [(t, f"{systems[t]}\n\nQuestion: {QUESTIONS[r % len(QUESTIONS)]}\nAnswer:")
            for r in range(w.rounds) for t in range(w.tenants)]


def prefix_counters(metrics_text: str) -> dict[str, float]:
    """The prefix-cache counters of one /metrics page (Prometheus text: `name{labels} value` lines)."""
    found = dict.fromkeys(COUNTERS, 0.0)
    for line in metrics_text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in found:
            found[name] += float(line.rsplit(" ", 1)[1])
    return found


def hit_rates(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]) -> dict:
    """{replica: counters} before and after a run -> each replica's hits, queries and hit rate, and the overall
    rate (all hits over all queries, so a busy replica weighs more than an idle one). None: nothing was queried."""
    hits_name, queries_name = COUNTERS
    replicas, total_hits, total_queries = {}, 0.0, 0.0
    for url in after:
        hits = after[url][hits_name] - before[url][hits_name]
        queries = after[url][queries_name] - before[url][queries_name]
        replicas[url] = {"hits": hits, "queries": queries, "hit_rate": hits / queries if queries else None}
        total_hits, total_queries = total_hits + hits, total_queries + queries
    return {"replicas": replicas, "hit_rate": total_hits / total_queries if total_queries else None}


def replica_urls(log_text: str) -> list[str]:
    """The replicas' URLs from `serve --replicas`'s startup line ("... -> replicas URL URL  (Ctrl-C stops)")."""
    line = next((line for line in log_text.splitlines() if "-> replicas" in line), "")
    return re.findall(r"http://[\w.\[\]:-]+", line.partition("-> replicas")[2])


async def _measure(router_url: str, urls: list[str], w: TenantWorkload) -> dict:
    import httpx

    settings = ServeSettings(rates=(w.rate,), num_prompts=w.tenants * w.rounds, endpoint="completions",
                             max_tokens=w.max_tokens, temperature=0.0, ignore_eos=True, seed=w.seed,
                             max_concurrency=w.max_concurrency)
    requests = tenant_prompts(w)
    # loopback only: no proxy from the environment; every request on a connection of its own (bench/serve.py)
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(settings.timeout_s, connect=10.0), limits=limits,
                                 trust_env=False) as client:
        model = await first_model(client, urls[0])
        for url in urls:        # first-request costs out of the measurement; a prompt no tenant's shares
            warm = await send_request(client, f"{url}/v1/completions",
                                      build_payload("Warm up: say hello.", model, settings), "completions",
                                      RequestRecord(prompt_words=4))
            if not warm.ok:
                raise RuntimeError(f"the warm-up request to {url} failed: {warm.error}")

        async def counters() -> dict[str, dict[str, float]]:
            pages = await asyncio.gather(*(client.get(f"{url}/metrics") for url in urls))
            return {url: prefix_counters(page.text) for url, page in zip(urls, pages)}

        before = await counters()
        records, wall_s = await run_rate(client, f"{router_url}/v1/completions", model,
                                         [prompt for _, prompt in requests], w.rate, settings)
        after = await counters()
    ttfts = [r.ttft_s for r in records if r.ok and r.ttft_s is not None]
    failed = [r.error for r in records if not r.ok]
    return {"ttft_p50_ms": _ms(percentile(ttfts, 50)), "ttft_p99_ms": _ms(percentile(ttfts, 99)),
            "ttft_mean_ms": _ms(sum(ttfts) / len(ttfts)) if ttfts else None,
            "requests": len(records), "failed": len(failed), "errors": failed[:3], "wall_s": wall_s,
            "ttft_ms_by_tenant": _by_tenant(requests, records), **hit_rates(before, after)}


def _by_tenant(requests, records) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {}
    for (tenant, _), record in zip(requests, records):
        out.setdefault(TENANTS[tenant], []).append(_ms(record.ttft_s))
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 1)


def run_policy(policy: str, w: TenantWorkload, serve_options: list[str], replicas: int = 2,
               log_dir: Path | None = None) -> dict:
    """Start `minitransformer serve --replicas N --router-policy policy` afresh, run the workload through it, stop
    it; the policy's numbers (TTFT percentiles, hit rate per replica and overall)."""
    if log_dir is None:                      # the logs only matter while it runs (a failure quotes their tail)
        with tempfile.TemporaryDirectory(prefix="router-workload-") as tmp:
            return run_policy(policy, w, serve_options, replicas, Path(tmp))
    port = free_port()
    argv = [sys.executable, "-m", "minitransformer", "serve", "--port", str(port), "--replicas", str(replicas),
            "--router-policy", policy, *serve_options]
    with ManagedServer(f"{policy} router", argv, port, "/readiness", log_dir / f"{policy}.log") as router:
        deadline = now() + 10.0      # smg answers /readiness a moment before the line is printed
        while len(urls := replica_urls(router.log_path.read_text())) != replicas and now() < deadline:
            time.sleep(0.1)
        if len(urls) != replicas:
            raise RuntimeError(f"expected {replicas} replica URLs on the startup line: {router.log_tail()}")
        return {"policy": policy, **asyncio.run(_measure(router.url, urls, w))}


def uncached_seconds(w: TenantWorkload, serve_options: list[str], replicas: int = 2) -> float:
    """Seconds from sending to the first token of a tenant request whose system prompt no replica has seen, on
    otherwise idle replicas: each tenant's first request, one at a time, through round robin on fresh replicas, the
    mean of their TTFTs. The replicas share this machine's cores, so however many there are, the machine prefills
    about one such request in that time: 1 / it is the uncached requests per second it keeps up with."""
    alone = replace(w, rounds=1, rate=float("inf"), max_concurrency=1)
    run = run_policy("round_robin", alone, serve_options, replicas)
    if run["failed"] or run["ttft_mean_ms"] is None:
        raise RuntimeError(f"timing an uncached tenant request failed: {run['errors']}")
    return run["ttft_mean_ms"] / 1e3


def rate_for_this_machine(uncached_s: float, load: float = AUTO_LOAD) -> float:
    """Requests per second at `load` of the 1 / uncached_s this machine prefills, to two significant digits (a rate
    a reader can type back as --tenant-rate)."""
    return float(f"{load / uncached_s:.2g}")


def compare_policies(w: TenantWorkload = TenantWorkload(), serve_options: list[str] | None = None,
                     policies: tuple[str, ...] = ("round_robin", "cache_aware"), replicas: int = 2) -> dict:
    """Every policy on the same workload, each on fresh replicas -> {policy: numbers}, plus the workload."""
    options = serve_options if serve_options is not None else ["--max-num-seqs", "4", "--num-blocks", "256",
                                                               "--log-level", "warning"]
    return {"workload": asdict(w), "serve_options": options,
            "policies": {policy: run_policy(policy, w, options, replicas) for policy in policies}}


if __name__ == "__main__":      # python -m minitransformer.bench.router_workload: one comparison, as JSON
    import json

    print(json.dumps(compare_policies(), indent=1))
