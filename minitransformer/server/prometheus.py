"""`GET /metrics`: the server's numbers in Prometheus' text format, under vLLM's metric names.

Dashboards and alerts written for vLLM read these unchanged (names from vLLM's production-metrics docs):

    vllm:num_requests_running / vllm:num_requests_waiting    gauges: the scheduler's queues after the last step
    vllm:kv_cache_usage_perc                                 gauge: fraction of KV blocks in use (1 = full)
    vllm:prompt_tokens_total / vllm:generation_tokens_total  counters: tokens prefilled / sampled
    vllm:num_preemptions_total, vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total
    vllm:request_success_total{finished_reason}              counter: finished requests by finish reason
    vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds, vllm:request_queue_time_seconds,
    vllm:request_prefill_time_seconds, vllm:request_decode_time_seconds, vllm:e2e_request_latency_seconds,
    vllm:request_prompt_tokens, vllm:request_generation_tokens    histograms, observed when a request finishes

and, in our own namespace, what structured output costs (vLLM exports no metric for it: its grammar bitmask is
timed nowhere on /metrics, so no dashboard has a name to expect; `minitransformer:` keeps ours from ever colliding
with one vLLM adds later):

    minitransformer:structured_output_requests_total{type,complete}   counter: constrained requests finished, by
                                                                      kind and whether the output completed it
    minitransformer:structured_output_masks_total                     counter: masks computed (one per token), as
                                                                      they are computed (the engine's count)
    minitransformer:structured_output_mask_seconds_total              counter: time computing them; the ratio of
                                                                      the two rates is the mean cost per token
    minitransformer:structured_output_mask_seconds_per_token          histogram: one request's mean mask time

and, under `serve --disaggregated` (parallel/kv_connector.py), the KV transfers from the prefill process, named
after vLLM's NIXL-connector metrics (vllm:nixl_xfer_time_seconds, vllm:nixl_bytes_transferred; vLLM names them after
the connector, ours is MPI) in our namespace:

    minitransformer:mpi_xfer_time_seconds / minitransformer:mpi_bytes_transferred   histograms, one per transfer
    minitransformer:kv_transfers_in_flight        gauge: requests at the prefill process or on their way back
    minitransformer:kv_transfers_discarded_total  counter: transfers that arrived for a request aborted meanwhile
    minitransformer:prefill_kv_cache_usage_perc   gauge: the prefill process's KV pool, as it last reported it

The text format itself is simple enough to write out (`# HELP`, `# TYPE`, one sample per line; a histogram is its
cumulative `_bucket{le=...}` counts plus `_sum` and `_count`), so it is written here rather than through a client
library. Timings come from the request's own RequestMetrics (metrics.py), the same numbers `--json` prints.
"""

from __future__ import annotations

import bisect
import threading

from ..core.request import Result
from ..serving import EngineStats
from ..serving.kv_transfer import TransferStats

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
# A mask costs tens of microseconds for a simple regex to milliseconds for a deep schema (llguidance's Earley parser
# walks the vocabulary's token trie): buckets from 10 us to 100 ms.
# A transfer through shared memory here takes ~0.1 ms per MB; over a network, milliseconds to a second.
TRANSFER_SECONDS_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)
TRANSFER_BYTES_BUCKETS = tuple(2 ** k for k in range(16, 32, 2))        # 64 KiB .. 1 GiB, by powers of 4
MASK_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)


class Histogram:
    """Counts per bucket (upper bounds `le`), the sum and the count, as Prometheus keeps them."""

    def __init__(self, name: str, help: str, buckets: tuple):
        self.name, self.help, self.buckets = name, help, buckets
        self.counts = [0] * (len(buckets) + 1)               # the last one is +Inf
        self.sum, self.count = 0.0, 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, labels: str) -> list[str]:
        out, cumulative = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"], 0
        for bound, count in zip((*map(_number, self.buckets), "+Inf"), self.counts):
            cumulative += count
            out.append(f'{self.name}_bucket{{{labels},le="{bound}"}} {cumulative}')
        out += [f"{self.name}_sum{{{labels}}} {_number(self.sum)}", f"{self.name}_count{{{labels}}} {self.count}"]
        return out


# The names other code reads back off /metrics (bench/router_workload.py, bench/interference.py), written once here.
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits_total"
PREFILL_TIME = "vllm:request_prefill_time_seconds"
TRANSFER_TIME = "minitransformer:mpi_xfer_time_seconds"
TRANSFER_BYTES = "minitransformer:mpi_bytes_transferred"


class ServerMetrics:
    """The histograms and finish counters; written by the engine thread, read by /metrics (hence the lock)."""

    def __init__(self, model_name: str):
        self.labels = f'model_name="{_escape(model_name)}"'
        self.lock = threading.Lock()
        self.finished: dict[str, int] = {}
        seconds = lambda name, help: Histogram(name, help, LATENCY_BUCKETS)
        self.ttft = seconds("vllm:time_to_first_token_seconds", "Time to first token in seconds.")
        self.itl = seconds("vllm:inter_token_latency_seconds", "Time between consecutive output tokens in seconds.")
        self.queue = seconds("vllm:request_queue_time_seconds", "Time a request waited before its first schedule.")
        self.prefill = seconds(PREFILL_TIME, "Time from first schedule to first token.")
        self.decode = seconds("vllm:request_decode_time_seconds", "Time from first token to the last.")
        self.e2e = seconds("vllm:e2e_request_latency_seconds", "Arrival to finish in seconds.")
        self.prompt_tokens = Histogram("vllm:request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.generation_tokens = Histogram("vllm:request_generation_tokens", "Generated tokens per request.",
                                           TOKEN_BUCKETS)
        self.transfers: TransferStats | None = None                # set under --disaggregated
        self.transfer_time = Histogram(TRANSFER_TIME,
                                       "Seconds per KV transfer from the prefill process.", TRANSFER_SECONDS_BUCKETS)
        self.transfer_bytes = Histogram(TRANSFER_BYTES,
                                        "Bytes per KV transfer from the prefill process.", TRANSFER_BYTES_BUCKETS)
        self.structured: dict[tuple[str, bool], int] = {}        # (kind, complete) -> requests
        self.mask_per_token = Histogram("minitransformer:structured_output_mask_seconds_per_token",
                                        "Mean time per token computing a request's structured-output mask.",
                                        MASK_BUCKETS)

    def observe_transfers(self, stats: TransferStats | None) -> None:
        """Engine.take_kv_transfer_stats() after a step (None: not disaggregated): each new transfer observed."""
        if stats is None:
            return
        with self.lock:
            for nbytes, seconds in stats.last:
                self.transfer_time.observe(seconds)
                self.transfer_bytes.observe(nbytes)
            self.transfers = stats

    def observe_finished(self, result: Result, finish_reason: str) -> None:
        m = result.metrics
        with self.lock:
            self.finished[finish_reason] = self.finished.get(finish_reason, 0) + 1
            for histogram, value in ((self.ttft, m.ttft_s), (self.queue, m.queue_s), (self.prefill, m.prefill_s),
                                     (self.e2e, m.e2e_s)):
                if value is not None:
                    histogram.observe(value)
            if m.ttft_s is not None and m.e2e_s is not None:
                self.decode.observe(m.e2e_s - m.ttft_s)
            for gap in m.itl_s:
                self.itl.observe(float(gap))
            self.prompt_tokens.observe(result.usage.prompt_tokens)
            self.generation_tokens.observe(result.usage.completion_tokens)
            if result.structured is not None:
                self._observe_structured(result.structured)

    def _observe_structured(self, summary: dict) -> None:
        """Result.structured (structured.Constraint.summary) of a finished request; the caller holds the lock."""
        key = (summary["type"], bool(summary["complete"]))
        self.structured[key] = self.structured.get(key, 0) + 1
        if summary["mask_s_per_token"] is not None:
            self.mask_per_token.observe(summary["mask_s_per_token"])

    def render(self, stats: EngineStats) -> str:
        """The whole /metrics page."""
        labels = self.labels

        def sample(kind: str, name: str, help: str, value) -> list[str]:
            return [f"# HELP {name} {help}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {_number(value)}"]

        lines = [
            *sample("gauge", "vllm:num_requests_running", "Requests in the running batch.", stats.num_running_reqs),
            *sample("gauge", "vllm:num_requests_waiting", "Requests waiting to be scheduled.", stats.num_waiting_reqs),
            *sample("gauge", "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    stats.kv_cache_usage),
            *sample("counter", "vllm:prompt_tokens_total", "Prefill tokens processed.", stats.num_prompt_tokens),
            *sample("counter", "vllm:generation_tokens_total", "Generation tokens processed.",
                    stats.num_generation_tokens),
            *sample("counter", "vllm:num_preemptions_total", "Cumulative preemptions.", stats.num_preemptions),
            *sample("counter", PREFIX_CACHE_QUERIES, "Prompt tokens looked up in the prefix cache.",
                    stats.prefix_cache_queries),
            *sample("counter", PREFIX_CACHE_HITS, "Prompt tokens found in the prefix cache.",
                    stats.prefix_cache_hits),
        ]
        with self.lock:
            lines += ["# HELP vllm:request_success_total Finished requests, by finish reason.",
                      "# TYPE vllm:request_success_total counter"]
            lines += [f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {count}'
                      for reason, count in sorted(self.finished.items())]
            for histogram in (self.ttft, self.itl, self.queue, self.prefill, self.decode, self.e2e,
                              self.prompt_tokens, self.generation_tokens):
                lines += histogram.lines(labels)
            lines += self._structured_lines(sample, stats)
            lines += self._transfer_lines(sample)
        return "\n".join(lines) + "\n"

    def _structured_lines(self, sample, stats: EngineStats) -> list[str]:
        """The structured-output families (see the module docstring); the caller holds the lock. The mask counters
        are the engine's, running requests' masks included, so they move while a costly constraint runs."""
        name = "minitransformer:structured_output_requests_total"
        lines = [f"# HELP {name} Finished requests with a structured-output constraint, by kind and completion.",
                 f"# TYPE {name} counter"]
        lines += [f'{name}{{{self.labels},type="{kind}",complete="{str(complete).lower()}"}} {count}'
                  for (kind, complete), count in sorted(self.structured.items())]
        return [*lines,
                *sample("counter", "minitransformer:structured_output_masks_total",
                        "Structured-output masks computed (one per generated token).", stats.num_masks),
                *sample("counter", "minitransformer:structured_output_mask_seconds_total",
                        "Seconds spent computing structured-output masks.", stats.mask_s),
                *self.mask_per_token.lines(self.labels)]


    def _transfer_lines(self, sample) -> list[str]:
        """The KV-transfer families (module docstring), only when disaggregated; the caller holds the lock."""
        stats = self.transfers
        if stats is None:
            return []
        lines = [*self.transfer_time.lines(self.labels), *self.transfer_bytes.lines(self.labels),
                 *sample("gauge", "minitransformer:kv_transfers_in_flight",
                         "Requests at the prefill process or on their way back.", stats.in_flight),
                 *sample("counter", "minitransformer:kv_transfers_discarded_total",
                         "KV transfers that arrived for a request aborted meanwhile.", stats.discarded)]
        if stats.producer_num_blocks:
            lines += sample("gauge", "minitransformer:prefill_kv_cache_usage_perc",
                            "The prefill process's KV-cache usage. 1 means 100 percent usage.",
                            (stats.producer_blocks_used or 0) / stats.producer_num_blocks)
        return lines


def _number(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
