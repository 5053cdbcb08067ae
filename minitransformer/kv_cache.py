"""The contiguous KV cache: every layer's keys and values, kept so that a decode step computes only the new token's.

Without it, step n recomputes K and V for all n tokens of the sequence (no_cache.py); with it, each step computes the
new token's K and V once, appends them, and attends to everything stored. The price is memory:

    bytes = 2 (K and V) x layers x batch x kv_heads x tokens x head_dim x bytes per value

which `estimate_kv_bytes` computes and lesson 03_kv_cache_growth prints next to the measured `bytes_used` after every
token. GQA is why kv_heads (3) and not query heads (9) appear there: the cache is 3x smaller than with full heads.

The cache is preallocated for prompt + max_tokens (so appending never reallocates or copies) and shared by a batch of
sequences that all have the same length (same-length prompts decoded in lock step). Ragged batches, where every
sequence has its own length, are the paged cache's job (serving/).
"""

from __future__ import annotations

import numpy as np

from .backend import DTYPE, check_count, check_memory
from .config import ModelConfig
from .errors import InputError


def estimate_kv_bytes(config: ModelConfig, tokens: int, batch: int = 1, dtype=DTYPE) -> int:
    """Bytes of K and V for `tokens` tokens of `batch` sequences: 2 * layers * batch * kv_heads * tokens * head_dim
    * itemsize. Equal to a KVCache's `bytes_used` at that length (tests/test_kv_cache.py checks it)."""
    return 2 * config.n_layers * batch * config.n_kv_heads * tokens * config.head_dim * np.dtype(dtype).itemsize


def check_sizes(config: ModelConfig, max_len, batch, nbytes_of, xp) -> tuple[int, int]:
    """max_len and batch checked as integers within the context, and the cache's bytes (nbytes_of(max_len, batch))
    checked against the memory available, all before anything is allocated. Returns (max_len, batch)."""
    max_len, batch = check_count("max_len", max_len), check_count("batch", batch)
    if not max_len <= config.context_length:
        raise InputError(f"KV cache length must be in [1, {config.context_length}] (the context window), "
                         f"got {max_len}")
    what = f"a KV cache of {max_len} tokens" + (f" x {batch} sequences" if batch > 1 else "")
    check_memory(nbytes_of(max_len, batch), what, xp, "lower max_tokens (or the prompt, or the batch)")
    return max_len, batch


class KVCache:
    """K and V for `batch` sequences, each (layers, batch, kv_heads, max_len, head_dim), filled to `length`.

    The model calls `update(layer, k_new, v_new, positions)` once per layer during a forward pass (the protocol in
    model.py); the new keys land at [length, length + T) and the cache's `length` moves on after the last layer.
    Invariant: positions of the tokens passed in are length, length + 1, ...; prefill.py and decode.py make them so.
    """

    def __init__(self, config: ModelConfig, max_len: int, batch: int = 1, xp=np, dtype=DTYPE):
        max_len, batch = check_sizes(config, max_len, batch,
                                     lambda n, b: estimate_kv_bytes(config, n, b, dtype), xp)
        self.config = config
        self.max_len = max_len
        self.batch = batch
        self.xp = xp
        self.dtype = np.dtype(dtype)
        shape = (config.n_layers, batch, config.n_kv_heads, max_len, config.head_dim)
        self.k = xp.zeros(shape, dtype=dtype)      # (layers, batch, kv_heads, max_len, head_dim)
        self.v = xp.zeros(shape, dtype=dtype)      # (layers, batch, kv_heads, max_len, head_dim)
        self.length = 0                            # tokens stored per sequence
        self.key_positions = xp.broadcast_to(xp.arange(max_len), (batch, max_len))   # (batch, max_len)

    # ------------------------------------------------------------------ the model's hook

    def update(self, layer: int, k_new, v_new, positions):
        """Store this step's keys/values and return everything to attend to.

        k_new, v_new (B, K, T, d) -> k, v (B, K, length + T, d) views into the cache, key positions (B, length + T).
        """
        start, end = self.next_slots(k_new.shape[2])
        self.k[layer, :, :, start:end] = k_new
        self.v[layer, :, :, start:end] = v_new
        if layer == self.config.n_layers - 1:      # the last layer has written: the step is complete
            self.length = end
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end], self.key_positions[:, :end]

    def next_slots(self, T: int) -> tuple[int, int]:
        """[start, end) of the slots T new tokens go to, or the InputError of a released or full cache."""
        if self.k is None:
            raise InputError("this KV cache was released; allocate a new one")
        start, end = self.length, self.length + T
        if end > self.max_len:
            raise InputError(f"KV cache is full: {start} tokens stored + {T} new > {self.max_len} reserved")
        return start, end

    def truncate(self, length: int) -> None:
        """Forget every token from `length` on (speculative decoding rolls back rejected drafts this way).

        Only the length moves: the slots past it are overwritten by the next update, and nothing ever reads them
        (update returns views up to the new end), so rolling back costs no copy.
        """
        if not 0 <= length <= self.length:
            raise InputError(f"cannot truncate a KV cache of {self.length} tokens to {length}; the new length must "
                             f"be in [0, {self.length}]")
        self.length = length

    # ------------------------------------------------------------------ sizes (lesson 03 prints these)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the filled part of K (and of V): (layers, batch, kv_heads, length, head_dim)."""
        c = self.config
        return (c.n_layers, self.batch, c.n_kv_heads, self.length, c.head_dim)

    @property
    def bytes_used(self) -> int:
        """Bytes of K and V holding real tokens."""
        return estimate_kv_bytes(self.config, self.length, self.batch, self.dtype)

    @property
    def bytes_reserved(self) -> int:
        """Bytes allocated up front (max_len tokens); 0 once released."""
        return 0 if self.k is None else int(self.k.nbytes + self.v.nbytes)

    def release(self) -> None:
        """Drop the arrays (a finished or aborted request gives its memory back). The length is kept for reports."""
        self.k = self.v = None
