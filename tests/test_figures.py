"""`minitransformer figures --quick` measures and draws every figure; the measurements behind them hold together.

The CLI runs as a user runs it (a subprocess, the real model) and must leave five valid PNGs of a sensible size;
the measuring functions are checked on the tiny model against numbers worked out here from the config.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from minitransformer import viz

ROOT = Path(__file__).resolve().parents[1]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header, after checking the signature and that the IHDR chunk comes first."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR" and data[-8:-4] == b"IEND", f"{path.name} is truncated"
    return struct.unpack(">II", data[16:24])


def test_figures_quick_writes_five_pngs(real_model_path, tmp_path):
    out = tmp_path / "figs"
    env = dict(os.environ, MINITRANSFORMER_MODEL=str(real_model_path))
    result = subprocess.run([sys.executable, "-m", "minitransformer", "figures", "--quick", "--out", str(out)],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(out / name) for name in viz.FIGURES + viz.CONCEPT_FIGURES]   # paths only
    assert "drawing" in result.stderr                                             # the progress bar is on stderr
    for name in viz.FIGURES:
        width, height = png_size(out / name)
        assert (width, height) == (700, 440), name                               # figsize (7, 4.4) at dpi 100
        assert 10_000 < (out / name).stat().st_size < 150_000, name              # drawn, and small enough to commit
    for name in viz.CONCEPT_FIGURES:                                              # their own sizes; still PNGs
        assert min(png_size(out / name)) > 300 and (out / name).stat().st_size < 300_000, name


def test_measurements_on_the_tiny_model(tiny_model):
    ticks = []
    kv = viz.measure_kv_bytes(tiny_model, viz.QUICK, lambda: ticks.append(1))
    c = tiny_model.config
    for batch, tokens, used in kv["measured"]:
        assert used == 2 * c.n_layers * batch * c.n_kv_heads * tokens * c.head_dim * 4     # K and V, float32
    assert sorted({(b, n) for b, n, _ in kv["measured"]}) == sorted(
        (b, n) for b in viz.QUICK.kv_batches for n in viz.QUICK.kv_lengths)

    steps = viz.measure_cache_vs_no_cache(tiny_model, viz.QUICK, lambda: ticks.append(1))
    assert len(steps["with_cache_s"]) == len(steps["no_cache_s"]) == viz.QUICK.no_cache_tokens
    itl = viz.measure_itl(tiny_model, viz.QUICK, lambda: ticks.append(1))
    assert itl["tokens"] == list(viz.QUICK.context_lengths) and all(t > 0 for t in itl["itl_s"])
    assert len(ticks) == len(viz.QUICK.kv_batches) + 2 + len(viz.QUICK.context_lengths)   # one tick per unit of work


def test_machine_label_names_the_cores():
    label = viz.machine_label()
    assert f"{os.cpu_count()} cores" in label and len(label) > len(f"{os.cpu_count()} cores") + 3


@pytest.mark.parametrize("quick", [True, False])
def test_sweeps_fit_the_model(quick):
    sweep = viz.QUICK if quick else viz.FULL
    assert max(sweep.context_lengths) + sweep.decode_steps + 1 <= 8192      # SmolLM2's context window
    assert sweep.repeats >= 1 and sweep.decode_steps >= 2
