"""Which code computes attention, chosen once when the model is loaded: plain arrays or our CUDA kernels.

    load_model(..., attention="arrays")   ArrayAttention: layers.attention's array ops (the reference; fastest on a CPU)
    load_model(..., attention="kernels")  KernelAttention: flash_prefill for prompts and chunks, paged_decode for
                                          one-query decodes (on NumPy arrays the kernels run on the CPU runner)
    load_model(..., attention="auto")     kernels on the GPU, arrays on the CPU

The model keeps the object as `model.attention` and hands it to whatever cache a forward pass uses, so every cache
(contiguous, paged, int8 or float32) attends through the one choice. Both classes answer the same three questions:

    causal(q, k, v, q_positions, k_positions)        keys already contiguous (the contiguous cache, or no cache)
    paged_decode(cache, layer, q, positions, tables)  one query per sequence, keys in the paged pool's blocks
    paged_chunk(cache, layer, q, positions, table)    one prefill chunk against its cached prefix and itself

The seam between the model and its caches is written down here as three Protocols, so that code taking "a
backend" or "a cache" names what it uses rather than one class: AttentionBackend (what a cache calls: the questions
above), ForwardCache (what model.forward calls on a cache: kv_cache.KVCache, serving/paged_cache.PagedStep) and
PagedPool (what the paged answers read of the engine's pool: serving/paged_cache.PagedKVCache). They live with the
backend because the model imports this module and sits below the caches.

A model whose shapes the kernels were not compiled for (head_dim not 64 or 128, more query heads per KV head than
the decode kernel holds) gets ArrayAttention at load, with the reason logged once. What only a call can tell (keys
that are not consecutive positions, an int8 pool the decode kernel cannot read) goes to the arrays for that call.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np

from ..kernels.attention import HEAD_DIMS, flash_prefill, paged_decode
from ..kernels.loader import source_constant
from .backend import array_module
from .errors import InputError
from .layers import attention, causal_attention

MODES = ("arrays", "kernels", "auto")
DECODE_BLOCK = 16           # tokens per block of the one-table view of a contiguous cache

log = logging.getLogger("minitransformer.attention")
_logged: set[str] = set()


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


def choose_attention(mode: str, device: str, config) -> AttentionBackend:
    """The attention object for `mode` on `device` and this model's shapes (see the module docstring)."""
    if mode not in MODES:
        raise InputError(f"unknown attention {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "arrays" or (mode == "auto" and device == "cpu"):
        return ArrayAttention()
    group_limit = source_constant("paged_decode.cu", "DECODE_MAX_GROUP")
    if config.head_dim not in HEAD_DIMS:
        fallback(f"head_dim {config.head_dim} is not one of the compiled {HEAD_DIMS}")
        return ArrayAttention()
    if config.n_heads // config.n_kv_heads > group_limit:
        fallback(f"{config.n_heads // config.n_kv_heads} query heads per KV head exceed the decode kernel's group "
                 "limit")
        return ArrayAttention()
    return KernelAttention()


def fallback(reason: str) -> None:
    """Log why attention goes to the array implementation, once per distinct reason."""
    if reason not in _logged:
        _logged.add(reason)
        log.warning("attention kernels cannot serve this (%s); using layers.attention", reason)


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


class KernelAttention(ArrayAttention):
    """The same three answers through kernels/flash_prefill.cu and kernels/paged_decode.cu. `calls` counts which
    code served each call (the tests read it)."""
    name = "kernels"
    uses_kernels = True

    def __init__(self):
        self.calls = {"flash_prefill": 0, "paged_decode": 0, "arrays": 0}

    def causal(self, q, k, v, q_positions, k_positions):
        """Contract (prefill.py, decode.py and KVCache keep it): keys at positions 0..S-1 of their sequence (or
        consecutive from any start) and the T queries the last T of them. Checked on NumPy inputs (cheap); trusted
        on CuPy, since checking would read the positions back to the host every step."""
        T, S = q.shape[2], k.shape[2]
        if not consecutive(q_positions, k_positions, T, S):
            fallback("positions are not the last T of S consecutive key positions")
            self.calls["arrays"] += 1
            return causal_attention(q, k, v, q_positions, k_positions)
        xp = array_module(q)
        if T == 1 and S > 1:
            self.calls["paged_decode"] += 1
            return contiguous_decode(q, k, v, xp)[:, :, None]                   # (B, H, 1, d)
        self.calls["flash_prefill"] += 1
        return flash_prefill(xp.ascontiguousarray(q), xp.ascontiguousarray(k), xp.ascontiguousarray(v))

    def reads_pool(self, codec: Codec) -> bool:
        return codec.raw                       # the decode kernel reads float blocks; an int8 pool is gathered

    def paged_decode(self, cache: PagedPool, layer: int, q, positions, seq_lens, tables):
        if not self.reads_pool(cache.codec):
            self.calls["arrays"] += 1
            return super().paged_decode(cache, layer, q, positions, seq_lens, tables)
        self.calls["paged_decode"] += 1
        xp = cache.xp
        return paged_decode(xp.ascontiguousarray(q), cache.k[layer], cache.v[layer], tables.astype(np.int32),
                            seq_lens.astype(np.int32))

    def paged_chunk(self, cache: PagedPool, layer: int, q, positions, table, num_keys: int):
        """The chunk's blocks gathered (and dequantized) into contiguous keys, then flash_prefill: the kernel's
        layout, queries the last T of num_keys keys."""
        self.calls["flash_prefill"] += 1
        xp = cache.xp
        k, v = cache.gather(layer, table)                                        # (1, K, nb * block_size, d)
        return flash_prefill(xp.ascontiguousarray(q), xp.ascontiguousarray(k[:, :, :num_keys]),
                             xp.ascontiguousarray(v[:, :, :num_keys]))


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


def consecutive(q_positions, k_positions, T: int, S: int) -> bool:
    """Keys at S consecutive positions and the queries the last T of them (always True for device arrays)."""
    if not isinstance(q_positions, np.ndarray):
        return True
    keys = np.asarray(k_positions)
    return bool(np.array_equal(keys, np.broadcast_to(keys[:, :1] + np.arange(S), keys.shape))
                and np.array_equal(q_positions, keys[:, S - T:]))


def contiguous_decode(q, k, v, xp):
    """One query per sequence against S contiguous keys through paged_decode: q (B, H, 1, d), k and v (B, K, S, d)
    -> (B, H, d).

    The contiguous cache stores (B, K, S, d) but paged_decode reads (blocks, block_size, K, d), tokens before heads,
    so the keys are copied token-major into blocks of DECODE_BLOCK tokens, sequence b owning blocks
    [b * nb, (b + 1) * nb): one block table per sequence, all of length S.
    """
    B, H, _, d = q.shape
    K, S = k.shape[1], k.shape[2]
    nb = -(-S // DECODE_BLOCK)
    k_cache = xp.zeros((B, nb * DECODE_BLOCK, K, d), dtype=k.dtype)       # (B, nb * bs, K, d)
    v_cache = xp.zeros_like(k_cache)
    k_cache[:, :S] = k.transpose(0, 2, 1, 3)
    v_cache[:, :S] = v.transpose(0, 2, 1, 3)
    shape = (B * nb, DECODE_BLOCK, K, d)
    tables = xp.arange(B * nb, dtype=np.int32).reshape(B, nb)              # (B, nb)
    lens = xp.full((B,), S, dtype=np.int32)                                # (B,)
    return paged_decode(xp.ascontiguousarray(q[:, :, 0]), k_cache.reshape(shape), v_cache.reshape(shape),
                        tables, lens)
