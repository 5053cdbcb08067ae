"""Paged KV cache and block manager: paged attention == contiguous attention, the flat ragged forward == the model's
own forward, slot mapping, reference counts, prefix-cache hashing and LRU eviction."""

import numpy as np
import pytest

from minitransformer.core.attention import ArrayAttention, SlidingWindowAttention
from minitransformer.core.errors import InputError
from minitransformer.core.kv_cache import KVCache
from minitransformer.core.layers import attention
from minitransformer.core.request import Request
from minitransformer.core.sampling_params import SamplingParams
from minitransformer.serving import BlockManager, PagedKVCache
from minitransformer.serving.paged_cache import PagedStep, length_groups
from minitransformer.serving.sequence import Sequence


def make_seq(tokens, rid="r"):
    """A Sequence with just what the block manager reads (request id and tokens)."""
    request = Request(rid, None, [int(t) for t in tokens], SamplingParams(), 0.0)
    return Sequence(request, None, 10**6, kv_bytes=lambda tokens: 0)


def test_paged_attention_equals_contiguous_attention(tiny_model):
    cfg = tiny_model.config
    rng = np.random.default_rng(0)
    B, num_blocks = 4, 24
    cache = PagedKVCache(cfg, num_blocks, B)
    K, H, d = cfg.n_kv_heads, cfg.n_heads, cfg.head_dim
    lengths = [1, 4, 7, 13]                                    # one token, one exact block, partial blocks
    physical = rng.permutation(num_blocks)                     # blocks scattered through the pool
    tables, used = [], 0
    for L in lengths:
        n = -(-L // B)
        tables.append(list(physical[used:used + n]))
        used += n
    keys = [rng.normal(size=(K, L, d)).astype(np.float32) for L in lengths]
    values = [rng.normal(size=(K, L, d)).astype(np.float32) for L in lengths]
    for table, k, v, L in zip(tables, keys, values, lengths):
        slots = np.array([table[p // B] * B + p % B for p in range(L)])
        cache.write(1, slots, k, v)
    # decodes of all four in one padded batch: the query at the last position of each
    width = max(map(len, tables))
    padded = np.array([t + [0] * (width - len(t)) for t in tables])
    q = rng.normal(size=(4, H, 1, d)).astype(np.float32)
    q_pos = np.array([[L - 1] for L in lengths])
    arrays = ArrayAttention()
    paged = arrays.paged_decode(cache, 1, q[:, :, 0], q_pos[:, 0], q_pos[:, 0] + 1, padded)[:, :, None]   # (4, H, 1, d)
    for row, L in enumerate(lengths):
        ref = attention(q[row:row + 1], keys[row][None], values[row][None], q_pos[row:row + 1],
                        np.arange(L)[None])
        np.testing.assert_allclose(paged[row:row + 1], ref, atol=1e-5, rtol=0)
    # a prefill chunk of the longest: queries at positions 9..12 against its whole prefix
    qc = rng.normal(size=(1, H, 4, d)).astype(np.float32)
    pos = np.arange(9, 13)[None]
    paged = arrays.paged_chunk(cache, 1, qc, pos, np.array([tables[3]]), num_keys=13)
    ref = attention(qc, keys[3][None], values[3][None], pos, np.arange(13)[None])
    np.testing.assert_allclose(paged, ref, atol=1e-5, rtol=0)
    assert paged.dtype == np.float32


def test_length_groups_bound_each_rows_padding():
    """Rows sorted by length split where the next row needs more than twice the blocks of its group's first row."""
    lengths = [1, 4, 5, 9, 16, 17, 40, 41, 200]                 # blocks of 4: 1 1 2 3 4 5 10 11 50
    groups = length_groups(lengths, 4)
    assert groups == [(0, 3, 2), (3, 6, 5), (6, 8, 11), (8, 9, 50)]
    for first, end, blocks in groups:                          # each group gathered to its longest row only
        assert blocks == -(-lengths[end - 1] // 4) <= 2 * -(-lengths[first] // 4)
    assert length_groups([], 4) == [] and length_groups([7] * 5, 4) == [(0, 5, 2)]


@pytest.mark.parametrize("window", [0, 3])
def test_a_step_attends_in_groups_as_in_one_padded_batch(tiny_model, window):
    """PagedStep.decode per group of similar length == one call over the batch padded to its longest row, and both
    == attention over each row's own keys; with a sliding window (SlidingWindowAttention) the keys out of the window
    are masked in the decode and in a prefill chunk alike."""
    cfg = tiny_model.config
    rng = np.random.default_rng(2)
    B, num_blocks, layer = 4, 40, 1
    cache = PagedKVCache(cfg, num_blocks, B)
    K, H, d = cfg.n_kv_heads, cfg.n_heads, cfg.head_dim
    lengths = [2, 3, 6, 9, 21, 30]                              # ascending, as model_runner.prepare orders decodes
    physical = list(rng.permutation(num_blocks))
    tables = [[int(physical.pop()) for _ in range(-(-L // B))] for L in lengths]
    keys = [rng.normal(size=(K, L, d)).astype(np.float32) for L in lengths]
    values = [rng.normal(size=(K, L, d)).astype(np.float32) for L in lengths]
    for table, k, v, L in zip(tables, keys, values, lengths):
        cache.write(layer, np.array([table[p // B] * B + p % B for p in range(L)]), k, v)
    width = max(map(len, tables))
    padded = np.array([t + [0] * (width - len(t)) for t in tables])
    positions = np.array(lengths) - 1
    q = rng.normal(size=(len(lengths), H, d)).astype(np.float32)
    backend = SlidingWindowAttention(window) if window else ArrayAttention()
    groups = length_groups(lengths, B)
    assert len(groups) > 1
    step = lambda groups: PagedStep(cache, np.zeros(0, dtype=np.int64), len(lengths), positions, positions + 1,
                                    padded, decode_groups=groups)
    grouped, one_batch = step(groups).decode(layer, q, backend), step(None).decode(layer, q, backend)
    np.testing.assert_allclose(grouped, one_batch, atol=1e-6, rtol=0)
    for row, L in enumerate(lengths):
        ref = attention(q[row:row + 1, :, None], keys[row][None], values[row][None], positions[row:row + 1, None],
                        np.arange(L)[None], window)[:, :, 0]
        np.testing.assert_allclose(grouped[row:row + 1], ref, atol=1e-5, rtol=0)
    # a prefill chunk of the longest: queries at positions 20..29 against its whole prefix
    qc = rng.normal(size=(1, H, 10, d)).astype(np.float32)
    pos = np.arange(20, 30)[None]
    chunk = backend.paged_chunk(cache, layer, qc, pos, np.array([tables[-1]]), num_keys=30)
    ref = attention(qc, keys[-1][None], values[-1][None], pos, np.arange(30)[None], window)
    np.testing.assert_allclose(chunk, ref, atol=1e-5, rtol=0)


def test_flat_forward_through_the_paged_cache_equals_the_contiguous_forward(tiny_model):
    """Three sequences in one flat pass (a whole prompt, a chunk continuing a cached prefix, a decode) give the same
    logits as the model's own forward with a contiguous KVCache, to 1e-5 + 1e-6 relative (float32 rounding)."""
    from minitransformer.serving import model_runner
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(3, 250, size=n)) for n in (9, 21, 6)]
    bm = BlockManager(32, 4, enable_prefix_caching=False)
    cache = PagedKVCache(tiny_model.config, 32, 4)
    seqs = [make_seq(p, f"s{i}") for i, p in enumerate(prompts)]
    # step 1: the first 16 tokens of s1 and the first 5 of s2 (partial chunks: nothing sampled)
    first = [(seqs[1], 16), (seqs[2], 5)]
    for seq, n in first:
        assert bm.allocate_slots(seq, n)
    inputs = model_runner.prepare(first, bm, np)
    assert inputs.logits_rows == [] and inputs.num_decodes == 0
    model_runner.execute(tiny_model, cache, inputs)
    for seq, n in first:
        seq.num_computed_tokens += n
    # step 2: all of s0, the rest of s1 (5 tokens), the last token of s2 (a 1-token step, batched as a decode)
    second = [(seqs[0], 9), (seqs[1], 5), (seqs[2], 1)]
    for seq, n in second:
        assert bm.allocate_slots(seq, n)
    inputs = model_runner.prepare(second, bm, np)
    assert inputs.num_decodes == 1 and [s.request_id for s in inputs.sampled] == ["s2", "s0", "s1"]
    logits = model_runner.execute(tiny_model, cache, inputs)                     # (3, V)
    for row, i in enumerate((2, 0, 1)):
        kv = KVCache(tiny_model.config, len(prompts[i]))
        ref = tiny_model.forward(np.array([prompts[i]]), np.arange(len(prompts[i]))[None], kv, last_only=True)
        # float32, two summation orders (a 3-sequence flat batch vs one sequence: BLAS blocks the products
        # differently): a few ulp of each logit, so relative to its size (2 ulp of a logit of 48 is 1.1e-5)
        np.testing.assert_allclose(logits[row], ref[0], atol=1e-5, rtol=1e-6)


def test_slot_mapping_reference_counts_and_free():
    bm = BlockManager(6, 4)
    a, b = make_seq(range(3, 12), "a"), make_seq(range(50, 55), "b")
    assert bm.allocate_slots(a, 9)                                  # 3 blocks
    assert bm.allocate_slots(b, 5)                                  # 2 blocks
    assert bm.num_free_blocks == 1 and bm.usage == pytest.approx(5 / 6)
    t = bm.block_tables["a"]
    assert bm.slot_mapping(a, 0, 9) == [t[p // 4] * 4 + p % 4 for p in range(9)]
    assert len(set(bm.block_tables["a"]) | set(bm.block_tables["b"])) == 5
    c = make_seq(range(9), "c")
    assert not bm.allocate_slots(c, 9)                              # needs 3, 1 free: refused, nothing changed
    assert "c" not in bm.block_tables and bm.num_free_blocks == 1
    bm.check()
    bm.free(a)
    bm.free(b)
    bm.check()
    assert bm.num_free_blocks == 6 and all(r == 0 for r in bm.ref_counts)


def test_prefix_cache_shares_full_blocks_and_recomputes_the_last_token():
    bm = BlockManager(8, 4)
    prompt = list(range(10, 22))                                     # 12 tokens = exactly 3 blocks
    a = make_seq(prompt, "a")
    assert bm.find_cached_prefix(a) == []
    assert bm.allocate_slots(a, 12)
    a.num_computed_tokens = 12
    bm.cache_full_blocks(a)
    assert len(bm.cached_blocks) == 3
    b = make_seq(prompt, "b")                                        # same 12 tokens: a 100% prompt hit ...
    hit = bm.find_cached_prefix(b)
    assert hit == bm.block_tables["a"][:2]                           # ... but the last token is recomputed, so the
    assert bm.allocate_slots(b, 12 - 8, hit)                         # last block is not taken (token 11 lives in it)
    assert [bm.ref_counts[x] for x in hit] == [2, 2]
    assert bm.block_tables["b"][:2] == hit and bm.block_tables["b"][2] != bm.block_tables["a"][2]
    c = make_seq(prompt + [99], "c")                                 # 13 tokens: all 3 full blocks are reused
    assert bm.find_cached_prefix(c) == bm.block_tables["a"]
    d = make_seq([10, 11, 12, 99] + prompt[4:], "d")                 # differs in block 0: the chain breaks at once
    assert bm.find_cached_prefix(d) == []
    bm.check()


def test_freed_cached_blocks_are_found_until_evicted_oldest_first():
    bm = BlockManager(4, 4)
    a = make_seq(list(range(3, 11)) + [0], "a")                      # 9 tokens: 2 full blocks + 1
    assert bm.allocate_slots(a, 9)
    a.num_computed_tokens = 9
    bm.cache_full_blocks(a)
    blocks = list(bm.block_tables["a"])
    bm.free(a)                                                       # all free, both full blocks still cached
    assert bm.num_free_blocks == 4 and len(bm.cached_blocks) == 2
    again = make_seq(list(range(3, 11)) + [5], "again")
    assert bm.find_cached_prefix(again) == blocks[:2]
    # a 2-block allocation takes the never-used block first, then a's tail block (freed before its prefix blocks)
    other = make_seq(range(100, 108), "other")
    assert bm.allocate_slots(other, 8)
    assert blocks[2] in bm.block_tables["other"]                       # the uncached tail went first
    assert bm.find_cached_prefix(again) == blocks[:2]
    one_more = make_seq(range(200, 204), "one_more")
    assert bm.allocate_slots(one_more, 4)                            # evicts blocks[1] (freed before blocks[0])
    assert bm.block_tables["one_more"] == [blocks[1]]
    assert bm.find_cached_prefix(again) == blocks[:1]                 # the chain now ends after block 0
    bm.check()


def test_pool_and_block_sizes_are_checked(tiny_model):
    with pytest.raises(InputError, match="at least 1 block"):
        BlockManager(0, 16)
    cache = PagedKVCache(tiny_model.config, 10, 16)
    c = tiny_model.config
    assert cache.k.shape == (c.n_layers, 10, 16, c.n_kv_heads, c.head_dim)
    assert cache.bytes_total == 10 * cache.bytes_per_block == 2 * cache.k.nbytes
