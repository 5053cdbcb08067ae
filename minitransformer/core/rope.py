"""The RoPE table: cos and sin of every rotation angle, precomputed for the positions in use (layers.rope_table),
and the model's pairing of dimensions (ModelConfig.rope_pairing, from its architecture) that layers.apply_rope
rotates with them.

It covers what is used, not the context the model file declares: a GGUF may declare billions of positions, tens of
GiB of table. At load it covers ROPE_TABLE_POSITIONS (or the whole context, if shorter, as for the default model);
a longer sequence grows it, at least doubling, so a long generation rebuilds it only a few times. generate() and the
Engine reserve a request's whole length before any work, so a table that cannot fit is refused then, in one line;
Transformer.forward grows it for host positions past its end, whoever calls it.
"""

from __future__ import annotations

import numpy as np

from .backend import check_memory
from .config import ModelConfig
from .errors import InputError
from .layers import rope_table

ROPE_TABLE_POSITIONS = 8192     # positions covered at load (fewer if the context is shorter)


class RopeTable:
    """cos, sin: (positions, head_dim / 2) float32 each, on the model's device; row p rotates position p.
    base: RoPE theta (the config's rope_base unless given: Gemma 3's sliding layers use rope_base_local).
    pairing: which dimensions each angle rotates together, "interleaved" or "neox" (layers.apply_rope).
    Llama 3's frequency factors (config.rope_freq_factors) are in the angles, so the forward never sees them."""

    def __init__(self, config: ModelConfig, xp, base: float | None = None):
        self.config, self.xp = config, xp
        self.base = config.rope_base if base is None else base     # Gemma 3's sliding layers have their own
        self.pairing = config.rope_pairing
        self.cos = self.sin = None
        self.positions = 0
        self.reserve(min(config.context_length, ROPE_TABLE_POSITIONS))

    def reserve(self, n: int) -> None:
        """Cover positions [0, n), checking the memory of a larger table before building it."""
        if n <= self.positions:
            return
        context = self.config.context_length
        if n > context:
            raise InputError(f"position {n - 1} is outside the context window [0, {context})")
        n = min(context, max(n, 2 * self.positions))
        half = self.config.head_dim // 2
        what, hint = f"the RoPE table for {n} positions", "ask for fewer tokens (prompt + max_tokens, max_model_len)"
        # built on the host: float64 angles and one float64 cos or sin at a time, kept as two float32 tables
        check_memory(n * half * (8 + 8 + 4 + 4), what, np, hint)
        if self.xp is not np:
            check_memory(n * half * 2 * 4, what, self.xp, hint)
        cos, sin = rope_table(n, self.config.head_dim, self.base, self.config.rope_freq_factors)
        self.cos, self.sin = self.xp.asarray(cos), self.xp.asarray(sin)      # (n, d/2) each
        self.positions = n
