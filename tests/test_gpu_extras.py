"""The `gpu` extras of pyproject.toml resolve on PyPI to a CuPy whose [ctk] extra brings NVRTC and the CUDA headers
as wheels, for the CUDA major the flavour is named after: what a machine with only the NVIDIA driver needs before the
first kernel compiles. Asks pip (metadata only, no wheel downloaded); skipped when the package index cannot be
reached."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
FLAVOURS = {"gpu-cuda12": "12", "gpu-cuda13": "13"}


def index_reachable_or_skip(project: str) -> None:
    """pip says only "from versions: none" when it cannot reach its index, so ask the index page first."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        urllib.request.urlopen(f"{index}/{project}/", timeout=20).close()
    except OSError as exc:  # URLError, timeouts, refused connections
        pytest.skip(f"the package index {index} is not reachable from here (offline?), so the {project} extra "
                    f"cannot be resolved: {exc}")


def pip_report(requirement: str, tmp_path: Path) -> dict:
    """pip's resolution of one requirement string alone (--no-deps: the package itself, from its metadata)."""
    index_reachable_or_skip(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
    report = tmp_path / "report.json"
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed",
                          "--quiet", "--timeout", "30", "--report", str(report), requirement],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(report.read_text())


def test_gpu_is_the_cuda12_flavour_and_each_flavour_is_one_cupy_with_ctk():
    assert EXTRAS["gpu"] == ["minitransformer[gpu-cuda12]"]
    for extra, major in FLAVOURS.items():
        assert len(EXTRAS[extra]) == 1 and EXTRAS[extra][0].startswith(f"cupy-cuda{major}x[ctk]"), EXTRAS[extra]


@pytest.mark.parametrize("extra", sorted(FLAVOURS))
def test_gpu_extra_resolves_to_a_cupy_whose_ctk_extra_brings_nvrtc_and_the_headers(extra, tmp_path):
    major = FLAVOURS[extra]
    (requirement,) = EXTRAS[extra]
    (install,) = pip_report(requirement, tmp_path)["install"]
    metadata = install["metadata"]
    assert metadata["name"] == f"cupy-cuda{major}x" and install["requested_extras"] == ["ctk"]
    assert int(metadata["version"].split(".")[0]) >= 14
    assert "ctk" in metadata["provides_extra"]
    ctk = [r for r in metadata["requires_dist"] if re.search(r"""extra\s*==\s*["']ctk["']""", r)]
    toolkit = next(r for r in ctk if r.startswith("cuda-toolkit["))         # NVIDIA's meta-package of CUDA wheels
    components = set(re.match(r"cuda-toolkit\[([^\]]*)\]", toolkit).group(1).split(","))
    assert {"nvrtc", "cudart", "cublas"} <= components       # the compiler, the runtime and its headers, matmuls
    assert re.search(rf"=={major}\.\*", toolkit), toolkit      # the CUDA major of the flavour's name
