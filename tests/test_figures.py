"""`minitransformer figures --quick` measures and draws every figure; the measurements behind them hold together;
a timed figure measured on a busy machine is refused unless --allow-busy.

The CLI runs as a user runs it (a subprocess, the real model) and must leave five valid PNGs of a sensible size
(with --allow-busy: the test machine is shared); the measuring functions are checked on the tiny model against
numbers worked out here from the config. The refusal is tested with a stand-in Probe that reports a busy (or quiet)
run: nothing here loads the CPU on purpose.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from minitransformer.lab import viz

ROOT = Path(__file__).resolve().parents[1]


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header, after checking the signature and that the IHDR chunk comes first."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR" and data[-8:-4] == b"IEND", f"{path.name} is truncated"
    return struct.unpack(">II", data[16:24])


def test_figures_quick_writes_every_png(real_model_path, tmp_path):
    out = tmp_path / "figs"
    env = dict(os.environ, MINITRANSFORMER_MODEL=str(real_model_path))
    result = subprocess.run([sys.executable, "-m", "minitransformer", "figures", "--quick", "--allow-busy", "--out",
                             str(out)],
                            capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(out / name) for name in viz.FIGURES + viz.CONCEPT_FIGURES]   # paths only
    assert "drawing" in result.stderr                                             # the progress bar is on stderr
    sizes = {"batching_sweep.png": (1200, 480), "serving_tradeoff.png": (900, 560),   # figsize (12, 4.8), (9, 5.6),
             "kv_cache_bytes.png": (1000, 440)}                                       # (10, 4.4): two panels
    for name in viz.FIGURES:
        assert png_size(out / name) == sizes.get(name, (700, 440)), name         # figsize (7, 4.4), dpi 100
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
    assert len(steps["with_cache_total"].samples) == len(steps["no_cache_total"].samples) == viz.QUICK.step_runs
    itl = viz.measure_itl(tiny_model, viz.QUICK, lambda: ticks.append(1))
    assert itl["tokens"] == list(viz.QUICK.context_lengths) and all(t > 0 for t in itl["itl_s"])
    assert all(a <= b <= c for a, b, c in zip(itl["itl_s"], itl["itl_median_s"], itl["itl_max_s"]))
    assert len(ticks) == len(viz.QUICK.kv_batches) + 2 * viz.QUICK.step_runs + len(viz.QUICK.context_lengths)


def test_ttft_is_the_fastest_repeat_after_a_warm_up(tiny_model, monkeypatch):
    """measure_ttft runs one untimed request per length, then `repeats`: the fastest is drawn, the slowest kept."""
    import dataclasses

    import minitransformer.lab.viz_measure as vm
    calls = []
    real = vm.generate
    monkeypatch.setattr(vm, "generate", lambda *a, **k: calls.append(1) or real(*a, **k))
    sweep = dataclasses.replace(viz.QUICK, prompt_lengths=(8,), repeats=3)
    data = viz.measure_ttft(tiny_model, sweep, lambda: None)
    assert len(calls) == 4                                                # warm-up + 3
    assert data["ttft_s"][0] <= data["ttft_median_s"][0] <= data["ttft_max_s"][0]
    assert data["prefill_s"][0] <= data["prefill_max_s"][0]


# ---------------------------------------------------------------------------------------------------- busy runs

class StandInProbe:
    """In place of measure.Probe: finish() reports the Quietness we choose, without measuring anything."""
    quiet = None

    def finish(self):
        return StandInProbe.quiet


def busy_run(monkeypatch, quiet: bool):
    from minitransformer.lab.measure import Quietness
    StandInProbe.quiet = Quietness(load=0.1 if quiet else 1.9, others=0.01 if quiet else 0.6, cores=2,
                                   calibration_before=1e-3, calibration_after=1e-3 if quiet else 1.3e-3)
    monkeypatch.setattr(viz, "Probe", StandInProbe)
    return StandInProbe.quiet


def test_a_busy_run_writes_no_timed_figure_and_says_which_and_why(tiny_model_path, tmp_path, monkeypatch):
    import io

    from rich.console import Console
    busy = busy_run(monkeypatch, quiet=False)
    console = Console(file=io.StringIO(), width=300)
    written = viz.make_figures(tmp_path, quick=True, model_path=tiny_model_path, console=console,
                               only="ttft_vs_prompt_length,kv_cache_bytes")
    assert written == [tmp_path / "kv_cache_bytes.png"]                   # bytes, not time: drawn whatever the load
    assert not (tmp_path / "ttft_vs_prompt_length.png").exists()
    text = console.file.getvalue()
    lines = [line for line in text.splitlines() if line.startswith("not drawn:")]
    assert lines == [viz.refusal("ttft_vs_prompt_length.png", busy)]
    assert busy.why_busy() in lines[0] and "other programs used 60% of the 2 cores" in lines[0]
    assert "--allow-busy" in lines[0] and busy.line() in text


def test_allow_busy_draws_it_with_the_reason_in_its_title(tiny_model_path, tmp_path, monkeypatch):
    busy = busy_run(monkeypatch, quiet=False)
    titles = {}
    real = viz.plot_ttft
    monkeypatch.setattr(viz, "plot_ttft",
                        lambda data, where, path: titles.update(ttft=where) or real(data, where, path))
    written = viz.make_figures(tmp_path, quick=True, model_path=tiny_model_path, only="ttft_vs_prompt_length",
                               allow_busy=True)
    assert written == [tmp_path / "ttft_vs_prompt_length.png"] and png_size(written[0]) == (700, 440)
    assert "BUSY machine, drawn with --allow-busy" in titles["ttft"]
    assert " ".join(titles["ttft"].split()).endswith(busy.why_busy())
    busy_run(monkeypatch, quiet=True)                                     # a quiet run: no such line
    viz.make_figures(tmp_path, quick=True, model_path=tiny_model_path, only="ttft_vs_prompt_length")
    assert "BUSY" not in titles["ttft"]


def test_the_cli_exits_1_when_it_refused_a_figure(tiny_model_path, tmp_path, monkeypatch, capsys):
    from minitransformer import cli
    busy_run(monkeypatch, quiet=False)
    code = cli.main(["figures", "--quick", "--model", str(tiny_model_path), "--out", str(tmp_path), "--only",
                     "roofline,kv_cache_bytes"])
    out, err = capsys.readouterr()
    assert code == 1 and out.split() == [str(tmp_path / "kv_cache_bytes.png")]
    assert "not drawn: roofline.png: the machine was busy" in " ".join(err.split())


def test_machine_label_names_the_cores():
    label = viz.machine_label()
    assert f"{os.cpu_count()} cores" in label and len(label) > len(f"{os.cpu_count()} cores") + 3


@pytest.mark.parametrize("quick", [True, False])
def test_sweeps_fit_the_model(quick):
    sweep = viz.QUICK if quick else viz.FULL
    assert max(sweep.context_lengths) + sweep.decode_steps + 1 <= 8192      # SmolLM2's context window
    assert sweep.repeats >= 1 and sweep.decode_steps >= 2
