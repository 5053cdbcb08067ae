"""docs/formulas.md: every number on the formula sheet is what the code computes for this model (so a change to the
cost model or the model cannot leave the sheet behind), and the formulas written there give the code's answers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from minitransformer.core.kv_cache import estimate_kv_bytes, kv_bytes_per_token
from minitransformer.core.metrics import RequestMetrics
from minitransformer.lab.machine import H200, forward_cost
from minitransformer.lab.viz_capacity import H200_MEMORY_BYTES, LLAMA_3_1_8B, MEMORY_SHARE, Capacity, parameter_count

ROOT = Path(__file__).resolve().parents[1]
SHEET = (ROOT / "docs" / "formulas.md").read_text()
FLAT = " ".join(SHEET.split())


def quoted(value: str) -> None:
    """The sheet prints `value` in bold, as its answer."""
    assert f"**{value}" in FLAT, f"docs/formulas.md does not quote {value!r} (what the code computes now)"


@pytest.fixture(scope="module")
def config(real_model):
    return real_model.config


def test_memory_formulas(config, real_model):
    c = config
    per_token = kv_bytes_per_token(c)
    assert per_token == 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4            # the formula as written
    quoted(f"{per_token:,} bytes")
    quoted(f"{kv_bytes_per_token(c, dtype=np.float16):,}")
    quoted(f"{estimate_kv_bytes(c, 4096):,} bytes")
    assert real_model.weight_bytes == parameter_count(c) * 4
    assert f"{parameter_count(c):,} x 4" in FLAT
    quoted(f"{real_model.weight_bytes:,} bytes")
    eight_b = Capacity("8B", H200_MEMORY_BYTES, parameter_count(LLAMA_3_1_8B) * 2,
                       estimate_kv_bytes(LLAMA_3_1_8B, 1, dtype=np.float16))
    assert MEMORY_SHARE == 0.9 and f"{parameter_count(LLAMA_3_1_8B) * 2:,}" in FLAT
    assert f"{estimate_kv_bytes(LLAMA_3_1_8B, 1, dtype=np.float16):,} x 8,192" in FLAT
    quoted(f"{eight_b.users(8192)}** requests of 8,192 tokens")


def test_work_and_time_formulas(config, real_model):
    decode = forward_cost(config, 1, 256, weight_bytes=real_model.weight_bytes)
    prefill = forward_cost(config, 512, 0, weight_bytes=real_model.weight_bytes)
    quoted(f"{decode.flops:,.0f} FLOPs")
    quoted(f"{prefill.flops / 512:,.0f} FLOPs per token")
    quoted(f"{decode.bytes:,.0f} bytes")
    quoted(f"{decode.intensity:.2f} FLOP per byte")
    quoted(f"{prefill.intensity:.1f}")
    quoted(f"{H200.ridge:.0f} FLOP per byte")
    on_h200 = H200.cost(config, 1, 256)
    quoted(f"{on_h200.intensity:.2f}")
    assert f"{on_h200.bytes:,.0f} bytes" in FLAT
    seconds = H200.seconds(on_h200)
    assert seconds == on_h200.bytes / H200.bandwidth                         # memory-bound: bytes set the time
    quoted(f"{round(1 / seconds, -2):,.0f} tokens/s")
    assert f"({seconds * 1e6:.0f} us a step)" in FLAT


def test_latency_formula():
    """E2EL = TTFT + (n - 1) x TPOT with RequestMetrics' own definitions, on the sheet's example."""
    ttft, tpot, n = 0.2, 0.020, 65
    metrics = RequestMetrics(arrival_time=0.0, scheduled_time=0.05,
                             token_times=[ttft + i * tpot for i in range(n)], finished_time=ttft + (n - 1) * tpot)
    assert metrics.ttft_s == pytest.approx(ttft) and metrics.tpot_s == pytest.approx(tpot)
    quoted(f"{metrics.e2e_s:.2f} s")


def test_speculative_formula():
    spec = importlib.util.spec_from_file_location("lesson12", ROOT / "lessons" / "12_speculative_decoding.py")
    lesson = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lesson)
    a, k = 0.6, 4
    assert lesson.expected_tokens(k, a) == pytest.approx(sum(a ** i for i in range(k + 1)))
    quoted(f"{lesson.expected_tokens(k, a):.2f} tokens per pass")
