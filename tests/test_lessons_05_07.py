"""Lessons 05-07 run as a learner runs them (a subprocess on the real model) and their printed numbers hold together.

References are computed here, independently of the lessons' code: the next-token distribution from a plain
forward pass and float64 softmax / filters written out in a few lines, UTF-8 bytes from the tokenizer, metric
identities (TTFT = queue + prefill, ...) from the printed columns themselves. Timings are never compared across
runs, only within one line of one run where the margin is huge.

Each lesson's claims() is run on its real output (whatever the machine was doing, it must read every number it needs)
and on edited copies: a printed number changed to contradict a claim must flip that claim to holds=False. A timed
claim is first made to hold (the table edited into a quiet run's shape), so the flip is tested on any machine.
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

from minitransformer.lab.claims import printed_verdicts, table_with
from printed_output import printed_alike, quotient_agrees, rounds_from, set_cells, timing_cells_agree

ROOT = Path(__file__).resolve().parents[1]
NUMBER = r"(-?[0-9][0-9,]*\.?[0-9]*(?:e[+-]\d+)?)"


def run_lesson(name: str, model_path, *args: str) -> str:
    env = dict(os.environ, COLUMNS="200", MINITRANSFORMER_MODEL=str(model_path))    # wide: one line per table row
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / name), *args], capture_output=True, text=True,
                            env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def numbers(output: str, pattern: str) -> tuple[float, ...]:
    match = re.search(pattern, output)
    assert match, f"{pattern!r} not in the lesson's output:\n{output[-4000:]}"
    return tuple(float(g.replace(",", "")) for g in match.groups())


def row(output: str, first_cell: str) -> list[str]:
    """The cells of the rich table row whose first cell is `first_cell`."""
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if len(cells) > 1 and cells[0] == first_cell:
            return cells
    raise AssertionError(f"no table row {first_cell!r} in:\n{output[-4000:]}")


def lesson_module(name: str):
    """The lesson file imported as a module (its name starts with a digit), for its claims()."""
    spec = importlib.util.spec_from_file_location(name.removesuffix(".py").replace("-", "_"), ROOT / "lessons" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def holds(module, output: str) -> dict[str, bool]:
    return {c.key: c.holds for c in module.claims(output)}


def replace_once(output: str, old: str, new: str) -> str:
    assert old in output, f"{old!r} not in the output"
    return output.replace(old, new, 1)


# ---------------------------------------------------------------------------------------------------- lesson 05

PROMPT_05 = "Once upon a time, in a small village by the sea, there lived a"


def reference_distributions(model, prompt: str) -> dict[str, np.ndarray]:
    """The next-token distribution of each setting, float64, written out from the definitions (not sampling.py)."""
    ids = model.tokenizer.encode(prompt)
    logits = np.asarray(model.forward(np.asarray([ids]), np.arange(len(ids))[None], last_only=True)[0], np.float64)

    def softmax(x):
        e = np.exp(x - x.max())
        return e / e.sum()

    def keep_only(p, keep):
        q = np.where(keep, p, 0.0)
        return q / q.sum()

    p1 = softmax(logits)
    ordered = np.sort(p1)[::-1]
    n_top_p = int(np.searchsorted(np.cumsum(ordered), 0.9) + 1)     # smallest prefix whose mass reaches 0.9
    point_mass = np.zeros_like(p1)
    point_mass[np.argmax(logits)] = 1.0
    return {"greedy": point_mass,
            "temperature=0.5": softmax(logits / 0.5), "temperature=1.0": p1, "temperature=1.5": softmax(logits / 1.5),
            "top_k=20": keep_only(p1, p1 >= ordered[19]), "top_p=0.9": keep_only(p1, p1 >= ordered[n_top_p - 1]),
            "min_p=0.1": keep_only(p1, p1 >= 0.1 * p1.max())}


@pytest.fixture(scope="module")
def out05(real_model_path):
    return run_lesson("05_sampling.py", real_model_path, "--tokens", "6", "--repeats", "5", "--json-tokens", "24")


def test_lesson_05_sampling(real_model, out05):
    out = out05
    reference = reference_distributions(real_model, PROMPT_05)
    for name, p in reference.items():
        cells = row(out, name)
        candidates, entropy = int(cells[1].replace(",", "")), float(cells[2])
        q = p[p > 0]
        assert candidates == len(q), (name, cells)
        assert entropy == pytest.approx(float(-(q * np.log2(q)).sum()), abs=2e-3), (name, cells)
        best = real_model.tokenizer.decode([int(np.argmax(p))])
        assert cells[3].startswith(f"{best!r} {p.max():.1%}"), (name, cells)
    assert row(out, "greedy")[1:3] == ["1", "0.000"]
    ent = [float(row(out, f"temperature={t}")[2]) for t in ("0.5", "1.0", "1.5")]
    assert ent[0] < ent[1] < ent[2]                       # temperature orders the entropy, removes no token

    a, b, c = (row(out, r)[2] for r in ("a", "b", "c"))
    assert a == b != c and len(a.split()) == 6
    assert "seed 42 twice identical = True; seed 43 differs = True" in out

    step, slowest, share, greedy = numbers(out, rf"decode step {NUMBER} ms; slowest sampler \(\S+\) {NUMBER} ms = "
                                                rf"{NUMBER}% of a step; greedy {NUMBER} ms")
    assert share == pytest.approx(100 * slowest / step, abs=0.1 + 0.01 * share)
    assert greedy <= slowest
    cost = table_with(out, "min ms")                      # section 3: the step and every sampler, timed in turns
    mins = dict(zip(cost.column("what runs"), cost.numbers("min ms")))
    assert list(mins) == ["decode step"] + list(reference)
    assert step == pytest.approx(mins.pop("decode step"), abs=0.006)
    assert slowest == max(mins.values()) and greedy == mins["greedy"]
    for name, low, median, spread in zip(cost.column("what runs"), cost.numbers("min ms"), cost.numbers("median"),
                                         cost.numbers("spread")):
        assert timing_cells_agree(low, median, spread, decimals=3), name
    flat = " ".join(out.split())
    assert "top_k=20 keeps 20 tokens" in flat and f"top_p=0.9 keeps {row(out, 'top_p=0.9')[1]} " in flat


def test_lesson_05_claims_follow_its_numbers(out05):
    lesson = lesson_module("05_sampling.py")
    found = holds(lesson, out05)
    assert set(found) == {"temperature-entropy", "filters-cut", "seed-repeats", "seed-differs", "sampler-small",
                          "constrained-valid", "free-fails", "mask-steers", "mask-small"}
    assert found["temperature-entropy"] and found["filters-cut"] and found["seed-repeats"]   # not about time
    assert found["constrained-valid"] and found["free-fails"] and found["mask-steers"]
    assert printed_verdicts(out05).keys() == found.keys()
    hot = row(out05, "temperature=1.5")[2]
    assert not holds(lesson, set_cells(out05, "temperature=1.5", {2: "0.100"}))["temperature-entropy"], hot
    assert not holds(lesson, replace_once(out05, "twice identical = True", "twice identical = False"))["seed-repeats"]
    # The timing claim: a quiet run's shape first (every sampler 0.5 ms against a 25 ms step), then one sampler slow.
    quiet = out05
    for name in ["decode step", "greedy", "temperature=0.5", "temperature=1.0", "temperature=1.5", "top_k=20",
                 "top_p=0.9", "min_p=0.1"]:
        t = "25.000" if name == "decode step" else "0.500"
        quiet = set_cells(quiet, name, {1: t, 2: t, 3: "0.010"}, after="min ms")
    assert holds(lesson, quiet)["sampler-small"]
    assert not holds(lesson, set_cells(quiet, "top_p=0.9", {2: "3.000"}, after="min ms"))["sampler-small"]


def constrained_steps(out: str) -> list[list[str]]:
    """Section 5's table: one row of cells per step of the constrained reply."""
    return [row(out, str(step)) for step in range(len(table_with(out, "argmax allowed").rows))]


def test_lesson_05_structured_output(real_model, out05):
    """Sections 4-6 against references computed here: jsonschema for the schema, json.loads for the free reply, and
    one uncached forward pass over the prompt and the constrained reply for every step's unmasked distribution."""
    import json

    import jsonschema

    from minitransformer import SamplingParams, generate
    from minitransformer.structured import StructuredOutputsParams

    schema, prompt = lesson_module("05_sampling.py").SCHEMA, lesson_module("05_sampling.py").JSON_PROMPT
    tok = real_model.tokenizer
    texts = dict(re.findall(r"^(free|constrained): ('.*')$", out05, re.M))
    free_text, held_text = eval(texts["free"]), eval(texts["constrained"])        # the lines are Python reprs
    free = generate(real_model, prompt, SamplingParams(max_tokens=24, temperature=0.0), chat=True)
    assert free_text == free.text and row(out05, "free")[1:3] == ["24", "length (None)"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(free_text)
    jsonschema.validate(json.loads(held_text), schema)
    assert row(out05, "constrained")[2:5] == ["stop ('structured')", "parses", "yes"]
    assert "check json: free parses = False; constrained parses = True, matches the schema = True, " \
           "stop_reason = 'structured'" in out05

    steps = constrained_steps(out05)
    held = generate(real_model, prompt, SamplingParams(max_tokens=24, temperature=0.0,
                                                       structured=StructuredOutputsParams(json=schema)),
                    chat=True)                                       # greedy: the lesson's reply, with its token ids
    assert held.text == held_text and len(steps) == len(held.token_ids) == int(row(out05, "constrained")[1])
    ids = held.prompt_token_ids + held.token_ids
    # every step's raw distribution, from one pass over prompt + reply (no cache, no mask)
    logits = real_model.forward(np.asarray([ids]), np.arange(len(ids))[None])[0]                   # (T, V)
    logits = np.asarray(logits, np.float64)[len(held.prompt_token_ids) - 1:-1]   # (reply, V): row i -> token i
    for i, (cells, token) in enumerate(zip(steps, held.token_ids)):
        assert eval(cells[2]) == tok.decode([token]), (i, cells)
        p = np.exp(logits[i] - logits[i].max())
        p /= p.sum()
        second, best = np.sort(p)[-2:]
        if best - second > 1e-3:                                     # no near-tie: the favourite is the argmax
            assert eval(cells[4]) == tok.decode([int(np.argmax(p))]), (i, cells)
        assert float(cells[5].rstrip("%")) == pytest.approx(100 * best, abs=0.05), (i, cells)
        assert float(cells[3].rstrip("%")) == pytest.approx(100 * p[token], abs=0.05), (i, cells)
    assert eval(steps[0][4]) == tok.decode(free.token_ids[:1])       # step 0's favourite is the free reply's start
    for cells in steps:
        assert 1 <= int(cells[1].replace(",", "")) <= tok.vocab_size
        kept = cells[7] == "yes"
        assert kept == (cells[2] == cells[4])                         # kept: greedy's choice is the favourite
        assert cells[6] in ("yes", "no") and (cells[6] == "yes") == kept   # greedy keeps an allowed favourite
        assert float(cells[3].rstrip("%")) <= float(cells[5].rstrip("%"))
    assert any(cells[7] == "no" for cells in steps)
    assert [int(cells[1].replace(",", "")) for cells in steps] == held.structured["allowed_tokens"]

    cost = table_with(out05, "what runs per token")
    assert cost.column("what runs per token") == ["decode step", "json mask"]
    low = dict(zip(cost.column("what runs"), cost.numbers("min ms")))
    for name, fastest, median, spread in zip(cost.column("what runs"), cost.numbers("min ms"),
                                             cost.numbers("median"), cost.numbers("spread")):
        assert timing_cells_agree(fastest, median, spread, decimals=3), name
    share = dict(zip(cost.column("what runs"), cost.numbers("min / decode")))
    assert share["decode step"] == 100.0
    assert share["json mask"] == pytest.approx(100 * low["json mask"] / low["decode step"], abs=0.06)
    assert f"one walk through the constrained reply's {len(steps)} tokens" in " ".join(out05.split())


def test_lesson_05_structured_claims_follow_its_numbers(out05):
    lesson = lesson_module("05_sampling.py")
    assert not holds(lesson, replace_once(out05, "matches the schema = True", "matches the schema = False"))[
        "constrained-valid"]
    assert not holds(lesson, replace_once(out05, "free parses = False", "free parses = True"))["free-fails"]
    first = constrained_steps(out05)[0]
    flipped = set_cells(out05, "0", {6: "yes" if first[6] == "no" else "no"}, after="argmax allowed")
    assert not holds(lesson, flipped)["mask-steers"]                  # a change where the favourite was allowed
    every_kept = out05
    for cells in constrained_steps(out05):
        every_kept = set_cells(every_kept, cells[0], {6: "yes", 7: "yes"}, after="argmax allowed")
    assert not holds(lesson, every_kept)["mask-steers"]               # the mask changed nothing: nothing to show
    # The timing claim: a quiet run's shape (a 0.2 ms mask against a 25 ms step), then a mask as slow as a step
    quiet = set_cells(out05, "decode step", {1: "25.000", 2: "25.000", 3: "0.010"}, after="what runs per token")
    quiet = set_cells(quiet, "json mask", {1: "0.200", 2: "0.200", 3: "0.010"}, after="what runs per token")
    assert holds(lesson, quiet)["mask-small"]
    assert not holds(lesson, set_cells(quiet, "json mask", {3: "5.000"}, after="what runs per token"))["mask-small"]


# ---------------------------------------------------------------------------------------------------- lesson 06

def complete_text(data: bytes) -> str:
    """The characters whose bytes have all arrived (a strict decode of the longest decodable prefix)."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError(f"not UTF-8: {data!r}")


@pytest.fixture(scope="module")
def out06(real_model_path):
    return run_lesson("06_stopping_and_streaming.py", real_model_path, "--cancel-after", "3", "--emoji-tokens", "6")


def test_lesson_06_stopping_and_streaming(real_model_path, out06):
    from minitransformer import load_tokenizer
    tok = load_tokenizer(real_model_path)
    out = out06
    eos, length, stop = row(out, "EOS"), row(out, "max_tokens"), row(out, "stop string")
    assert eos[2:4] == ["stop", "'eos'"] and f"check eos: last id {tok.eos_id} == eos_id" in out
    assert length[2:5] == ["length", "None", "5"]
    assert stop[2:4] == ["stop", "'math problem'"]
    eos_text, length_text, stop_text = (eval(r[5]) for r in (eos, length, stop))   # the cells are Python reprs
    assert eos_text.startswith(length_text)                            # greedy: the capped reply is a prefix
    assert "math problem" in eos_text and stop_text == eos_text[:eos_text.index("math problem")]
    assert int(stop[4]) < int(eos[4])

    spans = re.findall(r"#(\d+) (\d+) '", out.split("check stop:")[1].split("\n─")[0])
    ids = [int(t) for _, t in spans]
    assert len(ids) >= 2 and "math problem" in tok.decode(ids)        # one token alone never holds it
    assert all("math problem" not in tok.decode([t]) for t in ids)
    assert f"tokenized alone = {tok.encode('math problem')}" in out and f"tokens {ids}" in out
    assert "Matching ids would miss it" in out
    assert f"EOS id {tok.eos_id} adds 0 characters" in out

    received, shown = b"", ""
    for i in range(6):
        cells = row(out, str(i))
        token = int(cells[1])
        assert cells[2] == tok.token_bytes(token).hex(" ")
        received += tok.token_bytes(token)
        delta = complete_text(received)[len(shown):]
        assert eval(cells[4]) == delta, (i, cells)
        assert int(cells[3]) == len(received) - len(complete_text(received).encode())
        shown += delta
    assert any(eval(row(out, str(i))[4]) == "" for i in range(6))     # the emoji really arrived in pieces
    assert "deltas joined == final text: True; U+FFFD in the stream: False" in out

    tokens, = numbers(out, r"finish_reason 'abort', stop_reason 'cancelled', (\d+) of 64 tokens")
    assert tokens == 3 + 1               # cancel is seen before the step after the third delta's token
    reserved, after, prompt = numbers(out, rf"reserved while streaming {NUMBER} bytes; after the abort {NUMBER} "
                                            rf"bytes; usage \{{'prompt_tokens': (\d+)")
    # K and V, float32, SmolLM2-135M's 30 layers x 3 KV heads x head_dim 64 (README.md, "The default model"), for
    # prompt + 64
    assert reserved == 2 * 4 * 30 * 3 * 64 * (prompt + 64) and after == 0


def test_lesson_06_claims_follow_its_text(out06):
    lesson = lesson_module("06_stopping_and_streaming.py")
    found = holds(lesson, out06)
    assert found == {key: True for key in ("eos-ends", "length-caps", "stop-string-cuts", "ids-differ", "eos-no-text",
                                           "utf8-held", "cancel-aborts")}
    assert printed_verdicts(out06) == found                       # nothing timed: shown whatever the machine did
    answer = " ".join(out06.split("Interview question")[1].split())
    assert "so only a search of the detokenized text finds it" in answer and "could not show" not in answer
    held = re.search(r"check utf8: (\d+) of", out06).group(1)
    edited = replace_once(out06, f"check utf8: {held} of", "check utf8: 0 of")
    assert not holds(lesson, edited)["utf8-held"]
    reserved = re.search(r"after the abort ([\d,]+) bytes", out06).group(0)
    assert not holds(lesson, replace_once(out06, reserved, "after the abort 4,096 bytes"))["cancel-aborts"]
    ids = re.search(r"inside the reply its characters are tokens (\[[\d, ]*\])", out06).group(1)
    alone = re.search(r"tokenized alone = (\[[\d, ]*\])", out06).group(1)
    assert not holds(lesson, replace_once(out06, f"tokenized alone = {alone}", f"tokenized alone = {ids}"))[
        "ids-differ"]


# ---------------------------------------------------------------------------------------------------- lesson 07

@pytest.fixture(scope="module")
def out07(real_model_path):
    return run_lesson("07_latency_metrics_and_levers.py", real_model_path, "--tokens", "5", "--lengths", "16,96",
                      "--outputs", "2,6", "--repeats", "2")


def test_lesson_07_latency_metrics_and_levers(real_model_path, out07):
    from gguf import GGUFReader

    from minitransformer import load_tokenizer
    from minitransformer.core.config import ModelConfig

    tok = load_tokenizer(real_model_path)
    out = out07
    ms = lambda cell: float(cell) / 1e3
    prompts = ["What is 2+2?", "Name three colors of the rainbow.", "Write one sentence about the sea."]
    previous_total = 0.0
    for i, prompt in enumerate(prompts):
        cells = row(out, f"r{i}")
        rendered = tok.render_chat([{"role": "user", "content": prompt}])
        assert int(cells[1]) == len(tok.encode(rendered, special=True))
        queue, prefill, ttft, p50, p90, rate, total = (float(c) for c in cells[2:9])
        assert ttft == pytest.approx(queue + prefill, abs=0.15)           # TTFT = queue + prefill (0.1 ms rounding)
        assert queue >= previous_total - 0.1                              # FIFO: r_i waits for r_(i-1) to finish
        assert rate == pytest.approx(4 / ms(total - ttft), rel=0.01, abs=0.06)   # (n - 1) / (total - TTFT)
        assert p50 <= p90 and total > ttft
        previous_total = total

    modes = table_with(out, "first text min")
    streamed, blocking = row(out, "streamed"), row(out, "not streamed")
    assert blocking[1:4] == blocking[4:7]                                 # nothing visible before the end
    for cells in (streamed, blocking):
        low, median, spread = (float(c) for c in cells[4:7])
        assert timing_cells_agree(low, median, spread, decimals=1)
    first, last, ratio, total_s, total_b, work = numbers(
        out, rf"first text {NUMBER} ms streamed vs {NUMBER} ms not streamed \(mins, {NUMBER}x\); totals {NUMBER} vs "
             rf"{NUMBER} ms \({NUMBER}x")
    assert [first, last, total_s, total_b] == [float(streamed[1]), float(blocking[1]), float(streamed[4]),
                                               float(blocking[4])]
    assert ratio == pytest.approx(first / last, abs=0.006) and work == pytest.approx(total_s / total_b, abs=0.006)
    assert modes.column("mode") == ["streamed", "not streamed"]

    totals = [float(row(out, str(n))[1]) for n in (2, 6)]                 # mins
    per_token, = numbers(out, rf"each extra output token added {NUMBER} ms")
    assert per_token == pytest.approx((totals[1] - totals[0]) / 4, abs=0.1)
    ttfts = [float(row(out, str(n))[1]) for n in (16, 96)]
    growth, = numbers(out, rf"96 prompt tokens took {NUMBER}x the TTFT of 16")
    assert growth == pytest.approx(ttfts[1] / ttfts[0], rel=0.03, abs=0.06)

    # Bytes per token: float32 parameters counted from the config (tied embeddings), and the file's size on disk.
    c = ModelConfig.from_gguf(GGUFReader(str(real_model_path)))
    layer = c.d_model * (c.q_dim + 2 * c.kv_dim) + c.q_dim * c.d_model + 3 * c.d_model * c.ffn_dim + 2 * c.d_model
    params = c.vocab_size * c.d_model + c.n_layers * layer + c.d_model
    fp32, stored = row(out, "ours, float32 in memory"), row(out, "ours as stored (Q4_1 file)")
    assert float(fp32[1].split()[0]) == pytest.approx(4 * params / 1e9, abs=5e-4)
    assert float(stored[1].split()[0]) == pytest.approx(real_model_path.stat().st_size / 1e9, abs=5e-4)
    bandwidth, = numbers(out, rf"read bandwidth \(measured now\): {NUMBER} GB/s")
    for name, size in (("1B float16", 2e9), ("7B float16", 14e9)):
        cells = row(out, name)
        gb_per_s = rounds_from(bandwidth, 1)                                        # printed to 0.1 GB/s
        assert quotient_agrees(float(cells[2]), 1, (size / 1e6, size / 1e6), gb_per_s)    # floor ms = bytes / bw
        assert quotient_agrees(float(cells[3]), 1, gb_per_s, (size / 1e9, size / 1e9))    # ceiling tok/s = bw / bytes
        assert float(cells[5]) == pytest.approx(size / 4.8e12 * 1e3, abs=6e-4)          # H200's datasheet 4.8 TB/s
    assert float(fp32[4]) == pytest.approx(float(row(out, "6")[5]), abs=0.05)             # measured = fastest TPOT
    decode, floor = numbers(out, rf"bound decode-step: measured {NUMBER} ms, floor {NUMBER} ms")
    assert printed_alike(decode, 2, float(fp32[4]), 1) and printed_alike(floor, 2, float(fp32[2]), 1)
    gap, gap_floor = numbers(out, rf"bound fastest-gap: measured {NUMBER} ms, floor {NUMBER} ms")
    fastest_gaps = table_with(out, "prompt tokens").numbers("ITL min")            # section 3's context table
    assert gap_floor == floor and printed_alike(gap, 2, min(fastest_gaps), 1)

    prefill_row, decode_row = row(out, "prefill"), row(out, "decode")
    ridge, = numbers(out, rf"roofline bound \(ridge {NUMBER} FLOP/byte\)")
    for cells in (prefill_row, decode_row):                               # the label follows the numbers printed
        intensity = float(re.search(NUMBER + " FLOP/byte", cells[2]).group(1))
        if intensity != ridge:                                            # equal when printed: either label
            assert cells[2].startswith("compute" if intensity > ridge else "memory"), cells
    # forward_cost's intensity, by hand: decode multiplies each float32 weight (4 bytes) once: 2 FLOPs -> ~0.5
    assert float(re.search(NUMBER + " FLOP/byte", decode_row[2]).group(1)) == pytest.approx(0.5, abs=0.05)

    # T4 states a saving only where the run showed one; otherwise it says it could not.
    shown = printed_verdicts(out)
    flat = " ".join(out.split())
    if shown["ttft-grows-with-prompt"]:
        saved, = numbers(flat, rf"96 -> 16 tokens saves {NUMBER} ms of TTFT")
        assert saved == pytest.approx(ttfts[1] - ttfts[0], abs=0.11)
    else:
        assert "this run could not show a saving" in row(out, "prompt trimming")[1]
    sooner = f"first text at {streamed[1]} ms instead of {blocking[1]} ms"
    assert (sooner in flat) == shown["stream-first-sooner"]


def quiet_07(out: str) -> str:
    """The lesson's output edited into a quiet run's shape: every timing that a claim compares well apart."""
    out = set_cells(out, "streamed", {1: "100.0", 2: "101.0", 3: "2.0", 4: "450.0", 5: "452.0", 6: "3.0"})
    out = set_cells(out, "not streamed", {i: v for i, v in enumerate(["448.0", "450.0", "3.0"] * 2, start=1)})
    out = set_cells(out, "2", {1: "130.0", 2: "131.0", 3: "2.0"}, after="output tokens")
    out = set_cells(out, "6", {1: "230.0", 2: "231.0", 3: "2.0"}, after="output tokens")
    for label, ttft, itl in (("16", "60.0", "24.0"), ("96", "200.0", "25.0")):
        out = set_cells(out, label, {1: ttft, 2: ttft, 3: "1.0", 4: itl, 5: itl, 6: "1.0"}, after="prompt tokens")
    return out


def test_lesson_07_claims_follow_its_numbers(out07):
    lesson = lesson_module("07_latency_metrics_and_levers.py")
    found = holds(lesson, out07)                          # every number it needs is read, whatever the machine did
    assert set(found) == {"queue-in-ttft", "stream-first-sooner", "stream-same-total", "e2e-grows-with-output",
                          "ttft-grows-with-prompt", "itl-flat", "above-floor", "roofline"}
    assert printed_verdicts(out07).keys() == found.keys()
    quiet = holds(lesson, quiet_07(out07))
    for key in ("stream-first-sooner", "stream-same-total", "e2e-grows-with-output", "ttft-grows-with-prompt",
                "itl-flat"):
        assert quiet[key], key
    edits = {"ttft-grows-with-prompt": ("96", {1: "60.5"}, "prompt tokens"),       # inside 16 tokens' range
             "itl-flat": ("96", {4: "40.0"}, "prompt tokens"),                     # +67%: not flat
             "e2e-grows-with-output": ("6", {1: "131.0"}, "output tokens"),
             "stream-first-sooner": ("streamed", {1: "447.0"}, "first text min"),
             "stream-same-total": ("streamed", {4: "600.0"}, "first text min")}
    for key, (label, cells, after) in edits.items():
        assert not holds(lesson, set_cells(quiet_07(out07), label, cells, after=after))[key], key
    bound = re.search(r"bound fastest-gap: measured ([\d.]+) ms, floor ([\d.]+) ms", " ".join(out07.split()))
    below = replace_once(out07, f"bound fastest-gap: measured {bound.group(1)} ms",
                         f"bound fastest-gap: measured {float(bound.group(2)) / 2:.2f} ms")
    assert not holds(lesson, below)["above-floor"]
