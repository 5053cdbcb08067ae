"""Which code computes attention: the array implementation (layers.attention) or our CUDA kernels.

    load_model(..., attention="arrays")   layers.attention: NumPy/CuPy array ops (the reference, fastest on the CPU)
    load_model(..., attention="kernels")  prefill through flash_prefill, decode (one query) through paged_decode
    load_model(..., attention="auto")     kernels on the GPU, arrays on the CPU

The kernels take NumPy arrays too (then they run on the CPU runner, compiled from the same .cu files), which is how
the kernel path is tested on a machine without a GPU. A shape the kernels cannot serve (head_dim not 64 or 128, more
query heads per KV head than the decode kernel holds, positions that are not consecutive) falls back to the arrays
with the reason logged once.

The contiguous KVCache stores (B, K, S, d) but paged_decode reads (blocks, block_size, K, d), tokens before heads, so
each decode step lays the cache out that way (a copy of the S cached tokens, as one block table per sequence).
A cache stored token-major would make that a view; the serving engine's paged cache is already token-major.
"""

from __future__ import annotations

import logging

import numpy as np

from .backend import array_module
from .errors import InputError
from .kernels.attention import HEAD_DIMS, flash_prefill, paged_decode
from .kernels.loader import source_constant
from .layers import attention as array_attention

MODES = ("arrays", "kernels", "auto")
DECODE_BLOCK = 16           # tokens per block of the one-table view of a contiguous cache

log = logging.getLogger("minitransformer.attention")
_logged: set[str] = set()


def choose_attention(mode: str, device: str):
    """A KernelAttention for `mode` on `device`, or None for layers.attention (which model.py calls itself)."""
    if mode not in MODES:
        raise InputError(f"unknown attention {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "arrays" or (mode == "auto" and device == "cpu"):
        return None
    return KernelAttention()


def fallback(reason: str) -> None:
    """Log why a call went to the array implementation, once per distinct reason."""
    if reason not in _logged:
        _logged.add(reason)
        log.warning("attention kernels cannot serve this call (%s); using layers.attention", reason)


class KernelAttention:
    """attention(q, k, v, q_positions, k_positions) with layers.attention's signature, through the kernels.

    Contract (what prefill.py, decode.py and KVCache guarantee): keys sit at positions 0..S-1 of their sequence
    and the T queries are the last T of them. On NumPy inputs it is checked (cheap); on CuPy it is trusted,
    since checking would read the positions back to the host every step.
    """

    def __init__(self):
        self.calls = {"flash_prefill": 0, "paged_decode": 0, "arrays": 0}

    def __call__(self, q, k, v, q_positions, k_positions):
        T, S = q.shape[2], k.shape[2]
        reason = self.unsupported(q, k, q_positions, k_positions)
        if reason:
            fallback(reason)
            self.calls["arrays"] += 1
            return array_attention(q, k, v, q_positions, k_positions)
        xp = array_module(q)
        if T == 1 and S > 1:
            self.calls["paged_decode"] += 1
            return self.decode(q, k, v, xp)[:, :, None]                        # (B, H, 1, d)
        self.calls["flash_prefill"] += 1
        return flash_prefill(xp.ascontiguousarray(q), xp.ascontiguousarray(k), xp.ascontiguousarray(v))

    @staticmethod
    def unsupported(q, k, q_positions, k_positions) -> str | None:
        """Why the kernels cannot serve this call, or None when they can."""
        B, H, T, d = q.shape
        K, S = k.shape[1], k.shape[2]
        if d not in HEAD_DIMS:
            return f"head_dim {d} is not one of the compiled {HEAD_DIMS}"
        if T == 1 and S > 1 and H // K > source_constant("paged_decode.cu", "DECODE_MAX_GROUP"):
            return f"{H // K} query heads per KV head exceed the decode kernel's group limit"
        if isinstance(q_positions, np.ndarray):      # host arrays: check the contract the kernels assume
            keys = np.asarray(k_positions)
            if not (np.array_equal(keys, np.broadcast_to(keys[:, :1] + np.arange(S), keys.shape))
                    and np.array_equal(q_positions, keys[:, S - T:])):
                return "positions are not the last T of S consecutive key positions"
        return None

    @staticmethod
    def decode(q, k, v, xp):
        """One query per sequence against S cached keys: q (B, H, 1, d), k and v (B, K, S, d) -> (B, H, d).

        The keys are laid out token-major in blocks of DECODE_BLOCK tokens, sequence b owning blocks
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

