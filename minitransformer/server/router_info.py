"""What a router in front of several replicas reads from each one: its load, its settings, its version.

    GET /v1/loads                       SGLang's load report: queue depth, running requests, KV use, per DP rank
    GET /server_info, /get_server_info  SGLang's settings report (the model, the context, the pool, the batch cap)
    GET /version                        vLLM's {"version": ...}

`minitransformer serve --replicas N` (cli/replicas.py) puts N servers behind SGLang's model gateway (smg). At
registration smg asks each worker for /server_info (falling back to /get_server_info on a 404) and /version; then
its load monitor polls `/v1/loads?include=core,...` every --load-monitor-interval seconds. Its cache-aware policy
skips the worker whose prefix matches when that worker is overloaded: `token_usage` (KV in use, 0..1) above the
others' by more than a threshold; its least-load policy divides the queued work by `gen_throughput`. Without
these endpoints smg logs the 404s and routes on its own count of the requests it has in flight.

The shapes are SGLang's and vLLM's (sglang/srt/entrypoints/v1_loads.py and http_server.py's get_server_info;
GetLoadsReqOutput in sglang/srt/managers/io_struct.py; vLLM's api_server.py /version), with only the fields this
engine can fill truthfully: one engine is one DP rank (rank 0); a field with no measurement behind it (SGLang's
`utilization`, its memory and speculative sections) is left out rather than sent as 0. Every number comes from
EngineLoop.stats, the snapshot the engine thread publishes after each step, and the engine's fixed EngineConfig:
the engine's read API, as /metrics reads it. Lesson 16 reads the prefix-cache counters on /metrics instead.
"""

from __future__ import annotations

import importlib.metadata
from datetime import datetime, timezone

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..core.metrics import now
from ..serving import EngineConfig, EngineStats
from .errors import bad_request


def _installed_version() -> str:
    """The installed package's version (pyproject.toml's; the package's __init__ sits in a layer above this)."""
    try:
        return importlib.metadata.version("minitransformer")
    except importlib.metadata.PackageNotFoundError:          # run from a checkout that was never installed
        return "unknown"


__version__ = _installed_version()

# SGLang's sections of /v1/loads; "core" is the one this engine reports (the others are sent only when measured).
LOAD_SECTIONS = frozenset({"core", "memory", "spec", "lora", "disagg", "queues", "all"})


def load_report(stats: EngineStats, config: EngineConfig, gen_throughput: float) -> dict:
    """One DP rank's load, in SGLang's GetLoadsReqOutput field names. KV use is counted in whole blocks: a block
    holds up to block_size tokens, and a block in use is unavailable whether it is full or not."""
    used_blocks = stats.num_blocks - stats.num_free_blocks
    queries = stats.prefix_cache_queries
    return {
        "dp_rank": 0,
        "num_running_reqs": stats.num_running_reqs,
        "num_waiting_reqs": stats.num_waiting_reqs,
        "num_total_reqs": stats.num_running_reqs + stats.num_waiting_reqs,
        "num_used_tokens": used_blocks * config.block_size,
        "max_total_num_tokens": config.pool_tokens,
        "token_usage": round(stats.kv_cache_usage, 4),
        "gen_throughput": round(gen_throughput, 2),
        # since the server started (SGLang's is over its last logging interval)
        "cache_hit_rate": round(stats.prefix_cache_hits / queries, 4) if queries else 0.0,
        "max_running_requests": config.max_num_seqs,
    }


def aggregate(loads: list[dict]) -> dict:
    """The totals and means over the ranks, as SGLang's /v1/loads adds them."""
    n = max(len(loads), 1)
    return {"total_running_reqs": sum(load["num_running_reqs"] for load in loads),
            "total_waiting_reqs": sum(load["num_waiting_reqs"] for load in loads),
            "total_reqs": sum(load["num_total_reqs"] for load in loads),
            "avg_token_usage": round(sum(load["token_usage"] for load in loads) / n, 4),
            "avg_throughput": round(sum(load["gen_throughput"] for load in loads) / n, 2)}


class RouterInfo:
    """The three endpoints over one app.Server (its engine loop, its model name, its authorization)."""

    def __init__(self, server):
        self.server = server
        # gen_throughput: generated tokens per second since the previous /v1/loads (the first: since the start)
        self._last = (now(), server.loop.stats.num_generation_tokens)

    def routes(self, endpoint) -> list[Route]:
        return [Route("/v1/loads", endpoint(self.loads), methods=["GET"]),
                Route("/server_info", endpoint(self.server_info), methods=["GET"]),
                Route("/get_server_info", endpoint(self.server_info), methods=["GET"]),
                Route("/version", endpoint(self.version), methods=["GET"])]

    async def loads(self, request: Request) -> Response:
        """SGLang's /v1/loads: ?include=core,queues,... (checked against SGLang's sections), ?dp_rank=0."""
        self.server.access.operator_only(request)
        include = [s.strip() for s in request.query_params.get("include", "all").split(",") if s.strip()]
        unknown = sorted(set(include) - LOAD_SECTIONS)
        if unknown:
            raise bad_request(f"unknown /v1/loads section(s) {unknown}; the sections are {sorted(LOAD_SECTIONS)}",
                              param="include")
        rank = request.query_params.get("dp_rank")
        if rank not in (None, "0"):
            raise bad_request(f"dp_rank {rank!r} does not exist: this server is one data-parallel rank, 0",
                              param="dp_rank")
        stats = self.server.loop.stats
        clock = now()
        then, tokens_then = self._last
        self._last = (clock, stats.num_generation_tokens)
        rate = (stats.num_generation_tokens - tokens_then) / (clock - then) if clock > then else 0.0
        loads = [load_report(stats, self.server.loop.engine.config, max(rate, 0.0))]
        return JSONResponse({"timestamp": datetime.now(timezone.utc).isoformat(), "version": __version__,
                             "dp_rank_count": 1, "loads": loads, "aggregate": aggregate(loads)})

    async def server_info(self, request: Request) -> Response:
        """SGLang's /server_info (its server arguments, renamed to ours where we have them): what smg stores as
        the worker's labels (model, context length, KV capacity, the running-batch cap)."""
        self.server.access.operator_only(request)
        config: EngineConfig = self.server.loop.engine.config
        name = self.server.config.model_name
        return JSONResponse({
            "model_path": name, "served_model_name": name, "tokenizer_path": name,
            "context_length": config.max_model_len, "max_total_tokens": config.pool_tokens,
            "max_running_requests": config.max_num_seqs, "max_prefill_tokens": config.max_num_batched_tokens,
            "page_size": config.block_size, "schedule_policy": config.policy,
            "dp_size": 1, "is_embedding": False, "disaggregation_mode": "null",
            "version": __version__,
        })

    async def version(self, request: Request) -> Response:
        """vLLM's /version: open to anyone, as /health is."""
        return JSONResponse({"version": __version__})
