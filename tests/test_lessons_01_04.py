"""Lessons 01-04 run as a learner runs them (a subprocess on the real model, small settings) and the numbers they
print hold together against references computed here, independently of the lessons' code: the same tokens from
generate() and from a full no-cache forward pass, cache bytes from the H1 formula written out, FLOPs from the
weight arrays. Timings are only compared where the margin is large (see each test).

Each lesson's claims() decides its verdicts from its printed numbers: the tests run it on the real output (the
verdicts it printed must be the ones claims() gives) and on copies with one number edited to contradict a claim,
which must then fail.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from minitransformer import SamplingParams, generate
from minitransformer.core.layers import softmax
from minitransformer.lab.claims import is_shown
from minitransformer.lab.measure import Quietness
from printed_output import quotient_agrees, rounds_from

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


def lesson_claims(name: str):
    """The lesson's claims() function, imported from its file (main() does not run)."""
    spec = importlib.util.spec_from_file_location(f"lesson_{name[:2]}", ROOT / "lessons" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.claims


def decided(name: str, output: str) -> dict:
    """{key: Claim} as the lesson's claims() decides them on `output`."""
    return {claim.key: claim for claim in lesson_claims(name)(output)}


def check_printed_verdicts(name: str, output: str) -> dict:
    """The verdicts the lesson printed are exactly claims() on its own output, given the quietness it printed."""
    found, quiet = decided(name, output), Quietness.parse(output)
    assert quiet is not None, "no quietness line"
    printed = {m[1]: m[2] == "shown" for m in re.finditer(r"claim (\S+): (shown|not shown|refuted):", output)}
    assert printed == {key: is_shown(claim, quiet) for key, claim in found.items()}
    return found


def edited(output: str, pattern: str, replace) -> str:
    """`output` with the first match of `pattern` replaced (replace: a string or a function of the match)."""
    changed, n = re.subn(pattern, replace, output, count=1)
    assert n == 1, f"{pattern!r} not in the output"
    return changed


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


def test_01_claims_follow_its_numbers(lesson_01):
    """Untimed claims hold on the real output; each flips when its number is edited to contradict it."""
    name = "01_autoregressive_loop.py"
    found = check_printed_verdicts(name, lesson_01)
    assert set(found) == {"in-order", "next-changes", "same-probabilities", "one-pass-faster"}
    assert all(found[key].holds for key in ("in-order", "next-changes", "same-probabilities"))
    assert found["one-pass-faster"].timed and not found["in-order"].timed
    loop_lo = float(check(lesson_01, rf"check timing: loop {NUMBER}-")[0])
    edits = {
        "in-order": (r"chosen in 5 of 5 steps", "chosen in 4 of 5 steps"),
        "next-changes": (r"-> next token (\d+) \(was \d+\)", lambda m: f"-> next token {m[1]} (was {m[1]})"),
        "same-probabilities": (r"one pass\| = \S+ over", "one pass| = 3.0e-02 over"),
        "one-pass-faster": (r"one pass [\d.]+-[\d.]+ ms", f"one pass 1.0-{loop_lo + 1:.1f} ms"),
    }
    for key, (pattern, replace) in edits.items():
        claim = decided(name, edited(lesson_01, pattern, replace))[key]
        assert not claim.holds, (key, claim.evidence)
    faster = decided(name, edited(lesson_01, r"one pass [\d.]+-[\d.]+ ms", f"one pass 1.0-{loop_lo - 1:.1f} ms"))
    assert faster["one-pass-faster"].holds


def test_01_warm_up_comes_before_the_timed_prefill():
    """Step 1's time is the prefill's, not the process's first call: a warm-up pass runs before the loop."""
    source = (ROOT / "lessons" / "01_autoregressive_loop.py").read_text()
    main = source[source.index("def main("):]
    assert main.index("warm_up(model, prompt_ids)") < main.index("started_at.append(now())")


# ---------------------------------------------------------------------------------------------------- lesson 02

@pytest.fixture(scope="module")
def lesson_02(real_model_path):
    return run_lesson("02_prefill_vs_decode.py", "--prompt-tokens", "128", "--new-tokens", "3", "--lengths", "8,48",
                      "--steps", "2", "--repeats", "1", model_path=real_model_path)


def test_02_ttft_exceeds_itl_for_a_long_prompt(lesson_02):
    """128 prompt tokens vs 1: ~10x the matmul work, a margin no scheduler noise closes (two gaps' median)."""
    ttft, ttft_hi, itl, itl_hi, ratio = (float(x) for x in check(
        lesson_02, rf"check request: TTFT {NUMBER}-{NUMBER} ms, ITL p50 {NUMBER}-{NUMBER} ms, TTFT / ITL = {NUMBER}"))
    assert ttft > itl > 0 and quotient_agrees(ratio, 1, rounds_from(ttft, 1), rounds_from(itl, 1))
    assert ttft_hi == ttft and itl_hi == itl                     # --repeats 1: one run, no spread
    # the prose rounds the same time to whole ms: within half a ms of the 1-decimal figure (not that figure rounded)
    prose = float(check(lesson_02, r"with a prompt of 128 tokens, was run once\. It had TTFT (\d+) ms at the "
                                   r"fastest")[0])
    assert abs(prose - ttft) <= 0.5 + 0.05 + 1e-9


def reference_flops(model, new: int, keys: int) -> int:
    """From the weight arrays themselves: 2 FLOPs per weight per token row, the lm_head on the last row only, and
    q k^T plus probs v: 4 * H * d per (query, key) pair per layer."""
    cfg = model.config
    per_token = sum(w.size for layer in model.layers for w in (layer.w_qkv, layer.wo, layer.w_gate_up, layer.w_down))
    return 2 * per_token * new + 2 * model.lm_head.size + cfg.n_layers * 4 * cfg.n_heads * cfg.head_dim * new * keys


def test_02_costs_and_bounds(lesson_02, real_model):
    out, cfg = lesson_02, real_model.config
    bandwidth, gemm, ridge = (float(x) for x in check(out, rf"check peaks: bandwidth {NUMBER} GB/s, GEMM {NUMBER} "
                                                           rf"GFLOP/s, ridge {NUMBER} FLOP/byte"))
    assert ridge == pytest.approx(gemm / bandwidth, rel=0.01)
    # printed twice, to 2 and to 1 decimal: the one-decimal figure is the same number, not the 2-decimal one rounded
    printed = float(check(out, rf"Ridge point: {NUMBER} FLOP per byte \(measured by this run\)")[0])
    assert abs(printed - ridge) <= 0.05 + 0.005 + 1e-9
    verdict = check(out, r"ridge of [0-9.]+: (more than 2x below it, memory-bound|not 2x below it)\.")[0]
    intensity = float(check(out, rf"moved = {NUMBER} FLOP/byte")[0])
    assert verdict.startswith("more than") == (intensity < ridge / 2)              # the lesson's NEAR = 2
    kv_per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4
    for L in (8, 48):
        for phase, new, keys in (("prefill", L, L), ("decode", 1, L + 1)):
            flops, nbytes, low, high, median = check(out, rf"check cost: {phase} {L}: (\d+) FLOP, (\d+) bytes, "
                                                          rf"{NUMBER}-{NUMBER} s \(median {NUMBER}\)")
            assert int(flops) == reference_flops(real_model, new, keys)
            floor = real_model.weight_bytes + kv_per_token * keys                 # weights + cache read, at least
            assert floor < int(nbytes) < 1.2 * floor
            assert 0 < float(low) <= float(median) <= float(high)
            if phase == "decode":
                assert 0.4 < int(flops) / int(nbytes) < 0.6


def test_02_peaks_come_from_one_measurement(lesson_02, real_model_path, tmp_path):
    """With $MINITRANSFORMER_MACHINE_PROFILE set (make_transcripts.py measures once for every lesson), the lesson
    uses that profile and says so: one ridge point across the transcripts."""
    from minitransformer.lab.measure import Timing
    from minitransformer.lab.peaks import PROFILE_ENV, MachineProfile
    profile = MachineProfile("Test CPU", "2026-12-05 17:00", 20 * 10**9, Timing((1.0, 1.2)), 10**9, Timing((0.1,)),
                             100e9, Timing((1.0, 1.1)))                          # read 20 GB/s, GEMM 100 GFLOP/s
    profile.save(tmp_path / "machine.json")
    env = dict(os.environ, MINITRANSFORMER_MODEL=str(real_model_path), **{PROFILE_ENV: str(tmp_path / "machine.json")})
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / "02_prefill_vs_decode.py"), "--prompt-tokens",
                             "16", "--new-tokens", "2", "--lengths", "8", "--steps", "1", "--repeats", "1",
                             "--batch", "2"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = " ".join(result.stdout.split())
    assert "check peaks: bandwidth 20.00 GB/s, GEMM 100.00 GFLOP/s, ridge 5.00 FLOP/byte" in out
    assert "measured once for this set of runs by scripts/make_transcripts.py" in out
    assert profile.line() in out


def test_02_claims_follow_its_numbers(lesson_02):
    """The FLOP/byte claims hold on the real output; each claim flips when one number is edited against it."""
    name = "02_prefill_vs_decode.py"
    found = check_printed_verdicts(name, lesson_02)
    assert set(found) == {"first-token-slower", "decode-memory-bound", "prefill-compute-bound", "prefill-rate",
                          "prefill-token-cheaper", "decode-flat", "decode-memory-pace", "prefill-compute-pace",
                          "batch-costs-more", "batch-gain", "matmul-rows", "h200-memory-bound"}
    assert found["decode-memory-bound"].holds and found["h200-memory-bound"].holds
    assert [key for key, claim in found.items() if not claim.timed] == ["decode-memory-bound",
                                                                        "prefill-compute-bound", "h200-memory-bound"]
    ttft = float(check(lesson_02, rf"check request: TTFT {NUMBER}-")[0])
    one_lo = float(check(lesson_02, rf"1 sequence {NUMBER}-")[0])
    flops, nbytes = (float(x) for x in check(lesson_02, r"check cost: prefill 48: (\d+) FLOP, (\d+) bytes"))
    edits = {
        "first-token-slower": (r"ITL p50 [\d.]+-[\d.]+ ms", f"ITL p50 1.0-{ttft + 1:.1f} ms"),
        "decode-memory-bound": (r"(GFLOP/s, )ridge [\d.]+ FLOP/byte", lambda m: m[1] + "ridge 0.60 FLOP/byte"),
        "prefill-compute-bound": (r"(GFLOP/s, )ridge [\d.]+ FLOP/byte",           # the check line's, not the profile's
                                  lambda m: m[1] + f"ridge {flops / nbytes:.2f} FLOP/byte"),
        "prefill-rate": (r"(check cost: prefill 48: \d+ FLOP, \d+ bytes, )[\d.]+-[\d.]+ s \(median [\d.]+\)",
                         lambda m: m[1] + "90.000000-90.000000 s (median 90.000000)"),
        "prefill-token-cheaper": (r"(check cost: decode 48: \d+ FLOP, \d+ bytes, )[\d.]+-",
                                  lambda m: m[1] + "0.000001-"),
        "decode-flat": (r"(check cost: decode 48: \d+ FLOP, \d+ bytes, )[\d.]+-[\d.]+ s \(median [\d.]+\)",
                        lambda m: m[1] + "9.000000-9.000000 s (median 9.000000)"),
        "decode-memory-pace": (r"bandwidth [\d.]+ GB/s, GEMM", "bandwidth 99999.00 GB/s, GEMM"),
        "prefill-compute-pace": (r"GEMM [\d.]+ GFLOP/s", "GEMM 9999999.00 GFLOP/s"),
        "batch-costs-more": (r"4 sequences [\d.]+-", f"4 sequences {one_lo / 2:.6f}-"),
        "batch-gain": (r"4 sequences ([\d.]+)-[\d.]+ s", lambda m: f"4 sequences {m[1]}-{4 * one_lo + 1:.6f} s"),
        "matmul-rows": (r"matmul 4 rows [\d.]+-", "matmul 4 rows 0.1-"),
        "h200-memory-bound": (r"check h200: ridge \d+", "check h200: ridge 1"),
    }
    for key, (pattern, replace) in edits.items():
        claim = decided(name, edited(lesson_02, pattern, replace))[key]
        assert not claim.holds, (key, claim.evidence)


def test_02_batching_and_the_h200_paragraph(lesson_02, real_model):
    """Part 4's ratios are the printed times' ratios (fastest steps); a batch reads the weights once (bytes ~1x, H200
    roofline ~1x); the H200 numbers follow from the datasheet's figures and the model's bf16 bytes, computed here
    from its shapes."""
    out = lesson_02
    many, many_hi, one, one_hi, ratio, bytes_ratio, mm, mm_hi, mm1, mm1_hi, matmul, h200 = (float(x) for x in check(
        out, rf"check batch: 4 sequences {NUMBER}-{NUMBER} s, 1 sequence {NUMBER}-{NUMBER} s, ratio {NUMBER}; bytes "
             rf"ratio {NUMBER}; matmul 4 rows {NUMBER}-{NUMBER} us, 1 row {NUMBER}-{NUMBER} us, ratio {NUMBER}; "
             rf"H200 ratio {NUMBER}"))
    assert ratio == pytest.approx(many / one, rel=0.01, abs=0.006) and matmul == pytest.approx(mm / mm1, rel=0.01,
                                                                                              abs=0.006)
    assert many <= many_hi and one <= one_hi and mm <= mm_hi and mm1 <= mm1_hi
    assert 1.0 < bytes_ratio < 1.05 and 1.0 <= h200 < 1.05
    took = float(check(out, rf"and took {NUMBER}x as long \(fastest steps")[0])
    gain = float(check(out, rf"so (?:batching 4 raised tokens/s )?{NUMBER}x")[0])
    assert took == pytest.approx(ratio, abs=0.006) and quotient_agrees(gain, 1, (4, 4), rounds_from(ratio, 2))
    assert "its ridge is 206 FLOP/byte" in out                                  # 989e12 / 4.8e12
    us, per_s = check(out, rf"at best {NUMBER} us per token \(([0-9,]+) tokens/s")
    params = sum(w.size for layer in real_model.layers for w in vars(layer).values() if w is not None) \
        + real_model.lm_head.size                                                # None: norms only Gemma 3 has
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
    assert f"(30, 2, {P + 3}, 3, 64)" in out                                # the live table's last shape
    assert float(check(out, rf"check recompute: max \|cache built token by token - cache of one full pass\| = "
                            rf"{NUMBER}")[0]) < 1e-4


def test_03_projection_reproduces_h1(lesson_03):
    small, large = (float(x) for x in check(lesson_03, rf"check H1: 4096 tokens x batch 4 = {NUMBER} GiB; 16384 "
                                                      rf"tokens x batch 16 = {NUMBER} GiB"))
    assert (small, large) == (2.0, 32.0)                 # lesson 03: 2 x 32 x 8 x 128 x tokens x batch x 2 bytes
    assert 2 * 32 * 8 * 128 * 4096 * 4 * 2 == 2 * 2**30 and 2 * 32 * 8 * 128 * 16384 * 16 * 2 == 32 * 2**30
    assert "16 users at its full 8,192-token context would need 5.62 GiB" in lesson_03   # 46,080 B x 8192 x 16


def test_03_claims_follow_its_numbers(lesson_03):
    """Nothing in lesson 03 is timed: every claim holds on the real output, whatever the machine was doing, and each
    flips when one number is edited against it."""
    name = "03_kv_cache_growth.py"
    found = check_printed_verdicts(name, lesson_03)
    assert set(found) == {"estimator", "linear-in-tokens", "preallocated", "recompute-same", "h1", "context-in-keys"}
    assert all(claim.holds and not claim.timed for claim in found.values())
    assert "claim context-in-keys: shown" in lesson_03 and "not shown" not in lesson_03
    edits = {
        "estimator": (r"at 4 of 4 steps", "at 3 of 4 steps"),
        "linear-in-tokens": (r"(check bytes: S=\d+: \d+, S=\d+: )\d+", lambda m: m[1] + "1"),
        "preallocated": (r"on every row \(1 distinct\)", "on every row (2 distinct)"),
        "recompute-same": (r"one full pass\| = \S+", "one full pass| = 3.0e-02"),
        "h1": (r"batch 16 = 32\.00 GiB", "batch 16 = 16.00 GiB"),
        "context-in-keys": (r"differ by \d+%", "differ by 0%"),
    }
    for key, (pattern, replace) in edits.items():
        claim = decided(name, edited(lesson_03, pattern, replace))[key]
        assert not claim.holds, (key, claim.evidence)


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


def test_04_a_slope_never_contradicts_its_endpoints():
    """A printed 16.4 -> 17.0 ms came with 'slope -31 us per token' (a least-squares line pulled by one slow early
    step); the slope now joins the two quarters' medians, so its sign is theirs."""
    spec = importlib.util.spec_from_file_location("lesson_04", ROOT / "lessons" / "04_cache_vs_no_cache.py")
    lesson = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lesson)
    steps = np.array([0.050] + [0.030] + [0.0164] * 7 + [0.0166] * 8 + [0.0170] * 8)     # prefill, one slow step
    assert np.polyfit(np.arange(1, len(steps)), steps[1:], 1)[0] < 0                     # what it used to print
    first, last, slope = lesson.trend(steps)
    assert (first, last) == (0.0164, 0.0170) and slope > 0
    assert slope == pytest.approx((last - first) / (len(steps) - 6 - 1))                 # 6 steps a quarter, 18 apart


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
