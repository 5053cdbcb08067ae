"""Checked mode: before a paged-decode launch, read its block tables and lengths on the host and name a bad entry.

A kernel trusts its indices. A block id past the pool makes paged_decode read memory that is not the cache: on the
CPU runner that is garbage or a crash, on a GPU an "illegal address" that ends the CUDA context and says nothing of
which sequence or table slot was wrong. NumPy inputs are always checked (the check is a few comparisons on arrays
already on the host). CuPy inputs are checked only in checked mode, `MINITRANSFORMER_CHECKED=1`, because reading
the tables back costs a device-to-host copy and a synchronisation before every launch. The tests run in checked mode
(tests/conftest.py); lesson 11 shows the block tables the kernel reads.

A CUDA graph capture cannot copy to the host, so in checked mode a capture of paged decode is refused with that
reason and the serving engine runs its decode steps plainly, each one checked.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from ..core.backend import to_host
from ..core.errors import DeviceError, InputError

CHECKED_ENV = "MINITRANSFORMER_CHECKED"


def checked_mode() -> bool:
    """True when $MINITRANSFORMER_CHECKED is set to anything but "", 0, false, no or off (read at every call)."""
    return os.environ.get(CHECKED_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def check_block_tables(block_tables, seq_lens, block_size: int, num_blocks: int) -> None:
    """Raise InputError naming the first bad entry: a length outside the table, or a block id outside the pool.

    block_tables (B, max_blocks) and seq_lens (B,), NumPy or CuPy (copied to the host first). Only the slots a
    sequence's length reaches are read by the kernel, so only those must hold real blocks; the rest may be anything.
    """
    if _capturing(block_tables):
        raise DeviceError(f"checked mode ({CHECKED_ENV}=1) reads block tables on the host before each paged-decode "
                          f"launch, which a CUDA graph capture cannot record; unset {CHECKED_ENV} to capture graphs")
    tables = to_host(block_tables)                                       # (B, max_blocks)
    lens = to_host(seq_lens).astype(np.int64)                            # (B,)
    max_blocks = tables.shape[1]
    capacity = max_blocks * block_size
    bad_lens = np.flatnonzero((lens < 0) | (lens > capacity))
    if bad_lens.size:
        b = int(bad_lens[0])
        raise InputError(f"seq_lens[{b}] = {int(lens[b])} lies outside [0, {capacity}] (the table's {max_blocks} "
                         f"slots x block_size {block_size}){_more(bad_lens.size, 'length')}")
    reached = np.arange(max_blocks) < -(-lens[:, None] // block_size)    # (B, max_blocks): slots the kernel reads
    bad = reached & ((tables < 0) | (tables >= num_blocks))              # (B, max_blocks)
    if bad.any():
        b, slot = (int(i) for i in np.argwhere(bad)[0])
        raise InputError(f"block_tables[{b}, {slot}] = {int(tables[b, slot])} is not a block of the pool: sequence "
                         f"{b} (length {int(lens[b])}) reads table slot {slot}, and the pool has {num_blocks} blocks "
                         f"(ids 0..{num_blocks - 1}){_more(int(bad.sum()), 'block id')}")


def _more(count: int, what: str) -> str:
    return f"; {count - 1} more bad {what}{'s' if count > 2 else ''}" if count > 1 else ""


def _capturing(array) -> bool:
    """Is the current CUDA stream being captured? Only a CuPy array can be, and then CuPy is already imported."""
    cupy = None if isinstance(array, np.ndarray) else sys.modules.get("cupy")
    return cupy is not None and cupy.cuda.get_current_stream().is_capturing()
