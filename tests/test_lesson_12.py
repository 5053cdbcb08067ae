"""Lesson 12 runs as a learner runs it (a subprocess on the real model) and its printed numbers hold together.

References computed here, independently of the lesson's code: the same requests run through generate() in this
process (drafted / accepted counts are deterministic for greedy decoding), and the counting identity of a run that
ends at max_tokens: every verify pass ends with one token of the target's own, so passes = tokens - accepted.
Timings are only checked for arithmetic consistency, never for their size.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minitransformer import SamplingParams, generate

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "lessons" / "12_speculative_decoding.py"
TOKENS, KS = 16, (1, 3)
ROW = re.compile(r"│ (repeat|free) +│" + r" (\S+) +│" * 11)              # a row of table 2: 12 columns
WHY = re.compile(r"│ (repeat|free) +│ (\S+) +│ (\d+) +│" + r" ([0-9.]+) +│" * 10)   # table 2c: 13 columns


@pytest.fixture(scope="module")
def lesson(real_model_path, tmp_path_factory):
    figure = tmp_path_factory.mktemp("fig") / "speculative.png"
    env = dict(os.environ, COLUMNS="200", MINITRANSFORMER_MODEL=str(real_model_path))
    result = subprocess.run([sys.executable, str(LESSON), "--tokens", str(TOKENS), "--ks", ",".join(map(str, KS)),
                             "--drafters", "ngram,self:20", "--prompts", "repeat,free", "--repeats", "2",
                             "--figure", str(figure)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, figure


def table1(out: str) -> str:
    """Section 1 only: table 2c's rows would match table 1's patterns too."""
    return out[:out.index("2. greedy")]


def table2_rows(out: str):
    """Rows of table 2 only (table 2c's rows are longer and would match ROW too)."""
    return ROW.findall(out[out.index("2. greedy"):out.index("2b. tokens per target pass")])


def lesson_prompts():
    spec = importlib.util.spec_from_file_location("lesson12", LESSON)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PROMPTS


def test_pass_cost_table_is_consistent(lesson):
    out, _ = lesson
    rows = re.findall(r"│ (\d+) +│ ([0-9.]+) +│ ([0-9.]+) +│ ([0-9.]+) +│ ([0-9.]+) +│", table1(out))
    costs = {int(T): (float(ms), float(ratio), float(per), float(mm)) for T, ms, ratio, per, mm in rows}
    assert sorted(costs) == [1, 2, 4]                                  # 1 and k + 1 for k in KS
    assert costs[1][3] == 1.0 and costs[4][3] > 0                      # the matmul column is relative to T = 1
    for T, (ms, ratio, per, _) in costs.items():
        assert ratio == pytest.approx(ms / costs[1][0], rel=0.02, abs=0.01)
        assert per == pytest.approx(ms / T, rel=0.01, abs=0.06)


def test_speculative_rows_match_generate_and_count_correctly(lesson, real_model):
    out, _ = lesson
    rows = table2_rows(out)
    assert len(rows) == 2 * (1 + 2 * len(KS)), out[-3000:]
    prompts = lesson_prompts()
    plain_rate, plain_ms = {}, {}
    for name, drafter, k, same, counts, rate, per_pass, verify, draft, tok_s, speedup, predicted in rows:
        if drafter == "plain":
            plain_rate[name], plain_ms[name] = float(tok_s), float(verify)
            rounding = 0.05 / float(tok_s)                                  # tok/s is printed .1f
            assert float(verify) == pytest.approx(1e3 / float(tok_s), rel=0.02 + rounding)
            continue
        assert same == "yes"                                            # greedy output unchanged
        accepted, drafted = (int(n) for n in counts.split("/"))
        assert float(rate) == pytest.approx(accepted / drafted if drafted else 0.0, abs=0.006)
        passes = TOKENS - accepted                                      # prefill + verify passes
        assert float(per_pass) == pytest.approx(TOKENS / passes, abs=0.006)
        rounding = float(speedup) * 0.05 * (1 / float(tok_s) + 1 / plain_rate[name])   # both tok/s printed .1f
        assert float(speedup) == pytest.approx(float(tok_s) / plain_rate[name], rel=0.03, abs=0.006 + rounding)
        tokens_per_verify = (TOKENS - 1) / (passes - 1)
        expect = tokens_per_verify * plain_ms[name] / (float(verify) + float(draft))
        assert float(predicted) == pytest.approx(expect, rel=0.03, abs=0.01)
        if drafter == "ngram":                                          # deterministic: the same counts here
            ref = generate(real_model, prompts[name], SamplingParams(max_tokens=TOKENS, temperature=0.0),
                           speculative="ngram", num_speculative_tokens=int(k)).speculative
            assert (drafted, accepted) == (ref["draft_tokens"], ref["accepted_tokens"])
    # the list the prompt already holds is what prompt lookup is for: it beats free text at every k
    ngram = {(r[0], r[2]): int(r[4].split("/")[0]) for r in rows if r[1] == "ngram"}
    assert all(ngram[("repeat", str(k))] > ngram[("free", str(k))] for k in KS)


def test_answer_quotes_this_runs_numbers_and_figure_is_written(lesson):
    out, figure = lesson
    flat = " ".join(out.split())
    ratio = re.search(r"a pass over (\d+) tokens cost ([0-9.]+)x a 1-token step", flat)
    assert ratio and ratio.group(1) == str(max(KS) + 1)
    assert re.search(rf"│ {ratio.group(1)} +│ [0-9.]+ +│ {re.escape(ratio.group(2))} +│", table1(out))
    matmul = re.search(r"one matmul with 2 rows cost ([0-9.]+)x the same matmul with 1 row, with (\d+) rows ([0-9.]+)x",
                       flat)
    assert matmul and matmul.group(2) == str(max(KS) + 1)
    for T, value in ((2, matmul.group(1)), (max(KS) + 1, matmul.group(3))):
        assert re.search(rf"│ {T} +│ [0-9.]+ +│ [0-9.]+ +│ [0-9.]+ +│ {re.escape(value)} +│", table1(out))
    best = re.search(r"Best: (\w+) text with (\S+) at k=(\d+), acceptance ([0-9.]+), speedup ([0-9.]+)x", flat)
    speedups = [float(r[10]) for r in table2_rows(out) if r[1] != "plain"]
    assert best and float(best.group(5)) == max(speedups)
    assert "identical = yes" in flat
    assert figure.stat().st_size > 5000 and figure.read_bytes()[:4] == b"\x89PNG"


def test_expected_tokens_per_pass_formula_is_computed_from_the_rows_acceptance(lesson):
    out, _ = lesson
    section = out[out.index("2b. tokens per target pass"):out.index("2c. why")]
    rows = re.findall(r"│ (repeat|free) +│ (\S+) +│ (\d+) +│" + r" ([0-9.]+) +│" * 3, section)
    assert len(rows) == 2 * 2 * len(KS), section
    table2 = {(r[0], r[1], r[2]): r for r in table2_rows(out)}
    for name, drafter, k, a, per_pass, expected in rows:
        row = table2[(name, drafter, k)]
        assert (a, per_pass) == (row[5], row[6])                          # table 2's rate and tok/pass
        accepted, drafted = (int(n) for n in row[4].split("/"))
        exact, k = accepted / drafted if drafted else 0.0, int(k)
        formula = k + 1 if exact >= 1 else (1 - exact ** (k + 1)) / (1 - exact)
        assert float(expected) == pytest.approx(formula, abs=0.006)


SAMPLED = re.compile(r"│ ([0-9.]+) +│" + r" ([0-9.]+) +│" * 6)     # a row of table 3: temperature + 6 numbers


def test_sampled_speculation_draws_from_the_targets_distribution(lesson):
    """Table 3: 10,000 speculative draws per temperature are as close to p as plain draws, within the bound that
    N draws from p stay under, while keeping every draft (TV(q, p)) would not be; acceptance is sum min(p, q)."""
    out, _ = lesson
    section = out[out.index("3. sampled"):]
    rows = [tuple(map(float, r)) for r in SAMPLED.findall(section)]
    assert [r[0] for r in rows] == [0.7, 1.0, 1.5], section[:3000]
    assert "10000 next tokens" in " ".join(section.split())
    for temperature, accepted, overlap, tv_spec, tv_plain, bound, tv_draft in rows:
        assert tv_spec <= bound and tv_plain <= bound
        assert tv_draft > 2 * bound                                   # the check can tell q from p
        assert abs(accepted - overlap) <= 4 * (overlap * (1 - overlap) / 10_000) ** 0.5 + 0.002
    assert "draws from p at every temperature: yes" in out


def test_why_table_predicts_the_speedup_from_its_inputs(lesson, real_model):
    """Table 2c: tokens per pass from the counts, verify steps from table 1, draft steps from table 2's times, the
    predicted speedup from those three; the H200 columns from the model's shapes (bytes-bound passes at bf16)."""
    out, _ = lesson
    section = out[out.index("2c. why"):out.index("3. sampled")]
    rows = WHY.findall(section)
    assert len(rows) == 2 * 2 * len(KS), section
    ratios = {int(T): ratio for T, ratio in re.findall(r"│ (\d+) +│ [0-9.]+ +│ ([0-9.]+) +│", table1(out))}
    table2 = {(r[0], r[1], r[2]): r for r in table2_rows(out)}
    plain_ms = {r[0]: float(r[7]) for r in table2_rows(out) if r[1] == "plain"}
    c = real_model.config
    layer = c.d_model * (c.q_dim + 2 * c.kv_dim) + c.q_dim * c.d_model + 3 * c.d_model * c.ffn_dim
    head = c.d_model * c.vocab_size
    for name, drafter, k, a, drafts, per_pass, verify, draft, predicted, measured, h_verify, h_draft, h_speedup in rows:
        row, k = table2[(name, drafter, k)], int(k)
        accepted, drafted = (int(n) for n in row[4].split("/"))
        verify_passes = TOKENS - accepted - 1                           # passes after the prefill
        assert a == row[5] and measured == row[10]                      # table 2's rate and speedup
        assert float(drafts) == pytest.approx(drafted / verify_passes, abs=0.006)
        assert float(per_pass) == pytest.approx(1 + accepted / verify_passes, abs=0.006)   # = 1 + a x drafts/pass
        assert verify == ratios[k + 1]                                  # measured apart, in table 1
        assert float(draft) == pytest.approx(float(row[8]) / plain_ms[name], rel=0.03, abs=0.006)
        assert float(predicted) == pytest.approx(float(per_pass) / (float(verify) + float(draft)), rel=0.02,
                                                 abs=0.006)
        assert 1.0 <= float(h_verify) <= 1.05                           # k + 1 rows read the same weights
        layers = 0 if drafter == "ngram" else int(drafter.split(":")[1])
        fraction = 0.0 if drafter == "ngram" else (layers * layer + head) / (c.n_layers * layer + head)
        assert float(h_draft) == pytest.approx(k * fraction, rel=0.03, abs=0.006)
        assert float(h_speedup) == pytest.approx(float(per_pass) / (float(h_verify) + float(h_draft)), rel=0.02,
                                                 abs=0.006)
    flat = " ".join(out.split())
    best = re.search(r"Best: (\w+) text with (\S+) at k=(\d+)", flat).groups()
    why = re.search(r"that run yielded ([0-9.]+) tokens per pass for ([0-9.]+) \+ ([0-9.]+) steps of verify and draft "
                    r"work, predicting ([0-9.]+)x \(measured ([0-9.]+)x\); on an H200, where the verify pass costs "
                    r"about one step, the same acceptance predicts ([0-9.]+)x", flat)
    mine = next(r for r in rows if r[:3] == best)
    assert why and why.groups() == (mine[5], mine[6], mine[7], mine[8], mine[9], mine[12])


def test_verdict_only_beyond_the_measured_spread(lesson):
    out, _ = lesson
    flat = " ".join(out.split())
    verdict, best, spread = re.search(r"So on this machine speculation (won|never won|was within noise of plain "
                                      r"decoding): the best run was ([0-9.]+)x, against a run-to-run spread of "
                                      r"(\d+)%", flat).groups()
    best, spread = float(best), int(spread) / 100
    if verdict == "won":
        assert best > 1 + spread - 0.01
    elif verdict == "never won":
        assert best < 1 - spread + 0.01
    else:
        assert 1 - spread - 0.01 <= best <= 1 + spread + 0.01
