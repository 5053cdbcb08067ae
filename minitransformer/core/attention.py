"""Attention as arrays, and the seam where another way of computing it plugs in.

The model keeps one attention object, `model.attention`, and hands it to whatever cache a forward pass uses, so every
cache (contiguous, paged, int8 or float32) attends through the one choice. An attention answers three questions:

    causal(q, k, v, q_positions, k_positions)        keys already contiguous (the contiguous cache, or no cache)
    paged_decode(cache, layer, q, positions, tables)  one query per sequence, keys in the paged pool's blocks
    paged_chunk(cache, layer, q, positions, table)    one prefill chunk against its cached prefix and itself

ArrayAttention answers them with layers.attention's array operations: the reference, and the fastest on a CPU.
kernels/attention_backend.py's KernelAttention answers them with our CUDA kernels (flash_prefill, paged_decode);
`minitransformer.load_model(attention="kernels" | "auto")` sets it as model.attention (lesson 11).

The seam between the model and its caches is written down here as Protocols, so that code taking "a backend" or "a
cache" names what it uses rather than one class: AttentionBackend (what a cache calls: the questions above),
ForwardCache (what model.forward calls on a cache: kv_cache.KVCache, serving/paged_cache.PagedStep) and PagedPool
(what the paged answers read of the engine's pool: serving/paged_cache.PagedKVCache).
"""

from __future__ import annotations

from typing import Any, Protocol

from .layers import attention, causal_attention


class Codec(Protocol):
    """What attention asks of a KV codec (kv_storage.KVCodec): whether the arrays hold the model's floats as they
    are (no scale, no cast), which is what a kernel can read in place."""

    @property
    def raw(self) -> bool: ...


class PagedPool(Protocol):
    """What paged_decode and paged_chunk read of the engine's pool (serving/paged_cache.PagedKVCache)."""
    xp: Any

    @property
    def codec(self) -> Codec: ...   # how k and v store their numbers, looked up once when the pool was made (read-only)

    @property
    def k(self) -> Any: ...     # (layers, num_blocks, block_size, kv_heads, head_dim), the codec's stored values

    @property
    def v(self) -> Any: ...

    def gather(self, layer: int, block_tables) -> tuple[Any, Any]:
        """block_tables (R, nb) -> float32 k, v (R, K, nb * block_size, d): each row's blocks, decoded."""
        ...


class AttentionBackend(Protocol):
    """Who computes attention (ArrayAttention or KernelAttention): the model's one choice, made at load and handed
    to whatever cache a forward pass uses."""
    name: str
    uses_kernels: bool

    def causal(self, q, k, v, q_positions, k_positions) -> Any:
        """q (B, H, T, d) against contiguous k, v (B, K, S, d) -> (B, H, T, d)."""
        ...

    def reads_pool(self, codec: Codec) -> bool:
        """Whether paged decodes read a pool stored by `codec` in place (else they gather each row's blocks)."""
        ...

    def paged_decode(self, cache: PagedPool, layer: int, q, positions, seq_lens, tables) -> Any:
        """q (R, H, d), one query per sequence, keys through block tables (R, nb) -> (R, H, d)."""
        ...

    def paged_chunk(self, cache: PagedPool, layer: int, q, positions, table, num_keys: int) -> Any:
        """One prefill chunk q (1, H, T, d) against its cached prefix and itself -> (1, H, T, d)."""
        ...


class ForwardCache(Protocol):
    """What model.forward asks of a KV cache (kv_cache.KVCache; serving/paged_cache.PagedStep for the engine's pool).

    attend is called once per layer of a pass: store this pass's keys and values of `layer`, attend every query to
    what the cache holds for its sequence through `attention`; advance(T) after the pass says T tokens were stored.
    """

    def attend(self, layer: int, q, k, v, positions, attention: AttentionBackend) -> Any:
        """q (B, H, T, d), k and v (B, K, T, d) -> (B, H, T, d)."""
        ...

    def advance(self, T: int) -> None: ...


class ArrayAttention:
    """Attention as array operations (layers.attention): the reference every kernel is tested against.

    window: 0, or a sliding layer's window (SlidingWindowAttention, which answers `causal` with it too): the query
    at position p sees keys in (p - window, p] only (layers.attention masks by position).
    """
    name = "arrays"
    uses_kernels = False
    window = 0

    def causal(self, q, k, v, q_positions, k_positions):
        """q (B, H, T, d) against contiguous k, v (B, K, S, d) -> (B, H, T, d); the queries are the last T keys."""
        return causal_attention(q, k, v, q_positions, k_positions)

    def reads_pool(self, codec: Codec) -> bool:
        """Whether decodes read a paged pool stored by `codec` in place (a kernel), rather than gathering each
        sequence's blocks."""
        return False

    def paged_decode(self, cache: PagedPool, layer: int, q, positions, seq_lens, tables):
        """One query per sequence: q (R, H, d) at positions (R,), keys through block tables (R, nb) -> (R, H, d).

        seq_lens (R,) = positions + 1, int32 (what the kernel reads; the arrays mask by position instead).
        """
        k, v = cache.gather(layer, tables)                                       # (R, K, nb * block_size, d)
        S = k.shape[2]
        key_positions = cache.xp.broadcast_to(cache.xp.arange(S), (q.shape[0], S))   # (R, S)
        return attention(q[:, :, None], k, v, positions[:, None], key_positions, self.window)[:, :, 0]

    def paged_chunk(self, cache: PagedPool, layer: int, q, positions, table, num_keys: int):
        """One prefill chunk: q (1, H, T, d) are keys [num_keys - T, num_keys) of the sequence whose blocks are
        table (1, nb); it attends to its cached prefix and, causally, to itself -> (1, H, T, d)."""
        k, v = cache.gather(layer, table)                                        # (1, K, nb * block_size, d)
        k, v = k[:, :, :num_keys], v[:, :, :num_keys]                            # the rest of the last block: unused
        key_positions = cache.xp.arange(num_keys)[None]                          # (1, num_keys)
        return causal_attention(q, k, v, positions, key_positions, window=self.window)


class SlidingWindowAttention(ArrayAttention):
    """A sliding layer's attention (Gemma 3's local layers): the query at position p sees the keys in
    (p - window, p] only (layers.causal_attention's window), in all three answers.

    Arrays only, whatever the model chose: the kernels have no window, so a sliding layer never reaches them (and
    Gemma 3's head_dim 256 is not a compiled kernel size anyway). Every cache keeps all of a sequence's keys and the
    window is a mask: the contiguous cache adds a slice that skips the keys before the window (a decode reads only
    the last `window`); the paged pool keeps a sliding layer's blocks that fell out of the window and masks them.
    Why keep them: a block of the pool holds one token range for every layer, the global layers still read it, and
    freeing only a sliding layer's share would take a second block manager (vLLM's hybrid allocator keeps one pool
    per attention type for that). What it costs: a sliding layer's decode gathers the whole table, not the last
    window's blocks, so on long sequences it reads more than it attends to (lesson 17 measures the bytes a freed
    window would save).
    """
    name = "arrays (sliding window)"

    def __init__(self, window: int):
        self.window = window

    def causal(self, q, k, v, q_positions, k_positions):
        return causal_attention(q, k, v, q_positions, k_positions, window=self.window)
