"""Lesson 15 runs as a learner runs it (a subprocess on the real model, small settings; it starts its ranks through
generate --tensor-parallel-size and run_ranks) and its numbers hold together: the same token ids at sizes 1 and 3,
each rank's third of the KV cache, two all-reduces of d_model float32 per layer on every rank, the per-layer rows a
thirtieth of the per-token ones, the 8B table equal to the ring formula worked by hand, claims decided from the
printed numbers (and flipped by an edited one), the answer stating only what they showed, and no process left
behind. Without mpi4py the lesson is skipped here, and on its own says in one line how to get it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import subprocess
import sys

import pytest

from lesson_runs import small_run
from minitransformer.lab.claims import printed_verdicts, table_with
from minitransformer.lab.machine import H200
from minitransformer.lab.measure import Quietness
from printed_output import edit_cell
from test_lessons_08_10 import ROOT, load_lesson
from test_tensor_parallel import smollm_config
from test_transcripts import SMALL

L15 = "15_tensor_parallelism.py"
TOKENS = int(SMALL["15"][SMALL["15"].index("--tokens") + 1])
UNTIMED = {"same-tokens", "kv-split", "two-per-layer", "decode-latency", "fast-links", "crossover"}

needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                               reason="mpi4py is not installed: pip install '.[parallel]' (the dev extra has it)")


@pytest.fixture(scope="module")
def lesson_15(real_model_path):
    """The lesson at test_transcripts' small settings (that test compares the same run with the transcript)."""
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed: pip install '.[parallel]' (the dev extra has it)")
    run = small_run(ROOT / "lessons" / L15, tuple(SMALL["15"]), str(real_model_path), figure=True)
    assert run.code == 0, run.stderr[-3000:]
    return run.output, run.figure, run.leftovers


def flat(output: str) -> str:
    return " ".join(output.split())


def decided(output: str) -> dict:
    return {c.key: c for c in load_lesson(L15).claims(output)}


@needs_mpi
def test_the_split_model_gives_the_same_tokens_and_each_rank_a_third_of_the_cache(lesson_15):
    output, figure, _ = lesson_15
    assert f"check tokens: size 3 gave {TOKENS} of {TOKENS} token ids of size 1" in flat(output)
    prompt, = (int(x) for x in re.findall(r"decode steps after the (\d+)-token prompt", flat(output)))
    one = 46_080 * (prompt + TOKENS - 1)          # SmolLM2's 46,080 bytes a token (lesson 03) x the tokens cached
    assert f"check KV: rank 0's cache at size 3 holds {one // 3:,} bytes, size 1's {one:,}" in flat(output)
    assert figure.stat().st_size > 10_000


@needs_mpi
def test_every_rank_runs_two_all_reduces_of_one_hidden_state_per_layer(lesson_15):
    output, _, _ = lesson_15
    ranks = table_with(output, "all-reduces per token")
    rows = {row[0]: dict(zip(ranks.columns, row)) for row in ranks.rows}
    assert set(rows) == {"1 process", "0", "1", "2"}
    for rank in ("0", "1", "2"):
        assert rows[rank]["all-reduces per token"] == "60" and rows[rank]["bytes each"] == "2,304"
    per = table_with(output, "scope")
    layer, token = (dict(zip(per.columns, row)) for row in per.rows)
    assert (layer["all-reduces"], token["all-reduces"]) == ("2", "60")
    assert (layer["bytes"], token["bytes"]) == ("4,608", "138,240")
    for column in ("all-reduce ms", "compute per rank ms", "one process ms"):      # a layer is a 30th of a token
        assert float(token[column]) == pytest.approx(30 * float(layer[column]), abs=0.03)
    alone = table_with(output, "all-reduce of")
    assert [row[1] for row in alone.rows] == ["2,304", "36,864"]                  # 1 row and 16 rows of 576 floats


@needs_mpi
def test_the_8b_table_is_the_ring_formula_worked_by_hand(lesson_15):
    """compute = the H200 roofline / n; 64 all-reduces of tokens x 4096 x 2 bytes, each 6.6 us + 2(n-1) hops +
    2(n-1)/n x bytes / bandwidth, with 0.6 us and 450 GB/s for NVLink, 1.0 us and 64 GB/s for PCIe."""
    output, _, _ = lesson_15
    table = table_with(output, "link")
    rows = {(r[0], r[1], r[2]): dict(zip(table.columns, r)) for r in table.rows}
    llama = dataclasses.replace(smollm_config(), **load_lesson(L15).LLAMA_8B)
    for link, hop, bandwidth in (("NVLink 4", 0.6e-6, 450e9), ("PCIe 5 x16", 1.0e-6, 64e9)):
        for tokens in (1, 1024):
            one = H200.seconds(H200.cost(llama, tokens))
            for n in (1, 2, 4, 8, 16):
                nbytes = tokens * 4096 * 2
                comm = 0 if n == 1 else 64 * (6.6e-6 + 2 * (n - 1) * hop + 2 * (n - 1) / n * nbytes / bandwidth)
                row = rows[link, f"{tokens:,}", str(n)]
                assert float(row["compute ms"]) == pytest.approx(one / n * 1e3, abs=6e-4)
                assert float(row["all-reduce ms"]) == pytest.approx(comm * 1e3, abs=6e-4)
                assert float(row["speedup"]) == pytest.approx(one / (one / n + comm), abs=6e-3)
    assert "check crossover NVLink 4, 1 token: the step is shortest at 8 GPUs" in flat(output)
    assert "check crossover PCIe 5 x16, 1,024 tokens: the step is shortest at 1 GPU " in flat(output)


@needs_mpi
def test_claims_and_the_answer_follow_the_printed_numbers(lesson_15):
    output, _, _ = lesson_15
    found = decided(output)
    assert set(found) == UNTIMED | {"small-is-latency", "no-faster-here", "joins-cost-more", "joins-are-waiting"}
    for key in UNTIMED:                                       # arithmetic and token ids: whatever the machine's load
        assert found[key].holds and not found[key].timed, found[key]
    quiet, verdicts = Quietness.parse(output), printed_verdicts(output)
    for key, claim in found.items():
        assert verdicts[key] == (claim.holds and (not claim.timed or quiet.quiet)), key
    answer = flat(output[output.index("Interview question"):])
    assert ("were slower than one process here" in answer) == verdicts["no-faster-here"]
    assert ("could not show 3 ranks slower" in answer) == (not verdicts["no-faster-here"])
    assert ("Most of those all-reduce milliseconds were waiting" in answer) == verdicts["joins-are-waiting"]
    assert ("costs its latency, not its bytes" in answer) == verdicts["small-is-latency"]
    assert "60 all-reduces of 2,304 bytes each" in answer and "that is why TP needs fast links" in answer


@needs_mpi
def test_an_edited_number_flips_its_claim(lesson_15):
    output, _, _ = lesson_15
    fewer = output.replace(f"size 3 gave {TOKENS} of {TOKENS}", f"size 3 gave {TOKENS - 1} of {TOKENS}")
    assert not decided(fewer)["same-tokens"].holds
    assert not decided(edit_cell(output, "all-reduces per token", ("1",), "59"))["two-per-layer"].holds
    assert not decided(edit_cell(output, "bytes each", ("2",), "4,608"))["two-per-layer"].holds
    slow = edit_cell(output, "us", ("16 rows (a 16-token prefill)",), "99999.0 (99999.0, 0.0)")
    assert not decided(slow)["small-is-latency"].holds
    quick = edit_cell(output, "us", ("16 rows (a 16-token prefill)",), "0.1 (0.1, 0.0)")
    assert decided(quick)["small-is-latency"].holds
    faster = edit_cell(output, "step ms", ("0",), "0.1 (0.1, 0.0)")                 # rank 0 far ahead of one process
    assert not decided(faster)["no-faster-here"].holds
    assert not decided(edit_cell(output, "speedup", ("NVLink 4", "1,024", "8"), "0.50"))["fast-links"].holds


@needs_mpi
def test_no_process_outlives_the_lesson(lesson_15):
    """Every process the run started (the CLI's ranks, the lesson's own ranks) is gone."""
    assert lesson_15[2] == ()


@pytest.mark.parametrize("flags, message", [(["--repeats", "1"], "--repeats must be at least 2"),
                                            (["--size", "2"], "9 query heads, 3 KV heads and FFN 1536")])
def test_bad_flags_are_one_line_and_exit_2(real_model_path, flags, message):
    import os
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / L15), *flags], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "MINITRANSFORMER_MODEL": str(real_model_path)})
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_without_mpi4py_the_lesson_says_how_to_get_it(real_model_path, tmp_path):
    """An mpi4py that fails to import (as when the parallel extra is missing): one line naming the extra, exit 2."""
    import os
    broken = tmp_path / "mpi4py"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise ImportError('no mpi4py here')\n")
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / L15)], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "MINITRANSFORMER_MODEL": str(real_model_path),
                                 "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        "error: tensor parallelism needs mpi4py; install the parallel extra: pip install 'minitransformer[parallel]' "
        "(mpi4py and MPICH)"]
