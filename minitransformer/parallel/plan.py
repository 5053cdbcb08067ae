"""Which part of the model each rank holds: Megatron-style tensor parallelism over heads and FFN columns.

One decoder layer, split over N ranks (model.LAYER_WEIGHTS says which matrix splits which way):

    x (T, D), the same on every rank
      -> x @ w_qkv[:, this rank's q heads | its KV heads | its KV heads]   column-parallel: whole heads per rank
      -> attention over those heads only (a head never needs another head's numbers)
      -> out (T, H/N * d) @ wo[this rank's rows]                            row-parallel: a partial (T, D)
      -> all-reduce (sum)                                                   every rank has the full (T, D)
      -> x @ w_gate_up[:, this rank's F/N gate | F/N up columns]            column-parallel
      -> silu(gate) * up (T, F/N) @ w_down[this rank's F/N rows]            row-parallel: a partial (T, D)
      -> all-reduce (sum)

Two all-reduces of T x D float32 per layer and nothing else: each column-parallel product feeds its row-parallel
partner without any exchange, because the nonlinearity between them (attention per head, silu(gate) * up per
column) never mixes the split dimension.

The embedding and the lm_head are replicated: every rank holds the whole (V, D) table and looks its rows up, and
rank 0 alone computes logits from the full hidden state the last all-reduce leaves everywhere. The alternative,
vocab-parallel (Megatron's VocabParallelEmbedding, vLLM's): each rank holds V/N rows; the lookup is masked and
all-reduced, the lm_head gives each rank V/N logits, and a gather assembles them (for SmolLM2, 49,152 x 576 float32
= 113 MB per rank that replication spends to save one collective per step and a gather of V logits per token).

KV heads are handed out as vLLM does: with N <= K each rank takes K/N of them (N must divide K); with N > K each KV
head is replicated N/K times (K must divide N), so every rank still holds the one KV head its query heads read.
Query heads and FFN columns must divide by N. Anything else is refused before a process starts, with the numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.config import ModelConfig
from ..core.errors import InputError


def check_tensor_parallel_size(config: ModelConfig, size: int) -> None:
    """Refuse a size the model's heads or FFN cannot be split into, naming the model's numbers."""
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"--tensor-parallel-size must be a whole number >= 1, got {size!r}")
    H, K, F = config.n_heads, config.n_kv_heads, config.ffn_dim
    sizes = f"{config.name} has {H} query heads, {K} KV heads and FFN {F}"
    works = ", ".join(str(n) for n in supported_sizes(config))
    if H % size:
        raise InputError(f"--tensor-parallel-size {size} cannot split the query heads: {sizes}; query heads must "
                         f"divide evenly among the ranks (sizes that work: {works})")
    if K % size and size % K:
        raise InputError(f"--tensor-parallel-size {size} cannot split the KV heads: {sizes}; the KV heads must "
                         f"divide among the ranks, or the ranks among the KV heads (sizes that work: {works})")
    if F % size:
        raise InputError(f"--tensor-parallel-size {size} cannot split the feed-forward: {sizes}; FFN {F} is not "
                         f"divisible by {size} (sizes that work: {works})")


def supported_sizes(config: ModelConfig) -> list[int]:
    """Every size that splits the query heads, the KV heads (or replicates them) and the FFN: [1, 3] for SmolLM2."""
    H, K, F = config.n_heads, config.n_kv_heads, config.ffn_dim
    return [n for n in range(1, H + 1) if H % n == 0 and (K % n == 0 or n % K == 0) and F % n == 0]


@dataclass(frozen=True)
class ShardPlan:
    """Rank `rank` of `world_size`: which query heads, KV heads and FFN columns it holds, and the config its
    forward runs with (the same model, with H/N query heads, its KV heads and F/N FFN columns)."""
    config: ModelConfig          # the whole model's
    world_size: int
    rank: int
    comm: Any = field(default=None, compare=False, repr=False)   # the all-reduce this rank's forward calls

    @classmethod
    def hook(cls, comm) -> Callable[[ModelConfig], ShardPlan]:
        """core.loading.load_model's shard hook for this process of `comm`'s world: the plan of its rank, made when
        the loader has read the whole model's config."""
        return lambda config: cls(config, comm.world_size, comm.rank, comm)

    def __post_init__(self):
        check_tensor_parallel_size(self.config, self.world_size)
        if not 0 <= self.rank < self.world_size:
            raise InputError(f"rank {self.rank} is outside [0, {self.world_size})")

    @property
    def kv_replicas(self) -> int:
        """How many ranks hold each KV head: 1 when the KV heads divide among the ranks, N/K when they cannot."""
        return max(1, self.world_size // self.config.n_kv_heads)

    @property
    def local_kv_heads(self) -> int:
        return max(1, self.config.n_kv_heads // self.world_size)

    @property
    def first_kv_head(self) -> int:
        return self.rank // self.kv_replicas * self.local_kv_heads

    def shard_config(self) -> ModelConfig:
        """The config this rank's forward and KV cache use: its share of the heads and of the FFN."""
        c = self.config
        return dataclasses.replace(c, n_heads=c.n_heads // self.world_size, n_kv_heads=self.local_kv_heads,
                                   ffn_dim=c.ffn_dim // self.world_size)

    def span(self, size: str) -> slice:
        """This rank's part of a split dimension, named as LAYER_WEIGHTS names it ("q_dim", "kv_dim", "ffn_dim"),
        in elements of the whole model's dimension."""
        c, local = self.config, self.shard_config()
        if size == "kv_dim":
            start = self.first_kv_head * c.head_dim
        elif size in ("q_dim", "ffn_dim"):
            start = self.rank * getattr(local, size)
        else:
            raise ValueError(f"{size} is not a dimension tensor parallelism splits")
        return slice(start, start + getattr(local, size))
