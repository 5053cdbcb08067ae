"""`minitransformer bench engine`: the bound's arithmetic on synthetic step logs, then the subcommand end to end on
the tiny model against our real server, its printed row read back against its JSON. Times are never asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from minitransformer import cli
from minitransformer.bench import engine_bound as eb
from minitransformer.lab import measure


def test_decode_step_time_is_linear_between_measured_batches_and_flat_outside():
    measured = {1: 0.010, 4: 0.016, 16: 0.040}
    assert eb.decode_step_seconds(4, measured) == 0.016
    assert eb.decode_step_seconds(2, measured) == pytest.approx(0.012)
    assert eb.decode_step_seconds(10, measured) == pytest.approx(0.028)
    assert eb.decode_step_seconds(32, measured) == 0.040 and eb.decode_step_seconds(0, measured) == 0.010


def test_prefill_rate_weights_each_prompt_by_its_own_time():
    # two prompts of 10 tokens (0.1 s each) and one of 100 (0.5 s): 0.7 s over 120 tokens
    assert eb.prefill_seconds_per_token([10, 100, 10], {10: 0.1, 100: 0.5}) == pytest.approx(0.7 / 120)


def test_bound_sums_every_step_of_a_synthetic_log():
    steps = [(300, 0),          # prefill only: 300 tokens
             (200, 4),          # mixed: 200 prefill tokens riding with 4 decodes
             (0, 6), (0, 6),    # decode only at 6: interpolated between 4 and 8
             (0, 2),            # the tail
             (0, 0)]            # an empty step (nothing scheduled) costs nothing
    bound = eb.predict_seconds(steps, s_per_prefill_token=0.001, decode_s={1: 0.01, 2: 0.012, 4: 0.02, 8: 0.03})
    assert bound["prefill_s"] == pytest.approx(0.5)
    assert bound["decode_s"] == pytest.approx(0.02 + 2 * 0.025 + 0.012)
    assert bound["total_s"] == pytest.approx(0.5 + 0.082)
    assert bound["steps"] == {"prefill_only": 1, "decode_only": 3, "mixed": 1}
    assert bound["decode_steps_by_batch"] == {2: 1, 4: 1, 6: 2}


def test_decode_is_measured_at_one_the_powers_of_two_and_the_largest_batch():
    assert eb.decode_batches([0, 16, 16, 12, 3, 1]) == [1, 2, 4, 8, 16]
    assert eb.decode_batches([0, 6, 2]) == [1, 2, 4, 6]
    assert eb.decode_batches([0]) == [] and eb.decode_batches([1]) == [1]


def test_ratios_are_speeds():
    assert eb.ratios(8.0, 10.0, 12.5) == {"engine_over_bound": 0.8, "server_over_engine": 0.8}
    assert eb.ratios(8.0, 10.0, None)["server_over_engine"] is None


def _printed_row(out: str) -> list[str]:
    """The cells of the summary table's one data row (the line between the box's vertical bars)."""
    row = next(line for line in out.splitlines() if line.startswith("│"))
    return [cell.strip() for cell in row.strip("│").split("│")]


def test_bench_engine_end_to_end_prints_what_it_writes(tiny_model_path, our_server, tmp_path, capsys):
    argv = ["bench", "engine", "--model", str(tiny_model_path), "--url", our_server.url,
            "--num-prompts", "6", "--prompt-words", "3,12",    # the tiny model's context is 128 tokens
            "--max-tokens", "5", "--max-num-seqs", "4", "--repeats", "2", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    data = json.loads((tmp_path / "engine.json").read_text())
    cells = eb.table_cells(data)
    assert _printed_row(out) == list(cells.values())
    printed = " ".join(out.split())
    assert data["quietness"]["line"] in printed and data["server_quietness"]["line"] in printed
    assert data["server"]["server_pid"] == our_server.process.pid        # found by its port: its CPU is ours
    # the JSON holds what the row was computed from: the bound re-summed from its steps and rates agrees
    rates = {int(n): t["min_s"] for n, t in data["prefill_s_by_length"].items()}
    decode = {int(b): t["min_s"] for b, t in data["decode_step_s_by_batch"].items()}
    again = eb.predict_seconds([tuple(s) for s in data["steps"]],
                               eb.prefill_seconds_per_token(data["workload"]["prompt_lengths"], rates), decode)
    for key in ("prefill_s", "decode_s", "total_s"):
        assert again[key] == pytest.approx(data["bound"][key])
    assert again["steps"] == data["bound"]["steps"]
    assert {str(b): n for b, n in again["decode_steps_by_batch"].items()} == data["bound"]["decode_steps_by_batch"]
    assert data["ratios"]["engine_over_bound"] == pytest.approx(data["bound"]["total_s"] / data["engine"]["min_s"])
    assert data["ratios"]["server_over_engine"] == pytest.approx(data["engine"]["min_s"] / data["server"]["wall_s"])
    # the server runs as often as the engine (2 runs of 6 requests, 5 tokens each), and its fastest run is kept
    assert data["server"]["completed"] == 12 and data["server"]["output_tokens"] == 60
    assert len(data["server"]["samples_s"]) == 2 and data["server"]["wall_s"] == min(data["server"]["samples_s"])
    # every step of the engine's run is in the log: all prompt tokens prefilled once, 5 tokens per request
    assert sum(p for p, _ in data["steps"]) == data["workload"]["prompt_tokens"] == sum(
        data["workload"]["prompt_lengths"])
    assert sum(d for _, d in data["steps"]) == 6 * (5 - 1)      # each request's first token comes with its prefill
    assert len(data["engine"]["samples_s"]) == 2 and max(decode) == 4


def test_a_server_elsewhere_has_no_local_process():
    assert eb.listening_pid("http://example.com:8000") is None
    assert measure.process_cpu_seconds(os.getpid()) > 0


@pytest.mark.parametrize("argv", [["--max-tokens", "1"], ["--repeats", "0"], ["--prompt-words", "3,x"]])
def test_bad_flags_are_one_line_exit_2(tiny_model_path, argv):
    result = subprocess.run([sys.executable, "-m", "minitransformer", "bench", "engine", "--model",
                             str(tiny_model_path), *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
