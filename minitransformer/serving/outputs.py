"""What the engine reports, its read API: a RequestOutput per request per step, EngineStats and EngineSnapshot, a
StepRecord per step.

Plain dataclasses, kept apart from engine.py so the loop reads on its own (vLLM keeps RequestOutput in outputs.py
and its stats in metrics/). Whatever sits above the engine (the HTTP server, the CLI, the figures) reads the engine
through these and nothing else: a snapshot is plain values, so it stays true while the engine goes on stepping.
Lessons 08-10 draw their timelines from StepRecord.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.request import Delta, Result
from .block_manager import BlockState


@dataclass
class RequestOutput:
    """What step() reports for one request: its id, and the Delta (new tokens, text, logprob entries; the Result
    once finished). The step's outputs are a list, so the id says whose Delta each one is."""
    request_id: str
    delta: Delta

    @property
    def finished(self) -> bool:
        return self.delta.finish_reason is not None

    @property
    def result(self) -> Result | None:
        return self.delta.result


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
    num_masks: int = 0               # structured-output masks computed so far, running requests' included
    mask_s: float = 0.0              # ... and the seconds they took (the engine thread's, computing them)


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


@dataclass(frozen=True)
class EngineConfig:
    """The engine's fixed sizes: what a server may accept and what the live page draws."""
    num_blocks: int                  # the KV pool, in blocks of block_size tokens
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    policy: str                      # "continuous" | "static" | "priority"
    max_model_len: int
    kv_pool_bytes: int               # K and V of num_blocks x block_size tokens

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class SequenceView:
    """One request as the engine holds it, copied out: its place in the queues, its tokens and its block table."""
    request_id: str
    tenant: str | None
    status: str                      # a SequenceStatus value: "waiting" | "running" | "preempted" | "finished"
    num_prompt_tokens: int
    num_output_tokens: int
    num_computed_tokens: int         # tokens whose K and V are in the cache
    max_tokens: int
    num_preemptions: int
    block_table: tuple[int, ...]     # physical block of each logical block (empty once finished)
    ttft_s: float | None
    itl_s: float | None              # mean inter-token latency so far
    finish_reason: str | None = None

    @classmethod
    def of(cls, seq, block_table) -> SequenceView:
        """The view of a serving.Sequence now (block_table: its list in the block manager, or () once freed)."""
        times = seq.metrics.token_times
        mean_itl = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None   # no pass over the gaps
        return cls(seq.request_id, seq.tenant, seq.status.value, seq.num_prompt_tokens, seq.num_output_tokens,
                   seq.num_computed_tokens, seq.params.max_tokens, seq.num_preemptions, tuple(block_table),
                   seq.metrics.ttft_s, mean_itl, seq.decision.finish_reason if seq.decision else None)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens


@dataclass(frozen=True)
class EngineSnapshot:
    """The engine between two steps (Engine.snapshot()): the queues, every block's state and reference count, and
    the requests that finished lately. Build it only where the engine is stepped (its thread), then hand it on."""
    step: int                                   # steps run so far
    config: EngineConfig
    stats: EngineStats
    running: tuple[SequenceView, ...]           # in admission order
    waiting: tuple[SequenceView, ...]           # in queue order (the preempted ones included)
    blocks: tuple[BlockState, ...]              # (num_blocks,)
    ref_counts: tuple[int, ...]                 # (num_blocks,) block tables holding each block
    finished: tuple[SequenceView, ...]          # the latest first, at most Engine's FINISHED_KEPT
