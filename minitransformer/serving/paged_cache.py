"""The paged KV cache: every layer's keys and values in a pool of fixed-size blocks (vLLM's PagedAttention).

    k[layer], v[layer]: (num_blocks, block_size, kv_heads, head_dim)

A token's keys go to the *slot* the block manager maps it to (block * block_size + offset), so the sequences of a
batch can each have their own length and grow independently; attention finds a sequence's keys through its block
table. Here that is done with arrays: gather the table's blocks into a contiguous (K, S, d) view, then the same
masked attention as the contiguous path (layers.attention). With the kernel backend on (load_model(attention=...),
see attention_backend.py) decodes go through `decode_attention` instead: kernels/paged_decode.cu reads the blocks in
place, since the pool already has the kernel's layout; prefill chunks go through `prefill_attention`
(kernels/flash_prefill.cu on the gathered keys). Blocks past a sequence's end (padding in a batch) hold
positions beyond every query, so the causal mask hides them: no separate length mask is needed.
"""

from __future__ import annotations

import numpy as np

from ..backend import DTYPE, check_count, check_memory
from ..config import ModelConfig
from ..kv_cache import estimate_kv_bytes
from ..kernels.attention import flash_prefill, paged_decode
from ..layers import attention, causal_attention


def reserve(shape, dtype, xp=np):
    """A zero-filled pool whose memory is really ours from now on: xp.zeros, then every page written once.

    Why write zeros over zeros: NumPy's zeros come from the OS as pages it has not mapped yet, and the first write
    to each page faults; on this machine a fault that asks for a huge page sometimes stalls ~1 ms compacting memory.
    Left lazy, those faults land in the serving steps that first touch each block: an Engine serving 16 requests x
    64 tokens measured 175-183 tok/s lazy and 188-192 paged in (three alternating rounds, 2 cores). Paging the pool in
    once at start is what reserving memory up front means (vLLM allocates its KV cache at start; llama.cpp clears its
    KV buffer when a context is created). The default 512 MiB pool takes 0.05-1 s here, once per Engine, and is
    resident from then on. On the GPU zeros are already written; fill is one more kernel.
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
    """The K and V pools of every layer, (layers, num_blocks, block_size, kv_heads, head_dim) each."""

    def __init__(self, config: ModelConfig, num_blocks: int, block_size: int = 16, xp=np, dtype=DTYPE):
        num_blocks, block_size = check_pool(num_blocks, block_size, estimate_kv_bytes(config, 1, dtype=dtype), xp)
        self.config, self.num_blocks, self.block_size, self.xp = config, num_blocks, block_size, xp
        self.dtype = np.dtype(dtype)
        shape = (config.n_layers, num_blocks, block_size, config.n_kv_heads, config.head_dim)
        # zeros: padding slots read as finite numbers (0 * garbage NaN would poison an output row; masked zeros
        # cannot).
        self.k = reserve(shape, dtype, xp)
        self.v = reserve(shape, dtype, xp)

    @property
    def bytes_total(self) -> int:
        """Bytes of both pools (what the engine reserves up front)."""
        return int(self.k.nbytes + self.v.nbytes)

    @property
    def bytes_per_block(self) -> int:
        return estimate_kv_bytes(self.config, self.block_size, dtype=self.dtype)

    def write(self, layer: int, slots, k_new, v_new) -> None:
        """Store keys/values of N tokens.   slots (N,) int; k_new, v_new (K, N, d)."""
        K, d = self.config.n_kv_heads, self.config.head_dim
        self.k[layer].reshape(-1, K, d)[slots] = k_new.transpose(1, 0, 2)       # (N, K, d) into (blocks*B, K, d)
        self.v[layer].reshape(-1, K, d)[slots] = v_new.transpose(1, 0, 2)

    def gather(self, layer: int, block_tables):
        """Contiguous keys and values of each row's blocks.

        block_tables (R, nb) int (shorter tables padded with any block id) -> k, v (R, K, nb * block_size, d);
        key j of row r is at position j.
        """
        R, nb = block_tables.shape
        S = nb * self.block_size
        k = self.k[layer][block_tables].reshape(R, S, *self.k.shape[-2:]).transpose(0, 2, 1, 3)   # (R, K, S, d)
        v = self.v[layer][block_tables].reshape(R, S, *self.v.shape[-2:]).transpose(0, 2, 1, 3)   # (R, K, S, d)
        return k, v

    def attention(self, layer: int, q, q_positions, block_tables, num_keys: int | None = None):
        """Paged attention: each row's queries against the keys its block table points to.

        q (R, H, T, d), q_positions (R, T), block_tables (R, nb) -> (R, H, T, d).
        num_keys: for one prefill chunk (R = 1) whose T queries are keys [num_keys - T, num_keys) of its sequence,
        the keys are cut there and go through layers.causal_attention, which skips each query block's future keys.
        """
        k, v = self.gather(layer, block_tables)                                 # (R, K, S, d) each
        if num_keys is not None:
            k, v = k[:, :, :num_keys], v[:, :, :num_keys]                       # the rest of the last block: unused
        S = k.shape[2]
        key_positions = self.xp.broadcast_to(self.xp.arange(S), (q.shape[0], S))  # (R, S)
        attend = attention if num_keys is None else causal_attention
        return attend(q, k, v, q_positions, key_positions)

    def prefill_attention(self, layer: int, q, block_tables, num_keys: int):
        """One prefill chunk through the flash_prefill kernel: its T queries are keys [num_keys - T, num_keys) of its
        sequence, the layout the kernel assumes (queries are the last Tq of Tk keys, causal).

        q (1, H, T, d), block_tables (1, nb) -> (1, H, T, d). The chunk's blocks are gathered into contiguous
        (1, K, num_keys, d) keys and values first (the kernel reads one contiguous sequence).
        """
        xp = self.xp
        k, v = self.gather(layer, block_tables)                                 # (1, K, nb * block_size, d) each
        return flash_prefill(xp.ascontiguousarray(q), xp.ascontiguousarray(k[:, :, :num_keys]),
                             xp.ascontiguousarray(v[:, :, :num_keys]))

    def decode_attention(self, layer: int, q, seq_lens, block_tables):
        """One query per row through the paged_decode kernel, blocks read in place (no gather).

        q (R, H, d), seq_lens (R,) tokens each row attends to, block_tables (R, nb) -> (R, H, d).
        """
        xp = self.xp
        return paged_decode(xp.ascontiguousarray(q), self.k[layer], self.v[layer],
                            block_tables.astype(np.int32), seq_lens.astype(np.int32))
