"""Lesson 12 runs as a learner runs it (a subprocess on the real model) and its printed numbers hold together.

References computed here, independently of the lesson's code: the same requests run through generate() in this
process (greedy decoding is deterministic, so the drafted / accepted counts and each pass's drafts are the same),
the counting identity of a run that ends at max_tokens (every pass ends with one token of the target's own, so
passes = tokens - accepted), and Leviathan et al.'s expectation recomputed from the printed acceptance. Timings are
only checked for arithmetic consistency, never for their size; claims() is checked on the real output and on edited
copies of it.
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
from minitransformer.lab.claims import printed_verdicts, table_with
from minitransformer.lab.measure import Quietness
from minitransformer.speculative import speculative_runner
from printed_output import edit_cell, timing_cells_agree

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "lessons" / "12_speculative_decoding.py"
TOKENS, KS, REPEATS = 16, (1, 3), 2
PROMPTS = ("repeat", "free")


@pytest.fixture(scope="module")
def lesson(real_model_path, tmp_path_factory):
    figure = tmp_path_factory.mktemp("fig") / "speculative.png"
    env = dict(os.environ, COLUMNS="200", MINITRANSFORMER_MODEL=str(real_model_path))
    result = subprocess.run([sys.executable, str(LESSON), "--tokens", str(TOKENS), "--ks", ",".join(map(str, KS)),
                             "--drafters", "ngram,self:20", "--prompts", ",".join(PROMPTS), "--repeats",
                             str(REPEATS), "--figure", str(figure)], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, figure


def load_lesson():
    spec = importlib.util.spec_from_file_location("lesson12", LESSON)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows_of(out: str, column: str) -> list[dict]:
    table = table_with(out, column)
    return [dict(zip(table.columns, row)) for row in table.rows]


def flat(out: str) -> str:
    return " ".join(out.split())


def test_pass_cost_table_is_consistent(lesson):
    """Table 1: one row per pass size 1 .. max(k) + 1; the ratio and per-token columns follow from the fastest run;
    the median lies between the fastest and the slowest."""
    out, _ = lesson
    rows = {int(r["tokens in the pass"]): r for r in rows_of(out, "tokens in the pass")}
    assert sorted(rows) == list(range(1, max(KS) + 2))
    one = float(rows[1]["ms per pass"])
    for T, r in rows.items():
        fastest, median, spread = (float(r[c]) for c in ("ms per pass", "median", "spread"))
        assert timing_cells_agree(fastest, median, spread, decimals=1)
        assert float(r["x a 1-token step"]) == pytest.approx(fastest / one, rel=0.02, abs=0.01)
        assert float(r["ms per token"]) == pytest.approx(fastest / T, rel=0.01, abs=0.06)
    matmul = [c for c in table_with(out, "tokens in the pass").columns if c.startswith("one matmul")][0]
    assert float(rows[1][matmul]) == 1.0
    assert f"each timed {3 * REPEATS} times in turns" in flat(out)


def reference(real_model, name: str, drafter: str | None, k: int = 0):
    prompts = load_lesson().PROMPTS
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0)
    if drafter is None:
        return generate(real_model, prompts[name], params)
    return generate(real_model, prompts[name], params, runner=speculative_runner(drafter, k))


def test_speculative_rows_match_generate_and_count_correctly(lesson, real_model):
    out, _ = lesson
    rows = rows_of(out, "same")
    assert len(rows) == len(PROMPTS) * (1 + 2 * len(KS)), out[-3000:]
    plain = {r["prompt"]: float(r["ms/token"]) for r in rows if r["drafter"] == "plain"}
    for r in rows:
        fastest, median, spread = (float(r[c]) for c in ("ms/token", "median", "spread"))
        assert timing_cells_agree(fastest, median, spread, decimals=1)
        if r["drafter"] == "plain":
            continue
        assert r["same"] == "yes"                                            # greedy output unchanged
        accepted, checked = (int(n) for n in r["accepted"].split("/"))
        assert float(r["a"]) == pytest.approx(accepted / checked if checked else 0.0, abs=0.006)
        verify_passes = TOKENS - accepted - 1                                # after the prefill
        assert float(r["tok/pass"]) == pytest.approx((TOKENS - 1) / verify_passes, abs=0.006)
        rounding = 0.05 / fastest + 0.05 / plain[r["prompt"]]               # both printed .1f
        assert float(r["speedup"]) == pytest.approx(plain[r["prompt"]] / fastest, rel=0.01 + rounding, abs=0.006)
        ref = reference(real_model, r["prompt"], r["drafter"], int(r["k"])).speculative
        assert (checked, accepted) == (ref["draft_tokens"], ref["accepted_tokens"])
    # the list the prompt already holds is what prompt lookup is for: it beats free text at every k
    ngram = {(r["prompt"], r["k"]): int(r["accepted"].split("/")[0]) for r in rows if r["drafter"] == "ngram"}
    assert all(ngram["repeat", str(k)] > ngram["free", str(k)] for k in KS)


def test_the_model_predicts_from_acceptance_and_table_1_alone(lesson, real_model):
    """Table 2b: per pass with d drafts (the reference run's passes), (1 - a^(d+1)) / (1 - a) tokens for table 1's
    (d+1)-token pass and d drafting passes (the check line's ratio); no timing from section 2 enters."""
    out, _ = lesson
    ratio = {int(r["tokens in the pass"]): float(r["x a 1-token step"]) for r in rows_of(out, "tokens in the pass")}
    draft_step, = (float(x) for x in re.search(r"check draft pass: self:20: .*? = ([0-9.]+) x a 1-token step",
                                               flat(out)).groups())
    table2 = {(r["prompt"], r["drafter"], r["k"]): r for r in rows_of(out, "same")}
    rows = rows_of(out, "predicted")
    assert len(rows) == len(PROMPTS) * 2 * len(KS)
    for r in rows:
        row = table2[r["prompt"], r["drafter"], r["k"]]
        accepted, checked = (int(n) for n in row["accepted"].split("/"))
        a = accepted / checked if checked else 0.0
        drafts = [len(p[0]) for p in reference(real_model, r["prompt"], r["drafter"], int(r["k"])).speculative[
            "passes"][1:]]
        tokens = np.mean([d + 1 if a >= 1 else (1 - a ** (d + 1)) / (1 - a) for d in drafts])
        verify = np.mean([ratio[d + 1] for d in drafts])
        drafting = 0.0 if r["drafter"] == "ngram" else np.mean(drafts) * draft_step
        assert float(r["drafts per pass"]) == pytest.approx(np.mean(drafts), abs=0.006)
        assert float(r["tok/pass formula"]) == pytest.approx(tokens, abs=0.006)
        assert r["tok/pass measured"] == row["tok/pass"] and r["measured"] == row["speedup"]
        assert float(r["verify steps"]) == pytest.approx(verify, abs=0.011)
        assert float(r["draft steps"]) == pytest.approx(drafting, rel=0.01, abs=0.011)
        assert float(r["predicted"]) == pytest.approx(float(r["tok/pass formula"]) / (float(r["verify steps"])
                                                      + float(r["draft steps"])), rel=0.02, abs=0.006)
        h200 = float(r["H200 predicted"])
        assert 0 < h200 <= float(r["tok/pass formula"]) + 0.01        # a verify pass costs at least one step


SAMPLED = re.compile(r"│ ([0-9.]+) +│" + r" ([0-9.]+) +│" * 6)     # a row of table 3: temperature + 6 numbers


def test_sampled_speculation_draws_from_the_targets_distribution(lesson):
    """Table 3: 10,000 speculative draws per temperature are as close to p as plain draws, within the bound that
    N draws from p stay under, while keeping every draft (TV(q, p)) would not be; acceptance is sum min(p, q)."""
    out, _ = lesson
    section = out[out.index("3. sampled"):]
    rows = [tuple(map(float, r)) for r in SAMPLED.findall(section)]
    assert [r[0] for r in rows] == [0.7, 1.0, 1.5], section[:3000]
    assert "10000 next tokens" in flat(section)
    for _temperature, accepted, overlap, tv_spec, tv_plain, bound, tv_draft in rows:
        assert tv_spec <= bound and tv_plain <= bound
        assert tv_draft > 2 * bound                                   # the check can tell q from p
        assert abs(accepted - overlap) <= 4 * (overlap * (1 - overlap) / 10_000) ** 0.5 + 0.002


# ---------------------------------------------------------------------------------------------------- the claims

def decided(out: str) -> dict:
    return {c.key: c for c in load_lesson().claims(out)}


def test_claims_and_verdicts_follow_the_printed_numbers(lesson):
    """One verdict line per claim, shown exactly when its check holds (and, for a timing, the run was quiet); the
    counting claims hold on any machine."""
    out, figure = lesson
    found = decided(out)
    assert set(found) == {"same-tokens", "lookup-likes-repeats", "self-rarely-agrees", "verify-costs-more",
                          "matmul-jump", "model-explains", "spec-won", "spec-lost", "sampled-matches"}
    assert found["same-tokens"].holds and found["lookup-likes-repeats"].holds and found["sampled-matches"].holds
    assert not (found["spec-won"].holds and found["spec-lost"].holds)
    quiet, verdicts = Quietness.parse(out), printed_verdicts(out)
    for key, claim in found.items():
        assert verdicts[key] == (claim.holds and (not claim.timed or quiet.quiet)), key
    answer = flat(out[out.index("Interview question"):])
    assert ("So on this machine speculation won" in answer) == verdicts["spec-won"]
    assert ("speculation lost everywhere" in answer) == (verdicts["spec-lost"] and not verdicts["spec-won"])
    assert ("The price jumps at the second row" in answer) == (verdicts["matmul-jump"]
                                                               and verdicts["verify-costs-more"])
    assert ("explains it without looking at section 2's clock" in answer) == verdicts["model-explains"]
    assert "every run above produced plain greedy's tokens" in answer
    assert ("redrawn from max(p - q, 0)" in answer) == verdicts["sampled-matches"]
    assert figure.stat().st_size > 5000 and figure.read_bytes()[:4] == b"\x89PNG"
    assert "figures/draft_and_verify.png draws" not in out           # 16 tokens: not the figure's run


def test_an_edited_number_flips_its_claim(lesson):
    out, _ = lesson
    assert not decided(edit_cell(out, "same", ("repeat", "ngram", "1"), "NO"))["same-tokens"].holds
    slow_one = edit_cell(out, "ms per pass", ("4",), "0.1")                  # a 4-token pass cheaper than 1 token
    assert not decided(slow_one)["verify-costs-more"].holds
    cheap = edit_cell(edit_cell(out, "ms per pass", ("4",), "9999.0"), "ms per pass", ("1",), "1.0")
    cheap = edit_cell(cheap, "spread", ("1",), "0.1")
    assert decided(cheap)["verify-costs-more"].holds
    wrong = edit_cell(out, "predicted", ("free", "self:20", "3"), "99.00")   # a prediction no run comes near
    assert not decided(wrong)["model-explains"].holds
    exact = out                                            # every prediction what the fastest runs gave, no spread
    for r in rows_of(out, "same"):
        label = (r["prompt"], r["drafter"], r["k"])
        exact = edit_cell(exact, "spread", label, "0.0", table="same")
        if r["drafter"] != "plain":
            exact = edit_cell(exact, "predicted", label, r["speedup"])
    assert decided(exact)["model-explains"].holds
    # every speculative row far faster than plain, with no spread: speculation won
    fast = out
    for name in PROMPTS:
        for drafter in ("ngram", "self:20"):
            for k in KS:
                fast = edit_cell(fast, "ms/token", (name, drafter, str(k)), "0.1")
                fast = edit_cell(fast, "spread", (name, drafter, str(k)), "0.0", table="same")
    assert decided(fast)["spec-won"].holds and not decided(fast)["spec-lost"].holds
    assert not decided(edit_cell(out, "TV(speculative, p)", ("0.70",), "0.9999"))["sampled-matches"].holds


def test_one_run_has_no_spread_to_judge_by(lesson):
    """With --repeats 1 (test_transcripts' small settings) no claim about generation times can hold."""
    out, _ = lesson
    once = out.replace(f"setting run {REPEATS} times in turns", "setting run 1 time in turns")
    found = decided(once)
    assert not any(found[key].holds for key in ("model-explains", "spec-won", "spec-lost"))
