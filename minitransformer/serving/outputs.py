"""What the engine reports: a RequestOutput per request per step, EngineStats snapshots, a StepRecord per step.

Plain dataclasses, kept apart from engine.py so the loop reads on its own (vLLM keeps RequestOutput in outputs.py
and its stats in metrics/). Lessons 08-10 draw their timelines from StepRecord.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..request import Delta, Result


@dataclass
class RequestOutput:
    """What step() reports for one request: the new text (Delta), and the Result once finished."""
    request_id: str
    delta: Delta
    finished: bool
    result: Result | None = None


@dataclass
class EngineStats:
    """A snapshot with vLLM's metric names (vllm:num_requests_running, vllm:kv_cache_usage_perc, ...)."""
    num_running_reqs: int
    num_waiting_reqs: int
    kv_cache_usage: float            # fraction of blocks in use, 0..1
    num_preemptions: int
    prefix_cache_queries: int        # tokens looked up in the prefix cache
    prefix_cache_hits: int           # of which found
    num_steps: int
    num_prompt_tokens: int           # tokens prefilled (unlike vLLM's prompt_tokens_total, recomputation after a
                                     # preemption counts again, outputs included, and prefix-cache hits do not)
    num_generation_tokens: int       # tokens sampled
    num_free_blocks: int
    num_blocks: int


@dataclass
class StepRecord:
    """One step, for timelines: who ran, how many tokens of each kind, how long it took."""
    step: int
    request_ids: list[str]
    num_prefill_tokens: int
    num_decode_tokens: int
    num_batched_tokens: int
    duration_s: float
    kv_cache_usage: float            # after the step
    num_waiting: int                 # after the step
    num_running: int
    preempted: list[str]
    start_s: float                   # on metrics.now()'s clock
