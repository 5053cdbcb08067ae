"""Exercise 11: the paged KV cache's slot mapping.

The serving engine keeps every sequence's keys and values in one pool of fixed-size blocks (block_size tokens each;
16 by default, 4 in this exercise's run). A sequence does not own a contiguous range: it owns a *block table*, the
physical block id of each of its logical blocks, handed out one at a time from the free list as it grows, so after a
few requests have come and gone the table looks like [29, 28, 27, 7]. Before each forward, every token to compute
gets its *slot*, the row of the pool its keys and values are written to:

    slot(p) = block_table[p // block_size] * block_size + p % block_size

Shapes: block_table a list of ints (one per logical block; len >= ceil(end / block_size)), start <= end positions of
the sequence (a prefill chunk is [computed, computed + n), a decode [p, p + 1)), block_size an int. Returns a list of
end - start ints, one slot per position, in order. The pool is k[layer]: (num_blocks, block_size, kv_heads=3,
head_dim=64) for SmolLM2, and the slot indexes its first two axes flattened.

Pitfalls: p // block_size is the *logical* block; the table turns it into the physical one (forget the table and
every sequence writes over the others' keys). Positions start at 0: position block_size is the first slot of logical
block 1. The range is [start, end): end is not included.

Check it: `minitransformer learn check paged_slots`. Stuck: `minitransformer learn hint paged_slots`.
"""


def slot_mapping(block_table, start, end, block_size):
    raise NotImplementedError("write slot_mapping")
