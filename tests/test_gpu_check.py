"""scripts/gpu_check.py end to end on this machine, and the CLI's answer to --device gpu without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def has_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError or no CUDA driver
        return False


@pytest.mark.skipif(has_gpu(), reason="a GPU is present: the full check is gpu_check's own job (minutes)")
def test_gpu_check_runs_end_to_end_with_gpu_parts_skipped(tmp_path):
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "scripts/gpu_check.py", "--json", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert report["gpu"] is False and report["skipped"]
    assert len(report["parts"]) == 6
    assert f"GPU parts skipped: {report['skipped']}" in run.stdout
    assert all(f"skipped: {part}" in run.stdout for part in report["parts"])


@pytest.mark.skipif(has_gpu(), reason="a GPU is present: --device gpu works there")
def test_cli_device_gpu_without_gpu_is_one_line_exit_2():
    run = subprocess.run([sys.executable, "-m", "minitransformer", "generate", "hi", "--device", "gpu"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device gpu" in lines[0] and "Traceback" not in run.stderr


def dry_run(tmp_path, model_path, *extra, env=None):
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--model", str(model_path),
                          "--json", str(out), "--tokens", "4", "--batches", "1,3", "--prefill", "32", *extra],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    return run, json.loads(out.read_text())


def test_gpu_check_dry_run_on_the_cpu_measures_and_checks_everything_but_the_gpu_parts(tmp_path, tiny_model_path):
    """--device cpu runs the measuring code of parts 2-4 on the tiny model, so a GPU run does not meet it first."""
    run, report = dry_run(tmp_path, tiny_model_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert report["device"] == "cpu" and report["gpu"] is False
    assert not {"tests", "kernels", "hf_transformers"} & set(report)                 # GPU-only parts
    assert set(report["seconds"]) == {"cpu_vs_gpu", "engine_decode", "speeds", "float16"}
    assert all(r["tokens_equal"] and r["max_logits_diff"] == 0.0 for r in report["cpu_vs_gpu"])   # same code, CPU
    for batch, row in report["engine_decode"].items():
        assert row["tokens_equal"] and row["graphs_disabled"] is None
        assert row["replays"] >= 60                                  # 64 tokens: all but the first from a replay
        assert row["plain_tok_s"] > 0 and row["graphs_tok_s"] > 0
    assert set(report["engine_decode"]) == {"1", "3"} and set(report["speeds"]["prefill_tok_s"]) == {"32"}
    f16 = report["float16"]
    assert 0.45 < f16["weight_bytes"] / f16["float32_weight_bytes"] < 0.55 and 0 <= f16["tokens_equal_to_float32"] <= 64
    assert "engine decode, batch" in run.stdout and "float16 weights" in run.stdout
    assert "[engine_decode] ok" in run.stderr


def test_gpu_check_records_a_failing_part_and_still_measures_the_others(tmp_path):
    """A part that raises costs only its own numbers: the report keeps the rest, says what failed, exit code 1.
    Here a real failure: one weight of 70000 (stored F32) that float16 cannot hold, so the float16 part refuses."""
    from unittest import mock

    import tiny_model
    original = tiny_model.tiny_tensors

    def with_a_huge_weight(*args, **kwargs):
        tensors = original(*args, **kwargs)
        tensors["blk.1.ffn_down.weight"][0, 0] = 70000.0
        return tensors

    with mock.patch.object(tiny_model, "tiny_tensors", with_a_huge_weight):
        path = tiny_model.write_tiny_llama(tmp_path / "huge.gguf", types={"ffn_down.weight": tiny_model.Q.F32})
    run, report = dry_run(tmp_path, path)
    assert run.returncode == 1
    assert report["float16"]["failed"].startswith("InputError: float16 cannot store these weights: the largest |w| "
                                                  "is 70000")
    assert "in quantize_float16" in report["float16"]["traceback"]              # where it was raised
    assert all(row["tokens_equal"] for row in report["engine_decode"].values())     # measured all the same
    assert set(report["seconds"]) == {"cpu_vs_gpu", "engine_decode", "speeds", "float16"}
    assert "float16: FAILED InputError: float16 cannot store" in run.stdout
    assert "[float16] FAILED" in run.stderr
