"""How a KV cache stores its numbers: a table of codecs, float32 or int8 with one float32 scale per (token, head)
(lesson 13).

Both caches -- the contiguous one (kv_cache.py) and the paged pool (serving/paged_cache.py) -- keep their keys and
values in a KVStorage and address it with the same kind of index: whatever selects a set of (token, head) vectors
in one layer's array (slices for the contiguous cache, block and offset arrays for the pool). Storage is an option
of either cache, not a kind of cache: writing encodes, reading decodes, and the attention after it sees float32
either way, the same numbers whichever cache holds them.

A codec (KVCodec) says everything the rest of the package needs to know about one way of storing: its name (what
`kv_cache=` and `--kv-cache` take), the dtype of the stored values, whether each vector carries a scale, encode and
decode, and so the bytes of one vector. CODECS is the table; a new way of storing is one entry there (plus its
test): the caches, the byte formulas and the CLI read the table, none of them names a codec.

int8 stores a quarter of the bytes plus a 4-byte scale per vector: for head_dim 64, 68 bytes per (token, head)
instead of 256, so the same memory holds 3.8x more tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .backend import DTYPE, dequantize_int8_rows, quantize_int8_rows
from .errors import InputError

SCALE_DTYPE = np.dtype(DTYPE)   # a scaled codec's one scale per (token, head) vector


def _as_stored(x):
    """Store the vectors as they come (assignment casts them to the cache's float dtype)."""
    return x


@dataclass(frozen=True)
class KVCodec:
    """One way of storing key and value vectors (..., head_dim).

    Unscaled (scaled=False): encode(x) -> values, decode(values) -> float32.
    Scaled: encode(x) -> (values (..., head_dim), scale (...,) float32), decode(values, scale) -> float32.
    `dtype` is the stored values' dtype; None keeps the cache's own float dtype (float32 unless asked otherwise).
    """
    name: str                   # what kv_cache= (generate, Engine) and --kv-cache take
    help: str                   # one line for --kv-cache's help
    dtype: Any                  # stored values: a NumPy dtype, or None for the cache's float dtype
    scaled: bool                # one SCALE_DTYPE scale per (token, head) vector
    encode: Callable
    decode: Callable

    def stored_dtype(self, dtype=DTYPE) -> np.dtype:
        """The dtype of the stored values in a cache whose floats are `dtype`."""
        return np.dtype(dtype if self.dtype is None else self.dtype)

    def bytes_per_vector(self, head_dim: int, dtype=DTYPE) -> int:
        """Bytes of one (token, head) key or value vector: head_dim stored values, plus its scale when scaled."""
        return head_dim * self.stored_dtype(dtype).itemsize + (SCALE_DTYPE.itemsize if self.scaled else 0)

    @property
    def raw(self) -> bool:
        """The arrays hold the model's floats as they are (no scale, no cast), so a kernel can read them in place."""
        return self.dtype is None and not self.scaled


CODECS = {codec.name: codec for codec in (
    KVCodec("f32", "float32 (the default)", None, False, _as_stored, _as_stored),
    KVCodec("int8", "int8 with a scale per token and head", np.int8, True, quantize_int8_rows, dequantize_int8_rows),
)}
STORAGES = tuple(CODECS)        # the names, in the table's order


def check_storage(storage: str) -> KVCodec:
    """The codec named `storage`, or the InputError naming the table's (generate's kv_cache= and the Engine's take
    these names)."""
    if storage not in CODECS:
        raise InputError(f"kv_cache must be one of {', '.join(STORAGES)}, got {storage!r}")
    return CODECS[storage]


class KVStorage:
    """Keys and values of every layer, k and v (layers, *slots, head_dim), stored by one codec of CODECS.

    put(layer, index, k, v) stores vectors at k[layer][index]; get(layer, index) returns them as float32 (views for
    the raw float32 codec, so reading the contiguous cache costs no copy). A scaled codec keeps k_scale and v_scale
    (layers, *slots) beside them (None otherwise). `allocate` makes the arrays: xp.zeros, or the paged pool's
    reserve(), which also pages the memory in. The codec is looked up once, here, not per step.
    """

    def __init__(self, shape: tuple[int, ...], storage: str, xp=np, dtype=DTYPE, allocate=None):
        allocate = allocate or (lambda shape, dtype: xp.zeros(shape, dtype=dtype))
        self.codec = check_storage(storage)
        self.dtype = self.codec.stored_dtype(dtype)
        self.k = allocate(shape, self.dtype)               # (layers, *slots, head_dim)
        self.v = allocate(shape, self.dtype)
        # (layers, *slots), NumPy or CuPy; None for an unscaled codec
        self.k_scale: Any = None
        self.v_scale: Any = None
        if self.codec.scaled:
            self.k_scale = allocate(shape[:-1], SCALE_DTYPE)   # (layers, *slots): zeros, so unwritten slots read 0.0
            self.v_scale = allocate(shape[:-1], SCALE_DTYPE)

    def put(self, layer: int, index, k, v) -> None:
        """Store k, v (shape of k[layer][index]) at `index` of `layer`."""
        encode = self.codec.encode
        if self.k_scale is None:
            self.k[layer][index] = encode(k)
            self.v[layer][index] = encode(v)
            return
        self.k[layer][index], self.k_scale[layer][index] = encode(k)
        self.v[layer][index], self.v_scale[layer][index] = encode(v)

    def get(self, layer: int, index):
        """The float32 keys and values at `index` of `layer`."""
        decode = self.codec.decode
        if self.k_scale is None:
            return decode(self.k[layer][index]), decode(self.v[layer][index])
        return (decode(self.k[layer][index], self.k_scale[layer][index]),
                decode(self.v[layer][index], self.v_scale[layer][index]))

    @property
    def arrays(self) -> list:
        """Every stored array: k, v, then k_scale, v_scale for a scaled codec (what a KV transfer copies)."""
        return [self.k, self.v] + ([] if self.k_scale is None else [self.k_scale, self.v_scale])

    @property
    def nbytes(self) -> int:
        scales = 0 if self.k_scale is None else self.k_scale.nbytes + self.v_scale.nbytes
        return int(self.k.nbytes + self.v.nbytes + scales)
