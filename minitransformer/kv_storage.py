"""How a KV cache stores its numbers: float32, or int8 with one float32 scale per (token, head) (lesson 13).

Both caches -- the contiguous one (kv_cache.py) and the paged pool (serving/paged_cache.py) -- keep their keys and
values in a KVStorage and address it with the same kind of index: whatever selects a set of (token, head) vectors
in one layer's array (slices for the contiguous cache, block and offset arrays for the pool). Storage is an option
of either cache, not a kind of cache: writing quantizes, reading dequantizes, and the attention after it sees float32
either way, the same numbers whichever cache holds them.

int8 stores a quarter of the bytes plus a 4-byte scale per vector: for head_dim 64, 68 bytes per (token, head)
instead of 256, so the same memory holds 3.8x more tokens.
"""

from __future__ import annotations

import numpy as np

from .backend import DTYPE, INT8_MAX, array_module
from .errors import InputError

STORAGES = ("f32", "int8")


def check_storage(storage: str) -> str:
    """One of STORAGES, or the InputError naming them (generate's kv_cache= and the Engine's take these names)."""
    if storage not in STORAGES:
        raise InputError(f"kv_cache must be one of {', '.join(STORAGES)}, got {storage!r}")
    return storage


def bytes_per_vector(head_dim: int, storage: str = "f32", dtype=DTYPE) -> int:
    """Bytes of one (token, head) key or value vector: head_dim values, plus the scale when int8."""
    return head_dim + 4 if storage == "int8" else head_dim * np.dtype(dtype).itemsize


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


class KVStorage:
    """Keys and values of every layer, k and v (layers, *slots, head_dim), in float32 or int8 + scales.

    put(layer, index, k, v) stores vectors at k[layer][index]; get(layer, index) returns them as float32 (views for
    float32 storage, so reading the contiguous cache costs no copy). `allocate` makes the arrays: xp.zeros, or the
    paged pool's reserve(), which also pages the memory in.
    """

    def __init__(self, shape: tuple[int, ...], storage: str, xp=np, dtype=DTYPE, allocate=None):
        allocate = allocate or (lambda shape, dtype: xp.zeros(shape, dtype=dtype))
        self.kind = check_storage(storage)
        self.dtype = np.dtype(np.int8 if storage == "int8" else dtype)
        self.k = allocate(shape, self.dtype)               # (layers, *slots, head_dim)
        self.v = allocate(shape, self.dtype)
        if storage == "int8":
            self.k_scale = allocate(shape[:-1], DTYPE)     # (layers, *slots): zeros, so unwritten slots read 0.0
            self.v_scale = allocate(shape[:-1], DTYPE)

    def put(self, layer: int, index, k, v) -> None:
        """Store k, v (shape of k[layer][index]) at `index` of `layer`."""
        if self.kind == "f32":
            self.k[layer][index] = k
            self.v[layer][index] = v
            return
        self.k[layer][index], self.k_scale[layer][index] = quantize_kv(k)
        self.v[layer][index], self.v_scale[layer][index] = quantize_kv(v)

    def get(self, layer: int, index):
        """The float32 keys and values at `index` of `layer`."""
        if self.kind == "f32":
            return self.k[layer][index], self.v[layer][index]
        return (dequantize_kv(self.k[layer][index], self.k_scale[layer][index]),
                dequantize_kv(self.v[layer][index], self.v_scale[layer][index]))

    @property
    def nbytes(self) -> int:
        scales = self.k_scale.nbytes + self.v_scale.nbytes if self.kind == "int8" else 0
        return int(self.k.nbytes + self.v.nbytes + scales)
