"""A concept lives in one place: core/ stands alone, and each concept a reader looks up has one home.

- Importing the core (or the package's front door) loads core/ and nothing else: no optimization, no optional
  dependency (llguidance, mpi4py, cupy, torch). Checked in a fresh interpreter, since this test process has long
  loaded everything.
- One clock and one percentile (core/metrics.py), one best/median/spread summary (lab/measure.Timing): nothing else
  in the package reads a timing clock or ranks values itself.
- The CLI's choices are their owners' own tuples, never typed again.
- No code outside core/config.py's FAMILIES names a model family.
- Prometheus metric names are spelled once, in server/prometheus.py.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minitransformer import ATTENTION
from minitransformer.bench.serve_compare import VLLM_BINDINGS, VLLM_MODES
from minitransformer.bench.serve_workload import ENDPOINTS
from minitransformer.cli import build_parser
from minitransformer.core.backend import DEVICES
from minitransformer.core.config import FAMILIES
from minitransformer.core.kv_storage import STORAGES
from minitransformer.models import KNOWN_MODELS
from minitransformer.quantize.schemes import SCHEMES
from minitransformer.serving.scheduler import POLICIES

PACKAGE = Path(__file__).resolve().parents[1] / "minitransformer"
OPTIONAL = ("llguidance", "mpi4py", "cupy", "torch")

LOADED = """
import json, sys
{statement}
print(json.dumps(sorted(m for m in sys.modules if m.startswith("minitransformer") or m.split(".")[0] in {optional})))
"""


def loaded_by(statement: str) -> list[str]:
    """The minitransformer modules and optional dependencies a fresh interpreter has loaded after `statement`."""
    code = LOADED.format(statement=statement, optional=set(OPTIONAL))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent)
    return json.loads(out.stdout)


@pytest.mark.parametrize("statement", ["import minitransformer.core",
                                       "from minitransformer import load_model, generate"])
def test_importing_the_core_loads_the_core_alone(statement):
    loaded = loaded_by(statement)
    outside = [m for m in loaded if m not in ("minitransformer", "minitransformer.core")
               and not m.startswith("minitransformer.core.")]
    assert outside == [], f"{statement} loaded {outside}"
    assert "minitransformer.core.generate" in loaded and "minitransformer.core.model" in loaded


def test_the_check_sees_an_optimization_loaded():
    """The same check, with an optimization imported on purpose, names it: the test above can fail."""
    loaded = loaded_by("import minitransformer.core; import minitransformer.structured")
    assert "minitransformer.structured" in loaded and "llguidance" in loaded


# ---------------------------------------------------------------------------------------------------- calls

def calls_in(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every call in a file: `np.percentile(...)` -> "np.percentile"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            parts, target = [], node.func
            while isinstance(target, ast.Attribute):
                parts.append(target.attr)
                target = target.value
            if isinstance(target, ast.Name):
                found.append((node.lineno, ".".join([target.id, *reversed(parts)])))
    return found


CLOCKS = {"time.perf_counter", "time.monotonic", "time.perf_counter_ns", "time.monotonic_ns", "time.process_time",
          "time.thread_time", "time.thread_time_ns"}
RANKS = {"np.percentile", "np.quantile", "np.median", "numpy.percentile", "numpy.quantile", "numpy.median",
         "statistics.median", "statistics.quantiles", "np.nanpercentile", "np.nanmedian"}


def offenders(names: set[str], home: set[str]) -> list[str]:
    return [f"{path.relative_to(PACKAGE.parent)}:{line} calls {name}" for path in sorted(PACKAGE.rglob("*.py"))
            if str(path.relative_to(PACKAGE)) not in home for line, name in calls_in(path) if name in names]


def test_one_clock():
    """Every timestamp and timing of the package comes from core.metrics.now() (a CPU-time budget from its
    cpu_now())."""
    assert offenders(CLOCKS, {"core/metrics.py"}) == []


def test_one_percentile():
    """core.metrics.percentile is the one percentile (lab/measure.Timing's median is its 50th)."""
    assert offenders(RANKS, {"core/metrics.py"}) == []


def test_a_planted_clock_is_caught(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("import time\nstart = time.perf_counter()\nimport numpy as np\nnp.percentile([1], 50)\n")
    assert calls_in(planted) == [(2, "time.perf_counter"), (4, "np.percentile")]


# ---------------------------------------------------------------------------------------------------- the CLI

def choices(parser, path: tuple[str, ...]) -> dict:
    """flag -> the choices object of every option of the sub-command at `path`."""
    for name in path:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[name]
    return {a.option_strings[-1]: a.choices for a in parser._actions if a.option_strings and a.choices is not None}


@pytest.mark.parametrize("path, flag, owner", [
    (("generate",), "--device", DEVICES),
    (("generate",), "--attention", ATTENTION),
    (("generate",), "--weights", SCHEMES),
    (("generate",), "--kv-cache", STORAGES),
    (("serve",), "--policy", POLICIES),
    (("serve",), "--device", DEVICES),
    (("bench", "serve"), "--endpoint", ENDPOINTS),
    (("bench", "serve"), "--vllm-mode", VLLM_MODES),
    (("bench", "serve"), "--vllm-binding", VLLM_BINDINGS),
])
def test_each_cli_choice_list_is_its_owners_tuple(path, flag, owner):
    assert choices(build_parser(), path)[flag] is owner


def test_download_offers_the_known_models():
    assert list(choices(build_parser(), ("download",))["--model"]) == list(KNOWN_MODELS)


def test_serves_engine_flags_are_engine_args_fields():
    from minitransformer.core.sampling_params import options_of
    from minitransformer.serving.engine_args import EngineArgs

    serve = build_parser()._actions
    sub = next(a for a in serve if a.__class__.__name__ == "_SubParsersAction").choices["serve"]
    flags = {a.dest: a.default for a in sub._actions if a.option_strings}
    for option in options_of(EngineArgs):
        assert flags[option.name] == option.default, option.flag


# ---------------------------------------------------------------------------------------------------- families

def family_branches(path: Path) -> list[str]:
    """Comparisons of anything with a family's name, in code (docstrings and comments are prose)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant) and side.value in FAMILIES:
                    found.append(f"{path.name}:{node.lineno} compares with {side.value!r}")
    return found


def test_no_code_names_a_family():
    """The forward and the loader read a family's differences from FAMILIES; none branches on its name."""
    assert [f for path in sorted(PACKAGE.rglob("*.py")) for f in family_branches(path)] == []


def test_a_planted_family_branch_is_caught(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f(arch):\n    return 2 if arch == 'gemma3' else 1\n")
    assert len(family_branches(planted)) == 1


# ---------------------------------------------------------------------------------------------------- metric names

METRIC_NAME = re.compile(r"(vllm|minitransformer):[a-z_]+")


def metric_names(path: Path) -> list[str]:
    """String constants in code (not docstrings) that hold a Prometheus name of ours or vLLM's."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [f"{path.name}:{node.lineno} {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and METRIC_NAME.fullmatch(node.value)]


def test_metric_names_are_spelled_once():
    assert [m for path in sorted(PACKAGE.rglob("*.py")) if path.name != "prometheus.py"
            for m in metric_names(path)] == []


def test_a_planted_metric_name_is_caught(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""vllm:num_requests_running, in prose, is fine."""\nNAME = "vllm:num_requests_running"\n')
    assert metric_names(planted) == ["planted.py:2 'vllm:num_requests_running'"]
