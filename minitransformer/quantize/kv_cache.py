"""The int8 KV caches: Int8KVCache (contiguous, kv_cache.KVCache's protocol) and Int8PagedKVCache (the serving
engine's paged pools), both storing int8 values and one float32 scale per (token, head) (lesson 13).

Keys and values are a quarter of the bytes plus a scale, so the same memory holds 3.8x more tokens at head_dim 64.
One quantize_kv / dequantize_kv pair serves both caches, so a token is stored identically in either.
"""

from __future__ import annotations

import numpy as np

from ..backend import DTYPE, array_module
from ..config import ModelConfig
from ..kv_cache import KVCache, check_sizes
from ..serving.paged_cache import PagedKVCache, check_pool, reserve
from .schemes import INT8_MAX

# ----------------------------------------------------------------------------------------------- int8 KV cache

def quantize_kv(x):
    """x (..., d) float32 -> q (..., d) int8, scale (...,) float32: one symmetric scale per vector (token, head)."""
    xp = array_module(x)
    scale = xp.abs(x).max(axis=-1) / float(INT8_MAX)                                # (...,)
    scale = xp.where(scale > 0, scale, 1.0).astype(DTYPE)
    q = xp.clip(xp.rint(x / scale[..., None]), -INT8_MAX, INT8_MAX).astype(np.int8)
    return q, scale


def dequantize_kv(q, scale):
    """q (..., d) int8, scale (...,) -> (..., d) float32."""
    return q.astype(DTYPE) * scale[..., None]


def estimate_int8_kv_bytes(config: ModelConfig, tokens: int, batch: int = 1) -> int:
    """Bytes of an int8 KV cache: 2 x layers x batch x kv_heads x tokens x (head_dim int8 + one float32 scale)."""
    return 2 * config.n_layers * batch * config.n_kv_heads * tokens * (config.head_dim + 4)


class Int8KVCache(KVCache):
    """KVCache's constructor and `update` protocol, storing int8 keys/values with one float32 scale per (token, head).

    `update` quantizes the new keys/values, stores them and returns the dequantized prefix (B, K, S, d) float32, so
    attention sees exactly what is stored (the new token's own key too). For head_dim 64 a token-head costs 68 bytes
    instead of 256: 3.8x less cache. A paged pool stores the same (int8 values, scale) pairs per block slot and calls
    the same quantize_kv / dequantize_kv.
    """

    def __init__(self, config: ModelConfig, max_len: int, batch: int = 1, xp=np, dtype=DTYPE):
        max_len, batch = check_sizes(config, max_len, batch, lambda n, b: estimate_int8_kv_bytes(config, n, b), xp)
        self.config, self.max_len, self.batch, self.xp = config, max_len, batch, xp
        self.dtype = np.dtype(np.int8)
        shape = (config.n_layers, batch, config.n_kv_heads, max_len, config.head_dim)
        self.k = xp.zeros(shape, dtype=np.int8)                 # (layers, batch, kv_heads, max_len, head_dim)
        self.v = xp.zeros(shape, dtype=np.int8)
        self.k_scale = xp.ones(shape[:-1], dtype=DTYPE)         # (layers, batch, kv_heads, max_len)
        self.v_scale = xp.ones(shape[:-1], dtype=DTYPE)
        self.length = 0
        self.key_positions = xp.broadcast_to(xp.arange(max_len), (batch, max_len))   # (batch, max_len)

    def update(self, layer: int, k_new, v_new, positions):
        """k_new, v_new (B, K, T, d) float32 -> dequantized k, v (B, K, length + T, d), positions (B, length + T)."""
        start, end = self.next_slots(k_new.shape[2])
        self.k[layer, :, :, start:end], self.k_scale[layer, :, :, start:end] = quantize_kv(k_new)
        self.v[layer, :, :, start:end], self.v_scale[layer, :, :, start:end] = quantize_kv(v_new)
        if layer == self.config.n_layers - 1:
            self.length = end
        k = dequantize_kv(self.k[layer, :, :, :end], self.k_scale[layer, :, :, :end])     # (B, K, end, d)
        v = dequantize_kv(self.v[layer, :, :, :end], self.v_scale[layer, :, :, :end])
        return k, v, self.key_positions[:, :end]

    @property
    def bytes_used(self) -> int:
        return estimate_int8_kv_bytes(self.config, self.length, self.batch)

    @property
    def bytes_reserved(self) -> int:
        if self.k is None:
            return 0
        return int(self.k.nbytes + self.v.nbytes + self.k_scale.nbytes + self.v_scale.nbytes)

    def release(self) -> None:
        self.k = self.v = self.k_scale = self.v_scale = None


KV_CACHES = {"f32": KVCache, "int8": Int8KVCache}


class Int8PagedKVCache(PagedKVCache):
    """The serving engine's paged pools (serving/paged_cache.py) storing int8 values and one float32 scale per
    (slot, head): the same quantize_kv / dequantize_kv as Int8KVCache, so a token's keys are stored identically in
    both, and a block costs (head_dim + 4) / (4 * head_dim) of a float32 block (68 / 256 bytes per head at d = 64).

        k, v (layers, num_blocks, block_size, kv_heads, head_dim) int8; k_scale, v_scale (..., kv_heads) float32
    """

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16, xp=np, dtype=DTYPE):
        num_blocks, block_size = check_pool(num_blocks, block_size, estimate_int8_kv_bytes(config, 1), xp)
        self.config, self.num_blocks, self.block_size, self.xp = config, num_blocks, block_size, xp
        self.dtype = np.dtype(np.int8)
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        self.k = reserve(shape, np.int8, xp)
        self.v = reserve(shape, np.int8, xp)
        self.k_scale = reserve(shape[:-1], DTYPE, xp)          # zeros: never-written slots read back as 0.0
        self.v_scale = reserve(shape[:-1], DTYPE, xp)

    @property
    def bytes_total(self) -> int:
        return int(self.k.nbytes + self.v.nbytes + self.k_scale.nbytes + self.v_scale.nbytes)

    @property
    def bytes_per_block(self) -> int:
        return estimate_int8_kv_bytes(self.config, self.block_size)

    def write(self, layer: int, slots, k_new, v_new) -> None:
        """Quantize and store keys/values of N tokens.   slots (N,) int; k_new, v_new (K, N, d) float32."""
        K, d = self.config.n_kv_heads, self.config.head_dim
        for pool, scales, new in ((self.k, self.k_scale, k_new), (self.v, self.v_scale, v_new)):
            q, scale = quantize_kv(new.transpose(1, 0, 2))                  # (N, K, d) int8, (N, K)
            pool[layer].reshape(-1, K, d)[slots] = q
            scales[layer].reshape(-1, K)[slots] = scale

    def gather(self, layer: int, block_tables):
        """block_tables (R, nb) -> dequantized k, v (R, K, nb * block_size, d) float32, key j at position j."""
        R, nb = block_tables.shape
        S, K, d = nb * self.block_size, self.config.n_kv_heads, self.config.head_dim
        k = dequantize_kv(self.k[layer][block_tables], self.k_scale[layer][block_tables])    # (R, nb, B, K, d)
        v = dequantize_kv(self.v[layer][block_tables], self.v_scale[layer][block_tables])
        return k.reshape(R, S, K, d).transpose(0, 2, 1, 3), v.reshape(R, S, K, d).transpose(0, 2, 1, 3)
