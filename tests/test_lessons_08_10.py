"""Lessons 08-10 run as a learner runs them (subprocesses on the real model) and their printed numbers hold together.

References are computed here, independently of the lessons' code: the scheduling rules are re-checked on the
printed per-step timelines (static groups, a work-conserving continuous scheduler), the greedy tokens against
generate() alone, KV bytes from the model's shapes, prefix-cache hits from the tokenized prompts and the block size.
Each lesson's claims() is run on its real output (the verdicts it printed must be the ones its claims give) and on
copies with one printed number edited to contradict a claim, which must then fail.
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
from minitransformer.lab.claims import is_shown, printed_verdicts, table_with
from minitransformer.lab.measure import Quietness

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"([0-9.]+(?:e[+-]\d+)?)"


def run_lesson(name: str, model_path, *args) -> str:
    env = dict(os.environ, COLUMNS="200", MINITRANSFORMER_MODEL=str(model_path))
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / name), *args], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=1800)   # generous: shared CI machines
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def shared_run(name: str, args: list[str], model_path, figure: bool = True):
    """A lesson at test_transcripts' small settings, run once per session for both: that test compares its outline
    with the transcript, this module reads its numbers (lesson_runs.small_run). Run as make_transcripts runs a
    lesson: piped, 120 columns."""
    from lesson_runs import small_run
    from test_transcripts import SMALL

    assert SMALL[name[:2]] == args, f"test_transcripts' SMALL[{name[:2]!r}] and this module's arguments differ"
    run = small_run(ROOT / "lessons" / name, tuple(args), str(model_path), figure=figure)
    assert run.code == 0, run.stderr[-3000:]
    return run


def check(output: str, pattern: str) -> tuple[float, ...]:
    match = re.search(pattern, output)
    assert match, f"{pattern!r} not in the lesson's output:\n{output[-4000:]}"
    return tuple(float(g) for g in match.groups())


def load_lesson(name: str):
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py"), ROOT / "lessons" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decided(name: str, output: str) -> dict:
    """{key: Claim} of the lesson's claims() on this output."""
    return {c.key: c for c in load_lesson(name).claims(output)}


def assert_verdicts_as_printed(name: str, output: str) -> dict:
    """The lesson printed one verdict per claim, and each is what its claim and the run's quietness give."""
    found, quiet = decided(name, output), Quietness.parse(output)
    assert quiet is not None, "no quietness line"
    assert printed_verdicts(output) == {k: is_shown(c, quiet) for k, c in found.items()}
    return found


def edit_cell(output: str, row: str, column: int, text: str, after: str = "") -> str:
    """The output with cell `column` (0 = the row label) of the first table row labelled `row` (after the text
    `after`) replaced by `text`, padded to the cell's printed width, as if the run had printed that number."""
    lines = output.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if after in line)
    for i, line in enumerate(lines[start:], start):
        cells = line.split("│")
        if len(cells) > column + 1 and cells[1].strip() == row:
            width = len(cells[column + 1])
            assert len(text) + 2 <= width, (text, width)
            cells[column + 1] = f" {text}".ljust(width)
            lines[i] = "│".join(cells)
            return "".join(lines)
    raise AssertionError(f"no table row {row!r}")


# ---------------------------------------------------------------------------------------------------- lesson 08

L08 = "08_static_vs_continuous_batching.py"
SLOTS, N08, SWEEP, MAX_PROMPT, MAX_OUTPUT, REPEATS08, STEP_REPEATS = 2, 5, [3, 4], 24, 6, 2, 4
L08_ARGS = ["--requests", str(N08), "--max-num-seqs", str(SLOTS), "--sweep", ",".join(map(str, SWEEP)),
            "--max-prompt", str(MAX_PROMPT), "--max-output", str(MAX_OUTPUT), "--repeats", str(REPEATS08),
            "--step-repeats", str(STEP_REPEATS)]


@pytest.fixture(scope="module")
def lesson_08(real_model_path):
    """The lesson at test_transcripts' small settings (that test compares the same run with the transcript)."""
    run = shared_run(L08, L08_ARGS, real_model_path)
    return run.output, run.figure


def lanes_of(out: str, policy: str) -> dict[str, tuple[int, int, str]]:
    section = out.split(f"{policy} batching, max_num_seqs")[1]
    rows = re.findall(r"^(r\d\d) prompt +(\d+) out +(\d+) \|([PD.\- ]+)\|$", section, re.M)[:N08]
    assert len(rows) == N08, section[:2000]
    return {rid: (int(p), int(o), lane) for rid, p, o, lane in rows}


@pytest.mark.parametrize("policy", ["static", "continuous"])
def test_08_timeline_follows_the_policy(lesson_08, policy):
    out, _ = lesson_08
    lanes = lanes_of(out, policy)
    steps, util, tokens, per_step = check(out, rf"{policy}: steps (\d+), slot utilization {NUMBER}, "
                                               rf"(\d+) tokens = {NUMBER} per step")
    assert {len(lane) for _, _, lane in lanes.values()} == {steps}
    for rid, (_, n_out, lane) in lanes.items():
        assert lane.count("D") == n_out - 1, (rid, lane)           # ignore_eos: max_tokens, the first from prefill
        assert re.fullmatch(r"\.*P+[D\-]*D? *", lane), (rid, lane)  # queued -> prefill -> decode -> done, in order
    busy = sum(lane.count("P") + lane.count("D") for _, _, lane in lanes.values())
    assert util == pytest.approx(busy / (steps * SLOTS), abs=1e-3)
    assert tokens == sum(o for _, o, _ in lanes.values())
    assert per_step == pytest.approx(tokens / steps, abs=0.006)
    for step in range(int(steps)):
        active = [lane[step] in "PD-" for _, _, lane in lanes.values()]
        queued = [lane[step] == "." for _, _, lane in lanes.values()]
        assert sum(active) <= SLOTS
        if policy == "continuous" and any(queued):                  # never a free slot while someone waits
            assert sum(active) == SLOTS, step
        if policy == "static" and step:                            # a newcomer only when the whole group is done
            joined = [lane[step] != "." and lane[step - 1] == "." for _, _, lane in lanes.values()]
            if any(joined):
                earlier = [lane[step] for _, _, lane in lanes.values() if lane[step - 1] != "."]
                assert set(earlier) <= {" "}, step


def test_08_same_tokens_as_generate_alone(lesson_08, real_model):
    out, _ = lesson_08
    assert f"check tokens: static == continuous for {N08}/{N08} requests" in out
    printed = [int(x) for x in re.search(r"r00 = \[([\d, ]+)\]", out).group(1).split(",")]
    _, prompt, max_tokens = load_lesson(L08).workload(real_model.tokenizer, N08, MAX_PROMPT, MAX_OUTPUT, 0)[0]
    alone = generate(real_model, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    assert printed == alone.token_ids


def cell_numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", cell)]


def test_08_clock_table_schedule_answer_and_figure(lesson_08, real_model):
    """Part 4's columns: every configuration, its schedule as the timelines count it, and timed cells that read
    'best (median, spread)' consistently; the interview answer quotes the schedule; the figure was drawn."""
    out, figure = lesson_08
    cols, sizes = load_lesson(L08).clock_table(out)
    tokens = sum(o for *_, o in load_lesson(L08).workload(real_model.tokenizer, N08, MAX_PROMPT, MAX_OUTPUT, 0))
    assert sorted(cols) == [("continuous", m) for m in sorted(set(SWEEP) | {SLOTS})] + [("static", SLOTS)]
    for (policy, m), rows in cols.items():
        steps, util, tok_step = rows["steps"][0], rows["slot util"][0], rows["tok/step"][0]
        assert 0 < util <= 1
        # Prompts fit the token budget, so every scheduled sequence samples one token: util = tokens/step / slots
        assert util == pytest.approx(tok_step / m, abs=0.0051 / m + 0.0006)   # both rounded
        assert tok_step == pytest.approx(tokens / steps, abs=0.006)
        for label in ("tok/s", "TTFT p50 s", "TTFT p99 s", "ITL p50 ms", "ITL p99 ms"):
            best, median, spread = rows[label]
            if label == "tok/s":                                     # best is the highest
                assert best - spread - 0.11 <= median <= best + 0.051
            else:                                                    # best is the lowest
                assert best - 0.11 <= median <= best + spread + 0.11
        if m == SLOTS:
            printed = check(out, rf"{policy}: steps (\d+), slot utilization {NUMBER}")
            assert (steps, util) == printed
    flat = " ".join(out.split())
    st, co = cols["static", SLOTS], cols["continuous", SLOTS]
    assert f"here {st['steps'][0]:.0f} steps at {st['slot util'][0]:.0%} slot utilization" in flat
    assert f"{co['steps'][0]:.0f} steps at {co['slot util'][0]:.0%}" in flat
    sizes = sorted(set(SWEEP) | {SLOTS})                                # the sweep runs at --max-num-seqs too
    lo, hi = cols["continuous", sizes[0]]["tok/s"][0], cols["continuous", sizes[-1]]["tok/s"][0]
    assert f"From max_num_seqs {sizes[0]} to {sizes[-1]} (best of {REPEATS08} runs each): throughput {lo:.1f} -> " \
           f"{hi:.1f} tok/s" in flat
    data = figure.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 400_000


def test_08_step_cost_table(lesson_08):
    """Part 3: one row per batch size up to max_num_seqs and one mixed row, each timed STEP_REPEATS times in turns;
    the ratio and tok/s columns are the printed mins', the H200 column stays near 1 (weights read once), and every
    timed step held the tokens its row names."""
    out, _ = lesson_08
    section = out.split("3. What one engine step costs")[1].split("4. The clock")[0]
    rows = re.findall(r"│ ([^│]+?) +│ ([0-9.]+) +│ ([0-9.]+) +│ ([0-9.]+) +│ ([0-9.]+) +│ (\d+) +│ "
                      r"([0-9.]+|-) +│", section)
    labels = [r[0] for r in rows]
    assert labels == ["1", "2", f"{SLOTS - 1} decode + {MAX_PROMPT}-token prefill"]
    base = float(rows[0][1])
    for label, low, median, spread, ratio, tok_s, h200 in rows:
        b = int(label.split()[0]) + ("prefill" in label)
        assert float(low) <= float(median) <= float(low) + float(spread) + 0.11
        assert float(ratio) == pytest.approx(float(low) / base, rel=0.01, abs=0.006)
        assert int(tok_s) == pytest.approx(b / float(low) * 1e3, rel=0.01, abs=1)
        if "prefill" not in label:
            assert 1.0 <= float(h200) <= 1 + 0.02 * b
    good, total = check(out, r"check step shapes: (\d+) of (\d+) timed steps")
    assert good == total == STEP_REPEATS * len(rows)


def test_08_claims_follow_the_printed_numbers(lesson_08):
    """The verdicts printed are the claims' on this output; an edited number that contradicts a claim fails it."""
    out, _ = lesson_08
    found = assert_verdicts_as_printed(L08, out)
    assert {"same-tokens", "step-shapes", "batch-not-free", "batch-pays", "prefill-stalls", "fewer-steps",
            "continuous-throughput", "continuous-ttft", "continuous-ttft-tail", "bigger-fewer-steps",
            "bigger-bigger-prefills", "bigger-throughput", "bigger-ttft", "bigger-itl", "bigger-itl-tail"} == set(found)
    for key in ("same-tokens", "step-shapes", "fewer-steps", "bigger-fewer-steps"):     # not timed: they hold
        assert found[key].holds and not found[key].timed, found[key]
    static_col = 1                                                  # part 4's columns: label, static, continuous...
    assert not decided(L08, edit_cell(out, "steps", static_col, "1"))["fewer-steps"].holds
    cols, _ = load_lesson(L08).clock_table(out)
    co_col = 1 + sorted(m for p, m in cols if p == "continuous").index(SLOTS) + 1
    fast, slow = "99.9 (99.9, 0.1)", "1.0 (1.0, 0.1)"             # tok/s: far apart, each with a small spread
    shows = edit_cell(edit_cell(out, "tok/s", co_col, fast), "tok/s", static_col, slow)
    assert decided(L08, shows)["continuous-throughput"].holds
    flipped = edit_cell(shows, "tok/s", static_col, "99.9 (99.9, 2.0)")     # the ranges now overlap
    assert not decided(L08, flipped)["continuous-throughput"].holds
    assert not decided(L08, edit_cell(out, "1", 1, "9999.0"))["batch-not-free"].holds    # a step of one, slower


# ---------------------------------------------------------------------------------------------------- lesson 09

L09 = "09_paged_attention.py"
B09, N09, MAX09, CTX09, SHARED = 4, 3, 12, 512, 3
MIB = r"([0-9,.]+) MiB"


L09_ARGS = ["--requests", str(N09), "--max-tokens", str(MAX09), "--block-size", str(B09), "--shared", str(SHARED),
            "--every", "1", "--max-model-len", str(CTX09)]


@pytest.fixture(scope="module")
def lesson_09(real_model_path):
    return shared_run(L09, L09_ARGS, real_model_path, figure=False).output


def test_09_memory_table_matches_the_kv_formula(lesson_09, real_model):
    cfg = real_model.config
    per_token = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4 / 2**20      # MiB of K and V per token
    rows = re.findall(rf"│ (\d+)( \(peak\))? +│ (\d+) +│ (\d+) +│ {MIB} +│ {MIB} +│ {MIB} +│ (\d+) +│ "
                      rf"{MIB} +│ ([0-9.]+)% +│", lesson_09)
    assert len(rows) >= 2, lesson_09[:3000]
    sums = np.zeros(4)                                   # token-steps: used, reserved max_model_len, promised, paged
    for _step, peak, running, tokens, used, ctx, promised, blocks, paged, waste in rows:
        running, tokens, blocks = int(running), int(tokens), int(blocks)
        assert float(used) == pytest.approx(tokens * per_token, abs=0.006)
        assert float(ctx) == pytest.approx(running * CTX09 * per_token, abs=0.006)
        assert float(paged) == pytest.approx(blocks * B09 * per_token, abs=0.006)
        assert tokens <= blocks * B09 < tokens + running * B09       # at most one partly filled block per sequence
        assert float(waste) == pytest.approx(100 * (1 - tokens / (blocks * B09)), abs=0.06)
        assert float(used) <= float(promised) <= float(ctx)
        if not peak:                                     # --every 1: one row per step, then the peak repeated
            sums += [int(tokens), int(running) * CTX09, float(promised) / per_token, int(blocks) * B09]
    assert [int(r[0]) for r in rows if not r[1]] == list(range(1, len(rows)))
    flat = " ".join(lesson_09.split())
    used, ctx, promised, paged = sums
    assert f"filled {used / ctx:.1%} of what reserving {CTX09} tokens each would hold" in flat
    printed, = check(flat, rf"{NUMBER}% of exact prompt \+ max_tokens reservations")
    assert printed == pytest.approx(100 * used / promised, rel=0.01)     # the table's MiB are rounded
    assert f"{used / paged:.1%} of the paged blocks" in flat


def test_09_block_tables_grow_and_slots_follow_the_formula(lesson_09):
    section = lesson_09.split("2. Block tables grow")[1].split("3. Prefix caching")[0]
    lines = re.findall(r"^step +(\d+) +free blocks +(\d+) +(.*)$", section, re.M)
    assert len(lines) >= 4
    seen = {}
    for _, free, text in lines:
        tables = {rid: (int(n), [int(b) for b in t.split(",")])
                  for rid, n, t in re.findall(r"(\w): +(\d+) tokens -> \[([\d, ]+)\]", text)}
        owned = [b for _, t in tables.values() for b in t]
        assert len(owned) == len(set(owned)) and int(free) == 16 - len(owned)   # no sharing without a prefix cache
        for rid, (n, table) in tables.items():
            assert len(table) == -(-n // B09), (rid, n, table)                 # exactly the blocks n tokens need
            assert table[:len(seen.get(rid, []))] == seen.get(rid, [])         # a table only ever grows at its end
            seen[rid] = table
    pos, block, offset, slot = map(int, re.search(r"position (\d+) -> .* = (\d+) \* \d+ \+ (\d+) = slot (\d+)",
                                                  section).groups())
    assert (block, offset) == (seen["c"][pos // B09], pos % B09) and slot == block * B09 + offset


def test_09_prefix_cache_hits_follow_from_the_prompts(lesson_09, real_model):
    from minitransformer.core.generate import make_request
    lesson = load_lesson(L09)
    prompts = [make_request(real_model, [{"role": "system", "content": lesson.SYSTEM}, {"role": "user", "content": q}],
                            SamplingParams(max_tokens=4), chat=True).prompt_token_ids
               for q in lesson.QUESTIONS[:SHARED]]
    rows = re.findall(r"│ (s\d) +│ (\d+) +│ (\d+) +│ (\d+) +│ (\d+) +│", lesson_09)
    assert [r[0] for r in rows] == [f"s{i}" for i in range(SHARED)]
    queries = hits = 0
    for i, (_, prompt_len, q_total, h_total, computed) in enumerate(rows):
        P = len(prompts[i])
        common = max((next((j for j, (x, y) in enumerate(zip(prompts[i], p)) if x != y), min(P, len(p)))
                      for p in prompts[:i]), default=0)
        hit = min(common, P - 1) // B09 * B09          # whole blocks only; the last prompt token is recomputed
        queries, hits = queries + P, hits + hit
        assert (int(prompt_len), int(q_total), int(h_total), int(computed)) == (P, queries, hits, P - hit)
    assert hits > 0
    flat = " ".join(lesson_09.split())
    assert f"s1 found {int(rows[1][3]) - int(rows[0][3])} of its {rows[1][1]} prompt tokens" in flat


def test_09_claims_follow_the_printed_numbers(lesson_09):
    """Nothing in lesson 09 is timed: every claim holds and is shown on the real output, and a number edited to
    contradict one fails it."""
    found = assert_verdicts_as_printed(L09, lesson_09)
    assert set(found) == {"last-block-only", "stops-early", "paged-holds-less", "paged-admits-more", "tables-grow",
                          "slot-formula", "prefix-hits", "prefix-whole-blocks"}
    assert all(c.holds and not c.timed for c in found.values()), [c for c in found.values() if not c.holds]
    # a first memory row whose blocks hold a whole spare block per sequence
    row = re.search(r"│ 1 +│ (\d+) +│ (\d+) +│", lesson_09)
    running, tokens = int(row[1]), int(row[2])
    too_many = str(-(-tokens // B09) + running)
    assert not decided(L09, edit_cell(lesson_09, "1", 6, too_many))["last-block-only"].holds
    # s1 computing its whole prompt although the counters say it found cached tokens
    s1 = re.search(r"│ s1 +│ (\d+) +│", lesson_09)
    assert not decided(L09, edit_cell(lesson_09, "s1", 4, s1[1]))["prefix-hits"].holds
    # paged blocks holding more token-steps than the reservations
    promised = re.search(r"reserve prompt\+max ([\d,]+), paged ([\d,]+);", " ".join(lesson_09.split()))
    more = f"{int(promised[1].replace(',', '')) + 1:,}"
    edited = re.sub(r"(reserve prompt\+max [\d,]+, paged\s+)[\d,]+;", lambda m: f"{m[1]}{more};", lesson_09)
    assert not decided(L09, edited)["paged-holds-less"].holds
    # a block table that lost its first block between two printed steps
    edited = re.sub(r"(step +2 +free blocks +\d+ +a: +\d+ tokens -> )\[(\d+)", r"\g<1>[99", lesson_09, count=1)
    assert edited != lesson_09 and not decided(L09, edited)["tables-grow"].holds


# ---------------------------------------------------------------------------------------------------- lesson 10

L10 = "10_priority_and_starvation.py"
SLOTS10, FLOOD, URGENT, LOW_TOKENS, URGENT_TOKENS, STREAM, AGING = 2, 4, 1, 3, 2, 5, 2
HOG, CAP, CANCEL_AT = 24, 48, 3             # part 4's long request and max_model_len; part 6's cancelling step


L10_ARGS = ["--slots", str(SLOTS10), "--flood", str(FLOOD), "--urgent", str(URGENT), "--low-tokens", str(LOW_TOKENS),
            "--urgent-tokens", str(URGENT_TOKENS), "--stream", str(STREAM), "--aging", str(AGING), "--hog-tokens",
            str(HOG), "--cap", str(CAP), "--cancel-at", str(CANCEL_AT)]


@pytest.fixture(scope="module")
def lesson_10(real_model_path):
    return shared_run(L10, L10_ARGS, real_model_path, figure=False).output


def simulate(arrivals, slots, policy, aging=10**9):
    """The scheduling rules on paper: {id: step of its first token}. arrivals: [(step, id, max_tokens, priority)]
    in the order they are added. Prompts fit the token budget and the pool, so a request holds one slot from the
    step it is admitted (its first token comes from that prefill) for max_tokens steps."""
    order = {rid: i for i, (_, rid, _, _) in enumerate(arrivals)}
    info = {rid: (n, prio) for _, rid, n, prio in arrivals}
    waiting, waited, running, first, step = [], {}, {}, {}, 0
    while len(first) < len(arrivals) or running:
        waiting += [rid for s, rid, _, _ in arrivals if s == step]
        while waiting and len(running) < slots:
            key = ((lambda r: (info[r][1] - waited.get(r, 0) // aging, order[r])) if policy == "priority"
                   else order.get)
            rid = min(waiting, key=key)
            waiting.remove(rid)
            running[rid] = 0
        for rid in waiting:
            waited[rid] = waited.get(rid, 0) + 1
        for rid in list(running):
            first.setdefault(rid, step)
            running[rid] += 1
            if running[rid] == info[rid][0]:
                del running[rid]
        step += 1
    return first


def test_10_urgent_requests_jump_the_queue(lesson_10):
    arrivals = [(0, f"low{i:02d}", LOW_TOKENS, 1) for i in range(FLOOD)] + \
               [(3, f"URGENT{i}", URGENT_TOKENS, 0) for i in range(URGENT)]
    printed = dict(re.findall(r"│ (FCFS|priority) .*?│ \[([\d, ]+)\] +│", lesson_10))
    for policy, label in (("continuous", "FCFS"), ("priority", "priority")):
        first = simulate(arrivals, SLOTS10, policy)
        expected = [first[f"URGENT{i}"] - 3 for i in range(URGENT)]
        assert [int(x) for x in printed[label].split(",")] == expected, (policy, printed)
    assert max(simulate(arrivals, SLOTS10, "priority")[f"URGENT{i}"] for i in range(URGENT)) < \
        max(simulate(arrivals, SLOTS10, "continuous")[f"URGENT{i}"] for i in range(URGENT))


def test_10_aging_bounds_the_starved_request(lesson_10):
    arrivals = [(0, "u000", 3, 0), (0, f"u{STREAM:03d}", 3, 0), (1, "u001", 3, 0), (1, "patient", 4, 1)] + \
               [(i, f"u{i:03d}", 3, 0) for i in range(2, STREAM)]
    rows = re.findall(r"│ (off|every \d+ steps) +│ (\d+) +│ (\d+) +│ (\d+) +│ (\d+) +│ "
                      r"[0-9.]+ \([0-9.]+, [0-9.]+\) +│", lesson_10)
    assert [r[0] for r in rows] == ["off", f"every {AGING} steps"]
    for (_label, arrived, first_step, waited, ahead), aging in zip(rows, (10**9, AGING)):
        first = simulate(arrivals, 2, "priority", aging)
        assert (int(arrived), int(first_step), int(waited)) == (1, first["patient"], first["patient"] - 1)
        assert int(ahead) == sum(1 for rid, s in first.items() if rid != "patient" and s < first["patient"])
    assert int(rows[1][3]) < int(rows[0][3])                      # aging shortened the wait
    flat = " ".join(lesson_10.split())
    assert f"without aging the patient request waited {rows[0][3]} steps" in flat
    assert f"every {AGING} steps waited, {rows[1][3]} steps" in flat


def test_10_claims_follow_the_printed_numbers(lesson_10):
    """The verdicts printed are the claims' on this output; the claims about the order of service (steps, not
    timed) hold; a number edited to contradict one fails it."""
    found = assert_verdicts_as_printed(L10, lesson_10)
    steps = ("urgent-first", "low-later", "same-work", "no-preemption", "starves", "aging-bounds", "admission",
             "hog-starves", "cap-bounds", "timeout-partial", "timeout-frees", "cancel-frees", "cancel-unaffected")
    assert set(found) == {*steps, "urgent-sooner-s", "low-later-s", "aging-sooner-s"}
    for key in steps:
        assert found[key].holds and not found[key].timed, found[key]
    fcfs = re.search(r"│ FCFS \(continuous\) +│ \[([\d, ]+)\]", lesson_10)[1]
    assert not decided(L10, edit_cell(lesson_10, "priority", 1, f"[{fcfs}]"))["urgent-first"].holds
    assert not decided(L10, edit_cell(lesson_10, "every 2 steps", 3, "99"))["aging-bounds"].holds
    assert not decided(L10, edit_cell(lesson_10, "priority", 4, "99"))["same-work"].holds
    refused = lesson_10.replace("tenant b, 40 + 8 tokens: accepted", "tenant b, 40 + 8 tokens: refused: quota")
    assert not decided(L10, refused)["admission"].holds
    # seconds: far apart they hold; overlapping they do not
    clock = "urgent TTFT max s"                                   # the seconds table's header
    fast = edit_cell(edit_cell(lesson_10, "priority", 1, "0.10 (0.10, 0.01)", after=clock), "FCFS (continuous)",
                     1, "9.00 (9.00, 0.01)", after=clock)
    assert decided(L10, fast)["urgent-sooner-s"].holds
    slow = edit_cell(fast, "priority", 1, "8.99 (9.00, 0.02)", after=clock)
    assert not decided(L10, slow)["urgent-sooner-s"].holds


def test_10_guardrails_follow_the_limits(lesson_10):
    """Part 4 against one slot on paper: the hog holds it for its whole reply (HOG tokens, or what max_model_len CAP
    leaves a 40-token prompt), then each short request (4 tokens) in turn. Parts 5 and 6: the reasons, the partial
    reply and the blocks as the engine's rules give them."""
    rows = table_with(lesson_10, "hog: asked").rows                  # wrapped cells joined
    assert [r[0].split() for r in rows] == [["none", str(rows[0][0].split()[1])], ["max_model_len", str(CAP)]]
    for (label, asked, admission, made, last, waits), hog in zip(rows, (HOG, CAP - 40)):
        assert (int(asked), int(made), int(last)) == (HOG, hog, hog - 1)
        assert admission == ("accepted" if label.startswith("none") else f"refused; asked again for {hog}")
        # the first short request's first token comes the step after the hog's last, the others 4 steps apart
        assert [int(w) for w in re.findall(r"\d+", waits)] == [hog - 1 + 4 * i for i in range(3)]
    flat = " ".join(lesson_10.split())
    made, asked = (int(x) for x in re.search(r"ended after [\d.]+ s with (\d+) of (\d+) tokens", flat).groups())
    assert 0 < made < asked == 1000
    assert "The engine's Result: finish_reason abort, stop_reason timeout." in flat
    assert "The HTTP API reports finish_reason length, stop_reason timeout." in flat
    before, pool, running, after = (int(x) for x in re.search(
        r"KV blocks free: (\d+) of (\d+) before it, (\d+) of \d+ after its last token, (\d+) of", flat).groups())
    assert before == after == pool == 64 and 0 < pool - running <= -(-(20 + made) // 16)
    cancelled = re.search(r"│ c, cancelled before step (\d+) +│ abort +│ cancelled +│ (\d+) +│ - +│",
                          lesson_10)
    assert cancelled and int(cancelled[1]) == int(cancelled[2]) == CANCEL_AT       # one token a step until then
    for rid in "ab":
        assert re.search(rf"│ {rid} +│ length +│ - +│ 16 +│ 16 of 16 +│", lesson_10), rid


def test_10_guardrail_claims_fail_on_contrary_numbers(lesson_10):
    """Each guardrail claim fails when one printed number or word contradicts it."""
    found = decided(L10, lesson_10)
    assert all(found[k].holds for k in ("hog-starves", "cap-bounds", "timeout-partial", "timeout-frees",
                                        "cancel-frees", "cancel-unaffected"))
    uncapped = re.search(r"│ (none \d+) ", lesson_10)[1]                          # 'none 8192': the model's context
    assert not decided(L10, edit_cell(lesson_10, uncapped, 5, "[1, 5, 9]"))["hog-starves"].holds
    assert not decided(L10, edit_cell(lesson_10, f"max_model_len {CAP}", 2, "accepted"))["cap-bounds"].holds
    assert not decided(L10, edit_cell(lesson_10, f"max_model_len {CAP}", 5, "[99, 103, 107]"))["cap-bounds"].holds
    reason = lesson_10.replace("abort, stop_reason timeout.", "abort, stop_reason cancelled.")
    assert reason != lesson_10 and not decided(L10, reason)["timeout-partial"].holds
    whole = re.sub(r"with \d+ of 1000 tokens", "with 1000 of 1000 tokens", lesson_10)
    assert not decided(L10, whole)["timeout-partial"].holds
    kept = re.sub(r"(\d+) of 64 after the timeout", "60 of 64 after the timeout", lesson_10)
    assert not decided(L10, kept)["timeout-frees"].holds
    late = re.sub(r"Right after it, before any other step: \d+", "Right after it, before any other step: 0", lesson_10)
    assert not decided(L10, late)["cancel-frees"].holds
    assert not decided(L10, edit_cell(lesson_10, "a", 4, "15 of 16"))["cancel-unaffected"].holds
