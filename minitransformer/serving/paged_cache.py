"""The paged KV cache: every layer's keys and values in a pool of fixed-size blocks (vLLM's PagedAttention).

    k[layer], v[layer]: (num_blocks, block_size, kv_heads, head_dim)

A token's keys go to the *slot* the block manager maps it to (block * block_size + offset), so the sequences of a
batch can each have their own length and grow independently; attention finds a sequence's keys through its block
table. `PagedStep` is one engine step's view of the pool, the object model.forward talks to (its cache protocol):
it writes the step's keys to their slots and asks the model's attention (core/attention.py) for each decode row
and each prefill chunk. The arrays gather a table's blocks into a contiguous (K, S, d) view and mask by position
(blocks past a sequence's end hold positions beyond every query, so no separate length mask is needed); the
kernels read float blocks in place (kernels/paged_decode.cu), since the pool already has the kernel's layout.
Storage is any codec of kv_storage.CODECS (float32 or int8), as for the contiguous cache.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.attention import AttentionBackend
from ..core.backend import DTYPE, check_count, check_memory, to_host
from ..core.config import ModelConfig
from ..core.kv_cache import kv_bytes_per_token
from ..core.kv_storage import KVCodec, KVStorage, check_storage


def reserve(shape, dtype, xp=np):
    """A zero-filled pool whose memory is really ours from now on: xp.zeros, then every page written once.

    Why write zeros over zeros: NumPy's zeros come from the OS as pages it has not mapped yet, and the first write
    to each page faults (a fault that asks for a huge page can stall compacting memory). Left lazy, those faults land
    in the serving steps that first touch each block; paging the pool in once at start is what reserving memory up
    front means (vLLM allocates its KV cache at start; llama.cpp clears its KV buffer when a context is created).
    On the GPU zeros are already written; fill is one more kernel.
    """
    pool = xp.zeros(shape, dtype=dtype)
    pool.fill(0)
    return pool


def check_pool(num_blocks, block_size, bytes_per_token: int, xp) -> tuple[int, int]:
    """num_blocks and block_size as integers, and the pool's bytes against the memory available, before reserve()
    zero-fills it (which would take seconds per GiB to fail). Returns (num_blocks, block_size)."""
    num_blocks, block_size = check_count("num_blocks", num_blocks), check_count("block_size", block_size)
    check_memory(num_blocks * block_size * bytes_per_token,
                 f"a KV cache pool of {num_blocks} blocks x {block_size} tokens", xp,
                 "lower num_blocks, block_size or kv_cache_bytes")
    return num_blocks, block_size


class PagedKVCache:
    """The K and V pools of every layer, (layers, num_blocks, block_size, kv_heads, head_dim) each, stored as
    `storage` (a codec name of kv_storage.CODECS). The attention backends read it as a PagedPool
    (core/attention.py)."""
    xp: Any                          # the array module of the pool (NumPy or CuPy)
    codec: KVCodec                   # how k and v store their numbers (kv_storage.CODECS)

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16, xp=np, dtype=DTYPE,
                 storage: str = "f32"):
        check_storage(storage)
        num_blocks, block_size = check_pool(num_blocks, block_size, kv_bytes_per_token(config, storage, dtype), xp)
        self.config, self.num_blocks, self.block_size, self.xp = config, num_blocks, block_size, xp
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        # zeros (reserve): padding slots read as finite numbers (0 * garbage NaN would poison an output row; masked
        # zeros cannot).
        self.store = KVStorage(shape, storage, xp, dtype, allocate=lambda shape, dtype: reserve(shape, dtype, xp))
        self.storage, self.codec = storage, self.store.codec    # the codec's name, the codec (kv_storage.CODECS)
        self.dtype = self.store.dtype                          # dtype of the stored values (int8 for "int8")

    k = property(lambda self: self.store.k)        # (layers, num_blocks, block_size, kv_heads, head_dim)
    v = property(lambda self: self.store.v)

    @property
    def bytes_total(self) -> int:
        """Bytes of both pools (what the engine reserves up front)."""
        return self.store.nbytes

    @property
    def bytes_per_block(self) -> int:
        return self.block_size * kv_bytes_per_token(self.config, self.storage, self.dtype)

    def where(self, slots):
        """slots (N,) -> (block, offset) of each token: the index write() stores at (a step computes it once)."""
        return slots // self.block_size, slots % self.block_size

    def write(self, layer: int, slots, k_new, v_new, where=None) -> None:
        """Store keys/values of N tokens.   slots (N,) int; k_new, v_new (K, N, d); where: self.where(slots)."""
        where = self.where(slots) if where is None else where
        self.store.put(layer, where, k_new.transpose(1, 0, 2), v_new.transpose(1, 0, 2))   # (N, K, d) each

    def gather(self, layer: int, block_tables):
        """Contiguous float32 keys and values of each row's blocks.

        block_tables (R, nb) int (shorter tables padded with any block id) -> k, v (R, K, nb * block_size, d);
        key j of row r is at position j.
        """
        R, nb = block_tables.shape
        K, d = self.config.n_kv_heads, self.config.head_dim
        k, v = self.store.get(layer, block_tables)                               # (R, nb, block_size, K, d) each
        S = nb * self.block_size
        return k.reshape(R, S, K, d).transpose(0, 2, 1, 3), v.reshape(R, S, K, d).transpose(0, 2, 1, 3)


    def token_index(self, block_table, num_tokens: int):
        """(block, offset) of a sequence's first num_tokens tokens, (P,) each: where export/import_tokens look."""
        positions = np.arange(num_tokens)
        table = np.asarray(block_table, dtype=np.int64)
        return table[positions // self.block_size], positions % self.block_size

    def export_tokens(self, block_table, num_tokens: int) -> list:
        """A sequence's first num_tokens tokens as stored, copied to the host: K and V (layers, P, kv_heads,
        head_dim), then their scales (layers, P, kv_heads) for a scaled storage. What a prefill engine sends
        (serving/kv_transfer.py): the stored values, not decoded floats, so the receiver stores exactly them."""
        blocks, offsets = self.token_index(block_table, num_tokens)
        return [to_host(array[:, blocks, offsets]) for array in self.store.arrays]

    def import_tokens(self, block_table, arrays) -> None:
        """export_tokens' arrays written into this pool at a block table's first P tokens (P = arrays[0].shape[1])."""
        blocks, offsets = self.token_index(block_table, arrays[0].shape[1])
        for stored, array in zip(self.store.arrays, arrays, strict=True):
            stored[:, blocks, offsets] = self.xp.asarray(array)


def length_groups(seq_lens, block_size: int) -> list[tuple[int, int, int]]:
    """Split decode rows sorted by length into groups of similar length: [(first row, end row, blocks)].

    seq_lens: the rows' key counts, ascending (model_runner.prepare sorts its decodes). Why: the arrays gather a
    group's block tables into one padded (rows, K, blocks * block_size, d) batch, so every row costs as much as the
    group's longest. One group for a batch of 16 rows of 28 to 316 keys gathers and attends 16 x 320 keys, more than
    twice the ~2,000 the rows hold. A group ends where the next row needs more than twice the blocks of the group's
    first row, so no row carries more than twice its own keys of padding, in at most log2(longest / shortest) + 1
    groups (each group is one more gather and two more batched matmuls per layer, about 20 us on this CPU).
    """
    blocks = [-(-int(n) // block_size) for n in seq_lens]                # ceil: blocks each row's keys fill
    groups: list[tuple[int, int, int]] = []
    first = 0
    for row in range(1, len(blocks) + 1):
        if row == len(blocks) or blocks[row] > 2 * blocks[first]:
            groups.append((first, row, blocks[row - 1]))
            first = row
    return groups


class PagedStep:
    """One engine step's tokens in the pool: the cache protocol of model.forward (model.py) for a flat batch.

    The step's N tokens are laid end to end (B = 1, T = N), decodes first (model_runner.py):
    slots (N,) where each token's keys go; rows [0, num_decodes) are one token of their own sequence each, at
    decode_positions (D,), attending to seq_lens (D,) = positions + 1 keys through decode_tables (D, nb);
    decode_groups: [(first row, end row, blocks)] from length_groups, for an attention that gathers the pool (the
    arrays): each group is gathered to its own longest row. None: one group, every table's full width (a kernel
    reads the pool in place and stops at each row's own length, so it takes every row in one call);
    chunks: per prefill chunk (first row, length, positions (1, n), block table (1, nb), keys it reads).
    """

    def __init__(self, cache: PagedKVCache, slots, num_decodes: int, decode_positions, seq_lens, decode_tables,
                 chunks=(), decode_groups=None):
        self.cache, self.slots, self.num_decodes, self.chunks = cache, slots, num_decodes, chunks
        self.decode_positions, self.seq_lens, self.decode_tables = decode_positions, seq_lens, decode_tables
        self.decode_groups = decode_groups
        self.where = cache.where(slots)             # once per step, not once per layer

    def attend(self, layer: int, q, k, v, positions, attention: AttentionBackend):
        """q (1, H, N, d), k and v (1, K, N, d) -> (1, H, N, d): store the step's keys, attend row by row."""
        self.cache.write(layer, self.slots, k[0], v[0], self.where)
        D = self.num_decodes
        if D:
            decoded = self.decode(layer, q[0, :, :D].transpose(1, 0, 2), attention).transpose(1, 0, 2)  # (H, D, d)
            if not self.chunks:
                return decoded[None]                                             # a decode-only step
        out = self.cache.xp.empty_like(q[0])                                    # (H, N, d)
        if D:
            out[:, :D] = decoded
        for row, n, chunk_positions, table, num_keys in self.chunks:
            out[:, row:row + n] = attention.paged_chunk(self.cache, layer, q[:, :, row:row + n], chunk_positions,
                                                        table, num_keys)[0]
        return out[None]

    def decode(self, layer: int, q, attention: AttentionBackend):
        """The decode rows' attention: q (D, H, d) -> (D, H, d), in one call or one per group of similar length."""
        groups = self.decode_groups
        if groups is None or len(groups) == 1 or attention.reads_pool(self.cache.codec):
            return attention.paged_decode(self.cache, layer, q, self.decode_positions, self.seq_lens,
                                          self.decode_tables)
        out = self.cache.xp.empty_like(q)                                       # (D, H, d)
        for a, b, blocks in groups:
            out[a:b] = attention.paged_decode(self.cache, layer, q[a:b], self.decode_positions[a:b],
                                              self.seq_lens[a:b], self.decode_tables[a:b, :blocks])
        return out

    def advance(self, T: int) -> None:
        """Nothing to move: the engine counts each sequence's computed tokens itself (Sequence.num_computed_tokens)."""
