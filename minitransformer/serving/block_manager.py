"""The block manager: KV-cache memory as fixed-size blocks, handed out on demand (vLLM's KVCacheManager).

Why blocks: a contiguous cache must reserve prompt + max_tokens for every request up front, and most of that stays
empty (requests stop early; max_tokens is a guess). Here memory is `num_blocks` blocks of `block_size` tokens; a
sequence owns a *block table* (the physical block of each of its logical blocks) that grows one block at a time, so
at most block_size - 1 slots per sequence are ever unused. Token at position p lives in slot

    block_table[p // block_size] * block_size + p % block_size              (`slot_mapping`)

Prefix caching (vLLM's automatic prefix caching): a *full* block is named by a chained hash of its tokens and of
the hash of the block before it, so equal hashes mean equal whole prefixes. When a new request starts with blocks
already in the cache (a shared system prompt), their keys and values are reused, not recomputed: the block's
reference count goes up and it appears in both tables. The last token of a sequence is always recomputed, even on a
full hit, because its logits are needed to sample the next token. Freed blocks keep their hash and stay findable
until a new allocation evicts them, oldest freed first (LRU); a shared block is never written to again, because only
full blocks are shared and a sequence only writes past its end.

A sequence's `cache_salt` (vLLM's name) seeds its first block's hash, so blocks are found only by sequences with the
same salt. A cache hit is visible from outside (the hit counters, and a faster first token), so without a salt one
tenant could learn whether another sent a given prompt by sending it and watching; the server salts each tenant's
requests with its own salt. The salt is hashed with Python's string hash, which is keyed anew in every process, so
nobody outside can compute which token blocks would collide with another salt's.

Counters as vLLM counts them, in tokens: prefix_cache_queries (tokens looked up) and prefix_cache_hits (found).
Invariants (check() asserts them): every reference count >= 0; a block is in the free queue iff its count is 0;
the blocks in all tables are exactly the blocks with a count > 0, each counted once per table holding it.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Sequence

from ..core.errors import InputError


class BlockState(enum.Enum):
    """One KV block, as the live page colours it."""
    FREE = "free"                    # no block table holds it, and it holds no cached prefix
    USED = "used"                    # in exactly one block table
    SHARED = "shared"                # in several block tables (a prefix-cache hit)
    CACHED = "cached"                # free, but still holding a cached prefix that a new request can revive


class BlockManager:
    """Free list, reference counts, per-request block tables and the prefix cache of one KV pool."""

    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise InputError(f"the KV pool needs at least 1 block of at least 1 token; got {num_blocks} blocks "
                             f"of {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        # Free blocks in eviction order (front = evicted first). An OrderedDict gives O(1) removal of a block that
        # a prefix hit takes back out of the middle of the queue.
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.block_hash: list[int | None] = [None] * num_blocks      # hash of a full cached block, else None
        self.cached_blocks: dict[int, int] = {}                      # hash -> block id
        self.block_tables: dict[str, list[int]] = {}                 # request id -> its block table
        self.block_hashes: dict[str, list[int]] = {}                 # request id -> hashes of its full blocks
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ------------------------------------------------------------------ sizes

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (vLLM's kv_cache_usage): cached-but-free blocks count as free."""
        return 1.0 - len(self.free_queue) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_states(self) -> list[BlockState]:
        """Every block's state, in block order (one pass over the pool: call it for a snapshot, not per step)."""
        return [BlockState.SHARED if refs > 1 else BlockState.USED if refs == 1
                else BlockState.CACHED if cached is not None else BlockState.FREE
                for refs, cached in zip(self.ref_counts, self.block_hash)]

    # ------------------------------------------------------------------ prefix cache

    def hash_blocks(self, token_ids: list[int], parent: int | None = None) -> list[int]:
        """Chained hashes of the full blocks of `token_ids`: hash i covers tokens [0, (i + 1) * block_size).

        Python's hash of a tuple of ints is deterministic (string hashing is salted, int hashing is not); vLLM
        uses sha256 to make collisions impossible in practice across processes, which we do not need here.
        """
        B = self.block_size
        hashes = []
        for start in range(0, len(token_ids) - B + 1, B):
            parent = hash((parent, tuple(token_ids[start:start + B])))
            hashes.append(parent)
        return hashes

    def find_cached_prefix(self, seq) -> list[int]:
        """The cached blocks that hold the longest prefix of `seq` (not its last token): block ids for
        allocate_slots. Only for a sequence with nothing computed; the scheduler counts the query once admitted.
        """
        if not self.enable_prefix_caching:
            return []
        usable = seq.token_ids(0, seq.num_tokens - 1)          # the last token is always recomputed
        blocks = []
        for h in self.hash_blocks(usable, salt_hash(seq)):
            block = self.cached_blocks.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    # ------------------------------------------------------------------ allocation

    def allocate_slots(self, seq, num_new_tokens: int, cached_blocks: Sequence[int] = ()) -> bool:
        """Make seq's table cover its cached blocks + computed tokens + num_new_tokens; False (nothing changed) if
        the free blocks do not suffice. Cached blocks that sit in the free queue are taken out of it, not evicted."""
        table = self.block_tables.setdefault(seq.request_id, seq.block_table)
        covered = (len(cached_blocks) * self.block_size if cached_blocks else seq.num_computed_tokens) \
            + num_new_tokens
        new_blocks = self.blocks_needed(covered) - len(table) - len(cached_blocks)
        revived = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        if new_blocks > self.num_free_blocks - revived:
            if not table:
                del self.block_tables[seq.request_id]
            return False
        for block in cached_blocks:
            if self.ref_counts[block] == 0:
                del self.free_queue[block]
            self.ref_counts[block] += 1
            table.append(block)
        if cached_blocks:
            self.block_hashes[seq.request_id] = [self._hash_of_cached(b) for b in cached_blocks]
        for _ in range(max(0, new_blocks)):
            block, _ = self.free_queue.popitem(last=False)     # the least recently freed block
            evicted_hash = self.block_hash[block]
            if evicted_hash is not None:                       # evict it from the prefix cache
                del self.cached_blocks[evicted_hash]
                self.block_hash[block] = None
            self.ref_counts[block] = 1
            table.append(block)
        return True

    def _hash_of_cached(self, block: int) -> int:
        """The hash of a block found in the prefix cache (only full, hashed blocks are ever found there)."""
        block_hash = self.block_hash[block]
        assert block_hash is not None, f"block {block} came from the prefix cache but has no hash"
        return block_hash

    def cache_full_blocks(self, seq) -> None:
        """After a step: name seq's newly completed full blocks so later requests can reuse them."""
        if not self.enable_prefix_caching:
            return
        hashes = self.block_hashes.setdefault(seq.request_id, [])
        num_full = seq.num_computed_tokens // self.block_size
        if num_full <= len(hashes):
            return
        first = len(hashes)
        hashes += self.hash_blocks(seq.token_ids(first * self.block_size, num_full * self.block_size),
                                   hashes[-1] if hashes else salt_hash(seq))
        table = self.block_tables[seq.request_id]
        for index in range(first, num_full):
            block, h = table[index], hashes[index]
            if self.block_hash[block] is None and h not in self.cached_blocks:
                self.block_hash[block] = h
                self.cached_blocks[h] = block

    def free(self, seq) -> None:
        """Give back seq's blocks (finished, aborted or preempted). Tail blocks go to the queue first, so they are
        evicted before the prefix blocks other requests are more likely to share (vLLM frees in reverse too)."""
        table = self.block_tables.pop(seq.request_id, [])
        self.block_hashes.pop(seq.request_id, None)
        for block in reversed(table):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                self.free_queue[block] = None
        seq.block_table = []

    def slot_mapping(self, seq, start: int, end: int) -> list[int]:
        """Cache slot of each of seq's tokens at positions [start, end)."""
        B, table = self.block_size, self.block_tables[seq.request_id]
        return [table[p // B] * B + p % B for p in range(start, end)]

    # ------------------------------------------------------------------ invariants (tests call this every step)

    def check(self) -> None:
        counts = [0] * self.num_blocks
        for table in self.block_tables.values():
            for block in table:
                counts[block] += 1
        assert all(c >= 0 for c in self.ref_counts), "negative reference count"
        assert counts == self.ref_counts, "reference counts disagree with the block tables"
        assert set(self.free_queue) == {b for b in range(self.num_blocks) if counts[b] == 0}, "free queue wrong"
        assert all(self.block_hash[b] == h for h, b in self.cached_blocks.items()), "prefix cache map wrong"


def salt_hash(seq) -> int | None:
    """The parent of a sequence's first block hash: None without a salt, else a hash of the salt."""
    salt = getattr(seq, "cache_salt", None)
    return None if salt is None else hash(("cache_salt", salt))
