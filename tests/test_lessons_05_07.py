"""Lessons 05-07 run as a learner runs them (a subprocess on the real model) and their printed numbers hold together.

References are computed here, independently of the lessons' code: the next-token distribution from a plain
forward pass and float64 softmax / filters written out in a few lines, UTF-8 bytes from the tokenizer, metric
identities (TTFT = queue + prefill, ...) from the printed columns themselves. Timings are never compared across
runs, only within one line of one run where the margin is huge.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

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


def test_lesson_05_sampling(real_model, real_model_path):
    out = run_lesson("05_sampling.py", real_model_path, "--tokens", "6", "--repeats", "5")
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
    costs = {name: float(row(out, name)[4]) for name in reference}
    assert slowest == max(costs.values())
    flat = " ".join(out.split())
    assert "top_k=20 keeps 20 tokens" in flat and f"top_p=0.9 keeps {row(out, 'top_p=0.9')[1]} " in flat


# ---------------------------------------------------------------------------------------------------- lesson 06

def complete_text(data: bytes) -> str:
    """The characters whose bytes have all arrived (a strict decode of the longest decodable prefix)."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    raise AssertionError(f"not UTF-8: {data!r}")


def test_lesson_06_stopping_and_streaming(real_model_path):
    from minitransformer import load_tokenizer
    tok = load_tokenizer(real_model_path)
    out = run_lesson("06_stopping_and_streaming.py", real_model_path, "--cancel-after", "3", "--emoji-tokens", "6")
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


# ---------------------------------------------------------------------------------------------------- lesson 07

def test_lesson_07_latency_metrics_and_levers(real_model_path):
    from minitransformer import load_tokenizer
    from minitransformer.config import ModelConfig
    from gguf import GGUFReader

    tok = load_tokenizer(real_model_path)
    out = run_lesson("07_latency_metrics_and_levers.py", real_model_path, "--tokens", "5", "--lengths", "16,96",
                     "--outputs", "2,6")
    ms = lambda cell: float(cell) / 1e3                                   # noqa: E731  printed ms -> seconds
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

    streamed, blocking = row(out, "streamed"), row(out, "not streamed")
    assert blocking[1] == blocking[2]                                     # nothing visible before the end
    sooner, work = numbers(out, rf"first text {NUMBER}x sooner; total time {NUMBER}x")
    assert sooner == pytest.approx(float(blocking[1]) / float(streamed[1]), rel=0.01, abs=0.051)   # printed .1f
    assert work == pytest.approx(float(streamed[2]) / float(blocking[2]), rel=0.02, abs=0.01)

    totals = [float(row(out, str(n))[1]) for n in (2, 6)]
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
    bandwidth, = numbers(out, rf"copy bandwidth measured now: {NUMBER} GB/s")
    for name, size in (("1B float16", 2e9), ("7B float16", 14e9)):
        cells = row(out, name)
        assert float(cells[2]) == pytest.approx(size / (bandwidth * 1e9) * 1e3, rel=0.01)   # floor = bytes / bw
        assert float(cells[3]) == pytest.approx(bandwidth * 1e9 / size, rel=0.01, abs=0.06)
        assert float(cells[5]) == pytest.approx(size / 4.8e12 * 1e3, abs=6e-4)          # H200's datasheet 4.8 TB/s
    assert float(fp32[4]) == pytest.approx(float(row(out, "6")[3]), abs=0.05)             # measured = TPOT above

    prefill_row, decode_row = row(out, "prefill"), row(out, "decode")
    ridge, = numbers(out, rf"bottleneck \(ridge {NUMBER} FLOP/byte\)")
    for cells in (prefill_row, decode_row):                               # the label follows the numbers printed
        intensity = float(re.search(NUMBER + " FLOP/byte", cells[2]).group(1))
        if intensity != ridge:                                            # equal when printed: either label
            assert cells[2].startswith("compute" if intensity > ridge else "memory"), cells
    # forward_cost's intensity, by hand: decode multiplies each float32 weight (4 bytes) once: 2 FLOPs -> ~0.5
    assert float(re.search(NUMBER + " FLOP/byte", decode_row[2]).group(1)) == pytest.approx(0.5, abs=0.05)
    flat = " ".join(out.split())
    assert f"96 -> 16 tokens saves {ttfts[1] - ttfts[0]:.1f} ms of TTFT" in flat or \
        f"96 -> 16 tokens saves {ttfts[1] - ttfts[0] + 0.1:.1f}" in flat or \
        f"96 -> 16 tokens saves {ttfts[1] - ttfts[0] - 0.1:.1f}" in flat
    assert f"first text at {streamed[1]} ms instead of {blocking[1]} ms" in flat
