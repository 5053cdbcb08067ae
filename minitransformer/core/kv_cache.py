"""The contiguous KV cache: every layer's keys and values, kept so that a decode step computes only the new token's.

Without it, step n recomputes K and V for all n tokens of the sequence (no_cache.py); with it, each step computes the
new token's K and V once, appends them, and attends to everything stored. The price is memory:

    bytes = 2 (K and V) x layers x batch x kv_heads x tokens x head_dim x bytes per value

which `estimate_kv_bytes` computes and lesson 03_kv_cache_growth prints next to the measured `bytes_used` after every
token. GQA is why kv_heads (3) and not query heads (9) appear there: the cache is 3x smaller than with full heads.

The cache is preallocated for prompt + max_tokens (so appending never reallocates or copies) and shared by a batch of
sequences that all have the same length (same-length prompts decoded in lock step). Ragged batches, where every
sequence has its own length, are the paged cache's job (serving/paged_cache.py). Both caches speak the protocol the
model's forward uses (attention.ForwardCache), both store by any codec of kv_storage.CODECS (float32, int8), and both
keep one axis order, tokens before heads: (..., tokens, kv_heads, head_dim), the layout the decode kernel reads
(kernels/paged_decode.cu), so a kernel reads this cache in place as blocks (BlockView). Attention's arrays want
(B, kv_heads, tokens, head_dim): a transposed view of the same memory, made in `attend`, never a copy.
"""

from __future__ import annotations

import math

import numpy as np

from .attention import AttentionBackend
from .backend import DTYPE, check_count, check_memory
from .config import ModelConfig
from .errors import InputError
from .kv_storage import KVStorage, check_storage


def kv_bytes_per_token(config: ModelConfig, storage: str = "f32", dtype=DTYPE) -> int:
    """Bytes of one token's keys and values in every layer: 2 (K and V) x layers x kv_heads x the bytes of one
    (token, head) vector in `storage` (kv_storage.CODECS: head_dim values at `dtype` for f32; head_dim int8 values
    and a 4-byte scale for int8). The one KV-bytes formula: the caches, the engine, bench/ and the lessons count
    through it."""
    per_vector = check_storage(storage).bytes_per_vector(config.head_dim, dtype)
    return 2 * config.n_layers * config.n_kv_heads * per_vector


def estimate_kv_bytes(config: ModelConfig, tokens: int, batch: int = 1, dtype=DTYPE, storage: str = "f32") -> int:
    """Bytes of K and V for `tokens` tokens of `batch` sequences: batch x tokens x kv_bytes_per_token. Equal to a
    cache's `bytes_used` at that length (tests/test_kv_cache.py checks it)."""
    return batch * tokens * kv_bytes_per_token(config, storage, dtype)


def estimate_kv_bytes_windowed(config: ModelConfig, tokens: int, batch: int = 1, dtype=DTYPE,
                               storage: str = "f32") -> int:
    """Bytes of K and V a cache needs for `tokens` tokens when each sliding layer (config.sliding_layers, Gemma 3's
    local layers) keeps only its last `sliding_window` keys: a global layer keeps every token, a sliding one
    min(tokens, window). Equal to estimate_kv_bytes for a model without sliding layers.

    The contiguous KVCache here keeps every key of every layer and masks the old ones (attention.py's
    SlidingWindowAttention); this is what a cache that drops them holds, as llama.cpp's sliding-window cache
    (src/llama-kv-cache-iswa.cpp) and vLLM's hybrid allocator (SlidingWindowSpec in vllm/v1/kv_cache_interface.py)
    do. Lesson 17_model_shape prints both and shows that the keys it drops change no logit."""
    per_layer_token = kv_bytes_per_token(config, storage, dtype) // config.n_layers     # K and V of one layer
    sliding = len(config.sliding_layers) if config.sliding_window else 0
    kept = (config.n_layers - sliding) * tokens + sliding * min(tokens, config.sliding_window)
    return batch * per_layer_token * kept


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
    """K and V for `batch` sequences, each (layers, batch, max_len, kv_heads, head_dim), filled to `length`.

    The model's protocol (attention.ForwardCache): `attend(layer, q, k, v, positions, attention)` once per layer of a
    forward pass stores the new keys at [length, length + T) and attends to [0, length + T); `advance(T)` after the
    pass moves `length` on. Invariant: the T tokens passed in sit at positions length, length + 1, ... (prefill.py
    and decode.py make them so). storage: a codec name of kv_storage.CODECS ("f32", "int8"); attention sees float32
    either way.
    """

    def __init__(self, config: ModelConfig, max_len: int, batch: int = 1, xp=np, dtype=DTYPE, storage: str = "f32"):
        check_storage(storage)
        max_len, batch = check_sizes(config, max_len, batch,
                                     lambda n, b: estimate_kv_bytes(config, n, b, dtype, storage), xp)
        self.config, self.max_len, self.batch, self.xp = config, max_len, batch, xp
        shape = (config.n_layers, batch, max_len, config.n_kv_heads, config.head_dim)
        # k, v (layers, batch, max_len, kv_heads, head_dim); None once released
        self.store: KVStorage | None = KVStorage(shape, storage, xp, dtype)
        self.storage, self.codec = storage, self.store.codec    # the codec's name, the codec (kv_storage.CODECS)
        self.dtype = self.store.dtype                          # dtype of the stored values (int8 for "int8")
        self.length = 0                                     # tokens stored per sequence
        self.key_positions = xp.broadcast_to(xp.arange(max_len), (batch, max_len))   # (batch, max_len)

    k = property(lambda self: None if self.store is None else self.store.k)
    v = property(lambda self: None if self.store is None else self.store.v)

    # ------------------------------------------------------------------ the model's protocol

    def attend(self, layer: int, q, k_new, v_new, positions, attention: AttentionBackend):
        """Store this step's keys/values of `layer` and attend to everything stored.

        q (B, H, T, d), k_new, v_new (B, K, T, d) -> (B, H, T, d), through `attention` (the model's choice of
        arrays or kernels, attention.py) on the float32 keys [0, length + T).
        """
        T = k_new.shape[2]
        start, end = self.next_slots(T)                                           # raises if released
        store: KVStorage = self.store                                             # type: ignore[assignment]
        store.put(layer, (slice(None), slice(start, end)), k_new.transpose(0, 2, 1, 3), v_new.transpose(0, 2, 1, 3))
        if T == 1 and attention.reads_pool(self.codec):      # a kernel reads the cache in place, as blocks
            view = BlockView(self)
            return attention.paged_decode(view, layer, q[:, :, 0], positions[:, 0], *view.tables(end))[:, :, None]
        k, v = store.get(layer, (slice(None), slice(0, end)))                    # (B, end, K, d) each
        return attention.causal(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), positions,
                                self.key_positions[:, :end])

    def advance(self, T: int) -> None:
        """A forward pass has stored T more tokens (in the layers it ran)."""
        self.length = self.next_slots(T)[1]

    def next_slots(self, T: int) -> tuple[int, int]:
        """[start, end) of the slots T new tokens go to, or the InputError of a released or full cache."""
        if self.store is None:
            raise InputError("this KV cache was released; allocate a new one")
        start, end = self.length, self.length + T
        if end > self.max_len:
            raise InputError(f"KV cache is full: {start} tokens stored + {T} new > {self.max_len} reserved")
        return start, end

    def truncate(self, length: int) -> None:
        """Forget every token from `length` on (speculative decoding rolls back rejected drafts this way).

        Only the length moves: the slots past it are overwritten by the next pass, and nothing ever reads them
        (attend reads up to the new end), so rolling back costs no copy.
        """
        if not 0 <= length <= self.length:
            raise InputError(f"cannot truncate a KV cache of {self.length} tokens to {length}; the new length must "
                             f"be in [0, {self.length}]")
        self.length = length

    # ------------------------------------------------------------------ sizes (lesson 03 prints these)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the filled part of K (and of V): (layers, batch, length, kv_heads, head_dim)."""
        c = self.config
        return (c.n_layers, self.batch, self.length, c.n_kv_heads, c.head_dim)

    @property
    def bytes_used(self) -> int:
        """Bytes of K and V holding real tokens (scales included for int8)."""
        return estimate_kv_bytes(self.config, self.length, self.batch, self.dtype, self.storage)

    @property
    def bytes_reserved(self) -> int:
        """Bytes allocated up front (max_len tokens); 0 once released."""
        return 0 if self.store is None else self.store.nbytes

    def release(self) -> None:
        """Drop the arrays (a finished or aborted request gives its memory back). The length is kept for reports."""
        self.store = None


class BlockView:
    """A KVCache seen as a paged pool (attention.PagedPool), for an attention that reads pools in place.

    Both caches store tokens before heads, so the cache's (batch, max_len, K, d) keys of one layer are, unchanged,
    batch * max_len / bs blocks of bs tokens: sequence b owns blocks [b * nb, (b + 1) * nb), nb = max_len / bs,
    and its block table is just those ids in order. bs is the largest power of two up to MAX_BLOCK that divides
    max_len, so the blocks tile the memory exactly (no copy, no reshaping of the cache).
    """
    MAX_BLOCK = 16

    def __init__(self, cache: KVCache):
        store = cache.store
        assert store is not None, "attend checked that the cache is not released"
        self.xp, self.codec = cache.xp, cache.codec
        self.block_size = bs = math.gcd(cache.max_len, self.MAX_BLOCK)     # a power of two: MAX_BLOCK is one
        self.blocks_per_sequence = cache.max_len // bs
        shape = (store.k.shape[0], cache.batch * self.blocks_per_sequence, bs, *store.k.shape[3:])
        self.k, self.v = store.k.reshape(shape), store.v.reshape(shape)   # (layers, blocks, bs, K, d): views
        self.batch = cache.batch

    def tables(self, num_keys: int):
        """(seq_lens (B,) int32, block tables (B, nb) int32) for every sequence holding num_keys keys."""
        xp, nb = self.xp, -(-num_keys // self.block_size)
        first = xp.arange(self.batch, dtype=np.int32)[:, None] * self.blocks_per_sequence         # (B, 1)
        return xp.full((self.batch,), num_keys, dtype=np.int32), first + xp.arange(nb, dtype=np.int32)[None]

    def gather(self, layer: int, block_tables):
        """block_tables (R, nb) -> k, v (R, K, nb * bs, d), as the engine's pool gathers (the codec is raw: a
        BlockView is made only for an attention that reads the pool in place, which needs raw floats)."""
        R, nb = block_tables.shape
        S, K, d = nb * self.block_size, self.k.shape[3], self.k.shape[4]
        k, v = self.k[layer][block_tables], self.v[layer][block_tables]            # (R, nb, bs, K, d) each
        return k.reshape(R, S, K, d).transpose(0, 2, 1, 3), v.reshape(R, S, K, d).transpose(0, 2, 1, 3)
