"""minitransformer.lab.machine: the profile holds plausible numbers and forward_cost counts what the model does.

forward_cost's references are independent of its formula: FLOPs are summed from the loaded tiny model's actual
weight arrays and a spy on layers.attention that records each product's (T, S); bytes from the arrays' nbytes.
Timings are never asserted beyond "positive and finite" (shared, noisy machine).
"""

from __future__ import annotations

import math
import unittest.mock

import numpy as np
import pytest

import minitransformer.core.layers
from minitransformer import KVCache, ModelConfig
from minitransformer.core.decode import decode_step
from minitransformer.core.gguf_file import open_gguf
from minitransformer.core.prefill import prefill
from minitransformer.lab import peaks
from minitransformer.lab.machine import PhaseCost, forward_cost, roofline_tokens_per_s
from minitransformer.lab.measure import Timing
from minitransformer.lab.peaks import PROFILE_ENV, MachineProfile, machine_profile, measure_profile

SMALL = {"read_bytes": 8 * 2**20, "copy_bytes": 4 * 2**20}


def test_the_profile_holds_positive_rates_and_the_read_stream_is_what_floors_divide_by():
    profile = measure_profile(repeats=2, **SMALL)
    for rate in (profile.read_bandwidth, profile.copy_bandwidth, profile.gemm_peak):
        assert math.isfinite(rate) and rate > 0
    assert 1e8 < profile.read_bandwidth < 1e13 and 1e7 < profile.gemm_peak < 1e15     # bytes/s, FLOP/s
    assert profile.read_bytes == SMALL["read_bytes"] and profile.copy_bytes == 2 * SMALL["copy_bytes"]
    assert len(profile.read.samples) == len(profile.copy.samples) == len(profile.gemm.samples) == 2
    assert profile.floor_seconds(1e9) == 1e9 / profile.read_bandwidth
    assert profile.ridge == profile.gemm_peak / profile.read_bandwidth


def fixed_profile() -> MachineProfile:
    """1 GiB read in 0.05 s at best: 21.5 GB/s; 0.5 GiB copied in 0.04 s: 13.4 GB/s; 2 GFLOP in 0.01 s."""
    return MachineProfile("Test CPU, 2 cores (x86_64)", "2026-12-05 17:00", 2**30, Timing((0.05, 0.06, 0.08)),
                          2**29, Timing((0.04, 0.05, 0.04)), 2e9, Timing((0.01, 0.011, 0.012)))


def test_a_profile_is_the_fastest_repeat_with_its_median_and_spread_in_its_line():
    profile = fixed_profile()
    assert profile.read_bandwidth == 2**30 / 0.05 and profile.copy_bandwidth == 2**29 / 0.04
    assert profile.gemm_peak == 2e9 / 0.01
    line = profile.line()
    assert "read 21.5 (median 17.9, spread 60%) GB/s" in line
    assert "copy 13.4 (median 13.4, spread 25%) GB/s (read + write)" in line
    assert "GEMM 200.0 (median 181.8, spread 20%) GFLOP/s" in line
    assert f"ridge {2e11 / (2**30 / 0.05):.2f} FLOP/byte" in line


def test_a_profile_measured_once_is_read_back_by_every_run_that_is_handed_it(tmp_path, monkeypatch):
    profile = fixed_profile()
    path = tmp_path / "machine.json"
    profile.save(path)
    assert MachineProfile.load(path) == profile
    monkeypatch.setenv(PROFILE_ENV, str(path))
    monkeypatch.setattr(peaks, "measure_profile", lambda *a, **k: pytest.fail("measured again"))
    assert machine_profile() == (profile, False)
    monkeypatch.delenv(PROFILE_ENV)
    monkeypatch.setattr(peaks, "measure_profile", lambda *a, **k: profile)
    assert machine_profile() == (profile, True)


def test_each_call_counts_its_work(monkeypatch):
    """With a clock that advances exactly 1 s per timed call, each rate is the work of one call."""
    import minitransformer.lab.measure as measure
    ticks = iter(range(1000))
    monkeypatch.setattr(measure, "now", lambda: float(next(ticks)))
    profile = measure_profile(repeats=3, read_bytes=2**20, copy_bytes=2**16)
    assert profile.gemm_peak == 2 * 1024**3
    assert profile.read_bandwidth == 2**20 and profile.copy_bandwidth == 2 * 2**16
    assert peaks.gemm_call(n=64)[0] == 2 * 64**3


def test_the_read_stream_reads_each_byte_once_the_way_a_decode_step_reads_a_weight():
    moved, call = peaks.read_call(nbytes=4 * 2048 * 10)
    assert moved == 4 * 2048 * 10
    out = call()
    assert out.shape == (1, 2048) and float(out[0, 0]) == 10.0          # one row of 10 ones times (10, 2048) ones


def record_attention_shapes(model, run):
    """(B, T queries, S keys) of every product layers.attention computes while run() executes: one per decode
    step or short prompt, one per block of 64 queries (against only its visible keys) in a longer prompt."""
    shapes, real = [], minitransformer.core.layers.attention
    def spy(q, k, v, q_pos, k_pos, *window):     # window: a sliding layer's (Gemma 3), passed along
        shapes.append((q.shape[0], q.shape[2], k.shape[2]))
        return real(q, k, v, q_pos, k_pos, *window)
    with unittest.mock.patch.object(minitransformer.core.layers, "attention", spy):
        run()
    return shapes


def reference_flops(model, shapes, rows):
    """2 x (weights each token row meets) x rows + lm_head on the last position + 4 H d per computed pair."""
    cfg = model.config
    matrices = sum(layer.w_qkv.size + layer.wo.size + layer.w_gate_up.size + layer.w_down.size
                   for layer in model.layers)
    B = shapes[0][0]
    attention = sum(4 * cfg.n_heads * cfg.head_dim * b * t * s for b, t, s in shapes)
    return 2 * matrices * rows + 2 * model.lm_head.size * B + attention


@pytest.mark.parametrize("batch, P", [(1, 11), (3, 11), (2, 100)])
def test_forward_cost_flops_match_the_models_matmuls(tiny_model, batch, P):
    cfg, L = tiny_model.config, tiny_model.config.n_layers
    cache = KVCache(cfg, P + 1, batch=batch)
    ids = np.arange(5, 5 + P * batch).reshape(batch, P) % cfg.vocab_size
    prefill_shapes = record_attention_shapes(tiny_model, lambda: prefill(tiny_model, ids, cache))
    decode_shapes = record_attention_shapes(tiny_model, lambda: decode_step(tiny_model, ids[:, -1], cache))
    if P <= 64:
        assert prefill_shapes == [(batch, P, P)] * L                    # one masked product per layer
    else:                                                               # rows [0, 64) see 64 keys, [64, 100) all
        assert prefill_shapes == [(batch, 64, 64), (batch, P - 64, P)] * L
    assert decode_shapes == [(batch, 1, P + 1)] * L
    assert forward_cost(cfg, P, batch=batch).flops == reference_flops(tiny_model, prefill_shapes, batch * P)
    assert forward_cost(cfg, 1, P, batch=batch).flops == reference_flops(tiny_model, decode_shapes, batch)


def test_forward_cost_bytes(tiny_model):
    cfg = tiny_model.config
    weights = tiny_model.weight_bytes                 # tied model: the embedding is the lm_head, stored once
    assert forward_cost(cfg, 1).bytes == forward_cost(cfg, 1, weight_bytes=weights).bytes   # default = the model's
    S, D, V, L = 40, cfg.d_model, cfg.vocab_size, cfg.n_layers
    kv_row = 2 * L * cfg.n_kv_heads * cfg.head_dim * 4              # K and V of one token, all layers, float32
    layer_io = sum(a.shape[0] + a.shape[1] for a in (tiny_model.layers[0].w_qkv, tiny_model.layers[0].wo,
                                                    tiny_model.layers[0].w_gate_up, tiny_model.layers[0].w_down))
    decode = forward_cost(cfg, 1, S, weight_bytes=weights)
    expected = (weights + kv_row * (S + 1) + kv_row                 # cache read (S + new) and written (new)
                + 4 * (L * layer_io + D + V)                        # matmul inputs and outputs, last row's logits
                + 4 * L * 2 * cfg.n_heads * (S + 1)                 # attention scores written and read
                + 4 * L * 2 * cfg.n_heads * cfg.head_dim)           # q read by q k^T, the output written by probs v
    assert decode.bytes == expected
    assert forward_cost(cfg, 1, S, dtype_bytes=2).bytes < decode.bytes


def test_prefill_is_intense_decode_is_not(real_model_path):
    """The roofline story in numbers for the real model's shapes: float32 decode does ~0.5 FLOP per byte moved
    (two FLOPs per 4-byte weight), a 256-token prefill over a hundred times more."""
    cfg = ModelConfig.from_gguf(open_gguf(real_model_path))         # the shapes only: no weights loaded
    decode = forward_cost(cfg, 1, 256)
    prefill_cost = forward_cost(cfg, 256)
    assert 0.4 < decode.intensity < 0.6
    assert prefill_cost.intensity > 100 * decode.intensity
    assert PhaseCost(6.0, 3.0).intensity == 2.0


def test_roofline():
    assert roofline_tokens_per_s(500e6, 20e9) == 40.0


def test_published_peaks_roofline_time_is_the_slower_of_arithmetic_and_memory():
    from minitransformer.lab.machine import H200
    assert H200.bandwidth == 4.8e12 and H200.flops == pytest.approx(1979e12 / 2, rel=0.01)   # datasheet, dense
    assert H200.ridge == pytest.approx(H200.flops / H200.bandwidth)
    memory_bound, compute_bound = PhaseCost(flops=1e9, bytes=1e9), PhaseCost(flops=1e15, bytes=1e9)
    assert H200.seconds(memory_bound) == pytest.approx(1e9 / 4.8e12)
    assert H200.seconds(compute_bound) == pytest.approx(1e15 / H200.flops)
    config = ModelConfig(name="t", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128,
                         vocab_size=100, context_length=64, norm_eps=1e-5, rope_base=10000.0, tied_embeddings=True)
    assert H200.cost(config, 8).bytes == forward_cost(config, 8, dtype_bytes=2).bytes       # bf16 arrays


def test_a_ring_all_reduce_pays_2_n_minus_1_hops_and_2_n_minus_1_over_n_of_the_bytes():
    """PublishedLink: NCCL's ring model (base + 2(n-1) hops + 2(n-1)/n x bytes / bandwidth); split_step: the roofline
    compute / n next to 2 all-reduces per layer of tokens x d_model at the dtype (lesson 15's table 3)."""
    from minitransformer.lab.machine import H200, NVLINK4, PCIE5, PublishedLink, split_step
    link = PublishedLink("test", bandwidth=100e9, base_latency=5e-6, hop_latency=1e-6)
    assert link.all_reduce_seconds(1e9, 1) == 0.0                                  # one GPU: nothing to join
    assert link.all_reduce_seconds(0, 4) == pytest.approx(5e-6 + 6e-6)
    assert link.all_reduce_seconds(4e9, 4) == pytest.approx(11e-6 + 1.5 * 4e9 / 100e9)
    assert NVLINK4.bandwidth == 900e9 / 2 and PCIE5.bandwidth < NVLINK4.bandwidth    # 900 GB/s both ways
    config = ModelConfig(name="t", n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128,
                         vocab_size=100, context_length=64, norm_eps=1e-5, rope_base=10000.0, tied_embeddings=True)
    one, four = split_step(H200, NVLINK4, config, 8, 1), split_step(H200, NVLINK4, config, 8, 4)
    assert (one.all_reduces, one.communication) == (0, 0.0) and one.seconds == H200.seconds(H200.cost(config, 8))
    assert four.compute == pytest.approx(one.compute / 4) and four.all_reduces == 2 * config.n_layers
    assert four.all_reduce_bytes == 8 * 64 * 2                                     # bf16 hidden states
    assert four.communication == pytest.approx(4 * NVLINK4.all_reduce_seconds(8 * 64 * 2, 4))


def test_matmul_rows_times_every_row_count_in_turns(monkeypatch):
    from minitransformer.lab import machine
    from minitransformer.lab.machine import measure_matmul_rows, time_matmul_rows
    w = np.ones((64, 96), dtype=np.float32)
    costs = measure_matmul_rows(np, w, (1, 4), repeats=2)
    assert sorted(costs) == [1, 4] and all(math.isfinite(t) and t > 0 for t in costs.values())
    timings = time_matmul_rows(np, w, (1, 4), repeats=3)
    assert [len(t.samples) for t in timings.values()] == [3, 3]
    # the row counts take turns (T=1, T=4, T=1, ...), so a busy moment slows both alike
    order = []
    real = machine.interleaved
    monkeypatch.setattr(machine, "interleaved", lambda runs, repeats, **kw: real(
        {T: (lambda T=T, run=run: order.append(T) or run()) for T, run in runs.items()}, repeats, **kw))
    measure_matmul_rows(np, w, (1, 4), repeats=2)
    assert order == [1, 4] * 3                                          # warm-up round, then 2 rounds
