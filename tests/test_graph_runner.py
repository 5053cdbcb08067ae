"""Decode steps over static buffers (serving/graph_runner.py): what a CUDA graph replays gives plain steps' tokens.

On the CPU nothing is captured, but the static-buffer step runs as the graph would replay it: padded to a capture
size, padding rows writing into the scratch block, full-width block tables, lengths as arrays. So every test here
compares Engine(cuda_graphs=True) with Engine(cuda_graphs=False) on the same requests; the capture itself is checked
on a GPU by scripts/gpu_check.py (tokens with graphs == without).
"""

import logging

import numpy as np
import pytest

from minitransformer import SamplingParams, load_model
from minitransformer.serving import Engine
from minitransformer.serving.graph_runner import capture_sizes
from test_serving_engine import MIXED, prompts_of


def serve(model, requests, **options):
    engine = Engine(model, **options)
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    results = engine.run()
    return engine, [results[i] for i in ids]


def assert_same_results(got, expected):
    for mine, theirs in zip(got, expected, strict=True):
        assert mine.token_ids == theirs.token_ids
        assert (mine.finish_reason, mine.stop_reason, mine.text) == (theirs.finish_reason, theirs.stop_reason,
                                                                     theirs.text)
        assert (mine.logprobs is None) == (theirs.logprobs is None)
        for a, b in zip(mine.logprobs or [], theirs.logprobs or [], strict=True):
            assert [t[0] for t in a["top"]] == [t[0] for t in b["top"]]
            # the runner-ups too: the tiny model's picks are near one-hot (log-probability ~0), the rest move
            np.testing.assert_allclose([a["logprob"]] + [t[1] for t in a["top"]],
                                       [b["logprob"]] + [t[1] for t in b["top"]], atol=1e-4)


def test_capture_sizes_are_powers_of_two_then_max_num_seqs():
    assert capture_sizes(1) == (1,)
    assert capture_sizes(5) == (1, 2, 4, 5)
    assert capture_sizes(16) == (1, 2, 4, 8, 16)
    assert capture_sizes(300) == (1, 2, 4, 8, 16, 32, 64, 128, 256, 300)


@pytest.mark.parametrize("kv_cache", ["f32", "int8"])
def test_static_buffer_decode_gives_the_tokens_of_plain_steps(tiny_model, kv_cache):
    """Mixed sampling, chunked prefill next to decodes, preemption in a small pool, batches of 1 to 5 decodes."""
    requests = [(p, MIXED[i % len(MIXED)]) for i, p in enumerate(prompts_of([1, 4, 17, 33, 8, 12, 26, 3, 40], seed=1))]
    options = dict(max_num_seqs=5, num_blocks=14, block_size=4, max_num_batched_tokens=12, kv_cache=kv_cache)
    plain, expected = serve(tiny_model, requests, **options, cuda_graphs=False)
    graphed, got = serve(tiny_model, requests, **options, cuda_graphs=True)
    assert_same_results(got, expected)
    replays = graphed.graphs.replays
    decode_only = sum(1 for r in graphed.step_log if r.num_prefill_tokens == 0 and r.num_decode_tokens)
    assert sum(replays.values()) >= decode_only > 0                 # every decode-only step went through a buffer
    assert len([s for s, n in replays.items() if n]) >= 3           # several capture sizes, padding included
    assert graphed.stats.num_preemptions == plain.stats.num_preemptions > 0
    # the scratch block is the pool's extra last block, outside every table, and the pool is whole again
    assert graphed.cache.k.shape[1] == plain.cache.k.shape[1] + 1 == 15
    assert graphed.block_manager.num_free_blocks == 14
    assert graphed.graphs.scratch_block == 14 and graphed.graphs.disabled is None


def test_padding_rows_write_only_the_scratch_block(tiny_model):
    """Three sequences padded to a capture size of 4: every pool block but the scratch one holds what plain steps
    wrote (the same schedule gives the same blocks), up to float32 rounding of a 4-row vs 3-row matmul."""
    requests = [(p, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2))
                for p in prompts_of([5, 9, 2])]
    options = dict(max_num_seqs=4, num_blocks=12, block_size=4)
    plain, expected = serve(tiny_model, requests, **options, cuda_graphs=False)
    graphed, got = serve(tiny_model, requests, **options, cuda_graphs=True)
    assert_same_results(got, expected)
    assert graphed.graphs.replays[4] > 0
    np.testing.assert_allclose(graphed.cache.k[:, :12], plain.cache.k, atol=1e-5)
    np.testing.assert_allclose(graphed.cache.v[:, :12], plain.cache.v, atol=1e-5)
    assert np.abs(graphed.cache.k[:, 12]).max() > 0                 # the padding rows did write there


def test_decode_kernel_path_on_the_cpu_runner(kernel_sized_path):
    """attention="kernels": the static step reads the pool through paged_decode with full-width tables."""
    model = load_model(kernel_sized_path, attention="kernels")
    requests = [(p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, logprobs=2))
                for p in prompts_of([5, 9, 2])]
    options = dict(max_num_seqs=3, num_blocks=16, block_size=4, max_model_len=64)
    _, expected = serve(model, requests, **options, cuda_graphs=False)
    graphed, got = serve(model, requests, **options, cuda_graphs=True)
    assert graphed.graphs.use_kernel and graphed.graphs.max_blocks == 16
    assert_same_results(got, expected)
    assert sum(graphed.graphs.replays.values()) > 0


def test_a_failed_capture_is_logged_and_steps_run_plainly(tiny_model, monkeypatch, caplog):
    """On a GPU a forward that breaks a capture rule raises inside GraphedStep: the engine says why and goes on."""
    from minitransformer.serving import cuda_graph

    def refuse(fn, *inputs):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(cuda_graph, "GraphedStep", refuse)
    requests = [(p, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)) for p in prompts_of([3, 6])]
    _, expected = serve(tiny_model, requests, max_num_seqs=2, num_blocks=8, block_size=4, cuda_graphs=False)
    engine = Engine(tiny_model, max_num_seqs=2, num_blocks=8, block_size=4, cuda_graphs=True)
    engine.graphs.capture = True                                     # as on a GPU
    ids = [engine.add_request(p, params) for p, params in requests]
    with caplog.at_level(logging.WARNING, logger="minitransformer.graphs"):
        results = engine.run()
    assert_same_results([results[i] for i in ids], expected)
    assert "capture of a 2-sequence decode step failed: RuntimeError" in engine.graphs.disabled
    assert "decode steps run without graphs" in caplog.text
    assert sum(engine.graphs.replays.values()) == 0


def test_graphs_are_on_by_default_only_on_a_gpu_with_the_decode_kernel(tiny_model, kernel_sized_path):
    """The default rule, with models that claim to be on a GPU (nothing runs): the array path would gather
    max_model_len keys per sequence and layer in every graphed step, so it keeps plain steps."""
    import copy
    assert Engine(tiny_model, num_blocks=8).graphs is None                           # the CPU
    on_gpu = copy.copy(tiny_model)
    on_gpu.device = "gpu"
    assert Engine(on_gpu, num_blocks=8).graphs is None                               # arrays: head_dim 16
    kernels = copy.copy(load_model(kernel_sized_path, attention="kernels"))
    kernels.device = "gpu"
    engine = Engine(kernels, num_blocks=8)
    assert engine.graphs is not None and engine.graphs.capture and engine.graphs.use_kernel
    assert Engine(kernels, num_blocks=8, kv_cache="int8").graphs is None             # the kernel reads float pools


def has_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError or no CUDA driver
        return False


@pytest.mark.skipif(not has_gpu(), reason="needs CuPy and an NVIDIA GPU (none on this machine)")
def test_captured_graphs_give_the_tokens_of_plain_launches_on_the_gpu(kernel_sized_path, monkeypatch):
    """The real capture: paged_decode and every matmul recorded once per capture size, replayed per step."""
    monkeypatch.setenv("MINITRANSFORMER_CHECKED", "0")       # checked mode reads tables on the host: no capture
    model = load_model(kernel_sized_path, device="gpu")
    requests = [(p, MIXED[i % len(MIXED)]) for i, p in enumerate(prompts_of([1, 4, 17, 33, 8, 12, 26], seed=2))]
    options = dict(max_num_seqs=5, num_blocks=32, block_size=4, max_num_batched_tokens=12, max_model_len=96)
    _, expected = serve(model, requests, **options, cuda_graphs=False)
    graphed, got = serve(model, requests, **options, cuda_graphs=True)
    assert graphed.graphs.disabled is None and graphed.graphs.capture
    assert type(graphed.graphs.steps[max(graphed.graphs.steps)]).__name__ == "GraphedStep"
    assert sum(graphed.graphs.replays.values()) > 0
    assert_same_results(got, expected)
