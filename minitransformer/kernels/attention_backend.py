"""Our CUDA kernels as the model's attention: KernelAttention answers core/attention.py's three questions with
flash_prefill (prompts and chunks) and paged_decode (one query per sequence), on a GPU or, for NumPy arrays, on the
CPU runner (lesson 11).

It plugs in where core/ says attention plugs in, `model.attention`; `minitransformer.load_model(attention="kernels")`
(or "auto" on a GPU) sets it through `kernel_attention(config)`. A model whose shapes the kernels were not compiled
for (head_dim not 64 or 128, more query heads per KV head than the decode kernel holds) gets the arrays instead, with
the reason logged once. What only a call can tell (keys that are not consecutive positions, an int8 pool the decode
kernel cannot read) goes to the arrays for that call.

Both caches store tokens before heads, the decode kernel's layout, so paged_decode reads the engine's pool and the
contiguous cache (as kv_cache.BlockView) in place.
"""

from __future__ import annotations

import logging

import numpy as np

from ..core.attention import ArrayAttention, AttentionBackend, Codec, PagedPool
from ..core.backend import array_module
from ..core.config import ModelConfig
from ..core.layers import causal_attention
from .attention import HEAD_DIMS, flash_prefill, paged_decode
from .loader import source_constant

log = logging.getLogger("minitransformer.attention")
_logged: set[str] = set()


def kernel_attention(config: ModelConfig) -> AttentionBackend:
    """KernelAttention for a model of `config`, or ArrayAttention (the reason logged) when its shapes were not
    compiled."""
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


class KernelAttention(ArrayAttention):
    """The three answers through kernels/flash_prefill.cu and kernels/paged_decode.cu. `calls` counts which code
    served each call (the tests read it)."""
    name = "kernels"
    uses_kernels = True

    def __init__(self):
        self.calls = {"flash_prefill": 0, "paged_decode": 0, "arrays": 0}

    def causal(self, q, k, v, q_positions, k_positions):
        """Contract (prefill.py, decode.py and KVCache keep it): keys at positions 0..S-1 of their sequence (or
        consecutive from any start) and the T queries the last T of them. Checked on NumPy inputs (cheap); trusted
        on CuPy, since checking would read the positions back to the host every step. A decode step through the
        contiguous cache does not come here: the cache hands it to paged_decode (kv_cache.KVCache.attend)."""
        T, S = q.shape[2], k.shape[2]
        if not consecutive(q_positions, k_positions, T, S):
            fallback("positions are not the last T of S consecutive key positions")
            self.calls["arrays"] += 1
            return causal_attention(q, k, v, q_positions, k_positions)
        xp = array_module(q)
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


def consecutive(q_positions, k_positions, T: int, S: int) -> bool:
    """Keys at S consecutive positions and the queries the last T of them (always True for device arrays)."""
    if not isinstance(q_positions, np.ndarray):
        return True
    keys = np.asarray(k_positions)
    return bool(np.array_equal(keys, np.broadcast_to(keys[:, :1] + np.arange(S), keys.shape))
                and np.array_equal(q_positions, keys[:, S - T:]))
