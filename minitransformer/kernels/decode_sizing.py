"""How a paged-decode launch is sized: which kernel, how many threads, how much shared memory, how long a partition.

Two kernels compute the same thing (lesson 11): "bandwidth" (paged_decode.cu, the default) is built to stream the
KV cache at the memory's speed, "simple" (paged_decode_simple.cu) is the plainer version it grew from, kept to compare
with. The partition length decides how many blocks the grid has: (partitions x K x B). Decode at batch 1 has only K
(sequence, KV head) pairs, so without splitting the context a 132-SM GPU would run 3 blocks; the bandwidth kernel's
partitions are cut short enough that the grid gives every SM DECODE_BLOCKS_PER_SM blocks, and no shorter (each
partition costs a partial result the merge kernel reads back). kernels/sass_report.py estimates what each size
reaches.
"""

from __future__ import annotations

from functools import cache

from ..core.errors import InputError
from .loader import MAX_SHARED_BYTES, source_constant

DECODE_VARIANTS = {"bandwidth": "paged_decode.cu", "simple": "paged_decode_simple.cu"}
PARTITION_KERNELS = {"bandwidth": "paged_decode_partition", "simple": "paged_decode_simple_partition"}
TYPE_NAMES = ("float", "__half")                       # the storage types both files instantiate
HEAD_DIMS = (64, 128)

# The GPU the CPU runner sizes its launches for (and the report's default): an H200 SXM, like an H100 SXM, has 132
# SMs (NVIDIA H200 Tensor Core GPU datasheet; NVIDIA Hopper architecture whitepaper). On a GPU the count is read
# from the device.
DEFAULT_NUM_SMS = 132
DECODE_BLOCKS_PER_SM = 4        # blocks per SM the grid aims at: one full wave at the kernel's register occupancy
SIMPLE_PARTITION = 512          # the simple kernel's fixed partition length (tokens)
MAX_PARTITION = 512             # the longest partition the sizing picks (shared memory holds its scores)
FLOAT_BYTES = 4


def decode_expressions(variant: str) -> tuple[str, ...]:
    """The template instantiations of one variant's file: its partition kernel and the merge kernel."""
    return tuple(f"{kernel}<{t}, {d}>" for kernel in (PARTITION_KERNELS[variant], "paged_decode_merge")
                 for t in TYPE_NAMES for d in HEAD_DIMS)


def check_variant(variant: str) -> None:
    if variant not in DECODE_VARIANTS:
        raise InputError(f"unknown paged decode variant {variant!r}; choose one of {', '.join(DECODE_VARIANTS)}")


def decode_threads(variant: str, head_dim: int) -> int:
    """Threads per partition block: DECODE_WARPS warps (bandwidth), or one per dimension of the head (simple)."""
    if variant == "simple":
        return head_dim
    return source_constant(DECODE_VARIANTS[variant], "DECODE_WARPS") * 32


def decode_shared_bytes(group: int, head_dim: int, partition_size: int, block_size: int,
                        variant: str = "bandwidth") -> int:
    """Dynamic shared memory of one partition block.

    bandwidth: scores (G, P), sums (G,), each warp's share of the output (warps, G, d), block ids (P / block_size,);
    simple: q (G, d), scores (G, P), sums (G,), block ids.
    """
    block_ids = 4 * (partition_size // block_size)
    if variant == "simple":
        return FLOAT_BYTES * (group * head_dim + group * partition_size + group) + block_ids
    warps = source_constant(DECODE_VARIANTS[variant], "DECODE_WARPS")
    return FLOAT_BYTES * (group * partition_size + group + warps * group * head_dim) + block_ids


@cache
def _cupy_sm_count(device_id: int) -> int:
    import cupy
    return int(cupy.cuda.Device(device_id).attributes["MultiProcessorCount"])


def device_sm_count(backend: str) -> int:
    """The current GPU's SM count (CuPy), or DEFAULT_NUM_SMS on the CPU runner."""
    if backend == "cupy":
        import cupy
        return _cupy_sm_count(cupy.cuda.Device().id)
    return DEFAULT_NUM_SMS


def choose_partition_size(variant: str, batch: int, kv_heads: int, max_tokens: int, block_size: int, group: int,
                          head_dim: int, num_sms: int) -> int:
    """Tokens per partition (a multiple of block_size) for a grid of about num_sms x DECODE_BLOCKS_PER_SM blocks.

    At least one cache block per warp (shorter partitions leave warps idle), at most MAX_PARTITION tokens and what
    shared memory holds. The simple kernel keeps its fixed SIMPLE_PARTITION.
    """
    if variant == "simple":
        return max(block_size, SIMPLE_PARTITION // block_size * block_size)
    warps = source_constant(DECODE_VARIANTS[variant], "DECODE_WARPS")
    per_sequence = -(-num_sms * DECODE_BLOCKS_PER_SM // max(1, batch * kv_heads))   # partitions per (b, KV head)
    size = -(-max(1, max_tokens) // per_sequence)
    size = -(-size // block_size) * block_size                                       # round up to whole blocks
    size = max(size, warps * block_size)
    size = min(size, max(block_size, MAX_PARTITION // block_size * block_size))
    while size > block_size and decode_shared_bytes(group, head_dim, size, block_size, variant) > MAX_SHARED_BYTES:
        size -= block_size
    return size
