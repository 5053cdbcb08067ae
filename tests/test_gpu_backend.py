"""The GPU path's pieces, tested on the CPU where they can be: attention through the kernels (CPU runner) must give
the array implementation's tokens and logits; GPU-only parts (CuPy, CUDA graphs) skip with a reason without a GPU."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from minitransformer import load_model
from minitransformer.core.attention import ArrayAttention
from minitransformer.core.decode import decode_step
from minitransformer.core.errors import InputError
from minitransformer.core.kv_cache import KVCache
from minitransformer.core.prefill import prefill
from minitransformer.kernels.attention_backend import KernelAttention, consecutive


def has_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError or no CUDA driver
        return False


gpu = pytest.mark.skipif(not has_gpu(), reason="needs CuPy and an NVIDIA GPU (none on this machine)")


def relative_error(got, expected) -> float:
    """Max |difference| over the logits' scale: these random-weight logits reach ~20, where float32's spacing is
    ~2e-6, so summation order alone moves them by ~1e-5 absolute (measured 1.8e-5) and a bug moves them by O(1)."""
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def greedy(model, prompt, steps):
    """Greedy tokens and every step's logits through prefill + decode_step on a contiguous KVCache (batch 2)."""
    cache = KVCache(model.config, max_len=len(prompt) + steps, batch=2)
    logits = prefill(model, [prompt, prompt[::-1]], cache)                 # (2, V)
    all_logits, tokens = [logits], []
    for _ in range(steps):
        token = logits.argmax(-1)                                          # (2,)
        tokens.append(token.tolist())
        logits = decode_step(model, token, cache)
        all_logits.append(logits)
    return tokens, np.stack(all_logits)


def test_kernels_match_arrays_on_the_cpu_runner(kernel_sized_path):
    arrays = load_model(kernel_sized_path, attention="arrays")
    kernels = load_model(kernel_sized_path, attention="kernels")
    assert arrays.kernel_attention is None and isinstance(kernels.kernel_attention, KernelAttention)
    prompt = [5, 17, 42, 99, 3, 250, 7, 61, 12, 88, 140, 33, 9, 70, 21, 200, 11]  # 17: not a multiple of the block
    tokens_a, logits_a = greedy(arrays, prompt, steps=3)
    tokens_k, logits_k = greedy(kernels, prompt, steps=3)
    assert tokens_k == tokens_a
    assert relative_error(logits_k, logits_a) < 1e-5
    calls = kernels.kernel_attention.calls
    assert calls == {"flash_prefill": 2, "paged_decode": 6, "arrays": 0}   # 2 layers x (1 prefill, 3 decodes)


def test_no_cache_forward_goes_through_flash_prefill(kernel_sized_path):
    arrays = load_model(kernel_sized_path, attention="arrays")
    kernels = load_model(kernel_sized_path, attention="kernels")
    ids = np.array([[4, 8, 15, 16, 23, 42], [1, 2, 3, 5, 8, 13]])
    positions = np.broadcast_to(np.arange(3, 9), ids.shape)                # consecutive, not from 0
    expected = arrays.forward(ids, positions)                             # (2, 6, V)
    got = kernels.forward(ids, positions)
    assert relative_error(got, expected) < 1e-5
    assert kernels.kernel_attention.calls["flash_prefill"] == 2


def test_unsupported_shapes_fall_back_with_one_logged_reason(tiny_model_path, kernel_sized_path, caplog):
    """A shape the kernels are not compiled for is decided once, at load (arrays, the reason logged); positions
    that break the kernels' contract go to the arrays for that call."""
    arrays = load_model(tiny_model_path, attention="arrays")
    with caplog.at_level(logging.WARNING, logger="minitransformer.attention"):
        kernels = load_model(tiny_model_path, attention="kernels")         # head_dim 16: not compiled
        load_model(tiny_model_path, attention="kernels")
    ids = np.array([[4, 8, 15, 16]])
    positions = np.arange(4)[None]
    np.testing.assert_array_equal(kernels.forward(ids, positions), arrays.forward(ids, positions))
    reasons = [r.getMessage() for r in caplog.records if "head_dim 16" in r.getMessage()]
    assert len(reasons) <= 1 and kernels.kernel_attention is None
    assert not consecutive(np.array([[0, 2]]), np.arange(3)[None], 2, 3)
    sized = load_model(kernel_sized_path, attention="kernels")
    gapped = np.array([[0, 1, 5, 6]])                                       # not consecutive: the arrays serve it
    np.testing.assert_allclose(sized.forward(ids, gapped),
                               load_model(kernel_sized_path, attention="arrays").forward(ids, gapped), atol=1e-5)
    assert sized.kernel_attention.calls["arrays"] == sized.config.n_layers


def test_auto_means_arrays_on_the_cpu_and_bad_options_are_refused(tiny_model_path):
    assert load_model(tiny_model_path).kernel_attention is None
    with pytest.raises(InputError, match="unknown attention 'cuda'"):
        load_model(tiny_model_path, attention="cuda")
    with pytest.raises(InputError, match="NumPy has no bfloat16"):
        load_model(tiny_model_path, dtype="bfloat16")
    assert load_model(tiny_model_path, dtype="float16").weight_scheme == "f16"    # tested in test_float16.py


def test_host_inputs_are_still_range_checked(tiny_model):
    with pytest.raises(InputError, match="outside the vocabulary"):
        tiny_model.forward([[0, tiny_model.config.vocab_size]], [[0, 1]])


def test_serving_engine_decodes_through_the_paged_kernel(kernel_sized_path, monkeypatch):
    """Ragged batch in the paged cache (block size 4, sequences of different lengths): same tokens with the kernel."""
    from minitransformer.core.sampling_params import SamplingParams
    from minitransformer.serving.engine import Engine
    calls = []
    original = KernelAttention.paged_decode
    monkeypatch.setattr(KernelAttention, "paged_decode",
                        lambda self, cache, layer, q, positions, seq_lens, tables:
                        calls.append(sorted(seq_lens.tolist()))
                        or original(self, cache, layer, q, positions, seq_lens, tables))
    prompts = [[5, 17, 42, 99, 3], [250, 7, 61, 12, 88, 140, 33, 9, 70], [21, 200]]
    results = {}
    for mode in ("arrays", "kernels"):
        engine = Engine(load_model(kernel_sized_path, attention=mode), max_num_seqs=3, num_blocks=16, block_size=4)
        ids = [engine.add_request(p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2))
               for p in prompts]
        done = engine.run()
        results[mode] = [(done[i].token_ids, [[lp for _, lp in e["top"]] for e in done[i].logprobs]) for i in ids]
    for (tokens_k, top_k), (tokens_a, top_a) in zip(results["kernels"], results["arrays"]):
        assert tokens_k == tokens_a
        np.testing.assert_allclose(top_k, top_a, atol=1e-4)        # runner-ups: they move with attention
    # decodes went through the kernel; the first decode step of layer 0 attends to each prompt plus its new token
    assert calls[0] == sorted(len(p) + 1 for p in prompts)


def test_serving_engine_prefills_chunks_through_flash_prefill(kernel_sized_path, monkeypatch):
    """Prompts split over several steps by a small token budget (a chunk attends to its cached prefix and to itself)
    and an int8 pool (gathered keys are dequantized): every chunk goes through the kernel, same tokens as arrays."""
    from minitransformer.core.sampling_params import SamplingParams
    from minitransformer.serving.engine import Engine
    chunks = []
    original = KernelAttention.paged_chunk
    monkeypatch.setattr(KernelAttention, "paged_chunk",
                        lambda self, cache, layer, q, positions, table, num_keys:
                        chunks.append((layer, q.shape[2], num_keys))
                        or original(self, cache, layer, q, positions, table, num_keys))
    prompts = [[5, 17, 42, 99, 3, 8, 250, 7, 61, 12, 88, 140, 33], [9, 70, 21, 200, 4, 77, 31]]
    for kv_cache in ("f32", "int8"):
        results = {}
        for mode in ("arrays", "kernels"):
            engine = Engine(load_model(kernel_sized_path, attention=mode), max_num_seqs=2, num_blocks=16,
                            block_size=4, max_num_batched_tokens=6, kv_cache=kv_cache)
            ids = [engine.add_request(p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2))
                   for p in prompts]
            done = engine.run()
            results[mode] = [(done[i].token_ids, [[lp for _, lp in e["top"]] for e in done[i].logprobs])
                             for i in ids]
        for (tokens_k, top_k), (tokens_a, top_a) in zip(results["kernels"], results["arrays"]):
            assert tokens_k == tokens_a, kv_cache
            # the tiny model's picks are near one-hot (log-probability ~0) and hardly move with attention; the
            # runner-up's log-probability (~-20) does: a chunk that skipped its cached prefix moves it by ~2.4
            np.testing.assert_allclose(top_k, top_a, atol=1e-4)
    # (queries, keys) of each chunk at layer 0, per pool: with 6 tokens a step, prompt 0 (13 tokens) goes as 6, then
    # 6 over its cached 6 (then its last token as a one-token row beside the decodes); prompt 1 (7) as 5, then 2
    layer0 = [(t, keys) for layer, t, keys in chunks if layer == 0]
    assert layer0 == [(6, 6), (6, 12), (5, 5), (2, 7)] * 2


def test_paged_decode_attention_matches_the_gather_path(kernel_sized_path):
    """The kernel reading blocks in place == the array path gathering them, on a ragged batch with shuffled blocks."""
    from minitransformer.serving.paged_cache import PagedKVCache
    config = load_model(kernel_sized_path, attention="arrays").config
    cache = PagedKVCache(config, num_blocks=12, block_size=4)
    rng = np.random.default_rng(0)
    cache.k[...] = rng.standard_normal(cache.k.shape)
    cache.v[...] = rng.standard_normal(cache.v.shape)
    lens = np.array([9, 3, 16])                                               # (R,)
    tables = np.array([[7, 2, 11, 0], [5, 0, 0, 0], [1, 3, 8, 4]])           # (R, 4): padded with block 0
    q = rng.standard_normal((3, config.n_heads, config.head_dim)).astype(np.float32)     # (R, H, d)
    expected = ArrayAttention().paged_decode(cache, 1, q, lens - 1, lens, tables)   # (R, H, d): gathered
    got = KernelAttention().paged_decode(cache, 1, q, lens - 1, lens, tables)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


@gpu
def test_gpu_greedy_matches_cpu(kernel_sized_path):
    cpu = load_model(kernel_sized_path, attention="arrays")
    on_gpu = load_model(kernel_sized_path, device="gpu")                   # auto: kernels on the GPU
    prompt = [5, 17, 42, 99, 3, 250, 7, 61]
    tokens_c, logits_c = greedy(cpu, prompt, steps=4)
    tokens_g, logits_g = greedy_gpu(on_gpu, prompt, steps=4)
    assert tokens_g == tokens_c
    assert np.abs(logits_g - logits_c).max() < 1e-4


def greedy_gpu(model, prompt, steps):
    from minitransformer.core.backend import to_host
    cache = KVCache(model.config, max_len=len(prompt) + steps, batch=2, xp=model.xp)
    logits = prefill(model, [prompt, prompt[::-1]], cache)
    all_logits, tokens = [to_host(logits)], []
    for _ in range(steps):
        token = logits.argmax(-1)
        tokens.append(to_host(token).tolist())
        logits = decode_step(model, token, cache)
        all_logits.append(to_host(logits))
    return tokens, np.stack(all_logits)


@gpu
def test_cuda_graph_replay_matches_plain_launches():
    import cupy

    from minitransformer.serving.cuda_graph import GraphedStep
    x = cupy.arange(12, dtype=cupy.float32).reshape(3, 4)
    step = GraphedStep(lambda a: (a @ a.T + 1.0).sum(axis=0), x)
    x[...] = cupy.ones((3, 4), dtype=cupy.float32)
    out = step.replay()
    cupy.testing.assert_allclose(out, (x @ x.T + 1.0).sum(axis=0))
