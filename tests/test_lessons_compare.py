"""Lessons 03, 07 and 13 with `--compare gemma3-270m`: the model-size lever measured on a second real model.

Each lesson runs as a learner runs it (a subprocess, small settings) with Gemma 3 270M as the second model; its
printed bytes are checked against references computed here from the second model's config (kv_bytes_per_token,
decode_read_bytes, expected_weight_bytes), and the claim the section adds is decided from those numbers, shown only
when it holds (and, for a timing, only on a quiet run). No timing is asserted. Without --compare the lessons print
what their transcripts hold (tests/test_transcripts.py).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from minitransformer.core.config import ModelConfig
from minitransformer.core.gguf_file import open_gguf
from minitransformer.core.kv_cache import kv_bytes_per_token
from minitransformer.lab.claims import printed_verdicts
from minitransformer.quantize import expected_weight_bytes

ROOT = Path(__file__).resolve().parents[1]


def run(name: str, real_model_path, gemma_model_path, *args: str) -> str:
    env = dict(os.environ, COLUMNS="120", MINITRANSFORMER_MODEL=str(real_model_path), PYTHONPATH=str(ROOT),
               OPENBLAS_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / name), *args, "--compare", str(gemma_model_path)],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def claims_of(name: str, output: str) -> dict:
    spec = importlib.util.spec_from_file_location(f"lesson_{name[:2]}", ROOT / "lessons" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {c.key: c for c in module.claims(output)}


def gemma_config(path) -> ModelConfig:
    return ModelConfig.from_gguf(open_gguf(path))


def test_03_measures_the_second_models_cache_per_token(real_model_path, gemma_model_path):
    out = run("03_kv_cache_growth.py", real_model_path, gemma_model_path, "--tokens", "2")
    flat = " ".join(out.split())
    per_token = kv_bytes_per_token(gemma_config(gemma_model_path))
    assert f"check second model: measured == estimate_kv_bytes at 3 of 3 steps; {per_token:,} bytes per token vs " \
           f"this model's 46,080" in flat
    found = claims_of("03_kv_cache_growth.py", out)
    assert found["second-model-estimator"].holds and printed_verdicts(out)["second-model-estimator"]
    broken = replace_flat(out, "check second model: measured == estimate_kv_bytes at 3 of",
                          "check second model: measured == estimate_kv_bytes at 2 of")
    assert not claims_of("03_kv_cache_growth.py", broken)["second-model-estimator"].holds


def test_07_times_both_models_in_turns_next_to_their_weight_floors(real_model_path, gemma_model_path):
    out = run("07_latency_metrics_and_levers.py", real_model_path, gemma_model_path, "--tokens", "4", "--lengths",
              "16,48", "--outputs", "2,4", "--repeats", "2")
    from minitransformer.bench.model_shape import decode_read_bytes
    gemma = decode_read_bytes(gemma_config(gemma_model_path))[0]        # float32 weights, tied: all of them
    assert re.search(rf"│ gemma-3-270m-q4_k_m +│ {gemma / 1e9:.3f} +│", out)
    found = claims_of("07_latency_metrics_and_levers.py", out)
    claim = found["model-size-measured"]
    assert "more weight bytes" in claim.statement and not claim.required and claim.timed
    assert printed_verdicts(out)["model-size-measured"] in (False, claim.holds)     # never shown beyond the numbers
    flat = " ".join(out.split())
    m = re.search(r"check second model: decode ([\d.]+)-([\d.]+) ms per token vs this model's ([\d.]+)-([\d.]+);",
                  flat)
    own_high = float(m[4])
    slower = f"check second model: decode {own_high + 1:.1f}-{own_high + 2:.1f} ms per token vs this model's " \
             f"{m[3]}-{m[4]};"
    faster = f"check second model: decode 0.1-0.2 ms per token vs this model's {m[3]}-{m[4]};"
    assert claims_of("07_latency_metrics_and_levers.py", replace_flat(out, m[0], slower))["model-size-measured"].holds
    assert not claims_of("07_latency_metrics_and_levers.py",
                         replace_flat(out, m[0], faster))["model-size-measured"].holds


def replace_flat(out: str, flat_text: str, new: str) -> str:
    """`out` with the text whose words are `flat_text` (rich may have wrapped it anywhere) replaced by `new`."""
    pattern = r"\s+".join(map(re.escape, flat_text.split()))
    changed, count = re.subn(pattern, lambda _: new, out, count=1)
    assert count == 1, flat_text
    return changed


def test_13_builds_the_second_models_int8_and_int4_copies_with_the_computed_bytes(real_model_path,
                                                                                 gemma_model_path):
    out = run("13_quantization.py", real_model_path, gemma_model_path, "--tokens", "48", "--window", "24",
              "--greedy-tokens", "4", "--kv-tokens", "256", "--repeats", "2")
    cfg = gemma_config(gemma_model_path)
    flat = " ".join(out.split())
    i8, i4 = expected_weight_bytes(cfg, "int8"), expected_weight_bytes(cfg, "int4")
    assert f"check second model memory: int8 {i8} bytes, computed {i8}; int4 {i4} bytes, computed {i4};" in flat
    share = 100 * cfg.vocab_size * (cfg.d_model + 4) / i4                 # the int8 lm_head: values + row scales
    assert share > 50 and f"is {share:.0f}% of its int4 bytes" in flat
    found = claims_of("13_quantization.py", out)
    assert found["second-model-memory"].holds and printed_verdicts(out)["second-model-memory"]
    broken = replace_flat(out, f"int4 {i4} bytes", f"int4 {i4 + 1} bytes")
    assert not claims_of("13_quantization.py", broken)["second-model-memory"].holds
