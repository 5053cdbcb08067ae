"""Stage: metrics — when each thing happened to a request, and the serving numbers derived from those times.

Definitions follow vLLM's, all from one monotonic clock:

    queue   = scheduled - arrival          time waiting before any model work
    prefill = first token - scheduled      the prompt's forward pass and the first sample
    TTFT    = first token - arrival        what a user waits before text starts to appear
    ITL     = gaps between consecutive tokens (mean, p50, p90, p99)
    TPOT    = (e2e - TTFT) / (n_out - 1)    mean time per output token after the first
    decode tokens/s = (n_out - 1) / (e2e - TTFT)
    e2e     = finished - arrival

Lesson 07_latency_metrics_and_levers prints these for a live request; `--json` carries them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np


def now() -> float:
    """The one clock every timestamp and timing of the package comes from (monotonic: immune to wall-clock
    changes); lab/measure.py's repeated timings read it too."""
    return time.perf_counter()


def cpu_now() -> float:
    """The calling thread's CPU time, seconds: for a budget that must not depend on what else the machine runs
    (a structured-output mask's, structured/constraint.py); a timing someone reads comes from now()."""
    return time.thread_time()


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0-100) of `values`, linear between the closest ranks (NumPy's default, and vLLM's
    benchmark's); None when there is nothing to rank. The one percentile of the package: the ITL summary below, the
    benchmarks' TTFT and ITL tails, lab/measure.Timing's median (q = 50)."""
    return float(np.percentile(values, q)) if len(values) else None


@dataclass
class Usage:
    """Token counts, as an OpenAI-style API reports them."""
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens}


@dataclass
class RequestMetrics:
    """Timestamps of one request's life; every derived number is a property (None when it is not defined yet)."""
    arrival_time: float
    scheduled_time: float | None = None
    token_times: list[float] = field(default_factory=list)     # when each output token was ready
    finished_time: float | None = None

    def mark_scheduled(self) -> None:
        self.scheduled_time = now()

    def mark_token(self) -> None:
        self.token_times.append(now())

    def mark_finished(self) -> None:
        self.finished_time = now()

    # ------------------------------------------------------------------ derived (vLLM's definitions)

    @property
    def queue_s(self) -> float | None:
        return None if self.scheduled_time is None else self.scheduled_time - self.arrival_time

    @property
    def prefill_s(self) -> float | None:
        if self.scheduled_time is None or not self.token_times:
            return None
        return self.token_times[0] - self.scheduled_time

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: one gap per output token after the first."""
        return list(np.diff(self.token_times)) if len(self.token_times) > 1 else []

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def tpot_s(self) -> float | None:
        n, e2e, ttft = len(self.token_times), self.e2e_s, self.ttft_s
        if n < 2 or e2e is None or ttft is None:
            return None
        return (e2e - ttft) / (n - 1)

    @property
    def decode_tokens_per_s(self) -> float | None:
        tpot = self.tpot_s
        return None if not tpot else 1.0 / tpot

    def itl_summary(self) -> dict[str, float | None]:
        """mean, p50, p90, p99 of the inter-token latencies (None each when there are fewer than 2 tokens)."""
        gaps = self.itl_s
        return {"mean": float(np.mean(gaps)) if gaps else None,
                "p50": percentile(gaps, 50), "p90": percentile(gaps, 90), "p99": percentile(gaps, 99)}

    def to_dict(self) -> dict:
        """The `metrics` object of `generate --json` (Result.to_dict)."""
        return {"queue_s": self.queue_s, "prefill_s": self.prefill_s, "ttft_s": self.ttft_s,
                "itl_s": self.itl_summary(), "tpot_s": self.tpot_s,
                "decode_tokens_per_s": self.decode_tokens_per_s, "e2e_s": self.e2e_s}
