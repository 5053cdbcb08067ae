"""Lesson 11 runs as a learner runs it (a subprocess on the real model) and its printed numbers hold together.

The references are independent of the lesson's own code: the tile counts come from the causal rule recomputed
here from the prompt length, the score-buffer size from the shapes, and every "check" difference must be below the
kernel tests' float32 tolerance (1e-5).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minitransformer import load_tokenizer
from printed_output import half_unit_e, timing_cells_agree

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "lessons" / "11_flash_attention_kernel.py"
PROMPT = "The quick brown fox jumps over the lazy dog. " * 5            # 50 tokens: 4 query tiles, 2 key tiles
NUMBER = r"([0-9.]+(?:e[+-]\d+)?)"


@pytest.fixture(scope="module")
def lesson_output(real_model_path):
    env = dict(os.environ, COLUMNS="200", MINITRANSFORMER_MODEL=str(real_model_path))   # one line per check
    result = subprocess.run([sys.executable, str(LESSON), "--prompt", PROMPT, "--layers", "3", "--sizes", "256,2048"],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, len(load_tokenizer(real_model_path).encode(PROMPT))


def check(output: str, pattern: str) -> tuple[float, ...]:
    match = re.search(pattern, output)
    assert match, f"{pattern!r} not in the lesson's output:\n{output[-4000:]}"
    return tuple(float(g) for g in match.groups())


def test_kernel_matches_array_on_the_real_model(lesson_output):
    out, _ = lesson_output
    diff, layers = check(out, rf"check prefill: max \|kernel - array\| = {NUMBER} over (\d+) layers")
    assert layers == 3 and diff < 1e-5
    assert 0 < diff          # the kernel really ran: float32 sums in another order never agree to the last bit here


def test_tile_by_tile_mirror_ends_at_the_kernels_output_and_lse(lesson_output):
    out, T = lesson_output
    out_diff, lse_diff = check(out, rf"check mirror: \|acc/l - kernel out\| = {NUMBER}, \|m \+ log l - kernel lse\| "
                                    rf"= {NUMBER}")
    assert out_diff < 1e-5 and lse_diff < 1e-5
    rows = re.findall(r"│ (\d+)-(\d+) +│ +(-?[0-9.]+) +│ +(-?[0-9.]+) +│ +([0-9.]+) +│ +([0-9.]+) +│ "
                      r"+([0-9.e+-]+) +│", out)
    assert [int(r[0]) for r in rows][:2] == [32, 0], rows          # last key tile first, as the kernel visits them
    running_max = [float(r[3]) for r in rows[:2]]
    assert running_max[1] == max(running_max[0], float(rows[1][2]))  # m is the max of the tile maxima seen so far
    assert float(rows[0][4]) == 0.0                                    # alpha = e^(-inf) before the first tile
    assert float(rows[1][6]) < 1e-5                                   # after the last tile: the kernel's answer


def test_tile_counts_follow_the_causal_rule(lesson_output):
    out, T = lesson_output
    visited, total, skipped = check(out, r"check tiles: visited (\d+) of (\d+), skipped (\d+)")
    # Query tile i (16 rows) needs keys 0 .. its last row, i.e. ceil((last + 1) / 32) key tiles of 32.
    expected = sum(-(-min(T, 16 * (i + 1)) // 32) for i in range(-(-T // 16)))
    assert (visited, total, skipped) == (expected, -(-T // 16) * -(-T // 32), total - expected)
    assert f"flash_prefill on {T} tokens" in out


def test_paged_decode_and_merge(lesson_output):
    out, T = lesson_output
    merge_out, merge_lse = check(out, rf"check merge: \|mirror - kernel out\| = {NUMBER}, \|M \+ log sum w - kernel "
                                      rf"lse\| = {NUMBER}")
    decode, = check(out, rf"check decode: max \|paged kernel - array\| = {NUMBER}")
    baseline, = check(out, rf"check decode baseline: max \|paged_decode_simple.cu - paged_decode.cu\| = {NUMBER}")
    assert max(merge_out, merge_lse, decode, baseline) < 1e-5
    assert f"seq_lens = [{T}, {T // 2 + 3}]" in out


def test_tensor_core_kernel_on_the_real_model(lesson_output):
    """flash_prefill_wmma.cu on the model's q, k, v in float16: its own error under the bound the kernel tests
    derive, and the work count of one key tile recomputed here (16 rows x 32 keys x d = 64, for S and for P V)."""
    out, _ = lesson_output
    total, ratio = check(out, rf"check wmma: max \|wmma - float32 array\| = {NUMBER} over 3 layers, max \|wmma - "
                              rf"array on float16 inputs\| / bound = {NUMBER}")
    assert 0 < ratio <= 1 and total > 0
    cuda_core, wmma = check(out, rf"check wmma layer 0: CUDA-core kernel in float16 {NUMBER}, tensor-core kernel "
                                 rf"{NUMBER}")
    assert cuda_core > 0 and wmma > 0
    flat = " ".join(out.split())
    fmas = 2 * 16 * 32 * 64
    assert f"issues them as {fmas} scalar FMAs, the tensor-core kernel as {fmas // (16 * 16 * 16)} mma_sync" in flat


def test_memory_table_and_answer_use_this_runs_numbers(lesson_output):
    out, T = lesson_output
    flat = " ".join(out.split())                                       # the answer is a wrapped paragraph
    score_gib = 4 * 9 * 2048 ** 2 / 2**30                               # float32 scores of 9 heads at T = 2048
    assert f"writes a {score_gib:,.2f} GiB score buffer" in flat
    diff, _ = check(out, rf"check prefill: max \|kernel - array\| = {NUMBER} over (\d+) layers")
    answered, = check(flat, rf"matched layers.attention to {NUMBER} on 3 layers")
    assert abs(answered - diff) <= half_unit_e(answered, 1) + half_unit_e(diff, 2)   # printed .1e and .2e
    assert "No GPU through CuPy here" in out or "check gpu:" in out


# ---------------------------------------------------------------------------------------------------- the claims

def load_lesson():
    import importlib.util
    spec = importlib.util.spec_from_file_location("lesson11", LESSON)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decided(output: str) -> dict:
    return {c.key: c for c in load_lesson().claims(output)}


def test_claims_are_decided_from_the_printed_numbers(lesson_output):
    """claims() reads this run's output: every correctness claim holds (they need no quiet machine), the lesson
    printed one verdict line per claim, and a claim about time is printed as shown only on a quiet run."""
    from minitransformer.lab.claims import printed_verdicts
    from minitransformer.lab.measure import Quietness
    out, _ = lesson_output
    found = decided(out)
    assert set(found) == {"tiles-causal", "prefill-exact", "mirror-exact", "decode-exact", "wmma-bound",
                          "wide-tiles-move-less", "runner-slower"}
    assert all(c.holds and not c.timed for key, c in found.items() if key != "runner-slower")
    assert found["runner-slower"].timed
    verdicts, quiet = printed_verdicts(out), Quietness.parse(out)
    assert set(verdicts) == set(found)
    for key, claim in found.items():
        assert verdicts[key] == (claim.holds and (not claim.timed or quiet.quiet)), key


def test_the_timing_line_reports_min_median_spread_of_turns(lesson_output):
    out, _ = lesson_output
    flat = " ".join(out.split())
    runner, r_median, r_spread, array, a_median, a_spread = check(
        flat, rf"CPU runner {NUMBER} ms \(median {NUMBER}, spread {NUMBER}\), NumPy {NUMBER} ms \(median {NUMBER}, "
              rf"spread {NUMBER}\)")
    assert "5 runs each in turns after a warm-up" in flat
    assert runner <= r_median and array <= a_median
    assert timing_cells_agree(runner, r_median, r_spread, decimals=1)
    assert timing_cells_agree(array, a_median, a_spread, decimals=1)


def edited(out: str, pattern: str, replacement: str) -> str:
    changed, n = re.subn(pattern, replacement, out, count=1)
    assert n == 1, pattern
    return changed


@pytest.mark.parametrize("key, pattern, replacement, holds", [
    ("prefill-exact", r"(check prefill: max \|kernel - array\| = )[0-9.e+-]+", r"\g<1>3.00e-05", False),
    ("decode-exact", r"(check decode: max \|paged kernel - array\| = )[0-9.e+-]+", r"\g<1>2.00e-04", False),
    ("mirror-exact", r"(check mirror: \|acc/l - kernel out\| = )[0-9.e+-]+", r"\g<1>1.00e-03", False),
    ("tiles-causal", r"(check tiles: visited )\d+", r"\g<1>1", False),
    ("wmma-bound", r"(/ bound = )[0-9.]+", r"\g<1>1.50", False),
    ("runner-slower", r"CPU runner [0-9.]+ ms \(median [0-9.]+, spread [0-9.]+\), NumPy [0-9.]+ ms \(median "
                      r"[0-9.]+, spread [0-9.]+\)",
     "CPU runner 5.0 ms (median 6.0, spread 2.0), NumPy 4.0 ms (median 4.5, spread 1.5)", False),
    ("runner-slower", r"CPU runner [0-9.]+ ms \(median [0-9.]+, spread [0-9.]+\), NumPy [0-9.]+ ms \(median "
                      r"[0-9.]+, spread [0-9.]+\)",
     "CPU runner 90.0 ms (median 91.0, spread 2.0), NumPy 4.0 ms (median 4.5, spread 1.5)", True),
])
def test_an_edited_number_flips_its_claim(lesson_output, key, pattern, replacement, holds):
    """A number changed to contradict (or support) a claim decides it the other way: the verdicts follow the
    printed numbers, not the lesson's memory of them."""
    out, _ = lesson_output
    assert decided(edited(out, pattern, replacement))[key].holds is holds
