"""The figures of figures/: each measured afresh on this machine by the engine itself, then drawn with matplotlib.

    minitransformer figures [--out figures] [--quick] [--only NAME,...]     (cli/tools.py calls make_figures)

    ttft_vs_prompt_length.png        generate(max_tokens=1)'s TTFT over prompt lengths: prefill grows with the prompt
    itl_vs_context_length.png        decode_step time over context lengths, next to the bytes-read floor
    step_time_cache_vs_no_cache.png  the time of every step of one request, with and without the KV cache
    kv_cache_bytes.png               estimate_kv_bytes over tokens for several batch sizes, and KVCache's measured bytes
    roofline.png                     this machine's read bandwidth and GEMM peak, with the prefill and decode points
    batching_sweep.png               decode tokens/s and ITL over batch sizes, next to an H200's roofline (viz_batching)
    serving_tradeoff.png             lesson 14's load: output tokens/s vs TTFT p99 over max_num_seqs, a line per arrival
                                     rate (viz_tradeoff)
    request_flow.png ... tensor_parallel_layer.png   (CONCEPT_FIGURES) diagrams drawn from a real run's objects:
                                     viz_flow.py, viz_shapes.py, viz_attention.py, viz_capacity.py, viz_concepts.py,
                                     viz_parallel.py (one layer's split, from the shard plan)

A run that measures the machine (the roofline and the ITL floor need it) writes the profile it used beside the
figures, figures/machine.json (PROFILE_FILE), and every run that times something writes the numbers it drew,
figures/measured.json (MEASURED_FILE): figures/README.md quotes its numbers from those two files, and
tests/test_quoted_numbers.py holds the README to them.

Measurements (measure_*, in viz_measure.py) come apart from the drawings (plot_*, here), so a reader can rerun one
without the other;
--only draws the figures named and measures only what they need. Every figure names the machine it was measured on.
--quick runs tiny sweeps (the test uses it): too few numbers to read much from, but all of them real measurements.

A timed figure (TIMED) is drawn only from a quiet run: a measure.Probe watches every measurement, and when another
program took the cores or the calibration drifted, the figure is not written and one line says which and why
(Quietness.why_busy). --allow-busy draws it anyway, with the reason in its title. Figures that time nothing (byte
counts, shapes, block tables) are drawn whatever the load.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from .. import load_model
from ..core.errors import InputError
from ..core.generate import generate
from ..core.kv_cache import estimate_kv_bytes
from ..core.sampling_params import SamplingParams
from .machine import forward_cost
from .measure import Probe, Quietness
from .peaks import MachineProfile, machine_label
from .viz_attention import draw_query_vs_cache
from .viz_batching import BATCHES, QUICK_BATCHES, draw_batching_sweep, measure_batch_sweep
from .viz_capacity import draw_users_that_fit
from .viz_concepts import draw_draft_and_verify, draw_paged_attention
from .viz_flow import draw_request_flow, run_request_flow
from .viz_measure import (
    FULL,
    QUICK,
    measure_cache_vs_no_cache,
    measure_itl,
    measure_kv_bytes,
    measure_peaks,
    measure_ttft,
    save_measurements,
    text_ids,
)
from .viz_parallel import draw_tensor_parallel_layer, figure_size
from .viz_shapes import draw_kv_cache_growth, draw_prefill_vs_decode_shapes
from .viz_timeline import draw_request_timeline, run_request_timeline
from .viz_tradeoff import LOAD_SWEEP, QUICK_LOAD_SWEEP, draw_serving_tradeoff, measure_tradeoff

FIGURES = ("ttft_vs_prompt_length.png", "itl_vs_context_length.png", "step_time_cache_vs_no_cache.png",
           "kv_cache_bytes.png", "roofline.png", "batching_sweep.png", "serving_tradeoff.png")
# Drawn from a run's objects (or the model's shard plan), not a sweep: no --quick.
CONCEPT_FIGURES = ("request_flow.png", "request_timeline.png", "kv_cache_growth.png", "query_vs_cache.png",
                   "prefill_vs_decode_shapes.png", "users_that_fit.png", "paged_attention.png",
                   "draft_and_verify.png", "tensor_parallel_layer.png")
# They show times: drawn only from a quiet run (or --allow-busy).
TIMED = ("ttft_vs_prompt_length.png", "itl_vs_context_length.png", "step_time_cache_vs_no_cache.png", "roofline.png",
         "batching_sweep.png", "serving_tradeoff.png", "request_flow.png", "request_timeline.png")
DPI = 100
PROFILE_FILE = "machine.json"
MEASURED_FILE = "measured.json"


def _figure(title: str, where: str):
    """A figure whose title's second line says which model and machine the numbers come from."""
    import matplotlib
    matplotlib.use("Agg")                                         # files only, no display needed
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.4))
    ax.set_title(f"{title}\n{where}", fontsize=10)
    ax.grid(True, alpha=0.3)
    return fig, ax


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _runs(n: int) -> str:
    return f"{n} run{'s' * (n != 1)}"


def _slowest_bars(ax, x, fastest, slowest) -> None:
    """A thin bar from each plotted (fastest) point up to the slowest run: how much the repeats moved."""
    ax.vlines(x, fastest, slowest, colors="grey", linewidth=1, alpha=0.7)


def plot_ttft(data: dict, where: str, path: Path) -> None:
    fig, ax = _figure("Time to first token vs prompt length (batch 1)", where)
    tokens, ttft = data["tokens"], np.array(data["ttft_s"]) * 1e3
    ax.plot(tokens, ttft, "o-", label=f"TTFT, fastest of {_runs(data['repeats'])} (bar: up to the slowest)")
    _slowest_bars(ax, tokens, ttft, np.array(data["ttft_max_s"]) * 1e3)
    # prefill throughput at each point, as a table beside the line (labels on the points overlapped at short prompts)
    rates = "\n".join(f"{n:>5,}: {n / p:>4.0f}" for n, p in zip(tokens, data["prefill_s"]))
    ax.text(0.03, 0.80, f"prefill tok/s\n(prompt tokens /\nprefill seconds)\n{rates}", transform=ax.transAxes,
            va="top", fontsize=7.5, family="monospace", bbox=dict(facecolor="white", edgecolor="lightgrey"))
    ax.set_xlabel("prompt length (tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left")
    _save(fig, path)


def plot_itl(data: dict, model, bandwidth: float, where: str, path: Path) -> None:
    fig, ax = _figure("Inter-token latency vs context length (batch 1)", where)
    tokens = np.array(data["tokens"])
    floor = [(model.weight_bytes + estimate_kv_bytes(model.config, int(n))) / bandwidth for n in tokens]
    ax.plot(tokens, np.array(data["itl_s"]) * 1e3, "o-",
            label=f"decode step, fastest of {data['steps']} (bar: up to the slowest)")
    _slowest_bars(ax, tokens, np.array(data["itl_s"]) * 1e3, np.array(data["itl_max_s"]) * 1e3)
    ax.plot(tokens, np.array(floor) * 1e3, "k:",
            label=f"floor: (weights + KV cache) / read bandwidth {bandwidth / 1e9:.1f} GB/s")
    ax.set_xlabel("context length (tokens already in the KV cache)")
    ax.set_ylabel("inter-token latency (ms)")
    ax.set_ylim(bottom=0)
    ax.legend()
    _save(fig, path)


def plot_cache_vs_no_cache(data: dict, where: str, path: Path) -> None:
    from matplotlib.ticker import MaxNLocator
    fig, ax = _figure(f"Step time with and without the KV cache ({data['prompt_tokens']}-token prompt, greedy)", where)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for key, label, style in (("with_cache", "with KV cache", "o-"), ("no_cache", "no cache (recompute all)", "s-")):
        steps = np.array(data[f"{key}_s"][1:]) * 1e3              # decode steps; step 0 (prefill) is the same work
        total = data[f"{key}_total"]
        ax.plot(np.arange(1, len(steps) + 1), steps, style, markersize=3,
                label=f"{label}: request {total.min:.2f} s (median {total.median:.2f}, spread {total.spread:.2f})")
    ax.set_xlabel("output token number (decode step)")
    ax.set_ylabel(f"step time (ms), fastest of {_runs(data['runs'])} each")
    ax.set_ylim(bottom=0)
    ax.legend()
    _save(fig, path)


def plot_kv_bytes(data: dict, config, model_name: str, path: Path) -> None:
    """Linear axes, so the straight lines through zero say "linear in tokens, and in batch" at a glance: the whole
    context on the left, the measured range enlarged on the right with a real KVCache's bytes on the lines. Bytes
    are counted, not timed: the title names no machine."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    fig.suptitle(f"KV cache bytes grow linearly with tokens and with batch: {model_name} ({config.n_layers} layers, "
                 f"{config.n_kv_heads} KV heads, head_dim {config.head_dim}, float32)\n"
                 f"estimate_kv_bytes = 2 x layers x batch x KV heads x tokens x head_dim x 4 bytes; dots: a real "
                 f"KVCache's bytes_used (counted, not timed)", fontsize=9.5)
    batches = sorted({b for b, _, _ in data["measured"]} | {16})
    longest = max(n for _, n, _ in data["measured"])
    for ax, end, title in ((axes[0], config.context_length, "the whole context"),
                           (axes[1], longest, f"enlarged: up to {longest} tokens, where the cache was measured")):
        tokens = np.unique(np.linspace(0, end, 65).astype(int))                # whole tokens: a straight line
        for batch in batches:
            line, = ax.plot(tokens, [estimate_kv_bytes(config, int(t), batch) / 2**20 for t in tokens],
                            label=f"estimate, batch {batch}")
            points = [(n, used / 2**20) for b, n, used in data["measured"] if b == batch and n <= end]
            if points:
                ax.plot(*zip(*points), "o", color=line.get_color(), label=f"measured KVCache, batch {batch}")
        ax.set_title(title, fontsize=9.5)
        ax.set_xlim(0, end)
        ax.set_ylim(0, None)
        ax.set_xlabel("tokens per sequence")
        ax.set_ylabel("K + V bytes (MiB)")
        ax.grid(True, alpha=0.3)
    axes[1].legend(fontsize=8)
    _save(fig, path)


def plot_roofline(ttft: dict, itl: dict, peaks: MachineProfile, config, weight_bytes: int, where: str,
                  path: Path) -> None:
    fig, ax = _figure("Roofline of this machine: prefill vs decode (float32, batch 1)", where)
    bandwidth, peak = peaks.read_bandwidth, peaks.gemm_peak
    prefill = [forward_cost(config, n, weight_bytes=weight_bytes) for n in ttft["tokens"]]
    decode = [forward_cost(config, 1, n, weight_bytes=weight_bytes) for n in itl["tokens"]]
    points = [c.intensity for c in prefill + decode]
    x = np.geomspace(min(points + [0.1]) / 2, max(points + [peak / bandwidth]) * 4, 200)
    ax.plot(x, np.minimum(peak, bandwidth * x) / 1e9, "k-",
            label=f"roof: {bandwidth / 1e9:.1f} GB/s read, {peak / 1e9:.0f} GFLOP/s GEMM")
    ax.plot([c.intensity for c in prefill], [c.flops / s / 1e9 for c, s in zip(prefill, ttft["prefill_s"])], "o",
            label=f"prefill, {ttft['tokens'][0]}-{ttft['tokens'][-1]} prompt tokens")
    ax.plot([c.intensity for c in decode], [c.flops / s / 1e9 for c, s in zip(decode, itl["itl_s"])], "s",
            label=f"decode step, context {itl['tokens'][0]}-{itl['tokens'][-1]}")
    ax.axvline(peak / bandwidth, color="grey", linestyle=":", label=f"ridge {peak / bandwidth:.3g} FLOP/byte")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.legend(fontsize=8, loc="best", framealpha=0.9)
    _save(fig, path)


# ---------------------------------------------------------------------------------------------------- all of it


# what each measured figure needs measured first; the concept diagrams run their own scenario
NEEDS = {"ttft_vs_prompt_length.png": ("ttft",), "itl_vs_context_length.png": ("itl", "peaks"),
         "step_time_cache_vs_no_cache.png": ("steps",), "kv_cache_bytes.png": ("kv",),
         "roofline.png": ("ttft", "itl", "peaks"), "batching_sweep.png": ("batch",),
         "serving_tradeoff.png": ("load",)}


def select_figures(only: str | None) -> list[str]:
    """`--only a.png,b` -> the figure names in drawing order (".png" optional); every name when only is None."""
    everything = list(FIGURES + CONCEPT_FIGURES)
    if only is None:
        return everything
    wanted = [name if name.endswith(".png") else name + ".png" for name in only.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in everything]
    if unknown or not wanted:
        raise InputError(f"--only takes figure names from: {', '.join(everything)}; got {only!r}")
    return [name for name in everything if name in wanted]


def busy_title(quiet: Quietness) -> str:
    """The extra title line of a figure drawn from a busy run with --allow-busy: what disturbed it."""
    return "\n".join(textwrap.wrap(f"BUSY machine, drawn with --allow-busy: {quiet.why_busy()}", 80))


def refusal(name: str, quiet: Quietness) -> str:
    """The one line that says a timed figure was not written, and why."""
    return (f"not drawn: {name}: the machine was busy while it was measured ({quiet.why_busy()}); close other "
            "programs and rerun, or pass --allow-busy to draw it with that in its title")


def make_figures(out: str | Path = "figures", quick: bool = False, model_path=None, console=None,
                 only: str | None = None, allow_busy: bool = False) -> list[Path]:
    """Measure what the chosen figures need, draw them into `out` (all of them unless `only`), return the paths
    written. Progress, the quietness line and any refusal go to `console`. A timed figure measured while the
    machine was busy is not written (one line names it and why) unless allow_busy."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    names, sweep = select_figures(only), QUICK if quick else FULL
    batches = QUICK_BATCHES if quick else BATCHES
    load = QUICK_LOAD_SWEEP if quick else LOAD_SWEEP
    needs = {need for name in names for need in NEEDS.get(name, ())}
    measures = {"ttft": ("TTFT over prompt lengths", measure_ttft, len(sweep.prompt_lengths)),
                "itl": ("ITL over context lengths", measure_itl, len(sweep.context_lengths)),
                "steps": ("cache vs no cache", measure_cache_vs_no_cache, 2 * sweep.step_runs),
                "kv": ("KV cache bytes", measure_kv_bytes, len(sweep.kv_batches)),
                "peaks": ("bandwidth and GEMM peaks", measure_peaks, 2),      # (progress label, function, ticks)
                "batch": ("decode steps over batch sizes", lambda model, _, tick: measure_batch_sweep(
                    model, batches, tick=tick), len(batches)),
                "load": ("requests arriving, slots swept", lambda model, _, tick: measure_tradeoff(
                    model, load, tick=tick), load.runs)}
    timed = [name for name in names if name in TIMED]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with Progress(TextColumn("{task.description:<34}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console or Console(stderr=True)) as progress:
        task = progress.add_task("loading the model", total=1 + sum(measures[n][2] for n in needs) + len(names))

        def stage(name: str):
            progress.update(task, description=name)
            return lambda: progress.advance(task)

        model = load_model(model_path)
        progress.advance(task)
        generate(model, text_ids(model, 8), SamplingParams(max_tokens=2, temperature=0.0))   # warm-up, not plotted
        probe = Probe() if timed else None                          # watches every timed measurement below
        m: dict[str, Any] = {key: run(model, sweep, stage(label))
                             for key, (label, run, _) in measures.items() if key in needs}
        if "request_flow.png" in names:
            stage("request flow (timed run)")
            m["flow"] = run_request_flow(model, repeats=1 if quick else 3)
        if "request_timeline.png" in names:
            stage("request timeline (timed run)")
            m["timeline"] = run_request_timeline(model)
        quiet = probe.finish() if probe else None
        if quiet:
            progress.console.print(quiet.line(), markup=False, highlight=False, soft_wrap=True)
        busy = quiet if quiet is not None and not quiet.quiet else None           # the verdict of a busy run
        tick, machine = stage("drawing"), machine_label()
        assert model.path is not None, "load_model gives the model its file's path"
        model_name, c = model.path.stem, model.config
        plain = f"{model_name} | measured on {machine}"
        where = plain + ("\n" + busy_title(busy) if busy and allow_busy else "")            # for the timed ones
        flow_where = f"measured on {machine}" + ("\n" + busy_title(busy) if busy and allow_busy else "")
        draw = {"ttft_vs_prompt_length.png": lambda p: plot_ttft(m["ttft"], where, p),
                "itl_vs_context_length.png": lambda p: plot_itl(m["itl"], model, m["peaks"].read_bandwidth, where, p),
                "step_time_cache_vs_no_cache.png": lambda p: plot_cache_vs_no_cache(m["steps"], where, p),
                "kv_cache_bytes.png": lambda p: plot_kv_bytes(m["kv"], c, model_name, p),
                "roofline.png": lambda p: plot_roofline(m["ttft"], m["itl"], m["peaks"], c, model.weight_bytes,
                                                        where, p),
                "batching_sweep.png": lambda p: draw_batching_sweep(model, m["batch"], where, p),
                "serving_tradeoff.png": lambda p: draw_serving_tradeoff(m["load"], where, p),
                "request_flow.png": lambda p: draw_request_flow(model, p, flow_where, data=m["flow"]),
                "request_timeline.png": lambda p: draw_request_timeline(model, p, flow_where, data=m["timeline"]),
                "kv_cache_growth.png": lambda p: draw_kv_cache_growth(model, p),
                "query_vs_cache.png": lambda p: draw_query_vs_cache(model, p),
                "users_that_fit.png": lambda p: draw_users_that_fit(model, p),
                "prefill_vs_decode_shapes.png": lambda p: draw_prefill_vs_decode_shapes(model, p),
                "paged_attention.png": lambda p: draw_paged_attention(model, p),
                "draft_and_verify.png": lambda p: draw_draft_and_verify(model, p),
                "tensor_parallel_layer.png": lambda p: draw_tensor_parallel_layer(c, figure_size(c), p, model_name)}
        written = []
        if timed and not (busy and not allow_busy):           # the numbers these figures draw, for their README
            if "peaks" in m:
                m["peaks"].save(out / PROFILE_FILE)
            save_measurements(out / MEASURED_FILE, m, {"measured on": machine, "model": model_name,
                                                       "quietness": quiet.line() if quiet else None})
        for name in names:
            if busy and name in TIMED and not allow_busy:
                progress.console.print(refusal(name, busy), markup=False, highlight=False, soft_wrap=True)
            else:
                draw[name](out / name)
                written.append(out / name)
            tick()
    return written
