"""The tensor-core flash prefill (flash_prefill_wmma.cu) as a Python function, float16 only (lesson 11).

`flash_prefill(q, k, v, variant="wmma")` in attention.py comes here; so does `plan_flash_prefill_wmma`, which a
timing script replays (AttentionPlan.run) against torch's scaled_dot_product_attention on the same float16 tensors.
The checks, shapes and outputs are flash_prefill's; what differs is the dtype (tensor cores multiply float16) and
that the kernel moves q, k and v with 16-byte loads, so their first elements must sit at 16-byte aligned addresses.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.backend import array_module
from ..core.errors import InputError
from .loader import array_param, backend_of, get_kernel, scalar_param, source_constant
from .plan import HEAD_DIMS, AttentionPlan, check_aligned16, check_prefill_inputs

WMMA_FILE = "flash_prefill_wmma.cu"
WMMA_EXPRESSIONS = tuple(f"flash_prefill_wmma<{d}>" for d in HEAD_DIMS)
HALF_BYTES, FLOAT_BYTES = 2, 4


def wmma_shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one block: k_tile and v_tile (BK, d + 8) float16, and per warp s_tile (16, BK + 4)
    float32, p_tile (16, BK + 8) float16 and row_scale (16,) float32 (flash_prefill_wmma.cu's layout)."""
    c = lambda name: source_constant(WMMA_FILE, name)
    block_k, tile, warps = c("WMMA_BLOCK_K"), c("WMMA_TILE"), c("WMMA_WARPS")
    kv = 2 * block_k * (head_dim + c("WMMA_HALF_PAD")) * HALF_BYTES
    per_warp = tile * ((block_k + c("WMMA_FLOAT_PAD")) * FLOAT_BYTES + (block_k + c("WMMA_HALF_PAD")) * HALF_BYTES
                       + FLOAT_BYTES)
    return kv + warps * per_warp


def plan_flash_prefill_wmma(q, k, v, *, module=None) -> AttentionPlan:
    """Check the inputs, allocate out (float16) and lse (float32), prepare the launch of flash_prefill_wmma.

    q (B, H, Tq, d), k and v (B, K, Tk, d), all float16 -> plan whose run() returns (out, lse) as flash_prefill.
    `module`: a module built from an edited flash_prefill_wmma.cu (loader.build_module) instead of the shipped one.
    """
    B, H, Tq, d, K, Tk = check_prefill_inputs(q, k, v)
    if q.dtype != np.float16:
        raise InputError(f"the tensor-core prefill takes float16 q, k, v (tensor cores multiply float16); got "
                         f"{q.dtype}: use variant='cuda_cores' or convert")
    check_aligned16(q=q, k=k, v=v)

    backend = backend_of(q)
    xp = array_module(q)
    params = (array_param("q", np.float16), array_param("k", np.float16), array_param("v", np.float16),
              array_param("out", np.float16), array_param("lse", np.float32), scalar_param("num_heads", np.int32),
              scalar_param("num_kv_heads", np.int32), scalar_param("q_len", np.int32),
              scalar_param("kv_len", np.int32), scalar_param("scale", np.float32))
    kernel = get_kernel(WMMA_FILE, f"flash_prefill_wmma<{d}>", params, backend, WMMA_EXPRESSIONS, module)

    out = xp.empty((B, H, Tq, d), dtype=np.float16)                         # (B, H, Tq, d)
    lse = xp.empty((B, H, Tq), dtype=np.float32)                            # (B, H, Tq)
    grid = (-(-Tq // source_constant(WMMA_FILE, "WMMA_BLOCK_Q")), H, B)
    block = (source_constant(WMMA_FILE, "WMMA_THREADS"),)
    launch = kernel.prepare(grid, block, (q, k, v, out, lse, np.int32(H), np.int32(K), np.int32(Tq), np.int32(Tk),
                                          np.float32(1.0 / math.sqrt(d))),
                            shared_mem=wmma_shared_bytes(d))
    return AttentionPlan([launch], out, lse)
