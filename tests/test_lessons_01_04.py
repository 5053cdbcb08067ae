"""Lessons 01-04 run as a learner runs them (a subprocess on the real model, small settings) and the numbers they
print hold together against references computed here, independently of the lessons' code: the same tokens from
generate() and from a full no-cache forward pass, cache bytes from the H1 formula written out, FLOPs from the
weight arrays. Timings are only compared where the margin is large (see each test).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitransformer import SamplingParams, generate
from minitransformer.layers import softmax

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(-?[0-9.]+(?:e[+-]\d+)?)"


def run_lesson(name: str, *args: str, model_path) -> str:
    env = dict(os.environ, MINITRANSFORMER_MODEL=str(model_path))
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / name), *args], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return " ".join(result.stdout.split())           # rich wraps long lines: compare on single-spaced text


def check(output: str, pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, output)
    assert match, f"{pattern!r} not in the lesson's output:\n{output[-4000:]}"
    return match.groups()


def ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


# ---------------------------------------------------------------------------------------------------- lesson 01

LOOP_PROMPT = "The printing press changed Europe because"


@pytest.fixture(scope="module")
def lesson_01(real_model_path):
    return run_lesson("01_autoregressive_loop.py", "--prompt", LOOP_PROMPT, "--tokens", "6",
                      model_path=real_model_path)


def test_01_loop_matches_generate_tokens_and_probabilities(lesson_01, real_model):
    out = lesson_01
    ids = ints(check(out, r"check ids: \[([0-9, ]+)\]")[0])
    reference = generate(real_model, LOOP_PROMPT, SamplingParams(max_tokens=6, temperature=0.0))
    assert ids == reference.token_ids and len(ids) == 6
    assert "after 6 tokens = 6 passes through the model (1 prefill + 5 decode steps)" in out
    # probability of each chosen token from one no-cache forward pass over prompt + answer
    prompt_ids = real_model.tokenizer.encode(LOOP_PROMPT)
    seq = prompt_ids + ids
    logits = real_model.forward(np.asarray([seq]), np.arange(len(seq))[None])[0]           # (P + n, V)
    probs = softmax(logits[len(prompt_ids) - 1:-1].astype(np.float64))                      # (n, V)
    expected = probs[np.arange(len(ids)), ids]
    printed = [float(x) for x in check(out, r"chosen-token probabilities: ([0-9. ]+?) check")[0].split()]
    assert np.allclose(printed, expected, atol=2e-4), (printed, expected)
    assert "check order: step n+1 started after token n was chosen in 5 of 5 steps" in out


def test_01_dependency_and_parallel_check(lesson_01, real_model):
    out = lesson_01
    ids = ints(check(out, r"check ids: \[([0-9, ]+)\]")[0])
    k, forced, after = (int(x) for x in check(out, r"check dependency: token (\d+) forced to (\d+) -> next token "
                                                   r"(\d+)"))
    assert k == 3
    prefix = real_model.tokenizer.encode(LOOP_PROMPT) + ids[:k - 1]
    logits = real_model.forward(np.asarray([prefix]), np.arange(len(prefix))[None], last_only=True)[0]
    order = np.argsort(-logits, kind="stable")
    assert forced == next(int(i) for i in order[:2] if i != ids[k - 1])         # the best other candidate
    seq = prefix + [forced]
    logits = real_model.forward(np.asarray([seq]), np.arange(len(seq))[None], last_only=True)[0]
    assert after == int(np.argmax(logits))
    diff = float(check(out, rf"check parallel pass: max \|log p loop - log p one pass\| = {NUMBER} over 6 tokens")[0])
    assert diff < 1e-4


# ---------------------------------------------------------------------------------------------------- lesson 02

@pytest.fixture(scope="module")
def lesson_02(real_model_path):
    return run_lesson("02_prefill_vs_decode.py", "--prompt-tokens", "128", "--new-tokens", "3", "--lengths", "8,48",
                      "--steps", "2", "--repeats", "1", model_path=real_model_path)


def test_02_ttft_exceeds_itl_for_a_long_prompt(lesson_02):
    """128 prompt tokens vs 1: ~10x the matmul work, a margin no scheduler noise closes (two gaps' median)."""
    ttft, itl, ratio = (float(x) for x in check(lesson_02, rf"check request: TTFT {NUMBER} ms, ITL p50 {NUMBER} ms, "
                                                          rf"TTFT / ITL = {NUMBER}"))
    assert ttft > itl > 0 and ratio == pytest.approx(ttft / itl, abs=0.06)
    assert f"prefill of 128 tokens made TTFT {ttft:.0f} ms" in lesson_02


def reference_flops(model, new: int, keys: int) -> int:
    """From the weight arrays themselves: 2 FLOPs per weight per token row, the lm_head on the last row only, and
    q k^T plus probs v: 4 * H * d per (query, key) pair per layer."""
    cfg = model.config
    per_token = sum(w.size for layer in model.layers for w in (layer.w_qkv, layer.wo, layer.w_gate_up, layer.w_down))
    return 2 * per_token * new + 2 * model.lm_head.size + cfg.n_layers * 4 * cfg.n_heads * cfg.head_dim * new * keys


def test_02_costs_and_bounds(lesson_02, real_model):
    out, cfg = lesson_02, real_model.config
    ridge = float(check(out, rf"Ridge point: {NUMBER} FLOP per byte")[0])
    low, high = (float(x) for x in check(out, rf"the ridge ranged {NUMBER}-{NUMBER}\)"))
    verdict = check(out, rf"ridge of [0-9.]+: (memory-bound|compute-bound|near the ridge)\. It ran")[0]
    intensity = float(check(out, rf"moved = {NUMBER} FLOP/byte")[0])
    assert 0 < low <= high and verdict == ("near the ridge" if low <= intensity <= high else
                                           "compute-bound" if intensity > ridge else "memory-bound")
    kv_per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    for L in (8, 48):
        for phase, new, keys in (("prefill", L, L), ("decode", 1, L + 1)):
            flops, nbytes, seconds, bound = check(out, rf"check cost: {phase} {L}: (\d+) FLOP, (\d+) bytes, "
                                                       rf"{NUMBER} s, (\w+)")
            assert int(flops) == reference_flops(real_model, new, keys)
            floor = real_model.weight_bytes + kv_per_token * keys                 # weights + cache read, at least
            assert floor < int(nbytes) < 1.2 * floor
            assert float(seconds) > 0
            assert bound == ("compute" if int(flops) / int(nbytes) > ridge else "memory")
            if phase == "decode":
                assert bound == "memory" and 0.4 < int(flops) / int(nbytes) < 0.6


def test_02_batching_and_the_h200_paragraph(lesson_02, real_model):
    """Part 4's ratios are the printed times' ratios; a batch reads the weights once (bytes ~1x, H200 roofline ~1x);
    the H200 numbers follow from the datasheet's figures and the model's bf16 bytes, computed here from its shapes."""
    out, cfg = lesson_02, real_model.config
    many, one, ratio, bytes_ratio, matmul, h200 = (float(x) for x in check(
        out, rf"check batch: 4 sequences {NUMBER} s, 1 sequence {NUMBER} s, ratio {NUMBER}; bytes ratio {NUMBER}; "
             rf"matmul ratio {NUMBER}; H200 ratio {NUMBER}"))
    assert ratio == pytest.approx(many / one, rel=0.01, abs=0.006) and matmul > 0
    assert 1.0 < bytes_ratio < 1.05 and 1.0 <= h200 < 1.05
    took, gain = (float(x) for x in check(out, rf"yet took {NUMBER}x as long, so batching 4 raised tokens/s only "
                                               rf"{NUMBER}x"))
    assert took == pytest.approx(ratio, abs=0.006) and gain == pytest.approx(4 / ratio, abs=0.06)
    assert "its ridge is 206 FLOP/byte" in out                                  # 989e12 / 4.8e12
    us, per_s = check(out, rf"at best {NUMBER} us per token \(([0-9,]+) tokens/s")
    params = sum(w.size for layer in real_model.layers for w in vars(layer).values()) + real_model.lm_head.size
    assert float(us) == pytest.approx(2 * params / 4.8e12 * 1e6, rel=0.05)      # bf16 weights / bandwidth
    assert int(per_s.replace(",", "")) == pytest.approx(1e6 / float(us), rel=0.02)


# ---------------------------------------------------------------------------------------------------- lesson 03

@pytest.fixture(scope="module")
def lesson_03(real_model_path):
    return run_lesson("03_kv_cache_growth.py", "--tokens", "3", "--batch", "2", model_path=real_model_path)


def test_03_measured_bytes_follow_the_formula(lesson_03, real_model):
    out, cfg = lesson_03, real_model.config
    P = len(real_model.tokenizer.encode("The cat sat on the mat, and the dog sat on the rug, because"))
    pairs = re.findall(r"S=(\d+): (\d+)", check(out, r"check bytes: ([S=0-9:, ]+) check estimator")[0])
    assert [int(s) for s, _ in pairs] == [P, P + 1, P + 2, P + 3]          # one row per layer per decoded token
    for tokens, measured in pairs:          # H1 written out: K and V x layers x batch x kv_heads x tokens x d x 4
        assert int(measured) == 2 * cfg.n_layers * 2 * cfg.n_kv_heads * int(tokens) * cfg.head_dim * 4
    assert "measured == estimate_kv_bytes at 4 of 4 steps; each token adds 92,160 bytes (batch 2)" in out
    assert f"(30, 2, 3, {P + 3}, 64)" in out                                # the live table's last shape
    assert float(check(out, rf"check recompute: max \|cache built token by token - cache of one full pass\| = "
                            rf"{NUMBER}")[0]) < 1e-4


def test_03_projection_reproduces_h1(lesson_03):
    small, large = (float(x) for x in check(lesson_03, rf"check H1: 4096 tokens x batch 4 = {NUMBER} GiB; 16384 "
                                                      rf"tokens x batch 16 = {NUMBER} GiB"))
    assert (small, large) == (2.0, 32.0)                 # lesson 03: 2 x 32 x 8 x 128 x tokens x batch x 2 bytes
    assert 2 * 32 * 8 * 128 * 4096 * 4 * 2 == 2 * 2**30 and 2 * 32 * 8 * 128 * 16384 * 16 * 2 == 32 * 2**30
    assert "16 users at its full 8,192-token context would need 5.62 GiB" in lesson_03   # 46,080 B x 8192 x 16


# ---------------------------------------------------------------------------------------------------- lesson 04

@pytest.fixture(scope="module")
def lesson_04(real_model_path):
    return run_lesson("04_cache_vs_no_cache.py", "--prompt-tokens", "16", "--tokens", "10", "--rows", "4",
                      model_path=real_model_path)


def lesson_text(name: str) -> str:
    """The prompt text a lesson builds its prompt from (read from the file, not re-typed here)."""
    source = (ROOT / "lessons" / name).read_text()
    return eval(re.search(r"^TEXT = (\(.*?\))$", source, re.S | re.M).group(1))    # a literal string expression


def test_04_cache_and_no_cache_give_the_same_tokens(lesson_04, real_model):
    out = lesson_04
    prompt = real_model.tokenizer.encode(lesson_text("04_cache_vs_no_cache.py"))[:16]
    reference = generate(real_model, prompt, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    assert "check tokens: identical at 10 of 10 positions" in out
    assert ints(check(out, r"ids \[([0-9, ]+)\]")[0]) == reference.token_ids
    kv_bytes = 2 * 30 * 3 * 64 * 4 * (16 + 9)                  # the last token is sampled, never fed back
    assert f"cache holds 25 tokens = {kv_bytes:,} bytes" in out


def test_04_work_and_totals(lesson_04):
    out = lesson_04
    fast, slow = (int(x) for x in check(out, r"check work: token-passes cache (\d+), no cache (\d+)"))
    assert (fast, slow) == (16 + 9, sum(16 + i for i in range(10)))
    total_fast, total_slow, ratio = (float(x) for x in check(out, rf"check totals: cache {NUMBER} s, no cache "
                                                                  rf"{NUMBER} s, ratio {NUMBER}x"))
    assert ratio == pytest.approx(total_slow / total_fast, rel=0.01)
    said_slow, said_fast = (float(x) for x in check(out, rf"In total {NUMBER} s vs {NUMBER} s"))
    # the answer rounds the same totals to 2 decimals (re-rounding the 3-decimal check line could differ by 0.01)
    assert said_slow == pytest.approx(total_slow, abs=0.0051) and said_fast == pytest.approx(total_fast, abs=0.0051)
