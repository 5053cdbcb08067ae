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
