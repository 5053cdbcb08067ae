"""Lesson 14's trade-off in one picture: output tokens/s against TTFT p99 as max_num_seqs grows, one line per
arrival rate.

    serving_tradeoff.png   lab/engine_load.py's loop (the Engine stepping while lesson 14's requests arrive at
                           Poisson times) for every arrival rate and max_num_seqs of LOAD_SWEEP, each configuration
                           run `repeats` times in turns. Each line goes through its configurations' fastest runs (a
                           run's throughput and that same run's TTFT p99), each point labelled with its max_num_seqs;
                           the other runs are the faint dots. A dashed line at the most tokens/s the rate's arrivals
                           allow (engine_load.arrival_bound): no number of slots can go past it.

The two rates are lesson 14's --rates auto: half and three times the requests per second this machine serves with the
most slots, measured first. Fixed rates were a different load on each machine: 2 and 8 requests/s were both past what
a slow 2-core machine served, and its figure had no knee.

What to look at: while requests queue for a slot, each slot more serves more of them at once, so a point moves right
(throughput) and down (TTFT p99 is mostly queueing). Once a rate's throughput reaches what its arrivals allow, the
slots are no longer the limit: more of them buy little throughput, and cost memory and a slower step. The ring
marks that knee, the fewest slots from which every slot count reached AT_BOUND of the bound; it is drawn only when
the run has one, and a note says when the most slots cost TTFT p99 against it beyond the spread of the runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .engine_load import (
    AT_BOUND,
    HEAVY,
    LIGHT,
    arrival_bound,
    arrival_offsets,
    load_label,
    rates_for_this_machine,
    sweep,
    workload,
)
from .viz_concepts import pyplot


@dataclass(frozen=True)
class LoadSweep:
    """What the figure runs: lesson 14's workload (its defaults) over `rates` x `slots`. rates None: lesson 14's
    --rates auto, a light and a heavy rate from what this machine serves with the most slots (measured first)."""
    rates: tuple[float, ...] | None
    slots: tuple[int, ...]           # max_num_seqs values
    requests: int
    max_tokens: int
    max_prompt: int
    repeats: int
    seed: int = 0

    @property
    def runs(self) -> int:
        return len(self.rates or (LIGHT, HEAVY)) * len(self.slots) * self.repeats


LOAD_SWEEP = LoadSweep(rates=None, slots=(1, 2, 4, 8, 16), requests=16, max_tokens=24, max_prompt=160,
                       repeats=2)                    # 20 runs of 16 requests
QUICK_LOAD_SWEEP = LoadSweep(rates=(4.0, 16.0), slots=(1, 4), requests=4, max_tokens=4, max_prompt=32, repeats=1)
LOG_SPAN = 10                    # TTFT p99 drawn on a log axis when its largest is at least this many times its least


@dataclass
class Tradeoff:
    """Every run of the sweep, summarized (engine_load.summarize), and each rate's arrival bound."""
    sweep: LoadSweep
    runs: dict[tuple[float, int], list[dict]]       # (rate, max_num_seqs) -> one summary per run
    bound: dict[float, float]                       # rate -> most output tokens/s its arrivals allow
    served: tuple[float, float] | None = None       # rates auto: (tok/s, requests/s) the most slots served with
                                                    # every request at once, the rates' yardstick

    @property
    def rates(self) -> tuple[float, ...]:
        """The arrival rates that ran (auto ones measured: measure_tradeoff fills them in)."""
        assert self.sweep.rates is not None, "measure_tradeoff replaces rates None with the measured rates"
        return self.sweep.rates

    def fastest(self, rate: float, slots: int) -> dict:
        """The configuration's run with the highest throughput: noise only slows a run down, so it is the closest
        to a quiet machine's. Its TTFT p99 is drawn with it: every point is one run that happened."""
        return max(self.runs[rate, slots], key=lambda run: run["tok_s"])


def measure_tradeoff(model, settings: LoadSweep = LOAD_SWEEP, tick=lambda: None) -> Tradeoff:
    """Run lesson 14's workload at every rate and slot count of `settings` (engine_load.sweep: in turns, after an
    untimed warm-up); tick after each run. Rates None: first measure what this machine serves and take lesson 14's
    light and heavy rates from it."""
    requests = workload(model.tokenizer, settings.requests, settings.max_prompt, settings.max_tokens, settings.seed)
    served, rates = None, settings.rates
    if rates is None:
        tok_s, per_second, light, heavy = rates_for_this_machine(model, requests, max(settings.slots))
        served, rates = (tok_s, per_second), (light, heavy)
    offsets = {rate: arrival_offsets(settings.requests, rate, settings.seed) for rate in rates}
    runs = sweep(model, requests, offsets, settings.slots, settings.repeats, tick=tick)
    return Tradeoff(replace(settings, rates=rates), runs, {rate: arrival_bound(runs, offsets, rate) for rate in rates},
                    served)


def knee(slots, tok_s, bound: float, at: float = AT_BOUND) -> int | None:
    """The fewest slots from which every slot count of the sweep reached `at` of what the arrivals allow: from
    there on the arrivals, not the slots, limit throughput. None: the most slots did not reach it (the engine
    still limited throughput at the end of the sweep)."""
    found = None
    for m, rate in reversed(list(zip(slots, tok_s))):
        if rate < at * bound:
            break
        found = m
    return found


def ttft_cost(knee_ttft: list[float], most_ttft: list[float]) -> bool:
    """Did the most slots cost TTFT p99 against the knee, beyond the spread: every run of the most slots slower
    to a first token than every run at the knee? (Runs' TTFT p99s, in seconds.)"""
    return min(most_ttft) > max(knee_ttft)


def notes_for(data: Tradeoff) -> tuple[dict, list[str]]:
    """Each rate's knee (or None) and the notes the figure prints, decided from the run's numbers alone."""
    s, knees, notes = data.sweep, {}, []
    for rate in data.rates:
        fastest = [data.fastest(rate, m)["tok_s"] for m in s.slots]
        knees[rate] = here = knee(s.slots, fastest, data.bound[rate])
        label = load_label(rate)
        if here is None:
            notes.append(f"{label}: {s.slots[-1]} slots did not reach {AT_BOUND:.0%} of the {data.bound[rate]:.1f} "
                         "tok/s that arrive: up to there the engine, not the arrivals, limits throughput")
            continue
        notes.append(f"{label}: from {here} slots on, throughput is at least {AT_BOUND:.0%} of what arrives: the "
                     "arrivals, not the slots, limit it")
        most = s.slots[-1]
        if here != most:
            at_knee, at_most = ([r["ttft99"] for r in data.runs[rate, m]] for m in (here, most))
            if ttft_cost(at_knee, at_most):
                notes.append(f"{label}: and {most} slots cost TTFT p99 against {here} "
                             f"(best runs {min(at_knee):.2f} -> {min(at_most):.2f} s; every run apart)")
    return knees, notes


def place_labels(ax, pending: list[tuple[str, float, float, str]], gap: float = 11.0) -> list:
    """Write each point's slot count beside it, moving a label up (then down) in steps of `gap` pixels until it
    keeps `gap` pixels from every label placed before it: points of different rates often land on one another."""
    ax.figure.canvas.draw()                                        # final limits and scales, for pixel positions
    placed: list[tuple[float, float]] = []
    annotations = []
    for text, x, y, colour in pending:
        px, py = ax.transData.transform((x, y))
        for shift in (0, 1, -1, 2, -2, 3, -3, 4):
            spot = (px + 6, py + 5 + shift * gap)
            if all(abs(spot[0] - a) >= 2 * gap or abs(spot[1] - b) >= gap for a, b in placed):
                break
        placed.append(spot)
        annotations.append(ax.annotate(text, (x, y), textcoords="offset points", fontsize=8.5, color=colour,
                                       xytext=(6, 5 + shift * gap * 72 / ax.figure.dpi)))
    return annotations


def draw_serving_tradeoff(data: Tradeoff, where: str, path) -> dict:
    """One line per rate through the fastest runs (x: output tokens/s, y: TTFT p99), labelled with max_num_seqs,
    the arrival bound dashed, the knee ringed; returns what was drawn, read back from the figure's own artists:
    {"points": {rate: (x, y)}, "labels": {rate: [...]}, "bounds": {rate: x}, "rings": [(x, y)], "knees": {rate:
    slots or None}, "notes": [...], "log_y": bool}."""
    plt = pyplot()
    s = data.sweep
    knees, notes = notes_for(data)
    fig, ax = plt.subplots(figsize=(9, 5.6))
    drawn: dict[float, tuple[list, list]] = {}
    bounds: dict[float, float] = {}
    rings: list[tuple[float, float]] = []
    pending: list[tuple[str, float, float, str]] = []             # (slot count, x, y, colour): placed at the end
    ttft_all = [run["ttft99"] for done in data.runs.values() for run in done]
    for i, (rate, colour) in enumerate(zip(data.rates, ("tab:blue", "tab:orange", "tab:green", "tab:purple"))):
        others = [(run["tok_s"], run["ttft99"]) for m in s.slots for run in data.runs[rate, m]
                  if run is not data.fastest(rate, m)]
        if others:
            ax.plot(*zip(*others), ".", color=colour, alpha=0.35, label="the other runs" if i == 0 else None)
        best = [data.fastest(rate, m) for m in s.slots]
        line, = ax.plot([r["tok_s"] for r in best], [r["ttft99"] for r in best], "o-", color=colour,
                        label=f"{load_label(rate)}: fastest of {s.repeats} run{'s' * (s.repeats != 1)} per slot count")
        drawn[rate] = (list(line.get_xdata()), list(line.get_ydata()))
        pending += [(str(m), run["tok_s"], run["ttft99"], colour) for m, run in zip(s.slots, best)]
        ceiling = ax.axvline(data.bound[rate], color=colour, ls="--", lw=1,
                             label=f"{load_label(rate)}: at most {data.bound[rate]:.1f} tok/s arrive")
        bounds[rate] = ceiling.get_xdata()[0]
        if knees[rate] is not None:
            point = data.fastest(rate, knees[rate])
            ring, = ax.plot(point["tok_s"], point["ttft99"], "o", ms=16, mfc="none", mec="tab:red", mew=1.5)
            rings.append((ring.get_xdata()[0], ring.get_ydata()[0]))
    log_y = max(ttft_all) >= LOG_SPAN * min(ttft_all)
    if log_y:
        ax.set_yscale("log")
        steps = np.outer(10.0 ** np.arange(-3, 4), (1, 2, 5)).ravel()             # (21,) 0.001, 0.002, 0.005, ...
        ticks = [float(t) for t in steps if min(ttft_all) / 2 <= t <= max(ttft_all) * 2]
        ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
        ax.minorticks_off()
    ax.text(0.0, -0.12, "\n".join(notes), transform=ax.transAxes, ha="left", va="top", fontsize=8,
            color="tab:red")                                       # under the axis: tight_layout makes room
    ax.set_xlabel("output tokens/s (all generated tokens / the run's wall time)")
    ax.set_ylabel("TTFT p99 over the run's requests (s)" + (", log scale" if log_y else ""))
    ax.set_xlim(left=0)
    annotations = iter(place_labels(ax, pending))                 # in the order pending lists them: rate by rate
    labels = {rate: [next(annotations).get_text() for _ in s.slots] for rate in data.rates}
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7.5, loc="lower right")
    yardstick = "" if data.served is None else (
        f"the rates: {LIGHT:g}x and {HEAVY:g}x the {data.served[1]:.2f} requests/s that {max(s.slots)} slots served on "
        "this machine with every request at once\n")
    title = ax.set_title(f"Serving under load: throughput vs TTFT p99; the number by each point is its max_num_seqs\n"
                         f"{s.requests} requests of lesson 14 ({s.max_tokens} tokens each, prompts 16-{s.max_prompt}), "
                         f"Poisson arrivals, ringed: where the arrivals became the limit\n{yardstick}{where}",
                         fontsize=9.5)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return {"points": drawn, "labels": labels, "bounds": bounds, "rings": rings, "knees": knees, "notes": notes,
            "log_y": log_y, "title": title.get_text()}
