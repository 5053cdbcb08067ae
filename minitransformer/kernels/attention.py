"""The attention kernels as Python functions: check the shapes, size the launch, call the kernel (lesson 11).

Both functions take NumPy arrays (the kernel then runs on the CPU runner, compiled by g++ from the same .cu file)
or CuPy arrays (it runs on the GPU), and return arrays of the same kind. Launch sizes (rows per block, threads)
are read from the `constexpr int`s of the .cu files, so the Python side cannot drift from the source.

Shape letters as in layers.py: B batch, H query heads, K KV heads, G = H // K, Tq queries, Tk keys, d head_dim.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.backend import array_module
from ..core.errors import InputError
from .checked import check_block_tables, checked_mode
from .decode_sizing import (
    DECODE_VARIANTS,
    PARTITION_KERNELS,
    check_variant,
    choose_partition_size,
    decode_expressions,
    decode_shared_bytes,
    decode_threads,
    device_sm_count,
)
from .loader import (
    CUDA_TYPE_NAMES,
    MAX_SHARED_BYTES,
    array_param,
    backend_of,
    get_kernel,
    scalar_param,
    source_constant,
)
from .plan import (
    DTYPES,
    HEAD_DIMS,
    AttentionPlan,
    check_aligned16,
    check_array_storage,
    check_head_dim,
    check_heads,
    check_prefill_inputs,
)
from .prefill_wmma import plan_flash_prefill_wmma

PREFILL_FILE = "flash_prefill.cu"
DECODE_FILE = "paged_decode.cu"

PREFILL_EXPRESSIONS = tuple(f"flash_prefill<{CUDA_TYPE_NAMES[t]}, {d}>" for t in DTYPES for d in HEAD_DIMS)
DECODE_EXPRESSIONS = decode_expressions("bandwidth")
DECODE_SIMPLE_FILE = DECODE_VARIANTS["simple"]           # the teaching baseline (decode_sizing.py)
DECODE_SIMPLE_EXPRESSIONS = decode_expressions("simple")
FLOAT_BYTES = 4


# --------------------------------------------------------------------------------------------------- prefill ---

def prefill_shared_bytes(head_dim: int) -> int:
    """Dynamic shared memory of one flash_prefill block: q_tile (BQ, d) + k_tile (BK, d + 1) + v_tile (BK, d)."""
    block_q = source_constant(PREFILL_FILE, "PREFILL_BLOCK_Q")
    block_k = source_constant(PREFILL_FILE, "PREFILL_BLOCK_K")
    return FLOAT_BYTES * (block_q * head_dim + block_k * (head_dim + 1) + block_k * head_dim)


def flash_prefill(q, k, v, *, return_lse: bool = False, module=None, variant: str = "cuda_cores"):
    """Causal GQA attention of Tq queries, the last Tq of Tk positions, through the tiled kernel.

    q (B, H, Tq, d), k and v (B, K, Tk, d) -> out (B, H, Tq, d) of q's dtype, and lse (B, H, Tq) float32 (the
    natural log of each row's softmax denominator over the scaled scores) when `return_lse`.
    `module`: a module built from an edited .cu file of the variant (loader.build_module) instead of the shipped one.
    `variant`: "cuda_cores" (flash_prefill.cu, float32 or float16) or "wmma" (flash_prefill_wmma.cu: tensor
    cores, float16 only; prefill_wmma.py).
    """
    out, lse = plan_flash_prefill(q, k, v, module=module, variant=variant).run()
    return (out, lse) if return_lse else out


def plan_flash_prefill(q, k, v, *, module=None, variant: str = "cuda_cores") -> AttentionPlan:
    """Check the inputs, allocate the outputs and prepare the launch of flash_prefill (see flash_prefill)."""
    if variant == "wmma":
        return plan_flash_prefill_wmma(q, k, v, module=module)
    if variant != "cuda_cores":
        raise InputError(f"flash_prefill variant {variant!r}: choose 'cuda_cores' or 'wmma'")
    B, H, Tq, d, K, Tk = check_prefill_inputs(q, k, v)

    backend = backend_of(q)
    xp = array_module(q)
    T = q.dtype
    params = (array_param("q", T), array_param("k", T), array_param("v", T), array_param("out", T),
              array_param("lse", np.float32), scalar_param("num_heads", np.int32),
              scalar_param("num_kv_heads", np.int32), scalar_param("q_len", np.int32),
              scalar_param("kv_len", np.int32), scalar_param("scale", np.float32))
    kernel = get_kernel(PREFILL_FILE, f"flash_prefill<{CUDA_TYPE_NAMES[T]}, {d}>", params, backend,
                        PREFILL_EXPRESSIONS, module)

    out = xp.empty((B, H, Tq, d), dtype=T)                                  # (B, H, Tq, d)
    lse = xp.empty((B, H, Tq), dtype=np.float32)                            # (B, H, Tq)
    block_q = source_constant(PREFILL_FILE, "PREFILL_BLOCK_Q")
    grid = (-(-Tq // block_q), H, B)
    block = (source_constant(PREFILL_FILE, "PREFILL_THREADS"),)
    launch = kernel.prepare(grid, block, (q, k, v, out, lse, np.int32(H), np.int32(K), np.int32(Tq), np.int32(Tk),
                                          np.float32(1.0 / math.sqrt(d))),
                            shared_mem=prefill_shared_bytes(d))
    return AttentionPlan([launch], out, lse)


# ---------------------------------------------------------------------------------------------------- decode ---

def paged_decode(q, k_cache, v_cache, block_tables, seq_lens, *, partition_size: int | None = None,
                 return_lse: bool = False, module=None, variant: str = "bandwidth", num_sms: int | None = None):
    """One query per sequence against a paged KV cache, split over partitions of `partition_size` tokens.

    q (B, H, d); k_cache, v_cache (num_blocks, block_size, K, d); block_tables (B, max_blocks) int32;
    seq_lens (B,) int32 -> out (B, H, d) of q's dtype, and lse (B, H) float32 when `return_lse`.
    The grid covers max_blocks * block_size tokens (no device-to-host read of seq_lens); partitions past a
    sequence's length exit at once. With NumPy inputs seq_lens and the block ids in use are checked on the host;
    with CuPy inputs that check costs a synchronisation per step, so it runs only in checked mode (checked.py).
    `module`: a module built from an edited paged_decode.cu instead of the shipped one.
    `variant`: "bandwidth" (paged_decode.cu) or "simple" (paged_decode_simple.cu, the teaching baseline).
    `partition_size` None: sized by decode_sizing.choose_partition_size so the grid fills `num_sms` SMs (None: the
    GPU's own count, or an H200's 132 on the CPU runner); the simple variant's default is 512.
    """
    out, lse = plan_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, partition_size=partition_size,
                                 module=module, variant=variant, num_sms=num_sms).run()
    return (out, lse) if return_lse else out


def plan_paged_decode(q, k_cache, v_cache, block_tables, seq_lens, *, partition_size: int | None = None,
                      module=None, variant: str = "bandwidth", num_sms: int | None = None) -> AttentionPlan:
    """Check the inputs, allocate partials and outputs, prepare both launches of paged_decode (see paged_decode)."""
    if q.ndim != 3 or k_cache.ndim != 4 or v_cache.shape != k_cache.shape:
        raise InputError(f"paged_decode takes q (B, H, d) and k_cache, v_cache (num_blocks, block_size, K, d) of "
                         f"equal shapes; got q {q.shape}, k_cache {k_cache.shape}, v_cache {v_cache.shape}")
    B, H, d = q.shape
    num_blocks, block_size, K, d_cache = k_cache.shape
    if d_cache != d:
        raise InputError(f"q has head_dim {d} but the cache has {d_cache}")
    if block_tables.ndim != 2 or block_tables.shape[0] != B or seq_lens.shape != (B,):
        raise InputError(f"block_tables must be (B={B}, max_blocks) and seq_lens (B={B},); got "
                         f"{block_tables.shape} and {seq_lens.shape}")
    max_blocks = block_tables.shape[1]
    check_variant(variant)
    source = DECODE_VARIANTS[variant]
    max_group = source_constant(source, "DECODE_MAX_GROUP")
    group = check_heads(H, K, max_group)
    check_head_dim(d)
    backend = backend_of(q)
    if partition_size is None:
        partition_size = choose_partition_size(variant, B, K, max_blocks * block_size, block_size, group, d,
                                               num_sms or device_sm_count(backend))
    if partition_size < block_size or partition_size % block_size:
        raise InputError(f"partition_size {partition_size} must be a positive multiple of block_size {block_size}")
    shared = decode_shared_bytes(group, d, partition_size, block_size, variant)
    if shared > MAX_SHARED_BYTES:
        raise InputError(f"partition_size {partition_size} needs {shared} bytes of shared memory for {group} heads "
                         f"per group; the limit is {MAX_SHARED_BYTES}: use a smaller partition")
    check_array_storage("q", q)
    check_array_storage("k_cache", k_cache, q.dtype)
    check_array_storage("v_cache", v_cache, q.dtype)
    if variant == "bandwidth":
        check_aligned16(q=q, k_cache=k_cache, v_cache=v_cache)

    if backend == "cpu" or checked_mode():
        check_block_tables(block_tables, seq_lens, block_size, num_blocks)
    xp = array_module(q)
    T = q.dtype
    name = CUDA_TYPE_NAMES[T]
    num_partitions = max(1, -(-(max_blocks * block_size) // partition_size))

    partition_params = (array_param("q", T), array_param("k_cache", T), array_param("v_cache", T),
                        array_param("block_tables", np.int32), array_param("seq_lens", np.int32),
                        array_param("part_out", np.float32), array_param("part_max", np.float32),
                        array_param("part_sum", np.float32), scalar_param("num_heads", np.int32),
                        scalar_param("num_kv_heads", np.int32), scalar_param("block_size", np.int32),
                        scalar_param("max_blocks", np.int32), scalar_param("partition_size", np.int32),
                        scalar_param("scale", np.float32))
    merge_params = (array_param("part_out", np.float32), array_param("part_max", np.float32),
                    array_param("part_sum", np.float32), array_param("seq_lens", np.int32),
                    array_param("out", T), array_param("lse", np.float32), scalar_param("num_heads", np.int32),
                    scalar_param("partition_size", np.int32), scalar_param("num_partitions", np.int32))
    expressions = decode_expressions(variant)
    partition_kernel = get_kernel(source, f"{PARTITION_KERNELS[variant]}<{name}, {d}>", partition_params, backend,
                                  expressions, module)
    merge_kernel = get_kernel(source, f"paged_decode_merge<{name}, {d}>", merge_params, backend, expressions, module)

    part_out = xp.empty((B, H, num_partitions, d), dtype=np.float32)      # (B, H, P, d)
    part_max = xp.empty((B, H, num_partitions), dtype=np.float32)         # (B, H, P)
    part_sum = xp.empty((B, H, num_partitions), dtype=np.float32)         # (B, H, P)
    out = xp.empty((B, H, d), dtype=T)                                    # (B, H, d)
    lse = xp.empty((B, H), dtype=np.float32)                              # (B, H)

    partition = partition_kernel.prepare(
        (num_partitions, K, B), (decode_threads(variant, d),),
        (q, k_cache, v_cache, block_tables, seq_lens, part_out, part_max, part_sum, np.int32(H), np.int32(K),
         np.int32(block_size), np.int32(max_blocks), np.int32(partition_size), np.float32(1.0 / math.sqrt(d))),
        shared_mem=shared)
    merge = merge_kernel.prepare(
        (H, B), (d,),
        (part_out, part_max, part_sum, seq_lens, out, lse, np.int32(H), np.int32(partition_size),
         np.int32(num_partitions)))
    return AttentionPlan([partition, merge], out, lse, (part_out, part_max, part_sum))
