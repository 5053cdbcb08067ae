"""Lesson 16 runs as a learner runs it (a subprocess on the real model, small settings: it starts three servers, one
of them `serve --disaggregated` over MPI, then `serve --replicas 2` behind smg per router policy, and stops them
all) and its numbers hold together: every request answered, the bytes sent per prompt token equal to the model's
KV shape, the H200 table equal to the link formula worked by hand, cache-aware routing finding more prompt tokens
cached than round robin, claims decided from the printed numbers (and flipped by an edited one), the answer stating
only what they showed, and no process left behind.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest

from lesson_runs import small_run
from minitransformer.bench.router_workload import AUTO_LOAD, rate_for_this_machine
from minitransformer.lab.claims import NUMBER, printed_verdicts, table_with
from minitransformer.lab.measure import Quietness
from printed_output import edit_cell
from test_lessons_08_10 import ROOT, load_lesson
from test_transcripts import SMALL

L16 = "16_disaggregated_serving.py"
UNTIMED = {"no-request-lost", "kv-bytes", "nvlink-cheap", "rdma-costs-more", "cache-aware-hits"}

needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                               reason="mpi4py is not installed: pip install '.[parallel]' (the dev extra has it)")


@pytest.fixture(scope="module")
def lesson_16(real_model_path):
    """The lesson at test_transcripts' small settings (that test compares the same run with the transcript)."""
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed: pip install '.[parallel]' (the dev extra has it)")
    run = small_run(ROOT / "lessons" / L16, tuple(SMALL["16"]), str(real_model_path), figure=True)
    assert run.code == 0, run.stderr[-3000:]
    return run


def flat(output: str) -> str:
    return " ".join(output.split())


def decided(output: str) -> dict:
    return {c.key: c for c in load_lesson(L16).claims(output)}


@needs_mpi
def test_every_request_is_answered_and_the_bytes_are_the_kv_shape(lesson_16):
    output = lesson_16.output
    routed = table_with(output, "hit rate")
    assert [row[0] for row in routed.rows] == ["round_robin", "cache_aware"] and routed.column("failed") == ["0", "0"]
    itl = table_with(output, "chat ITL p99")
    assert [row[0] for row in itl.rows] == ["no chunking", "chunked", "disaggregated"]
    assert itl.column("failed") == ["0", "0", "0"]
    assert "check bytes: 46,080 bytes per prompt token sent; the model's shape gives 46,080" in flat(output)
    assert "(6 transfers," in flat(output)                  # 2 rounds x (2 chats + 1 long prompt), each sent once
    assert lesson_16.figure.stat().st_size > 10_000


@needs_mpi
def test_the_h200_table_is_the_link_formula_worked_by_hand(lesson_16):
    """Llama 3.1 8B in bf16: 32 layers x 2 x 8 KV heads x 128 x 2 bytes = 131,072 a token; 4,096 tokens over
    6.6 us + bytes / bandwidth, next to 2 x params x tokens FLOPs at 989 TFLOP/s (the prefill's roofline)."""
    output = lesson_16.output
    table = table_with(output, "link")
    rows = {row[0]: dict(zip(table.columns, row)) for row in table.rows}
    nbytes = 131_072 * 4096
    for name, bandwidth in (("NVLink 4 (H100/H200 SXM)", 450e9), ("InfiniBand NDR 400 Gb/s (RDMA)", 50e9)):
        assert float(rows[name]["transfer ms"]) == pytest.approx((6.6e-6 + nbytes / bandwidth) * 1e3, abs=6e-3)
    assert "131,072 bytes of KV per token, 512 MiB" in flat(output)


@needs_mpi
def test_claims_and_the_answer_follow_the_printed_numbers(lesson_16):
    output = lesson_16.output
    found = decided(output)
    for key in UNTIMED:                                       # counts and arithmetic: whatever the machine's load
        assert found[key].holds and not found[key].timed, found[key]
    quiet, verdicts = Quietness.parse(output), printed_verdicts(output)
    assert set(verdicts) == set(found)
    for key, claim in found.items():
        assert verdicts[key] == (claim.holds and (not claim.timed or quiet.quiet)), key
    answer = flat(output[output.index("Interview question"):])
    assert ("it lowered the chats' ITL p99 here" in answer) == verdicts["chunking-cuts-itl"]
    assert ("it lowered the ITL p99 too" in answer) == verdicts["disaggregation-cuts-itl"]
    assert ("exactly layers x 2 x KV heads" in answer) == verdicts["kv-bytes"]
    assert ("found more of the prompts cached than round robin" in answer) == verdicts["cache-aware-hits"]


@needs_mpi
def test_the_auto_tenant_rate_is_a_light_load_from_the_timed_uncached_request(lesson_16):
    """--tenant-rate auto (the small run's too): the printed uncached TTFT gives the rate the tenants were sent at,
    AUTO_LOAD of 1 / it to two digits, and table 4's title names that rate."""
    output = flat(lesson_16.output)
    seconds, per_second, rate, load = (float(x) for x in re.search(
        rf"took ({NUMBER}) s to its first token, alone on fresh replicas .*? prefills about ({NUMBER}) of them a "
        rf"second, and the tenants send ({NUMBER})/s, ({NUMBER}) of that", output).groups())
    # The lesson prints the seconds to 2 decimals but computes from the unrounded value: the printed numbers must
    # come from some time the printed seconds round from, [seconds - 0.005, seconds + 0.005] (both fall as it grows).
    slowest, fastest = seconds + 0.005, seconds - 0.005
    assert fastest > 0 and 1 / slowest - 0.005 <= per_second <= 1 / fastest + 0.005
    assert load == AUTO_LOAD and rate_for_this_machine(slowest) <= rate <= rate_for_this_machine(fastest)
    assert f"own + a question, {rate:g}/s," in output


def test_the_rate_is_the_load_over_the_uncached_seconds_to_two_digits():
    assert rate_for_this_machine(2.0) == 0.15 and rate_for_this_machine(0.6) == 0.5
    assert rate_for_this_machine(0.123, load=1.0) == 8.1


@pytest.mark.parametrize("flags, message", [(["--tenant-rate", "fast"], "--tenant-rate must be 'auto' or a number"),
                                            (["--tenant-rate", "0"], "--tenant-rate must be > 0")])
def test_a_bad_tenant_rate_is_one_line_and_exit_2(real_model_path, flags, message):
    test_bad_flags_are_one_line_and_exit_2(real_model_path, flags, message)


@needs_mpi
def test_an_edited_number_flips_its_claim(lesson_16):
    output = lesson_16.output
    lost = edit_cell(output, "failed", ("chunked",), "1")
    assert not decided(lost)["no-request-lost"].holds
    wrong = output.replace("46,080 bytes per prompt token sent", "46,081 bytes per prompt token sent")
    assert not decided(wrong)["kv-bytes"].holds
    spiky = edit_cell(output, "chat ITL p99 ms", ("no chunking",), "9000 (9000, 0)")
    smooth = edit_cell(spiky, "chat ITL p99 ms", ("chunked",), "1 (1, 0)")
    assert decided(smooth)["chunking-cuts-itl"].holds
    assert not decided(edit_cell(spiky, "chat ITL p99 ms", ("chunked",), "9999 (9999, 0)"))["chunking-cuts-itl"].holds
    assert not decided(edit_cell(output, "transfer / prefill %", ("NVLink 4 (H100/H200 SXM)",), "50.0"))[
        "nvlink-cheap"].holds
    assert not decided(edit_cell(output, "hit rate %", ("cache_aware",), "0.0 (0.0, 0.0)"))["cache-aware-hits"].holds
    assert not decided(edit_cell(output, "failed", ("round_robin",), "1", table="hit rate %"))["no-request-lost"].holds


@needs_mpi
def test_no_process_outlives_the_lesson(lesson_16):
    """Three servers, two MPI ranks, and twice per policy two replicas and a router were started; none is left."""
    assert lesson_16.leftovers == ()


@pytest.mark.parametrize("flags, message", [(["--rounds", "1"], "--rounds must be at least 2"),
                                            (["--chunk", "4096"], "--chunk must be in [16, 2048)")])
def test_bad_flags_are_one_line_and_exit_2(real_model_path, flags, message):
    result = subprocess.run([sys.executable, str(ROOT / "lessons" / L16), *flags], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "MINITRANSFORMER_MODEL": str(real_model_path)})
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
